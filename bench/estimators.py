"""Benchmark: every advantage estimator on the laptop job (same seed, same batch), learning and speed.

    python -m bench.estimators [estimator ...]

Per estimator: reward over the first / last 10% of steps, greedy validation at the end, wall time.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.results import REPORT, append, render
from lite_verl.config.validation import ADV_ESTIMATORS as ESTIMATORS


def main(names: list[str]) -> None:
    for est in names or ESTIMATORS:
        with tempfile.TemporaryDirectory() as tmp:
            run = Path(tmp) / "run"
            args = ["train", "--preset", "laptop", "--run-dir", str(run), "--set", f"algorithm.adv_estimator={est}",
                    "--set", "trainer.progress=false"]  # fmt: skip
            subprocess.run([sys.executable, "-m", "lite_verl", *args], check=True, stdout=subprocess.DEVNULL)
            s = json.loads((run / "summary.json").read_text())
        cmd = f"lite-verl train --preset laptop --set algorithm.adv_estimator={est}"
        for metric, value, unit in [
            ("reward_first_10pct", s["reward_first_10pct"], "reward"),
            ("reward_last_10pct", s["reward_last_10pct"], "reward"),
            ("val_reward_end_greedy", s["val_reward_end"], "reward"),
            ("train_wall_time", s["wall_s"], "s"),
        ]:
            append("estimators", "tiny:qwen2 (random init), echo task", f"adv_estimator={est}", metric, float(value),
                   unit, cmd)  # fmt: skip
        print(f"{est:<30} {s['reward_first_10pct']:.3f} -> {s['reward_last_10pct']:.3f}  {s['wall_s']:.0f}s")
    REPORT.write_text(render())


if __name__ == "__main__":
    main(sys.argv[1:])
