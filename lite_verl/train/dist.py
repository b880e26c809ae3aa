"""The torch.distributed process group the trainer runs over, and how W ranks share one update.

One rank (train.gpus of one GPU, or the CPU): `ensure_process_group` starts a group of world size 1
(gloo on the CPU; on a GPU machine nccl for CUDA tensors with gloo beside it for CPU ones) on a free
local port, passed as the init method: nothing is written into os.environ, which the rollout worker
processes inherit. The full fine-tuning backends (train/fsdp.py, train/zero3.py) shard over it.

W ranks (train.gpus [2, 3], or train.cpu_ranks=2 on a laptop): train/group.py starts them -- the
controller is rank 0, it spawns ranks 1..W-1 -- and each calls `join_group` with the same init method.
FSDP2 / ZeRO-3 then shard over all ranks; a LoRA adapter is replicated on each. (A process started by
an outside launcher -- RANK, WORLD_SIZE, ... set, as tests/test_full_backends.py does to drive two bare
backends -- joins that group through env:// in `ensure_process_group`.)

How the ranks share an update (`Ranks`; update.py uses it): every rank holds the whole rollout batch;
each computes a contiguous 1/W of the rows of every log-prob pass (then `gather`s the others') and of
every mini-batch. Losses are normalised by the whole mini-batch's token / sequence counts, which every
rank computes locally from the batch it holds, so the ranks' gradients must be SUMMED, not averaged:
LoRA all-reduces its trainable gradients with SUM before clipping (`sum_gradients`); FSDP2 and ZeRO-3
average over ranks, so train/full.py multiplies the loss by W. Per-rank metric sums add up the same
way (`reduce`). A W-rank update therefore equals the 1-rank update of the same batch, up to the order
of float additions.
"""

from __future__ import annotations

import atexit
import os
import socket
from dataclasses import dataclass

import torch


def free_port() -> int:
    """A TCP port nobody listens on now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def launched() -> bool:
    """Whether a launcher (torchrun or similar) started this process as one rank of several."""
    return "WORLD_SIZE" in os.environ and "RANK" in os.environ


def ensure_process_group(device: torch.device) -> tuple[int, int]:
    """-> (rank, world size). Joins the group a launcher or an earlier backend made, or starts a
    one-process group."""
    import torch.distributed as dist

    if not dist.is_available():  # pragma: no cover - every pip wheel of torch has it
        from lite_verl.errors import UserError

        raise UserError("this torch build has no torch.distributed; install the pip wheel of torch")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    if launched():
        dist.init_process_group(group_backend(), init_method="env://")
    else:
        dist.init_process_group(
            group_backend(), init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1
        )
    atexit.register(_destroy)  # a group left alive can abort the interpreter at exit (gloo's threads)
    return dist.get_rank(), dist.get_world_size()


def group_backend() -> str:
    """gloo for CPU tensors (also offloaded shards and the command payloads of train/group.py), nccl for
    CUDA ones wherever a GPU exists: the group is made once per process, whatever device trains."""
    return "cpu:gloo,cuda:nccl" if torch.cuda.is_available() else "gloo"


def join_group(device: torch.device, init_method: str, rank: int, world: int) -> None:
    """Rank `rank` of `world` joins the group at `init_method` (train/group.py starts all of them). A
    one-process group an earlier backend of this process made is left first (tests build several)."""
    import torch.distributed as dist

    if device.type == "cuda":
        torch.cuda.set_device(device)
    if dist.is_initialized():
        dist.destroy_process_group()
    dist.init_process_group(group_backend(), init_method=init_method, rank=rank, world_size=world)


def _destroy() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()


def world_size() -> int:
    """Ranks in the group (1 without one)."""
    import torch.distributed as dist

    return dist.get_world_size() if dist.is_initialized() else 1


@dataclass(frozen=True)
class Ranks:
    """This process's place among the W training ranks: which rows it computes, how results combine.
    Rank 0 of 1 (the default) leaves everything as it is."""

    rank: int = 0
    world: int = 1

    def share(self, rows: int) -> list[int]:
        """This rank's contiguous block of `rows` (validation makes every mini-batch divide by W)."""
        per = rows // self.world
        return list(range(self.rank * per, (self.rank + 1) * per))

    def gather(self, part: torch.Tensor) -> torch.Tensor:
        """Every rank's block of a CPU tensor [rows / W, ...], concatenated in rank order: [rows, ...]."""
        if self.world == 1:
            return part
        import torch.distributed as dist

        parts = [torch.empty_like(part) for _ in range(self.world)]
        dist.all_gather(parts, part.contiguous())
        return torch.cat(parts)

    def reduce(self, metrics: dict[str, float]) -> dict[str, float]:
        """Per-rank metric sums -> the whole mini-batch's: summed over ranks; `*_max` keys: the max."""
        if self.world == 1:
            return metrics
        import torch.distributed as dist

        keys = sorted(metrics)  # every rank runs the same code, so holds the same keys
        sums = torch.tensor([0.0 if k.endswith("_max") else metrics[k] for k in keys], dtype=torch.float64)
        maxes = torch.tensor([metrics[k] if k.endswith("_max") else 0.0 for k in keys], dtype=torch.float64)
        dist.all_reduce(sums)
        dist.all_reduce(maxes, op=dist.ReduceOp.MAX)
        return {k: float(m if k.endswith("_max") else s) for k, s, m in zip(keys, sums, maxes)}


def sum_gradients(params: list[torch.nn.Parameter]) -> None:
    """Replicated parameters (LoRA): every rank's gradients replaced by their sum over ranks, before
    clipping. One flat all-reduce per dtype; a parameter without a gradient counts as zeros."""
    if world_size() == 1:
        return
    import torch.distributed as dist

    by_dtype: dict[torch.dtype, list[torch.nn.Parameter]] = {}
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        by_dtype.setdefault(p.grad.dtype, []).append(p)
    for group in by_dtype.values():
        flat = torch.cat([p.grad.reshape(-1) for p in group])
        dist.all_reduce(flat)
        for p, g in zip(group, flat.split([p.numel() for p in group])):
            p.grad.copy_(g.view_as(p.grad))


def barrier() -> None:
    """Wait for every rank, through gloo (a CPU all-reduce): NCCL's barrier guesses a GPU from the rank
    number, which need not be this rank's train GPU."""
    if world_size() > 1:
        import torch.distributed as dist

        dist.all_reduce(torch.zeros(1))


def broadcast_parameters(params: list[torch.nn.Parameter]) -> None:
    """Rank 0's values into every rank's copy of replicated parameters: the replicas start equal,
    whatever random state each process had when it built them."""
    if world_size() == 1:
        return
    import torch.distributed as dist

    with torch.no_grad():
        for p in params:
            dist.broadcast(p.data, src=0)


ONE_RANK = Ranks()  # one training process: every row is this rank's, nothing to combine
