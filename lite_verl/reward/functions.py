"""Reward functions as users write them: loaded from the config, told apart by signature, called alike in
this process (`InProcessScorer`) and in the isolated worker (worker.py), their values combined.

Two shapes:
  TRL    fn(prompts, completions, **kwargs) -> list[float | None]: a function that names `completions` (or
         takes only **kwargs). One call per batch, by keyword, as TRL's GRPOTrainer makes it: prompts[i] and
         completions[i] are text, or chat messages when the dataset's prompt was chat messages (completions[i]
         = [{"role": "assistant", "content": ...}]); each other dataset column by its name (one value per
         completion), and ground_truth / data_source when no column has that name. A function without
         **kwargs gets only the names it takes. None = no reward from this function for that completion.
  verl   compute_score(data_source, solution_str, ground_truth, extra_info) -> float (or a dict with
         "score"): a function that names `solution_str`, called once per sample by keyword (its parameters
         in any order, those it lacks left out). Any other function that takes four positional arguments
         is called positionally, as lite-verl always did. None is an error: verl needs a number.

Several functions (reward.functions): the reward of a sample is sum_k weight_k * value_k over the functions
that scored it (a None is skipped, as TRL's nansum; a sample no function scored gets 0.0). Each function's
own values are kept as `parts` ([N] float32, NaN where it gave None) for the metrics reward/NAME/mean.
"""

from __future__ import annotations

import inspect
import numbers
import sys
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

from lite_verl.data.schema import PromptRow
from lite_verl.errors import RewardError
from lite_verl.reward import builtins
from lite_verl.reward.rules import check_value, default_compute_score, load_reward_function

if TYPE_CHECKING:  # torch loads lazily: the worker's child process imports this module
    import torch

    from lite_verl.config.schema import RewardConfig
    from lite_verl.run.cost import Ledger

Shape = Literal["trl", "verl", "positional"]
VERL_ARGS = ("data_source", "solution_str", "ground_truth", "extra_info")


class FunctionSpec(NamedTuple):
    """One reward function as configured; picklable: the worker loads it again from this."""

    name: str  # its metric: reward/NAME/mean
    fn: str  # module:function, path/to/file.py:function, or a built-in name (builtins.ARGS)
    label: str  # names it in errors, e.g. "reward.functions[1] my.mod:acc"
    weight: float = 1.0
    args: dict[str, str] = {}  # a built-in's settings (never mutated)

    @property
    def builtin(self) -> bool:
        return self.fn in builtins.ARGS


@dataclass(frozen=True)
class RewardFunction:
    """A loaded function and how to call it."""

    spec: FunctionSpec
    fn: Callable[..., Any]
    shape: Shape
    params: frozenset[str] = frozenset()  # the names it takes by keyword
    required: frozenset[str] = frozenset()  # those without a default
    any_keyword: bool = False  # it has **kwargs


Extras = dict[int, dict[str, float]]  # sample index -> the other numbers a verl-shaped dict returned


class TrainerState(NamedTuple):
    """TRL's trainer_state as its reward functions read it (a curriculum on the step, say)."""

    global_step: int = 0  # the training step being scored (0: before training, validation and eval)
    max_steps: int = 0  # trainer.total_steps


class ScoreContext(NamedTuple):
    """What a scoring knows besides the texts: TRL's completion_ids and trainer_state."""

    completion_ids: Sequence[Sequence[int]] = ()  # per response; empty: not known (a test, a bench)
    state: TrainerState = TrainerState()


class Sample(NamedTuple):
    """What a reward function may be given about one response."""

    data_source: str
    solution_str: str  # the response text
    ground_truth: Any
    extra_info: dict[str, Any]
    prompt: Any  # TRL's prompt: the text, or the chat messages when the dataset's prompt was chat messages
    columns: dict[str, Any]  # the dataset's other columns
    completion_ids: tuple[int, ...] = ()  # the response's token ids (TRL's completion_ids)
    trainer_state: TrainerState = TrainerState()  # the same for every sample of a step


class Call(NamedTuple):
    """One call of a reward function: fn(*args, **kwargs) scores samples[first : first + size]."""

    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    first: int
    size: int


def specs_of(cfg: RewardConfig) -> tuple[list[FunctionSpec], bool]:
    """The configured functions, and whether to log each one's metric (only with reward.functions)."""
    if cfg.functions:
        return [
            FunctionSpec(
                f.name or default_name(f.fn), f.fn, f"reward.functions[{i}] {f.fn}", f.weight, dict(f.args)
            )
            for i, f in enumerate(cfg.functions)
        ], True
    if cfg.function:
        return [
            FunctionSpec(default_name(cfg.function), cfg.function, f"reward.function {cfg.function}")
        ], False
    return [FunctionSpec("rule", "rule", "the rule reward")], False


