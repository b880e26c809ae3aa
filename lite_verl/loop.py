"""The training loop, top to bottom: rollout -> reward -> advantage -> update -> sync -> log.

    lite-verl train --preset laptop

`prepare` loads and checks everything a run needs (model, tokenizer, data, reward function) before
the run directory is created, so bad input costs no half-written run. `run_training` is the loop.
Seeds: data order from (trainer.seed, epoch); sampling at step k from (trainer.seed, k); LoRA init
from trainer.seed. A resumed run therefore continues exactly where the checkpoint left it.
"""

from __future__ import annotations

import json
import math
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch

from lite_verl import algos
from lite_verl.batch import RolloutBatch, UpdateBatch
from lite_verl.config import Config, TrainerConfig
from lite_verl.data.loader import PromptSampler, PromptSet, load_prompt_sets
from lite_verl.errors import RewardError, UserError
from lite_verl.reward.base import Scorer, make_scorer
from lite_verl.reward.functions import ScoreContext, TrainerState
from lite_verl.rollout.base import RolloutEngine, SamplingSettings
from lite_verl.rollout.factory import build_engine
from lite_verl.run.console import Progress, summary_text
from lite_verl.run.cost import Ledger, bill
from lite_verl.run.rundir import MetricsLog, RunDir, metrics_summary, set_rng_state
from lite_verl.run.samples import SamplesLog
from lite_verl.run.signals import Abandoned, Interrupted, StopRequest, TrainedThenInterrupted
from lite_verl.run.timing import PhaseTimer
from lite_verl.train.factory import build_trainer
from lite_verl.update import MicroBatchSize, make_kl_controller, run_update

if TYPE_CHECKING:
    from lite_verl.train.base import TrainBackend
    from lite_verl.train.group import GroupBackend, TrainGroup

MAX_SKIPPED_STEPS = 5  # non-finite losses in a row before the run stops
NO_SIGNAL_STEPS = 3  # steps in a row without a single unequal group before the run says so


class TrainingDiverged(UserError):
    """The loss or gradients stayed non-finite; the message suggests the fix."""


@dataclass
class Session:
    """Everything a run holds; `prepare` builds it, `run_training` uses and closes it."""

    cfg: Config
    tokenizer: Any
    backend: TrainBackend  # the trainer (train/base.py); rank 0's with several ranks
    engine: RolloutEngine  # the rollout engine (rollout/base.py)
    train_set: PromptSet
    val_set: PromptSet
    scorer: Scorer  # the reward source (reward/base.py): rule/user function, worker, reward model or URL
    kl_ctrl: algos.FixedKLController | algos.AdaptiveKLController  # the in-reward KL coefficient
    micro: MicroBatchSize  # train.micro_batch_size, halved after an out-of-memory
    group: TrainGroup | None = None  # several training ranks (train.gpus / train.cpu_ranks)
    prefetched: list[int] | None = None  # rollout.max_staleness=1: prompt rows of the rollout in flight

    def close(self) -> None:
        """Stop what the session started: the engine, the reward worker or model, the follower ranks."""
        self.engine.close()
        self.scorer.close()  # stops the reward worker, releases a loaded reward model
        if self.group is not None:
            self.group.close()


def prepare(cfg: Config) -> Session:
    """Load model, tokenizer, data and reward function; raises UserError before anything is written.

    The three seams come from their factories: `make_scorer` (reward/), `build_trainer` (train/) and
    `build_engine` (rollout/); the trainer comes before the engine, which serves its weights."""
    from lite_verl.model.load import check_prequantized, load_tokenizer, resolve_model_path, warn_demo_lr

    cfg = cfg.with_auto_resolved()
    torch.manual_seed(cfg.trainer.seed)
    scorer = make_scorer(cfg.reward)  # imports reward.function, reads reward.model's config; starts nothing
    path = resolve_model_path(cfg.model)
    awq = (
        cfg.rollout.engine == "vllm" and cfg.rollout.quantization == "awq" and not cfg.rollout.quantized_path
    )
    check_prequantized(path, cfg.model.path, cfg.train.backend, awq)
    warn_demo_lr(cfg, path)
    tokenizer = load_tokenizer(path, cfg.model.trust_remote_code, cfg.data.chat_template)
    train_set, val_set = load_prompt_sets(cfg.data, tokenizer, cfg.trainer.seed)
    cfg = steps_of_epochs(cfg, len(train_set))
    group, backend = build_trainer(cfg, path)
    try:
        if cfg.train.offload_during_rollout:  # vLLM starts on a card the trainer has left
            backend.park()
        engine = build_engine(cfg, path, tokenizer, backend, group, train_set)
    except BaseException:
        if group is not None:  # the follower ranks are already running
            group.close()
        raise
    micro = MicroBatchSize.of(cfg, lockstep=group is not None and backend.sharded)
    kl_ctrl = make_kl_controller(cfg.algorithm)
    return Session(cfg, tokenizer, backend, engine, train_set, val_set, scorer, kl_ctrl, micro, group)


