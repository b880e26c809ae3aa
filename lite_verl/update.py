"""From rollout to gradient: rewards on tokens, KL, advantages, and the PPO actor and critic updates.

The update owns micro-batching: each micro-batch's loss is normalised by the token (or sequence)
count of its whole mini-batch, so micro_batch_size changes memory, never the gradient. Several
training ranks (train/group.py) split rows the same way: each rank holds the whole batch, computes its
block of rows (`Ranks`, train/dist.py) with the whole mini-batch's counts, and the ranks' gradients and
metric sums are summed; so the number of ranks, like micro_batch_size, never changes the maths.
"""

from __future__ import annotations

import math
import sys
from collections import defaultdict
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, TypeVar

import torch

from lite_verl import algos
from lite_verl.batch import Experience, RolloutBatch, Split, UpdateBatch, micro_batch_rows
from lite_verl.config import AlgorithmConfig, Config, CriticConfig
from lite_verl.errors import UserError
from lite_verl.run.timing import PhaseTimer
from lite_verl.train.dist import ONE_RANK, Ranks

if TYPE_CHECKING:
    from lite_verl.train.base import TrainBackend

T = TypeVar("T")


class MicroBatchSize:
    """train.micro_batch_size as the run goes: halved (for the rest of the run) after an out-of-memory.

    Halving changes only how a mini-batch is split, so the maths stays the same. With several ranks
    each keeps its own size: what is retried is local work only (gathers, gradient sums and metric
    reductions come after it), so a LoRA rank that halves meets the others at the next collective.
    A sharded backend over several ranks (lockstep=True) gathers weights inside every forward: a rank
    stopping mid-forward would leave the others waiting in a collective, so its OOM is an error.
    """

    def __init__(self, size: int, lockstep: bool = False, full_length: int = 0) -> None:
        self.value = size
        self.lockstep = lockstep
        self.full_length = full_length  # > 0: pack rows up to size x full_length tokens per micro-batch

    @classmethod
    def of(cls, cfg: Config, lockstep: bool = False) -> MicroBatchSize:
        """train.micro_batch_size; with train.pack_micro_batches the token budget of that many rows of
        the run's full length (the longest prompt plus the longest response)."""
        return cls(
            cfg.train.micro_batch_size, lockstep, cfg.full_length if cfg.train.pack_micro_batches else 0
        )

    def split(self) -> Split:
        return Split(self.value, self.value * self.full_length)

    def retry_on_oom(self, fn: Callable[[Split], T], zero_grad: Callable[[], None]) -> T:
        """Run fn(split); on OOM clear the partial gradients, halve and run it again."""
        while True:
            try:
                return fn(self.split())
            except torch.OutOfMemoryError:
                zero_grad()
                if torch.cuda.is_available():
                    torch.cuda.empty_cache()
                if self.value == 1 or self.lockstep:
                    raise UserError(self._oom_message()) from None
                self.value //= 2
                print(f"lite-verl: warning: out of memory; train.micro_batch_size halved to {self.value}, retrying",
                      file=sys.stderr, flush=True)  # fmt: skip

    def _oom_message(self) -> str:
        if self.value > 1:
            return (
                f"out of memory with train.micro_batch_size={self.value}; fsdp/deepspeed over several train "
                f"ranks cannot halve it mid-step (the other ranks wait in a collective): set "
                f"train.micro_batch_size={self.value // 2}"
            )
        return (
            "out of memory with train.micro_batch_size=1; lower rollout.max_new_tokens, set "
            "train.gradient_checkpointing=true or use a smaller model"
        )


