"""train.backend=lora and qlora: a peft LoRA adapter trained on a frozen base (qlora: a 4-bit NF4 base).

    lite-verl train --preset laptop                                  # train.backend=lora
    lite-verl train --preset 4090x1 --set train.backend=qlora        # needs bitsandbytes

`LoraBackend` is a TrainBackend (train/base.py); `build_lora_backend` makes one from model.path. The KL
reference is the base with the adapter switched off, so it costs no memory. PPO's critic
(algorithm.adv_estimator=gae) is a second adapter on the same base plus a value head. The rollout
engine gets the adapter alone (sync.mode=adapter: adapter_state / export_adapter) or the merged
weights W + s * B @ A (sync.mode=merged: merged_weight_buckets). forward/backward/step are separate so
that update.py owns micro-batching and the loss. With several ranks (train/group.py) each holds a
replica: build_rank_backend (train/rank.py) broadcasts rank 0's, and `step` sums the ranks' gradients.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path
from typing import Any

import torch

from lite_verl.batch import position_ids
from lite_verl.config import ALL_LINEAR, Config, CriticConfig, TrainConfig
from lite_verl.errors import ConfigError
from lite_verl.tensorfile import FlatFileWriter
from lite_verl.train.base import (
    Bucket,
    Convert,
    LinearGroup,
    Transform,
    clip_gradients,
    nonfinite_gradients,
    set_group_lr,
)
from lite_verl.train.dist import sum_gradients
from lite_verl.train.head import response_log_probs
from lite_verl.train.park import HostPark, embeddings_to_host


def dense_weight(linear: torch.nn.Module) -> torch.Tensor:
    """A linear layer's weight in fp32; a bitsandbytes 4-bit one (QLoRA) is dequantized."""
    quant_state = getattr(linear.weight, "quant_state", None)
    if quant_state is not None:
        import bitsandbytes.functional as bnb_f

        return bnb_f.dequantize_4bit(linear.weight.data, quant_state).float()
    return linear.weight.float()


def build_lora_backend(cfg: Config, model_dir: Path, device: torch.device) -> LoraBackend:
    """train.backend=lora|qlora on `device`: the base from model_dir (NF4 for qlora), a fresh adapter
    initialised from trainer.seed."""
    from lite_verl.model.load import load_model

    base = load_model(model_dir, cfg.model, device, nf4=cfg.train.backend == "qlora")
    if cfg.train.use_liger:
        from lite_verl.train.kernels import apply_liger

        apply_liger(base)  # before peft wraps the projections the fused MLP calls
    return LoraBackend(base, cfg.train, device, cfg.trainer.seed, cfg.model.fp32_lm_head)


