"""Built-in reward functions, addressed by name in `reward.functions` (`fn: boxed`), settings in `args`.

    gsm8k    1.0 for the right GSM8K answer, else args.format_score (0.0) when there is an answer, else 0.0.
             args.mode: strict (verl's `#### n`, the default) | flexible (the last number in the response)
    boxed    1.0 when the last \\boxed{...} equals the ground truth. With math-verify installed
             (pip install 'lite-verl[math]') it decides equivalence (1/2 = \\frac{1}{2} = 0.5) as TRL's
             accuracy_reward does, and a ground truth it cannot parse gives None (the sample is skipped);
             without it, a string rule after light normalisation (verl's math rule, simplified).
             args.checker: auto (math-verify when installed) | math-verify | string
    format   1.0 when the response is the tagged blocks in order, whitespace only around them, else 0.0.
             args.tags: think,answer (the default: <think>...</think><answer>...</answer>);
             args.pattern: a regex the whole response must match instead (re.DOTALL), e.g. TRL's
             think format `<think>(?!.*<think>).*?</think>.*`
    length   DAPO's soft overlong penalty (Yu et al. 2025, eq. 13) on the response length in characters:
             0 up to max_chars - soft_chars, then linear down to -1 at max_chars, -1 beyond.
             args.max_chars (required), args.soft_chars (default max_chars // 4)
    rule     the rule reward chosen by data_source (reward/rules.py), e.g. to add `format` to it

Each is TRL-shaped (`fn(completions, ground_truth, **kwargs) -> list[float | None]`, completions as text or
as chat messages) and imports nothing from lite-verl but errors: config validation checks `args` here.
"""

from __future__ import annotations

import functools
import math
import re
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from lite_verl.errors import RewardError

BatchFn = Callable[..., list[float | None]]

# name -> its settings (args) and their help; `rule` is made in functions.py (it needs the data sources)
ARGS: dict[str, dict[str, str]] = {
    "gsm8k": {"mode": "strict | flexible", "format_score": "score of a wrong answer (default 0.0)"},
    "boxed": {"checker": "auto | math-verify | string"},
    "format": {"tags": "tag names in order (default think,answer)", "pattern": "a full-match regex"},
    "length": {"max_chars": "length scored -1 (required)", "soft_chars": "the soft span (max_chars // 4)"},
    "rule": {},
}
MATH_INSTALL = "pip install 'lite-verl[math]' (or pip install math-verify)"

_GSM8K_ANSWER = re.compile(r"#### (\-?[0-9\.\,]+)")
_NUMBER = re.compile(r"(\-?[0-9\.\,]+)")


def gsm8k_extract(solution_str: str, mode: str = "strict") -> str | None:
    """verl's GSM8K extraction from the (last 300 chars of the) response: strict = the last `#### n`,
    flexible = the last number."""
    tail = solution_str[-300:]
    if mode == "strict":
        found = _GSM8K_ANSWER.findall(tail)
        return found[-1].replace(",", "").replace("$", "") if found else None
    numbers = [n for n in _NUMBER.findall(tail) if n not in ("", ".")]
    return numbers[-1].replace(",", "").rstrip(".") if numbers else None


def gsm8k_score(
    solution_str: str, ground_truth: str, format_score: float = 0.0, score: float = 1.0, mode: str = "strict"
) -> float:
    """1.0 for the right answer, `format_score` for a wrong one, 0.0 when there is none (as verl). A ground
    truth that is a whole GSM8K solution (its `answer` column) counts by its `#### n`."""
    answer = gsm8k_extract(solution_str, mode)
    if answer is None:
        return 0.0
    gold = _number_text(ground_truth)
    gold = (gsm8k_extract(gold) or gold) if "####" in gold else gold
    return score if answer == gold.replace(",", "") else format_score


def _number_text(ground_truth: Any) -> str:
    """A ground truth as the text an answer is compared with. A whole float is written as an integer: a csv
    or parquet column with one empty cell is read as floats (8.0), and '8' must still match it."""
    if isinstance(ground_truth, float) and ground_truth.is_integer():
        return str(int(ground_truth))
    return str(ground_truth)


