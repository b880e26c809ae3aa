"""train.backend=deepspeed: full fine-tuning partitioned by ZeRO-3 (deepspeed.initialize), with optional
CPU offload of the weights (train.offload_params) and of the optimizer (train.offload_optimizer).

`build_zero3_backend` makes the backend: the model of train/full.py, partitioned by `ZeroSharding`,
inside a `FullBackend`; the frozen KL reference is partitioned the same way when it is first needed.

DeepSpeed is imported only here: pip install 'lite-verl[deepspeed]'. Without a GPU it runs on its CPU
accelerator (gloo), compiling two small C++ ops the first time it runs (a C++ compiler is needed; they are
cached under ~/.cache/torch_extensions): a shared-memory collective, and with offload_optimizer its CPU
Adam. Micro-batching stays lite-verl's (update.py): DeepSpeed sees one micro-batch per sample and one
accumulation step; gradients of several backward() calls add up until step(), which is the boundary.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from lite_verl.config import Config
from lite_verl.device import OFFLOAD_PAGEABLE, pin_host_memory
from lite_verl.errors import ConfigError, MissingDependency
from lite_verl.train.dist import ensure_process_group
from lite_verl.train.full import FullBackend, gathered_modules, load_full_model, save_weights

TAG = "state"  # DeepSpeed's checkpoint tag inside RUN/checkpoints/step_N/deepspeed/


def build_zero3_backend(cfg: Config, model_dir: Path, device: torch.device) -> FullBackend:
    """train.backend=deepspeed on `device` (this rank's, train/rank.rank_device), over the process group
    of train/dist.py (joined, or a one-process group started)."""
    _, world = ensure_process_group(device)
    model = load_full_model(cfg, model_dir, "float32")  # fp32 masters; compute in model.dtype
    zero = ZeroSharding(model, cfg, device, model_dir)
    return FullBackend(zero, cfg.train, device, lambda: zero_reference(cfg, model_dir, device), world)


def require_deepspeed(on_gpu: bool):
    if importlib.util.find_spec("deepspeed") is None:
        raise MissingDependency("deepspeed", "deepspeed", "train.backend=deepspeed")
    # deepspeed.initialize insists on LOCAL_RANK, which a launcher sets; one process is local rank 0
    # (also vLLM's default, so rollout workers inheriting it see no change)
    os.environ.setdefault("LOCAL_RANK", "0")
    # name the accelerator rather than have DeepSpeed guess it and warn
    os.environ.setdefault("DS_ACCELERATOR", "cuda" if on_gpu else "cpu")
    # torch deprecated collectives DeepSpeed still calls, warned at every step: nothing a user can act on
    warnings.filterwarnings("ignore", r"`torch\.distributed\.\w+` is deprecated", FutureWarning)
    import deepspeed

    deepspeed.utils.logger.setLevel(logging.WARNING)
    return deepspeed


def deepspeed_config(cfg: Config, optimizer: bool = True) -> dict[str, Any]:
    """The DeepSpeed config for lite-verl's settings. optimizer=False: a frozen model (the reference)."""
    t = cfg.train
    offload = t.offload_params or t.offload_optimizer
    pin = bool(t.gpus) and offload and pin_host_memory(OFFLOAD_PAGEABLE)
    zero: dict[str, Any] = {"stage": 3}
    if t.offload_params:
        zero["offload_param"] = {"device": "cpu", "pin_memory": pin}
    if optimizer and t.offload_optimizer:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": pin}
    ds: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": 1,  # batches are split by update.py; DeepSpeed only counts
        "gradient_accumulation_steps": 1,
        "zero_optimization": zero,
        "bf16": {"enabled": cfg.model.dtype == "bfloat16"},  # fp32 masters live in the optimizer
        "fp16": {"enabled": cfg.model.dtype == "float16"},  # with DeepSpeed's dynamic loss scaling
        "steps_per_print": 2**31 - 1,
        "wall_clock_breakdown": False,
    }
    if optimizer:
        ds["gradient_clipping"] = t.grad_clip if t.grad_clip > 0 else 0.0
        # torch's AdamW on the device; DeepSpeed's CPU Adam (the same update) when the optimizer is offloaded
        ds["optimizer"] = {"type": "AdamW", "params": {"lr": t.lr, "weight_decay": t.weight_decay,
                           "betas": [0.9, 0.999], "eps": 1e-8, "torch_adam": not t.offload_optimizer}}  # fmt: skip
    return ds


