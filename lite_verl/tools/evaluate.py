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
A response is correct when its reward reaches --correct (1.0: what the rule rewards give a right answer); with
several weighted reward.functions, when the first one's own score does (--correct-fn NAME: another one).
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
    """One data source's rewards: greedy [prompts], sampled [prompts][k]; and what is judged correct
    (loop.judged: one function of several, else the rewards themselves), in the same shapes."""

    greedy: list[float] = field(default_factory=list)
    sampled: list[list[float]] = field(default_factory=list)
    greedy_judged: list[float] = field(default_factory=list)
    sampled_judged: list[list[float]] = field(default_factory=list)

    def summary(self, k: int, correct: float) -> dict[str, float]:
        greedy_judged = self.greedy_judged or self.greedy
        out = {
            "prompts": float(len(self.greedy)),
            "greedy": _mean(self.greedy),
            "greedy_acc": _mean([float(x >= correct) for x in greedy_judged]),
        }
        if self.sampled:
            flat = [s for row in self.sampled for s in row]
            out[f"mean@{k}"] = _mean(flat)
            out[f"pass@{k}"] = _mean(
                [
                    pass_at_k(len(r), sum(s >= correct for s in r), k)
                    for r in self.sampled_judged or self.sampled
                ]
            )
        return out


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else float("nan")


def evaluate(
    session: Session, k: int, correct: float, judge: str = ""
) -> tuple[dict[str, dict[str, float]], list[dict[str, Any]]]:
    """(scores of the session's validation prompts, per data source and over all ('all'); each prompt's greedy
    completion: the prompt as the model saw it, the text, its reward and whether it is judged right).
    Correctness is the reward reaching `correct`; with several reward.functions, the own score of `judge`
    (judged_by)."""
    from lite_verl.loop import judged, score_prompts, step_seed
    from lite_verl.rollout.base import SamplingSettings

    cfg, val = session.cfg, session.val_set
    if not len(val):
        raise UserError(
            "no prompts to evaluate: give --set data.val_files=[FILE], hold out a slice of the training data "
            "with --set 'data.val_split=train[-200:]', or for a built-in task set data.val_size > 0"
        )
    r = cfg.rollout
    greedy, sampled = SamplingSettings.of(r, greedy=True), SamplingSettings.of(r, n=k, log_probs=False)
    seed = step_seed(cfg.trainer.seed, -2)
    g, texts = score_prompts(session, val, greedy, seed)
    g_judged = judged(session, g, judge)
    s, _ = score_prompts(session, val, sampled, seed)
    s_judged = judged(session, s, judge)
    by_source: dict[str, SourceScores] = defaultdict(SourceScores)
    for i, row in enumerate(val.rows):
        for name in (row.data_source, "all"):
            part = by_source[name]
            part.greedy.append(float(g[i]))
            part.sampled.append([float(x) for x in s[i * k : (i + 1) * k]])
            part.greedy_judged.append(float(g_judged[i]))
            part.sampled_judged.append([float(x) for x in s_judged[i * k : (i + 1) * k]])
    completions = [
        {"data_source": row.data_source, "prompt": session.tokenizer.decode(val.token_ids[i]),
         "completion": texts[i], "reward": float(g[i]), "correct": bool(g_judged[i] >= correct)}
        for i, row in enumerate(val.rows)
    ]  # fmt: skip
    return {name: part.summary(k, correct) for name, part in sorted(by_source.items())}, completions


def judged_by(cfg: Config, correct_fn: str) -> str:
    """The reward function whose own score says right or wrong: --correct-fn, else the first of several
    reward.functions (the task's, by convention; a format or length term is added after it); '' when one
    reward decides (then its total is judged). A name that is not one of them is a UserError."""
    from lite_verl.reward.functions import default_name

    names = [f.name or default_name(f.fn) for f in cfg.reward.functions]
    if correct_fn and correct_fn not in names:
        raise UserError(
            f"--correct-fn {correct_fn}: not one of reward.functions ({', '.join(names) or 'none'})"
        )
    return correct_fn or (names[0] if len(names) > 1 else "")


def eval_config(
    target: str,
    preset: str | None,
    config_file: str | None,
    sets: list[str],
    limit: int = 0,
    recipe: str | None = None,
) -> tuple[Config, Path | None]:
    """(config, checkpoint or None). A run directory gives its resolved config (`run_layer`: with --preset,
    --recipe or --config applied) and last checkpoint; anything else is a model (model.path) evaluated under
    the given preset/config. Validation files are read whole unless `limit` (data.val_size caps them in
    training)."""
    from lite_verl.config import load_config
    from lite_verl.run.rundir import RunDir

    run = Path(target)
    if (run / "config.yaml").is_file():
        ckpt = RunDir(run).latest_checkpoint()
        if ckpt is None:
            raise UserError(
                f"eval {run}: the run holds no complete checkpoint yet; evaluate its model instead"
            )
        cfg, found = load_config(None, run_layer(run, preset, config_file, recipe), sets), ckpt
    else:
        cfg = load_config(preset, config_file, [f"model.path={target}", *sets], recipe=recipe)
        found = None
    d = cfg.data
    if d.val_files:  # eval scores the validation set alone: the training files are not read (nor downloaded);
        # the session's train set then holds the same prompts (an AWQ rollout calibrates on them)
        d = replace(
            d, train_files=d.val_files, split=d.val_split, val_size=d.val_size if limit else ALL_PROMPTS
        )
    return replace(cfg, data=d), found


