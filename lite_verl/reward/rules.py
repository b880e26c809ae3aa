"""Rewards: rule rewards chosen by `data_source`, or a user function given as `module:function`.

Every reward function has verl's signature
    fn(data_source: str, solution_str: str, ground_truth: str, extra_info: dict | None) -> float | dict
(a dict must hold "score"). The value must be a finite number; anything else is a RewardError that
names the function, the sample and the fix. `InProcessScorer` calls one in this process (the rule
rewards, or reward.function with reward.isolate=false); worker.py runs a user function in a child.
"""

from __future__ import annotations

import importlib
import importlib.util
import math
import re
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lite_verl.data.schema import PromptRow
from lite_verl.data.tasks import ARITH_SOURCE, ECHO_LEN, ECHO_SOURCE
from lite_verl.errors import RewardError

if TYPE_CHECKING:  # torch loads lazily: the worker's child process imports this module
    import torch

    from lite_verl.run.cost import Ledger

RewardFn = Callable[..., Any]

_GSM8K_ANSWER = re.compile(r"#### (\-?[0-9\.\,]+)")


def gsm8k_extract(solution_str: str) -> str | None:
    """verl's strict GSM8K extraction: the last `#### n` in the (last 300 chars of the) response."""
    found = _GSM8K_ANSWER.findall(solution_str[-300:])
    if not found:
        return None
    return found[-1].replace(",", "").replace("$", "")


def gsm8k_score(solution_str: str, ground_truth: str, format_score: float = 0.0, score: float = 1.0) -> float:
    """1.0 for the right `#### n`, `format_score` for a wrong one, 0.0 when there is none (as verl)."""
    answer = gsm8k_extract(solution_str)
    if answer is None:
        return 0.0
    return score if answer == ground_truth.replace(",", "") else format_score


def echo_score(solution_str: str, ground_truth: str) -> float:
    """Occurrences of the requested letter anywhere in the response, capped at ECHO_LEN, over ECHO_LEN."""
    return min(solution_str.count(ground_truth), ECHO_LEN) / ECHO_LEN


def default_compute_score(
    data_source: str, solution_str: str, ground_truth: str, extra_info: dict[str, Any] | None = None
) -> float:
    if data_source in ("openai/gsm8k", ARITH_SOURCE):
        return gsm8k_score(solution_str, ground_truth)
    if data_source == ECHO_SOURCE:
        return echo_score(solution_str, ground_truth)
    raise RewardError(
        f"no rule reward for data_source {data_source!r} (known: openai/gsm8k, {ARITH_SOURCE}, {ECHO_SOURCE}); "
        "give your own with reward.function=module:function"
    )


def load_reward_function(spec: str) -> RewardFn:
    """`module:function` or `path/to/file.py:function`. Empty spec = the rule rewards."""
    if not spec:
        return default_compute_score
    target, _, name = spec.rpartition(":")
    try:
        if target.endswith(".py"):
            path = Path(target)
            if not path.is_file():
                raise RewardError(f"reward.function: file {target!r} does not exist")
            mod_spec = importlib.util.spec_from_file_location(f"lite_verl_user_reward_{path.stem}", path)
            assert mod_spec is not None and mod_spec.loader is not None
            module = importlib.util.module_from_spec(mod_spec)
            sys.modules[mod_spec.name] = module
            mod_spec.loader.exec_module(module)
        else:
            module = importlib.import_module(target)
    except RewardError:
        raise
    except Exception as e:  # noqa: BLE001 - any import failure is the user's to fix
        raise RewardError(f"reward.function: cannot import {target!r} ({type(e).__name__}: {e})") from None
    fn = getattr(module, name, None)
    if not callable(fn):
        raise RewardError(f"reward.function: {target!r} has no function {name!r}")
    return fn


def score_batch(
    fn: RewardFn,
    data_sources: Sequence[str],
    responses: Sequence[str],
    ground_truths: Sequence[str],
    extra_infos: Sequence[dict[str, Any]],
    name: str = "reward",
) -> list[float]:
    """One float per response; a raise, None, NaN or non-number is a RewardError naming the sample."""
    scores = []
    for i, (src, text, gt, extra) in enumerate(zip(data_sources, responses, ground_truths, extra_infos)):
        try:
            value = fn(src, text, gt, extra)
        except RewardError:
            raise
        except Exception as e:  # noqa: BLE001
            raise RewardError(
                f"{name} raised {type(e).__name__}: {e} on sample {i} (data_source {src!r})"
            ) from None
        if isinstance(value, dict):
            value = value.get("score")
        scores.append(check_value(value, i, src, name))
    return scores


def check_value(value: Any, i: int, data_source: str, name: str) -> float:
    """A reward must be a finite number; anything else is a RewardError naming the sample."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise RewardError(
            f"{name} returned {value!r} on sample {i} (data_source {data_source!r}); it must return a finite float"
        )
    return float(value)


class InProcessScorer:
    """The `Scorer` (base.py) for a reward function called in this process; `name` is used in its errors."""

    def __init__(self, fn: RewardFn, name: str) -> None:
        self.fn, self.name = fn, name

    def score(self, rows: Sequence[PromptRow], texts: Sequence[str]) -> torch.Tensor:
        """[N] float32."""
        import torch

        values = score_batch(
            self.fn,
            [r.data_source for r in rows],
            texts,
            [r.ground_truth for r in rows],
            [r.extra_info for r in rows],
            name=self.name,
        )
        return torch.tensor(values, dtype=torch.float32)

    def start_step(self) -> None:
        pass

    def bill_to(self, ledger: Ledger) -> None:
        pass  # runs on the controller's CPU, already billed

    def close(self) -> None:
        pass