class ZeroSharding:
    """ZeRO-3: weights, gradients and optimizer state partitioned over the ranks by a DeepSpeed engine."""

    def __init__(self, model: torch.nn.Module, cfg: Config, device: torch.device, model_dir: Path) -> None:
        import torch.distributed as dist

        deepspeed = require_deepspeed(device.type == "cuda")
        params = [p for p in model.parameters() if p.requires_grad]
        self.engine, *_ = deepspeed.initialize(
            args=device_args(device), model=model, model_parameters=params, config=deepspeed_config(cfg)
        )
        self.model = self.engine.module
        self.forward_module = self.engine  # its forward keeps DeepSpeed's micro-step bookkeeping
        self.optimizer = self.engine.optimizer  # DeepSpeed's wrapper; its param_groups are the optimizer's
        self.model_dir = model_dir
        self.rank = dist.get_rank()

    def backward(self, loss: torch.Tensor) -> None:
        self.engine.backward(loss)

    def step(self, max_norm: float) -> float:
        """The optimizer step (clipping at train.grad_clip is in the engine's config); the pre-clip norm."""
        self.engine.step()
        norm = self.engine.get_global_grad_norm()
        return float(norm) if norm is not None else float("nan")

    def zero_grad(self) -> None:
        self.engine.zero_grad()

    def settle(self, module: torch.nn.Module | None = None) -> None:
        pass  # ZeRO-3 partitions weights again after every forward

    @contextmanager
    def gathered(self, module: torch.nn.Module):
        """Copies of the module's own weights, gathered whole (they are partitioned again after)."""
        import deepspeed

        params = dict(module.named_parameters(recurse=False))
        with deepspeed.zero.GatheredParameters(list(params.values())):
            full = {n: p.data.detach().clone() for n, p in params.items()}
        yield full

    def local_bytes(self) -> int:
        return sum(p.ds_tensor.numel() * p.ds_tensor.element_size() for p in self.model.parameters())

    def save(self, directory: Path) -> None:
        """DeepSpeed's own checkpoint (partitioned weights, fp32 masters, optimizer state), plus the full
        weights as a HF model directory (model/) for export."""
        self.engine.save_checkpoint(str(directory / "deepspeed"), tag=TAG)
        weights = {}
        for name, _, full in gathered_modules(self):
            weights.update({f"{name}.{n}" if name else n: t.cpu() for n, t in full.items()})
        if self.rank == 0:
            save_weights(weights, directory / "model", self.model_dir)

    def load(self, directory: Path) -> None:
        if not (directory / "deepspeed" / TAG).is_dir():
            raise ConfigError(
                f"checkpoint {directory} holds no DeepSpeed state (deepspeed/{TAG}): it was not written by "
                "train.backend=deepspeed; resume it with the backend it was trained with"
            )
        self.engine.load_checkpoint(str(directory / "deepspeed"), tag=TAG, load_lr_scheduler_states=False)


def device_args(device: torch.device) -> Any:
    """DeepSpeed puts its engine on cuda:LOCAL_RANK unless args.device_rank names the GPU: this rank's
    train GPU (train.gpus [2, 3] -> 2 and 3). None on the CPU (its accelerator has one device)."""
    from types import SimpleNamespace

    return SimpleNamespace(device_rank=device.index) if device.type == "cuda" else None


def zero_reference(cfg: Config, model_dir: Path, device: torch.device):
    """The frozen initial policy in model.dtype, partitioned by ZeRO-3 (in host memory with
    offload_params); returns the engine, which the reference forward calls."""
    deepspeed = require_deepspeed(bool(cfg.train.gpus))
    model = load_full_model(cfg, model_dir, cfg.model.dtype)
    model.requires_grad_(False)
    model.eval()
    engine, *_ = deepspeed.initialize(
        args=device_args(device), model=model, config=deepspeed_config(cfg, optimizer=False)
    )
    return engine
