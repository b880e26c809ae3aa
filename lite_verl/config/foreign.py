"""Keys users bring from verl, TRL's GRPOConfig and Unsloth, and what lite-verl calls them.

An unknown key is looked up here by its dotted suffixes, longest first (verl's
`actor_rollout_ref.actor.optim.lr` matches `optim.lr`), before spelling suggestions: spelling alone sends
`data.max_response_length` to `data.max_prompt_length`, and verl's micro-batch key to the mini-batch one,
which changes the maths.
"""

from __future__ import annotations

MICRO = "train.micro_batch_size (rows per forward; the gradient is the same for any value)"

# suffix -> the lite-verl key or setting, with a note where the meaning differs
VERL: dict[str, str] = {  # Hydra keys of verl's ppo_trainer.yaml
    "optim.lr": "train.lr",
    "ppo_micro_batch_size_per_gpu": MICRO,
    "ppo_micro_batch_size": MICRO,
    "log_prob_micro_batch_size_per_gpu": MICRO,
    "max_response_length": "rollout.max_new_tokens",
    "response_length": "rollout.max_new_tokens",
    "train_batch_size": "trainer.batch_size (prompts per step)",
    "total_training_steps": "trainer.total_steps",
    "total_epochs": "trainer.total_epochs",
    "test_freq": "trainer.val_every",
    "save_freq": "trainer.save_every",
    "n_gpus_per_node": "train.gpus and rollout.gpus (the GPU ids each role uses)",
    "nnodes": "one machine here; `lite-verl export-verl RUN --nnodes N` writes a verl launch for several",
    "default_local_dir": "the --run-dir option of lite-verl train",
    "defaults": "nothing: Hydra's defaults list is not read; give one plain YAML file (--config) holding the keys",
    "project_name": "trainer.project_name",
    "kv_cache_dtype": "rollout.kv_cache_dtype",  # rollout.engine_kwargs.vllm.kv_cache_dtype
    "experiment_name": "trainer.experiment_name",
    "logger": "trainer.loggers",
    "rollout.name": "rollout.engine",
    "custom_reward_function.path": "reward.function (FILE.py:FUNCTION)",
    "custom_reward_function.name": "reward.function (FILE.py:FUNCTION)",
    "reward_model.enable": "reward.model (a reward model's path; empty = none)",
    "clip_ratio": "algorithm.clip_ratio_low and algorithm.clip_ratio_high",
    "tensor_model_parallel_size": "rollout.gpus (vLLM's tensor parallelism spans the GPUs listed)",
    "enable_gradient_checkpointing": "train.gradient_checkpointing",
    "use_liger": "train.use_liger",
}
TRL: dict[str, str] = {  # GRPOConfig / TrainingArguments
    "learning_rate": "train.lr",
    "num_generations": "rollout.n",
    "top_k": "rollout.top_k",
    "min_p": "rollout.min_p",
    "max_completion_length": "rollout.max_new_tokens",
    "per_device_train_batch_size": "trainer.batch_size (prompts per step; each gets rollout.n responses)",
    "gradient_accumulation_steps": MICRO,
    "max_steps": "trainer.total_steps",
    "num_train_epochs": "trainer.total_epochs",
    "beta": "algorithm.kl_loss_coef",
    "epsilon": "algorithm.clip_ratio_low",
    "epsilon_high": "algorithm.clip_ratio_high",
    "loss_type": "algorithm.loss_agg_mode (and algorithm.adv_estimator=dr_grpo for TRL's dr_grpo)",
    "scale_rewards": "algorithm.norm_adv_by_std_in_grpo",
    "num_iterations": "algorithm.ppo_epochs",
    "use_vllm": "rollout.engine=vllm",
    "use_liger_kernel": "train.use_liger",
    "vllm_gpu_memory_utilization": "rollout.gpu_memory_utilization",
    "output_dir": "the --run-dir option of lite-verl train",
    "save_steps": "trainer.save_every",
    "eval_steps": "trainer.val_every",
    "logging_steps": "nothing: every step is logged (RUN/metrics.jsonl)",
    "warmup_ratio": "train.warmup_steps (in steps)",
    "lr_scheduler_type": "train.lr_scheduler",
    "max_grad_norm": "train.grad_clip",
    "reward_weights": "reward.functions (a weight per function)",
    "report_to": "trainer.loggers",
    "run_name": "trainer.experiment_name",
    "bf16": "model.dtype=bfloat16",
    "mask_truncated_completions": "algorithm.mask_truncated_completions",
}
UNSLOTH: dict[str, str] = {  # FastLanguageModel.from_pretrained / get_peft_model
    "model_name": "model.path",
    "max_seq_length": "data.max_prompt_length + rollout.max_new_tokens",
    "load_in_4bit": "train.backend=qlora",
    "fast_inference": "rollout.engine=vllm",
    "max_lora_rank": "train.lora_rank",
    "r": "train.lora_rank",
    "use_gradient_checkpointing": "train.gradient_checkpointing",
    "offload_embedding": "train.embeddings_on_host",
}
FOREIGN_KEYS: dict[str, tuple[str, str]] = {
    k: (origin, v)
    for origin, table in (("Unsloth", UNSLOTH), ("TRL", TRL), ("verl", VERL))
    for k, v in table.items()
}


def foreign_hint(key: str, valid: frozenset[str] | set[str]) -> str | None:
    """What lite-verl calls `key` (a verl, TRL or Unsloth key, or a lite-verl key under a foreign prefix
    such as verl's actor_rollout_ref.rollout.n), or None."""
    parts = key.split(".")
    for i in range(len(parts)):
        suffix = ".".join(parts[i:])
        if suffix in FOREIGN_KEYS:
            origin, ours = FOREIGN_KEYS[suffix]
            return f"{origin}'s '{suffix}' is lite-verl's {ours}"
        if i > 0 and suffix in valid:
            return f"did you mean '{suffix}'?"
    return None
