"""The training-backend interface: everything the loop, the update, the rollout engines and RunDir ask
of a trainer, one meaning per method.

Backends (train/rank.py builds the one a config asks for on each rank; train/factory.py is what the
loop calls):
  LoraBackend   LoRA on a frozen base, or on a 4-bit base (qlora)          train/lora.py
  FullBackend   every weight trains, sharded by FSDP2 or by ZeRO-3         train/full.py over
                                                                           train/fsdp.py, train/zero3.py
  GroupBackend  rank 0's backend when several ranks train: announces to    train/group.py
                the followers what every rank must do together

What differs between backends is said by three attributes, not by missing methods: `has_adapter`
(LoRA: an adapter to serve; full fine-tuning: none, so adapter_state/export_adapter raise ConfigError),
`supports_critic` (LoRA: a second adapter and a value head; full: enable_critic raises ConfigError)
and `sharded` (full fine-tuning: the trained weights are split over the ranks, so every rank takes
part in forwards, weight gathers and saves). Where the trainer computes is `device`.

Tensor shapes: N rows (sequences), T = prompt + response tokens (left-padded prompts), R response
tokens (the last R of each row).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import torch

from lite_verl.config import CriticConfig

# transform(peft key, tensor) -> tensor: maps an adapter tensor before it is served (AWQ's scaled space)
Transform = Callable[[str, torch.Tensor], torch.Tensor]
# convert(HF module name, merged weight in fp32, bias) -> {parameter name: tensor}: replaces the rounding
# of a linear layer to the serving dtype (AWQ re-quantization)
Convert = Callable[[str, torch.Tensor, torch.Tensor | None], dict[str, torch.Tensor]]
LinearGroup = list[tuple[str, torch.Tensor, torch.Tensor | None]]  # [(HF module name, weight, bias)]
Bucket = list[tuple[str, torch.Tensor]]  # [(HF parameter name, tensor)]


def set_group_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    """Every parameter group of `optimizer` at learning rate `lr`."""
    for group in optimizer.param_groups:
        group["lr"] = lr


@runtime_checkable
class TrainBackend(Protocol):
    """A policy being trained (and, for PPO, its critic), as the loop and the update use it."""

    # read-only to callers; a backend may hold them as plain attributes
    @property
    def device(self) -> torch.device:
        """Where the trainer computes (rank 0's device in a group); forward/values move inputs there."""
        ...

    @property
    def model(self) -> torch.nn.Module:
        """The trained HF causal LM (LoRA: the peft model around it), e.g. for HF generate."""
        ...

    @property
    def has_adapter(self) -> bool:
        """The trained weights are an adapter that a rollout engine can serve by itself (LoRA)."""
        ...

    @property
    def supports_critic(self) -> bool:
        """enable_critic can build a critic (PPO's values, algorithm.adv_estimator=gae)."""
        ...

    @property
    def sharded(self) -> bool:
        """The trained weights are split over the ranks (full fine-tuning): with several ranks every rank
        runs forwards, merged_linears/merged_weight_buckets and save together."""
        ...

    # --- the policy -----------------------------------------------------------------------------
    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        response_length: int,
        temperature: float,
        with_entropy: bool = False,
        reference: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Log-probs [N, R] of the last `response_length` tokens of input_ids [N, T] under
        logits / temperature, and their entropies [N, R] with `with_entropy` (else None); fp32, on
        `device`. With grad unless the caller disables it. reference=True: the frozen initial policy
        (the KL reference), always without grad."""
        ...

    def backward(self, loss: torch.Tensor) -> None:
        """Accumulate the gradients of `loss` (a scalar of this rank's rows, normalised by the whole
        mini-batch) into the policy's -- and inside `critic_mode`, the critic's -- gradients. Several
        calls add up until `step`/`critic_step`; over several ranks they add up as a sum over ranks."""
        ...

    def step(self) -> float:
        """Clip the policy's gradients at train.grad_clip, take one optimizer step, zero them. Returns
        the pre-clip global gradient norm; a non-finite norm skips the step (every rank agrees)."""
        ...

    def zero_grad(self) -> None:
        """Drop the policy's accumulated gradients (also after an out-of-memory retry)."""
        ...

    def set_lr(self, lr: float) -> None:
        """The policy optimizer's learning rate from the next step on (train.lr_scheduler; the critic's
        rate, critic.lr, stays constant)."""
        ...

    def train_mode(self, on: bool = True) -> None:
        """torch's train (dropout on) or eval mode for the trained model."""
        ...

    def autocast(self) -> AbstractContextManager[Any]:
        """The context the policy's forward computes in: torch.autocast to the model's dtype for LoRA on a
        bf16 model (fp32 adapters, bf16 maths), nothing otherwise. The HF rollout engine samples under it
        too, so that sampling and the update run the same maths."""
        ...

    # --- the critic (algorithm.adv_estimator=gae) -----------------------------------------------------
    def enable_critic(self, cfg: CriticConfig) -> None:
        """Build the critic (once, when the backend is built, on every rank). ConfigError when
        `supports_critic` is False."""
        ...

    def critic_mode(self) -> AbstractContextManager[Any]:
        """A context inside which `values` and `backward` address the critic; the policy again after.
        Needs enable_critic first (full fine-tuning: ConfigError)."""
        ...

    def values(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, response_length: int
    ) -> torch.Tensor:
        """V(s_t) [N, R] in fp32: the value of the state before each response token. Inside
        `critic_mode`."""
        ...

    def zero_critic_grad(self) -> None:
        """Drop the critic's accumulated gradients (nothing when there is no critic)."""
        ...

    def critic_step(self) -> float:
        """`step` for the critic: clip, step, zero; returns the pre-clip norm. Needs enable_critic first
        (full fine-tuning: ConfigError)."""
        ...

    # --- weight sync into a rollout engine ----------------------------------------------------------
    def adapter_state(self, transform: Transform | None = None) -> tuple[dict[str, torch.Tensor], dict]:
        """The policy's adapter: ({peft key: tensor} mapped by `transform`, peft config as a JSON-ready
        dict), what an engine needs to serve it (sync.mode=adapter). ConfigError unless `has_adapter`."""
        ...

    def export_adapter(
        self, directory: Path, dtype: str | None = None, transform: Transform | None = None
    ) -> None:
        """adapter_state written to `directory` in peft's file format, cast to `dtype` (None: as held).
        ConfigError unless `has_adapter`."""
        ...

    def merged_linears(self) -> Iterator[LinearGroup]:
        """The trained linear layers as dense weights, one list per parent module (a fused q/k/v or
        gate/up group is never split): [(HF module name, weight in fp32, bias)]. LoRA: W + s * B @ A of
        every module holding an adapter, its other linear layers as they are; full: every linear layer
        and the LM head. Sharded: a collective (every rank iterates it)."""
        ...

    def merged_weight_buckets(
        self, bucket_bytes: int, dtype: str, convert: Convert | None = None, everything: bool = False
    ) -> Iterator[Bucket]:
        """What sync.mode=merged loads into an engine: lists of (HF parameter name, tensor) of at least
        `bucket_bytes` each (the last may be smaller; a parent module's tensors never split), rounded
        once to `dtype` -- or for linear layers turned into tensors by `convert`. They hold every
        weight training changes (merged_linears' layers); with `everything` also every weight it does
        not change (LoRA's embeddings, norms, unadapted layers), for an engine that discarded its own.
        Full fine-tuning changes every weight, so its buckets are always the whole model. Tensors stay
        on the trainer's device. Sharded: a collective (every rank iterates it)."""
        ...

    # --- the card handed to a colocated vLLM (train.offload_during_rollout) ------------------------
    def park(self) -> None:
        """Between updates: every weight, adapter and optimizer state of the trainer to pinned host memory
        (train/park.py), the card's cache emptied, until `unpark` (or `load`, which unparks). Saving still
        works while parked. Only LoRA parks; full fine-tuning offloads with train.offload_params instead
        (ConfigError)."""
        ...

    def unpark(self) -> None:
        """Back on the card what `park` moved (nothing when not parked)."""
        ...

    # --- checkpoints ------------------------------------------------------------------------------
    def save(self, directory: Path) -> None:
        """The trained state (weights or adapter, optimizer state, critic) into `directory`, which
        exists (RunDir makes the write atomic). Layout: LoRA adapter/ + optimizer.pt (+ critic.pt);
        fsdp model/ + optimizer.pt; deepspeed deepspeed/ + model/."""
        ...

    def load(self, directory: Path) -> None:
        """What `save` wrote, back into this backend; ConfigError for a checkpoint of another backend
        or other settings."""
        ...

    def parameter_bytes(self) -> int:
        """Bytes of parameter storage this process holds for the trained model and its critic (its
        shards when sharded; a frozen base counted, the KL reference of full fine-tuning not)."""
        ...


def clip_gradients(params: list[torch.nn.Parameter], max_norm: float) -> float:
    """Clip the gradients to a global norm of max_norm; -> the norm before. A non-finite norm leaves them as
    they are (torch's clip_grad_norm_ would scale every one by NaN, hiding where it started)."""
    utils = torch.nn.utils
    if not hasattr(utils, "get_total_norm"):  # torch < 2.6
        return float(utils.clip_grad_norm_(params, max_norm))
    norm = utils.get_total_norm([p.grad for p in params if p.grad is not None])
    if bool(torch.isfinite(norm)):
        utils.clip_grads_with_norm_(params, max_norm, norm)
    return float(norm)


def nonfinite_gradients(named: Iterable[tuple[str, torch.nn.Parameter]]) -> str:
    """Where a non-finite gradient norm comes from, in one line: which trained tensors hold NaN or inf
    gradients and the decoder layers they span. The backward runs from the head down, so a value born
    in layer k's backward spoils layers 0..k: the highest spoiled layer is where it started (every layer
    spoiled: the loss, the head or the last layer)."""
    bad, total, layers, kinds = 0, 0, [], set()
    for name, p in named:
        if p.grad is None:
            continue
        total += 1
        if bool(torch.isfinite(p.grad).all()):
            continue
        bad += 1
        found = re.search(r"layers\.(\d+)\.", name)
        if found:
            layers.append(int(found.group(1)))
        kinds.add(re.sub(r".*\.(\w+_proj)\..*", r"\1", name) if "_proj" in name else name.rsplit(".", 2)[-2])
    if not bad:
        return "every gradient is finite (the non-finite value came from the loss)"
    span = f"decoder layers {min(layers)}..{max(layers)}" if layers else "no decoder layer"
    return f"non-finite gradients in {bad} of {total} trained tensors ({span}; {', '.join(sorted(kinds))})"
