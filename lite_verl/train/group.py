"""Several training processes: rank 0 is the controller, ranks 1..W-1 follow its commands.

    lite-verl train --preset 4090x4                                # train.gpus [2, 3]: two ranks
    lite-verl train --preset laptop --set train.cpu_ranks=2        # the same maths on a CPU (gloo)

The controller (the CLI process) does all it does with one rank -- rollout, reward, logging, weight
sync, checkpoints -- and trains on the first train device. `TrainGroup.start` spawns one follower per
other device (train/follower.py); all join one torch.distributed group (train/dist.py), build the
same backend (train/rank.build_rank_backend, so their collectives pair up) and then each follower loops
on commands, sent over a pipe (tensors follow by broadcast over gloo; train/commands.py):

  update    the step's UpdateBatch; every rank runs update.run_update on it, computing its share of the
            rows (train/dist.py says why the shares add up to the one-rank update)
  generate  rollout.engine=hf over fsdp/deepspeed: every rank runs generate on the same prompts and
            seed, because every forward gathers weights collectively; rank 0's result is used
  buckets, linears  merged sync of fsdp/deepspeed: weights gathered module by module, collectively
  save, load  checkpoints (sharded backends gather; LoRA followers load the same files)
  park, unpark  LoRA's tensors to host memory and back around a colocated vLLM's rollout
  stop      leave the group and exit

A LoRA adapter is replicated, so rank 0 alone exports, merges and saves it. The controller's backend
is wrapped (`GroupBackend`) so that the loop, the rollout engines and RunDir need not know any of this;
train/factory.build_trainer puts the two together. rollout.engine=hf over a sharded trainer generates
on every rank through `TrainGroup.generate` (rollout/lockstep.py).

Failures: a follower's exception goes to the controller as one line (its traceback to stderr) and the
follower exits; the controller raises TrainRankFailed naming the rank. When the controller is stuck in
a collective that cannot finish (NCCL waits for a dead peer), a watchdog thread prints that line and
ends the process. Followers end when the controller does (they watch its process).
"""

from __future__ import annotations

import atexit
import multiprocessing as mp
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import torch

from lite_verl.batch import UpdateBatch
from lite_verl.config import Config, CriticConfig
from lite_verl.config.validation import train_world
from lite_verl.errors import UserError
from lite_verl.train.base import Bucket, Convert, LinearGroup, TrainBackend, Transform
from lite_verl.train.commands import STOP, batch_tensors, send_command
from lite_verl.train.dist import Ranks, barrier, free_port, join_group
from lite_verl.train.rank import rank_device

if TYPE_CHECKING:
    from lite_verl.rollout.base import SamplingSettings

T = TypeVar("T")
FAILURE_WAIT_S = 10.0  # how long the controller waits for a follower's report after a collective failed
GRACE_S = 15.0  # after a follower failed: time the controller has to stop by itself before it is ended
STOP_TIMEOUT_S = 60.0


class TrainRankFailed(UserError):
    """A follower rank raised or died; the message names the rank and its error."""

    exit_code = 1


