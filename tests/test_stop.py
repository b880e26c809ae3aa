"""rollout.stop: a response ends after the token that completes the first stop string, the same rule on
every engine (rollout/hf.cut_at_stop); the engines' own early stopping only saves time."""

from __future__ import annotations

import pytest
import torch

from lite_verl.rollout.base import SamplingSettings
from lite_verl.rollout.hf import cut_at_stop


@pytest.fixture(scope="module")
def tok(tiny_dir):
    from lite_verl.model.load import load_tokenizer

    return load_tokenizer(tiny_dir, False)


def test_the_cut_is_after_the_token_that_completes_the_first_stop_string(tok):
    stop = ("\n\nQuestion:",)
    head = tok("3 + 4 = 7.\n#### 7", add_special_tokens=False)["input_ids"]
    rest = tok("\n\nQuestion: what is 2 + 2?\nAnswer: 4\n\nQuestion:", add_special_tokens=False)["input_ids"]
    ids = torch.tensor([head + rest, head + rest])
    mask = torch.ones_like(ids)
    mask[1, len(head) + 1 :] = 0  # the second row ended (EOS) before any stop string
    cut = cut_at_stop(ids, mask, tok, stop)
    kept = cut[0].sum().item()
    text = tok.decode(ids[0, :kept].tolist())
    assert text.endswith("Question:") and text.count("Question:") == 1  # the first one, kept
    assert "Question:" not in tok.decode(ids[0, : kept - 1].tolist())  # no token earlier would do
    assert torch.equal(cut[1], mask[1])  # no stop string: left as it was
    assert torch.equal(cut_at_stop(ids, mask, tok, ()), mask)


def test_a_typed_backslash_n_in_rollout_stop_is_a_newline():
    from lite_verl.config import load_config

    cfg = load_config("laptop", None, ["rollout.stop=['\\n\\nQuestion:', 'END']"])
    assert cfg.rollout.stop_strings == ("\n\nQuestion:", "END")
    assert SamplingSettings.of(cfg.rollout).stop == ("\n\nQuestion:", "END")
    assert SamplingSettings.of(cfg.rollout, greedy=True) == SamplingSettings(
        n=1,
        temperature=0.0,
        max_new_tokens=cfg.rollout.max_new_tokens,
        stop=("\n\nQuestion:", "END"),
        log_probs=False,
    )


def check_stopped(batch, tokenizer, stop: tuple[str, ...]) -> int:
    """Every response that holds a stop string ends with the token that completes its first one; -> how
    many responses were cut by a stop string."""
    cut = 0
    for ids, mask in zip(batch.response_ids, batch.response_mask):
        kept = ids[mask.bool()].tolist()
        text = tokenizer.decode(kept, skip_special_tokens=True)
        if any(s in text for s in stop):
            cut += 1
            assert not any(s in tokenizer.decode(kept[:-1], skip_special_tokens=True) for s in stop), text
    return cut


def test_the_hf_engine_stops_at_the_stop_strings():
    from lite_verl.config import load_config
    from lite_verl.loop import prepare

    session = prepare(load_config("laptop", None, ["rollout.max_new_tokens=24", "data.val_size=0"]))
    prompts = session.train_set.token_ids[:6]
    free = session.engine.generate(prompts, SamplingSettings(n=2, max_new_tokens=24), seed=3)
    # stop at characters the random-init model emits often: most responses are cut
    stop = ("a", "e", "o")
    stopped = session.engine.generate(prompts, SamplingSettings(n=2, max_new_tokens=24, stop=stop), seed=3)
    assert check_stopped(stopped, session.tokenizer, stop) >= 6
    assert stopped.response_mask.sum() < free.response_mask.sum()
    after = stopped.response_mask == 0  # what the cut dropped is padding, with no log-prob
    assert torch.all(stopped.rollout_log_probs[after] == 0)
    assert torch.all(stopped.response_ids[after] == session.tokenizer.pad_token_id)
