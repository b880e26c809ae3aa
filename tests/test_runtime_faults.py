"""Runtime faults: non-finite losses are skipped then stop the run; out-of-memory halves the micro-batch
(with the same maths); a failing reward can be scored with a default instead of stopping."""

from __future__ import annotations

import json
import math
import warnings

import pytest
import torch

from lite_verl.config import load_config
from lite_verl.data.loader import PromptSampler
from lite_verl.errors import RewardError
from lite_verl.loop import TrainingDiverged, prepare, run_training, train_step
from lite_verl.run.cost import Ledger
from lite_verl.run.rundir import RunDir, read_metrics

SMALL = ["trainer.batch_size=4", "rollout.n=4", "data.task_size=64", "data.val_size=0", "trainer.progress=false",
         "rollout.max_new_tokens=8"]  # fmt: skip


def _poison(backend, steps_to_poison: set[int], counter: list[int]):
    """Make the trainer's log-probs NaN on chosen training steps (a stand-in for a numerical blow-up)."""
    real = backend.forward

    def forward(*args, **kwargs):
        lp, ent = real(*args, **kwargs)
        if torch.is_grad_enabled() and counter[0] in steps_to_poison:
            lp = lp * float("nan")
        return lp, ent

    backend.forward = forward


def test_nan_loss_skips_the_step_then_stops_the_run(tmp_path):
    cfg = load_config("laptop", None, [*SMALL, "trainer.total_steps=8"])
    session = prepare(cfg)
    counter = [0]
    _poison(session.backend, set(range(1, 100)), counter)
    real_step = session.backend.step

    def step():
        counter[0] += 1
        return real_step()

    before = [p.detach().clone() for p in session.backend.params]
    session.backend.step = step
    run = RunDir(tmp_path / "run")
    run.create(cfg)
    with (
        pytest.warns(UserWarning, match="non-finite loss or gradient; the update was skipped"),
        pytest.raises(TrainingDiverged, match="5 steps in a row had a non-finite loss; lower train.lr"),
    ):
        run_training(session, run)
    rows = [m for m in read_metrics(run.path) if "reward/mean" in m]
    assert [m["actor/skipped_step"] for m in rows] == [0.0, 1.0, 1.0, 1.0, 1.0]  # the 5th skip stops the run
    after = session.backend.params
    # weights changed by the one good step only, and hold no NaN
    assert all(torch.isfinite(p).all() for p in after)
    assert any(not torch.equal(a, b) for a, b in zip(after, before))


def test_a_skipped_step_says_in_which_layer_the_non_finite_gradient_started(capsys):
    """A NaN born in one decoder layer's backward spoils that layer and the ones below it (the backward runs
    from the head down): the warning names the highest spoiled layer as the start."""
    cfg = load_config("laptop", None, SMALL)
    backend = prepare(cfg).backend
    layers = backend.model.get_base_model().model.layers
    assert len(layers) >= 2
    top = len(layers) - 2  # a layer below the last one

    def poison(module, grad_input, grad_output):
        return tuple(g * float("nan") if g is not None else None for g in grad_input)

    handle = layers[top].mlp.register_full_backward_hook(poison)
    ids = torch.randint(3, 100, (2, 12))
    log_prob, _ = backend.forward(ids, torch.ones_like(ids), 4, 1.0)
    backend.backward(log_prob.sum())
    handle.remove()
    assert not math.isfinite(backend.step())
    err = capsys.readouterr().err
    assert "non-finite gradients in" in err and f"decoder layers 0..{top};" in err, err
    log_prob, _ = backend.forward(ids, torch.ones_like(ids), 4, 1.0)
    backend.backward(log_prob.sum())
    assert math.isfinite(backend.step())  # the next step is clean, and says nothing
    assert "non-finite" not in capsys.readouterr().err


def _steps(micro: int, oom_above: int | None, *extra: str, tokens: bool = False) -> list[dict]:
    """Two steps; a forward of more than `oom_above` rows (tokens=True: rows x columns) runs out of memory."""
    cfg = load_config("laptop", None, [*SMALL, f"train.micro_batch_size={micro}", *extra])
    session = prepare(cfg)
    if oom_above is not None:
        real = session.backend.forward

        def forward(input_ids, *args, **kwargs):
            if (input_ids.numel() if tokens else input_ids.shape[0]) > oom_above:
                raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
            return real(input_ids, *args, **kwargs)

        session.backend.forward = forward
    sampler = PromptSampler(len(session.train_set), 4, 0, True)
    ledger = Ledger.from_config(cfg)
    return [train_step(session, sampler, s, ledger) for s in (1, 2)]


