"""Prompt datasets ready for rollout: rows, their token ids, and a seeded, resumable sampler.

Rows come from data.train_files / data.val_files (sources.py reads them through `datasets`, schema.py maps
their columns) or from the built-in task. A prompt is formatted with the model's chat template when it has
one (data.apply_chat_template); without one, or with the key off, the prompt text goes in as it is, with the
tokenizer's special tokens (a base model's BOS). Too-long prompts are an error naming the row, or dropped
and counted with data.filter_overlong_prompts: never truncated.
"""

from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass

import torch

from lite_verl.config import DataConfig
from lite_verl.data.schema import ColumnKeys, PromptRow, framed, load_rows, rows_from
from lite_verl.data.sources import load_split
from lite_verl.data.tasks import task_rows
from lite_verl.errors import DataError


@dataclass(frozen=True)
class PromptSet:
    rows: list[PromptRow]
    token_ids: list[list[int]]  # formatted prompt ids (chat template or plain text), one list per row

    def __len__(self) -> int:
        return len(self.rows)


def plain_text(messages: tuple[dict[str, str], ...], where: str) -> str:
    """A single-turn prompt without a chat template: its system and user texts, a blank line apart."""
    if sum(m["role"] != "system" for m in messages) != 1 or messages[-1]["role"] != "user":
        raise DataError(
            f"{where}: a conversation of {len(messages)} messages needs a chat template, and the model has "
            "none "
            "(or data.apply_chat_template=false); use a chat model or single-turn prompts"
        )
    return "\n\n".join(m["content"] for m in messages)


def encode_prompts(
    rows: list[PromptRow],
    tokenizer,
    max_len: int,
    what: str,
    drop_long: bool = False,
    chat_template: bool = True,
) -> tuple[list[PromptRow], list[list[int]]]:
    """Format and tokenize every row; (kept rows, their ids). `chat_template`: data.apply_chat_template."""
    templated = chat_template and bool(getattr(tokenizer, "chat_template", None))
    kept, out = [], []
    for i, row in enumerate(rows):
        if templated:
            text = tokenizer.apply_chat_template(
                list(row.messages), add_generation_prompt=True, tokenize=False
            )
            ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        else:
            ids = tokenizer(
                plain_text(row.messages, row.where or f"{what} row {i}"), add_special_tokens=True
            )["input_ids"]
        if len(ids) > max_len and drop_long:
            continue
        if len(ids) > max_len:
            raise DataError(
                f"{what}: {row.where or f'row {i}'}: the prompt has {len(ids)} tokens, more than "
                f"data.max_prompt_length={max_len}; raise data.max_prompt_length or set "
                "data.filter_overlong_prompts=true"
            )
        kept.append(row)
        out.append(ids)
    answered = sum(1 for r in kept if r.messages and r.messages[-1]["role"] == "assistant")
    if answered:  # an SFT dataset's conversations hold the answer: the model would answer after it
        print(f"lite-verl: {answered} of {len(kept)} prompts of {what} end with an assistant message (SFT-style "
              "data holds its answer there); the model writes the next turn after it. Give the conversation up to "
              "the last user message (data.prompt_key), and the answer as data.answer_key", file=sys.stderr)  # fmt: skip
    if len(kept) < len(rows):
        print(
            f"lite-verl: dropped {len(rows) - len(kept)} of {len(rows)} prompts of {what} longer than "
            f"data.max_prompt_length={max_len}",
            file=sys.stderr,
        )
    if rows and not kept:
        raise DataError(f"{what}: every prompt is longer than data.max_prompt_length={max_len}; raise it")
    return kept, out


def column_keys(cfg: DataConfig) -> ColumnKeys:
    return ColumnKeys(cfg.prompt_key, cfg.answer_key, cfg.system_prompt, cfg.data_source, cfg.prompt_template)


