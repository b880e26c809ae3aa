"""Data schema, built-in tasks, GSM8K conversion, the sampler, and rewards."""

from __future__ import annotations

import json

import pytest
from conftest import SHARED_GSM8K

from lite_verl.config import RewardConfig
from lite_verl.data.loader import PromptSampler
from lite_verl.data.schema import PromptRow, load_rows, parse_row
from lite_verl.data.tasks import echo_rows, task_rows
from lite_verl.errors import DataError, RewardError
from lite_verl.reward.base import make_scorer
from lite_verl.reward.rules import default_compute_score, echo_score, gsm8k_extract, load_reward_function

ROW = {
    "prompt": [{"role": "user", "content": "1+1?"}],
    "data_source": "openai/gsm8k",
    "reward_model": {"style": "rule", "ground_truth": "2"},
    "extra_info": {"i": 0},
}


def test_parse_row_and_errors():
    row = parse_row(ROW, "f:1")
    assert row.messages[0]["content"] == "1+1?" and row.ground_truth == "2"
    with pytest.raises(DataError, match="f:1: missing field 'prompt'"):
        parse_row({"data_source": "x"}, "f:1")
    with pytest.raises(DataError, match=r"prompt\[0\] must be an object"):
        parse_row({**ROW, "prompt": [{"role": "user"}]}, "f:1")
    with pytest.raises(DataError, match="missing field 'reward_model.ground_truth'"):
        parse_row({**ROW, "reward_model": {"style": "rule"}}, "f:1")
    with pytest.raises(DataError, match="missing field 'data_source'"):
        parse_row({**ROW, "data_source": ""}, "f:1")


def test_jsonl_and_parquet(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    j = tmp_path / "d.jsonl"
    j.write_text(json.dumps(ROW) + "\n\n" + json.dumps(ROW) + "\n")
    assert len(load_rows([str(j)])) == 2
    p = tmp_path / "d.parquet"
    pq.write_table(pa.Table.from_pylist([ROW, ROW, ROW]), p)
    rows = load_rows([str(p)])
    assert len(rows) == 3 and rows[0].messages[0]["role"] == "user"


def test_load_errors(tmp_path):
    with pytest.raises(DataError, match="does not exist"):
        load_rows([str(tmp_path / "nope.jsonl")])
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(ROW) + "\n{not json\n")
    with pytest.raises(DataError, match=r"bad.jsonl:2: not valid JSON"):
        load_rows([str(bad)])
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(DataError, match="holds no rows"):
        load_rows([str(empty)])


def test_tasks_are_deterministic_and_val_is_held_out():
    assert [r.ground_truth for r in echo_rows(50, 3)] == [r.ground_truth for r in echo_rows(50, 3)]
    train = task_rows("arithmetic", 200, 0, "train")
    val = task_rows("arithmetic", 200, 0, "val")
    assert {r.messages[0]["content"] for r in train} != {r.messages[0]["content"] for r in val}
    for row in train[:50]:  # each built-in solution earns the full GSM8K reward
        assert default_compute_score(row.data_source, row.extra_info["answer"], row.ground_truth) == 1.0
    sequences = task_rows("sequence", 300, 0, "train")
    assert len({r.messages[0]["content"] for r in sequences}) > 280
    for (
        row
    ) in sequences:  # a progression with a positive next term, its solution worth 1.0, another number 0.1
        terms = [int(t) for t in row.messages[0]["content"].split("sequence ")[1].split("?")[0].split(", ")]
        step = terms[1] - terms[0]
        assert all(b - a == step for a, b in zip(terms, terms[1:])) and 2 <= abs(step) <= 15
        assert int(row.ground_truth) == terms[-1] + step >= 1
        assert default_compute_score(row.data_source, row.extra_info["answer"], row.ground_truth) == 1.0
        assert default_compute_score(row.data_source, f"#### {terms[-1]}", row.ground_truth) == 0.0
    largest = task_rows("largest", 300, 0, "train")
    assert len({r.messages[0]["content"] for r in largest}) == 300
    assert not {r.messages[0]["content"] for r in largest} & {
        r.messages[0]["content"] for r in task_rows("largest", 300, 0, "val")
    }
    for row in (
        largest
    ):  # 4-6 distinct numbers, the answer their maximum (worth 1.0); the first one 0.1 unless it is the max
        numbers = [int(t) for t in row.messages[0]["content"].split(": ")[1].split("?")[0].split(", ")]
        assert (
            4 <= len(numbers) <= 6
            and len(set(numbers)) == len(numbers)
            and int(row.ground_truth) == max(numbers)
        )
        assert default_compute_score(row.data_source, row.extra_info["answer"], row.ground_truth) == 1.0
        wrong = min(numbers)
        assert default_compute_score(row.data_source, f"so #### {wrong}", row.ground_truth) == 0.0


