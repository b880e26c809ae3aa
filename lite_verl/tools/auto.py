"""`--preset auto`: detect this machine's GPUs and let the planner pick placement, backend and memory knobs.

    lite-verl train --preset auto --set model.path=DIR
    lite-verl plan --preset auto --model-shape 7b          # what auto would pick here for a Qwen2.5-7B

1. `detect()` lists the CUDA GPUs this process sees: name, total and free memory, compute capability and
   the others each can reach directly (P2P). No CUDA: the `laptop` preset, said so.
2. The shipped preset that matches the count is the start: 1 GPU -> 4090x1 (colocated), 2 -> 3090x2 (split:
   vLLM on one, the trainer on the other), 3 or more -> 4090x4 (vLLM tensor-parallel on two, the trainer on
   the next one or two). Roles go on the cards of the largest model only; cost.gpu_models names the detected
   cards (plan.CARD_GIB's names where one matches), priced from the presets where they know the card.
3. Candidates, the lightest change first: unquantized rollout before AWQ (AWQ needs a quantization pass and
   samples from a slightly different policy), lora before qlora (a 4-bit base), and for each: no gradient
   checkpointing, then checkpointing with the micro-batch halved down to 1 (a memory knob only: the
   gradient is the same). The first whose plan fits every card, and what is free on it now, wins.
Layers, later wins, as for a named preset: defaults < the preset < auto's choices < --config < --set. A knob
the user set is therefore never varied. The resolved config records its preset as `auto-NAME`, which loads
as NAME (so `--resume` and `--config RUN/config.yaml` work on any machine).

`check_topology` runs before every GPU `lite-verl train`, auto or not: the GPU ids exist and each card has the
plan's predicted peak free now (another process's memory is not in the plan; this is where it shows).
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

from lite_verl.config import Config, load_config, merge, read_yaml
from lite_verl.config.presets import AUTO, preset_names, preset_path
from lite_verl.config.schema import Backend, Quantization
from lite_verl.errors import ConfigError, UserError
from lite_verl.tools import plan as planner
from lite_verl.tools.plan import GIB, GpuPlan, Shape, knob

# Qwen2.5 shapes (their config.json) for `lite-verl plan --model-shape SIZE`: a plan without the weights.
MODEL_SHAPES = {
    "0.5b": Shape(hidden=896, intermediate=4864, layers=24, heads=14, kv_heads=2, vocab=151936, tied=True),
    "1.5b": Shape(hidden=1536, intermediate=8960, layers=28, heads=12, kv_heads=2, vocab=151936, tied=True),
    "3b": Shape(hidden=2048, intermediate=11008, layers=36, heads=16, kv_heads=2, vocab=151936, tied=True),
    "7b": Shape(hidden=3584, intermediate=18944, layers=28, heads=28, kv_heads=4, vocab=152064, tied=False),
    "14b": Shape(hidden=5120, intermediate=13824, layers=48, heads=40, kv_heads=8, vocab=152064, tied=False),
    "32b": Shape(hidden=5120, intermediate=27648, layers=64, heads=40, kv_heads=8, vocab=152064, tied=False),
}
VENDOR_WORDS = ("NVIDIA", "GeForce", "Tesla", "Quadro")


@dataclass(frozen=True)
class Gpu:
    id: int  # local id, as this process sees it (after CUDA_VISIBLE_DEVICES)
    name: str  # torch.cuda.get_device_name, e.g. "NVIDIA GeForce RTX 4090"
    total_gib: float  # the card's memory
    free_gib: float  # free now (torch.cuda.mem_get_info): what other processes hold is not ours
    peers: tuple[int, ...] = ()  # ids it reads and writes directly (P2P); consumer cards usually have none
    capability: tuple[int, int] = (8, 0)  # CUDA compute capability; bfloat16 needs 8.0 or later

    @property
    def card(self) -> str:
        return card_name(self.name, self.total_gib)


@dataclass(frozen=True)
class Choice:
    cfg: Config  # the resolved, validated config
    gpus: tuple[Gpu, ...]  # what was detected (empty: the laptop preset)
    lines: tuple[str, ...]  # what auto decided and why, one line each


def card_name(device_name: str, total_gib: float) -> str:
    """The plan's name of a card ("NVIDIA GeForce RTX 4090" -> "RTX 4090", a plan.CARD_GIB key), so that presets'
    prices and the plan's sizes apply; the device name itself when no key matches or the key's size is not this
    card's (an A100 40GB is not the 80 GiB "A100", an RTX 3060 Ti not the 12 GiB "RTX 3060")."""
    words = [w for w in device_name.replace("-", " ").split() if w not in VENDOR_WORDS]
    for key, gib in planner.CARD_GIB.items():
        if words[: len(key.split())] == key.split() and abs(gib - total_gib) <= 0.1 * gib:
            return key
    return device_name


