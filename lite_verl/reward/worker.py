"""User reward functions run in a child process with a time limit per call.

A user function that raises, crashes its process (segfault, os._exit) or hangs must not take the
trainer with it. The controller prepares each call (functions.calls_of: one per sample for verl-shaped
functions, one per batch for TRL-shaped ones), the worker makes them in order and answers each; the
controller waits at most `reward.timeout_s` per sample of a call. On a failure, `reward.on_error` decides:
`raise` (the default) stops the run with one line naming the function, the sample and the fix; `default`
gives the failed samples `reward.default_score` from that function, warns, restarts the worker if needed
and goes on. `IsolatedScorer` is the `Scorer` (base.py) over one RewardWorker running every configured
function (built-ins too, when a user function is among them).
"""

from __future__ import annotations

import multiprocessing as mp
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

from lite_verl.data.schema import PromptRow
from lite_verl.errors import RewardError
from lite_verl.reward.functions import (
    Call,
    Extras,
    FunctionSpec,
    RewardFunction,
    Sample,
    ScoreContext,
    calls_of,
    load_function,
    plain,
    raised,
    read_values,
    score_all,
    where,
)

if TYPE_CHECKING:  # torch loads lazily: the worker's child process imports this module
    import torch

    from lite_verl.run.cost import Ledger


def _serve(specs: list[FunctionSpec], conn: Any) -> None:  # pragma: no cover - runs in the child process
    from lite_verl.run.signals import child_process_setup

    child_process_setup()  # Ctrl-C / SIGTERM to the group are the controller's to act on
    try:
        try:  # the user's modules are imported here only, never in the controller
            functions = [load_function(s) for s in specs]
        except Exception as e:  # noqa: BLE001 - whatever the import raised, reported in one line
            conn.send(("err", str(e) if isinstance(e, RewardError) else f"{type(e).__name__}: {e}"))
            return
        conn.send(("ready", [Shape(f.shape, f.params, f.required, f.any_keyword) for f in functions]))
        _serve_forever(functions, conn)
    except (EOFError, OSError, KeyboardInterrupt):
        return  # the controller went away or stopped us: leave quietly


def _serve_forever(functions: list[RewardFunction], conn: Any) -> None:  # pragma: no cover - in the child
    """Requests: (function index, calls), or None to stop. One answer per call: ("ok", value) or
    ("err", why)."""
    while True:
        request = conn.recv()
        if request is None:
            return
        index, calls = request
        f = functions[index]
        for call in calls:
            try:
                answer = ("ok", plain(f.fn(*call.args, **call.kwargs), f.shape == "trl"))
            except Exception as e:  # noqa: BLE001 - the user's function may raise anything
                answer = ("err", raised(e))
            conn.send(answer)


START_TIMEOUT_S = 120.0  # importing the user's reward modules in the worker


class Shape(NamedTuple):
    """How to call a function, as the worker found it (RewardFunction without the function itself)."""

    shape: str
    params: frozenset[str]
    required: frozenset[str]
    any_keyword: bool


def _runs_in_the_worker(*args: Any, **kwargs: Any) -> Any:
    raise RuntimeError("an isolated reward function runs in its worker process, not in the controller")


