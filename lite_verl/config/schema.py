"""The run configuration's schema: one frozen dataclass per section, each key with its type, default and help.

A key's help is its field metadata (`key(default, help)`), written once: `lite-verl validate --keys` prints
it (convert.describe). A key with a fixed set of values is a `Literal` type: the values are written once,
in the type; the help, the type check (convert.py) and the error for a wrong value list them from it.

A preset only says *where and how* things run (devices, memory knobs, backends, prices); what is
computed (batch sizes in prompts, loss normalisation, seeds) lives in the other sections so that a
laptop and a workstation run of one config follow the same algorithm.

Building a Config from dicts: convert.py; the layers (preset, --config, --set): layers.py; the checks
on a whole config: validation.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Literal, TypeVar, cast, get_args

Dtype = Literal["float32", "bfloat16", "float16"]
Engine = Literal["hf", "vllm"]
Quantization = Literal["none", "awq"]
KvCacheDtype = Literal["auto", "fp8"]
Backend = Literal["lora", "qlora", "fsdp", "deepspeed"]
LrScheduler = Literal["constant", "linear", "cosine"]  # algos.LR_SCHEDULES lists the same
OptimizerStateDtype = Literal["float32", "bfloat16"]
AdvEstimator = Literal[
    "gae", "grpo", "dr_grpo", "rloo", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "remax"
]
KlType = Literal["kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3"]  # k1 = kl, k2 = mse, k3 = low_var_kl
KlControl = Literal["fixed", "adaptive"]
# algos.agg_loss implements these (algos.LOSS_AGG_MODES, which stays torch-only and free of config imports;
# tests/test_config.py checks that the two agree)
LossAggMode = Literal["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]
RolloutCorrection = Literal["auto", "none", "token", "sequence"]
OnError = Literal["raise", "default"]
# where each step's metrics go (run/trackers.py); wandb, mlflow and trackio need their extra installed
Logger = Literal["console", "jsonl", "tensorboard", "wandb", "mlflow", "trackio"]
SyncMode = Literal["adapter", "merged"]
Checkpointing = bool | Literal["auto"]  # train.gradient_checkpointing; auto: decided by the memory plan
KvCache = float | Literal["auto"]  # rollout.kv_cache_gib; auto: sized to one rollout by the memory plan

BACKENDS: tuple[Backend, ...] = get_args(Backend)
# full fine-tuning (train/full.py): every weight trains; TrainConfig.full_finetune says whether a config does
FULL_BACKENDS: tuple[Backend, ...] = ("fsdp", "deepspeed")
# train.target_modules=[all-linear]: peft's name for every linear layer but the output head (TRL's, verl's)
ALL_LINEAR = "all-linear"

T = TypeVar("T")


def key(default: T, help: str, where: bool = False) -> T:
    """A config key: its default and its one-line help (field metadata, printed by `lite-verl validate --keys`).
    `where`: the key says where and how things run (devices, memory knobs, engines, prices), never what is
    computed. Presets set only such keys and recipes none of them (config/layers.py checks both)."""
    meta = {"help": help, "where": where}
    if isinstance(default, dict):
        made = cast(dict[Any, Any], default)
        return cast(T, field(default_factory=lambda: dict(made), metadata=meta))
    return cast(T, field(default=default, metadata=meta))


def typed_newlines(text: str) -> str:
    """A typed `\\n` as a newline, in prompt frames and stop strings: a shell's --set cannot hold one, and
    a prompt never means a backslash-n."""
    return text.replace("\\n", "\n")


@dataclass(frozen=True)
class ModelConfig:
    path: str = key(
        "tiny:qwen2",
        "HF causal-LM directory, Hub id org/name[@revision] (cached snapshot, else downloaded once), "
        "a .gguf file (imported once), or tiny:qwen2 / tiny:llama (random-init, made on the spot)",
    )
    revision: str = key(
        "", "Hub id only: branch, tag or commit to use; empty = main (or the @revision in path)"
    )
    dtype: Dtype = key("float32", "weights and compute of the trained model", where=True)
    trust_remote_code: bool = key(False, "passed to from_pretrained for models with custom code")
    fp32_lm_head: bool = key(
        True, "bf16/fp16 models: LM head in fp32 in the trainer and in vLLM (fewer mismatches)", where=True
    )


@dataclass(frozen=True)
class DataConfig:
    train_files: tuple[str, ...] = key(
        (),
        "prompt data: .jsonl/.json/.parquet/.csv files or directories of them, datasets save_to_disk "
        "directories, or Hub dataset ids org/name[@revision] (read by `datasets`); empty = the built-in task",
    )
    val_files: tuple[str, ...] = key(
        (),
        "validation data, same forms (split data.val_split); empty = split data.val_split of train_files "
        "when it has one (none if not), or a held-out built-in set",
    )
    subset: str = key("", "Hub dataset config (load_dataset's name), e.g. main for openai/gsm8k")
    split: str = key(
        "train", "split of train_files to train on (a single file is one split); slices work: train[:90%]"
    )
    val_split: str = key(
        "test",
        "split of val_files, or else of train_files, to validate on (TRL's dataset_test_split); '' = none; "
        "a held-out slice: split=train[:-200] val_split=train[-200:]",
    )
    prompt_key: str = key(
        "prompt", "column holding the prompt: plain text, or a list of chat messages {role, content}"
    )
    answer_key: str = key(
        "reward_model.ground_truth",
        "column holding the ground truth given to the reward, its type kept; a.b = key b of struct column a "
        "(verl's schema); left at this default, a source without verl's reward_model column uses its first "
        "column of answer, solution, ground_truth, target; '' = none",
    )
    system_prompt: str = key("", "a system message put before every prompt that has none")
    prompt_template: str = key(
        "",
        "wraps each prompt's (last user) text, of data files and built-in tasks: {prompt} is replaced by it, e.g. "
        "'{prompt} Answer after ####.' or, for a base model, 'Question: {prompt}\\nAnswer:'; empty = as it is",
    )
    chat_template: str = key(
        "",
        "the chat template prompts are formatted with: empty = the model's own; chatml; a .jinja file; or the "
        "Jinja text itself (Unsloth's get_chat_template); exports carry it",
    )
    apply_chat_template: bool = key(
        True,
        "format prompts with the model's chat template when it has one (else plain text); false = the "
        "prompt text as is, for base models",
    )
    data_source: str = key(
        "", "data_source of rows without that column (picks the rule reward); empty = the path or Hub id"
    )
    skip_bad_rows: bool = key(
        False, "skip rows with a missing or malformed prompt or answer (counted on stderr), not an error"
    )
    task: str = key(
        "echo",
        "built-in task when train_files is empty: echo | arithmetic | countdown | sequence | largest (data/tasks.py TASKS)",
    )
    task_size: int = key(4096, "number of built-in training prompts generated from trainer.seed")
    val_size: int = key(64, "number of prompts scored at each validation")
    max_prompt_length: int = key(
        512,
        "prompts longer than this (in tokens) are an error naming the row, unless filter_overlong_prompts",
    )
    filter_overlong_prompts: bool = key(
        False, "drop prompts longer than max_prompt_length (with a count on stderr), as verl's"
    )
    shuffle: bool = key(True, "reshuffle the prompts every epoch (seeded by trainer.seed and the epoch)")


@dataclass(frozen=True)
class RolloutConfig:
    engine: Engine = key("hf", "hf = transformers generate in the trainer; vllm = a vLLM engine", where=True)
    n: int = key(8, "responses sampled per prompt (the GRPO group size)")
    temperature: float = key(1.0, "sampling temperature; the trainer divides logits by it too")
    top_p: float = key(1.0, "nucleus sampling")
    top_k: int = key(0, "sample from the k most likely tokens only; 0 = all (TRL's top_k, verl's top_k=-1)")
    min_p: float = key(
        0.0,
        "drop tokens less likely than min_p x the most likely one; 0 = off (TRL's, Unsloth's notebooks: 0.1)",
    )
    max_new_tokens: int = key(16, "response length limit in tokens")
    stop: tuple[str, ...] = key(
        (),
        "strings that end a response: it is cut after the token that completes the first one (kept and trained "
        "on, as EOS is), the same on every engine; e.g. ['\\n\\nQuestion:'] for a base model in a Q/A frame "
        "(a typed \\n is a newline)",
    )
    gpus: tuple[int, ...] = key((), "local GPU ids for rollout; empty = CPU", where=True)
    gpu_memory_utilization: float = key(0.5, "vLLM: fraction of each rollout GPU it may take", where=True)
    kv_cache_gib: KvCache = key(
        0.0,
        "vLLM on GPUs: its KV cache per GPU in GiB, reserved as given (vLLM's kv_cache_memory_bytes: no memory "
        "profiling, so other processes on the card cannot disturb its start, and gpu_memory_utilization is "
        "then sized by the plan); auto: what one rollout holds at once (trainer.batch_size x rollout.n rows of "
        "the full length) with a margin; 0 = what gpu_memory_utilization leaves after weights and activations",
        where=True,
    )
    kv_cache_dtype: KvCacheDtype = key(
        "auto",
        "vLLM on GPUs: the KV cache's element type; auto = the serving dtype (bf16/fp16, 2 bytes); fp8 = 1 byte "
        "(vLLM's kv_cache_dtype=fp8, half the cache, for cards with FP8: RTX 40xx, L4, H100): the rollout's "
        "log-probs move a little, as with AWQ, and algorithm.rollout_correction=auto corrects for it",
        where=True,
    )
    quantization: Quantization = key(
        "none", "weights the rollout engine serves (awq: 4-bit, vLLM only)", where=True
    )
    quantized_path: str = key(
        "", "awq: a model dir from `lite-verl quantize`; empty = quantize on first use (cached)", where=True
    )
    awq_group_size: int = key(128, "awq: input channels per quantization group (32, 64 or 128)", where=True)
    enforce_eager: bool = key(
        False, "vLLM: no CUDA graphs / compile (faster start, slower decode)", where=True
    )
    colocate: bool = key(
        True,
        "rollout.gpus == train.gpus: true = hybrid engine (vLLM sleeps during updates); false = split on the same cards",
        where=True,
    )
    sleep_level: int = key(
        1,
        "colocated vLLM during updates: 1 = weights parked in host memory; 2 = discarded (sync.mode=merged, no AWQ: every weight is reloaded at the next sync, no host round trip)",
        where=True,
    )
    max_staleness: int = key(
        0,
        "0 = synchronous; 1 = one-step-off-policy: rollout k+1 runs while the trainer updates on k (split placement, vllm)",
    )

    @property
    def stop_strings(self) -> tuple[str, ...]:
        return tuple(typed_newlines(s) for s in self.stop)


@dataclass(frozen=True)
class TrainConfig:
    backend: Backend = key(
        "lora",
        "lora/qlora train an adapter (qlora: on a 4-bit base); fsdp/deepspeed train every weight",
        where=True,
    )
    gpus: tuple[int, ...] = key(
        (), "local GPU ids for training, one training process (rank) each; empty = CPU", where=True
    )
    cpu_ranks: int = key(
        1,
        "CPU training (gpus empty) in this many gloo processes: a laptop runs the maths of a len(gpus)-GPU run",
        where=True,
    )
    lr: float = key(
        3e-3,
        "AdamW learning rate (peak, after warm-up); right for tiny models; ~1e-5..1e-4 for real 1B+ LoRA",
    )
    lr_scheduler: LrScheduler = key(
        "constant",
        "learning rate over the run after warm-up (transformers' schedules, one step per training step)",
    )
    warmup_steps: int = key(0, "training steps of linear warm-up from 0 to train.lr (0 = none)")
    min_lr_ratio: float = key(0.0, "linear/cosine: the rate decays to train.lr x this at the last step")
    weight_decay: float = key(0.0, "AdamW weight decay")
    grad_clip: float = key(1.0, "max global grad norm; <= 0 disables clipping")
    micro_batch_size: int = key(
        8, "sequences per forward/backward; a memory knob, never changes the maths", where=True
    )
    pack_micro_batches: bool = key(
        True,
        "fill each forward/backward with shorter rows up to the tokens of micro_batch_size full-length ones (same memory bound, fewer launches)",
        where=True,
    )
    lora_rank: int = key(16, "LoRA rank r")
    lora_alpha: int = key(32, "LoRA alpha (scale = alpha / r)")
    lora_dropout: float = key(0.0, "LoRA dropout")
    target_modules: tuple[str, ...] = key(
        ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"),
        "names of the linear layers LoRA adapts (in every decoder layer), or all-linear (every linear but the head)",
    )
    gradient_checkpointing: Checkpointing = key(
        False,
        "trade compute for activation memory (one more forward per micro-batch); auto: off where the memory "
        "plan fits without it at train.micro_batch_size, on otherwise (decided before loading, written to the run's config)",
        where=True,
    )
    use_liger: bool = key(
        False,
        "Liger's Triton kernels for RMSNorm, SwiGLU and RoPE in the trainer's model (verl's use_liger, TRL's "
        "use_liger_kernel): fewer launches and activations per layer, the same maths up to rounding; CUDA only "
        "(pip install 'lite-verl[liger]'); an architecture Liger does not cover runs as transformers builds it",
        where=True,
    )
    grow_micro_batch: bool = key(
        False,
        "double train.micro_batch_size, up to one mini-batch's rows per training rank, while the memory plan fits "
        "with room to spare (fewer, larger kernels: a small update is host-bound); decided before loading with "
        "gradient_checkpointing=auto, written to the run's config",
        where=True,
    )
    offload_params: bool = key(
        False,
        "fsdp/deepspeed: weights (and the reference policy) in host memory; fsdp moves gradients and AdamW state with them",
        where=True,
    )
    offload_optimizer: bool = key(
        False,
        "fsdp/deepspeed: AdamW state, fp32 masters and gradients in host memory (fsdp: together with offload_params)",
        where=True,
    )
    offload_during_rollout: bool = key(
        False,
        "lora/qlora with a colocated vLLM (the hybrid engine): the trainer's weights, adapters and AdamW state wait in "
        "pinned host memory while vLLM generates, so the card holds one of the two at a time (costs two host copies "
        "of the trainer's weights per step)",
        where=True,
    )
    embeddings_on_host: bool = key(
        False,
        "lora/qlora on a GPU, a model whose input embeddings are not its LM head (untied: Qwen2.5-7B and up): the "
        "frozen input embedding table stays in host memory and each forward looks its tokens up there (a 7B's "
        "1.0 GiB off the card for ~22 MB copied per 8 x 384-token micro-batch); a tied model keeps it on the card",
        where=True,
    )
    optimizer_state_dtype: OptimizerStateDtype = key(
        "float32",
        "AdamW's m and v with train.backend=fsdp (fp32 master weights either way; bfloat16: 12 instead of 16 bytes per parameter, the host memory a 7B fsdp offload needs goes from 113 to 85 GiB)",
        where=True,
    )
    max_memory_gib: float = key(
        0.0,
        "cap this process's memory on its training GPU (0 = the whole card): the trainer's share of a card it shares, or a 24 GB card emulated on a bigger one",
        where=True,
    )

    @property
    def all_linear(self) -> bool:
        """target_modules=[all-linear]: peft's every linear layer but the head (validation keeps it alone)."""
        return ALL_LINEAR in self.target_modules

    @property
    def full_finetune(self) -> bool:
        """Every weight trains (fsdp, deepspeed: train/full.py), rather than an adapter (lora, qlora)."""
        return self.backend in FULL_BACKENDS

    @property
    def checkpointing(self) -> bool:
        """gradient_checkpointing as the trainer applies it: auto that the plan has not decided (the cli decides
        it before loading; a Config built in code may not) means on, the memory-safe choice."""
        return self.gradient_checkpointing is not False


