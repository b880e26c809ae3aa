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
import queue
import signal
import sys
import threading
import time
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
        self._raise_later: BaseException | None = None  # see _handle
        self._relay: _Relay | None = None

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
            self._relay = _Relay()
            for sig in STOP_SIGNALS:
                self._old[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        error, self._raise_later = self._raise_later or self._react(signum), None
        if error is None:
            return
        if _inside_thread_start(frame) and self._relay is not None:
            # raised here, the exception would leave the new thread half-registered (it prints a traceback as
            # it ends): raise it once start() has returned, when the relay calls this handler again
            self._raise_later = error
            self._relay.again(signum)
            return
        raise error

    def _react(self, signum: int) -> BaseException | None:
        """What this signal does now: the exception that stops the work, or None (recorded and said)."""
        if not self.defer:
            return Interrupted(signum, 0, False)
        if self.signum is not None:
            return KeyboardInterrupt()
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
        return Abandoned() if self._abandon else None

    def __exit__(self, *exc: Any) -> None:
        for sig, handler in self._old.items():
            signal.signal(sig, handler)
        if self._relay is not None:
            self._relay.close()
        if self._raise_later is not None and exc[0] is None:  # the block ended before the relay's call
            raise self._raise_later


class _Relay:
    """A thread that has the main thread's signal handler called again a moment later (StopRequest._handle):
    started before any signal comes, as a handler must not start a thread (it may have interrupted
    Thread.start() holding threading's registry lock); woken through a SimpleQueue, which is reentrant."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[int | None] = queue.SimpleQueue()
        self._closed = False
        threading.Thread(target=self._run, name="lite-verl-signal-relay", daemon=True).start()

    def again(self, signum: int) -> None:
        self._queue.put(signum)

    def close(self) -> None:
        self._closed = True  # the handler is gone: a signal sent now would meet the default action
        self._queue.put(None)

    def _run(self) -> None:
        main = threading.main_thread().ident
        while (signum := self._queue.get()) is not None:
            time.sleep(0.001)  # after the handler returned (called earlier, it defers once more)
            # the signal itself, not interrupt_main(): a blocking call (a sleep) is interrupted too
            if main is not None and not self._closed:
                signal.pthread_kill(main, signum)


def _inside_thread_start(frame: Any) -> bool:
    """Whether this frame of the main thread runs inside threading.Thread.start()."""
    while frame is not None:
        if frame.f_code is _THREAD_START:
            return True
        frame = frame.f_back
    return False


_THREAD_START = threading.Thread.start.__code__


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
