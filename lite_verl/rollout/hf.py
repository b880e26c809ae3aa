"""Rollout with transformers `generate` on the trained model itself (colocated, no weight copy).

For laptops, CPU CI and as a correctness reference for vLLM. Because the engine holds the very module
the trainer updates, `sync_weights` has nothing to move, and sleep/wake/close have nothing to free.
It generates in the trainer's own process, so it cannot overlap a rollout with the update
(`overlaps` is False; config validation allows rollout.max_staleness=1 only with rollout.engine=vllm).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any

import torch

from lite_verl.algos import log_probs_from_logits
from lite_verl.batch import RolloutBatch
from lite_verl.rollout.base import SamplingSettings


def left_pad(prompts: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """-> ids [B, P], mask [B, P], left-padded to the longest prompt."""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, width - len(p) :] = torch.tensor(p, dtype=torch.long)
        mask[i, width - len(p) :] = 1
    return ids, mask


def cut_at_stop(
    response_ids: torch.Tensor, mask: torch.Tensor, tokenizer: Any, stop: tuple[str, ...]
) -> torch.Tensor:
    """mask [B, R] (a prefix of ones per row) cut after the token that completes the first of `stop` in each
    response's text; that token is kept, as an EOS is. One rule for every engine: their own early stopping
    (vLLM's stop, transformers' stop_strings) only saves time, and may match inside a token differently."""
    if not stop:
        return mask
    mask = mask.clone()
    for i in range(len(response_ids)):
        ids = response_ids[i, : int(mask[i].sum())].tolist()
        end = _stop_end(tokenizer, ids, stop)
        if end is not None:
            mask[i, end:] = 0
    return mask


def _stop_end(tokenizer: Any, ids: list[int], stop: tuple[str, ...]) -> int | None:
    """The fewest leading tokens of `ids` whose text holds a stop string (None: no stop string at all);
    binary search, since a prefix's text only grows."""

    def has_stop(k: int) -> bool:
        text = tokenizer.decode(ids[:k], skip_special_tokens=False)
        return any(s in text for s in stop)

    if not ids or not has_stop(len(ids)):
        return None
    lo, hi = 1, len(ids)
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if has_stop(mid) else (mid + 1, hi)
    return lo


def response_mask_after_eos(response_ids: torch.Tensor, eos_ids: set[int]) -> torch.Tensor:
    """[B, R] -> [B, R] long: 1 up to and including the first EOS, 0 after it."""
    is_eos = torch.zeros_like(response_ids, dtype=torch.bool)
    for e in eos_ids:
        is_eos |= response_ids == e
    before = is_eos.long().cumsum(-1) - is_eos.long()  # EOS seen strictly before this position
    return (before == 0).long()