def steps_of_epochs(cfg: Config, prompts: int) -> Config:
    """trainer.total_epochs > 0: total_steps = ceil(epochs x prompts / batch_size), said once, and the epochs
    resolved to 0 (the run's config then holds the steps, as --resume and watch read them)."""
    tr = cfg.trainer
    if tr.total_epochs <= 0:
        return cfg
    steps = max(1, math.ceil(tr.total_epochs * prompts / tr.batch_size))
    print(f"lite-verl: trainer.total_epochs={tr.total_epochs:g} over {prompts} prompts at {tr.batch_size} a step: "
          f"trainer.total_steps={steps}", file=sys.stderr)  # fmt: skip
    return replace(cfg, trainer=replace(tr, total_steps=steps, total_epochs=0.0))


def host_peak_gib() -> float | None:
    """This process's peak resident memory in GiB (ru_maxrss: KiB on Linux, bytes on macOS); None where the
    platform has no `resource` module (Windows)."""
    try:
        import resource
    except ImportError:
        return None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (2**30 if sys.platform == "darwin" else 2**20)


def step_seed(seed: int, step: int) -> int:
    return (seed * 1_000_003 + step * 7919) % (2**31)


def score(
    session: Session, rows_idx: list[int], prompts: PromptSet, rollout: RolloutBatch, n: int, step: int = 0
) -> tuple[torch.Tensor, list[str]]:
    """Rewards of the rollout's responses, n per prompt row of rows_idx in order: ([len(rows_idx) * n], their
    texts). The token ids (read once, for the texts too) and the step reach TRL-shaped functions as
    completion_ids and trainer_state."""
    rows = [prompts.rows[i] for i in rows_idx for _ in range(n)]
    ids = rollout.response_token_ids()
    texts = rollout.response_texts(session.tokenizer, ids)
    context = ScoreContext(ids, TrainerState(step, session.cfg.trainer.total_steps))
    return session.scorer.score(rows, texts, context), texts


def score_prompts(
    session: Session, prompts: PromptSet, sampling: SamplingSettings, seed: int, step: int = 0
) -> tuple[torch.Tensor, list[str]]:
    """Generate sampling.n responses to every prompt of `prompts` and score them: ([len(prompts) * n], the
    responses' texts in the same order). `step`: the training step a validation follows (0: none)."""
    rollout = session.engine.generate(prompts.token_ids, sampling, seed)
    return score(session, list(range(len(prompts))), prompts, rollout, sampling.n, step)


CORRECT = 1.0  # a reward at least this counts as a right answer (what the rule rewards give one)


def validate(session: Session, step: int) -> dict[str, float]:
    """Greedy, one response per held-out prompt: the mean reward and the accuracy (reward >= CORRECT; with
    several reward.functions the first one's own score), and each per data_source when there are several
    (as `lite-verl eval` reports them)."""
    val = session.val_set
    if not len(val):
        return {}
    sampling = SamplingSettings.of(session.cfg.rollout, greedy=True)
    scores, _ = score_prompts(session, val, sampling, step_seed(session.cfg.trainer.seed, -1), step)
    right = judged(session, scores) >= CORRECT
    out = {"val/reward_mean": float(scores.mean()), "val/acc": float(right.float().mean())}
    sources = sorted({row.data_source for row in val.rows})
    for source in sources if len(sources) > 1 else []:
        mine = [i for i, row in enumerate(val.rows) if row.data_source == source]
        out[f"val/{source}/reward_mean"] = float(scores[mine].mean())
        out[f"val/{source}/acc"] = float(right[mine].float().mean())
    return out


