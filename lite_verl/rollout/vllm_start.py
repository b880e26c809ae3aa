"""How the vLLM worker process is configured and started (rollout/vllm_worker.py runs in it).

`worker_options` turns a run's config into what the worker builds vLLM with (serving dtype and
kernel, memory and LoRA limits); `start_worker` spawns the process with its environment (its GPUs, or
its CPU cores and KV-cache space). The engine (rollout/vllm_engine.py) then waits for its first reply.
"""

from __future__ import annotations

import multiprocessing as mp
import os
from contextlib import contextmanager
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from pathlib import Path

import torch

from lite_verl.config import Config, RolloutConfig
from lite_verl.device import cpu_kv_space, nccl_env, visible_devices_env
from lite_verl.errors import UserError
from lite_verl.rollout.vllm_worker import WorkerOptions, worker_main
from lite_verl.tools.plan import GIB, kv_cache_gib, shape_of, vllm_limits, vllm_need_gib


def worker_options(cfg: Config, model_path: Path, colocated: bool) -> WorkerOptions:
    """What the worker starts vLLM with: the model, its serving dtype and kernel, memory and LoRA limits.
    `colocated`: vLLM shares the trainer's GPUs and sleeps during updates (CUDA only)."""
    r = cfg.rollout
    dtype = "float32" if not r.gpus and cfg.model.dtype == "float16" else cfg.model.dtype  # no fp16 on CPU
    awq_copy = False
    if r.quantization == "awq":
        awq_copy = _awq_copy(cfg.sync.mode, r.gpus)
        _check_cpu_awq(r.gpus)
        dtype = "float16" if r.gpus else "bfloat16"  # AWQ kernels: fp16 (GPU), bf16 (CPU)
    kv_bytes, utilization = _kv_cache(cfg, model_path)
    return WorkerOptions(
        model=str(model_path),
        dtype=dtype,
        gpu_memory_utilization=utilization,
        max_model_len=cfg.full_length,
        max_lora_rank=_lora_rank_slot(cfg.train.lora_rank) if cfg.sync.mode == "adapter" else 0,
        enforce_eager=r.enforce_eager,
        sleep_mode=colocated and torch.cuda.is_available(),
        seed=cfg.trainer.seed,
        quantization=_awq_kernel(r.quantization, bool(r.gpus), awq_copy),
        fp32_lm_head=cfg.model.fp32_lm_head and dtype != "float32",
        tensor_parallel_size=max(len(r.gpus), 1),
        kv_cache_bytes=kv_bytes,
        batch_limits=vllm_limits(cfg) if kv_bytes else (0, 0),
        kv_cache_dtype=r.kv_cache_dtype,
    )


def _kv_cache(cfg: Config, model_path: Path) -> tuple[int, float]:
    """(vLLM's kv_cache_memory_bytes, its gpu_memory_utilization). rollout.kv_cache_gib set: the cache as the
    plan sizes it, and the fraction of the card the plan's vLLM parts add up to (vLLM checks at start that
    this much is free; it reserves the cache without profiling). Unset: (0, rollout.gpu_memory_utilization)."""
    r = cfg.rollout
    if not r.kv_cache_gib or not r.gpus or not torch.cuda.is_available():
        return 0, r.gpu_memory_utilization
    shape = shape_of(model_path)
    card = torch.cuda.get_device_properties(r.gpus[0]).total_memory / GIB
    need = vllm_need_gib(cfg, shape)
    if need > 0.95 * card:
        raise UserError(
            f"rollout.kv_cache_gib: vLLM would need ~{need:.1f} GiB of GPU {r.gpus[0]}'s {card:.0f} GiB; "
            "lower rollout.kv_cache_gib, trainer.batch_size or rollout.max_new_tokens"
        )
    return int(kv_cache_gib(cfg, shape) * GIB), need / card


