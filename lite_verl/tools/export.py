"""`lite-verl quantize` and `lite-verl export`: AWQ models and trained policies as model directories.

    lite-verl quantize MODEL_DIR OUT_DIR [--calib prompts.jsonl] [--group-size 128] [--max-prompts 512]
    lite-verl export RUN_DIR OUT_DIR [--format hf|adapter|awq|gguf] [--quant q8_0] [--dtype auto] [--step N]
                     [--awq-group-size 64] [--push-to-hub org/name [--dry-run]]

export --format hf merges the last checkpoint's LoRA adapter into the base (W + s * B @ A) and writes a
normal HF model; --format awq then AWQ-quantizes that merged model, calibrated afresh on the run's own
prompts (the final policy deserves its own scale search; syncs during training reuse the first one);
--format gguf converts it with llama.cpp's converter (ship/gguf.py) and writes an Ollama Modelfile. Every
format gets a model card (README.md) from the run; --push-to-hub uploads the directory (ship/hub.py).
--format adapter writes the LoRA adapter alone (peft's directory, with the tokenizer: Unsloth's
save_method="lora"). --dtype auto keeps the base model's own dtype (a bf16 model trained in fp32 on a
laptop exports bf16); --step picks an earlier checkpoint.
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from lite_verl.errors import UserError

FORMATS = ("hf", "adapter", "awq", "gguf")
DTYPES = ("auto", "bfloat16", "float16", "float32")


@dataclass(frozen=True)
class ExportOptions:
    fmt: str = "hf"  # hf | adapter | awq | gguf
    quant: str = ""  # gguf: f16, q8_0, q4_k_m, ...
    dtype: str = "auto"  # the merged weights' dtype; auto = the base model's own
    step: int = 0  # the checkpoint of this step; 0 = the last complete one
    awq_group_size: int = 0  # awq: 32, 64 or 128; 0 = the run's rollout.awq_group_size


def _prompts(
    model_dir: Path, calib: str | None, limit: int, seed: int = 0, data_overrides: list[str] | None = None
):
    from lite_verl.config import load_config
    from lite_verl.data.loader import load_prompt_sets
    from lite_verl.model.load import load_tokenizer

    overrides = [f"model.path={model_dir}", "data.val_size=0", "data.task=arithmetic"]
    if calib:
        overrides.append(f"data.train_files=[{calib}]")
    cfg = load_config("laptop", None, overrides + (data_overrides or []))
    tokenizer = load_tokenizer(Path(model_dir), chat_template=cfg.data.chat_template)
    train, _ = load_prompt_sets(cfg.data, tokenizer, seed)
    return [list(ids) for ids in train.token_ids[:limit]]


def quantize_command(
    model_dir: str, out_dir: str, calib: str | None, group_size: int, max_prompts: int
) -> Path:
    from lite_verl.model.hub import parse_hub_id
    from lite_verl.model.load import check_causal_lm
    from lite_verl.quant.awq import AWQSettings, quantize_model, require_autoawq

    require_autoawq()
    src = Path(model_dir)
    if model_dir.lower().endswith(".gguf") or parse_hub_id(model_dir):
        from lite_verl.config import ModelConfig
        from lite_verl.model.load import resolve_model_path

        src = resolve_model_path(ModelConfig(path=model_dir))  # a Hub id's snapshot, a GGUF file's import
    if not (src / "config.json").is_file():
        raise UserError(f"{src} is not a model directory (no config.json); give a Hugging Face model dir")
    check_causal_lm(src)
    if group_size not in (32, 64, 128):
        raise UserError(f"--group-size {group_size}: use 32, 64 or 128")
    prompts = _prompts(src, calib, max_prompts)
    return quantize_model(src, Path(out_dir), prompts, AWQSettings(group_size=group_size))


def export_run(run_dir: str, out_dir: str, opts: ExportOptions | None = None) -> Path:
    """A checkpoint of the run -> OUT_DIR as a HF model (hf), its adapter (adapter), an AWQ model (awq) or a
    GGUF file + Modelfile (gguf), with a model card (README.md) written from the run."""
    from lite_verl.run.files import atomic_directory, atomic_write_text
    from lite_verl.run.rundir import load_run_config
    from lite_verl.ship.card import model_card

    opts = opts or ExportOptions()
    quant = _check_options(opts)
    run, out = Path(run_dir), Path(out_dir)
    check_out_dir(run, out)
    cfg = load_run_config(run, [])
    ckpt = checkpoint_of(run, opts.step)
    if opts.fmt == "hf":
        _merged_hf(ckpt, cfg, out, opts.dtype)
    elif opts.fmt == "adapter":
        _adapter(ckpt, cfg, out)
    else:
        hf = Path(tempfile.mkdtemp(prefix="lite-verl-export-"))
        try:
            _merged_hf(ckpt, cfg, hf, opts.dtype)
            if opts.fmt == "awq":
                _awq(hf, out, cfg, opts.awq_group_size or cfg.rollout.awq_group_size)
            else:
                from lite_verl.ship.gguf import write_gguf

                with atomic_directory(out) as tmp:
                    write_gguf(hf, tmp, quant, "model")
        finally:
            shutil.rmtree(hf, ignore_errors=True)
    files = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())
    atomic_write_text(out / "README.md", model_card(run, cfg, opts.fmt, [*files, "README.md"]))
    return out


def _check_options(opts: ExportOptions) -> str:
    """-> the GGUF quant type; one line for an option that does not apply."""
    if opts.fmt not in FORMATS:
        raise UserError(f"--format {opts.fmt}: use {', '.join(FORMATS)}")
    if opts.quant and opts.fmt != "gguf":
        raise UserError(f"--quant {opts.quant} applies to --format gguf only")
    if opts.dtype not in DTYPES:
        raise UserError(f"--dtype {opts.dtype}: use {', '.join(DTYPES)}")
    if opts.awq_group_size and (opts.fmt != "awq" or opts.awq_group_size not in (32, 64, 128)):
        raise UserError(f"--awq-group-size {opts.awq_group_size}: 32, 64 or 128, with --format awq")
    if opts.fmt != "gguf":
        return ""
    from lite_verl.ship.gguf import check_quant

    return check_quant(opts.quant or "f16")


def checkpoint_of(run: Path, step: int = 0) -> Path:
    """The run's checkpoint of `step` (0: the last complete one); one line naming the steps there are."""
    from lite_verl.run.rundir import RunDir, checkpoint_problem

    if step <= 0:
        ckpt = RunDir(run).latest_checkpoint()
        if ckpt is None:
            raise UserError(f"{run} holds no complete checkpoint; train with trainer.save_every > 0 (or to the end) "
                            "and trainer.keep_checkpoints > 0")  # fmt: skip
        return ckpt
    ckpt = run / "checkpoints" / f"step_{step:08d}"
    if not ckpt.is_dir() or checkpoint_problem(ckpt):
        have = sorted(int(p.name.split("_")[-1]) for p in (run / "checkpoints").glob("step_*") if p.is_dir())
        raise UserError(f"--step {step}: {run} has no complete checkpoint of that step (it has: "
                        f"{', '.join(map(str, have)) or 'none'}; trainer.keep_checkpoints keeps the last ones)")  # fmt: skip
    return ckpt


