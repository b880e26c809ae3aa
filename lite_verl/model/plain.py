"""A model loaded quantized (from a GGUF file, a bitsandbytes checkpoint), as plain weights that save."""

from __future__ import annotations

from typing import Any

import torch


def plain_copy(model: Any, config: Any = None) -> Any:
    """The same weights in a model built from its config (or `config`) without quantization_config:
    transformers refuses to save a model it loaded quantized (GGUF, bitsandbytes) even once dequantized."""
    import copy

    from transformers import AutoModelForCausalLM

    config = copy.deepcopy(config or model.config)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    clean = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    clean.load_state_dict(model.state_dict())
    return clean
