"""The rollout-engine interface: everything the training loop asks of an engine, one meaning per method.

Engines (rollout/factory.py builds the one a config asks for):
  HFRolloutEngine    transformers generate with the trained model itself (rollout/hf.py)
  LockstepEngine     the same over a sharded trainer: every training rank generates (rollout/lockstep.py)
  VLLMRolloutEngine  a vLLM worker process; weights pushed in memory after each update (rollout/vllm_engine.py)

What differs between engines is said by `overlaps`, not by missing methods: an engine whose
`overlaps` is False has no rollout in flight, ever (its submit/collect raise), and its
sleep/wake/close are documented no-ops where there is nothing to free.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Protocol

from lite_verl.batch import RolloutBatch
from lite_verl.config import RolloutConfig


@dataclass(frozen=True)
class SamplingSettings:
    n: int = 1  # responses per prompt
    temperature: float = 1.0  # 0 = greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 = every token
    min_p: float = 0.0  # 0 = off
    # the sampled tokens' log-probs: the update needs them (rollout correction, the trainer/rollout gap); a
    # rollout that is only scored (validation, eval, ReMax's greedy baseline) does not, and vLLM then skips
    # building them per token (zeros in RolloutBatch.rollout_log_probs)
    log_probs: bool = True
    max_new_tokens: int = 32
    stop: tuple[str, ...] = ()  # rollout.stop_strings: a response ends after the token that completes one

    @classmethod
    def of(
        cls, rollout: RolloutConfig, greedy: bool = False, n: int | None = None, log_probs: bool | None = None
    ) -> SamplingSettings:
        """The run's sampling (rollout.*); greedy: one temperature-0 response per prompt (validation), without
        log-probs unless asked; n: another group size (eval's k)."""
        return cls(
            n=1 if greedy else n or rollout.n,
            temperature=0.0 if greedy else rollout.temperature,
            top_p=rollout.top_p,
            top_k=rollout.top_k,
            min_p=rollout.min_p,
            log_probs=not greedy if log_probs is None else log_probs,
            max_new_tokens=rollout.max_new_tokens,
            stop=rollout.stop_strings,
        )


class RolloutEngine(Protocol):
    @property
    def overlaps(self) -> bool:
        """True when a rollout can run while the trainer updates (submit/collect; rollout.max_staleness=1)."""
        ...

    @property
    def eos_ids(self) -> Collection[int]:
        """The token ids that end a response: the tokenizer's EOS and the model's generation_config ones."""
        ...

    @property
    def last_generate_span(self) -> tuple[float, float]:
        """Wall-clock (time.time()) start and end of the latest rollout that generate or collect returned."""
        ...

    def generate(self, prompts: list[list[int]], sampling: SamplingSettings, seed: int) -> RolloutBatch:
        """Sample `sampling.n` responses per prompt (rows grouped: prompt i -> rows i*n .. i*n+n-1). A response
        ends at EOS or after the token that completes one of `sampling.stop` (rollout/hf.cut_at_stop).

        Log-probs are of the sampled tokens under the sampling distribution (logits / temperature).
        The same seed gives the same samples on the same machine. Waits for the rollout; with one in
        flight (submit) it queues behind it.
        """
        ...

    def submit(self, prompts: list[list[int]], sampling: SamplingSettings, seed: int) -> None:
        """Start a rollout like `generate` and return at once; it samples with the weights of now, while
        the trainer updates. One at a time: `collect` it before the next submit. Needs `overlaps`."""
        ...

    def collect(self) -> RolloutBatch:
        """The rollout started by `submit`, waiting for it if it has not finished."""
        ...

    def finished_span(self) -> tuple[float, float] | None:
        """Wall-clock (start, end) of the submitted rollout if it has already finished, else None."""
        ...

    def sync_weights(self, step: int) -> float:
        """Make the engine generate with the trainer's current weights; returns seconds spent. With a
        rollout in flight it first waits for that rollout (which keeps the weights it started with)."""
        ...

    def sleep(self) -> None:
        """Free what the engine holds on a device the trainer shares (its KV cache) before an update."""
        ...

    def wake(self) -> None:
        """Take back what `sleep` freed; generate and sync_weights wake the engine by themselves."""
        ...

    def close(self) -> None:
        """Stop the engine and release its processes and files; the engine is unusable after it."""
        ...
