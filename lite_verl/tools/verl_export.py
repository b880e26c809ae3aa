"""A lite-verl config as verl's: Hydra overrides for `python3 -m verl.trainer.main_ppo` (verl 0.9).

    lite-verl export-verl runs/20261202-120000-4090x1            # -> runs/20261202-120000-4090x1/verl/
    lite-verl export-verl my.yaml --preset 4090x4 --nnodes 2 --gpus-per-node 8 --out verl_job

When one workstation is not enough, the answer is an existing distributed engine: verl on Ray. This
module maps a resolved Config onto the keys of verl's `trainer/config/ppo_trainer.yaml`: one Override
per setting that has a verl key, one Note per setting that has none, saying what the export does
instead. `verl_files.py` writes them out with the data; `tests/test_verl_export.py` composes verl's own
config with the overrides, so a misspelt key fails there.

Where verl differs by design (each one is also a Note in the export):
* placement: verl runs actor, reference and vLLM rollout on every GPU of the job (its hybrid engine);
  lite-verl's split placement and one-step-off-policy have no one-key equivalent;
* AWQ rollout and the merged AWQ re-quantization: verl's vLLM serves bf16 weights;
* the critic (gae) is a model of its own in verl, not a second adapter on the actor's base.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from lite_verl.config import ALL_LINEAR, Config
from lite_verl.errors import UserError
from lite_verl.run.trackers import logger_names

ACTOR = "actor_rollout_ref.actor."
REF = "actor_rollout_ref.ref."
ROLLOUT = "actor_rollout_ref.rollout."
MODEL = "actor_rollout_ref.model."
VERL_RULE_SOURCES = ("openai/gsm8k",)  # data sources whose rule reward verl and lite-verl share
# model.dtype -> FSDP's mixed-precision param dtype (verl computes in bf16 unless told)
VERL_LOGGERS = ("console", "tensorboard", "wandb", "mlflow", "trackio")  # trainer.loggers verl also has
MIXED_PRECISION = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}


@dataclass(frozen=True)
class InExport:
    """A path inside the export directory: absolute in overrides.txt, "$HERE/..." in run_verl.sh."""

    rel: str


Value = str | int | float | bool | None | tuple[str, ...] | dict[str, str] | InExport


@dataclass(frozen=True)
class Override:
    key: str  # verl's dotted key; a leading "+" adds a key that verl's yaml leaves out
    value: Value


@dataclass(frozen=True)
class Note:
    setting: str  # the lite-verl setting, e.g. "rollout.quantization=awq"
    verl: str  # what the verl job does instead


Item = Override | Note


@dataclass(frozen=True)
class Layout:
    nnodes: int  # Ray nodes
    gpus_per_node: int  # GPUs per node (verl's trainer.n_gpus_per_node)

    @property
    def world(self) -> int:
        return self.nnodes * self.gpus_per_node


@dataclass(frozen=True)
class Inputs:
    """What the export decided outside the config: where the model and reward function are, the data size."""

    name: str  # experiment name
    model: str | InExport  # the model directory verl loads
    n_train: int  # rows in train.parquet
    has_val: bool  # lite-verl validates this run (val.parquet holds its validation prompts)
    reward_file: InExport | None  # reward.custom_reward_function.path; None = verl's own rules
    reward_name: str = "compute_score"  # the function in reward_file


@dataclass(frozen=True)
class Plan:
    overrides: tuple[Override, ...]
    notes: tuple[Note, ...]


def default_layout(cfg: Config, nnodes: int = 1, gpus_per_node: int | None = None) -> Layout:
    """One node with the config's GPUs (rollout and train together; at least 1) unless told otherwise."""
    if nnodes < 1 or (gpus_per_node is not None and gpus_per_node < 1):
        raise UserError(f"--nnodes {nnodes} / --gpus-per-node {gpus_per_node}: give whole numbers >= 1")
    used = len(set(cfg.rollout.gpus) | set(cfg.train.gpus))
    return Layout(nnodes, gpus_per_node or max(1, used))


