"""The vLLM rollout worker: a process that owns one vLLM `LLM`, pinned to rollout.gpus.

The controller (loop.py, through VLLMRolloutEngine) sends small typed commands over a pipe; token
ids and log-probs come back as CPU tensors (shared memory, not pickled lists); weights arrive in
buckets, as CUDA tensors (IPC, no copy) when the trainer shares the GPU, else as CPU tensors.

Commands: generate, score, add_adapter, add_adapter_tensors, load_weights, weights_loaded, sleep, wake, stats, close.
The vLLM engine core runs inside this process (VLLM_ENABLE_V1_MULTIPROCESSING=0), so weight loads
reach the model runner directly through a worker extension.
"""

from __future__ import annotations

import traceback
from dataclasses import dataclass
from typing import Any

import torch
import torch.multiprocessing  # noqa: F401 - registers tensor sharing for the pipe


class LiteVerlWorkerExtension:
    """Mixed into vLLM's Worker (worker_extension_cls): in-place weight loading."""

    def lite_verl_load_weights(self, named_tensors: list[tuple[str, Any]], awq_copy: bool = False) -> None:
        from lite_verl.rollout.vllm_compat import copy_awq_in_place, reload_weights

        device = self.model_runner.device if hasattr(self.model_runner, "device") else None  # type: ignore[attr-defined]
        moved = [(n, t.to(device) if device is not None else t) for n, t in named_tensors]
        if awq_copy:
            copy_awq_in_place(self.model_runner.model, moved)  # type: ignore[attr-defined]
        else:
            reload_weights(self, moved)

    def lite_verl_awq_leftovers(self) -> list[str]:
        """Layers of a merged AWQ sync still waiting for some of their tensors (cleared: the next sync
        starts afresh); empty after a complete one."""
        return sorted(self.model_runner.model.__dict__.pop("_lite_verl_awq_pending", {}))  # type: ignore[attr-defined]

    def lite_verl_stage_adapter(self, lora_id: int, flat: Any, layout: list, config: dict) -> None:
        """Hold an adapter's tensors (views of one flat buffer) for the next add_lora of lora_id."""
        from lite_verl.rollout.vllm_compat import stage_adapter
        from lite_verl.tensorfile import unpack

        device = getattr(self.model_runner, "device", None)  # type: ignore[attr-defined]
        if device is not None and torch.device(device).type == "cuda" and flat.device.type != "cuda":
            flat = flat.to(device, non_blocking=True)  # one host-to-device copy, not one per tensor
        stage_adapter(lora_id, unpack(flat, layout), config)

    def lite_verl_drop_adapter(self, lora_id: int) -> None:
        from lite_verl.rollout.vllm_compat import drop_adapter

        drop_adapter(lora_id)
        if torch.cuda.is_available():
            torch.cuda.synchronize()  # the slot copies are done: the sender may reuse its buffer

    def lite_verl_weight_bytes(self) -> int:
        model = self.model_runner.model  # type: ignore[attr-defined]
        tensors = {id(t): t for t in [*model.parameters(), *model.buffers()]}
        return sum(t.numel() * t.element_size() for t in tensors.values() if t.device.type != "meta")


@dataclass(frozen=True)
class WorkerOptions:
    model: str
    dtype: str
    gpu_memory_utilization: float
    max_model_len: int
    max_lora_rank: int  # 0 = LoRA off (merged sync)
    enforce_eager: bool
    sleep_mode: bool
    seed: int
    quantization: str | None = None
    fp32_lm_head: bool = False
    tensor_parallel_size: int = 1
    # rollout.kv_cache_gib: the cache reserved as given (gpu_memory_utilization then plan-sized), and vLLM's
    # max_num_batched_tokens and max_num_seqs set to what the plan counts
    kv_cache_bytes: int = 0
    batch_limits: tuple[int, int] = (0, 0)
    kv_cache_dtype: str = "auto"  # rollout.kv_cache_dtype (fp8: one byte per cached value)


def engine_kwargs(o: WorkerOptions) -> dict[str, Any]:
    """The LLM(...) arguments of lite-verl's engine (bench/rollout.py starts a bare one with the same)."""
    from lite_verl.rollout.vllm_compat import fp32_lm_head, llm_kwargs

    kwargs = llm_kwargs(
        model=o.model,
        dtype=o.dtype,
        gpu_memory_utilization=o.gpu_memory_utilization,
        max_model_len=o.max_model_len,
        enable_lora=o.max_lora_rank > 0,
        max_lora_rank=o.max_lora_rank or None,
        max_loras=1,
        enforce_eager=o.enforce_eager,
        enable_sleep_mode=o.sleep_mode,
        seed=o.seed,
        tensor_parallel_size=o.tensor_parallel_size,
        logprobs_mode="processed_logprobs",  # after temperature: what the trainer computes
        worker_extension_cls="lite_verl.rollout.vllm_worker.LiteVerlWorkerExtension",
        quantization=o.quantization,
        enable_prefix_caching=True,
        **(fp32_lm_head() if o.fp32_lm_head else {}),
        **({"kv_cache_memory_bytes": o.kv_cache_bytes} if o.kv_cache_bytes else {}),
        **({"kv_cache_dtype": o.kv_cache_dtype} if o.kv_cache_dtype != "auto" else {}),
        **(dict(zip(("max_num_batched_tokens", "max_num_seqs"), o.batch_limits)) if o.kv_cache_bytes else {}),
    )
    if o.max_lora_rank == 0:
        kwargs = {k: v for k, v in kwargs.items() if k not in ("max_lora_rank", "max_loras")}
    from vllm.platforms import current_platform

    if current_platform.is_cpu():
        # a prompt split over two scheduler steps rewinds its seeded sampler, which a CPU generator
        # cannot do ("CPU Generator does not use offset"): schedule whole prompts only
        kwargs.update(llm_kwargs(enable_chunked_prefill=False))
    return kwargs


