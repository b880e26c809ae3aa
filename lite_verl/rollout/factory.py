"""The one place that turns a run's config into its rollout engine (rollout/base.py: RolloutEngine).

    rollout.engine=hf                          HFRolloutEngine on the trained model, on train.gpus
    rollout.engine=hf, sharded trainer group   LockstepEngine around it: every training rank generates
    rollout.engine=vllm                        VLLMRolloutEngine serving the model (or its AWQ version)

Engines import lazily: an hf run never imports vLLM or AutoAWQ.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lite_verl.config import Config, RolloutConfig
from lite_verl.rollout.base import RolloutEngine

if TYPE_CHECKING:
    from lite_verl.data.loader import PromptSet
    from lite_verl.train.base import TrainBackend
    from lite_verl.train.group import TrainGroup

AWQ_CALIBRATION_PROMPTS = 512  # rollout.quantization=awq: the run's first train prompts calibrate it


def build_engine(
    cfg: Config,
    model_path: Path,
    tokenizer: Any,
    backend: TrainBackend,
    group: TrainGroup | None,
    train_set: PromptSet,
) -> RolloutEngine:
    """The rollout engine of a run. `model_path`: the trained model's directory; `backend`: the trainer
    (the hf engine generates with its model, vLLM takes its weights at each sync); `group`: the
    TrainGroup when several ranks train, else None; `train_set`: AWQ calibration prompts."""
    if cfg.rollout.engine == "vllm":
        from lite_verl.rollout.vllm_engine import VLLMRolloutEngine

        serve = model_path
        if cfg.rollout.quantization == "awq":
            serve = awq_model(cfg.rollout, model_path, train_set)
        return VLLMRolloutEngine.from_config(cfg, serve, tokenizer, backend)
    return _hf_engine(cfg, tokenizer, backend, group)


def _hf_engine(cfg: Config, tokenizer: Any, backend: TrainBackend, group: TrainGroup | None) -> RolloutEngine:
    """transformers generate with the trained model; over a sharded trainer every rank generates."""
    from lite_verl.rollout.hf import HFRolloutEngine

    # a sharded model's every forward gathers weights from all ranks: they all generate, in lockstep
    lockstep = group if group is not None and backend.sharded else None
    engine = HFRolloutEngine(
        backend.model, tokenizer, backend.device, synced=lockstep is not None, compute=backend.autocast
    )
    if lockstep is None:
        return engine
    from lite_verl.rollout.lockstep import LockstepEngine

    return LockstepEngine(engine, lockstep)


def awq_model(rollout: RolloutConfig, model_path: Path, train_set: PromptSet) -> Path:
    """rollout.quantized_path, or the cached AWQ model calibrated on this run's first 512 prompts."""
    from lite_verl.quant.awq import AWQSettings, quantized_for_run

    if rollout.quantized_path:
        return Path(rollout.quantized_path)
    calib = [list(ids) for ids in train_set.token_ids[:AWQ_CALIBRATION_PROMPTS]]
    print(
        f"lite-verl: AWQ model for {model_path.name} (calibrating on {len(calib)} prompts unless cached)",
        file=sys.stderr,
    )
    return quantized_for_run(model_path, calib, AWQSettings(group_size=rollout.awq_group_size))
