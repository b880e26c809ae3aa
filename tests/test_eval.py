"""`lite-verl eval`: the pass@k estimator by hand, the per-source summary, and the command on a run."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import SMALL

from lite_verl.tools.evaluate import SourceScores, pass_at_k


@pytest.mark.parametrize(
    ("n", "c", "k", "expected"),
    [
        (4, 0, 1, 0.0),
        (4, 4, 2, 1.0),
        (4, 1, 1, 0.25),  # one draw: c / n
        (4, 1, 2, 0.5),  # 1 - C(3,2)/C(4,2) = 1 - 3/6
        (5, 2, 3, 0.9),  # 1 - C(3,3)/C(5,3) = 1 - 1/10
        (3, 2, 2, 1.0),  # n - c < k: every draw of 2 holds a correct one
    ],
)
def test_pass_at_k_by_hand(n, c, k, expected):
    assert pass_at_k(n, c, k) == pytest.approx(expected)


def test_pass_at_k_refuses_impossible_counts():
    with pytest.raises(ValueError, match="0 < k <= n"):
        pass_at_k(2, 1, 3)


def test_source_summary_of_fixed_samples():
    """Two prompts, k = 2: rewards worked out by hand."""
    part = SourceScores(greedy=[1.0, 0.0], sampled=[[1.0, 0.0], [0.0, 0.5]])
    out = part.summary(k=2, correct=1.0)
    assert out["prompts"] == 2
    assert out["greedy"] == 0.5
    assert SourceScores(greedy=[1.0, 0.1, 0.1, 0.0]).summary(2, correct=1.0)["greedy_acc"] == 0.25
    assert out["mean@2"] == pytest.approx(1.5 / 4)
    assert out["pass@2"] == pytest.approx((1.0 + 0.0) / 2)  # 0.5 is below --correct
    assert SourceScores(greedy=[0.5], sampled=[[0.5, 0.5]]).summary(2, correct=0.5)["pass@2"] == 1.0


@pytest.mark.slow
def test_eval_command_scores_a_runs_last_checkpoint(tmp_path):
    run = tmp_path / "run"
    base = [sys.executable, "-m", "lite_verl"]
    sets = [a for s in [*SMALL, "trainer.total_steps=2", "data.val_size=6"] for a in ("--set", s)]
    subprocess.run([*base, "train", "--preset", "laptop", "--run-dir", str(run), *sets], check=True)
    out = tmp_path / "eval.json"
    done = subprocess.run(
        [*base, "eval", str(run), "--k", "3", "--out", str(out)], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(out.read_text())
    assert result["checkpoint"].endswith("step_00000002") and result["k"] == 3
    scores = result["scores"]
    assert set(scores) == {"all", "lite_verl/echo"}
    assert scores["all"]["prompts"] == 6
    for key in ("greedy", "greedy_acc", "mean@3", "pass@3"):
        assert 0.0 <= scores["all"][key] <= 1.0
    assert scores["all"]["pass@3"] >= scores["all"]["mean@3"] - 1e-9 or scores["all"]["mean@3"] < 1.0
    assert "data_source" in done.stdout and "pass@3" in done.stdout
    # every greedy completion kept, with the prompt as the model saw it; a few printed, per verdict
    shown = result["completions"]
    assert len(shown) == 6 and all(c["prompt"] and c["data_source"] == "lite_verl/echo" for c in shown)
    right = sum(c["correct"] for c in shown)
    assert right == round(scores["all"]["greedy_acc"] * 6)
    assert done.stdout.count("    completion: ") == min(right, 2) + min(6 - right, 2)
    kept = json.loads((run / "eval" / "step_00000002.json").read_text())  # with the run, for report
    assert kept["scores"] == scores
    from lite_verl.tools.report import report

    text = report(run, plots=False)
    assert "eval of step_00000002 (lite-verl eval, k=3):" in text and "pass@3" in text


def test_eval_of_a_run_without_checkpoint_is_one_line(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("preset: laptop\n")
    done = subprocess.run(
        [sys.executable, "-m", "lite_verl", "eval", str(run)], capture_output=True, text=True
    )
    assert done.returncode != 0
    assert "holds no complete checkpoint" in done.stderr
    assert "Traceback" not in done.stderr


def test_eval_of_a_run_under_another_preset_and_recipe_keeps_its_model_and_trainer(tmp_path):
    """`eval RUN --preset P`: this machine's where/how keys, not the training machine's (a QLoRA adapter loads
    into the laptop's LoRA); `--recipe R`: R's task (data, reward, sampling), the run's model and adapter."""
    from lite_verl.config import load_config
    from lite_verl.tools.evaluate import run_layer

    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text(
        "preset: 4090x1\nrecipe: arithmetic\nmodel: {path: tiny:qwen2, dtype: bfloat16}\n"
        "train: {backend: qlora, lora_rank: 8, gpus: [0]}\nrollout: {gpus: [0], temperature: 0.9, stop: [Q]}\n"
        "data: {task: arithmetic, val_size: 7}\n"
    )
    cfg = load_config(None, run_layer(run, "laptop", None, "largest"), [])
    assert cfg.preset == "laptop" and cfg.recipe == "largest"
    assert cfg.train.gpus == () and cfg.rollout.gpus == () and cfg.model.dtype == "float32"  # the laptop's
    assert cfg.train.backend == "lora" and cfg.train.lora_rank == 8 and cfg.model.path == "tiny:qwen2"
    assert cfg.data.task == "largest" and cfg.data.val_size == 500  # the recipe's task, not the run's
    assert cfg.rollout.temperature == 1.0 and cfg.rollout.stop == () and cfg.reward.functions[0].fn == "gsm8k"
    extra = tmp_path / "extra.yaml"
    extra.write_text("data: {val_size: 3}\n")
    cfg = load_config(None, run_layer(run, "laptop", str(extra), None), [])
    assert cfg.data.task == "arithmetic" and cfg.data.val_size == 3 and cfg.rollout.temperature == 0.9
    assert cfg.rollout.stop == ("Q",)


def test_with_several_weighted_rewards_correctness_is_the_first_functions_own_score():
    """A right answer with a length penalty totals 0.93 < --correct 1.0: judged by the task's function (the
    first, or --correct-fn), not by the weighted total; None from it is not correct."""
    from types import SimpleNamespace

    import torch

    from lite_verl.config import load_config
    from lite_verl.errors import UserError
    from lite_verl.loop import judged  # the run's own validation judges alike
    from lite_verl.tools.evaluate import judged_by

    part = SourceScores(greedy=[0.93, 0.1], sampled=[[0.93, 0.1], [0.1, 0.1]],
                        greedy_judged=[1.0, 0.0], sampled_judged=[[1.0, 0.0], [0.0, 0.0]])  # fmt: skip
    got = part.summary(2, 1.0)
    assert got["greedy_acc"] == 0.5 and got["pass@2"] == 0.5  # by the total: 0 and 0
    assert got["greedy"] == pytest.approx(0.515) and got["mean@2"] == pytest.approx(0.3075)
    two = ["reward.functions=[{fn: gsm8k}, {fn: length, weight: 0.2, args: {max_chars: '64'}}]"]
    cfg = load_config("laptop", None, two)
    assert judged_by(cfg, "") == "gsm8k" and judged_by(cfg, "length") == "length"
    assert judged_by(load_config("laptop", None, []), "") == ""  # one reward: its total
    with pytest.raises(UserError, match=r"--correct-fn acc: not one of reward.functions \(gsm8k, length\)"):
        judged_by(cfg, "acc")
    parts = {"gsm8k": torch.tensor([1.0, float("nan")])}
    session = SimpleNamespace(cfg=cfg, scorer=SimpleNamespace(last_parts=parts))
    total = torch.tensor([0.93, 0.2])
    assert judged(session, total, "gsm8k").tolist() == [1.0, float("-inf")]
    assert judged(session, total).tolist() == [1.0, float("-inf")]  # the first function by default
    session.cfg = load_config("laptop", None, [])
    assert judged(session, total) is total and judged(session, total, "") is total


def test_eval_reads_the_validation_files_alone(tmp_path):
    """eval never trains: a config whose training files are gone (or on the Hub) still evaluates its val set."""
    from lite_verl.tools.evaluate import eval_config

    val = tmp_path / "test.jsonl"
    val.write_text(json.dumps({"prompt": "2+2?", "answer": "4"}) + "\n")
    sets = ["data.train_files=[/nowhere/train.jsonl]", f"data.val_files=[{val}]", "data.val_split=train"]
    cfg, ckpt = eval_config("tiny:qwen2", "laptop", None, sets)
    assert ckpt is None and cfg.data.train_files == (str(val),) and cfg.data.split == "train"
