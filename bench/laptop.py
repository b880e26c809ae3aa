"""Benchmark: the README's main job, `lite-verl train --preset laptop`, end to end on this machine.

    python -m bench.laptop [--set key=value ...]

Records wall time, steps/s, tokens/s (rollout and overall), the learning figures (reward first/last
10% of steps, greedy validation before/after) to bench/results.jsonl, then re-renders RESULTS.md.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.results import REPORT, append, render


def main(extra: list[str]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp) / "run"
        cmd = [
            sys.executable,
            "-m",
            "lite_verl",
            "train",
            "--preset",
            "laptop",
            "--run-dir",
            str(run),
            *extra,
        ]
        t0 = time.perf_counter()
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        wall = time.perf_counter() - t0
        summary = json.loads((run / "summary.json").read_text())
        rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        steps = [r for r in rows if "reward/mean" in r]
    shown = "lite-verl train --preset laptop " + " ".join(shlex.quote(a) for a in extra)
    settings = "defaults" + ("; " + " ".join(a for a in extra if a != "--set") if extra else "")
    model = "tiny:qwen2 (0.36M params, random init)"
    gen = sum(r["perf/gen_tokens_per_s"] for r in steps) / len(steps)
    figures = [
        ("wall_time_incl_startup", wall, "s"),
        ("train_wall_time", summary["wall_s"], "s"),
        ("steps_per_s", len(steps) / summary["wall_s"], "step/s"),
        ("tokens_per_s", summary["tokens_per_s"], "token/s"),
        ("rollout_gen_tokens_per_s", gen, "token/s"),
        ("reward_first_10pct", summary["reward_first_10pct"], "reward"),
        ("reward_last_10pct", summary["reward_last_10pct"], "reward"),
        ("val_reward_start_greedy", summary["val_reward_start"], "reward"),
        ("val_reward_end_greedy", summary["val_reward_end"], "reward"),
    ]
    for metric, value, unit in figures:
        row = append("laptop", model, settings, metric, float(value), unit, shown)
        print(f"{metric:<28} {value:10.3f} {unit}")
    REPORT.write_text(render())
    print(f"hardware: {row['hardware']}; appended to bench/results.jsonl, wrote {REPORT.name}")


if __name__ == "__main__":
    main(sys.argv[1:])
