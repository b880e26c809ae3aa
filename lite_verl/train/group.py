"""Several training processes: rank 0 is the controller, ranks 1..W-1 follow its commands.

    lite-verl train --preset 4090x4                                # train.gpus [2, 3]: two ranks
    lite-verl train --preset laptop --set train.cpu_ranks=2        # the same maths on a CPU (gloo)

The controller (the CLI process) does all it does with one rank -- rollout, reward, logging, weight
sync, checkpoints -- and trains on the first train device. `TrainGroup.start` spawns one follower per
other device; all join one torch.distributed group (train/dist.py), build the same backend
(`build_trainer`, so their collectives pair up) and then each follower loops on commands, sent over a
pipe (tensors follow by broadcast over gloo):

  update    the step's UpdateBatch; every rank runs update.run_update on it, computing its share of the
            rows (train/dist.py says why the shares add up to the one-rank update)
  generate  rollout.engine=hf over fsdp/deepspeed: every rank runs generate on the same prompts and
            seed, because every forward gathers weights collectively; rank 0's result is used
  buckets, linears  merged sync of fsdp/deepspeed: weights gathered module by module, collectively
  save, load  checkpoints (sharded backends gather; LoRA followers load the same files)
  stop      leave the group and exit

A LoRA adapter is replicated, so rank 0 alone exports, merges and saves it. The controller's backend
is wrapped (`GroupBackend`) so that the loop, the rollout engines and RunDir need not know any of this.

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
from contextlib import contextmanager
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any, TypeVar

import torch

from lite_verl.batch import RolloutBatch, UpdateBatch
from lite_verl.config import Config, TrainConfig
from lite_verl.config.validation import train_world
from lite_verl.errors import UserError
from lite_verl.train.dist import Ranks, barrier, broadcast_parameters, free_port, join_group

T = TypeVar("T")
FAILURE_WAIT_S = 10.0  # how long the controller waits for a follower's report after a collective failed
GRACE_S = 15.0  # after a follower failed: time the controller has to stop by itself before it is ended
STOP_TIMEOUT_S = 60.0


class TrainRankFailed(UserError):
    """A follower rank raised or died; the message names the rank and its error."""

    exit_code = 1


def rank_device(train: TrainConfig, rank: int) -> torch.device:
    """train.gpus[rank], or the CPU."""
    return torch.device(f"cuda:{train.gpus[rank]}") if train.gpus else torch.device("cpu")


def build_trainer(cfg: Config, model_dir: Path, device: torch.device, world: int):
    """The training backend of one rank. The controller and every follower run this, in this order,
    so the collectives inside (FSDP2 / ZeRO-3 setup, the LoRA broadcast) pair up."""
    from lite_verl.device import cap_memory
    from lite_verl.model.load import load_model
    from lite_verl.train.lora import LoraBackend

    cap_memory(device, cfg.train.max_memory_gib)
    if cfg.train.backend in ("fsdp", "deepspeed"):  # full fine-tuning (train/full.py)
        from lite_verl.train.full import build_full_backend

        backend = build_full_backend(cfg, model_dir, device)
    else:
        base = load_model(model_dir, cfg.model, device, nf4=cfg.train.backend == "qlora")
        backend = LoraBackend(base, cfg.train, device, cfg.trainer.seed, cfg.model.fp32_lm_head)
    if cfg.algorithm.adv_estimator == "gae":
        backend.enable_critic(cfg.critic)
    if world > 1 and isinstance(backend, LoraBackend):  # replicas equal whatever each RNG held
        broadcast_parameters(backend.params + backend.critic_params)
    return backend


def sharded(cfg: Config) -> bool:
    return cfg.train.backend in ("fsdp", "deepspeed")


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
        import torch.distributed as dist

        tensors = tensors or {}
        head = (command, args or {}, {k: (tuple(t.shape), t.dtype) for k, t in tensors.items()})
        for conn in self._commands:
            conn.send(head)
        for t in tensors.values():
            dist.broadcast(t.contiguous(), src=0)

    def update(self, batch: UpdateBatch, kl_coef: float, local: Callable[[], T]) -> T:
        return self.run("update", local, {"step": batch.step, "kl_coef": kl_coef}, batch_tensors(batch))

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
                self.send("stop")
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


def batch_tensors(batch: UpdateBatch) -> dict[str, torch.Tensor]:
    r = batch.rollout
    out = {"prompt_ids": r.prompt_ids, "prompt_mask": r.prompt_mask, "response_ids": r.response_ids,
           "response_mask": r.response_mask, "rollout_log_probs": r.rollout_log_probs,
           "scores": batch.scores, "group_ids": batch.group_ids}  # fmt: skip
    if batch.baselines is not None:
        out["baselines"] = batch.baselines
    return out


def batch_from(tensors: dict[str, torch.Tensor], step: int) -> UpdateBatch:
    rollout = RolloutBatch(*(tensors[k] for k in ("prompt_ids", "prompt_mask", "response_ids",
                                                   "response_mask", "rollout_log_probs")))  # fmt: skip
    return UpdateBatch(rollout, tensors["scores"], tensors["group_ids"], tensors.get("baselines"), step)


class GroupBackend:
    """Rank 0's backend when several ranks train: what needs every rank is announced to the followers
    first; everything else is the local backend's."""

    def __init__(self, local: Any, group: TrainGroup) -> None:
        self.local = local
        self.group = group
        self.sharded = sharded(group.cfg)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.local, name)

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

    def merged_weight_buckets(self, bucket_bytes: int, dtype: str, convert=None, everything: bool = False):
        if not self.sharded:
            yield from self.local.merged_weight_buckets(bucket_bytes, dtype, convert, everything)
            return
        assert convert is None  # AWQ re-quantization is LoRA-only (validation)
        with self.group.guard():
            self.group.send("buckets", {"bucket_bytes": bucket_bytes, "dtype": dtype})
            yield from self.local.merged_weight_buckets(bucket_bytes, dtype)

    def merged_linears(self):
        if not self.sharded:
            yield from self.local.merged_linears()
            return
        with self.group.guard():
            self.group.send("linears")
            yield from self.local.merged_linears()


class LockstepEngine:
    """rollout.engine=hf over a sharded trainer: the followers generate alongside rank 0 (their
    forwards take part in the weight gathers); rank 0's rollout is the one used."""

    def __init__(self, engine: Any, group: TrainGroup) -> None:
        self.engine = engine
        self.group = group

    def __getattr__(self, name: str) -> Any:
        return getattr(self.engine, name)

    def generate(self, prompts: list[list[int]], sampling: Any, seed: int) -> RolloutBatch:
        args = {"prompts": [list(p) for p in prompts], "sampling": sampling, "seed": seed}
        return self.group.run("generate", lambda: self.engine.generate(prompts, sampling, seed), args)
