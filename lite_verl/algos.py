"""The maths of RL post-training: advantages, policy loss, KL, entropy, loss aggregation.

Pure functions of tensors; imports torch only. Names, arguments and numerics follow verl's
`trainer/ppo/core_algos.py` so that verl recipes carry over, including its surprising parts, which each
docstring points out. Shapes: B = responses in the batch, T = response length (padded).

Micro-batching: `agg_loss(..., global_tokens=, global_seqs=)` normalises by the counts of the whole
mini-batch instead of the micro-batch, so that summing micro-batch losses gives exactly the mini-batch
loss (gradient accumulation is then the same maths as one big batch).
"""

from __future__ import annotations

from collections import defaultdict

import torch

LOSS_AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")


def masked_sum(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    return (values * mask).sum() if dim is None else (values * mask).sum(dim)


def masked_mean(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """sum(values * mask) / (sum(mask) + 1e-8), as verl (the epsilon makes an empty mask give 0)."""
    return masked_sum(values, mask, dim) / (mask.sum() if dim is None else mask.sum(dim)).add(1e-8)


def compute_grpo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: list | torch.Tensor,
    epsilon: float = 1e-6,
    norm_adv_by_std_in_grpo: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GRPO outcome advantage (Shao et al. 2024, DeepSeekMath), verl's numerics.

    token_level_rewards: [B, T]  (the score sits on the last valid token; summed per row)
    response_mask:       [B, T]
    index:               [B]     group id of each row (rows of one prompt share an id)
    Returns (advantages, returns), both [B, T] = the row's normalised score on every valid token.

    verl's details: the std is torch.std (unbiased, n-1); epsilon is added to the std, not under a
    sqrt; a group of one row gets mean 0 and std 1 (its advantage is its raw score).
    norm_adv_by_std_in_grpo=False gives Dr. GRPO (Liu et al. 2025): score minus group mean.
    """
    scores = token_level_rewards.sum(dim=-1)
    keys = index.tolist() if isinstance(index, torch.Tensor) else list(index)
    groups: dict[object, list[int]] = defaultdict(list)
    for i, k in enumerate(keys):
        groups[k].append(i)
    with torch.no_grad():
        mean = torch.zeros_like(scores)
        std = torch.ones_like(scores)
        for rows in groups.values():
            if len(rows) > 1:
                group = scores[rows]
                mean[rows] = group.mean()
                std[rows] = group.std()
        adv = scores - mean
        if norm_adv_by_std_in_grpo:
            adv = adv / (std + epsilon)
        adv = adv.unsqueeze(-1) * response_mask
    return adv, adv


def kl_penalty(logprob: torch.Tensor, ref_logprob: torch.Tensor, kl_penalty: str) -> torch.Tensor:
    """Per-token KL estimate of KL(pi || pi_ref) from sampled tokens (Schulman 2020, "Approximating KL").

    logprob, ref_logprob: [B, T]. Returns [B, T].
    kl / k1:         log pi - log pi_ref
    abs:             |log pi - log pi_ref|
    mse / k2:        0.5 * (log pi - log pi_ref)^2
    low_var_kl / k3: r - log r - 1 with r = pi_ref / pi; verl clamps log r to [-20, 20] and the
                     result to [-10, 10].
    """
    diff = logprob - ref_logprob
    if kl_penalty in ("kl", "k1"):
        return diff
    if kl_penalty == "abs":
        return diff.abs()
    if kl_penalty in ("mse", "k2"):
        return 0.5 * diff.square()
    if kl_penalty in ("low_var_kl", "k3"):
        log_ratio = torch.clamp(ref_logprob - logprob, min=-20, max=20)
        kld = log_ratio.exp() - log_ratio - 1
        return torch.clamp(kld, min=-10, max=10)
    raise ValueError(f"unknown kl_penalty {kl_penalty!r}")


def agg_loss(
    loss_mat: torch.Tensor,
    loss_mask: torch.Tensor,
    loss_agg_mode: str,
    *,
    global_tokens: float | None = None,
    global_seqs: float | None = None,
) -> torch.Tensor:
    """Aggregate a [B, T] loss matrix into a scalar.

    token-mean:              sum(loss * mask) / sum(mask)            (DAPO; verl's default)
    seq-mean-token-sum:      mean over rows of sum(loss * mask)
    seq-mean-token-mean:     mean over rows of (sum(loss * mask) / sum(mask))  (the GRPO paper)
    seq-mean-token-sum-norm: sum(loss * mask) / T, T = loss_mask.shape[-1]   (Dr. GRPO's constant)

    global_tokens / global_seqs replace the local token / row counts in the denominators, so that the
    micro-batches of one mini-batch sum to the mini-batch's loss.
    """
    if loss_agg_mode == "token-mean":
        if global_tokens is None:
            return masked_mean(loss_mat, loss_mask)
        return masked_sum(loss_mat, loss_mask) / global_tokens
    n_seqs = loss_mat.shape[0] if global_seqs is None else global_seqs
    if loss_agg_mode == "seq-mean-token-sum":
        return masked_sum(loss_mat, loss_mask, -1).sum() / n_seqs
    if loss_agg_mode == "seq-mean-token-mean":
        return (masked_sum(loss_mat, loss_mask, -1) / loss_mask.sum(-1).clamp(min=1)).sum() / n_seqs
    if loss_agg_mode == "seq-mean-token-sum-norm":  # no row count in it: micro-batches simply add up
        return masked_sum(loss_mat, loss_mask) / loss_mask.shape[-1]
    raise ValueError(f"unknown loss_agg_mode {loss_agg_mode!r}; one of {LOSS_AGG_MODES}")


def compute_policy_loss(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float = 0.2,
    clip_ratio_c: float = 3.0,
    rollout_is_weights: torch.Tensor | None = None,
    *,
    global_tokens: float | None = None,
    global_seqs: float | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO clipped surrogate (Schulman et al. 2017) with dual clip (Ye et al. 2020), verl's numerics.

    old_log_prob, log_prob, advantages, response_mask: [B, T]; rollout_is_weights: [B, T] or None.
    ratio = exp(clamp(log_prob - old_log_prob, -20, 20))           (verl clamps the log-ratio)
    L1 = -A * ratio;  L2 = -A * clip(ratio, 1 - clip_low, 1 + clip_high);  L = max(L1, L2)
    dual clip, only where A < 0: L = min(L, -A * clip_ratio_c)
    Truncated IS weights (rollout/train mismatch), when given, multiply the per-token loss.
    Returns (loss, metrics) with pg_clipfrac, pg_clipfrac_lower (dual clip) and ppo_kl.
    """
    neg_kl = torch.clamp(log_prob - old_log_prob, min=-20.0, max=20.0)
    ratio = torch.exp(neg_kl)
    ppo_kl = masked_mean(-neg_kl, response_mask)
    losses1 = -advantages * ratio
    losses2 = -advantages * torch.clamp(ratio, 1 - clip_ratio_low, 1 + clip_ratio_high)
    clipped = torch.maximum(losses1, losses2)
    pg_clipfrac = masked_mean(torch.gt(losses2, losses1).float(), response_mask)
    losses3 = -advantages * clip_ratio_c
    dual = torch.minimum(losses3, clipped)
    pg_clipfrac_lower = masked_mean(
        torch.gt(clipped, losses3).float() * (advantages < 0).float(), response_mask
    )
    pg_losses = torch.where(advantages < 0, dual, clipped)
    if rollout_is_weights is not None:
        pg_losses = pg_losses * rollout_is_weights
    loss = agg_loss(
        pg_losses, response_mask, loss_agg_mode, global_tokens=global_tokens, global_seqs=global_seqs
    )
    metrics = {
        "pg_clipfrac": pg_clipfrac.detach(),
        "pg_clipfrac_lower": pg_clipfrac_lower.detach(),
        "ppo_kl": ppo_kl.detach(),
    }
    return loss, metrics


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """[..., V] -> [...]: H = logsumexp(z) - sum(softmax(z) * z)."""
    probs = torch.softmax(logits, dim=-1)
    return torch.logsumexp(logits, dim=-1) - (probs * logits).sum(-1)


def compute_entropy_loss(
    logits: torch.Tensor, response_mask: torch.Tensor, loss_agg_mode: str = "token-mean"
) -> torch.Tensor:
    """Mean entropy of the policy over valid response tokens. logits: [B, T, V]; mask: [B, T]."""
    return agg_loss(entropy_from_logits(logits), response_mask, loss_agg_mode)


def log_probs_from_logits(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """logits [B, T, V], tokens [B, T] -> log p(token) [B, T], without materialising log_softmax."""
    picked = torch.gather(logits, -1, tokens.unsqueeze(-1)).squeeze(-1)
    return picked - torch.logsumexp(logits, dim=-1)