class RewardWorker:
    """The child process running the configured functions, restarted after a crash or a time-out."""

    def __init__(
        self, specs: list[FunctionSpec], timeout_s: float, on_error: str = "raise", default_score: float = 0.0
    ) -> None:
        self.specs, self.timeout_s, self.on_error, self.default_score = (
            specs,
            timeout_s,
            on_error,
            default_score,
        )
        self._ctx = mp.get_context("spawn")
        self._proc: Any = None
        self._conn: Any = None

    def start(self) -> list[RewardFunction]:
        """Start the worker, which imports the functions; -> them as the controller calls them (their shape,
        without importing anything here). Raises RewardError in one line when the import fails, hangs or
        ends the process."""
        shapes = self._start()
        return [
            RewardFunction(spec, _runs_in_the_worker, s.shape, s.params, s.required, s.any_keyword)  # type: ignore[arg-type]
            for spec, s in zip(self.specs, shapes)
        ]

    def _start(self) -> list[Shape]:
        parent, child = self._ctx.Pipe()
        self._proc = self._ctx.Process(target=_serve, args=(self.specs, child), daemon=True)
        self._proc.start()
        child.close()
        self._conn = parent
        names = ", ".join(s.label for s in self.specs)
        if not parent.poll(START_TIMEOUT_S):
            self._kill()
            raise RewardError(f"{names}: importing it in the reward worker did not finish within "
                              f"{START_TIMEOUT_S:.0f}s; make the module import quickly (no work at import time)")  # fmt: skip
        try:
            kind, value = parent.recv()
        except (EOFError, OSError):
            self._proc.join(timeout=5)
            code = self._proc.exitcode
            self._kill()
            raise RewardError(f"{names}: importing it ended the reward worker process (exit code {code}); "
                              "fix what the module does at import time") from None  # fmt: skip
        if kind == "err":
            self._kill()
            raise RewardError(value)
        return value

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

    def score(
        self, index: int, f: RewardFunction, samples: Sequence[Sample], extras: Extras | None = None
    ) -> list[float | None]:
        """One value per sample from function `index` (f, loaded here too); a failed call's samples get
        the default (on_error=default) or raise. A verl-shaped dict's other numbers go to `extras`."""
        values: list[float | None] = []
        pending = calls_of(f, samples)
        while pending:
            if self._proc is None or not self._proc.is_alive():
                self._start()
            self._conn.send((index, pending))
            done = self._collect(f, pending, samples, values, extras)
            pending = pending[done:]
        return values

    def _collect(
        self,
        f: RewardFunction,
        calls: list[Call],
        samples: Sequence[Sample],
        out: list[float | None],
        extras: Extras | None = None,
    ) -> int:
        """Answers of `calls` appended to `out`; -> the number of calls answered (or failed). Stops early,
        the failed call scored, when the worker dies or hangs."""
        for done, call in enumerate(calls, start=1):
            if not self._conn.poll(self.timeout_s * call.size):
                limit = f"reward.timeout_s={self.timeout_s}s" + (" per sample" if f.shape == "trl" else "")
                why = "died" if not self._proc.is_alive() else f"did not return within {limit}"
                self._kill()
                out += self._fail(f, call, f"{why} {where(f, call, samples)}", timed_out=why != "died")
                return done
            try:
                kind, value = self._conn.recv()
            except (EOFError, OSError):
                self._kill()
                out += self._fail(f, call, f"crashed its worker process {where(f, call, samples)}")
                return done
            if kind == "err":
                out += self._fail(f, call, f"raised {value} {where(f, call, samples)}")
                continue
            try:
                out += read_values(f, call, value, samples, extras)
            except RewardError as e:
                out += self._fail(f, call, None, error=e)
        return len(calls)

    def _fail(
        self,
        f: RewardFunction,
        call: Call,
        what: str | None,
        error: RewardError | None = None,
        timed_out: bool = False,
    ) -> list[float | None]:
        if self.on_error == "raise":
            self._kill()  # answers it may still send belong to this call: never read them as the next one's
            if error is not None:
                raise error
            more_time = " raise reward.timeout_s," if timed_out else ""  # only a timeout needs more time
            fix = f"fix the function,{more_time} or set reward.on_error=default"
            raise RewardError(f"{f.spec.label} {what}; {fix}")
        msg = str(error) if error is not None else f"{f.spec.label} {what}"
        print(
            f"lite-verl: warning: {msg}; scored {self.default_score} (reward.on_error=default)",
            file=sys.stderr,
        )
        return [self.default_score] * call.size


@dataclass
class IsolatedScorer:
    """The `Scorer` for user reward functions in a worker process (reward.isolate=true)."""

    functions: list[RewardFunction]  # their shapes (from the worker) decide the calls; they run there
    worker: RewardWorker
    log_parts: bool = False  # reward.functions: keep each function's values for its metric
    last_parts: dict[str, torch.Tensor] = field(default_factory=dict)

    def score(
        self, rows: Sequence[PromptRow], texts: Sequence[str], context: ScoreContext | None = None
    ) -> torch.Tensor:
        """[N] float32."""
        total, self.last_parts = score_all(
            self.functions, rows, texts, context, self.log_parts, self.worker.score
        )
        return total

    def start_step(self) -> None:
        pass

    def bill_to(self, ledger: Ledger) -> None:
        pass  # a CPU process next to the controller, already billed

    def close(self) -> None:
        self.worker.close()
