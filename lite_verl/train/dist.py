"""The torch.distributed process group the full fine-tuning backends (train/full.py) shard over.

lite-verl 0.1 trains in one process: `ensure_process_group` starts a group of world size 1 (gloo on
the CPU; on a GPU machine nccl for CUDA tensors with gloo beside it for CPU ones) on a free local port,
passed as the init method: nothing is written into os.environ, which the rollout worker processes inherit.

Where N processes would plug in: a launcher that starts one trainer process per train GPU (torchrun,
or lite-verl's own) sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT; this module then
joins that group (env://) instead of making one, `train_device` picks the local rank's GPU, and FSDP2 /
ZeRO-3 shard over all of them. The controller side (rank 0 drives rollout, reward and logging, the
other ranks follow its batches) is not built; validation refuses more than one train GPU for now.
One thing that controller must settle: FSDP2 and ZeRO-3 average gradients over the ranks, which is
right when every rank sees the same rows; if each rank takes its share of a mini-batch while update.py
normalises each loss by the whole mini-batch's token count, the ranks' gradients must be summed instead.
"""

from __future__ import annotations

import atexit
import os
import socket

import torch


def free_port() -> int:
    """A TCP port nobody listens on now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def launched() -> bool:
    """Whether a launcher (torchrun or similar) started this process as one rank of several."""
    return "WORLD_SIZE" in os.environ and "RANK" in os.environ


def train_device(gpus: tuple[int, ...]) -> torch.device:
    """This rank's device: train.gpus[LOCAL_RANK] under a launcher, else the first train GPU, or the CPU."""
    if not gpus:
        return torch.device("cpu")
    local = int(os.environ.get("LOCAL_RANK", "0")) if launched() else 0
    return torch.device(f"cuda:{gpus[local]}")


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
    # gloo for CPU tensors (also offloaded shards), nccl for CUDA ones wherever a GPU exists: the group is
    # made once per process, whatever device its first user trains on
    backend = "cpu:gloo,cuda:nccl" if torch.cuda.is_available() else "gloo"
    if launched():
        dist.init_process_group(backend, init_method="env://")
    else:
        dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    atexit.register(_destroy)  # a group left alive can abort the interpreter at exit (gloo's threads)
    return dist.get_rank(), dist.get_world_size()


def _destroy() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()
