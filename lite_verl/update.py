"""From rollout to gradient: rewards on tokens, advantages, reference log-probs, and the PPO update.

The update owns micro-batching: each micro-batch's loss is normalised by the token (or sequence)
count of its whole mini-batch, so micro_batch_size changes memory, never the gradient.
"""

from __future__ import annotations

import math
from collections import defaultdict

import torch

from lite_verl import algos
from lite_verl.batch import Experience, RolloutBatch
from lite_verl.config import AlgorithmConfig


def token_level_rewards(scores: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """scores [N] -> [N, R] with each score on its row's last valid token (verl's convention)."""
    rewards = torch.zeros_like(response_mask, dtype=torch.float32)
    last = (response_mask.sum(-1) - 1).clamp(min=0).long()
    rewards[torch.arange(len(scores)), last] = scores.float()
    return rewards


def compute_advantages(
    scores: torch.Tensor, response_mask: torch.Tensor, group_ids: list[int], cfg: AlgorithmConfig
) -> torch.Tensor:
    rewards = token_level_rewards(scores, response_mask)
    if cfg.adv_estimator in ("grpo", "dr_grpo"):
        norm = cfg.norm_adv_by_std_in_grpo and cfg.adv_estimator == "grpo"
        adv, _ = algos.compute_grpo_outcome_advantage(
            rewards, response_mask, group_ids, norm_adv_by_std_in_grpo=norm
        )
        return adv
    raise ValueError(f"unknown adv_estimator {cfg.adv_estimator!r}")  # validation stops this earlier


def batched_log_probs(
    backend, rollout: RolloutBatch, micro: int, temperature: float, reference: bool
) -> torch.Tensor:
    """Log-probs [N, R] of the rollout's responses, no grad, in micro-batches."""
    ids, mask, r = rollout.input_ids, rollout.attention_mask, rollout.response_ids.shape[1]
    outs = []
    with torch.no_grad():
        for s in range(0, ids.shape[0], micro):
            lp, _ = backend.forward(
                ids[s : s + micro], mask[s : s + micro], r, temperature, reference=reference
            )
            outs.append(lp.float().cpu())
    return torch.cat(outs) * rollout.response_mask


def make_experience(
    backend,
    rollout: RolloutBatch,
    advantages: torch.Tensor,
    cfg: AlgorithmConfig,
    micro: int,
    temperature: float,
) -> Experience:
    """Old log-probs are recomputed by the trainer unless the update is a single on-policy step
    (one epoch, one mini-batch): then they equal the first forward of the update, detached."""
    on_policy = cfg.ppo_epochs == 1 and cfg.ppo_mini_batch_size == 0
    old = None if on_policy else batched_log_probs(backend, rollout, micro, temperature, reference=False)
    ref = batched_log_probs(backend, rollout, micro, temperature, reference=True) if cfg.use_kl_loss else None
    return Experience(
        input_ids=rollout.input_ids,
        attention_mask=rollout.attention_mask,
        response_mask=rollout.response_mask.float(),
        old_log_probs=old,  # type: ignore[arg-type]
        ref_log_probs=ref,
        advantages=advantages,
        rollout_log_probs=rollout.rollout_log_probs,
    )


def _mini_batches(num_rows: int, rows_per_mini: int) -> list[list[int]]:
    return [list(range(s, min(s + rows_per_mini, num_rows))) for s in range(0, num_rows, rows_per_mini)]


def ppo_update(
    backend, exp: Experience, cfg: AlgorithmConfig, rows_per_mini: int, micro: int, temperature: float
) -> dict[str, float]:
    """cfg.ppo_epochs passes; one optimizer step per mini-batch; gradient accumulation over micro-batches."""
    sums: dict[str, float] = defaultdict(float)
    steps = 0
    backend.train_mode(True)
    for _ in range(cfg.ppo_epochs):
        for rows in _mini_batches(exp.num_rows, rows_per_mini):
            metrics = _mini_batch_step(backend, exp.take(rows), cfg, micro, temperature)
            for k, v in metrics.items():
                sums[k] += v
            steps += 1
    return {k: v / steps for k, v in sums.items()}


def _mini_batch_step(
    backend, mb: Experience, cfg: AlgorithmConfig, micro: int, temperature: float
) -> dict[str, float]:
    tokens = float(mb.response_mask.sum())
    seqs = float(mb.num_rows)
    norm = {"global_tokens": max(tokens, 1.0), "global_seqs": seqs}
    out: dict[str, float] = defaultdict(float)
    for s in range(0, mb.num_rows, micro):
        m = mb.take(list(range(s, min(s + micro, mb.num_rows))))
        mask = m.response_mask.to(backend.device)
        share = float(m.response_mask.sum()) / max(tokens, 1.0)  # weight of token-mean metrics
        log_prob, entropy = backend.forward(
            m.input_ids, m.attention_mask, m.response_length, temperature, with_entropy=True
        )
        old = log_prob.detach() if m.old_log_probs is None else m.old_log_probs.to(log_prob.device)
        adv = m.advantages.to(log_prob.device)
        pg_loss, pg_metrics = algos.compute_policy_loss(
            old,
            log_prob,
            adv,
            mask,
            cfg.loss_agg_mode,
            cfg.clip_ratio_low,
            cfg.clip_ratio_high,
            cfg.clip_ratio_c,
            **norm,
        )
        loss = pg_loss
        assert entropy is not None
        ent = algos.agg_loss(entropy, mask, cfg.loss_agg_mode, **norm)
        if cfg.entropy_coeff:
            loss = loss - cfg.entropy_coeff * ent
        if cfg.use_kl_loss and m.ref_log_probs is not None:
            kl = algos.kl_penalty(log_prob, m.ref_log_probs.to(log_prob.device), cfg.kl_loss_type)
            kl_loss = algos.agg_loss(kl, mask, cfg.loss_agg_mode, **norm)
            loss = loss + cfg.kl_loss_coef * kl_loss
            out["actor/kl_loss"] += float(kl_loss.detach())
        backend.backward(loss)
        out["actor/loss"] += float(loss.detach())
        out["actor/pg_loss"] += float(pg_loss.detach())
        out["actor/entropy"] += float(ent.detach())
        for k, v in pg_metrics.items():
            out[f"actor/{k}"] += float(v) * share
        gap = (log_prob.detach().float().cpu() - m.rollout_log_probs).abs() * m.response_mask
        out["rollout/logprob_gap_mean"] += float(gap.sum()) / max(tokens, 1.0)
        out["rollout/logprob_gap_max"] = max(out["rollout/logprob_gap_max"], float(gap.max()))
    grad_norm = backend.step()
    out["actor/grad_norm"] = grad_norm
    out["actor/skipped_step"] = 0.0 if math.isfinite(grad_norm) and math.isfinite(out["actor/loss"]) else 1.0
    return dict(out)