def judged(session: Session, scores: torch.Tensor, judge: str = "") -> torch.Tensor:
    """What is judged right or wrong in the last scoring (`scores`): with several reward.functions the own
    values of `judge`, by default the first one (the task's; a format or length term comes after it; None is
    wrong); else the reward itself. Validation and `lite-verl eval` judge alike."""
    parts = session.scorer.last_parts  # in reward.functions' order, then the functions' extra numbers
    name, judged_values = "", scores
    if len(session.cfg.reward.functions) > 1 and parts:
        name = judge or next(iter(parts))
        judged_values = parts[name].nan_to_num(nan=float("-inf"))
    # a verl-shaped function that returns {"score", "acc", ...} is judged by its acc, as verl's validation is
    acc = next((v for k, v in parts.items() if k.endswith("/acc") and (not name or k == f"{name}/acc")), None)
    if acc is None:
        return judged_values
    return torch.where(acc.isnan(), judged_values, acc)


def _greedy_baselines(session: Session, rows_idx: list[int], step: int) -> torch.Tensor:
    """ReMax: the reward of the greedy response to each prompt, repeated for its n samples. [N]"""
    sampling = SamplingSettings.of(session.cfg.rollout, greedy=True)
    greedy = session.engine.generate([session.train_set.token_ids[i] for i in rows_idx], sampling, seed=0)
    scores, _ = score(session, rows_idx, session.train_set, greedy, 1, step)
    return scores.repeat_interleave(session.cfg.rollout.n)


def train_step(
    session: Session, sampler: PromptSampler, step: int, ledger: Ledger, samples: SamplesLog | None = None
) -> dict[str, float]:
    """One step: rollout -> reward -> (engine sleeps; the trainer comes back to the card) -> update -> sync,
    with train.offload_during_rollout the trainer leaving the card after a merged sync, before an adapter's
    (Config.park_before_sync), each phase timed; a few of the
    step's completions go to `samples` (RUN/samples.jsonl) when it is due."""
    n = session.cfg.rollout.n
    session.scorer.start_step()  # an idle reward model gives its GPU back
    timer = PhaseTimer()  # every phase ends waiting for its results, so the host clock is enough
    with timer.phase("rollout"):
        rows_idx, rollout, waited = _rollout(session, sampler, step, ledger)
        baselines = None
        if session.cfg.algorithm.adv_estimator == "remax":
            with ledger.busy_on("rollout"):
                baselines = _greedy_baselines(session, rows_idx, step)
    with timer.phase("reward"), ledger.busy_on("reward"):
        scores, texts = score(session, rows_idx, session.train_set, rollout, n, step)
    group_ids = torch.arange(len(rows_idx)).repeat_interleave(n)
    with timer.phase("sleep"):
        session.engine.sleep()  # colocated vLLM frees its KV cache for the trainer
        if session.cfg.train.offload_during_rollout:
            session.backend.unpark()
    keep_samples = samples is not None and samples.due(step)
    with timer.phase("update"), ledger.busy_on("train"):  # billed on every train GPU
        advantages: list[torch.Tensor] = []  # [N] each response's first-token advantage, when sampled
        batch = UpdateBatch(rollout, scores, group_ids, baselines, step, _truncated(session, rollout))
        metrics = train_update(session, batch, advantages.append if keep_samples else None)
    sync_s = _sync_and_park(session, step, timer)
    metrics.update(waited)
    metrics.update(_overlap(session, timer.spans["update"]))
    metrics.update(_rollout_metrics(rollout, scores, session.scorer.last_parts, group_ids))
    metrics.update(_step_metrics(session, timer, sync_s, rollout, metrics))
    if samples is not None and keep_samples:
        rows = [session.train_set.rows[i] for i in rows_idx for _ in range(n)]
        parts, adv = session.scorer.last_parts, (advantages[0] if advantages else None)
        samples.record(step, rows, texts, rollout, scores, parts, adv, session.engine.eos_ids)
    return metrics


