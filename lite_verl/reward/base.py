"""The reward seam: one `Scorer` per reward source, chosen once by `make_scorer(cfg.reward)`.

    scorer = make_scorer(cfg.reward)       # loads and checks the source: UserError before any write
    scorer.bill_to(ledger)                 # a reward model's device is billed while it is loaded
    scorer.start_step()                    # each step: release a reward model idle past keep_alive_s
    scores = scorer.score(rows, texts)     # [N] float32; rows[i] is the prompt row of texts[i]
    scorer.score(rows, texts, context)     # with the token ids and step (TRL's completion_ids, trainer_state)
    scorer.last_parts                      # {name: [N] float32} of that score, one per reward.functions entry
    scorer.close()                         # end of run: stop the worker, release the model

The sources (config validation allows one at most):
    reward.model        RewardModelScorer (model.py)     a sequence-classification model, loaded on demand
    reward.url          RemoteScorer      (remote.py)    POST to an HTTP endpoint, on_error=default falls back
    reward.function(s)  IsolatedScorer    (worker.py)    user functions in a child process (reward.isolate)
    otherwise           InProcessScorer   (functions.py) built-ins, rule rewards, user functions in process
reward.function is one user function, reward.functions several weighted ones, user or built-in; functions.py
says how each is called (TRL's shape or verl's) and how their values add up.

Every scorer has every method (a no-op where there is nothing to do), so the loop never asks `hasattr`.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import torch

from lite_verl.data.schema import PromptRow

if TYPE_CHECKING:
    from lite_verl.config import RewardConfig
    from lite_verl.reward.functions import ScoreContext
    from lite_verl.run.cost import Ledger


@runtime_checkable
class Scorer(Protocol):
    """Scores responses; owns whatever the reward source holds (a worker process, a loaded model)."""

    # each function's own values in the last score() ([N] float32, NaN where it gave None), by its name;
    # empty unless reward.functions is set. The loop logs them as reward/NAME/mean.
    last_parts: dict[str, torch.Tensor]

    def score(
        self, rows: Sequence[PromptRow], texts: Sequence[str], context: ScoreContext | None = None
    ) -> torch.Tensor:
        """One reward per response: [N] float32, texts[i] answering rows[i]; a bad score is a RewardError.
        `context`: the responses' token ids and the step, which TRL-shaped functions may take."""
        ...

    def start_step(self) -> None:
        """Called at the start of each training step (a reward model idle past keep_alive_s is released)."""
        ...

    def bill_to(self, ledger: Ledger) -> None:
        """Report device time held by this scorer (a loaded reward model) to the run's ledger."""
        ...

    def close(self) -> None:
        """End of run: stop what the scorer started; it is not used again."""
        ...


def make_scorer(cfg: RewardConfig) -> Scorer:
    """The scorer for the reward section. Loads and checks the source now, raising UserError before the run
    directory exists: a user function in this process, or with reward.isolate in its worker (started here:
    the user's module is never imported by the controller); a reward model's config is read (the model
    starts on the first score)."""
    from lite_verl.reward.functions import InProcessScorer, load_function, note_fallbacks, specs_of

    if cfg.model:
        from lite_verl.model.hub import parse_hub_id, resolve_hub
        from lite_verl.reward.model import OnDemandRewardModel, RewardModelScorer

        hub = parse_hub_id(cfg.model)  # a Hub id: its cached snapshot, downloaded once if missing
        path = resolve_hub(*hub, key="reward.model") if hub else Path(cfg.model)
        return RewardModelScorer(OnDemandRewardModel(path, cfg.device, cfg.keep_alive_s))
    if cfg.url:
        from lite_verl.reward.remote import RemoteScorer

        return RemoteScorer(cfg.url, cfg.timeout_s, cfg.retries, cfg.on_error, cfg.default_score)
    specs, log_parts = specs_of(cfg)
    note_fallbacks(specs)
    if cfg.isolate and any(not s.builtin for s in specs):
        from lite_verl.reward.worker import IsolatedScorer, RewardWorker

        worker = RewardWorker(specs, cfg.timeout_s, cfg.on_error, cfg.default_score)
        return IsolatedScorer(worker.start(), worker, log_parts)
    return InProcessScorer([load_function(s) for s in specs], log_parts)
