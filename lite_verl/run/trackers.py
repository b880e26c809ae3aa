"""Experiment trackers: where each step's metrics go besides RUN/metrics.jsonl (trainer.loggers).

    console      the progress bar (trainer.progress=false hides it too)
    jsonl        RUN/metrics.jsonl, always written by rundir.MetricsLog (required: summary, report, resume)
    tensorboard  RUN/tb/ (tensorboardX, a core dependency)
    wandb        Weights & Biases; WANDB_MODE=offline works without network (RUN/wandb/offline-run-*)
    mlflow       MLflow; MLFLOW_TRACKING_URI, else a file store in RUN/mlruns (MLFLOW_ALLOW_FILE_STORE set)
    trackio      Trackio (Hugging Face's local-first tracker); TRACKIO_DIR says where it keeps its database

A step's sample completions (RUN/samples.jsonl's rows) go to each tracker as a table: a W&B Table, an MLflow
JSON table artifact (samples/step_N.json), a Trackio Table, TensorBoard text. Each tracker is imported only when named. The run ids of wandb, mlflow and trackio are kept in
RUN/trackers.json so that `lite-verl train --resume RUN` continues the same tracked run. Every tracker gets
the resolved config once, each step's metrics (finite numbers only), the summary at the end, and `finish`
on every exit path. A tracker that fails while logging warns once and is dropped: training goes on.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import re
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from lite_verl.config.schema import TrainerConfig
from lite_verl.errors import MissingDependency, UserError, first_line
from lite_verl.run.files import atomic_write_text

# logger -> (module to import, pip extra of lite-verl)
PACKAGES = {"wandb": ("wandb", "wandb"), "mlflow": ("mlflow", "mlflow"), "trackio": ("trackio", "trackio")}
PROJECT = "lite-verl"  # W&B project, MLflow experiment, Trackio project unless trainer.project_name or their env vars say otherwise


class Tracker(Protocol):
    def log(self, step: int, metrics: Mapping[str, float]) -> None: ...

    def log_samples(self, step: int, columns: list[str], rows: list[list[Any]]) -> None: ...

    def log_config(self, config: dict[str, Any]) -> None: ...

    def log_summary(self, summary: Mapping[str, float]) -> None: ...

    def finish(self, failed: bool = False) -> None: ...


def logger_names(tr: TrainerConfig) -> tuple[str, ...]:
    """trainer.loggers with the old trainer.tensorboard switch applied (true adds it, false removes it)."""
    names = list(dict.fromkeys(tr.loggers))
    if tr.tensorboard is True and "tensorboard" not in names:
        names.append("tensorboard")
    if tr.tensorboard is False:
        names = [n for n in names if n != "tensorboard"]
    return tuple(names)


def require_trackers(tr: TrainerConfig) -> None:
    """A named tracker whose package is missing: one line with the install command."""
    for name in logger_names(tr):
        if name in PACKAGES and importlib.util.find_spec(PACKAGES[name][0]) is None:
            module, extra = PACKAGES[name]
            raise MissingDependency(module, extra, f"trainer.loggers={name}")


def sample_table(rows: Sequence[Mapping[str, Any]]) -> tuple[list[str], list[list[Any]]]:
    """samples.jsonl rows as one table: fixed columns, then one `reward/<part>` column per reward function."""
    parts = sorted({k for r in rows for k in (r.get("reward_parts") or {})})
    columns = ["step", "prompt", "completion", "reward", *(f"reward/{p}" for p in parts), "advantage", "length",
               "finish"]  # fmt: skip
    table = [[r.get("step"), r.get("prompt"), r.get("completion"), r.get("reward"),
              *((r.get("reward_parts") or {}).get(p) for p in parts), r.get("advantage"), r.get("length"),
              r.get("finish")] for r in rows]  # fmt: skip
    return columns, table


def markdown_table(columns: list[str], rows: list[list[Any]]) -> str:
    def cell(v: Any) -> str:
        text = f"{v:.4g}" if isinstance(v, float) else str(v)
        return text.replace("|", "\\|").replace("\n", "<br>")

    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    return "\n".join(lines + ["| " + " | ".join(cell(v) for v in r) + " |" for r in rows])


def finite(metrics: Mapping[str, Any]) -> dict[str, float]:
    """The numbers of a row that a tracker can take: bools as 0/1, NaN, inf and non-numbers dropped."""
    out = {}
    for k, v in metrics.items():
        if isinstance(v, (bool, int, float)) and not isinstance(v, complex) and math.isfinite(float(v)):
            out[k] = float(v)
    return out


def flatten(data: Any, prefix: str = "") -> dict[str, Any]:
    """Nested dicts and lists as one level of `a/b/0` keys (the summary's bill is a list of rows)."""
    if isinstance(data, Mapping):
        items: Sequence[tuple[Any, Any]] = list(data.items())
    elif isinstance(data, (list, tuple)):
        items = list(enumerate(data))
    else:
        return {prefix.rstrip("/"): data}
    out: dict[str, Any] = {}
    for k, v in items:
        out.update(flatten(v, f"{prefix}{k}/"))
    return out


class _State:
    """RUN/trackers.json: the run id of each tracker, for a resume."""

    def __init__(self, run: Path) -> None:
        self.file = run / "trackers.json"
        try:
            self.data: dict[str, dict[str, str]] = json.loads(self.file.read_text())
        except (OSError, ValueError):
            self.data = {}

    def get(self, name: str) -> dict[str, str]:
        return dict(self.data.get(name, {}))

    def put(self, name: str, value: dict[str, str]) -> None:
        self.data[name] = value
        atomic_write_text(self.file, json.dumps(self.data, indent=2))


class TensorBoardTracker:
    def __init__(self, run: Path) -> None:
        try:
            from tensorboardX import SummaryWriter
        except (
            ImportError
        ):  # torch's own writer (needs the `tensorboard` package) writes the same event files
            from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(str(run / "tb"))

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        for k, v in metrics.items():
            self.writer.add_scalar(k, v, step)

    def log_samples(self, step: int, columns: list[str], rows: list[list[Any]]) -> None:
        self.writer.add_text("samples", markdown_table(columns, rows), step)

    def log_config(self, config: dict[str, Any]) -> None:
        pass  # RUN/config.yaml has it; TensorBoard's hparams tab needs a metric per config, not worth it

    def log_summary(self, summary: Mapping[str, float]) -> None:
        pass

    def finish(self, failed: bool = False) -> None:
        self.writer.close()


def _names(config: dict[str, Any], env: str, run: Path) -> tuple[str, str]:
    """(project, run name): trainer.project_name, else the tracker's environment variable, else lite-verl;
    trainer.experiment_name, else the run directory's name."""
    tr = config.get("trainer", {})
    return tr.get("project_name") or os.environ.get(env, PROJECT), tr.get("experiment_name") or run.name


class WandbTracker:
    def __init__(self, run: Path, state: _State, config: dict[str, Any]) -> None:
        import wandb

        saved = state.get("wandb")
        project, name = _names(config, "WANDB_PROJECT", run)
        self.run = wandb.init(
            project=saved.get("project") or project,
            name=name,
            id=saved.get("id"),  # None: a new run, its id kept below
            resume="allow",  # a resume continues the same run
            dir=str(run),
            config=config,
            allow_val_change=True,  # --resume --set trainer.total_steps=N changes the config
        )
        state.put("wandb", {"id": self.run.id, "project": str(self.run.project)})
        self.run.define_metric("step")
        self.run.define_metric("*", step_metric="step")  # the x axis is the training step, resumes included

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        self.run.log({**metrics, "step": step})

    def log_samples(self, step: int, columns: list[str], rows: list[list[Any]]) -> None:
        import wandb

        self.run.log(
            {"samples": wandb.Table(columns=columns, data=rows, allow_mixed_types=True), "step": step}
        )

    def log_config(self, config: dict[str, Any]) -> None:
        self.run.config.update(config, allow_val_change=True)

    def log_summary(self, summary: Mapping[str, float]) -> None:
        self.run.summary.update({f"summary/{k}": v for k, v in summary.items()})

    def finish(self, failed: bool = False) -> None:
        self.run.finish(exit_code=1 if failed else 0)


_MLFLOW_BAD = re.compile(r"[^\w\-. :/]")  # MLflow keys: alphanumerics, _ - . space : /


class MlflowTracker:
    def __init__(self, run: Path, state: _State, config: dict[str, Any]) -> None:
        import mlflow

        self.mlflow = mlflow
        saved = state.get("mlflow")
        uri = os.environ.get("MLFLOW_TRACKING_URI") or saved.get("tracking_uri") or (run / "mlruns").as_uri()
        if uri.startswith("file:"):  # MLflow 3 refuses its file store (maintenance mode) unless told
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        mlflow.set_tracking_uri(uri)
        if saved.get("run_id"):
            active = mlflow.start_run(run_id=saved["run_id"])  # a resume reopens the same run
        else:
            experiment, name = _names(config, "MLFLOW_EXPERIMENT_NAME", run)
            mlflow.set_experiment(experiment)
            active = mlflow.start_run(run_name=name)
        self.run_id = active.info.run_id
        state.put("mlflow", {"run_id": self.run_id, "tracking_uri": uri})
        self.log_config(config)

    @staticmethod
    def _key(k: str) -> str:
        return _MLFLOW_BAD.sub("_", k)

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        self.mlflow.log_metrics({self._key(k): v for k, v in metrics.items()}, step=step)

    def log_samples(self, step: int, columns: list[str], rows: list[list[Any]]) -> None:
        """The table in the split JSON layout mlflow.log_table writes (that one needs pandas; -skinny has none)."""
        self.mlflow.log_dict({"columns": columns, "data": rows}, f"samples/step_{step:08d}.json")

    def log_config(self, config: dict[str, Any]) -> None:
        """Params once each (MLflow refuses a changed value: a resume's --set lands in config.json only)."""
        have = self.mlflow.get_run(self.run_id).data.params
        params = {self._key(k): str(v)[:500] for k, v in flatten(config).items()}
        new = {k: v for k, v in params.items() if k not in have}
        if new:
            self.mlflow.log_params(new)
        self.mlflow.log_dict(config, "config.json")

    def log_summary(self, summary: Mapping[str, float]) -> None:
        self.mlflow.log_metrics({self._key(f"summary/{k}"): v for k, v in summary.items()})

    def finish(self, failed: bool = False) -> None:
        self.mlflow.end_run(status="FAILED" if failed else "FINISHED")


class TrackioTracker:
    def __init__(self, run: Path, state: _State, config: dict[str, Any]) -> None:
        import trackio

        saved = state.get("trackio")
        project, name = _names(config, "TRACKIO_PROJECT", run)
        project, name = saved.get("project") or project, saved.get("name") or name
        self.run = trackio.init(project=project, name=name, config=config, resume="allow", embed=False)
        state.put("trackio", {"project": project, "name": name})
        self.trackio = trackio

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        self.trackio.log(dict(metrics), step=step)

    def log_samples(self, step: int, columns: list[str], rows: list[list[Any]]) -> None:
        self.trackio.log(
            {"samples": self.trackio.Table(columns=columns, data=rows, allow_mixed_types=True)}, step=step
        )

    def log_config(self, config: dict[str, Any]) -> None:
        pass  # given to trackio.init

    def log_summary(self, summary: Mapping[str, float]) -> None:
        self.trackio.log({f"summary/{k}": v for k, v in summary.items()})

    def finish(self, failed: bool = False) -> None:
        self.trackio.finish()


class Trackers:
    """The trackers of trainer.loggers (all but console and jsonl), fed together."""

    def __init__(self, run: Path, names: Sequence[str], config: dict[str, Any]) -> None:
        self.active: dict[str, Tracker] = {}
        state = _State(run)
        makers = {"wandb": WandbTracker, "mlflow": MlflowTracker, "trackio": TrackioTracker}
        try:
            for name in names:
                if name == "tensorboard":
                    self.active[name] = TensorBoardTracker(run)
                elif name in makers:
                    module, extra = PACKAGES[name]
                    if importlib.util.find_spec(module) is None:
                        raise MissingDependency(module, extra, f"trainer.loggers={name}")
                    try:
                        self.active[name] = makers[name](run, state, config)
                    except Exception as e:  # no API key, a tracking server that does not answer, ...
                        line = first_line(e, 300)
                        raise UserError(f"trainer.loggers={name}: could not start the run ({line})") from e
        except BaseException:
            self.finish(failed=True)
            raise

    def _each(self, what: str, *args: Any) -> None:
        for name, tracker in list(self.active.items()):
            try:
                getattr(tracker, what)(*args)
            except Exception as e:  # a tracker's failure never stops training
                warnings.warn(
                    f"trainer.loggers={name}: {what} failed ({e}); no more logging to it", stacklevel=2
                )
                del self.active[name]

    def log(self, step: int, metrics: Mapping[str, Any]) -> None:
        row = finite(metrics)
        if row:
            self._each("log", step, row)

    def log_config(self, config: dict[str, Any]) -> None:
        self._each("log_config", config)

    def log_samples(self, step: int, rows: Sequence[Mapping[str, Any]]) -> None:
        """RUN/samples.jsonl's rows of one step, as a table to each tracker."""
        if rows and self.active:
            self._each("log_samples", step, *sample_table(rows))

    def log_summary(self, summary: Mapping[str, Any]) -> None:
        """The summary's numbers (the bill's rows flattened: bill/0/cost_usd, ...)."""
        self._each("log_summary", finite(flatten(summary)))

    def finish(self, failed: bool = False) -> None:
        for name, tracker in list(self.active.items()):
            try:
                tracker.finish(failed)
            except Exception as e:
                warnings.warn(f"trainer.loggers={name}: finish failed ({e})", stacklevel=2)
        self.active.clear()
