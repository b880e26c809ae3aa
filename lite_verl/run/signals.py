"""Signals: the first SIGINT/SIGTERM asks the loop to stop after the step in flight (a checkpoint is
written); a second one stops at once."""

from __future__ import annotations

import signal
import sys
import threading
from typing import Any


class Interrupted(Exception):
    """SIGINT/SIGTERM: the step in flight finished, a checkpoint was written, the run stopped."""

    def __init__(self, signum: int, step: int) -> None:
        self.exit_code = 128 + signum
        super().__init__(
            f"stopped by {signal.Signals(signum).name} after step {step}; a checkpoint was written"
        )


class StopRequest:
    """First SIGINT/SIGTERM asks the loop to stop after the current step; a second one stops at once."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self._old: dict[int, Any] = {}

    def __enter__(self) -> StopRequest:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._old[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        if self.signum is not None:
            raise KeyboardInterrupt
        self.signum = signum
        print(
            f"\nlite-verl: {signal.Signals(signum).name}: finishing this step and writing a checkpoint "
            "(send it again to stop at once)",
            file=sys.stderr,
            flush=True,
        )

    def __exit__(self, *exc: Any) -> None:
        for sig, handler in self._old.items():
            signal.signal(sig, handler)
