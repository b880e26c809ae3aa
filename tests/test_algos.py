"""The pure maths, with numbers worked out by hand in the comments."""

from __future__ import annotations

import math

import pytest
import torch

from lite_verl import algos


def test_grpo_unbiased_std_and_epsilon():
    # group 0: scores 1, 0  -> mean 0.5, unbiased std sqrt(0.5) = 0.70711
    # advantages +-0.5 / (0.70711 + 1e-6) = +-0.70711
    # group 1: scores 1, 1, 1 -> std 0 -> 0 / (0 + 1e-6) = 0
    rewards = torch.tensor([[0.0, 1.0], [0.0, 0.0], [1.0, 0.0], [0.0, 1.0], [1.0, 0.0]])
    mask = torch.ones(5, 2)
    adv, ret = algos.compute_grpo_outcome_advantage(rewards, mask, [0, 0, 1, 1, 1])
    expected = 0.5 / (math.sqrt(0.5) + 1e-6)
    assert adv[0].tolist() == pytest.approx([expected, expected], abs=1e-6)
    assert adv[1].tolist() == pytest.approx([-expected, -expected], abs=1e-6)
    assert adv[2:].abs().max() == 0
    assert torch.equal(adv, ret)


def test_grpo_singleton_group_keeps_raw_score():
    # a group of one: mean 0, std 1 -> advantage = score / (1 + 1e-6)
    adv, _ = algos.compute_grpo_outcome_advantage(torch.tensor([[0.0, 3.0]]), torch.ones(1, 2), [7])
    assert adv[0, 0].item() == pytest.approx(3.0 / (1 + 1e-6))


def test_dr_grpo_no_std():
    # scores 2, 0 -> mean 1 -> advantages +1, -1 (no division)
    adv, _ = algos.compute_grpo_outcome_advantage(
        torch.tensor([[2.0], [0.0]]), torch.ones(2, 1), [0, 0], norm_adv_by_std_in_grpo=False
    )
    assert adv.squeeze(-1).tolist() == [1.0, -1.0]


