"""`lite-verl watch RUN`: follow a run from another terminal.

    lite-verl watch runs/20250101-120000-laptop          # refresh every 5 s until summary.json appears
    lite-verl watch RUN --once                           # one frame (scripts, tests)

A frame: step/total, the last reward mean, the last validation reward, the step time, a sparkline of
reward/mean over the last steps and the ETA from the mean step time. Everything comes from RUN/config.yaml
and RUN/metrics.jsonl, read only: watching never disturbs the run. Ctrl-C ends it (exit 0).
"""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from lite_verl.errors import UserError
from lite_verl.run.files import read_jsonl

BARS = "▁▂▃▄▅▆▇█"
SPARK_STEPS = 40


def sparkline(values: list[float]) -> str:
    """One block character per value, scaled from the smallest to the largest (flat: the middle one)."""
    vals = [v for v in values if math.isfinite(v)]
    if not vals:
        return ""
    lo, hi = min(vals), max(vals)
    if hi - lo < 1e-12:
        return BARS[len(BARS) // 2 - 1] * len(vals)
    return "".join(BARS[round((v - lo) / (hi - lo) * (len(BARS) - 1))] for v in vals)


def _duration(s: float) -> str:
    s = max(0, round(s))
    h, rest = divmod(s, 3600)
    m, sec = divmod(rest, 60)
    return f"{h}h{m:02d}m" if h else f"{m}m{sec:02d}s" if m else f"{sec}s"


START_WAIT_S = 300.0  # how long watch waits for a run directory that does not exist yet


def _total_steps(run: Path) -> int | None:
    try:
        cfg = yaml.safe_load((run / "config.yaml").read_text()) or {}
        return int(cfg["trainer"]["total_steps"])
    except (OSError, yaml.YAMLError, KeyError, TypeError, ValueError):
        return None


def check_run_dir(run: Path) -> None:
    if not (run / "config.yaml").is_file():
        raise UserError(
            f"{run} is not a lite-verl run directory (no config.yaml); give one made by lite-verl train"
        )


def _wait_for_run(run: Path, limit_s: float, out: Any) -> None:
    """Until RUN/config.yaml exists or limit_s pass (then check_run_dir says what is missing)."""
    deadline = time.monotonic() + limit_s
    if not (run / "config.yaml").is_file():
        print(
            f"waiting for {run} (lite-verl train writes it once the model and data are loaded)",
            file=out,
            flush=True,
        )
    while not (run / "config.yaml").is_file() and time.monotonic() < deadline:
        time.sleep(0.5)


def frame(run: Path) -> str:
    """The run's state now, a few lines."""
    total = _total_steps(run)
    all_rows = read_jsonl(run / "metrics.jsonl")  # not rundir.read_metrics: that module imports torch
    rows = [m for m in all_rows if "reward/mean" in m]
    vals = [m for m in all_rows if "val/reward_mean" in m]
    finished = (run / "summary.json").is_file()
    step = rows[-1]["step"] if rows else 0
    state = "finished" if finished else "running" if rows else "starting"
    head = f"{run.name}  step {step}/{total if total is not None else '?'}  {state}"
    if not rows:
        return head + "\n(no step logged yet)"
    last = rows[-1]
    parts = [f"reward {last['reward/mean']:.4f}"]
    if vals:
        parts.append(f"val reward {vals[-1]['val/reward_mean']:.4f} (step {vals[-1]['step']})")
    times = [m["timing/step_s"] for m in rows if isinstance(m.get("timing/step_s"), (int, float))]
    if times:
        parts.append(f"step {times[-1]:.2f} s")
    if total is not None and times and not finished:
        parts.append(f"ETA {_duration(max(0, total - step) * sum(times) / len(times))}")
    recent = rows[-SPARK_STEPS:]
    rewards = [float(m["reward/mean"]) for m in recent]
    spark = (
        f"reward/mean {sparkline(rewards)}  steps {recent[0]['step']}-{recent[-1]['step']}, "
        f"min {min(rewards):.4f} max {max(rewards):.4f}"
    )
    return "\n".join([head, "  ".join(parts), spark])


def watch(run_dir: str | Path, once: bool = False, interval: float = 5.0, out: Any = None) -> int:
    """Print frames until the run's summary.json appears (or once); Ctrl-C ends it. -> exit code 0."""
    run = Path(run_dir)
    out = out or sys.stdout
    clear = "\033[H\033[J" if out.isatty() and not once else ""
    try:
        if not once:  # started beside `lite-verl train`: its directory appears after the model and data load
            _wait_for_run(run, START_WAIT_S, out)
        check_run_dir(run)
        while True:
            done = (run / "summary.json").is_file()
            print(clear + frame(run), file=out, flush=True)
            if once or done:
                return 0
            time.sleep(interval)
            if not clear:
                print(file=out)
    except KeyboardInterrupt:
        return 0
