"""train.use_liger: Liger's Triton kernels in the trainer's model, as verl's `use_liger` applies them.

Liger replaces a loaded model's RMSNorm and SwiGLU MLP forwards and its architecture's RoPE function with
fused Triton kernels: fewer launches per decoder layer (a small update is host-bound) and fewer saved
activations, the same maths up to rounding. Its loss kernels stay off: the update computes log-probs with
its own fused fp32 head (train/head.py), never a cross-entropy. Liger patches transformers' modeling module
of the architecture for the whole process, as verl's workers do; it is applied to the base model before
peft wraps it, so the adapters sit inside the fused MLP's projections unchanged.
"""

from __future__ import annotations

import inspect
import sys

import torch

# what Liger's apply_liger_kernel_to_<architecture>(...) gets; each takes the names it knows
KERNELS = {
    "rope": True,
    "rms_norm": True,
    "swiglu": True,
    "cross_entropy": False,
    "fused_linear_cross_entropy": False,
}


def apply_liger(model: torch.nn.Module) -> bool:
    """Liger's kernels in a loaded HF causal LM (in place) -> whether Liger covers its architecture (when not,
    one line says so and the model runs as transformers builds it)."""
    from liger_kernel.transformers.monkey_patch import MODEL_TYPE_TO_APPLY_LIGER_FN

    model_type = getattr(getattr(model, "config", None), "model_type", None)
    apply = MODEL_TYPE_TO_APPLY_LIGER_FN.get(model_type)
    if apply is None:
        print(
            f"lite-verl: train.use_liger: Liger has no kernels for model type {model_type!r}; "
            "the trainer runs it as transformers builds it",
            file=sys.stderr,
        )
        return False
    known = inspect.signature(apply).parameters
    apply(model=model, **{k: v for k, v in KERNELS.items() if k in known})
    return True
