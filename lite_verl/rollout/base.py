"""The rollout-engine interface."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from lite_verl.batch import RolloutBatch


@dataclass(frozen=True)
class SamplingSettings:
    n: int = 1  # responses per prompt
    temperature: float = 1.0  # 0 = greedy
    top_p: float = 1.0
    max_new_tokens: int = 32


class RolloutEngine(Protocol):
    def generate(self, prompts: list[list[int]], sampling: SamplingSettings, seed: int) -> RolloutBatch:
        """Sample `sampling.n` responses per prompt (rows grouped: prompt i -> rows i*n .. i*n+n-1).

        Log-probs are of the sampled tokens under the sampling distribution (logits / temperature).
        The same seed gives the same samples on the same machine.
        """
        ...

    def sync_weights(self, step: int) -> float:
        """Make the engine generate with the trainer's current weights; returns seconds spent."""
        ...