def _held_out(cfg: DataConfig) -> list[PromptRow]:
    """Validation rows from split data.val_split of the training sources, where they have it."""
    if not cfg.val_split or cfg.val_size == 0:
        return []
    rows: list[PromptRow] = []
    for name in cfg.train_files:
        parts = load_split(
            name, cfg.val_split, cfg.subset, "data.train_files", "data.val_split", False, cfg.skip_bad_rows
        )
        if parts is not None:
            rows.extend(rows_from(parts, column_keys(cfg), "data.train_files", cfg.skip_bad_rows))
    if not rows:
        print(
            f"lite-verl: no validation prompts: data.train_files has no split {cfg.val_split!r} "
            "(data.val_split); "
            "give data.val_files, or hold out a slice: data.split=train[:-200] data.val_split=train[-200:]",
            file=sys.stderr,
        )
    return rows


def prompt_rows(cfg: DataConfig, seed: int) -> tuple[list[PromptRow], list[PromptRow]]:
    """(train, val) rows before tokenizing: the files when given, else the built-in task from `seed`."""
    keys = column_keys(cfg)
    if cfg.train_files:
        train_rows = load_rows(
            cfg.train_files, "data.train_files", keys, cfg.split, cfg.subset, cfg.skip_bad_rows
        )
    else:
        train_rows = _framed_task(cfg, task_rows(cfg.task, cfg.task_size, seed, "train"))
    if cfg.val_files:
        val_rows = load_rows(
            cfg.val_files,
            "data.val_files",
            keys,
            cfg.val_split,
            cfg.subset,
            cfg.skip_bad_rows,
            "data.val_split",
        )
    elif cfg.train_files:
        val_rows = _held_out(cfg)
    else:
        val_rows = _framed_task(cfg, task_rows(cfg.task, cfg.val_size, seed, "val"))
    if len(val_rows) > cfg.val_size > 0 and (cfg.val_files or cfg.train_files):
        print(f"lite-verl: validating on the first {cfg.val_size} of the {len(val_rows)} validation prompts "
              f"(data.val_size); --set data.val_size={len(val_rows)} for all", file=sys.stderr)  # fmt: skip
    return train_rows, val_rows[: cfg.val_size]


def _framed_task(cfg: DataConfig, rows: list[PromptRow]) -> list[PromptRow]:
    """A built-in task's rows inside data.system_prompt / data.prompt_template, as data files' rows are
    (e.g. a worked example before each prompt for a base model without a chat template)."""
    if not cfg.system_prompt and not cfg.prompt_template:
        return rows
    return [
        dataclasses.replace(r, messages=framed(r.messages, cfg.system_prompt, cfg.prompt_template))
        for r in rows
    ]


def load_prompt_sets(cfg: DataConfig, tokenizer, seed: int) -> tuple[PromptSet, PromptSet]:
    """(train, val), formatted and tokenized (see prompt_rows)."""
    train_rows, val_rows = prompt_rows(cfg, seed)
    if cfg.apply_chat_template and not getattr(tokenizer, "chat_template", None):
        # a base model given an instruction rarely answers in the reward's format (Gemma-3-270M base on
        # arithmetic: greedy accuracy 0 as plain text, 0.14 after one worked example): a frame to continue
        tip = (
            ""
            if cfg.prompt_template
            else "; a base model answers more often in a question/answer frame, e.g. --set "
            "'data.prompt_template=Question: {prompt}\\nAnswer:' --set 'rollout.stop=[\"\\n\\nQuestion:\"]'"
        )
        print(
            "lite-verl: the model has no chat template: prompts go in as plain text "
            f"(data.apply_chat_template=false says so){tip}",
            file=sys.stderr,
        )
    drop, template, n = cfg.filter_overlong_prompts, cfg.apply_chat_template, cfg.max_prompt_length
    train = PromptSet(*encode_prompts(train_rows, tokenizer, n, "data.train_files", drop, template))
    val = PromptSet(*encode_prompts(val_rows, tokenizer, n, "data.val_files", drop, template))
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
