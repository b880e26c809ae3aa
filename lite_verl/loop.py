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
import signal
import sys
import threading
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from lite_verl.batch import UpdateBatch
from lite_verl.config import Config
from lite_verl.config.validation import train_world
from lite_verl.data.loader import PromptSampler, PromptSet, load_prompt_sets
from lite_verl.device import role_device
from lite_verl.errors import UserError
from lite_verl.reward.rules import RewardFn, load_reward_function, score_batch
from lite_verl.rollout.base import SamplingSettings
from lite_verl.run.console import Progress, summary_text
from lite_verl.run.cost import Ledger, bill
from lite_verl.run.rundir import MetricsLog, RunDir, read_metrics, set_rng_state
from lite_verl.train.group import sharded
from lite_verl.update import MicroBatchSize, make_kl_controller, run_update

MAX_SKIPPED_STEPS = 5  # non-finite losses in a row before the run stops


class TrainingDiverged(UserError):
    """The loss or gradients stayed non-finite; the message suggests the fix."""


class Interrupted(Exception):
    """SIGINT/SIGTERM: the step in flight finished, a checkpoint was written, the run stopped."""

    def __init__(self, signum: int, step: int) -> None:
        self.exit_code = 128 + signum
        super().__init__(
            f"stopped by {signal.Signals(signum).name} after step {step}; a checkpoint was written"
        )


class StopRequest:
    """First SIGINT/SIGTERM asks the loop to stop after the current step; a second one stops at once."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self._old: dict[int, Any] = {}

    def __enter__(self) -> StopRequest:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._old[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        if self.signum is not None:
            raise KeyboardInterrupt
        self.signum = signum
        print(
            f"\nlite-verl: {signal.Signals(signum).name}: finishing this step and writing a checkpoint "
            "(send it again to stop at once)",
            file=sys.stderr,
            flush=True,
        )

    def __exit__(self, *exc: Any) -> None:
        for sig, handler in self._old.items():
            signal.signal(sig, handler)


@dataclass
class Session:
    cfg: Config
    tokenizer: Any
    backend: Any  # a training backend (train/lora.py)
    engine: Any  # a rollout engine (rollout/base.py)
    train_set: PromptSet
    val_set: PromptSet
    reward_fn: RewardFn
    kl_ctrl: Any  # in-reward KL coefficient controller (algos.FixedKLController / AdaptiveKLController)
    reward_worker: Any = None  # reward_worker.RewardWorker for an isolated reward.function
    micro: MicroBatchSize | None = None  # train.micro_batch_size, halved after an out-of-memory
    prefetched: list[int] | None = None  # rollout.max_staleness=1: prompt rows of the rollout in flight
    reward_model: Any = None  # reward_model.OnDemandRewardModel for reward.model
    group: Any = None  # train/group.TrainGroup when several ranks train (train.gpus / train.cpu_ranks)


def prepare(cfg: Config) -> Session:
    """Load model, tokenizer, data and reward function; raises UserError before anything is written."""
    from lite_verl.model.load import load_tokenizer, resolve_model_path

    cfg = resolve_auto(cfg)
    torch.manual_seed(cfg.trainer.seed)
    reward_fn = load_reward_function(cfg.reward.function)
    path = resolve_model_path(cfg.model)
    tokenizer = load_tokenizer(path, cfg.model.trust_remote_code)
    train_set, val_set = load_prompt_sets(cfg.data, tokenizer, cfg.trainer.seed)
    group, backend = _trainer(cfg, path)
    if cfg.rollout.engine == "vllm":
        from lite_verl.rollout.vllm_engine import VLLMRolloutEngine

        serve = path
        if cfg.rollout.quantization == "awq":
            serve = _awq_model(cfg, path, train_set)
        engine = VLLMRolloutEngine(cfg, serve, tokenizer, backend)
    else:
        engine = _hf_engine(cfg, backend, tokenizer, group)
    kl_ctrl = make_kl_controller(cfg.algorithm)
    worker = None
    if cfg.reward.function and cfg.reward.isolate:
        from lite_verl.reward.worker import RewardWorker

        w = cfg.reward
        worker = RewardWorker(w.function, w.timeout_s, w.on_error, w.default_score)
    micro = MicroBatchSize.of(cfg, lockstep=group is not None and sharded(cfg))
    session = Session(cfg, tokenizer, backend, engine, train_set, val_set, reward_fn, kl_ctrl, worker, micro)
    session.group = group
    if cfg.reward.model:
        from lite_verl.reward.model import OnDemandRewardModel

        session.reward_model = OnDemandRewardModel(
            Path(cfg.reward.model), cfg.reward.device, cfg.reward.keep_alive_s
        )
    return session


def _trainer(cfg: Config, path: Path) -> tuple[Any, Any]:
    """-> (TrainGroup or None, backend): one process, or rank 0 of several with its followers started
    (train/group.py); rank 0's backend then announces what needs every rank."""
    from lite_verl.train.group import GroupBackend, TrainGroup, build_trainer

    world = train_world(cfg)
    device = role_device(cfg.train.gpus)
    if world == 1:
        return None, build_trainer(cfg, path, device, world)
    group = TrainGroup.start(cfg, path)
    try:
        with group.guard():
            return group, GroupBackend(build_trainer(cfg, path, device, world), group)
    except BaseException:
        group.close()
        raise