def _assert_same_steps(reference: list[dict], halved: list[dict]) -> None:
    """The same rewards, losses and gradient norms step by step: micro-batching changed nothing."""
    for a, b in zip(reference, halved):
        assert a["reward/mean"] == b["reward/mean"]
        assert a["actor/loss"] == pytest.approx(b["actor/loss"], rel=1e-5, abs=1e-7)
        assert a["actor/grad_norm"] == pytest.approx(b["actor/grad_norm"], rel=1e-4)


def test_out_of_memory_halves_the_micro_batch_and_keeps_the_maths(capsys):
    rows = "train.pack_micro_batches=false"  # exactly micro_batch_size rows per forward
    reference = _steps(4, None, rows)
    halved = _steps(16, 4, rows)
    assert "train.micro_batch_size halved to 8" in capsys.readouterr().err
    assert halved[0]["train/micro_batch_size"] == 4.0
    _assert_same_steps(reference, halved)


def test_out_of_memory_halves_a_packed_micro_batch_by_its_tokens(capsys):
    """Packed micro-batches (the default) hold up to micro_batch_size x 40 tokens here: an out-of-memory
    above 200 tokens halves 16 -> 8 -> 4 (160 tokens), and the numbers are those of an unpacked run."""
    short = "data.max_prompt_length=32"  # 32 + 8 new tokens: a full-length row is 40 tokens
    reference = _steps(4, None, short, "train.pack_micro_batches=false")
    halved = _steps(16, 200, short, tokens=True)
    assert "train.micro_batch_size halved to 4" in capsys.readouterr().err
    assert halved[0]["train/micro_batch_size"] == 4.0
    _assert_same_steps(reference, halved)


def test_out_of_memory_at_micro_batch_one_is_a_clear_error():
    from lite_verl.errors import UserError

    with pytest.raises(UserError, match="out of memory with train.micro_batch_size=1"):
        _steps(2, 0)


def test_reward_failures_scored_with_the_default(tmp_path, capsys):
    f = tmp_path / "flaky.py"
    f.write_text(
        "import os\n"
        "def score(ds, text, gt, extra=None):\n"
        "    if extra['index'] % 3 == 0:\n        os._exit(1)\n"
        "    if extra['index'] % 3 == 1:\n        raise ValueError('nope')\n"
        "    return 1.0\n"
    )
    cfg = load_config("laptop", None, [*SMALL, "trainer.total_steps=1", f"reward.function={f}:score",
                                       "reward.on_error=default", "reward.default_score=-1"])  # fmt: skip
    session = prepare(cfg)
    run = RunDir(tmp_path / "run")
    run.create(cfg)
    run_training(session, run)
    err = capsys.readouterr().err
    assert "crashed its worker process" in err and "raised ValueError: nope" in err
    row = [m for m in read_metrics(run.path) if "reward/mean" in m][0]
    assert -1.0 < row["reward/mean"] < 1.0 and row["reward/max"] == 1.0


def test_anomaly_detection_names_the_operation_that_made_the_nan(monkeypatch):
    """LITE_VERL_DETECT_ANOMALY=1 (README "Numerical and memory faults"): every training rank runs its backward
    under torch's anomaly detection, so the first operation whose gradient is NaN raises, naming itself (how
    cuDNN's attention backward was found on a GPU)."""
    monkeypatch.setenv("LITE_VERL_DETECT_ANOMALY", "1")
    try:
        backend = prepare(load_config("laptop", None, SMALL)).backend
        assert torch.is_anomaly_enabled() and torch.is_anomaly_check_nan_enabled()
        mlp = backend.model.get_base_model().model.layers[0].mlp
        handle = mlp.register_full_backward_hook(lambda m, gi, go: tuple(g * float("nan") for g in gi))
        ids = torch.randint(3, 100, (2, 12))
        log_prob, _ = backend.forward(ids, torch.ones_like(ids), 4, 1.0)
        with pytest.raises(RuntimeError, match="returned nan values"):
            backend.backward(log_prob.sum())
        handle.remove()
    finally:
        torch.autograd.set_detect_anomaly(False)