class HFRolloutEngine:
    """A RolloutEngine (rollout/base.py) over the trained module."""

    overlaps = False

    def __init__(
        self,
        model: Any,  # a transformers PreTrainedModel (or a peft model around one): has generate()
        tokenizer,
        device: torch.device,
        chunk_size: int = 256,
        synced: bool = False,
        compute: Callable[[], AbstractContextManager] = nullcontext,
    ) -> None:
        self.model = model
        # the trainer's compute context (train/lora.py: autocast for a bf16 model), so that sampling runs
        # the adapters as the update does and the rollout's log-probs are the trainer's
        self.compute = compute
        # a model sharded over several ranks (train/group.py) generates on all of them at once: every
        # forward gathers weights collectively, so each rank keeps stepping until all have finished
        self.synced = synced
        self.tokenizer = tokenizer
        self.device = device
        self.chunk_size = chunk_size  # rows per generate call (memory bound)
        eos = model.generation_config.eos_token_id if hasattr(model, "generation_config") else None
        eos_list = eos if isinstance(eos, list) else [eos] if eos is not None else []
        self.eos_ids = {int(e) for e in eos_list} | {int(tokenizer.eos_token_id)}
        self.pad_id = int(tokenizer.pad_token_id)
        self.last_generate_span: tuple[float, float] = (0.0, 0.0)

    @torch.no_grad()
    def generate(self, prompts: list[list[int]], sampling: SamplingSettings, seed: int) -> RolloutBatch:
        began = time.time()
        rows = [p for p in prompts for _ in range(sampling.n)]
        was_training = self.model.training
        self.model.eval()
        outs = []
        try:  # a signal may end a validation mid-way (loop._validate_or_skip): the trainer stays in train mode
            with torch.random.fork_rng(devices=[self.device] if self.device.type == "cuda" else []):
                torch.manual_seed(seed)
                with self.compute():
                    outs += [self._generate_chunk(rows[a : a + self.chunk_size], sampling)
                             for a in range(0, len(rows), self.chunk_size)]  # fmt: skip
        finally:
            self.model.train(was_training)
        self.last_generate_span = (began, time.time())
        return _concat(outs, self.pad_id)

    def _generate_chunk(self, rows: list[list[int]], sampling: SamplingSettings) -> RolloutBatch:
        prompt_ids, prompt_mask = left_pad(rows, self.pad_id)
        greedy = sampling.temperature == 0
        # the sampled tokens' log-probs, one step at a time: keeping every step's logits (output_logits)
        # would hold [B, R, V] floats, 6 GiB for 256 rows x 128 tokens x SmolLM2's 49k vocabulary
        scorer = _StepLogProbs(1.0 if greedy else sampling.temperature)
        with scorer.watching(_causal_lm(self.model)):
            out = self._sample(prompt_ids, prompt_mask, sampling, greedy, scorer)
        response_ids = out.sequences[:, prompt_ids.shape[1] :].cpu()
        log_probs = torch.stack(scorer.log_probs, dim=1)  # [B, R]: one per generated token
        mask = cut_at_stop(
            response_ids, response_mask_after_eos(response_ids, self.eos_ids), self.tokenizer, sampling.stop
        )
        response_ids = torch.where(mask.bool(), response_ids, torch.full_like(response_ids, self.pad_id))
        return RolloutBatch(prompt_ids, prompt_mask, response_ids, mask, log_probs * mask)

    def _sample(self, prompt_ids, prompt_mask, sampling: SamplingSettings, greedy: bool, scorer) -> Any:
        from transformers import StoppingCriteriaList

        return self.model.generate(
            input_ids=prompt_ids.to(self.device),
            attention_mask=prompt_mask.to(self.device),
            do_sample=not greedy,
            temperature=None if greedy else sampling.temperature,
            top_p=None if greedy else sampling.top_p,
            top_k=0 if greedy else sampling.top_k,  # 0: none, whatever the model's generation_config says
            min_p=None if greedy or not sampling.min_p else sampling.min_p,
            repetition_penalty=1.0,  # nor a penalty: log-probs must be of the plain softmax
            max_new_tokens=sampling.max_new_tokens,
            eos_token_id=sorted(self.eos_ids),
            pad_token_id=self.pad_id,
            stopping_criteria=StoppingCriteriaList([scorer]),
            # stops early; cut_at_stop decides where a response ends
            stop_strings=list(sampling.stop) if sampling.stop else None,
            tokenizer=self.tokenizer if sampling.stop else None,
            return_dict_in_generate=True,
            synced_gpus=self.synced,
        )

    def submit(self, prompts: list[list[int]], sampling: SamplingSettings, seed: int) -> None:
        raise RuntimeError(_NO_OVERLAP)

    def collect(self) -> RolloutBatch:
        raise RuntimeError(_NO_OVERLAP)

    def finished_span(self) -> tuple[float, float] | None:
        return None  # never a rollout in flight

    def sync_weights(self, step: int) -> float:
        return 0.0  # the engine generates with the trained module itself

    def sleep(self) -> None:
        pass  # no memory of its own: the weights are the trainer's, there is no KV cache kept between calls

    def wake(self) -> None:
        pass

    def close(self) -> None:
        pass  # no process or file of its own


_NO_OVERLAP = (
    "rollout.engine=hf generates in the trainer's process and cannot overlap a rollout with the update "
    "(rollout.max_staleness=1 needs rollout.engine=vllm)"
)


def _causal_lm(model: Any) -> torch.nn.Module:
    """The transformers model whose forward `generate` calls (inside a peft wrapper, its base model)."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


class _StepLogProbs:
    """Log-probs of the sampled tokens under logits / temperature, as generate goes: a forward hook keeps
    the model's last-position logits of the step (the raw logits, before any logits processor, as
    output_logits gives them), and this criterion, called once the step's token is appended, turns them
    into that token's log-prob. It never stops generation. (A plain callable, as StoppingCriteriaList
    calls its items: subclassing transformers' StoppingCriteria would import transformers with this module.)"""

    def __init__(self, temperature: float) -> None:
        self.temperature = temperature
        self.log_probs: list[torch.Tensor] = []  # one [B] per generated token
        self._logits: torch.Tensor | None = None

    @contextmanager
    def watching(self, model: torch.nn.Module) -> Iterator[None]:
        handle = model.register_forward_hook(self._keep)
        try:
            yield
        finally:
            handle.remove()

    def _keep(self, module: Any, args: Any, output: Any) -> None:
        self._logits = output.logits[:, -1, :].to(dtype=torch.float32, copy=True)

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        assert self._logits is not None
        tokens = input_ids[:, -1]
        self.log_probs.append(log_probs_from_logits(self._logits / self.temperature, tokens).cpu())
        self._logits = None
        return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)


def _concat(parts: list[RolloutBatch], pad_id: int) -> RolloutBatch:
    """Concatenate chunks, re-padding prompts (left) and responses (right) to common widths."""
    if len(parts) == 1:
        return parts[0]
    p = max(b.prompt_ids.shape[1] for b in parts)
    r = max(b.response_ids.shape[1] for b in parts)

    def pad(t: torch.Tensor, width: int, value: float, left: bool) -> torch.Tensor:
        extra = width - t.shape[1]
        return torch.nn.functional.pad(t, (extra, 0) if left else (0, extra), value=value)

    return RolloutBatch(
        torch.cat([pad(b.prompt_ids, p, pad_id, True) for b in parts]),
        torch.cat([pad(b.prompt_mask, p, 0, True) for b in parts]),
        torch.cat([pad(b.response_ids, r, pad_id, False) for b in parts]),
        torch.cat([pad(b.response_mask, r, 0, False) for b in parts]),
        torch.cat([pad(b.rollout_log_probs, r, 0.0, False) for b in parts]),
    )
