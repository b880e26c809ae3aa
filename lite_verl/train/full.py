"""Full fine-tuning: what train.backend=fsdp (train/fsdp.py) and train.backend=deepspeed (train/zero3.py)
share -- `FullBackend` over a `Sharding`, the log-prob head, model preparation and the weights files.

    lite-verl train --preset laptop --set train.backend=fsdp --set sync.mode=merged

Every weight trains, so there is no adapter: the rollout engine gets the whole model (sync.mode=merged;
the HF engine generates with the trained module itself). `FullBackend` is a TrainBackend
(train/base.py); how the weights are sharded is a small strategy object it holds (`FSDPSharding` in
train/fsdp.py, `ZeroSharding` in train/zero3.py), and each of those modules builds its backend from the
pieces here. This module imports neither. Both shard over the torch.distributed group of train/dist.py:
one process, or one per train GPU (train/group.py). With several ranks, every rank runs
forward/backward/step, merged_weight_buckets and save in lockstep (they gather collectively); only
rank 0 pushes the buckets to the rollout engine and writes files. Each rank back-propagates its share
of a mini-batch, normalised by the whole mini-batch's counts, so the loss is multiplied by W to turn
the sharding's gradient average into the sum (train/dist.py).

Memory per train GPU (P parameters, world size W, b bytes per element of model.dtype):
* fsdp: fp32 master weights 4P/W, fp32 gradients 4P/W, AdamW m and v 8P/W; with train.offload_params
  (FSDP2's CPUOffloadPolicy moves all three together) they live in host memory and the optimizer steps
  there. In the forward, the gathered weights of the root (embeddings, head, final norm) and of about two
  decoder layers, cast to model.dtype (MixedPrecisionPolicy; gradients reduce in fp32).
* deepspeed: weights in model.dtype b*P/W (host with offload_params), fp32 master, gradients and AdamW
  state 16P/W (host with offload_optimizer; DeepSpeed's CPU Adam then steps there).
* the reference policy of the KL loss (or in-reward KL): a frozen copy of the *initial* weights in
  model.dtype, b*P/W more, sharded the same way and in host memory with offload_params. It is loaded from
  model.path at the first reference forward, so a run without KL never pays for it.
lite_verl/tools/plan.py counts these.
"""

from __future__ import annotations

import contextlib
import math
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Protocol

import torch

from lite_verl.batch import position_ids
from lite_verl.config import Config, CriticConfig, TrainConfig
from lite_verl.errors import ConfigError
from lite_verl.train.base import Bucket, Convert, LinearGroup, Transform, set_group_lr
from lite_verl.train.head import response_log_probs

WEIGHTS = "model.safetensors"  # full weights in a checkpoint: RUN/checkpoints/step_N/model/


class Sharding(Protocol):
    """How a full fine-tuning backend holds, steps and gathers its weights (FSDP2 or ZeRO-3)."""

    model: torch.nn.Module  # the HF causal LM (generate, parameter names)
    forward_module: Callable[..., Any]  # what training forwards call (FSDP: the model; ZeRO-3: its engine)

    def backward(self, loss: torch.Tensor) -> None:
        """Accumulate the gradients of `loss` (averaged over the ranks by the sharding)."""
        ...

    def step(self, max_norm: float) -> float:
        """Clip at max_norm, step unless the norm is not finite, zero the gradients; the pre-clip norm."""
        ...

    def zero_grad(self) -> None: ...

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        """The optimizer stepping the trained weights (its param_groups carry the learning rate)."""
        ...

    def settle(self, module: torch.nn.Module | None = None) -> None:
        """Every weight of `module` (the trained model by default) back in its resting (sharded) state:
        before reading them, and after a no-grad forward."""
        ...

    def gathered(self, module: torch.nn.Module) -> contextlib.AbstractContextManager[dict[str, torch.Tensor]]:
        """A context giving {name: full tensor} of the module's own parameters (not its children's)."""
        ...

    def local_bytes(self) -> int:
        """Bytes of this rank's shards of the trained weights."""
        ...

    def save(self, directory: Path) -> None: ...
    def load(self, directory: Path) -> None: ...


