"""Finding and reading prompt data through Hugging Face `datasets`: local files, directories, Hub ids.

A source (one entry of data.train_files / data.val_files) is, in this order:
    * a file: .jsonl / .json / .parquet / .csv        load_dataset("json" | "parquet" | "csv", data_files=...)
    * a `datasets` save_to_disk directory             load_from_disk(...)
    * a directory of data files (train.jsonl, test.jsonl, data/train-*.parquet ...: datasets' split names)
    * a Hub dataset id, `org/name` or `org/name@revision`, and data.subset   load_dataset(id, subset, split)
A source that names no existing path and does not look like a Hub id is an error naming it.

Files are read one at a time so that a bad row is named by its file (and, for jsonl, its line). A split
(data.split, data.val_split) takes datasets' slice syntax everywhere: `train[:90%]`, `test[-200:]`. A single
file, or a save_to_disk Dataset, is one split whatever its name. HF_HUB_OFFLINE is datasets' own: a Hub id
offline is read from the datasets cache, and missing there it is one error naming the id and the fix.

The rows come back as plain dicts (column -> value, types kept); schema.py maps their columns onto PromptRow.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import json
import re
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lite_verl.errors import DataError

FORMATS = {
    ".jsonl": "json",
    ".json": "json",
    ".parquet": "parquet",
    ".csv": "csv",
}  # suffix -> datasets builder
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*(/[\w.-]+)?(@[\w./-]+)?")
_SPLIT = re.compile(r"([\w.-]*)(\[[^\[\]]*\])?")  # name and optional slice, e.g. train[:90%]
FORMS = (
    "a .jsonl/.json/.parquet/.csv file, a directory, a datasets save_to_disk directory or a Hub dataset id"
)


@dataclass(frozen=True)
class RawRows:
    """The rows of one file or one split, before their columns are mapped (schema.rows_from)."""

    source: str  # as the user gave it: a path or a Hub id (the rows' default data_source)
    label: str  # the file, or the source and split, that error messages name
    rows: list[dict[str, Any]]  # one dict per row: column -> value, with the dataset's types
    columns: tuple[str, ...]
    index: Sequence[int]  # each row's position in its file or split (not i once a slice is taken)
    jsonl: bool = False  # name a row by its file line (label:line) rather than "label row i"

    def where(self, i: int) -> str:
        """Row i's place, for an error message: "data/train.jsonl:12" or "data/train.parquet row 11"."""
        n = self.index[i]
        return f"{self.label}:{self._lines[n]}" if n < len(self._lines) else f"{self.label} row {n}"

    @functools.cached_property
    def _lines(self) -> list[int]:
        """1-based line of each row of a jsonl file (blank lines hold no row); [] when they do not match."""
        if not self.jsonl:
            return []
        with open(self.label, encoding="utf-8", errors="replace") as f:
            lines = [i for i, line in enumerate(f, start=1) if line.strip()]
        return lines if self.index and len(lines) > max(self.index) else []


def split_parts(spec: str) -> tuple[str, str]:
    """A split spec's name and slice: train[:90%] -> ("train", "[:90%]"); anything else raises DataError."""
    m = _SPLIT.fullmatch(spec.strip())
    if m is None:
        raise DataError(f"{spec!r} is not a split name with an optional slice, e.g. train, test, train[:90%]")
    return m.group(1), m.group(2) or ""


def is_split_spec(spec: str) -> bool:
    return _SPLIT.fullmatch(spec.strip()) is not None


def load_split(
    source: str,
    split: str,
    subset: str,
    what: str,
    split_key: str,
    required: bool = True,
    skip_bad: bool = False,
) -> list[RawRows] | None:
    """The rows of `split` of one source, one RawRows per file. `required=False` (the validation split
    looked up in the training data): None when the source has no such split, instead of an error.
    `skip_bad` (data.skip_bad_rows): a jsonl line that is not JSON is left out and counted."""
    path = Path(source).expanduser()
    if path.is_file():
        return _read_split({"train": [path]}, source, split, split_key, required, what, skip_bad)
    if path.is_dir():
        if (path / "dataset_dict.json").is_file() or (path / "state.json").is_file():
            return _load_saved(path, source, split, split_key, required, what)
        files = _split_files(path, source, subset, what)
        return _read_split(files, source, split, split_key, required, what, skip_bad)
    check_source(source, what)
    return _load_hub(source, split, subset, what, split_key, required)