def check_layout(cfg: Config, layout: Layout, n_train: int) -> None:
    """verl splits every batch evenly over the GPUs and drops a last incomplete batch."""
    n, batch = cfg.rollout.n, cfg.trainer.batch_size
    mini = cfg.algorithm.ppo_mini_batch_size or batch
    for what, count in (("trainer.batch_size", batch), ("algorithm.ppo_mini_batch_size", mini)):
        if (count * n) % layout.world:
            raise UserError(
                f"{what}={count} x rollout.n={n} = {count * n} responses do not split evenly over "
                f"{layout.world} GPU(s) as verl needs; change {what} or --gpus-per-node/--nnodes"
            )
    if n_train < batch:
        raise UserError(
            f"the training data has {n_train} prompts, fewer than trainer.batch_size={batch}; verl drops an "
            "incomplete batch, so it would never train: raise data.task_size or add prompts"
        )


def micro_batch(cfg: Config, layout: Layout) -> int:
    """train.micro_batch_size, lowered to divide each GPU's share of a mini-batch (memory only, same maths)."""
    mini = cfg.algorithm.ppo_mini_batch_size or cfg.trainer.batch_size
    per_gpu = mini * cfg.rollout.n // layout.world
    return max(d for d in range(1, min(cfg.train.micro_batch_size, per_gpu) + 1) if per_gpu % d == 0)


def plan_export(cfg: Config, inp: Inputs, layout: Layout) -> Plan:
    items = [
        *_data(cfg, inp),
        *_rollout(cfg, layout),
        *_actor(cfg, inp, layout),
        *_precision(cfg),
        *_algorithm(cfg),
        *_critic(cfg, inp, layout),
        *_reward(cfg, inp, layout),
        *_trainer(cfg, inp, layout),
    ]
    return Plan(
        tuple(i for i in items if isinstance(i, Override)), tuple(i for i in items if isinstance(i, Note))
    )


# ----------------------------------------------------------------------------------------------------
# Sections, in the order of verl's config.
# ----------------------------------------------------------------------------------------------------


def _data(cfg: Config, inp: Inputs) -> list[Item]:
    d = cfg.data
    items: list[Item] = [
        Override("data.train_files", InExport("train.parquet")),
        Override("data.val_files", InExport("val.parquet")),
        Override("data.train_batch_size", cfg.trainer.batch_size),
        Override("data.max_prompt_length", d.max_prompt_length),
        Override("data.max_response_length", cfg.rollout.max_new_tokens),
        Override("data.filter_overlong_prompts", d.filter_overlong_prompts),
        Override("data.shuffle", d.shuffle),
        Override("data.seed", cfg.trainer.seed),
    ]
    if not d.train_files:
        items.append(
            Note(
                f"data.task={d.task}",
                f"verl has no built-in tasks: the export generated the same prompts from trainer.seed="
                f"{cfg.trainer.seed} ({d.task_size} train, {d.val_size} val) into train.parquet / val.parquet",
            )
        )
    if not inp.has_val:
        items.append(
            Note(
                "no validation (data.val_size=0, or data.train_files without data.val_files)",
                "verl needs a validation file: val.parquet holds a few training prompts and validation is "
                "off (trainer.test_freq=-1, trainer.val_before_train=false)",
            )
        )
    return items


