"""AWQ 4-bit for the rollout engine: calibrate once with AutoAWQ, then re-quantize at every sync.

    lite-verl quantize MODEL_DIR OUT_DIR [--calib prompts.jsonl] [--group-size 128]

Calibration (AutoAWQ, once per (model, settings, calibration prompts); cached) finds, per decoder layer,
per-input-channel scales s (AWQ's activation-aware search) and per-group clip thresholds. The quantized
model is  norm / s  ->  Q(clip(W * s))  (and, for an fc -> fc pair such as up -> down, the first layer's
rows are divided by s). lite-verl records every scale and clip AutoAWQ applied, in order, next to the
model (RECIPE_FILE). With them the trained actor is re-quantized at each sync without re-calibrating:

* sync.mode=merged: W + s_lora * B @ A (fp32) -> fp16 -> the recorded ops replayed -> int4 with group
  zero points -> packed exactly as AutoAWQ's GEMM packer does (bit-for-bit; a test checks it against
  AutoAWQ) -> vLLM's in-place reload. An unchanged model reproduces the calibrated tensors exactly.
* sync.mode=adapter: vLLM serves the AWQ base plus the LoRA adapter. The quantized layers see inputs
  x / s and (for the first layer of an fc -> fc pair) produce outputs / s, so the adapter is mapped into
  that space: A' = A * s_in (columns), B' = B / s_out (rows). Without it the adapter would be wrong.

Why AutoAWQ: the design's choice; it is deprecated upstream but installs and quantizes with torch 2.13
and transformers 5.x (the GPU machine: transformers 5.17). Its scale/clip search is what lite-verl keeps.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from lite_verl.errors import ConfigError, MissingDependency, ModelError

RECIPE_FILE = (
    "lite_verl_awq_recipe.st"  # safetensors format; not *.safetensors, which vLLM would load as weights
)
META_FILE = "lite_verl_awq.json"
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # nibble order of AutoAWQ's GEMM packing (what vLLM's awq expects)
RECIPE_VERSION = 1


@dataclass(frozen=True)
class AWQSettings:
    group_size: int = 128
    zero_point: bool = True
    w_bit: int = 4
    max_calib_seq_len: int = 512  # calibration prompts are concatenated and cut into blocks of this length


# --- packing ---------------------------------------------------------------------------------------
def pack_int4(values: torch.Tensor) -> torch.Tensor:
    """[rows, cols] ints in 0..15 -> [rows, cols / 8] int32, nibbles in AutoAWQ's GEMM order."""
    rows, cols = values.shape
    v = values.to(torch.int32).reshape(rows, cols // 8, 8)
    packed = torch.zeros(rows, cols // 8, dtype=torch.int32, device=values.device)
    for i, j in enumerate(AWQ_ORDER):
        packed |= v[:, :, j] << (4 * i)
    return packed


def unpack_int4(packed: torch.Tensor) -> torch.Tensor:
    """Inverse of pack_int4 -> [rows, cols] int32 in 0..15."""
    rows, n = packed.shape
    out = torch.empty(rows, n, 8, dtype=torch.int32, device=packed.device)
    for i, j in enumerate(AWQ_ORDER):
        out[:, :, j] = (packed >> (4 * i)) & 0xF
    return out.reshape(rows, n * 8)


def quantize_weight(w: torch.Tensor, group_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """fp16 W [out, in] (already scaled and clipped) -> (qweight [in, out/8] int32, qzeros [in/g, out/8]
    int32, scales [in/g, out] fp16): AutoAWQ's zero-point fake quantization followed by its GEMM
    packer, the same fp16 operations in the same order, vectorised."""
    assert w.dtype == torch.float16 and w.shape[1] % group_size == 0 and w.shape[0] % 8 == 0
    out_f, in_f = w.shape
    g = w.reshape(-1, group_size)
    max_val, min_val = g.amax(dim=1, keepdim=True), g.amin(dim=1, keepdim=True)
    scales = (max_val - min_val).clamp(min=1e-5) / 15
    zeros = (-torch.round(min_val / scales)).clamp_(0, 15)
    fake = ((torch.clamp(torch.round(g / scales) + zeros, 0, 15) - zeros) * scales).reshape(out_f, in_f)
    scales = scales.reshape(out_f, -1).t().contiguous()  # [in/g, out]
    zeros = zeros.reshape(out_f, -1).t().contiguous()
    # the packer recovers the integers from the fake-quantized weight, as AutoAWQ's from_linear does
    scale_zeros = (zeros * scales).repeat_interleave(group_size, dim=0)  # [in, out]
    ints = torch.round((fake.t() + scale_zeros) / scales.repeat_interleave(group_size, dim=0)).to(torch.int32)
    return pack_int4(ints), pack_int4(zeros.to(torch.int32)), scales.half()


def dequantize(
    qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor, group_size: int
) -> torch.Tensor:
    """-> W [out, in] fp32, as vLLM's AWQ kernels compute it: (q - z) * s."""
    q = unpack_int4(qweight).float()
    z = unpack_int4(qzeros).float().repeat_interleave(group_size, dim=0)
    s = scales.float().repeat_interleave(group_size, dim=0)
    return ((q - z) * s).t()


# --- the recipe: every scale and clip AutoAWQ applied ----------------------------------------------
class AWQRecipe:
    """The calibration's scales and clips, replayable on new weights."""

    def __init__(self, groups: list[tuple[str, list[str], torch.Tensor]], clips: dict[str, torch.Tensor],
                 settings: AWQSettings, quantized: list[str], dtype: str = "float16") -> None:  # fmt: skip
        self.groups, self.clips, self.settings = groups, clips, settings
        self.dtype = getattr(torch, dtype)  # the dtype AutoAWQ scaled and clipped in
        self.quantized = set(quantized)  # linear layers AutoAWQ replaced by 4-bit ones
        self._in: dict[str, torch.Tensor] = {}
        self._out: dict[str, torch.Tensor] = {}
        for prev, layers, s in groups:
            for name in layers:
                self._in[name] = self._in[name] * s if name in self._in else s.clone()
            self._out[prev] = self._out[prev] * s if prev in self._out else s.clone()

    # storage: one safetensors file (tensors) whose metadata holds the structure
    def save(self, directory: Path) -> None:
        from safetensors.torch import save_file

        tensors = {f"scale.{i}": s.float().contiguous() for i, (_, _, s) in enumerate(self.groups)}
        tensors.update({f"clip.{name}": v.float().contiguous() for name, v in self.clips.items()})
        meta = {"version": RECIPE_VERSION, "groups": [[p, ls] for p, ls, _ in self.groups],
                "settings": asdict(self.settings), "quantized": sorted(self.quantized),
                "dtype": str(self.dtype).removeprefix("torch.")}  # fmt: skip
        save_file(tensors, str(directory / RECIPE_FILE), metadata={"lite_verl": json.dumps(meta)})

    @classmethod
    def load(cls, directory: Path) -> AWQRecipe:
        from safetensors import safe_open

        path = Path(directory) / RECIPE_FILE
        if not path.is_file():
            raise ModelError(
                f"{directory} has no {RECIPE_FILE}: it was not quantized by lite-verl, so the trained weights "
                "cannot be mapped into it; quantize with `lite-verl quantize` (or leave rollout.quantized_path empty)"
            )
        with safe_open(str(path), "pt") as f:
            meta = json.loads(f.metadata()["lite_verl"])
            tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 - safe_open has no __iter__
        groups = [(p, list(ls), tensors[f"scale.{i}"]) for i, (p, ls) in enumerate(meta["groups"])]
        clips = {k.removeprefix("clip."): v for k, v in tensors.items() if k.startswith("clip.")}
        return cls(groups, clips, AWQSettings(**meta["settings"]), meta["quantized"], meta["dtype"])

    # replay
    def lora_factors(self, name: str) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """(s_in, s_out) of a linear layer: its quantized input is x / s_in, its output y / s_out."""
        return self._in.get(name), self._out.get(name)

    def transform(
        self, name: str, weight: torch.Tensor, bias: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The scale and clip ops AutoAWQ applied to this layer, replayed in order, in its dtype -> fp16."""
        w = weight.to(self.dtype).clone()
        b = None if bias is None else bias.to(self.dtype).clone()
        for prev, layers, s in self.groups:
            s = s.to(w.device)
            if name in layers:
                w.mul_(s.view(1, -1))
            if name == prev:  # a norm (1-D weight) or the first linear of an fc -> fc pair
                if w.dim() == 1:
                    w.div_(s)
                else:
                    w[-s.size(0) :].div_(s.view(-1, 1))
                if b is not None:
                    b.div_(s.view(-1))
        clip = self.clips.get(name)
        if clip is not None:
            clip = clip.to(w.device)
            w = torch.clamp(w.reshape(*clip.shape[:2], -1), -clip.to(w.dtype), clip.to(w.dtype)).reshape(
                w.shape
            )
        return w.half(), None if b is None else b.half()

    def quantize_linear(
        self, name: str, weight: torch.Tensor, bias: torch.Tensor | None
    ) -> dict[str, torch.Tensor]:
        """-> vLLM checkpoint tensors of one linear layer: {name.qweight, .qzeros, .scales[, .bias]}."""
        w, b = self.transform(name, weight, bias)
        qweight, qzeros, scales = quantize_weight(w, self.settings.group_size)
        out = {f"{name}.qweight": qweight, f"{name}.qzeros": qzeros, f"{name}.scales": scales}
        if b is not None:
            out[f"{name}.bias"] = b
        return out


# --- calibration (AutoAWQ) ---------------------------------------------------------------------------
def require_autoawq() -> None:
    if importlib.util.find_spec("awq") is None:
        raise MissingDependency(
            "autoawq", "awq", "AWQ quantization (rollout.quantization=awq, lite-verl quantize)"
        )


def model_fingerprint(model_dir: Path) -> str:
    """Hash of the config and every weight file's bytes (a fine-tuned model with the same shapes differs)."""
    h = hashlib.blake2b(digest_size=16)
    for f in sorted(Path(model_dir).iterdir()):
        if f.name == "config.json" or f.suffix in (".safetensors", ".bin"):
            h.update(f.name.encode())
            with open(f, "rb") as fh:
                while chunk := fh.read(1 << 24):
                    h.update(chunk)
    return h.hexdigest()


def cache_key(model_dir: Path, settings: AWQSettings, calib: list[list[int]]) -> str:
    h = hashlib.blake2b(digest_size=12)
    h.update(model_fingerprint(model_dir).encode())
    h.update(json.dumps([asdict(settings), RECIPE_VERSION]).encode())
    h.update(json.dumps(calib).encode())
    return h.hexdigest()


def _recording_quantizer():
    from awq.quantize.quantizer import AwqQuantizer
    from awq.utils.module import get_op_name

    class RecordingQuantizer(AwqQuantizer):
        """AutoAWQ's quantizer, keeping the scales and clips it applies (AutoAWQ discards them)."""

        record: dict[str, Any]

        def _search_best_scale(self, module, prev_op, layers, inp, module2inspect=None, kwargs={}):  # noqa: B006
            prev, names, scales = super()._search_best_scale(
                module, prev_op, layers, inp, module2inspect, kwargs
            )
            pre = get_op_name(self.model, module) + "."
            self.record["groups"].append(
                (pre + prev, [pre + n for n in names], scales.detach().float().clone())
            )
            return prev, names, scales

        def _compute_best_scale(
            self,
            x,
            w_mean,
            x_mean,
            module2inspect,
            linears2scale,
            fp16_output,
            kwargs={},  # noqa: B006
        ):
            # AutoAWQ snapshots the weights with `v.cpu()`, which on a CPU is the live tensor itself, so its
            # grid search leaves them scaled by the first candidate: restore from real copies instead
            saved = {k: v.detach().clone() for k, v in module2inspect.state_dict().items()}
            try:
                return super()._compute_best_scale(
                    x, w_mean, x_mean, module2inspect, linears2scale, fp16_output, kwargs
                )
            finally:
                module2inspect.load_state_dict(saved)

        def _search_best_clip(self, layer, named_linears, input_feat):
            clips = super()._search_best_clip(layer, named_linears, input_feat)
            pre = get_op_name(self.model, layer) + "."
            self.record["clips"].update({pre + n: v.detach().float().cpu().clone() for n, v in clips})
            return clips

        def _apply_quant(self, module, named_linears):
            pre = get_op_name(self.model, module) + "."
            self.record["quantized"] += [pre + n for n in named_linears]
            return super()._apply_quant(module, named_linears)

    return RecordingQuantizer


def quantize_model(
    model_dir: Path, out_dir: Path, calib: list[list[int]], settings: AWQSettings = AWQSettings()
) -> Path:
    """AWQ-quantize model_dir into out_dir (atomically), calibrated on token-id sequences `calib`;
    out_dir loads in vLLM (quantization awq / awq_marlin) and holds lite-verl's recipe."""
    check_group_size(model_dir, settings.group_size)
    require_autoawq()
    import warnings

    from transformers import AutoTokenizer

    from lite_verl.run.files import atomic_directory

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from awq import AutoAWQForCausalLM

    model_dir = Path(model_dir)
    seqs = [list(s)[: settings.max_calib_seq_len] for s in calib if s]
    total = sum(len(s) for s in seqs)
    if total < 64:
        raise ModelError(f"AWQ calibration needs at least 64 prompt tokens; got {total}")
    seq_len = min(settings.max_calib_seq_len, total)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    # fp16, as AutoAWQ intends (transformers 5 ignores its torch_dtype= and would load the config's dtype)
    model = AutoAWQForCausalLM.from_pretrained(str(model_dir), safetensors=True, dtype=torch.float16)
    quantizer = _recording_quantizer()
    quantizer.record = {"groups": [], "clips": {}, "quantized": []}
    model.quantize(
        tokenizer,
        quant_config={"zero_point": settings.zero_point, "q_group_size": settings.group_size,
                      "w_bit": settings.w_bit, "version": "GEMM"},
        calib_data=seqs, max_calib_samples=len(seqs), max_calib_seq_len=seq_len, quantizer_cls=quantizer,
    )  # fmt: skip
    record = quantizer.record
    dtype = str(next(model.model.parameters()).dtype).removeprefix("torch.")
    recipe = AWQRecipe(record["groups"], record["clips"], settings, record["quantized"], dtype)
    with atomic_directory(Path(out_dir)) as tmp:
        model.save_quantized(str(tmp))
        tokenizer.save_pretrained(tmp)
        gen = model_dir / "generation_config.json"
        if gen.is_file():
            (tmp / gen.name).write_text(gen.read_text())
        recipe.save(tmp)
        (tmp / META_FILE).write_text(json.dumps({
            "source": str(model_dir.resolve()), "source_fingerprint": model_fingerprint(model_dir),
            "settings": asdict(settings), "calib_sequences": len(seqs), "calib_tokens": total,
        }, indent=1))  # fmt: skip
    return Path(out_dir)


def check_group_size(model_dir: Path, group: int) -> None:
    """Every quantized linear layer's input (hidden_size; intermediate_size for the MLP's down
    projection) must be whole groups; else one line naming the group size that fits."""
    f = Path(model_dir) / "config.json"
    if not f.is_file():
        return  # the model loader reports a missing or malformed directory itself
    config = json.loads(f.read_text())
    config = config.get("text_config", config)
    widths = {k: config[k] for k in ("hidden_size", "intermediate_size") if isinstance(config.get(k), int)}
    bad = {k: v for k, v in widths.items() if v % group}
    if not bad:
        return
    fits = [g for g in (128, 64, 32) if all(v % g == 0 for v in widths.values())]
    fix = f"set rollout.awq_group_size={fits[0]}" if fits else "use rollout.quantization=none"
    k, v = next(iter(bad.items()))
    raise ConfigError(
        f"rollout.awq_group_size={group} does not divide {Path(model_dir).name}'s {k}={v}: {fix}"
    )


def quantized_for_run(model_dir: Path, calib: list[list[int]], settings: AWQSettings = AWQSettings()) -> Path:
    """The cached AWQ model for (model, settings, calibration prompts); quantized on first use."""
    from lite_verl.model.tiny import cache_dir

    out = cache_dir() / "awq" / cache_key(model_dir, settings, calib)
    if not (out / RECIPE_FILE).is_file():
        quantize_model(model_dir, out, calib, settings)
    return out
