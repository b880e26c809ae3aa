"""Prompt datasets ready for rollout: rows, their token ids, and a seeded, resumable sampler."""

from __future__ import annotations

import sys
from dataclasses import dataclass

import torch

from lite_verl.config import DataConfig
from lite_verl.data.schema import PromptRow, load_rows
from lite_verl.data.tasks import task_rows
from lite_verl.errors import DataError, ModelError


@dataclass(frozen=True)
class PromptSet:
    rows: list[PromptRow]
    token_ids: list[list[int]]  # chat-templated prompt ids, one list per row

    def __len__(self) -> int:
        return len(self.rows)


def encode_prompts(
    rows: list[PromptRow], tokenizer, max_len: int, what: str, drop_long: bool = False
) -> tuple[list[PromptRow], list[list[int]]]:
    """Chat-template and tokenize every row; (kept rows, their ids)."""
    if not getattr(tokenizer, "chat_template", None):
        raise ModelError(
            "the model's tokenizer has no chat template; use an instruct/chat model or add "
            "'chat_template' to its tokenizer_config.json"
        )
    kept, out = [], []
    for i, row in enumerate(rows):
        text = tokenizer.apply_chat_template(list(row.messages), add_generation_prompt=True, tokenize=False)
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        if len(ids) > max_len and drop_long:
            continue
        if len(ids) > max_len:
            raise DataError(
                f"{what} row {i}: the prompt has {len(ids)} tokens, more than data.max_prompt_length="
                f"{max_len}; raise data.max_prompt_length or set data.filter_overlong_prompts=true"
            )
        kept.append(row)
        out.append(ids)
    if len(kept) < len(rows):
        print(
            f"lite-verl: dropped {len(rows) - len(kept)} of {len(rows)} prompts of {what} longer than "
            f"data.max_prompt_length={max_len}",
            file=sys.stderr,
        )
    if rows and not kept:
        raise DataError(f"{what}: every prompt is longer than data.max_prompt_length={max_len}; raise it")
    return kept, out


def load_prompt_sets(cfg: DataConfig, tokenizer, seed: int) -> tuple[PromptSet, PromptSet]:
    """(train, val). Files when given, else the built-in task from `seed` (val held out)."""
    if cfg.train_files:
        train_rows = load_rows(cfg.train_files, "data.train_files")
    else:
        train_rows = task_rows(cfg.task, cfg.task_size, seed, "train")
    if cfg.val_files:
        val_rows = load_rows(cfg.val_files, "data.val_files")
    elif cfg.train_files:
        val_rows = []
    else:
        val_rows = task_rows(cfg.task, cfg.val_size, seed, "val")
    val_rows = val_rows[: cfg.val_size]
    drop = cfg.filter_overlong_prompts
    train = PromptSet(*encode_prompts(train_rows, tokenizer, cfg.max_prompt_length, "data.train_files", drop))
    val = PromptSet(*encode_prompts(val_rows, tokenizer, cfg.max_prompt_length, "data.val_files", drop))
    return train, val


class PromptSampler:
    """Global position k -> row perm_e[k % n] with e = k // n and perm_e seeded by (seed, e).

    The state is one integer (`consumed`), so resuming at a checkpoint continues the exact order,
    whatever the hardware.
    """

    def __init__(self, n: int, batch_size: int, seed: int, shuffle: bool, consumed: int = 0) -> None:
        self.n, self.batch_size, self.seed, self.shuffle = n, batch_size, seed, shuffle
        self.consumed = consumed
        self._epoch = -1
        self._perm: list[int] = []

    def _order(self, epoch: int) -> list[int]:
        if epoch != self._epoch:
            if self.shuffle:
                g = torch.Generator().manual_seed(self.seed * 100_003 + epoch)
                self._perm = torch.randperm(self.n, generator=g).tolist()
            else:
                self._perm = list(range(self.n))
            self._epoch = epoch
        return self._perm

    def next_batch(self) -> list[int]:
        out = []
        for k in range(self.consumed, self.consumed + self.batch_size):
            out.append(self._order(k // self.n)[k % self.n])
        self.consumed += self.batch_size
        return out
