"""The run directory: resolved config, environment, metrics, checkpoints, report.

    RUN/config.yaml          resolved config as the run started; `lite-verl train --config` it to re-run
    RUN/config_history.jsonl what each --resume --set changed: {time, step, changes: {key: {old, new}}}
    RUN/.lock                held by the process that owns the run (run/lock.py); names it
    RUN/env.json             package versions, devices, git commit, command line, the model's source
    RUN/metrics.jsonl        one JSON object per step (and per validation)
    RUN/samples.jsonl        a few completions every trainer.samples_every steps (run/samples.py)
    RUN/tb/                  TensorBoard events
    RUN/trackers.json        run ids of wandb / mlflow / trackio (trainer.loggers): a resume continues them
    RUN/checkpoints/step_N/  adapter, optimizer.pt, state.json (step, data position, RNG states)
    RUN/summary.json         final numbers and the bill

Every file is written atomically (temp file, fsync, rename); a checkpoint directory appears only
when complete, and its state.json lists its files with their sizes, so that one damaged afterwards
(a truncated or missing file) is skipped for the one before it. The run's config is config.yaml with
config_history.jsonl's changes applied in order (load_run_config).
"""

from __future__ import annotations

import contextlib
import json
import platform
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch
import yaml

from lite_verl.config import Config, load_config, read_yaml, to_dict
from lite_verl.errors import UserError, first_line
from lite_verl.run.files import (
    append_jsonl,
    atomic_directory,
    atomic_write_text,
    drop_rows_after,
    free_gib,
    read_jsonl,
)
from lite_verl.run.lock import LOCK_NAME, RunDirBusy, RunLock

HISTORY = "config_history.jsonl"


def default_run_dir(preset: str, recipe: str = "") -> Path:
    """runs/<time>-[<recipe>-]<preset>"""
    names = [Path(n).stem for n in (recipe, preset) if n]
    return Path("runs") / "-".join([time.strftime("%Y%m%d-%H%M%S"), *names])


def _git_commit() -> str:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5, cwd=Path(__file__).parent
        )
        return out.stdout.strip() if out.returncode == 0 else ""
    except (OSError, subprocess.SubprocessError):
        return ""


