"""Phase timing: one context manager that fills the `timing/<phase>_s` metrics of a step.

    timer = PhaseTimer(device)
    with timer.phase("update"):
        ...
    metrics.update(timer.metrics)        # {"timing/update_s": ...}

With a CUDA `device` the timer waits for the GPU at both ends of a phase, so the seconds are those of
the work the phase queued, not of the host returning early; without one (CPU, or phases whose end
already waits) it reads the clock only. A phase entered twice adds up (the optimizer steps of an update).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

import torch

from lite_verl.device import synchronize


class PhaseTimer:
    def __init__(self, device: torch.device | None = None) -> None:
        self.device = device
        self.metrics: dict[str, float] = {}
        self.spans: dict[str, tuple[float, float]] = {}  # phase -> (start, end) wall clock of its last run

    def now(self) -> float:
        """perf_counter() after the GPU finished what was queued."""
        if self.device is not None:
            synchronize(self.device)  # a no-op off CUDA
        return time.perf_counter()

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        start, wall = self.now(), time.time()
        try:
            yield
        finally:
            seconds = self.now() - start
            key = f"timing/{name}_s"
            self.metrics[key] = self.metrics.get(key, 0.0) + seconds
            self.spans[name] = (wall, wall + seconds)

    def seconds(self, name: str) -> float:
        return self.metrics.get(f"timing/{name}_s", 0.0)