def _rollout(cfg: Config, layout: Layout) -> list[Item]:
    r, t = cfg.rollout, cfg.train
    tp = math.gcd(max(1, len(r.gpus)), layout.world) if r.engine == "vllm" else 1
    items: list[Item] = [
        Override(ROLLOUT + "name", "vllm"),
        Override(ROLLOUT + "n", r.n),
        Override(ROLLOUT + "temperature", r.temperature),
        Override(ROLLOUT + "top_p", r.top_p),
        Override(ROLLOUT + "top_k", r.top_k or -1),
        Override(ROLLOUT + "gpu_memory_utilization", r.gpu_memory_utilization),
        Override(ROLLOUT + "enforce_eager", r.enforce_eager),
        Override(ROLLOUT + "tensor_model_parallel_size", tp),
        Override(ROLLOUT + "seed", cfg.trainer.seed),
        Override(ROLLOUT + "checkpoint_engine.update_weights_bucket_megabytes", cfg.sync.bucket_mb),
    ]
    if r.engine == "hf":
        items.append(Note("rollout.engine=hf", "verl generates with vLLM (rollout.name=vllm)"))
    if r.kv_cache_dtype != "auto":  # verl hands rollout.engine_kwargs.vllm to vLLM as given
        items.append(Override("+" + ROLLOUT + "engine_kwargs.vllm.kv_cache_dtype", r.kv_cache_dtype))
    if r.min_p:
        items.append(
            Note(f"rollout.min_p={r.min_p}", "verl's rollout config has no min_p: it samples without it")
        )
    if r.stop:
        items.append(
            Note(
                f"rollout.stop={list(r.stop)}",
                "verl's rollout has no stop strings: responses end at EOS or rollout.response_length",
            )
        )
    if r.quantization == "awq":
        items.append(
            Note(
                "rollout.quantization=awq",
                "verl's vLLM rollout serves bf16 weights (its rollout.quantization knows fp8 and torchao, not "
                "AWQ); rollout.quantized_path and rollout.awq_group_size are dropped",
            )
        )
        if cfg.sync.mode == "merged":
            items.append(
                Note(
                    "sync.mode=merged (AWQ re-quantization at every sync)",
                    "verl merges the adapter and pushes bf16 weights into vLLM (model.lora.merge=true); "
                    "no re-quantization",
                )
            )
    if not r.gpus and not t.gpus:
        items.append(
            Note(
                "rollout.gpus=[] / train.gpus=[] (the CPU)",
                f"verl needs GPUs: exported for {layout.nnodes} node(s) x {layout.gpus_per_node} GPU(s) "
                "(--nnodes, --gpus-per-node)",
            )
        )
    elif set(r.gpus) != set(t.gpus) or not r.colocate:
        items.append(
            Note(
                f"split placement (rollout.gpus={list(r.gpus)}, train.gpus={list(t.gpus)})",
                f"verl colocates actor, reference and rollout on all {layout.world} GPU(s) (its hybrid "
                f"engine; vLLM tensor-parallel over {tp})",
            )
        )
    if r.max_staleness:
        items.append(
            Note(
                f"rollout.max_staleness={r.max_staleness} (one-step-off-policy)",
                "not mapped: the verl job is synchronous (trainer.v1.trainer_mode=sync); verl's asynchronous "
                "modes are trainer.v1.trainer_mode and trainer.v1.sampler.max_off_policy_threshold",
            )
        )
    return items