@dataclass(frozen=True)
class AlgorithmConfig:
    adv_estimator: AdvEstimator = key("grpo", "advantage estimator (algos.py); gae is PPO with a critic")
    norm_adv_by_std_in_grpo: bool = key(True, "GRPO: divide by the group std (dr_grpo never does)")
    gamma: float = key(1.0, "discount (gae, reinforce_plus_plus)")
    lam: float = key(1.0, "GAE lambda")
    use_kl_loss: bool = key(True, "add beta * KL(policy || reference) to the loss (verl's GRPO recipe)")
    kl_loss_coef: float = key(0.001, "beta of the KL loss")
    kl_loss_type: KlType = key("low_var_kl", "estimator of the KL loss (k1 = kl, k2 = mse, k3 = low_var_kl)")
    use_kl_in_reward: bool = key(False, "subtract kl_coef * KL from the token rewards instead (PPO style)")
    kl_penalty: KlType = key("kl", "estimator of the in-reward KL (k1 = kl, k2 = mse, k3 = low_var_kl)")
    kl_ctrl_type: KlControl = key(
        "fixed", "how the in-reward KL coefficient moves (adaptive: Ziegler et al.)"
    )
    kl_coef: float = key(0.001, "in-reward KL coefficient (initial value when adaptive)")
    kl_target: float = key(0.1, "adaptive controller: target KL per token")
    kl_horizon: int = key(10000, "adaptive controller: horizon in samples")
    clip_ratio_low: float = key(0.2, "PPO clip: ratio >= 1 - clip_ratio_low")
    clip_ratio_high: float = key(0.2, "PPO clip: ratio <= 1 + clip_ratio_high (DAPO clip-higher when larger)")
    clip_ratio_c: float = key(3.0, "dual clip for negative advantages (> 1)")
    loss_agg_mode: LossAggMode = key(
        "token-mean", "how token losses add up to the batch loss (algos.agg_loss, as verl)"
    )
    entropy_coeff: float = key(0.0, "entropy bonus coefficient (loss -= coeff * entropy)")
    mask_truncated_completions: bool = key(
        False,
        "responses cut by rollout.max_new_tokens (no EOS, no stop) count in their group's advantages but not "
        "in the loss (TRL's mask_truncated_completions, DAPO's overlong filtering)",
    )
    ppo_epochs: int = key(1, "passes over each rollout batch")
    ppo_mini_batch_size: int = key(
        0, "prompts per optimizer step; 0 = the whole batch (one step per rollout)"
    )
    rollout_correction: RolloutCorrection = key(
        "auto",
        "truncated IS for rollout/trainer mismatch (auto: token when the rollout is quantized or stale, else none)",
    )
    rollout_is_threshold: float = key(2.0, "C: IS weights are truncated at this value")


