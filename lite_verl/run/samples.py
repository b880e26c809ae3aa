"""RUN/samples.jsonl: a few of a step's completions, to read what the policy writes as it trains.

Every trainer.samples_every steps and at the last step, trainer.samples_per_step of the step's responses,
one JSON object a line:

    {"step", "sample" (row in the step's batch), "prompt", "completion", "reward",
     "reward_parts" ({function name: value or null}, with reward.functions; else {}),
     "advantage" (the first response token's: the sequence's for outcome rewards),
     "length" (response tokens, EOS included), "finish" ("stop": EOS ended it; "length": max_new_tokens did)}

The rows are picked by reward alone (best, worst, evenly spaced between; ties by position), so a resumed
or repeated CPU run writes the same ones. Appended and fsynced like metrics.jsonl; on resume the rows
after the checkpoint's step are dropped (files.drop_rows_after, as metrics.jsonl).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from lite_verl.batch import RolloutBatch
from lite_verl.config import Config
from lite_verl.data.schema import PromptRow
from lite_verl.run.files import append_jsonl, drop_rows_after, read_jsonl

FILE = "samples.jsonl"


def pick(rewards: Sequence[float], k: int) -> list[int]:
    """k row indices by reward rank, best first: the best, the worst and evenly spaced ranks between."""
    n = len(rewards)
    k = min(k, n)
    if k <= 0:
        return []
    order = sorted(range(n), key=lambda i: (-_finite(rewards[i]), i))
    if k == 1:
        return [order[0]]
    ranks = sorted({round(j * (n - 1) / (k - 1)) for j in range(k)})  # spaced >= 1 apart: k distinct
    return [order[r] for r in ranks]


def _finite(x: float) -> float:
    return x if math.isfinite(x) else -math.inf


def _number(x: float) -> float | None:
    return round(float(x), 6) if math.isfinite(float(x)) else None  # NaN (a function gave None) -> null


def finish_reasons(rollout: RolloutBatch, eos_ids: Iterable[int], max_new_tokens: int) -> list[str]:
    """ "stop" when the response's last valid token is an EOS (or it ended before max_new_tokens),
    "length" when max_new_tokens cut it (RolloutBatch.cut_by_length, what mask_truncated_completions masks)."""
    return ["length" if cut else "stop" for cut in rollout.cut_by_length(eos_ids, max_new_tokens).tolist()]


def sample_rows(
    step: int,
    prompts: Sequence[str],
    completions: Sequence[str],
    rollout: RolloutBatch,
    scores: torch.Tensor,
    parts: Mapping[str, torch.Tensor],
    advantages: torch.Tensor | None,
    eos_ids: Iterable[int],
    max_new_tokens: int,
    k: int,
) -> list[dict[str, Any]]:
    """The k picked responses of one step as samples.jsonl rows (prompts[i] is response i's prompt)."""
    rewards = scores.float().tolist()
    lengths = rollout.response_lengths().tolist()
    finish = finish_reasons(rollout, eos_ids, max_new_tokens)
    adv = advantages.float().tolist() if advantages is not None else None
    part_lists = {name: v.float().tolist() for name, v in parts.items()}
    return [
        {
            "step": step,
            "sample": i,
            "prompt": prompts[i],
            "completion": completions[i],
            "reward": _number(rewards[i]),
            "reward_parts": {name: _number(v[i]) for name, v in part_lists.items()},
            "advantage": _number(adv[i]) if adv is not None else None,
            "length": int(lengths[i]),
            "finish": finish[i],
        }
        for i in pick(rewards, k)
    ]


class SamplesLog:
    """RUN/samples.jsonl, written at the steps `due` says. On resume, rows after the checkpoint's step go."""

    def __init__(
        self,
        run: Path,
        cfg: Config,
        resume_step: int | None = None,
        to_trackers: Callable[[int, list[dict[str, Any]]], None] | None = None,
    ) -> None:
        self.file = Path(run) / FILE
        self.to_trackers = to_trackers  # the same rows, as a table to trainer.loggers' trackers
        tr = cfg.trainer
        self.every, self.per_step, self.total_steps = tr.samples_every, tr.samples_per_step, tr.total_steps
        self.max_new_tokens = cfg.rollout.max_new_tokens
        if resume_step is not None:
            drop_rows_after(self.file, resume_step)

    def record(
        self,
        step: int,
        rows: Sequence[PromptRow],
        texts: Sequence[str],
        rollout: RolloutBatch,
        scores: torch.Tensor,
        parts: Mapping[str, torch.Tensor],
        advantages: torch.Tensor | None,
        eos_ids: Iterable[int],
    ) -> None:
        """The step's picked samples, if it is due (rows[i]: the prompt row response i answers)."""
        if self.due(step):  # the loop asks first too, to skip gathering what a step not due needs
            prompts = [r.messages[-1]["content"] if r.messages else "" for r in rows]
            self.write(
                sample_rows(
                    step, prompts, texts, rollout, scores, parts, advantages, eos_ids, self.max_new_tokens,
                    self.per_step,
                )
            )  # fmt: skip

    def due(self, step: int) -> bool:
        on = self.every > 0 and self.per_step > 0
        return on and (step % self.every == 0 or step == self.total_steps)

    def write(self, rows: list[dict[str, Any]]) -> None:
        if rows:
            append_jsonl(self.file, rows)
            if self.to_trackers is not None:
                self.to_trackers(rows[0]["step"], rows)


def read_samples(run: Path) -> list[dict[str, Any]]:
    """Rows of RUN/samples.jsonl ([] without one); a last line cut short by a kill is skipped."""
    return read_jsonl(Path(run) / FILE)


def best_and_worst(run: Path) -> tuple[int, list[dict[str, Any]]] | None:
    """The last recorded step's best and worst sample (one row when they are the same): (step, rows)."""
    rows = read_samples(run)
    if not rows:
        return None
    step = rows[-1].get("step")
    mine = [r for r in rows if r.get("step") == step and r.get("reward") is not None]
    if not isinstance(step, int) or not mine:
        return None
    best = max(mine, key=lambda r: r["reward"])
    worst = min(mine, key=lambda r: r["reward"])
    return step, [best] if best is worst else [best, worst]
