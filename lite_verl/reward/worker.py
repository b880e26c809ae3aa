"""User reward functions run in a child process with a per-call timeout.

A user function that raises, crashes its process (segfault, os._exit) or hangs must not take the
trainer with it. The worker evaluates one sample at a time and answers each; the controller waits
at most `reward.timeout_s` per sample. On a failure, `reward.on_error` decides: `raise` (the default)
stops the run with one line naming the function, the sample and the fix; `default` scores the sample
`reward.default_score`, warns, restarts the worker if needed and goes on. `IsolatedScorer` is the
`Scorer` (base.py) over one RewardWorker.
"""

from __future__ import annotations

import multiprocessing as mp
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from lite_verl.data.schema import PromptRow
from lite_verl.errors import RewardError
from lite_verl.reward.rules import check_value, load_reward_function

if TYPE_CHECKING:  # torch loads lazily: the worker's child process imports this module
    import torch

    from lite_verl.run.cost import Ledger


def _serve(spec: str, conn) -> None:  # pragma: no cover - runs in the child process
    try:
        _serve_forever(load_reward_function(spec), conn)
    except (EOFError, OSError, KeyboardInterrupt):
        return  # the controller went away or stopped us: leave quietly


def _serve_forever(fn, conn) -> None:  # pragma: no cover - runs in the child process
    while True:
        items = conn.recv()
        if items is None:
            return
        for i, (src, text, gt, extra) in enumerate(items):
            try:
                value = fn(src, text, gt, extra)
                if isinstance(value, dict):
                    value = value.get("score")
                answer = ("ok", i, value if isinstance(value, (int, float, type(None))) else repr(value))
            except Exception as e:  # noqa: BLE001 - the user's function may raise anything
                answer = ("err", i, f"{type(e).__name__}: {e}")
            conn.send(answer)


class RewardWorker:
    def __init__(
        self, spec: str, timeout_s: float, on_error: str = "raise", default_score: float = 0.0
    ) -> None:
        self.spec, self.timeout_s, self.on_error, self.default_score = (
            spec,
            timeout_s,
            on_error,
            default_score,
        )
        self._ctx = mp.get_context("spawn")
        self._proc: Any = None
        self._conn: Any = None
        self.failures = 0  # samples scored with the default after a failure

    def _start(self) -> None:
        parent, child = self._ctx.Pipe()
        self._proc = self._ctx.Process(target=_serve, args=(self.spec, child), daemon=True)
        self._proc.start()
        child.close()
        self._conn = parent

    def _kill(self) -> None:
        if self._proc is not None and self._proc.is_alive():
            self._proc.kill()
            self._proc.join(timeout=5)
        self._proc = None

    def close(self) -> None:
        if self._proc is not None and self._proc.is_alive():
            try:
                self._conn.send(None)
                self._proc.join(timeout=2)
            except (OSError, BrokenPipeError):
                pass
        self._kill()

    def score(self, items: list[tuple[str, str, str, dict]]) -> list[float]:
        """items: (data_source, response, ground_truth, extra_info). One float per item."""
        scores: list[float] = []
        while len(scores) < len(items):
            if self._proc is None or not self._proc.is_alive():
                self._start()
            start = len(scores)
            self._conn.send(items[start:])
            scores.extend(self._collect(items, start))
        return scores

    def _collect(self, items: list[tuple[str, str, str, dict]], start: int) -> list[float]:
        """Answers for items[start:]; stops early (with the failed item scored) when the worker fails."""
        out: list[float] = []
        for i in range(start, len(items)):
            src = items[i][0]
            if not self._conn.poll(self.timeout_s):
                why = (
                    "died"
                    if not self._proc.is_alive()
                    else f"did not return within reward.timeout_s={self.timeout_s}s"
                )
                self._kill()
                out.append(self._fail(f"{why} on sample {i} (data_source {src!r})"))
                return out
            try:
                kind, _, value = self._conn.recv()
            except (EOFError, OSError):
                self._kill()
                out.append(self._fail(f"crashed its worker process on sample {i} (data_source {src!r})"))
                return out
            if kind == "err":
                out.append(self._fail(f"raised {value} on sample {i} (data_source {src!r})"))
                continue
            try:
                out.append(check_value(value, i, src, f"reward.function {self.spec}"))
            except RewardError as e:
                out.append(self._fail(None, error=e))
        return out

    def _fail(self, what: str | None, error: RewardError | None = None) -> float:
        if self.on_error == "raise":
            if error is not None:
                raise error
            raise RewardError(
                f"reward.function {self.spec} {what}; fix the function, raise reward.timeout_s, "
                "or set reward.on_error=default"
            )
        self.failures += 1
        msg = str(error) if error is not None else f"reward.function {self.spec} {what}"
        print(
            f"lite-verl: warning: {msg}; scored {self.default_score} (reward.on_error=default)",
            file=sys.stderr,
        )
        return self.default_score


class IsolatedScorer:
    """The `Scorer` for reward.function in a worker process (reward.isolate=true)."""

    def __init__(self, worker: RewardWorker) -> None:
        self.worker = worker

    def score(self, rows: Sequence[PromptRow], texts: Sequence[str]) -> torch.Tensor:
        """[N] float32."""
        import torch

        items = [(r.data_source, t, r.ground_truth, r.extra_info) for r, t in zip(rows, texts)]
        return torch.tensor(self.worker.score(items), dtype=torch.float32)

    def start_step(self) -> None:
        pass

    def bill_to(self, ledger: Ledger) -> None:
        pass  # a CPU process next to the controller, already billed

    def close(self) -> None:
        self.worker.close()
