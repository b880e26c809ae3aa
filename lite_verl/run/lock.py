"""One process owns a run directory: an advisory lock on RUN/.lock, held for the whole train or resume.

With fcntl (Linux, macOS) it is flock(2) on RUN/.lock: the kernel releases it when the owner exits, however
it exits (kill -9 included), so a dead owner never leaves a run locked. The owner removes the file before it
lets go, so a finished run keeps none; a process that opened the file just before that and then got the
lock finds it no longer at RUN/.lock and locks the new one. Without fcntl, RUN/.lock is created with O_EXCL
and removed at release; one left by a dead process of this host (its pid gone) is taken over. Either way the
file names the owner (pid, host, command, start time) so that a refused process says who.

A forked child shares the owner's open file, and with it the flock: it would keep the run locked after the
owner died. The lock's fd is opened O_CLOEXEC (a `spawn` child, an exec'd one, never has it) and closed in
every child forked from Python (os.register_at_fork), which releases nothing: a flock lasts while any
descriptor of it is open in the owner.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import socket
import sys
import time
from pathlib import Path
from typing import Any

from lite_verl.errors import UserError

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

LOCK_NAME = ".lock"

_HELD: set[int] = set()  # this process's lock fds: a forked child closes its copies


def _close_in_child() -> None:
    for fd in _HELD:
        with contextlib.suppress(OSError):
            os.close(fd)
    _HELD.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_close_in_child)


class RunDirBusy(UserError):
    """Another process holds the run directory; the message names it."""


class RunLock:
    """The lock on RUN/.lock. `with RunLock(run):` or acquire()/release(); RunDirBusy when held elsewhere."""

    def __init__(self, run: Path) -> None:
        self.run = Path(run)
        self.file = self.run / LOCK_NAME
        self._fd: int | None = None  # flock: the open lock file
        self._pid: int | None = None  # the process that acquired it (a forked child must not release it)

    @property
    def held(self) -> bool:
        return self._pid == os.getpid()

    def acquire(self) -> RunLock:
        if not self.held:
            (self._acquire_flock if fcntl is not None else self._acquire_exclusive)()
            self._pid = os.getpid()
        return self

    def release(self) -> None:
        if not self.held:
            return
        self._pid = None
        if self._fd is None:  # the O_EXCL file: ours, so remove it
            self.file.unlink(missing_ok=True)
            return
        fd, self._fd = self._fd, None
        _HELD.discard(fd)
        try:
            self.file.unlink(missing_ok=True)  # while still held: see the module's docstring
        except OSError:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, 0)  # kept: at least a later holder's refusals must not name us
        os.close(fd)  # closing the last descriptor releases the flock

    def check_free(self) -> None:
        """RunDirBusy if another process holds the lock; creates and writes nothing."""
        if not self.file.exists() or self.held:
            return
        if fcntl is None:
            holder = _read_holder(self.file)
            if holder is not None and _alive(holder):
                raise self._busy(holder)
            return
        try:
            fd = os.open(self.file, os.O_RDWR | os.O_CLOEXEC)
        except OSError:
            return  # removed meanwhile
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise self._busy(_read_holder(self.file)) from None
        except OSError:
            pass  # no locks on this filesystem: acquire() says so
        finally:
            os.close(fd)  # also releases the probe's lock

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()

    def __del__(self) -> None:  # a lock nobody holds a reference to owns nothing (like a file object)
        with contextlib.suppress(Exception):
            self.release()

    # --- the two mechanisms ----------------------------------------------------------------------
    def _acquire_flock(self) -> None:
        while True:
            fd = self._lock_file()
            if _same_file(fd, self.file):
                break
            os.close(fd)  # its owner removed it as we locked it: lock the file at RUN/.lock now
        _HELD.add(fd)
        self._fd = fd
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(_me()).encode(), 0)

    def _lock_file(self) -> int:
        """RUN/.lock opened (created if absent) and flocked: its fd; RunDirBusy when another process has it."""
        assert fcntl is not None
        fd = os.open(self.file, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise self._busy(_read_holder(self.file)) from None
        except OSError as e:  # e.g. ENOLCK: a network filesystem without a lock service
            os.close(fd)
            raise UserError(
                f"cannot lock {self.file} ({e.strerror}): its filesystem does not support file locks; "
                "use a run directory on a local disk"
            ) from None
        return fd

    def _acquire_exclusive(self) -> None:
        """No fcntl: create RUN/.lock exclusively; one whose process is gone from this host is stale."""
        for _ in range(2):
            try:
                fd = os.open(self.file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            except FileExistsError:
                holder = _read_holder(self.file)
                if holder is None or _alive(holder):  # unreadable: being written, or not ours to judge
                    raise self._busy(holder) from None
                self.file.unlink(missing_ok=True)  # stale: its owner died without releasing it
                continue
            with os.fdopen(fd, "w") as f:
                f.write(json.dumps(_me()))
            return
        raise self._busy(_read_holder(self.file))

    def _busy(self, holder: dict[str, Any] | None) -> RunDirBusy:
        who = "another process (pid unknown)"
        if holder:
            command = str(holder.get("command", ""))
            command = command if len(command) <= 100 else command[:97] + "..."
            who = (
                f"pid {holder.get('pid', '?')} on {holder.get('host', '?')} "
                f"({command}, since {holder.get('since', '?')})"
            )
        return RunDirBusy(
            f"run directory {self.run} is in use by {who}; wait for it to finish or stop it, then try again"
        )


def _me() -> dict[str, Any]:
    return {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "command": shlex.join(["lite-verl", *sys.argv[1:]]),
        "since": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }


def _same_file(fd: int, path: Path) -> bool:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return False
    fs = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (fs.st_dev, fs.st_ino)


def _read_holder(file: Path) -> dict[str, Any] | None:
    try:
        holder = json.loads(file.read_text())
    except (OSError, ValueError):
        return None  # not written yet, or removed meanwhile
    return holder if isinstance(holder, dict) else None


def _alive(holder: dict[str, Any]) -> bool:
    """Whether the holder may still run: another host's process cannot be checked, so it counts as alive."""
    if holder.get("host") != socket.gethostname():
        return True
    try:
        pid = int(holder["pid"])
    except (KeyError, TypeError, ValueError):
        return True
    if os.name == "posix":
        try:
            os.kill(pid, 0)  # signal 0: only asks whether the process exists
        except ProcessLookupError:
            return False
        except PermissionError:  # exists, another user's
            return True
        return True
    try:  # pragma: no cover - Windows (os.kill there would end the process)
        import psutil

        return bool(psutil.pid_exists(pid))
    except ImportError:  # pragma: no cover
        return True
