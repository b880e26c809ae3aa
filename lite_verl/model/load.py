"""Loading the policy's base model and tokenizer, with errors a user can act on.

`model.path` is any Hugging Face causal-LM directory (loaded with the real `from_pretrained`), or
`tiny:qwen2` / `tiny:llama` for a random-init model made on the spot (see tiny.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from lite_verl.config import ModelConfig
from lite_verl.errors import ModelError


def resolve_model_path(cfg: ModelConfig) -> Path:
    if cfg.path.startswith("tiny:"):
        from lite_verl.model.tiny import resolve_tiny

        arch = cfg.path.split(":", 1)[1]
        if arch not in ("qwen2", "llama"):
            raise ModelError(f"model.path={cfg.path!r}: tiny models are tiny:qwen2 or tiny:llama")
        return resolve_tiny(cfg.path)
    path = Path(cfg.path).expanduser()
    if not path.is_dir():
        raise ModelError(
            f"model.path={cfg.path!r} does not exist; give a local Hugging Face model directory "
            "(no downloads at run time) or tiny:qwen2"
        )
    config_file = path / "config.json"
    if not config_file.is_file():
        raise ModelError(
            f"model.path={cfg.path!r} has no config.json; it is not a Hugging Face model directory"
        )
    check_causal_lm(path)
    return path


def check_causal_lm(path: Path) -> None:
    from transformers import AutoConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    try:
        raw = json.loads((path / "config.json").read_text())
    except json.JSONDecodeError:
        raise ModelError(f"{path}/config.json is not valid JSON") from None
    model_type = raw.get("model_type")
    if model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES and not raw.get("auto_map"):
        raise ModelError(
            f"model.path={str(path)!r} is a {model_type!r} model, not a causal LM transformers can train; "
            "use a decoder-only model (Qwen2, Llama, ...)"
        )
    AutoConfig.from_pretrained(path)


def load_tokenizer(path: Path, trust_remote_code: bool = False):
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as e:
        raise ModelError(
            f"model.path={str(path)!r}: cannot load its tokenizer ({e.__class__.__name__})"
        ) from None
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    tok.padding_side = "left"
    return tok


def load_model(path: Path, cfg: ModelConfig, device: torch.device, nf4: bool = False):
    """The model in cfg.dtype on `device`; nf4=True (train.backend=qlora): every linear layer of the
    decoder stored as bitsandbytes 4-bit NF4 (double-quantized), computing in cfg.dtype; the LM head
    and embeddings stay in cfg.dtype."""
    from transformers import AutoModelForCausalLM

    from lite_verl.device import torch_dtype

    if not nf4:
        model = AutoModelForCausalLM.from_pretrained(
            path, dtype=torch_dtype(cfg.dtype), trust_remote_code=cfg.trust_remote_code
        )
        return model.to(device)
    from transformers import BitsAndBytesConfig

    quant = BitsAndBytesConfig(
        load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
        bnb_4bit_compute_dtype=torch_dtype(cfg.dtype),
    )  # fmt: skip
    model = AutoModelForCausalLM.from_pretrained(
        path, dtype=torch_dtype(cfg.dtype), quantization_config=quant, device_map={"": str(device)},
        trust_remote_code=cfg.trust_remote_code,
    )  # fmt: skip
    # On a CPU, bitsandbytes repacks a 4-bit weight into an inference-only layout at its first eval
    # forward, after which training through that layer fails; lite-verl generates and trains with the
    # same layers, so that repacking is turned off.
    for module in model.modules():
        if hasattr(module, "support_avx512bf16_for_cpu"):
            module.support_avx512bf16_for_cpu = False
    return model
