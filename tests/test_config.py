"""Config layers, type checks, error messages, and every preset."""

from __future__ import annotations

from pathlib import Path

import pytest

from lite_verl.config import all_keys, load_config, parse_override
from lite_verl.config.presets import preset_names
from lite_verl.errors import ConfigError

GPU_PRESETS = ["4090x1", "4090x4", "3090x2", "a10x4"]


def test_laptop_defaults_and_layers(tmp_path):
    user = tmp_path / "my.yaml"
    user.write_text("trainer:\n  total_steps: 7\n  batch_size: 4\nrollout:\n  n: 4\n")
    cfg = load_config("laptop", str(user), ["trainer.total_steps=9", "train.lr=1e-3", "train.gpus=[]"])
    assert cfg.trainer.total_steps == 9  # --set wins over the file
    assert cfg.trainer.batch_size == 4  # the file wins over defaults
    assert cfg.train.lr == 1e-3  # YAML 1.1 reads 1e-3 as a string; accepted as float
    assert cfg.rollout.engine == "hf" and cfg.train.gpus == ()
    assert cfg.preset == "laptop"


def test_required_keys_exist():
    keys = set(all_keys())
    for k in ["model.path", "data.train_files", "data.val_files", "trainer.total_steps", "trainer.seed"]:
        assert k in keys


def test_unknown_key_names_nearest():
    with pytest.raises(ConfigError, match="unknown config key 'trainer.total_step'.*trainer.total_steps"):
        load_config("laptop", None, ["trainer.total_step=3"])
    with pytest.raises(ConfigError, match="did you mean 'train.lr'"):
        parse_override("lr=3")


@pytest.mark.parametrize(
    "key, says",
    [
        ("actor_rollout_ref.actor.optim.lr", "verl's 'optim.lr' is lite-verl's train.lr"),
        ("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu", "lite-verl's train.micro_batch_size"),
        ("data.max_response_length", "lite-verl's rollout.max_new_tokens"),
        ("actor_rollout_ref.rollout.n", "did you mean 'rollout.n'"),
        ("num_generations", "TRL's 'num_generations' is lite-verl's rollout.n"),
        ("beta", "lite-verl's algorithm.kl_loss_coef"),
        ("offload_embedding", "Unsloth's 'offload_embedding' is lite-verl's train.embeddings_on_host"),
        ("actor_rollout_ref.rollout.engine_kwargs.vllm.kv_cache_dtype", "lite-verl's rollout.kv_cache_dtype"),
        (
            "max_seq_length",
            "Unsloth's 'max_seq_length' is lite-verl's data.max_prompt_length \\+ rollout.max_new_tokens",
        ),
    ],
)
def test_keys_from_verl_trl_and_unsloth_get_lite_verls_name(key, says):
    """By spelling alone, verl's micro-batch key was sent to the mini-batch one (other maths) and
    max_response_length to max_prompt_length: known keys of the tools users come from are named instead."""
    with pytest.raises(ConfigError, match=f"unknown config key '{key}'; .*{says}"):
        load_config("laptop", None, [f"{key}=1"])


def test_set_adds_one_entry_of_a_mapping():
    cfg = load_config("4090x1", None, ["cost.price_per_hour.RTX 4090=0.5", "cost.price_per_hour.H200=3.5"])
    assert cfg.cost.price_per_hour == {"RTX 4090": 0.5, "H200": 3.5, "cpu": 0.0}  # the preset's others kept
    with pytest.raises(ConfigError, match=r"cost.price_per_hour.H200 must be a float"):
        load_config("4090x1", None, ["cost.price_per_hour.H200=abc"])
    with pytest.raises(
        ConfigError, match=r"no price for GPU model 'H200'.*--set 'cost.price_per_hour.H200=0.0'"
    ):
        load_config("4090x1", None, ["cost.gpu_models=[H200]"])
    with pytest.raises(ConfigError, match="unknown config key 'cost.price_per_hour.'"):
        parse_override("cost.price_per_hour.=1")


