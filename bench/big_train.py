"""Benchmark (issue #10): GRPO steps of big models with the trainer capped at a 24 GB card's memory,
measured peak vs `lite-verl plan`'s prediction.

    python -m bench.big_train [--variants qlora:7b,fsdp:3b,fsdp:7b,fsdp16:7b] [--steps 3] [--cap 24]

Each variant runs `lite-verl train` (4090x1 preset) on a random Qwen2.5-shaped model (bench/gpu_models.py)
with `train.max_memory_gib=CAP`: the trainer process may allocate no more than a 24 GB card holds. The vLLM
worker (bf16, LoRA adapters or merged weights) runs beside it on the same GPU (`rollout.colocate=false`)
with its own budget, so the cap applies to the trainer alone. Prompts are the built-in task's 16 tokens
and the random model never stops early, so every sequence is 16 + max_new_tokens long and the plan's
token count is exact. Figures per variant: the trainer's peak allocated memory over the run
(torch.cuda.max_memory_allocated, summary.json train_peak_gib), the plan's prediction of it
(GpuPlan.train_alloc_gib: weights, trainable state, activations, the LM head's working set; no CUDA context), the
relative error, and the median step time. A variant the plan refuses (for instance fsdp at 7B, whose
offloaded fp32 state and KL reference need ~128 GiB of host memory) is recorded as refused with the plan's reason;
fsdp16 is fsdp with AdamW's moments in bf16 (train.optimizer_state_dtype=bfloat16: 12 bytes per
parameter on the host instead of 16) and no KL (no reference copy on the host), which bring a 7B
within a 128 GB machine. host_peak_gib is the trainer process's peak RSS against the plan's host total.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
from pathlib import Path

from bench.gpu_models import make_model
from bench.results import REPORT, append, render
from bench.train_run import MEMORY_UNITS, PeakGpuMemory, memory_figures, train_run

BACKEND_SETS = {
    "qlora": ["train.backend=qlora", "sync.mode=adapter"],
    "lora": ["train.backend=lora", "sync.mode=adapter"],
    "fsdp": ["train.backend=fsdp", "train.offload_params=true", "train.offload_optimizer=true", "sync.mode=merged"],
    "fsdp16": ["train.backend=fsdp", "train.offload_params=true", "train.offload_optimizer=true", "sync.mode=merged",
               "train.optimizer_state_dtype=bfloat16", "algorithm.use_kl_loss=false"],
    "deepspeed": ["train.backend=deepspeed", "train.offload_params=true", "train.offload_optimizer=true",
                  "sync.mode=merged"],
}  # fmt: skip


def run_sets(model: Path, backend: str, args: argparse.Namespace) -> list[str]:
    return [
        f"model.path={model}", *BACKEND_SETS[backend], f"train.max_memory_gib={args.cap}",
        "rollout.quantization=none", "rollout.colocate=false", "rollout.gpu_memory_utilization=0.3",
        "rollout.enforce_eager=true", f"rollout.max_new_tokens={args.new_tokens}", "data.max_prompt_length=16",
        f"trainer.batch_size={args.batch}", "rollout.n=8", f"train.micro_batch_size={args.micro}",
        "train.gradient_checkpointing=true", "train.lr=1e-5", f"trainer.total_steps={args.steps}",
        "data.val_size=0", "trainer.plan_check=false", "cost.gpu_models=[RTX 4090]", "trainer.keep_checkpoints=0",
    ]  # fmt: skip


def predicted(sets: list[str], model: Path) -> tuple[float, str, float]:
    """(the plan's trainer allocation in GiB, the plan's host-memory refusal or '', the plan's host memory
    in GiB). The GPU side is not checked here: a 24 GB card with vLLM beside the trainer is not this
    layout, the cap is."""
    from lite_verl.config import load_config
    from lite_verl.tools.plan import host_gib, host_refusal, plan, shape_of

    cfg = load_config("4090x1", None, sets)
    shape = shape_of(model)
    host = host_gib(cfg, shape)
    return plan(cfg, shape)[0].train_alloc_gib, host_refusal(cfg, shape), host


def run_variant(backend: str, size: str, args: argparse.Namespace, cmd: str) -> None:
    model = make_model(size, Path(args.root))
    sets = run_sets(model, backend, args)
    plan_gib, refused, plan_host = predicted(sets, model)
    label = f"Qwen2.5-{size} shape (random, bf16)"
    settings = (f"{BACKEND_SETS[backend][0]} ({' '.join(BACKEND_SETS[backend][1:])}), trainer capped at "
                f"train.max_memory_gib={args.cap}, batch {args.batch}x8, micro-batch {args.micro}, 16 + "
                f"{args.new_tokens} tokens, gradient checkpointing, vLLM bf16 beside it on the same GPU")  # fmt: skip
    append("big_train", label, settings, "plan_train_alloc_gib", plan_gib, "GiB", cmd)
    if refused:
        print(f"{backend}:{size}: the plan refuses it: {refused}", flush=True)
        append(
            "big_train", label, settings + f"; REFUSED by the plan: {refused}", "refused", 1.0, "bool", cmd
        )
        return
    run_dir = Path(args.out) / f"{backend}-{size}"
    with PeakGpuMemory() as mem:
        train, _, summary, wall = train_run("4090x1", run_dir, sets)
    peak = float(summary.get("train_peak_gib") or 0.0)
    micro = min(r.get("train/micro_batch_size", args.micro) for r in train)
    if micro != args.micro:
        settings += f" (OOM under the cap: micro-batch fell to {micro:g})"
    figures = {
        "train_peak_gib": (peak, "GiB"),
        "host_peak_gib": (float(summary.get("host_peak_gib") or 0.0), "GiB"),
        "plan_host_gib": (plan_host, "GiB"),
        "plan_error_pct": (100 * (plan_gib - peak) / peak if peak else float("nan"), "%"),
        "step_time_median_s": (statistics.median(r["timing/step_s"] for r in train), "s"),
        "update_time_median_s": (statistics.median(r["timing/update_s"] for r in train), "s"),
        # parts of the update: the no-grad forwards (reference), and clipping + AdamW (on the host when offloaded)
        **{
            f"{part}_time_median_s": (statistics.median(r.get(f"timing/{part}_s", 0.0) for r in train), "s")
            for part in ("experience", "optimizer")
        },
        "process_wall_s": (wall, "s"),
        # device-wide, vLLM included (the figures above are the trainer's own, against its cap)
        **{m: (v, MEMORY_UNITS[m]) for m, v in memory_figures(run_dir, mem).items()},
    }
    for metric, (value, unit) in figures.items():
        append("big_train", label, settings, metric, value, unit, cmd)
    print(f"{backend}:{size}: plan {plan_gib:.2f} GiB, measured {peak:.2f} GiB, "
          + ", ".join(f"{m} {v:.2f}" for m, (v, _) in figures.items()), flush=True)  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--variants", default="qlora:7b,fsdp:3b,fsdp:7b", help="backend:size, comma-separated")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--cap", type=float, default=24.0, help="train.max_memory_gib (GiB)")
    ap.add_argument("--batch", type=int, default=8, help="prompts per step (x8 samples)")
    ap.add_argument("--micro", type=int, default=8)
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--root", default="/tmp/models")
    ap.add_argument("--out", default="/tmp/lite-verl-big")
    args = ap.parse_args()
    import torch

    if not torch.cuda.is_available():
        raise SystemExit("bench/big_train.py measures GPU memory: run it on a CUDA machine")
    cmd = f"python -m bench.big_train --variants {args.variants} --steps {args.steps} --cap {args.cap:g}"
    for variant in args.variants.split(","):
        backend, size = variant.split(":")
        try:
            run_variant(backend, size, args, cmd)
        except SystemExit as e:  # one failed variant (its stderr is printed) does not stop the others
            print(f"{variant}: {e}", flush=True)
            subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv"], check=False)
    REPORT.write_text(render())


if __name__ == "__main__":
    main()
