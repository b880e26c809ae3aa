"""The run directory: resolved config, environment, metrics, checkpoints, report.

    RUN/config.yaml          resolved config; `lite-verl train --config RUN/config.yaml` re-runs it
    RUN/env.json             package versions, devices, git commit, command line, the model's source
    RUN/metrics.jsonl        one JSON object per step (and per validation)
    RUN/samples.jsonl        a few completions every trainer.samples_every steps (run/samples.py)
    RUN/tb/                  TensorBoard events
    RUN/checkpoints/step_N/  adapter, optimizer.pt, state.json (step, data position, RNG states)
    RUN/summary.json         final numbers and the bill

Every file is written atomically (temp file, fsync, rename); a checkpoint directory appears only
when complete.
"""

from __future__ import annotations

import contextlib
import json
import math
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

from lite_verl.config import Config, load_config, to_dict
from lite_verl.errors import UserError
from lite_verl.run.files import append_jsonl, atomic_directory, atomic_write_text, drop_rows_after, read_jsonl


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

    @property
    def checkpoints(self) -> Path:
        return self.path / "checkpoints"

    def create(self, cfg: Config) -> None:
        self.path.mkdir(parents=True, exist_ok=False)
        self.write_config(cfg)
        from lite_verl.model.load import model_provenance

        env = {**environment(), "model": model_provenance(cfg.model)}  # a Hub id's commit: rerun exactly it
        atomic_write_text(self.path / "env.json", json.dumps(env, indent=2))

    def write_config(self, cfg: Config) -> None:
        header = "# Resolved lite-verl config. Re-run: lite-verl train --config <this file>\n"
        atomic_write_text(self.path / "config.yaml", header + yaml.safe_dump(to_dict(cfg), sort_keys=False))

    # --- checkpoints -----------------------------------------------------------------------------
    def latest_checkpoint(self) -> Path | None:
        """The newest complete checkpoint. Only reads: `eval`, `export` and `report` may look at a run
        that is still saving (its temp dir .step_* is not a checkpoint)."""
        if not self.checkpoints.is_dir():
            return None
        done = sorted(p for p in self.checkpoints.glob("step_*") if (p / "state.json").is_file())
        return done[-1] if done else None

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
                atomic_write_text(tmp / "state.json", json.dumps({"step": step, **state}, indent=2))
        except (OSError, RuntimeError) as e:  # a full disk: torch.save says "unexpected pos ..."
            free = shutil.disk_usage(self.checkpoints).free / 2**30
            reason = (str(e).strip().splitlines() or [type(e).__name__])[-1][:200]
            raise UserError(
                f"the checkpoint of step {step} could not be written to {self.checkpoints} ({reason}); "
                f"{free:.1f} GiB free there: free space or use --run-dir on a bigger disk "
                "(trainer.keep_checkpoints=0 writes none: no resume, no export)"
            ) from None
        done = sorted(p for p in self.checkpoints.glob("step_*") if p.is_dir())
        for old in done[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
        return final


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
    """metrics.jsonl (+ TensorBoard). On resume, rows after the checkpoint's step are dropped."""

    def __init__(self, run: Path, tensorboard: bool, resume_step: int | None = None) -> None:
        self.file = run / "metrics.jsonl"
        if resume_step is not None:
            drop_rows_after(self.file, resume_step)
        self.tb = None
        if tensorboard:
            try:
                from tensorboardX import SummaryWriter

                self.tb = SummaryWriter(str(run / "tb"))
            except ImportError:  # pragma: no cover - a core dependency
                self.tb = None

    def log(self, step: int, metrics: dict[str, float]) -> None:
        row = {"step": step, **{k: (round(v, 6) if isinstance(v, float) else v) for k, v in metrics.items()}}
        append_jsonl(self.file, [row])
        if self.tb is not None:
            for k, v in metrics.items():
                if isinstance(v, (int, float)) and math.isfinite(v):
                    self.tb.add_scalar(k, v, step)

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()


def read_metrics(run: Path) -> list[dict[str, Any]]:
    """Rows of metrics.jsonl; a last line cut short by a kill is skipped."""
    return read_jsonl(Path(run) / "metrics.jsonl")


def load_run_config(run_dir: Path, overrides: list[str]) -> Config:
    """RUN/config.yaml with --set overrides (resume, report, export)."""
    cfg_file = Path(run_dir) / "config.yaml"
    if not cfg_file.is_file():
        raise UserError(
            f"--resume {run_dir}: no config.yaml there; give a run directory made by lite-verl train"
        )
    return load_config(None, str(cfg_file), overrides)
