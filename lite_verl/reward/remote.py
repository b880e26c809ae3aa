"""A remote reward endpoint over HTTP (reward.url).

    reward.url: http://...   POST {"items": [{data_source, solution_str, ground_truth, extra_info}]}
                             -> {"scores": [float, ...]}; reward.timeout_s per request, reward.retries

Network errors, timeouts and HTTP 5xx are retried with backoff; what still fails is a RewardError, or with
reward.on_error=default a warning and reward.default_score for the whole batch. `RemoteScorer` is the
`Scorer` (base.py).
"""

from __future__ import annotations

import json
import math
import time
import urllib.error
import urllib.request
import warnings
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from lite_verl.data.schema import PromptRow
from lite_verl.errors import RewardError, UserError

if TYPE_CHECKING:
    from lite_verl.run.cost import Ledger


def score_remote(url: str, items: list[dict[str, Any]], timeout_s: float, retries: int) -> list[float]:
    """POST the items; retry on network errors, timeouts and 5xx with backoff; -> one float per item."""
    body = json.dumps({"items": items}).encode()
    last = ""
    for attempt in range(retries + 1):
        if attempt:
            time.sleep(min(0.5 * 2 ** (attempt - 1), 8.0))
        request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=timeout_s) as response:
                scores = json.loads(response.read()).get("scores")
            break
        except urllib.error.HTTPError as e:
            last = f"HTTP {e.code}"
            if e.code < 500:  # the request is wrong: retrying will not help
                raise RewardError(
                    f"reward.url={url} answered {last}; check the endpoint and its input format"
                ) from None
        except (urllib.error.URLError, TimeoutError, OSError, ValueError) as e:
            last = f"{type(e).__name__}: {getattr(e, 'reason', e)}"
    else:
        raise RewardError(
            f"reward.url={url} failed {retries + 1} times ({last}); check the endpoint, or raise reward.timeout_s / reward.retries"
        )
    if not isinstance(scores, list) or len(scores) != len(items):
        raise RewardError(f'reward.url={url} must answer {{"scores": [...]}} with {len(items)} numbers')
    for i, v in enumerate(scores):
        if not isinstance(v, (int, float)) or not math.isfinite(v):  # true/false: 1/0, as a function's
            raise RewardError(f"reward.url={url} returned {v!r} for item {i}; scores must be finite numbers")
    return [float(v) for v in scores]


class RemoteScorer:
    """The `Scorer` for reward.url."""

    def __init__(self, url: str, timeout_s: float, retries: int, on_error: str, default_score: float) -> None:
        self.url, self.timeout_s, self.retries = url, timeout_s, retries
        self.on_error, self.default_score = on_error, default_score
        self.last_parts: dict[str, torch.Tensor] = {}  # one source, no parts

    def score(self, rows: Sequence[PromptRow], texts: Sequence[str], context: object = None) -> torch.Tensor:
        """[N] float32 (verl's four fields are sent, `context` is not); on a failure with on_error=default: a
        warning and default_score for every item."""
        items = [{"data_source": r.data_source, "solution_str": t, "ground_truth": r.ground_truth,
                  "extra_info": r.extra_info} for r, t in zip(rows, texts)]  # fmt: skip
        try:
            return torch.tensor(
                score_remote(self.url, items, self.timeout_s, self.retries), dtype=torch.float32
            )
        except UserError as e:
            if self.on_error != "default":
                raise
            warnings.warn(
                f"{e}; scored {len(items)} samples {self.default_score} (reward.on_error=default)",
                stacklevel=1,
            )
            return torch.full((len(items),), float(self.default_score))

    def start_step(self) -> None:
        pass

    def bill_to(self, ledger: Ledger) -> None:
        pass  # the endpoint is not this run's hardware

    def close(self) -> None:
        pass
