"""The `lite-verl` command.

    lite-verl train --preset laptop                       # GRPO on the CPU, tiny model, built-in task
    lite-verl train --preset 4090x1 --recipe gsm8k --set model.path=Qwen/Qwen2.5-1.5B-Instruct
    lite-verl train --preset 4090x1 --config my.yaml --set trainer.total_steps=200
    lite-verl recipes                                     # what can be trained, with launch lines
    lite-verl train --preset auto --set model.path=DIR    # detect the GPUs, pick what fits, say why
    lite-verl train --resume runs/20261202-120000-laptop  # continue from the last checkpoint
    lite-verl validate --preset 4090x4                    # print the resolved config, or what is wrong
    lite-verl make-tiny-model DIR                         # random-init model + locally trained tokenizer
    lite-verl prepare-gsm8k SRC.jsonl DST.jsonl           # GSM8K's jsonl -> verl's prompt schema
    lite-verl import-gguf FILE.gguf DIR                   # a GGUF file -> a Hugging Face model directory
    lite-verl export-verl RUN_DIR [--nnodes 2 --gpus-per-node 8]   # the same run as a verl (Ray) launch
    lite-verl k8s RUN_DIR --image REGISTRY/lite-verl:0.1 | kubectl apply -f -   # as a Kubernetes Job

A mistake in the input prints one line naming the field and the fix, and exits with code 2.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from lite_verl.errors import ConfigError, UserError

if TYPE_CHECKING:
    from lite_verl.config import Config
    from lite_verl.run.rundir import RunDir
    from lite_verl.tools.auto import Gpu
    from lite_verl.tools.plan import Shape

EPILOG = (
    "Docs: README.md. Config keys: `lite-verl validate --keys`. Presets (where): `lite-verl presets`. "
    "Recipes (what): `lite-verl recipes`."
)


PRESET_HELP = ("hardware preset: a name in presets/ (e.g. laptop, 4090x1), a YAML path, or auto (detect this "
               "machine's GPUs and pick what fits)")  # fmt: skip
RECIPE_HELP = ("what to train: a name in recipes/ (data, rewards, hyper-parameters; `lite-verl recipes`) or a YAML "
               "path; layered under the preset")  # fmt: skip


def _add_config_args(
    p: argparse.ArgumentParser,
    config_file: bool = True,
    preset_help: str = PRESET_HELP,
    recipe_help: str = RECIPE_HELP,
) -> None:
    p.add_argument("--preset", help=preset_help)
    p.add_argument("--recipe", help=recipe_help)
    if config_file:
        p.add_argument("--config", help="your YAML config; layered over the preset")
    p.add_argument(
        "--set",
        dest="sets",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override one key, e.g. --set trainer.total_steps=10 (repeatable; values parsed as YAML)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="lite-verl",
        description="RL post-training (GRPO, PPO and kin) of Hugging Face causal LMs on one workstation "
        "or a laptop CPU.",
        epilog=EPILOG,
    )
    parser.add_argument("--version", action="version", version=f"lite-verl {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    _add_config_commands(sub)
    _add_model_commands(sub)
    _add_run_commands(sub)
    _add_export_verl(sub)
    _add_k8s(sub)
    return parser


def _add_config_commands(sub) -> None:
    """train, validate, presets, plan: the commands that take a config."""
    p = sub.add_parser(
        "train",
        help="run RL training",
        description="Run RL training (rollout -> reward -> "
        "advantage -> update -> sync), writing a run directory.",
        epilog=EPILOG,
    )
    _add_config_args(p)
    p.add_argument("--run-dir", help="where to write the run (default runs/<time>-[<recipe>-]<preset>)")
    p.add_argument("--resume", metavar="RUN_DIR", help="continue RUN_DIR from its last checkpoint")

    p = sub.add_parser(
        "validate",
        help="check a config and print it resolved",
        description="Resolve defaults < preset < --config < --set, check it, print it as YAML.",
    )
    _add_config_args(p)
    p.add_argument("--keys", action="store_true", help="list every config key with its meaning and its value (under "
                   "the given --preset, --recipe and --set; the preset's defaults otherwise)")  # fmt: skip
    p.add_argument(
        "--no-env-check",
        action="store_true",
        help="skip the checks of this machine (GPUs, packages, model and data paths)",
    )

    sub.add_parser("presets", help="list the hardware presets (where a run goes)")
    sub.add_parser("recipes", help="list the recipes (what a run trains), with their launch lines")

    p = sub.add_parser(
        "plan",
        help="predict peak GPU memory per card before loading anything",
        description="Per GPU and role: predicted peak memory (weights, LoRA + optimizer state, activations, "
        "logits, vLLM), whether it fits, and which knob to turn.",
    )
    _add_config_args(p)
    p.add_argument(
        "--model-shape",
        metavar="SIZE",
        help="plan for a Qwen2.5 shape (0.5b, 1.5b, 3b, 7b, 14b, 32b) instead of model.path's config.json",
    )


def _add_model_commands(sub) -> None:
    """make-tiny-model, import-gguf, prepare-gsm8k, quantize: models and data made or converted."""
    p = sub.add_parser(
        "make-tiny-model",
        help="write a random-init tiny model + tokenizer",
        description="Write a random-init Qwen2/Llama model and a tokenizer trained locally.",
    )
    p.add_argument("dir", help="output directory")
    p.add_argument("--arch", default="qwen2", choices=["qwen2", "llama"])
    p.add_argument("--seed", type=int, default=0)

    p = sub.add_parser(
        "import-gguf",
        help="convert a GGUF file into a Hugging Face model directory",
        description="Dequantize a GGUF file (llama.cpp) into a normal HF model directory.",
    )
    p.add_argument("gguf", help="the .gguf file")
    p.add_argument("dir", help="output directory")
    p.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16", "float16"])

    p = sub.add_parser(
        "prepare-gsm8k",
        help="convert GSM8K jsonl to verl's prompt schema",
        description="Convert GSM8K's {question, answer} jsonl into verl's prompt rows.",
    )
    p.add_argument("src", help="GSM8K train.jsonl or test.jsonl")
    p.add_argument("dst", help="output .jsonl")

    p = sub.add_parser(
        "quantize",
        help="AWQ 4-bit quantize a model for vLLM (AutoAWQ)",
        description="AWQ-quantize MODEL_DIR into OUT_DIR (group zero points), calibrated on prompts; "
        "OUT_DIR loads in vLLM and works as rollout.quantized_path.",
    )
    p.add_argument("model", help="Hugging Face model directory, Hub id (org/name[@rev]) or .gguf file")
    p.add_argument("out", help="output directory")
    p.add_argument(
        "--calib", help="prompts file in verl's schema (jsonl/parquet); default: the built-in arithmetic task"
    )
    p.add_argument("--group-size", type=int, default=128, help="input channels per group: 32, 64 or 128")
    p.add_argument("--max-prompts", type=int, default=512, help="calibration prompts to use")


def _add_run_commands(sub) -> None:
    """report, export, eval: what a run directory (or a model) gives."""
    p = sub.add_parser(
        "report",
        help="print a finished run's bill and numbers, write PNG plots",
        description="The run's table (GPU-hours per role, cost, wall time, tokens/s, utilisation), a what-if "
        "for the other placement, and PNG plots in RUN/report/ (matplotlib: pip install 'lite-verl[report]').",
    )
    p.add_argument("run", help="run directory")
    p.add_argument("--no-plots", action="store_true", help="only the table")

    sub.add_parser(
        "doctor",
        help="check this machine: package versions and conflicts, GPUs, Hugging Face cache, disk",
        description="What lite-verl finds here, each problem with its fix in one line; exit 1 if any.",
    )

    p = sub.add_parser(
        "watch",
        help="follow a run from another terminal: step, reward, sparkline, ETA",
        description="Refreshes until the run's summary.json appears (Ctrl-C stops watching, not the run).",
    )
    p.add_argument("run", help="run directory")
    p.add_argument("--once", action="store_true", help="print one frame and exit")
    p.add_argument("--interval", type=float, default=5.0, help="seconds between frames")

    p = sub.add_parser(
        "export",
        help="write a run's trained policy as a model directory (HF, AWQ or GGUF) and push it to the Hub",
        description="Merge the last checkpoint's adapter into the base: a HF model (--format hf), an AWQ "
        "4-bit model for vLLM (--format awq), or a GGUF file with an Ollama Modelfile for llama.cpp, Ollama "
        "and LM Studio (--format gguf, pip install 'lite-verl[gguf]'). A model card (README.md) is written "
        "from the run; --push-to-hub uploads the directory.",
    )
    p.add_argument("run", help="run directory")
    p.add_argument("out", help="output directory")
    p.add_argument("--format", default="hf", choices=["hf", "adapter", "awq", "gguf"],
                   help="hf: merged model (default); adapter: the LoRA adapter alone (peft); awq; gguf")  # fmt: skip
    p.add_argument("--quant", default="", help="gguf: f16 (default), bf16, f32, q8_0, or a k-quant such as "
                   "q4_k_m (needs llama-cpp-python)")  # fmt: skip
    p.add_argument("--dtype", default="auto", choices=["auto", "bfloat16", "float16", "float32"],
                   help="the merged weights' dtype; auto = the base model's own (default)")  # fmt: skip
    p.add_argument("--step", type=int, default=0, help="export this step's checkpoint (default: the last)")
    p.add_argument("--awq-group-size", type=int, default=0, choices=[0, 32, 64, 128],
                   help="--format awq: the quantization group (default: the run's rollout.awq_group_size)")  # fmt: skip
    p.add_argument("--push-to-hub", metavar="ORG/NAME", default="", help="upload the export to this Hub repo")
    p.add_argument("--private", action="store_true", help="--push-to-hub: create the repo private")
    p.add_argument(
        "--dry-run", action="store_true", help="--push-to-hub: list what would be uploaded, upload nothing"
    )

    p = sub.add_parser(
        "eval",
        help="score a model or a run's last checkpoint: greedy accuracy, mean@k, pass@k per data source",
        description="Generate with the config's rollout engine on the validation prompts (data.val_files, "
        "or the built-in task's held-out set) and score with its reward: greedy, mean@k and pass@k per "
        "data_source, as a table and --out JSON. A run directory evaluates its last checkpoint.",
        epilog=EPILOG,
    )
    p.add_argument("target", metavar="MODEL_OR_RUN_DIR", help="a run directory, or a model (model.path)")
    _add_config_args(
        p,
        preset_help=PRESET_HELP + "; with a run directory, in place of the hardware keys it was trained with",
        recipe_help="the task to evaluate on: a name in recipes/ (its data, rewards and sampling) or a YAML path; "
        "a run directory keeps its model and adapter",
    )
    p.add_argument("--k", type=int, default=4, help="samples per prompt for mean@k and pass@k (default 4)")
    p.add_argument("--correct", type=float, default=1.0, help="a reward at least this counts as correct")
    p.add_argument("--correct-fn", default="", metavar="NAME", help="with several reward.functions: the one whose "
                   "own score is judged (default: the first)")  # fmt: skip
    p.add_argument("--limit", type=int, default=0, help="evaluate the first N prompts (default: all)")
    p.add_argument("--out", help="write the result as JSON here (scores, and every greedy completion)")
    p.add_argument("--show", type=int, default=2, metavar="N",
                   help="print N greedy completions judged right and N judged wrong (default 2; 0: none)")  # fmt: skip


def _add_source_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "source",
        nargs="?",
        metavar="RUN_OR_CONFIG",
        help="a run directory (its config.yaml) or a YAML config file; none: --preset alone",
    )
    _add_config_args(p, config_file=False)


def _add_export_verl(sub) -> None:
    p = sub.add_parser(
        "export-verl",
        help="write the same run as a verl launch (Ray, FSDP, vLLM) for more than one machine",
        description="Write verl's launch of a run: run_verl.sh (Hydra overrides for verl.trainer.main_ppo), "
        "train/val parquet in verl's schema, and UNSUPPORTED.md (what has no verl equivalent).",
        epilog=EPILOG,
    )
    _add_source_args(p)
    p.add_argument("--out", help="output directory (default RUN/verl, or verl-<config name>)")
    p.add_argument("--nnodes", type=int, default=1, help="Ray nodes (default 1)")
    p.add_argument("--gpus-per-node", type=int, help="GPUs per node (default: the GPUs the config uses)")
    p.add_argument("--force", action="store_true", help="replace --out if it exists")


def _add_k8s(sub) -> None:
    p = sub.add_parser(
        "k8s",
        help="write a Kubernetes Job (+ ConfigMap) that runs the training and resumes on retry",
        description="A batch/v1 Job: GPU limits, restartPolicy Never, backoffLimit, ttlSecondsAfterFinished, "
        "volumes for models/data/runs; a retried pod resumes from the last checkpoint.",
        epilog=EPILOG,
    )
    _add_source_args(p)
    p.add_argument("--image", required=True, help="container image with lite-verl (see the Dockerfile)")
    p.add_argument("--out", help="write the YAML here (default: stdout, for `| kubectl apply -f -`)")
    p.add_argument("--name", help="Job name and run directory name (default from RUN_OR_CONFIG)")
    p.add_argument("--namespace", default="default")
    p.add_argument("--backoff-limit", type=int, default=3, help="pod retries before the Job fails")
    p.add_argument("--ttl", type=int, default=86400, help="seconds to keep the finished Job (and its pods)")
    p.add_argument("--shm-size", default="16Gi", help="size of /dev/shm (vLLM and the adapter sync use it)")
    for vol in ("models", "data", "runs"):
        p.add_argument(f"--{vol}-pvc", help=f"PersistentVolumeClaim for /{vol} (default lite-verl-{vol})")
        p.add_argument(f"--{vol}-host-path", help=f"a directory on the node for /{vol}, instead of a PVC")


def _version() -> str:
    from lite_verl import __version__

    return __version__


def _quiet_libraries() -> None:
    """Less noise from transformers; HF_HUB_OFFLINE, HF_HOME and HF_TOKEN stay the user's (a Hub id in
    model.path downloads once, with the Hub's own progress bars)."""
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*is deprecated")
    # bitsandbytes (imported by peft when installed) warns on every CPU import that an optional kernel
    # package is missing: one line of noise in every command, and in front of our one-line errors
    logging.getLogger("bitsandbytes").setLevel(logging.ERROR)
    try:
        from huggingface_hub import constants
        from huggingface_hub.utils import enable_progress_bars
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()  # transformers' bars, and (through it) all of huggingface_hub's ...
        if constants.HF_HUB_DISABLE_PROGRESS_BARS is None:  # ... but a model download keeps its own
            enable_progress_bars("huggingface_hub.snapshot_download")
    except ImportError:  # pragma: no cover
        pass


