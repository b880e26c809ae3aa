"""What the user sees: a progress bar while training and a one-screen summary at the end."""

from __future__ import annotations

import sys
from typing import Any

from lite_verl.run.cost import BillRow, format_bill


class Progress:
    """tqdm bar on stderr: step, reward, tokens/s, ETA. On a non-terminal, one line every ~10%."""

    def __init__(self, total: int, initial: int, enabled: bool = True) -> None:
        self.total = total
        self.enabled = enabled
        self.tty = sys.stderr.isatty()
        self.bar = None
        if enabled and self.tty:
            from tqdm import tqdm

            self.bar = tqdm(total=total, initial=initial, desc="train", unit="step", dynamic_ncols=True)
        self.every = max(1, total // 10)

    def update(self, step: int, metrics: dict[str, float]) -> None:
        if not self.enabled:
            return
        reward = metrics.get("reward/mean", float("nan"))
        tps = metrics.get("perf/tokens_per_s", 0.0)
        if self.bar is not None:
            self.bar.set_postfix(reward=f"{reward:.3f}", tok_s=f"{tps:.0f}", refresh=False)
            self.bar.update(1)
        elif step % self.every == 0 or step == self.total:
            step_s = metrics.get("timing/step_s", 0.0)
            eta = step_s * (self.total - step)
            print(
                f"step {step}/{self.total}  reward {reward:.3f}  tokens/s {tps:.0f}  ETA {eta:.0f}s",
                file=sys.stderr,
                flush=True,
            )

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _fmt(v: Any, spec: str = ".3f") -> str:
    return "-" if v is None else format(v, spec)


def summary_text(s: dict[str, Any], bill_rows: list[BillRow]) -> str:
    lines = [
        "",
        "lite-verl run finished"
        if s.get("finished", True)
        else f"lite-verl run NOT finished ({s['steps']} steps done; wall time = the steps' own)",
        f"  run directory     {s['run_dir']}",
        f"  steps             {s['steps']}   wall time {s['wall_s']:.0f} s",
        f"  train reward      {_fmt(s['reward_first_10pct'])} (first 10% of steps) -> "
        f"{_fmt(s['reward_last_10pct'])} (last 10%)",
        f"  val reward        {_fmt(s['val_reward_start'])} (start) -> {_fmt(s['val_reward_end'])} (end, greedy)",
        f"  tokens/s          {_fmt(s['tokens_per_s'], '.0f')}",
        f"  checkpoint        {s['checkpoint'] or '-'}",
        "",
    ]
    if bill_rows or s.get("finished", True):
        lines += ["The bill (held = reserved for the role, busy = computing; prices from cost.price_per_hour):",
                  format_bill(bill_rows), ""]  # fmt: skip
    return "\n".join(lines)
