"""Several training ranks (train/group.py) on the CPU, with train.cpu_ranks: a 2-rank update equals the
1-rank update of the same batch; the real CLI runs with 2 ranks; a follower's failure ends the run with
one line naming the rank and leaves no process behind; a batch that does not split evenly is refused.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import SMALL, assert_refused

from lite_verl.config import load_config

TESTS = Path(__file__).resolve().parent
# two mini-batches of 8 responses, two epochs: several optimizer steps, old log-probs recomputed
STEPS = [*SMALL, "train.micro_batch_size=4", "algorithm.ppo_mini_batch_size=2", "algorithm.ppo_epochs=2"]
COMPARED = [
    "actor/loss",
    "actor/pg_loss",
    "actor/kl_loss",
    "actor/grad_norm",
    "actor/pg_clipfrac",
    "actor/entropy",
]


def _one_step(
    ranks: int, *extra: str, save: Path | None = None
) -> tuple[dict[str, float], list[torch.Tensor]]:
    """One train_step with `ranks` CPU ranks -> (metrics, every trained tensor after it). `save`: a
    checkpoint written there and loaded back before the tensors are read (fsdp: collectives)."""
    from lite_verl.data.loader import PromptSampler
    from lite_verl.loop import prepare, train_step
    from lite_verl.run.cost import Ledger

    cfg = load_config("laptop", None, [*STEPS, f"train.cpu_ranks={ranks}", *extra])
    session = prepare(cfg)
    try:
        metrics = train_step(
            session, PromptSampler(len(session.train_set), 4, 0, True), 1, Ledger.from_config(cfg)
        )
        backend = session.backend
        if save is not None:
            backend.save(save)
            backend.load(save)
        if cfg.train.backend == "lora":
            local = backend.local if session.group else backend
            trained = [p.detach().clone() for p in local.params + local.critic_params]
        else:  # gathered from the shards: a collective, which the followers join
            trained = [
                t.clone() for bucket in backend.merged_weight_buckets(2**30, "float32") for _, t in bucket
            ]
    finally:
        if session.group is not None:
            session.group.close()
    return metrics, trained


def _assert_same_update(one, two, keys: list[str]) -> None:
    (m1, t1), (m2, t2) = one, two
    assert m1["reward/mean"] == m2["reward/mean"]  # the same rollout
    for k in keys:
        assert m2[k] == pytest.approx(m1[k], rel=1e-4, abs=1e-6), k
    assert len(t1) == len(t2)
    gap = max(float((a - b).abs().max()) for a, b in zip(t1, t2))
    print(f"max |2 ranks - 1 rank| over the trained tensors: {gap:.2e}")
    # float addition order only, which AdamW's 8 steps amplify (a micro_batch_size change alone moves
    # the LoRA run by ~1e-5); a wrong normalisation or an averaged gradient moves weights by ~1e-3
    assert gap < 5e-5


def test_two_lora_ranks_update_like_one():
    """PPO with a critic (gae), truncated IS: old log-probs and values gathered, actor and critic
    gradients summed over the ranks."""
    extra = ["algorithm.adv_estimator=gae", "algorithm.rollout_correction=token"]
    keys = [*COMPARED, "critic/vf_loss", "critic/grad_norm"]
    _assert_same_update(_one_step(1, *extra), _one_step(2, *extra), keys)


def test_two_fsdp_ranks_update_like_one(tmp_path):
    """FSDP2 sharded over two ranks (gradients summed by scaling the loss by W), GRPO with the KL loss;
    generation runs on both ranks in lockstep; a checkpoint is gathered, written and loaded back."""
    extra = ["train.backend=fsdp", "sync.mode=merged"]
    two = _one_step(2, *extra, save=tmp_path)
    assert (tmp_path / "model" / "model.safetensors").is_file() and (tmp_path / "optimizer.pt").is_file()
    _assert_same_update(_one_step(1, *extra), two, COMPARED)


def _step_in_a_process(
    tmp_path: Path, ranks: int, *extra: str
) -> tuple[dict[str, float], list[torch.Tensor]]:
    """_one_step in a fresh interpreter: DeepSpeed caches the process group it first saw, so it cannot
    follow a group re-made in one process (the CLI makes one per process)."""
    out = tmp_path / f"step{ranks}.pt"
    code = (f"import sys; sys.path.insert(0, {str(TESTS)!r}); import torch, test_train_group as t\n"
            f"if __name__ == '__main__': torch.save(t._one_step({ranks}, *{list(extra)!r}), {str(out)!r})")  # fmt: skip
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    return torch.load(out, weights_only=False)


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None, reason="deepspeed is not installed")
def test_two_deepspeed_ranks_update_like_one(tmp_path):
    """ZeRO-3 partitioned over two ranks (its gradient average undone by the loss x W)."""
    extra = ["train.backend=deepspeed", "sync.mode=merged"]
    one, two = _step_in_a_process(tmp_path, 1, *extra), _step_in_a_process(tmp_path, 2, *extra)
    _assert_same_update(one, two, COMPARED)


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA GPUs")
@pytest.mark.parametrize("backend", ["lora", "fsdp"])
def test_two_gpu_ranks_update_like_one(backend):
    """train.gpus [0, 1] (nccl for CUDA tensors, gloo for the command payloads) against train.gpus [0]."""
    sync = "sync.mode=merged" if backend == "fsdp" else "sync.mode=adapter"
    gpus = [
        "cost.gpu_models=[GPU, GPU]",
        "cost.price_per_hour={GPU: 1.0, cpu: 0.0}",
        f"train.backend={backend}",
        sync,
    ]
    one = _one_step(1, *gpus, "train.gpus=[0]", "rollout.gpus=[0]")
    two = _one_step(1, *gpus, "train.gpus=[0,1]", "rollout.gpus=[0,1]")
    _assert_same_update(one, two, COMPARED)
    peaks = [two[0][f"perf/train_peak_gib_rank{r}"] for r in (0, 1)]  # each rank's, gathered on rank 0
    assert all(p > 0 for p in peaks), peaks


# --- the real CLI ------------------------------------------------------------------------------------
def _train(tmp_path: Path, run: str, *sets: str) -> subprocess.CompletedProcess:
    from test_cli import FAST, cli

    args = [a for s in ("trainer.total_steps=2", "trainer.progress=false", *sets) for a in ("--set", s)]
    return cli("train", "--preset", "laptop", "--run-dir", run, *FAST, *args, cwd=tmp_path)


@pytest.mark.slow
def test_cli_run_with_two_cpu_ranks_writes_what_one_rank_writes(tmp_path):
    """`lite-verl train --preset laptop --set train.cpu_ranks=2`: exit 0, the same metrics as one rank
    (step 1 in numbers; the keys of every row), a checkpoint."""
    from test_cli import metrics

    one = _train(tmp_path, "one")
    two = _train(tmp_path, "two", "train.cpu_ranks=2")
    assert one.returncode == 0, one.stderr[-3000:]
    assert two.returncode == 0, two.stderr[-3000:]
    a, b = metrics(tmp_path / "one"), metrics(tmp_path / "two")
    assert [sorted(m) for m in a] == [sorted(m) for m in b]
    first = [(x, y) for x, y in zip(a, b) if x["step"] == 1 and "actor/loss" in x][0]
    assert first[0]["reward/mean"] == first[1]["reward/mean"]
    assert first[1]["actor/grad_norm"] == pytest.approx(first[0]["actor/grad_norm"], rel=1e-4)
    summary = json.loads((tmp_path / "two" / "summary.json").read_text())
    assert summary["steps"] == 2 and Path(summary["checkpoint"]).is_dir()


# --- failures ---------------------------------------------------------------------------------------
def _failing_follower(*args) -> None:
    """A follower (in its own process) whose update raises; started by the controller below."""
    from lite_verl.train import follower

    def update(self, args, tensors):
        raise RuntimeError("injected failure in the update")

    follower.Follower.update = update
    follower.follower_main(*args)


def _controller(pid_file: str, mode: str) -> None:
    """A controller process: the real CLI with a failing follower (mode=fail), or one that is killed
    once its follower runs (mode=kill). The followers' pids go to pid_file."""
    from lite_verl import cli
    from lite_verl.train import follower, group

    start = group.TrainGroup.start

    def record(cfg, model_dir):
        g = start(cfg, model_dir)
        Path(pid_file).write_text(" ".join(str(p.pid) for p in g.procs))
        if mode == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        return g

    group.TrainGroup.start = record
    if mode == "fail":
        follower.follower_main = _failing_follower
    sets = [*SMALL, "trainer.total_steps=2", "train.cpu_ranks=2"]
    sys.exit(
        cli.main(
            ["train", "--preset", "laptop", "--run-dir", "run", *[a for s in sets for a in ("--set", s)]]
        )
    )


