"""The fused log-prob / entropy head equals log-softmax over materialised logits, values and gradients."""

from __future__ import annotations

import pytest
import torch

from lite_verl.train import head
from lite_verl.train.head import fused_log_probs, response_log_probs


def _reference(hidden, weight, targets, temperature, fp32):
    logits = hidden.float() @ weight.float().t() if fp32 else (hidden @ weight.t()).float()
    return response_log_probs(logits, targets, temperature, True)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_fused_matches_materialised_logits(monkeypatch, temperature):
    monkeypatch.setattr(head, "CHUNK_BYTES", 4 * 97 * 5)  # blocks of 5 tokens: 3 blocks + a ragged one
    monkeypatch.setattr(head, "CHUNK_ROWS", 40)  # and the vocabulary cast in chunks of 40 rows
    torch.manual_seed(0)
    n, r, hdim, vocab = 2, 8, 16, 97
    weight = torch.randn(vocab, hdim, dtype=torch.float64).requires_grad_()
    hidden = torch.randn(n, r, hdim, dtype=torch.float64).requires_grad_()
    targets = torch.randint(0, vocab, (n, r))
    g_lp, g_ent = torch.randn(n, r, dtype=torch.float64), torch.randn(n, r, dtype=torch.float64)

    def run(fn):
        lp, ent = fn()
        grads = torch.autograd.grad(
            (lp.double() * g_lp).sum() + (ent.double() * g_ent).sum(), (hidden, weight)
        )
        return lp.double(), ent.double(), grads

    # float64 inputs: the fused path computes in fp32 (fp32=True widens to float32), so compare at fp32 precision
    lp, ent, (gh, gw) = run(lambda: fused_log_probs(hidden, weight, targets, temperature, True, True))
    rlp, rent, (rgh, rgw) = run(lambda: _reference(hidden, weight, targets, temperature, True))
    for got, want in ((lp, rlp), (ent, rent), (gh, rgh), (gw, rgw)):
        assert torch.allclose(got, want, atol=2e-4, rtol=1e-4), (got - want).abs().max()


def test_an_unused_output_gets_no_gradient_term(monkeypatch):
    """The entropy computed for logging only (entropy_coeff=0), or the log-probs unused: the gradient is that
    of the output the loss uses (the unused one's term is skipped, not multiplied by zeros)."""
    monkeypatch.setattr(head, "CHUNK_ROWS", 40)
    torch.manual_seed(2)
    weight = torch.randn(97, 16, dtype=torch.float64).requires_grad_()
    hidden = torch.randn(2, 8, 16, dtype=torch.float64).requires_grad_()
    targets = torch.randint(0, 97, (2, 8))
    lp, ent = fused_log_probs(hidden, weight, targets, 1.0, True, True)
    rlp, rent = _reference(hidden, weight, targets, 1.0, True)
    for got, want in ((lp, rlp), (ent, rent)):
        g = torch.autograd.grad(got.double().sum(), (hidden, weight), retain_graph=True)
        r = torch.autograd.grad(want.double().sum(), (hidden, weight), retain_graph=True)
        assert all(torch.allclose(a, b, atol=2e-4, rtol=1e-4) for a, b in zip(g, r))


def test_fused_without_entropy_and_in_bf16():
    torch.manual_seed(1)
    weight = torch.randn(50, 8, dtype=torch.bfloat16)  # frozen head (LoRA): no weight gradient asked
    hidden = torch.randn(3, 4, 8, dtype=torch.bfloat16).requires_grad_()
    targets = torch.randint(0, 50, (3, 4))
    lp, ent = fused_log_probs(hidden, weight, targets, 1.0, False, False)
    assert ent is None and lp.dtype == torch.float32
    rlp, _ = _reference(hidden, weight, targets, 1.0, False)
    assert torch.allclose(lp, rlp, atol=1e-5)
    (g,) = torch.autograd.grad(lp.sum(), hidden)
    (rg,) = torch.autograd.grad(rlp.sum(), hidden)
    assert g.dtype == torch.bfloat16 and torch.allclose(g.float(), rg.float(), atol=2e-2)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_tensor_core_fp32_head_equals_fp32_cores(monkeypatch, dtype):
    """On a GPU the fp32 head multiplies the model-dtype operands on tensor cores with an fp32 result
    (backward: TF32): the same log-probs, entropy and gradients as the product on fp32 cores."""
    torch.manual_seed(2)
    vocab, hdim = 50_000, 512
    weight = (torch.randn(vocab, hdim, device="cuda") * 0.05).to(dtype).requires_grad_()
    hidden = torch.randn(4, 64, hdim, device="cuda").to(dtype).requires_grad_()
    targets = torch.randint(0, vocab, (4, 64), device="cuda")

    def run(exact):
        monkeypatch.setattr(head, "EXACT_FP32", exact)
        lp, ent = fused_log_probs(hidden, weight, targets, 1.0, True, True)
        grads = torch.autograd.grad(lp.sum() + 0.1 * ent.sum(), (hidden, weight))
        return lp, ent, grads

    lp, ent, (gh, gw) = run(False)
    rlp, rent, (rgh, rgw) = run(True)
    assert head._MM_OUT_DTYPE[0], (
        "this torch's CUDA mm has no out_dtype: the fp32 head falls back to fp32 cores"
    )
    assert (lp - rlp).abs().max() < 1e-4 and (ent - rent).abs().max() < 1e-4
    for got, want in ((gh, rgh), (gw, rgw)):
        assert torch.allclose(got.float(), want.float(), rtol=2e-2, atol=2e-3)