def token_level_rewards(scores: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """scores [N] -> [N, R] with each score on its row's last valid token (verl's convention)."""
    rewards = torch.zeros_like(response_mask, dtype=torch.float32)
    last = (response_mask.sum(-1) - 1).clamp(min=0).long()
    rewards[torch.arange(len(scores)), last] = scores.float()
    return rewards


def compute_advantages(
    rewards: torch.Tensor,
    mask: torch.Tensor,
    group_ids: list[int],
    cfg: AlgorithmConfig,
    values: torch.Tensor | None = None,
    baselines: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Dispatch on algorithm.adv_estimator. rewards, mask, values: [N, R]; baselines: [N]."""
    est = cfg.adv_estimator
    if est == "gae":
        assert values is not None
        return algos.compute_gae_advantage_return(rewards, values, mask, cfg.gamma, cfg.lam)
    if est in ("grpo", "dr_grpo"):
        norm = cfg.norm_adv_by_std_in_grpo and est == "grpo"
        return algos.compute_grpo_outcome_advantage(rewards, mask, group_ids, norm_adv_by_std_in_grpo=norm)
    if est == "rloo":
        return algos.compute_rloo_outcome_advantage(rewards, mask, group_ids)
    if est == "reinforce_plus_plus":
        return algos.compute_reinforce_plus_plus_outcome_advantage(rewards, mask, cfg.gamma)
    if est == "reinforce_plus_plus_baseline":
        return algos.compute_reinforce_plus_plus_baseline_outcome_advantage(rewards, mask, group_ids)
    if est == "remax":
        assert baselines is not None
        return algos.compute_remax_outcome_advantage(rewards, baselines, mask)
    raise ValueError(f"unknown adv_estimator {est!r}")  # validation stops this earlier


def make_kl_controller(cfg: AlgorithmConfig) -> algos.FixedKLController | algos.AdaptiveKLController:
    if cfg.kl_ctrl_type == "adaptive":
        return algos.AdaptiveKLController(cfg.kl_coef, cfg.kl_target, cfg.kl_horizon)
    return algos.FixedKLController(cfg.kl_coef)


def batched_log_probs(
    backend: TrainBackend, rollout: RolloutBatch, micro: Split, temperature: float, reference: bool
) -> torch.Tensor:
    """Log-probs [N, R] of the rollout's responses, no grad, in micro-batches of similar lengths with
    their common padding cut off."""
    with torch.no_grad():
        return _each_trimmed(
            rollout,
            micro,
            lambda ids, mask, r: backend.forward(ids, mask, r, temperature, reference=reference)[0],
        )


def batched_values(backend: TrainBackend, rollout: RolloutBatch, micro: Split) -> torch.Tensor:
    with torch.no_grad(), backend.critic_mode():
        return _each_trimmed(rollout, micro, backend.values)


def _each_trimmed(rollout: RolloutBatch, micro: Split, fn: Callable[..., torch.Tensor]) -> torch.Tensor:
    """fn(ids, mask, response_length) -> [n, r] over micro-batches cut from the rows in length order,
    each without its all-padding columns; the results in row order, padded back to [N, R]."""
    out = torch.zeros(rollout.response_mask.shape, dtype=torch.float32)
    for rows in micro_batch_rows(rollout.attention_mask, rollout.response_ids.shape[1], micro):
        m = rollout.take(rows).trimmed()
        r = m.response_ids.shape[1]
        out[rows, :r] = fn(m.input_ids, m.attention_mask, r).float().cpu()
    return out * rollout.response_mask


def make_experience(
    backend: TrainBackend,
    rollout: RolloutBatch,
    scores: torch.Tensor,
    group_ids: list[int],
    cfg: AlgorithmConfig,
    kl_ctrl,
    micro: MicroBatchSize,
    temperature: float,
    baselines: torch.Tensor | None = None,
    ranks: Ranks = ONE_RANK,
) -> tuple[Experience, dict[str, float]]:
    """Old/reference log-probs, values, token rewards (with in-reward KL), advantages, IS weights."""
    mask = rollout.response_mask.float()
    old, ref, values = _no_grad_forwards(backend, rollout, cfg, micro, temperature, ranks)
    metrics: dict[str, float] = {}
    rewards = token_level_rewards(scores, mask)
    if cfg.use_kl_in_reward:
        assert old is not None and ref is not None
        rewards, kl = algos.apply_kl_penalty(rewards, old, ref, mask, kl_ctrl.value, cfg.kl_penalty)
        metrics.update({"actor/reward_kl": kl, "actor/kl_coef": kl_ctrl.value})
        kl_ctrl.update(kl, n_steps=int(mask.shape[0]))
    advantages, returns = compute_advantages(rewards, mask, group_ids, cfg, values, baselines)
    is_weights = None
    if cfg.rollout_correction != "none" and old is not None:  # else formed in the update (_actor_grads)
        is_weights, is_metrics = algos.compute_rollout_is_weights(
            old, rollout.rollout_log_probs, mask, cfg.rollout_correction, cfg.rollout_is_threshold
        )
        metrics.update({f"rollout/{k}": float(v) for k, v in is_metrics.items()})
    if old is not None:
        metrics.update(_logprob_gap(old, rollout.rollout_log_probs, mask))
    exp = Experience(
        input_ids=rollout.input_ids,
        attention_mask=rollout.attention_mask,
        response_mask=mask,
        old_log_probs=old,
        ref_log_probs=ref,
        advantages=advantages,
        rollout_log_probs=rollout.rollout_log_probs,
        values=values,
        returns=returns if values is not None else None,
        is_weights=is_weights,
    )
    return exp, metrics


def on_policy(cfg: AlgorithmConfig) -> bool:
    """One epoch over one mini-batch: the policy the update starts from is the one whose log-probs it uses."""
    return cfg.ppo_epochs == 1 and cfg.ppo_mini_batch_size == 0


def _no_grad_forwards(
    backend: TrainBackend,
    rollout: RolloutBatch,
    cfg: AlgorithmConfig,
    micro: MicroBatchSize,
    temperature: float,
    ranks: Ranks,
) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
    """-> (old log-probs, reference log-probs, values), each [N, R] or None when nothing needs it.

    Old log-probs are recomputed by the trainer unless the update is a single on-policy step (one epoch,
    one mini-batch) and no in-reward KL needs them: then they equal the first forward of the update,
    detached, and the rollout-correction weights (per token or per row) are formed inside the update from
    that forward (_actor_grads), with the same maths and no extra pass. With several
    ranks each computes its block of rows and gathers the rest (W times less compute than every rank
    doing all rows); everything after that is cheap and computed whole, identically, on every rank.
    """
    need_old = not on_policy(cfg) or cfg.use_kl_in_reward
    need_ref = cfg.use_kl_loss or cfg.use_kl_in_reward
    mine = rollout.take(ranks.share(rollout.response_mask.shape[0])) if ranks.world > 1 else rollout

    def forward(m: Split, reference: bool) -> torch.Tensor:
        return batched_log_probs(backend, mine, m, temperature, reference=reference)

    def all_rows(fn: Callable[[Split], torch.Tensor]) -> torch.Tensor:
        return ranks.gather(micro.retry_on_oom(fn, backend.zero_grad))

    old = all_rows(lambda m: forward(m, False)) if need_old else None
    ref = all_rows(lambda m: forward(m, True)) if need_ref else None
    values = all_rows(lambda m: batched_values(backend, mine, m)) if cfg.adv_estimator == "gae" else None
    return old, ref, values


def _logprob_gap(old: torch.Tensor, rollout_log_probs: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """How far the engine's sampling log-probs are from the trainer's, per response token."""
    gap = (old - rollout_log_probs).abs() * mask
    return {
        "rollout/logprob_gap_mean": float(gap.sum() / mask.sum().clamp(min=1)),
        "rollout/logprob_gap_max": float(gap.max()),
    }


def _mini_batches(num_rows: int, rows_per_mini: int) -> list[list[int]]:
    return [list(range(s, min(s + rows_per_mini, num_rows))) for s in range(0, num_rows, rows_per_mini)]


def _micro_batches(mb: Experience, micro: Split) -> list[Experience]:
    """Micro-batches of rows of similar length (longest first), each without its all-padding columns.
    Losses are normalised by the whole mini-batch's counts, so how rows are grouped changes memory and
    speed, not the gradient."""
    return [mb.take(r).trimmed() for r in micro_batch_rows(mb.attention_mask, mb.response_length, micro)]


def run_update(
    backend: TrainBackend,
    batch: UpdateBatch,
    cfg: Config,
    kl_ctrl,
    micro: MicroBatchSize,
    ranks: Ranks = ONE_RANK,
    on_advantages: Callable[[torch.Tensor], None] | None = None,
) -> dict[str, float]:
    """One step's update on every rank alike: experience, then the critic's and the actor's updates.
    `on_advantages` gets each response's first-token advantage, [N] on the CPU (RUN/samples.jsonl)."""
    a, t = cfg.algorithm, cfg.train
    lr = algos.lr_at(
        batch.step, t.lr, cfg.trainer.total_steps, t.lr_scheduler, t.warmup_steps, t.min_lr_ratio
    )
    backend.set_lr(lr)  # a function of the step: every rank, and a resumed run, agree without state
    timer = PhaseTimer(backend.device)
    with timer.phase("experience"):  # the no-grad forwards: old, reference, values
        exp, metrics = make_experience(
            backend, batch.rollout, batch.scores, batch.group_ids.tolist(), a, kl_ctrl, micro,
            cfg.rollout.temperature, batch.baselines, ranks,
        )  # fmt: skip
    exp = replace(exp, horizon=cfg.rollout.max_new_tokens)  # seq-mean-token-sum-norm's T: the budget
    if batch.truncated is not None:  # advantages above counted them; the loss below does not
        exp = replace(
            exp, response_mask=exp.response_mask * (~batch.truncated).to(exp.response_mask)[:, None]
        )
        metrics["actor/masked_truncated_frac"] = float(batch.truncated.float().mean())
    if on_advantages is not None:
        on_advantages(exp.advantages[:, 0].detach().float().cpu())
    metrics.update(timer.metrics)
    metrics["train/lr"] = lr
    rows_per_mini = (a.ppo_mini_batch_size or cfg.trainer.batch_size) * cfg.rollout.n
    if exp.values is not None:
        metrics.update(critic_update(backend, exp, a, cfg.critic, rows_per_mini, micro, ranks))
    if batch.step > cfg.critic.warmup_steps or exp.values is None:
        metrics.update(ppo_update(backend, exp, a, rows_per_mini, micro, cfg.rollout.temperature, ranks))
    device = backend.device
    if ranks.world > 1 and device.type == "cuda":
        # every rank's peak so far (rank 0 resets its own each step): the bill and the plan need them all
        peak = torch.tensor([torch.cuda.max_memory_allocated(device) / 2**30], dtype=torch.float64)
        metrics.update({f"perf/train_peak_gib_rank{r}": float(v) for r, v in enumerate(ranks.gather(peak))})
        # a follower's figure covers one update, as rank 0's (reset by loop.py) covers one step
        if ranks.rank:
            torch.cuda.reset_peak_memory_stats(device)
    if cfg.hybrid and device.type == "cuda":
        # the update's activations go back to the driver before vLLM wakes: torch's allocator would keep
        # them cached, and the card would hold them and vLLM's KV cache at once (the device-wide peak)
        torch.cuda.empty_cache()
    return metrics


def ppo_update(
    backend: TrainBackend,
    exp: Experience,
    cfg: AlgorithmConfig,
    rows_per_mini: int,
    micro: MicroBatchSize,
    temperature: float,
    ranks: Ranks = ONE_RANK,
) -> dict[str, float]:
    """cfg.ppo_epochs passes; one optimizer step per mini-batch; gradient accumulation over micro-batches."""
    backend.train_mode(True)
    timer = PhaseTimer(backend.device)

    def step(out: dict[str, float]) -> dict[str, float]:
        with timer.phase("optimizer"):
            norm = backend.step()
        ok = math.isfinite(norm) and math.isfinite(out["actor/loss"])
        return {"actor/grad_norm": norm, "actor/skipped_step": 0.0 if ok else 1.0}

    out = _each_mini_batch(
        exp, cfg.ppo_epochs, rows_per_mini, micro, backend.zero_grad, ranks,
        lambda mb, m, norm: _actor_grads(backend, mb, cfg, m, temperature, norm), step,
    )  # fmt: skip
    out["actor/skipped_step"] = float(out["actor/skipped_step"] > 0)
    # clipping and the optimizer step(s), summed: with offloaded state, the host's share of the update
    out["timing/optimizer_s"] = timer.seconds("optimizer")
    return out


Norm = dict[str, float]  # global_tokens, global_seqs, global_length: the whole mini-batch's (algos.agg_loss)


def _each_mini_batch(
    exp: Experience,
    epochs: int,
    rows_per_mini: int,
    micro: MicroBatchSize,
    zero_grad: Callable[[], None],
    ranks: Ranks,
    grads: Callable[[Experience, Split, Norm], dict[str, float]],
    step: Callable[[dict[str, float]], dict[str, float]],
) -> dict[str, float]:
    """Over epochs x mini-batches: `grads(this rank's rows, micro_batch_size, norm)` accumulates the
    gradients and metric sums (local work, retried with a halved micro-batch after an out-of-memory),
    the ranks' metric sums are added up, and `step(metrics)` steps (summing the ranks' gradients first)
    and returns its own metrics. -> the mean of each metric over the mini-batches."""
    sums: dict[str, float] = defaultdict(float)
    steps = 0
    for _ in range(epochs):
        for rows in _mini_batches(exp.num_rows, rows_per_mini):
            mb = exp.take(rows)
            norm = {
                "global_tokens": max(float(mb.response_mask.sum()), 1.0),
                "global_seqs": float(mb.num_rows),
                "global_length": float(mb.horizon or mb.response_length),  # Dr. GRPO's T, before any trimming
            }
            mine = mb.take(ranks.share(mb.num_rows)) if ranks.world > 1 else mb
            out = ranks.reduce(
                micro.retry_on_oom(lambda m, mine=mine, norm=norm: grads(mine, m, norm), zero_grad)
            )
            out.update(step(out))
            for k, v in out.items():
                sums[k] += v
            steps += 1
    return {k: v / steps for k, v in sums.items()}


def _actor_grads(
    backend: TrainBackend, mb: Experience, cfg: AlgorithmConfig, micro: Split, temperature: float, norm: Norm
) -> dict[str, float]:
    """Forward/backward over mb's micro-batches; metric sums weighted to add up over micro-batches
    and ranks to the whole mini-batch's values."""
    tokens = norm["global_tokens"]
    out: dict[str, float] = defaultdict(float)
    for m in _micro_batches(mb, micro):
        mask = m.response_mask.to(backend.device)
        share = float(m.response_mask.sum()) / tokens  # weight of token-mean metrics
        log_prob, entropy = backend.forward(
            m.input_ids, m.attention_mask, m.response_length, temperature, True
        )
        old = log_prob.detach() if m.old_log_probs is None else m.old_log_probs.to(log_prob.device)
        is_w = None if m.is_weights is None else m.is_weights.to(log_prob.device)
        if m.old_log_probs is None and cfg.rollout_correction != "none":  # on-policy: old is this forward
            is_w, is_metrics = algos.compute_rollout_is_weights(
                old,
                m.rollout_log_probs.to(old.device),
                mask,
                cfg.rollout_correction,
                cfg.rollout_is_threshold,
            )
            for k, v in is_metrics.items():
                key = f"rollout/{k}"
                out[key] = max(out[key], float(v)) if k.endswith("_max") else out[key] + float(v) * share
        pg_loss, pg_metrics = algos.compute_policy_loss(
            old, log_prob, m.advantages.to(log_prob.device), mask, cfg.loss_agg_mode,
            cfg.clip_ratio_low, cfg.clip_ratio_high, cfg.clip_ratio_c, is_w, **norm,
        )  # fmt: skip
        assert entropy is not None
        ent = algos.agg_loss(entropy, mask, cfg.loss_agg_mode, **norm)
        loss = pg_loss - cfg.entropy_coeff * ent if cfg.entropy_coeff else pg_loss
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
        if m.old_log_probs is None:  # on-policy: this forward is the trainer's view of the rollout
            gap = (log_prob.detach().float().cpu() - m.rollout_log_probs).abs() * m.response_mask
            out["rollout/logprob_gap_mean"] += float(gap.sum()) / tokens
            out["rollout/logprob_gap_max"] = max(out["rollout/logprob_gap_max"], float(gap.max()))
    return dict(out)


def critic_update(
    backend: TrainBackend,
    exp: Experience,
    cfg: AlgorithmConfig,
    critic: CriticConfig,
    rows_per_mini: int,
    micro: MicroBatchSize,
    ranks: Ranks = ONE_RANK,
) -> dict[str, float]:
    """The value loss on the same mini-batches as the actor, with the critic's own optimizer."""
    with backend.critic_mode():
        out = _each_mini_batch(
            exp, cfg.ppo_epochs, rows_per_mini, micro, backend.zero_critic_grad, ranks,
            lambda mb, m, norm: _critic_grads(backend, mb, cfg, critic, m, norm),
            lambda _: {"critic/grad_norm": backend.critic_step()},
        )  # fmt: skip
    mask = exp.response_mask
    assert exp.values is not None and exp.returns is not None
    out["critic/values_mean"] = float(algos.masked_mean(exp.values, mask))
    out["critic/returns_mean"] = float(algos.masked_mean(exp.returns, mask))
    return out


def _critic_grads(
    backend: TrainBackend,
    mb: Experience,
    cfg: AlgorithmConfig,
    critic: CriticConfig,
    micro: Split,
    norm: Norm,
) -> dict[str, float]:
    out: dict[str, float] = defaultdict(float)
    dev = backend.device
    for m in _micro_batches(mb, micro):
        assert m.values is not None and m.returns is not None
        vpreds = backend.values(m.input_ids, m.attention_mask, m.response_length)
        loss, clipfrac = algos.compute_value_loss(
            vpreds, m.returns.to(dev), m.values.to(dev), m.response_mask.to(dev),
            critic.cliprange_value, cfg.loss_agg_mode, **norm,
        )  # fmt: skip
        backend.backward(loss)
        share = float(m.response_mask.sum()) / norm["global_tokens"]
        out["critic/vf_loss"] += float(loss.detach())
        out["critic/vf_clipfrac"] += float(clipfrac) * share
    return dict(out)
