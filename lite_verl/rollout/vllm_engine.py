"""vLLM rollout with the hybrid engine: a worker process owns the engine; weights move in memory.

    rollout.engine: vllm     rollout.gpus: [0]     sync.mode: adapter | merged

* sync.mode=adapter: after each update the LoRA tensors are packed into one buffer and loaded as a new
  adapter *version* from memory (CUDA IPC when the trainer shares the rollout GPU, shared host memory
  otherwise; a file in /dev/shm on a vLLM whose loader cannot be taught that); the previous version is
  unloaded. Each generate names the version it expects, so a stale adapter cannot be used.
* sync.mode=merged: LoRA is merged into the base weights of the adapted layers (W + s * B @ A) and
  those tensors are loaded into the running engine in buckets of sync.bucket_mb (extra peak memory at
  most one bucket); vLLM serves plain weights, no LoRA kernels in the decode path.
* Colocated (rollout.gpus == train.gpus, CUDA): vLLM sleeps (frees its KV cache) while the trainer
  works and wakes before the next rollout.

Built by rollout/factory.py through `VLLMRolloutEngine.from_config`; rollout/vllm_start.py configures
and spawns the worker, this module waits for it and drives it (generate, submit/collect, weight sync).
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import suppress
from pathlib import Path
from typing import Any

import torch

from lite_verl.batch import RolloutBatch
from lite_verl.config import Config, RolloutConfig, SyncConfig
from lite_verl.errors import UserError
from lite_verl.rollout.base import SamplingSettings
from lite_verl.rollout.hf import cut_at_stop, left_pad, response_mask_after_eos
from lite_verl.rollout.vllm_start import start_worker, worker_options
from lite_verl.rollout.vllm_worker import WorkerOptions

START_TIMEOUT_S = 900


class RolloutWorkerError(UserError):
    """The vLLM worker failed; the message carries vLLM's own reason."""


class MemoryMoved(RolloutWorkerError):
    """vLLM did not start because another process's GPU memory changed while it measured the free memory
    (device.vllm_memory_race): worth one more try, in a fresh worker process. `reason`: the worker's words."""

    def __init__(self, reason: str, where: str = "") -> None:
        super().__init__(f"{reason}{where}")
        self.reason = reason


def start_retrying(start: Callable[[], Any], waits_s: tuple[float, ...] = (5.0, 20.0)) -> Any:
    """start() (a new worker and its first reply); again after each wait of `waits_s` while it raises
    MemoryMoved: another process on the card (a second run, an `eval`, a sleeping or waking engine) freed or
    took memory while vLLM measured. Each retry is a fresh process because vLLM's sleep-mode allocator serves
    one engine per process: a second engine in the same one fails ("CuMem allocator can only be used for one
    instance per process", seen on an H100)."""
    first, retries = "", 0
    while True:
        try:
            return start()
        except RolloutWorkerError as e:
            if isinstance(e, MemoryMoved) and retries < len(waits_s):
                first = first or e.reason
                print(f"lite-verl: vLLM start: GPU memory moved while it measured ({e.reason}); retrying in a "
                      f"new process in {waits_s[retries]:.0f} s", file=sys.stderr, flush=True)  # fmt: skip
                time.sleep(waits_s[retries])
                retries += 1
                continue
            if retries == 0:
                raise
            tries = f"{retries} {'retry' if retries == 1 else 'retries'}"
            raise RolloutWorkerError(f"{e} (after {tries}; the first start: {first})") from None


