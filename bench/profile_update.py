"""Benchmark: where the LoRA update's time goes, one GRPO update on a fixed random batch.

    python -m bench.profile_update [--size 1.5b] [--rows 256] [--prompt 128] [--response 256]
                                   [--variants fused,plain,bf16_head,no_ckpt] [--trace DIR] [--model DIR]

The trainer exactly as `lite-verl train --preset 4090x1` builds it (train/rank.build_rank_backend), at 8
rows per forward/backward with checkpointing (the preset's sizes until 2026-12-07; it grows them since, as the
`grown` variant does), fed one step's batch of random tokens, and `update.run_update`
timed after a warm-up. Variants change one thing each:
  fused      the default: log-probs and entropy from the hidden states (train/head.fused_log_probs)
  plain      materialised logits (the head as the model runs it, then log-softmax)
  bf16_head  the fused path with the head's product in the model's dtype (model.fp32_lm_head=false)
  exact_fp32 the fused path with the fp32 head on fp32 cores (no tensor cores: the 1bbebdb code)
  micro32    the default at 32 sequences per forward/backward instead of the preset's 8
  fp32_adapters the default with the LoRA adapters computing in fp32 (no autocast: the code before 2026-12-05)
  peft_casts the default with peft's input casts: each adapter's bf16 input copied to fp32 and back under
             autocast (the code from 2026-12-05 to train/lora.keep_input_dtype, 2026-12-07)
  no_ckpt    the default without gradient checkpointing
  liger      train.use_liger=true: Liger's Triton RMSNorm, SwiGLU and RoPE (liger-kernel, staged by gpu_stage.sh)
  grown      train.grow_micro_batch=true with gradient_checkpointing=auto, decided by the plan for a 24 GiB card
             as `lite-verl train` decides them (the micro-batch and checkpointing it chose are printed)
On a GPU every variant also records the plan's prediction of the trainer's peak allocation (plan_alloc_gib,
what torch.cuda.max_memory_allocated measures as peak_gib): #29 goal 4. The config's lengths and batch are
the batch's (data.max_prompt_length, rollout.max_new_tokens, trainer.batch_size), so packing and plan see it.
Each variant prints its time and trained tokens/s, and the top operators of one profiled update (by
device time on a GPU, CPU time on a CPU). A Qwen2.5-{size} shape with random weights on a GPU;
lite-verl's tiny Qwen2 on a CPU.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

from bench.gpu_models import bench_model
from bench.results import REPORT, append, render

VARIANTS = {
    "fused": [],
    "plain": [],
    "bf16_head": ["model.fp32_lm_head=false"],
    "exact_fp32": [],
    "micro32": ["train.micro_batch_size=32"],
    "no_ckpt": ["train.gradient_checkpointing=false"],
    "fp32_adapters": [],
    "peft_casts": [],
    "grown": ["train.grow_micro_batch=true", "train.gradient_checkpointing=auto"],
    "liger": ["train.use_liger=true"],
    "liger_no_ckpt": ["train.use_liger=true", "train.gradient_checkpointing=false"],
    "bf16": ["model.dtype=bfloat16"],
}


def fake_batch(rows: int, prompt: int, response: int, vocab: int, n: int, seed: int):
    """One step's rollout of random tokens: full-length prompts and responses, a spread of rewards."""
    from lite_verl.batch import RolloutBatch, UpdateBatch

    g = torch.Generator().manual_seed(seed)
    rollout = RolloutBatch(
        prompt_ids=torch.randint(3, vocab, (rows, prompt), generator=g),
        prompt_mask=torch.ones(rows, prompt, dtype=torch.long),
        response_ids=torch.randint(3, vocab, (rows, response), generator=g),
        response_mask=torch.ones(rows, response, dtype=torch.long),
        rollout_log_probs=-torch.rand(rows, response, generator=g) * 5,
    )
    scores = torch.rand(rows, generator=g)
    return UpdateBatch(rollout, scores, torch.arange(rows // n).repeat_interleave(n), None, 1)


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def measure(variant: str, model_dir: Path, args) -> dict[str, float]:
    from lite_verl.config import load_config
    from lite_verl.tools.plan import decide_memory_knobs, plan, shape_of
    from lite_verl.train.rank import build_rank_backend
    from lite_verl.update import MicroBatchSize, make_kl_controller, run_update

    gpu = torch.cuda.is_available()
    sets = [
        f"model.path={model_dir}",
        "algorithm.use_kl_loss=false",
        "rollout.quantization=none",
        f"data.max_prompt_length={args.prompt}",
        f"rollout.max_new_tokens={args.response}",
        f"trainer.batch_size={args.rows // 8}",
        "rollout.n=8",
        # the preset's sizes until 2026-12-07 (8 rows, checkpointing); it grows them since: `grown`
        "train.grow_micro_batch=false",
        "train.gradient_checkpointing=true",
        *VARIANTS[variant],
    ]
    if args.micro and variant != "micro32":
        sets.append(f"train.micro_batch_size={args.micro}")
    cfg = load_config("4090x1" if gpu else "laptop", None, sets).with_auto_resolved()
    shape = shape_of(model_dir)
    cfg = decide_memory_knobs(cfg, shape)  # grown: as train decides it (a 24 GiB card on a GPU)
    print(f"{variant}: micro_batch_size {cfg.train.micro_batch_size}, "
          f"checkpointing {cfg.train.gradient_checkpointing}", flush=True)  # fmt: skip
    device = torch.device("cuda:0" if gpu else "cpu")
    backend = build_rank_backend(cfg, model_dir, device, 1)
    if variant == "plain":
        backend.fused_head = False
    if variant in ("fp32_adapters", "peft_casts"):
        from lite_verl.train.lora import keep_input_dtype

        keep_input_dtype(backend.model, False)  # peft casts each adapter's input to fp32 again
    if variant == "fp32_adapters":
        backend.compute_dtype = None  # peft's own fp32 adapter maths, as before train/lora.py's autocast
    from lite_verl.train import head

    head.EXACT_FP32 = variant == "exact_fp32"
    vocab = min(backend.model.get_base_model().get_output_embeddings().weight.shape[0], args.max_token_id)
    batch = fake_batch(args.rows, args.prompt, args.response, vocab, cfg.rollout.n, 0)
    kl = make_kl_controller(cfg.algorithm)
    micro = MicroBatchSize.of(cfg)  # as the trainer builds it: packed unless train.pack_micro_batches=false
    run_update(backend, batch, cfg, kl, micro)  # warm-up
    sync()
    if gpu:
        torch.cuda.reset_peak_memory_stats(device)
    times = []
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        run_update(backend, batch, cfg, kl, micro)
        sync()
        times.append(time.perf_counter() - t0)
    out = {
        "update_s": min(times),
        "trained_tokens_per_s": args.rows * (args.prompt + args.response) / min(times),
    }
    if gpu:
        out["peak_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
        out["plan_alloc_gib"] = plan(cfg, shape)[0].train_alloc_gib
        out["micro_batch_size"] = float(cfg.train.micro_batch_size)
    print(f"{variant}: " + ", ".join(f"{k} {v:.3f}" for k, v in out.items()), flush=True)
    if args.profile:
        profiled(variant, backend, batch, cfg, kl, micro, gpu, args)
    del backend
    if gpu:
        torch.cuda.empty_cache()
    return out


def profiled(variant, backend, batch, cfg, kl, micro, gpu: bool, args) -> None:
    """One more update under torch.profiler: its top operators (minutes of host time for a host-bound
    update's ~100k events, hence optional) and, with --trace, its chrome trace."""
    from torch.profiler import ProfilerActivity, profile

    from lite_verl.update import run_update

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if gpu else [])
    with profile(activities=acts) as prof:
        run_update(backend, batch, cfg, kl, micro)
        sync()
    key = "self_cuda_time_total" if gpu else "self_cpu_time_total"
    print(f"--- {variant}: top operators by {key}", flush=True)
    print(prof.key_averages().table(sort_by=key, row_limit=18, max_name_column_width=60), flush=True)
    if args.trace:
        args.trace.mkdir(parents=True, exist_ok=True)
        prof.export_chrome_trace(str(args.trace / f"{variant}.json"))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", default="1.5b")
    ap.add_argument("--rows", type=int, default=256)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--response", type=int, default=256)
    ap.add_argument("--micro", type=int, default=0, help="train.micro_batch_size (0: the preset's)")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--max-token-id", type=int, default=512, help="random tokens below this id")
    ap.add_argument("--variants", default="fused,exact_fp32,micro32,plain,bf16_head,no_ckpt")
    ap.add_argument("--profile", action="store_true", help="also profile one update per variant (slow)")
    ap.add_argument("--trace", type=Path, help="write each variant's chrome trace here")
    ap.add_argument("--root", default="/tmp/models")
    ap.add_argument("--model", default="", help="a model directory instead of the --size shape / tiny model")
    args = ap.parse_args()
    if args.model:  # a real model's directory (e.g. SmolLM2 on the CPU, the laptop journey's update)
        model_dir, label = Path(args.model), f"{Path(args.model).name} (real weights)"
    else:
        model_dir, label = bench_model(args.size, Path(args.root))
    cmd = " ".join(["python -m bench.profile_update", *sys.argv[1:]])
    for variant in args.variants.split(","):
        r = measure(variant, model_dir, args)
        settings = (
            f"{variant}: one GRPO update (LoRA, preset {'4090x1' if torch.cuda.is_available() else 'laptop'}), "
            f"{args.rows} rows x ({args.prompt} prompt + {args.response} response) random tokens, no KL"
        )
        units = {"update_s": "s", "trained_tokens_per_s": "token/s", "peak_gib": "GiB", "plan_alloc_gib": "GiB",
                 "micro_batch_size": "rows"}  # fmt: skip
        for metric, value in r.items():
            append("profile_update", label, settings, metric, value, units[metric], cmd)
    REPORT.write_text(render())


if __name__ == "__main__":
    main()
