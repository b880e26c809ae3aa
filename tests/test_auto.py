"""--preset auto on fake machines (CPU only): what it picks, that it fits, that the user's values win, and
the topology check before anything loads."""

from __future__ import annotations

import dataclasses
import json

import pytest
import yaml

from lite_verl.config import load_config, to_dict
from lite_verl.errors import ConfigError
from lite_verl.tools import plan as planner
from lite_verl.tools.auto import MODEL_SHAPES, Gpu, card_name, check_topology, choose, plan_on

QWEN_1_5B, QWEN_7B = MODEL_SHAPES["1.5b"], MODEL_SHAPES["7b"]


def machine(
    n: int, name: str, total: float, free: float | None = None, p2p: bool = False, cc=(8, 9)
) -> list[Gpu]:
    free = total - 0.4 if free is None else free  # the driver and display keep a little
    return [
        Gpu(i, name, total, free, tuple(j for j in range(n) if j != i) if p2p else (), cc) for i in range(n)
    ]


RTX4090x1 = machine(1, "NVIDIA GeForce RTX 4090", 23.99)
RTX3090x2 = machine(2, "NVIDIA GeForce RTX 3090", 23.69)  # consumer cards: no peer access
RTX4090x4 = machine(4, "NVIDIA GeForce RTX 4090", 23.99)
A10x1 = machine(1, "NVIDIA A10", 22.49, cc=(8, 6))


def qwen_dir(tmp_path, shape):
    """A model directory holding only config.json: enough for the plan (nothing loads)."""
    (tmp_path / "config.json").write_text(json.dumps({
        "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": shape.hidden,
        "intermediate_size": shape.intermediate, "num_hidden_layers": shape.layers,
        "num_attention_heads": shape.heads, "num_key_value_heads": shape.kv_heads, "vocab_size": shape.vocab,
        "tie_word_embeddings": shape.tied}))  # fmt: skip
    return tmp_path


def fits(choice, shape) -> bool:
    free = {g.id: g.free_gib for g in choice.gpus}
    plans = plan_on(choice.cfg, shape, choice.gpus)
    return bool(plans) and all(p.fits and p.peak_gib <= free[p.gpu] for p in plans)


def test_card_names_match_the_plan_only_when_the_size_does():
    assert card_name("NVIDIA GeForce RTX 4090", 23.99) == "RTX 4090"
    assert card_name("NVIDIA A100-SXM4-80GB", 79.3) == "A100"
    assert card_name("Tesla T4", 14.58) == "T4"
    assert card_name("NVIDIA A100-PCIE-40GB", 39.4) == "NVIDIA A100-PCIE-40GB"  # not the 80 GiB A100
    assert card_name("NVIDIA GeForce RTX 3060 Ti", 7.8) == "NVIDIA GeForce RTX 3060 Ti"
    assert card_name("NVIDIA A10G", 22.0) == "NVIDIA A10G"


def test_no_gpu_picks_the_laptop_preset_and_says_so():
    choice = choose([], None, [])
    assert choice.cfg.preset == "auto-laptop" and not choice.cfg.rollout.gpus and not choice.cfg.train.gpus
    assert choice.lines == (
        "auto: no CUDA GPU detected -> preset laptop: rollout (HF generate) and training on the CPU",
    )


def test_1_5b_on_one_4090_stays_lora_colocated(tmp_path):
    choice = choose(RTX4090x1, None, [f"model.path={qwen_dir(tmp_path, QWEN_1_5B)}"])
    cfg = choice.cfg
    assert cfg.preset == "auto-4090x1" and cfg.rollout.gpus == cfg.train.gpus == (0,) and cfg.rollout.colocate
    assert (cfg.rollout.engine, cfg.train.backend, cfg.rollout.quantization) == ("vllm", "lora", "none")
    assert cfg.cost.gpu_models == ("RTX 4090",) and cfg.cost.price_per_hour["RTX 4090"] == 0.69
    assert fits(choice, QWEN_1_5B)
    assert choice.lines[0].startswith(
        "auto: 1x NVIDIA GeForce RTX 4090 (24 GiB) -> colocated like preset 4090x1"
    )
    assert choice.lines[-1].startswith("auto: chose train.backend=lora, rollout.quantization=none")


