"""Atomic files and directories: a reader never sees a half-written file (temp file, fsync, rename).

Kept apart from the run directory (which knows the config) so that data, quant and model code can write
atomically without importing the config.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any

# a write the disk refused: full, over quota, read-only, not permitted, failing
DISK_ERRORS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.EIO}


def existing_parent(path: Path) -> Path:
    """`path` if it exists, else its nearest existing parent (where it would be created)."""
    where = Path(path).expanduser().absolute()
    while not where.exists() and where != where.parent:
        where = where.parent
    return where


def free_gib(path: Path) -> float | None:
    """Free space on the disk that holds `path` (or would: its nearest existing parent); None if unknown."""
    try:
        return shutil.disk_usage(existing_parent(path)).free / 2**30
    except OSError:
        return None


def disk_error(e: OSError) -> str:
    """One line for a write the disk refused (an errno of DISK_ERRORS): which file, why, and the way out."""
    free = free_gib(Path(e.filename).parent if e.filename else Path.cwd())
    room = f"; {free:.1f} GiB free there" if free is not None else ""
    fix = {errno.ENOSPC: "free space there, or write to a bigger disk (--run-dir, OUT)",
           errno.EDQUOT: "free space in your quota", errno.EROFS: "write to a writable disk (--run-dir, OUT)",
           errno.EIO: "check the disk"}.get(e.errno, "check its permissions, or use a directory you may write to (--run-dir, OUT)")  # fmt: skip
    verb = "could not access" if e.errno in (errno.EACCES, errno.EPERM) else "could not write"
    return f"{verb} {e.filename or 'a file'}: {e.strerror}{room}; {fix}"


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def follow_umask(root: Path) -> None:
    """Give `root` and everything under it the modes a plain open() would (0644 / 0755 under umask 022).
    mkstemp/mkdtemp and safetensors create 0600 / 0700, which a rename keeps: a vLLM server, a teammate's
    `lite-verl watch` or TensorBoard running as another user could not read the run or the export."""
    mask = _umask()
    root = Path(root)
    paths = [root, *root.rglob("*")] if root.is_dir() else [root]
    for p in paths:
        if not p.is_symlink():
            os.chmod(p, (0o777 if p.is_dir() else 0o666) & ~mask)


def atomic_write_text(path: Path, text: str) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


@contextmanager
def atomic_directory(final: Path):
    """Yield a temp directory beside `final`; on success it replaces `final` in one rename, on failure
    it is removed. Readers never see a half-written directory."""
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=final.parent))
    try:
        yield tmp
        follow_umask(tmp)
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


# --- JSON-lines logs (metrics.jsonl, samples.jsonl): appended and fsynced row by row -------------------
def append_jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    """Append rows, one JSON object a line, and fsync: a kill loses at most the line being written."""
    with Path(path).open("a") as f:
        f.write("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
        f.flush()
        os.fsync(f.fileno())


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The rows of a JSON-lines file ([] when there is none); a last line cut short by a kill is skipped."""
    f = Path(path)
    if not f.is_file():
        return []
    rows = []
    for line in f.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows


def drop_rows_after(path: Path, step: int) -> None:
    """Resume: a JSON-lines log keeps its rows up to `step` (those after the checkpoint are redone), and a
    row cut short by a kill is dropped."""
    f = Path(path)
    if f.exists():
        kept = [line for line in f.read_text().splitlines() if _step_of(line, step + 1) <= step]
        atomic_write_text(f, "".join(line + "\n" for line in kept))


def _step_of(line: str, default: int) -> int:
    try:
        return int(json.loads(line).get("step", default))
    except (json.JSONDecodeError, AttributeError, TypeError, ValueError):
        return default