def _run_controller(tmp_path: Path, mode: str) -> tuple[subprocess.CompletedProcess, list[int]]:
    pid_file = tmp_path / "pids"
    code = f"import sys; sys.path.insert(0, {str(TESTS)!r}); import test_train_group as t; t._controller({str(pid_file)!r}, {mode!r})"
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=300, env=env
    )
    return out, [int(p) for p in pid_file.read_text().split()]


def _gone(pid: int, within_s: float = 10.0) -> bool:
    import psutil

    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.2)
    return False


def test_a_failing_follower_ends_the_run_with_one_line_naming_its_rank(tmp_path):
    out, pids = _run_controller(tmp_path, "fail")
    assert out.returncode == 1, out.stderr[-3000:]
    assert (
        "lite-verl: error: train rank 1 failed: RuntimeError: injected failure in the update\n" in out.stderr
    )
    assert "Traceback" in out.stderr  # the follower's own, printed by it (the controller's line has none)
    assert pids and all(_gone(p) for p in pids)


def test_followers_end_when_the_controller_is_killed(tmp_path):
    out, pids = _run_controller(tmp_path, "kill")
    assert out.returncode == -signal.SIGKILL
    assert pids and all(_gone(p) for p in pids)


# --- config ------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "overrides, message",
    [
        (["train.cpu_ranks=3", "trainer.batch_size=4", "rollout.n=4"],
         r"trainer.batch_size=4 x rollout.n=4 = 16 responses per optimizer step do not split evenly over the "
         r"3 training ranks of train.cpu_ranks=3; make trainer.batch_size x rollout.n a multiple of 3"),
        (["train.cpu_ranks=2", "rollout.n=3", "trainer.batch_size=6", "algorithm.ppo_mini_batch_size=1"],
         r"algorithm.ppo_mini_batch_size=1 x rollout.n=3 = 3 responses .* multiple of 2"),
        (["train.cpu_ranks=0"], r"train.cpu_ranks=0 must be > 0"),
        (["train.cpu_ranks=2", "train.gpus=[0]", "rollout.gpus=[0]"], r"set train.cpu_ranks=1"),
        (["train.gpus=[0,1,2]", "rollout.engine=vllm", "rollout.gpus=[3]", "rollout.n=4", "trainer.batch_size=4"],
         r"over the 3 training ranks of train.gpus \[0, 1, 2\]"),
    ],
)  # fmt: skip
def test_ranks_that_cannot_share_the_batch_evenly_are_refused(overrides, message):
    assert_refused(overrides, message)