@pytest.mark.parametrize("gpus", [RTX4090x1, A10x1], ids=["4090", "A10"])
def test_7b_on_one_24_gib_card_ends_with_qlora_and_awq(gpus, tmp_path):
    choice = choose(gpus, None, [f"model.path={qwen_dir(tmp_path, QWEN_7B)}"])
    cfg = choice.cfg
    assert (cfg.train.backend, cfg.rollout.quantization) == ("qlora", "awq") and fits(choice, QWEN_7B)
    said = "\n".join(choice.lines)
    assert "auto: lora with unquantized rollout does not fit: GPU 0" in said
    assert "auto: lora with AWQ rollout does not fit" in said and "use train.backend=qlora" in said
    assert choice.lines[-1].startswith("auto: chose train.backend=qlora, rollout.quantization=awq")


def test_7b_on_one_12_gib_card_sizes_vllms_cache_and_parks_the_trainer_during_rollouts():
    """Past qlora + AWQ, the ladder's last rungs: vLLM holds one rollout's KV cache, not a share of the card,
    and the trainer waits in host memory while vLLM generates (the card holds one of the two)."""
    card = machine(1, "NVIDIA GeForce RTX 3060", 11.76)
    sets = [
        "trainer.batch_size=16",
        "rollout.n=8",
        "rollout.max_new_tokens=256",
        "data.max_prompt_length=128",
    ]
    choice = choose(card, None, sets, QWEN_7B)
    cfg = choice.cfg
    assert (cfg.train.backend, cfg.rollout.quantization) == ("qlora", "awq") and fits(choice, QWEN_7B)
    assert cfg.train.offload_during_rollout and cfg.rollout.kv_cache_gib == "auto"
    assert "rollout.kv_cache_gib=auto, train.offload_during_rollout=true" in choice.lines[-1]
    said = "\n".join(choice.lines)
    assert "auto: qlora with AWQ rollout does not fit" in said and "set rollout.kv_cache_gib=auto" in said
    with pytest.raises(ConfigError, match=r"train.offload_during_rollout false/true"):
        choose(card, None, [*sets, "rollout.max_new_tokens=4096"], QWEN_7B)  # no rung fits


def test_two_3090_without_p2p_split_rollout_and_training():
    choice = choose(RTX3090x2, None, [], QWEN_7B)
    cfg = choice.cfg
    assert cfg.preset == "auto-3090x2" and cfg.rollout.gpus == (0,) and cfg.train.gpus == (1,)
    assert (
        cfg.train.backend == "lora"
        and cfg.cost.gpu_models == ("RTX 3090", "RTX 3090")
        and fits(choice, QWEN_7B)
    )
    assert choice.lines[0].startswith(
        "auto: 2x NVIDIA GeForce RTX 3090 (24 GiB, no P2P) -> split placement like preset 3090x2: vLLM on GPU 0"
    )


def test_four_4090_place_like_the_4090x4_preset():
    choice = choose(RTX4090x4, None, [], QWEN_7B)
    cfg = choice.cfg
    assert (
        cfg.rollout.gpus == (0, 1) and cfg.train.gpus == (2, 3) and cfg.cost.gpu_models == ("RTX 4090",) * 4
    )
    assert fits(choice, QWEN_7B)


def test_the_users_set_wins_over_auto():
    sets = ["train.micro_batch_size=2", "train.gradient_checkpointing=true", "rollout.quantization=awq"]
    cfg = choose(RTX4090x1, None, sets, QWEN_1_5B).cfg
    assert (cfg.train.micro_batch_size, cfg.train.gradient_checkpointing, cfg.rollout.quantization) == (
        2,
        True,
        "awq",
    )
    assert cfg.train.backend == "lora"
    cfg = choose(RTX3090x2, None, ["train.gpus=[0]", "rollout.gpus=[0]"], QWEN_1_5B).cfg  # colocated by hand
    assert cfg.rollout.gpus == cfg.train.gpus == (0,)


def test_a_config_file_wins_over_auto_too(tmp_path):
    (tmp_path / "my.yaml").write_text("train:\n  micro_batch_size: 1\n")
    cfg = choose(RTX4090x1, str(tmp_path / "my.yaml"), [], QWEN_1_5B).cfg
    assert cfg.train.micro_batch_size == 1