def test_sampler_resumes_in_the_same_order():
    full = PromptSampler(10, 4, seed=5, shuffle=True)
    batches = [full.next_batch() for _ in range(6)]  # crosses epoch boundaries
    resumed = PromptSampler(10, 4, seed=5, shuffle=True, consumed=12)
    assert [resumed.next_batch() for _ in range(3)] == batches[3:]
    assert sorted(batches[0] + batches[1] + batches[2][:2]) == list(range(10))  # an epoch is a permutation


def test_gsm8k_rule():
    assert gsm8k_extract("so 3 + 4 = 7\n#### 7") == "7"
    assert gsm8k_extract("#### 1,234 then #### 12") == "12"
    assert default_compute_score("openai/gsm8k", "#### 1,234", "1234") == 1.0
    assert default_compute_score("openai/gsm8k", "#### 5", "7") == 0.0
    assert default_compute_score("openai/gsm8k", "the answer is 7", "7") == 0.0


def test_echo_rule():
    assert echo_score("cccccccc", "c") == 1.0
    assert echo_score("c c c c", "c") == 0.5
    assert echo_score("xx ccccccccccc", "c") == 1.0
    assert echo_score("abcdabcdcc", "c") == 4 / 8


def test_user_reward_function(tmp_path):
    f = tmp_path / "myreward.py"
    f.write_text(
        "def length(data_source, solution_str, ground_truth, extra_info=None):\n    return len(solution_str) / 10\n"
        "def broken(*a):\n    raise ValueError('boom')\n"
        "def nan(*a):\n    return float('nan')\n"
        "def as_dict(*a):\n    return {'score': 1.0, 'acc': True}\n"
    )

    def score(name: str, text: str) -> list[float]:
        scorer = make_scorer(RewardConfig(function=f"{f}:{name}", isolate=False))
        return scorer.score([PromptRow(({"role": "user", "content": "q"},), "x", "g")], [text]).tolist()

    assert score("length", "abcde") == [0.5]
    assert score("as_dict", "a") == [1.0]
    with pytest.raises(
        RewardError, match=r"raised ValueError: boom \(myreward.py:\d+ in broken\) on sample 0"
    ):
        score("broken", "a")
    with pytest.raises(RewardError, match="returned nan on sample 0"):
        score("nan", "a")
    with pytest.raises(RewardError, match="has no function 'missing'; it has as_dict, broken, length, nan$"):
        load_reward_function(f"{f}:missing")
    with pytest.raises(RewardError, match="has no function 'lenght'; did you mean 'length'\\?"):
        load_reward_function(f"{f}:lenght")
    with pytest.raises(RewardError, match="cannot import 'no_such_module_xyz'"):
        load_reward_function("no_such_module_xyz:f")


def test_unknown_data_source_needs_a_function():
    with pytest.raises(
        RewardError, match=r"no rule reward for data_source 'mine'.*reward.functions=\[boxed\]"
    ):
        default_compute_score("mine", "x", "y")


