"""Every estimator and loss option runs through the real loop; the main ones learn; the critic is cheap."""

from __future__ import annotations

import json
import math

import pytest
from conftest import SMALL

from lite_verl.config import load_config
from lite_verl.loop import prepare, run_training
from lite_verl.run.rundir import RunDir, read_metrics


def _run(tmp_path, overrides: list[str], steps: int) -> list[dict]:
    cfg = load_config("laptop", None, [*SMALL, f"trainer.total_steps={steps}", *overrides])
    session = prepare(cfg)
    run = RunDir(tmp_path / "run")
    run.create(cfg)
    run_training(session, run)
    return [m for m in read_metrics(run.path) if "reward/mean" in m]


@pytest.mark.parametrize(
    "overrides",
    [
        ["algorithm.adv_estimator=gae"],
        ["algorithm.adv_estimator=dr_grpo", "algorithm.loss_agg_mode=seq-mean-token-sum-norm"],
        ["algorithm.adv_estimator=rloo", "algorithm.loss_agg_mode=seq-mean-token-mean"],
        [
            "algorithm.adv_estimator=reinforce_plus_plus",
            "algorithm.use_kl_loss=false",
            "algorithm.use_kl_in_reward=true",
            "algorithm.kl_ctrl_type=adaptive",
        ],
        [
            "algorithm.adv_estimator=reinforce_plus_plus_baseline",
            "algorithm.loss_agg_mode=seq-mean-token-sum",
        ],
        ["algorithm.adv_estimator=remax"],
        [
            "algorithm.ppo_epochs=2",
            "algorithm.ppo_mini_batch_size=2",
            "algorithm.rollout_correction=token",
            "algorithm.entropy_coeff=0.01",
            "algorithm.clip_ratio_high=0.28",
        ],
        ["algorithm.rollout_correction=sequence", "algorithm.kl_loss_type=k2"],
    ],
    ids=[
        "gae",
        "dr_grpo",
        "rloo",
        "rpp_kl_in_reward",
        "rpp_baseline",
        "remax",
        "epochs_minibatch_tis",
        "seq_tis",
    ],
)
def test_every_estimator_runs(tmp_path, overrides):
    rows = _run(tmp_path, overrides, steps=3)
    assert [r["step"] for r in rows] == [1, 2, 3]
    for r in rows:
        assert math.isfinite(r["actor/loss"]) and math.isfinite(r["actor/grad_norm"])
    if "algorithm.adv_estimator=gae" in overrides:
        assert "critic/vf_loss" in rows[0] and rows[0]["critic/grad_norm"] > 0
    if "algorithm.use_kl_in_reward=true" in overrides:
        assert "actor/kl_coef" in rows[0]
    if any("rollout_correction=token" in o for o in overrides):
        # HF rollout samples from the trained model itself: the IS weights are ~1
        assert rows[0]["rollout/is_weight_mean"] == pytest.approx(1.0, abs=1e-3)


@pytest.mark.slow
@pytest.mark.parametrize("estimator", ["gae", "grpo", "rloo", "reinforce_plus_plus_baseline"])
def test_reward_rises(tmp_path, estimator):
    """Acceptance: the built-in task's reward rises for PPO with a critic, GRPO, RLOO and REINFORCE++-baseline."""
    cfg = load_config("laptop", None, [f"algorithm.adv_estimator={estimator}", "trainer.total_steps=60",
                                       "data.val_size=0", "trainer.progress=false"])  # fmt: skip
    session = prepare(cfg)
    run = RunDir(tmp_path / "run")
    run.create(cfg)
    summary = run_training(session, run)
    assert summary["reward_last_10pct"] - summary["reward_first_10pct"] >= 0.3, summary


def test_critic_shares_the_base_weights():
    """Acceptance: with LoRA, the critic adds its adapter and value head, never a second base."""
    cfg = load_config("laptop", None, SMALL)
    session = prepare(cfg)
    backend = session.backend
    before = backend.parameter_bytes()
    base_bytes = sum(
        p.numel() * p.element_size() for n, p in backend.model.named_parameters() if "lora_" not in n
    )
    backend.enable_critic(cfg.critic)
    added = backend.parameter_bytes() - before
    critic_bytes = sum(p.numel() * p.element_size() for p in backend.critic_params)
    assert added == critic_bytes
    assert added < base_bytes


@pytest.mark.slow
def test_gae_resume_is_exact(tmp_path):
    from test_cli import cli, metrics

    common = ["--set", "algorithm.adv_estimator=gae", "--set", "trainer.batch_size=4", "--set", "rollout.n=4",
              "--set", "data.val_size=0", "--set", "data.task_size=64"]  # fmt: skip
    assert (
        cli("train", "--run-dir", "full", *common, "--set", "trainer.total_steps=4", cwd=tmp_path).returncode
        == 0
    )
    assert (
        cli("train", "--run-dir", "part", *common, "--set", "trainer.total_steps=2", cwd=tmp_path).returncode
        == 0
    )
    out = cli("train", "--resume", "part", "--set", "trainer.total_steps=4", cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    a = [m for m in metrics(tmp_path / "full") if "reward/mean" in m]
    b = [m for m in metrics(tmp_path / "part") if "reward/mean" in m]
    for x, y in zip(a, b):
        assert x["reward/mean"] == y["reward/mean"]
        assert x["critic/vf_loss"] == pytest.approx(y["critic/vf_loss"], rel=1e-5, abs=1e-7)
    ckpt = tmp_path / "part" / "checkpoints" / "step_00000004"
    assert (ckpt / "critic.pt").is_file() and (ckpt / "adapter" / "critic").is_dir()
    assert json.loads((ckpt / "state.json").read_text())["step"] == 4