def check_out_dir(run: Path, out: Path) -> None:
    """OUT is replaced whole (atomically): it must be new, empty, or an earlier export, and not hold the run."""
    r, o = run.resolve(), out.resolve()
    if o == r or r in o.parents or o in r.parents:
        raise UserError(f"export {run} {out}: OUT must be outside the run directory (and not contain it)")
    if o.is_dir() and any(o.iterdir()):
        from lite_verl.ship.card import CARD_MARK

        card = o / "README.md"
        earlier = card.is_file() and CARD_MARK in card.read_text(errors="replace")
        if not earlier:
            raise UserError(f"{out} exists and is not empty; give a new directory (an earlier lite-verl export "
                            "there would be replaced)")  # fmt: skip
    elif o.exists() and not o.is_dir():
        raise UserError(f"{out} is a file; give a directory for the export")


def _merged_hf(ckpt: Path, cfg, target: Path, dtype: str = "auto") -> Path:
    """A checkpoint's policy as a HF model directory: a LoRA adapter merged into the base (in fp32, then
    cast to `dtype`), or a full-weights checkpoint as it is."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from lite_verl.model.load import load_tokenizer, quant_method, resolve_model_path
    from lite_verl.model.plain import plain_copy
    from lite_verl.run.files import atomic_directory

    path = resolve_model_path(cfg.model)
    tokenizer = load_tokenizer(path, cfg.model.trust_remote_code, cfg.data.chat_template)
    if (ckpt / "adapter").is_dir():  # lora / qlora: the adapter merged into the base, in fp32
        base = AutoModelForCausalLM.from_pretrained(
            path, dtype=torch.float32, trust_remote_code=cfg.model.trust_remote_code
        )
        prequantized = quant_method(path) is not None  # a *-bnb-4bit: dequantized, merged (merged_16bit)
        base = base.dequantize() if prequantized else base
        merged = PeftModel.from_pretrained(base, ckpt / "adapter").merge_and_unload()
        merged = plain_copy(merged) if prequantized else merged
    elif (ckpt / "model").is_dir():  # fsdp / deepspeed: the checkpoint holds the full weights
        merged = AutoModelForCausalLM.from_pretrained(
            ckpt / "model", dtype=torch.float32, trust_remote_code=cfg.model.trust_remote_code
        )
    else:
        raise UserError(f"{ckpt} holds neither adapter/ nor model/; is it a lite-verl checkpoint?")
    merged = merged.to(getattr(torch, base_dtype(path, cfg.model.dtype) if dtype == "auto" else dtype))
    with atomic_directory(target) as tmp:
        merged.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        if (path / "generation_config.json").is_file():
            shutil.copy(path / "generation_config.json", tmp / "generation_config.json")
    return target


def base_dtype(path: Path, fallback: str) -> str:
    """The dtype the base model was saved in (config.json's dtype / torch_dtype), else `fallback`."""
    import json

    try:
        raw = json.loads((path / "config.json").read_text())
    except (OSError, ValueError):
        return fallback
    saved = raw.get("dtype") or raw.get("torch_dtype")
    return saved if saved in DTYPES[1:] else fallback


def _adapter(ckpt: Path, cfg, out: Path) -> Path:
    """The checkpoint's LoRA adapter as peft wrote it (PeftModel.from_pretrained(base, OUT)), the tokenizer beside."""
    from lite_verl.model.load import load_tokenizer, resolve_model_path
    from lite_verl.run.files import atomic_directory

    if not (ckpt / "adapter").is_dir():
        raise UserError(
            f"{ckpt} holds full weights (train.backend={cfg.train.backend}), no adapter; use --format hf"
        )
    with atomic_directory(out) as tmp:
        shutil.copytree(ckpt / "adapter", tmp, dirs_exist_ok=True, ignore=shutil.ignore_patterns("critic"))
        tokenizer = load_tokenizer(
            resolve_model_path(cfg.model), cfg.model.trust_remote_code, cfg.data.chat_template
        )
        tokenizer.save_pretrained(tmp)
    return out


def _awq(hf: Path, out: Path, cfg, group_size: int) -> Path:
    """AWQ-quantize the merged model, calibrated afresh on the run's own prompts."""
    from lite_verl.quant.awq import AWQSettings, quantize_model

    data = [f"data.{k}={v}" for k, v in (("task", cfg.data.task), ("task_size", cfg.data.task_size))]
    calib = cfg.data.train_files[0] if cfg.data.train_files else None
    prompts = _prompts(hf, calib, 512, cfg.trainer.seed, data)
    return quantize_model(hf, out, prompts, AWQSettings(group_size=group_size))
