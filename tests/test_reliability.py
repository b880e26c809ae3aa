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


def test_a_checkpoint_the_disk_cannot_hold_is_one_clear_error_and_keeps_the_last_one(tmp_path):
    """A full disk mid-save (torch.save's "unexpected pos"): one line naming the step, the directory, the
    free space and the ways out; no temp directory left; the previous checkpoint is still complete."""
    import torch

    from lite_verl.config import load_config
    from lite_verl.errors import UserError
    from lite_verl.run.rundir import RunDir

    class Backend:  # what a backend's save does when the disk fills: part of a file, then an error
        fail = False

        def save(self, directory: Path) -> None:
            torch.save({"w": torch.zeros(4)}, directory / "model.pt")
            if self.fail:
                raise RuntimeError(
                    "[enforce fail at inline_container.cc:672] . unexpected pos 20415564352 vs 2041"
                )

    run = RunDir(tmp_path / "run")
    run.create(load_config("laptop", None, []))
    backend = Backend()
    run.save_checkpoint(1, backend, {"consumed": 4}, keep=2)
    backend.fail = True
    with pytest.raises(UserError) as err:
        run.save_checkpoint(2, backend, {"consumed": 8}, keep=2)
    message = str(err.value)
    assert "\n" not in message
    assert "checkpoint of step 2 could not be written" in message and "unexpected pos" in message
    assert "GiB free there" in message and "trainer.keep_checkpoints=0" in message
    assert sorted(p.name for p in run.checkpoints.iterdir()) == ["step_00000001"]
    assert run.latest_checkpoint() == run.checkpoints / "step_00000001"


def test_keep_checkpoints_0_writes_none(tmp_path):
    out = cli("train", "--preset", "laptop", "--run-dir", "run", "--set", "trainer.total_steps=2",
              "--set", "trainer.keep_checkpoints=0", *COMMON, cwd=tmp_path)  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert len(metrics(tmp_path / "run")) >= 2
    assert not list((tmp_path / "run").glob("checkpoints/*"))
    out = cli("export", "run", "merged", cwd=tmp_path)
    assert out.returncode != 0 and "keep_checkpoints > 0" in out.stderr


def test_written_files_follow_the_umask(tmp_path):
    """mkstemp and safetensors create 0600 files, which a rename keeps: a run, a checkpoint or an export
    another user (a vLLM server, a teammate's watch) must read gets the modes a plain open() would."""
    import torch
    from safetensors.torch import save_file

    from lite_verl.run.files import atomic_directory, atomic_write_text

    old = os.umask(0o022)
    try:
        atomic_write_text(tmp_path / "config.yaml", "a: 1\n")
        with atomic_directory(tmp_path / "ckpt") as tmp:
            save_file({"w": torch.zeros(2)}, str(tmp / "model.safetensors"))
            (tmp / "adapter").mkdir()
    finally:
        os.umask(old)
    modes = {
        p.name: p.stat().st_mode & 0o777
        for p in [tmp_path / "config.yaml", *(tmp_path / "ckpt").rglob("*"), tmp_path / "ckpt"]
    }
    assert modes == {"config.yaml": 0o644, "model.safetensors": 0o644, "adapter": 0o755, "ckpt": 0o755}
