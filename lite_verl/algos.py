"""The maths of RL post-training: advantages, policy loss, KL, entropy, loss aggregation.

Pure functions of tensors; imports torch only. Names, arguments and numerics follow verl's
`trainer/ppo/core_algos.py` so that verl recipes carry over, including its surprising parts, which each
docstring points out. Shapes: B = responses in the batch, T = response length (padded).

Micro-batching: `agg_loss(..., global_tokens=, global_seqs=)` normalises by the counts of the whole
mini-batch instead of the micro-batch, so that summing micro-batch losses gives exactly the mini-batch
loss (gradient accumulation is then the same maths as one big batch).
"""

from __future__ import annotations

import math
from collections import defaultdict

import torch

# config/schema.py's LossAggMode lists the same modes (tests/test_config.py checks it)
LOSS_AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")


def masked_sum(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    return (values * mask).sum() if dim is None else (values * mask).sum(dim)


def masked_mean(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """sum(values * mask) / (sum(mask) + 1e-8), as verl (the epsilon makes an empty mask give 0)."""
    return masked_sum(values, mask, dim) / (mask.sum() if dim is None else mask.sum(dim)).add(1e-8)


def masked_var(values: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    """Variance over valid entries; unbiased (n / (n - 1) correction) as verl's masked_whiten uses."""
    mean = masked_mean(values, mask)
    var = masked_mean((values - mean).square(), mask)
    if unbiased:
        n = mask.sum()
        if n <= 1:
            raise ValueError("masked_var: at least two valid entries are needed for an unbiased variance")
        var = var * n / (n - 1)
    return var


def masked_whiten(values: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True) -> torch.Tensor:
    """(values - mean) / sqrt(var + 1e-8) over valid entries, unbiased variance (verl)."""
    mean, var = masked_mean(values, mask), masked_var(values, mask)
    whitened = (values - mean) * torch.rsqrt(var + 1e-8)
    return whitened if shift_mean else whitened + mean


def _group_rows(index: list | torch.Tensor) -> dict[object, list[int]]:
    keys = index.tolist() if isinstance(index, torch.Tensor) else list(index)
    groups: dict[object, list[int]] = defaultdict(list)
    for i, k in enumerate(keys):
        groups[k].append(i)
    return groups


def _group_mean(scores: torch.Tensor, index: list | torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row: (mean of its group, size of its group); a group of one has mean 0 (verl)."""
    mean = torch.zeros_like(scores)
    size = torch.ones_like(scores)
    for rows in _group_rows(index).values():
        size[rows] = float(len(rows))
        if len(rows) > 1:
            mean[rows] = scores[rows].mean()
    return mean, size


# estimators whose baseline is the response's own group: a group of equal rewards gives zero advantages
GROUP_BASELINES = ("grpo", "dr_grpo", "rloo", "reinforce_plus_plus_baseline")


def equal_reward_fraction(scores: torch.Tensor, index: list | torch.Tensor) -> float | None:
    """Of the groups of more than one response, the fraction whose rewards are all equal (TRL logs it as
    frac_reward_zero_std): a group baseline learns nothing from them. None when no group has two."""
    groups = [rows for rows in _group_rows(index).values() if len(rows) > 1]
    if not groups:
        return None
    return sum(bool((scores[rows] == scores[rows[0]]).all()) for rows in groups) / len(groups)


def compute_gae_advantage_return(
    token_level_rewards: torch.Tensor,
    values: torch.Tensor,
    response_mask: torch.Tensor,
    gamma: float = 1.0,
    lam: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalized Advantage Estimation (Schulman et al. 2016), verl's numerics.

    token_level_rewards, values, response_mask: [B, T]. Returns (advantages, returns), [B, T].
    delta_t = r_t + gamma * V_{t+1} - V_t;  A_t = delta_t + gamma * lam * A_{t+1};  returns = A + V.
    Padded positions are skipped (the recursion carries V and A across them), so padding never
    changes a result. verl's detail: the advantages are then whitened over all valid tokens of the
    batch with the unbiased variance; the returns are not.
    """
    with torch.no_grad():
        next_value = torch.zeros_like(values[:, 0])
        last_gae = torch.zeros_like(values[:, 0])
        reversed_adv = []
        for t in reversed(range(token_level_rewards.shape[-1])):
            m = response_mask[:, t]
            delta = token_level_rewards[:, t] + gamma * next_value - values[:, t]
            gae = delta + gamma * lam * last_gae
            next_value = values[:, t] * m + (1 - m) * next_value
            last_gae = gae * m + (1 - m) * last_gae
            reversed_adv.append(last_gae)
        advantages = torch.stack(reversed_adv[::-1], dim=1)
        returns = advantages + values
        advantages = masked_whiten(advantages, response_mask) * response_mask
    return advantages, returns


def compute_rloo_outcome_advantage(
    token_level_rewards: torch.Tensor, response_mask: torch.Tensor, index: list | torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE leave-one-out (Ahmadian et al. 2024): score minus the mean of the other rows of its group.

    token_level_rewards, response_mask: [B, T]; index: [B]. Returns ([B, T], [B, T]).
    Computed as verl does: s * n / (n - 1) - mean * n / (n - 1) (= s - mean of the others); a group of
    one keeps its raw score.
    """
    with torch.no_grad():
        scores = token_level_rewards.sum(dim=-1)
        mean, size = _group_mean(scores, index)
        loo = scores * size / (size - 1) - mean * size / (size - 1)
        adv = torch.where(size > 1, loo, scores).unsqueeze(-1) * response_mask
    return adv, adv


def compute_reinforce_plus_plus_outcome_advantage(
    token_level_rewards: torch.Tensor, response_mask: torch.Tensor, gamma: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++ (Hu 2025): discounted return-to-go, whitened over the batch's valid tokens.

    token_level_rewards, response_mask: [B, T]. Returns (advantages, returns), [B, T].
    The running return is reset after each row's last valid token (verl).
    """
    with torch.no_grad():
        returns = torch.zeros_like(token_level_rewards)
        running = torch.zeros_like(token_level_rewards[:, 0])
        for t in reversed(range(token_level_rewards.shape[-1])):
            running = token_level_rewards[:, t] + gamma * running
            returns[:, t] = running
            running = running * response_mask[:, t]
        advantages = masked_whiten(returns, response_mask) * response_mask
    return advantages, returns


def compute_reinforce_plus_plus_baseline_outcome_advantage(
    token_level_rewards: torch.Tensor, response_mask: torch.Tensor, index: list | torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++ with a group-mean baseline: (score - group mean) on every token, then whitened
    over the batch's valid tokens (verl). Singleton groups have mean 0. Shapes as GRPO."""
    with torch.no_grad():
        scores = token_level_rewards.sum(dim=-1)
        mean, _ = _group_mean(scores, index)
        adv = (scores - mean).unsqueeze(-1) * response_mask
        adv = masked_whiten(adv, response_mask) * response_mask
    return adv, adv


def compute_remax_outcome_advantage(
    token_level_rewards: torch.Tensor, reward_baselines: torch.Tensor, response_mask: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """ReMax (Li et al. 2023): return-to-go minus the reward of the greedy response to the same prompt.

    token_level_rewards, response_mask: [B, T]; reward_baselines: [B]. Returns (advantages, returns).
    Not whitened (verl).
    """
    with torch.no_grad():
        returns = (token_level_rewards * response_mask).flip(dims=[-1]).cumsum(dim=-1).flip(dims=[-1])
        advantages = returns - reward_baselines.unsqueeze(-1) * response_mask
    return advantages, returns


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
    groups = _group_rows(index)
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
    global_length: float | None = None,
) -> torch.Tensor:
    """Aggregate a [B, T] loss matrix into a scalar, as verl 0.9.1's core_algos.agg_loss.

    token-mean:              sum(loss * mask) / N                     (DAPO; verl's default)
    seq-mean-token-sum:      sum over rows of sum_t(loss * mask) / B
    seq-mean-token-mean:     sum over rows of (sum_t(loss * mask) / sum_t(mask)) / B  (the GRPO paper)
    seq-mean-token-sum-norm: sum(loss * mask) / (B * T)               (Dr. GRPO: a constant per row)
    N = valid tokens; B = rows with at least one valid token; T = loss_mask.shape[-1].

    global_tokens / global_seqs / global_length replace N / B / T by the whole mini-batch's counts, so
    that the micro-batches of one mini-batch sum to the mini-batch's loss (global_seqs counts all its
    rows, as verl's global_batch_size = ppo_mini_batch_size * n; update.py passes global_length =
    rollout.max_new_tokens, the generation budget verl pads responses to, whatever the batch's longest
    response or a micro-batch's trimmed width).
    An all-padding batch gives 0 where verl divides by zero.
    """
    if loss_agg_mode == "token-mean":
        if global_tokens is None:
            return masked_mean(loss_mat, loss_mask)
        return masked_sum(loss_mat, loss_mask) / global_tokens
    # verl leaves fully masked rows out of the local row count (they add nothing to the sum either)
    n_seqs = (loss_mask.sum(-1) > 0).sum().clamp(min=1) if global_seqs is None else global_seqs
    if loss_agg_mode == "seq-mean-token-sum":
        return masked_sum(loss_mat, loss_mask, -1).sum() / n_seqs
    if loss_agg_mode == "seq-mean-token-mean":
        return (masked_sum(loss_mat, loss_mask, -1) / loss_mask.sum(-1).clamp(min=1)).sum() / n_seqs
    if loss_agg_mode == "seq-mean-token-sum-norm":  # seq-mean-token-sum with every row divided by T
        return masked_sum(loss_mat, loss_mask) / n_seqs / (global_length or loss_mask.shape[-1])
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
    global_length: float | None = None,
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
        pg_losses,
        response_mask,
        loss_agg_mode,
        global_tokens=global_tokens,
        global_seqs=global_seqs,
        global_length=global_length,
    )
    metrics = {
        "pg_clipfrac": pg_clipfrac.detach(),
        "pg_clipfrac_lower": pg_clipfrac_lower.detach(),
        "ppo_kl": ppo_kl.detach(),
    }
    return loss, metrics


def compute_value_loss(
    vpreds: torch.Tensor,
    returns: torch.Tensor,
    values: torch.Tensor,
    response_mask: torch.Tensor,
    cliprange_value: float,
    loss_agg_mode: str = "token-mean",
    *,
    global_tokens: float | None = None,
    global_seqs: float | None = None,
    global_length: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Clipped value loss (PPO2 baselines), verl's numerics. All tensors [B, T].

    vclip = clip(vpreds, values - c, values + c);  L = 0.5 * agg(max((vpreds - R)^2, (vclip - R)^2)).
    Returns (loss, clipfrac = share of valid tokens where the clipped term was larger).
    """
    vclipped = torch.clamp(vpreds, values - cliprange_value, values + cliprange_value)
    losses1 = (vpreds - returns).square()
    losses2 = (vclipped - returns).square()
    loss = 0.5 * agg_loss(
        torch.maximum(losses1, losses2),
        response_mask,
        loss_agg_mode,
        global_tokens=global_tokens,
        global_seqs=global_seqs,
        global_length=global_length,
    )
    clipfrac = masked_mean(torch.gt(losses2, losses1).float(), response_mask)
    return loss, clipfrac


def compute_rollout_is_weights(
    old_log_prob: torch.Tensor,
    rollout_log_prob: torch.Tensor,
    response_mask: torch.Tensor,
    level: str = "token",
    threshold: float = 2.0,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Truncated importance sampling for the rollout/trainer mismatch (Yao et al. 2025, "TIS").

    The rollout engine samples from pi_rollout (another kernel, quantized weights, or a stale policy);
    the loss is computed for pi_old. w = pi_old / pi_rollout, truncated at `threshold` (C), detached.
    level="token":    w_t = min(exp(logp_old_t - logp_rollout_t), C)
    level="sequence": w = min(exp(sum_t (logp_old_t - logp_rollout_t)), C) on every token of the row
    old_log_prob, rollout_log_prob, response_mask: [B, T]. Returns (weights [B, T], metrics).
    The log-ratio is clamped to [-20, 20] before exp, as in the policy loss.
    """
    with torch.no_grad():
        log_ratio = (old_log_prob - rollout_log_prob) * response_mask
        if level == "sequence":
            log_ratio = log_ratio.sum(-1, keepdim=True).expand_as(old_log_prob)
        elif level != "token":
            raise ValueError(f"unknown rollout IS level {level!r}; token or sequence")
        raw = torch.exp(torch.clamp(log_ratio, -20.0, 20.0))
        weights = raw.clamp(max=threshold) * response_mask
        metrics = {
            "is_weight_mean": masked_mean(weights, response_mask),
            "is_weight_max": (raw * response_mask).max(),
            "is_truncated_frac": masked_mean((raw > threshold).float(), response_mask),
        }
    return weights, metrics


class FixedKLController:
    """KL-in-reward coefficient that never changes."""

    def __init__(self, kl_coef: float) -> None:
        self.value = kl_coef

    def update(self, current_kl: float, n_steps: int) -> None:
        pass


class AdaptiveKLController:
    """Ziegler et al. 2019: beta *= 1 + clip(KL / target - 1, -0.2, 0.2) * n_steps / horizon (verl)."""

    def __init__(self, init_kl_coef: float, target_kl: float, horizon: int) -> None:
        self.value, self.target, self.horizon = init_kl_coef, target_kl, horizon

    def update(self, current_kl: float, n_steps: int) -> None:
        error = max(-0.2, min(0.2, current_kl / self.target - 1))
        self.value *= 1 + error * n_steps / self.horizon


def apply_kl_penalty(
    token_level_scores: torch.Tensor,
    old_log_prob: torch.Tensor,
    ref_log_prob: torch.Tensor,
    response_mask: torch.Tensor,
    beta: float,
    kl_penalty_type: str = "kl",
) -> tuple[torch.Tensor, float]:
    """KL as a reward penalty (InstructGPT): r_t = score_t - beta * KL_t. All [B, T].

    Returns (token_level_rewards, the batch KL = mean over rows of each row's token-mean KL) - the
    figure the adaptive controller is updated with (verl).
    """
    kld = kl_penalty(old_log_prob, ref_log_prob, kl_penalty_type) * response_mask
    rewards = token_level_scores - beta * kld
    current = masked_mean(kld, response_mask, dim=-1).mean()
    return rewards, float(current)


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


# ----------------------------------------------------------------------------------------------------
# Learning-rate schedule (the shape of transformers' get_{constant,linear,cosine}_schedule_with_warmup,
# which TRL and verl use), as a pure function of the training step so that a resumed run and every rank
# agree without any scheduler state.
# ----------------------------------------------------------------------------------------------------
LR_SCHEDULES = ("constant", "linear", "cosine")


def lr_at(
    step: int,
    base_lr: float,
    total_steps: int,
    schedule: str,
    warmup_steps: int = 0,
    min_lr_ratio: float = 0.0,
) -> float:
    """The learning rate of training step `step` (1-based; every optimizer step within it uses this rate).

    transformers' schedules at scheduler step s = step - 1 (what a LambdaLR stepped once per training step
    gives): warm-up factor s / warmup_steps while s < warmup_steps; then with progress
    p = (s - warmup) / (total - warmup): constant 1, linear 1 - p, cosine (1 + cos(pi p)) / 2; scaled into
    [min_lr_ratio, 1] as transformers' cosine-with-min-lr does (factor' = min + (1 - min) * factor).
    """
    if schedule not in LR_SCHEDULES:
        raise ValueError(f"unknown lr schedule {schedule!r}; one of {LR_SCHEDULES}")
    s = step - 1
    if s < warmup_steps:
        return base_lr * s / max(1, warmup_steps)
    if schedule == "constant":
        return base_lr
    progress = (s - warmup_steps) / max(1, total_steps - warmup_steps)
    if schedule == "linear":
        factor = max(0.0, 1.0 - progress)
    else:
        factor = max(0.0, 0.5 * (1.0 + math.cos(math.pi * progress)))
    return base_lr * (min_lr_ratio + (1.0 - min_lr_ratio) * factor)
