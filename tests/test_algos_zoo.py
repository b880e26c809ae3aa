"""The estimator zoo, value loss, IS weights and KL control: numbers worked out by hand, and properties."""

from __future__ import annotations

import math

import pytest
import torch

from lite_verl import algos


def test_gae_by_hand():
    # gamma 0.9, lam 0.5, rewards [0, 0, 1], values [0.2, 0.4, 0.6]
    # t=2: delta = 1 - 0.6 = 0.4                 A2 = 0.4
    # t=1: delta = 0.9*0.6 - 0.4 = 0.14          A1 = 0.14 + 0.45*0.4 = 0.32
    # t=0: delta = 0.9*0.4 - 0.2 = 0.16          A0 = 0.16 + 0.45*0.32 = 0.304
    # returns = A + V = [0.504, 0.72, 1.0]; advantages whitened with the unbiased variance
    adv, ret = algos.compute_gae_advantage_return(
        torch.tensor([[0.0, 0.0, 1.0]]), torch.tensor([[0.2, 0.4, 0.6]]), torch.ones(1, 3), gamma=0.9, lam=0.5
    )
    assert ret[0].tolist() == pytest.approx([0.504, 0.72, 1.0], abs=1e-6)
    raw = [0.304, 0.32, 0.4]
    mean = sum(raw) / 3
    std = math.sqrt(sum((x - mean) ** 2 for x in raw) / 2 + 1e-8)
    assert adv[0].tolist() == pytest.approx([(x - mean) / std for x in raw], abs=1e-5)


def test_gae_padding_never_changes_results():
    g = torch.Generator().manual_seed(0)
    rewards, values = torch.rand(3, 4, generator=g), torch.rand(3, 4, generator=g)
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0], [1, 0, 0, 0]], dtype=torch.float32)
    rewards = rewards * mask
    adv, ret = algos.compute_gae_advantage_return(rewards, values, mask, 0.95, 0.9)
    junk = torch.full((3, 3), 7.0)  # padded columns with junk values must not leak in
    adv2, ret2 = algos.compute_gae_advantage_return(
        torch.cat([rewards, torch.zeros(3, 3)], 1), torch.cat([values * mask + (1 - mask) * 5.0, junk], 1),
        torch.cat([mask, torch.zeros(3, 3)], 1), 0.95, 0.9,
    )  # fmt: skip
    assert torch.allclose(adv2[:, :4] * mask, adv * mask, atol=1e-6)
    assert torch.allclose(ret2[:, :4] * mask, ret * mask, atol=1e-6)


def test_rloo_by_hand():
    # group of 3 with scores 1, 0, 0.5: s - mean(others) = 0.75, -0.75, 0; a singleton keeps its score 2
    rewards = torch.tensor([[0.0, 1.0], [0.0, 0.0], [0.5, 0.0], [2.0, 0.0]])
    adv, _ = algos.compute_rloo_outcome_advantage(rewards, torch.ones(4, 2), [0, 0, 0, 1])
    assert adv[:, 0].tolist() == pytest.approx([0.75, -0.75, 0.0, 2.0], abs=1e-6)


