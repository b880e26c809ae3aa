"""Prompt rows in verl's dataset schema, and their loading from jsonl / parquet with row-level checks.

A row:
    {"prompt": [{"role": "user", "content": "..."}],      # chat messages
     "data_source": "openai/gsm8k",                      # selects the rule reward
     "reward_model": {"style": "rule", "ground_truth": "42"},
     "extra_info": {...}}                                 # optional, passed to the reward function
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lite_verl.errors import DataError


@dataclass(frozen=True)
class PromptRow:
    messages: tuple[dict[str, str], ...]  # chat messages, each {"role", "content"}
    data_source: str  # selects the rule reward (see rewards.py)
    ground_truth: str  # reward_model.ground_truth as a string
    extra_info: dict[str, Any] = field(default_factory=dict)

    def to_verl(self) -> dict[str, Any]:
        return {
            "prompt": [dict(m) for m in self.messages],
            "data_source": self.data_source,
            "reward_model": {"style": "rule", "ground_truth": self.ground_truth},
            "extra_info": self.extra_info,
        }


def parse_row(raw: Any, where: str) -> PromptRow:
    """Check one raw row; `where` is "file:row" for the error message."""
    if not isinstance(raw, dict):
        raise DataError(f"{where}: a row must be a JSON object with 'prompt' and 'data_source'")
    prompt = raw.get("prompt")
    if prompt is None:
        raise DataError(f"{where}: missing field 'prompt' (a list of chat messages {{role, content}})")
    if hasattr(prompt, "tolist"):  # parquet gives numpy arrays
        prompt = prompt.tolist()
    if isinstance(prompt, str):
        prompt = [{"role": "user", "content": prompt}]
    if not isinstance(prompt, (list, tuple)) or not prompt:
        raise DataError(
            f"{where}: field 'prompt' must be a non-empty list of chat messages {{role, content}}"
        )
    messages = []
    for i, m in enumerate(prompt):
        if (
            not isinstance(m, dict)
            or not isinstance(m.get("role"), str)
            or not isinstance(m.get("content"), str)
        ):
            raise DataError(f"{where}: prompt[{i}] must be an object with string 'role' and 'content'")
        messages.append({"role": m["role"], "content": m["content"]})
    data_source = raw.get("data_source")
    if not isinstance(data_source, str) or not data_source:
        raise DataError(f"{where}: missing field 'data_source' (a string such as 'openai/gsm8k')")
    rm = raw.get("reward_model") or {}
    if not isinstance(rm, dict):
        raise DataError(f"{where}: field 'reward_model' must be an object {{style, ground_truth}}")
    gt = rm.get("ground_truth")
    if gt is None:
        raise DataError(f"{where}: missing field 'reward_model.ground_truth'")
    extra = raw.get("extra_info") or {}
    if not isinstance(extra, dict):
        raise DataError(f"{where}: field 'extra_info' must be an object")
    return PromptRow(tuple(messages), data_source, str(gt), dict(extra))


def _read_jsonl(path: Path) -> list[tuple[Any, str]]:
    rows = []
    with path.open() as f:
        for i, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                rows.append((json.loads(line), f"{path}:{i}"))
            except json.JSONDecodeError as e:
                raise DataError(
                    f"{path}:{i}: not valid JSON ({e.msg}); each line must be one JSON object"
                ) from None
    return rows


def _read_parquet(path: Path) -> list[tuple[Any, str]]:
    try:
        import pyarrow.parquet as pq
    except ImportError:  # pragma: no cover - pyarrow is a core dependency
        raise DataError(f"{path}: reading parquet needs pyarrow; pip install pyarrow") from None
    try:
        table = pq.read_table(path)
    except Exception as e:  # noqa: BLE001 - pyarrow raises many types for a bad file
        raise DataError(f"{path}: not a readable parquet file ({type(e).__name__})") from None
    return [(row, f"{path}:row {i}") for i, row in enumerate(table.to_pylist())]


def load_rows(files: tuple[str, ...] | list[str], what: str = "data.train_files") -> list[PromptRow]:
    rows: list[PromptRow] = []
    for name in files:
        path = Path(name).expanduser()
        if not path.is_file():
            raise DataError(f"{what}: {name!r} does not exist; give the path of a .jsonl or .parquet file")
        if path.suffix == ".parquet":
            raw = _read_parquet(path)
        elif path.suffix in (".jsonl", ".json"):
            raw = _read_jsonl(path)
        else:
            raise DataError(f"{what}: {name!r} must end in .jsonl or .parquet")
        if not raw:
            raise DataError(f"{what}: {name!r} holds no rows")
        rows.extend(parse_row(r, where) for r, where in raw)
    return rows


def write_jsonl(rows: list[PromptRow], path: Path) -> None:
    """Write rows in verl's schema, atomically."""
    from lite_verl.run.files import atomic_write_text

    atomic_write_text(path, "".join(json.dumps(r.to_verl()) + "\n" for r in rows))
