"""Typed, frozen run configuration.

Layers, later wins: dataclass defaults < preset (presets/NAME.yaml) < user YAML (--config FILE)
< `--set a.b=c` overrides. Every key is checked against the dataclasses below: an unknown key is an
error that names the nearest valid key, a wrong type names the field and the expected type.

A preset only says *where and how* things run (devices, memory knobs, backends, prices); what is
computed (batch sizes in prompts, loss normalisation, seeds) lives in the other sections so that a
laptop and a workstation run of one config follow the same algorithm.
"""

from __future__ import annotations

import dataclasses
import difflib
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from lite_verl.errors import ConfigError

# ----------------------------------------------------------------------------------------------------
# Sections. One comment per field; the comment is the documentation (`lite-verl validate` prints it).
# ----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelConfig:
    path: str = (
        "tiny:qwen2"  # HF causal-LM directory, or tiny:qwen2 / tiny:llama (random-init, made on the spot)
    )
    dtype: str = "float32"  # float32 | bfloat16 | float16: weights and compute of the trained model
    trust_remote_code: bool = False  # passed to from_pretrained for models with custom code
    fp32_lm_head: bool = (
        True  # bf16/fp16 models: LM head in fp32 in the trainer and in vLLM (fewer mismatches)
    )


@dataclass(frozen=True)
class DataConfig:
    train_files: tuple[str, ...] = ()  # jsonl/parquet files in verl's schema; empty = the built-in task
    val_files: tuple[str, ...] = ()  # validation files (same schema); empty = a held-out built-in set
    task: str = "echo"  # built-in task when train_files is empty: echo | arithmetic
    task_size: int = 4096  # number of built-in training prompts generated from trainer.seed
    val_size: int = 64  # number of prompts scored at each validation
    max_prompt_length: int = 512  # prompts longer than this (in tokens) are an error naming the row...
    filter_overlong_prompts: bool = False  # ...unless this drops them (with a count on stderr), as verl's
    shuffle: bool = True  # reshuffle the prompts every epoch (seeded by trainer.seed and the epoch)


@dataclass(frozen=True)
class RolloutConfig:
    engine: str = "hf"  # hf (transformers generate) | vllm
    n: int = 8  # responses sampled per prompt (the GRPO group size)
    temperature: float = 1.0  # sampling temperature; the trainer divides logits by it too
    top_p: float = 1.0  # nucleus sampling
    max_new_tokens: int = 16  # response length limit in tokens
    gpus: tuple[int, ...] = ()  # local GPU ids for rollout; empty = CPU
    gpu_memory_utilization: float = 0.5  # vLLM: fraction of each rollout GPU it may take
    quantization: str = "none"  # none | awq: weights the rollout engine serves (awq: 4-bit, vLLM only)
    quantized_path: str = (
        ""  # awq: a model dir from `lite-verl quantize`; empty = quantize on first use (cached)
    )
    awq_group_size: int = 128  # awq: input channels per quantization group (32, 64 or 128)
    enforce_eager: bool = False  # vLLM: no CUDA graphs / compile (faster start, slower decode)
    colocate: bool = True  # rollout.gpus == train.gpus: true = hybrid engine (vLLM sleeps during updates); false = split on the same cards
    sleep_level: int = 1  # colocated vLLM during updates: 1 = weights parked in host memory; 2 = discarded (sync.mode=merged, no AWQ: every weight is reloaded at the next sync, no host round trip)
    max_staleness: int = 0  # 0 = synchronous; 1 = one-step-off-policy: rollout k+1 runs while the trainer updates on k (split placement, vllm)


