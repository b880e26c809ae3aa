"""What `lite-verl train --resume RUN --set KEY=VALUE` may change. Every config key is either refused or
accepted below, never both (tests/test_run_ownership.py checks it); a key in no group is refused, so a new
key cannot change on resume until it is classified here. A group may name a whole section (algorithm).

A resumed run must be the same run continued: its checkpoint loads as it was written, its data position
points into the same prompt order, and metrics.jsonl stays one curve of one experiment. Keys that would
break one of these are refused in one line naming the key and both values; the others are accepted and
recorded in RUN/config_history.jsonl (RunDir.append_history), config.yaml staying as the run started.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lite_verl.config import Config, all_keys, to_dict
from lite_verl.errors import ConfigError
from lite_verl.run.rundir import load_run_config

# --- refused: each group says why ---------------------------------------------------------------------
# The checkpoint's tensors were made for these: weights or adapter of this base and shape, optimizer state of
# this layout, a critic adapter and value head only with gae. Another value fails to load or loads as
# something else.
CHECKPOINT_KEYS = frozenset({
    "model.path", "model.revision", "train.backend", "train.lora_rank", "train.lora_alpha",
    "train.target_modules", "train.optimizer_state_dtype", "algorithm.adv_estimator",
})  # fmt: skip
# state.json's data position counts prompts of one prompt set in one seeded order: these fix the set
# (files, columns, formatting, filtering, the built-in task), the order and the step's slice of it.
DATA_ORDER_KEYS = frozenset({
    "trainer.seed", "trainer.batch_size", "data.train_files", "data.subset", "data.split",
    "data.prompt_key", "data.answer_key", "data.system_prompt", "data.prompt_template",
    "data.apply_chat_template", "data.chat_template", "data.data_source", "data.skip_bad_rows", "data.task", "data.task_size",
    "data.max_prompt_length", "data.filter_overlong_prompts", "data.shuffle",
})  # fmt: skip
# The validation set: summary.json compares the first validation with the last, which needs one set.
VALIDATION_KEYS = frozenset({"data.val_files", "data.val_split", "data.val_size"})
# What the run optimises (sampling, advantage, loss, its schedule, the critic, the reward's definition): a
# change midway makes metrics.jsonl two experiments under one name. A new run can start from the same config.
OBJECTIVE_KEYS = frozenset({
    "rollout.n", "rollout.temperature", "rollout.top_p", "rollout.top_k", "rollout.min_p", "rollout.max_new_tokens", "rollout.stop", "rollout.max_staleness",
    "train.lr_scheduler", "train.warmup_steps", "train.min_lr_ratio", "train.weight_decay",
    "train.lora_dropout", "algorithm", "critic", "reward.function", "reward.functions", "reward.model",
    "reward.url", "reward.default_score",
})  # fmt: skip
RESUME_FIXED: dict[frozenset[str], str] = {  # the first group that holds a key gives the reason
    CHECKPOINT_KEYS: "the checkpoint's tensors were made for it",
    DATA_ORDER_KEYS: "the checkpoint's data position counts prompts of this prompt set and order",
    VALIDATION_KEYS: "the run's validations must score one set",
    OBJECTIVE_KEYS: "it changes what the run optimises",
}

# --- accepted --------------------------------------------------------------------------------------------
# Where and how it runs (devices, engines, memory knobs, prices: the schema's where=True keys not above, and
# the permission trust_remote_code), so a run can move to another machine. They change speed, memory or
# precision, never the algorithm: model.dtype is the base's precision (peft keeps LoRA adapters in fp32, fsdp
# keeps fp32 masters, so the checkpoint loads either way), refused only under deepspeed (_deepspeed_layout).
PLACEMENT_KEYS = frozenset({
    "model.dtype", "model.fp32_lm_head", "model.trust_remote_code", "rollout.engine", "rollout.gpus",
    "rollout.gpu_memory_utilization", "rollout.kv_cache_gib", "rollout.kv_cache_dtype", "rollout.quantization", "rollout.quantized_path",
    "rollout.awq_group_size", "rollout.enforce_eager", "rollout.colocate", "rollout.sleep_level",
    "train.gpus", "train.cpu_ranks", "train.micro_batch_size", "train.pack_micro_batches", "train.grow_micro_batch", "train.use_liger",
    "train.gradient_checkpointing", "train.offload_params", "train.offload_optimizer", "train.offload_during_rollout", "train.embeddings_on_host", "train.max_memory_gib",
    "reward.device", "reward.keep_alive_s", "sync", "trainer.plan_check", "cost",
})  # fmt: skip
# How long it runs and what it records. A longer run stretches a linear/cosine train.lr_scheduler, which is
# computed from trainer.total_steps at every step.
RUN_LENGTH_KEYS = frozenset({
    "trainer.total_steps", "trainer.total_epochs", "trainer.save_every", "trainer.save_every_minutes", "trainer.keep_checkpoints", "trainer.val_every",
    "trainer.val_before_train", "trainer.tensorboard", "trainer.progress", "trainer.loggers",
    "trainer.project_name", "trainer.experiment_name",
    "trainer.samples_every", "trainer.samples_per_step",
})  # fmt: skip
# The remedies of a run that stopped: a lower step size after a divergence ("lower train.lr"), a reward
# function's failures scored instead of raised, more time or retries for it. The checkpoint stays valid.
REMEDY_KEYS = frozenset({
    "train.lr", "train.grad_clip", "reward.on_error", "reward.isolate", "reward.timeout_s", "reward.retries",
})  # fmt: skip
# Informational: the names the config was built from.
INFO_KEYS = frozenset({"preset", "recipe"})
RESUME_SAFE = PLACEMENT_KEYS | RUN_LENGTH_KEYS | REMEDY_KEYS | INFO_KEYS


Change = tuple[Any, Any]  # (checkpoint's value, new value), as in config.yaml


def covers(group: frozenset[str], key: str) -> bool:
    """`key` is in `group`, itself or through a section named there (algorithm covers algorithm.gamma)."""
    return any(key == g or key.startswith(g + ".") for g in group)


def changed_keys(before: Config, after: Config) -> dict[str, Change]:
    """{dotted key: (before, after)} of the keys whose values differ; a mapping-valued key is one key."""
    a, b = to_dict(before), to_dict(after)
    out = {}
    for key in all_keys():
        old, new = _get(a, key), _get(b, key)
        if old != new:
            out[key] = (old, new)
    return out


def _get(data: dict[str, Any], key: str) -> Any:
    for part in key.split("."):
        data = data[part]
    return data


def resume_config(run_dir: Path, sets: list[str]) -> tuple[Config, dict[str, Change]]:
    """The config a resume runs with (the run's config + --set) and what --set changed in it; ConfigError,
    one line naming the key and both values, for a change the checkpoint cannot take."""
    before = load_run_config(run_dir, [])
    after = load_run_config(run_dir, sets)
    changes = changed_keys(before, after)
    for key, (old, new) in changes.items():
        why = _refusal(key, old, new, before)
        if why:
            raise ConfigError(
                f"--resume {run_dir} --set {key}: the checkpoint has {old!r}, --set gives {new!r}; it cannot "
                f"change on resume ({why}); start a new run instead: lite-verl train --config "
                f"{Path(run_dir) / 'config.yaml'} --set {key}=..."
            )
    return after, changes


def _refusal(key: str, old: Any, new: Any, before: Config) -> str:
    """Why `key` may not go from `old` to `new` on resume, or '' when it may."""
    for group, why in RESUME_FIXED.items():
        if covers(group, key):
            return why
    if before.train.backend == "deepspeed" and _deepspeed_layout(key, old, new, before):
        return "deepspeed's checkpoint is partitioned over its ranks, in its precision"
    if not covers(RESUME_SAFE, key):  # unclassified (a test keeps this from happening): refused to be safe
        return "it is not classified as safe to change in lite_verl/run/resume.py"
    return ""


def _deepspeed_layout(key: str, old: Any, new: Any, before: Config) -> bool:
    """The change alters deepspeed's rank count (len(train.gpus), else train.cpu_ranks) or precision: its
    own checkpoint (ZeRO-3 partitions, optimizer state in model.dtype) loads only into the layout that wrote
    it."""
    if key == "model.dtype":
        return True
    if key == "train.gpus":
        return len(old) != len(new) and bool(old or new)
    return key == "train.cpu_ranks" and not before.train.gpus
