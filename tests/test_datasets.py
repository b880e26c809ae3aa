"""Prompt data through `datasets`: every source form, column mapping, types kept, bad rows, Hub ids offline.

All offline: a Hub id is read from a datasets cache built here (the layout `load_dataset` writes).
"""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
from conftest import SHARED_GSM8K

from lite_verl.config import DataConfig
from lite_verl.config.validation import validate_config
from lite_verl.data.loader import load_prompt_sets, prompt_rows
from lite_verl.data.tasks import task_rows
from lite_verl.errors import ConfigError, DataError

ROWS = [
    {"question": "What is 2 + 3?", "answer": 5, "choices": [4, 5, 6], "level": "easy"},
    {"question": "What is 7 * 6?", "answer": 42, "choices": [42, 36], "level": "hard"},
    {"question": "What is 9 - 4?", "answer": 5, "choices": [5], "level": "easy"},
]
MAPPED = DataConfig(prompt_key="question", answer_key="answer", val_split="")
CHAT = [{"role": "user", "content": "Say hi."}]


def _jsonl(path: Path, rows: list[dict], blank_after: int = -1) -> Path:
    lines = [json.dumps(r) + ("\n\n" if i == blank_after else "\n") for i, r in enumerate(rows)]
    path.write_text("".join(lines))
    return path


def _parquet(path: Path, rows: list[dict]) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def _csv(path: Path, rows: list[dict]) -> Path:
    import csv

    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return path


def _rows(cfg: DataConfig, seed: int = 0):
    return prompt_rows(cfg, seed)


@pytest.fixture(autouse=True)
def _datasets_cache(tmp_path, monkeypatch):
    """Each test writes datasets' cache under its own tmp_path, offline."""
    import datasets
    import huggingface_hub.constants

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf_datasets")
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)


@pytest.fixture(scope="module")
def tokenizer(tiny_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_dir)


@pytest.mark.parametrize("fmt", ["jsonl", "csv", "parquet"])
def test_files_with_column_mapping_and_types_kept(fmt, tmp_path):
    make = {"jsonl": _jsonl, "csv": _csv, "parquet": _parquet}[fmt]
    rows = ROWS if fmt != "csv" else [{k: v for k, v in r.items() if k != "choices"} for r in ROWS]
    path = make(tmp_path / f"math.{fmt}", rows)
    train, val = _rows(replace(MAPPED, train_files=(str(path),)))
    assert val == []
    assert [r.messages for r in train] == [({"role": "user", "content": r["question"]},) for r in ROWS]
    assert [r.ground_truth for r in train] == [5, 42, 5]  # an int stays an int (csv columns too)
    assert train[1].columns == {k: v for k, v in rows[1].items() if k != "question"}  # every other column
    assert train[0].data_source == str(path)  # no data_source column: the source names the rows
    if fmt != "csv":
        assert train[1].columns["choices"] == [42, 36]  # a list stays a list


def test_list_answers_chat_prompts_and_verl_rows(tmp_path):
    rows = [
        {
            "prompt": CHAT,
            "data_source": "mine",
            "reward_model": {"ground_truth": ["a", "b"]},
            "extra_info": {"i": 0},
        }
    ]
    for path in (_jsonl(tmp_path / "v.jsonl", rows), _parquet(tmp_path / "v.parquet", rows)):
        (row,), _ = _rows(DataConfig(train_files=(str(path),)))
        assert row.messages == (CHAT[0],) and row.data_source == "mine"
        assert row.ground_truth == ["a", "b"] and row.extra_info == {"i": 0}
        assert set(row.columns) == {"data_source", "reward_model", "extra_info"}


def test_system_prompt_and_chat_template(tmp_path, tokenizer):
    path = _jsonl(tmp_path / "q.jsonl", ROWS)
    cfg = replace(MAPPED, train_files=(str(path),), system_prompt="Answer with a number.")
    train, _ = load_prompt_sets(cfg, tokenizer, 0)
    messages = [
        {"role": "system", "content": "Answer with a number."},
        {"role": "user", "content": "What is 2 + 3?"},
    ]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert train.token_ids[0] == tokenizer(text, add_special_tokens=False)["input_ids"]
    assert "<|im_start|>system" in text  # the template was applied
    plain, _ = load_prompt_sets(replace(cfg, apply_chat_template=False), tokenizer, 0)
    assert tokenizer.decode(plain.token_ids[0]) == "Answer with a number.\n\nWhat is 2 + 3?"


