"""Benchmark: AWQ 4-bit vs bf16 rollout in vLLM, and the AWQ hybrid engine's syncs.

    python -m bench.awq_rollout --sizes 1.5b,7b            # speed + memory + merged-AWQ sync, random Qwen2.5 shapes
    python -m bench.awq_rollout --gap-model DIR            # AWQ-vs-trainer log-prob gap on a real model (AutoAWQ calibration)

Random-shaped models cannot be calibrated meaningfully, so for speed and memory their AWQ twin is made
by lite-verl's packer with unit scales and no clipping (same tensors, same kernels, same sync work as a
calibrated model; the recipe just holds no scale ops). Per size, colocated on one GPU:
* rollout tokens/s, bf16 vs AWQ (256 prompts x 64 tokens, <= 256 new, T=1, enforce_eager), and the
  engine's weight memory (bytes of the served model's tensors) and the KV cache that fits in the same
  gpu_memory_utilization (0.4 of the H200);
* like for like: bf16 merged vs AWQ merged (no LoRA kernels), bf16 + adapter vs AWQ + adapter, and
  AWQ merged vs AWQ + adapter (on vLLM 0.26 merged AWQ serves the "awq" kernel, elsewhere awq_marlin);
* merged-AWQ sync time: W + s*B@A -> scales -> int4 -> pack -> vLLM in-place reload (target 1.5B <= 1 s).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from bench.gpu_models import make_model
from bench.results import REPORT, append, render

LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def make_awq_twin(src: Path, group: int = 128) -> Path:
    """An AWQ checkpoint of `src` (unit scales, no clip) with an empty lite-verl recipe."""
    import torch
    from safetensors.torch import load_file, save_file

    from lite_verl.quant.awq import AWQRecipe, AWQSettings, quantize_weight

    out = src.parent / (src.name + "-awq")
    if (out / "config.json").is_file():
        return out
    out.mkdir(parents=True, exist_ok=True)
    tensors, quantized = {}, []
    for f in sorted(src.glob("*.safetensors")):
        for name, t in load_file(str(f), device="cuda" if torch.cuda.is_available() else "cpu").items():
            module = name.removesuffix(".weight")
            if name.endswith(".weight") and module.rsplit(".", 1)[-1] in LINEARS:
                q, z, s = quantize_weight(t.half(), group)
                tensors.update({f"{module}.qweight": q, f"{module}.qzeros": z, f"{module}.scales": s})
                quantized.append(module)
            else:
                tensors[name] = t.half()
    save_file({k: v.contiguous().cpu() for k, v in tensors.items()}, str(out / "model.safetensors"))
    config = json.loads((src / "config.json").read_text())
    config["torch_dtype"] = config["dtype"] = "float16"
    config["quantization_config"] = {"quant_method": "awq", "bits": 4, "group_size": group, "zero_point": True,
                                     "version": "gemm", "modules_to_not_convert": None}  # fmt: skip
    (out / "config.json").write_text(json.dumps(config, indent=1))
    for f in src.iterdir():
        if "token" in f.name or f.name in ("generation_config.json", "chat_template.jinja"):
            (out / f.name).write_bytes(f.read_bytes())
    AWQRecipe([], {}, AWQSettings(group_size=group), quantized, "float16").save(out)
    return out


def _cfg(path: Path, extra: list[str]):
    from lite_verl.config import load_config

    return load_config("laptop", None, [
        f"model.path={path}", "model.dtype=bfloat16", "train.gpus=[0]", "rollout.gpus=[0]", "rollout.engine=vllm",
        "rollout.enforce_eager=true", "rollout.gpu_memory_utilization=0.4", "data.max_prompt_length=128",
        "rollout.max_new_tokens=256", "data.task_size=16", "data.val_size=0", "cost.gpu_models=[H200]",
        "cost.price_per_hour={H200: 0.0, cpu: 0.0}", *extra,
    ])  # fmt: skip


def _rollout_tps(engine, prompts) -> float:
    from lite_verl.rollout.base import SamplingSettings

    s = SamplingSettings(n=1, temperature=1.0, max_new_tokens=256)
    engine.generate(prompts[:8], s, seed=0)
    t0 = time.perf_counter()
    out = engine.generate(prompts, s, seed=1)
    return float(out.response_mask.sum()) / (time.perf_counter() - t0)


def bench_size(size: str, root: Path, variants: list[str]) -> None:
    import torch

    from bench.rollout import prompts as make_prompts
    from lite_verl.loop import prepare

    bf16 = make_model(size, root)
    awq = make_awq_twin(bf16)
    ps = make_prompts(256, 64)
    model = f"Qwen2.5-{size} shape (random)"
    cmd = f"python -m bench.awq_rollout --sizes {size}"
    rows = []
    for label, extra in [
        ("bf16", ["sync.mode=merged"]),
        ("bf16_adapter", ["sync.mode=adapter"]),
        ("awq_merged", ["sync.mode=merged", "rollout.quantization=awq", f"rollout.quantized_path={awq}"]),
        ("awq_adapter", ["sync.mode=adapter", "rollout.quantization=awq", f"rollout.quantized_path={awq}"]),
    ]:
        if label not in variants:
            continue
        session = prepare(_cfg(bf16, extra))
        with torch.no_grad():  # a non-zero adapter, as after training
            for n, p in session.backend.model.named_parameters():
                if "lora_B" in n:
                    p.normal_(0, 1e-3)
        engine = session.engine
        syncs = []
        for step in range(1, 5):
            torch.cuda.synchronize()
            syncs.append(engine.sync_weights(step))
        sync_s = statistics.median(syncs[1:])
        tps = _rollout_tps(engine, ps)
        stats = engine.stats()
        mem, kv_tokens = stats["weights_gb"], stats.get("kv_cache_tokens", 0)
        engine.close()
        del session, engine
        torch.cuda.empty_cache()
        settings = f"{label}: colocated 1 GPU, vLLM enforce_eager, 256 prompts x 64 tok, <= 256 new, T=1; LoRA r=16 all linear"
        for metric, value, unit in [("rollout_tokens_per_s", tps, "token/s"), ("engine_weights_gb", mem, "GiB"),
                                    ("kv_cache_tokens", kv_tokens, "tokens"), ("sync_s", sync_s, "s")]:  # fmt: skip
            append("awq_rollout", model, settings, metric, float(value), unit, cmd)
        rows.append((label, tps, mem, sync_s))
        print(
            f"{size} {label}: {tps:.0f} tok/s, vLLM weights {mem:.2f} GiB, KV cache {kv_tokens} tokens, "
            f"sync {sync_s * 1e3:.0f} ms",
            flush=True,
        )
    tps = {label: t for label, t, _, _ in rows}
    for a, b in [("awq_merged", "bf16"), ("awq_adapter", "bf16_adapter"), ("awq_merged", "awq_adapter")]:
        if a in tps and b in tps:
            append("awq_rollout", model, f"{a} over {b}", "speedup", tps[a] / tps[b], "ratio", cmd)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="")
    ap.add_argument(
        "--gap-model", type=Path, help="a real HF model dir: AWQ (calibrated) vs trainer log-prob gap"
    )
    ap.add_argument("--group", type=int, default=64)
    ap.add_argument("--variants", default="bf16,bf16_adapter,awq_merged,awq_adapter")
    ap.add_argument("--modes", default="adapter,merged", help="sync modes for --gap-model")
    ap.add_argument("--root", default="/tmp/models")
    args = ap.parse_args()
    for size in [s for s in args.sizes.split(",") if s]:
        bench_size(size, Path(args.root), args.variants.split(","))
    if args.gap_model:
        from bench.logprob_gap import measure

        cmd = f"python -m bench.awq_rollout --gap-model {args.gap_model.name} --group {args.group}"
        for mode in args.modes.split(","):
            r = measure(args.gap_model, mode, 1e-3, quantized="awq", group=args.group)
            for metric, value in r.items():
                unit = (
                    "nats/token"
                    if "gap" in metric or "moved" in metric
                    else ("s" if metric == "sync_s" else "tokens")
                )
                append("awq_logprob_gap", args.gap_model.name, f"AWQ g{args.group} (AutoAWQ-calibrated on 64 run prompts), "
                       f"sync.mode={mode}, fp16 vLLM vs bf16 trainer, 1 GRPO step lr 1e-3", metric, value, unit, cmd)  # fmt: skip
            print(f"AWQ {mode}: {r}", flush=True)
    REPORT.write_text(render())


if __name__ == "__main__":
    main()
