"""`lite-verl k8s`: the run as a Kubernetes Job that is used and burnt.

    lite-verl k8s runs/20261202-120000-4090x1 --image registry.example.com/lite-verl:0.1 | kubectl apply -f -
    lite-verl k8s my.yaml --preset 4090x4 --image IMG --models-pvc models --runs-host-path /srv/runs --out job.yaml

Writes two manifests: a ConfigMap holding the resolved config (paths rewritten to the mounts) and the
entrypoint script, and a batch/v1 Job: one pod, `nvidia.com/gpu` = the number of distinct GPUs the
config uses (renumbered 0..k-1, as the pod sees them), restartPolicy Never, backoffLimit,
ttlSecondsAfterFinished, and volumes for /models, /data and /runs (PVCs, or host paths).

Resume on retry: the run directory lives on the runs volume, /runs/NAME. The script starts a new run
when there is no complete checkpoint (removing what a try that died before its first checkpoint left,
which `lite-verl train` would otherwise refuse as a non-empty run directory), resumes from the last
checkpoint when there is one, and does nothing when the run has finished (summary.json). Exit code 2 is
bad input: the pod failure policy fails the Job at once instead of retrying it.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from lite_verl.config import Config, to_dict
from lite_verl.errors import UserError

CONFIG_DIR = "/etc/lite-verl"  # where the ConfigMap is mounted
CONTAINER = "train"
_IMAGE = re.compile(
    r"(?:[a-zA-Z0-9.-]+(?::[0-9]+)?/)?[a-z0-9]+(?:[._-][a-z0-9]+)*(?:/[a-z0-9]+(?:[._-][a-z0-9]+)*)*"
    r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(?:@sha256:[a-f0-9]{64})?"
)
_NAME = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")  # a DNS-1123 label (Job names feed pod labels)


@dataclass(frozen=True)
class Volume:
    name: str  # models | data | runs: mounted at /NAME
    pvc: str = ""  # a PersistentVolumeClaim...
    host_path: str = ""  # ...or a directory on the node

    @property
    def mount(self) -> str:
        return f"/{self.name}"


@dataclass(frozen=True)
class JobOptions:
    image: str  # a container image with lite-verl installed (the repository's Dockerfile)
    name: str  # Job name, and the run directory /runs/NAME
    namespace: str = "default"
    backoff_limit: int = 3  # pod retries before the Job fails (each retry resumes)
    ttl_s: int = 86400  # seconds the finished Job and its pods are kept
    shm_size: str = "16Gi"  # /dev/shm (vLLM and the adapter sync use it; Kubernetes gives 64 MiB)
    volumes: tuple[Volume, ...] = ()  # models, data, runs


@dataclass(frozen=True)
class Staged:
    """A local file or directory the pod needs, and where it must be on a volume."""

    key: str  # the config key, e.g. model.path
    local: str  # the path on this machine
    volume: str  # models | data
    path: str  # the path in the pod


def job_options(args: argparse.Namespace, default_name: str) -> JobOptions:
    """The CLI's flags, checked: a bad value is a one-line error naming the flag and the fix."""
    image, name = args.image, args.name or job_name(default_name)
    if not _IMAGE.fullmatch(image):
        raise UserError(
            f"--image {image!r} is not an image reference; write e.g. registry.example.com/lite-verl:0.1"
        )
    if not _NAME.fullmatch(name):
        raise UserError(
            f"--name {name!r}: use lowercase letters, digits and '-', at most 63, e.g. lite-verl-gsm8k"
        )
    for flag, value in (("--backoff-limit", args.backoff_limit), ("--ttl", args.ttl)):
        if value < 0:
            raise UserError(f"{flag} {value}: give a whole number >= 0")
    volumes = []
    for vol in ("models", "data", "runs"):
        pvc, host = getattr(args, f"{vol}_pvc"), getattr(args, f"{vol}_host_path")
        if pvc and host:
            raise UserError(f"--{vol}-pvc and --{vol}-host-path are both given; keep one")
        if host and not host.startswith("/"):
            raise UserError(f"--{vol}-host-path {host!r} must be an absolute path on the node")
        volumes.append(Volume(vol, pvc="" if host else (pvc or f"lite-verl-{vol}"), host_path=host or ""))
    return JobOptions(
        image, name, args.namespace, args.backoff_limit, args.ttl, args.shm_size, tuple(volumes)
    )


def job_name(stem: str) -> str:
    """A valid Job name from a run or config name: lite-verl-<stem>, lowercased, at most 63 characters."""
    name = re.sub(r"[^a-z0-9-]+", "-", f"lite-verl-{stem}".lower())
    return re.sub(r"-+", "-", name)[:63].strip("-")


