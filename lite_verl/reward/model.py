"""A reward model started on demand (reward.model).

    reward.model: DIR        a HF sequence-classification model with one output (a scalar reward head),
                             on reward.device; loaded to score, released after reward.keep_alive_s idle

The reward model's device is billed only while the model is loaded (the seed's "start it on demand"):
OnDemandRewardModel reports its loaded seconds to the Ledger (run/cost.py). `RewardModelScorer` is its
`Scorer` (base.py).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from lite_verl.data.schema import PromptRow
from lite_verl.errors import ModelError

if TYPE_CHECKING:
    from lite_verl.run.cost import Ledger

BATCH = 16  # sequences per reward-model forward


def check_reward_model(path: Path) -> None:
    """A readable sequence-classification config with one label; raises ModelError naming the fix."""
    from transformers import AutoConfig

    if not (path / "config.json").is_file():
        raise ModelError(f"reward.model={path}: no config.json there; give a Hugging Face model directory")
    config = AutoConfig.from_pretrained(path)
    if getattr(config, "num_labels", None) != 1:
        raise ModelError(
            f"reward.model={path} has num_labels={getattr(config, 'num_labels', None)}; a reward model needs one "
            "output (a scalar head, e.g. AutoModelForSequenceClassification with num_labels=1)"
        )


class OnDemandRewardModel:
    def __init__(self, path: Path, device: str, keep_alive_s: float, ledger=None) -> None:
        check_reward_model(path)
        self.path, self.device, self.keep_alive_s, self.ledger = Path(path), device, keep_alive_s, ledger
        self.model: Any = None
        self.tokenizer: Any = None
        self.loaded_at = 0.0
        self.last_used = 0.0
        self.loads = 0

    def _load(self) -> None:
        import torch
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        self.loaded_at = time.monotonic()
        self.tokenizer = AutoTokenizer.from_pretrained(self.path)
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        dtype = torch.bfloat16 if self.device.startswith("cuda") else torch.float32
        self.model = AutoModelForSequenceClassification.from_pretrained(self.path, dtype=dtype).to(
            self.device
        )
        self.model.config.pad_token_id = self.tokenizer.pad_token_id
        self.model.eval()
        self.loads += 1

    def release(self) -> None:
        """Free the device; its held time stops here."""
        if self.model is None:
            return
        import torch

        self.model = self.tokenizer = None
        if self.device.startswith("cuda"):
            torch.cuda.empty_cache()
        if self.ledger is not None:
            self.ledger.add_held(self.device, time.monotonic() - self.loaded_at)

    def release_if_idle(self) -> None:
        if self.model is not None and time.monotonic() - self.last_used >= self.keep_alive_s:
            self.release()

    def _text(self, messages: tuple[dict[str, str], ...], response: str) -> str:
        chat = [*messages, {"role": "assistant", "content": response}]
        if getattr(self.tokenizer, "chat_template", None):
            return self.tokenizer.apply_chat_template(chat, tokenize=False)
        return "\n".join(m["content"] for m in chat)

    def score(self, messages: list[tuple[dict[str, str], ...]], responses: list[str]) -> list[float]:
        import torch

        if self.model is None:
            self._load()
        texts = [self._text(m, r) for m, r in zip(messages, responses)]
        out: list[float] = []
        with torch.no_grad():
            for s in range(0, len(texts), BATCH):
                enc = self.tokenizer(texts[s : s + BATCH], return_tensors="pt", padding=True, truncation=True)
                logits = self.model(**{k: v.to(self.device) for k, v in enc.items()}).logits
                out += [float(x) for x in logits[:, 0].float().cpu()]
        self.last_used = time.monotonic()
        if self.keep_alive_s <= 0:
            self.release()
        return out


class RewardModelScorer:
    """The `Scorer` for reward.model: scores [prompt messages + response] with the on-demand model."""

    def __init__(self, reward_model: OnDemandRewardModel) -> None:
        self.reward_model = reward_model
        self.last_parts: dict[str, torch.Tensor] = {}  # one source, no parts

    def score(self, rows: Sequence[PromptRow], texts: Sequence[str], context: object = None) -> torch.Tensor:
        """[N] float32 (the model reads the texts: `context` is not needed)."""
        values = self.reward_model.score([r.messages for r in rows], list(texts))
        return torch.tensor(values, dtype=torch.float32)

    def start_step(self) -> None:
        self.reward_model.release_if_idle()

    def bill_to(self, ledger: Ledger) -> None:
        self.reward_model.ledger = ledger  # its device is billed while the model is loaded

    def close(self) -> None:
        self.reward_model.release()