_PROBE = """
import json, torch
n = torch.cuda.device_count()
gpus = []
for i in range(n):
    free, total = torch.cuda.mem_get_info(i)
    peers = [j for j in range(n) if j != i and torch.cuda.can_device_access_peer(i, j)]
    gpus.append({"id": i, "name": torch.cuda.get_device_name(i), "free": free, "total": total, "peers": peers,
                 "capability": list(torch.cuda.get_device_capability(i))})
print(json.dumps(gpus))
"""


def detect() -> list[Gpu]:
    """The CUDA GPUs this process sees ([] without CUDA). Measured in a short-lived child process:
    mem_get_info makes a CUDA context (~0.3-0.5 GiB) on every card it asks, which this process would keep
    for the whole run, on rollout cards too, where vLLM's budget is a share of the whole card."""
    import torch

    if not torch.cuda.is_available():
        return []
    out = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=300)
    if out.returncode != 0 or not out.stdout.strip():
        tail = (out.stderr.strip().splitlines() or ["no output"])[-1]
        raise UserError(f"GPU detection failed ({tail}); check the driver with nvidia-smi, or name a preset")
    rows = json.loads(out.stdout.strip().splitlines()[-1])
    return [
        Gpu(d["id"], d["name"], d["total"] / GIB, d["free"] / GIB, tuple(d["peers"]), tuple(d["capability"]))
        for d in rows
    ]


def card_sizes(gpus: Sequence[Gpu]) -> dict[int, float]:
    """Detected cards by local id -> measured GiB: plan.plan() sizes each GPU by it (an A10 has 22.5 GiB, not
    24; an unknown card is not assumed to have 24; a 4090 preset run on an H100 gives vLLM a share of 80)."""
    return {g.id: g.total_gib for g in gpus}


def plan_on(cfg: Config, shape: Shape, gpus: Sequence[Gpu]) -> list[GpuPlan]:
    return planner.plan(cfg, shape, card_sizes(gpus))


def check_topology(cfg: Config, shape: Shape, gpus: Sequence[Gpu]) -> None:
    """Before anything loads: every GPU the config names exists here, and each has at least the plan's
    predicted peak free now (trainer.plan_check=false skips the memory part, as it does the plan's check)."""
    missing = _unusable(cfg, gpus)
    if missing:
        raise ConfigError(missing)
    for note in priced_as_another_card(cfg, gpus):
        print(note, file=sys.stderr)
    if not cfg.trainer.plan_check:
        return
    short = _short_of_free(plan_on(cfg, shape, gpus), gpus)
    if short:
        raise ConfigError(
            f"{short} (lite-verl plan); free it (nvidia-smi lists what holds it), lower the memory knobs "
            "(--preset auto picks them), or set trainer.plan_check=false to try anyway"
        )


def _unusable(cfg: Config, gpus: Sequence[Gpu]) -> str | None:
    """Why these cards cannot take `cfg` whatever its memory knobs: a GPU id it names is not here, or its fp8
    KV cache is on a card without FP8."""
    return _missing(cfg, gpus) or _without_fp8(cfg, gpus)


