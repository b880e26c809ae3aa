"""Reward functions as users write them: TRL's batched shape with dataset columns, verl's compute_score by
keyword, several weighted functions with a metric each, None, the built-ins, and the isolated worker."""

from __future__ import annotations

import math
import textwrap

import pytest
import torch
from conftest import SMALL, assert_refused

from lite_verl.config import RewardConfig, load_config, to_dict
from lite_verl.config.schema import RewardFunctionConfig
from lite_verl.data.schema import PromptRow
from lite_verl.errors import RewardError
from lite_verl.reward import builtins
from lite_verl.reward.base import make_scorer
from lite_verl.reward.functions import FunctionSpec, InProcessScorer, load_function, shape_of
from lite_verl.reward.worker import IsolatedScorer

USER = textwrap.dedent(
    """
    import time

    def trl_acc(prompts, completions, answer, **kwargs):
        # TRL's shape: every dataset column by name; ground_truth and data_source come too
        assert kwargs["ground_truth"] == answer and "data_source" in kwargs
        return [float(c.strip() == str(a)) for c, a in zip(completions, answer)]

    def trl_level(completions, level):  # no **kwargs: only the names it takes
        return [lv * len(c) for c, lv in zip(completions, level)]

    def trl_chat(prompts, completions, **kwargs):
        # conversational prompt: prompts and completions are chat messages
        return [float(p[-1]["role"] == "user" and c[0]["role"] == "assistant") + len(c[0]["content"])
                for p, c in zip(prompts, completions)]

    def trl_prompt_len(prompts, completions, **kwargs):
        return [float(len(p)) for p in prompts]

    def trl_some_none(completions, **kwargs):
        return [None if c.startswith("skip") else 1.0 for c in completions]

    def trl_short(completions, **kwargs):
        return [1.0]

    def trl_sleeps(completions, **kwargs):
        time.sleep(60)

    def trl_raises(completions, **kwargs):
        raise ValueError("bad batch")

    def compute_score(data_source, solution_str, ground_truth, extra_info=None):
        return float(solution_str == ground_truth) + (0.5 if extra_info.get("bonus") else 0.0)

    def reordered(ground_truth, extra_info, solution_str, data_source):
        return {"score": float(solution_str.endswith(ground_truth)), "acc": True}

    def verl_extras(data_source, solution_str, ground_truth, extra_info=None):
        # DAPO's math_dapo shape: a score of -1/1, acc a bool, pred text
        right = solution_str == ground_truth
        return {"score": 1.0 if right else -1.0, "acc": right, "pred": solution_str, "len": len(solution_str)}

    def two_args(solution_str, ground_truth):
        return float(len(solution_str))

    def positional(src, text, gt, extra):  # lite-verl's old calling convention: positional
        return float(text == gt)

    def verl_none(data_source, solution_str, ground_truth, extra_info=None):
        return None

    def neither(a, b):
        return 1.0

    def verl_bool(data_source, solution_str, ground_truth, extra_info=None):
        return str(ground_truth) in solution_str

    def trl_bools(completions, **kwargs):
        return [c == "yes" for c in completions]

    def verl_numpy_bool(data_source, solution_str, ground_truth, extra_info=None):
        import numpy
        return numpy.bool_(str(ground_truth) in solution_str)

    def trl_tokens(completions, completion_ids, trainer_state):  # TRL's token ids and trainer state
        return [len(ids) + trainer_state.global_step / 1000 for ids in completion_ids]

    def trl_all_none(completions, **kwargs):
        return [None] * len(completions)
    """
)


def row(
    prompt: str = "q", answer: object = "2", conversational: bool = False, **columns: object
) -> PromptRow:
    cols = {"answer": answer, **columns}
    return PromptRow(({"role": "user", "content": prompt},), "mine", answer, {}, cols, conversational)


@pytest.fixture
def user(tmp_path):
    (tmp_path / "rw.py").write_text(USER)
    return f"{tmp_path / 'rw.py'}"


