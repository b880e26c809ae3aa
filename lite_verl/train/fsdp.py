"""train.backend=fsdp: full fine-tuning sharded by FSDP2 (torch.distributed.fsdp.fully_shard).

`build_fsdp_backend` makes the backend: the model of train/full.py, sharded by `FSDPSharding`, inside a
`FullBackend`; the frozen KL reference is sharded the same way when it is first needed.

Each decoder layer, then the root (embeddings, final norm, head), is sharded over a 1-D device mesh of
all ranks (gloo on the CPU: FSDP2 runs there for real, one rank or several). fp32 master weights,
computing in model.dtype through MixedPrecisionPolicy (gradients reduce in fp32). train.offload_params
(with train.offload_optimizer; FSDP2 moves them together) is CPUOffloadPolicy: shards, gradients and
AdamW state stay in host memory and the optimizer steps there.
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from pathlib import Path

import torch

from lite_verl.config import Config
from lite_verl.device import OFFLOAD_PAGEABLE, pin_host_memory
from lite_verl.train.dist import ensure_process_group
from lite_verl.train.full import (
    FullBackend,
    check_full_checkpoint,
    decoder_layers,
    load_full_model,
    load_weights,
    save_weights,
)


def build_fsdp_backend(cfg: Config, model_dir: Path, device: torch.device) -> FullBackend:
    """train.backend=fsdp on `device` (this rank's, train/rank.rank_device), over the process group of
    train/dist.py (joined, or a one-process group started)."""
    _, world = ensure_process_group(device)
    model = load_full_model(cfg, model_dir, "float32")  # fp32 masters; compute in model.dtype
    fsdp = FSDPSharding(model, cfg, device, model_dir)
    return FullBackend(fsdp, cfg.train, device, lambda: fsdp_reference(cfg, model_dir, fsdp.mesh), world)


def shard_fsdp(model: torch.nn.Module, mesh, param_dtype: torch.dtype | None, offload: bool) -> None:
    """fully_shard each decoder layer, then the root (embeddings, final norm, head). param_dtype: the
    compute dtype the gathered weights are cast to (gradients reduce in fp32); None: as stored."""
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard

    mp = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32 if param_dtype else None)
    pin = offload and mesh.device_type == "cuda" and pin_host_memory(OFFLOAD_PAGEABLE)
    policy = CPUOffloadPolicy(pin_memory=pin) if offload else OffloadPolicy()
    for layer in decoder_layers(model):
        fully_shard(layer, mesh=mesh, mp_policy=mp, offload_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=mp, offload_policy=policy)


def _full_tensor(p: torch.Tensor) -> torch.Tensor:
    """A sharded parameter (DTensor) gathered whole on the mesh's device; a plain tensor as it is."""
    from torch.distributed.tensor import DTensor

    t = p.detach()
    if not isinstance(t, DTensor):
        return t
    if t.device.type != t.device_mesh.device_type:  # offloaded shards: gather on the device
        t = t.to(t.device_mesh.device_type)
    return t.full_tensor()


class FSDPSharding:
    """train.backend=fsdp: fp32 master weights sharded by FSDP2 over all ranks, computing in model.dtype;
    AdamW over the shards (in host memory with train.offload_params: CPUOffloadPolicy)."""

    def __init__(self, model: torch.nn.Module, cfg: Config, device: torch.device, model_dir: Path) -> None:
        import torch.distributed as dist
        from torch.distributed.device_mesh import init_device_mesh

        from lite_verl.device import torch_dtype

        self.rank = dist.get_rank()
        self.mesh = init_device_mesh(device.type, (dist.get_world_size(),))
        compute = torch_dtype(cfg.model.dtype)
        shard_fsdp(model, self.mesh, compute if compute != torch.float32 else None, cfg.train.offload_params)
        self.model = self.forward_module = model
        self.model_dir = model_dir
        self.params = [p for p in model.parameters() if p.requires_grad]
        t = cfg.train
        if t.optimizer_state_dtype == "bfloat16":  # m and v in bf16 (train/optim.py)
            from lite_verl.train.optim import LowStateAdamW

            self.optimizer = LowStateAdamW(self.params, lr=t.lr, weight_decay=t.weight_decay)
        else:
            self.optimizer = torch.optim.AdamW(self.params, lr=t.lr, weight_decay=t.weight_decay, fused=True)

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    def step(self, max_norm: float) -> float:
        from torch.distributed.tensor import DTensor

        norm = torch.nn.utils.clip_grad_norm_(self.params, max_norm)  # over all shards: one global norm
        norm = float(norm.full_tensor() if isinstance(norm, DTensor) else norm)
        if math.isfinite(norm):
            self.optimizer.step()
        self.zero_grad()
        return norm

    def zero_grad(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)

    def settle(self, module: torch.nn.Module | None = None) -> None:
        """After a no-grad forward FSDP2 keeps a root's weights gathered (in model.dtype) for the backward
        it expects: shard them back, so that reads see the fp32 masters and the frozen reference's
        embeddings and head (2 GiB at 7B) do not stay on the GPU for the rest of the run."""
        from torch.distributed.fsdp import FSDPModule

        for m in (module or self.model).modules():
            if isinstance(m, FSDPModule):
                m.reshard()

    @contextmanager
    def gathered(self, module: torch.nn.Module):
        yield {n: _full_tensor(p) for n, p in module.named_parameters(recurse=False)}

    def local_bytes(self) -> int:
        from torch.distributed.tensor import DTensor

        self.settle()
        local = [p.to_local() if isinstance(p, DTensor) else p for p in self.model.parameters()]
        return sum(t.numel() * t.element_size() for t in local)

    # checkpoints: full (gathered) weights and optimizer state, written by rank 0, keyed by parameter
    # name, so they load onto any number of ranks. Gathering needs host memory for all of it on rank 0;
    # sharded torch.distributed.checkpoint files are the way past that, not needed on one workstation.
    def save(self, directory: Path) -> None:
        from torch.distributed.checkpoint import state_dict as sd

        self.settle()
        options = sd.StateDictOptions(full_state_dict=True, cpu_offload=True)
        weights = sd.get_model_state_dict(self.model, options=options)
        optim = sd.get_optimizer_state_dict(self.model, self.optimizer, options=options)
        if self.rank == 0:
            save_weights(weights, directory / "model", self.model_dir)
            torch.save(optim, directory / "optimizer.pt")

    def load(self, directory: Path) -> None:
        from torch.distributed.checkpoint import state_dict as sd

        check_full_checkpoint(directory)
        self.settle()
        weights = load_weights(directory / "model", self.model) if self.rank == 0 else {}
        optim = torch.load(directory / "optimizer.pt", weights_only=True) if self.rank == 0 else {}
        options = sd.StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
        sd.set_model_state_dict(self.model, weights, options=options)
        sd.set_optimizer_state_dict(self.model, self.optimizer, optim, options=options)


def fsdp_reference(cfg: Config, model_dir: Path, mesh) -> torch.nn.Module:
    """The frozen initial policy in model.dtype, sharded (and offloaded) like the trained one."""
    model = load_full_model(cfg, model_dir, cfg.model.dtype)
    model.requires_grad_(False)
    model.eval()
    shard_fsdp(model, mesh, None, cfg.train.offload_params)
    return model