# ----------------------------------------------------------------------------------------------------
# The config as the pod sees it.
# ----------------------------------------------------------------------------------------------------


def pod_config(cfg: Config) -> tuple[Config, list[Staged], dict[str, str]]:
    """(config for the pod, what to copy onto the volumes, extra ConfigMap files)."""
    staged: list[Staged] = []
    files: dict[str, str] = {}

    def put(key: str, local: str, volume: str) -> str:
        path = f"/{volume}/{Path(local.rstrip('/')).name}"
        if any(s.path == path and s.local != local for s in staged):
            raise UserError(f"{key}: two files named {Path(local).name!r} would meet at {path}; rename one")
        if not any(s.path == path for s in staged):
            staged.append(Staged(key, local, volume, path))
        return path

    cfg = _renumber_gpus(cfg)
    m, d, r, w = cfg.model, cfg.data, cfg.rollout, cfg.reward
    if not m.path.startswith("tiny:"):  # tiny models are made in the pod
        m = dataclasses.replace(m, path=put("model.path", m.path, "models"))
    d = dataclasses.replace(
        d,
        train_files=tuple(put("data.train_files", f, "data") for f in d.train_files),
        val_files=tuple(put("data.val_files", f, "data") for f in d.val_files),
    )
    if r.quantized_path:
        r = dataclasses.replace(r, quantized_path=put("rollout.quantized_path", r.quantized_path, "models"))
    if w.model:
        w = dataclasses.replace(w, model=put("reward.model", w.model, "models"))
    target, _, fn = w.function.rpartition(":")
    if target.endswith(".py"):  # a file of this machine: it travels in the ConfigMap
        files["reward_fn.py"] = _read(target, "reward.function")
        w = dataclasses.replace(w, function=f"{CONFIG_DIR}/reward_fn.py:{fn}")
    preset = cfg.preset
    if preset.endswith((".yaml", ".yml")):  # the same for a preset file
        files["preset.yaml"], preset = _read(preset, "--preset"), f"{CONFIG_DIR}/preset.yaml"
    return dataclasses.replace(cfg, preset=preset, model=m, data=d, rollout=r, reward=w), staged, files


def _read(path: str, what: str) -> str:
    p = Path(path).expanduser()
    if not p.is_file():
        raise UserError(f"{what}: {path!r} does not exist on this machine; the pod needs a copy of it")
    return p.read_text()


def _renumber_gpus(cfg: Config) -> Config:
    """The pod sees its k GPUs as 0..k-1: map the config's ids (and their cost.gpu_models) onto those."""
    ids = cfg.used_gpus
    new = {old: i for i, old in enumerate(ids)}
    device = cfg.reward.device
    if device.startswith("cuda:"):
        device = f"cuda:{new[int(device[5:])]}"
    return dataclasses.replace(
        cfg,
        rollout=dataclasses.replace(cfg.rollout, gpus=tuple(new[g] for g in cfg.rollout.gpus)),
        train=dataclasses.replace(cfg.train, gpus=tuple(new[g] for g in cfg.train.gpus)),
        reward=dataclasses.replace(cfg.reward, device=device),
        cost=dataclasses.replace(cfg.cost, gpu_models=tuple(cfg.cost.gpu_models[g] for g in ids)),
    )


def run_script(run_dir: str, config_file: str) -> str:
    """The container's entrypoint: start, resume after a retry, or stop when the run has finished."""
    return f"""#!/bin/sh
# lite-verl Job entrypoint: a new run the first time, the same run resumed when the pod is retried.
set -eu
RUN="{run_dir}"
if [ -f "$RUN/summary.json" ]; then
    echo "lite-verl: $RUN has finished (summary.json); nothing to do"
    exit 0
fi
if ls "$RUN"/checkpoints/step_*/state.json >/dev/null 2>&1; then
    echo "lite-verl: resuming $RUN from its last checkpoint"
    exec lite-verl train --resume "$RUN"
fi
# a try that died before its first checkpoint left nothing worth keeping
rm -rf "$RUN"
exec lite-verl train --config {config_file} --run-dir "$RUN"
"""


# ----------------------------------------------------------------------------------------------------
# Manifests.
# ----------------------------------------------------------------------------------------------------