# --- the controller ----------------------------------------------------------------------------------
class TrainGroup:
    """The controller's handle on its followers: start them, send commands, notice failures, stop."""

    def __init__(self, cfg: Config, world: int) -> None:
        self.cfg = cfg
        self.ranks = Ranks(0, world)
        self.procs: list[Any] = []  # multiprocessing.Process of ranks 1..W-1
        self._commands: list[Connection] = []
        self._errors: list[Connection] = []
        self.failure: str | None = None
        self._failed = threading.Event()
        self._closing = False
        self._reported = False  # the main thread raised TrainRankFailed: the watchdog leaves it be
        self.broken = False  # a command did not complete: followers may sit in a collective
        self._in_command = 0  # > 0 while rank 0 does its part of a command (and may wait in a collective)
        self._wake_r, self._wake_w = mp.Pipe(duplex=False)

    @classmethod
    def start(cls, cfg: Config, model_dir: Path) -> TrainGroup:
        """Spawn ranks 1..W-1 and join the group as rank 0 (returns once all have joined)."""
        from lite_verl.device import nccl_env
        from lite_verl.train import follower

        world = train_world(cfg)
        group = cls(cfg, world)
        os.environ.update(nccl_env(cfg.train.gpus))  # GPUs without peer access (RTX 4090): before NCCL starts
        ctx = mp.get_context("spawn")
        init = f"tcp://127.0.0.1:{free_port()}"
        for rank in range(1, world):
            cmd_r, cmd_w = ctx.Pipe(duplex=False)
            err_r, err_w = ctx.Pipe(duplex=False)
            args = (rank, world, init, cfg, model_dir, cmd_r, err_w)
            proc = ctx.Process(
                target=follower.follower_main, args=args, daemon=True, name=f"lite-verl-train-rank{rank}"
            )
            proc.start()
            cmd_r.close()
            err_w.close()
            group.procs.append(proc)
            group._commands.append(cmd_w)
            group._errors.append(err_r)
        threading.Thread(target=group._watch, name="lite-verl-train-watchdog", daemon=True).start()
        atexit.register(group.close)
        with group.guard():
            join_group(rank_device(cfg.train, 0), init, 0, world)
        return group

    def run(self, command: str, local: Callable[[], T], args: dict | None = None,
            tensors: dict[str, torch.Tensor] | None = None) -> T:  # fmt: skip
        """Send `command` to the followers, then do rank 0's part (`local`)."""
        with self.guard():
            self.send(command, args, tensors)
            return local()

    def send(
        self, command: str, args: dict | None = None, tensors: dict[str, torch.Tensor] | None = None
    ) -> None:
        """`command` to every follower (train/commands.py), without doing rank 0's part: for a caller
        that iterates its part itself inside `guard()` (the merged weight generators)."""
        send_command(self._commands, command, args, tensors)

    def update(self, batch: UpdateBatch, kl_coef: float, local: Callable[[], T]) -> T:
        """Every follower runs update.run_update on `batch` (with rank 0's KL coefficient), then rank 0
        runs `local` (its own run_update); rank 0's metrics are returned."""
        return self.run("update", local, {"step": batch.step, "kl_coef": kl_coef}, batch_tensors(batch))

    def generate(
        self, prompts: list[list[int]], sampling: SamplingSettings, seed: int, local: Callable[[], T]
    ) -> T:
        """Every follower generates `prompts` with the HF engine over its own shards (the forwards of a
        sharded model gather weights collectively), then rank 0 runs `local`; its rollout is returned."""
        args = {"prompts": [list(p) for p in prompts], "sampling": sampling, "seed": seed}
        return self.run("generate", local, args)

    @contextmanager
    def guard(self) -> Iterator[None]:
        """A failure of rank 0's part of a command becomes TrainRankFailed when a follower failed (the
        collective broke because of it); rank 0's own errors pass through."""
        self._in_command += 1
        try:
            yield
        except (KeyboardInterrupt, GeneratorExit):
            self.broken = True
            raise
        except Exception as e:
            self.broken = True
            if self._failed.wait(0.0 if isinstance(e, UserError) else FAILURE_WAIT_S) and self.failure:
                self._reported = True
                raise TrainRankFailed(self.failure) from None
            raise
        finally:
            self._in_command -= 1

    def _watch(self) -> None:
        """Wait for a follower to fail; then stop the others, and end this process if it is still inside
        a command after GRACE_S (stuck in a collective). Outside one, the next command fails instead."""
        rank_of: dict[Any, int] = {p.sentinel: r for r, p in enumerate(self.procs, 1)}
        rank_of.update({c: r for r, c in enumerate(self._errors, 1)})
        ready = wait([*rank_of, self._wake_r])
        if self._closing:
            return
        rank = rank_of[ready[0]]
        self.failure = f"train rank {rank} failed: {self._reason(rank)}"
        self._failed.set()
        self._terminate()
        time.sleep(GRACE_S)
        if self._in_command and not self._reported and not self._closing:
            print(f"lite-verl: error: {self.failure}", file=sys.stderr, flush=True)
            os._exit(1)

    def _reason(self, rank: int) -> str:
        conn, proc = self._errors[rank - 1], self.procs[rank - 1]
        try:
            if conn.poll(2.0):
                return str(conn.recv())
        except (EOFError, OSError):
            pass
        proc.join(5.0)
        return f"its process exited with code {proc.exitcode}"

    def _terminate(self) -> None:
        for p in self.procs:
            if p.is_alive():
                p.terminate()

    def close(self) -> None:
        """Stop the followers ('stop' when they are idle, else terminate them) and leave the group."""
        import torch.distributed as dist

        if self._closing:
            return
        self._closing = True
        self._wake_w.send(None)
        if not self.broken:
            try:
                self.send(STOP)
            except (OSError, RuntimeError):
                self.broken = True
        if self.broken:
            self._terminate()
        deadline = time.monotonic() + STOP_TIMEOUT_S
        for p in self.procs:
            p.join(max(0.0, deadline - time.monotonic()))
            if p.is_alive():
                p.kill()
                p.join()
        if dist.is_initialized():
            dist.destroy_process_group()