def test_a_model_without_chat_template_gets_plain_text(tmp_path, tokenizer, capsys):
    from lite_verl.data.loader import encode_prompts

    template, tokenizer.chat_template = tokenizer.chat_template, None
    try:
        _, _ = load_prompt_sets(DataConfig(task_size=4, val_size=2), tokenizer, 0)
        err = capsys.readouterr().err
        assert "has no chat template" in err and "data.prompt_template=Question: {prompt}" in err  # the tip
        framed = DataConfig(task_size=4, val_size=2, prompt_template="Q: {prompt}\nA:")
        _, _ = load_prompt_sets(framed, tokenizer, 0)
        err = capsys.readouterr().err
        assert "has no chat template" in err and "prompt_template" not in err  # framed already: no tip
        row = task_rows("echo", 1, 0)[0]
        _, (ids,) = encode_prompts([row], tokenizer, 64, "data.train_files")
        assert tokenizer.decode(ids) == row.messages[0]["content"]
        two_turns = replace(
            row, messages=(*row.messages, {"role": "assistant", "content": "a"}, *row.messages)
        )
        with pytest.raises(DataError, match="row 0: a conversation of 3 messages needs a chat template"):
            encode_prompts([two_turns], tokenizer, 64, "data.train_files")
    finally:
        tokenizer.chat_template = template


def test_builtin_task_rows_are_unchanged(tokenizer):
    train, val = _rows(DataConfig(task="arithmetic", task_size=16, val_size=4), seed=3)
    assert train == task_rows("arithmetic", 16, 3, "train") and val == task_rows("arithmetic", 4, 3, "val")
    sets, _ = load_prompt_sets(DataConfig(task_size=4, val_size=0), tokenizer, 3)
    text = tokenizer.apply_chat_template(
        list(sets.rows[0].messages), add_generation_prompt=True, tokenize=False
    )
    assert sets.token_ids[0] == tokenizer(text, add_special_tokens=False)["input_ids"]


def test_builtin_task_takes_the_system_prompt_and_template(tokenizer):
    """A base model's frame (a worked example, Question/Answer) reaches built-in tasks as it reaches files."""
    cfg = DataConfig(
        task="arithmetic", task_size=4, val_size=2, apply_chat_template=False,
        system_prompt="Question: 1 + 1?\nAnswer: 1 + 1 = 2.\n#### 2", prompt_template="Question: {prompt}\nAnswer:",
    )  # fmt: skip
    train, val = _rows(cfg, seed=3)
    bare = task_rows("arithmetic", 4, 3, "train")
    assert [r.ground_truth for r in train] == [r.ground_truth for r in bare]
    assert train[0].messages == (
        {"role": "system", "content": cfg.system_prompt},
        {"role": "user", "content": f"Question: {bare[0].messages[0]['content']}\nAnswer:"},
    )
    assert val[0].messages[1]["content"].startswith("Question: ") and val[0].messages[1]["content"].endswith(
        "Answer:"
    )
    sets, _ = load_prompt_sets(cfg, tokenizer, 3)
    text = tokenizer.decode(sets.token_ids[0])
    assert text == f"{cfg.system_prompt}\n\nQuestion: {bare[0].messages[0]['content']}\nAnswer:"


def test_save_to_disk_dataset_and_dataset_dict(tmp_path):
    import datasets

    single = tmp_path / "single"
    datasets.Dataset.from_list(ROWS).save_to_disk(str(single))
    train, _ = _rows(replace(MAPPED, train_files=(str(single),)))
    assert [r.ground_truth for r in train] == [5, 42, 5] and train[0].columns["choices"] == [4, 5, 6]
    both = tmp_path / "dict"
    datasets.DatasetDict(
        {"train": datasets.Dataset.from_list(ROWS[:2]), "test": datasets.Dataset.from_list(ROWS[2:])}
    ).save_to_disk(str(both))
    train, val = _rows(replace(MAPPED, train_files=(str(both),), val_split="test"))
    assert len(train) == 2 and [r.messages[0]["content"] for r in val] == ["What is 9 - 4?"]
    with pytest.raises(DataError, match=r"has no split 'dev' \(its splits: train, test\); set data.split"):
        _rows(replace(MAPPED, train_files=(str(both),), split="dev"))


