"""The LM head in fp32: logits = h @ W^T accumulated and returned in fp32, for bf16/fp16 models.

Rounding logits to bf16 moves each log-prob by up to half a bf16 step of the logit (0.06 nats at a
logit of 16), independently in the trainer and in vLLM: that alone made a 0.03-0.04 nats/token gap
between them on an H200. With `model.fp32_lm_head` both sides compute the head in fp32 (vLLM through
lite_verl.rollout.vllm_compat). The weight is cast a vocabulary chunk at a time, forward and backward,
so no fp32 copy of the whole head is kept (0.9 GB for Qwen2.5-1.5B).
"""

from __future__ import annotations

import torch

from lite_verl.algos import entropy_from_logits, log_probs_from_logits

CHUNK_ROWS = 16384  # vocabulary rows cast to fp32 at a time


class _FP32Head(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        ctx.save_for_backward(hidden, weight)
        h = hidden.float()
        out = torch.empty(*hidden.shape[:-1], weight.shape[0], dtype=torch.float32, device=hidden.device)
        for s in range(0, weight.shape[0], CHUNK_ROWS):
            out[..., s : s + CHUNK_ROWS] = h @ weight[s : s + CHUNK_ROWS].float().t()
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # type: ignore[override]
        hidden, weight = ctx.saved_tensors
        grad_h = grad_w = None
        if ctx.needs_input_grad[0]:
            grad_h = torch.zeros(hidden.shape, dtype=torch.float32, device=hidden.device)
            for s in range(0, weight.shape[0], CHUNK_ROWS):
                grad_h += grad[..., s : s + CHUNK_ROWS] @ weight[s : s + CHUNK_ROWS].float()
            grad_h = grad_h.to(hidden.dtype)
        if ctx.needs_input_grad[1]:
            g2 = grad.reshape(-1, grad.shape[-1])
            h2 = hidden.reshape(-1, hidden.shape[-1]).float()
            grad_w = (g2.t() @ h2).to(weight.dtype)
        return grad_h, grad_w


def fp32_logits(hidden: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """hidden [..., H] (any float dtype) x weight [V, H] -> fp32 logits [..., V]."""
    return _FP32Head.apply(hidden, weight)


def response_log_probs(
    logits: torch.Tensor, targets: torch.Tensor, temperature: float, with_entropy: bool
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs of `targets` [N, R] under the response positions' logits [N, R, V] / temperature, and
    their entropy when asked: the last step of every training backend's forward."""
    logits = logits.float()
    if temperature > 0:
        logits = logits / temperature
    entropy = entropy_from_logits(logits) if with_entropy else None
    return log_probs_from_logits(logits, targets), entropy
