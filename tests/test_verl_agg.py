"""lite-verl's loss aggregation against verl 0.9.1's own functions, for a whole batch and for micro-batches.

verl's trainer passes each micro-batch the mini-batch's counts (batch_num_tokens = valid tokens,
global_batch_size = rows, loss_scale_factor = T) and dp_size, multiplies the loss by dp_size and lets
the data-parallel all-reduce average the ranks' gradients: the mini-batch's loss is the sum over all
micro-batches of all ranks divided by dp_size. lite-verl's micro-batch losses, given the same counts as
global_*, must add up to that value and to verl's whole-batch value.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch

from lite_verl import algos

SKIP = "verl is not installed: pip install --no-deps verl==0.9.1"
# valid tokens per row, T = 7; verl adds 1e-8 to seq-mean-token-mean's token counts, hence rel=1e-7
LENGTHS = (7, 1, 4, 6, 2, 5, 3, 7)


@pytest.fixture(scope="module")
def verl_algos():
    if importlib.util.find_spec("verl") is None:
        pytest.skip(SKIP)
    # verl is here: an import error now is a real failure, not a reason to skip
    from verl.trainer.ppo import core_algos

    return core_algos


def _batch(lengths=LENGTHS, seed=0):
    g = torch.Generator().manual_seed(seed)
    t = max(lengths)
    loss = torch.randn(len(lengths), t, generator=g, dtype=torch.float64)
    mask = torch.tensor([[1.0] * k + [0.0] * (t - k) for k in lengths], dtype=torch.float64)
    return loss, mask


def _trimmed(loss, mask, rows):
    """rows of the batch cut to their longest valid length, as update.py trims a micro-batch's padding."""
    width = int(mask[rows].sum(-1).max())
    return loss[rows, :width], mask[rows, :width]


@pytest.mark.parametrize("mode", algos.LOSS_AGG_MODES)
@pytest.mark.parametrize("lengths", [LENGTHS, (3, 0, 5, 0, 1)], ids=["full-rows", "empty-rows"])
def test_whole_batch_matches_verl(verl_algos, mode, lengths):
    loss, mask = _batch(lengths)
    ours = algos.agg_loss(loss, mask, mode)
    theirs = verl_algos.agg_loss(loss, mask, mode)
    assert ours.item() == pytest.approx(theirs.item(), rel=1e-7, abs=1e-12)


@pytest.mark.parametrize("mode", algos.LOSS_AGG_MODES)
@pytest.mark.parametrize("dp_size", [1, 2])
def test_micro_batches_sum_to_verl_whole_batch(verl_algos, mode, dp_size):
    loss, mask = _batch()
    b, t, n = loss.shape[0], loss.shape[1], float(mask.sum())
    whole = verl_algos.agg_loss(loss, mask, mode).item()
    ranks = [list(range(r, b, dp_size)) for r in range(dp_size)]  # each rank's share of the mini-batch
    micro = [rows[s : s + 3] for rows in ranks for s in range(0, len(rows), 3)]
    ours = sum(
        algos.agg_loss(
            *_trimmed(loss, mask, rows), mode, global_tokens=n, global_seqs=float(b), global_length=float(t)
        ).item()
        for rows in micro
    )
    verl_sum = sum(
        verl_algos.agg_loss(
            *_trimmed(loss, mask, rows), mode, dp_size=dp_size, batch_num_tokens=n, global_batch_size=b,
            loss_scale_factor=t,
        ).item()
        for rows in micro
    )  # fmt: skip
    assert ours == pytest.approx(whole, rel=1e-7, abs=1e-12)
    assert ours == pytest.approx(verl_sum / dp_size, rel=1e-7, abs=1e-12)  # the all-reduce's mean


@pytest.mark.parametrize("mode", algos.LOSS_AGG_MODES)
def test_value_loss_matches_verl(verl_algos, mode):
    """The value loss inherits the aggregation (micro-batch form: the mini-batch's counts given)."""
    loss, mask = _batch()
    g = torch.Generator().manual_seed(1)
    vpreds, returns, values = (torch.randn(loss.shape, generator=g, dtype=torch.float64) for _ in range(3))
    n, b, t = float(mask.sum()), loss.shape[0], loss.shape[1]
    rows = slice(2, 5)
    ours, ours_frac = algos.compute_value_loss(
        vpreds[rows], returns[rows], values[rows], mask[rows], 0.5, mode,
        global_tokens=n, global_seqs=float(b), global_length=float(t),
    )  # fmt: skip
    theirs, theirs_frac = verl_algos.compute_value_loss(
        vpreds[rows], returns[rows], values[rows], mask[rows], 0.5, mode,
        batch_num_tokens=n, global_batch_size=b, loss_scale_factor=t,
    )  # fmt: skip
    assert ours.item() == pytest.approx(theirs.item(), rel=1e-7, abs=1e-12)
    assert ours_frac.item() == pytest.approx(float(theirs_frac), rel=1e-7, abs=1e-12)
