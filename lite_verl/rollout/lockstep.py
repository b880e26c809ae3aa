"""rollout.engine=hf over a sharded trainer (train.backend fsdp/deepspeed with several ranks).

Every forward of a sharded model gathers its weights collectively, so every training rank has to
generate alongside rank 0: `generate` announces the prompts and seed to the followers (train/group.py,
command "generate"; each runs the same HFRolloutEngine call, train/follower.py), then rank 0 generates.
Rank 0's rollout is the one used. Everything else is the wrapped engine's.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import TYPE_CHECKING

from lite_verl.batch import RolloutBatch
from lite_verl.rollout.base import RolloutEngine, SamplingSettings

if TYPE_CHECKING:
    from lite_verl.train.group import TrainGroup


class LockstepEngine:
    """A RolloutEngine (rollout/base.py): `engine` on rank 0, the same call on every follower."""

    overlaps = False  # the rollout is a collective of all training ranks: it cannot run beside the update

    def __init__(self, engine: RolloutEngine, group: TrainGroup) -> None:
        self.engine = engine
        self.group = group

    @property
    def last_generate_span(self) -> tuple[float, float]:
        return self.engine.last_generate_span

    @property
    def eos_ids(self) -> Collection[int]:
        return self.engine.eos_ids

    def generate(self, prompts: list[list[int]], sampling: SamplingSettings, seed: int) -> RolloutBatch:
        return self.group.generate(
            prompts, sampling, seed, lambda: self.engine.generate(prompts, sampling, seed)
        )

    def submit(self, prompts: list[list[int]], sampling: SamplingSettings, seed: int) -> None:
        self.engine.submit(prompts, sampling, seed)  # the hf engine raises: it cannot overlap

    def collect(self) -> RolloutBatch:
        return self.engine.collect()

    def finished_span(self) -> tuple[float, float] | None:
        return self.engine.finished_span()

    def sync_weights(self, step: int) -> float:
        return self.engine.sync_weights(step)

    def sleep(self) -> None:
        self.engine.sleep()

    def wake(self) -> None:
        self.engine.wake()

    def close(self) -> None:
        self.engine.close()  # the group itself is closed by whoever started it (the loop)