def last_boxed(text: str) -> str | None:
    """The content of the last \\boxed{...} (or \\fbox{...}), braces matched; None when there is none."""
    start = max(text.rfind("\\boxed"), text.rfind("\\fbox"))
    if start < 0:
        return None
    if text.startswith("\\boxed ", start):  # \boxed 5
        return text[start + 7 :].split("$")[0].strip()
    open_at = text.find("{", start)
    if open_at < 0:
        return None
    depth = 0
    for i in range(open_at, len(text)):
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        if depth == 0:
            return text[open_at + 1 : i]
    return None


def normalize_answer(answer: str) -> str:
    """Light LaTeX normalisation for the string rule: spacing, \\left/\\right, dfrac, units of %, $ and
    degrees, \\text{...}, a trailing period, thousands separators and trailing zeros of plain numbers."""
    s = answer.strip().strip("$")
    for old, new in (("\\!", ""), ("\\left", ""), ("\\right", ""), ("dfrac", "frac"), ("tfrac", "frac"),
                     ("^{\\circ}", ""), ("^\\circ", ""), ("\\%", ""), ("%", ""), ("\\$", "")):  # fmt: skip
        s = s.replace(old, new)
    s = re.sub(r"\\(?:text|mathrm|textbf)\{([^}]*)\}", r"\1", s)
    s = re.sub(r"\\frac(\d)(\d)", r"\\frac{\1}{\2}", s)  # \frac12
    s = s.replace(" ", "").rstrip(".")
    if re.fullmatch(r"-?\d{1,3}(,\d{3})+(\.\d+)?", s):
        s = s.replace(",", "")
    if re.fullmatch(r"-?\d+\.\d+", s):
        s = s.rstrip("0").rstrip(".")
    return s


def boxed_string_score(text: str, ground_truth: Any) -> float:
    """The string rule: the last boxed answer equals the ground truth (its own box, if it has one)."""
    answer = last_boxed(text)
    if answer is None:
        return 0.0
    gold = str(ground_truth)
    gold = last_boxed(gold) or gold
    return float(normalize_answer(answer) == normalize_answer(gold))


@functools.cache  # a failed import searches sys.path again each time
def math_verify_available() -> bool:
    try:
        import math_verify  # noqa: F401
    except ImportError:
        return False
    return True


def boxed_math_verify_score(text: str, ground_truth: Any) -> float | None:
    """TRL's accuracy_reward for one sample: None when math-verify cannot parse the ground truth."""
    from latex2sympy2_extended import NormalizationConfig
    from math_verify import LatexExtractionConfig, parse, verify

    main = threading.current_thread() is threading.main_thread()  # its time limits use SIGALRM
    gold = parse(str(ground_truth), parsing_timeout=10 if main else None)
    if not gold:
        return None
    extraction = LatexExtractionConfig(
        normalization_config=NormalizationConfig(units=True),
        boxed_match_priority=0,
        try_extract_without_anchor=False,
    )
    answer = parse(
        text,
        extraction_config=[extraction],
        extraction_mode="first_match",
        parsing_timeout=10 if main else None,
    )
    return float(verify(gold, answer, timeout_seconds=5 if main else None))


def text_of(completion: Any) -> str:
    """A TRL completion: the text, or the content of its last message when it is chat messages."""
    if isinstance(completion, str):
        return completion
    return str(completion[-1]["content"])


def _float_arg(name: str, args: Mapping[str, str], key: str, default: float | None) -> float:
    raw = args.get(key)
    if raw is None:
        if default is None:
            raise RewardError(f"built-in reward {name!r} needs args.{key} ({ARGS[name][key]})")
        return default
    try:
        value = float(raw)
    except ValueError:
        raise RewardError(f"built-in reward {name!r}: args.{key}={raw!r} must be a number") from None
    if not math.isfinite(value):
        raise RewardError(f"built-in reward {name!r}: args.{key}={raw!r} must be finite")
    return value


def _choice(name: str, args: Mapping[str, str], key: str, allowed: Sequence[str]) -> str:
    value = args.get(key, allowed[0])
    if value not in allowed:
        raise RewardError(f"built-in reward {name!r}: args.{key}={value!r} must be {' or '.join(allowed)}")
    return value


def _gsm8k(args: Mapping[str, str]) -> BatchFn:
    mode = _choice("gsm8k", args, "mode", ("strict", "flexible"))
    wrong = _float_arg("gsm8k", args, "format_score", 0.0)

    def gsm8k(completions: list[Any], ground_truth: list[Any], **kwargs: Any) -> list[float | None]:
        return [gsm8k_score(text_of(c), g, wrong, mode=mode) for c, g in zip(completions, ground_truth)]

    return gsm8k


