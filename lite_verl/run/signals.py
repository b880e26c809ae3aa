"""Signals: one shutdown protocol for the controller and every child process it starts.

The controller (`lite-verl train`): from the start of the command, the first SIGINT / SIGTERM / SIGHUP
(Ctrl-C in a terminal reaches the whole process group; `timeout`, systemd, Slurm, docker and Kubernetes send
SIGTERM) stops it. Before the first step there is nothing to save: it stops at once and the run directory is
removed. Once steps run, the step in flight finishes, a checkpoint is written, the children are shut down in
order, and the exit code is 128 + the signal (130, 143, 129). A second signal stops at once; the children
still end.

A child (vLLM worker, reward worker, follower training rank) calls `child_process_setup()` first: it ignores
the group's signals, so that only the controller decides when it stops (it tells the child through its
pipe), and it ends when the controller's process ends, however that ends (kill -9 included).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

# the signals that ask a run to stop; SIGHUP (a closed terminal or ssh session) where the platform has it
STOP_SIGNALS: tuple[signal.Signals, ...] = tuple(
    getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, name)
)


class Interrupted(Exception):
    """A stop signal ended the run: after `step` (0 = before the first), with or without a checkpoint."""

    def __init__(self, signum: int, step: int, checkpoint: bool) -> None:
        self.exit_code = 128 + signum
        self.step, self.checkpoint = step, checkpoint
        name = signal.Signals(signum).name
        if step == 0:
            text = f"stopped by {name} before the first step of this run (nothing was trained)"
        elif checkpoint:
            text = f"stopped by {name} after step {step}; a checkpoint was written"
        else:
            text = (
                f"stopped by {name} after step {step}; NO checkpoint was written (trainer.keep_checkpoints=0)"
            )
        super().__init__(text)


class TrainedThenInterrupted(Interrupted):
    """A stop signal came after the last step (during it, or cutting the final validation short): every
    step was trained and checkpointed, so there is nothing to resume; the message says how to evaluate."""

    def __init__(self, signum: int, step: int, checkpoint: bool, run_dir: str) -> None:
        super().__init__(signum, step, checkpoint)
        saved = (
            f"the last checkpoint is written (evaluate it with: lite-verl eval {run_dir})"
            if checkpoint
            else "no checkpoint was written (trainer.keep_checkpoints=0)"
        )
        name = signal.Signals(signum).name
        Exception.__init__(
            self, f"stopped by {name} at the end of the run; all {step} steps were trained and {saved}"
        )


class Abandoned(Exception):
    """A stop signal ended work that saves nothing (a validation) at once; StopRequest.signum keeps it."""


class StopRequest:
    """While active (a context manager), the stop signals are handled here.

    defer=False (from the command's start until the loop runs): the first signal raises Interrupted at
    once. defer=True (the loop): the first signal is recorded in `signum` and the loop stops after the step
    in flight; a second one raises KeyboardInterrupt (stop now). Inside `abandoning()` the first signal
    ends the block at once instead (Abandoned): a validation is not worth waiting minutes for."""

    def __init__(self, defer: bool = True, saves: bool = True) -> None:
        self.defer = defer
        self.signum: int | None = None
        self._old: dict[int, Any] = {}
        # what the first signal starts, as its message says it (never a checkpoint that will not be written)
        self._after = (
            "writing a checkpoint" if saves else "stopping (trainer.keep_checkpoints=0: no checkpoint)"
        )
        self._abandon: str | None = None  # inside abandoning(): what follows the cut, as the message says it

    @contextmanager
    def abandoning(self, last: bool = False) -> Iterator[None]:
        """Run work that saves nothing: a stop signal, now or already received, raises Abandoned at once.
        `last`: after the last step, whose checkpoint is already written (the run then just stops)."""
        if self.signum is not None:
            raise Abandoned
        self._abandon = "stopping" if last else self._after
        try:
            yield
        finally:
            self._abandon = None

    def __enter__(self) -> StopRequest:
        if threading.current_thread() is threading.main_thread():
            for sig in STOP_SIGNALS:
                self._old[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        if not self.defer:
            raise Interrupted(signum, 0, False)
        if self.signum is not None:
            raise KeyboardInterrupt
        self.signum = signum
        doing = (
            f"cutting the validation short, then {self._abandon}"
            if self._abandon
            else f"finishing this step, then {self._after}"
        )
        print(
            f"\nlite-verl: {signal.Signals(signum).name}: {doing} (send it again to stop at once)",
            file=sys.stderr,
            flush=True,
        )
        if self._abandon:
            raise Abandoned

    def __exit__(self, *exc: Any) -> None:
        for sig, handler in self._old.items():
            signal.signal(sig, handler)


@contextmanager
def held_signals() -> Iterator[None]:
    """Inside, a stop signal waits for the block to end, then acts as it would have (the handler in place
    is called). For code that starts threads (a tracker's writers): an exception raised inside
    `Thread.start()` leaves the new thread half-registered, and it prints a traceback as it dies."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    pending: list[int] = []
    old = {sig: signal.signal(sig, lambda signum, frame: pending.append(signum)) for sig in STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)
        if pending:
            signal.raise_signal(pending[0])  # the restored handler runs now, in this thread


def child_process_setup() -> None:
    """First thing in a child process: ignore the group's stop signals and end with the controller."""
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    exit_with_parent()


def exit_with_parent() -> None:
    """End this process when its parent process ends, however it ends (its sentinel closes), even while
    this process waits inside a collective or a long generate."""
    parent = mp.parent_process()
    if parent is None:
        return

    def watch() -> None:
        parent.join()
        os._exit(1)

    threading.Thread(target=watch, name="lite-verl-parent-watch", daemon=True).start()
