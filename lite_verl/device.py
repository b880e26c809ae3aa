"""All device placement goes through here: config GPU ids -> torch devices and dtypes.

Local GPU ids in the config are the ids this process sees (after CUDA_VISIBLE_DEVICES). An empty list
means CPU. Rollout workers in their own processes get CUDA_VISIBLE_DEVICES set from their ids.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def torch_dtype(name: str) -> torch.dtype:
    return DTYPES[name]


def role_device(gpus: tuple[int, ...]) -> torch.device:
    """The device a single-process role runs on: its first GPU, or the CPU."""
    return torch.device(f"cuda:{gpus[0]}") if gpus else torch.device("cpu")


def visible_devices_env(gpus: tuple[int, ...]) -> dict[str, str]:
    """Environment for a worker process pinned to `gpus` (ids as this process sees them)."""
    parent = os.environ.get("CUDA_VISIBLE_DEVICES")
    if parent:
        physical = [p.strip() for p in parent.split(",")]
        ids = [physical[g] for g in gpus]
    else:
        ids = [str(g) for g in gpus]
    return {"CUDA_VISIBLE_DEVICES": ",".join(ids)}


def describe_devices() -> dict[str, object]:
    """What this machine has, for env.json."""
    info: dict[str, object] = {"cpu_count": os.cpu_count(), "cuda_available": torch.cuda.is_available()}
    if torch.cuda.is_available():
        info["gpus"] = [
            {
                "id": i,
                "name": torch.cuda.get_device_name(i),
                "memory_gb": round(torch.cuda.get_device_properties(i).total_memory / 2**30, 1),
            }
            for i in range(torch.cuda.device_count())
        ]
    return info


def cap_memory(device: torch.device, gib: float) -> None:
    """Caps this process's allocations on `device` at `gib` GiB (train.max_memory_gib): beyond it PyTorch
    raises its out-of-memory error as a card of that size would, so a 24 GB card can be emulated on a
    bigger one and a trainer sharing its card with a vLLM process cannot take the engine's share."""
    if not gib or device.type != "cuda":
        return
    from lite_verl.errors import ConfigError

    total = torch.cuda.get_device_properties(device).total_memory / 2**30
    if gib > total:
        raise ConfigError(
            f"train.max_memory_gib={gib} exceeds GPU {device.index}'s {total:.1f} GiB; lower it or set it to 0"
        )
    torch.cuda.set_per_process_memory_fraction(gib / total, device)


def page_granular_allocator(device: torch.device) -> None:
    """This process's CUDA caching allocator in expandable segments, before the trainer loads: emptying the
    cache then returns every free page to the driver, not only wholly free segments. transformers loads a
    model into one segment the size of the model (its allocator warm-up), and one tensor still in it kept
    all of it reserved: parked for a rollout (train.offload_during_rollout), a QLoRA 7B trainer still held
    6.0-6.6 GiB on an H200 beside vLLM (bench/card_peak.py, 2026-12-07). Set in-process, not through
    PYTORCH_CUDA_ALLOC_CONF: a vLLM worker started from here inherits the environment, and its sleep-mode
    memory pool refuses expandable segments. Only where no tensor of the trainer is shared with vLLM by
    CUDA IPC (Config.park_before_sync: the adapter goes through host memory)."""
    if device.type != "cuda":
        return
    allocator_settings("expandable_segments:True")


def allocator_settings(settings: str) -> None:
    """The caching allocator's settings (PYTORCH_CUDA_ALLOC_CONF's syntax) for this process, from now on:
    torch's accelerator-wide setter where it has one (torch.cuda's older one warns it is deprecated there)."""
    setter = getattr(torch._C, "_accelerator_setAllocatorSettings", None)
    (setter or torch.cuda.memory._set_allocator_settings)(settings)


def safe_attention_backward(device: torch.device) -> None:
    """Keeps the training backward off cuDNN's attention kernel on this process's GPUs.

    torch >= 2.11 puts cuDNN first for scaled_dot_product_attention on Hopper and newer cards, and its
    backward returns NaN query gradients when an attention mask is passed, the padded length is 64 past a
    multiple of 128 and a row's log-sum-exp is very negative (pytorch/pytorch#196678): a left-padded
    prompt row is one. Seen here (#24 item 9): SmolLM2-135M skipped steps 1 and 5 of the arithmetic recipe
    and 3 of 60 on GSM8K for a NaN gradient on an H200; on an H100 anomaly detection named
    ScaledDotProductCudnnAttentionBackward0 at step 1. The memory-efficient and flash kernels, which take over, are
    clean on the same inputs; forward results are the same within rounding."""
    if device.type == "cuda":
        torch.backends.cuda.enable_cudnn_sdp(False)