def cmd_train(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from lite_verl.config.paths import with_absolute_paths
    from lite_verl.config.validation import check_environment
    from lite_verl.loop import prepare, run_training
    from lite_verl.run.rundir import RunDir, default_run_dir

    if args.resume:
        given = [f for f, v in (("--preset", args.preset), ("--recipe", args.recipe), ("--config", args.config),
                                ("--run-dir", args.run_dir)) if v]  # fmt: skip
        if given:  # the run's config.yaml already holds its preset and recipe: another would change its maths
            raise UserError(
                f"--resume takes its preset, recipe, config and run directory from RUN_DIR; drop {'/'.join(given)} "
                "(--set changes what may change)"
            )
        return _resume_run(Path(args.resume), args.sets)
    cfg, gpus = _load(args)
    check_environment(cfg)
    cfg = _check_plan(cfg, gpus)
    run = RunDir(Path(args.run_dir) if args.run_dir else default_run_dir(cfg.preset, cfg.recipe))
    run.check_new()  # absent or empty, and no other process's
    session = prepare(cfg)  # everything that can fail on bad input fails here, before the run dir exists
    steps = session.cfg.trainer  # trainer.total_epochs becomes steps once the data is read
    cfg = replace(
        cfg, trainer=replace(cfg.trainer, total_steps=steps.total_steps, total_epochs=steps.total_epochs)
    )
    from lite_verl.run.signals import Interrupted, StopRequest

    try:
        with StopRequest() as stop:  # a signal while the directory is made is acted on once it is whole
            # a process that took the directory meanwhile: refused, nothing written. Its config.yaml holds the
            # local paths absolute, so --resume and eval RUN work from anywhere (errors keep the typed ones)
            lock = run.create(with_absolute_paths(cfg))
    except BaseException:
        session.close()
        raise
    if stop.signum is not None:  # nothing trained yet: leave no run directory
        with lock:
            run.discard()
        session.close()
        raise Interrupted(stop.signum, 0, False)
    with lock:
        try:
            run_training(session, run)
        except BaseException as e:
            _after_failure(run, run.latest_checkpoint() is not None, e)
            raise
    return 0


def _resume_run(path: Path, sets: list[str]) -> int:
    """--resume RUN: own the run, check what --set changes (run/resume.py), record it, continue."""
    from lite_verl.config.validation import check_environment
    from lite_verl.loop import prepare, run_training
    from lite_verl.run.resume import resume_config
    from lite_verl.run.rundir import RunDir, run_config_file

    run_config_file(path)  # not a run directory: say so before a lock file is put there
    run = RunDir(path)
    with run.lock():  # held elsewhere: one line naming the holder, nothing written
        cfg, changes = resume_config(path, sets)
        ckpt = run.latest_checkpoint(quiet=True)  # the loop warns about a damaged one
        done = int(ckpt.name.split("_")[-1]) if ckpt else None
        if done is not None and cfg.trainer.total_steps < done:
            raise ConfigError(
                f"--resume {path} --set trainer.total_steps={cfg.trainer.total_steps}: the run is already at step "
                f"{done}; set trainer.total_steps to {done} or more (nothing was changed)"
            )
        check_environment(cfg)
        cfg = _check_plan(cfg)  # this machine's plan; a --set gradient_checkpointing=auto is decided here
        session = prepare(cfg)
        if changes:
            run.append_history(changes, done)
        run_training(session, run, resume=True)
    return 0


def _after_failure(run: RunDir, checkpoint: bool, error: BaseException) -> None:
    """A run that stopped with an error: with a checkpoint, say how to resume; with finished steps but no
    checkpoint, keep its metrics and logs and write RUN/FAILED (what stopped it); with nothing done, leave
    no run directory behind (an existing empty one given as --run-dir is left empty)."""
    from lite_verl.run.files import atomic_write_text
    from lite_verl.run.rundir import read_metrics
    from lite_verl.run.signals import TrainedThenInterrupted

    path = run.path
    if isinstance(error, TrainedThenInterrupted):
        return  # every step is trained: nothing to resume (its message says how to evaluate the run)
    if checkpoint:
        print(f"lite-verl: resume with: lite-verl train --resume {path}", file=sys.stderr)
        return
    steps = [m["step"] for m in read_metrics(path) if "reward/mean" in m]
    if not steps:
        run.discard()
        return
    why = f"{type(error).__name__}: {error}".strip().rstrip(":")
    try:
        atomic_write_text(
            path / "FAILED", f"stopped after step {int(max(steps))} with no checkpoint: {why}\n"
        )
        where = "and says why in FAILED"
    except OSError:  # the disk that failed the run may not take this file either
        where = "(FAILED could not be written)"
    print(f"lite-verl: {path} keeps the metrics and logs of {len(steps)} step(s) {where}; no checkpoint to "
          "resume from was written before it stopped (trainer.save_every and save_every_minutes set how often)",
          file=sys.stderr)  # fmt: skip


def _load(
    args: argparse.Namespace, shape: Shape | None = None, out: TextIO | None = None
) -> tuple[Config, list[Gpu] | None]:
    """The config of --preset/--config/--set, and the detected GPUs (None unless --preset auto, which detects
    them, chooses, and prints why to `out`, stdout by default)."""
    from lite_verl.config import load_config
    from lite_verl.config.presets import AUTO

    if args.preset != AUTO:
        return load_config(args.preset, args.config, args.sets, recipe=args.recipe), None
    from lite_verl.tools.auto import choose, detect

    choice = choose(detect(), args.config, args.sets, shape, args.recipe)
    for line in choice.lines:
        print(line, file=out or sys.stdout)
    return choice.cfg, list(choice.gpus)


def _check_plan(cfg: Config, gpus: list[Gpu] | None = None) -> Config:
    """Before anything loads: train.gradient_checkpointing=auto decided by the plan, then the plan fits every
    card and the host's RAM, and the cards exist with that much memory free now (the GPUs are detected here
    unless --preset auto already did). -> the config to run (auto made concrete)."""
    from lite_verl.model.load import resolve_model_path
    from lite_verl.tools.auto import card_sizes, check_topology, detect
    from lite_verl.tools.plan import check_plan, decide_memory_knobs, shape_of

    model_dir = resolve_model_path(cfg.model)
    cpu = not (cfg.rollout.gpus or cfg.train.gpus)  # a CPU run: the host's RAM only
    gpus = [] if cpu else detect() if gpus is None else gpus
    cards = card_sizes(gpus)
    t = cfg.train  # the model's shape is read only when something is to decide
    decides = t.gradient_checkpointing == "auto" or t.grow_micro_batch
    free = {g.id: g.free_gib for g in gpus}
    cfg = decide_memory_knobs(cfg, shape_of(model_dir) if decides else None, cards, free)
    if t.grow_micro_batch and cfg.train.micro_batch_size != t.micro_batch_size:
        print(f"plan: train.micro_batch_size {t.micro_batch_size} -> {cfg.train.micro_batch_size} "
              f"(train.grow_micro_batch: the plan fits it with room), gradient checkpointing "
              f"{'on' if cfg.train.checkpointing else 'off'}", file=sys.stderr)  # fmt: skip
    check_plan(cfg, model_dir, cards)
    if not cpu:
        check_topology(cfg, shape_of(model_dir), gpus)
    return cfg


def cmd_plan(args: argparse.Namespace) -> int:
    from lite_verl.model.load import resolve_model_path
    from lite_verl.tools.auto import MODEL_SHAPES, card_sizes
    from lite_verl.tools.plan import decide_memory_knobs, format_plan, plan, shape_of

    shape = None
    if args.model_shape:
        if args.model_shape.lower() not in MODEL_SHAPES:
            raise UserError(f"--model-shape {args.model_shape}: give one of {', '.join(MODEL_SHAPES)}")
        shape = MODEL_SHAPES[args.model_shape.lower()]
    cfg, gpus = _load(args, shape)
    shape = shape or shape_of(resolve_model_path(cfg.model))
    cfg = decide_memory_knobs(cfg, shape, card_sizes(gpus or []))  # auto: as `train` would decide it
    print(format_plan(cfg, plan(cfg, shape, card_sizes(gpus or [])), shape))
    return 0


def cmd_validate(args: argparse.Namespace) -> int:
    import yaml

    from lite_verl.config import describe, to_dict
    from lite_verl.config.validation import check_environment

    if args.keys:  # each key's value under the given --preset/--recipe/--set (the defaults with none)
        from lite_verl.config.convert import flat_values

        values = flat_values(to_dict(_load(args, out=sys.stderr)[0]))
        for key, comment in describe():
            value = values.get(key, "")
            shown = (
                "''" if value == "" else yaml.safe_dump(value, default_flow_style=True, width=10**6).strip()
            )
            print(f"{key:<36} {comment}\n{'':<36} = {shown.removesuffix(chr(10) + '...')}")
        return 0
    cfg, _ = _load(args, out=sys.stderr)
    print(yaml.safe_dump(to_dict(cfg), sort_keys=False), end="")
    if not args.no_env_check:
        check_environment(cfg)
        _check_paths(cfg)
    recipe = f", recipe {cfg.recipe}" if cfg.recipe else ""
    print(f"# config OK (preset {cfg.preset}{recipe})", file=sys.stderr)
    return 0


def _check_paths(cfg: Config) -> None:
    """The model and data paths exist (a Hub id is taken as given: validate downloads nothing)."""
    from lite_verl.data.sources import check_source
    from lite_verl.model.load import check_model_path

    check_model_path(cfg.model)
    for key, sources in (("data.train_files", cfg.data.train_files), ("data.val_files", cfg.data.val_files)):
        for source in sources:
            check_source(source, key)


def cmd_presets(args: argparse.Namespace) -> int:
    from lite_verl.config.presets import AUTO, launch_line, preset_names, preset_path

    print(
        f"{AUTO:<10} lite-verl train --preset auto --set model.path=DIR  (detects the GPUs, picks what fits)"
    )
    for name in preset_names():
        print(f"{name:<10} {launch_line(preset_path(name))}")
    return 0


def cmd_recipes(args: argparse.Namespace) -> int:
    from lite_verl.config.presets import launch_line, recipe_names, recipe_path

    width = max(map(len, recipe_names()), default=0)
    for name in recipe_names():
        path = recipe_path(name)
        about = next((ln[2:].strip() for ln in path.read_text().splitlines() if ln.startswith("# ")), "")
        print(f"{name:<{width}} {about}\n{'':<{width}} {launch_line(path)}")
    return 0


def cmd_make_tiny(args: argparse.Namespace) -> int:
    from lite_verl.model.tiny import TinySpec, make_tiny_model

    out = make_tiny_model(args.dir, TinySpec(arch=args.arch, seed=args.seed))
    print(f"wrote a random-init {args.arch} model and its tokenizer to {out}")
    return 0


def cmd_prepare_gsm8k(args: argparse.Namespace) -> int:
    from lite_verl.data.gsm8k import convert_gsm8k

    n = convert_gsm8k(args.src, args.dst)
    print(f"wrote {n} prompts to {args.dst}")
    return 0


def cmd_import_gguf(args: argparse.Namespace) -> int:
    from lite_verl.model.gguf import import_gguf

    out = import_gguf(args.gguf, args.dir, args.dtype)
    print(f"wrote a Hugging Face model directory to {out}")
    return 0


def cmd_quantize(args: argparse.Namespace) -> int:
    from lite_verl.tools.export import quantize_command

    out = quantize_command(args.model, args.out, args.calib, args.group_size, args.max_prompts)
    print(f"wrote an AWQ 4-bit model to {out} (use it as rollout.quantized_path, or serve it with vLLM)")
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from lite_verl.tools.report import report

    print(report(args.run, plots=not args.no_plots))
    return 0


def cmd_doctor(args: argparse.Namespace) -> int:
    from lite_verl.tools.doctor import doctor

    return doctor()


def cmd_watch(args: argparse.Namespace) -> int:
    from lite_verl.tools.watch import watch

    return watch(args.run, once=args.once, interval=args.interval)


def cmd_eval(args: argparse.Namespace) -> int:
    from lite_verl.tools.evaluate import run_eval

    if args.k < 1:
        raise UserError(f"--k {args.k}: give at least 1 sample per prompt")
    sets = [*args.sets, *([f"data.val_size={args.limit}"] if args.limit else [])]
    run_eval(args.target, args.preset, args.config, sets, args.k, args.correct, Path(args.out) if args.out else None,
             limit=args.limit, recipe=args.recipe, correct_fn=args.correct_fn, show=args.show)  # fmt: skip
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from lite_verl.ship import hub
    from lite_verl.tools.export import ExportOptions, export_run

    repo = hub.check_repo_id(args.push_to_hub) if args.push_to_hub else ""
    if args.dry_run and not repo:
        raise UserError("--dry-run applies to --push-to-hub ORG/NAME")
    if repo and not args.dry_run:
        hub.check_token(repo)
    opts = ExportOptions(args.format, args.quant, args.dtype, args.step, args.awq_group_size)
    out = export_run(args.run, args.out, opts)
    print(f"wrote the trained policy ({args.format}) to {out}")
    if repo:
        print("\n".join(hub.upload_plan(out, repo, args.private)))
        if args.dry_run:
            print("dry run: nothing was uploaded")
        else:
            print(
                f"pushed: {hub.push(out, repo, args.private, f'lite-verl export of {Path(args.run).name}')}"
            )
    return 0


def _load_source(args: argparse.Namespace):
    """RUN_OR_CONFIG + --preset/--set -> (config, a name for it, the run directory or None)."""
    from lite_verl.config import load_config

    if args.source is None:
        cfg = load_config(args.preset, None, args.sets, recipe=args.recipe)
        return cfg, Path(cfg.recipe or cfg.preset).stem, None
    path = Path(args.source)
    if path.is_dir():
        if not (path / "config.yaml").is_file():
            raise UserError(
                f"RUN_OR_CONFIG {path}: a directory without config.yaml; give a run directory made by "
                "lite-verl train, or a YAML config file"
            )
        from lite_verl.run.rundir import run_config_layer

        layer = run_config_layer(path)  # config.yaml with the changes its resumes made
        cfg = load_config(args.preset, layer, args.sets, recipe=args.recipe)
        return cfg, path.absolute().name, path
    if not path.exists():
        raise UserError(
            f"RUN_OR_CONFIG {str(path)!r} does not exist; give a run directory (with config.yaml) or a YAML "
            "config file"
        )
    return load_config(args.preset, str(path), args.sets, recipe=args.recipe), path.stem, None


def cmd_export_verl(args: argparse.Namespace) -> int:
    from lite_verl.tools.verl_export import default_layout
    from lite_verl.tools.verl_files import export_verl

    cfg, name, run = _load_source(args)
    out = Path(args.out) if args.out else (run / "verl" if run else Path(f"verl-{name}"))
    done = export_verl(cfg, name, out, default_layout(cfg, args.nnodes, args.gpus_per_node), args.force)
    print(
        f"wrote verl's launch of '{name}' to {done.out}: run_verl.sh ({len(done.plan.overrides)} overrides), "
        f"train.parquet ({done.n_train} prompts), val.parquet ({done.n_val})"
    )
    print("no verl equivalent (UNSUPPORTED.md):")
    for note in done.plan.notes:
        print(f"  - {note.setting}: {note.verl}")
    return 0


def cmd_k8s(args: argparse.Namespace) -> int:
    from lite_verl.run.files import atomic_write_text
    from lite_verl.tools.k8s import job_options, k8s_yaml

    cfg, name, _ = _load_source(args)
    text = k8s_yaml(cfg, job_options(args, name))
    if not args.out:
        print(text, end="")
        return 0
    atomic_write_text(Path(args.out), text)
    print(
        f"wrote a Kubernetes Job to {args.out}; start it with: kubectl apply -f {args.out}", file=sys.stderr
    )
    return 0


COMMANDS = {
    "export-verl": cmd_export_verl,
    "k8s": cmd_k8s,
    "quantize": cmd_quantize,
    "export": cmd_export,
    "report": cmd_report,
    "watch": cmd_watch,
    "eval": cmd_eval,
    "plan": cmd_plan,
    "import-gguf": cmd_import_gguf,
    "train": cmd_train,
    "validate": cmd_validate,
    "presets": cmd_presets,
    "recipes": cmd_recipes,
    "doctor": cmd_doctor,
    "make-tiny-model": cmd_make_tiny,
    "prepare-gsm8k": cmd_prepare_gsm8k,
}


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:  # Hydra's bare KEY=VALUE (verl, TRL's scripts) is lite-verl's --set KEY=VALUE
        bare = [a for a in extra if "=" in a and not a.startswith("-")]
        hint = f"; config changes take one --set each: --set {bare[0]}" if bare else ""
        print(f"lite-verl: error: unrecognized arguments: {' '.join(extra)}{hint}", file=sys.stderr)
        return 2
    if not args.command:
        parser.print_help()
        return 0
    _quiet_libraries()
    from lite_verl.run.signals import StopRequest

    try:
        # train: a stop signal before the loop runs (model load, first validation) ends the command at once,
        # as an exception that cleans up (the loop then finishes its step in flight instead: run/signals.py)
        with StopRequest(defer=False) if args.command == "train" else contextlib.nullcontext():
            return COMMANDS[args.command](args)
    except UserError as e:
        print(f"lite-verl: error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print("lite-verl: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # the reader left (`lite-verl recipes | head`): stop quietly, as a pipe's writer does
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit's flush
        return 141  # 128 + SIGPIPE
    except OSError as e:
        from lite_verl.run.files import DISK_ERRORS, disk_error

        if e.errno not in DISK_ERRORS:
            raise
        print(f"lite-verl: error: {disk_error(e)}", file=sys.stderr)
        return 2
    except Exception as e:
        from lite_verl.run.signals import Interrupted

        if isinstance(e, Interrupted):
            print(f"lite-verl: {e}", file=sys.stderr)
            return e.exit_code
        raise


if __name__ == "__main__":
    raise SystemExit(main())