@dataclass(frozen=True)
class TrainConfig:
    backend: str = "lora"  # lora | qlora | fsdp | deepspeed
    gpus: tuple[int, ...] = ()  # local GPU ids for training, one training process (rank) each; empty = CPU
    cpu_ranks: int = 1  # CPU training (gpus empty) in this many gloo processes: a laptop runs the maths of a len(gpus)-GPU run
    lr: float = 3e-3  # AdamW learning rate (constant); right for tiny models; ~1e-5..5e-5 for real 1B+ LoRA
    weight_decay: float = 0.0  # AdamW weight decay
    grad_clip: float = 1.0  # max global grad norm; <= 0 disables clipping
    micro_batch_size: int = 8  # sequences per forward/backward; a memory knob, never changes the maths
    pack_micro_batches: bool = True  # fill each forward/backward with shorter rows up to the tokens of micro_batch_size full-length ones (same memory bound, fewer launches)
    lora_rank: int = 16  # LoRA rank r
    lora_alpha: int = 32  # LoRA alpha (scale = alpha / r)
    lora_dropout: float = 0.0  # LoRA dropout
    target_modules: tuple[str, ...] = (
        "q_proj",
        "k_proj",
        "v_proj",
        "o_proj",
        "gate_proj",
        "up_proj",
        "down_proj",
    )  # LoRA targets
    gradient_checkpointing: bool = False  # trade compute for activation memory
    offload_params: bool = False  # fsdp/deepspeed: weights (and the reference policy) in host memory; fsdp moves gradients and AdamW state with them
    offload_optimizer: bool = False  # fsdp/deepspeed: AdamW state, fp32 masters and gradients in host memory (fsdp: together with offload_params)
    optimizer_state_dtype: str = "float32"  # fsdp: AdamW's m and v in float32 | bfloat16 (fp32 master weights either way; 12 instead of 16 bytes per parameter, the host memory a 7B fsdp offload needs goes from 113 to 85 GiB)
    max_memory_gib: float = 0.0  # cap this process's memory on its training GPU (0 = the whole card): the trainer's share of a card it shares, or a 24 GB card emulated on a bigger one


@dataclass(frozen=True)
class AlgorithmConfig:
    adv_estimator: str = "grpo"  # gae (PPO, critic) | grpo | dr_grpo | rloo | reinforce_plus_plus | reinforce_plus_plus_baseline | remax
    norm_adv_by_std_in_grpo: bool = True  # GRPO: divide by the group std (dr_grpo never does)
    gamma: float = 1.0  # discount (gae, reinforce_plus_plus)
    lam: float = 1.0  # GAE lambda
    use_kl_loss: bool = True  # add beta * KL(policy || reference) to the loss (verl's GRPO recipe)
    kl_loss_coef: float = 0.001  # beta of the KL loss
    kl_loss_type: str = "low_var_kl"  # kl (k1) | abs | mse (k2) | low_var_kl (k3)
    use_kl_in_reward: bool = False  # subtract kl_coef * KL from the token rewards instead (PPO style)
    kl_penalty: str = "kl"  # estimator of the in-reward KL: kl | abs | mse | low_var_kl
    kl_ctrl_type: str = "fixed"  # fixed | adaptive (Ziegler et al.) in-reward KL coefficient
    kl_coef: float = 0.001  # in-reward KL coefficient (initial value when adaptive)
    kl_target: float = 0.1  # adaptive controller: target KL per token
    kl_horizon: int = 10000  # adaptive controller: horizon in samples
    clip_ratio_low: float = 0.2  # PPO clip: ratio >= 1 - clip_ratio_low
    clip_ratio_high: float = 0.2  # PPO clip: ratio <= 1 + clip_ratio_high (DAPO clip-higher when larger)
    clip_ratio_c: float = 3.0  # dual clip for negative advantages (> 1)
    loss_agg_mode: str = (
        "token-mean"  # token-mean | seq-mean-token-sum | seq-mean-token-mean | seq-mean-token-sum-norm
    )
    entropy_coeff: float = 0.0  # entropy bonus coefficient (loss -= coeff * entropy)
    ppo_epochs: int = 1  # passes over each rollout batch
    ppo_mini_batch_size: int = 0  # prompts per optimizer step; 0 = the whole batch (one step per rollout)
    rollout_correction: str = "auto"  # auto | none | token | sequence: truncated IS for rollout/trainer mismatch (auto: token when the rollout is quantized or stale, else none)
    rollout_is_threshold: float = 2.0  # C: IS weights are truncated at this value


