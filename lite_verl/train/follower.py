"""A follower rank of train/group.py: a spawned process that builds the backend as rank 0 does
(train/rank.py) and then runs the commands rank 0 sends (train/commands.py: update, generate, buckets,
linears, save, load, park, unpark, stop) until it is told to stop or rank 0 is gone. Its errors go to rank 0 as one
line; its traceback to stderr. It imports nothing of train/group.py: group starts it, by
`follower_main`.
"""

from __future__ import annotations

import os
import sys
import traceback
from contextlib import suppress
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import torch

from lite_verl.config import Config
from lite_verl.errors import UserError
from lite_verl.run.signals import child_process_setup
from lite_verl.train.base import TrainBackend
from lite_verl.train.commands import COMMANDS, STOP, batch_from, receive_command
from lite_verl.train.dist import Ranks, barrier, join_group
from lite_verl.train.rank import build_rank_backend, rank_device


def follower_main(
    rank: int, world: int, init: str, cfg: Config, model_dir: Path, commands: Connection, errors: Connection
) -> None:
    """Rank `rank` (a spawned process): join, build the backend as rank 0 does, serve its commands."""
    import torch.distributed as dist

    child_process_setup()  # the group's signals are rank 0's to act on; end with rank 0
    _quiet()
    try:
        torch.manual_seed(cfg.trainer.seed + rank)  # its own dropout masks; replicas are broadcast equal
        device = rank_device(cfg.train, rank)
        join_group(device, init, rank, world)
        backend = build_rank_backend(cfg, model_dir, device, world)
        follower = Follower(backend, cfg, Ranks(rank, world), model_dir)
        follower.serve(commands)
    except BaseException as e:  # whatever it is (SystemExit too), the controller must hear of it
        if not isinstance(e, UserError):
            print(f"lite-verl: train rank {rank}:", file=sys.stderr)
            traceback.print_exc()
        sys.stderr.flush()
        with suppress(OSError):
            errors.send(str(e) if isinstance(e, UserError) else f"{type(e).__name__}: {e}")
        os._exit(1)  # no interpreter teardown: a broken gloo group can abort it
    dist.destroy_process_group()


def _quiet() -> None:
    """Rank 0 reports for all: no progress bars or library chatter from the followers."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()


class Follower:
    """A follower's backend and the commands it runs (one method per name of train/commands.COMMANDS)."""

    def __init__(self, backend: TrainBackend, cfg: Config, ranks: Ranks, model_dir: Path) -> None:
        from lite_verl.update import MicroBatchSize

        self.backend, self.cfg, self.ranks, self.model_dir = backend, cfg, ranks, model_dir
        self.micro = MicroBatchSize.of(cfg, lockstep=backend.sharded)  # as rank 0's (group and sharded)
        self.engine: Any = None

    def serve(self, commands: Connection) -> None:
        while True:
            try:
                command, args, tensors = receive_command(commands)
            except EOFError:  # the controller is gone
                return
            if command == STOP:
                return
            if command not in COMMANDS:
                raise ValueError(f"unknown command {command!r} from the controller")
            getattr(self, command)(args, tensors)

    def update(self, args: dict, tensors: dict[str, torch.Tensor]) -> None:
        from lite_verl.algos import FixedKLController
        from lite_verl.update import run_update

        # the controller's coefficient: an adaptive controller's state lives there, in one place
        kl = FixedKLController(args["kl_coef"])
        run_update(self.backend, batch_from(tensors, args["step"]), self.cfg, kl, self.micro, self.ranks)

    def generate(self, args: dict, tensors: dict[str, torch.Tensor]) -> None:
        if self.engine is None:
            from lite_verl.model.load import load_tokenizer
            from lite_verl.rollout.hf import HFRolloutEngine

            tokenizer = load_tokenizer(self.model_dir, self.cfg.model.trust_remote_code)
            self.engine = HFRolloutEngine(
                self.backend.model, tokenizer, self.backend.device, synced=True, compute=self.backend.autocast
            )
        self.engine.generate(args["prompts"], args["sampling"], args["seed"])

    def buckets(self, args: dict, tensors: dict[str, torch.Tensor]) -> None:
        for _ in self.backend.merged_weight_buckets(args["bucket_bytes"], args["dtype"]):
            pass

    def linears(self, args: dict, tensors: dict[str, torch.Tensor]) -> None:
        for _ in self.backend.merged_linears():
            pass

    def save(self, args: dict, tensors: dict[str, torch.Tensor]) -> None:
        self.backend.save(Path(args["directory"]))
        barrier()

    def load(self, args: dict, tensors: dict[str, torch.Tensor]) -> None:
        self.backend.load(Path(args["directory"]))

    def park(self, args: dict, tensors: dict[str, torch.Tensor]) -> None:
        self.backend.park()
        barrier()

    def unpark(self, args: dict, tensors: dict[str, torch.Tensor]) -> None:
        self.backend.unpark()