def test_directory_of_split_files_and_slices(tmp_path):
    folder = tmp_path / "math"
    folder.mkdir()
    _jsonl(folder / "train.jsonl", ROWS[:2])
    _jsonl(folder / "test.jsonl", ROWS[2:])
    train, val = _rows(replace(MAPPED, train_files=(str(folder),), val_split="test"))
    assert [r.ground_truth for r in train] == [5, 42] and [r.ground_truth for r in val] == [5]
    one = _jsonl(tmp_path / "all.jsonl", ROWS)  # a held-out slice of a single file
    train, val = _rows(replace(MAPPED, train_files=(str(one),), split="train[:2]", val_split="train[-1:]"))
    assert [r.ground_truth for r in train] == [5, 42] and [r.messages[0]["content"] for r in val] == [
        "What is 9 - 4?"
    ]
    _, val = _rows(replace(MAPPED, train_files=(str(one),), val_split="test"))  # a file has no split 'test'
    assert val == []


def _hub_cache(root: Path, repo: str, config: str) -> None:
    """What load_dataset(repo, config) leaves in the datasets cache: org___name/config/version/hash/."""
    from datasets.packaged_modules.json.json import Json

    src = _jsonl(root / "src.jsonl", ROWS)
    builder = Json(
        cache_dir=str(root / "build"),
        dataset_name=repo.split("/")[1],
        config_name=config,
        data_files={"train": str(src), "test": str(src)},
    )
    builder.download_and_prepare()
    target = root / "hf_datasets" / repo.replace("/", "___") / config / "0.0.0"
    target.mkdir(parents=True)
    shutil.move(builder.cache_dir, target / "0123456789abcdef")


def test_hub_id_from_the_local_datasets_cache_offline(tmp_path):
    _hub_cache(tmp_path, "someorg/tinymath", "main")
    cfg = replace(
        MAPPED, train_files=("someorg/tinymath",), subset="main", split="train[:2]", val_split="test"
    )
    train, val = _rows(cfg)
    assert [r.ground_truth for r in train] == [5, 42] and len(val) == 3
    assert train[0].data_source == "someorg/tinymath" and train[0].columns["level"] == "easy"
    _, val = _rows(replace(cfg, val_split="validation"))  # the id has no such split: no validation
    assert val == []
    with pytest.raises(DataError, match=r"someorg/tinymath \[main, dev\]: Unknown split"):
        _rows(replace(cfg, split="dev"))


def test_hub_id_offline_and_not_cached_is_one_line():
    with pytest.raises(DataError) as e:
        _rows(replace(MAPPED, train_files=("nobody/nothing",), subset="main"))
    message = str(e.value)
    assert "Hub dataset 'nobody/nothing' is not in the datasets cache and HF_HUB_OFFLINE is set" in message
    assert "datasets.load_dataset('nobody/nothing', 'main')" in message and "\n" not in message


def test_bad_rows_name_file_row_and_column(tmp_path):
    rows = [*ROWS, {"question": "", "answer": 1}, {"question": "Why?", "answer": None}]
    jsonl = _jsonl(tmp_path / "bad.jsonl", rows, blank_after=0)  # a blank line: row 3 is on line 5
    with pytest.raises(DataError, match=r"bad.jsonl:5: field 'question' is empty"):
        _rows(replace(MAPPED, train_files=(str(jsonl),)))
    csv = _csv(tmp_path / "bad.csv", [{"question": "Hi?", "answer": 1}, {"question": "Ho?", "answer": ""}])
    with pytest.raises(DataError, match=r"bad.csv row 1: missing field 'answer'"):
        _rows(replace(MAPPED, train_files=(str(csv),)))
    with pytest.raises(DataError, match=r"has no column 'prompt' \(its columns: question, answer"):
        _rows(DataConfig(train_files=(str(jsonl),)))
    with pytest.raises(
        DataError, match=r"bad.jsonl:1: missing field 'solution'; set data.answer_key to one of"
    ):
        _rows(replace(MAPPED, train_files=(str(jsonl),), answer_key="solution"))
    broken = tmp_path / "broken.jsonl"
    broken.write_text(json.dumps(ROWS[0]) + "\n\n{oops\n")
    with pytest.raises(DataError, match=r"broken.jsonl:3: not valid JSON"):
        _rows(replace(MAPPED, train_files=(str(broken),)))


def test_skip_bad_rows_counts_them(tmp_path, capsys):
    rows = [*ROWS, {"question": "", "answer": 1}, {"question": "Why?", "answer": None}]
    path = _jsonl(tmp_path / "bad.jsonl", rows)
    train, _ = _rows(replace(MAPPED, train_files=(str(path),), skip_bad_rows=True))
    assert len(train) == 3
    err = capsys.readouterr().err
    assert "skipped 2 of 5 rows" in err and "bad.jsonl:4: field 'question' is empty" in err
    only_bad = _jsonl(tmp_path / "only_bad.jsonl", rows[3:])
    with pytest.raises(DataError, match="all 2 rows of .* are bad"):
        _rows(replace(MAPPED, train_files=(str(only_bad),), skip_bad_rows=True))


