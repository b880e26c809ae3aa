"""Import a GGUF file (llama.cpp's format, which many hobbyists hold) as a normal Hugging Face model dir.

    lite-verl import-gguf model.Q4_1.gguf OUT_DIR [--dtype bfloat16]

transformers dequantizes GGUF on load but refuses to `save_pretrained` such a model, so the weights
are copied into a clean model built from the same config (without its quantization_config).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from lite_verl.errors import MissingDependency, ModelError


def import_gguf(gguf_file: str | Path, out_dir: str | Path, dtype: str = "bfloat16") -> Path:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from lite_verl.device import torch_dtype
    from lite_verl.run.files import atomic_directory

    src, out = Path(gguf_file), Path(out_dir)
    if not src.is_file():
        raise ModelError(f"{src} does not exist; give the path of a .gguf file")
    if importlib.util.find_spec("gguf") is None:
        raise MissingDependency("gguf", "gguf", "reading GGUF files")
    folder, name = str(src.parent), src.name
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
        loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    except (ValueError, OSError, KeyError) as e:
        raise ModelError(
            f"{src}: transformers cannot read this GGUF file ({type(e).__name__}: {e})"
        ) from None
    config = AutoConfig.from_pretrained(folder, gguf_file=name)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    clean = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    clean.load_state_dict(loaded.state_dict())
    clean = clean.to(torch_dtype(dtype))
    with atomic_directory(out) as tmp:
        clean.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
    return out
