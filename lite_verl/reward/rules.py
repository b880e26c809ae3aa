"""Rule rewards chosen by `data_source`, the import of a user function given as `module:function`, and the
check every reward value passes.

The rule rewards have verl's signature
    fn(data_source: str, solution_str: str, ground_truth: str, extra_info: dict | None) -> float
A value must be a finite number; anything else is a RewardError that names the function, the sample
and the fix. How a user function is called (verl's or TRL's shape) is functions.py's business.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import math
import numbers
import re
import sys
from collections.abc import Callable
from fractions import Fraction
from pathlib import Path
from typing import Any

from lite_verl.data.tasks import (
    ARITH_SOURCE,
    COUNTDOWN_SOURCE,
    ECHO_LEN,
    ECHO_SOURCE,
    LARGEST_SOURCE,
    SEQUENCE_SOURCE,
)
from lite_verl.errors import RewardError
from lite_verl.reward.builtins import boxed_score, gsm8k_extract, gsm8k_score

__all__ = ["gsm8k_extract", "gsm8k_score", "default_compute_score", "load_reward_function", "check_value"]

RewardFn = Callable[..., Any]


def echo_score(solution_str: str, ground_truth: str) -> float:
    """Occurrences of the requested letter anywhere in the response, capped at ECHO_LEN, over ECHO_LEN."""
    return min(solution_str.count(ground_truth), ECHO_LEN) / ECHO_LEN


COUNTDOWN_FORMAT_SCORE = 0.1  # an equation in <answer> tags that is wrong (TinyZero gives 0.1 too)
_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_OPS = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b, ast.Mult: lambda a, b: a * b,
        ast.Div: lambda a, b: a / b}  # fmt: skip


def _arith(node: ast.AST, used: list[int]) -> Fraction:
    """The exact value of + - * / over integer literals (collected in `used`); ValueError for anything else."""
    if isinstance(node, ast.Expression):
        return _arith(node.body, used)
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        left, right = _arith(node.left, used), _arith(node.right, used)
        if isinstance(node.op, ast.Div) and right == 0:
            raise ValueError("division by zero")
        return Fraction(_OPS[type(node.op)](left, right))
    if isinstance(node, ast.Constant) and type(node.value) is int:
        used.append(node.value)
        return Fraction(node.value)
    raise ValueError(f"not allowed in an equation: {ast.dump(node)[:40]}")


def countdown_score(solution_str: str, target: Any, numbers: list[int]) -> float:
    """1.0 when the last <answer> holds an arithmetic expression that uses each of `numbers` exactly once
    and equals `target`; COUNTDOWN_FORMAT_SCORE when there is an <answer> that is not that; else 0.0."""
    found = _ANSWER.findall(solution_str)
    if not found:
        return 0.0
    expression = found[-1].split("=")[0].strip()  # "3 + 4 * 3 = 15" counts by its left side
    used: list[int] = []
    try:
        value = _arith(ast.parse(expression, mode="eval"), used) if len(expression) < 200 else None
    except (SyntaxError, ValueError, RecursionError):
        return COUNTDOWN_FORMAT_SCORE
    right = sorted(used) == sorted(int(n) for n in numbers) and value == Fraction(int(target))
    return 1.0 if right else COUNTDOWN_FORMAT_SCORE


# data sources whose answers end in `#### n`, scored by GSM8K's rule
HASH_ANSWER_SOURCES = ("openai/gsm8k", ARITH_SOURCE, SEQUENCE_SOURCE, LARGEST_SOURCE)
# verl's MATH data sources (its default_compute_score: the last \boxed{} against the solution's) and the math recipe's
BOXED_SOURCES = ("lighteval/MATH", "DigitalLearningGmbH/MATH-lighteval", "HuggingFaceH4/MATH-500", "math")


def default_compute_score(
    data_source: str, solution_str: str, ground_truth: str, extra_info: dict[str, Any] | None = None
) -> float:
    if data_source in HASH_ANSWER_SOURCES:
        return gsm8k_score(solution_str, ground_truth)
    if data_source in BOXED_SOURCES:
        return boxed_score(solution_str, ground_truth)
    if data_source == ECHO_SOURCE:
        return echo_score(solution_str, ground_truth)
    if data_source == COUNTDOWN_SOURCE and extra_info is not None and "numbers" in extra_info:
        return countdown_score(solution_str, ground_truth, extra_info["numbers"])
    raise RewardError(
        f"no rule reward for data_source {data_source!r} (known: {', '.join(HASH_ANSWER_SOURCES + BOXED_SOURCES)}, "
        f"{ECHO_SOURCE}, {COUNTDOWN_SOURCE} with extra_info.numbers); for \\boxed{{}} answers set "
        "reward.functions=[boxed], else give your own with reward.function=module:function"
    )


def load_reward_function(spec: str, key: str = "reward.function") -> RewardFn:
    """`module:function` or `path/to/file.py:function`. Empty spec = the rule rewards. `key` names the
    config key in the errors."""
    if not spec:
        return default_compute_score
    target, _, name = spec.rpartition(":")
    try:
        if target.endswith(".py"):
            path = Path(target)
            if not path.is_file():
                raise RewardError(f"{key}: file {target!r} does not exist")
            _importable_from(path.resolve().parent)  # its sibling modules, as `python file.py` would see them
            mod_spec = importlib.util.spec_from_file_location(f"lite_verl_user_reward_{path.stem}", path)
            assert mod_spec is not None and mod_spec.loader is not None
            module = importlib.util.module_from_spec(mod_spec)
            sys.modules[mod_spec.name] = module
            mod_spec.loader.exec_module(module)
        else:
            _importable_from(Path.cwd())  # a module beside the user, as `python -c "import m"` would find it
            module = importlib.import_module(target)
    except RewardError:
        raise
    except Exception as e:  # noqa: BLE001 - any import failure is the user's to fix
        raise RewardError(f"{key}: cannot import {target!r} ({type(e).__name__}: {e})") from None
    fn = getattr(module, name, None)
    if not callable(fn):
        import difflib

        mine = [
            n
            for n, v in vars(module).items()
            if callable(v) and getattr(v, "__module__", "") == module.__name__
        ]
        close = difflib.get_close_matches(name, mine, n=1)
        hint = (
            f"; did you mean {close[0]!r}?"
            if close
            else (f"; it has {', '.join(sorted(mine))}" if mine else "")
        )
        raise RewardError(f"{key}: {target!r} has no function {name!r}{hint}")
    return fn


def _importable_from(folder: Path) -> None:
    """Puts `folder` on sys.path (once; the `lite-verl` console script's own folder is there instead), last,
    so that a user's file never shadows an installed package the run imports later."""
    if str(folder) not in sys.path:
        sys.path.append(str(folder))


def check_value(value: Any, i: int, data_source: str, name: str) -> float:
    """A reward must be a finite number (numpy's too; a bool is 0 or 1, as TRL and verl read it); anything
    else is a RewardError naming the sample."""
    if not isinstance(value, numbers.Real) or not math.isfinite(value):
        # reward/functions.plain sent anything not a number as its repr already
        shown = value if isinstance(value, str) else repr(value)
        hint = "; convert it with float(...)" if shown[:1] in "'\"" and shown[1:-1].strip() else ""
        raise RewardError(
            f"{name} returned {shown} on sample {i} (data_source {data_source!r}); it must return a finite float{hint}"
        )
    return float(value)