def environment() -> dict[str, Any]:
    from importlib import metadata

    from lite_verl.device import describe_devices

    versions = {}
    for pkg in (
        "lite-verl",
        "torch",
        "transformers",
        "peft",
        "tokenizers",
        "vllm",
        "bitsandbytes",
        "deepspeed",
    ):
        with contextlib.suppress(metadata.PackageNotFoundError):
            versions[pkg] = metadata.version(pkg)
    return {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "packages": versions,
        "devices": describe_devices(),
        "git_commit": _git_commit(),
        "argv": sys.argv,
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


class RunDir:
    def __init__(self, path: Path) -> None:
        self.path = Path(path).absolute()
        self.made = False  # create() made the directory (else it was there, empty)

    @property
    def checkpoints(self) -> Path:
        return self.path / "checkpoints"

    def lock(self) -> RunLock:
        """The run's ownership lock, not yet taken: `with run.lock():` around a resume."""
        return RunLock(self.path)

    def check_new(self) -> None:
        """Before a new run prepares anything: the directory is absent or empty, and nobody holds it."""
        if not self.path.exists():
            return
        if not self.path.is_dir():
            raise UserError(f"--run-dir {self.path} is a file; give a directory that is absent or empty")
        if self._has_content():
            self.lock().check_free()  # a run in progress: say whose
            path = self.path
            raise UserError(
                f"--run-dir {path} already exists and is not empty; pick another or use --resume {path}"
            )

    def _has_content(self) -> bool:
        return any(p.name != LOCK_NAME for p in self.path.iterdir())

    def create(self, cfg: Config) -> RunLock:
        """Make the directory (an existing empty one will do), take its lock, write config.yaml and env.json.
        -> the held lock: release it (or `with` it) when the run ends."""
        try:  # made here only if this call created it (two processes racing: one of them)
            self.path.mkdir(parents=True)
            self.made = True
        except FileExistsError:
            self.made = False
        try:
            lock = self.lock().acquire()  # another process that got here first: RunDirBusy, nothing written
        except RunDirBusy:  # its directory now, even if this call made it: touch nothing
            self.made = False
            raise
        except BaseException:  # a lock file the disk refused
            if self.made:
                shutil.rmtree(self.path, ignore_errors=True)
            raise
        if self._has_content():  # filled since check_new, by a run that has ended already: not ours
            self.made = False
            lock.release()
            raise UserError(f"--run-dir {self.path} is no longer empty; pick another")
        try:
            self.write_config(cfg)
            from lite_verl.model.load import model_provenance

            # the model's source: a Hub id's commit, to rerun exactly it
            env = {**environment(), "model": model_provenance(cfg.model)}
            atomic_write_text(self.path / "env.json", json.dumps(env, indent=2))
        except BaseException:  # a full or read-only disk, a signal: no half-made run directory is left
            self.discard()
            lock.release()
            raise
        return lock

    def discard(self) -> None:
        """Remove what this run wrote: the directory if create() made it, else only its contents."""
        if self.made:
            shutil.rmtree(self.path, ignore_errors=True)
            return
        for p in self.path.iterdir():
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p, ignore_errors=True)
            else:
                p.unlink(missing_ok=True)

    def write_config(self, cfg: Config) -> None:
        header = "# Resolved lite-verl config. Re-run: lite-verl train --config <this file>\n"
        atomic_write_text(self.path / "config.yaml", header + yaml.safe_dump(to_dict(cfg), sort_keys=False))

    def append_history(self, changes: dict[str, tuple[Any, Any]], step: int | None) -> None:
        """One row of config_history.jsonl: what a resume from checkpoint `step` changed (config.yaml stays
        as the run started)."""
        row = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "step": step,
            "changes": {k: {"old": old, "new": new} for k, (old, new) in changes.items()},
        }
        append_jsonl(self.path / HISTORY, [row])

    # --- checkpoints -----------------------------------------------------------------------------
    def latest_checkpoint(self, quiet: bool = False) -> Path | None:
        """The newest complete checkpoint; a damaged one (checkpoint_problem) is skipped, with a warning
        unless `quiet`, for the one before it. Only reads: `eval`, `export` and `report` may look at a run
        that is still saving (its temp dir .step_* is not a checkpoint)."""
        if not self.checkpoints.is_dir():
            return None
        for ckpt in sorted((p for p in self.checkpoints.glob("step_*") if p.is_dir()), reverse=True):
            problem = checkpoint_problem(ckpt)
            if not problem:
                return ckpt
            if not quiet:
                warning = f"lite-verl: warning: skipping checkpoint {ckpt}: {problem}; using an earlier one"
                print(warning, file=sys.stderr)
        return None

    def remove_stale_saves(self) -> None:
        """Temp dirs of a save that was interrupted (.step_*): called by the process that owns the run."""
        for stale in self.checkpoints.glob(".step_*"):
            shutil.rmtree(stale, ignore_errors=True)

    def save_checkpoint(self, step: int, backend, state: dict[str, Any], keep: int) -> Path:
        """Write into a temp dir, fsync, rename to step_N; then drop all but the last `keep`."""
        final = self.checkpoints / f"step_{step:08d}"
        try:
            with atomic_directory(final) as tmp:
                backend.save(tmp)
                torch.save(rng_state(), tmp / "rng.pt")
                files = {str(p.relative_to(tmp)): p.stat().st_size for p in tmp.rglob("*") if p.is_file()}
                state = {"step": step, **state, "files": files}  # what checkpoint_problem checks
                atomic_write_text(tmp / "state.json", json.dumps(state, indent=2))
        except (OSError, RuntimeError) as e:  # a full disk: torch.save says "unexpected pos ..."
            free = free_gib(self.checkpoints) or 0.0
            reason = first_line(e, 200, last=True)
            raise UserError(
                f"the checkpoint of step {step} could not be written to {self.checkpoints} ({reason}); "
                f"{free:.1f} GiB free there: free space or use --run-dir on a bigger disk "
                "(trainer.keep_checkpoints=0 writes none: no resume, no export)"
            ) from None
        done = sorted(p for p in self.checkpoints.glob("step_*") if p.is_dir())
        for old in done[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
        return final


def checkpoint_problem(ckpt: Path) -> str:
    """Why `ckpt` cannot be resumed from, or '' when it can: state.json unreadable, or a file it lists
    missing or of another size (a truncated write, a deleted file). Sizes only: a flipped byte passes."""
    try:
        state = json.loads((ckpt / "state.json").read_text())
        int(state["step"])
    except (OSError, ValueError, KeyError, TypeError):
        return "its state.json is missing or unreadable"
    files = state.get("files")
    if not isinstance(files, dict):  # written before checkpoints listed their files
        return "" if (ckpt / "rng.pt").is_file() else "its rng.pt is missing"
    for name, size in files.items():
        try:
            actual = (ckpt / name).stat().st_size
        except OSError:
            return f"its {name} is missing"
        if actual != size:
            return f"its {name} has {actual} bytes, not the {size} written"
    return ""


def rng_state() -> dict[str, Any]:
    import numpy as np

    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    import numpy as np

    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


class MetricsLog:
    """metrics.jsonl, and each row to the trackers of trainer.loggers (run/trackers.py). On resume, rows after
    the checkpoint's step are dropped."""

    def __init__(self, run: Path, cfg: Config, resume_step: int | None = None) -> None:
        self.file = run / "metrics.jsonl"
        if resume_step is not None:
            drop_rows_after(self.file, resume_step)
        from lite_verl.run.trackers import Trackers, logger_names

        self.console = "console" in logger_names(cfg.trainer)
        self.trackers = Trackers(run, logger_names(cfg.trainer), to_dict(cfg))

    def log(self, step: int, metrics: dict[str, float]) -> None:
        row = {"step": step, **{k: (round(v, 6) if isinstance(v, float) else v) for k, v in metrics.items()}}
        append_jsonl(self.file, [row])
        self.trackers.log(step, metrics)

    def close(self, summary: dict[str, Any] | None = None, failed: bool = False) -> None:
        """Finish the trackers (every exit path), the run's summary logged first."""
        if summary is not None:
            self.trackers.log_summary(summary)
        self.trackers.finish(failed)


def read_metrics(run: Path) -> list[dict[str, Any]]:
    """Rows of metrics.jsonl; a last line cut short by a kill is skipped."""
    return read_jsonl(Path(run) / "metrics.jsonl")


def metrics_summary(run: Path) -> dict[str, Any]:
    """What RUN/metrics.jsonl says of a run, finished or not: steps, train and validation reward at the start
    and the end, tokens/s, the trainer's peak (summary.json adds the wall time, the bill, the checkpoint)."""
    logged = read_metrics(run)
    rows = [m for m in logged if "reward/mean" in m]
    vals = [m for m in logged if "val/reward_mean" in m]
    k = max(1, -(-len(rows) // 10))  # the first and last 10% of steps, at least one
    return {
        "run_dir": str(run),
        "steps": len(rows),
        "reward_first_10pct": sum(m["reward/mean"] for m in rows[:k]) / k if rows else None,
        "reward_last_10pct": sum(m["reward/mean"] for m in rows[-k:]) / k if rows else None,
        "val_reward_start": vals[0]["val/reward_mean"] if vals else None,
        "val_reward_end": vals[-1]["val/reward_mean"] if vals else None,
        "val_acc_start": vals[0].get("val/acc") if vals else None,
        "val_acc_end": vals[-1].get("val/acc") if vals else None,
        "tokens_per_s": sum(m["perf/tokens_per_s"] for m in rows) / len(rows) if rows else None,
        "train_peak_gib": max((m.get("perf/train_peak_gib", 0.0) for m in rows), default=0.0),
    }


def run_config_file(run_dir: Path) -> Path:
    """RUN/config.yaml; a directory without one is not a run."""
    cfg_file = Path(run_dir) / "config.yaml"
    if not cfg_file.is_file():
        what = "does not exist" if not Path(run_dir).exists() else "has no config.yaml"
        raise UserError(f"{run_dir} {what}: it is not a run directory; give one made by lite-verl train")
    return cfg_file


def read_history(run_dir: Path) -> list[dict[str, Any]]:
    """Rows of config_history.jsonl, oldest first; a last line cut short by a kill is skipped."""
    f = Path(run_dir) / HISTORY
    rows = []
    for line in f.read_text().splitlines() if f.is_file() else []:
        with contextlib.suppress(json.JSONDecodeError):
            row = json.loads(line)
            if isinstance(row, dict) and isinstance(row.get("changes"), dict):
                rows.append(row)
    return rows


def run_config_layer(run_dir: Path) -> dict[str, Any]:
    """RUN/config.yaml as a config layer, with the changes of config_history.jsonl applied in order."""
    data = read_yaml(run_config_file(run_dir), "config file")
    for row in read_history(run_dir):
        for key, change in row["changes"].items():
            *sections, name = key.split(".")
            node = data
            for s in sections:
                node = node.setdefault(s, {})
            node[name] = change["new"]
    return data


def load_run_config(run_dir: Path, overrides: list[str]) -> Config:
    """The run's config (config.yaml + config_history.jsonl) with --set overrides (resume, report, export)."""
    return load_config(None, run_config_layer(run_dir), overrides)