def _missing(cfg: Config, gpus: Sequence[Gpu]) -> str | None:
    ids = sorted(g.id for g in gpus)
    have = f"GPU ids {ids}" if ids else "no CUDA GPU"
    roles = (
        ("rollout.gpus", cfg.rollout.gpus),
        ("train.gpus", cfg.train.gpus),
        ("reward.device", cfg.reward_gpus),
    )
    for key, used in roles:
        for g in used:
            if g not in ids:
                return f"{key} names GPU {g}, which this machine does not have ({have}); fix {key} or use --preset auto"
    return None


# Ada (RTX 40xx, L4) and later: vLLM's FP8 KV cache kernels; Ampere (3090, A10) has none
FP8_CAPABILITY = (8, 9)


def _without_fp8(cfg: Config, gpus: Sequence[Gpu]) -> str | None:
    """rollout.kv_cache_dtype=fp8 on a rollout card older than Ada: vLLM would fail at its start."""
    if cfg.rollout.kv_cache_dtype != "fp8":
        return None
    for g in gpus:
        if g.id in cfg.rollout.gpus and g.capability < FP8_CAPABILITY:
            return (
                f"rollout.kv_cache_dtype=fp8 needs a card with FP8 (compute capability 8.9+: RTX 40xx, L4, H100); "
                f"GPU {g.id} ({g.name}) is {g.capability[0]}.{g.capability[1]}: set rollout.kv_cache_dtype=auto"
            )
    return None


def priced_as_another_card(cfg: Config, gpus: Sequence[Gpu]) -> list[str]:
    """One line per used GPU whose cost.gpu_models entry names another card than the one detected (a
    4090 preset run on an H200): the run goes ahead, but the bill prices and labels it as the named card."""
    by_id, notes = {g.id: g for g in gpus}, []
    for gid in cfg.used_gpus:
        g, named = by_id.get(gid), cfg.cost.gpu_models[gid] if gid < len(cfg.cost.gpu_models) else None
        if g is not None and named is not None and named not in (g.card, g.name):
            notes.append(
                f"lite-verl: cost.gpu_models[{gid}] is {named!r} but GPU {gid} is {g.name!r}: the bill prices it as "
                f"{named!r}; set cost.gpu_models (and cost.price_per_hour) or use --preset auto"
            )
    return notes


def _short_of_free(plans: list[GpuPlan], gpus: Sequence[Gpu]) -> str | None:
    by_id = {g.id: g for g in gpus}
    for p in plans:
        g = by_id.get(p.gpu)
        if g is not None and p.peak_gib > g.free_gib:
            return f"GPU {p.gpu} ({g.name}) has {g.free_gib:.1f} GiB free but needs ~{p.peak_gib:.1f} GiB"
    return None


def misfit(cfg: Config, shape: Shape, gpus: Sequence[Gpu]) -> str | None:
    """Why `cfg` cannot run on these cards (None when it can): a card's plan does not fit, or needs more
    than is free on it now. The cards can take it otherwise (_search checked _unusable first)."""
    plans = plan_on(cfg, shape, gpus)
    for p in plans:
        if not p.fits:
            return f"GPU {p.gpu} ({p.model}) would need ~{p.peak_gib:.1f} of {p.card_gib:.0f} GiB; {knob(cfg, p)}"
    return _short_of_free(plans, gpus)


def compose(
    base: str, layer: dict[str, Any], config_file: str | None, sets: Sequence[str], recipe: str | None = None
) -> Config:
    """The named-preset layers (layers.load_config) with auto's choices between the preset and the user's:
    defaults < recipe < preset `base` < `layer` < --config < --set, recorded as preset `auto-BASE`."""
    return load_config(base, config_file, sets, recipe=recipe, machine=layer, recorded_as=f"{AUTO}-{base}")