@pytest.mark.parametrize(
    "source", ["lighteval/MATH", "DigitalLearningGmbH/MATH-lighteval", "HuggingFaceH4/MATH-500"]
)
def test_verls_math_sources_are_scored_by_their_boxed_answer(source):
    """verl's default_compute_score scores its MATH data sources: a parquet made by verl's math preprocessing
    trains with no reward function given."""
    solution = "So the sum is $\\boxed{\\frac{1}{2}}$."
    assert default_compute_score(source, "... hence \\boxed{\\frac{1}{2}}.", solution) == 1.0
    assert default_compute_score(source, "... hence \\boxed{3}.", solution) == 0.0
    assert default_compute_score(source, "no box at all: 1/2", solution) == 0.0


@pytest.mark.skipif(
    not (SHARED_GSM8K / "test.jsonl").is_file(), reason="../shared/data/gsm8k is not beside this checkout"
)
def test_convert_real_gsm8k(tmp_path):
    from lite_verl.data.gsm8k import convert_gsm8k

    n = convert_gsm8k(SHARED_GSM8K / "test.jsonl", tmp_path / "gsm8k_test.jsonl")
    rows = load_rows([str(tmp_path / "gsm8k_test.jsonl")])
    assert n == len(rows) == 1319
    assert rows[0].data_source == "openai/gsm8k" and '"####"' in rows[0].messages[0]["content"]
    # the reference solution earns reward 1 under the rule
    assert all(
        default_compute_score(r.data_source, r.extra_info["answer"], r.ground_truth) == 1.0 for r in rows
    )


def test_convert_gsm8k_reads_the_hubs_parquet_and_names_a_bad_row(tmp_path):
    """GSM8K on the Hub (and verl's copies) is parquet: read through `datasets` like jsonl; a row without
    its final '#### n' is an error naming the file and row."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from lite_verl.data.gsm8k import convert_gsm8k

    rows = [
        {"question": "2 + 3?", "answer": "2 + 3 = 5\n#### 5"},
        {"question": "1,000 + 1?", "answer": "#### 1,001"},
    ]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "test-00000-of-00001.parquet")
    assert convert_gsm8k(tmp_path / "test-00000-of-00001.parquet", tmp_path / "out.jsonl") == 2
    got = load_rows([str(tmp_path / "out.jsonl")])
    assert [r.ground_truth for r in got] == ["5", "1001"] and got[0].extra_info["split"] == "test"
    pq.write_table(
        pa.Table.from_pylist([*rows, {"question": "x", "answer": "no final"}]), tmp_path / "bad.parquet"
    )
    with pytest.raises(DataError, match=r"bad.parquet row 2: the answer has no '#### n'"):
        convert_gsm8k(tmp_path / "bad.parquet", tmp_path / "out2.jsonl")
    assert not (tmp_path / "out2.jsonl").exists()


def test_validation_reports_accuracy_and_each_data_source(tmp_path):
    """Greedy validation as `lite-verl eval` reports it: mean reward, accuracy, and per data_source."""
    import json

    from conftest import SMALL

    from lite_verl.config import load_config
    from lite_verl.loop import prepare, validate

    rows = [{"prompt": f"Repeat the letter {c}.", "data_source": src, "reward_model": {"ground_truth": c}}
            for c, src in (("a", "lite_verl/echo"), ("b", "lite_verl/echo"), ("c", "lite_verl/arithmetic"))]  # fmt: skip
    data = tmp_path / "val.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    session = prepare(load_config("laptop", None, [*SMALL, f"data.val_files=[{data}]", "data.val_size=3"]))
    try:
        out = validate(session, 0)
    finally:
        session.close()
    for key in (
        "val/reward_mean",
        "val/acc",
        "val/lite_verl/echo/acc",
        "val/lite_verl/arithmetic/reward_mean",
    ):
        assert key in out and 0.0 <= out[key] <= 1.0, key
    # the overall mean is the prompt-weighted mean of the sources'
    both = (2 * out["val/lite_verl/echo/reward_mean"] + out["val/lite_verl/arithmetic/reward_mean"]) / 3
    assert abs(out["val/reward_mean"] - both) < 1e-6
