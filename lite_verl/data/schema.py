"""Prompt rows: the PromptRow type, and the mapping of a dataset row's columns onto it.

verl's schema is the default mapping (data.prompt_key=prompt, data.answer_key=reward_model.ground_truth):
    {"prompt": [{"role": "user", "content": "..."}],      # chat messages, or plain text
     "data_source": "openai/gsm8k",                      # selects the rule reward
     "reward_model": {"style": "rule", "ground_truth": "42"},
     "extra_info": {...}}                                 # optional, passed to the reward function
Any other dataset maps its own columns, e.g. GSM8K's original {"question", "answer"}: data.prompt_key=question
data.answer_key=answer. Every column but the prompt rides along in PromptRow.columns (TRL hands them to
reward functions as keyword arguments). A bad row is a DataError naming its file, row and column, or is
skipped and counted (data.skip_bad_rows). Reading the files: sources.py.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from lite_verl.config.schema import typed_newlines
from lite_verl.data.sources import RawRows, load_split
from lite_verl.errors import DataError

MESSAGES = "a list of chat messages {role, content}"
VERL_ANSWER = "reward_model.ground_truth"  # data.answer_key's default: verl's schema
# where TRL-style and plain datasets keep the answer, tried in order when a source has no verl schema and
# data.answer_key is left at its default (trl-lib's maths sets: solution; GSM8K, MATH-style: answer)
ANSWER_COLUMNS = ("answer", "solution", "ground_truth", "target")


@dataclass(frozen=True)
class PromptRow:
    messages: tuple[dict[str, str], ...]  # chat messages {"role", "content"}; plain text: one user message
    data_source: str  # selects the rule reward (see reward/rules.py)
    ground_truth: Any  # the answer column, its type kept (str, int, list...); None when data.answer_key=''
    extra_info: dict[str, Any] = field(default_factory=dict)  # verl's extra_info column
    # every column of the source row but the prompt, types kept, the answer's too under its own name
    # (TRL passes these to reward functions as keywords); {} for the built-in tasks
    columns: dict[str, Any] = field(default_factory=dict)
    # the prompt column held chat messages (TRL's "conversational" format), not text: TRL-shaped reward
    # functions get prompts and completions as messages then, as text otherwise (reward/functions.py)
    conversational: bool = True
    # where it came from ("train.jsonl:12", "train.parquet row 11"), for errors found later (a long prompt);
    # '' for built-in tasks. Not part of the row's value.
    where: str = field(default="", compare=False)

    def to_verl(self) -> dict[str, Any]:
        return {
            "prompt": [dict(m) for m in self.messages],
            "data_source": self.data_source,
            "reward_model": {"style": "rule", "ground_truth": self.ground_truth},
            "extra_info": self.extra_info,
        }


@dataclass(frozen=True)
class ColumnKeys:
    """Which columns make a PromptRow: DataConfig's prompt_key, answer_key, system_prompt, data_source."""

    prompt: str = "prompt"
    answer: str = VERL_ANSWER  # a.b reads key b of struct column a; "" = no ground truth
    system_prompt: str = ""  # a system message put before prompts that have none
    data_source: str = ""  # for rows without a data_source column; "" = the source's path or Hub id
    template: str = ""  # the last user message becomes template.format(prompt=it); "" = as it is


def lookup(raw: dict[str, Any], key: str) -> Any:
    """raw[key], or for a dotted key the value inside struct columns (reward_model.ground_truth), or None."""
    if key in raw:
        return raw[key]
    value: Any = raw
    for part in key.split("."):
        if not isinstance(value, dict):
            return None
        value = value.get(part)
    return value


def _messages(
    prompt: Any, where: str, key: str, system: str, template: str = ""
) -> tuple[dict[str, str], ...]:
    if prompt is None:
        raise DataError(f"{where}: missing field {key!r} (text, or {MESSAGES})")
    if hasattr(prompt, "tolist"):  # numpy arrays from pandas/parquet
        prompt = prompt.tolist()
    if isinstance(prompt, str):
        if not prompt.strip():
            raise DataError(f"{where}: field {key!r} is empty")
        prompt = [{"role": "user", "content": prompt}]
    if not isinstance(prompt, (list, tuple)) or not prompt:
        raise DataError(
            f"{where}: field {key!r} must be text or a non-empty list of chat messages {{role, content}}"
        )
    messages = []
    for i, m in enumerate(prompt):
        m = _from_sharegpt(m, where, f"{key}[{i}]")
        if (
            not isinstance(m, dict)
            or not isinstance(m.get("role"), str)
            or not isinstance(m.get("content"), str)
        ):
            raise DataError(f"{where}: {key}[{i}] must be an object with string 'role' and 'content'")
        messages.append({"role": m["role"], "content": m["content"]})
    return framed(messages, system, template)


# ShareGPT's speakers (Unsloth's standardize_sharegpt reads the same) as chat roles
SHAREGPT_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant",
                  "system": "system", "tool": "tool", "function_call": "assistant", "observation": "tool"}  # fmt: skip


def _from_sharegpt(m: Any, where: str, at: str) -> Any:
    """A ShareGPT message {"from", "value"} as {"role", "content"}; anything else as it is."""
    if not isinstance(m, dict) or "role" in m or "from" not in m or "value" not in m:
        return m
    role = SHAREGPT_ROLES.get(str(m["from"]).lower())
    if role is None:
        raise DataError(f"{where}: {at} is a ShareGPT message from {m['from']!r}; lite-verl reads the speakers "
                        f"{', '.join(SHAREGPT_ROLES)}: rename it to one of them")  # fmt: skip
    return {"role": role, "content": m["value"]}