def scorer_for(*functions: tuple[str, float], **kw: object):
    fns = tuple(RewardFunctionConfig(fn=fn, weight=w) for fn, w in functions)
    return make_scorer(RewardConfig(functions=fns, **kw))


def test_trl_function_gets_prompts_completions_and_columns(user):
    rows = [row("one plus one", 2, level=1.0), row("two plus two", 4, level=0.5)]
    texts = ["2", "5 "]
    scorer = make_scorer(RewardConfig(function=f"{user}:trl_acc", isolate=False))
    assert scorer.score(rows, texts).tolist() == [1.0, 0.0]
    assert scorer.last_parts == {}  # reward.function: no per-function metrics, as before
    level = make_scorer(RewardConfig(function=f"{user}:trl_level", isolate=False))
    assert level.score(rows, texts).tolist() == [1.0, 1.0]
    prompt_len = make_scorer(RewardConfig(function=f"{user}:trl_prompt_len", isolate=False))
    assert prompt_len.score(rows, texts).tolist() == [12.0, 12.0]  # plain-text prompts arrive as text
    chat = make_scorer(RewardConfig(function=f"{user}:trl_chat", isolate=False))
    assert chat.score([row(conversational=True)] * 2, ["ab", "abc"]).tolist() == [3.0, 4.0]


def test_a_text_prompt_column_reaches_trl_functions_as_text(user):
    from lite_verl.data.schema import ColumnKeys, parse_row

    keys = ColumnKeys(prompt="question", answer="answer")
    text = parse_row({"question": "1+1?", "answer": 2}, "f:1", keys, "mine")
    chat = parse_row({"question": [{"role": "user", "content": "1+1?"}], "answer": 2}, "f:2", keys, "mine")
    assert (text.conversational, chat.conversational) == (False, True)
    scorer = make_scorer(RewardConfig(function=f"{user}:trl_acc", isolate=False))
    assert scorer.score([text], ["2"]).tolist() == [1.0]  # answer=2 from its column, completions as text


def test_verl_function_is_called_by_keyword(user):
    rows = [row(answer="x"), PromptRow(({"role": "user", "content": "q"},), "mine", "y", {"bonus": 1})]
    texts = ["x", "y"]
    for name, expected in [
        ("compute_score", [1.0, 1.5]),
        ("reordered", [1.0, 1.0]),  # its parameters in another order, a dict with "score"
        ("two_args", [1.0, 1.0]),  # only the arguments it names
        ("positional", [1.0, 1.0]),
    ]:
        scorer = make_scorer(RewardConfig(function=f"{user}:{name}", isolate=False))
        assert scorer.score(rows, texts).tolist() == expected, name


def test_shapes_are_told_apart_by_signature(user):
    shapes = {
        name: load_function(FunctionSpec(name, f"{user}:{name}", name)).shape
        for name in ("trl_acc", "trl_level", "compute_score", "reordered", "positional")
    }
    assert shapes == {"trl_acc": "trl", "trl_level": "trl", "compute_score": "verl", "reordered": "verl",
                      "positional": "positional"}  # fmt: skip
    assert shape_of(FunctionSpec("k", "m:k", "k"), lambda **kw: [1.0]).shape == "trl"
    with pytest.raises(
        RewardError, match=r"neither\(a, b\) has neither shape: TRL's fn\(prompts, completions"
    ):
        load_function(FunctionSpec("neither", f"{user}:neither", "reward.function x"))
    with pytest.raises(RewardError, match="parameter 'answer' is none of verl's"):
        shape_of(FunctionSpec("k", "m:k", "k"), lambda solution_str, answer: 1.0)