def _actor(cfg: Config, inp: Inputs, layout: Layout) -> list[Item]:
    from lite_verl.model.load import template_text  # torch: only when a verl job is written

    t, a = cfg.train, cfg.algorithm
    micro = micro_batch(cfg, layout)
    items: list[Item] = [
        Override(MODEL + "path", inp.model),
        Override(MODEL + "trust_remote_code", cfg.model.trust_remote_code),
        *(
            [Override(MODEL + "custom_chat_template", template_text(cfg.data.chat_template))]
            if cfg.data.chat_template
            else []
        ),  # fmt: skip
        Override(MODEL + "enable_gradient_checkpointing", t.checkpointing),
        Override(MODEL + "use_liger", t.use_liger),
        Override(ACTOR + "strategy", "fsdp2"),
        *_optimizer(ACTOR + "optim.", t.lr, t.weight_decay, t.grad_clip),
        Override(ACTOR + "ppo_mini_batch_size", a.ppo_mini_batch_size or cfg.trainer.batch_size),
        Override(ACTOR + "ppo_micro_batch_size_per_gpu", micro),
        Override(ACTOR + "ppo_epochs", a.ppo_epochs),
        Override(ACTOR + "clip_ratio_low", a.clip_ratio_low),
        Override(ACTOR + "clip_ratio_high", a.clip_ratio_high),
        Override(ACTOR + "clip_ratio_c", a.clip_ratio_c),
        Override(ACTOR + "loss_agg_mode", a.loss_agg_mode),
        # seq-mean-token-sum-norm's T: lite-verl's is the response length limit; verl's default would be each
        # micro-batch's longest response, which changes with how a batch is split
        *(
            [Override(ACTOR + "loss_scale_factor", cfg.rollout.max_new_tokens)]
            if a.loss_agg_mode == "seq-mean-token-sum-norm"
            else []
        ),  # fmt: skip
        Override(ACTOR + "entropy_coeff", a.entropy_coeff),
        Override(ACTOR + "use_kl_loss", a.use_kl_loss),
        Override(ACTOR + "kl_loss_coef", a.kl_loss_coef),
        Override(ACTOR + "kl_loss_type", a.kl_loss_type),
        Override(REF + "log_prob_micro_batch_size_per_gpu", micro),
        Override(ROLLOUT + "log_prob_micro_batch_size_per_gpu", micro),
        *_backend(cfg, MODEL, (ACTOR + "fsdp_config.", REF + "fsdp_config.")),
    ]
    if a.mask_truncated_completions:
        items.append(Note("algorithm.mask_truncated_completions=true",
                          "verl's actor has no such mask: truncated responses stay in the loss"))  # fmt: skip
    if t.pack_micro_batches:  # verl's dynamic batch size: micro-batches up to this many tokens per GPU
        budget = micro * cfg.full_length
        items += [
            Override(ACTOR + "use_dynamic_bsz", True),
            Override(ACTOR + "ppo_max_token_len_per_gpu", budget),
        ]
        items += [
            Override(role + key, value)
            for role in (REF, ROLLOUT)
            for key, value in (("log_prob_use_dynamic_bsz", True), ("log_prob_max_token_len_per_gpu", budget))
        ]
    if t.grad_clip <= 0:
        items.append(Note(f"train.grad_clip={t.grad_clip} (no clipping)", "verl always clips: clip_grad=1e9"))
    if micro != t.micro_batch_size:
        items.append(
            Note(
                f"train.micro_batch_size={t.micro_batch_size}",
                f"ppo_micro_batch_size_per_gpu={micro}: it must divide each GPU's share of a mini-batch "
                "(a memory knob; the maths is the same)",
            )
        )
    return items


def _optimizer(prefix: str, lr: float, weight_decay: float, grad_clip: float) -> list[Item]:
    """AdamW with a constant lr, as lite-verl's (verl's default weight decay is 0.01: set it)."""
    return [
        Override(prefix + "lr", lr),
        Override(prefix + "weight_decay", weight_decay),
        Override(prefix + "clip_grad", grad_clip if grad_clip > 0 else 1e9),  # verl always clips
    ]


def _backend(cfg: Config, model: str, fsdp_configs: Sequence[str]) -> list[Item]:
    """train.backend: LoRA keys for lora/qlora, CPU offload for full fine-tuning (fsdp, deepspeed)."""
    t = cfg.train
    if t.full_finetune:
        # full fine-tuning: CPU offload as the config says (train.offload_*; on by design where unset)
        offload = {
            "param_offload": getattr(t, "offload_params", True),
            "optimizer_offload": getattr(t, "offload_optimizer", True),
        }
        items: list[Item] = [Override(p + k, v) for p in fsdp_configs for k, v in offload.items()]
        if t.backend == "deepspeed":
            items.append(
                Note(
                    "train.backend=deepspeed",
                    "verl has no DeepSpeed trainer: FSDP2 with the same CPU offload",
                )
            )
        return items
    items = [
        Override(model + "lora_rank", t.lora_rank),
        Override(model + "lora_alpha", t.lora_alpha),
        # verl takes peft's all-linear as a string
        Override(
            model + "target_modules",
            ALL_LINEAR if t.all_linear else tuple(t.target_modules),
        ),
    ]
    if model == MODEL:
        items.append(Override(model + "lora.merge", cfg.sync.mode == "merged"))
    if t.backend == "qlora" and model == MODEL:
        items.append(
            Note(
                "train.backend=qlora (NF4 4-bit base)",
                "verl trains LoRA on a bf16 base (no 4-bit base): about 4x the base weights' memory per GPU",
            )
        )
    if t.lora_dropout and model == MODEL:
        items.append(Note(f"train.lora_dropout={t.lora_dropout}", "verl's FSDP LoRA has no dropout key: 0"))
    return items


