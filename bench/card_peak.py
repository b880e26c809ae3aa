"""Benchmark (#29 goal 3): the device-wide memory peak of the 4090x1 preset's GRPO on one card, loading
included, and its step time, per memory lever.

    python -m bench.card_peak [--size 7b] [--steps 4] [--variants preset,kv_auto,offload] [--set KEY=VALUE ...]

Each variant is one `lite-verl train --preset 4090x1` of a random Qwen2.5-{size}-shaped model (bench/gpu_models.py)
with QLoRA on the 4-bit base and the AWQ rollout (calibrated once by AutoAWQ, then cached), 16 prompts x 8
responses x 256 new tokens (a random model almost never ends early), while nvidia-smi samples the card's used
memory every 100 ms (every process on it). Variants change where and how only:
  preset     vLLM's share as the preset gives it on a 24 GB card (gpu_memory_utilization 0.35 of 24 GiB, scaled
             to this card)
  kv_auto    rollout.kv_cache_gib=auto: vLLM reserves one rollout's KV cache exactly, its budget sized by the plan
  offload    kv_auto + train.offload_during_rollout: the trainer's tensors wait in host memory while vLLM
             generates (an adapter sync goes through host memory after the trainer left), and vLLM takes its
             KV cache back only after
  lean       offload at the preset's 8 rows per forward/backward (train.grow_micro_batch=false): what
             `--preset auto` picks for a 12 GiB card
  lean_eager lean with vLLM in eager mode (rollout.enforce_eager=true): no CUDA graphs in vLLM's process, whose
             memory stays on the card while it sleeps; the 1.5B <= 4 GB target's last lever, at a slower decode
  lean_fp8   lean with vLLM's KV cache in fp8 (rollout.kv_cache_dtype=fp8): one byte per cached value, half
             the cache (1.0 of the 7B's 2.0 GiB planned): the rollout's peak
  lean_fp8_host  lean_fp8 with the trainer's untied input embeddings in host memory (train.embeddings_on_host=true):
             1.0 GiB off a 7B's update, the lean plan's peak (10.25 -> 9.23 GiB planned with both levers)
Rows: the measured peak, the plan's predicted peak and its error (goal 4), the steady step time (after the
first step) and its phases, and (NVML, where pynvml is) the peak split by process: trainer, vLLM's worker and
what no process holds; the timeline goes to /tmp/lite-verl-card-peak-VARIANT.mem.jsonl.
Targets: <= 10 GiB at 7B, <= 4 GiB at 1.5B, a 7B step <= 12 s.
The AWQ copy is lite-verl's unit-scale twin of the random weights (bench/awq_rollout.make_awq_twin: the same
tensors, kernels and sync work as a calibrated copy; the weights are random, so calibration is moot), or with
--calib-prompts N calibrated once by `lite-verl quantize --max-prompts N` (AutoAWQ: 6 min 39 s for a 7B on 16
prompts on an H200, most of a 10-minute call), then given as rollout.quantized_path. Prompts
are cut at 128 tokens (data.max_prompt_length, every variant; the echo task's are shorter), so vLLM's KV
cache is sized for 128 + 256 tokens a row.
Needs bitsandbytes beside vLLM (stage ../shared/gpu/sets/bnb.txt too; awq.txt for --calib-prompts). This process
never touches the card (the model is built by a child process), so the card's peak is the run's alone. One
or two variants per call at 7B (a variant took 176 s on an H200 for 3 steps, the 7B load and vLLM's start
included; an AutoAWQ calibration takes a call of its own).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
from pathlib import Path

from bench.gpu_models import built_model, in_child
from bench.results import append, render
from bench.train_run import PeakGpuMemory, ProcessMemory, gpu0_memory_gib, memory_figures, train_run

CARD_GIB = 24.0  # the card the preset is written for
LEAN = ["rollout.kv_cache_gib=auto", "train.offload_during_rollout=true", "train.grow_micro_batch=false"]
VARIANTS = {
    "preset": [],
    "kv_auto": ["rollout.kv_cache_gib=auto"],
    "offload": ["rollout.kv_cache_gib=auto", "train.offload_during_rollout=true"],
    "lean": LEAN,
    "lean_eager": [*LEAN, "rollout.enforce_eager=true"],
    "lean_fp8": [*LEAN, "rollout.kv_cache_dtype=fp8"],
    "lean_fp8_host": [*LEAN, "rollout.kv_cache_dtype=fp8", "train.embeddings_on_host=true"],
}
PHASES = ("rollout", "sleep", "update", "sync")


def quantized(model: Path, prompts: int) -> Path:
    """The model's AWQ copy: lite-verl's unit-scale twin (prompts=0, bench/awq_rollout.make_awq_twin, in a child
    process), or calibrated on `prompts` built-in prompts by `lite-verl quantize`; reused when already written."""
    if prompts == 0:
        return Path(in_child(f"from pathlib import Path; from bench.awq_rollout import make_awq_twin; "
                             f"print(make_awq_twin(Path({str(model)!r})))"))  # fmt: skip
    out = model.parent / f"{model.name}-awq-calib{prompts}"
    if not (out / "config.json").is_file():
        cmd = [
            sys.executable,
            "-m",
            "lite_verl",
            "quantize",
            str(model),
            str(out),
            "--max-prompts",
            str(prompts),
        ]
        subprocess.run(cmd, check=True)
    return out


def run_variant(name: str, model: Path, args: argparse.Namespace) -> dict[str, float]:
    card = gpu0_memory_gib("total")
    sets = [f"model.path={model}", f"rollout.quantized_path={quantized(model, args.calib_prompts)}",
            "data.max_prompt_length=128", "train.backend=qlora", "trainer.batch_size=16", "rollout.n=8",
            "rollout.max_new_tokens=256", f"trainer.total_steps={args.steps}", "data.val_size=0",
            "trainer.progress=false", "trainer.keep_checkpoints=0", "data.task=echo",
            f"rollout.gpu_memory_utilization={0.35 * CARD_GIB / card:.4f}", *VARIANTS[name], *args.set]  # fmt: skip
    run_dir = Path(f"/tmp/lite-verl-card-peak-{name}")
    with PeakGpuMemory() as mem, ProcessMemory() as procs:
        train, _, summary, wall = train_run("4090x1", run_dir, sets)
    run_dir.parent.joinpath(f"{run_dir.name}.mem.jsonl").write_text(
        procs.timeline()
    )  # gpu_session.sh brings it back
    steady = train[1:] or train
    out = {**memory_figures(run_dir, mem), **procs.figures(), "wall_s": wall,
           "steady_step_s": statistics.mean(r["timing/step_s"] for r in steady),
           "train_peak_gib": summary.get("train_peak_gib", 0.0)}  # fmt: skip
    for phase in PHASES:
        out[f"{phase}_s"] = statistics.mean(r.get(f"timing/{phase}_s", 0.0) for r in steady)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="7b", help="the Qwen2.5 shape (random weights)")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--variants", default="preset,kv_auto,offload", help=f"of {', '.join(VARIANTS)}")
    ap.add_argument("--set", action="append", default=[], help="KEY=VALUE for every variant (where/how only)")
    ap.add_argument("--root", type=Path, default=Path("/tmp/lite-verl-bench-models"))
    ap.add_argument("--calib-prompts", type=int, default=0,
                    help="prompts calibrating the AWQ copy by AutoAWQ; 0: lite-verl's unit-scale twin (seconds)")  # fmt: skip
    ap.add_argument("--warm", action="store_true",
                    help="build the model and calibrate its AWQ copy (one step of the first variant), record nothing: "
                         "run beside other GPU work, then measure alone with the cache warm")  # fmt: skip
    args = ap.parse_args()
    model, label = built_model(args.size, args.root)
    if args.warm:
        args.steps = 1
        print("warm", run_variant(args.variants.split(",")[0], model, args), flush=True)
        return
    command = "python -m bench.card_peak " + " ".join(sys.argv[1:])
    for name in args.variants.split(","):
        out = run_variant(name, model, args)
        print(name, {k: round(v, 3) for k, v in out.items()}, flush=True)
        awq = f"calibrated on {args.calib_prompts} prompts" if args.calib_prompts else "unit-scale twin"
        settings = (f"4090x1 preset, qlora + AWQ rollout ({awq}), 16 prompts x 8 "
                    f"x 256 new tokens, prompts <= 128 tokens, {args.steps} steps "
                    f"(steady: after the first), variant {name}: {' '.join(VARIANTS[name]) or 'as shipped'}"
                    f"{' ' + ' '.join(args.set) if args.set else ''}")  # fmt: skip
        for metric, value in out.items():
            unit = "GiB" if metric.endswith("gib") else "%" if metric.endswith("pct") else "s"
            append("card_peak", label, settings, f"{name}_{metric}", value, unit, command)
    render()


if __name__ == "__main__":
    main()