@dataclass(frozen=True)
class CriticConfig:
    lr: float = 3e-3  # critic AdamW learning rate (adapter + value head)
    cliprange_value: float = 0.5  # value clipping around the old values
    warmup_steps: int = 0  # steps that update only the critic (the actor waits)


@dataclass(frozen=True)
class RewardConfig:
    function: str = ""  # module:function or path/to/file.py:function; empty = rule by data_source
    isolate: bool = True  # run reward.function in a worker process (a crash or hang cannot take the run down)
    timeout_s: float = 30.0  # per-sample time limit for reward.function (isolated only)
    on_error: str = "raise"  # raise | default: what a raising, crashing or hanging reward.function does
    default_score: float = 0.0  # the score given on a failure when on_error=default
    device: str = "cpu"  # where a reward model runs: cpu or cuda:N
    model: str = ""  # a reward model dir (sequence classification, one output); replaces the rule reward
    keep_alive_s: float = (
        0.0  # reward.model: release it after this many idle seconds (0 = after every scoring)
    )
    url: str = ""  # a remote reward endpoint (POST items -> scores); replaces the rule reward
    retries: int = 2  # reward.url: retries after a failed request (network error, timeout, HTTP 5xx)


@dataclass(frozen=True)
class SyncConfig:
    mode: str = "adapter"  # adapter (push LoRA tensors) | merged (merge, load full weights)
    bucket_mb: int = 512  # merged sync: weights move in buckets of about this size


@dataclass(frozen=True)
class TrainerConfig:
    total_steps: int = 100  # rollout + update steps
    batch_size: int = 16  # prompts per step, global: the same on every machine
    seed: int = 0  # seeds data order, built-in task, sampling and init
    save_every: int = 0  # checkpoint every N steps (0 = only at the end)
    keep_checkpoints: int = 2  # keep the last N checkpoints (0 = write none: no resume, no export; benchmarks of models too big for the disk)
    val_every: int = 0  # validate every N steps (0 = never; the run still validates at the end if val_size>0)
    tensorboard: bool = True  # also write TensorBoard events next to metrics.jsonl
    progress: bool = True  # show a progress bar
    plan_check: bool = (
        True  # GPU runs: refuse a config whose predicted peak memory exceeds a card (lite-verl plan)
    )


@dataclass(frozen=True)
class CostConfig:
    gpu_models: tuple[str, ...] = ()  # model of each local GPU id, e.g. [RTX 4090, RTX 4090]
    price_per_hour: dict[str, float] = field(default_factory=dict)  # USD per GPU-hour by model (and "cpu")