def _precision(cfg: Config) -> list[Item]:
    """model.dtype: vLLM's dtype, and FSDP's compute dtype where it is not verl's default bf16."""
    dtype, gae = cfg.model.dtype, cfg.algorithm.adv_estimator == "gae"
    items: list[Item] = [Override(ROLLOUT + "dtype", dtype)]
    param = MIXED_PRECISION[dtype]
    if param != "bf16":
        fsdp = [ACTOR + "fsdp_config.", REF + "fsdp_config."] + (["critic.fsdp."] if gae else [])
        mp = {"param_dtype": param, "reduce_dtype": "fp32", "buffer_dtype": "fp32"}
        items += [Override(f"+{p}mixed_precision", mp) for p in fsdp]
    if cfg.model.fp32_lm_head and dtype != "float32":
        items.append(
            Note(
                "model.fp32_lm_head=true",
                f"no verl key: verl computes the LM head in {dtype} (trainer and vLLM), so expect a slightly "
                "larger rollout/trainer log-prob gap (algorithm.rollout_correction covers it)",
            )
        )
    return items


def _algorithm(cfg: Config) -> list[Item]:
    a = cfg.algorithm
    dr = a.adv_estimator == "dr_grpo"
    mode = cfg.with_auto_resolved().algorithm.rollout_correction
    items: list[Item] = [
        Override("algorithm.adv_estimator", "grpo" if dr else a.adv_estimator),
        Override("algorithm.norm_adv_by_std_in_grpo", a.norm_adv_by_std_in_grpo and not dr),
        Override("algorithm.gamma", a.gamma),
        Override("algorithm.lam", a.lam),
        Override("algorithm.use_kl_in_reward", a.use_kl_in_reward),
        Override("algorithm.kl_penalty", a.kl_penalty),
        Override("algorithm.kl_ctrl.type", a.kl_ctrl_type),
        Override("algorithm.kl_ctrl.kl_coef", a.kl_coef),
        Override("algorithm.kl_ctrl.target_kl", a.kl_target),
        Override("algorithm.kl_ctrl.horizon", a.kl_horizon),
        Override("algorithm.rollout_correction.rollout_is", None if mode == "none" else mode),
        Override("algorithm.rollout_correction.rollout_is_threshold", a.rollout_is_threshold),
    ]
    if dr:
        items.append(
            Note(
                "algorithm.adv_estimator=dr_grpo",
                "verl has no dr_grpo name: grpo with norm_adv_by_std_in_grpo=false (the same advantage)",
            )
        )
    if a.rollout_correction == "auto":
        items.append(
            Note(
                "algorithm.rollout_correction=auto",
                f"resolved as lite-verl does for this config: rollout_is={mode if mode != 'none' else 'null'}",
            )
        )
    return items


def _critic(cfg: Config, inp: Inputs, layout: Layout) -> list[Item]:
    if cfg.algorithm.adv_estimator != "gae":
        return []
    c, t = cfg.critic, cfg.train
    micro = micro_batch(cfg, layout)
    packed = (
        [Override("critic.ppo_max_token_len_per_gpu", micro * cfg.full_length)]
        if t.pack_micro_batches
        else []
    )
    return [
        Override("critic.enable", True),
        Override("critic.strategy", "fsdp2"),
        *_optimizer("critic.optim.", c.lr, 0.0, t.grad_clip),
        Override("critic.cliprange_value", c.cliprange_value),
        Override("critic.ppo_micro_batch_size_per_gpu", micro),
        *packed,
        Override("critic.model.path", inp.model),
        Override("critic.model.trust_remote_code", cfg.model.trust_remote_code),
        Override("critic.model.enable_gradient_checkpointing", t.checkpointing),
        *_backend(cfg, "critic.model.", ("critic.fsdp.",)),
        Override("trainer.critic_warmup", c.warmup_steps),
        Note(
            "the critic (gae): a 2nd adapter + value head on the actor's base",
            "verl's critic is a model of its own (base + its own LoRA + value head): one more copy of the "
            "base weights",
        ),
    ]