def test_skip_bad_rows_skips_lines_that_are_not_json(tmp_path, capsys):
    """A truncated or garbled jsonl line is skipped and counted too; later rows keep their own line numbers."""
    path = tmp_path / "garbled.jsonl"
    lines = [json.dumps(ROWS[0]), "{oops", "", "[1, 2]", json.dumps(ROWS[1]), json.dumps({"question": ""})]
    path.write_text("\n".join(lines) + "\n")
    train, _ = _rows(replace(MAPPED, train_files=(str(path),), skip_bad_rows=True))
    assert [r.ground_truth for r in train] == [ROWS[0]["answer"], ROWS[1]["answer"]]
    err = capsys.readouterr().err
    assert "skipped 2 of 5 lines" in err and "garbled.jsonl:2: not valid JSON" in err
    assert (
        "garbled.jsonl:6: field 'question' is empty" in err
    )  # the row after the skipped lines: its own line
    with pytest.raises(DataError, match="garbled.jsonl:2: not valid JSON"):  # without the switch: the error
        _rows(replace(MAPPED, train_files=(str(path),)))


def test_no_answer_column_and_data_source_key(tmp_path):
    path = _jsonl(tmp_path / "q.jsonl", ROWS)
    (row, *_), _ = _rows(replace(MAPPED, train_files=(str(path),), answer_key="", data_source="openai/gsm8k"))
    assert row.ground_truth is None and row.data_source == "openai/gsm8k"


def test_default_answer_key_finds_a_trl_datasets_answer_column(tmp_path, capsys):
    """A TRL dataset (prompt + solution) with data.answer_key left at verl's default: the solution is the
    ground truth, said once; an explicit key still wins, and a source with none of the usual columns is
    an error naming its columns."""
    rows = [
        {"prompt": "What is 2 + 3?", "solution": "5", "level": 1},
        {"prompt": "1 + 1?", "solution": "2", "level": 2},
    ]
    path = _jsonl(tmp_path / "trl.jsonl", rows)
    train, _ = _rows(DataConfig(train_files=(str(path),), val_split=""))
    assert [r.ground_truth for r in train] == ["5", "2"] and train[0].columns["solution"] == "5"
    assert "ground truth from its column 'solution'" in capsys.readouterr().err
    train, _ = _rows(DataConfig(train_files=(str(path),), val_split="", answer_key="level"))
    assert [r.ground_truth for r in train] == [1, 2]
    bare = _jsonl(tmp_path / "bare.jsonl", [{"prompt": "hi", "level": 1}])
    with pytest.raises(DataError, match=r"missing field 'reward_model.ground_truth'.*\['level', 'prompt'\]"):
        _rows(DataConfig(train_files=(str(bare),), val_split=""))


def test_a_validation_file_cut_to_val_size_is_said(tmp_path, capsys):
    path = _jsonl(tmp_path / "q.jsonl", ROWS)
    _, val = _rows(replace(MAPPED, train_files=(str(path),), val_files=(str(path),), val_size=2))
    assert (
        len(val) == 2 and "validating on the first 2 of the 3 validation prompts" in capsys.readouterr().err
    )


def test_sources_that_are_neither_a_path_nor_a_hub_id(tmp_path):
    with pytest.raises(
        DataError, match="'nope.jsonl' does not exist; give a .jsonl/.json/.parquet/.csv file"
    ):
        _rows(DataConfig(train_files=("nope.jsonl",)))
    (tmp_path / "data.txt").write_text("hello\n")
    with pytest.raises(DataError, match=r"must end in .jsonl, .json, .parquet, .csv"):
        _rows(DataConfig(train_files=(str(tmp_path / "data.txt"),)))


def test_split_and_key_checks():
    from lite_verl.config import Config

    with pytest.raises(ConfigError, match=r"data.split='train\[' must be a split name"):
        validate_config(replace(Config(), data=DataConfig(split="train[")))
    with pytest.raises(ConfigError, match="data.prompt_key is empty"):
        validate_config(replace(Config(), data=DataConfig(prompt_key="")))
    validate_config(replace(Config(), data=DataConfig(split="train[:-200]", val_split="")))


@pytest.mark.skipif(not (SHARED_GSM8K / "train.jsonl").is_file(), reason="needs ../shared/data/gsm8k")
def test_real_gsm8k_loads_with_its_own_columns():
    cfg = DataConfig(train_files=(str(SHARED_GSM8K),), prompt_key="question", answer_key="answer", val_size=8)
    train, val = _rows(cfg)  # the directory: train.jsonl to train, test.jsonl (val_split=test) to validate
    assert len(train) == 7473 and len(val) == 8
    assert train[0].messages[0]["content"].startswith("Natalia sold clips")
    assert train[0].ground_truth.endswith("#### 72") and train[0].columns == {"answer": train[0].ground_truth}


