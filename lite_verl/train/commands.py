"""The messages between the controller (rank 0, train/group.py) and its followers (train/follower.py).

A command is a header sent over each follower's pipe -- (name, args, {tensor name: (shape, dtype)}) --
followed by the tensors themselves, broadcast from rank 0 over the gloo group in header order. Both
sides import this module and neither imports the other's, so the format lives in one place.

Command names (`COMMANDS`, plus "stop"): update, generate, buckets, linears, save, load, park, unpark.
"""

from __future__ import annotations

from collections.abc import Iterable
from multiprocessing.connection import Connection
from typing import Any

import torch

from lite_verl.batch import RolloutBatch, UpdateBatch

# what a follower runs
COMMANDS = ("update", "generate", "buckets", "linears", "save", "load", "park", "unpark")
STOP = "stop"  # leave the group and exit


def send_command(
    conns: Iterable[Connection],
    command: str,
    args: dict[str, Any] | None = None,
    tensors: dict[str, torch.Tensor] | None = None,
) -> None:
    """Rank 0: the header to every follower, then each tensor broadcast (a collective: every follower
    must be receiving)."""
    import torch.distributed as dist

    tensors = tensors or {}
    head = (command, args or {}, {k: (tuple(t.shape), t.dtype) for k, t in tensors.items()})
    for conn in conns:
        conn.send(head)
    for t in tensors.values():
        dist.broadcast(t.contiguous(), src=0)


def receive_command(conn: Connection) -> tuple[str, dict[str, Any], dict[str, torch.Tensor]]:
    """A follower: the next (command, args, tensors) from rank 0 (EOFError when rank 0 is gone)."""
    import torch.distributed as dist

    command, args, specs = conn.recv()
    tensors = {}
    for name, (shape, dtype) in specs.items():
        tensors[name] = torch.empty(shape, dtype=dtype)
        dist.broadcast(tensors[name], src=0)
    return command, args, tensors


def batch_tensors(batch: UpdateBatch) -> dict[str, torch.Tensor]:
    """The tensors of an UpdateBatch by name, for the "update" command (its step goes in the args)."""
    r = batch.rollout
    out = {"prompt_ids": r.prompt_ids, "prompt_mask": r.prompt_mask, "response_ids": r.response_ids,
           "response_mask": r.response_mask, "rollout_log_probs": r.rollout_log_probs,
           "scores": batch.scores, "group_ids": batch.group_ids}  # fmt: skip
    if batch.baselines is not None:
        out["baselines"] = batch.baselines
    if batch.truncated is not None:
        out["truncated"] = batch.truncated.long()  # broadcast as integers
    return out


def batch_from(tensors: dict[str, torch.Tensor], step: int) -> UpdateBatch:
    """batch_tensors' inverse."""
    rollout = RolloutBatch(*(tensors[k] for k in ("prompt_ids", "prompt_mask", "response_ids",
                                                   "response_mask", "rollout_log_probs")))  # fmt: skip
    truncated = tensors["truncated"].bool() if "truncated" in tensors else None
    return UpdateBatch(
        rollout, tensors["scores"], tensors["group_ids"], tensors.get("baselines"), step, truncated
    )
