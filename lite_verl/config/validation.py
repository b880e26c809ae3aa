"""Checks on a resolved Config. Each failure is one ConfigError that names the field and the fix.

`validate_config` is static (no imports, no devices): presets are validated by it in the tests.
`check_environment` looks at this machine: GPU ids present, optional packages installed.
The allowed values of an enumerated key are its `Literal` type in schema.py; this module checks how
keys combine (placement, backends, estimators) and the ranges of numbers.
"""

from __future__ import annotations

import functools
import importlib.util
import math
from pathlib import Path
from typing import get_args

from lite_verl.config.convert import choices, key_types, not_one_of
from lite_verl.config.schema import (
    ALL_LINEAR,
    AdvEstimator,
    Config,
    RewardConfig,
    RolloutConfig,
    TrainConfig,
)
from lite_verl.errors import ConfigError, MissingDependency, RewardError
from lite_verl.reward import builtins as reward_builtins

ADV_ESTIMATORS: tuple[AdvEstimator, ...] = get_args(AdvEstimator)
GROUP_ESTIMATORS: tuple[AdvEstimator, ...] = ("grpo", "dr_grpo", "rloo", "reinforce_plus_plus_baseline")

# Parts of the design that have their own issue and are not built yet. A preset may name them: it then
# fails validation with this message instead of crashing later.
NOT_BUILT: dict[tuple[str, str], str] = {}
BUILT_ALTERNATIVE = {
    "rollout.engine": "hf",
    "rollout.quantization": "none",
    "train.backend": "lora",
}


