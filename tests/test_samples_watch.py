"""RUN/samples.jsonl (a few completions per sampled step), its resume, `report`'s samples and `watch`."""

from __future__ import annotations

import io
import json
import shutil
import time
from pathlib import Path

import pytest
from conftest import SMALL
from test_cli import cli

from lite_verl.run.samples import best_and_worst, pick, read_samples

K = 3
MAX_NEW = 16
FIELDS = {"step", "sample", "prompt", "completion", "reward", "reward_parts", "advantage", "length", "finish"}


def sets(*overrides: str) -> list[str]:
    return [a for o in overrides for a in ("--set", o)]


TRAIN = sets(
    *SMALL,
    f"rollout.max_new_tokens={MAX_NEW}",
    "trainer.samples_every=2",
    f"trainer.samples_per_step={K}",
    "trainer.save_every=1",
    "trainer.keep_checkpoints=4",
    "reward.functions=[{fn: format}, {fn: length, args: {max_chars: 20}}]",
)


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    """A 4-step CPU run with two reward functions, samples at steps 2 and 4."""
    cwd = tmp_path_factory.mktemp("samples")
    out = cli(
        "train", "--preset", "laptop", "--run-dir", "run", *TRAIN, *sets("trainer.total_steps=4"), cwd=cwd
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return cwd / "run"


@pytest.mark.slow
def test_samples_rows_at_the_sampled_steps_with_every_field(finished):
    rows = read_samples(finished)
    assert [r["step"] for r in rows] == [2] * K + [4] * K  # every samples_every steps and the last
    for r in rows:
        assert set(r) == FIELDS
        assert isinstance(r["prompt"], str) and r["prompt"] and isinstance(r["completion"], str)
        assert set(r["reward_parts"]) == {"format", "length"}  # one value per reward function
        total = r["reward_parts"]["format"] + r["reward_parts"]["length"]  # weights 1.0
        assert r["reward"] == pytest.approx(total, abs=1e-5)
        assert isinstance(r["advantage"], float)
        assert 1 <= r["length"] <= MAX_NEW
        assert r["finish"] in ("stop", "length")
        if r["finish"] == "length":
            assert r["length"] == MAX_NEW  # max_new_tokens cut it
        if r["length"] < MAX_NEW:
            assert r["finish"] == "stop"  # only an EOS ends a response early
    for step in (2, 4):
        mine = [r for r in rows if r["step"] == step]
        assert len({r["sample"] for r in mine}) == K
        rewards = [r["reward"] for r in mine]
        assert rewards == sorted(rewards, reverse=True)  # best first, worst last


@pytest.mark.slow
def test_resume_redoes_the_steps_after_the_checkpoint_without_duplicates(finished, tmp_path):
    """A kill after step 4 wrote its samples but before its checkpoint (and step 3's) was complete:
    resuming from step 2 writes step 4's samples once, the same ones (same seeds, same data)."""
    run = tmp_path / "run"
    shutil.copytree(finished, run)
    before = read_samples(run)
    for step in (3, 4):
        shutil.rmtree(run / "checkpoints" / f"step_{step:08d}")
    (run / "summary.json").unlink()
    with (run / "samples.jsonl").open("a") as f:
        f.write('{"step": 4, "prompt": "cut sho')  # a line cut short by the kill
    out = cli("train", "--resume", "run", cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    after = read_samples(run)
    assert [r["step"] for r in after] == [2] * K + [4] * K
    key = [(r["step"], r["sample"], r["completion"], r["reward"]) for r in after]
    assert key == [(r["step"], r["sample"], r["completion"], r["reward"]) for r in before]
    metrics = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert metrics == [1, 2, 3, 4]


@pytest.mark.slow
def test_report_shows_the_best_and_worst_sample_of_the_last_step(finished):
    from lite_verl.tools.report import report_text

    step, rows = best_and_worst(finished)
    assert step == 4 and rows[0]["reward"] >= rows[-1]["reward"]
    text = report_text(finished)
    assert "samples of step 4" in text and "best: reward" in text
    if len(rows) == 2:
        assert "worst: reward" in text


@pytest.mark.slow
def test_watch_once_on_a_finished_run(finished):
    out = cli("watch", str(finished), "--once", cwd=finished.parent)
    assert out.returncode == 0, out.stderr
    assert "step 4/4" in out.stdout and "finished" in out.stdout
    assert "reward" in out.stdout
    assert any(c in out.stdout for c in "▁▂▃▄▅▆▇█")  # the sparkline
    assert out.stderr == ""


def test_watch_refuses_a_directory_that_is_not_a_run(tmp_path):
    out = cli("watch", str(tmp_path), "--once", cwd=tmp_path)
    assert out.returncode == 2
    assert "not a lite-verl run directory" in out.stderr and out.stderr.count("\n") == 1
    assert "Traceback" not in out.stderr


def test_watch_follows_a_running_run_until_ctrl_c(tmp_path, monkeypatch):
    """No summary.json: frames until Ctrl-C, which ends watching with exit 0; the ETA from the step times."""
    from lite_verl.tools import watch as w

    (tmp_path / "config.yaml").write_text("trainer:\n  total_steps: 10\n")
    rows = [{"step": s, "reward/mean": s / 10, "timing/step_s": 2.0} for s in (1, 2, 3, 4)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    sleeps = []

    def sleep(s: float) -> None:
        sleeps.append(s)
        if len(sleeps) == 2:
            raise KeyboardInterrupt

    monkeypatch.setattr(w.time, "sleep", sleep)
    out = io.StringIO()
    assert w.watch(tmp_path, interval=0.5, out=out) == 0
    text = out.getvalue()
    assert text.count("step 4/10  running") == 2  # two frames, then Ctrl-C
    assert "ETA 12s" in text and "▁▃▆█" in text


def test_watch_waits_for_a_run_directory_that_train_has_not_written_yet(tmp_path):
    """`lite-verl train ... & lite-verl watch RUN`: the directory appears once the model and data are loaded;
    watch waits for it (saying so) instead of refusing at once."""
    import threading

    from lite_verl.tools import watch as w

    run = tmp_path / "run"

    def train() -> None:
        time.sleep(1.0)
        run.mkdir()
        (run / "config.yaml").write_text("trainer:\n  total_steps: 1\n")
        (run / "metrics.jsonl").write_text(
            json.dumps({"step": 1, "reward/mean": 0.5, "timing/step_s": 1.0}) + "\n"
        )
        (run / "summary.json").write_text("{}")

    threading.Thread(target=train).start()
    out = io.StringIO()
    assert w.watch(run, interval=0.1, out=out) == 0
    assert "waiting for" in out.getvalue() and "step 1/1  finished" in out.getvalue()


def test_pick_is_deterministic_best_worst_and_spread():
    rewards = [0.5, 1.0, -1.0, 0.0, 0.5, 0.2, 0.9, -0.5]
    assert pick(rewards, 3) == [1, 5, 2]  # best, the median rank, worst
    assert pick(rewards, 2) == [1, 2]
    assert pick(rewards, 1) == [1]
    assert sorted(pick(rewards, 20)) == list(range(8))
    assert pick(rewards, 0) == [] and pick([], 3) == []
    assert pick([0.0] * 4, 2) == [0, 3]  # ties by position