def check_source(source: str, what: str) -> None:
    """A source that is neither an existing path nor shaped like a Hub dataset id is a DataError (no read,
    no download: `lite-verl validate` asks too)."""
    path = Path(source).expanduser()
    if path.exists():
        return
    if path.suffix in FORMATS or source.startswith((".", "/", "~")) or not _HUB_ID.fullmatch(source):
        raise DataError(f"{what}: {source!r} does not exist; give {FORMS}")


def _choose(names: Sequence[str], spec: str, label: str, key: str, required: bool) -> tuple[str, str] | None:
    """(split name, slice) of `spec` among `names`. A source of one split gives it whatever the name,
    unless `required` is False (a split looked up by name); then a missing split is None."""
    name, sl = split_parts(spec)
    if name in names:
        return name, sl
    if not required:
        return None
    if len(names) != 1:
        raise DataError(f"{label!r} has no split {name!r} (its splits: {', '.join(names)}); set {key}")
    return names[0], sl


@contextlib.contextmanager
def _quiet() -> Iterator[Any]:
    """Import datasets; while reading local data, no progress bars or logs (Hub downloads keep theirs)."""
    import datasets

    bars, level = datasets.is_progress_bar_enabled(), datasets.logging.get_verbosity()
    datasets.disable_progress_bars()
    datasets.logging.set_verbosity(datasets.logging.CRITICAL)  # a bad file is our one-line error, not a log
    try:
        yield datasets
    finally:
        datasets.logging.set_verbosity(level)
        if bars:
            datasets.enable_progress_bars()


def _load_file(path: Path, source: str, what: str, skip_bad: bool = False) -> RawRows:
    """One file of `source` (the file itself, or one file of a directory)."""
    if path.suffix not in FORMATS:
        raise DataError(f"{what}: {str(path)!r} must end in {', '.join(FORMATS)} (or be a directory)")
    jsonl = path.suffix == ".jsonl"
    with _quiet() as datasets:
        try:
            ds = datasets.load_dataset(FORMATS[path.suffix], data_files=str(path), split="train")
            rows = ds.to_list()  # decodes the text: a file that is not UTF-8 fails here
            index: Sequence[int] = range(len(ds))
        except Exception as e:  # noqa: BLE001 - pyarrow, pandas and datasets each raise their own types
            error = _unreadable(path, what, e)
            if not (skip_bad and isinstance(error, _BadJsonLine)):
                raise error from None
            ds, index = _good_json_lines(path, str(error))
            rows = ds.to_list()
    if not rows:
        raise DataError(f"{what}: {str(path)!r} holds no rows")
    if path.suffix == ".csv":
        rows = [{k: structured_cell(v) for k, v in row.items()} for row in rows]
    return RawRows(source, str(path), rows, tuple(ds.column_names), index, jsonl)


def structured_cell(value: Any) -> Any:
    """A CSV cell holding a dict or a list as text (pandas' to_csv of verl's reward_model, extra_info or chat
    prompt writes its repr, JSON writers JSON) as that dict or list; any other cell as it is."""
    if not isinstance(value, str) or value[:1] not in "[{" or value.rstrip()[-1:] not in "]}":
        return value
    try:
        return json.loads(value)
    except ValueError:
        pass
    try:
        parsed = ast.literal_eval(value)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return value
    return parsed if isinstance(parsed, (dict, list)) else value


