"""Typed tensors passed between rollout, reward, advantage and update.

N = responses in the step (prompts x rollout.n), P = padded prompt length, R = padded response length.
Prompts are left-padded and responses right-padded, so the prompt/response boundary is column P for
every row (as in verl).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, fields, replace
from typing import Any, NamedTuple

import torch


@dataclass(frozen=True)
class RolloutBatch:
    prompt_ids: torch.Tensor  # [N, P] left-padded
    prompt_mask: torch.Tensor  # [N, P] 1 on prompt tokens
    response_ids: torch.Tensor  # [N, R] right-padded
    response_mask: torch.Tensor  # [N, R] 1 on generated tokens up to and including EOS
    rollout_log_probs: torch.Tensor  # [N, R] log-prob of each sampled token under the sampling policy

    @property
    def input_ids(self) -> torch.Tensor:  # [N, P+R]
        return torch.cat([self.prompt_ids, self.response_ids], dim=1)

    @property
    def attention_mask(self) -> torch.Tensor:  # [N, P+R]
        return torch.cat([self.prompt_mask, self.response_mask], dim=1)

    def response_lengths(self) -> torch.Tensor:  # [N]
        return self.response_mask.sum(-1)

    def cut_by_length(self, eos_ids: Iterable[int], max_new_tokens: int) -> torch.Tensor:
        """[N] bool: responses that reached max_new_tokens without ending in an EOS (a stop string ends a
        response at its own length, so one completed on the very last token counts as cut too)."""
        lengths = self.response_lengths()
        last = self.response_ids.gather(1, (lengths - 1).clamp(min=0)[:, None])[:, 0]
        ended = torch.isin(last, torch.tensor(sorted({int(e) for e in eos_ids}), dtype=last.dtype))
        return (lengths >= max_new_tokens) & ~ended

    def take(self, rows: list[int]) -> RolloutBatch:
        idx = torch.as_tensor(rows, dtype=torch.long)
        return replace(self, **{f.name: getattr(self, f.name)[idx] for f in fields(self)})

    def trimmed(self) -> RolloutBatch:
        """The same rows without the prompt columns left of the longest prompt and the response columns
        right of the longest response (see Experience.trimmed)."""
        p0, r = padding_bounds(self.attention_mask, self.response_ids.shape[1])
        return replace(self, prompt_ids=self.prompt_ids[:, p0:], prompt_mask=self.prompt_mask[:, p0:],
                       response_ids=self.response_ids[:, :r], response_mask=self.response_mask[:, :r],
                       rollout_log_probs=self.rollout_log_probs[:, :r])  # fmt: skip

    def response_token_ids(self) -> list[list[int]]:
        """Each row's valid response tokens (EOS or stop included): TRL's completion_ids."""
        return [ids[m.bool()].tolist() for ids, m in zip(self.response_ids, self.response_mask)]

    def response_texts(self, tokenizer, token_ids: list[list[int]] | None = None) -> list[str]:
        """Each row's valid response tokens decoded, special tokens (EOS) dropped. Only the masked
        tokens are decoded: padding ids need not be special tokens of every tokenizer. `token_ids`: the
        rows' response_token_ids(), when the caller has them already."""
        return tokenizer.batch_decode(token_ids or self.response_token_ids(), skip_special_tokens=True)


@dataclass(frozen=True)
class UpdateBatch:
    """One step's input to the update (update.run_update); the controller sends it to every train rank."""

    rollout: RolloutBatch
    scores: torch.Tensor  # [N] one score per response
    group_ids: torch.Tensor  # [N] long: which prompt of the step each response answers
    baselines: torch.Tensor | None  # [N] ReMax: the reward of the prompt's greedy response
    step: int  # the training step (critic.warmup_steps counts it)
    # [N] bool: cut by max_new_tokens (algorithm.mask_truncated_completions); None: nothing masked
    truncated: torch.Tensor | None = None