def _sync_and_park(session: Session, step: int, timer: PhaseTimer) -> float:
    """The engine takes the trained weights; with train.offload_during_rollout the trainer leaves the card
    before an adapter sync (Config.park_before_sync: through host memory), after a merged one (it merges on
    the card). -> the sync's seconds; timed as phases sync and sleep."""
    park_first = session.cfg.park_before_sync
    if park_first:
        with timer.phase("sleep"):
            _park_trainer(session)
    with timer.phase("sync"):
        sync_s = session.engine.sync_weights(step)  # with a rollout in flight: waits for it, then loads
    if not park_first:
        with timer.phase("sleep"):
            _park_trainer(session)
    return sync_s


def _park_trainer(session: Session) -> None:
    """train.offload_during_rollout: the trainer's tensors wait in host memory until the next update, so a
    colocated vLLM has the card to itself while it generates (after a merged sync its KV cache comes back
    after this; an adapter sync follows this and wakes vLLM whole)."""
    if session.cfg.train.offload_during_rollout:
        session.backend.park()


def _rollout(
    session: Session, sampler: PromptSampler, step: int, ledger: Ledger
) -> tuple[list[int], RolloutBatch, dict[str, float]]:
    """This step's prompts and responses: collected from the rollout started during the last update
    (rollout.max_staleness=1), else generated now. With staleness the next batch starts here, with the
    weights of now. -> (prompt rows, rollout, {timing/rollout_wait_s} when collected)"""
    cfg, r = session.cfg, session.cfg.rollout
    sampling = SamplingSettings.of(r)
    waited: dict[str, float] = {}
    t0 = time.perf_counter()
    if session.prefetched is not None:  # one-step-off-policy: started during the previous update
        rows_idx, session.prefetched = session.prefetched, None
        rollout = session.engine.collect()
        start, end = session.engine.last_generate_span
        ledger.add_busy("rollout", end - start)
        waited["timing/rollout_wait_s"] = time.perf_counter() - t0
    else:
        rows_idx = sampler.next_batch()
        with ledger.busy_on("rollout"):
            prompts = [session.train_set.token_ids[i] for i in rows_idx]
            rollout = session.engine.generate(prompts, sampling, seed=step_seed(cfg.trainer.seed, step))
    if r.max_staleness and step < cfg.trainer.total_steps:
        session.prefetched = sampler.next_batch()
        next_prompts = [session.train_set.token_ids[i] for i in session.prefetched]
        session.engine.submit(next_prompts, sampling, seed=step_seed(cfg.trainer.seed, step + 1))
    return rows_idx, rollout, waited


def _overlap(session: Session, train_span: tuple[float, float]) -> dict[str, float]:
    """How long the next rollout ran while this update did (rollout.max_staleness=1)."""
    span = session.engine.finished_span() if session.prefetched is not None else None
    if span is None:
        return {}
    return {"perf/overlap_s": max(0.0, min(span[1], train_span[1]) - max(span[0], train_span[0]))}


def _step_metrics(
    session: Session, timer: PhaseTimer, sync_s: float, rollout: RolloutBatch, update: dict[str, float]
) -> dict[str, float]:
    """Phase seconds, tokens per second, the micro-batch size in use and the trainer's GPU peak
    (the largest of every rank's, which `update` holds with several ranks).
    timing/sync_s is the engine's own figure: a sync that first waits for a rollout in flight does not
    count the wait."""
    t = {k: timer.seconds(k) for k in ("rollout", "reward", "sleep", "update", "sync")}
    step_s = sum(t.values())
    metrics = {"train/micro_batch_size": float(session.micro.value)}
    device = session.backend.device
    if device.type == "cuda":  # the trainer's peak this step
        ranks = [v for k, v in update.items() if k.startswith("perf/train_peak_gib_rank")]
        metrics["perf/train_peak_gib"] = max([torch.cuda.max_memory_allocated(device) / 2**30, *ranks])
        torch.cuda.reset_peak_memory_stats(device)
    gen_tokens, all_tokens = float(rollout.response_mask.sum()), float(rollout.attention_mask.sum())
    metrics.update(
        {
            "perf/gen_tokens_per_s": gen_tokens / max(t["rollout"], 1e-9),
            "perf/tokens_per_s": all_tokens / max(step_s, 1e-9),
            "timing/rollout_s": t["rollout"],
            "timing/reward_s": t["reward"],
            "timing/sleep_s": t["sleep"],
            "timing/update_s": t["update"],
            "timing/sync_s": sync_s,
            "timing/step_s": step_s,
        }
    )
    return metrics