def _hf_engine(cfg: Config, backend: Any, tokenizer: Any, group: Any) -> Any:
    """transformers generate with the trained model; over a sharded trainer every rank generates."""
    from lite_verl.rollout.hf import HFRolloutEngine
    from lite_verl.train.group import LockstepEngine

    lockstep = group is not None and sharded(cfg)
    engine = HFRolloutEngine(backend.model, tokenizer, role_device(cfg.train.gpus), synced=lockstep)
    return LockstepEngine(engine, group) if lockstep else engine


def resolve_auto(cfg: Config) -> Config:
    """algorithm.rollout_correction=auto: token-level truncated IS when the rollout engine serves
    quantized weights or lags one update behind (its log-probs then differ from the trainer's by
    design), none otherwise."""
    from dataclasses import replace

    if cfg.algorithm.rollout_correction != "auto":
        return cfg
    quantized = (
        cfg.rollout.quantization != "none" or cfg.train.backend == "qlora"
    )  # trainer and engine differ
    mode = "token" if quantized or cfg.rollout.max_staleness > 0 else "none"
    return replace(cfg, algorithm=replace(cfg.algorithm, rollout_correction=mode))


def _awq_model(cfg: Config, path: Path, train_set: PromptSet) -> Path:
    """rollout.quantized_path, or the cached AWQ model calibrated on this run's first 512 prompts."""
    from lite_verl.quant.awq import AWQSettings, quantized_for_run

    if cfg.rollout.quantized_path:
        return Path(cfg.rollout.quantized_path)
    calib = [list(ids) for ids in train_set.token_ids[:512]]
    print(
        f"lite-verl: AWQ model for {path.name} (calibrating on {len(calib)} prompts unless cached)",
        file=sys.stderr,
    )
    return quantized_for_run(path, calib, AWQSettings(group_size=cfg.rollout.awq_group_size))


def host_peak_gib() -> float:
    """This process's peak resident memory in GiB (ru_maxrss: KiB on Linux, bytes on macOS)."""
    import resource

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (2**30 if sys.platform == "darwin" else 2**20)


def step_seed(seed: int, step: int) -> int:
    return (seed * 1_000_003 + step * 7919) % (2**31)


def score(
    session: Session, rows_idx: list[int], prompts: PromptSet, texts: list[str], n: int
) -> torch.Tensor:
    rows = [prompts.rows[i] for i in rows_idx for _ in range(n)]
    w = session.cfg.reward
    if session.reward_model is not None:
        return torch.tensor(
            session.reward_model.score([r.messages for r in rows], texts), dtype=torch.float32
        )
    if w.url:
        from lite_verl.reward.model import score_remote

        items = [{"data_source": r.data_source, "solution_str": t, "ground_truth": r.ground_truth,
                  "extra_info": r.extra_info} for r, t in zip(rows, texts)]  # fmt: skip
        try:
            return torch.tensor(score_remote(w.url, items, w.timeout_s, w.retries), dtype=torch.float32)
        except UserError as e:
            if w.on_error != "default":
                raise
            warnings.warn(
                f"{e}; scored {len(items)} samples {w.default_score} (reward.on_error=default)", stacklevel=1
            )
            return torch.full((len(items),), float(w.default_score))
    if session.reward_worker is not None:
        items = [(r.data_source, t, r.ground_truth, r.extra_info) for r, t in zip(rows, texts)]
        return torch.tensor(session.reward_worker.score(items), dtype=torch.float32)
    name = session.cfg.reward.function or "the rule reward"
    values = score_batch(
        session.reward_fn,
        [r.data_source for r in rows],
        texts,
        [r.ground_truth for r in rows],
        [r.extra_info for r in rows],
        name=name,
    )
    return torch.tensor(values, dtype=torch.float32)


