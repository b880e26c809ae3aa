"""Interruptions: SIGTERM stops cleanly with a checkpoint; kill -9 at a random moment loses at most a step."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_cli import cli, metrics

COMMON = ["--set", "trainer.batch_size=4", "--set", "rollout.n=4", "--set", "data.val_size=4",
          "--set", "data.task_size=64", "--set", "trainer.save_every=1"]  # fmt: skip


def _start(tmp_path: Path, run: str, steps: int) -> subprocess.Popen:
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    args = [
        sys.executable,
        "-m",
        "lite_verl",
        "train",
        "--run-dir",
        run,
        *COMMON,
        "--set",
        f"trainer.total_steps={steps}",
    ]
    return subprocess.Popen(
        args, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def _wait_for_step(run: Path, step: int, proc: subprocess.Popen, timeout: float = 300) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if (run / "checkpoints" / f"step_{step:08d}" / "state.json").is_file():
            return
        if proc.poll() is not None:
            raise AssertionError(f"the run ended early: {proc.stderr.read()[-2000:]}")  # type: ignore[union-attr]
        time.sleep(0.05)
    raise AssertionError("timed out waiting for a checkpoint")


@pytest.mark.slow
def test_sigterm_writes_a_checkpoint_and_says_how_to_resume(tmp_path):
    proc = _start(tmp_path, "run", 50)
    _wait_for_step(tmp_path / "run", 1, proc)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, err[-2000:]
    assert "stopped by SIGTERM" in err and "lite-verl train --resume" in err
    state = json.loads(
        sorted((tmp_path / "run" / "checkpoints").glob("step_*"))[-1].joinpath("state.json").read_text()
    )
    done = [m["step"] for m in metrics(tmp_path / "run") if "reward/mean" in m]
    assert state["step"] == done[-1] < 50  # the step in flight finished and was saved


@pytest.mark.slow
def test_kill_9_then_resume_equals_an_uninterrupted_run(tmp_path):
    steps = 6
    full = cli("train", "--run-dir", "full", *COMMON, "--set", f"trainer.total_steps={steps}", cwd=tmp_path)
    assert full.returncode == 0, full.stderr[-2000:]
    proc = _start(tmp_path, "killed", steps)
    _wait_for_step(tmp_path / "killed", 2, proc)
    time.sleep(random.uniform(0.0, 0.5))  # a random moment: mid-step, mid-write or mid-checkpoint
    proc.kill()
    proc.communicate()
    resumed = cli("train", "--resume", "killed", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    a = [m for m in metrics(tmp_path / "full") if "reward/mean" in m]
    b = [m for m in metrics(tmp_path / "killed") if "reward/mean" in m]
    assert [m["step"] for m in b] == list(range(1, steps + 1))
    for x, y in zip(a, b):
        assert x["reward/mean"] == y["reward/mean"]
        assert x["actor/loss"] == pytest.approx(y["actor/loss"], rel=1e-5, abs=1e-7)
        assert x["actor/grad_norm"] == pytest.approx(y["actor/grad_norm"], rel=1e-5)
    val_a = [m["val/reward_mean"] for m in metrics(tmp_path / "full") if "val/reward_mean" in m]
    val_b = [m["val/reward_mean"] for m in metrics(tmp_path / "killed") if "val/reward_mean" in m]
    assert val_a[-1] == val_b[-1]
    assert not list((tmp_path / "killed" / "checkpoints").glob(".step_*"))  # no half-written checkpoint left
    assert len(list((tmp_path / "killed" / "checkpoints").glob("step_*"))) == 2  # keep_checkpoints
