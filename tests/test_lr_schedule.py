"""The learning-rate schedule (algos.lr_at): transformers' schedules, by hand and against transformers."""

from __future__ import annotations

import math

import pytest
import torch

from lite_verl.algos import lr_at


@pytest.mark.parametrize(
    ("step", "expected"),
    [
        (1, 0.0),  # warm-up starts at 0, as transformers' does (scheduler step 0)
        (3, 1e-3 * 2 / 4),  # s = 2 of 4 warm-up steps
        (5, 1e-3),  # s = 4: warm-up done, cosine progress 0
        (8, 1e-3 * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 3 / 8)))),  # progress (7 - 4) / (12 - 4)
        (13, 1e-3 * 0.1),  # progress 1: the floor
    ],
)
def test_cosine_with_warmup_and_floor_by_hand(step, expected):
    assert lr_at(step, 1e-3, 12, "cosine", warmup_steps=4, min_lr_ratio=0.1) == pytest.approx(expected)


def test_the_config_offers_the_schedules_lr_at_computes():
    import typing

    from lite_verl.algos import LR_SCHEDULES
    from lite_verl.config.schema import LrScheduler

    assert typing.get_args(LrScheduler) == LR_SCHEDULES


def test_constant_without_warmup_is_train_lr_at_every_step():
    assert {lr_at(s, 3e-3, 100, "constant") for s in range(1, 101)} == {3e-3}


@pytest.mark.parametrize("schedule", ["constant", "linear", "cosine"])
def test_matches_transformers_schedules(schedule):
    from transformers import get_scheduler

    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=2e-4)
    sched = get_scheduler(schedule if schedule != "constant" else "constant_with_warmup", opt, 3, 20)
    for step in range(1, 21):  # lr during training step `step`, then one scheduler step
        assert lr_at(step, 2e-4, 20, schedule, warmup_steps=3) == pytest.approx(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()


def test_the_update_sets_the_step_rate_on_the_optimizer(tiny_dir):
    """run_update puts lr_at(step) on the policy optimizer and logs it as train/lr."""
    from conftest import SMALL

    from lite_verl.config import load_config
    from lite_verl.data.loader import PromptSampler
    from lite_verl.loop import prepare, train_step
    from lite_verl.run.cost import Ledger

    sets = [*SMALL, "trainer.total_steps=10", "train.lr_scheduler=linear", "train.warmup_steps=2"]
    session = prepare(load_config("laptop", None, sets))
    sampler = PromptSampler(len(session.train_set), 4, 0, True, 0)
    ledger = Ledger.from_config(session.cfg)
    try:
        for step in (1, 2, 5):
            metrics = train_step(session, sampler, step, ledger)
            expected = lr_at(step, session.cfg.train.lr, 10, "linear", warmup_steps=2)
            assert metrics["train/lr"] == pytest.approx(expected)
            assert session.backend.optimizer.param_groups[0]["lr"] == pytest.approx(expected)  # type: ignore[attr-defined]
    finally:
        session.close()