def _make_llm(o: WorkerOptions):
    from vllm import LLM

    from lite_verl.device import gpu_start_lock

    # one lite-verl engine starts per GPU at a time: vLLM sizes its KV cache from the free memory it sees (if
    # another process's memory moves meanwhile, the engine retries in a new worker: vllm_engine.start_retrying)
    with gpu_start_lock():
        llm = LLM(**engine_kwargs(o))
    if o.sleep_mode:  # asleep (level 1), vLLM parks each weight tensor in pinned host memory
        from lite_verl.device import pin_host_memory

        pin_host_memory(
            "asleep, vLLM's weights may take up to 2x their size in host memory "
            "(rollout.sleep_level=2 with merged sync keeps none)"
        )
    return llm


class _Server:
    def __init__(self, llm) -> None:
        self.llm = llm
        self.lora: Any = None  # the current LoRARequest, or None (base weights)

    def generate(self, prompts: list[list[int]], n: int, temperature: float, top_p: float, max_tokens: int,
                 seed: int, stop_ids: list[int], stop: list[str] | None = None, top_k: int = 0, min_p: float = 0.0,
                 logprobs: bool = True,
                 ) -> tuple[torch.Tensor, torch.Tensor, tuple[float, float]]:  # fmt: skip
        """-> token ids [N, R] (-1 = none), their log-probs (zeros unless `logprobs`), and this call's
        wall-clock (start, end)."""
        import time

        from vllm import SamplingParams

        started = time.time()
        from lite_verl.rollout.vllm_compat import flat_logprobs, sampled_logprobs, tokens_prompt

        flat = flat_logprobs()
        params = [
            SamplingParams(
                n=n,
                temperature=temperature,
                top_p=top_p if temperature > 0 else 1.0,
                # vLLM's "all tokens" is -1 (newer versions take 0 too)
                top_k=top_k if temperature > 0 and top_k > 0 else -1,
                min_p=min_p if temperature > 0 else 0.0,
                max_tokens=max_tokens,
                logprobs=0 if logprobs else None,
                seed=(seed + i) % (2**31),
                stop_token_ids=stop_ids,
                stop=stop or None,  # the engine's cut_at_stop decides where a response ends; this stops early
                include_stop_str_in_output=True,
                detokenize=bool(stop),  # stop strings are matched on the text
                **flat,
            )  # fmt: skip
            for i in range(len(prompts))
        ]
        outs = self.llm.generate(
            [tokens_prompt(p) for p in prompts], params, lora_request=self.lora, use_tqdm=False
        )
        rows = [(list(c.token_ids), sampled_logprobs(c) if logprobs else []) for o in outs for c in o.outputs]
        width = max(1, max(len(t) for t, _ in rows))
        ids = torch.full((len(rows), width), -1, dtype=torch.long)
        lps = torch.zeros((len(rows), width), dtype=torch.float32)
        for i, (t, lp) in enumerate(rows):
            ids[i, : len(t)] = torch.tensor(t, dtype=torch.long)
            lps[i, : len(lp)] = torch.tensor(lp, dtype=torch.float32)
        return ids, lps, (started, time.time())

    def score(self, sequences: list[list[int]], temperature: float) -> list[list[float]]:
        """Log-probs of tokens 1.. of each sequence under the current weights (prompt_logprobs)."""
        from vllm import SamplingParams

        from lite_verl.rollout.vllm_compat import flat_logprobs, prompt_logprobs, tokens_prompt

        params = SamplingParams(
            max_tokens=1,
            prompt_logprobs=0,
            temperature=temperature or 1.0,
            detokenize=False,
            **flat_logprobs(),
        )
        outs = self.llm.generate(
            [tokens_prompt(s) for s in sequences], params, lora_request=self.lora, use_tqdm=False
        )
        return [prompt_logprobs(o) for o in outs]

    def add_adapter(self, version: int, path: str) -> None:
        from vllm.lora.request import LoRARequest

        from lite_verl.rollout.vllm_compat import add_lora, remove_lora

        old = self.lora
        if old is not None:
            remove_lora(self.llm, old.lora_int_id)
        self.lora = LoRARequest(lora_name=f"v{version}", lora_int_id=version, lora_path=path)
        add_lora(self.llm, self.lora)  # load now, so the sync time is the real cost

    def add_adapter_tensors(self, version: int, flat: torch.Tensor, layout: list, config: dict) -> None:
        """add_adapter from memory: `flat` (a CUDA IPC view of the trainer's buffer, or shared CPU memory)
        holds the tensors at `layout`; no file is written or read."""
        from vllm.lora.request import LoRARequest

        from lite_verl.rollout.vllm_compat import MEMORY_PATH, add_lora, remove_lora

        self.llm.collective_rpc("lite_verl_stage_adapter", args=(version, flat, layout, config))
        old = self.lora
        if old is not None:
            remove_lora(self.llm, old.lora_int_id)
        self.lora = LoRARequest(
            lora_name=f"v{version}", lora_int_id=version, lora_path=f"{MEMORY_PATH}v{version}"
        )
        try:
            add_lora(self.llm, self.lora)
        finally:
            self.llm.collective_rpc("lite_verl_drop_adapter", args=(version,))

    def load_weights(self, named_tensors: list[tuple[str, torch.Tensor]], awq_copy: bool = False) -> None:
        self.llm.collective_rpc("lite_verl_load_weights", args=(named_tensors, awq_copy))

    def weights_loaded(self) -> None:
        from lite_verl.rollout.vllm_compat import reset_prefix_cache

        left = sorted(
            {name for names in self.llm.collective_rpc("lite_verl_awq_leftovers") for name in names}
        )
        if left:
            raise RuntimeError(
                f"merged AWQ sync: {len(left)} layer(s) got only part of their tensors (first: {left[0]}); "
                "the engine would serve a mix of old and new weights"
            )
        reset_prefix_cache(self.llm)

    def sleep(self, level: int = 1, tries: int = 3) -> None:
        """Sleep, again after a race: vLLM compares the card's free memory before and after it released its
        own and asserts it grew ("Memory usage increased after sleeping"), so another process allocating
        meanwhile (a second run or an `eval` on the card) fails a sleep that has happened, and its executor
        never records it (a later wake_up would skip the weights). The weights are woken directly through
        the workers and the sleep retried; a race on every try is raised."""
        import time

        from lite_verl.device import vllm_memory_race

        for left in range(tries - 1, -1, -1):
            try:
                return self.llm.sleep(level=level)
            except AssertionError as e:
                if not vllm_memory_race(str(e)) or not left:
                    raise
            self.llm.collective_rpc("wake_up", kwargs={"tags": None})  # the workers' memory, back in place
            time.sleep(1.0)

    def wake(self, tags: list[str] | None = None) -> None:
        """All it freed, or only `tags` of vLLM's ("weights", "kv_cache")."""
        self.llm.wake_up(tags=tags)

    def stats(self) -> dict[str, Any]:
        info: dict[str, Any] = {"lora": getattr(self.lora, "lora_int_id", None)}
        info["weights_gb"] = self.llm.collective_rpc("lite_verl_weight_bytes")[0] / 2**30
        cache = getattr(getattr(self.llm.llm_engine, "vllm_config", None), "cache_config", None)
        if cache is not None and getattr(cache, "num_gpu_blocks", None):
            info["kv_cache_tokens"] = int(cache.num_gpu_blocks) * int(cache.block_size)
        if torch.cuda.is_available():
            free, total = torch.cuda.mem_get_info()
            info["gpu_used_gb"] = (total - free) / 2**30
        return info


def worker_main(conn, options: WorkerOptions) -> None:  # pragma: no cover - runs in the worker process
    from lite_verl.run.signals import child_process_setup

    child_process_setup()  # Ctrl-C / SIGTERM to the group are the controller's to act on
    try:
        server = _Server(_make_llm(options))
    except BaseException as e:  # noqa: BLE001 - report any start-up failure to the controller
        from lite_verl.device import vllm_memory_race

        status = (
            "memory moved" if vllm_memory_race(str(e)) else "error"
        )  # the engine retries it (start_retrying)
        conn.send((status, f"vLLM could not start: {type(e).__name__}: {e}", traceback.format_exc()))
        return
    from lite_verl.rollout.vllm_compat import memory_lora_supported

    conn.send(("ok", {"memory_lora": memory_lora_supported()}, ""))
    while True:
        try:
            command, kwargs = conn.recv()
        except (EOFError, OSError, KeyboardInterrupt):
            return
        if command == "close":
            conn.send(("ok", None, ""))
            return
        try:
            result = getattr(server, command)(**kwargs)
            conn.send(("ok", result, ""))
        except BaseException as e:  # noqa: BLE001
            conn.send(("error", f"{command} failed: {type(e).__name__}: {e}", traceback.format_exc()))
