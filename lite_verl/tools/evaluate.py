"""`lite-verl eval`: accuracy of a model or of a run's last checkpoint on held-out prompts.

    lite-verl eval RUN_DIR                       the run's config, its last checkpoint (adapter applied)
    lite-verl eval MODEL --preset laptop --set data.val_files=[test.jsonl]
    lite-verl eval RUN_DIR --k 8 --out eval.json

It runs the run's own machinery (`loop.prepare`: the rollout engine the config names, vLLM or HF generate,
and the run's reward scorer) on the validation prompts (`data.val_files`, or the built-in task's held-out
set), so an evaluation scores exactly as training did. Per `data_source`:
  greedy   the mean reward of one greedy response per prompt
  greedy_acc  the fraction of prompts whose greedy response is correct (differs from greedy when a reward
           gives partial credit, e.g. 0.1 for a wrong answer in the right format)
  mean@k   the mean reward of k sampled responses per prompt (rollout.temperature, top_p)
  pass@k   the fraction of prompts with at least one correct response among k, estimated without bias
           from n = k samples (Chen et al. 2021, "Evaluating Large Language Models Trained on Code")
A response is correct when its reward reaches --correct (1.0: what the rule rewards give a right answer).
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lite_verl.errors import UserError

ALL_PROMPTS = 10**9  # data.val_size that keeps every row of data.val_files
EVAL_DIR = "eval"  # RUN/eval/step_N.json: the evaluation of a run's checkpoint step_N

if TYPE_CHECKING:
    from lite_verl.config import Config
    from lite_verl.loop import Session


def pass_at_k(n: int, c: int, k: int) -> float:
    """P(at least one of k draws without replacement from n samples, c of them correct, is correct):
    1 - C(n - c, k) / C(n, k), the unbiased estimator of Chen et al. (2021)."""
    if not 0 < k <= n or not 0 <= c <= n:
        raise ValueError(f"pass@k needs 0 < k <= n and 0 <= c <= n (n={n}, c={c}, k={k})")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


@dataclass
class SourceScores:
    """One data source's rewards: greedy [prompts], sampled [prompts][k]."""

    greedy: list[float] = field(default_factory=list)
    sampled: list[list[float]] = field(default_factory=list)

    def summary(self, k: int, correct: float) -> dict[str, float]:
        out = {
            "prompts": float(len(self.greedy)),
            "greedy": _mean(self.greedy),
            "greedy_acc": _mean([float(x >= correct) for x in self.greedy]),
        }
        if self.sampled:
            flat = [s for row in self.sampled for s in row]
            out[f"mean@{k}"] = _mean(flat)
            out[f"pass@{k}"] = _mean(
                [pass_at_k(len(r), sum(s >= correct for s in r), k) for r in self.sampled]
            )
        return out


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else float("nan")


def evaluate(session: Session, k: int, correct: float) -> dict[str, dict[str, float]]:
    """Scores of the session's validation prompts, per data source and over all ('all')."""
    from lite_verl.loop import score_prompts, step_seed
    from lite_verl.rollout.base import SamplingSettings

    cfg, val = session.cfg, session.val_set
    if not len(val):
        raise UserError("no prompts to evaluate: give data.val_files or set data.val_size > 0")
    r = cfg.rollout
    greedy, sampled = SamplingSettings.of(r, greedy=True), SamplingSettings.of(r, n=k)
    seed = step_seed(cfg.trainer.seed, -2)
    g = score_prompts(session, val, greedy, seed)
    s = score_prompts(session, val, sampled, seed)
    by_source: dict[str, SourceScores] = defaultdict(SourceScores)
    for i, row in enumerate(val.rows):
        for name in (row.data_source, "all"):
            by_source[name].greedy.append(float(g[i]))
            by_source[name].sampled.append([float(x) for x in s[i * k : (i + 1) * k]])
    return {name: part.summary(k, correct) for name, part in sorted(by_source.items())}


def eval_config(
    target: str,
    preset: str | None,
    config_file: str | None,
    sets: list[str],
    limit: int = 0,
    recipe: str | None = None,
) -> tuple[Config, Path | None]:
    """(config, checkpoint or None). A run directory gives its resolved config and last checkpoint; anything
    else is a model (model.path) evaluated under the given preset/config. Validation files are read whole
    unless `limit` (data.val_size caps them in training)."""
    from lite_verl.config import load_config
    from lite_verl.run.rundir import RunDir, load_run_config

    run = Path(target)
    if (run / "config.yaml").is_file():
        ckpt = RunDir(run).latest_checkpoint()
        if ckpt is None:
            raise UserError(
                f"eval {run}: the run holds no complete checkpoint yet; evaluate its model instead"
            )
        cfg, found = load_run_config(run, sets), ckpt
    else:
        cfg = load_config(preset, config_file, [f"model.path={target}", *sets], recipe=recipe)
        found = None
    if cfg.data.val_files and not limit:
        cfg = replace(cfg, data=replace(cfg.data, val_size=ALL_PROMPTS))
    return cfg, found


def run_eval(target: str, preset: str | None, config_file: str | None, sets: list[str], k: int,
             correct: float, out: Path | None, limit: int = 0, recipe: str | None = None) -> dict[str, Any]:  # fmt: skip
    """Load, evaluate, print the table, write the JSON. -> the result."""
    from lite_verl.loop import prepare

    cfg, ckpt = eval_config(target, preset, config_file, sets, limit, recipe)
    cfg = replace(cfg, trainer=replace(cfg.trainer, progress=False))
    session = prepare(cfg)
    try:
        if ckpt is not None:
            session.backend.load(ckpt)  # the trained adapter (or weights); the engine then serves them
            session.engine.sync_weights(int(json.loads((ckpt / "state.json").read_text())["step"]))
        scores = evaluate(session, k, correct)
    finally:
        session.close()
    result = {"target": target, "checkpoint": str(ckpt or ""), "k": k, "correct": correct, "scores": scores}
    print(format_table(scores, k))
    from lite_verl.run.files import atomic_write_text

    if out is not None:
        atomic_write_text(out, json.dumps(result, indent=2))
    if ckpt is not None:  # a run's checkpoint: kept with the run too, where `lite-verl report` shows it
        (Path(target) / EVAL_DIR).mkdir(exist_ok=True)
        atomic_write_text(Path(target) / EVAL_DIR / f"{ckpt.name}.json", json.dumps(result, indent=2))
    return result


def eval_lines(run_dir: Path) -> list[str]:
    """The evaluations kept in RUN/eval/ (one per evaluated checkpoint), for `lite-verl report`."""
    lines = []
    for path in sorted((run_dir / EVAL_DIR).glob("step_*.json")):
        try:
            result = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        lines.append(f"eval of {path.stem} (lite-verl eval, k={result['k']}):")
        lines += ["  " + line for line in format_table(result["scores"], result["k"]).splitlines()]
    return lines


def format_table(scores: dict[str, dict[str, float]], k: int) -> str:
    cols = ["prompts", "greedy", "greedy_acc", f"mean@{k}", f"pass@{k}"]
    width = max(12, *(len(n) for n in scores))
    lines = [f"{'data_source':<{width}}" + "".join(f"{c:>12}" for c in cols)]
    for name, row in scores.items():
        cells = "".join(
            f"{row.get(c, float('nan')):>12.0f}" if c == "prompts" else f"{row.get(c, float('nan')):>12.4f}"
            for c in cols
        )
        lines.append(f"{name:<{width}}{cells}")
    return "\n".join(lines)