def test_two_weighted_functions_give_the_weighted_sum_and_a_metric_each(user):
    from lite_verl.batch import RolloutBatch
    from lite_verl.loop import _rollout_metrics

    cfg = load_config(
        "laptop",
        None,
        [
            f"reward.functions=[{{fn: '{user}:trl_acc', weight: 2.0}}, {{fn: length, weight: 0.5, "
            "args: {max_chars: 4, soft_chars: 2}}]"
        ],  # fmt: skip
    )
    scorer = make_scorer(cfg.reward)
    assert isinstance(scorer, IsolatedScorer)  # a user function among them: all run in the worker
    try:
        scores = scorer.score([row(answer=2), row(answer=4), row(answer=6)], ["2", "4 is it", "5"])
    finally:
        scorer.close()
    # trl_acc: 1, 0 (text "4 is it" != "4"), 0; length (max 4, soft 2): 0, -1 (7 chars), 0
    assert scores.tolist() == [2.0, -0.5, 0.0]
    assert {k: v.tolist() for k, v in scorer.last_parts.items()} == {
        "trl_acc": [1.0, 0.0, 0.0],
        "length": [0.0, -1.0, 0.0],
    }
    n, r = 3, 4
    rollout = RolloutBatch(torch.zeros(n, 2, dtype=torch.long), torch.ones(n, 2, dtype=torch.long),
                           torch.zeros(n, r, dtype=torch.long), torch.ones(n, r, dtype=torch.long),
                           torch.zeros(n, r))  # fmt: skip
    groups = torch.tensor([0, 0, 1])  # the first two responses answer one prompt
    metrics = _rollout_metrics(rollout, scores, scorer.last_parts, groups)
    assert metrics["reward/mean"] == pytest.approx(0.5)  # the weighted total, as before
    assert metrics["reward/zero_std_frac"] == 0.0  # 2.0 vs -0.5; the group of one is not counted
    assert metrics["reward/trl_acc/mean"] == pytest.approx(1 / 3)
    assert metrics["reward/length/mean"] == pytest.approx(-1 / 3)
    one = _rollout_metrics(rollout, scores, {}, groups)  # one function: as before
    assert "reward/trl_acc/mean" not in one


def test_none_is_no_reward_from_that_function(user):
    scorer = scorer_for((f"{user}:trl_some_none", 1.0), ("format", 0.5), isolate=False)
    assert isinstance(scorer, InProcessScorer)
    texts = ["<think>a</think><answer>b</answer>", "skip <think>a</think><answer>b</answer>", "skip me"]
    scores = scorer.score([row()] * 3, texts)
    assert scores.tolist() == [1.5, 0.0, 0.0]  # None is skipped in the sum; format still counts
    some_none = scorer.last_parts["trl_some_none"]
    assert some_none[0] == 1.0 and math.isnan(some_none[1]) and math.isnan(some_none[2])
    only = make_scorer(RewardConfig(function=f"{user}:trl_some_none", isolate=False))
    assert only.score([row()] * 2, ["skip", "x"]).tolist() == [0.0, 1.0]  # no function scored it: 0.0
    with pytest.raises(RewardError, match="returned None on sample 0"):  # verl's shape needs a number
        make_scorer(RewardConfig(function=f"{user}:verl_none", isolate=False)).score([row()], ["x"])
    with pytest.raises(RewardError, match="returned 1 values for 2 completions"):
        make_scorer(RewardConfig(function=f"{user}:trl_short", isolate=False)).score([row()] * 2, ["a", "b"])


def test_gsm8k_builtin():
    gsm8k = builtins.make_builtin("gsm8k", {})
    flexible = builtins.make_builtin("gsm8k", {"mode": "flexible", "format_score": "0.1"})
    texts = ["so it is 18.\n#### 18", "the answer is 18.", "#### 17"]
    truth = ["18", "18", "Janet sells 16 - 3 - 4 = 9 eggs...\n#### 18"]  # a whole GSM8K solution too
    assert gsm8k(texts, truth) == [1.0, 0.0, 0.0]
    assert flexible(texts, truth) == [1.0, 1.0, 0.1]
    with pytest.raises(RewardError, match="args.mode='loose' must be strict or flexible"):
        builtins.make_builtin("gsm8k", {"mode": "loose"})