def framed(messages: Iterable[dict[str, str]], system: str, template: str) -> tuple[dict[str, str], ...]:
    """data.prompt_template around the last user message ({prompt} = its text) and data.system_prompt
    before a conversation that has none: the same for data files and built-in tasks. A typed `\\n` in
    either is a newline: a shell's --set cannot hold one, and a prompt never means a backslash-n."""
    messages = [dict(m) for m in messages]
    system, template = typed_newlines(system), typed_newlines(template)
    if template:
        last = max(i for i, m in enumerate(messages) if m["role"] == "user") if any(
            m["role"] == "user" for m in messages) else len(messages) - 1  # fmt: skip
        messages[last]["content"] = template.replace("{prompt}", messages[last]["content"])
    if system and messages[0]["role"] != "system":
        messages.insert(0, {"role": "system", "content": system})
    return tuple(messages)


def parse_row(raw: Any, where: str, keys: ColumnKeys = ColumnKeys(), source: str | None = None) -> PromptRow:
    """Map one dataset row; `where` ("file:line", "file row i") names it in errors. `source` is the
    data_source of a row without that column (None: the column is required, as in verl's schema)."""
    if not isinstance(raw, dict):
        raise DataError(
            f"{where}: a row must be an object with the columns {keys.prompt!r} and {keys.answer!r}"
        )
    messages = _messages(lookup(raw, keys.prompt), where, keys.prompt, keys.system_prompt, keys.template)
    data_source = raw.get("data_source")
    if data_source is None:
        data_source = keys.data_source or source
    if not isinstance(data_source, str) or not data_source:
        raise DataError(f"{where}: missing field 'data_source' (a string such as 'openai/gsm8k')")
    truth = lookup(raw, keys.answer) if keys.answer else None
    if keys.answer and truth is None:
        column = keys.answer if keys.answer in raw else keys.answer.split(".")[0]
        hint = "" if column in raw else f"; set data.answer_key to one of the columns {sorted(raw)} or to ''"
        raise DataError(f"{where}: missing field {keys.answer!r}{hint}")
    extra = raw.get("extra_info")
    if extra is not None and not isinstance(extra, dict):
        raise DataError(f"{where}: field 'extra_info' must be an object")
    top = keys.prompt if keys.prompt in raw else keys.prompt.split(".")[0]
    columns = {k: v for k, v in raw.items() if k != top}
    conversational = not isinstance(lookup(raw, keys.prompt), str)
    return PromptRow(messages, data_source, truth, dict(extra or {}), columns, conversational, where)


def rows_from(parts: list[RawRows], keys: ColumnKeys, what: str, skip_bad: bool) -> list[PromptRow]:
    """PromptRows of the parts of one source. A bad row raises, or with `skip_bad` is left out and counted."""
    rows: list[PromptRow] = []
    bad: list[str] = []
    for part in parts:
        top = keys.prompt if keys.prompt in part.columns else keys.prompt.split(".")[0]
        if top not in part.columns:
            raise DataError(
                f"{what}: {part.label} has no column {keys.prompt!r} (its columns: "
                f"{', '.join(part.columns)}); "
                "set data.prompt_key to the column that holds the prompts"
            )
        source = keys.data_source or part.source
        part_keys = _answer_column(part, keys, what)
        for i, raw in enumerate(part.rows):
            try:
                rows.append(parse_row(raw, part.where(i), part_keys, source))
            except DataError as e:
                if not skip_bad:
                    raise
                bad.append(str(e))
    if bad:
        total = len(rows) + len(bad)
        if not rows:
            raise DataError(f"{what}: all {total} rows of {parts[0].source!r} are bad; the first: {bad[0]}")
        print(f"lite-verl: skipped {len(bad)} of {total} rows of {parts[0].source!r} (data.skip_bad_rows); "
              f"the first: {bad[0]}", file=sys.stderr)  # fmt: skip
    return rows


def _answer_column(part: RawRows, keys: ColumnKeys, what: str) -> ColumnKeys:
    """The keys for one source: with data.answer_key at verl's default and no 'reward_model' column, the
    answer comes from the first of ANSWER_COLUMNS the source has (said once), as a TRL user expects."""
    if keys.answer != VERL_ANSWER or "reward_model" in part.columns:
        return keys
    found = next((c for c in ANSWER_COLUMNS if c in part.columns), None)
    if found is None:
        return keys  # parse_row names the missing field and the columns there are
    print(f"lite-verl: {what}: {part.label}: ground truth from its column {found!r} (no verl 'reward_model' "
          "column); set data.answer_key to choose another, or '' for none", file=sys.stderr)  # fmt: skip
    return replace(keys, answer=found)


def load_rows(
    files: tuple[str, ...] | list[str],
    what: str = "data.train_files",
    keys: ColumnKeys = ColumnKeys(),
    split: str = "train",
    subset: str = "",
    skip_bad: bool = False,
    split_key: str = "data.split",
) -> list[PromptRow]:
    """The rows of `split` of every source in `files`, in order (see sources.py for what a source is)."""
    rows: list[PromptRow] = []
    for name in files:
        parts = load_split(name, split, subset, what, split_key, skip_bad=skip_bad)
        assert parts is not None  # required splits raise instead
        rows.extend(rows_from(parts, keys, what, skip_bad))
    return rows


def write_jsonl(rows: list[PromptRow], path: Path) -> None:
    """Write rows in verl's schema, atomically."""
    from lite_verl.run.files import atomic_write_text

    atomic_write_text(path, "".join(json.dumps(r.to_verl()) + "\n" for r in rows))
