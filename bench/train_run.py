"""`lite-verl train` as a subprocess for benchmarks, and the learning figures every run report shares."""

from __future__ import annotations

import itertools
import json
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any


def train_run(
    preset: str, run_dir: Path, sets: list[str]
) -> tuple[list[dict], list[dict], dict[str, Any], float]:
    """-> (per-step rows, validation rows, summary.json, process wall seconds); exits on failure. The run's
    output goes to <run_dir>.log as it comes; its progress lines ("step ...") and lite-verl's own messages
    are echoed to stderr, so a run cut short by a time limit still shows how far it got."""
    shutil.rmtree(run_dir, ignore_errors=True)
    cmd = [sys.executable, "-m", "lite_verl", "train", "--preset", preset, "--run-dir", str(run_dir)]
    for s in sets:
        cmd += ["--set", s]
    log = run_dir.parent / f"{run_dir.name}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    with (
        open(log, "w") as out,
        subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as proc,
    ):
        assert proc.stdout is not None
        for line in proc.stdout:
            out.write(line)
            if line.startswith(("step ", "lite-verl")):
                print(f"{run_dir.name}: {line.rstrip()}", file=sys.stderr, flush=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        print("".join(log.read_text().splitlines(keepends=True)[-40:]), file=sys.stderr)
        raise SystemExit(f"{run_dir.name}: lite-verl train failed ({proc.returncode}); whole output in {log}")
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if "reward/mean" in r]
    val = [r for r in rows if "val/reward_mean" in r]
    return train, val, json.loads((run_dir / "summary.json").read_text()), wall


def planned_peak_gib(run_dir: Path) -> float:
    """The plan's device-wide peak for a finished run (its config.yaml, auto knobs decided), on this machine's
    cards, as the run's own check sizes them (a 4090x1 layout on an H200 budgets vLLM's
    gpu_memory_utilization of the H200). Goal 4 of #29 compares it with the measured peak."""
    from lite_verl.model.load import resolve_model_path
    from lite_verl.run.rundir import load_run_config
    from lite_verl.tools.auto import card_sizes, detect
    from lite_verl.tools.plan import plan, shape_of

    cfg = load_run_config(run_dir, [])
    return sum(p.peak_gib for p in plan(cfg, shape_of(resolve_model_path(cfg.model)), card_sizes(detect())))


def gpu0_memory_gib(field: str) -> float:
    """GPU 0's memory.<field> (total, used) as nvidia-smi reports it, device-wide (every process), in GiB."""
    out = subprocess.run(["nvidia-smi", f"--query-gpu=memory.{field}", "--format=csv,noheader,nounits", "-i", "0"],
                         capture_output=True, text=True, check=True).stdout  # fmt: skip
    return float(out.split()[0]) / 1024


class PeakGpuMemory:
    """Device-wide peak memory used on GPU 0 (every process on it), sampled by nvidia-smi every 100 ms while
    the block runs; peak_gib stays None on a machine without nvidia-smi (a CPU run of a GPU bench)."""

    def __enter__(self):
        self.peak_gib: float | None = None
        self.proc = None
        if shutil.which("nvidia-smi"):
            self.proc = subprocess.Popen(
                ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits", "-lms", "100", "-i", "0"],
                stdout=subprocess.PIPE, text=True,
            )  # fmt: skip
        return self

    def __exit__(self, *exc):
        if self.proc is not None:
            self.proc.terminate()
            out, _ = self.proc.communicate(timeout=10)
            self.peak_gib = max((float(x) for x in out.split() if x.strip()), default=0.0) / 1024