def test_gsm8k_builtin_takes_a_float_column_of_whole_numbers():
    """A csv/parquet answer column with one empty cell is read as floats (8.0): a right '#### 8' scores."""
    gsm8k = builtins.make_builtin("gsm8k", {})
    assert gsm8k(["#### 8", "#### 8", "#### 2.5", "#### 9"], [8.0, 8, 2.5, 8.0]) == [1.0, 1.0, 1.0, 0.0]


def test_format_builtin():
    fmt = builtins.make_builtin("format", {})
    texts = ["<think>x</think>\n<answer>4</answer>", "<think>x</think> 4",
             "<answer>4</answer><think>x</think>",
             "<think>a<think>b</think><answer>4</answer>"]  # fmt: skip
    assert fmt(texts) == [1.0, 0.0, 0.0, 0.0]
    assert builtins.make_builtin("format", {"tags": "think"})(["<think>x</think>", texts[0]]) == [1.0, 0.0]
    think_trl = builtins.make_builtin("format", {"pattern": r"<think>(?!.*<think>).*?</think>.*"})
    assert think_trl(["<think>x</think> 4", "4"]) == [1.0, 0.0]  # TRL's think_format_reward
    chat = [[{"role": "assistant", "content": texts[0]}]]  # conversational completions too
    assert fmt(chat) == [1.0]


def test_length_builtin():
    length = builtins.make_builtin("length", {"max_chars": "10", "soft_chars": "4"})
    # 0 up to 6 chars, then (6 - L) / 4 down to -1 at 10, -1 beyond
    assert length(["a" * 6, "a" * 8, "a" * 10, "a" * 30]) == [0.0, -0.5, -1.0, -1.0]
    with pytest.raises(RewardError, match="needs args.max_chars"):
        builtins.make_builtin("length", {})


def test_boxed_builtin_string_rule():
    boxed = builtins.make_builtin("boxed", {"checker": "string"})
    texts = [
        "so \\boxed{\\dfrac{1}{2}}.",
        "\\boxed{0.5}",
        "\\boxed{1,000}",
        "no box: 3",
        "\\boxed{\\text{(B)}}",
    ]
    truth = ["\\frac{1}{2}", "\\frac{1}{2}", "1000", "3", "(B)"]
    assert boxed(texts, truth) == [1.0, 0.0, 1.0, 0.0, 1.0]  # 0.5 is not 1/2 to the string rule
    assert builtins.last_boxed("a \\boxed{x^{2}} b \\boxed{\\frac{1}{2}}") == "\\frac{1}{2}"


def test_boxed_builtin_falls_back_to_the_string_rule_with_a_notice(monkeypatch, capsys):
    monkeypatch.setattr(builtins, "math_verify_available", lambda: False)
    scorer = scorer_for(("boxed", 1.0))
    assert "math-verify is not installed: pip install 'lite-verl[math]'" in capsys.readouterr().err
    assert scorer.score([row(answer="\\frac{1}{2}")] * 2, ["\\boxed{\\frac12}", "\\boxed{0.5}"]).tolist() == [
        1.0,
        0.0,
    ]
    with pytest.raises(RewardError, match="math-verify: pip install 'lite-verl\\[math\\]'"):
        builtins.make_builtin("boxed", {"checker": "math-verify"})


def test_boxed_builtin_with_math_verify():
    pytest.importorskip("math_verify", reason="math-verify is not installed: pip install 'lite-verl[math]'")
    boxed = builtins.make_builtin("boxed", {})
    texts = ["so \\boxed{0.5}", "\\boxed{\\frac{1}{3}}", "\\boxed{2}", "\\boxed{x}"]
    truth = ["\\frac{1}{2}", "\\frac{1}{2}", "$2$", "no maths here"]
    # equivalence, not strings; a ground truth math-verify cannot parse: None, the sample skipped (as TRL)
    assert boxed(texts, truth) == [1.0, 0.0, 1.0, None]