def validate(session: Session, step: int) -> dict[str, float]:
    """Greedy, one response per held-out prompt; the mean score."""
    val = session.val_set
    if not len(val):
        return {}
    sampling = SamplingSettings(n=1, temperature=0.0, max_new_tokens=session.cfg.rollout.max_new_tokens)
    rollout = session.engine.generate(val.token_ids, sampling, seed=step_seed(session.cfg.trainer.seed, -1))
    texts = rollout.response_texts(session.tokenizer)
    scores = score(session, list(range(len(val))), val, texts, 1)
    return {"val/reward_mean": float(scores.mean())}


def _greedy_baselines(
    session: Session, rows_idx: list[int], prompts: list[list[int]], n: int
) -> torch.Tensor:
    """ReMax: the reward of the greedy response to each prompt, repeated for its n samples. [N]"""
    sampling = SamplingSettings(n=1, temperature=0.0, max_new_tokens=session.cfg.rollout.max_new_tokens)
    greedy = session.engine.generate(prompts, sampling, seed=0)
    texts = greedy.response_texts(session.tokenizer)
    return score(session, rows_idx, session.train_set, texts, 1).repeat_interleave(n)


def train_step(session: Session, sampler: PromptSampler, step: int, ledger: Ledger) -> dict[str, float]:
    cfg, r, a = session.cfg, session.cfg.rollout, session.cfg.algorithm
    if session.reward_model is not None:
        session.reward_model.release_if_idle()
    t0 = time.perf_counter()
    sampling = SamplingSettings(
        n=r.n, temperature=r.temperature, top_p=r.top_p, max_new_tokens=r.max_new_tokens
    )
    overlap = {}
    if session.prefetched is not None:  # one-step-off-policy: started during the previous update
        rows_idx, session.prefetched = session.prefetched, None
        rollout = session.engine.collect()
        start, end = session.engine.last_generate_span
        ledger.add_busy("rollout", end - start)
        overlap["timing/rollout_wait_s"] = time.perf_counter() - t0
    else:
        rows_idx = sampler.next_batch()
        with ledger.busy_on("rollout"):
            rollout = session.engine.generate(
                [session.train_set.token_ids[i] for i in rows_idx],
                sampling,
                seed=step_seed(cfg.trainer.seed, step),
            )
    prompts = [session.train_set.token_ids[i] for i in rows_idx]
    if r.max_staleness and step < cfg.trainer.total_steps:  # the next batch, with the weights of now
        session.prefetched = sampler.next_batch()
        next_prompts = [session.train_set.token_ids[i] for i in session.prefetched]
        session.engine.submit(next_prompts, sampling, seed=step_seed(cfg.trainer.seed, step + 1))
    with ledger.busy_on("rollout"):
        baselines = _greedy_baselines(session, rows_idx, prompts, r.n) if a.adv_estimator == "remax" else None
    t1 = time.perf_counter()
    with ledger.busy_on("reward"):
        texts = rollout.response_texts(session.tokenizer)
        scores = score(session, rows_idx, session.train_set, texts, r.n)
    t2 = time.perf_counter()
    group_ids = torch.arange(len(rows_idx)).repeat_interleave(r.n)
    if hasattr(session.engine, "sleep"):
        session.engine.sleep()  # colocated vLLM frees its KV cache for the trainer
    t_slept = time.perf_counter()
    with ledger.busy_on("train"):  # billed on every train GPU
        metrics = train_update(session, UpdateBatch(rollout, scores, group_ids, baselines, step))
    t3 = time.perf_counter()
    train_span = (time.time() - (t3 - t_slept), time.time())
    sync_s = session.engine.sync_weights(step)  # with a rollout in flight: waits for it, then loads
    t4 = time.perf_counter()
    span = session.engine.finished_span() if session.prefetched is not None else None
    if span is not None:  # how long the next rollout ran while this update did
        overlap["perf/overlap_s"] = max(0.0, min(span[1], train_span[1]) - max(span[0], train_span[0]))
    metrics.update(overlap)
    metrics.update(_rollout_metrics(rollout, scores))
    metrics["train/micro_batch_size"] = float(session.micro.value)
    device = getattr(session.backend, "device", None)
    if isinstance(device, torch.device) and device.type == "cuda":  # the trainer's peak this step
        ranks = [v for k, v in metrics.items() if k.startswith("perf/train_peak_gib_rank")]
        metrics["perf/train_peak_gib"] = max([torch.cuda.max_memory_allocated(device) / 2**30, *ranks])
        torch.cuda.reset_peak_memory_stats(device)
    gen_tokens, all_tokens = float(rollout.response_mask.sum()), float(rollout.attention_mask.sum())
    metrics.update(
        {
            "perf/gen_tokens_per_s": gen_tokens / max(t1 - t0, 1e-9),
            "perf/tokens_per_s": all_tokens / max(t4 - t0, 1e-9),
            "timing/rollout_s": t1 - t0,
            "timing/reward_s": t2 - t1,
            "timing/sleep_s": t_slept - t2,
            "timing/update_s": t3 - t_slept,
            "timing/sync_s": sync_s,
            "timing/step_s": t4 - t0,
        }
    )
    return metrics


