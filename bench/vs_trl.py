"""Benchmark: GRPO end to end, lite-verl vs TRL's GRPOTrainer, same model, prompts and settings.

    python bench/vs_trl.py [--steps 20] [--model tiny:qwen2]        # CPU: both generate with HF

Settings shared by both: the built-in echo task's prompts (same chat template), 16 prompts x 8 samples
per step, <= 16 new tokens, temperature 1, LoRA r=16 alpha 32 on all linear layers, lr 3e-3, one
optimizer step per batch, no KL term (TRL beta=0, lite-verl use_kl_loss=false), fp32 on the CPU.
Throughput = (generated tokens + tokens through the update's forward/backward) / wall seconds of the
training loop (model loading excluded). Also: the echo reward of the last 10% of steps.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results import REPORT, append, render  # noqa: E402
from train_run import train_run  # noqa: E402

PROMPTS, N, NEW_TOKENS, LR, RANK = 16, 8, 16, 3e-3, 16


def lite_verl(model: str, steps: int) -> dict[str, float]:
    sets = [f"model.path={model}", f"trainer.total_steps={steps}", f"trainer.batch_size={PROMPTS}", f"rollout.n={N}",
            f"rollout.max_new_tokens={NEW_TOKENS}", f"train.lr={LR}", f"train.lora_rank={RANK}", "train.lora_alpha=32",
            "algorithm.use_kl_loss=false", "data.val_size=0", "trainer.progress=false", "data.task=echo"]  # fmt: skip
    train, _, summary, _ = train_run("laptop", Path("/tmp/lite-verl-vs-trl"), sets)
    gen = sum(r["perf/gen_tokens_per_s"] * r["timing/rollout_s"] for r in train)
    trained = sum(r["perf/tokens_per_s"] * r["timing/step_s"] for r in train)
    wall = sum(r["timing/step_s"] for r in train)
    k = max(len(train) // 10, 1)
    return {"tokens_per_s": (gen + trained) / wall, "step_s": statistics.median(r["timing/step_s"] for r in train),
            "reward_last_10pct": statistics.mean(r["reward/mean"] for r in train[-k:]), "wall_s": wall}  # fmt: skip


def trl(model: str, steps: int) -> dict[str, float]:
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from lite_verl.config import ModelConfig
    from lite_verl.data.tasks import task_rows
    from lite_verl.model import resolve_model_path
    from lite_verl.rewards import echo_score

    path = resolve_model_path(ModelConfig(path=model))
    rows = task_rows("echo", PROMPTS * steps, 0, "train")
    data = Dataset.from_list(
        [{"prompt": [dict(m) for m in r.messages], "ground_truth": r.ground_truth} for r in rows]
    )

    def reward(completions, ground_truth, **_):
        return [
            echo_score(c[0]["content"] if isinstance(c, list) else c, g)
            for c, g in zip(completions, ground_truth)
        ]

    logs: list[dict] = []

    class Keep(TrainerCallback):
        def on_log(self, args, state, control, logs_=None, **kw):
            if kw.get("logs"):
                logs.append(dict(kw["logs"]))

    args = GRPOConfig(
        output_dir="/tmp/trl-grpo", per_device_train_batch_size=PROMPTS * N, num_generations=N,
        gradient_accumulation_steps=1, steps_per_generation=1, max_completion_length=NEW_TOKENS, temperature=1.0,
        learning_rate=LR, lr_scheduler_type="constant", warmup_steps=0, max_steps=steps, beta=0.0, logging_steps=1,
        report_to=[], use_cpu=True, bf16=False, save_strategy="no", seed=0, disable_dropout=True,
    )  # fmt: skip
    tok = AutoTokenizer.from_pretrained(path)
    trainer = GRPOTrainer(
        model=AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32), reward_funcs=reward, args=args,
        train_dataset=data, processing_class=tok, callbacks=[Keep()],
        peft_config=LoraConfig(r=RANK, lora_alpha=32, target_modules="all-linear", task_type="CAUSAL_LM"),
    )  # fmt: skip
    t0 = time.perf_counter()
    trainer.train()
    wall = time.perf_counter() - t0
    steps_logged = [x for x in logs if "completions/mean_length" in x]
    gen = sum(x["completions/mean_length"] * PROMPTS * N for x in steps_logged)
    trained = steps_logged[-1].get("num_tokens", 0.0)  # cumulative prompt + completion tokens
    k = max(len(steps_logged) // 10, 1)
    rewards = [x.get("reward", x.get("rewards/reward/mean", 0.0)) for x in steps_logged]
    return {"tokens_per_s": (gen + trained) / wall, "step_s": wall / max(len(steps_logged), 1),
            "reward_last_10pct": statistics.mean(rewards[-k:]), "wall_s": wall}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--model", default="tiny:qwen2")
    args = ap.parse_args()
    import trl as trl_pkg

    ours, theirs = lite_verl(args.model, args.steps), trl(args.model, args.steps)
    cmd = f"python bench/vs_trl.py --steps {args.steps} --model {args.model}"
    settings = (f"CPU, HF generate in both, echo task, {PROMPTS} prompts x {N}, <= {NEW_TOKENS} new tokens, LoRA r={RANK}, "
                f"lr {LR}, no KL, {args.steps} steps; TRL {trl_pkg.__version__}")  # fmt: skip
    for who, r in (("lite_verl", ours), ("trl", theirs)):
        for metric, value in r.items():
            unit = {"tokens_per_s": "token/s", "step_s": "s", "wall_s": "s"}.get(metric, "reward")
            append("vs_trl", args.model, settings, f"{who}_{metric}", value, unit, cmd)
    append("vs_trl", args.model, settings, "lite_verl_over_trl_tokens_per_s", ours["tokens_per_s"] / theirs["tokens_per_s"],
           "ratio", cmd)  # fmt: skip
    print(
        "lite-verl",
        ours,
        "\nTRL",
        theirs,
        f"\nratio {ours['tokens_per_s'] / theirs['tokens_per_s']:.2f}",
        flush=True,
    )
    REPORT.write_text(render())


if __name__ == "__main__":
    main()