def train_update(
    session: Session, batch: UpdateBatch, on_advantages: Callable[[torch.Tensor], None] | None = None
) -> dict[str, float]:
    """The step's update; with several train ranks every rank runs it on its share of the rows.
    `on_advantages` gets rank 0's [N] first-token advantages (RUN/samples.jsonl)."""
    micro, group = session.micro, session.group
    if group is None:
        return run_update(
            session.backend, batch, session.cfg, session.kl_ctrl, micro, on_advantages=on_advantages
        )
    local = cast("GroupBackend", session.backend).local  # rank 0's own backend, beside the followers'
    return group.update(
        batch,
        session.kl_ctrl.value,
        lambda: run_update(local, batch, session.cfg, session.kl_ctrl, micro, group.ranks, on_advantages),
    )


def _truncated(session: Session, rollout: RolloutBatch) -> torch.Tensor | None:
    """[N] bool: the responses rollout.max_new_tokens cut (RolloutBatch.cut_by_length); None unless
    algorithm.mask_truncated_completions."""
    if not session.cfg.algorithm.mask_truncated_completions:
        return None
    return rollout.cut_by_length(session.engine.eos_ids, session.cfg.rollout.max_new_tokens)


def _rollout_metrics(
    rollout: RolloutBatch, scores: torch.Tensor, parts: dict[str, torch.Tensor], group_ids: torch.Tensor
) -> dict[str, float]:
    """Reward and length statistics; with reward.functions, each function's mean over the responses it
    scored (`parts`: [N] with NaN where it gave None) as reward/NAME/mean, next to the weighted total;
    the share of prompts whose responses all got the same reward (reward/zero_std_frac)."""
    lengths = rollout.response_lengths().float()
    equal = algos.equal_reward_fraction(scores, group_ids)
    metrics = {} if equal is None else {"reward/zero_std_frac": equal}
    metrics |= {
        "reward/mean": float(scores.mean()),
        "reward/std": float(scores.std()) if len(scores) > 1 else 0.0,
        "reward/max": float(scores.max()),
        "response_length/mean": float(lengths.mean()),
        "response_length/clip_ratio": float((lengths >= rollout.response_ids.shape[1]).float().mean()),
    }
    for name, values in parts.items():
        scored = values[~values.isnan()]
        if len(scored):  # a function that scored nothing this step logs nothing (no NaN in metrics.jsonl)
            metrics[f"reward/{name}/mean"] = float(scored.mean())
    return metrics


def serve_checkpoint(session: Session, ckpt: Path) -> dict[str, Any]:
    """A checkpoint's trained state into the trainer, then into the engine, which started with the base's
    weights; -> its state.json. As a step ends (_sync_and_park), with train.offload_during_rollout vLLM asleep
    while the trainer comes back to the card."""
    if session.cfg.train.offload_during_rollout:
        session.engine.sleep()
    session.backend.load(ckpt)  # unparks: the optimizer state goes where its parameters are
    state = json.loads((ckpt / "state.json").read_text())
    _sync_and_park(session, int(state["step"]), PhaseTimer())
    return state


def _resume(session: Session, run: RunDir, ledger: Ledger) -> tuple[int, int]:
    """Load the latest checkpoint: -> (next step, prompts consumed)."""
    run.remove_stale_saves()
    ckpt = run.latest_checkpoint()
    if ckpt is None:
        raise UserError(f"--resume {run.path}: it holds no complete checkpoint; start a new run instead")
    state = serve_checkpoint(session, ckpt)
    set_rng_state(torch.load(ckpt / "rng.pt", weights_only=False))
    ledger.restore(state.get("ledger", {}))
    session.kl_ctrl.value = float(state.get("kl_coef", session.kl_ctrl.value))
    return int(state["step"]) + 1, int(state["consumed"])