@dataclass(frozen=True)
class CriticConfig:
    lr: float = key(3e-3, "critic AdamW learning rate (adapter + value head)")
    cliprange_value: float = key(0.5, "value clipping around the old values")
    warmup_steps: int = key(0, "steps that update only the critic (the actor waits)")


@dataclass(frozen=True)
class RewardFunctionConfig:
    """One entry of reward.functions (a mapping in YAML: {fn: boxed, weight: 1.0})."""

    fn: str = key(
        "", "module:function, path/to/file.py:function, or a built-in: rule | gsm8k | boxed | format | length"
    )
    weight: float = key(1.0, "its weight in the reward (the weighted sum of the functions' values)")
    name: str = key("", "its metric reward/NAME/mean; empty = the built-in's or the function's name")
    args: dict[str, str] = key({}, "a built-in's settings, e.g. {tags: think,answer} (reward/builtins.py)")


@dataclass(frozen=True)
class RewardConfig:
    function: str = key(
        "",
        "one reward function, module:function or path/to/file.py:function, verl's compute_score or TRL's "
        "fn(prompts, completions, **columns); empty = rule by data_source",
    )
    functions: tuple[RewardFunctionConfig, ...] = key(
        (),
        "several weighted reward functions instead: [{fn: ..., weight: 1.0, name: ..., args: {...}}], "
        "fn a user function or a built-in (rule, gsm8k, boxed, format, length); "
        "reward = sum of weight x value (a None skipped)",
    )
    isolate: bool = key(
        True, "run user reward functions in a worker process (a crash or hang cannot take the run down)"
    )
    timeout_s: float = key(
        30.0, "time limit per sample of a user reward function (isolated only; a TRL batch gets N x this)"
    )
    on_error: OnError = key("raise", "what a raising, crashing or hanging user reward function does")
    default_score: float = key(0.0, "the value a failed function gives a sample when on_error=default")
    device: str = key("cpu", "where a reward model runs: cpu or cuda:N", where=True)
    model: str = key("", "a reward model dir (sequence classification, one output); replaces the rule reward")
    keep_alive_s: float = key(
        0.0, "reward.model: release it after this many idle seconds (0 = after every scoring)", where=True
    )
    url: str = key("", "a remote reward endpoint (POST items -> scores); replaces the rule reward")
    retries: int = key(2, "reward.url: retries after a failed request (network error, timeout, HTTP 5xx)")


