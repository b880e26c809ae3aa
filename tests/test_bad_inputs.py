"""The catalogue of bad inputs: each gives one line naming the fix, exit code 2, no traceback, and
leaves no run directory behind (or, for an existing run, loses nothing).

Runs the CLI's `main()` in-process (the subprocess path is covered in test_cli.py).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from lite_verl.cli import main

FAST = ["--set", "trainer.batch_size=2", "--set", "rollout.n=2", "--set", "data.val_size=0",
        "--set", "data.task_size=8", "--set", "rollout.max_new_tokens=4", "--set", "trainer.total_steps=2"]  # fmt: skip
ROW = {"prompt": [{"role": "user", "content": "hi"}], "data_source": "lite_verl/echo",
       "reward_model": {"ground_truth": "a"}}  # fmt: skip


def _files(tmp: Path, tiny_dir: Path) -> None:
    (tmp / "empty.jsonl").write_text("")
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"prompt": pa.array([], pa.string())}), tmp / "empty.parquet")  # a footer, 0 rows
    (tmp / "notjson.jsonl").write_text("{oops\n")
    (tmp / "nogt.jsonl").write_text(json.dumps({**ROW, "reward_model": {}}) + "\n")
    (tmp / "badprompt.jsonl").write_text(json.dumps({**ROW, "prompt": 5}) + "\n")
    (tmp / "long.jsonl").write_text(
        json.dumps({**ROW, "prompt": [{"role": "user", "content": "a b " * 400}]}) + "\n"
    )
    (tmp / "unknown_source.jsonl").write_text(json.dumps({**ROW, "data_source": "mine"}) + "\n")
    (tmp / "data.txt").write_text("a,b\n")
    (tmp / "noprompt.csv").write_text("question,answer\nhi,1\n")
    (tmp / "badyaml.yaml").write_text("trainer:\n  seed: [1\n")
    (tmp / "list.yaml").write_text("- 1\n- 2\n")
    (tmp / "overlap.yaml").write_text(
        "rollout: {engine: vllm, gpus: [0, 1], quantization: none}\ntrain: {gpus: [1, 2]}\n"
        "cost: {gpu_models: [A10, A10, A10], price_per_hour: {A10: 1.0}}\n"
    )
    (tmp / "unknown_section.yaml").write_text("trainr:\n  seed: 1\n")
    (tmp / "hydra_defaults.yaml").write_text("defaults:\n  - ppo_trainer\n")
    (tmp / "interpolation.yaml").write_text("data:\n  max_prompt_length: ${data.max_response_length}\n")
    (tmp / "noconfig").mkdir()
    (tmp / "noconfig" / "weights.bin").write_text("")
    (tmp / "bert").mkdir()
    (tmp / "bert" / "config.json").write_text(json.dumps({"model_type": "t5"}))
    (tmp / "rw.py").write_text(
        "import os, time\n"
        "def raises(*a):\n    raise RuntimeError('bad reward')\n"
        "def nan(*a):\n    return float('nan')\n"
        "def none(*a):\n    return None\n"
        "def text(*a):\n    return 'high'\n"
        "def hangs(*a):\n    time.sleep(60)\n"
        "def crashes(*a):\n    os._exit(7)\n"
    )
    (tmp / "latin1.jsonl").write_bytes(json.dumps({**ROW, "prompt": "PLACEHOLDER"}).replace(
        "PLACEHOLDER", "caf\u00e9").encode("latin-1"))  # fmt: skip
    truncated = tmp / "truncated"
    truncated.mkdir()
    for f in tiny_dir.iterdir():
        (truncated / f.name).write_bytes(f.read_bytes())
    weights = truncated / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    (tmp / "full").mkdir()
    (tmp / "full" / "keep.txt").write_text("mine")
    (tmp / "nockpt").mkdir()
    (tmp / "nockpt" / "config.yaml").write_text("trainer: {total_steps: 2}\n")


CASES: dict[str, tuple[list[str], str]] = {
    # config
    "unknown key": (["--set", "trainer.totl_steps=3"], "did you mean 'trainer.total_steps'"),
    "unknown key in file": (["--config", "unknown_section.yaml"], "unknown config key 'trainr'"),
    "hydra defaults list": (["--config", "hydra_defaults.yaml"], "Hydra's defaults list is not read"),
    "omegaconf interpolation": (["--config", "interpolation.yaml"], "is an OmegaConf/Hydra interpolation; lite-verl reads plain YAML"),
    "set without =": (["--set", "trainer.total_steps"], "is not key=value"),
    "hydra-style override": (["trainer.total_steps=3"], "config changes take one --set each: --set trainer.total_steps=3"),
    "wrong type int": (["--set", "trainer.total_steps=many"], "trainer.total_steps must be an int"),
    "wrong type bool": (["--set", "data.shuffle=3"], "data.shuffle must be a bool"),
    "lora rank zero (verl's full fine-tuning)": (["--set", "train.lora_rank=0"], "for full fine-tuning (verl's lora_rank 0) set train.backend=fsdp"),
    "wrong type list": (["--set", "train.target_modules={a: 1}"], "train.target_modules must be a list of str"),
    "negative size": (["--set", "trainer.batch_size=-4"], "trainer.batch_size=-4 must be > 0"),
    "zero steps": (["--set", "trainer.total_steps=0"], "trainer.total_steps=0 must be > 0"),
    "top_p range": (["--set", "rollout.top_p=0"], "rollout.top_p=0.0 must be in (0, 1]"),
    "group of one": (["--set", "rollout.n=1"], "set rollout.n >= 2"),
    "unknown choice": (["--set", "algorithm.adv_estimator=grpoo"], "did you mean 'grpo'"),
    "mini-batch": (["--set", "algorithm.ppo_mini_batch_size=3"], "must divide trainer.batch_size"),
    "two KLs": (["--set", "algorithm.use_kl_in_reward=true"], "pick one KL"),
    "GPU not present": (["--preset", "4090x1", "--set", "rollout.engine=hf", "--set", "rollout.quantization=none"],
                        "this machine has no CUDA GPU"),
    "impossible placement": (["--config", "overlap.yaml"], "overlaps train.gpus"),
    "hf split placement": (["--set", "train.gpus=[0]"], "must equal train.gpus"),
    "full FT adapter sync": (["--set", "train.backend=fsdp"], "train.backend=fsdp trains every weight and has no adapter"),
    "reward model missing": (["--set", "reward.model=/no/rm"], "reward.model='/no/rm' does not exist"),
    "reward url scheme": (["--set", "reward.url=ftp://x"], "reward.url='ftp://x' must start with http://"),
    "stale needs vllm": (["--set", "rollout.max_staleness=1"], "rollout.max_staleness=1 needs rollout.engine=vllm"),
    "stale colocated": (["--preset", "4090x1", "--set", "rollout.max_staleness=1"], "or set rollout.colocate=false"),
    "staleness 2": (["--set", "rollout.max_staleness=2"], "must be 0 (synchronous) or 1"),
    "sleep level": (["--set", "rollout.sleep_level=3"], "rollout.sleep_level=3 must be 1"),
    "sleep level 2 adapter": (["--set", "rollout.sleep_level=2"], "it needs sync.mode=merged"),
    "awq needs vllm": (["--set", "rollout.quantization=awq"], "rollout.quantization=awq needs rollout.engine=vllm"),
    "awq group size": (["--set", "rollout.engine=vllm", "--set", "rollout.quantization=awq", "--set",
                        "rollout.awq_group_size=96"], "rollout.awq_group_size=96 must be 32, 64 or 128"),
    "awq path missing": (["--set", "rollout.engine=vllm", "--set", "rollout.quantization=awq", "--set",
                          "rollout.quantized_path=/no/awq"], "rollout.quantized_path='/no/awq' does not exist"),
    "unknown preset": (["--preset", "4090x3"], "unknown preset '4090x3'"),
    "config missing": (["--config", "nope.yaml"], "config file 'nope.yaml' does not exist"),
    "config bad yaml": (["--config", "badyaml.yaml"], "is not valid YAML at line"),
    "config not a mapping": (["--config", "list.yaml"], "must hold a mapping of sections"),
    # model
    "model missing": (["--set", "model.path=/no/such/model"], "does not exist"),
    "model no config": (["--set", "model.path=noconfig"], "has no config.json"),
    "not a causal LM": (["--set", "model.path=bert"], "is a 't5' model, not a causal LM"),
    "bad tiny arch": (["--set", "model.path=tiny:gpt9"], "tiny:qwen2 or tiny:llama"),
    "bad target modules": (["--set", "train.target_modules=[c_attn]"], "are not module names of this model"),
    # data
    "data missing": (["--set", "data.train_files=[nope.jsonl]"], "'nope.jsonl' does not exist"),
    "data empty": (["--set", "data.train_files=[empty.jsonl]"], "holds no rows"),
    "parquet empty": (["--set", "data.train_files=[empty.parquet]"], "'empty.parquet' holds no rows"),
    "data not json": (["--set", "data.train_files=[notjson.jsonl]"], "notjson.jsonl:1: not valid JSON"),
    "no ground truth": (["--set", "data.train_files=[nogt.jsonl]"], "missing field 'reward_model.ground_truth'"),
    "prompt not a list": (["--set", "data.train_files=[badprompt.jsonl]"], "badprompt.jsonl:1: field 'prompt' must be text or a non-empty list"),
    "prompt too long": (["--set", "data.train_files=[long.jsonl]"], "long.jsonl:1: the prompt has"),
    "all prompts dropped": (["--set", "data.train_files=[long.jsonl]", "--set", "data.filter_overlong_prompts=true"],
                            "every prompt is longer"),
    "wrong extension": (["--set", "data.train_files=[data.txt]"], "must end in .jsonl, .json, .parquet, .csv"),
    "no prompt column": (["--set", "data.train_files=[noprompt.csv]"], "noprompt.csv has no column 'prompt' (its columns: question, answer)"),
    "bad answer column": (["--set", "data.train_files=[noprompt.csv]", "--set", "data.prompt_key=question", "--set",
                           "data.answer_key=solution"], "noprompt.csv row 0: missing field 'solution'; set data.answer_key"),
    "bad split": (["--set", "data.split=train["], "data.split='train[' must be a split name"),
    "hub dataset not cached": (["--set", "data.train_files=[nobody/nothing]"], "is not in the datasets cache and HF_HUB_OFFLINE is set"),
    # rewards
    "reward module missing": (["--set", "reward.function=no_such_mod:f"], "cannot import 'no_such_mod'"),
    "reward function missing": (["--set", "reward.function=rw.py:nope"], "has no function 'nope'"),
    "reward file missing": (["--set", "reward.function=nope.py:f"], "file 'nope.py' does not exist"),
    "reward raises": (["--set", "reward.function=rw.py:raises"], "raised RuntimeError: bad reward (rw.py:3 in raises) on sample 0"),
    "reward NaN": (["--set", "reward.function=rw.py:nan"], "returned nan on sample 0"),
    "reward None": (["--set", "reward.function=rw.py:none"], "returned None on sample 0"),
    "reward not a number": (["--set", "reward.function=rw.py:text"], "returned 'high' on sample 0 (data_source 'lite_verl/echo'); it must return a finite float; convert it"),
    "reward hangs": (["--set", "reward.function=rw.py:hangs", "--set", "reward.timeout_s=1"],
                     "did not return within reward.timeout_s=1.0s"),
    "reward crashes": (["--set", "reward.function=rw.py:crashes"], "on sample 0"),
    "no rule for data_source": (["--set", "data.train_files=[unknown_source.jsonl]"], "no rule reward for data_source 'mine'"),
    # run directories
    "run dir not empty": (["--run-dir", "full"], "already exists and is not empty"),
    "data not utf-8": (["--set", "data.train_files=[latin1.jsonl]"], "'latin1.jsonl' is not UTF-8 text (it holds the byte 0xe9)"),
    "weights truncated": (["--set", "model.path=truncated"], "cannot read its weights (SafetensorError"),
}  # fmt: skip
RESUME_CASES = {
    "resume missing": (["--resume", "nowhere"], "nowhere does not exist: it is not a run directory"),
    "resume without checkpoint": (["--resume", "nockpt"], "holds no complete checkpoint"),
    "resume with a recipe": (["--resume", "nockpt", "--recipe", "gsm8k"], "drop --recipe (--set changes"),
}


@pytest.mark.parametrize("case", list(CASES) + list(RESUME_CASES))
def test_bad_input(case, tmp_path, tiny_dir, capsys, monkeypatch):
    from conftest import has_cuda

    if case == "GPU not present" and has_cuda():
        pytest.skip("this machine has a GPU")
    _files(tmp_path, tiny_dir)
    monkeypatch.chdir(tmp_path)
    before = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*"))
    if case in RESUME_CASES:
        args, message = RESUME_CASES[case]
        code = main(["train", *args])
    else:
        args, message = CASES[case]
        run_dir = [] if "--run-dir" in args else ["--run-dir", "run"]
        code = main(["train", *run_dir, *FAST, *args])
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("lite-verl: error:")]
    assert code == 2, err
    assert len(errors) == 1 and message in errors[0], err
    assert "Traceback" not in err
    after = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*"))
    assert after == before, "a run directory or file was left behind"
    assert (tmp_path / "full" / "keep.txt").read_text() == "mine"


def test_catalogue_is_large_enough():
    assert len(CASES) + len(RESUME_CASES) >= 30


def test_no_env_leak():
    assert os.environ.get("HF_HUB_OFFLINE") == "1"