def test_unknown_key_in_file(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("rollout:\n  temprature: 0.7\n")
    with pytest.raises(ConfigError, match="rollout.temprature.*rollout.temperature"):
        load_config("laptop", str(f))


@pytest.mark.parametrize(
    "override, pattern",
    [
        ("trainer.total_steps=abc", "trainer.total_steps must be an int"),
        ("trainer.total_steps=1.5", "trainer.total_steps must be an int"),
        ("trainer.tensorboard=3", "trainer.tensorboard must be a bool"),
        ("train.gpus=[a]", r"train.gpus\[0\] must be an int"),
        ("trainer.batch_size=0", "trainer.batch_size=0 must be > 0"),
        ("rollout.top_p=1.5", r"rollout.top_p=1.5 must be in \(0, 1\]"),
        ("rollout.top_k=-1", r"rollout.top_k=-1 must be >= 0 \(0 = no top-k\)"),
        ("rollout.min_p=1", r"rollout.min_p=1.0 must be in \[0, 1\)"),
        ("rollout.n=1", "rollout.n >= 2"),
        ("algorithm.loss_agg_mode=token_mean", "did you mean 'token-mean'"),
        ("algorithm.ppo_mini_batch_size=5", "must divide trainer.batch_size"),
        ("train.gpus=[0]", "rollout.gpus .* must equal train.gpus"),
        ("reward.function=nocolon", "module:function"),
    ],
)
def test_bad_values_name_the_field(override, pattern):
    with pytest.raises(ConfigError, match=pattern):
        load_config("laptop", None, [override])


def test_unknown_preset():
    with pytest.raises(ConfigError, match="unknown preset 'lapto'; did you mean 'laptop'"):
        load_config("lapto")


def test_every_preset_has_a_header_and_price():
    from lite_verl.config.presets import preset_path

    assert set(GPU_PRESETS + ["laptop"]) <= set(preset_names())
    for name in preset_names():
        text = preset_path(name).read_text()
        assert text.startswith(f"# lite-verl preset: {name}")
        assert "# Launch:" in text and "# Assumes:" in text
        assert "price_per_hour" in text


@pytest.mark.parametrize("name", GPU_PRESETS)
def test_gpu_presets_validate_now_that_awq_rollout_exists(name):
    cfg = load_config(name)  # static checks; the GPUs themselves are checked by check_environment
    assert cfg.rollout.engine == "vllm" and cfg.rollout.quantization in ("awq", "none")
    assert cfg.rollout.gpus and cfg.train.gpus


def test_gpu_preset_geometry_is_valid_apart_from_unbuilt_parts():
    # with the built engine swapped in, the placement/cost parts of each preset validate
    cfg = load_config("4090x1", None, ["rollout.engine=hf", "rollout.quantization=none"])
    assert cfg.rollout.gpus == cfg.train.gpus == (0,)
    with pytest.raises(ConfigError, match="rollout.engine=hf generates with the trained model"):
        load_config("4090x4", None, ["rollout.engine=hf", "rollout.quantization=none"])


def test_presets_do_not_change_the_maths():
    """Rule 7: a preset sets where/how, never batch sizes, losses or seeds."""
    from lite_verl.config import read_yaml
    from lite_verl.config.presets import preset_path

    for name in preset_names():
        data = read_yaml(preset_path(name), name)
        assert "algorithm" not in data and "data" not in data
        assert not ({"batch_size", "seed", "total_steps"} & set(data.get("trainer", {})))


def test_placement_checks():
    from lite_verl.config import from_dict, validate_config

    base = {
        "rollout": {"engine": "vllm", "gpus": [0, 1], "quantization": "none"},
        "train": {"gpus": [1, 2]},
        "cost": {"gpu_models": ["A10"] * 3, "price_per_hour": {"A10": 1.0}},
    }
    with pytest.raises(ConfigError, match=r"rollout.gpus \[0, 1\] overlaps train.gpus \[1, 2\]"):
        validate_config(from_dict(base))
    with pytest.raises(ConfigError, match="negative GPU id"):
        validate_config(from_dict({"train": {"gpus": [-1]}, "rollout": {"gpus": [-1]}}))
    with pytest.raises(ConfigError, match="cost.gpu_models lists only 0"):
        validate_config(from_dict({"train": {"gpus": [0]}, "rollout": {"gpus": [0]}}))


def test_environment_check_rejects_missing_gpus():
    from conftest import has_cuda

    from lite_verl.config.validation import check_environment

    if has_cuda():
        pytest.skip("this machine has a GPU")
    cfg = load_config("4090x1", None, ["rollout.engine=hf", "rollout.quantization=none"])
    with pytest.raises(ConfigError, match=r"GPU id\(s\) \[0\] but this machine has no CUDA GPU"):
        check_environment(cfg)


def test_bill_charges_a_shared_gpu_once():
    from lite_verl.run.cost import Ledger, bill

    cfg = load_config("4090x1", None, ["rollout.engine=hf", "rollout.quantization=none"])
    ledger = Ledger.from_config(cfg)
    ledger.busy[("rollout", "cuda:0")] = 30.0
    ledger.busy[("train", "cuda:0")] = 90.0
    ledger.elapsed_before = 3600.0 - (ledger.wall() - ledger.elapsed_before)  # wall = 1 h
    rows = {r.role: r for r in bill(ledger, cfg)}
    assert rows["rollout"].held_s + rows["train"].held_s == pytest.approx(3600.0, rel=1e-3)
    assert rows["train"].held_s == pytest.approx(3 * rows["rollout"].held_s, rel=1e-3)
    assert sum(r.cost_usd for r in rows.values()) == pytest.approx(0.69, rel=1e-3)  # one 4090-hour


def test_every_key_has_one_line_help():
    from lite_verl.config import describe

    helps = dict(describe())
    assert list(helps) == all_keys()
    for key, text in helps.items():
        assert text.strip() and "\n" not in text, key


def test_enumerated_keys_list_their_values_in_help_and_error():
    import dataclasses

    from lite_verl.config import Config, SyncConfig, describe, validate_config
    from lite_verl.config.convert import choices, key_types

    enumerated = {k: choices(tp) for k, tp in key_types() if choices(tp)}
    assert {"model.dtype", "rollout.engine", "train.backend", "algorithm.loss_agg_mode", "sync.mode"} <= set(
        enumerated
    )
    helps = dict(describe())
    for key, allowed in enumerated.items():
        assert helps[key].startswith(" | ".join(allowed) + ": "), key
        with pytest.raises(ConfigError, match=rf"^{key}(\[0\])?='nope' must be ") as err:  # [0]: a list key
            load_config("laptop", None, [f"{key}=nope"])
        assert "\n" not in str(err.value) and all(v in str(err.value) for v in allowed)
    # a Config made in code is checked too
    bad = dataclasses.replace(Config(), sync=SyncConfig(mode="x"))
    with pytest.raises(ConfigError, match="sync.mode='x' must be adapter or merged"):
        validate_config(bad)


def test_loss_agg_modes_are_the_maths_modes():
    import typing

    from lite_verl import algos
    from lite_verl.config.schema import LossAggMode

    assert typing.get_args(LossAggMode) == algos.LOSS_AGG_MODES


def test_full_finetune_is_fsdp_or_deepspeed():
    from lite_verl.config import FULL_BACKENDS, TrainConfig

    assert FULL_BACKENDS == ("fsdp", "deepspeed")
    assert [TrainConfig(backend=b).full_finetune for b in ("lora", "qlora", "fsdp", "deepspeed")] == [
        False,
        False,
        True,
        True,
    ]


def test_presets_are_found_in_a_checkout_without_the_installed_package():
    """Run from a checkout (PYTHONPATH=., no pip install), presets and recipes come from the repository's
    presets/ and recipes/."""
    from lite_verl.config.presets import _shipped_dir

    for kind in ("presets", "recipes"):
        assert _shipped_dir(kind) == Path(__file__).resolve().parent.parent / kind


def test_use_liger_needs_a_gpu_and_its_package_each_in_one_line(monkeypatch):
    """train.use_liger: Triton kernels, so a CPU trainer is refused naming the key and the fix; on a GPU a
    missing liger-kernel gives the install command (verl's use_liger and TRL's use_liger_kernel point here)."""
    import importlib.util

    import torch

    from lite_verl.config.validation import check_environment
    from lite_verl.errors import MissingDependency

    with pytest.raises(ConfigError, match=r"train.use_liger=true runs Liger's Triton kernels on a CUDA GPU.*"
                                          r"set train.use_liger=false"):  # fmt: skip
        load_config("laptop", None, ["train.use_liger=true"])
    cfg = load_config(
        "4090x1", None, ["rollout.engine=hf", "rollout.quantization=none", "train.use_liger=true"]
    )
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "liger_kernel" else real(name, *a)
    )
    with pytest.raises(MissingDependency, match=r"train.use_liger=true needs the package 'liger-kernel'.*"
                                                r"pip install 'lite-verl\[liger\]'"):  # fmt: skip
        check_environment(cfg)
    for foreign, origin in (("actor_rollout_ref.model.use_liger", "verl"), ("use_liger_kernel", "TRL")):
        with pytest.raises(ConfigError, match=rf"{origin}'s '\w+' is lite-verl's train.use_liger"):
            load_config("laptop", None, [f"{foreign}=true"])
