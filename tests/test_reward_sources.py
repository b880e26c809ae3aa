"""The reward seam (one Scorer per source, chosen by make_scorer), the reward model on demand (billed while
loaded) and a remote reward endpoint with timeout and retry."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import torch
from conftest import SMALL

from lite_verl.config import RewardConfig, load_config
from lite_verl.data.schema import PromptRow
from lite_verl.errors import ConfigError, ModelError, RewardError
from lite_verl.reward.base import Scorer, make_scorer

ROWS = [
    PromptRow(({"role": "user", "content": "1+1?"},), "openai/gsm8k", "2", {"i": 0}),
    PromptRow(({"role": "user", "content": "2+2?"},), "openai/gsm8k", "4", {"i": 1}),
]
TEXTS = ["so #### 2", "so #### 5"]


def make_reward_model(out: Path, tiny_dir: Path, num_labels: int = 1) -> Path:
    from transformers import AutoModelForSequenceClassification, AutoTokenizer, Qwen2Config

    tok = AutoTokenizer.from_pretrained(tiny_dir)
    config = Qwen2Config(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, num_labels=num_labels,
                         pad_token_id=tok.pad_token_id)  # fmt: skip
    torch.manual_seed(0)
    AutoModelForSequenceClassification.from_config(config).save_pretrained(out)
    tok.save_pretrained(out)
    return out


def _run(tmp_path, *extra):
    from lite_verl.loop import prepare, run_training
    from lite_verl.run.rundir import RunDir

    cfg = load_config("laptop", None, [*SMALL, "trainer.total_steps=3", *extra])
    session = prepare(cfg)
    run = RunDir(tmp_path / "run")
    run.create(cfg)
    return session, run_training(session, run)


@pytest.mark.parametrize("keep_alive, loads", [(0, 3), (3600, 1)])
def test_reward_model_is_loaded_on_demand_and_released(tmp_path, tiny_dir, keep_alive, loads):
    rm = make_reward_model(tmp_path / "rm", tiny_dir)
    session, summary = _run(
        tmp_path, f"reward.model={rm}", f"reward.keep_alive_s={keep_alive}", "data.val_size=0"
    )
    reward_model = session.scorer.reward_model
    assert reward_model.loads == loads  # once per scoring, or once for the run
    assert reward_model.model is None  # released at the end of the run
    scores = reward_model.score([({"role": "user", "content": "hi"},)] * 2, ["a b c", "zzzz"])
    assert scores[0] != scores[1]  # a real model: different responses, different rewards


def test_on_demand_device_is_billed_while_loaded_only():
    from lite_verl.run.cost import Ledger, bill

    cfg = load_config("a10x4", None, ["reward.model=", "reward.device=cuda:4"])
    ledger = Ledger.from_config(cfg)
    ledger.elapsed_before = 100.0  # a 100 s run
    ledger.add_held("cuda:4", 12.5)
    rows = {r.role: r for r in bill(ledger, cfg)}
    assert rows["reward"].held_s == pytest.approx(12.5)
    assert rows["train"].held_s >= 100.0


def test_reward_model_must_have_one_output(tmp_path, tiny_dir):
    from lite_verl.reward.model import check_reward_model

    with pytest.raises(ModelError, match="num_labels=2; a reward model needs one output"):
        check_reward_model(make_reward_model(tmp_path / "rm2", tiny_dir, num_labels=2))
    with pytest.raises(ConfigError, match="are both set; a run has one reward source"):
        load_config("laptop", None, ["reward.function=m:f", "reward.url=http://x"])


class _Server:
    """A local reward endpoint: score = len(solution_str); `fail_first` requests answer 500, `delay_s` stalls."""

    def __init__(self, fail_first: int = 0, delay_s: float = 0.0) -> None:
        state = {"calls": 0}

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - http.server's name
                state["calls"] += 1
                items = json.loads(self.rfile.read(int(self.headers["Content-Length"])))["items"]
                time.sleep(delay_s)
                if state["calls"] <= fail_first:
                    self.send_response(500)
                    self.end_headers()
                    return
                body = json.dumps({"scores": [float(len(i["solution_str"])) for i in items]}).encode()
                try:
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.end_headers()
                    self.wfile.write(body)
                except BrokenPipeError:  # the client timed out first
                    pass

            def log_message(self, *args):
                pass

        self.state = state
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/score"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()


def test_remote_reward_retries_then_scores():
    from lite_verl.reward.remote import score_remote

    server = _Server(fail_first=2)
    try:
        items = [
            {"data_source": "x", "solution_str": s, "ground_truth": "", "extra_info": {}}
            for s in ("ab", "abcd")
        ]
        assert score_remote(server.url, items, timeout_s=5, retries=2) == [2.0, 4.0]
        assert server.state["calls"] == 3
    finally:
        server.close()


def test_remote_reward_timeout_is_a_clear_error_or_the_default(tmp_path):
    from lite_verl.reward.remote import score_remote

    server = _Server(delay_s=1.0)
    try:
        with pytest.raises(RewardError, match="failed 2 times .*raise reward.timeout_s / reward.retries"):
            score_remote(server.url, [{"solution_str": "a"}], timeout_s=0.2, retries=1)
        session, summary = _run(tmp_path, f"reward.url={server.url}", "reward.timeout_s=0.2", "reward.retries=0",
                                "reward.on_error=default", "reward.default_score=0.25", "data.val_size=0")  # fmt: skip
        assert summary["reward_first_10pct"] == pytest.approx(0.25)
    finally:
        server.close()


def test_make_scorer_picks_one_scorer_per_source(tmp_path):
    from lite_verl.reward.functions import InProcessScorer
    from lite_verl.reward.model import RewardModelScorer
    from lite_verl.reward.remote import RemoteScorer
    from lite_verl.reward.worker import IsolatedScorer
    from lite_verl.run.cost import Ledger

    (tmp_path / "rw.py").write_text("def score(src, text, gt, extra):\n    return float(text.endswith(gt))\n")
    rm = tmp_path / "rm"
    rm.mkdir()
    (rm / "config.json").write_text(json.dumps({"model_type": "qwen2", "num_labels": 1}))
    fn = f"{tmp_path / 'rw.py'}:score"
    cases = [
        (RewardConfig(), InProcessScorer, [1.0, 0.0]),  # the rule reward
        (RewardConfig(function=fn, isolate=False), InProcessScorer, [1.0, 0.0]),
        (RewardConfig(function=fn), IsolatedScorer, [1.0, 0.0]),
        (RewardConfig(model=str(rm)), RewardModelScorer, None),
        (RewardConfig(url="http://127.0.0.1:9/score"), RemoteScorer, None),
    ]
    ledger = Ledger.from_config(load_config("laptop", None, []))
    for cfg, kind, expected in cases:
        scorer = make_scorer(cfg)
        assert type(scorer) is kind and isinstance(scorer, Scorer)
        scorer.bill_to(ledger)
        scorer.start_step()
        if expected is not None:
            scores = scorer.score(ROWS, TEXTS)
            assert scores.dtype == torch.float32 and scores.tolist() == expected
        scorer.close()
    assert (
        make_scorer(RewardConfig(model=str(rm))).reward_model.ledger is None
    )  # billed once bill_to is called


def test_make_scorer_raises_before_anything_starts(tmp_path, tiny_dir):
    with pytest.raises(RewardError, match="cannot import 'no_such_module_xyz'"):
        make_scorer(RewardConfig(function="no_such_module_xyz:f"))
    with pytest.raises(RewardError, match="cannot import 'no_such_module_xyz'"):  # isolated: checked here too
        make_scorer(RewardConfig(function="no_such_module_xyz:f", isolate=True))
    with pytest.raises(ModelError, match="num_labels=2; a reward model needs one output"):
        make_scorer(RewardConfig(model=str(make_reward_model(tmp_path / "rm2", tiny_dir, num_labels=2))))


def test_remote_scorer_default_on_error_warns():
    scorer = make_scorer(
        RewardConfig(url="http://127.0.0.1:9/score", retries=0, on_error="default", default_score=0.25)
    )
    with pytest.warns(
        UserWarning, match=r"failed 1 times .*; scored 2 samples 0.25 \(reward.on_error=default\)"
    ):
        scores = scorer.score(ROWS, TEXTS)
    assert scores.tolist() == [0.25, 0.25]
    with pytest.raises(RewardError, match="failed 1 times"):
        make_scorer(RewardConfig(url="http://127.0.0.1:9/score", retries=0)).score(ROWS, TEXTS)


def test_reward_worker_child_starts_without_torch():
    """The child imports worker.py and rules.py; torch there would count against reward.timeout_s."""
    code = "import sys, lite_verl.reward.worker; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True)
