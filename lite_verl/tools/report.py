"""`lite-verl report RUN`: the run's bill and numbers as a table, a what-if for the other placement,
and PNG plots (reward, tokens/s, per-role time line, cost over time) in RUN/report/.

Everything comes from the run directory (config.yaml, metrics.jsonl, summary.json), so a report can be
made again at any time, on any machine. Plots need matplotlib (`pip install 'lite-verl[report]'`);
without it the table is still printed and one line says how to get the plots.
"""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from lite_verl.config import Config
from lite_verl.errors import UserError
from lite_verl.run.cost import BillRow

PHASES = ("rollout", "reward", "sleep", "update", "sync")  # sleep: a colocated vLLM freeing its memory


def _load(run_dir: Path) -> tuple[Config, list[dict[str, Any]], dict[str, Any]]:
    from lite_verl.run.rundir import load_run_config, read_metrics

    cfg = load_run_config(run_dir, [])  # not a run directory: one line saying so
    rows = [m for m in read_metrics(run_dir) if "reward/mean" in m]
    if (run_dir / "summary.json").is_file():
        return cfg, rows, json.loads((run_dir / "summary.json").read_text())
    if not rows:
        raise UserError(
            f"{run_dir} has no finished step yet: nothing to report (lite-verl watch follows a run)"
        )
    # interrupted, failed or still running: what its metrics say (no bill: the ledger lives in the process)
    from lite_verl.run.rundir import RunDir, metrics_summary

    ckpt = RunDir(run_dir).latest_checkpoint(quiet=True)
    summary = {**metrics_summary(run_dir), "wall_s": sum(m.get("timing/step_s", 0.0) for m in rows),
               "checkpoint": str(ckpt or ""), "bill": [], "finished": False}  # fmt: skip
    return cfg, rows, summary


def what_if(cfg: Config, rows: list[dict[str, Any]]) -> str:
    """The same run priced under the other placement, from its measured phase times per step.

    colocated: one set of GPUs does every phase in turn; split with one-step-off-policy: the rollout of
    step k+1 overlaps reward + update of step k, so a step takes max(rollout, reward + update) + sync
    on the train GPUs plus as many rollout GPUs again (same GPU model)."""
    if not cfg.train.gpus:
        return "what-if: the run used no GPU; nothing to compare"
    t = {p: [m.get(f"timing/{p}_s", 0.0) for m in rows] for p in PHASES}
    serial = sum(sum(v) for v in t.values())
    overlapped = sum(
        max(r, w + z + u) + s
        for r, w, z, u, s in zip(t["rollout"], t["reward"], t["sleep"], t["update"], t["sync"])
    )
    prices = cfg.cost.price_per_hour
    models = cfg.cost.gpu_models
    train_price = sum(prices.get(models[g], 0.0) for g in cfg.train.gpus)
    colocated = bool(cfg.rollout.gpus) and cfg.rollout.gpus == cfg.train.gpus and cfg.rollout.colocate
    if colocated:
        wall, gpus, price = overlapped, 2 * len(cfg.train.gpus), 2 * train_price
        other = f"split (rollout on {len(cfg.train.gpus)} more GPU(s) of the same model, one-step-off-policy)"
    else:
        wall, gpus, price = serial, len(cfg.train.gpus), train_price
        other = "colocated (rollout and training share the train GPUs, in turn)"
    return (
        f"what-if {other}: ~{wall:.0f} s of steps on {gpus} GPU(s), ~{wall / 3600 * price:.4f} USD "
        f"(from this run's per-step phase times; validation and start-up not included)"
    )


def report_text(run_dir: Path) -> str:
    from lite_verl.run.console import summary_text

    cfg, rows, summary = _load(run_dir)
    bill = [BillRow(**b) for b in summary.get("bill", [])]
    lines = [summary_text(summary, bill).rstrip(), what_if(cfg, rows)]
    if rows:
        share = {p: sum(m.get(f"timing/{p}_s", 0.0) for m in rows) for p in PHASES}
        total = sum(share.values()) or 1.0
        lines.append("step time by phase: " + ", ".join(f"{p} {v / total:.0%}" for p, v in share.items()))
        overlap = sum(m.get("perf/overlap_s", 0.0) for m in rows)
        if overlap:
            lines.append(f"rollout overlapped with updates for {overlap:.1f} s (rollout.max_staleness=1)")
    lines.extend(samples_lines(run_dir))
    from lite_verl.tools.evaluate import eval_lines

    lines.extend(eval_lines(run_dir))
    return "\n".join(lines)


