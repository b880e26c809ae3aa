"""`lite-verl k8s`: the manifests validate against the Kubernetes schema (the kubernetes client's models,
strictly: a field they do not know or a wrong type fails), the Job has what a used-and-burnt training
Job needs, the pod's config is this machine's with paths and GPU ids rewritten, and the entrypoint
starts, resumes and stops as it should.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from lite_verl.cli import main
from lite_verl.config import from_dict
from lite_verl.tools.k8s import job_name, run_script

IMAGE = "registry.example.com/team/lite-verl:0.1"


def k8s(tmp_path: Path, *args: str) -> tuple[dict, dict, str]:
    """(ConfigMap, Job, the YAML text) written by `lite-verl k8s ... --out FILE`."""
    out = tmp_path / "job.yaml"
    assert main(["k8s", *args, "--image", IMAGE, "--out", str(out)]) == 0
    text = out.read_text()
    config_map, job = yaml.safe_load_all(text)
    return config_map, job, text


def strictly_valid(doc: dict, kind: str) -> None:
    """Deserialize into the client's model (required fields, types) and back: an unknown field is dropped
    on the way, so the round trip must give the document unchanged."""
    kubernetes = pytest.importorskip("kubernetes", reason="pip install kubernetes (in the `test` extra)")
    client = kubernetes.client.ApiClient()
    try:
        obj = client.deserialize(json.dumps(doc), kind, None)
    except TypeError:  # clients before 35 take a response object
        obj = client.deserialize(type("R", (), {"data": json.dumps(doc)})(), kind)
    assert client.sanitize_for_serialization(obj) == doc


def pod_config(config_map: dict):
    return from_dict(yaml.safe_load(config_map["data"]["config.yaml"]))


def test_gpu_job_validates_and_has_what_a_training_job_needs(tmp_path, tiny_dir):
    (tmp_path / "rw.py").write_text("def score(*a, **k):\n    return 1.0\n")
    sets = ["--set", f"model.path={tiny_dir}", "--set", f"reward.function={tmp_path / 'rw.py'}:score"]
    config_map, job, text = k8s(tmp_path, "--preset", "a10x4", *sets, "--backoff-limit", "5", "--ttl", "600")
    strictly_valid(config_map, "V1ConfigMap")
    strictly_valid(job, "V1Job")
    spec, pod = job["spec"], job["spec"]["template"]["spec"]
    assert (
        job["apiVersion"] == "batch/v1"
        and job["kind"] == "Job"
        and job["metadata"]["name"] == "lite-verl-a10x4"
    )
    assert spec["backoffLimit"] == 5 and spec["ttlSecondsAfterFinished"] == 600
    assert pod["restartPolicy"] == "Never"
    (container,) = pod["containers"]
    assert container["image"] == IMAGE and container["resources"]["limits"] == {"nvidia.com/gpu": "5"}
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert mounts == {"config": "/etc/lite-verl", "dshm": "/dev/shm", "models": "/models", "runs": "/runs"}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["models"]["persistentVolumeClaim"]["claimName"] == "lite-verl-models"
    assert volumes["config"]["configMap"]["name"] == config_map["metadata"]["name"]
    assert volumes["dshm"]["emptyDir"]["medium"] == "Memory"
    rule = spec["podFailurePolicy"]["rules"][0]
    assert rule["action"] == "FailJob" and rule["onExitCodes"]["values"] == [2]  # bad input: no retry
    cfg = pod_config(config_map)
    assert cfg.model.path == f"/models/{tiny_dir.name}" and cfg.reward.device == "cuda:4"
    assert cfg.reward.function == "/etc/lite-verl/reward_fn.py:score"
    assert config_map["data"]["reward_fn.py"] == (tmp_path / "rw.py").read_text()
    assert f"copy {tiny_dir} (model.path)" in text  # the header says what goes onto which volume


def test_gpu_ids_are_renumbered_as_the_pod_sees_them(tmp_path, tiny_dir):
    (tmp_path / "c.yaml").write_text(
        f"model: {{path: {tiny_dir}}}\nrollout: {{engine: vllm, gpus: [2]}}\ntrain: {{gpus: [3]}}\n"
        f"reward: {{model: {tiny_dir}, device: 'cuda:5'}}\n"
        "cost: {gpu_models: [A, B, C, D, E, F], price_per_hour: {A: 1.0, B: 1.0, C: 2.0, D: 3.0, E: 1.0, F: 4.0}}\n"
    )
    config_map, job, text = k8s(tmp_path, str(tmp_path / "c.yaml"))
    strictly_valid(job, "V1Job")
    assert job["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "3"
    cfg = pod_config(config_map)
    assert cfg.rollout.gpus == (0,) and cfg.train.gpus == (1,) and cfg.reward.device == "cuda:2"
    assert cfg.cost.gpu_models == ("C", "D", "F") and cfg.reward.model == cfg.model.path
    assert job["metadata"]["name"] == "lite-verl-c" and text.count("# copy") + text.count("#   copy") == 1


def test_cpu_job_with_data_files_and_host_paths(tmp_path):
    row = {"prompt": [{"role": "user", "content": "hi"}], "data_source": "lite_verl/echo",
           "reward_model": {"ground_truth": "a"}}  # fmt: skip
    (tmp_path / "train.jsonl").write_text(json.dumps(row) + "\n")
    args = ["--preset", "laptop", "--set", f"data.train_files=[{tmp_path / 'train.jsonl'}]",
            "--data-host-path", "/srv/data", "--runs-pvc", "my-runs", "--namespace", "ml"]  # fmt: skip
    config_map, job, text = k8s(tmp_path, *args)
    strictly_valid(config_map, "V1ConfigMap")
    strictly_valid(job, "V1Job")
    (container,) = job["spec"]["template"]["spec"]["containers"]
    assert "resources" not in container  # a CPU config asks for no GPU
    volumes = {v["name"]: v for v in job["spec"]["template"]["spec"]["volumes"]}
    assert "models" not in volumes  # tiny:qwen2 is made in the pod
    assert volumes["data"]["hostPath"]["path"] == "/srv/data"
    assert volumes["runs"]["persistentVolumeClaim"]["claimName"] == "my-runs"
    assert job["metadata"]["namespace"] == "ml" and pod_config(config_map).data.train_files == (
        "/data/train.jsonl",
    )
    assert "host path /srv/data" in text


def test_yaml_goes_to_stdout_by_default(tmp_path, capsys):
    assert main(["k8s", "--preset", "laptop", "--image", IMAGE]) == 0
    docs = list(yaml.safe_load_all(capsys.readouterr().out))
    assert [d["kind"] for d in docs] == ["ConfigMap", "Job"]
    assert "lite-verl train --resume" in docs[0]["data"]["run.sh"]


def test_job_name_is_a_dns_label():
    assert job_name("20261202-120000-4090x1") == "lite-verl-20261202-120000-4090x1"
    assert job_name("My_Run.v2") == "lite-verl-my-run-v2"
    assert len(job_name("x" * 100)) == 63


@pytest.mark.parametrize(
    "args, words",
    [
        (["--preset", "laptop", "--image", "Not An/Image"], ["--image"]),
        (["--preset", "laptop", "--image", IMAGE, "--name", "Bad_Name"], ["--name"]),
        (
            ["--preset", "laptop", "--image", IMAGE, "--runs-pvc", "a", "--runs-host-path", "/b"],
            ["--runs-pvc"],
        ),
        (["--preset", "laptop", "--image", IMAGE, "--runs-host-path", "rel/dir"], ["absolute"]),
        (["--preset", "laptop", "--image", IMAGE, "--backoff-limit", "-1"], ["--backoff-limit"]),
        (["nowhere.yaml", "--image", IMAGE], ["nowhere.yaml", "does not exist"]),
        (["--preset", "laptop", "--image", IMAGE, "--set", "trainer.seeed=1"], ["trainer.seed"]),
    ],
)
def test_bad_input_one_line_exit_2_no_file(args, words, tmp_path, capsys):
    rc = main(["k8s", *args, "--out", str(tmp_path / "job.yaml")])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert all(w in err for w in words), err
    assert not (tmp_path / "job.yaml").exists()


# ----------------------------------------------------------------------------------------------------
# The entrypoint: fresh start, resume on retry, nothing to do after the end.
# ----------------------------------------------------------------------------------------------------


def _entrypoint(tmp_path: Path, lite_verl: str) -> tuple[Path, dict[str, str], Path]:
    """run.sh for tmp/runs/r1, and a `lite-verl` on PATH (a stand-in script or the real CLI)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "lite-verl").write_text(lite_verl)
    (bin_dir / "lite-verl").chmod(0o755)
    script = tmp_path / "run.sh"
    run = tmp_path / "runs" / "r1"
    script.write_text(run_script(str(run), str(tmp_path / "config.yaml")))
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    return script, env, run