def _awq_copy(mode: str, gpus: tuple[int, ...]) -> bool:
    """Merged AWQ on a vLLM that cannot re-run awq_marlin's repacking (0.26): serve the "awq" kernel,
    whose layout is the checkpoint's, and copy re-quantized tensors into place (one GPU only)."""
    from lite_verl.rollout.vllm_compat import can_reload_quantized

    awq_copy = mode == "merged" and not can_reload_quantized()
    if awq_copy and len(gpus) != 1:
        import vllm

        raise UserError(
            f"sync.mode=merged with rollout.quantization=awq needs one rollout GPU on vLLM "
            f"{vllm.__version__} (no in-place reload of quantized layers); use sync.mode=adapter, "
            f"rollout.gpus=[one id], or a newer vLLM"
        )
    return awq_copy


def _check_cpu_awq(gpus: tuple[int, ...]) -> None:
    """Refuse AWQ on a CPU whose vLLM build lacks the kernel before the worker starts (else its first
    generate fails deep inside vLLM)."""
    from lite_verl.rollout.vllm_compat import cpu_awq_missing

    why = None if gpus else cpu_awq_missing()
    if why:
        raise UserError(
            f"rollout.quantization=awq with rollout.gpus=[]: {why}; set rollout.quantization=none, "
            f"or give the rollout a GPU (rollout.gpus=[0])"
        )


def _worker_env(rollout: RolloutConfig) -> dict[str, str]:
    """Environment of the worker process: its GPUs (or CPU KV-cache space and cores), vLLM in-process."""
    env = {
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        "VLLM_USE_FLASHINFER_SAMPLER": "0",
        "TOKENIZERS_PARALLELISM": "false",
    }
    if rollout.gpus:
        env.update(visible_devices_env(rollout.gpus))
        env.update(nccl_env(rollout.gpus))  # tensor parallel over cards without peer access
    else:
        env["VLLM_CPU_KVCACHE_SPACE"] = cpu_kv_space()
        if rollout.max_staleness and "VLLM_CPU_OMP_THREADS_BIND" not in os.environ:
            env.update(_split_cpu_cores())  # rollout and update run at once: give each its own cores
    return env


def start_worker(options: WorkerOptions, rollout: RolloutConfig) -> tuple[Connection, BaseProcess]:
    """Spawn the worker process on rollout.gpus (or the CPU); -> (our end of its pipe, the process).
    It answers its first command once vLLM is built."""
    ctx = mp.get_context("spawn")
    conn, child = ctx.Pipe()
    with _env(_worker_env(rollout)):
        proc = ctx.Process(target=worker_main, args=(child, options), daemon=True)
        proc.start()
    child.close()
    return conn, proc


@contextmanager
def _env(values: dict[str, str]):
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _split_cpu_cores() -> dict[str, str]:
    """One-step-off-policy on a CPU: the vLLM worker gets the upper half of this process's cores, the
    trainer the rest (two sets of OpenMP threads on the same cores slow both down several times)."""
    cores = (
        sorted(os.sched_getaffinity(0))
        if hasattr(os, "sched_getaffinity")
        else list(range(os.cpu_count() or 1))
    )
    if len(cores) < 2:
        return {}
    half = len(cores) // 2
    torch.set_num_threads(half)
    return {"VLLM_CPU_OMP_THREADS_BIND": ",".join(str(c) for c in cores[half:])}


def _awq_kernel(quantization: str, gpu: bool, awq_copy: bool) -> str | None:
    """vLLM's quantization argument: awq_marlin on a GPU (fastest), awq where merged sync copies packed
    tensors into place (its layout is the checkpoint's), None on the CPU (from the model's config)."""
    if quantization != "awq" or not gpu:
        return None
    return "awq" if awq_copy else "awq_marlin"


def _lora_rank_slot(rank: int) -> int:
    """vLLM accepts max_lora_rank from a fixed set; the smallest that fits."""
    for slot in (8, 16, 32, 64, 128, 256, 320, 512):
        if rank <= slot:
            return slot
    return rank
