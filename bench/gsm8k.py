"""Benchmark: learning on real data: SmolLM2-135M-Instruct on GSM8K, lite-verl and TRL, same steps.

    python -m bench.gsm8k --gguf SmolLM2-135M-Instruct.Q4_1.gguf --data DIR [--steps 50] [--lr 2e-5]
                          [--only lite-verl|trl]

DIR holds GSM8K's train.jsonl and test.jsonl (../shared/data/gsm8k). Both trainers: the same training
prompts (verl's GSM8K prompt, `lite-verl prepare-gsm8k`), 32 prompts x 8 samples per step, <= 256 new
tokens, temperature 1, LoRA r=16 alpha 32 on all linear layers, lr 2e-5 constant, no KL, bf16, vLLM
colocated on GPU 0, micro-batches of 32 sequences, merged weights in vLLM (TRL merges too), the same reward (bench/gsm8k_reward.py: 1 for the right `#### n`, 0.1 for a wrong
one in that format: the model rarely uses the format at first, so the strict rule alone gives GRPO no
signal). Evaluation: greedy, <= 256 new tokens, the whole test set (1,319), accuracy by the strict
`#### n` rule, before and after, each trained policy merged into a plain HF model and served by vLLM.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from bench.results import CURVES, REPORT, append, read_curve, render, write_curve
from bench.train_run import (
    MEMORY_UNITS,
    PeakGpuMemory,
    memory_figures,
    reward_curve,
    single_process_group_env,
    train_run,
)

PROMPTS, N, NEW_TOKENS, LR, RANK = 32, 8, 256, 2e-5, 16
MICRO = 32  # sequences per forward/backward, both trainers
REWARD = Path(__file__).resolve().parent / "gsm8k_reward.py"


def prepare(gguf: Path, data: Path, out: Path) -> tuple[Path, Path, Path]:
    from lite_verl.data.gsm8k import convert_gsm8k
    from lite_verl.model.gguf import import_gguf

    model = Path("/tmp/models") / gguf.stem
    if not (model / "config.json").is_file():
        import_gguf(gguf, model, "bfloat16")
    out.mkdir(parents=True, exist_ok=True)
    train, test = out / "train.jsonl", out / "test.jsonl"
    if not train.is_file():
        convert_gsm8k(data / "train.jsonl", train, "train")
        convert_gsm8k(data / "test.jsonl", test, "test")
    return model, train, test


def evaluate(model: Path, test: Path) -> float:
    """Greedy accuracy on every test row by the strict rule, vLLM bf16 (run in a fresh process)."""
    proc = subprocess.run(
        [sys.executable, "-m", "bench.gsm8k", "--eval", str(model), "--test", str(test)],
        capture_output=True,
        text=True,
    )
    lines = [x for x in proc.stdout.splitlines() if x.startswith("ACCURACY ")]
    if proc.returncode != 0 or not lines:
        print(proc.stderr[-3000:], file=sys.stderr)
        raise SystemExit(f"evaluation of {model} failed")
    return float(lines[-1].split()[1])


def _eval_main(model: Path, test: Path) -> None:
    import os

    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    from transformers import AutoTokenizer
    from vllm import LLM, SamplingParams

    from lite_verl.reward.rules import gsm8k_score

    rows = [json.loads(x) for x in test.read_text().splitlines() if x.strip()]
    tok = AutoTokenizer.from_pretrained(model)
    prompts = [tok.apply_chat_template(r["prompt"], add_generation_prompt=True, tokenize=False) for r in rows]
    llm = LLM(model=str(model), dtype="bfloat16", gpu_memory_utilization=0.3, enforce_eager=True, seed=0)
    outs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS), use_tqdm=False)
    right = [
        gsm8k_score(o.outputs[0].text, r["reward_model"]["ground_truth"]) == 1.0 for o, r in zip(outs, rows)
    ]
    print(f"ACCURACY {sum(right) / len(right)}", flush=True)


def lite_verl(model: Path, train: Path, test: Path, steps: int, lr: float, out: Path) -> tuple[float, dict]:
    sets = [
        f"model.path={model}", f"data.train_files=[{train}]", f"data.val_files=[{test}]", "data.val_size=0",
        "data.max_prompt_length=256", f"rollout.max_new_tokens={NEW_TOKENS}", "rollout.quantization=none",
        "rollout.gpu_memory_utilization=0.3", f"trainer.batch_size={PROMPTS}", f"rollout.n={N}", f"train.lr={lr}",
        f"train.lora_rank={RANK}", "train.lora_alpha=32", "algorithm.use_kl_loss=false", f"trainer.total_steps={steps}",
        f"reward.function={REWARD}:compute_score", "data.filter_overlong_prompts=true",
        f"train.micro_batch_size={MICRO}", "sync.mode=merged",
    ]  # fmt: skip
    run = out / "lite_verl_run"
    with PeakGpuMemory() as mem:
        rows, _, summary, _ = train_run("4090x1", run, sets)
    merged = out / "lite_verl_merged"
    subprocess.run(
        [sys.executable, "-m", "lite_verl", "export", str(run), str(merged), "--format", "hf"], check=True
    )
    return evaluate(merged, test), {
        "rows": rows,
        "wall_s": float(summary["wall_s"]),
        "memory": memory_figures(run, mem),
    }


def trl(model: Path, train: Path, steps: int, lr: float, out: Path) -> tuple[Path, dict]:
    """TRL's GRPOTrainer, vLLM colocate mode; -> (merged model dir, per-step logs)."""
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from bench.gsm8k_reward import compute_score

    rows = [json.loads(x) for x in train.read_text().splitlines() if x.strip()][: PROMPTS * steps]
    data = Dataset.from_list(
        [{"prompt": r["prompt"], "ground_truth": r["reward_model"]["ground_truth"]} for r in rows]
    )

    def reward(completions, ground_truth, **_):
        texts = [c[0]["content"] if isinstance(c, list) else c for c in completions]
        return [compute_score("openai/gsm8k", t, g) for t, g in zip(texts, ground_truth)]

    logs: list[dict] = []

    class Keep(TrainerCallback):
        def on_log(self, args, state, control, **kw):
            if kw.get("logs"):
                logs.append({**kw["logs"], "_wall_s": time.perf_counter() - t0})

    micro = MICRO
    args = GRPOConfig(
        output_dir=str(out / "trl"), num_generations=N, max_completion_length=NEW_TOKENS, temperature=1.0,
        learning_rate=lr, lr_scheduler_type="constant", warmup_steps=0, max_steps=steps, beta=0.0, logging_steps=1,
        report_to=[], save_strategy="no", seed=0, disable_dropout=True, per_device_train_batch_size=micro,
        gradient_accumulation_steps=PROMPTS * N // micro, steps_per_generation=PROMPTS * N // micro, bf16=True,
        use_vllm=True, vllm_mode="colocate", vllm_gpu_memory_utilization=0.3,
    )  # fmt: skip
    single_process_group_env()
    trainer = GRPOTrainer(
        model=AutoModelForCausalLM.from_pretrained(model, dtype=torch.bfloat16), reward_funcs=reward, args=args,
        train_dataset=data, processing_class=AutoTokenizer.from_pretrained(model), callbacks=[Keep()],
        peft_config=LoraConfig(r=RANK, lora_alpha=32, target_modules="all-linear", task_type="CAUSAL_LM"),
    )  # fmt: skip
    t0 = time.perf_counter()
    trainer.train()
    wall = time.perf_counter() - t0
    merged = out / "trl_merged"
    trainer.model.merge_and_unload().save_pretrained(merged)
    AutoTokenizer.from_pretrained(model).save_pretrained(merged)
    return merged, {"logs": [x for x in logs if "reward" in x], "wall_s": wall}