@dataclass(frozen=True)
class SyncConfig:
    mode: SyncMode = key(
        "adapter", "adapter = push the LoRA tensors; merged = merge them, load full weights", where=True
    )
    bucket_mb: int = key(512, "merged sync: weights move in buckets of about this size", where=True)


@dataclass(frozen=True)
class TrainerConfig:
    total_steps: int = key(100, "rollout + update steps")
    total_epochs: float = key(
        0.0,
        "> 0: passes over the training prompts instead of total_steps, which becomes ceil(epochs x prompts / "
        "batch_size) once the data is read (TRL's num_train_epochs, verl's total_epochs) and is written to the run",
    )
    batch_size: int = key(16, "prompts per step, global: the same on every machine")
    seed: int = key(0, "seeds data order, built-in task, sampling and init")
    save_every: int = key(0, "also checkpoint every N steps (0 = by time, a signal and the end only)")
    save_every_minutes: float = key(
        10.0, "checkpoint when this many minutes passed since the last one (0 = off: benchmarks)"
    )
    keep_checkpoints: int = key(
        2,
        "keep the last N checkpoints (0 = write none: no resume, no export; benchmarks of models too big for the disk)",
    )
    val_every: int = key(
        0, "validate every N steps (0 = never; the run still validates at the end if val_size>0)"
    )
    val_before_train: bool = key(True, "validate before the first step (when data.val_size > 0)")
    loggers: tuple[Logger, ...] = key(
        ("console", "jsonl", "tensorboard"),
        "where metrics go: console (progress bar), jsonl (RUN/metrics.jsonl: required, the summary, report "
        "and resume read it), tensorboard (RUN/tb), wandb, mlflow, trackio (pip install 'lite-verl[wandb]' etc.)",
    )
    project_name: str = key(
        "",
        "the trackers' project (W&B project, MLflow experiment, Trackio project; verl's trainer.project_name); "
        "empty = WANDB_PROJECT / MLFLOW_EXPERIMENT_NAME / TRACKIO_PROJECT, else lite-verl",
    )
    experiment_name: str = key(
        "",
        "the trackers' run name (verl's trainer.experiment_name, TRL's run_name); empty = the run directory's name",
    )
    tensorboard: bool | None = key(
        None,
        "old switch, kept: true adds tensorboard to trainer.loggers, false removes it, null = as loggers say",
    )
    samples_every: int = key(
        10,
        "write a few of the step's completions to RUN/samples.jsonl every N steps and at the last (0 = off)",
    )
    samples_per_step: int = key(
        8, "completions per sampled step: the best, the worst and evenly spaced between"
    )
    progress: bool = key(True, "show a progress bar")
    plan_check: bool = key(
        True,
        "GPU runs: refuse a config whose predicted peak memory exceeds a card (lite-verl plan)",
        where=True,
    )