def _good_json_lines(path: Path, first_error: str) -> tuple[Any, list[int]]:
    """data.skip_bad_rows on a jsonl file with lines that are not JSON objects: a Dataset of the others (the
    types inferred by datasets, as for a clean file) and their positions among the non-blank lines."""
    import datasets

    good, index, total = [], [], 0
    with path.open(encoding="utf-8") as f:
        for line in f:
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                row = None
            if isinstance(row, dict):
                good.append(row)
                index.append(total)
            total += 1
    print(f"lite-verl: skipped {total - len(good)} of {total} lines of {str(path)!r} that are not JSON objects "
          f"(data.skip_bad_rows); the first: {first_error}", file=sys.stderr)  # fmt: skip
    return datasets.Dataset.from_list(good), index


class _BadJsonLine(DataError):
    """A json/jsonl file with a line that is not JSON (data.skip_bad_rows skips such lines)."""


def _unreadable(path: Path, what: str, e: Exception) -> DataError:
    """The error for a file datasets could not read: empty, not UTF-8, a bad JSON line (named), or unreadable."""
    bad_text = next((x for x in (e, e.__cause__, e.__context__) if isinstance(x, UnicodeDecodeError)), None)
    if bad_text is not None:
        return DataError(
            f"{what}: {str(path)!r} is not UTF-8 text (it holds the byte {bad_text.object[bad_text.start]:#04x}); "
            "re-save it as UTF-8"
        )
    if (
        path.stat().st_size == 0
        or (path.suffix != ".parquet" and not _has_data(path))
        or _empty_parquet(path)
    ):
        return DataError(f"{what}: {str(path)!r} holds no rows")
    bad_line = _first_bad_json_line(path) if FORMATS[path.suffix] == "json" else None
    if bad_line is not None:
        return _BadJsonLine(bad_line)
    cause = str(e.__cause__ or e).strip().splitlines()
    return DataError(
        f"{what}: {str(path)!r} is not a readable {path.suffix[1:]} file ({type(e).__name__}: "
        f"{cause[0] if cause else 'no message'})"
    )


def _first_bad_json_line(path: Path) -> str | None:
    """The first line of a json/jsonl file that is not JSON, as "FILE:LINE: not valid JSON (why); ...", or None."""
    with path.open(encoding="utf-8", errors="replace") as f:
        for i, line in enumerate(f, start=1):
            try:
                if line.strip():
                    json.loads(line)
            except json.JSONDecodeError as bad:
                return f"{path}:{i}: not valid JSON ({bad.msg}); each line must be one JSON object"
    return None


def _empty_parquet(path: Path) -> bool:
    """A parquet file whose footer says it holds no rows (datasets fails on it with a batch-size error)."""
    if path.suffix != ".parquet":
        return False
    try:
        import pyarrow.parquet as pq

        return pq.ParquetFile(path).metadata.num_rows == 0
    except Exception:  # noqa: BLE001 - not parquet at all: the generic message says so
        return False


def _has_data(path: Path) -> bool:
    """A text file holds more than blank lines (csv: more than its header line)."""
    with path.open(encoding="utf-8", errors="replace") as f:
        lines = [line for line in f if line.strip()]
    return len(lines) > (1 if path.suffix == ".csv" else 0)


def _slice(parts: list[RawRows], name: str, sl: str) -> list[RawRows]:
    """datasets' slice syntax over the rows of all parts together, e.g. [:90%] or [-200:]."""
    import datasets

    total = sum(len(p.rows) for p in parts)
    try:
        ranges = datasets.ReadInstruction.from_spec(name + sl).to_absolute({name: total})
    except (ValueError, AssertionError) as e:
        raise DataError(f"split {name + sl!r}: {e}") from None
    keep = {i for r in ranges for i in range(r.from_, r.to)}
    out, offset = [], 0
    for p in parts:
        local = [i for i in range(len(p.rows)) if offset + i in keep]
        offset += len(p.rows)
        if local:
            rows = [p.rows[i] for i in local]
            out.append(RawRows(p.source, p.label, rows, p.columns, [p.index[i] for i in local], p.jsonl))
    if not out:
        raise DataError(f"split {name + sl!r} of {parts[0].source!r} holds no rows")
    return out