class LogProbHead(torch.nn.Module):
    """The LM head as a module that a sharded model's forward reaches through the sharding's hooks (the
    weight is whole only inside them). Given `targets` (the `targeting` context) it returns, in place of
    logits, [..., 2] = (log-prob of each target, entropy) from train/head.fused_log_probs: the update never
    materialises [tokens, vocabulary] logits. Otherwise (generation) it returns logits, in fp32 with
    `fp32`. It holds the original weight Parameter: tied embeddings stay tied, the state-dict name stays
    `lm_head.weight`."""

    def __init__(self, linear: torch.nn.Linear, fp32: bool) -> None:
        super().__init__()
        self.weight = linear.weight
        self.fp32 = fp32
        self.pending: tuple[torch.Tensor, float, bool] | None = None

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        from lite_verl.train.head import fp32_logits, fused_log_probs

        if self.pending is not None:
            targets, temperature, with_entropy = self.pending
            lp, ent = fused_log_probs(hidden, self.weight, targets, temperature, self.fp32, with_entropy)
            return torch.stack([lp, ent if ent is not None else torch.zeros_like(lp)], dim=-1)
        if self.fp32:
            return fp32_logits(hidden, self.weight)
        return torch.nn.functional.linear(hidden, self.weight)

    @contextlib.contextmanager
    def targeting(self, targets: torch.Tensor, temperature: float, with_entropy: bool) -> Iterator[None]:
        self.pending = (targets, temperature, with_entropy)
        try:
            yield
        finally:
            self.pending = None