class ProcessMemory:
    """Who holds the card: NVML's per-process memory on GPU 0 (what `nvidia-smi --query-compute-apps` lists)
    and the device's used memory, sampled every 100 ms while the block runs, to split a device-wide peak into
    the trainer, vLLM's worker and what no process accounts for (contexts of exited processes, the driver).
    figures() is {} without pynvml (vLLM brings it) or a GPU; timeline() is every sample, for reading."""

    def __enter__(self):
        self.samples: list[tuple[float, float, dict[int, float]]] = []  # (s, device GiB, {pid: GiB})
        self.labels: dict[int, str] = {}
        self._stop = threading.Event()
        self._thread = None
        try:
            import pynvml

            pynvml.nvmlInit()
            handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        except Exception as e:  # noqa: BLE001 - a CPU machine or no pynvml: no per-process figures
            print(f"per-process memory not sampled: {e}", file=sys.stderr)
            return self
        self._thread = threading.Thread(target=self._sample, args=(pynvml, handle), daemon=True)
        self._thread.start()
        return self

    def _sample(self, nvml, handle) -> None:
        t0 = time.perf_counter()
        while not self._stop.wait(0.1):
            used = nvml.nvmlDeviceGetMemoryInfo(handle).used / 2**30
            procs = {
                p.pid: (p.usedGpuMemory or 0) / 2**30
                for p in nvml.nvmlDeviceGetComputeRunningProcesses(handle)
            }
            for pid in procs:
                self.labels.setdefault(pid, _process_label(pid, len(self.labels)))
            self.samples.append((time.perf_counter() - t0, used, procs))

    def __exit__(self, *exc):
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def figures(self) -> dict[str, float]:
        """The device's peak sample split by process, and each process's own peak (GiB)."""
        if not self.samples:
            return {}
        _, used, procs = max(self.samples, key=lambda s: s[1])
        out = {"nvml_device_peak_gib": used, "at_peak_outside_processes_gib": used - sum(procs.values())}
        out |= {f"at_peak_{self.labels[pid]}_gib": gib for pid, gib in procs.items()}
        for pid, label in self.labels.items():
            out[f"{label}_peak_gib"] = max(s[2].get(pid, 0.0) for s in self.samples)
        return out

    def timeline(self) -> str:
        return "".join(json.dumps({"t": round(t, 2), "device": round(u, 3),
                                   **{self.labels[p]: round(g, 3) for p, g in procs.items()}}) + "\n"
                       for t, u, procs in self.samples)  # fmt: skip


def _process_label(pid: int, seen: int) -> str:
    """'trainer' for `lite-verl train` itself (rank 0 trains in the controller's process), 'worker' for a
    process it spawned (vLLM's, a rank's), 'procN' where the container hides the host's pids."""
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return f"proc{seen}"
    if "multiprocessing" in cmd:
        return f"worker{seen}"
    return "trainer" if "lite_verl" in cmd else f"proc{seen}"


def memory_figures(run_dir: Path, mem: PeakGpuMemory) -> dict[str, float]:
    """#29 goal 4 for one finished run: the measured device-wide peak, the plan's and its error (%); none on
    a machine without a GPU. Every GPU bench that runs `lite-verl train` reports these three."""
    if not mem.peak_gib:
        return {}
    plan = planned_peak_gib(run_dir)
    return {"device_peak_gib": mem.peak_gib, "plan_peak_gib": plan,
            "plan_error_pct": 100 * (plan - mem.peak_gib) / mem.peak_gib}  # fmt: skip


MEMORY_UNITS = {"device_peak_gib": "GiB", "plan_peak_gib": "GiB", "plan_error_pct": "%"}


def reward_curve(rows: list[dict]) -> list[tuple[int, float, float]]:
    """(step, wall seconds so far, mean reward) of a run's per-step rows (results.write_curve)."""
    clock = itertools.accumulate(r["timing/step_s"] for r in rows)
    return [(int(r["step"]), t, r["reward/mean"]) for r, t in zip(rows, clock)]


def learning_figures(train: list[dict], val: list[dict], summary: dict[str, Any]) -> dict[str, float]:
    k = max(len(train) // 10, 1)
    return {
        "reward_first_10pct": statistics.mean(r["reward/mean"] for r in train[:k]),
        "reward_last_10pct": statistics.mean(r["reward/mean"] for r in train[-k:]),
        "val_reward_start_greedy": val[0]["val/reward_mean"] if val else float("nan"),
        "val_reward_end_greedy": val[-1]["val/reward_mean"] if val else float("nan"),
        "train_wall_time": float(summary["wall_s"]),
    }


def single_process_group_env() -> None:
    """The torch.distributed variables `torchrun --nproc_per_node 1` would set, for TRL's vLLM colocate
    mode in this process (its engine joins a process group of one). Set after lite-verl's own runs, which
    are subprocesses that must not inherit them; values already set win."""
    import os

    from lite_verl.train.dist import free_port

    for key, value in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1",
                       "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}.items():  # fmt: skip
        os.environ.setdefault(key, value)