class VLLMRolloutEngine:
    """A RolloutEngine (rollout/base.py) over a vLLM worker process (rollout/vllm_worker.py)."""

    overlaps = True  # the worker is its own process: a submitted rollout runs while the trainer updates

    @classmethod
    def from_config(cls, cfg: Config, model_path: Path, tokenizer, backend) -> VLLMRolloutEngine:
        """The engine of a run: vLLM serves `model_path` (the trained model, or its AWQ version) and
        takes its weights from `backend` after each update."""
        from lite_verl.rollout.vllm_compat import require_vllm

        require_vllm()
        same_gpus = bool(cfg.rollout.gpus) and cfg.rollout.gpus == cfg.train.gpus
        options = worker_options(cfg, model_path, colocated=cfg.hybrid)
        return cls(
            cfg.rollout, cfg.sync, options, tokenizer, backend, same_gpus,
            cfg.train.offload_during_rollout and not cfg.park_before_sync,
        )  # fmt: skip

    def __init__(
        self,
        rollout: RolloutConfig,
        sync: SyncConfig,
        options: WorkerOptions,
        tokenizer,
        backend,
        same_gpus: bool,
        kv_after_sync: bool = False,
    ) -> None:
        """Start the worker with `options` and wait until vLLM serves (START_TIMEOUT_S). `same_gpus`:
        rollout.gpus == train.gpus, so weights can move by CUDA IPC. `kv_after_sync`: the trainer leaves the
        card after each sync (train.offload_during_rollout with a merged sync), so a sync wakes the weights
        alone and the KV cache waits for the next rollout."""
        self.rollout, self.sync, self.tokenizer, self.backend = rollout, sync, tokenizer, backend
        self.mode = sync.mode
        self.same_gpus = same_gpus
        self.sleep_mode = (
            options.sleep_mode
        )  # the hybrid engine (colocated, CUDA): vLLM sleeps during updates
        self.serving_dtype = options.dtype
        # the "awq" kernel (not awq_marlin): merged sync copies re-quantized tensors into place
        self.awq_copy = options.quantization == "awq"
        # rollout.quantization=awq: how trained weights map into the 4-bit model
        self.recipe = _awq_recipe(rollout, Path(options.model))
        self.sleeping = False
        self.weights_awake = False  # asleep but for the weights: a sync woke them, the KV cache comes later
        self.kv_after_sync = kv_after_sync
        self.version = 0
        self.last_sync_parts: dict[str, float] = {}
        # an async generate in flight: (prompts, sampling, greedy copies)
        self._pending: tuple[list[list[int]], SamplingSettings, int] | None = None
        self._ready: Any = None  # its reply, once another command had to read past it
        self.last_generate_span: tuple[float, float] = (0.0, 0.0)  # the worker's wall-clock start, end
        self.pad_id = int(tokenizer.pad_token_id)
        self.eos_ids = sorted({int(tokenizer.eos_token_id)} | _generation_eos(Path(options.model)))
        self.shm = _adapter_dir()
        self._unanswered: str | None = None  # the request whose reply the controller has not read
        self.proc: Any = None
        features = start_retrying(lambda: self._start_worker(options)) or {}
        # adapter sync from memory (no file) where this vLLM allows it; LITE_VERL_ADAPTER_FILES=1 forces files
        self.memory_lora = bool(features.get("memory_lora")) and not os.environ.get("LITE_VERL_ADAPTER_FILES")
        self._adapter_buffer: Any = None

    # --- plumbing --------------------------------------------------------------------------------
    def _start_worker(self, options: WorkerOptions) -> Any:
        """A new worker process (after the last one has exited, its GPU memory with it); -> its first reply."""
        if self.proc is not None:
            self.proc.join(60)
        self.conn, self.proc = start_worker(options, self.rollout)
        return self._wait("start", START_TIMEOUT_S)

    def _wait(self, what: str, timeout: float) -> Any:
        self._unanswered = what  # until its reply is read: a wait cut short (a signal) leaves it set
        deadline = time.monotonic() + timeout
        while not self.conn.poll(1.0):
            if not self.proc.is_alive():
                raise RolloutWorkerError(
                    f"the vLLM worker died during {what} (exit code {self.proc.exitcode})"
                )
            if time.monotonic() > deadline:
                raise RolloutWorkerError(f"the vLLM worker did not answer {what} within {timeout:.0f}s")
        status, result, trace = self.conn.recv()
        self._unanswered = None
        if status == "memory moved":
            raise MemoryMoved(result, f"; rollout.engine=vllm, rollout.gpus={list(self.rollout.gpus)}")
        if status != "ok":
            if os.environ.get("LITE_VERL_DEBUG"):
                print(trace, file=sys.stderr)
            where = [ln.strip() for ln in trace.splitlines() if ln.strip().startswith("File ")][-1:]
            result = f"{result} ({where[0]})" if where else result
            raise RolloutWorkerError(f"{result}; rollout.engine=vllm, rollout.gpus={list(self.rollout.gpus)}")
        return result

    def _call(self, command: str, timeout: float = 3600, **kwargs: Any) -> Any:
        if self._pending is not None and self._ready is None:
            self._ready = self._wait("generate", timeout)  # replies come in order: the rollout's first
        self.conn.send((command, kwargs))
        return self._wait(command, timeout)

    def close(self) -> None:
        # a worker still busy with a request nobody reads (a validation cut short by a signal) is not asked
        # politely: it would finish that request first. vLLM runs inside it, so killing it leaves no process.
        if self.proc.is_alive() and self._unanswered is None:
            with suppress(RolloutWorkerError, OSError, BrokenPipeError):
                self._call("close", timeout=30)
            self.proc.join(timeout=10)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(timeout=10)
        shutil.rmtree(self.shm, ignore_errors=True)

    # --- RolloutEngine ---------------------------------------------------------------------------
    def generate(self, prompts: list[list[int]], sampling: SamplingSettings, seed: int) -> RolloutBatch:
        """A rollout, waited for (it queues behind a rollout in flight, e.g. validation during a prefetch)."""
        self.wake()
        kwargs, greedy_copies = self._generate_args(prompts, sampling, seed)
        return self._to_batch(prompts, sampling, greedy_copies, self._call("generate", **kwargs))

    def submit(self, prompts: list[list[int]], sampling: SamplingSettings, seed: int) -> None:
        """Start a rollout and return at once (one-step-off-policy: it runs while the trainer updates).
        Commands sent meanwhile (a weight sync) queue behind it in the worker."""
        if self._pending is not None:
            raise RuntimeError("a rollout is already in flight; collect() it first")
        self.wake()
        kwargs, greedy_copies = self._generate_args(prompts, sampling, seed)
        self.conn.send(("generate", kwargs))
        self._pending = (prompts, sampling, greedy_copies)

    def finished_span(self) -> tuple[float, float] | None:
        """Wall-clock (start, end) of the rollout in flight, if the worker already replied."""
        return None if self._ready is None else self._ready[2]

    def collect(self) -> RolloutBatch:
        """The rollout started by submit(), waiting for it if needed."""
        if self._pending is None:
            raise RuntimeError("no rollout in flight")
        prompts, sampling, greedy_copies = self._pending
        reply = self._ready if self._ready is not None else self._wait("generate", 3600)
        self._pending = self._ready = None
        return self._to_batch(prompts, sampling, greedy_copies, reply)

    def _generate_args(self, prompts, sampling: SamplingSettings, seed: int) -> tuple[dict[str, Any], int]:
        greedy_copies = sampling.n if sampling.temperature == 0 else 1  # vLLM wants n=1 when greedy
        kwargs = dict(
            prompts=prompts, n=sampling.n // greedy_copies, temperature=sampling.temperature, top_p=sampling.top_p,
            top_k=sampling.top_k, min_p=sampling.min_p, logprobs=sampling.log_probs,
            max_tokens=sampling.max_new_tokens, seed=seed, stop_ids=self.eos_ids, stop=list(sampling.stop),
        )  # fmt: skip
        return kwargs, greedy_copies

    def _to_batch(self, prompts, sampling: SamplingSettings, greedy_copies: int, reply) -> RolloutBatch:
        ids, lps, self.last_generate_span = reply
        if greedy_copies > 1:
            ids, lps = ids.repeat_interleave(greedy_copies, 0), lps.repeat_interleave(greedy_copies, 0)
        rows = [p for p in prompts for _ in range(sampling.n)]
        prompt_ids, prompt_mask = left_pad(rows, self.pad_id)
        valid = ids >= 0
        response_ids = torch.where(valid, ids, torch.full_like(ids, self.pad_id))
        mask = response_mask_after_eos(response_ids, set(self.eos_ids)) * valid.long()
        mask = cut_at_stop(response_ids, mask, self.tokenizer, sampling.stop)
        return RolloutBatch(
            prompt_ids, prompt_mask, response_ids * mask + self.pad_id * (1 - mask), mask, lps * mask
        )

    def score(self, sequences: list[list[int]], temperature: float = 1.0) -> list[list[float]]:
        """vLLM's log-probs of tokens 1.. of each given sequence (for mismatch checks and tests)."""
        self.wake()
        return self._call("score", sequences=sequences, temperature=temperature)

    def sync_weights(self, step: int) -> float:
        t0 = time.perf_counter()
        # a merged sync reloads every weight itself
        self.wake(reload=self.mode != "merged", weights_only=self.kv_after_sync)
        if self.mode == "adapter":
            self._push_adapter(step)
        else:
            self._push_merged()
        return time.perf_counter() - t0

    def sleep(self) -> None:
        """Colocated on CUDA: free vLLM's KV cache while the trainer runs."""
        if self.sleep_mode and not self.sleeping and self._pending is None:
            self._call("sleep", level=self.rollout.sleep_level)
            self.sleeping = True

    def wake(self, reload: bool = True, weights_only: bool = False) -> None:
        """Take back the KV cache; after rollout.sleep_level=2 also the weights (unless `reload` is False:
        a merged sync is about to load them all anyway). `weights_only`: the weights alone, for a merged sync
        before the trainer leaves the card (train.offload_during_rollout); the next wake takes the rest."""
        if not self.sleeping or (weights_only and self.weights_awake):
            return
        if not self.weights_awake:
            self._call("wake", tags=["weights"] if weights_only else None)
            if self.rollout.sleep_level == 2 and reload:  # its weights were discarded: the trainer's
                self._push_merged()
        if weights_only:
            self.weights_awake = True
            return
        if self.weights_awake:
            self._call("wake", tags=["kv_cache"])
        self.sleeping = self.weights_awake = False

    # --- weight sync -----------------------------------------------------------------------------
    def _push_adapter(self, step: int) -> None:
        if self.memory_lora:
            try:
                self._push_adapter_memory()
                return
            except RolloutWorkerError as e:  # an unexpected vLLM internals change: files still work
                print(
                    f"lite-verl: in-memory adapter load failed, using files from now on ({e})",
                    file=sys.stderr,
                )
                self.memory_lora = False
        self._push_adapter_file()

    def _push_adapter_memory(self) -> None:
        """The adapter's tensors packed into one buffer the worker maps: CUDA IPC when the trainer shares
        the rollout GPU (no copy at all), else shared host memory (one device-to-host copy)."""
        from lite_verl.device import torch_dtype
        from lite_verl.tensorfile import FlatBuffer

        version = self.version + 1
        t0 = time.perf_counter()
        state, config = self.backend.adapter_state(self._awq_adapter if self.recipe else None)
        on_cuda = next(iter(state.values())).is_cuda
        host = "none" if on_cuda and self.same_gpus else "shared"
        if self._adapter_buffer is None or self._adapter_buffer.host != host:
            self._adapter_buffer = FlatBuffer(host)
        buf = self._adapter_buffer
        flat = buf.pack(state, torch_dtype(self.serving_dtype))
        if host == "shared":
            flat = buf.to_host()
        else:
            torch.cuda.current_stream().synchronize()  # the worker reads it on its own stream
        t1 = time.perf_counter()
        self._call("add_adapter_tensors", version=version, flat=flat, layout=buf.layout, config=config)
        self.last_sync_parts = {"export_s": t1 - t0, "load_s": time.perf_counter() - t1}
        self.version = version

    def _push_adapter_file(self) -> None:
        version = self.version + 1
        path = self.shm / f"v{version}"
        t0 = time.perf_counter()
        self.backend.export_adapter(path, self.serving_dtype, self._awq_adapter if self.recipe else None)
        t1 = time.perf_counter()
        self._call("add_adapter", version=version, path=str(path))
        self.last_sync_parts = {"export_s": t1 - t0, "load_s": time.perf_counter() - t1}
        old = self.shm / f"v{self.version}"
        shutil.rmtree(old, ignore_errors=True)
        self.version = version

    def _push_merged(self) -> None:
        """Buckets go one at a time (extra peak memory: one bucket on each side), then the prefix cache
        is reset: cached KV was computed with the old weights."""
        share_cuda = self.same_gpus and torch.cuda.is_available()
        bucket_bytes = int(self.sync.bucket_mb * 2**20)
        convert = self._awq_linear if self.recipe else None
        everything = self.rollout.sleep_level == 2  # asleep it discarded all its weights, not only LoRA's
        for bucket in self.backend.merged_weight_buckets(
            bucket_bytes, self.serving_dtype, convert, everything
        ):
            payload = bucket if share_cuda else [(n, t.cpu()) for n, t in bucket]
            self._call("load_weights", named_tensors=payload, awq_copy=self.awq_copy)
            del bucket, payload
        self._call("weights_loaded")
        self.version += 1

    # AWQ: trained weights into the quantized model's space (lite_verl/quant/awq.py)
    def _awq_adapter(self, key: str, tensor: torch.Tensor) -> torch.Tensor:
        """A' = A * s_in (columns), B' = B / s_out (rows): the quantized layer sees x / s_in, emits y / s_out."""
        assert self.recipe is not None
        module = key.removeprefix("base_model.model.").rsplit(".lora_", 1)[0]
        s_in, s_out = self.recipe.lora_factors(module)
        if ".lora_A." in key and s_in is not None:
            return tensor.float() * s_in.to(tensor.device)[None, :]
        if ".lora_B." in key and s_out is not None:
            return tensor.float() / s_out.to(tensor.device)[:, None]
        return tensor

    def _awq_linear(
        self, name: str, weight: torch.Tensor, bias: torch.Tensor | None
    ) -> dict[str, torch.Tensor]:
        """A merged linear layer re-quantized with the calibration's scales and clips (no re-calibration)."""
        assert self.recipe is not None
        from lite_verl.device import torch_dtype

        if name in self.recipe.quantized:
            return self.recipe.quantize_linear(name, weight, bias)
        out = {f"{name}.weight": weight.to(torch_dtype(self.serving_dtype))}
        if bias is not None:
            out[f"{name}.bias"] = bias.to(torch_dtype(self.serving_dtype))
        return out

    def stats(self) -> dict[str, Any]:
        return self._call("stats")


