"""Benchmark: the shipped recipes, proven through the user's commands only: eval before, train, eval after.

    python -m bench.recipes --model smollm2=FILE.gguf [--model gemma=FILE.gguf] \
        --jobs smollm2:arithmetic,smollm2:countdown,smollm2:gsm8k,gemma:countdown \
        [--preset 4090x1] [--gsm8k DIR] [--steps N] [--set KEY=VALUE ...] [--job-set JOB:KEY=VALUE ...]

Each job runs in its own process tree, --parallel of them at once (one GPU holds several), their starts
--stagger seconds apart:
    lite-verl eval MODEL --preset P --recipe R [--set ...] --out before.json
    lite-verl train --preset P --recipe R --set model.path=MODEL [--set ...] --run-dir RUN
    lite-verl eval RUN --out after.json
and appends greedy accuracy (reward 1.0) and mean reward, mean@4 and pass@4 before and after (all prompts the recipe evaluates: GSM8K's
1,319 test problems, 500 held-out generated ones), the train wall time and the reward of the first and last
10% of steps to bench/results.jsonl; the per-step rewards go to bench/runs/recipes_curve_<job>.jsonl.
`--gsm8k DIR` points the gsm8k recipe at a local copy (DIR/train.jsonl, DIR/test.jsonl) instead of the Hub.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

from bench.results import append, render, write_curve
from bench.train_run import reward_curve

WORK = Path("/tmp/lite-verl-recipes")
MODEL_NAMES = {"smollm2": "SmolLM2-135M-Instruct (its Q4_1 GGUF, imported)",
               "gemma": "Gemma-3-270M base (its Q4_K_M GGUF, imported)"}  # fmt: skip


def lite_verl(args: list[str], log: Path) -> float:
    """Run `python -m lite_verl ARGS`, output appended to `log`; -> wall seconds. Raises on failure."""
    start = time.perf_counter()
    with log.open("a") as f:
        f.write(f"\n$ lite-verl {shlex.join(args)}\n")
        f.flush()
        done = subprocess.run([sys.executable, "-m", "lite_verl", *args], stdout=f, stderr=subprocess.STDOUT)
    if done.returncode != 0:  # the reason in the call's own output: a cut call may lose the log files
        said = [
            ln for ln in log.read_text(errors="replace").splitlines() if ln.strip() and " INFO " not in ln
        ]
        raise RuntimeError(
            f"lite-verl {args[0]} exited {done.returncode}; see {log}; it said: {' | '.join(said[-4:])}"
        )
    return time.perf_counter() - start


def run_job(job: str, model: str, args: argparse.Namespace) -> dict:
    """eval before, train, eval after for one model:recipe; -> the figures and the commands."""
    name, recipe = job.split(":")
    home = WORK / job.replace(":", "_")
    home.mkdir(parents=True, exist_ok=True)
    log = home / "log.txt"
    mine = [s.split(":", 2) for s in args.job_set]
    sets = [*args.set, *(kv for n, r, kv in mine if f"{n}:{r}" == job)]
    if recipe == "gsm8k" and args.gsm8k:
        sets += [f"data.train_files=[{args.gsm8k}/train.jsonl]", f"data.val_files=[{args.gsm8k}/test.jsonl]"]
    if args.steps:
        sets.append(f"trainer.total_steps={args.steps}")
    flags = ["--preset", args.preset, "--recipe", recipe, *(x for s in sets for x in ("--set", s))]
    before = ["eval", model, *flags, "--out", str(home / "before.json")]
    train = ["train", *flags, "--set", f"model.path={model}", "--set", "trainer.progress=false",
             "--run-dir", str(home / "run")]  # fmt: skip
    after = ["eval", str(home / "run"), "--out", str(home / "after.json")]
    out: dict = {
        "job": job,
        "sets": sets,
        "commands": [shlex.join(["lite-verl", *c]) for c in (before, train, after)],
    }
    out["eval_before_s"] = lite_verl(before, log)
    out["train_s"] = lite_verl(train, log)
    out["eval_after_s"] = lite_verl(after, log)
    for when in ("before", "after"):
        out[when] = json.loads((home / f"{when}.json").read_text())["scores"]["all"]
    out["summary"] = json.loads((home / "run" / "summary.json").read_text())
    out["config"] = (home / "run" / "config.yaml").read_text()
    rows = [json.loads(line) for line in (home / "run" / "metrics.jsonl").read_text().splitlines()]
    out["curve"] = reward_curve([r for r in rows if "reward/mean" in r])
    out["val"] = [(r["step"], r["val/reward_mean"]) for r in rows if "val/reward_mean" in r]
    # #24 item 9: a step skipped for a non-finite loss or gradient (cuDNN attention's NaN backward on Hopper)
    out["skipped_steps"] = sum(int(r.get("actor/skipped_step", 0) > 0) for r in rows)
    return out


def record(result: dict, args: argparse.Namespace) -> None:
    job = result["job"]
    name, recipe = job.split(":")
    steps = result["summary"]["steps"]
    sets = [x for x in result["sets"] if not x.startswith(("data.train_files=", "data.val_files="))]
    extra = f"; --set {' '.join(sets)}" if sets else ""
    settings = (f"recipe {recipe} as shipped, {steps} steps, preset {args.preset}{extra}; eval: greedy, mean@4 and "
                f"pass@4 on {int(result['before']['prompts'])} held-out prompts; {len(args.jobs)} jobs at once on one GPU")  # fmt: skip
    command = " && ".join(result["commands"])
    model = MODEL_NAMES.get(name, name)
    for when in ("before", "after"):
        for metric in ("greedy_acc", "greedy", "mean@4", "pass@4"):
            if metric in result[when]:
                unit = "reward" if metric in ("greedy", "mean@4") else "accuracy"
                append(
                    "recipes",
                    model,
                    settings,
                    f"{recipe}_{metric}_{when}",
                    result[when][metric],
                    unit,
                    command,
                )
    s = result["summary"]
    append("recipes", model, settings, f"{recipe}_train_wall_s", result["train_s"], "s", command)
    append("recipes", model, settings, f"{recipe}_skipped_steps", result["skipped_steps"], "steps", command)
    for key in ("reward_first_10pct", "reward_last_10pct"):
        append("recipes", model, settings, f"{recipe}_{key}", s[key], "reward", command)
    write_curve(
        "recipes",
        job.replace(":", "_"),
        f"{model}, recipe {recipe}: {settings}",
        {"lite-verl": result["curve"]},
    )


def record_partial(folder: Path, hw: str, why: str, command: str) -> None:
    """The jobs of a run that did not finish (extra.tgz unpacked: JOB/before.json, JOB/metrics.jsonl): the eval
    before, the steps reached and the mean reward of their first and last 3 steps, the greedy accuracy of the
    run's own validations (the same held-out prompts as the eval, greedy), marked with `why`."""
    for home in sorted(d for d in folder.iterdir() if d.is_dir()):
        name, recipe = home.name.split("_", 1)
        model = MODEL_NAMES.get(name, name)
        metrics = home / "metrics.jsonl"
        rows = [json.loads(x) for x in metrics.read_text().splitlines()] if metrics.is_file() else []
        train = [r for r in rows if "reward/mean" in r]
        settings = f"recipe {recipe} as shipped, PARTIAL: {why}; {len(train)} steps done"
        if (home / "before.json").is_file():
            before = json.loads((home / "before.json").read_text())["scores"]["all"]
            for metric in ("greedy_acc", "mean@4", "pass@4"):
                append("recipes", model, settings, f"{recipe}_{metric}_before", before[metric],
                       "accuracy" if metric != "mean@4" else "reward", command, hw=hw)  # fmt: skip
        for r in rows:
            if "val/acc" in r:
                append("recipes", model, settings, f"{recipe}_val_greedy_acc_step_{r['step']}", r["val/acc"],
                       "accuracy", command, hw=hw)  # fmt: skip
        if len(train) >= 6:
            for key, part in (("reward_first_3_steps", train[:3]), ("reward_last_3_steps", train[-3:])):
                value = sum(r["reward/mean"] for r in part) / 3
                append("recipes", model, settings, f"{recipe}_{key}", value, "reward", command, hw=hw)
            write_curve("recipes", f"{home.name}_partial", f"{model}, recipe {recipe}: {settings}",
                        {"lite-verl": reward_curve(train)})  # fmt: skip
        print(f"{home.name}: {len(train)} steps, rewards {[round(r['reward/mean'], 3) for r in train]}")
    render()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--partial", type=Path, help="record the unfinished jobs of this folder (extra.tgz unpacked)"
    )
    p.add_argument("--hardware", default="", help="with --partial: where they ran")
    p.add_argument("--why", default="", help="with --partial: why they did not finish")
    p.add_argument("--command", default="", help="with --partial: the command that ran them")
    p.add_argument("--model", action="append", default=[], help="NAME=PATH (a model dir, .gguf or Hub id)")
    p.add_argument("--jobs", default="", help="NAME:RECIPE,... (required unless --partial)")
    p.add_argument("--preset", default="4090x1")
    p.add_argument("--gsm8k", default="", help="a local GSM8K copy for the gsm8k recipe")
    p.add_argument("--steps", type=int, default=0, help="override the recipe's trainer.total_steps")
    p.add_argument("--set", action="append", default=[], help="KEY=VALUE for every command of every job")
    p.add_argument("--job-set", action="append", default=[], help="NAME:RECIPE:KEY=VALUE for one job")
    # 2026-12-05 on one H200: 4 jobs at once made 15-20 s steps, 5 engines starting together left one without
    # KV-cache memory (vLLM profiles free memory while the others load), and the machine stopped answering
    p.add_argument("--parallel", type=int, default=2, help="jobs running at once (default 2)")
    p.add_argument("--stagger", type=float, default=30.0, help="seconds between the starts of the first jobs")
    args = p.parse_args()
    if args.partial:
        return record_partial(args.partial, args.hardware, args.why, args.command)
    if not args.jobs:
        p.error("--jobs is required")
    args.jobs = args.jobs.split(",")
    models = dict(m.split("=", 1) for m in args.model)

    def start(i: int, job: str) -> dict:
        time.sleep(args.stagger * min(i, args.parallel - 1))  # one engine profiles GPU memory at a time
        return run_job(job, models[job.split(":")[0]], args)

    failed = 0
    with ThreadPoolExecutor(max(1, args.parallel)) as pool:
        futures = {pool.submit(start, i, j): j for i, j in enumerate(args.jobs)}
        for f in as_completed(futures):  # each job recorded as it ends: a cut call keeps the finished ones
            job = futures[f]
            try:
                result = f.result()
            except Exception as e:  # noqa: BLE001 - one job failing must not lose the others' figures
                print(f"{job}: FAILED: {e}", flush=True)
                failed += 1
                continue
            record(result, args)
            render()
            b, a = result["before"], result["after"]
            print(f"{job}: greedy accuracy {b['greedy_acc']:.3f} -> {a['greedy_acc']:.3f}, pass@4 {b.get('pass@4', 0):.3f} -> "
                  f"{a.get('pass@4', 0):.3f}, reward {result['summary']['reward_first_10pct']:.3f} -> "
                  f"{result['summary']['reward_last_10pct']:.3f}, val {result['val']}, skipped steps "
                  f"{result['skipped_steps']}, train {result['train_s']:.0f} s", flush=True)  # fmt: skip
    render()
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
