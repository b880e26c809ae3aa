"""trainer.loggers: the config key, the one-line error for a missing tracker package, and a real CPU run
logged to TensorBoard, W&B (offline) and MLflow (file store in the run dir), read back, then resumed into the
same tracked runs."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import SMALL, assert_refused

from lite_verl.config import load_config
from lite_verl.run.trackers import Trackers, finite, flatten, logger_names


def require(package: str) -> None:
    """Skip (never pass silently) when an optional tracker package is absent."""
    if importlib.util.find_spec(package) is None:
        pytest.skip(f"{package} is not installed: pip install 'lite-verl[{package}]'")


def test_loggers_default_keeps_todays_outputs_and_tensorboard_switch():
    cfg = load_config("laptop", None, [])
    assert logger_names(cfg.trainer) == ("console", "jsonl", "tensorboard")
    off = load_config("laptop", None, ["trainer.tensorboard=false"])
    assert logger_names(off.trainer) == ("console", "jsonl")
    on = load_config("laptop", None, ["trainer.loggers=[jsonl]", "trainer.tensorboard=true"])
    assert logger_names(on.trainer) == ("jsonl", "tensorboard")
    one = load_config("laptop", None, ["trainer.loggers=[jsonl,mlflow]"])
    assert one.trainer.loggers == ("jsonl", "mlflow")


def test_loggers_refuse_unknown_names_and_a_run_without_jsonl():
    assert_refused(
        ["trainer.loggers=[jsonl,wandbb]"], r"trainer.loggers\[1\]='wandbb' must be .*did you mean 'wandb'"
    )
    assert_refused(["trainer.loggers=[console,tensorboard]"], "trainer.loggers must include jsonl")


def test_missing_tracker_package_is_one_line_before_the_run_dir(tmp_path, monkeypatch, capsys):
    from lite_verl import cli

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a)
    )
    run = tmp_path / "run"
    rc = cli.main(["train", "--run-dir", str(run), "--set", "trainer.loggers=[console,jsonl,wandb]"])
    err = capsys.readouterr().err.strip()
    assert rc != 0 and not run.exists()
    assert err.count("\n") == 0
    assert (
        "trainer.loggers=wandb needs the package 'wandb'" in err and "pip install 'lite-verl[wandb]'" in err
    )


def test_non_finite_values_and_the_summary_do_not_crash_a_tracker(tmp_path, monkeypatch):
    require("mlflow")
    from mlflow.tracking import MlflowClient

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    trackers = Trackers(tmp_path, ["tensorboard", "mlflow"], {"trainer": {"total_steps": 2}})
    trackers.log(1, {"a": float("nan"), "b": float("inf"), "c": 1.5, "flag": True, "name": "x"})
    trackers.log(2, {"a": float("nan")})  # nothing finite: nothing logged
    trackers.log_summary({"wall_s": 3.0, "tokens_per_s": None, "bill": [{"role": "train", "cost_usd": 0.5}]})
    assert set(trackers.active) == {"tensorboard", "mlflow"}  # none dropped
    trackers.finish()
    state = json.loads((tmp_path / "trackers.json").read_text())
    run = MlflowClient(state["mlflow"]["tracking_uri"]).get_run(state["mlflow"]["run_id"])
    assert run.data.metrics == {"c": 1.5, "flag": 1.0, "summary/wall_s": 3.0, "summary/bill/0/cost_usd": 0.5}
    assert run.data.params["trainer/total_steps"] == "2" and run.info.status == "FINISHED"
    assert finite({"x": math.nan, "y": 2}) == {"y": 2.0}
    assert flatten({"a": [{"b": 1}]}) == {"a/0/b": 1}


def test_samples_reach_the_trackers_as_tables(tmp_path, monkeypatch):
    """samples.jsonl rows -> an MLflow JSON table artifact and TensorBoard text; reward parts become columns."""
    require("mlflow")
    from mlflow.tracking import MlflowClient

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    rows = [{"step": 10, "sample": i, "prompt": "Echo: ab", "completion": f"a|b {i}", "reward": 1.0 - i,
             "reward_parts": {"rule": 1.0 - i, "length": 0.5}, "advantage": 0.7, "length": 4, "finish": "stop"}
            for i in range(2)]  # fmt: skip
    trackers = Trackers(tmp_path, ["tensorboard", "mlflow"], {})
    trackers.log_samples(10, rows)
    assert set(trackers.active) == {"tensorboard", "mlflow"}
    trackers.finish()
    state = json.loads((tmp_path / "trackers.json").read_text())
    client = MlflowClient(state["mlflow"]["tracking_uri"])
    local = client.download_artifacts(state["mlflow"]["run_id"], "samples/step_00000010.json", str(tmp_path))
    table = json.loads(Path(local).read_text())
    assert table["columns"] == ["step", "prompt", "completion", "reward", "reward/length", "reward/rule",
                                "advantage", "length", "finish"]  # fmt: skip
    assert table["data"][1] == [10, "Echo: ab", "a|b 1", 0.0, 0.5, 0.0, 0.7, 4, "stop"]
    text = _tensorboard_texts(tmp_path / "tb")
    assert len(text) == 1 and text[0][0] == 10 and "a\\|b 1" in text[0][1]


def _tensorboard_events(tb: Path):
    """Every event of the event files, read as TFRecords (length (8), crc (4), data, crc (4)) of
    tensorboardX's Event protobuf: no `tensorboard` package needed."""
    from tensorboardX.proto import event_pb2

    for f in sorted(tb.glob("events.out.tfevents.*")):
        data, pos = f.read_bytes(), 0
        while pos + 12 <= len(data):
            n = int.from_bytes(data[pos : pos + 8], "little")
            yield event_pb2.Event.FromString(data[pos + 12 : pos + 12 + n])
            pos += 16 + n