def default_name(fn: str) -> str:
    """A function's metric name when reward.functions does not give one: the built-in's or the function's."""
    return fn.rpartition(":")[2]


def load_function(spec: FunctionSpec) -> RewardFunction:
    """Import (or build) the function and read its shape; raises RewardError naming spec.label."""
    if spec.fn == "rule":
        fn: Callable[..., Any] = default_compute_score
    elif spec.builtin:
        try:
            fn = builtins.make_builtin(spec.fn, spec.args)
        except RewardError as e:
            raise RewardError(f"{spec.label}: {e}") from None
    else:
        fn = load_reward_function(spec.fn, key=spec.label.split(" ")[0])
    return shape_of(spec, fn)


def shape_of(spec: FunctionSpec, fn: Callable[..., Any]) -> RewardFunction:
    """Tell TRL's shape from verl's by the parameter names (module docstring)."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):  # no signature to read (a builtin, some C callables): as before
        return RewardFunction(spec, fn, "positional")
    named = {p.name: p for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    kinds = {p.kind for p in params}
    required = frozenset(n for n, p in named.items() if p.default is p.empty)
    any_keyword = inspect.Parameter.VAR_KEYWORD in kinds
    only_keywords = any_keyword and not named and inspect.Parameter.VAR_POSITIONAL not in kinds
    if "completions" in named or only_keywords:
        return RewardFunction(spec, fn, "trl", frozenset(named), required, any_keyword)
    if "solution_str" in named:
        unknown = sorted(required - set(VERL_ARGS))
        if unknown or inspect.Parameter.POSITIONAL_ONLY in kinds:
            raise RewardError(
                f"{spec.label}: parameter {(unknown or ['/'])[0]!r} is none of verl's {', '.join(VERL_ARGS)} "
                "(they are passed by keyword)"
            )
        return RewardFunction(spec, fn, "verl", frozenset(named), required, any_keyword)
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    takes_four = inspect.Parameter.VAR_POSITIONAL in kinds or len(positional) >= 4
    needs_more = sum(p.default is p.empty for p in positional) > 4 or required - {p.name for p in positional}
    if takes_four and not needs_more:
        return RewardFunction(spec, fn, "positional")
    raise RewardError(
        f"{spec.label}: {getattr(fn, '__name__', 'it')}{inspect.signature(fn)} has neither shape: TRL's "
        "fn(prompts, completions, **kwargs) -> list[float | None], or verl's "
        "compute_score(data_source, solution_str, ground_truth, extra_info) -> float"
    )


def trl_prompt(row: PromptRow) -> Any:
    """TRL's prompt: the chat messages, or the text of a plain-text prompt (its last user message)."""
    if row.conversational:
        return [dict(m) for m in row.messages]
    return next(
        (m["content"] for m in reversed(row.messages) if m["role"] == "user"), row.messages[-1]["content"]
    )


def trl_completion(s: Sample) -> Any:
    """TRL's completion: the text, or [{"role": "assistant", "content": text}] after chat messages."""
    return s.solution_str if isinstance(s.prompt, str) else [{"role": "assistant", "content": s.solution_str}]


def samples_of(
    rows: Sequence[PromptRow], texts: Sequence[str], context: ScoreContext | None = None
) -> list[Sample]:
    ids = context.completion_ids if context is not None and context.completion_ids else [()] * len(texts)
    state = context.state if context is not None else TrainerState()
    return [
        Sample(r.data_source, t, r.ground_truth, r.extra_info, trl_prompt(r), r.columns, tuple(i), state)
        for r, t, i in zip(rows, texts, ids)
    ]


def calls_of(f: RewardFunction, samples: Sequence[Sample]) -> list[Call]:
    """The calls that score `samples` with `f`: one for a TRL-shaped function, one per sample otherwise."""
    if f.shape == "positional":
        return [
            Call((s.data_source, s.solution_str, s.ground_truth, s.extra_info), {}, i, 1)
            for i, s in enumerate(samples)
        ]
    if f.shape == "verl":
        # a Sample starts with verl's four arguments, in VERL_ARGS's order
        return [Call((), _accepted(f, dict(zip(VERL_ARGS, s[:4]))), i, 1) for i, s in enumerate(samples)]
    offered: dict[str, list[Any]] = {
        "prompts": [s.prompt for s in samples],
        "completions": [trl_completion(s) for s in samples],
    }
    for name in dict.fromkeys(k for s in samples for k in s.columns):  # the columns, in their order
        offered.setdefault(name, [s.columns.get(name) for s in samples])
    offered.setdefault("ground_truth", [s.ground_truth for s in samples])
    offered.setdefault("data_source", [s.data_source for s in samples])
    offered.setdefault("completion_ids", [list(s.completion_ids) for s in samples])
    offered.setdefault("trainer_state", samples[0].trainer_state if samples else TrainerState())  # one object
    missing = sorted(f.required - offered.keys())
    if missing:
        raise RewardError(
            f"{f.spec.label} takes {missing[0]!r}, which is not given: a TRL-shaped function gets prompts, "
            f"completions, completion_ids, trainer_state, ground_truth, data_source and the dataset's columns "
            f"({', '.join(offered)})"
        )
    return [Call((), _accepted(f, offered), 0, len(samples))]


