"""Benchmark (#29 goal 3): what a parked trainer process still holds on the card while vLLM generates.

    python -m bench.park_footprint [--size 0.5b] [--rows 8] [--tokens 384] [--nf4]

train.offload_during_rollout parks the trainer's tensors in host memory (lite_verl/train/park.py), but the
process stays: its CUDA context, the kernels it loaded (cuBLAS, bitsandbytes, attention) and whatever the
caching allocator keeps. The plan counts plan.OVERHEAD_GIB for it beside vLLM's rollout (0.5 until this
bench measured 0.75 on an H100, 2026-12-08; the 7B lean run had measured 10.77 GiB device-wide against 10.0
planned). This process loads a random
Qwen2.5-shaped model as a run does (lite_verl.model.load, QLoRA's 4-bit base with --nf4), adds a LoRA adapter
and AdamW, runs one forward/backward/step of rows x tokens and parks, measuring the card's used memory
(nvidia-smi, device-wide: the only process on it) before CUDA starts, with the bare context, after the step
and parked. Rows: parked_process_gib (what vLLM cannot have), context_gib and parked_reserved_gib (torch's
cache after the park: near 0 if the park hands everything back).
On the bare GPU machine it needs only bitsandbytes beside what is there: `pip download --no-deps -d .stage/bnb
bitsandbytes==0.50.2` here (41 MiB), carry [".stage/bnb"], `pip install --no-deps --no-index --target /tmp/site
.stage/bnb/*.whl` there, PYTHONPATH=/tmp/site:$PWD.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from bench.gpu_models import built_model
from bench.results import append, render
from bench.train_run import gpu0_memory_gib


def measure(model_dir: Path, rows: int, tokens: int, nf4: bool) -> dict[str, float]:
    import torch
    from peft import LoraConfig, get_peft_model

    from lite_verl.config import load_config
    from lite_verl.device import page_granular_allocator
    from lite_verl.model.load import load_model
    from lite_verl.train.park import HostPark

    base = gpu0_memory_gib("used")
    device = torch.device("cuda", 0)
    torch.zeros(1, device=device)
    torch.cuda.synchronize()
    context = gpu0_memory_gib("used") - base
    page_granular_allocator(device)  # as build_rank_backend does for an offloaded adapter-synced trainer
    model = load_model(model_dir, load_config("4090x1").model, device, nf4=nf4)
    model = get_peft_model(model, LoraConfig(r=16, target_modules="all-linear"))
    model.gradient_checkpointing_enable()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    ids = torch.randint(0, 1000, (rows, tokens), device=device)
    model(ids).logits.float().mean().backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    del ids
    torch.cuda.synchronize()
    trained = gpu0_memory_gib("used") - base
    HostPark(device).park([model], [opt])
    return {"context_gib": context, "trained_process_gib": trained, "parked_process_gib": gpu0_memory_gib("used") - base,
            "parked_reserved_gib": torch.cuda.memory_reserved(device) / 2**30}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="0.5b", help="the Qwen2.5 shape (random weights, bench/gpu_models.py)")
    ap.add_argument(
        "--rows", type=int, default=8, help="rows of the one forward/backward (the lean preset's 8)"
    )
    ap.add_argument("--tokens", type=int, default=384, help="tokens per row (128 prompt + 256 new)")
    ap.add_argument("--nf4", action="store_true", help="QLoRA's 4-bit base (bitsandbytes)")
    ap.add_argument("--root", type=Path, default=Path("/tmp/lite-verl-bench-models"))
    args = ap.parse_args()
    model, _ = built_model(args.size, args.root)
    out = measure(model, args.rows, args.tokens, args.nf4)
    print({k: round(v, 3) for k, v in out.items()}, flush=True)
    command = "python -m bench.park_footprint " + " ".join(sys.argv[1:])
    settings = (f"{'QLoRA (nf4 base)' if args.nf4 else 'LoRA (bf16 base)'} r16 + AdamW, one forward/backward/step of "
                f"{args.rows} x {args.tokens} tokens with checkpointing, then HostPark; device-wide used memory "
                "(nvidia-smi) minus the card's before CUDA started")  # fmt: skip
    for metric, value in out.items():
        append(
            "park_footprint",
            f"Qwen2.5-{args.size} shape (random, bf16)",
            settings,
            metric,
            value,
            "GiB",
            command,
        )
    render()


if __name__ == "__main__":
    main()