def prepare_model(model: torch.nn.Module, fp32_head: bool, checkpointing: bool) -> torch.nn.Module:
    """Before sharding: the log-prob head swapped in for a plain linear head (fp32 with `fp32_head`),
    gradient checkpointing on (non-reentrant)."""
    head = model.get_output_embeddings()
    if type(head) is torch.nn.Linear and head.bias is None:
        model.set_output_embeddings(LogProbHead(head, fp32_head))
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The repeated blocks a sharding wraps one by one (model.model.layers for Qwen2/Llama-like LMs)."""
    layers = getattr(getattr(model, "model", None), "layers", None)
    if not isinstance(layers, torch.nn.ModuleList):
        raise ConfigError(
            f"train.backend=fsdp/deepspeed: cannot find the decoder layers of {type(model).__name__} "
            "(expected model.model.layers); use train.backend=lora for this model"
        )
    return list(layers)


def gathered_modules(sharding: Sharding) -> Iterator[tuple[str, torch.nn.Module, dict[str, torch.Tensor]]]:
    """(module name, module, {param name: full tensor}) for each module owning parameters, in model
    order, gathered one module at a time; a parameter shared by two modules (tied embeddings) only
    with the first."""
    sharding.settle()
    seen: set[int] = set()
    for name, module in sharding.model.named_modules():
        own = [(n, p) for n, p in module.named_parameters(recurse=False) if id(p) not in seen]
        if not own:
            continue
        seen.update(id(p) for _, p in own)
        with sharding.gathered(module) as full:
            yield name, module, {n: full[n] for n, _ in own}


class FullBackend:
    """A TrainBackend (train/base.py) in which every weight trains, held by `sharding`.
    `load_reference()` builds the frozen initial policy (sharded like the trained one) the first time a
    reference forward is asked for."""

    has_adapter = False  # the rollout engine gets the whole model (sync.mode=merged)
    supports_critic = False  # validation refuses algorithm.adv_estimator=gae first
    sharded = True  # FSDP2 / ZeRO-3 split every weight over the ranks

    def __init__(
        self,
        sharding: Sharding,
        cfg: TrainConfig,
        device: torch.device,
        load_reference: Callable[[], Callable[..., Any]],
        world: int = 1,
    ) -> None:
        self.sharding = sharding
        self.world = world  # ranks: FSDP2 / ZeRO-3 average gradients over them; update.py wants the sum
        self.model = sharding.model
        self.device = device
        self.grad_clip = cfg.grad_clip
        self._load_reference = load_reference
        self._reference: Callable[..., Any] | None = None

    # --- forward -------------------------------------------------------------------------------
    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        response_length: int,
        temperature: float,
        with_entropy: bool = False,
        reference: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Log-probs [N, R] of the response tokens (and entropy [N, R]) under logits / temperature.
        reference=True runs the frozen initial policy (no grad)."""
        input_ids, attention_mask = input_ids.to(self.device), attention_mask.to(self.device)
        if not reference:
            module = self.sharding.forward_module
            return _log_probs(module, input_ids, attention_mask, response_length, temperature, with_entropy)
        if self._reference is None:
            self._reference = self._load_reference()
        with torch.no_grad():
            out = _log_probs(
                self._reference, input_ids, attention_mask, response_length, temperature, with_entropy
            )
        self.sharding.settle(self._reference)  # FSDP2 keeps a root gathered after its forward: not here
        return out

    # --- update --------------------------------------------------------------------------------
    def zero_grad(self) -> None:
        self.sharding.zero_grad()

    def set_lr(self, lr: float) -> None:
        set_group_lr(self.sharding.optimizer, lr)

    def backward(self, loss: torch.Tensor) -> None:
        self.sharding.backward(loss * self.world if self.world > 1 else loss)

    def step(self) -> float:
        """Clip, step, zero the gradients. Returns the pre-clip global grad norm (non-finite: no step)."""
        return self.sharding.step(self.grad_clip if self.grad_clip > 0 else math.inf)

    def train_mode(self, on: bool = True) -> None:
        self.model.train(on)

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        return contextlib.nullcontext()  # the model computes in its own dtype already

    # --- critic: not with full fine-tuning (validation refuses adv_estimator=gae first) ----------
    def enable_critic(self, cfg: CriticConfig) -> None:
        raise ConfigError(_NO_CRITIC)

    def critic_mode(self) -> contextlib.AbstractContextManager[Any]:
        raise ConfigError(_NO_CRITIC)

    def values(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, response_length: int
    ) -> torch.Tensor:
        raise ConfigError(_NO_CRITIC)

    def zero_critic_grad(self) -> None:
        pass  # no critic, no gradients

    def critic_step(self) -> float:
        raise ConfigError(_NO_CRITIC)

    # --- weight sync into a rollout engine --------------------------------------------------------
    def adapter_state(self, transform: Transform | None = None) -> tuple[dict[str, torch.Tensor], dict]:
        raise ConfigError(_NO_ADAPTER)

    def export_adapter(
        self, directory: Path, dtype: str | None = None, transform: Transform | None = None
    ) -> None:
        raise ConfigError(_NO_ADAPTER)

    @torch.no_grad()
    def merged_linears(self) -> Iterator[LinearGroup]:
        """Yield, per parent module, [(HF module name, weight in fp32, bias)] of its linear layers (and
        the LM head): the trained weights, gathered from their shards."""
        group: LinearGroup = []
        parent = None
        for name, module, full in gathered_modules(self.sharding):
            if not isinstance(module, (torch.nn.Linear, LogProbHead)):
                continue
            if group and name.rpartition(".")[0] != parent:
                yield group
                group = []
            parent = name.rpartition(".")[0]
            group.append((name, full["weight"].float(), full.get("bias")))
        if group:
            yield group

    @torch.no_grad()
    def merged_weight_buckets(
        self, bucket_bytes: int, dtype: str, convert: Convert | None = None, everything: bool = False
    ) -> Iterator[Bucket]:
        """Lists of (HF parameter name, tensor) of about bucket_bytes each: every weight of the model
        (each one trains, so `everything` changes nothing), gathered one module at a time and rounded
        once to `dtype`. `convert(name, weight, bias) -> {name: tensor}` replaces that rounding for
        linear layers. A parent module's tensors are never split across buckets (vLLM reloads fused
        q/k/v, gate/up whole)."""
        from lite_verl.device import torch_dtype

        target = torch_dtype(dtype)
        bucket: Bucket = []
        size, parent = 0, None
        for name, module, full in gathered_modules(self.sharding):
            if size >= bucket_bytes and name.rpartition(".")[0] != parent:
                yield bucket
                bucket, size = [], 0
            parent = name.rpartition(".")[0]
            prefix = f"{name}." if name else ""
            if convert is not None and isinstance(module, (torch.nn.Linear, LogProbHead)):
                out = convert(name, full["weight"].float(), full.get("bias"))
            else:
                out = {prefix + n: t.to(target) for n, t in full.items()}
            for n, t in out.items():
                bucket.append((n, t))
                size += t.numel() * t.element_size()
        if bucket:
            yield bucket

    # --- the card handed to a colocated vLLM: not here ---------------------------------------------
    def park(self) -> None:
        raise ConfigError(
            "train.offload_during_rollout is for lora/qlora; full fine-tuning offloads with train.offload_params"
        )

    def unpark(self) -> None:
        pass  # never parked

    # --- checkpoints ---------------------------------------------------------------------------
    def save(self, directory: Path) -> None:
        """Full weights + optimizer state (the sharding's format) into `directory` (RunDir makes it
        atomic: a temp dir renamed when complete)."""
        self.sharding.save(directory)

    def load(self, directory: Path) -> None:
        self.sharding.load(directory)

    def parameter_bytes(self) -> int:
        """Bytes of this rank's shards of the trained weights (the reference not included)."""
        return self.sharding.local_bytes()