def test_grpo_mask_zeroes_padding_and_padding_does_not_change_scores():
    rewards = torch.tensor([[0.0, 1.0, 0.0], [0.5, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    adv, _ = algos.compute_grpo_outcome_advantage(rewards, mask, [0, 0])
    assert adv[0, 2] == 0 and adv[1, 1] == 0 and adv[1, 2] == 0
    wider = torch.cat([rewards, torch.zeros(2, 4)], 1)
    adv2, _ = algos.compute_grpo_outcome_advantage(wider, torch.cat([mask, torch.zeros(2, 4)], 1), [0, 0])
    assert torch.allclose(adv2[:, :3], adv)


def test_grpo_permutation_invariant():
    g = torch.Generator().manual_seed(0)
    rewards = torch.rand(12, 4, generator=g)
    mask = torch.ones(12, 4)
    index = [i // 4 for i in range(12)]
    adv, _ = algos.compute_grpo_outcome_advantage(rewards, mask, index)
    perm = torch.randperm(12, generator=g)
    adv_p, _ = algos.compute_grpo_outcome_advantage(rewards[perm], mask[perm], [index[i] for i in perm])
    assert torch.allclose(adv_p, adv[perm], atol=1e-6)


def test_policy_loss_clip_and_dual_clip():
    # token 0: A=+1, ratio e^0.5=1.6487 -> clipped to 1.2 -> loss -1.2, clipfrac counts it
    # token 1: A=-1, ratio e^2=7.389 -> max(7.389, 1.2) = 7.389 -> dual clip min(7.389, 3) = 3
    # token 2: A=-1, ratio 1 -> loss 1
    old = torch.zeros(1, 3)
    new = torch.tensor([[0.5, 2.0, 0.0]])
    adv = torch.tensor([[1.0, -1.0, -1.0]])
    mask = torch.ones(1, 3)
    loss, m = algos.compute_policy_loss(old, new, adv, mask)
    assert loss.item() == pytest.approx((-1.2 + 3.0 + 1.0) / 3, abs=1e-6)
    # pg_clipfrac: losses2 > losses1 where clipping raised the loss: token 1 (-A*1.2=1.2 < 7.389: no),
    # token 0 (-1.2 > -1.6487: yes) -> 1/3
    assert m["pg_clipfrac"].item() == pytest.approx(1 / 3, abs=1e-6)
    assert m["pg_clipfrac_lower"].item() == pytest.approx(1 / 3, abs=1e-6)
    # ppo_kl = mean(old - new) = -(0.5 + 2) / 3
    assert m["ppo_kl"].item() == pytest.approx(-2.5 / 3, abs=1e-6)


def test_policy_loss_clip_higher_and_log_ratio_clamp():
    # clip_ratio_high 0.28: ratio 1.6487 clipped at 1.28 for A>0
    loss, _ = algos.compute_policy_loss(
        torch.zeros(1, 1), torch.tensor([[0.5]]), torch.ones(1, 1), torch.ones(1, 1), clip_ratio_high=0.28
    )
    assert loss.item() == pytest.approx(-1.28)
    # log-ratio 50 is clamped to 20; with A<0 the dual clip gives 3 * |A|
    loss, _ = algos.compute_policy_loss(
        torch.zeros(1, 1), torch.tensor([[50.0]]), -torch.ones(1, 1), torch.ones(1, 1)
    )
    assert loss.item() == pytest.approx(3.0)


def test_kl_estimators():
    logp, ref = torch.tensor([-1.0]), torch.tensor([-2.0])
    # k1: -1 - -2 = 1; abs: 1; k2: 0.5; k3: r = e^(ref - logp) = e^-1; r - log r - 1 = 0.36788 + 1 - 1
    assert algos.kl_penalty(logp, ref, "kl").item() == 1.0
    assert algos.kl_penalty(logp, ref, "abs").item() == 1.0
    assert algos.kl_penalty(logp, ref, "mse").item() == 0.5
    assert algos.kl_penalty(logp, ref, "low_var_kl").item() == pytest.approx(math.exp(-1), abs=1e-6)
    # k3 is clamped to 10
    assert algos.kl_penalty(torch.tensor([-30.0]), torch.tensor([0.0]), "k3").item() == 10.0


def test_agg_loss_modes_by_hand():
    loss = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    assert algos.agg_loss(loss, mask, "token-mean").item() == pytest.approx(10 / 4)
    assert algos.agg_loss(loss, mask, "seq-mean-token-sum").item() == pytest.approx((6 + 4) / 2)
    assert algos.agg_loss(loss, mask, "seq-mean-token-mean").item() == pytest.approx((2 + 4) / 2)
    # verl 0.9.1: seq-mean-token-sum with each row's sum divided by T = 3
    assert algos.agg_loss(loss, mask, "seq-mean-token-sum-norm").item() == pytest.approx(10 / (2 * 3))


@pytest.mark.parametrize("mode", algos.LOSS_AGG_MODES)
def test_agg_loss_micro_batches_sum_to_full_batch(mode):
    g = torch.Generator().manual_seed(1)
    loss = torch.randn(8, 5, generator=g)
    mask = (torch.rand(8, 5, generator=g) > 0.3).float()
    mask[:, 0] = 1
    full = algos.agg_loss(loss, mask, mode)
    tokens, seqs = float(mask.sum()), 8.0
    parts = sum(
        algos.agg_loss(loss[s : s + 3], mask[s : s + 3], mode, global_tokens=tokens, global_seqs=seqs)
        for s in range(0, 8, 3)
    )
    assert parts.item() == pytest.approx(full.item(), rel=1e-5, abs=1e-6)


def test_entropy_and_log_probs_from_logits():
    logits = torch.tensor([[[0.0, 0.0]], [[math.log(3.0), 0.0]]])  # p = (.5,.5) and (.75,.25)
    ent = algos.entropy_from_logits(logits)
    assert ent[0, 0].item() == pytest.approx(math.log(2))
    assert ent[1, 0].item() == pytest.approx(-(0.75 * math.log(0.75) + 0.25 * math.log(0.25)), abs=1e-6)
    lp = algos.log_probs_from_logits(logits, torch.tensor([[0], [1]]))
    assert lp[:, 0].tolist() == pytest.approx([math.log(0.5), math.log(0.25)], abs=1e-6)


def test_equal_reward_fraction_counts_groups_of_two_or_more():
    from lite_verl.algos import equal_reward_fraction

    scores = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.5, 0.5, 2.0])
    assert equal_reward_fraction(scores, [0, 0, 1, 1, 2, 2, 3]) == pytest.approx(2 / 3)  # group 3 has one
    assert equal_reward_fraction(scores[:2], torch.tensor([7, 8])) is None  # no group of two