def curve_tag(lr: float) -> str:
    """The curve file's tag, by learning rate (runs at other rates keep their files): h200_lr1e-4."""
    mantissa, exp = f"{lr:.0e}".split("e")
    return f"h200_lr{mantissa}e{int(exp)}"


def earlier_curves(lr: float) -> dict[str, list]:
    """lite-verl's curve from an earlier `--only lite-verl` call at this lr, for a `--only trl` call to add
    TRL's to."""
    path = CURVES / f"gsm8k_curve_{curve_tag(lr)}.jsonl"
    return {w: c for w, c in read_curve(path)[1].items() if w != "TRL"} if path.is_file() else {}


def report(who: str, after: float, wall: float, rewards: list[float], record, out: Path) -> None:
    """One trainer's rows (accuracy after, wall time, mean reward of its first and last 10% of steps)."""
    k = max(len(rewards) // 10, 1)
    for metric, value, unit in [
        ("accuracy_after", after, "fraction"), ("wall_s", wall, "s"),
        ("reward_first_10pct", sum(rewards[:k]) / k, "reward"), ("reward_last_10pct", sum(rewards[-k:]) / k, "reward"),
    ]:  # fmt: skip
        record(f"{who}_{metric}", value, unit)
    (out / f"{who}_rewards.json").write_text(json.dumps(rewards))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gguf", type=Path)
    ap.add_argument("--data", type=Path, default=Path("../shared/data/gsm8k"))
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--lr", type=float, default=LR, help="both trainers' (constant) learning rate")
    ap.add_argument(
        "--only", choices=["lite-verl", "trl"], help="one trainer (a GPU call too short for both)"
    )
    ap.add_argument("--out", type=Path, default=Path("/tmp/lite-verl-gsm8k"))
    ap.add_argument("--eval", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--test", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.eval:
        return _eval_main(args.eval, args.test)
    model, train, test = prepare(args.gguf, args.data, args.out)
    cmd = f"python -m bench.gsm8k --gguf {args.gguf.name} --steps {args.steps} --lr {args.lr:g}"
    settings = (f"H200, vLLM colocated, {PROMPTS} prompts x {N}, <= {NEW_TOKENS} new tokens, LoRA r={RANK}, lr {args.lr:g}, "
                f"no KL, {args.steps} steps, reward bench/gsm8k_reward.py; accuracy: greedy, all 1,319 test problems")  # fmt: skip
    curves = earlier_curves(args.lr) if args.only == "trl" else {}  # lite-verl's, from an earlier call
    about = f"{model.name} on GSM8K, reward per step (`{cmd}`)"

    def record(metric: str, value: float, unit: str) -> None:
        append("gsm8k", model.name, settings, metric, value, unit, cmd)

    if args.only != "trl":
        before = evaluate(model, test)
        record("accuracy_before", before, "fraction")
        print(f"before: {before:.4f}", flush=True)
        after, ours = lite_verl(model, train, test, args.steps, args.lr, args.out)
        rows = ours["rows"]
        report("lite_verl", after, ours["wall_s"], [r["reward/mean"] for r in rows], record, args.out)
        print(f"lite-verl after {args.steps} steps: {after:.4f} ({ours['wall_s']:.0f} s)", flush=True)
        curves["lite-verl"] = reward_curve(rows)
        for metric, value in ours["memory"].items():
            record(f"lite_verl_{metric}", value, MEMORY_UNITS[metric])
        # now, and again with TRL's: a cut run keeps lite-verl's
        write_curve("gsm8k", curve_tag(args.lr), about, curves)
    if args.only != "lite-verl":
        merged, theirs = trl(model, train, args.steps, args.lr, args.out)
        after_trl = evaluate(merged, test)
        logs = theirs["logs"]
        report("trl", after_trl, theirs["wall_s"], [x["reward"] for x in logs], record, args.out)
        print(f"TRL after {args.steps} steps: {after_trl:.4f} ({theirs['wall_s']:.0f} s)", flush=True)
        curves["TRL"] = [(i + 1, x["_wall_s"], x["reward"]) for i, x in enumerate(logs)]
        write_curve("gsm8k", curve_tag(args.lr), about, curves)
    REPORT.write_text(render())


if __name__ == "__main__":
    main()