def _boxed(args: Mapping[str, str]) -> BatchFn:
    checker = _choice("boxed", args, "checker", ("auto", "math-verify", "string"))
    if checker == "math-verify" and not math_verify_available():
        raise RewardError(f"built-in reward 'boxed' with args.checker=math-verify: {MATH_INSTALL}")
    use_math_verify = checker != "string" and math_verify_available()

    def boxed(completions: list[Any], ground_truth: list[Any], **kwargs: Any) -> list[float | None]:
        one = boxed_math_verify_score if use_math_verify else boxed_string_score
        return [one(text_of(c), g) for c, g in zip(completions, ground_truth)]

    return boxed


def boxed_score(text: str, ground_truth: Any) -> float:
    """One sample by the `boxed` built-in's auto checker (math-verify when installed, else the string rule);
    a ground truth math-verify cannot parse is judged by the string rule."""
    if math_verify_available():
        got = boxed_math_verify_score(text, ground_truth)
        if got is not None:
            return got
    return boxed_string_score(text, ground_truth)


def _format(args: Mapping[str, str]) -> BatchFn:
    if "pattern" in args:
        try:
            pattern = re.compile(args["pattern"], re.DOTALL)
        except re.error as e:
            raise RewardError(f"built-in reward 'format': args.pattern is not a regex ({e})") from None
    else:
        tags = [t.strip() for t in args.get("tags", "think,answer").split(",") if t.strip()]
        if not tags or not all(re.fullmatch(r"[\w.-]+", t) for t in tags):
            raise RewardError(
                f"built-in reward 'format': args.tags={args.get('tags')!r} must be names, e.g. think,answer"
            )
        blocks = [rf"<{t}>(?:(?!</?{t}>).)*</{t}>" for t in tags]  # each block once, no nested tag
        pattern = re.compile(r"\s*" + r"\s*".join(blocks) + r"\s*", re.DOTALL)

    def format_reward(completions: list[Any], **kwargs: Any) -> list[float | None]:
        return [float(pattern.fullmatch(text_of(c)) is not None) for c in completions]

    return format_reward


def _length(args: Mapping[str, str]) -> BatchFn:
    max_chars = _float_arg("length", args, "max_chars", None)
    soft = _float_arg("length", args, "soft_chars", max_chars // 4)
    if max_chars <= 0 or not 0 < soft <= max_chars:
        raise RewardError(
            f"built-in reward 'length': needs 0 < args.soft_chars ({soft}) <= args.max_chars ({max_chars})"
        )

    def length(completions: list[Any], **kwargs: Any) -> list[float | None]:
        # r = 0 for L <= max - soft; (max - soft - L) / soft up to max; -1 beyond (DAPO's soft overlong)
        lengths = [len(text_of(c)) for c in completions]
        return [max(-1.0, min(0.0, (max_chars - soft - n) / soft)) for n in lengths]

    return length


MAKERS: dict[str, Callable[[Mapping[str, str]], BatchFn]] = {
    "gsm8k": _gsm8k,
    "boxed": _boxed,
    "format": _format,
    "length": _length,
}


def check_args(name: str, args: Mapping[str, str]) -> None:
    """Raises RewardError for an unknown built-in, an unknown setting or a bad value."""
    if name in MAKERS:
        make_builtin(name, args)  # building it checks the values
    else:
        _check_names(name, args)


def _check_names(name: str, args: Mapping[str, str]) -> None:
    """An unknown built-in or an unknown setting of one is a RewardError (values are checked when built)."""
    if name not in ARGS:
        raise RewardError(f"no built-in reward {name!r} (built-ins: {', '.join(ARGS)})")
    unknown = [k for k in args if k not in ARGS[name]]
    if unknown:
        known = ", ".join(ARGS[name]) or "none"
        raise RewardError(
            f"built-in reward {name!r} has no setting args.{unknown[0]} (its settings: {known})"
        )


def make_builtin(name: str, args: Mapping[str, str]) -> BatchFn:
    """The built-in `name` (not `rule`) with its settings; raises RewardError for bad ones."""
    _check_names(name, args)
    return MAKERS[name](args)