def position_ids(attention_mask: torch.Tensor) -> torch.Tensor:
    """[N, L] -> [N, L]: 0 at each row's first real token, counting up; 0 on left padding."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


@dataclass(frozen=True)
class Experience:
    """Everything the update needs, row-aligned. Select rows with `take`."""

    input_ids: torch.Tensor  # [N, P+R]
    attention_mask: torch.Tensor  # [N, P+R]
    response_mask: torch.Tensor  # [N, R] float
    old_log_probs: torch.Tensor | None  # [N, R] trainer log-probs before the update; None = on-policy
    ref_log_probs: torch.Tensor | None  # [N, R] reference policy (adapter off), when a KL term needs it
    advantages: torch.Tensor  # [N, R]
    rollout_log_probs: torch.Tensor  # [N, R]
    values: torch.Tensor | None = None  # [N, R] critic values before the update (gae)
    returns: torch.Tensor | None = None  # [N, R] value targets (gae)
    is_weights: torch.Tensor | None = None  # [N, R] truncated IS weights for rollout/trainer mismatch
    # seq-mean-token-sum-norm's T (Dr. GRPO's constant, verl's max_response_length): the generation budget,
    # rollout.max_new_tokens, not the batch's longest response; 0 = the response width
    horizon: int = 0

    @property
    def num_rows(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def response_length(self) -> int:
        return int(self.response_mask.shape[1])

    def take(self, rows: torch.Tensor | list[int]) -> Experience:
        idx = torch.as_tensor(rows, dtype=torch.long)
        picked: dict[str, Any] = {}
        for f in fields(self):
            v = getattr(self, f.name)
            if isinstance(v, torch.Tensor):
                picked[f.name] = v[idx]
        return replace(self, **picked)

    def trimmed(self) -> Experience:
        """The same rows without the columns that are padding in all of them: left of the longest
        prompt, right of the longest response. Causal attention and masked losses make every valid
        token's numbers the same; a micro-batch of short rows then costs what they hold."""
        p0, r = padding_bounds(self.attention_mask, self.response_length)
        if p0 == 0 and r == self.response_length:
            return self
        cut = {}
        for f in fields(self):
            v = getattr(self, f.name)
            if not isinstance(v, torch.Tensor):
                continue
            if f.name in ("input_ids", "attention_mask"):
                cut[f.name] = v[:, p0 : v.shape[1] - self.response_length + r]
            else:
                cut[f.name] = v[:, :r]
        return replace(self, **cut)


def padding_bounds(attention_mask: torch.Tensor, response_length: int) -> tuple[int, int]:
    """(first prompt column any row uses, response columns up to the last any row uses) of a left-padded
    prompt + right-padded response batch; at least one response column."""
    prompt = attention_mask[:, : attention_mask.shape[1] - response_length].bool().any(0)
    response = attention_mask[:, attention_mask.shape[1] - response_length :].bool().any(0)
    p0 = int(prompt.float().argmax()) if prompt.any() else prompt.shape[0]
    r = int(response.nonzero().max()) + 1 if response.any() else 1
    return p0, r


def length_order(attention_mask: torch.Tensor) -> list[int]:
    """Row indices, longest first: micro-batches cut from this order hold rows of similar length."""
    return torch.argsort(attention_mask.sum(1), descending=True, stable=True).tolist()


class Split(NamedTuple):
    """How micro-batches are cut: `rows` rows each, or with tokens > 0 up to that many tokens each."""

    rows: int
    tokens: int = 0


def micro_batch_rows(attention_mask: torch.Tensor, response_length: int, split: Split) -> list[list[int]]:
    """Row indices of each micro-batch, cut from the length order: `split.rows` rows each, or with
    split.tokens > 0 as many rows as fit in that many tokens of the trimmed tensor they make (rows x
    (longest prompt + longest response among them)), at least one. Short rows then share one forward
    instead of filling several (verl's dynamic batch size): fewer kernel launches, the same memory bound."""
    order = length_order(attention_mask)
    rows, tokens = split
    if tokens <= 0:
        return [order[s : s + rows] for s in range(0, len(order), rows)]
    start = attention_mask.shape[1] - response_length  # the first response column
    prompt = attention_mask[:, :start].sum(1).tolist()
    response = attention_mask[:, start:].sum(1).clamp(min=1).tolist()
    out: list[list[int]] = []
    cut: list[int] = []
    width_p = width_r = 0
    for i in order:
        p, r = max(width_p, prompt[i]), max(width_r, response[i])
        if cut and (len(cut) + 1) * (p + r) > tokens:
            out.append(cut)
            cut, p, r = [], prompt[i], response[i]
        cut.append(i)
        width_p, width_r = p, r
    return out + [cut] if cut else out
