"""Benchmark: where does the vLLM-vs-trainer log-prob gap in bf16 come from? (issue #11, target 0.02)

    python -m bench.gap_sources --model DIR      # e.g. SmolLM2-135M-Instruct (bench/logprob_gap.py imports it)

Fixed (prompt, response) pairs sampled by vLLM from arithmetic prompts are scored by
  vLLM bf16 and vLLM fp32 (two engines, both with the fp32 LM head),
  HF transformers bf16 with SDPA and with eager attention, and HF fp32,
every side computing log-softmax in fp32 from an fp32 head. Mean |delta| per token of each pair of
scorers tells how much of the bf16 gap each implementation's own rounding contributes: with the fp32
runs as the reference, |vLLM bf16 - ref| and |HF bf16 - ref| are the two sides' own errors.
"""

from __future__ import annotations

import argparse
import itertools
from pathlib import Path

from bench.results import REPORT, append, render


def _hf_scores(model_dir: Path, seqs: list[list[int]], plens: list[int], dtype, attn: str) -> list:
    import torch
    import torch.nn.functional as F
    from transformers import AutoModelForCausalLM

    model = (
        AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype, attn_implementation=attn).cuda().eval()
    )
    head = model.get_output_embeddings().weight.float()
    out = []
    with torch.no_grad():
        for s, p in zip(seqs, plens):
            ids = torch.tensor([s], device="cuda")
            hidden = model.model(input_ids=ids).last_hidden_state[0]
            logp = F.log_softmax(F.linear(hidden.float(), head), dim=-1)
            out.append(logp[p - 1 : -1].gather(-1, ids[0, p:, None])[:, 0].cpu())
    del model
    torch.cuda.empty_cache()
    return out


def _vllm_scores(cfg, model_dir: Path, tokenizer, backend, seqs, plens) -> list:
    import torch

    from lite_verl.rollout.vllm_engine import VLLMRolloutEngine

    engine = VLLMRolloutEngine.from_config(cfg, model_dir, tokenizer, backend)
    try:
        return [torch.tensor(v[p - 1 :]) for v, p in zip(engine.score(seqs), plens)]
    finally:
        engine.close()


def main() -> None:
    import dataclasses

    import torch

    from lite_verl.config import load_config
    from lite_verl.loop import prepare
    from lite_verl.rollout.base import SamplingSettings
    from lite_verl.rollout.vllm_engine import fixed_sequences

    ap = argparse.ArgumentParser()
    ap.add_argument("--model", type=Path, required=True)
    args = ap.parse_args()
    cfg = load_config("laptop", None, [
        "model.dtype=bfloat16", "train.gpus=[0]", "rollout.gpus=[0]", "rollout.gpu_memory_utilization=0.3",
        f"model.path={args.model}", "rollout.engine=vllm", "rollout.enforce_eager=true", "data.task=arithmetic",
        "data.task_size=64", "data.val_size=0", "data.max_prompt_length=256", "rollout.max_new_tokens=64",
        "cost.gpu_models=[GPU]", "cost.price_per_hour={GPU: 0.0, cpu: 0.0}",
    ])  # fmt: skip
    session = prepare(cfg)
    fixed = session.engine.generate(
        session.train_set.token_ids[:8], SamplingSettings(n=2, max_new_tokens=64), 7
    )
    seqs, plens = fixed_sequences(fixed)
    scores = {"vllm_bf16": [torch.tensor(v[p - 1 :]) for v, p in zip(session.engine.score(seqs), plens)]}
    session.engine.close()
    fp32 = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, dtype="float32"))
    try:
        scores["vllm_fp32"] = _vllm_scores(fp32, args.model, session.tokenizer, session.backend, seqs, plens)
    except Exception as e:  # noqa: BLE001 - an fp32 engine is a reference only; say why it is missing
        print(f"vLLM fp32 failed: {type(e).__name__}: {e}", flush=True)
    scores["hf_bf16_sdpa"] = _hf_scores(args.model, seqs, plens, torch.bfloat16, "sdpa")
    scores["hf_bf16_eager"] = _hf_scores(args.model, seqs, plens, torch.bfloat16, "eager")
    scores["hf_fp32"] = _hf_scores(args.model, seqs, plens, torch.float32, "sdpa")
    tokens = sum(len(s) for s in scores["hf_fp32"])
    cmd = f"python -m bench.gap_sources --model {args.model.name}"
    settings = f"{len(seqs)} fixed responses ({tokens} tokens) sampled by vLLM bf16, fp32 LM head everywhere, enforce_eager"
    for a, b in itertools.combinations(scores, 2):
        gap = torch.cat([(x.float() - y.float()).abs() for x, y in zip(scores[a], scores[b])])
        print(f"{a:>14} vs {b:<14} mean {gap.mean():.4f}  p99 {gap.quantile(0.99):.3f}  max {gap.max():.3f}")
        append(
            "gap_sources", args.model.name, settings, f"{a}_vs_{b}_mean", float(gap.mean()), "nats/token", cmd
        )
    REPORT.write_text(render())


if __name__ == "__main__":
    main()