def run_training(session: Session, run: RunDir, resume: bool = False) -> dict[str, Any]:
    """The loop. Returns the summary (also written to RUN/summary.json)."""
    cfg, tr = session.cfg, session.cfg.trainer
    ledger = Ledger.from_config(cfg)
    session.scorer.bill_to(ledger)  # a reward model's device is billed while the model is loaded
    start, consumed = _resume(session, run, ledger) if resume else (1, 0)
    _park_trainer(session)  # before any rollout, validation included
    try:
        log = MetricsLog(run.path, cfg, resume_step=start - 1 if resume else None)  # trainer.loggers
    except BaseException:  # a tracker that cannot start its run
        session.close()
        raise
    samples = SamplesLog(run.path, cfg, start - 1 if resume else None, log.trackers.log_samples)
    sampler = PromptSampler(len(session.train_set), tr.batch_size, tr.seed, cfg.data.shuffle, consumed)
    progress = Progress(tr.total_steps, start - 1, enabled=tr.progress and log.console)
    # from here a signal finishes the step in flight (before: lite-verl's cli stops at once)
    stop = StopRequest(saves=tr.keep_checkpoints > 0)
    try:
        if not resume and cfg.data.val_size and tr.val_before_train:
            log.log(0, validate(session, 0))
        with stop:
            _steps(session, run, sampler, ledger, (log, samples), progress, start, stop)
            if cfg.data.val_size:  # the last checkpoint is written: a signal here only skips the validation
                final = _validate_or_skip(session, tr.total_steps, stop, last=True)
                if final:
                    log.log(tr.total_steps, final)
    except BaseException:
        log.close(failed=True)  # the trackers are finished on every exit path
        raise
    finally:
        progress.close()
        session.close()
    summary: dict[str, Any] = {}
    try:
        summary = _finish(session, run, ledger)
    finally:
        log.close(summary)
    if stop.signum is not None:  # it came in the last step or the final validation: all is trained and saved
        raise TrainedThenInterrupted(stop.signum, tr.total_steps, tr.keep_checkpoints > 0, str(run.path))
    return summary


def _validate_or_skip(session: Session, step: int, stop: StopRequest, last: bool = False) -> dict[str, float]:
    """validate(), cut short at once by a stop signal (it saves nothing, and on a CPU it can take minutes);
    the signal stays in stop.signum for the loop to act on."""
    try:
        with stop.abandoning(last):
            return validate(session, step)
    except Abandoned:
        print(f"lite-verl: the validation at step {step} was skipped", file=sys.stderr, flush=True)
        return {}


def _steps(
    session: Session,
    run: RunDir,
    sampler: PromptSampler,
    ledger: Ledger,
    logs: tuple[MetricsLog, SamplesLog],
    progress: Progress,
    start: int,
    stop: StopRequest,
) -> None:
    """Steps start..total_steps: train, check for divergence, validate, log, checkpoint, honour a signal."""
    tr = session.cfg.trainer
    log, samples = logs
    skipped = flat = 0
    best = -math.inf  # the highest reward one response got in this process's steps
    saved_at = time.monotonic()
    finished: tuple[int, dict[str, Any]] | None = None  # the last step done and its state, if not saved
    for step in range(start, tr.total_steps + 1):
        try:
            metrics = train_step(session, sampler, step, ledger, samples)
        except RewardError:  # a reward that raised or hung: the policy of the last step done is intact
            if finished is not None and tr.keep_checkpoints > 0:  # save it: fix the reward, then --resume
                run.save_checkpoint(finished[0], session.backend, finished[1], tr.keep_checkpoints)
            raise
        skipped = skipped + 1 if metrics.get("actor/skipped_step") else 0
        if skipped:
            warnings.warn(f"step {step}: non-finite loss or gradient; the update was skipped", stacklevel=1)
        best = max(best, metrics["reward/max"])
        flat = flat + 1 if _no_signal(session.cfg, metrics, best) else 0
        if flat == NO_SIGNAL_STEPS:  # once per such stretch
            warnings.warn(_no_signal_text(session.cfg, step, metrics, best), stacklevel=1)
        if skipped >= MAX_SKIPPED_STEPS:
            raise TrainingDiverged(
                f"{skipped} steps in a row had a non-finite loss; lower train.lr or check the reward scale"
            )
        if tr.val_every and step % tr.val_every == 0 and step != tr.total_steps:
            metrics.update(_validate_or_skip(session, step, stop))
        log.log(step, metrics)
        progress.update(step, metrics)
        last = step == tr.total_steps
        saved = tr.keep_checkpoints > 0 and (last or stop.signum is not None or _due(tr, step, saved_at))
        # a rollout in flight is not part of the state: a resumed run generates that batch again
        consumed = sampler.consumed - (len(session.prefetched) if session.prefetched is not None else 0)
        state = {"consumed": consumed, "ledger": ledger.state(), "kl_coef": session.kl_ctrl.value}
        finished = None if saved else (step, state)
        if saved:
            run.save_checkpoint(step, session.backend, state, tr.keep_checkpoints)
            saved_at = time.monotonic()
        if stop.signum is not None and not last:
            raise Interrupted(stop.signum, step, saved)