def _awq_recipe(rollout: RolloutConfig, model_path: Path) -> Any:
    """rollout.quantization=awq: the AWQRecipe saved with the 4-bit model (quant/awq.py), else None."""
    if rollout.quantization != "awq":
        return None
    from lite_verl.quant.awq import AWQRecipe

    return AWQRecipe.load(model_path)


def _adapter_dir() -> Path:
    """A fresh directory for adapter files: in /dev/shm (memory) where there is one."""
    shm = "/dev/shm" if Path("/dev/shm").is_dir() else None
    return Path(tempfile.mkdtemp(prefix="lite-verl-adapters-", dir=shm))


def _generation_eos(model_path: Path) -> set[int]:
    import json

    f = Path(model_path) / "generation_config.json"
    if not f.is_file():
        return set()
    eos = json.loads(f.read_text()).get("eos_token_id")
    if eos is None:
        return set()
    return {int(e) for e in (eos if isinstance(eos, list) else [eos])}


def fixed_sequences(rollout: RolloutBatch) -> tuple[list[list[int]], list[int]]:
    """-> (prompt + response token ids, prompt length) of every row with a non-empty response."""
    seqs, plens = [], []
    for i in range(rollout.response_ids.shape[0]):
        p = rollout.prompt_ids[i][rollout.prompt_mask[i].bool()].tolist()
        r = rollout.response_ids[i][rollout.response_mask[i].bool()].tolist()
        if r:
            seqs.append(p + r)
            plens.append(len(p))
    return seqs, plens


def fixed_response_gap(
    engine: VLLMRolloutEngine, backend, rollout: RolloutBatch
) -> tuple[torch.Tensor, list[list[float]]]:
    """Score rollout's (prompt, response) pairs with vLLM (prompt log-probs) and with the trainer.

    -> (|vLLM - trainer| per response token, concatenated; vLLM's log-probs per response). This is the
    check that a sync put the trainer's weights into the engine: both sides see the same fixed tokens.
    """
    seqs, plens = fixed_sequences(rollout)
    engine_lps = [v[p - 1 :] for v, p in zip(engine.score(seqs), plens)]
    gaps = []
    for s, p, v in zip(seqs, plens, engine_lps):
        ids = torch.tensor([s])
        with torch.no_grad():
            lp, _ = backend.forward(ids, torch.ones_like(ids), len(s) - p, 1.0)
        gaps.append((torch.tensor(v) - lp[0].float().cpu()).abs())
    return torch.cat(gaps), engine_lps