@dataclass(frozen=True)
class Config:
    preset: str = "laptop"  # the preset this config was built from (informational)
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    critic: CriticConfig = field(default_factory=CriticConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    sync: SyncConfig = field(default_factory=SyncConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    cost: CostConfig = field(default_factory=CostConfig)

    @property
    def full_length(self) -> int:
        """The longest sequence a run generates and trains on: the prompt limit plus the response limit."""
        return self.data.max_prompt_length + self.rollout.max_new_tokens

    @property
    def reward_gpus(self) -> tuple[int, ...]:
        """The reward model's local GPU id, when it has one (reward.device=cuda:N)."""
        d = self.reward.device
        return (int(d[5:]),) if d.startswith("cuda:") else ()

    @property
    def used_gpus(self) -> list[int]:
        """The distinct local GPU ids the config uses (rollout, train, reward model), in order."""
        return sorted({*self.rollout.gpus, *self.train.gpus, *self.reward_gpus})

    def validate(self) -> Config:
        from lite_verl.config.validation import validate_config

        validate_config(self)
        return self


# ----------------------------------------------------------------------------------------------------
# Building a Config from nested dicts, with type checks.
# ----------------------------------------------------------------------------------------------------


def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def all_keys(cls: type = Config, prefix: str = "") -> list[str]:
    """Every dotted key a config accepts, e.g. `trainer.total_steps`."""
    keys = []
    for name, tp in _hints(cls).items():
        if dataclasses.is_dataclass(tp):
            keys.extend(all_keys(tp, f"{prefix}{name}."))  # type: ignore[arg-type]
        else:
            keys.append(f"{prefix}{name}")
    return keys


def _unknown_key(key: str) -> ConfigError:
    near = difflib.get_close_matches(key, all_keys(), n=1, cutoff=0.5)
    if not near:  # try the last part alone: `lr` -> `train.lr`
        tail = key.rsplit(".", 1)[-1]
        near = [k for k in all_keys() if k.rsplit(".", 1)[-1] == tail][:1]
    hint = f"; did you mean '{near[0]}'?" if near else "; `lite-verl validate --keys` lists the valid keys"
    return ConfigError(f"unknown config key '{key}'{hint}")


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is tuple:
        return f"list of {_type_name(typing.get_args(tp)[0])}"
    if origin is dict:
        k, v = typing.get_args(tp)
        return f"mapping of {_type_name(k)} to {_type_name(v)}"
    return getattr(tp, "__name__", str(tp))


def _coerce(key: str, value: Any, tp: Any) -> Any:
    """Check `value` against the field type `tp`; return it in the dataclass's representation."""
    bad = ConfigError(
        f"{key} must be a {_type_name(tp)}, got {value!r} ({type(value).__name__}); fix it in the config"
    )
    origin = typing.get_origin(tp)
    if origin is tuple:
        if (
            isinstance(value, (str, int, float))
            and not isinstance(value, bool)
            and typing.get_args(tp)[0] is not str
        ):
            value = [value]  # `--set train.gpus=0` means [0]
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, (list, tuple)):
            raise bad
        return tuple(_coerce(f"{key}[{i}]", v, typing.get_args(tp)[0]) for i, v in enumerate(value))
    if origin is dict:
        if not isinstance(value, dict):
            raise bad
        kt, vt = typing.get_args(tp)
        return {_coerce(f"{key} key", k, kt): _coerce(f"{key}.{k}", v, vt) for k, v in value.items()}
    if tp is bool:
        if not isinstance(value, bool):
            raise bad
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise bad
        return value
    if tp is float:
        if isinstance(value, str):  # YAML 1.1 reads 1e-3 (no dot) as a string
            try:
                value = float(value)
            except ValueError:
                raise bad from None
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise bad
        return float(value)
    if tp is str:
        if isinstance(value, bool) or not isinstance(value, (str, int, float)):
            raise bad
        return str(value)
    raise bad  # pragma: no cover


def _build(cls: type, data: dict[str, Any], prefix: str = "") -> Any:
    hints = _hints(cls)
    kwargs: dict[str, Any] = {}
    for name, value in data.items():
        key = f"{prefix}{name}"
        if name not in hints:
            raise _unknown_key(key)
        tp = hints[name]
        if dataclasses.is_dataclass(tp):
            if value is None:
                continue
            if not isinstance(value, dict):
                raise ConfigError(f"{key} must be a section (a mapping of keys), got {value!r}")
            kwargs[name] = _build(tp, value, f"{key}.")  # type: ignore[arg-type]
        else:
            kwargs[name] = _coerce(key, value, tp)
    return cls(**kwargs)


def merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """Deep merge of nested dicts; `over` wins. Lists are replaced, not concatenated."""
    out = dict(base)
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = merge(out[k], v)
        else:
            out[k] = v
    return out


def parse_override(item: str) -> dict[str, Any]:
    """`a.b=c` -> {"a": {"b": c}} with c parsed as YAML (`3` int, `[0,1]` list, `true` bool)."""
    if "=" not in item:
        raise ConfigError(f"--set {item!r} is not key=value; write e.g. --set trainer.total_steps=10")
    key, raw = item.split("=", 1)
    key = key.strip()
    # one entry of a mapping, its name kept whole: --set "cost.price_per_hour.RTX 4090=0.5"
    mapping = next((k for k in _mapping_keys() if key.startswith(k + ".") and key != k + "."), None)
    if key not in all_keys() and mapping is None:
        raise _unknown_key(key)
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    if value is None:
        value = ""
    out: dict[str, Any] = {}
    node = out
    parts = mapping.split(".") + [key[len(mapping) + 1 :]] if mapping else key.split(".")
    for p in parts[:-1]:
        node = node.setdefault(p, {})
    node[parts[-1]] = value
    return out


def _mapping_keys(cls: type = Config, prefix: str = "") -> list[str]:
    """The dotted keys whose value is a mapping (cost.price_per_hour): --set can add or change one entry."""
    keys = []
    for name, tp in _hints(cls).items():
        if dataclasses.is_dataclass(tp):
            keys.extend(_mapping_keys(tp, f"{prefix}{name}."))  # type: ignore[arg-type]
        elif typing.get_origin(tp) is dict:
            keys.append(f"{prefix}{name}")
    return keys


def read_yaml(path: str | Path, what: str) -> dict[str, Any]:
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"{what} {str(p)!r} does not exist; give the path of a YAML file")
    try:
        data = yaml.safe_load(p.read_text())
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise ConfigError(f"{what} {str(p)!r} is not valid YAML{where}; fix its syntax") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{what} {str(p)!r} must hold a mapping of sections (model:, data:, ...)")
    return data


