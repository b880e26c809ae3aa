"""The trainer a config asks for: the one entry point the loop uses to build its training backend.

    group, backend = build_trainer(cfg, model_dir)

One train device (train.gpus of one GPU, or the CPU without train.cpu_ranks): no group, the backend of
train/rank.py. Several (train.gpus [2, 3], train.cpu_ranks=2): the followers are started first
(train/group.TrainGroup.start), every rank builds the same backend, and rank 0's is wrapped in a
GroupBackend that announces to the followers what every rank must do together. The caller closes the
group when it is done (TrainGroup.close); if building fails, it is closed here.
"""

from __future__ import annotations

from pathlib import Path

from lite_verl.config import Config
from lite_verl.config.validation import train_world
from lite_verl.train.base import TrainBackend
from lite_verl.train.group import GroupBackend, TrainGroup
from lite_verl.train.rank import build_rank_backend, rank_device


def build_trainer(cfg: Config, model_dir: Path) -> tuple[TrainGroup | None, TrainBackend]:
    """-> (TrainGroup or None, backend): one process, or rank 0 of several with its followers started;
    rank 0's backend then announces what needs every rank. `model_dir`: the resolved model.path."""
    world = train_world(cfg)
    device = rank_device(cfg.train, 0)
    if world == 1:
        return None, build_rank_backend(cfg, model_dir, device, world)
    group = TrainGroup.start(cfg, model_dir)
    try:
        with group.guard():
            return group, GroupBackend(build_rank_backend(cfg, model_dir, device, world), group)
    except BaseException:
        group.close()
        raise