def manifests(cfg: Config, opts: JobOptions) -> tuple[list[dict[str, Any]], list[Staged]]:
    """[ConfigMap, Job] as plain dicts, and what must be copied onto the volumes first."""
    pod, staged, files = pod_config(cfg)
    runs = next(v for v in opts.volumes if v.name == "runs")
    header = "# Resolved lite-verl config for the Kubernetes Job; paths are the pod's.\n"
    data = {
        "config.yaml": header + yaml.safe_dump(to_dict(pod), sort_keys=False),
        "run.sh": run_script(f"{runs.mount}/{opts.name}", f"{CONFIG_DIR}/config.yaml"),
        **files,
    }
    meta = {"name": opts.name, "namespace": opts.namespace, "labels": _labels(opts)}
    config_map = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": data}
    needed = {s.volume for s in staged} | {"runs"}
    volumes = [v for v in opts.volumes if v.name in needed]
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": meta,
        "spec": _job_spec(opts, volumes, len(cfg.used_gpus)),
    }
    return [config_map, job], staged


def _labels(opts: JobOptions) -> dict[str, str]:
    return {"app.kubernetes.io/name": "lite-verl", "app.kubernetes.io/instance": opts.name}


def _job_spec(opts: JobOptions, volumes: list[Volume], gpus: int) -> dict[str, Any]:
    container: dict[str, Any] = {
        "name": CONTAINER,
        "image": opts.image,
        "command": ["sh", f"{CONFIG_DIR}/run.sh"],
        "env": [
            {"name": "LITE_VERL_CACHE", "value": "/runs/.cache/lite-verl"},  # tiny models, AWQ cache
            {"name": "HF_HUB_OFFLINE", "value": "1"},
            {"name": "PYTHONUNBUFFERED", "value": "1"},
        ],
        "volumeMounts": [
            {"name": "config", "mountPath": CONFIG_DIR, "readOnly": True},
            {"name": "dshm", "mountPath": "/dev/shm"},
            *(_mount(v) for v in volumes),
        ],
    }
    if gpus:
        container["resources"] = {"limits": {"nvidia.com/gpu": str(gpus)}}
    return {
        "backoffLimit": opts.backoff_limit,
        "ttlSecondsAfterFinished": opts.ttl_s,
        "podFailurePolicy": {
            "rules": [  # bad input (exit 2) cannot pass on a retry; a drained node is not the run's fault
                {
                    "action": "FailJob",
                    "onExitCodes": {"containerName": CONTAINER, "operator": "In", "values": [2]},
                },
                {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]},
            ]
        },
        "template": {
            "metadata": {"labels": _labels(opts)},
            "spec": {
                "restartPolicy": "Never",
                "containers": [container],
                "volumes": [
                    {"name": "config", "configMap": {"name": opts.name}},
                    {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": opts.shm_size}},
                    *(_volume(v) for v in volumes),
                ],
            },
        },
    }


def _mount(v: Volume) -> dict[str, Any]:
    """models and data are read-only in the pod; runs is where the run directory grows."""
    return {"name": v.name, "mountPath": v.mount, **({} if v.name == "runs" else {"readOnly": True})}


def _volume(v: Volume) -> dict[str, Any]:
    if v.host_path:
        kind = "DirectoryOrCreate" if v.name == "runs" else "Directory"  # models and data must be there
        return {"name": v.name, "hostPath": {"path": v.host_path, "type": kind}}
    return {"name": v.name, "persistentVolumeClaim": {"claimName": v.pvc}}


# ----------------------------------------------------------------------------------------------------
# YAML.
# ----------------------------------------------------------------------------------------------------


class _Dumper(yaml.SafeDumper):
    """Multi-line strings (the config, the script) as readable `|` blocks."""


def _str(dumper: yaml.SafeDumper, s: str) -> yaml.ScalarNode:
    return dumper.represent_scalar("tag:yaml.org,2002:str", s, style="|" if "\n" in s else None)


_Dumper.add_representer(str, _str)


def k8s_yaml(cfg: Config, opts: JobOptions) -> str:
    docs, staged = manifests(cfg, opts)
    where = {v.name: v for v in opts.volumes}
    lines = [
        f"# lite-verl training as a Kubernetes Job: {opts.name}. Run directory: /runs/{opts.name}",
        "# (the runs volume). A retried pod resumes from the last checkpoint. Before `kubectl apply -f`:",
    ]
    for s in staged:
        v = where[s.volume]
        src = f"PVC {v.pvc}" if v.pvc else f"host path {v.host_path}"
        lines.append(
            f"#   copy {s.local} ({s.key}) to {s.path[len(v.mount) + 1 :]} on the {s.volume} volume ({src})"
        )
    if not staged:
        lines.append("#   nothing to copy (the model and the data are made in the pod)")
    target = cfg.reward.function.rpartition(":")[0]
    if target and not target.endswith(".py"):
        lines.append(f"#   reward.function={cfg.reward.function}: install module {target!r} in the image")
    body = "---\n".join(yaml.dump(d, Dumper=_Dumper, sort_keys=False) for d in docs)
    return "\n".join(lines) + "\n---\n" + body