def _log_probs(
    module: Callable[..., Any],
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    response_length: int,
    temperature: float,
    with_entropy: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The response's log-probs (and entropies) from `module` (a model, or a ZeRO-3 engine around one),
    through LogProbHead when the model has one."""
    # logits at position t predict token t+1: the response is predicted by [P-1, P+R-1), i.e. the
    # last R+1 positions' logits without the very last
    kwargs = dict(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids(attention_mask),
                  logits_to_keep=response_length + 1, use_cache=False)  # fmt: skip
    targets = input_ids[:, -response_length:]
    head = getattr(module, "module", module).get_output_embeddings()  # a ZeRO-3 engine wraps the model
    if not isinstance(head, LogProbHead):
        return response_log_probs(module(**kwargs).logits[:, :-1], targets, temperature, with_entropy)
    # the last kept position predicts past the sequence: a dummy target, dropped below
    padded = torch.cat([targets, torch.zeros_like(targets[:, :1])], dim=1)
    with head.targeting(padded, temperature, with_entropy):
        out = module(**kwargs).logits[:, :-1]
    return out[..., 0], (out[..., 1] if with_entropy else None)


_NO_ADAPTER = (
    "sync.mode=adapter: full fine-tuning (train.backend=fsdp/deepspeed) has no adapter; set sync.mode=merged"
)
_NO_CRITIC = (
    "algorithm.adv_estimator=gae needs a critic, which full fine-tuning does not build; "
    "use train.backend=lora or a critic-free estimator (grpo)"
)


# --- checkpoints: full weights as a HF model directory ------------------------------------------
def save_weights(weights: dict[str, torch.Tensor], directory: Path, model_dir: Path) -> None:
    """A loadable HF model directory: config files of model.path + model.safetensors (fp32 masters;
    from_pretrained casts them). A tensor shared by two names (tied embeddings) is written once."""
    from safetensors.torch import save_file

    directory.mkdir(parents=True, exist_ok=True)
    seen: set[int] = set()
    unique = {}
    for name, t in weights.items():
        if t.data_ptr() not in seen:
            seen.add(t.data_ptr())
            unique[name] = t.contiguous()
    save_file(unique, str(directory / WEIGHTS), metadata={"format": "pt"})
    for name in ("config.json", "generation_config.json"):
        if (model_dir / name).is_file():
            shutil.copy(model_dir / name, directory / name)


def check_full_checkpoint(checkpoint: Path) -> None:
    if not (checkpoint / "model" / WEIGHTS).is_file():
        raise ConfigError(
            f"checkpoint {checkpoint} holds no full weights (model/{WEIGHTS}): it was not written by "
            "train.backend=fsdp/deepspeed; resume it with the backend it was trained with"
        )


def load_weights(directory: Path, model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """save_weights' file as a full state dict of `model` (tied names filled in)."""
    from safetensors.torch import load_file

    weights = load_file(str(directory / WEIGHTS))
    names: dict[int, str] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        if id(p) in names and name not in weights:
            weights[name] = weights[names[id(p)]]
        names.setdefault(id(p), name)
    return weights


# --- the model a sharding starts from ----------------------------------------------------------------
def load_full_model(cfg: Config, model_dir: Path, dtype: str) -> torch.nn.Module:
    """The HF model in `dtype` on the host (the sharding moves it), fp32 head and checkpointing set."""
    from dataclasses import replace

    from lite_verl.model.load import load_model

    model = load_model(model_dir, replace(cfg.model, dtype=dtype), torch.device("cpu"))
    if cfg.train.use_liger:
        from lite_verl.train.kernels import apply_liger

        apply_liger(model)  # module forwards and a function: kept through the sharding
    fp32_head = cfg.model.fp32_lm_head and cfg.model.dtype != "float32"
    return prepare_model(model, fp32_head, cfg.train.checkpointing)