def _tensorboard_texts(tb: Path) -> list[tuple[int, str]]:
    """add_text's records: tag samples/text_summary, a string tensor."""
    return [(e.step, v.tensor.string_val[0].decode()) for e in _tensorboard_events(tb) for v in e.summary.value
            if v.tag == "samples/text_summary"]  # fmt: skip


def _wandb_records(path: Path):
    """The protobuf records of a .wandb file (wandb's leveldb-style log: a 7-byte header, 32 KiB blocks of
    chunks with crc32, length, type); wandb 0.31 has no Python reader of its own."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    pos, block, buf = 7, 32768, b""
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a chunk header is padding
            pos += block - pos % block
            continue
        length, kind = int.from_bytes(data[pos + 4 : pos + 6], "little"), data[pos + 6]
        buf += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # FULL, LAST
            record = pb.Record()
            record.ParseFromString(buf)
            yield record
            buf = b""


def _wandb_history(run_dir: Path) -> list[dict[str, float]]:
    rows = []
    for rec in _wandb_records(next(run_dir.glob("run-*.wandb"))):
        if rec.WhichOneof("record_type") == "history":
            rows.append({"/".join(i.nested_key) or i.key: json.loads(i.value_json) for i in rec.history.item})
    return rows


def _tensorboard_scalars(tb: Path, tag: str) -> list[tuple[int, float]]:
    try:
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    except ImportError:
        return [
            (e.step, v.simple_value) for e in _tensorboard_events(tb) for v in e.summary.value if v.tag == tag
        ]
    events = EventAccumulator(str(tb))
    events.Reload()
    return [(e.step, e.value) for e in events.Scalars(tag)]


def assert_series(points: list[tuple[int, float]], rewards: list[float]) -> None:
    """Steps 1, 2, ... with metrics.jsonl's values (float32 in TensorBoard, 6 decimals in the jsonl)."""
    assert [int(step) for step, _ in points] == list(range(1, len(rewards) + 1))
    assert [v for _, v in points] == pytest.approx(rewards, rel=1e-5, abs=1e-6)


def _train(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "PYTHONWARNINGS": "ignore",
        "WANDB_MODE": "offline",
        "WANDB_SILENT": "true",
        "MLFLOW_TRACKING_URI": "",  # the file store in the run dir
    }
    return subprocess.run(
        [sys.executable, "-m", "lite_verl", "train", *args],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )


@pytest.mark.slow
def test_trackers_read_back_and_resume_continues_the_same_runs(tmp_path, monkeypatch):
    require("wandb")
    require("mlflow")
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # to read the run dir's file store back here
    from mlflow.tracking import MlflowClient

    loggers = "trainer.loggers=[console,jsonl,tensorboard,wandb,mlflow]"
    names = ["trainer.project_name=gsm-sweep", "trainer.experiment_name=lr-1e-5"]  # verl's keys
    sets = [a for s in [*SMALL, "trainer.total_steps=2", loggers, *names] for a in ("--set", s)]
    first = _train(tmp_path, "--preset", "laptop", "--run-dir", "run", *sets)
    assert first.returncode == 0, first.stderr[-3000:]
    run = tmp_path / "run"
    rewards = [m["reward/mean"] for m in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())]
    state = json.loads((run / "trackers.json").read_text())

    # TensorBoard: its own reader when installed, else the event file's records via tensorboardX's protobuf
    assert_series(_tensorboard_scalars(run / "tb", "reward/mean"), rewards)

    # MLflow: the series and a config param
    client = MlflowClient(state["mlflow"]["tracking_uri"])
    run_id = state["mlflow"]["run_id"]
    series = client.get_metric_history(run_id, "reward/mean")
    assert_series([(m.step, m.value) for m in series], rewards)
    mlrun = client.get_run(run_id)
    assert mlrun.data.params["trainer/total_steps"] == "2" and mlrun.info.status == "FINISHED"
    assert (
        mlrun.info.run_name == "lr-1e-5"
        and client.get_experiment(mlrun.info.experiment_id).name == "gsm-sweep"
    )
    assert state["wandb"]["project"] == "gsm-sweep"
    assert "summary/wall_s" in mlrun.data.metrics

    # W&B offline: the run directory, its history and summary
    wandb_id = state["wandb"]["id"]
    (offline,) = (run / "wandb").glob(f"offline-run-*-{wandb_id}")
    history = _wandb_history(offline)
    assert_series([(h["step"], h["reward/mean"]) for h in history if "reward/mean" in h], rewards)
    tables = [h for h in history if "samples/_type" in h]  # samples.jsonl's last step (2) as a W&B Table
    assert [h["step"] for h in tables] == [2] and tables[0]["samples/_type"] == "table-file"
    assert client.list_artifacts(run_id, "samples")[0].path == "samples/step_00000002.json"

    # resume: the same MLflow run and W&B run id, steps appended
    again = _train(tmp_path, "--resume", "run", "--set", "trainer.total_steps=3")
    assert again.returncode == 0, again.stderr[-3000:]
    state2 = json.loads((run / "trackers.json").read_text())
    assert state2["mlflow"]["run_id"] == run_id and state2["wandb"]["id"] == wandb_id
    assert [m.step for m in client.get_metric_history(run_id, "reward/mean")] == [1, 2, 3]
    assert len(client.search_runs([mlrun.info.experiment_id])) == 1
    offline_runs = sorted((run / "wandb").glob("offline-run-*"))
    assert len(offline_runs) == 2 and all(p.name.endswith(f"-{wandb_id}") for p in offline_runs)
    resumed = [h["step"] for h in _wandb_history(offline_runs[-1]) if "reward/mean" in h]
    assert resumed == [3]