# what a --recipe brings to the evaluation of a run: its task; the run keeps its model and trainer
TASK_SECTIONS = ("data", "reward")


def run_layer(run: Path, preset: str | None, config_file: str | None, recipe: str | None) -> dict[str, Any]:
    """A run's config as the layer its evaluation starts from. --preset: this machine's where/how keys in place
    of the training machine's (a full fine-tuning run keeps train.backend: its checkpoint loads only there).
    --recipe: its task (data and reward, rollout's sampling keys) in place of the run's: a run trained on one
    task, evaluated on another. --config: its keys over the run's, as --set."""
    from lite_verl.config.convert import where_keys
    from lite_verl.config.layers import merge, read_yaml, recipe_layer
    from lite_verl.run.rundir import run_config_layer

    layer = run_config_layer(run)
    where = where_keys()
    if preset:  # fsdp/deepspeed checkpoints load only into their backend; a LoRA adapter into either LoRA
        full = layer.get("train", {}).get("backend") in ("fsdp", "deepspeed")
        layer = _without(layer, where - {"train.backend"} if full else where)
        layer["preset"] = preset
    if recipe:
        task = recipe_layer(recipe)
        for section in TASK_SECTIONS:
            layer[section] = task.get(section, {})
        rollout = layer.get("rollout", {})  # the run's hardware keys, the recipe's sampling (stop included)
        kept = {k: v for k, v in rollout.items() if f"rollout.{k}" in where}
        layer["rollout"] = merge(kept, _without({"rollout": task.get("rollout", {})}, where)["rollout"])
        layer["recipe"] = recipe  # beneath the layer: the new task's defaults, not the old one's
    if config_file:
        layer = merge(layer, read_yaml(config_file, "config file"))
    return layer


def _without(layer: dict[str, Any], keys: frozenset[str], prefix: str = "") -> dict[str, Any]:
    """`layer` (nested dicts) without the dotted `keys` (a section named whole, e.g. sync, goes whole)."""
    out = {}
    for k, v in layer.items():
        dotted = prefix + k
        if dotted in keys:
            continue
        out[k] = _without(v, keys, dotted + ".") if isinstance(v, dict) else v
    return out


def run_eval(target: str, preset: str | None, config_file: str | None, sets: list[str], k: int,
             correct: float, out: Path | None, limit: int = 0, recipe: str | None = None,
             correct_fn: str = "", show: int = 2) -> dict[str, Any]:  # fmt: skip
    """Load, evaluate, print the table and `show` greedy completions of each verdict, write the JSON (with
    every greedy completion). -> the result."""
    from lite_verl.loop import prepare, serve_checkpoint

    cfg, ckpt = eval_config(target, preset, config_file, sets, limit, recipe)
    cfg = replace(cfg, trainer=replace(cfg.trainer, progress=False))
    judge = judged_by(cfg, correct_fn)
    session = prepare(cfg)
    try:
        if ckpt is not None:
            serve_checkpoint(session, ckpt)  # the trained adapter (or weights), served by the engine
        scores, completions = evaluate(session, k, correct, judge)
    finally:
        session.close()
    result = {"target": target, "checkpoint": str(ckpt or ""), "k": k, "correct": correct,
              "judged_by": judge or "reward", "scores": scores, "completions": completions}  # fmt: skip
    if judge:
        print(f"correct: {judge}'s own score >= {correct} (--correct-fn picks another of reward.functions)")
    print(format_table(scores, k))
    print("\n".join(shown_completions(completions, show)))
    from lite_verl.run.files import atomic_write_text

    if out is not None:
        atomic_write_text(out, json.dumps(result, indent=2))
    if ckpt is not None:  # a run's checkpoint: kept with the run too, where `lite-verl report` shows it
        (Path(target) / EVAL_DIR).mkdir(exist_ok=True)
        task = Path(recipe or config_file or "").stem  # another task, or a part of it: its own file
        part = f"-first{limit}" if limit else ""
        name = f"{ckpt.name}-{task}{part}" if task else f"{ckpt.name}{part}"
        atomic_write_text(Path(target) / EVAL_DIR / f"{name}.json", json.dumps(result, indent=2))
    return result


def shown_completions(completions: list[dict[str, Any]], show: int, width: int = 400) -> list[str]:
    """Up to `show` greedy completions judged right and `show` judged wrong, each with the end of the prompt
    the model saw: what a score of 0 looks like, without a training run."""
    lines: list[str] = []
    for verdict in (True, False):
        mine = [c for c in completions if c["correct"] is verdict][:show]
        for c in mine:
            lines += [
                f"--- {'right' if verdict else 'wrong'} (reward {c['reward']:.3g}, {c['data_source']}); prompt ends: "
                f"{_one_line(c['prompt'][-width // 2 :])}",
                f"    completion: {_one_line(c['completion'][:width])}",
            ]
    return lines


def _one_line(text: str) -> str:
    return text.replace("\n", "\\n")


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