def choose(
    gpus: Sequence[Gpu],
    config_file: str | None = None,
    sets: Sequence[str] = (),
    shape: Shape | None = None,
    recipe: str | None = None,
) -> Choice:
    """The config auto runs with on these GPUs, and why. `shape` defaults to model.path's config.json."""
    if not gpus:
        cfg = compose("laptop", {}, config_file, sets, recipe)
        why = "auto: no CUDA GPU detected -> preset laptop: rollout (HF generate) and training on the CPU"
        return Choice(cfg, (), (why,))
    used, lines = _pick_cards(gpus)
    base, machine, placement = _layout(used)
    hardware, hw_lines = _hardware(gpus, used)
    machine = merge(machine, hardware)
    lines = [f"auto: {_describe(used)} -> {placement}", *lines, *hw_lines]
    if shape is None:
        from lite_verl.model.load import resolve_model_path

        shape = planner.shape_of(resolve_model_path(compose(base, machine, config_file, sets, recipe).model))
    cfg, found = _search(base, machine, (config_file, sets, recipe), shape, gpus)
    if cfg.train.grow_micro_batch and cfg.train.gradient_checkpointing is False:
        # the ladder drops checkpointing as soon as it fits; growing may rather keep it for more rows
        cfg = replace(cfg, train=replace(cfg.train, gradient_checkpointing="auto"))
    return Choice(cfg, tuple(gpus), tuple(lines + found))


def _pick_cards(gpus: Sequence[Gpu]) -> tuple[list[Gpu], list[str]]:
    """The cards of one model, the largest (then the most of them): roles sized for one card fit all of theirs."""
    models: dict[str, list[Gpu]] = {}
    for g in gpus:
        models.setdefault(g.card, []).append(g)
    used = max(models.values(), key=lambda gs: (gs[0].total_gib, len(gs)))
    idle = [g for g in gpus if g not in used]
    if not idle:
        return used, []
    names = ", ".join(f"{g.id} ({g.name}, {g.total_gib:.0f} GiB)" for g in idle)
    return used, [f"auto: GPU(s) {names} left idle: the roles go on the {len(used)}x {used[0].card} only"]


def _layout(used: list[Gpu]) -> tuple[str, dict[str, Any], str]:
    """The shipped preset this many cards match, its placement over the detected ids, and the sentence."""
    ids = [g.id for g in used]
    if len(ids) == 1:
        why = f"colocated like preset 4090x1: vLLM and the trainer share GPU {ids[0]}, vLLM sleeps during the update"
        return "4090x1", _placement(ids, ids), why
    if len(ids) == 2:
        why = f"split placement like preset 3090x2: vLLM on GPU {ids[0]}, the trainer on GPU {ids[1]}"
        return "3090x2", _placement(ids[:1], ids[1:]), why
    rollout, train, rest = ids[:2], ids[2:4], ids[4:]
    why = f"split placement like preset 4090x4: vLLM (tensor-parallel) on GPUs {rollout}, the trainer on {train}"
    if rest:
        why += f"; GPUs {rest} left idle (the trainer is one process in lite-verl 0.1)"
    return "4090x4", _placement(rollout, train), why


def _placement(rollout: list[int], train: list[int]) -> dict[str, Any]:
    return {"rollout": {"engine": "vllm", "gpus": rollout}, "train": {"gpus": train}}


def _describe(used: list[Gpu]) -> str:
    """The used cards in a few words, e.g. 2x NVIDIA GeForce RTX 3090 (24 GiB, no P2P). Without P2P, NCCL
    (vLLM's tensor parallelism, the trainer's group: device.nccl_env) goes through host memory."""
    g = used[0]
    p2p = ""
    if len(used) > 1:
        ids = {u.id for u in used}
        both_ways = all(ids - {u.id} <= set(u.peers) for u in used)
        p2p = ", P2P" if both_ways else ", no P2P"
    return f"{len(used)}x {g.name} ({g.total_gib:.0f} GiB{p2p})"