def test_a_pinned_knob_that_cannot_fit_is_one_error_naming_the_size_and_the_tries():
    with pytest.raises(ConfigError, match=r"auto: a 7.6B-parameter model fits no candidate on 1x NVIDIA GeForce "
                       r"RTX 3060 \(12 GiB\) \(tried 18 configs: train.backend lora, rollout.quantization none/awq, "
                       r"train.gradient_checkpointing false/true, train.micro_batch_size 8/4/2/1, "
                       r"train.offload_during_rollout false/true, rollout.enforce_eager false/true\); the most frugal: "
                       r"GPU 0 \(RTX 3060\) would need .*use a smaller model or more GPUs"):  # fmt: skip
        choose(machine(1, "NVIDIA GeForce RTX 3060", 11.76), None, ["train.backend=lora"], QWEN_7B)
    # on a 24 GiB card the bf16 7B base fits once the trainer leaves the card to vLLM during rollouts
    lean = choose(RTX4090x1, None, ["train.backend=lora"], QWEN_7B).cfg
    assert lean.train.backend == "lora" and lean.train.offload_during_rollout
    with pytest.raises(ConfigError, match=r"rollout.gpus names GPU 5, which this machine does not have"):
        choose(RTX4090x1, None, ["train.gpus=[5]", "rollout.gpus=[5]", "cost.gpu_models=[a, b, c, d, e, f]",
                                 "cost.price_per_hour={a: 0, f: 0}"], QWEN_1_5B)  # fmt: skip


def test_a_card_too_small_for_lean_takes_a_1_5b_once_vllm_drops_its_cuda_graphs():
    """Lean alone plans above this card; without CUDA graphs (whose pool a sleeping vLLM keeps on the card)
    it fits, and the choice says rollouts are slower (9x measured at 1.5B)."""
    small = machine(1, "NVIDIA GeForce RTX 3050", 4.6)
    choice = choose(small, None, [], QWEN_1_5B)
    cfg = choice.cfg
    assert (
        cfg.rollout.enforce_eager and cfg.train.offload_during_rollout and cfg.rollout.kv_cache_gib == "auto"
    )
    assert fits(choice, QWEN_1_5B)
    assert (
        "rollout.enforce_eager=true (vLLM without CUDA graphs: rollouts several times slower)"
        in choice.lines[-1]
    )
    graphs = dataclasses.replace(cfg, rollout=dataclasses.replace(cfg.rollout, enforce_eager=False))
    (with_graphs,) = plan_on(graphs, QWEN_1_5B, choice.gpus)
    (chosen,) = plan_on(cfg, QWEN_1_5B, choice.gpus)
    assert with_graphs.peak_gib > small[0].free_gib >= chosen.peak_gib
    # a card with room keeps the graphs
    assert not choose(RTX4090x1, None, [], QWEN_1_5B).cfg.rollout.enforce_eager


def test_what_is_free_now_decides_too():
    busy = machine(1, "NVIDIA GeForce RTX 4090", 23.99, free=11.0)  # another process holds 13 GiB
    choice = choose(busy, None, [], QWEN_1_5B)
    assert choice.cfg.train.backend == "qlora" and fits(choice, QWEN_1_5B)
    assert "has 11.0 GiB free but needs ~12.3 GiB" in "\n".join(choice.lines)


def test_an_unknown_card_is_sized_by_its_measured_memory():
    choice = choose(machine(1, "NVIDIA L40S", 44.4), None, [], QWEN_7B)
    cfg = choice.cfg
    assert cfg.cost.gpu_models == ("NVIDIA L40S",) and cfg.cost.price_per_hour["NVIDIA L40S"] == 0.0
    (p,) = plan_on(cfg, QWEN_7B, choice.gpus)
    assert p.card_gib == pytest.approx(44.4) and p.fits and cfg.train.backend == "lora"
    assert "NVIDIA L40S" not in planner.CARD_GIB  # only while planning
    assert any("no hourly price known for NVIDIA L40S" in line for line in choice.lines)


def test_a_card_without_bfloat16_trains_in_float16_and_mixed_cards_use_the_largest():
    t4 = machine(1, "Tesla T4", 14.58, cc=(7, 5))
    assert choose(t4, None, [], QWEN_1_5B).cfg.model.dtype == "float16"
    mixed = [*machine(4, "NVIDIA A10", 22.49, cc=(8, 6)), Gpu(4, "Tesla T4", 14.58, 14.2, (), (7, 5))]
    choice = choose(mixed, None, [], QWEN_1_5B)
    assert choice.cfg.train.gpus == (2, 3) and choice.cfg.model.dtype == "bfloat16"
    assert choice.cfg.cost.gpu_models == ("A10", "A10", "A10", "A10", "T4")
    assert any("GPU(s) 4 (Tesla T4, 15 GiB) left idle" in line for line in choice.lines)