def from_dict(data: dict[str, Any]) -> Config:
    cfg: Config = _build(Config, data)
    return cfg


def to_dict(cfg: Any) -> dict[str, Any]:
    """Plain nested dict (tuples as lists) for YAML/JSON output."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(cfg):
        v = getattr(cfg, f.name)
        if dataclasses.is_dataclass(v):
            out[f.name] = to_dict(v)
        elif isinstance(v, tuple):
            out[f.name] = list(v)
        elif isinstance(v, dict):
            out[f.name] = dict(v)
        else:
            out[f.name] = v
    return out


def load_config(
    preset: str | None = None, config_file: str | None = None, overrides: list[str] | tuple[str, ...] = ()
) -> Config:
    """Resolve the layers into a validated Config. Raises ConfigError with a one-line message."""
    from lite_verl.config.presets import preset_path

    data: dict[str, Any] = {}
    if config_file:
        user = read_yaml(config_file, "config file")
        # a resolved run config names its preset; --preset on the command line wins
        preset = preset or user.get("preset")
    else:
        user = {}
    preset = preset or "laptop"
    data = merge(data, read_yaml(preset_path(preset), f"preset '{preset}'"))
    data = merge(data, user)
    for item in overrides:
        data = merge(data, parse_override(item))
    data["preset"] = preset
    return from_dict(data).validate()


def describe(cls: type = Config, prefix: str = "") -> list[tuple[str, str]]:
    """(dotted key, comment) pairs, read from the comments in this file."""
    import inspect

    src = inspect.getsource(cls).splitlines()
    comments = {}
    for line in src:
        s = line.strip()
        if ":" in s and "#" in s and not s.startswith("#"):
            name = s.split(":", 1)[0].strip()
            comments[name] = s.split("#", 1)[1].strip()
    out = []
    for name, tp in _hints(cls).items():
        if dataclasses.is_dataclass(tp):
            out.extend(describe(tp, f"{prefix}{name}."))  # type: ignore[arg-type]
        else:
            out.append((f"{prefix}{name}", comments.get(name, "")))
    return out