def _hardware(gpus: Sequence[Gpu], used: list[Gpu]) -> tuple[dict[str, Any], list[str]]:
    """cost.gpu_models of every detected id, the price of the used card, the dtype the card computes in."""
    card, lines = used[0].card, []
    price = known_prices().get(card)
    if price is None:
        lines.append(f"auto: no hourly price known for {card}: the bill counts USD 0 "
                     f"(--set 'cost.price_per_hour={{\"{card}\": PRICE}}')")  # fmt: skip
    layer: dict[str, Any] = {
        "cost": {"gpu_models": [g.card for g in sorted(gpus, key=lambda g: g.id)],
                 "price_per_hour": {card: price or 0.0, "cpu": 0.0}},
        "model": {"dtype": "bfloat16"},
    }  # fmt: skip
    low = min(g.capability for g in used)
    if low < (8, 0):
        layer["model"]["dtype"] = "float16"
        lines.append(
            f"auto: {card} (compute capability {low[0]}.{low[1]}) has no bfloat16 -> model.dtype=float16"
        )
    return layer, lines


def known_prices() -> dict[str, float]:
    """USD per GPU-hour of every card a shipped preset prices."""
    prices: dict[str, float] = {}
    for name in preset_names():
        prices.update(read_yaml(preset_path(name), name).get("cost", {}).get("price_per_hour", {}))
    return prices


@dataclass(frozen=True)
class Knobs:
    quantization: Quantization  # rollout.quantization
    backend: Backend  # train.backend
    checkpointing: bool  # train.gradient_checkpointing
    micro_batch_size: int  # train.micro_batch_size
    # rollout.kv_cache_gib=auto and train.offload_during_rollout: vLLM holds one rollout's KV cache, not a share
    # of the card, and the card holds vLLM or the trainer, not both (two host copies of the trainer a step)
    lean: bool = False
    # rollout.enforce_eager: vLLM without CUDA graphs, whose pool stays on the card while vLLM sleeps (plan:
    # VLLM_PROCESS_GIB against VLLM_CONTEXT_GIB: 0.48 GiB measured); the last resort: a 1.5B rollout took 9x as long
    eager: bool = False

    def layer(self) -> dict[str, Any]:
        out: dict[str, Any] = {"rollout": {"quantization": self.quantization},
                               "train": {"backend": self.backend, "gradient_checkpointing": self.checkpointing,
                                         "micro_batch_size": self.micro_batch_size}}  # fmt: skip
        if self.lean:
            out["rollout"]["kv_cache_gib"] = "auto"
            out["train"]["offload_during_rollout"] = True
        if self.eager:
            out["rollout"]["enforce_eager"] = True
        return out

    def group(self) -> str:
        lean = ", one rollout's KV cache, trainer offloaded during rollouts" if self.lean else ""
        eager = ", vLLM without CUDA graphs" if self.eager else ""
        return f"{self.backend} with {'AWQ' if self.quantization == 'awq' else 'unquantized'} rollout{lean}{eager}"


def ladder(micro_batch_size: int) -> Iterator[Knobs]:
    """The candidates in the order auto tries them, the lightest change to the run first; last, the most
    frugal backend and rollout made lean (one card shared by vLLM and the trainer only: validation refuses
    it elsewhere, and auto skips it there), and that without vLLM's CUDA graphs (slower decoding)."""
    quantizations: tuple[Quantization, ...] = ("none", "awq")
    backends: tuple[Backend, ...] = ("lora", "qlora")
    for quantization in quantizations:
        for backend in backends:
            yield Knobs(quantization, backend, False, micro_batch_size)
            yield from _halved(Knobs(quantization, backend, True, micro_batch_size))
    yield from _halved(Knobs("awq", "qlora", True, micro_batch_size, lean=True))
    yield from _halved(Knobs("awq", "qlora", True, micro_batch_size, lean=True, eager=True))


def _halved(k: Knobs) -> Iterator[Knobs]:
    """`k`, then with train.micro_batch_size halved down to 1."""
    mb = k.micro_batch_size
    while mb >= 1:
        yield replace(k, micro_batch_size=mb)
        mb //= 2