def samples_lines(run_dir: Path, width: int = 160) -> list[str]:
    """The best and the worst sample of the last step in RUN/samples.jsonl; [] without one."""
    from lite_verl.run.samples import best_and_worst

    found = best_and_worst(run_dir)
    if found is None:
        return []
    step, rows = found
    lines = [f"samples of step {step} (RUN/samples.jsonl):"]
    for label, r in zip(("best", "worst"), rows):
        parts = ", ".join(f"{k} {v:.3g}" if v is not None else f"{k} -" for k, v in r["reward_parts"].items())
        adv = f", advantage {r['advantage']:.3g}" if r.get("advantage") is not None else ""
        lines.append(
            f"  {label}: reward {r['reward']:.3g}{f' ({parts})' if parts else ''}{adv}, "
            f"{r['length']} tokens, {r['finish']}"
        )
        for what in ("prompt", "completion"):
            text = json.dumps(r[what], ensure_ascii=False)  # one line: newlines escaped
            lines.append(f"    {what}: {text if len(text) <= width else text[: width - 3] + '...'}")
    return lines


def write_plots(run_dir: Path) -> list[Path]:
    """reward.png, tokens_per_s.png, timeline.png, cost.png in RUN/report/ -> their paths."""
    if importlib.util.find_spec("matplotlib") is None:
        return []
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from lite_verl.run.rundir import read_metrics

    _, rows, summary = _load(run_dir)
    vals = [m for m in read_metrics(run_dir) if "val/reward_mean" in m]
    draws: dict[str, Callable[[Any], None]] = {
        "reward.png": lambda ax: _draw_reward(ax, rows, vals),
        "tokens_per_s.png": lambda ax: _draw_tokens_per_s(ax, rows),
        "timeline.png": lambda ax: _draw_timeline(ax, rows),
        "cost.png": lambda ax: _draw_cost(ax, rows, summary),
    }
    out = run_dir / "report"
    out.mkdir(exist_ok=True)
    paths = []
    for name, draw in draws.items():
        fig, ax = plt.subplots(figsize=(6, 3.5))
        draw(ax)
        fig.tight_layout()
        fig.savefig(out / name, dpi=100)
        plt.close(fig)
        paths.append(out / name)
    return paths


def _draw_reward(ax: Any, rows: list[dict[str, Any]], vals: list[dict[str, Any]]) -> None:
    """Train reward per step, and the greedy validation reward where the run validated."""
    ax.plot([m["step"] for m in rows], [m["reward/mean"] for m in rows], label="train reward (mean)")
    if vals:
        ax.plot(
            [m["step"] for m in vals], [m["val/reward_mean"] for m in vals], "o-", label="validation (greedy)"
        )
    ax.set_xlabel("step")
    ax.set_ylabel("reward")
    ax.legend()


def _draw_tokens_per_s(ax: Any, rows: list[dict[str, Any]]) -> None:
    steps = [m["step"] for m in rows]
    ax.plot(steps, [m.get("perf/tokens_per_s", 0.0) for m in rows], label="all tokens / step time")
    ax.plot(
        steps, [m.get("perf/gen_tokens_per_s", 0.0) for m in rows], label="generated tokens / rollout time"
    )
    ax.set_xlabel("step")
    ax.set_ylabel("tokens/s")
    ax.legend()


def _draw_timeline(ax: Any, rows: list[dict[str, Any]]) -> None:
    """Per-role busy time line: phase seconds per step, stacked."""
    steps = [m["step"] for m in rows]
    bottom = [0.0] * len(rows)
    for p in PHASES:
        v = [m.get(f"timing/{p}_s", 0.0) for m in rows]
        ax.bar(steps, v, bottom=bottom, label=p, width=1.0)
        bottom = [b + x for b, x in zip(bottom, v)]
    ax.set_xlabel("step")
    ax.set_ylabel("seconds")
    ax.legend()


def _draw_cost(ax: Any, rows: list[dict[str, Any]], summary: dict[str, Any]) -> None:
    """Cost accrues with step time at the run's hourly rate, up to the bill's total."""
    wall = summary.get("wall_s") or 0.0
    total = sum(b["cost_usd"] for b in summary.get("bill", []))
    elapsed, t = [], 0.0
    for m in rows:
        t += m.get("timing/step_s", 0.0)
        elapsed.append(t)
    scale = total / elapsed[-1] if elapsed and elapsed[-1] > 0 else 0.0
    ax.plot(elapsed, [e * scale for e in elapsed])
    ax.set_xlabel(f"step time, s (run wall time {wall:.0f} s)")
    ax.set_ylabel("USD")


def report(run_dir: str | Path, plots: bool = True) -> str:
    run = Path(run_dir)
    text = report_text(run)
    if plots:
        written = write_plots(run)
        if written:
            text += "\nplots: " + ", ".join(str(p) for p in written)
        else:
            text += "\nplots: matplotlib is not installed; install it with: pip install 'lite-verl[report]'"
    from lite_verl.run.files import atomic_write_text

    atomic_write_text(run / "report.txt", text + "\n")
    return text