def test_reinforce_plus_plus_by_hand():
    # gamma 0.5; row 0 rewards [0,0,1] -> returns [0.25, 0.5, 1]; row 1 [0,1,pad] -> [0.5, 1, 0]
    # whitened over the 5 valid returns [0.25, 0.5, 1, 0.5, 1]: mean 0.65, unbiased var 0.45/4 = 0.1125
    rewards = torch.tensor([[0.0, 0.0, 1.0], [0.0, 1.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    adv, ret = algos.compute_reinforce_plus_plus_outcome_advantage(rewards, mask, gamma=0.5)
    assert ret.flatten().tolist() == pytest.approx([0.25, 0.5, 1.0, 0.5, 1.0, 0.0])
    std = math.sqrt(0.1125 + 1e-8)
    expected = [[(x - 0.65) / std for x in (0.25, 0.5, 1.0)], [(0.5 - 0.65) / std, (1.0 - 0.65) / std, 0.0]]
    assert adv.tolist()[0] == pytest.approx(expected[0], abs=1e-5)
    assert adv.tolist()[1] == pytest.approx(expected[1], abs=1e-5)


def test_reinforce_plus_plus_baseline_by_hand():
    # group scores 1, 0 -> 0.5, -0.5 on both tokens; whitened over 4 tokens: unbiased std sqrt(1/3)
    adv, _ = algos.compute_reinforce_plus_plus_baseline_outcome_advantage(
        torch.tensor([[0.0, 1.0], [0.0, 0.0]]), torch.ones(2, 2), [0, 0]
    )
    v = 0.5 / math.sqrt(1 / 3 + 1e-8)
    assert adv.flatten().tolist() == pytest.approx([v, v, -v, -v], abs=1e-5)


def test_remax_by_hand():
    # return-to-go of [0, 1] is [1, 1]; minus the greedy baseline 0.25 -> 0.75; not whitened
    adv, ret = algos.compute_remax_outcome_advantage(
        torch.tensor([[0.0, 1.0]]), torch.tensor([0.25]), torch.ones(1, 2)
    )
    assert ret.tolist() == [[1.0, 1.0]] and adv.tolist() == [[0.75, 0.75]]


@pytest.mark.parametrize(
    "fn", [algos.compute_grpo_outcome_advantage, algos.compute_rloo_outcome_advantage,
           algos.compute_reinforce_plus_plus_baseline_outcome_advantage],
)  # fmt: skip
def test_group_estimators_permutation_invariant(fn):
    g = torch.Generator().manual_seed(2)
    rewards = torch.rand(12, 3, generator=g)
    mask = torch.ones(12, 3)
    index = [i % 3 for i in range(12)]  # groups interleaved across the batch
    adv, _ = fn(rewards, mask, index)
    perm = torch.randperm(12, generator=g)
    adv_p, _ = fn(rewards[perm], mask[perm], [index[i] for i in perm])
    assert torch.allclose(adv_p, adv[perm], atol=1e-5)


@pytest.mark.parametrize(
    "fn", [algos.compute_grpo_outcome_advantage, algos.compute_rloo_outcome_advantage,
           algos.compute_reinforce_plus_plus_baseline_outcome_advantage],
)  # fmt: skip
def test_group_estimators_padding_invariant(fn):
    rewards = torch.tensor([[0.0, 1.0], [0.3, 0.0], [0.0, 0.7], [1.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0], [1.0, 1.0], [1.0, 0.0]])
    adv, _ = fn(rewards, mask, [0, 0, 1, 1])
    adv2, _ = fn(
        torch.cat([rewards, torch.zeros(4, 3)], 1), torch.cat([mask, torch.zeros(4, 3)], 1), [0, 0, 1, 1]
    )
    assert torch.allclose(adv2[:, :2], adv, atol=1e-6) and adv2[:, 2:].abs().max() == 0


def test_value_loss_by_hand():
    # vclip = clamp([1, 2], [0-0.5, 2-0.5], [0+0.5, 2+0.5]) = [0.5, 2]
    # l1 = [(1-1.5)^2, (2-1)^2] = [0.25, 1]; l2 = [(0.5-1.5)^2, (2-1)^2] = [1, 1]; max = [1, 1]
    loss, clipfrac = algos.compute_value_loss(
        torch.tensor([[1.0, 2.0]]),
        torch.tensor([[1.5, 1.0]]),
        torch.tensor([[0.0, 2.0]]),
        torch.ones(1, 2),
        0.5,
    )
    assert loss.item() == pytest.approx(0.5) and clipfrac.item() == pytest.approx(0.5)


def test_rollout_is_weights_by_hand():
    old, rollout = torch.tensor([[-1.0, -2.0]]), torch.tensor([[-1.5, -1.0]])
    w, m = algos.compute_rollout_is_weights(old, rollout, torch.ones(1, 2), "token", threshold=1.5)
    assert w.tolist()[0] == pytest.approx([1.5, math.exp(-1)], abs=1e-6)  # exp(0.5)=1.65 truncated
    assert m["is_truncated_frac"].item() == pytest.approx(0.5)
    w, _ = algos.compute_rollout_is_weights(old, rollout, torch.ones(1, 2), "sequence", threshold=1.5)
    assert w.tolist()[0] == pytest.approx([math.exp(-0.5)] * 2, abs=1e-6)  # exp(0.5 - 1)


def test_is_weights_scale_the_policy_loss():
    old = torch.zeros(1, 2)
    loss_w, _ = algos.compute_policy_loss(old, old, torch.ones(1, 2), torch.ones(1, 2),
                                          rollout_is_weights=torch.tensor([[0.5, 1.0]]))  # fmt: skip
    assert loss_w.item() == pytest.approx(-(0.5 + 1.0) / 2)


def test_kl_controllers_and_kl_in_reward():
    ctrl = algos.AdaptiveKLController(0.1, target_kl=0.05, horizon=100)
    ctrl.update(current_kl=0.1, n_steps=10)  # error clipped to 0.2 -> x (1 + 0.2 * 10 / 100)
    assert ctrl.value == pytest.approx(0.102)
    ctrl.update(current_kl=0.04, n_steps=10)  # error -0.2 -> x 0.98
    assert ctrl.value == pytest.approx(0.102 * 0.98)
    fixed = algos.FixedKLController(0.3)
    fixed.update(5.0, 10)
    assert fixed.value == 0.3
    # KL [1, 0] per token, beta 0.5: rewards [0 - 0.5, 1 - 0]; batch KL = mean of row means = 0.5
    rewards, kl = algos.apply_kl_penalty(
        torch.tensor([[0.0, 1.0]]),
        torch.tensor([[-1.0, -1.0]]),
        torch.tensor([[-2.0, -1.0]]),
        torch.ones(1, 2),
        0.5,
    )
    assert rewards.tolist() == [[-0.5, 1.0]] and kl == pytest.approx(0.5)


def test_masked_whiten_ignores_padding():
    v = torch.tensor([1.0, 2.0, 3.0, 100.0])
    mask = torch.tensor([1.0, 1.0, 1.0, 0.0])
    w = algos.masked_whiten(v, mask)
    assert (w * mask).tolist()[:3] == pytest.approx([-1.0, 0.0, 1.0], abs=1e-6)  # unbiased std of 1,2,3 is 1


def test_compute_entropy_loss():
    logits = torch.zeros(1, 2, 4)  # uniform over 4 -> entropy log 4 per token
    assert algos.compute_entropy_loss(logits, torch.ones(1, 2)).item() == pytest.approx(math.log(4))