def test_a_bool_is_a_reward_of_0_or_1_and_a_function_that_scores_nothing_is_warned_about_once(user):
    """TRL and verl read True/False as 1/0; a TRL function that returns None for every response scored
    nothing, which is worth one warning (TRL warns too), not an error."""
    for name in ("verl_bool", "verl_numpy_bool"):  # numpy's bool is no numbers.Real: read as its item
        verl = make_scorer(RewardConfig(function=f"{user}:{name}", isolate=False))
        assert verl.score([row(answer="2"), row(answer="3")], ["x 2", "x 2"]).tolist() == [1.0, 0.0], name
    trl = make_scorer(RewardConfig(function=f"{user}:trl_bools"))  # isolated: through the worker's pipe
    try:
        assert trl.score([row()] * 2, ["yes", "no"]).tolist() == [1.0, 0.0]
    finally:
        trl.close()
    nothing = make_scorer(RewardConfig(function=f"{user}:trl_all_none", isolate=False))
    with pytest.warns(
        UserWarning, match=r"trl_all_none returned None for all 2 responses: it scored nothing"
    ):
        assert nothing.score([row()] * 2, ["a", "b"]).tolist() == [0.0, 0.0]
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per function
        nothing.score([row()] * 2, ["a", "b"])


def test_isolated_worker_runs_a_trl_function_and_reports_a_timeout_in_one_line(user):
    rows = [row(answer=2), row(answer=4)]
    scorer = make_scorer(RewardConfig(function=f"{user}:trl_acc"))
    assert isinstance(scorer, IsolatedScorer)
    try:
        assert scorer.score(rows, ["2", "3"]).tolist() == [1.0, 0.0]
    finally:
        scorer.close()
    slow = scorer_for((f"{user}:trl_sleeps", 1.0), timeout_s=0.5)
    try:
        with pytest.raises(RewardError) as e:
            slow.score(rows, ["a", "b"])
    finally:
        slow.close()
    assert "\n" not in str(e.value)
    assert str(e.value).startswith(
        f"reward.functions[0] {user}:trl_sleeps did not return within reward.timeout_s=0.5s per sample "
        "on its batch (samples 0..1); fix the function, raise reward.timeout_s, "
        "or set reward.on_error=default"
    )


def test_isolated_worker_on_error_default_scores_the_failed_function(user, capsys):
    scorer = scorer_for((f"{user}:trl_raises", 1.0), ("format", 2.0), on_error="default", default_score=-1.0)
    try:
        scores = scorer.score([row()] * 2, ["<think>a</think><answer>b</answer>", "x"])
    finally:
        scorer.close()
    assert scores.tolist() == [1.0, -1.0]  # -1 from the failed function, + 2 x format
    line = USER.splitlines().index('    raise ValueError("bad batch")') + 1  # the user's line, not ours
    said = (
        f"raised ValueError: bad batch (rw.py:{line} in trl_raises) on its batch (samples 0..1); scored -1.0"
    )
    assert said in capsys.readouterr().err