def _accepted(f: RewardFunction, kwargs: dict[str, Any]) -> dict[str, Any]:
    return kwargs if f.any_keyword else {k: v for k, v in kwargs.items() if k in f.params}


def plain(value: Any, batched: bool) -> Any:
    """A function's answer made safe to send between processes: numbers and None as they are, anything else
    as its repr (read_values reports it). A verl-shaped dict gives its "score", and {"score", "extra"} when it
    holds other numbers too (verl's reward_extra_info, e.g. acc: logged as the function's own metrics)."""
    if batched:
        if isinstance(value, (str, bytes, dict)):
            return repr(value)
        try:
            return [plain(v, False) for v in value]
        except TypeError:
            return repr(value)
    if isinstance(value, dict):
        extra = {str(k): _number(v) for k, v in value.items() if k != "score"}
        extra = {k: v for k, v in extra.items() if isinstance(v, float)}  # text (a "pred") is not a metric
        score = _number(value.get("score"))
        return {"score": score, "extra": extra} if extra else score
    return _number(value)


def _number(value: Any) -> Any:
    """A number (a bool: 0.0 or 1.0; numpy's and torch's scalars too) as a float, None as None, anything
    else as its repr."""
    if value is None:
        return value
    if not isinstance(value, numbers.Real) and getattr(value, "ndim", None) == 0 and hasattr(value, "item"):
        value = value.item()  # a numpy or torch scalar (numpy.bool_ is not a numbers.Real)
    return float(value) if isinstance(value, numbers.Real) else repr(value)


def read_values(
    f: RewardFunction, call: Call, value: Any, samples: Sequence[Sample], extras: Extras | None = None
) -> list[float | None]:
    """The checked values of one call (after `plain`): finite numbers, or None from a TRL-shaped function.
    A verl-shaped dict's other numbers go to `extras` by sample index."""
    if f.shape != "trl":
        if isinstance(value, dict):
            if extras is not None:
                extras[call.first] = value["extra"]
            value = value["score"]
        return [check_value(value, call.first, samples[call.first].data_source, f.spec.label)]
    if not isinstance(value, list) or len(value) != call.size:
        got = f"{len(value)} values" if isinstance(value, list) else repr(value)
        raise RewardError(
            f"{f.spec.label} returned {got} for {call.size} completions; return one float (or None) each"
        )
    i0 = call.first
    return [
        None if v is None else check_value(v, i0 + j, samples[i0 + j].data_source, f.spec.label)
        for j, v in enumerate(value)
    ]


def where(f: RewardFunction, call: Call, samples: Sequence[Sample]) -> str:
    """Names the samples of a call in an error: "on sample 3 (data_source 'x')" or "on its batch (...)"."""
    if f.shape == "trl":
        return f"on its batch (samples {call.first}..{call.first + call.size - 1})"
    return f"on sample {call.first} (data_source {samples[call.first].data_source!r})"


def raised(e: BaseException) -> str:
    """'IndexError: list index out of range (rewards.py:12 in parse)': the error and the line of the user's code
    it came from (the innermost frame outside Python's and the installed packages' files)."""
    import sysconfig
    import traceback

    frames = traceback.extract_tb(e.__traceback__)
    libraries = {sysconfig.get_paths()[k] for k in ("stdlib", "purelib", "platlib")}
    mine = [
        f
        for f in frames
        if not f.filename.startswith("<") and not any(f.filename.startswith(lib) for lib in libraries)
    ] or frames  # <frozen importlib._bootstrap> and the like are not the user's
    at = f" ({mine[-1].filename.rsplit('/', 1)[-1]}:{mine[-1].lineno} in {mine[-1].name})" if mine else ""
    return f"{type(e).__name__}: {e}{at}"


def call_in_process(
    f: RewardFunction, samples: Sequence[Sample], extras: Extras | None = None
) -> list[float | None]:
    """One value per sample, calling `f` here; a raise is a RewardError naming the sample."""
    values: list[float | None] = []
    for call in calls_of(f, samples):
        try:
            value = f.fn(*call.args, **call.kwargs)
        except RewardError:
            raise
        except Exception as e:  # noqa: BLE001 - the user's function may raise anything
            raise RewardError(f"{f.spec.label} raised {raised(e)} {where(f, call, samples)}") from None
        values += read_values(f, call, plain(value, f.shape == "trl"), samples, extras)
    return values