def exact_pinned_memory() -> bool:
    """Whether pinned (page-locked) host memory is allocated at its size, after asking for it.

    torch's pinned-memory allocator rounds every allocation up to a power of two: FSDP2's CPU offload pins
    each fp32 shard and gradient, so a 7B model's 61 GB of them take ~110 GB. Newer torch has a knob
    (`pinned_max_round_threshold_mb`); it is set here to 1 MiB and checked by pinning 5 MiB + 4 KiB (8 MiB
    if rounded). False (the caller should not pin) without CUDA or where this torch still rounds."""
    setter = getattr(torch._C, "_accelerator_setAllocatorSettings", None)
    getter = getattr(torch._C, "_accelerator_getAllocatorSettings", None)
    stats = getattr(torch.cuda, "host_memory_stats", None)
    if setter is None or getter is None or stats is None or not torch.cuda.is_available():
        return False
    try:
        torch.cuda.init()  # host_memory_stats reads {} until CUDA is initialised
        current = getter()
        if "pinned_max_round_threshold_mb" not in current:
            setter(",".join(filter(None, [current, "pinned_max_round_threshold_mb:1"])))
        size = 5 * 2**20 + 4096
        before = stats().get("active_bytes.current", 0)
        probe = torch.empty(size, dtype=torch.uint8).pin_memory()
        grown = stats().get("active_bytes.current", 0) - before
        del probe
    except RuntimeError:
        return False
    return size <= grown < 2 * 2**22


# what FSDP2's and DeepSpeed's offload do where pinning would round up
OFFLOAD_PAGEABLE = "the offloaded training state stays in pageable memory (slower copies)"


@functools.cache
def pin_host_memory(otherwise: str) -> bool:
    """Whether pinned host memory (faster copies to a GPU) takes only what its tensors need
    (exact_pinned_memory); where it would not, one line says so and what happens `otherwise`. Decided,
    and said, once per process and caller."""
    if not torch.cuda.is_available():
        return False  # no pinning without a GPU
    if exact_pinned_memory():
        return True
    print(f"lite-verl: this torch rounds pinned host memory up to powers of two (up to 2x): {otherwise}; "
          "a torch with pinned_max_round_threshold_mb (2.13) avoids it", file=sys.stderr)  # fmt: skip
    return False


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def nccl_env(gpus: tuple[int, ...]) -> dict[str, str]:
    """NCCL_P2P_DISABLE=1 for a process group over GPUs that cannot reach each other's memory directly
    (consumer cards such as the RTX 4090 report no peer access; NCCL's P2P transport can then hang or
    fail). Nothing for one GPU, when every pair has peer access, or when the user already set it."""
    if len(gpus) < 2 or "NCCL_P2P_DISABLE" in os.environ or not torch.cuda.is_available():
        return {}
    pairs = [(a, b) for a in gpus for b in gpus if a != b]
    if all(torch.cuda.can_device_access_peer(a, b) for a, b in pairs):
        return {}
    return {"NCCL_P2P_DISABLE": "1"}


@contextlib.contextmanager
def gpu_start_lock(max_wait_s: float = 900.0) -> Iterator[None]:
    """Held while a vLLM engine starts on this process's GPUs (CUDA_VISIBLE_DEVICES): an exclusive flock per
    physical GPU in the temp directory, taken in order. vLLM sizes its KV cache from the free memory it sees
    while it profiles; two engines starting at once on one card (a run and an `eval`, two runs) each count
    the other's growth as their own and one ends with no KV cache. After max_wait_s it starts anyway (a
    start that hangs elsewhere must not hang this one). Nothing on a CPU or without fcntl."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows
        yield
        return
    gpus = [g.strip() for g in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if g.strip()]
    if not gpus or not torch.cuda.is_available():
        yield
        return
    folder = Path(tempfile.gettempdir()) / "lite-verl-gpu-locks"
    folder.mkdir(exist_ok=True)
    fds: list[int] = []
    deadline = time.monotonic() + max_wait_s
    try:
        for gpu in sorted(gpus):
            fd = os.open(
                folder / f"vllm-start-{re.sub(r'[^A-Za-z0-9_-]', '_', gpu)}.lock",
                os.O_RDWR | os.O_CREAT | os.O_CLOEXEC,
                0o666,
            )
            fds.append(fd)
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        break
                    time.sleep(0.5)
        yield
    finally:
        for fd in fds:
            os.close(fd)  # releases its flock


def cpu_kv_space() -> str:
    """VLLM_CPU_KVCACHE_SPACE for a vLLM worker on the CPU: the user's, else 1 (GiB; vLLM's own default takes
    far more of a laptop's RAM)."""
    return os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1")


# what vLLM says when another process's GPU memory moved while it measured the card's free memory: at start
# (its KV cache is sized from it) and when it sleeps (it asserts the free memory grew)
VLLM_MEMORY_RACES = (
    "Error in memory profiling",
    "No available memory for the cache blocks",
    "Memory usage increased after sleeping",
)


def vllm_memory_race(message: str) -> bool:
    """A vLLM failure caused by another process's GPU memory moving while vLLM measured free memory."""
    return any(race in message for race in VLLM_MEMORY_RACES)