def test_reward_functions_config(user):
    cfg = load_config(
        "laptop", None, ["reward.functions=[{fn: my.mod:f, weight: 1.0}, {fn: format, name: fmt}]"]
    )
    assert cfg.reward.functions == (
        RewardFunctionConfig(fn="my.mod:f", weight=1.0),
        RewardFunctionConfig(fn="format", name="fmt"),
    )
    out = to_dict(cfg)["reward"]["functions"]
    assert out[1] == {"fn": "format", "weight": 1.0, "name": "fmt", "args": {}}
    assert_refused(
        ["reward.functions=[{fn: gsm8k, wieght: 2}]"],
        r"reward.functions\[0\]: unknown key 'wieght'; its keys are fn, weight, name, args",
    )
    # TRL's reward_funcs: a list of functions; here each by name, weight 1 (one alone needs no brackets)
    listed = load_config("laptop", None, ["reward.functions=[gsm8k, my.mod:f]"]).reward.functions
    assert listed == (RewardFunctionConfig(fn="gsm8k"), RewardFunctionConfig(fn="my.mod:f"))
    assert load_config("laptop", None, ["reward.functions=my.mod:f"]).reward.functions == listed[1:]
    assert_refused(["reward.functions=[3]"], r"reward.functions\[0\] must be a mapping with keys fn, weight")
    assert_refused(
        ["reward.functions=[{fn: nocolon}]"], r"reward.functions\[0\].fn='nocolon' must be module:function"
    )
    assert_refused(
        ["reward.functions=[{fn: length}]"],
        r"reward.functions\[0\]: built-in reward 'length' needs args.max_chars",
    )
    assert_refused(["reward.functions=[{fn: format, args: {tag: x}}]"], "has no setting args.tag")
    assert_refused(["reward.functions=[{fn: m:f, args: {a: b}}]"], "only built-in rewards take args")
    assert_refused(
        ["reward.functions=[{fn: format}, {fn: format}]"], r"\[0\] and \[1\] are both named 'format'"
    )
    assert_refused(
        ["reward.function=m:f", "reward.functions=[{fn: format}]"], "are both set; a run has one reward"
    )
    assert_refused(["reward.functions=[{fn: m:f}]", "reward.isolate=false", "reward.on_error=default"],
                   "needs reward.isolate=true")  # fmt: skip
    load_config(
        "laptop", None, ["reward.functions=[{fn: format}]", "reward.isolate=false", "reward.on_error=default"]
    )


def test_training_logs_each_function(tmp_path, user):
    """The real loop on the echo task: the rule reward plus a TRL function in the worker, each logged."""
    from lite_verl.loop import prepare, run_training
    from lite_verl.run.rundir import RunDir, read_metrics

    functions = f"reward.functions=[{{fn: rule}}, {{fn: '{user}:trl_prompt_len', weight: 0.01, name: plen}}]"
    cfg = load_config("laptop", None, [*SMALL, "trainer.total_steps=2", functions])
    session = prepare(cfg)
    run = RunDir(tmp_path / "run")
    run.create(cfg)
    run_training(session, run)
    steps = [m for m in read_metrics(run.path) if "reward/mean" in m]
    assert len(steps) == 2
    for m in steps:  # the total is the weighted sum of the two means
        assert m["reward/mean"] == pytest.approx(
            m["reward/rule/mean"] + 0.01 * m["reward/plen/mean"], abs=1e-5
        )
        assert m["reward/plen/mean"] > 0


@pytest.mark.parametrize(
    "body, words",
    [
        ("import os\nos._exit(3)\n", "importing it ended the reward worker process (exit code 3)"),
        ("raise RuntimeError('no GPU here')\n", "cannot import"),
        ("import time\ntime.sleep(600)\n", "did not finish within"),
    ],
    ids=["exits", "raises", "hangs"],
)
def test_an_isolated_reward_module_is_imported_only_in_its_worker(tmp_path, monkeypatch, body, words):
    """reward.isolate: the controller never imports the user's module; an import that exits, raises or
    hangs is one line naming the function."""
    import sys

    from lite_verl.reward import worker

    monkeypatch.setattr(worker, "START_TIMEOUT_S", 3.0)
    (tmp_path / "bad_reward.py").write_text(
        body + "def score(data_source, solution_str, ground_truth):\n    return 1.0\n"
    )
    with pytest.raises(RewardError) as e:
        make_scorer(RewardConfig(function=f"{tmp_path / 'bad_reward.py'}:score"))
    assert words in str(e.value) and "\n" not in str(e.value) and "bad_reward.py" in str(e.value)
    assert not any("bad_reward" in name for name in sys.modules)  # never imported here


def test_an_isolated_scorer_gets_the_shapes_from_its_worker(user):
    import sys

    before = set(sys.modules)
    scorer = make_scorer(RewardConfig(function=f"{user}:trl_acc"))
    try:
        assert [f.shape for f in scorer.functions] == ["trl"]
        assert not [m for m in set(sys.modules) - before if "user" in m and "reward" in m]
        assert scorer.score([row(answer=2)], ["2"]).tolist() == [1.0]
    finally:
        scorer.close()