def test_an_auto_config_reloads_as_its_preset(tmp_path):
    """A run's config.yaml says preset: auto-4090x1; --resume and --config load it without detecting."""
    cfg = choose(RTX4090x1, None, [], QWEN_7B).cfg
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(to_dict(cfg)))
    assert load_config(None, str(tmp_path / "config.yaml")) == cfg


def test_topology_check_names_the_missing_gpu_and_the_short_card():
    with pytest.raises(
        ConfigError, match=r"train.gpus names GPU 1, which this machine does not have \(GPU ids \[0\]\)"
    ):
        check_topology(load_config("3090x2"), QWEN_1_5B, RTX4090x1)
    busy = machine(1, "NVIDIA GeForce RTX 4090", 23.99, free=5.0)
    with pytest.raises(
        ConfigError, match=r"GPU 0 \(NVIDIA GeForce RTX 4090\) has 5.0 GiB free but needs ~12.3 GiB"
    ):
        check_topology(load_config("4090x1"), QWEN_1_5B, busy)
    check_topology(load_config("4090x1", None, ["trainer.plan_check=false"]), QWEN_1_5B, busy)  # try anyway
    check_topology(load_config("4090x1"), QWEN_1_5B, RTX4090x1)
    with pytest.raises(ConfigError, match="names GPU 0, which this machine does not have"):
        check_topology(load_config("4090x1", None, ["trainer.plan_check=false"]), QWEN_1_5B, [])


def test_an_fp8_kv_cache_on_a_card_without_fp8_is_refused_before_loading():
    fp8 = load_config("4090x1", None, ["rollout.kv_cache_dtype=fp8"])
    check_topology(fp8, QWEN_1_5B, RTX4090x1)  # Ada: 8.9
    ampere = machine(1, "NVIDIA GeForce RTX 3090", 23.69, cc=(8, 6))
    with pytest.raises(
        ConfigError, match=r"GPU 0 \(NVIDIA GeForce RTX 3090\) is 8.6: set rollout.kv_cache_dtype=auto"
    ):
        check_topology(fp8, QWEN_1_5B, ampere)
    check_topology(load_config("4090x1"), QWEN_1_5B, ampere)
    # --preset auto: one clear line, not every rung of the ladder reported as not fitting
    with pytest.raises(ConfigError, match=r"^rollout.kv_cache_dtype=fp8 needs a card with FP8"):
        choose(ampere, None, ["rollout.kv_cache_dtype=fp8"], QWEN_1_5B)


def test_a_preset_on_another_card_says_the_bill_uses_the_presets_card(capsys):
    from lite_verl.tools.auto import priced_as_another_card

    h200 = machine(1, "NVIDIA H200", 139.8)
    notes = priced_as_another_card(load_config("4090x1"), h200)
    assert notes == [
        "lite-verl: cost.gpu_models[0] is 'RTX 4090' but GPU 0 is 'NVIDIA H200': the bill prices it as "
        "'RTX 4090'; set cost.gpu_models (and cost.price_per_hour) or use --preset auto"
    ]
    assert priced_as_another_card(load_config("4090x1"), RTX4090x1) == []  # the card it names
    assert (
        priced_as_another_card(
            load_config("4090x1", None, ["cost.gpu_models=[H200]", "cost.price_per_hour.H200=3.5"]), h200
        )
        == []
    )
    check_topology(load_config("4090x1", None, ["trainer.plan_check=false"]), QWEN_1_5B, h200)
    assert "prices it as 'RTX 4090'" in capsys.readouterr().err  # said, and the run goes ahead


def test_preset_names_and_errors_mention_auto():
    from lite_verl.config.presets import preset_path

    with pytest.raises(ConfigError, match="did you mean 'auto'.*available: auto, "):
        preset_path("atuo")
    with pytest.raises(ConfigError, match="preset 'auto' is chosen from this machine's GPUs"):
        load_config("auto")  # export-verl, k8s: the target machine is not this one


