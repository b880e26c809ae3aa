"""`lite-verl quantize` and `lite-verl export`: AWQ models and trained policies as model directories.

    lite-verl quantize MODEL_DIR OUT_DIR [--calib prompts.jsonl] [--group-size 128] [--max-prompts 512]
    lite-verl export RUN_DIR OUT_DIR [--format hf|awq|gguf] [--quant q8_0] [--push-to-hub org/name [--dry-run]]

export --format hf merges the last checkpoint's LoRA adapter into the base (W + s * B @ A) and writes a
normal HF model; --format awq then AWQ-quantizes that merged model, calibrated afresh on the run's own
prompts (the final policy deserves its own scale search; syncs during training reuse the first one);
--format gguf converts it with llama.cpp's converter (ship/gguf.py) and writes an Ollama Modelfile. Every
format gets a model card (README.md) from the run; --push-to-hub uploads the directory (ship/hub.py).
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from lite_verl.errors import UserError


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
    tokenizer = load_tokenizer(Path(model_dir))
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


def export_run(run_dir: str, out_dir: str, fmt: str = "hf", quant: str = "") -> Path:
    """The run's last checkpoint -> OUT_DIR as a HF model (hf), an AWQ model (awq) or a GGUF file + Modelfile
    (gguf), with a model card (README.md) written from the run."""
    from lite_verl.run.files import atomic_directory, atomic_write_text
    from lite_verl.run.rundir import load_run_config
    from lite_verl.ship.card import model_card

    if fmt not in ("hf", "awq", "gguf"):
        raise UserError(f"--format {fmt}: use hf, awq or gguf")
    if quant and fmt != "gguf":
        raise UserError(f"--quant {quant} applies to --format gguf only")
    if fmt == "gguf":
        from lite_verl.ship.gguf import check_quant

        quant = check_quant(quant or "f16")
    run, out = Path(run_dir), Path(out_dir)
    check_out_dir(run, out)
    cfg = load_run_config(run, [])
    if fmt == "hf":
        _merged_hf(run, cfg, out)
    else:
        hf = Path(tempfile.mkdtemp(prefix="lite-verl-export-"))
        try:
            _merged_hf(run, cfg, hf)
            if fmt == "awq":
                _awq(hf, out, cfg)
            else:
                from lite_verl.ship.gguf import write_gguf

                with atomic_directory(out) as tmp:
                    write_gguf(hf, tmp, quant, "model")
        finally:
            shutil.rmtree(hf, ignore_errors=True)
    files = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())
    atomic_write_text(out / "README.md", model_card(run, cfg, fmt, [*files, "README.md"]))
    return out


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


def _merged_hf(run: Path, cfg, target: Path) -> Path:
    """The last checkpoint's policy as a HF model directory: a LoRA adapter merged into the base (in fp32,
    then cast to model.dtype), or a full-weights checkpoint as it is."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from lite_verl.model.load import load_tokenizer, quant_method, resolve_model_path
    from lite_verl.model.plain import plain_copy
    from lite_verl.run.files import atomic_directory
    from lite_verl.run.rundir import RunDir

    ckpt = RunDir(run).latest_checkpoint()
    if ckpt is None:
        raise UserError(
            f"{run} holds no complete checkpoint; train with trainer.save_every > 0 (or to the end) "
            "and trainer.keep_checkpoints > 0"
        )
    path = resolve_model_path(cfg.model)
    tokenizer = load_tokenizer(path, cfg.model.trust_remote_code)
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
    merged = merged.to(getattr(torch, cfg.model.dtype))
    with atomic_directory(target) as tmp:
        merged.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        if (path / "generation_config.json").is_file():
            shutil.copy(path / "generation_config.json", tmp / "generation_config.json")
    return target


def _awq(hf: Path, out: Path, cfg) -> Path:
    """AWQ-quantize the merged model, calibrated afresh on the run's own prompts."""
    from lite_verl.quant.awq import AWQSettings, quantize_model

    data = [f"data.{k}={v}" for k, v in (("task", cfg.data.task), ("task_size", cfg.data.task_size))]
    calib = cfg.data.train_files[0] if cfg.data.train_files else None
    prompts = _prompts(hf, calib, 512, cfg.trainer.seed, data)
    return quantize_model(hf, out, prompts, AWQSettings(group_size=cfg.rollout.awq_group_size))