def test_steps_without_a_single_unequal_group_are_said_once(tmp_path):
    """A policy collapsed onto one rewarded-a-little answer: after one response got 1.0, every response gets
    0.1; GRPO has no advantage, reward/zero_std_frac is 1 from step 2 and after 3 such steps the run says so,
    once. Every response at the best reward seen (a solved task) is not warned about."""
    (tmp_path / "flat.py").write_text(
        "calls = [0]\n\ndef f(data_source, solution_str, ground_truth, extra_info):\n"
        "    calls[0] += 1\n    return 1.0 if calls[0] == 1 else 0.1\n"
    )
    sets = [*SMALL, "trainer.total_steps=5", f"reward.function={tmp_path / 'flat.py'}:f"]
    cfg = load_config("laptop", None, sets)
    run = RunDir(tmp_path / "run")
    run.create(cfg)
    with pytest.warns(UserWarning, match=r"steps 2-4: each prompt's 4 responses got equal rewards") as seen:
        run_training(prepare(cfg), run)
    assert sum("equal rewards" in str(w.message) for w in seen) == 1  # not again at step 5
    rows = [m for m in read_metrics(run.path) if "reward/mean" in m]
    assert [m["reward/zero_std_frac"] for m in rows] == [0.75, 1.0, 1.0, 1.0, 1.0]
    (tmp_path / "solved.py").write_text(
        "def f(data_source, solution_str, ground_truth, extra_info):\n    return 1.0\n"
    )
    cfg = load_config("laptop", None, [*sets[:-1], f"reward.function={tmp_path / 'solved.py'}:f"])
    run = RunDir(tmp_path / "solved")
    run.create(cfg)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        run_training(prepare(cfg), run)
    assert not [w for w in seen if "equal rewards" in str(w.message)]
    assert [m["reward/zero_std_frac"] for m in read_metrics(run.path) if "reward/mean" in m] == [1.0] * 5


def test_a_reward_that_never_fires_is_said_once(tmp_path):
    """A reward that gives 0 to every response from the start (a format it never matches): no group has an
    advantage, and after 3 steps the run says that nothing has scored above 0, once."""
    (tmp_path / "zero.py").write_text(
        "def f(data_source, solution_str, ground_truth, extra_info):\n    return 0.0\n"
    )
    cfg = load_config(
        "laptop", None, [*SMALL, "trainer.total_steps=4", f"reward.function={tmp_path / 'zero.py'}:f"]
    )
    run = RunDir(tmp_path / "run")
    run.create(cfg)
    with pytest.warns(
        UserWarning, match=r"steps 1-3: every response scored 0.000 and none has scored above 0"
    ) as seen:
        run_training(prepare(cfg), run)
    assert sum("none has scored" in str(w.message) for w in seen) == 1


def test_a_reward_that_fails_mid_run_leaves_a_checkpoint_to_resume_from(tmp_path):
    """A reward that raises at step 3 (with no periodic checkpoint due): the run saves step 2 before it
    stops, so fixing the reward and `--resume` continues from there, with step 2's sampler state."""
    (tmp_path / "late.py").write_text(
        "calls = [0]\n\ndef f(data_source, solution_str, ground_truth, extra_info):\n"
        "    calls[0] += 1\n    if calls[0] > 32:\n        raise ValueError('boom')\n    return len(solution_str) % 2\n"
    )  # SMALL: 4 prompts x 4 responses a step, so the 33rd call is step 3's first
    sets = [*SMALL, "trainer.total_steps=4", "trainer.save_every=0", "reward.isolate=false",
            f"reward.function={tmp_path / 'late.py'}:f"]  # fmt: skip
    cfg = load_config("laptop", None, sets)
    run = RunDir(tmp_path / "run")
    run.create(cfg)
    with pytest.raises(RewardError, match="boom"):
        run_training(prepare(cfg), run)
    ckpt = run.latest_checkpoint()
    assert ckpt is not None and ckpt.name.endswith("_00000002")
    state = json.loads((ckpt / "state.json").read_text())
    assert state["consumed"] == 8  # two steps of 4 prompts: step 3's batch is drawn again on resume
