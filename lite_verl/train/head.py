"""The LM head in fp32: logits = h @ W^T accumulated and returned in fp32, for bf16/fp16 models.

Rounding logits to bf16 moves each log-prob by up to half a bf16 step of the logit (0.06 nats at a
logit of 16), independently in the trainer and in vLLM: that alone made a 0.03-0.04 nats/token gap
between them on an H200. With `model.fp32_lm_head` both sides compute the head in fp32 (vLLM through
lite_verl.rollout.vllm_compat). The weight is cast a vocabulary chunk at a time, forward and backward,
so no fp32 copy of the whole head is kept (0.9 GB for Qwen2.5-1.5B).

The update does not need the logits, only each response token's log-prob and the entropy:
`fused_log_probs` computes both from the hidden states a few hundred tokens at a time and recomputes
those logits in the backward pass, so the update's memory no longer grows with micro-batch tokens x
vocabulary (on an H200, 7B qlora at micro-batch 8 x 256 response tokens held ~6 fp32 copies of the
[8, 256, 152k] logits, 7 GiB, before this).
"""

from __future__ import annotations

import torch

from lite_verl.algos import entropy_from_logits, log_probs_from_logits

CHUNK_ROWS = 16384  # vocabulary rows cast to fp32 at a time
CHUNK_BYTES = 128 * 2**20  # one [tokens, vocabulary] fp32 block of the fused log-probs; ~4 live at once


