"""What one training rank builds: its device and its backend. The controller (train/factory.py) and every
follower (train/follower.py) call `build_rank_backend` in the same order, so the collectives inside
(FSDP2 / ZeRO-3 setup, the LoRA broadcast) pair up.

  train.backend=lora, qlora   train/lora.py   build_lora_backend
  train.backend=fsdp          train/fsdp.py   build_fsdp_backend
  train.backend=deepspeed     train/zero3.py  build_zero3_backend

Each backend module is imported only when the config asks for it (ZeRO-3 needs DeepSpeed).
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from lite_verl.config import Config, TrainConfig
from lite_verl.train.base import TrainBackend
from lite_verl.train.full import FullBackend


def rank_device(train: TrainConfig, rank: int) -> torch.device:
    """train.gpus[rank], or the CPU."""
    from lite_verl.device import role_device

    return role_device(train.gpus[rank : rank + 1])


def build_rank_backend(cfg: Config, model_dir: Path, device: torch.device, world: int) -> TrainBackend:
    """The training backend of one rank of `world` on `device`, with its memory cap set and, for
    algorithm.adv_estimator=gae, its critic. LoRA replicas start equal: rank 0's values are broadcast."""
    from lite_verl.device import cap_memory, page_granular_allocator, safe_attention_backward

    if cfg.park_before_sync:  # parked, the trainer hands every page back to a colocated vLLM
        page_granular_allocator(device)
    cap_memory(device, cfg.train.max_memory_gib)
    safe_attention_backward(device)
    # a diagnosis (README "Numerical and memory faults"): the first backward op that makes a NaN raises,
    # naming itself and the forward line that made it; every rank, since each runs its own backward
    if os.environ.get("LITE_VERL_DETECT_ANOMALY"):
        torch.autograd.set_detect_anomaly(True, check_nan=True)
    if not cfg.train.full_finetune:  # lora, qlora
        from lite_verl.train.dist import broadcast_parameters
        from lite_verl.train.lora import build_lora_backend

        lora = build_lora_backend(cfg, model_dir, device)
        if cfg.algorithm.adv_estimator == "gae":
            lora.enable_critic(cfg.critic)
        if world > 1:  # replicas equal whatever each RNG held
            broadcast_parameters(lora.params + lora.critic_params)
        return lora
    full = build_full_backend(cfg, model_dir, device)
    if cfg.algorithm.adv_estimator == "gae":
        full.enable_critic(
            cfg.critic
        )  # ConfigError: full fine-tuning has no critic (validation says so first)
    return full


def build_full_backend(cfg: Config, model_dir: Path, device: torch.device) -> FullBackend:
    """train.backend=fsdp or deepspeed on `device`, over the process group of train/dist.py."""
    if cfg.train.backend == "deepspeed":
        from lite_verl.train.zero3 import build_zero3_backend

        return build_zero3_backend(cfg, model_dir, device)
    from lite_verl.train.fsdp import build_fsdp_backend

    return build_fsdp_backend(cfg, model_dir, device)
