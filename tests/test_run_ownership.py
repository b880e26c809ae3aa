"""One process owns a run directory (RUN/.lock), and a resume checks what it resumes (run/resume.py)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import SMALL
from test_cli import cli, metrics

from lite_verl.config import all_keys, load_config
from lite_verl.run import lock as lock_module
from lite_verl.run.lock import RunDirBusy, RunLock
from lite_verl.run.resume import RESUME_FIXED, RESUME_SAFE, covers
from lite_verl.run.rundir import HISTORY, RunDir, load_run_config, read_history

SETS = [arg for item in SMALL for arg in ("--set", item)]

# holds RUN/.lock until killed; with "fork", also forks a child that outlives it
HOLDER = """
import os, sys, time
from lite_verl.run.lock import RunLock
lock = RunLock(sys.argv[1]).acquire()
if sys.argv[2:] == ["fork"]:
    r, w = os.pipe()
    child = os.fork()
    if child == 0:  # past the fork hooks: says so, then outlives its parent
        os.write(w, b"x")
        time.sleep(120)
        os._exit(0)
    os.read(r, 1)
    print(child, flush=True)
print("ready", flush=True)
time.sleep(120)
"""


def _hold(run: Path, *extra: str) -> tuple[subprocess.Popen, list[str]]:
    """A process holding the run's lock, and what it printed before it was ready."""
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(run), *extra], stdout=subprocess.PIPE, text=True
    )
    lines = []
    while (line := proc.stdout.readline().strip()) != "ready":  # type: ignore[union-attr]
        assert line, "the holder died before taking the lock"
        lines.append(line)
    return proc, lines


def _snapshot(run: Path) -> dict[str, tuple[int, int, bytes]]:
    """Every file under `run`: (size, mtime, content)."""
    return {
        str(p.relative_to(run)): (p.stat().st_size, p.stat().st_mtime_ns, p.read_bytes())
        for p in sorted(run.rglob("*"))
        if p.is_file()
    }


def _one_error(out: subprocess.CompletedProcess) -> str:
    assert out.returncode == 2, (out.returncode, out.stderr[-2000:])
    assert "Traceback" not in out.stderr
    errors = [line for line in out.stderr.splitlines() if line.startswith("lite-verl: error:")]
    assert len(errors) == 1, out.stderr
    return errors[0]