_SCORED_NOTHING: set[str] = set()  # functions already warned about


def total_and_parts(
    functions: Sequence[RewardFunction],
    values: Sequence[Sequence[float | None]],
    log_parts: bool,
    extras: Sequence[Extras] = (),
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """reward[i] = sum_k weight_k * values[k][i] over the k with a value ([N] float32), and each function's
    values by name ([N] float32, NaN for None) when log_parts; then, always, each extra number a verl-shaped
    function returned as NAME/KEY ([N] float32, NaN where a sample has none)."""
    import torch

    n = len(values[0]) if values else 0
    total = [0.0] * n
    for f, vals in zip(functions, values):
        if vals and all(v is None for v in vals) and f.spec.label not in _SCORED_NOTHING:
            _SCORED_NOTHING.add(f.spec.label)  # once per function: None is TRL's "not mine", all of it is odd
            warnings.warn(
                f"{f.spec.label} returned None for all {len(vals)} responses: it scored nothing (None means "
                "'not mine'); check which rows it should score",
                stacklevel=1,
            )
        for i, v in enumerate(vals):
            if v is not None:
                total[i] += f.spec.weight * v
    parts = {
        f.spec.name: torch.tensor([float("nan") if v is None else v for v in vals], dtype=torch.float32)
        for f, vals in zip(functions, values)
    } if log_parts else {}  # fmt: skip
    for f, found in zip(functions, extras):
        for key in sorted({k for one in found.values() for k in one}):
            got = [found.get(i, {}).get(key, float("nan")) for i in range(n)]
            parts[f"{f.spec.name}/{key}"] = torch.tensor(got, dtype=torch.float32)
    return torch.tensor(total, dtype=torch.float32), parts


def score_all(
    functions: Sequence[RewardFunction],
    rows: Sequence[PromptRow],
    texts: Sequence[str],
    context: ScoreContext | None,
    log_parts: bool,
    call: Callable[[int, RewardFunction, Sequence[Sample], Extras], list[float | None]],
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """What a function scorer does wherever its functions run: the samples, `call(index, f, samples,
    extras)` per function (here or in the isolated worker), then total_and_parts."""
    samples = samples_of(rows, texts, context)
    extras: list[Extras] = [{} for _ in functions]
    values = [call(i, f, samples, extras[i]) for i, f in enumerate(functions)]
    return total_and_parts(functions, values, log_parts, extras)


def verl_compute_score(functions: Sequence[Mapping[str, Any]]) -> Callable[..., float]:
    """reward.functions (as dicts: fn, weight, name, args) as one verl-shaped compute_score: the weighted
    sum for one response, as training computes it. For `lite-verl export-verl`'s reward_fn.py: verl gives
    a function data_source, the response, the ground truth and extra_info (no prompt, no other columns)."""
    from lite_verl.config.schema import RewardConfig, RewardFunctionConfig

    specs, _ = specs_of(RewardConfig(functions=tuple(RewardFunctionConfig(**f) for f in functions)))
    loaded = [load_function(s) for s in specs]

    def compute_score(
        data_source: str, solution_str: str, ground_truth: Any, extra_info: Any = None
    ) -> float:
        sample = Sample(data_source, solution_str, ground_truth, dict(extra_info or {}), "", {})
        values = [call_in_process(f, [sample]) for f in loaded]
        return float(total_and_parts(loaded, values, False)[0][0])

    return compute_score


def note_fallbacks(specs: Sequence[FunctionSpec]) -> None:
    """The one-line notice that `boxed` uses its string rule (math-verify is not installed)."""
    auto_boxed = any(s.fn == "boxed" and s.args.get("checker", "auto") == "auto" for s in specs)
    if auto_boxed and not builtins.math_verify_available():
        print(
            "lite-verl: note: reward 'boxed' compares strings, math-verify is not installed: "
            + builtins.MATH_INSTALL,
            file=sys.stderr,
        )


@dataclass
class InProcessScorer:
    """The `Scorer` (base.py) for reward functions called in this process: the rule rewards, built-ins, or
    user functions with reward.isolate=false."""

    functions: list[RewardFunction]
    log_parts: bool = False  # reward.functions: keep each function's values for its metric
    last_parts: dict[str, torch.Tensor] = field(default_factory=dict)

    def score(
        self, rows: Sequence[PromptRow], texts: Sequence[str], context: ScoreContext | None = None
    ) -> torch.Tensor:
        """[N] float32."""
        total, self.last_parts = score_all(
            self.functions, rows, texts, context, self.log_parts, lambda _, f, s, e: call_in_process(f, s, e)
        )
        return total

    def start_step(self) -> None:
        pass

    def bill_to(self, ledger: Ledger) -> None:
        pass  # runs on the controller's CPU, already billed

    def close(self) -> None:
        pass