class _FP32Head(torch.autograd.Function):
    """Logits for generation and any caller that wants them whole; the same chunked fp32 products as
    the fused log-probs below."""

    @staticmethod
    def forward(ctx, hidden: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        ctx.save_for_backward(hidden, weight)
        z = _block_logits(hidden.reshape(-1, hidden.shape[-1]), weight, 0.0, True)
        return z.view(*hidden.shape[:-1], weight.shape[0])

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # type: ignore[override]
        hidden, weight = ctx.saved_tensors
        g2, h2 = grad.reshape(-1, grad.shape[-1]), hidden.reshape(-1, hidden.shape[-1])
        grad_h = (
            _matmul_weight(g2, weight, True).view(hidden.shape).to(hidden.dtype)
            if ctx.needs_input_grad[0]
            else None
        )
        tf32 = _tensor_cores(g2, weight)
        grad_w = _fp32_product(g2.t(), h2.float(), tf32).to(weight.dtype) if ctx.needs_input_grad[1] else None
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


def token_chunk(vocab: int) -> int:
    """Tokens per block of `fused_log_probs`: CHUNK_BYTES of fp32 logits (220 tokens at a 152k vocabulary)."""
    return max(1, CHUNK_BYTES // (4 * vocab))


EXACT_FP32 = False  # True: every fp32 head product on fp32 cores, as on a CPU (bench/profile_update.py)


def _tensor_cores(h: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether the fp32 head's products can run on a GPU's tensor cores without changing the result:
    bf16/fp16 operands multiply exactly in fp32 and the sum is accumulated in fp32 either way."""
    return (
        not EXACT_FP32
        and h.is_cuda
        and weight.dtype in (torch.bfloat16, torch.float16)
        and h.dtype in (weight.dtype, torch.float32)
    )


def _block_logits(h: torch.Tensor, weight: torch.Tensor, temperature: float, fp32: bool) -> torch.Tensor:
    """[T, H] x [V, H] -> fp32 [T, V] logits / temperature; fp32: the product accumulated and returned in
    fp32 (no logit rounded to the model's dtype), else in the weight's dtype and then widened, as the
    model would. On a GPU the fp32 product takes the low-precision operands on tensor cores with an
    fp32 output (the hidden states are the model's output in its dtype, so nothing is rounded); on a
    CPU a vocabulary chunk of the weight is cast to fp32 at a time."""
    if not fp32:
        return _scaled((h.to(weight.dtype) @ weight.t()).float(), temperature)
    z = _mm_fp32_out(h, weight.t()) if _tensor_cores(h, weight) and h.dtype == weight.dtype else None
    if z is None:
        z = torch.empty(h.shape[0], weight.shape[0], dtype=torch.float32, device=h.device)
        hf = h.float()
        for s in range(0, weight.shape[0], CHUNK_ROWS):
            z[:, s : s + CHUNK_ROWS] = hf @ weight[s : s + CHUNK_ROWS].float().t()
    return _scaled(z, temperature)


def _scaled(z: torch.Tensor, temperature: float) -> torch.Tensor:
    return z / temperature if temperature > 0 else z


_MM_OUT_DTYPE = [True]  # this torch's CUDA mm takes out_dtype (2.8+); cleared at the first refusal


def _mm_fp32_out(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor | None:
    """a @ b of bf16/fp16 operands with an fp32 result from cuBLAS's fp32 accumulator; None where torch
    cannot (the caller then casts to fp32)."""
    if not _MM_OUT_DTYPE[0]:
        return None
    try:
        return torch.mm(a, b, out_dtype=torch.float32)
    except torch.OutOfMemoryError:  # the micro-batch is too big, not the kernel missing: update.py halves it
        raise
    except (RuntimeError, TypeError, NotImplementedError):
        _MM_OUT_DTYPE[0] = False
        return None


def _fp32_product(a: torch.Tensor, b: torch.Tensor, tf32: bool) -> torch.Tensor:
    """a @ b in fp32; tf32: on tensor cores, each operand rounded to TF32's 10-bit mantissa (exact for
    bf16/fp16 values, ~5e-4 relative for fp32 gradients of logits), the sum accumulated in fp32."""
    if not tf32:
        return a @ b
    previous = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = True
    try:
        return a @ b
    finally:
        torch.backends.cuda.matmul.allow_tf32 = previous


def _matmul_weight(dz: torch.Tensor, weight: torch.Tensor, fp32: bool) -> torch.Tensor:
    """dz [T, V] x weight [V, H] -> [T, H] fp32, a vocabulary chunk of the weight at a time."""
    if not fp32:
        return (dz.to(weight.dtype) @ weight).float()
    tf32 = _tensor_cores(dz, weight)
    out = torch.zeros(dz.shape[0], weight.shape[1], dtype=torch.float32, device=dz.device)
    for s in range(0, weight.shape[0], CHUNK_ROWS):
        out += _fp32_product(dz[:, s : s + CHUNK_ROWS], weight[s : s + CHUNK_ROWS].float(), tf32)
    return out


class _FusedLogProbs(torch.autograd.Function):
    """Per token: log p(target) and entropy H of softmax(h W^T / temperature), a block of tokens at a
    time. Saved for backward: the hidden states, each token's log-sum-exp and entropy, not the logits.
    d log p_t / dz = onehot(t) - p;  dH / dz = -p * (log p + H)."""

    @staticmethod
    def forward(ctx, hidden, weight, targets, temperature, fp32, with_entropy):  # type: ignore[override]
        h, t = hidden.reshape(-1, hidden.shape[-1]), targets.reshape(-1)
        n, step = h.shape[0], token_chunk(weight.shape[0])
        logp = torch.empty(n, dtype=torch.float32, device=h.device)
        lse = torch.empty_like(logp)
        ent = torch.zeros_like(logp)
        for a in range(0, n, step):
            z = _block_logits(h[a : a + step], weight, temperature, fp32)
            lse[a : a + step] = torch.logsumexp(z, dim=-1)
            logp[a : a + step] = z.gather(1, t[a : a + step, None]).squeeze(1) - lse[a : a + step]
            if with_entropy:
                p = torch.exp(z - lse[a : a + step, None])
                ent[a : a + step] = lse[a : a + step] - (p * z).sum(-1)
        ctx.save_for_backward(hidden, weight, targets, lse, ent)
        ctx.temperature, ctx.fp32, ctx.with_entropy = temperature, fp32, with_entropy
        # an output the loss does not use (the entropy when entropy_coeff=0) gets None, not a zeros
        # gradient: its term, a [tokens, vocabulary] product per block, is then skipped in backward
        ctx.set_materialize_grads(False)
        if not with_entropy:
            ctx.mark_non_differentiable(ent)
        return logp.view(targets.shape), ent.view(targets.shape)

    @staticmethod
    def backward(ctx, g_logp, g_ent):  # type: ignore[override]
        hidden, weight, targets, lse, ent = ctx.saved_tensors
        h, t = hidden.reshape(-1, hidden.shape[-1]), targets.reshape(-1)
        g_logp = g_logp.reshape(-1) if g_logp is not None else torch.zeros_like(lse)
        g_ent = g_ent.reshape(-1) if g_ent is not None and ctx.with_entropy else None
        want_h, want_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        grad_h = torch.zeros(h.shape, dtype=torch.float32, device=h.device) if want_h else None
        grad_w = torch.empty_like(weight) if want_w else None
        scale = 1.0 / ctx.temperature if ctx.temperature > 0 else 1.0
        step = max(1, CHUNK_BYTES // (4 * CHUNK_ROWS))  # tokens per [tokens, vocabulary chunk] block
        # vocabulary chunks outside: the weight's gradient is summed in fp32 one chunk at a time, never
        # as a whole fp32 [V, H] copy (2.2 GB for a 7B head); p and log p of a chunk need only the saved lse
        for s in range(0, weight.shape[0], CHUNK_ROWS):
            w = weight[s : s + CHUNK_ROWS]
            acc = torch.zeros(w.shape, dtype=torch.float32, device=h.device) if want_w else None
            for a in range(0, h.shape[0], step):
                logq = _block_logits(h[a : a + step], w, ctx.temperature, ctx.fp32) - lse[a : a + step, None]
                p = torch.exp(logq)
                dz = p * (-g_logp[a : a + step, None])
                # + g_logp at each token's target when it lies in this chunk; no host sync (no nonzero())
                local = t[a : a + step] - s
                inside = (local >= 0) & (local < w.shape[0])
                hit = torch.where(inside, g_logp[a : a + step], torch.zeros_like(g_logp[a : a + step]))
                dz.scatter_add_(1, local.clamp(0, w.shape[0] - 1)[:, None], hit[:, None])
                if g_ent is not None:
                    dz -= p * (logq + ent[a : a + step, None]) * g_ent[a : a + step, None]
                dz *= scale
                if grad_h is not None:
                    grad_h[a : a + step] += _matmul_weight(dz, w, ctx.fp32)
                if acc is not None:
                    acc += _fp32_product(dz.t(), h[a : a + step].float(), _tensor_cores(dz, w))
            if grad_w is not None:
                grad_w[s : s + CHUNK_ROWS] = acc
        grad_h = grad_h.view(hidden.shape).to(hidden.dtype) if grad_h is not None else None
        return grad_h, grad_w, None, None, None, None


def fused_log_probs(
    hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, temperature: float, fp32: bool,
    with_entropy: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:  # fmt: skip
    """hidden [N, R, H] (the states that predict `targets` [N, R]), head weight [V, H] -> (log-probs [N, R],
    entropy [N, R] or None) of softmax(hidden W^T / temperature), without materialising [N, R, V] logits."""
    logp, ent = _FusedLogProbs.apply(hidden, weight, targets, temperature, fp32, with_entropy)
    return logp, (ent if with_entropy else None)