def test_plan_command_with_auto_on_a_cpu_machine(capsys, monkeypatch):
    import torch

    from lite_verl.cli import main

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert main(["plan", "--preset", "auto", "--model-shape", "1.5b"]) == 0
    out = capsys.readouterr().out
    assert "auto: no CUDA GPU detected -> preset laptop" in out and "no GPU in this config" in out


def test_plan_command_with_auto_on_a_fake_4090(capsys, monkeypatch):
    from lite_verl.cli import main
    from lite_verl.tools import auto

    monkeypatch.setattr(auto, "detect", lambda: RTX4090x1)
    assert main(["plan", "--preset", "auto", "--model-shape", "7b", "--set", "train.micro_batch_size=4"]) == 0
    out = capsys.readouterr().out
    assert "auto: chose train.backend=qlora, rollout.quantization=awq" in out and "micro_batch_size=4" in out
    assert "GPU 0 (RTX 4090, 24 GiB, 95% usable): predicted peak" in out and "-- fits" in out
    assert main(["plan", "--preset", "auto", "--model-shape", "9b"]) == 2
    assert "--model-shape 9b: give one of 0.5b, 1.5b" in capsys.readouterr().err


def test_plan_command_shows_the_grown_micro_batch(capsys, monkeypatch):
    """`lite-verl plan` decides train.grow_micro_batch as `train` would: the size it shows is the grown one."""
    from lite_verl.cli import main
    from lite_verl.tools import auto, plan

    monkeypatch.setattr(auto, "detect", lambda: RTX4090x1)
    monkeypatch.setattr(plan, "host_total_gib", lambda: 64.0)
    sets = ["--set", "rollout.quantization=none"]
    fixed = ["--set", "train.grow_micro_batch=false", "--set", "train.gradient_checkpointing=true"]
    assert main(["plan", "--preset", "4090x1", "--model-shape", "1.5b", *sets, *fixed]) == 0
    assert "train: micro_batch_size 8," in capsys.readouterr().out
    assert main(["plan", "--preset", "4090x1", "--model-shape", "1.5b", *sets]) == 0  # the preset grows it
    out = capsys.readouterr().out
    assert "train: micro_batch_size 64, gradient checkpointing on" in out and "-- fits" in out


def test_auto_with_grow_micro_batch_lets_the_plan_choose_checkpointing_for_more_rows(monkeypatch):
    """--preset auto drops checkpointing as soon as a run fits; with train.grow_micro_batch the choice goes
    back to the plan (auto), which may keep it for a larger micro-batch."""
    from lite_verl.tools import auto, plan

    monkeypatch.setattr(plan, "host_total_gib", lambda: 64.0)
    choice = auto.choose(RTX4090x1, None, ["train.grow_micro_batch=true"], QWEN_1_5B)
    assert choice.cfg.train.gradient_checkpointing == "auto"
    decided = plan.decide_memory_knobs(choice.cfg, QWEN_1_5B, auto.card_sizes(RTX4090x1))
    assert decided.train.micro_batch_size > choice.cfg.train.micro_batch_size


def test_a_preset_for_another_card_is_planned_on_the_card_this_machine_has():
    """vLLM's gpu_memory_utilization is a share of the card it finds, so the plan sizes the detected card, not
    the one cost.gpu_models names: the 4090x1 preset on an 80 GiB card gives vLLM 0.35 of 80 GiB (a run's
    check sized a 24 GiB card and refused a vLLM budget scaled to an H100, 2026-12-07), and on a 16 GiB card
    0.35 of 16. `lite-verl plan --preset 4090x1` without detection still plans the named card."""
    from lite_verl.tools.auto import card_sizes

    cfg = load_config("4090x1", None, ["rollout.quantization=none"])
    util = cfg.rollout.gpu_memory_utilization
    named = planner.plan(cfg, QWEN_1_5B)[0]
    assert named.card_gib == 24.0 and named.parts["vLLM (gpu_memory_utilization)"] == pytest.approx(util * 24)
    for total in (79.1, 15.6):
        p = planner.plan(cfg, QWEN_1_5B, card_sizes(machine(1, "NVIDIA H100 80GB HBM3", total)))[0]
        assert p.model == "RTX 4090" and p.card_gib == total  # priced as named, sized as found
        assert p.parts["vLLM (gpu_memory_utilization)"] == pytest.approx(util * total)