def keep_input_dtype(model: torch.nn.Module, keep: bool = True) -> None:
    """peft casts each adapted layer's input to the adapter's dtype (fp32) before autocast casts it back
    to bf16 for the product: two activation-sized copies per adapted linear, forward and again in the
    recompute and backward (~0.7 s of a 4.3 s 1.5B update on an H200, #29). Every forward of a bf16
    model runs under `LoraBackend.autocast()`, which casts the small fp32 adapter weights instead, so
    the input stays bf16: the same products (a bf16 value widened and rounded back is itself), fp32
    master weights and gradients as before. A forward outside autocast would now fail loudly on the
    dtype mismatch rather than silently run the adapters in fp32. keep=False: peft's casts again."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    for module in model.modules():
        if isinstance(module, BaseTunerLayer):
            module.cast_input_dtype_enabled = not keep  # peft >= 0.15 reads it (peft.helpers)


class LoraBackend:
    """A TrainBackend (train/base.py): LoRA on a frozen base (train.backend=lora), or on a 4-bit NF4
    base (train.backend=qlora: the base comes from model.load_model(nf4=True); peft wraps its
    Linear4bit layers the same way)."""

    has_adapter = True
    supports_critic = True  # a second adapter on the same base, plus a value head
    sharded = False  # each rank holds a whole replica of the adapter

    def __init__(
        self,
        base: torch.nn.Module,
        cfg: TrainConfig,
        device: torch.device,
        seed: int,
        fp32_lm_head: bool = True,
    ) -> None:
        from peft import LoraConfig, get_peft_model

        self.device = device
        names = {n.rsplit(".", 1)[-1] for n, _ in base.named_modules()}
        every = cfg.all_linear
        missing = [] if every else [m for m in cfg.target_modules if m not in names]
        if missing:
            raise ConfigError(
                f"train.target_modules {missing} are not module names of this model; "
                f"choose from e.g. {sorted(n for n in names if n.endswith('proj'))[:8]}"
            )
        self.lora_config = LoraConfig(
            r=cfg.lora_rank,
            lora_alpha=cfg.lora_alpha,
            lora_dropout=cfg.lora_dropout,
            # peft's own 'all-linear': every linear layer but the output head
            target_modules=ALL_LINEAR if every else list(cfg.target_modules),
            task_type="CAUSAL_LM",
        )
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)  # LoRA A init
            self.model = get_peft_model(base, self.lora_config)
        if cfg.checkpointing:
            self.model.gradient_checkpointing_enable()
            self.model.enable_input_require_grads()
        if cfg.embeddings_on_host:
            embeddings_to_host(self.model, device)
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        head = self.model.get_base_model().get_output_embeddings()
        # a plain linear head: the update's log-probs come from the hidden states without materialised
        # logits (train/head.fused_log_probs), computed in fp32 for a bf16/fp16 model when fp32_lm_head
        self.fused_head = type(head) is torch.nn.Linear and head.bias is None
        self.fp32_head = self.fused_head and fp32_lm_head and head.weight.dtype != torch.float32
        self.optimizer = torch.optim.AdamW(self.params, lr=cfg.lr, weight_decay=cfg.weight_decay)
        # peft keeps the adapters in fp32 (master weights; AdamW's state is fp32 too) and, left alone, runs
        # them in fp32: each adapted linear casts its input up and multiplies in fp32. A bf16 model's
        # forward runs under autocast instead, so the adapters compute in the model's dtype like the rest
        # of the model (verl's and HF Trainer's bf16 maths) while their weights and gradients stay fp32.
        # fp16 is left out: its gradients would need loss scaling, which this trainer does not do
        dtype = self.model.get_base_model().get_input_embeddings().weight.dtype
        self.compute_dtype = dtype if dtype == torch.bfloat16 else None
        if self.compute_dtype is not None:
            keep_input_dtype(self.model)
        self.grad_clip = cfg.grad_clip
        self.value_head: torch.nn.Linear | None = None
        self._adapter_config: dict | None = None
        self._adapter_tensors: dict[str, torch.Tensor] | None = None
        self._adapter_writer = FlatFileWriter()
        self.critic_params: list[torch.nn.Parameter] = []
        self.critic_optimizer: torch.optim.Optimizer | None = None
        self._parking = HostPark(device)

    # --- critic: a second adapter on the same frozen base, plus a value head ----------------------
    def enable_critic(self, cfg: CriticConfig) -> None:
        """PPO's critic shares the actor's base weights: only its adapter and value head are new."""
        self.model.add_adapter("critic", self.lora_config)
        self.model.set_adapter("default")
        hidden = self.model.get_base_model().config.hidden_size
        self.value_head = torch.nn.Linear(hidden, 1).to(self.device, torch.float32)
        torch.nn.init.zeros_(self.value_head.weight)  # V = 0 at the start: advantages = whitened returns
        torch.nn.init.zeros_(self.value_head.bias)
        adapter = [p for n, p in self.model.named_parameters() if ".critic." in n]
        self.critic_params = adapter + list(self.value_head.parameters())
        self.critic_optimizer = torch.optim.AdamW(self.critic_params, lr=cfg.lr, weight_decay=0.0)

    @contextmanager
    def critic_mode(self) -> Iterator[None]:
        """The critic adapter is active (and trainable) inside; the actor's again after."""
        self.model.set_adapter("critic")
        try:
            yield
        finally:
            self.model.set_adapter("default")

    def values(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, response_length: int
    ) -> torch.Tensor:
        """V(s_t) [N, R]: the value of the state before each response token (verl's alignment).
        Call inside `critic_mode()`."""
        assert self.value_head is not None, "enable_critic() first"
        input_ids, attention_mask = input_ids.to(self.device), attention_mask.to(self.device)
        backbone = self.model.get_base_model().base_model  # the decoder without its LM head
        with self.autocast():
            out = backbone(
                input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids(attention_mask)
            )
        hidden = out.last_hidden_state[:, -response_length - 1 : -1]
        return self.value_head(hidden.float()).squeeze(-1)

    def zero_critic_grad(self) -> None:
        if self.critic_optimizer is not None:
            self.critic_optimizer.zero_grad(set_to_none=True)

    def critic_step(self) -> float:
        assert self.critic_optimizer is not None
        sum_gradients(self.critic_params)  # several ranks: each holds its rows' share (train/dist.py)
        max_norm = self.grad_clip if self.grad_clip > 0 else math.inf
        norm = float(torch.nn.utils.clip_grad_norm_(self.critic_params, max_norm))
        if math.isfinite(norm):
            self.critic_optimizer.step()
        self.critic_optimizer.zero_grad(set_to_none=True)
        return norm

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

        reference=True runs the base with the adapter disabled (no grad).
        """
        input_ids = input_ids.to(self.device)
        attention_mask = attention_mask.to(self.device)
        if reference:
            with torch.no_grad(), self.model.disable_adapter():
                return self._log_probs(input_ids, attention_mask, response_length, temperature, with_entropy)
        return self._log_probs(input_ids, attention_mask, response_length, temperature, with_entropy)

    def _log_probs(self, input_ids, attention_mask, response_length, temperature, with_entropy):
        kwargs = dict(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids(attention_mask)
        )
        # logits at position t predict token t+1: the response tokens are predicted by [P-1, P+R-1)
        targets = input_ids[:, -response_length:]
        if self.fused_head:
            from lite_verl.train.head import fused_log_probs

            causal_lm = self.model.get_base_model()
            with self.autocast():
                hidden = causal_lm.base_model(**kwargs).last_hidden_state[:, -response_length - 1 : -1]
            weight = causal_lm.get_output_embeddings().weight  # the head: fp32 products, outside autocast
            return fused_log_probs(hidden, weight, targets, temperature, self.fp32_head, with_entropy)
        with self.autocast():
            logits = self.model(**kwargs).logits[:, -response_length - 1 : -1]
        return response_log_probs(logits, targets, temperature, with_entropy)

    def autocast(self) -> AbstractContextManager[Any]:
        """The forward's compute in the model's dtype (bf16 models; others are left as they are). The HF
        rollout engine samples under it too (rollout/factory.py), so both sides run the adapters alike."""
        if self.compute_dtype is None:
            return nullcontext()
        return torch.autocast(self.device.type, dtype=self.compute_dtype)

    # --- update --------------------------------------------------------------------------------
    def zero_grad(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)

    def set_lr(self, lr: float) -> None:
        set_group_lr(self.optimizer, lr)

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    def step(self) -> float:
        """Sum the ranks' gradients (train/dist.py; nothing with one rank), clip, step. Returns the pre-clip
        global grad norm; skips the step when it is not finite (every rank sees the same norm)."""
        sum_gradients(self.params)
        max_norm = self.grad_clip if self.grad_clip > 0 else math.inf
        norm = clip_gradients(self.params, max_norm)
        if math.isfinite(norm):
            self.optimizer.step()
        else:  # the step is skipped (loop.py warns); say where the value started
            trained = ((n, p) for n, p in self.model.named_parameters() if p.requires_grad)
            print(f"lite-verl: warning: {nonfinite_gradients(trained)}", file=sys.stderr, flush=True)
        self.zero_grad()
        return norm

    def train_mode(self, on: bool = True) -> None:
        self.model.train(on)

    # --- weight sync into a rollout engine --------------------------------------------------------
    def adapter_state(self, transform: Transform | None = None) -> tuple[dict[str, torch.Tensor], dict]:
        """The actor's LoRA tensors in peft's key format (live views; `transform(key, tensor) -> tensor`
        maps them first, e.g. AWQ: into the quantized model's scaled space) and its peft config as a
        JSON-ready dict: what a rollout engine needs to serve the adapter."""
        import json

        from peft import get_peft_model_state_dict

        if self._adapter_config is None:
            config = self.model.peft_config["default"].to_dict()
            self._adapter_config = json.loads(json.dumps(config, default=list))
        if self._adapter_tensors is None:  # views of the LoRA parameters
            self._adapter_tensors = get_peft_model_state_dict(self.model, adapter_name="default")
        state = self._adapter_tensors
        if transform is not None:
            state = {k: transform(k, v) for k, v in state.items()}
        return state, self._adapter_config

    def export_adapter(
        self, directory: Path, dtype: str | None = None, transform: Transform | None = None
    ) -> None:
        """The actor's adapter only, in peft's format (adapter_config.json + adapter_model.safetensors),
        cast to `dtype`. Written as one buffer (lite_verl.tensorfile), not with save_pretrained: the
        file-based adapter sync runs this after every update."""
        import json

        from lite_verl.device import torch_dtype

        directory.mkdir(parents=True, exist_ok=True)
        state, config = self.adapter_state(transform)
        (directory / "adapter_config.json").write_text(json.dumps(config))
        self._adapter_writer.write(
            state, directory / "adapter_model.safetensors", torch_dtype(dtype) if dtype else None
        )

    @torch.no_grad()
    def merged_linears(self) -> Iterator[LinearGroup]:
        """Yield, per module holding adapted layers, [(HF module name, W + s * B @ A in fp32, bias)].

        Only adapted layers change under LoRA, but vLLM fuses siblings (q/k/v, gate/up) and reloads a
        fused layer whole: a sibling or bias left out would be left uninitialised. So every linear
        layer of such a module is sent (unadapted ones as they are), and a group is never split.
        """
        from peft.tuners.lora import LoraLayer

        parents: dict[str, None] = {}
        for name, module in self.model.named_modules():
            if isinstance(module, LoraLayer) and "default" in module.lora_A:
                parents[name.rsplit(".", 1)[0]] = None
        for parent in parents:
            group: LinearGroup = []
            for child_name, child in self.model.get_submodule(parent).named_children():
                name = f"{parent}.{child_name}".removeprefix("base_model.model.")
                if isinstance(child, LoraLayer) and "default" in child.lora_A:
                    base = child.get_base_layer()
                    weight = dense_weight(base) + child.get_delta_weight("default").float()
                elif isinstance(child, torch.nn.Linear):
                    base, weight = child, dense_weight(child)
                else:
                    continue
                group.append((name, weight, base.bias))
            yield group

    @torch.no_grad()
    def unadapted_tensors(self, sent: set[str]) -> Iterator[tuple[str, torch.Tensor]]:
        """Yield (HF parameter name, tensor) for every base weight merged_linears did not send (`sent`:
        the linear layers' names it did): embeddings, norms, the head, linear layers of modules without an
        adapter, in their own dtype (4-bit layers dequantized). A shared (tied) tensor once."""
        from peft.tuners.lora import LoraLayer

        seen: set[int] = set()
        for name, module in self.model.named_modules():
            name = name.removeprefix("base_model.model.")
            if ".lora_" in name or name.endswith(".base_layer"):
                continue  # adapter tensors, and base layers (reached through their LoRA wrapper)
            # a LoRA wrapper not in `sent` holds no actor adapter: its base layer's tensors are the weights
            linear = module.get_base_layer() if isinstance(module, LoraLayer) else module
            if isinstance(linear, torch.nn.Linear):
                if name in sent or id(linear.weight) in seen:
                    continue
                seen.add(id(linear.weight))
                yield f"{name}.weight", dense_weight(linear)
                if linear.bias is not None:
                    yield f"{name}.bias", linear.bias.detach()
                continue
            for n, p in linear.named_parameters(recurse=False):
                if id(p) not in seen:
                    seen.add(id(p))
                    yield (f"{name}.{n}" if name else n), p.detach()

    def merged_weight_buckets(
        self, bucket_bytes: int, dtype: str, convert: Convert | None = None, everything: bool = False
    ) -> Iterator[Bucket]:
        """Lists of (parameter name, tensor) of about bucket_bytes each (whole groups of merged_linears,
        summed in fp32 and rounded once to `dtype`). `convert(name, weight, bias) -> {name: tensor}`
        replaces that rounding (AWQ re-quantization). everything: also every weight LoRA leaves alone
        (unadapted_tensors), for an engine that discarded its own (rollout.sleep_level=2). Tensors stay
        on the trainer's device."""
        from lite_verl.device import torch_dtype

        def plain(name, weight, bias):
            out = {name + ".weight": weight.to(torch_dtype(dtype))}
            if bias is not None:
                out[name + ".bias"] = bias.to(torch_dtype(dtype))
            return out

        sent: set[str] = set()

        def parts():  # {name: tensor} units never split across buckets: a fused group, or one tensor
            for group in self.merged_linears():
                sent.update(name for name, _, _ in group)
                yield {n: t for name, w, b in group for n, t in (convert or plain)(name, w, b).items()}
            for n, t in self.unadapted_tensors(sent) if everything else ():
                yield {n: t.to(self.device, torch_dtype(dtype))}  # train.embeddings_on_host: the table too

        bucket: Bucket = []
        size = 0
        for part in parts():
            bucket += part.items()
            size += sum(t.numel() * t.element_size() for t in part.values())
            if size >= bucket_bytes:
                yield bucket
                bucket, size = [], 0
        if bucket:
            yield bucket

    # --- the card handed to a colocated vLLM ----------------------------------------------------
    def park(self) -> None:
        self._adapter_tensors = None  # views of the storage that moves
        self._parking.park(*self._held())

    def unpark(self) -> None:
        self._parking.unpark(*self._held())
        self._adapter_tensors = None

    def _held(self) -> tuple[list[torch.nn.Module], list[torch.optim.Optimizer]]:
        modules = [self.model] + ([self.value_head] if self.value_head is not None else [])
        optimizers = [self.optimizer] + ([self.critic_optimizer] if self.critic_optimizer is not None else [])
        return modules, optimizers

    # --- checkpoints ---------------------------------------------------------------------------
    def save(self, directory: Path) -> None:
        """Adapter (peft format, loadable by PeftModel.from_pretrained) + optimizer state."""
        self.model.save_pretrained(directory / "adapter")  # the critic adapter goes to adapter/critic/
        torch.save(self.optimizer.state_dict(), directory / "optimizer.pt")
        if self.value_head is not None and self.critic_optimizer is not None:
            state = {
                "value_head": self.value_head.state_dict(),
                "optimizer": self.critic_optimizer.state_dict(),
            }
            torch.save(state, directory / "critic.pt")

    def load(self, directory: Path) -> None:
        """What `save` wrote, back on the card if it was parked (the optimizer's state goes where its
        parameters are); loop.serve_checkpoint parks it again around the sync."""
        self.unpark()
        self._load(directory)

    def _load(self, directory: Path) -> None:
        from peft import set_peft_model_state_dict
        from safetensors.torch import load_file

        weights = load_file(str(directory / "adapter" / "adapter_model.safetensors"))
        self._adapter_tensors = None
        result = set_peft_model_state_dict(self.model, weights)
        unexpected = getattr(result, "unexpected_keys", [])
        if unexpected:
            raise ConfigError(
                f"checkpoint {directory} does not match train.* LoRA settings ({len(unexpected)} keys)"
            )
        self.optimizer.load_state_dict(torch.load(directory / "optimizer.pt", weights_only=True))
        if self.value_head is not None and self.critic_optimizer is not None:
            if not (directory / "critic.pt").is_file():
                raise ConfigError(f"checkpoint {directory} has no critic; it was not a gae run")
            critic = load_file(str(directory / "adapter" / "critic" / "adapter_model.safetensors"))
            set_peft_model_state_dict(self.model, critic, adapter_name="critic")
            state = torch.load(directory / "critic.pt", weights_only=True)
            self.value_head.load_state_dict(state["value_head"])
            self.critic_optimizer.load_state_dict(state["optimizer"])

    def parameter_bytes(self) -> int:
        """Bytes of distinct parameter storage (shared tensors counted once), value head included."""
        seen, total = set(), 0
        modules = [self.model] + ([self.value_head] if self.value_head is not None else [])
        for module in modules:
            for p in module.parameters():
                key = p.untyped_storage().data_ptr()
                if key not in seen:
                    seen.add(key)
                    total += p.untyped_storage().nbytes()
        return total