@dataclass(frozen=True)
class CostConfig:
    gpu_models: tuple[str, ...] = key((), "model of each local GPU id, e.g. [RTX 4090, RTX 4090]", where=True)
    price_per_hour: dict[str, float] = key({}, 'USD per GPU-hour by model (and "cpu")', where=True)


@dataclass(frozen=True)
class Config:
    preset: str = key("laptop", "the preset this config was built from (informational)")
    recipe: str = key("", "the recipe this config was built from (informational); empty = none")
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

    def with_auto_resolved(self) -> Config:
        """algorithm.rollout_correction=auto made concrete: token-level truncated IS when the rollout engine
        serves quantized weights or a quantized KV cache, or lags one update behind (its log-probs then differ
        from the trainer's by design), none otherwise."""
        if self.algorithm.rollout_correction != "auto":
            return self
        r = self.rollout
        quantized = r.quantization != "none" or r.kv_cache_dtype != "auto" or self.train.backend == "qlora"
        mode: RolloutCorrection = "token" if quantized or self.rollout.max_staleness > 0 else "none"
        return replace(self, algorithm=replace(self.algorithm, rollout_correction=mode))

    @property
    def full_length(self) -> int:
        """The longest sequence a run generates and trains on: the prompt limit plus the response limit."""
        return self.data.max_prompt_length + self.rollout.max_new_tokens

    @property
    def hybrid(self) -> bool:
        """The hybrid engine: vLLM on the training GPUs, asleep during each update (rollout.colocate)."""
        r = self.rollout
        return r.engine == "vllm" and r.colocate and bool(r.gpus) and r.gpus == self.train.gpus

    @property
    def park_before_sync(self) -> bool:
        """train.offload_during_rollout with an adapter sync: the trainer leaves the card before the sync and
        the adapter (tens of MB) reaches vLLM through host memory, so the card never holds vLLM's weights and
        the trainer's together. A merged sync merges on the card first: the trainer leaves after it."""
        return self.train.offload_during_rollout and self.sync.mode == "adapter"

    @property
    def reward_gpus(self) -> tuple[int, ...]:
        """The reward model's local GPU id, when it has one (reward.device=cuda:N)."""
        d = self.reward.device
        return (int(d[5:]),) if d.startswith("cuda:") else ()

    @property
    def used_gpus(self) -> list[int]:
        """The distinct local GPU ids the config uses (rollout, train, reward model), in order."""
        return sorted({*self.rollout.gpus, *self.train.gpus, *self.reward_gpus})