def _reward(cfg: Config, inp: Inputs, layout: Layout) -> list[Item]:
    w = cfg.reward
    items: list[Item] = []
    if inp.reward_file is not None:
        items += [
            Override("reward.custom_reward_function.path", inp.reward_file),
            Override("reward.custom_reward_function.name", inp.reward_name),
        ]
    if w.functions:
        items.append(
            Note(
                "reward.functions (" + ", ".join(f.fn for f in w.functions) + ")",
                "reward_fn.py calls lite-verl's weighted sum of them (pip install lite-verl and each function's "
                "module on every Ray node); verl gives a function no prompt and no other columns than extra_info, "
                "and logs only the total",
            )
        )
    elif inp.reward_file is not None and not w.function:
        items.append(
            Note(
                "rule rewards by data_source (lite_verl/echo, lite_verl/arithmetic)",
                "verl's own rules do not know these data sources: reward_fn.py calls lite-verl's rules "
                "(pip install lite-verl on every Ray node)",
            )
        )
    if w.function:
        items.append(
            Note(
                f"reward.function={w.function}",
                "copied into reward_fn.py; only that file travels: what it imports must be installed on "
                "every Ray node",
            )
        )
        items.append(
            Note(
                "reward.isolate / timeout_s / on_error / default_score",
                "no verl keys: verl calls the function in its reward workers, with no per-sample time limit "
                "or default score",
            )
        )
    if w.model:
        items += _reward_model(cfg, layout)
    if w.url:
        items.append(
            Note(
                f"reward.url={w.url}",
                "no verl key: verl's rule rewards by data_source are on instead; to keep the endpoint, write "
                "a reward.custom_reward_function that POSTs to it",
            )
        )
    return items


def _reward_model(cfg: Config, layout: Layout) -> list[Item]:
    w = cfg.reward
    rm = "reward.reward_model."
    items: list[Item] = [
        Override(rm + "enable", True),
        Override(rm + "model_path", w.model),
        Override(rm + "rollout.name", "vllm"),
        Override(rm + "rollout.tensor_model_parallel_size", 1),
        Note(
            f"reward.keep_alive_s={w.keep_alive_s}, reward.device={w.device}",
            "verl serves the reward model with vLLM for the whole run",
        ),
    ]
    own_gpu = w.device.startswith("cuda:") and int(w.device[5:]) not in set(cfg.rollout.gpus) | set(
        cfg.train.gpus
    )
    if own_gpu:
        items += [
            Override(rm + "enable_resource_pool", True),
            Override(rm + "n_gpus_per_node", 1),
            Override(rm + "nnodes", 1),
        ]
    return items


def _trainer(cfg: Config, inp: Inputs, layout: Layout) -> list[Item]:
    tr = cfg.trainer
    steps_per_epoch = max(1, inp.n_train // tr.batch_size)
    val = inp.has_val
    items: list[Item] = [
        Override("trainer.total_training_steps", tr.total_steps),
        Override("trainer.total_epochs", math.ceil(tr.total_steps / steps_per_epoch)),
        Override("trainer.nnodes", layout.nnodes),
        Override("trainer.n_gpus_per_node", layout.gpus_per_node),
        Override("trainer.save_freq", tr.save_every or tr.total_steps),
        Override("trainer.max_actor_ckpt_to_keep", tr.keep_checkpoints),
        Override("trainer.test_freq", (tr.val_every or tr.total_steps) if val else -1),
        Override("trainer.val_before_train", val),
        Override("trainer.logger", tuple(n for n in logger_names(tr) if n in VERL_LOGGERS)),
        Override("trainer.project_name", "lite-verl"),
        Override("trainer.experiment_name", inp.name),
        Override("trainer.default_local_dir", InExport("checkpoints")),
        Note("cost.* (the bill)", "no verl equivalent: verl logs time and throughput per step, not a price"),
        Note("trainer.plan_check, trainer.progress", "lite-verl only (memory plan, progress bar)"),
        Note(
            "trainer.samples_every, trainer.samples_per_step",
            "lite-verl's RUN/samples.jsonl; verl dumps every rollout with trainer.rollout_data_dir",
        ),
    ]
    if cfg.algorithm.adv_estimator == "gae":
        items.insert(6, Override("trainer.max_critic_ckpt_to_keep", tr.keep_checkpoints))
    return items