def test_entrypoint_starts_resumes_and_stops(tmp_path):
    script, env, run = _entrypoint(tmp_path, '#!/bin/sh\necho "lite-verl $*"\n')

    def go() -> str:
        return subprocess.run(["sh", str(script)], env=env, capture_output=True, text=True, check=True).stdout

    assert go().strip() == f"lite-verl train --config {tmp_path / 'config.yaml'} --run-dir {run}"
    (run / "checkpoints" / ".step_00000002.tmp").mkdir(parents=True)  # died before its first checkpoint
    assert "--run-dir" in go() and not run.exists()  # cleared, so train does not refuse a non-empty dir
    (run / "checkpoints" / "step_00000002").mkdir(parents=True)
    (run / "checkpoints" / "step_00000002" / "state.json").write_text("{}")
    assert go().strip().endswith(f"lite-verl train --resume {run}")
    (run / "summary.json").write_text("{}")
    assert "has finished" in go()


@pytest.mark.slow
def test_entrypoint_resumes_a_real_run(tmp_path):
    """The real CLI: a run killed after its checkpoint at step 2 (summary.json gone), retried, finishes."""
    real = f'#!/bin/sh\nexec {sys.executable} -m lite_verl "$@"\n'
    script, env, run = _entrypoint(tmp_path, real)
    sets = ["trainer.total_steps=2", "trainer.save_every=1", "trainer.batch_size=2", "rollout.n=2",
            "data.task_size=8", "data.val_size=0", "rollout.max_new_tokens=4", "trainer.progress=false"]  # fmt: skip
    out = subprocess.run([sys.executable, "-m", "lite_verl", "validate", "--preset", "laptop", "--no-env-check",
                          *[a for s in sets for a in ("--set", s)]], capture_output=True, text=True, env=env)  # fmt: skip
    assert out.returncode == 0, out.stderr
    (tmp_path / "config.yaml").write_text(out.stdout)
    first = subprocess.run(["sh", str(script)], env=env, capture_output=True, text=True, timeout=600)
    assert first.returncode == 0, first.stderr[-2000:]
    (run / "summary.json").unlink()  # as if the pod was killed after its last checkpoint
    retry = subprocess.run(["sh", str(script)], env=env, capture_output=True, text=True, timeout=600)
    assert retry.returncode == 0 and "resuming" in retry.stdout, retry.stderr[-2000:]
    assert json.loads((run / "summary.json").read_text())["steps"] == 2