def test_a_reward_module_beside_the_user_and_a_file_importing_its_sibling_load(tmp_path, monkeypatch):
    """`reward.function=rewards:f` with rewards.py in the working directory (the console script's sys.path
    lacks it), and `path/rw.py:f` whose rw.py imports a helper next to it, load as Python would."""
    import sys

    from lite_verl.reward.rules import load_reward_function

    here, there = tmp_path / "here", tmp_path / "there"
    here.mkdir(), there.mkdir()
    (here / "lv_beside_rewards.py").write_text("def f(*a, **k):\n    return 1.0\n")
    (there / "lv_helpers_sibling.py").write_text("BONUS = 2.0\n")
    (there / "rw_sib.py").write_text(
        "from lv_helpers_sibling import BONUS\n\ndef f(*a, **k):\n    return BONUS\n"
    )
    monkeypatch.chdir(here)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", ".", str(here))])
    assert load_reward_function("lv_beside_rewards:f")() == 1.0
    assert load_reward_function(f"{there / 'rw_sib.py'}:f")() == 2.0


@pytest.mark.parametrize("isolate", [False, True])
def test_a_verl_dicts_other_numbers_are_logged_and_its_acc_judges(user, isolate):
    """verl's reward_extra_info: a compute_score dict's numbers besides "score" become the function's own
    metrics (text such as "pred" does not), in this process and from the isolated worker alike; validation
    and eval judge right or wrong by its "acc", as verl's val-core does."""
    from lite_verl.loop import judged

    scorer = make_scorer(RewardConfig(function=f"{user}:verl_extras", isolate=isolate))
    try:
        scores = scorer.score([row(answer="x"), row(answer="y")], ["x", "zz"])
        parts = {k: v.tolist() for k, v in scorer.last_parts.items()}
    finally:
        scorer.close()
    assert scores.tolist() == [1.0, -1.0]
    assert parts == {"verl_extras/acc": [1.0, 0.0], "verl_extras/len": [1.0, 2.0]}

    class Session:  # what judged reads
        cfg = load_config("laptop", None, [f"reward.function={user}:verl_extras"])

    Session.scorer = scorer
    assert judged(Session, scores).tolist() == [1.0, 0.0]


@pytest.mark.parametrize("isolate", [False, True])
def test_trl_functions_get_completion_ids_and_trainer_state(user, isolate):
    """TRL passes completion_ids and trainer_state (its global_step) to reward functions; so does lite-verl,
    in this process and through the isolated worker."""
    from lite_verl.reward.functions import ScoreContext, TrainerState

    scorer = make_scorer(RewardConfig(function=f"{user}:trl_tokens", isolate=isolate))
    try:
        got = scorer.score([row()] * 2, ["a", "bc"], ScoreContext([[5], [6, 7]], TrainerState(3, 10)))
    finally:
        scorer.close()
    assert got.tolist() == pytest.approx([1.003, 2.003])


def test_the_loop_gives_the_rollouts_token_ids_and_step(tmp_path, user):
    """In training, completion_ids are the responses' tokens (EOS included) and trainer_state the step: a
    reward of len(completion_ids) + step / 1000 is the mean response length plus the step, every step."""
    from lite_verl.loop import prepare, run_training
    from lite_verl.run.rundir import RunDir, read_metrics

    cfg = load_config("laptop", None, [*SMALL, "trainer.total_steps=2", f"reward.function={user}:trl_tokens"])
    session = prepare(cfg)
    run = RunDir(tmp_path / "run")
    run.create(cfg)
    run_training(session, run)
    for m in (m for m in read_metrics(run.path) if "reward/mean" in m):
        assert m["reward/mean"] == pytest.approx(m["response_length/mean"] + m["step"] / 1000, abs=1e-4)