def train_update(session: Session, batch: UpdateBatch) -> dict[str, float]:
    """The step's update; with several train ranks every rank runs it on its share of the rows."""
    micro = session.micro
    assert micro is not None
    if session.group is None:
        return run_update(session.backend, batch, session.cfg, session.kl_ctrl, micro)
    group = session.group
    return group.update(
        batch,
        session.kl_ctrl.value,
        lambda: run_update(session.backend.local, batch, session.cfg, session.kl_ctrl, micro, group.ranks),
    )


def _rollout_metrics(rollout, scores: torch.Tensor) -> dict[str, float]:
    lengths = rollout.response_lengths().float()
    return {
        "reward/mean": float(scores.mean()),
        "reward/std": float(scores.std()) if len(scores) > 1 else 0.0,
        "reward/max": float(scores.max()),
        "response_length/mean": float(lengths.mean()),
        "response_length/clip_ratio": float((lengths >= rollout.response_ids.shape[1]).float().mean()),
    }


def _resume(session: Session, run: RunDir, ledger: Ledger) -> tuple[int, int]:
    """Load the latest checkpoint: -> (next step, prompts consumed)."""
    ckpt = run.latest_checkpoint()
    if ckpt is None:
        raise UserError(f"--resume {run.path}: it holds no complete checkpoint; start a new run instead")
    session.backend.load(ckpt)
    state = json.loads((ckpt / "state.json").read_text())
    set_rng_state(torch.load(ckpt / "rng.pt", weights_only=False))
    ledger.restore(state.get("ledger", {}))
    session.kl_ctrl.value = float(state.get("kl_coef", session.kl_ctrl.value))
    return int(state["step"]) + 1, int(state["consumed"])


def run_training(session: Session, run: RunDir, resume: bool = False) -> dict[str, Any]:
    """The loop. Returns the summary (also written to RUN/summary.json)."""
    cfg, tr = session.cfg, session.cfg.trainer
    ledger = Ledger.from_config(cfg)
    if session.reward_model is not None:
        session.reward_model.ledger = ledger  # its device is billed while the model is loaded
    start, consumed = _resume(session, run, ledger) if resume else (1, 0)
    log = MetricsLog(run.path, tr.tensorboard, resume_step=start - 1 if resume else None)
    sampler = PromptSampler(len(session.train_set), tr.batch_size, tr.seed, cfg.data.shuffle, consumed)
    if not resume and cfg.data.val_size:
        log.log(0, validate(session, 0))
    progress = Progress(tr.total_steps, start - 1, enabled=tr.progress)
    stop = StopRequest()
    try:
        with stop:
            _steps(session, run, sampler, ledger, log, progress, start, stop)
        if cfg.data.val_size:
            log.log(tr.total_steps, validate(session, tr.total_steps))
    finally:
        progress.close()
        log.close()
        if session.reward_worker is not None:
            session.reward_worker.close()
        if hasattr(session.engine, "close"):
            session.engine.close()
        if session.reward_model is not None:
            session.reward_model.release()
        if session.group is not None:
            session.group.close()
    return _finish(session, run, ledger)