def _read_split(
    files: dict[str, list[Path]], source: str, spec: str, key: str, required: bool, what: str, skip_bad: bool
) -> list[RawRows] | None:
    """Read the files of the chosen split one by one, then take its slice."""
    chosen = _choose(list(files), spec, source, key, required)
    if chosen is None:
        return None
    name, sl = chosen
    parts = [_load_file(f, source, what, skip_bad) for f in files[name]]
    return _slice(parts, name, sl) if sl else parts


def _split_files(path: Path, source: str, subset: str, what: str) -> dict[str, list[Path]]:
    """A directory's data files by split, as datasets names them (train.jsonl, test.parquet, data/train-*)."""
    with _quiet() as datasets:
        try:
            builder = datasets.load_dataset_builder(str(path), subset or None)
        except Exception as e:  # noqa: BLE001 - EmptyDatasetError, FileNotFoundError, ValueError
            raise DataError(
                f"{what}: {source!r} holds no data files datasets can read ({e}); give {FORMS}"
            ) from None
    return {str(name): [Path(f) for f in fs] for name, fs in (builder.config.data_files or {}).items()}


def _load_saved(
    path: Path, source: str, split: str, key: str, required: bool, what: str
) -> list[RawRows] | None:
    """A directory written by Dataset.save_to_disk or DatasetDict.save_to_disk."""
    with _quiet() as datasets:
        try:
            saved = datasets.load_from_disk(str(path))
        except Exception as e:  # noqa: BLE001
            raise DataError(f"{what}: {source!r} is not a readable save_to_disk directory ({e})") from None
    found = dict(saved) if isinstance(saved, datasets.DatasetDict) else {"train": saved}
    chosen = _choose(list(found), split, source, key, required)
    if chosen is None:
        return None
    name, sl = chosen
    ds = found[name]
    if len(ds) == 0:
        raise DataError(f"{what}: {source!r} ({name}) holds no rows")
    parts = [RawRows(source, f"{source} ({name})", ds.to_list(), tuple(ds.column_names), range(len(ds)))]
    return _slice(parts, name, sl) if sl else parts


def _load_hub(
    source: str, split: str, subset: str, what: str, key: str, required: bool
) -> list[RawRows] | None:
    """A Hub dataset id: downloaded into (or, offline, read from) the datasets cache."""
    import datasets

    repo, _, revision = source.partition("@")
    if not split_parts(split)[0]:
        raise DataError(f"{what}: Hub dataset {repo!r} needs a split; set {key} (e.g. train or test)")
    label = f"{source} [{', '.join(x for x in (subset, split) if x)}]"
    try:
        ds = datasets.load_dataset(repo, subset or None, split=split, revision=revision or None)
    except ConnectionError:
        if datasets.config.HF_HUB_OFFLINE:
            args = f"{repo!r}, {subset!r}" if subset else repr(repo)
            raise DataError(
                f"{what}: no local path {repo!r}, and Hub dataset {repo!r} is not in the datasets cache and "
                'HF_HUB_OFFLINE is set; fetch it once with network (python -c "import datasets; '
                f'datasets.load_dataset({args})") or give a local path'
            ) from None
        raise DataError(f"{what}: cannot reach the Hub for dataset {repo!r}; check the network, or give a local "
                        f"copy ({what}=[DIR/train.jsonl], parquet or a datasets directory)") from None  # fmt: skip
    except datasets.exceptions.DatasetNotFoundError:
        raise DataError(
            f"{what}: no local path or Hub dataset {repo!r} (a private or gated one needs HF_TOKEN); "
            f"give {FORMS}"
        ) from None
    except ValueError as e:
        if "Unknown split" in str(e) and not required:
            return None
        hint = f"; set {key}" if "split" in str(e) else "; set data.subset" if "onfig" in str(e) else ""
        raise DataError(f"{what}: {label}: {str(e).splitlines()[0]}{hint}") from None
    if len(ds) == 0:
        raise DataError(f"{what}: {label} holds no rows")
    return [RawRows(source, label, ds.to_list(), tuple(ds.column_names), range(len(ds)))]
