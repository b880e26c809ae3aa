"""The model card (README.md) of an exported run: what it was trained from, how, how far, how well, at what cost."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from lite_verl.config import Config

CARD_MARK = "Trained with lite-verl"  # tools/export.py: an OUT holding a card with it is an earlier export


def _json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def _evals(run: Path) -> list[str]:
    """RUN/eval/step_N.json (lite-verl eval of a checkpoint) as markdown table rows."""
    rows = []
    for path in sorted((run / "eval").glob("step_*.json")):
        result = _json(path)
        for source, s in result.get("scores", {}).items():
            k = result.get("k", 4)
            cells = [path.stem, source, f"{_num(s, 'prompts'):.0f}", *(f"{_num(s, c):.4f}"
                     for c in ("greedy_acc", "greedy", f"mean@{k}", f"pass@{k}"))]  # fmt: skip
            rows.append("| " + " | ".join(cells) + " |")
    if not rows:
        return []
    head = "| checkpoint | data_source | prompts | greedy accuracy | greedy reward | mean@k | pass@k |"
    return ["## Evaluation (`lite-verl eval`)", "", head, "|" + "---|" * 7, *rows, ""]


def _bill(summary: dict[str, Any]) -> list[str]:
    rows = summary.get("bill") or []
    if not rows:
        return []
    out = ["## Bill", "", "| role | device | GPU model | held s | busy s | USD |", "|" + "---|" * 6]
    for r in rows:
        out.append(f"| {r.get('role')} | {r.get('device')} | {r.get('model')} | {_num(r, 'held_s'):.0f} | "
                   f"{_num(r, 'busy_s'):.0f} | {_num(r, 'cost_usd'):.4f} |")  # fmt: skip
    return [*out, ""]


def _num(data: dict[str, Any], key: str) -> float:
    value = data.get(key)
    return float(value) if isinstance(value, (int, float)) else float("nan")


def _front_matter(cfg: Config, fmt: str) -> list[str]:
    from lite_verl.model.hub import parse_hub_id

    base = cfg.model.path
    library = {"gguf": "gguf", "adapter": "peft"}.get(fmt, "transformers")
    lines = ["---", "library_name: " + library,
             "tags: [lite-verl, reinforcement-learning, " + cfg.algorithm.adv_estimator + "]"]  # fmt: skip
    hub = parse_hub_id(base) if not Path(base).expanduser().exists() else None
    if hub:  # a Hub id, not a local directory that looks like one
        lines.append(f"base_model: {hub[0]}")
    return [*lines, "---", ""]


def model_card(run: Path, cfg: Config, fmt: str, files: list[str]) -> str:
    summary = _json(run / "summary.json")
    a, t, tr = cfg.algorithm, cfg.train, cfg.trainer
    lines = [
        *_front_matter(cfg, fmt),
        f"# {run.name}",
        "",
        f"{CARD_MARK} (GRPO/PPO post-training on one workstation) from `{cfg.model.path}`"
        + (f", recipe `{cfg.recipe}`" if cfg.recipe else "")
        + f", preset `{cfg.preset}`.",
        "",
        "## Training",
        "",
        f"- algorithm: {a.adv_estimator}, loss aggregation {a.loss_agg_mode}, KL loss {a.use_kl_loss}",
        f"- update: {t.backend}"
        + (f", LoRA rank {t.lora_rank} alpha {t.lora_alpha}" if t.backend in ("lora", "qlora") else "")
        + f", lr {t.lr}",  # fmt: skip
        f"- data: {cfg.data.task if not cfg.data.train_files else ', '.join(cfg.data.train_files)}; "
        f"{tr.batch_size} prompts x {cfg.rollout.n} samples a step, up to {cfg.rollout.max_new_tokens} new tokens",
        f"- steps: {summary.get('steps', '?')} of {tr.total_steps}; reward (mean of the first and last 10% of steps): "
        f"{_num(summary, 'reward_first_10pct'):.4f} -> {_num(summary, 'reward_last_10pct'):.4f}",
        "",
    ]
    if summary.get("val_acc_start") is not None:
        lines += [f"Validation accuracy (in training, greedy): {_num(summary, 'val_acc_start'):.4f} -> "
                  f"{_num(summary, 'val_acc_end'):.4f}", ""]  # fmt: skip
    lines += [*_evals(run), *_bill(summary), "## Files", "", *(f"- `{f}`" for f in files), ""]
    if fmt == "gguf":
        lines += ["Run it with Ollama: `ollama create NAME -f Modelfile && ollama run NAME`, or with llama.cpp: "
                  "`llama-cli -m FILE.gguf`.", ""]  # fmt: skip
    return "\n".join(lines)