def _steps(session, run, sampler, ledger, log, progress, start: int, stop: StopRequest) -> None:
    tr = session.cfg.trainer
    skipped = 0
    for step in range(start, tr.total_steps + 1):
        metrics = train_step(session, sampler, step, ledger)
        skipped = skipped + 1 if metrics.get("actor/skipped_step") else 0
        if skipped:
            warnings.warn(f"step {step}: non-finite loss or gradient; the update was skipped", stacklevel=1)
        if skipped >= MAX_SKIPPED_STEPS:
            raise TrainingDiverged(
                f"{skipped} steps in a row had a non-finite loss; lower train.lr or check the reward scale"
            )
        if tr.val_every and step % tr.val_every == 0 and step != tr.total_steps:
            metrics.update(validate(session, step))
        log.log(step, metrics)
        progress.update(step, metrics)
        last = step == tr.total_steps
        due = (tr.save_every and step % tr.save_every == 0) or last or stop.signum is not None
        if due and tr.keep_checkpoints:
            # a rollout in flight is not part of the state: a resumed run generates that batch again
            consumed = sampler.consumed - (len(session.prefetched) if session.prefetched is not None else 0)
            state = {"consumed": consumed, "ledger": ledger.state(), "kl_coef": session.kl_ctrl.value}
            run.save_checkpoint(step, session.backend, state, tr.keep_checkpoints)
        if stop.signum is not None and not last:
            raise Interrupted(stop.signum, step)


def _finish(session: Session, run: RunDir, ledger: Ledger) -> dict[str, Any]:
    rows = [m for m in read_metrics(run.path) if "reward/mean" in m]
    vals = [m for m in read_metrics(run.path) if "val/reward_mean" in m]
    k = max(1, math.ceil(len(rows) * 0.1))
    summary: dict[str, Any] = {
        "run_dir": str(run.path),
        "steps": len(rows),
        "wall_s": ledger.wall(),
        "reward_first_10pct": sum(m["reward/mean"] for m in rows[:k]) / k if rows else None,
        "reward_last_10pct": sum(m["reward/mean"] for m in rows[-k:]) / k if rows else None,
        "val_reward_start": vals[0]["val/reward_mean"] if vals else None,
        "val_reward_end": vals[-1]["val/reward_mean"] if vals else None,
        "tokens_per_s": sum(m["perf/tokens_per_s"] for m in rows) / len(rows) if rows else None,
        "train_peak_gib": max((m.get("perf/train_peak_gib", 0.0) for m in rows), default=0.0),
        "host_peak_gib": host_peak_gib(),  # this process (controller + rank-0 trainer): offloaded state lives here
        "checkpoint": str(run.latest_checkpoint() or ""),
        "bill": [vars(b) for b in bill(ledger, session.cfg)],
        "on_demand_held_s": dict(ledger.on_demand),  # device -> seconds a reward model was loaded there
    }
    from lite_verl.run.files import atomic_write_text

    atomic_write_text(run.path / "summary.json", json.dumps(summary, indent=2))
    print(summary_text(summary, bill(ledger, session.cfg)), flush=True)
    return summary


def load_run_config(run_dir: Path, overrides: list[str]) -> Config:
    from lite_verl.config import load_config

    cfg_file = Path(run_dir) / "config.yaml"
    if not cfg_file.is_file():
        raise UserError(
            f"--resume {run_dir}: no config.yaml there; give a run directory made by lite-verl train"
        )
    return load_config(None, str(cfg_file), overrides)