def _search(
    base: str,
    machine: dict[str, Any],
    user: tuple[str | None, Sequence[str], str | None],
    shape: Shape,
    gpus: Sequence[Gpu],
) -> tuple[Config, list[str]]:
    """The first candidate of the ladder that fits; one line per group (backend, rollout) none of whose
    candidates fits, one for the choice. A candidate the user's values turn into an earlier one is skipped.
    `user`: the user's layers (--config, --set, --recipe)."""
    start = int(read_yaml(preset_path(base), base)["train"]["micro_batch_size"])
    seen: list[Config] = []
    failed: dict[str, str] = {}  # group -> why its most frugal candidate did not fit
    invalid: ConfigError | None = None
    for k in ladder(start):
        try:
            cfg = compose(base, merge(machine, k.layer()), *user)
        except ConfigError as e:
            invalid = invalid or e
            continue
        if cfg in seen:
            continue
        missing = _unusable(cfg, gpus)
        if missing:  # GPU ids or an fp8 cache the user gave: no knob of the ladder fixes that
            raise ConfigError(missing)
        seen.append(cfg)
        why = misfit(cfg, shape, gpus)
        if why is None:
            lines = [f"auto: {group} does not fit: {w}" for group, w in failed.items()
                     if group != k.group()]  # fmt: skip
            return cfg, [*lines, _chosen(cfg, shape, gpus, failed.get(k.group()))]
        failed[k.group()] = why
    if invalid is not None and not seen:
        raise invalid
    last = list(failed.values())[-1]
    raise ConfigError(
        f"auto: a {shape.params() / 1e9:.1f}B-parameter model fits no candidate on {_describe(_pick_cards(gpus)[0])} "
        f"(tried {_tried(seen)}); the most frugal: {last}; use a smaller model or more GPUs"
    )


def _tried(seen: list[Config]) -> str:
    """The values the candidates took, e.g. "train.backend lora/qlora, train.micro_batch_size 8/4/2/1"."""
    keys = {
        "train.backend": [c.train.backend for c in seen],
        "rollout.quantization": [c.rollout.quantization for c in seen],
        "train.gradient_checkpointing": [str(c.train.gradient_checkpointing).lower() for c in seen],
        "train.micro_batch_size": [str(c.train.micro_batch_size) for c in seen],
        "train.offload_during_rollout": [str(c.train.offload_during_rollout).lower() for c in seen],
        "rollout.enforce_eager": [str(c.rollout.enforce_eager).lower() for c in seen],
    }
    return f"{len(seen)} configs: " + ", ".join(f"{k} {'/'.join(dict.fromkeys(v))}" for k, v in keys.items())


def _chosen(cfg: Config, shape: Shape, gpus: Sequence[Gpu], lighter: str | None) -> str:
    t, r = cfg.train, cfg.rollout
    free = {g.id: g.free_gib for g in gpus}
    peaks = ", ".join(f"GPU {p.gpu} ~{p.peak_gib:.1f} of {p.card_gib:.0f} GiB ({free[p.gpu]:.1f} free)"
                      for p in plan_on(cfg, shape, gpus))  # fmt: skip
    line = (f"auto: chose train.backend={t.backend}, rollout.quantization={r.quantization}, "
            f"train.gradient_checkpointing={str(t.gradient_checkpointing).lower()}, "
            f"train.micro_batch_size={t.micro_batch_size}"
            f"{f', rollout.kv_cache_gib={r.kv_cache_gib}' if r.kv_cache_gib else ''}"
            f"{', train.offload_during_rollout=true' if t.offload_during_rollout else ''}"
            f"{', rollout.enforce_eager=true (vLLM without CUDA graphs: rollouts several times slower)' if r.enforce_eager else ''}"
            f": {peaks}")  # fmt: skip
    return f"{line}; a lighter setting would not fit: {lighter}" if lighter else line