def test_several_train_gpus_validate_for_every_backend():
    gpus = ["rollout.engine=vllm", "rollout.gpus=[0]", "train.gpus=[1,2]", "cost.gpu_models=[A, A, A]",
            "cost.price_per_hour={A: 1.0}"]  # fmt: skip
    for backend in ("lora", "qlora", "fsdp", "deepspeed"):
        sync = "sync.mode=merged" if backend in ("fsdp", "deepspeed") else "sync.mode=adapter"
        load_config("laptop", None, [*gpus, f"train.backend={backend}", sync])


def test_the_bill_counts_every_train_gpu():
    from lite_verl.run.cost import Ledger, bill

    cfg = load_config("4090x4", None, [])
    ledger = Ledger.from_config(cfg)
    with ledger.busy_on("train"):
        time.sleep(0.01)
    rows = {(r.role, r.device): r for r in bill(ledger, cfg)}
    assert rows[("train", "cuda:2")].busy_s > 0 and rows[("train", "cuda:3")].busy_s > 0
    assert rows[("train", "cuda:2")].cost_usd == rows[("train", "cuda:3")].cost_usd > 0


def test_ranks_share_rows_in_blocks_and_add_up_metrics():
    from lite_verl.train.dist import ONE_RANK, Ranks

    assert [Ranks(r, 2).share(8) for r in (0, 1)] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert ONE_RANK.share(3) == [0, 1, 2]
    m = {"actor/loss": 0.5, "rollout/logprob_gap_max": 0.1}
    assert ONE_RANK.reduce(m) == m and torch.equal(ONE_RANK.gather(torch.ones(2)), torch.ones(2))