def test_a_typed_backslash_n_in_the_frame_is_a_newline():
    """`--set 'data.prompt_template=Question: {prompt}\\nAnswer:'` (a shell cannot type a newline) frames as
    the same template with a real newline does."""
    cfg = DataConfig(
        task="arithmetic", task_size=2, val_size=0, apply_chat_template=False,
        system_prompt="Q: 1 + 1?\\nA: 2", prompt_template="Question: {prompt}\\nAnswer:",
    )  # fmt: skip
    real = DataConfig(
        task="arithmetic", task_size=2, val_size=0, apply_chat_template=False,
        system_prompt="Q: 1 + 1?\nA: 2", prompt_template="Question: {prompt}\nAnswer:",
    )  # fmt: skip
    typed, _ = _rows(cfg, seed=3)
    assert typed == _rows(real, seed=3)[0]
    assert "\\n" not in typed[0].messages[1]["content"] and "\nAnswer:" in typed[0].messages[1]["content"]


def test_sharegpt_conversations_read_as_chat_messages(tmp_path, tokenizer, capsys):
    """ShareGPT rows ({"from", "value"}: Unsloth's and many Hub datasets') are chat messages; an unknown
    speaker is one line; SFT-style conversations ending in the assistant's answer are said once, with the fix."""
    talk = [{"from": "system", "value": "Be brief."}, {"from": "human", "value": "2+2?"}]
    path = _jsonl(tmp_path / "s.jsonl", [{"conversations": talk, "answer": "4"}])
    cfg = DataConfig(train_files=(str(path),), prompt_key="conversations", answer_key="answer", val_split="")
    (row,), _ = _rows(cfg)
    assert row.messages == ({"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"})
    _jsonl(path, [{"conversations": [{"from": "narrator", "value": "x"}], "answer": "4"}])
    with pytest.raises(
        DataError, match=r"s.jsonl:1: conversations\[0\] is a ShareGPT message from 'narrator'"
    ):
        _rows(cfg)
    _jsonl(path, [{"conversations": [*talk, {"from": "gpt", "value": "4"}], "answer": "4"}])
    load_prompt_sets(cfg, tokenizer, 0)
    assert "1 of 1 prompts of data.train_files end with an assistant message" in capsys.readouterr().err


def test_chat_template_override_by_name_file_or_text(tmp_path, tiny_dir):
    """data.chat_template replaces the model's own (Unsloth's get_chat_template): a name, a file, the text."""
    from lite_verl.errors import ModelError
    from lite_verl.model.load import load_tokenizer

    path = _jsonl(tmp_path / "q.jsonl", ROWS)
    cfg = replace(MAPPED, train_files=(str(path),))
    jinja = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}<assistant>"
    (tmp_path / "t.jinja").write_text(jinja)
    for spec, starts in (("chatml", "<|im_start|>user\nWhat is 2 + 3?<|im_end|>\n<|im_start|>assistant\n"),
                         (str(tmp_path / "t.jinja"), "<user>What is 2 + 3?<assistant>"),
                         (jinja, "<user>What is 2 + 3?<assistant>")):  # fmt: skip
        tok = load_tokenizer(tiny_dir, chat_template=spec)
        train, _ = load_prompt_sets(cfg, tok, 0)
        assert tok.decode(train.token_ids[0]) == starts
    with pytest.raises(ModelError, match="data.chat_template='llama-9': not a template name"):
        load_tokenizer(tiny_dir, chat_template="llama-9")


def test_a_csv_of_verl_rows_reads_its_structured_cells(tmp_path):
    """pandas' to_csv of a verl dataframe writes dicts and chat messages as their repr: read back as such."""
    import pandas as pd

    frame = pd.DataFrame([{"prompt": CHAT, "data_source": "mine", "reward_model": {"ground_truth": "4"},
                           "extra_info": {"numbers": [1, 3]}, "note": "[see {x}]"}])  # fmt: skip
    frame.to_csv(tmp_path / "v.csv", index=False)
    (row,), _ = _rows(DataConfig(train_files=(str(tmp_path / "v.csv"),), val_split=""))
    assert row.messages == (CHAT[0],) and row.ground_truth == "4" and row.extra_info == {"numbers": [1, 3]}
    assert row.columns["note"] == "[see {x}]"  # text that only looks bracketed stays text