# --- ownership -------------------------------------------------------------------------------------------
def test_train_and_resume_of_a_held_run_dir_are_refused_and_write_nothing(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    RunDir(run).write_config(load_config("laptop", None, SMALL))  # a run in progress
    holder, _ = _hold(run)
    try:
        before = _snapshot(run)
        for args in (["--run-dir", "run", *SETS], ["--resume", "run", "--set", "trainer.total_steps=9"]):
            error = _one_error(cli("train", *args, cwd=tmp_path))
            assert f"run directory {run} is in use by pid {holder.pid} on {socket.gethostname()}" in error
            assert _snapshot(run) == before
    finally:
        holder.kill()
        holder.wait()


def test_an_empty_dir_taken_by_another_process_while_preparing_is_left_alone(tmp_path):
    """The holder took the directory after this train's first check: refused when it takes the lock."""
    run = tmp_path / "run"
    run.mkdir()
    holder, _ = _hold(run)
    try:
        before = _snapshot(run)
        error = _one_error(
            cli("train", "--run-dir", "run", *SETS, "--set", "trainer.total_steps=1", cwd=tmp_path)
        )
        assert f"is in use by pid {holder.pid}" in error
        assert _snapshot(run) == before and sorted(os.listdir(run)) == [".lock"]
    finally:
        holder.kill()
        holder.wait()


def test_an_existing_empty_dir_is_usable(tmp_path):
    (tmp_path / "run").mkdir()
    out = cli("train", "--run-dir", "run", *SETS, "--set", "trainer.total_steps=1", cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    assert (tmp_path / "run" / "config.yaml").is_file()
    assert [m["step"] for m in metrics(tmp_path / "run") if "reward/mean" in m] == [1]
    assert not (tmp_path / "run" / ".lock").exists()  # released, and removed, at the end


@pytest.mark.parametrize("how", ["exception", "SIGTERM", "SIGKILL with a forked child alive"])
def test_the_lock_is_released_on_every_exit(tmp_path, how):
    run = tmp_path / "run"
    run.mkdir()
    if how == "exception":
        with pytest.raises(ValueError), RunLock(run):
            with pytest.raises(RunDirBusy):
                RunLock(run).acquire()
            raise ValueError
        RunLock(run).acquire().release()
        return
    holder, printed = _hold(run, *(["fork"] if "fork" in how else []))
    try:
        with pytest.raises(RunDirBusy, match=f"pid {holder.pid}"):
            RunLock(run).acquire()
        holder.send_signal(signal.SIGTERM if how == "SIGTERM" else signal.SIGKILL)
        holder.wait()
        RunLock(run).acquire().release()  # free: a forked child of the holder does not keep it
        if printed:
            os.kill(int(printed[0]), 0)  # the child is still alive
    finally:
        holder.kill()
        holder.wait()
        if printed:
            os.kill(int(printed[0]), signal.SIGKILL)


def test_a_lock_file_removed_by_its_releasing_owner_is_not_a_lock(tmp_path):
    """B opened RUN/.lock while A held it; A removed it and let go; B's flock of the removed file then
    succeeds, so acquire() checks that the file it locked is still RUN/.lock (else it locks the new one)."""
    import fcntl

    a = RunLock(tmp_path).acquire()
    fd = os.open(tmp_path / ".lock", os.O_RDWR)
    try:
        a.release()
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        assert not lock_module._same_file(fd, tmp_path / ".lock")
        RunLock(tmp_path).acquire().release()  # the run is free: the removed file locks nothing
    finally:
        os.close(fd)


def test_without_fcntl_an_exclusive_lock_file_names_its_holder_and_a_stale_one_is_taken_over(
    tmp_path, monkeypatch
):
    monkeypatch.setattr(lock_module, "fcntl", None)
    run = tmp_path
    lock = RunLock(run).acquire()
    assert json.loads((run / ".lock").read_text())["pid"] == os.getpid()
    with pytest.raises(RunDirBusy, match=f"in use by pid {os.getpid()}"):
        RunLock(run).acquire()
    lock.release()
    assert not (run / ".lock").exists()
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    stale = {
        "pid": int(dead.stdout),
        "host": socket.gethostname(),
        "command": "lite-verl train",
        "since": "-",
    }
    (run / ".lock").write_text(json.dumps(stale))
    with RunLock(run):  # its process is gone: taken over
        assert json.loads((run / ".lock").read_text())["pid"] == os.getpid()
    assert not (run / ".lock").exists()


# --- what a resume may change ----------------------------------------------------------------------------
def test_every_config_key_is_either_refused_or_accepted_on_resume():
    for key in all_keys():
        fixed = any(covers(group, key) for group in RESUME_FIXED)
        assert fixed != covers(RESUME_SAFE, key), f"{key}: classify it in lite_verl/run/resume.py"
    names = [*RESUME_SAFE, *(k for group in RESUME_FIXED for k in group)]
    stale = [n for n in names if not any(k == n or k.startswith(n + ".") for k in all_keys())]
    assert not stale, stale


@pytest.fixture(scope="module")
def two_steps(tmp_path_factory) -> Path:
    """A finished run of 2 steps with a checkpoint after each."""
    home = tmp_path_factory.mktemp("base")
    out = cli("train", "--run-dir", "run", *SETS, "--set", "trainer.total_steps=2", "--set", "trainer.save_every=1",
              cwd=home)  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    return home / "run"


def _copy(run: Path, tmp_path: Path) -> Path:
    shutil.copytree(run, tmp_path / "run")
    return tmp_path / "run"


def test_resume_refuses_a_change_of_what_the_checkpoint_means(two_steps, tmp_path):
    run = _copy(two_steps, tmp_path)
    config = yaml.safe_load((run / "config.yaml").read_text())
    before = _snapshot(run)
    for key, new in (("model.path", "tiny:llama"), ("train.lora_rank", 4)):
        section, name = key.split(".")
        old = config[section][name]
        error = _one_error(cli("train", "--resume", "run", "--set", f"{key}={new}", cwd=tmp_path))
        assert f"--set {key}: the checkpoint has {old!r}, --set gives {new!r}" in error
        assert "the checkpoint's tensors were made for it" in error
        assert _snapshot(run) == before  # config.yaml as it was, no history, no lock file left


def test_resume_to_fewer_steps_than_the_checkpoint_is_refused_and_changes_nothing(two_steps, tmp_path):
    run = _copy(two_steps, tmp_path)
    before = _snapshot(run)
    error = _one_error(cli("train", "--resume", "run", "--set", "trainer.total_steps=1", cwd=tmp_path))
    assert "the run is already at step 2; set trainer.total_steps to 2 or more" in error
    assert _snapshot(run) == before  # no history row: `watch` would otherwise show step 2/1


def test_resume_with_more_steps_keeps_config_yaml_and_records_the_change(two_steps, tmp_path):
    run = _copy(two_steps, tmp_path)
    original = (run / "config.yaml").read_text()
    out = cli("train", "--resume", "run", "--set", "trainer.total_steps=3", cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    assert (run / "config.yaml").read_text() == original
    [row] = read_history(run)
    assert row["step"] == 2 and row["changes"] == {"trainer.total_steps": {"old": 2, "new": 3}}
    assert [m["step"] for m in metrics(run) if "reward/mean" in m] == [1, 2, 3]
    assert load_run_config(run, []).trainer.total_steps == 3  # a later resume (or report) keeps the change
    assert (run / HISTORY).read_text().endswith("\n")


def test_a_damaged_latest_checkpoint_falls_back_to_the_one_before_with_a_warning(two_steps, tmp_path):
    run = _copy(two_steps, tmp_path)
    weights = run / "checkpoints" / "step_00000002" / "adapter" / "adapter_model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])  # cut short
    out = cli("train", "--resume", "run", "--set", "trainer.total_steps=3", cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    warnings = [line for line in out.stderr.splitlines() if "warning: skipping checkpoint" in line]
    assert len(warnings) == 1 and "step_00000002" in warnings[0], out.stderr
    assert "adapter/adapter_model.safetensors has 100 bytes" in warnings[0]
    assert [m["step"] for m in metrics(run) if "reward/mean" in m] == [1, 2, 3]  # step 2 redone
    assert read_history(run)[0]["step"] == 1
    assert RunDir(run).latest_checkpoint() == run / "checkpoints" / "step_00000003"


def test_checkpoint_problems_are_found_by_reading_only(tmp_path, capsys):
    """Truncated state.json, a missing file: skipped for the one before, with one warning line each."""
    import torch

    class Backend:
        def save(self, directory: Path) -> None:
            torch.save({"w": torch.zeros(4)}, directory / "model.pt")

    run = RunDir(tmp_path / "run")
    with run.create(load_config("laptop", None, [])):
        for step in (1, 2, 3):
            run.save_checkpoint(step, Backend(), {"consumed": 4 * step}, keep=3)
    step = [run.checkpoints / f"step_0000000{i}" for i in (1, 2, 3)]
    assert run.latest_checkpoint() == step[2]
    state = step[2] / "state.json"
    state.write_text(state.read_text()[:20])
    (step[1] / "model.pt").unlink()
    assert run.latest_checkpoint() == step[0]
    lines = capsys.readouterr().err.splitlines()
    assert (
        len(lines) == 2
        and "state.json is missing or unreadable" in lines[0]
        and "model.pt is missing" in lines[1]
    )
    legacy = json.loads((step[0] / "state.json").read_text())
    del legacy["files"]  # a checkpoint written before they listed their files still counts
    (step[0] / "state.json").write_text(json.dumps(legacy))
    assert run.latest_checkpoint(quiet=True) == step[0]


def test_a_run_made_with_relative_paths_resumes_from_another_directory(tmp_path):
    """RUN/config.yaml holds the local paths made absolute (config/paths.py): a data file and a reward file
    given relative to where `train` ran still resolve when --resume is typed elsewhere."""
    home, elsewhere = tmp_path / "home", tmp_path / "elsewhere"
    home.mkdir(), elsewhere.mkdir()
    rows = [{"prompt": f"Repeat the letter {c}.", "answer": c} for c in "abcdefgh"]
    (home / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (home / "rw.py").write_text(
        "def score(completions, answer, **kw):\n    return [float(a in c) for c, a in zip(completions, answer)]\n"
    )
    out = cli("train", "--run-dir", "run", *SETS, "--set", "trainer.total_steps=1", "--set", "data.train_files=[data.jsonl]",
              "--set", "data.answer_key=answer", "--set", "data.val_split=", "--set", "reward.function=rw.py:score", cwd=home)  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    config = yaml.safe_load((home / "run" / "config.yaml").read_text())
    assert config["data"]["train_files"] == [str(home / "data.jsonl")]
    assert config["reward"]["function"] == f"{home / 'rw.py'}:score"
    out = cli("train", "--resume", "../home/run", "--set", "trainer.total_steps=2", cwd=elsewhere)
    assert out.returncode == 0, out.stderr[-2000:]
    assert [m["step"] for m in metrics(home / "run") if "reward/mean" in m] == [1, 2]