def _no_signal(cfg: Config, metrics: dict[str, float], best: float) -> bool:
    """Every group's rewards were equal, and the estimator's baseline is the group: no advantage at all;
    either below the best reward seen (every response at the best is a solved task, as at the end of the
    laptop run), or with no response ever scored above 0 (a reward that never fires)."""
    grouped = cfg.algorithm.adv_estimator in algos.GROUP_BASELINES
    flat = grouped and metrics.get("reward/zero_std_frac") == 1.0
    return flat and (metrics["reward/mean"] < best or best <= 0)


def _no_signal_text(cfg: Config, step: int, metrics: dict[str, float], best: float) -> str:
    entropy = f", actor/entropy {metrics['actor/entropy']:.2f}" if "actor/entropy" in metrics else ""
    if best <= 0 and metrics["reward/mean"] >= best:
        return (
            f"steps {step - NO_SIGNAL_STEPS + 1}-{step}: every response scored {metrics['reward/mean']:.3f} and none "
            f"has scored above 0 yet, so {cfg.algorithm.adv_estimator} has nothing to learn from: check what the "
            "reward gets (RUN/samples.jsonl: the responses and their scores), lengthen rollout.max_new_tokens if "
            "answers are cut, or make the task easier or the reward partial"
        )
    return (
        f"steps {step - NO_SIGNAL_STEPS + 1}-{step}: each prompt's {cfg.rollout.n} responses got equal rewards "
        f"(reward/mean {metrics['reward/mean']:.3f}{entropy}), so {cfg.algorithm.adv_estimator} had nothing to "
        f"learn from, below the best reward seen ({best:.3f}): the policy may have collapsed: lower train.lr, raise "
        "rollout.temperature or rollout.n, or make the reward tell the responses apart"
    )


def _due(tr: TrainerConfig, step: int, saved_at: float) -> bool:
    """A periodic checkpoint: every trainer.save_every steps, and trainer.save_every_minutes after the last."""
    by_steps = tr.save_every > 0 and step % tr.save_every == 0
    by_time = tr.save_every_minutes > 0 and time.monotonic() - saved_at >= 60 * tr.save_every_minutes
    return by_steps or by_time


def _finish(session: Session, run: RunDir, ledger: Ledger) -> dict[str, Any]:
    summary: dict[str, Any] = {
        **metrics_summary(run.path),
        "wall_s": ledger.wall(),
        "host_peak_gib": host_peak_gib(),  # this process (controller + rank-0 trainer): offloaded state lives here
        "checkpoint": str(run.latest_checkpoint() or ""),
        "bill": [vars(b) for b in bill(ledger, session.cfg)],
        "on_demand_held_s": dict(ledger.on_demand),  # device -> seconds a reward model was loaded there
    }
    from lite_verl.run.files import atomic_write_text

    atomic_write_text(run.path / "summary.json", json.dumps(summary, indent=2))
    print(summary_text(summary, bill(ledger, session.cfg)), flush=True)
    return summary