def _positive(key: str, value: float, allow_zero: bool = False) -> None:
    if value < 0 or (value == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise ConfigError(f"{key}={value} must be {bound}")


def _check_gpus(key: str, gpus: tuple[int, ...]) -> None:
    if any(g < 0 for g in gpus):
        raise ConfigError(f"{key} {list(gpus)} has a negative GPU id; use local ids 0, 1, ... or [] for CPU")
    if len(set(gpus)) != len(gpus):
        raise ConfigError(f"{key} {list(gpus)} names a GPU twice; list each local GPU id once")


def validate_config(cfg: Config) -> Config:
    """`cfg` itself when every check passes; else the first failure's ConfigError."""
    _check_choices(cfg)
    _check_model_data(cfg)
    _check_rollout(cfg)
    _check_train(cfg.train)
    _check_algorithm(cfg)
    _check_reward_trainer(cfg)
    _check_offload_during_rollout(cfg)
    _check_embeddings_on_host(cfg)
    _check_liger(cfg)
    _check_full_finetuning(cfg)
    _check_train_ranks(cfg)
    _check_placement(cfg)
    _check_cost(cfg)
    _check_not_built(cfg)
    return cfg


def _check_choices(cfg: Config) -> None:
    """Every key with a Literal type holds one of its values (from_dict checks them as it builds; a Config
    made or replaced in code is checked here)."""
    for key, tp in key_types():
        allowed = choices(tp)
        value = functools.reduce(getattr, key.split("."), cfg)
        for v in value if isinstance(value, tuple) else (value,):  # a list of choices: each item
            if allowed and v not in allowed:
                raise not_one_of(key, v, allowed)
    if "jsonl" not in cfg.trainer.loggers:
        raise ConfigError(
            "trainer.loggers must include jsonl: the summary, `lite-verl report` and --resume read "
            "RUN/metrics.jsonl; add the others next to it, e.g. [console, jsonl, wandb]"
        )


def _check_model_data(cfg: Config) -> None:
    m, d = cfg.model, cfg.data
    if not m.path:
        raise ConfigError("model.path is empty; give an HF model directory or tiny:qwen2")
    from lite_verl.data.tasks import TASKS

    if d.task not in TASKS:
        raise not_one_of("data.task", d.task, tuple(TASKS))
    _positive("data.task_size", d.task_size)
    _positive("data.val_size", d.val_size, allow_zero=True)
    _positive("data.max_prompt_length", d.max_prompt_length)
    _check_data_columns(cfg)


def _check_data_columns(cfg: Config) -> None:
    """Keys naming splits and columns: well-formed (whether the data has them is checked when it loads)."""
    from lite_verl.data.sources import is_split_spec

    d = cfg.data
    if not d.prompt_key:
        raise ConfigError("data.prompt_key is empty; name the column that holds the prompts (e.g. question)")
    if d.prompt_template and "{prompt}" not in d.prompt_template:
        raise ConfigError(
            f"data.prompt_template={d.prompt_template!r} has no {{prompt}}; write where the prompt goes, "
            "e.g. '{prompt} Answer after ####.'"
        )
    for name, spec, may_be_empty in (("data.split", d.split, False), ("data.val_split", d.val_split, True)):
        if not (spec or may_be_empty) or not is_split_spec(spec):
            raise ConfigError(
                f"{name}={spec!r} must be a split name with an optional slice: train, test, train[:90%], train[-200:]"
            )


def _check_rollout(cfg: Config) -> None:
    r = cfg.rollout
    _check_staleness(cfg)
    _check_sleep_level(cfg)
    if r.quantization == "awq":
        _check_awq(r)
    _positive("rollout.n", r.n)
    _positive("rollout.temperature", r.temperature)
    if not 0 < r.top_p <= 1:
        raise ConfigError(f"rollout.top_p={r.top_p} must be in (0, 1]")
    if r.top_k < 0:
        raise ConfigError(f"rollout.top_k={r.top_k} must be >= 0 (0 = no top-k)")
    if not 0 <= r.min_p < 1:
        raise ConfigError(f"rollout.min_p={r.min_p} must be in [0, 1) (0 = off)")
    _positive("rollout.max_new_tokens", r.max_new_tokens)
    if not 0 < r.gpu_memory_utilization <= 1:
        raise ConfigError(f"rollout.gpu_memory_utilization={r.gpu_memory_utilization} must be in (0, 1]")
    if r.kv_cache_gib != "auto" and r.kv_cache_gib < 0:
        raise ConfigError(f"rollout.kv_cache_gib={r.kv_cache_gib} must be >= 0 (GiB) or auto")
    vllm_on_gpus = r.engine == "vllm" and bool(r.gpus)
    if r.kv_cache_dtype != "auto" and not vllm_on_gpus:
        raise ConfigError(
            f"rollout.kv_cache_dtype={r.kv_cache_dtype} is vLLM's KV cache on a GPU; this rollout runs on the "
            "CPU or without vLLM: set rollout.kv_cache_dtype=auto"
        )
    if r.kv_cache_gib and not vllm_on_gpus:
        raise ConfigError(
            f"rollout.kv_cache_gib={r.kv_cache_gib} sizes vLLM's cache on a GPU; this rollout runs on the "
            "CPU or without vLLM: drop it (vLLM on the CPU takes VLLM_CPU_KVCACHE_SPACE)"
        )


def _check_staleness(cfg: Config) -> None:
    """rollout.max_staleness=1 overlaps the next rollout with the update: a vLLM process on its own cards."""
    r, t = cfg.rollout, cfg.train
    if r.max_staleness not in (0, 1):
        raise ConfigError(
            f"rollout.max_staleness={r.max_staleness} must be 0 (synchronous) or 1 (one-step-off-policy)"
        )
    if r.max_staleness == 1:
        if r.engine != "vllm":
            raise ConfigError(
                "rollout.max_staleness=1 needs rollout.engine=vllm: the rollout must run in its own process to overlap"
            )
        if r.gpus and r.gpus == t.gpus and r.colocate:
            raise ConfigError(
                "rollout.max_staleness=1 needs split placement: give rollout.gpus other than train.gpus, or set "
                "rollout.colocate=false to share the cards without sleeping (colocated, vLLM sleeps during updates)"
            )


def _check_sleep_level(cfg: Config) -> None:
    r = cfg.rollout
    if r.sleep_level not in (1, 2):
        raise ConfigError(
            f"rollout.sleep_level={r.sleep_level} must be 1 (park the weights) or 2 (discard them)"
        )
    if r.sleep_level == 2 and (cfg.sync.mode != "merged" or r.quantization != "none"):
        raise ConfigError(
            "rollout.sleep_level=2 discards vLLM's weights during updates, so the next sync must reload all of "
            "them: it needs sync.mode=merged and rollout.quantization=none (AWQ layers keep kernel state a "
            "reload does not rewrite); set rollout.sleep_level=1"
        )


def _check_awq(r: RolloutConfig) -> None:
    """rollout.quantization=awq: vLLM serves a 4-bit model, given or quantized on first use."""
    if r.engine != "vllm":
        raise ConfigError(
            "rollout.quantization=awq needs rollout.engine=vllm (set it, or rollout.quantization=none)"
        )
    if r.awq_group_size not in (32, 64, 128):
        raise ConfigError(f"rollout.awq_group_size={r.awq_group_size} must be 32, 64 or 128")
    if r.quantized_path and not Path(r.quantized_path).is_dir():
        raise ConfigError(
            f"rollout.quantized_path={r.quantized_path!r} does not exist; make it with `lite-verl quantize` "
            "or leave it empty to quantize on first use"
        )


def _check_train(t: TrainConfig) -> None:
    _positive("train.lr", t.lr)
    _positive("train.warmup_steps", t.warmup_steps, allow_zero=True)
    if not 0 <= t.min_lr_ratio <= 1:
        raise ConfigError(f"train.min_lr_ratio={t.min_lr_ratio} must be in [0, 1] (a fraction of train.lr)")
    _positive("train.weight_decay", t.weight_decay, allow_zero=True)
    _positive("train.micro_batch_size", t.micro_batch_size)
    _positive("train.max_memory_gib", t.max_memory_gib, allow_zero=True)
    if t.max_memory_gib and not t.gpus:
        raise ConfigError("train.max_memory_gib caps GPU memory but train.gpus is empty (CPU); set it to 0")
    if t.lora_rank == 0 and not t.full_finetune:  # verl's lora_rank 0 means full fine-tuning
        raise ConfigError("train.lora_rank=0: LoRA needs a rank > 0; for full fine-tuning (verl's lora_rank 0) set "
                          "train.backend=fsdp or deepspeed")  # fmt: skip
    if not t.full_finetune:  # full fine-tuning has no adapter: verl's configs carry lora_rank 0 there
        _positive("train.lora_rank", t.lora_rank)
        _positive("train.lora_alpha", t.lora_alpha)
    if not 0 <= t.lora_dropout < 1:
        raise ConfigError(f"train.lora_dropout={t.lora_dropout} must be in [0, 1)")
    if not t.target_modules:
        raise ConfigError(
            "train.target_modules is empty; name the linear layers LoRA adapts, e.g. [q_proj, v_proj]"
        )
    if t.all_linear and len(t.target_modules) > 1:
        raise ConfigError(
            f"train.target_modules={list(t.target_modules)}: {ALL_LINEAR} already means every linear layer; "
            f"give it alone or name the layers"
        )


def _check_algorithm(cfg: Config) -> None:
    r, t, a, tr = cfg.rollout, cfg.train, cfg.algorithm, cfg.trainer
    _positive("algorithm.kl_loss_coef", a.kl_loss_coef, allow_zero=True)
    _positive("algorithm.clip_ratio_low", a.clip_ratio_low, allow_zero=True)
    _positive("algorithm.clip_ratio_high", a.clip_ratio_high, allow_zero=True)
    if a.clip_ratio_c <= 1:
        raise ConfigError(f"algorithm.clip_ratio_c={a.clip_ratio_c} must be > 1 (the dual-clip bound)")
    _positive("algorithm.ppo_epochs", a.ppo_epochs)
    _positive("algorithm.ppo_mini_batch_size", a.ppo_mini_batch_size, allow_zero=True)
    if a.ppo_mini_batch_size and tr.batch_size % a.ppo_mini_batch_size:
        raise ConfigError(
            f"algorithm.ppo_mini_batch_size={a.ppo_mini_batch_size} must divide trainer.batch_size={tr.batch_size}"
        )
    _positive("algorithm.kl_coef", a.kl_coef, allow_zero=True)
    _positive("algorithm.kl_target", a.kl_target)
    _positive("algorithm.kl_horizon", a.kl_horizon)
    _positive("algorithm.rollout_is_threshold", a.rollout_is_threshold)
    if not 0 <= a.gamma <= 1 or not 0 <= a.lam <= 1:
        raise ConfigError(f"algorithm.gamma={a.gamma} and algorithm.lam={a.lam} must be in [0, 1]")
    if a.use_kl_loss and a.use_kl_in_reward:
        raise ConfigError("algorithm.use_kl_loss and algorithm.use_kl_in_reward are both on; pick one KL")
    _positive("critic.lr", cfg.critic.lr)
    _positive("critic.cliprange_value", cfg.critic.cliprange_value)
    _positive("critic.warmup_steps", cfg.critic.warmup_steps, allow_zero=True)
    if a.adv_estimator == "gae" and t.full_finetune:
        raise ConfigError(
            f"algorithm.adv_estimator=gae needs a critic, which lite-verl builds as a second LoRA adapter; "
            f"train.backend={t.backend} has none yet: use train.backend=lora or a critic-free estimator (grpo)"
        )
    if a.adv_estimator in GROUP_ESTIMATORS and r.n < 2:
        raise ConfigError(
            f"rollout.n={r.n}: {a.adv_estimator} compares responses within a group; set rollout.n >= 2"
        )


def _check_reward_functions(w: RewardConfig) -> None:
    """reward.functions: user functions or built-ins with valid args; weights finite, names unique."""
    names: dict[str, int] = {}
    for i, f in enumerate(w.functions):
        where = f"reward.functions[{i}]"
        if f.fn in reward_builtins.ARGS:
            try:
                reward_builtins.check_args(f.fn, f.args)
            except RewardError as e:
                raise ConfigError(f"{where}: {e}") from None
        elif ":" not in f.fn:
            raise ConfigError(
                f"{where}.fn={f.fn!r} must be module:function, path/to/file.py:function or a built-in "
                f"({', '.join(reward_builtins.ARGS)})"
            )
        elif f.args:
            raise ConfigError(f"{where}.args: only built-in rewards take args; {f.fn} is a user function")
        if not math.isfinite(f.weight):
            raise ConfigError(f"{where}.weight={f.weight} must be a finite number")
        name = f.name or f.fn.rpartition(":")[2]
        if name in names:
            raise ConfigError(
                f"reward.functions[{names[name]}] and [{i}] are both named {name!r}; "
                "set name: on one (it names the metric)"
            )
        names[name] = i


def _check_reward_trainer(cfg: Config) -> None:
    from lite_verl.model.hub import parse_hub_id

    w, tr = cfg.reward, cfg.trainer
    if w.function and ":" not in w.function:
        builtin = (
            f"; a built-in goes in reward.functions=[{{fn: {w.function}}}]"
            if w.function in reward_builtins.ARGS
            else ""
        )
        raise ConfigError(
            f"reward.function={w.function!r} must be module:function or path/to/file.py:function{builtin}"
        )
    _check_reward_functions(w)
    _positive("reward.timeout_s", w.timeout_s)
    user_code = w.function or any(f.fn not in reward_builtins.ARGS for f in w.functions)
    if w.on_error == "default" and user_code and not w.isolate:
        raise ConfigError("reward.on_error=default needs reward.isolate=true (a worker process to restart)")
    if w.device != "cpu" and not (w.device.startswith("cuda:") and w.device[5:].isdigit()):
        raise ConfigError(f"reward.device={w.device!r} must be cpu or cuda:N")
    given = {"reward.function": w.function, "reward.functions": w.functions, "reward.model": w.model,
             "reward.url": w.url}  # fmt: skip
    sources = [k for k, v in given.items() if v]
    if len(sources) > 1:
        raise ConfigError(f"{' and '.join(sources)} are both set; a run has one reward source: keep one")
    if w.model and not Path(w.model).is_dir() and parse_hub_id(w.model) is None:
        raise ConfigError(f"reward.model={w.model!r} does not exist; give a reward model directory or Hub id")
    _positive("reward.keep_alive_s", w.keep_alive_s, allow_zero=True)
    if w.url and not w.url.startswith(("http://", "https://")):
        raise ConfigError(f"reward.url={w.url!r} must start with http:// or https://")
    _positive("reward.retries", w.retries, allow_zero=True)
    _positive("sync.bucket_mb", cfg.sync.bucket_mb)

    _positive("trainer.total_steps", tr.total_steps)
    _positive("trainer.total_epochs", tr.total_epochs, allow_zero=True)
    _positive("trainer.batch_size", tr.batch_size)
    _positive("trainer.seed", tr.seed, allow_zero=True)
    _positive("trainer.save_every", tr.save_every, allow_zero=True)
    _positive("trainer.keep_checkpoints", tr.keep_checkpoints, allow_zero=True)
    _positive("trainer.val_every", tr.val_every, allow_zero=True)
    _positive("trainer.samples_every", tr.samples_every, allow_zero=True)
    _positive("trainer.samples_per_step", tr.samples_per_step, allow_zero=True)


def _check_liger(cfg: Config) -> None:
    """train.use_liger: Triton kernels, which run on CUDA GPUs only."""
    if cfg.train.use_liger and not cfg.train.gpus:
        raise ConfigError(
            "train.use_liger=true runs Liger's Triton kernels on a CUDA GPU, and this run trains on the CPU "
            "(train.gpus=[]): set train.use_liger=false, or train.gpus to a GPU id"
        )


def _check_embeddings_on_host(cfg: Config) -> None:
    """train.embeddings_on_host: a frozen input embedding table, which full fine-tuning trains."""
    t = cfg.train
    if t.embeddings_on_host and t.full_finetune:
        raise ConfigError(
            f"train.embeddings_on_host=true keeps a frozen embedding table in host memory, and train.backend="
            f"{t.backend} trains it: set train.embeddings_on_host=false (or train.offload_params=true)"
        )


def _check_offload_during_rollout(cfg: Config) -> None:
    """train.offload_during_rollout: a LoRA trainer parks while a vLLM on its GPUs generates."""
    t = cfg.train
    if not t.offload_during_rollout or (cfg.hybrid and not t.full_finetune):
        return
    fix = (
        "fsdp/deepspeed offload with train.offload_params" if t.full_finetune
        else "it needs rollout.engine=vllm on the train GPUs with rollout.colocate=true"
    )  # fmt: skip
    raise ConfigError(
        f"train.offload_during_rollout=true applies to lora/qlora sharing its GPUs with a sleeping vLLM "
        f"(train.backend={t.backend}, rollout.engine={cfg.rollout.engine}, rollout.gpus={list(cfg.rollout.gpus)}, "
        f"train.gpus={list(t.gpus)}): {fix}; or set train.offload_during_rollout=false"
    )


def _check_full_finetuning(cfg: Config) -> None:
    """train.backend=fsdp|deepspeed (train/full.py) and its offload knobs."""
    t = cfg.train
    if t.optimizer_state_dtype != "float32" and t.backend != "fsdp":
        raise ConfigError(
            f"train.optimizer_state_dtype={t.optimizer_state_dtype} applies to train.backend=fsdp (AdamW over "
            f"full weights); train.backend={t.backend} keeps float32: set train.optimizer_state_dtype=float32"
        )
    if not t.full_finetune:
        for key, on in (
            ("train.offload_params", t.offload_params),
            ("train.offload_optimizer", t.offload_optimizer),
        ):
            if on:
                raise ConfigError(
                    f"{key}=true applies to full fine-tuning (train.backend=fsdp or deepspeed); "
                    f"train.backend={t.backend} does not offload: set {key}=false"
                )
        return
    if cfg.sync.mode == "adapter":
        raise ConfigError(
            f"sync.mode=adapter: train.backend={t.backend} trains every weight and has no adapter to push; "
            "set sync.mode=merged"
        )
    if t.backend == "fsdp" and t.offload_params != t.offload_optimizer:
        raise ConfigError(
            "train.offload_params and train.offload_optimizer differ: FSDP2 offloads weights, gradients and "
            "AdamW state together; set both to true (or both to false) with train.backend=fsdp"
        )
    if t.backend == "fsdp" and cfg.model.dtype == "float16":
        raise ConfigError(
            "model.dtype=float16 with train.backend=fsdp: FSDP2 has no loss scaling; "
            "use model.dtype=bfloat16 (or train.backend=deepspeed)"
        )
    if cfg.rollout.quantization == "awq":
        raise ConfigError(
            f"rollout.quantization=awq with train.backend={t.backend}: the AWQ model folds its scales into the "
            "norm weights, which full fine-tuning changes too; use rollout.quantization=none"
        )


def train_world(cfg: Config) -> int:
    """Training processes (ranks): one per train GPU, or train.cpu_ranks on the CPU (train/group.py)."""
    return len(cfg.train.gpus) or cfg.train.cpu_ranks


def _check_train_ranks(cfg: Config) -> None:
    """Several ranks split every mini-batch's rows evenly: each runs the same number of forward and
    backward passes, which FSDP2 and ZeRO-3 need (their collectives must pair up across ranks)."""
    t, a, r = cfg.train, cfg.algorithm, cfg.rollout
    _positive("train.cpu_ranks", t.cpu_ranks)
    if t.cpu_ranks > 1 and t.gpus:
        raise ConfigError(
            f"train.cpu_ranks={t.cpu_ranks} applies to CPU training; with train.gpus {list(t.gpus)} there is "
            "one rank per train GPU: set train.cpu_ranks=1"
        )
    world = train_world(cfg)
    key, prompts = (
        ("algorithm.ppo_mini_batch_size", a.ppo_mini_batch_size)
        if a.ppo_mini_batch_size
        else ("trainer.batch_size", cfg.trainer.batch_size)
    )
    rows = prompts * r.n
    if rows % world:
        ranks = f"train.gpus {list(t.gpus)}" if t.gpus else f"train.cpu_ranks={t.cpu_ranks}"
        raise ConfigError(
            f"{key}={prompts} x rollout.n={r.n} = {rows} responses per optimizer step do not split evenly over "
            f"the {world} training ranks of {ranks}; make {key} x rollout.n a multiple of {world}"
        )


def _check_placement(cfg: Config) -> None:
    r, t = cfg.rollout, cfg.train
    _check_gpus("rollout.gpus", r.gpus)
    _check_gpus("train.gpus", t.gpus)
    if r.engine == "hf" and r.gpus != t.gpus:
        raise ConfigError(
            f"rollout.engine=hf generates with the trained model itself, so rollout.gpus {list(r.gpus)} "
            f"must equal train.gpus {list(t.gpus)}; set rollout.gpus={list(t.gpus)} or use rollout.engine=vllm"
        )
    if r.engine == "vllm" and bool(r.gpus) != bool(t.gpus):
        raise ConfigError(
            f"rollout.gpus {list(r.gpus)} and train.gpus {list(t.gpus)}: vLLM on the CPU (vllm-cpu) needs the "
            "trainer on the CPU too, and vLLM on GPUs a trainer on GPUs; give both or neither"
        )
    if r.gpus and t.gpus and set(r.gpus) & set(t.gpus) and set(r.gpus) != set(t.gpus):
        raise ConfigError(
            f"rollout.gpus {list(r.gpus)} overlaps train.gpus {list(t.gpus)}; make them equal (colocated) "
            "or disjoint (split)"
        )


def _check_cost(cfg: Config) -> None:
    c = cfg.cost
    for model, price in c.price_per_hour.items():
        if price < 0:
            raise ConfigError(f"cost.price_per_hour.{model}={price} must be >= 0")
    for gpu in cfg.used_gpus:
        if gpu >= len(c.gpu_models):
            raise ConfigError(
                f"GPU {gpu} is used but cost.gpu_models lists only {len(c.gpu_models)} GPU(s); "
                f"add its model name to cost.gpu_models"
            )
        model = c.gpu_models[gpu]
        if model not in c.price_per_hour:
            raise ConfigError(
                f"cost.price_per_hour has no price for GPU model {model!r}; add one in USD per GPU-hour, "
                f"e.g. --set 'cost.price_per_hour.{model}=0.0'"
            )


def _check_not_built(cfg: Config) -> None:
    values = {
        "rollout.engine": cfg.rollout.engine,
        "rollout.quantization": cfg.rollout.quantization,
        "train.backend": cfg.train.backend,
    }
    for key, value in values.items():
        why = NOT_BUILT.get((key, value))
        if why:
            raise ConfigError(
                f"{key}={value}: {why} in lite-verl 0.1; use --set {key}={BUILT_ALTERNATIVE[key]} for now"
            )


def check_environment(cfg: Config) -> None:
    """Checks that need this machine: the GPU ids exist, the optional packages are installed."""
    used = cfg.used_gpus
    if used:
        import torch

        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        missing = [g for g in used if g >= count]
        if missing:
            have = f"only {count} CUDA GPU(s)" if count else "no CUDA GPU"
            raise ConfigError(
                f"the config uses GPU id(s) {missing} but this machine has {have}; "
                f"use --preset laptop or fix rollout.gpus / train.gpus / reward.device"
            )
    from lite_verl.run.trackers import require_trackers

    require_trackers(cfg.trainer)  # trainer.loggers=[..., wandb]: its package, before the run dir exists
    if cfg.rollout.engine == "vllm" and importlib.util.find_spec("vllm") is None:
        raise MissingDependency("vllm", "vllm", "rollout.engine=vllm")
    needs = {"qlora": ("bitsandbytes", "qlora"), "deepspeed": ("deepspeed", "deepspeed")}
    if cfg.rollout.quantization == "awq" and not cfg.rollout.quantized_path:
        from lite_verl.quant.awq import require_autoawq

        require_autoawq()
    if cfg.train.use_liger and importlib.util.find_spec("liger_kernel") is None:
        raise MissingDependency("liger-kernel", "liger", "train.use_liger=true")
    if cfg.train.backend in needs:
        pkg, extra = needs[cfg.train.backend]
        if importlib.util.find_spec(pkg) is None:
            raise MissingDependency(pkg, extra, f"train.backend={cfg.train.backend}")
