"""Recipes (what is computed) and presets (where it runs): disjoint keys, the layer order, the shipped recipes
load, the countdown task is solvable and checked exactly, and a recipe trains from the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from test_cli import cli

from lite_verl.config import load_config
from lite_verl.config.convert import all_keys, set_keys, where_keys
from lite_verl.config.layers import preset_layer, recipe_layer
from lite_verl.config.presets import preset_names, preset_path, recipe_names, recipe_path
from lite_verl.data.tasks import COUNTDOWN_SOURCE, countdown_rows, task_rows
from lite_verl.errors import ConfigError
from lite_verl.reward.rules import COUNTDOWN_FORMAT_SCORE, countdown_score, default_compute_score

# the hardware keys, spelled out once here so that a key moving class in schema.py is a visible change
WHERE = {
    "model.dtype", "model.fp32_lm_head",
    "rollout.engine", "rollout.gpus", "rollout.gpu_memory_utilization", "rollout.kv_cache_gib", "rollout.kv_cache_dtype", "rollout.quantization",
    "rollout.quantized_path", "rollout.awq_group_size", "rollout.enforce_eager", "rollout.colocate",
    "rollout.sleep_level",
    "train.backend", "train.gpus", "train.cpu_ranks", "train.micro_batch_size", "train.pack_micro_batches",
    "train.gradient_checkpointing", "train.grow_micro_batch", "train.use_liger", "train.offload_params", "train.offload_optimizer",
    "train.offload_during_rollout", "train.embeddings_on_host", "train.optimizer_state_dtype", "train.max_memory_gib",
    "reward.device", "reward.keep_alive_s", "sync.mode", "sync.bucket_mb", "trainer.plan_check",
    "cost.gpu_models", "cost.price_per_hour",
}  # fmt: skip


def test_the_where_keys_are_the_hardware_ones():
    assert where_keys() == WHERE
    assert set(all_keys()) >= WHERE


@pytest.mark.parametrize("name", preset_names())
def test_every_preset_sets_only_where_keys(name):
    keys = set_keys(yaml.safe_load(preset_path(name).read_text()))
    assert keys and set(keys) <= WHERE, set(keys) - WHERE
    preset_layer(name)  # and the loader agrees


@pytest.mark.parametrize("name", recipe_names())
def test_every_recipe_sets_no_where_key_and_loads(name):
    keys = set(set_keys(yaml.safe_load(recipe_path(name).read_text())))
    assert keys and not keys & WHERE and keys <= set(all_keys()), keys & WHERE
    recipe_layer(name)
    for preset in preset_names():
        cfg = load_config(preset, None, [], recipe=name)
        assert cfg.recipe == name and cfg.preset == preset
    text = recipe_path(name).read_text()
    assert f"--recipe {name}" in text and "# Measured:" in text or "NOT measured" in text


def test_shipped_recipes():
    assert {"gsm8k", "math", "arithmetic", "arithmetic-base", "countdown", "sequence", "largest"} <= set(
        recipe_names()
    )


def test_a_preset_with_a_maths_key_and_a_recipe_with_a_hardware_key_are_refused(tmp_path):
    bad_preset = tmp_path / "p.yaml"
    bad_preset.write_text("rollout: {gpus: []}\ntrain: {lr: 0.1}\n")
    with pytest.raises(ConfigError, match=r"preset '.*p.yaml' sets train.lr, which says what is computed"):
        load_config(str(bad_preset))
    bad_recipe = tmp_path / "r.yaml"
    bad_recipe.write_text("trainer: {total_steps: 3}\nrollout: {gpus: [0]}\n")
    with pytest.raises(
        ConfigError, match=r"recipe '.*r.yaml' sets rollout.gpus, which says where things run"
    ):
        load_config("laptop", recipe=str(bad_recipe))
    with pytest.raises(ConfigError, match="unknown recipe 'arithmetc'; did you mean 'arithmetic'"):
        load_config("laptop", recipe="arithmetc")


def test_layers_defaults_recipe_preset_config_set(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("train: {lr: 0.5, warmup_steps: 3}\ntrainer: {total_steps: 7, batch_size: 8}\n")
    user = tmp_path / "u.yaml"
    user.write_text("train: {warmup_steps: 4}\ntrainer: {batch_size: 4}\n")
    cfg = load_config("laptop", str(user), ["trainer.batch_size=2"], recipe=str(recipe))
    assert cfg.train.lr == 0.5  # the recipe over the default
    assert cfg.train.micro_batch_size == 16  # the preset's (the default is 8)
    assert cfg.train.warmup_steps == 4  # --config over the recipe
    assert (cfg.trainer.total_steps, cfg.trainer.batch_size) == (7, 2)  # --set over --config
    # a resolved run config records its recipe and re-loads to the same config without naming it again
    resolved = tmp_path / "run.yaml"
    from lite_verl.config import to_dict

    resolved.write_text(yaml.safe_dump(to_dict(cfg)))
    assert load_config(None, str(resolved)) == cfg


def test_same_recipe_same_maths_on_every_preset():
    """A preset changes where and how, never what: the what-keys agree across presets."""
    from lite_verl.config import to_dict

    def what(cfg) -> dict:
        flat = {}
        for k in all_keys():
            v = to_dict(cfg)
            for part in k.split("."):
                v = v[part]
            flat[k] = v
        return {k: v for k, v in flat.items() if k not in WHERE and k != "preset"}

    base = what(load_config("laptop", recipe="arithmetic"))
    for preset in preset_names():
        assert what(load_config(preset, recipe="arithmetic")) == base, preset


def test_countdown_rows_are_solvable_and_scored_exactly():
    rows = countdown_rows(300, 0)
    assert len({r.messages[0]["content"] for r in rows}) > 250  # varied
    for r in rows:
        n = r.extra_info["numbers"]
        assert len(n) == 3 and all(1 <= x <= 20 for x in n) and 1 <= int(r.ground_truth) <= 200
        assert r.data_source == COUNTDOWN_SOURCE
        assert (
            default_compute_score(r.data_source, "so " + r.extra_info["answer"], r.ground_truth, r.extra_info)
            == 1.0
        )
    train = {r.messages[0]["content"] for r in task_rows("countdown", 200, 0)}
    val = {r.messages[0]["content"] for r in task_rows("countdown", 200, 0, "val")}
    assert len(train & val) < 20  # held-out stream (a few coincide by chance: the space is small)


@pytest.mark.parametrize(
    "text, target, numbers, score",
    [
        ("<answer>(1 + 2) * 3</answer>", 9, [3, 1, 2], 1.0),
        ("<answer>3 * (1 + 2) = 9</answer>", 9, [1, 2, 3], 1.0),  # the left side counts
        ("<answer>8 / (3 - 8 / 3)</answer>", 24, [8, 3, 8, 3], 1.0),  # exact fractions, not floats
        ("<answer>(1 + 2) * 3</answer>", 9, [1, 2, 4], COUNTDOWN_FORMAT_SCORE),  # wrong numbers
        ("<answer>1 + 2 + 3 + 3</answer>", 9, [1, 2, 3], COUNTDOWN_FORMAT_SCORE),  # a number twice
        ("<answer>(1 + 2) * 3</answer>", 10, [1, 2, 3], COUNTDOWN_FORMAT_SCORE),  # wrong value
        ("<answer>__import__('os')</answer>", 9, [1, 2, 3], COUNTDOWN_FORMAT_SCORE),  # never evaluated
        ("<answer>1 / (2 - 2) + 3</answer>", 9, [1, 2, 2, 3], COUNTDOWN_FORMAT_SCORE),
        ("<answer>2 ** 3 + 1</answer>", 9, [2, 3, 1], COUNTDOWN_FORMAT_SCORE),  # ** is not allowed
        ("(1 + 2) * 3", 9, [1, 2, 3], 0.0),  # no tags
        ("<answer>9</answer> then <answer>(1 + 2) * 3</answer>", 9, [1, 2, 3], 1.0),  # the last answer
    ],
)
def test_countdown_score(text, target, numbers, score):
    assert countdown_score(text, target, numbers) == score


def test_prompt_template_wraps_the_prompt_text(tmp_path):
    from lite_verl.data.loader import prompt_rows

    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps({"question": "1+1?", "answer": "#### 2"}) + "\n")
    cfg = load_config("laptop", None, [f"data.train_files=[{data}]", "data.prompt_key=question",
                                       "data.answer_key=answer", "data.val_size=0",
                                       "data.prompt_template=Q: {prompt} A after ####."])  # fmt: skip
    rows, _ = prompt_rows(cfg.data, 0)
    assert rows[0].messages[-1]["content"] == "Q: 1+1? A after ####."
    with pytest.raises(ConfigError, match="data.prompt_template='Q' has no {prompt}"):
        load_config("laptop", None, ["data.prompt_template=Q"])


def test_recipes_command_and_a_short_recipe_run_on_the_laptop(tmp_path):
    out = cli("recipes", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    for name in recipe_names():
        assert f"--recipe {name}" in out.stdout
    run = tmp_path / "run"
    out = cli("train", "--preset", "laptop", "--recipe", "countdown", "--run-dir", str(run),
              "--set", "model.path=tiny:qwen2", "--set", "trainer.total_steps=2", "--set", "trainer.batch_size=4",
              "--set", "rollout.n=4", "--set", "data.val_size=4", "--set", "rollout.max_new_tokens=12",
              "--set", "trainer.val_before_train=false", "--set", "trainer.progress=false", cwd=tmp_path)  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    assert cfg["recipe"] == "countdown" and cfg["data"]["task"] == "countdown" and cfg["train"]["lr"] == 2e-4
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "val/reward_mean" in r] == [2]  # none before training
    val = next(r for r in rows if "val/reward_mean" in r)
    assert 0.0 <= val["val/acc"] <= val["val/reward_mean"] + 1e-9  # rewards in {0, 0.1, 1}: acc <= mean
    assert all(0.0 <= r["reward/mean"] <= 1.0 for r in rows if "reward/mean" in r)
    assert Path(run / "summary.json").is_file()


def test_a_real_model_at_the_demo_learning_rate_is_warned(tmp_path, capsys):
    """train.lr's default is the tiny demo model's (3e-3): a real-sized model (hidden >= 512) without a
    recipe or its own rate gets one line naming the fix; a recipe's rate, a set rate or the tiny model none."""
    from lite_verl.model.load import warn_demo_lr

    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": 576}))
    warn_demo_lr(load_config("laptop", None, [f"model.path={tmp_path}"]), tmp_path)
    assert "train.lr=0.003 is the tiny demo model's rate" in capsys.readouterr().err
    for sets in (["train.lr=1e-5"], []):
        recipe = None if sets else "arithmetic"
        warn_demo_lr(load_config("laptop", None, [f"model.path={tmp_path}", *sets], recipe=recipe), tmp_path)
        assert capsys.readouterr().err == ""
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": 64}))
    warn_demo_lr(load_config("laptop", None, [f"model.path={tmp_path}"]), tmp_path)
    assert capsys.readouterr().err == ""