class GroupBackend:
    """A TrainBackend (train/base.py): rank 0's backend when several ranks train. What needs every rank
    -- save and load, and with sharded weights the merged gathers -- is announced to the followers
    first. The rest is rank 0's own backend (`local`): an update runs on every rank through
    `TrainGroup.update`, each rank on its local backend, and a forward outside one is rank 0's alone."""

    def __init__(self, local: TrainBackend, group: TrainGroup) -> None:
        self.local = local
        self.group = group
        self.device = local.device
        self.model = local.model
        self.has_adapter = local.has_adapter
        self.supports_critic = local.supports_critic
        self.sharded = local.sharded

    # --- rank 0's own ----------------------------------------------------------------------------
    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        response_length: int,
        temperature: float,
        with_entropy: bool = False,
        reference: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        return self.local.forward(
            input_ids, attention_mask, response_length, temperature, with_entropy, reference
        )

    def backward(self, loss: torch.Tensor) -> None:
        self.local.backward(loss)

    def step(self) -> float:
        return self.local.step()

    def zero_grad(self) -> None:
        self.local.zero_grad()

    def set_lr(self, lr: float) -> None:
        self.local.set_lr(lr)  # followers set theirs in their own update.run_update, from the same step

    def train_mode(self, on: bool = True) -> None:
        self.local.train_mode(on)

    def autocast(self) -> AbstractContextManager[Any]:
        return self.local.autocast()

    def enable_critic(self, cfg: CriticConfig) -> None:
        self.local.enable_critic(cfg)  # every rank enables its own when it is built (train/rank.py)

    def critic_mode(self) -> AbstractContextManager[Any]:
        return self.local.critic_mode()

    def values(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, response_length: int
    ) -> torch.Tensor:
        return self.local.values(input_ids, attention_mask, response_length)

    def zero_critic_grad(self) -> None:
        self.local.zero_critic_grad()

    def critic_step(self) -> float:
        return self.local.critic_step()

    def adapter_state(self, transform: Transform | None = None) -> tuple[dict[str, torch.Tensor], dict]:
        return self.local.adapter_state(transform)  # the replicated adapter: rank 0's copy is every rank's

    def export_adapter(
        self, directory: Path, dtype: str | None = None, transform: Transform | None = None
    ) -> None:
        self.local.export_adapter(directory, dtype, transform)

    def parameter_bytes(self) -> int:
        return self.local.parameter_bytes()

    # --- every rank ------------------------------------------------------------------------------
    def merged_linears(self) -> Iterator[LinearGroup]:
        if not self.sharded:
            yield from self.local.merged_linears()
            return
        with self.group.guard():
            self.group.send("linears")
            yield from self.local.merged_linears()

    def merged_weight_buckets(
        self, bucket_bytes: int, dtype: str, convert: Convert | None = None, everything: bool = False
    ) -> Iterator[Bucket]:
        if not self.sharded:
            yield from self.local.merged_weight_buckets(bucket_bytes, dtype, convert, everything)
            return
        assert convert is None  # AWQ re-quantization is LoRA-only (validation)
        with self.group.guard():
            self.group.send("buckets", {"bucket_bytes": bucket_bytes, "dtype": dtype})
            yield from self.local.merged_weight_buckets(bucket_bytes, dtype)

    def park(self) -> None:  # every rank: a colocated vLLM may share any of the train GPUs
        def local() -> None:
            self.local.park()
            barrier()  # every rank's card is free before vLLM takes memory back

        self.group.run("park", local)

    def unpark(self) -> None:
        self.group.run("unpark", self.local.unpark)

    def save(self, directory: Path) -> None:
        if not self.sharded:  # the replicated adapter: rank 0's copy is every rank's
            self.local.save(directory)
            return

        def local() -> None:
            self.local.save(directory)
            barrier()  # every rank's files (ZeRO-3 partitions) written before RunDir renames the dir

        self.group.run("save", local, {"directory": str(directory)})

    def load(self, directory: Path) -> None:
        self.group.run("load", lambda: self.local.load(directory), {"directory": str(directory)})
