"""Fault injection over the files a run writes (tests/faults/sitecustomize.py makes one write fail with ENOSPC,
as a full disk does): one line naming the file and the way out, exit 2, no half-made run directory, the last
checkpoint intact, and `--resume` finishing the run once the disk has room again."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

FAULTS = Path(__file__).parent / "faults"
RUN = ["--set", "trainer.batch_size=4", "--set", "rollout.n=4", "--set", "data.val_size=8", "--set",
       "data.task_size=64", "--set", "trainer.total_steps=4", "--set", "trainer.save_every=2", "--set",
       "trainer.progress=false"]  # fmt: skip


def lite_verl(cwd: Path, *args: str, fault: str = "", after: int = 0) -> subprocess.CompletedProcess:
    root = str(Path(__file__).parents[1])
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "LITE_VERL_FAULT": fault, "LITE_VERL_FAULT_AFTER": str(after),
           "PYTHONPATH": os.pathsep.join([str(FAULTS), root, os.environ.get("PYTHONPATH", "")])}  # fmt: skip
    return subprocess.run([sys.executable, "-m", "lite_verl", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=600)  # fmt: skip


def steps(run: Path) -> list[int]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [r["step"] for r in rows if "reward/mean" in r]


def error_line(out: subprocess.CompletedProcess) -> str:
    assert out.returncode == 2, out.stderr[-3000:]
    assert "Traceback" not in out.stderr, out.stderr[-3000:]
    errors = [line for line in out.stderr.splitlines() if line.startswith("lite-verl: error:")]
    assert len(errors) == 1, out.stderr[-3000:]
    return errors[0]


@pytest.mark.parametrize("fault", [r"/run/\.lock$", r"/run/config\.yaml$", r"/run/env\.json$", r"/run/tb/"])
def test_a_full_disk_while_the_run_starts_leaves_no_run_directory(tmp_path, fault):
    out = lite_verl(tmp_path, "train", "--run-dir", "run", *RUN, fault=fault)
    line = error_line(out)
    assert "No space left on device" in line and "free space there" in line and str(tmp_path / "run") in line
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    "fault, kept",
    [(r"/run/samples\.jsonl$", [2]), (r"/run/checkpoints/step_0+4$", [2]), (r"/run/summary\.json$", [2, 4])],
)
def test_a_full_disk_mid_run_keeps_the_checkpoints_and_resume_finishes(tmp_path, fault, kept):
    """samples.jsonl at step 2 (after its checkpoint), the last checkpoint's rename, the summary at the end."""
    out = lite_verl(tmp_path, "train", "--run-dir", "run", *RUN, fault=fault)
    line = error_line(out)
    assert "No space left on device" in line or "could not be written" in line
    assert f"resume with: lite-verl train --resume {tmp_path / 'run'}" in out.stderr
    run = tmp_path / "run"
    assert sorted(int(p.name.split("_")[1]) for p in (run / "checkpoints").glob("step_*")) == kept
    assert not list((run / "checkpoints").glob(".step_*"))  # no half-written checkpoint
    out = lite_verl(tmp_path, "train", "--resume", "run")
    assert out.returncode == 0, out.stderr[-3000:]
    assert steps(run) == [1, 2, 3, 4] and json.loads((run / "summary.json").read_text())["steps"] == 4


def test_a_full_disk_in_the_first_steps_keeps_their_metrics_and_says_why(tmp_path):
    out = lite_verl(tmp_path, "train", "--run-dir", "run", *RUN, fault=r"/run/metrics\.jsonl$", after=2)
    assert "could not write" in error_line(out)
    assert "keeps the metrics and logs of 1 step(s) and says why in FAILED" in out.stderr
    assert "No space left on device" in (tmp_path / "run" / "FAILED").read_text()
