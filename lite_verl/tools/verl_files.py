"""`lite-verl export-verl`: write the verl launch of a run into one directory, atomically.

    OUT/run_verl.sh         python3 -m verl.trainer.main_ppo with the Hydra overrides, one per line
    OUT/overrides.txt       the same overrides, one per line, absolute paths (for tools)
    OUT/train.parquet       prompts in verl's schema: data_source, prompt (chat messages), ability,
    OUT/val.parquet         reward_model {style, ground_truth}, extra_info {split, index, ...}
    OUT/reward_fn.py        verl's reward.custom_reward_function, when verl's own rules do not fit
    OUT/model/              the model, when it is lite-verl's tiny:* (made on the spot, so copied)
    OUT/UNSUPPORTED.md      what has no verl equivalent, and what the export did about it
    OUT/lite_verl_config.yaml   the resolved lite-verl config it came from

The mapping itself is verl_export.py. Built-in tasks are generated exactly as `lite-verl train` would
(same task, size and seed), so the verl job trains on the same prompts.
"""

from __future__ import annotations

import importlib.util
import json
import re
import shlex
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from lite_verl.config import Config, to_dict
from lite_verl.data.schema import PromptRow
from lite_verl.data.tasks import ARITH_SOURCE, ECHO_SOURCE
from lite_verl.errors import DataError, UserError
from lite_verl.tools.verl_export import (
    VERL_RULE_SOURCES,
    InExport,
    Inputs,
    Layout,
    Override,
    Plan,
    Value,
    check_layout,
    plan_export,
)

ABILITY = {"openai/gsm8k": "math", ARITH_SOURCE: "math", ECHO_SOURCE: "echo"}  # verl's `ability` column
VAL_FALLBACK = 8  # prompts in val.parquet when the run has no validation (verl needs a file)
RULES_SHIM = '''"""verl reward function written by `lite-verl export-verl`: lite-verl's rule rewards by data_source.

Needs lite-verl importable on every Ray node: pip install lite-verl (no extras).
"""

from lite_verl.reward.rules import default_compute_score


def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    return default_compute_score(data_source, solution_str, ground_truth, extra_info)
'''


FUNCTIONS_SHIM = '''"""verl reward function written by `lite-verl export-verl`: the run's reward.functions, weighted.

Needs lite-verl importable on every Ray node (pip install lite-verl), and each user function's module.
"""

import json

from lite_verl.reward.functions import verl_compute_score

_score = verl_compute_score(json.loads(%r))


def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    return _score(data_source, solution_str, ground_truth, extra_info)
'''


@dataclass(frozen=True)
class Exported:
    out: Path
    plan: Plan
    n_train: int
    n_val: int


def export_verl(cfg: Config, name: str, out: Path, layout: Layout, force: bool = False) -> Exported:
    """Write the export into `out` (replaced only with force). Raises UserError before writing anything."""
    from lite_verl.run.files import atomic_directory

    out = Path(out).absolute()
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {out} is a file; give a directory")
    if out.exists() and any(out.iterdir()) and not force:
        raise UserError(f"--out {out} already exists; pick another directory or pass --force to replace it")
    train, val, has_val = prompt_rows(cfg)
    check_layout(cfg, layout, len(train))
    reward_src, reward_name = reward_source(cfg, train + val)
    model = model_source(cfg)
    inp = Inputs(
        name=name,
        model=InExport("model") if isinstance(model, Path) else model,
        n_train=len(train),
        has_val=has_val,
        reward_file=InExport("reward_fn.py") if reward_src is not None else None,
        reward_name=reward_name,
    )
    plan = plan_export(cfg, inp, layout)
    with atomic_directory(out) as tmp:
        write_parquet(train, "train", tmp / "train.parquet")
        write_parquet(val, "val" if has_val else "train", tmp / "val.parquet")
        if isinstance(model, Path):
            shutil.copytree(model, tmp / "model")
        if reward_src is not None:
            _write_reward(reward_src, tmp / "reward_fn.py")
        lines = [override_line(o, str(out)) for o in plan.overrides]
        (tmp / "overrides.txt").write_text("".join(line + "\n" for line in lines))
        (tmp / "run_verl.sh").write_text(launch_script(plan, name))
        (tmp / "run_verl.sh").chmod(0o755)
        (tmp / "UNSUPPORTED.md").write_text(unsupported_md(plan, name))
        (tmp / "lite_verl_config.yaml").write_text(yaml.safe_dump(to_dict(cfg), sort_keys=False))
    return Exported(out, plan, len(train), len(val))


# ----------------------------------------------------------------------------------------------------
# Data, model and reward function.
# ----------------------------------------------------------------------------------------------------


def prompt_rows(cfg: Config) -> tuple[list[PromptRow], list[PromptRow], bool]:
    """(train, val, has_val): the rows `lite-verl train` would load (sources, splits and column mapping
    included), before tokenization."""
    from lite_verl.data.loader import prompt_rows as training_rows

    train, val = training_rows(cfg.data, cfg.trainer.seed)
    if cfg.data.val_size and val:
        return train, val, True
    return train, train[:VAL_FALLBACK], False


def verl_row(row: PromptRow, split: str, index: int) -> dict[str, Any]:
    return {
        "data_source": row.data_source,
        "prompt": [dict(m) for m in row.messages],
        "ability": ABILITY.get(row.data_source, "general"),
        "reward_model": {"style": "rule", "ground_truth": row.ground_truth},
        "extra_info": {"split": split, "index": index, **row.extra_info},
    }


def write_parquet(rows: list[PromptRow], split: str, path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        table = pa.Table.from_pylist([verl_row(r, split, i) for i, r in enumerate(rows)])
    except (pa.ArrowInvalid, pa.ArrowTypeError) as e:
        raise DataError(
            f"the {split} prompts do not fit one parquet schema ({e}); give every row's extra_info field "
            "the same type"
        ) from None
    pq.write_table(table, path)


def model_source(cfg: Config) -> str | Path:
    """A model directory path (or Hub id) for verl, or (a Path) a tiny:* model to copy into the export."""
    from lite_verl.model.hub import parse_hub_id
    from lite_verl.model.load import resolve_model_path

    if cfg.model.path.startswith("tiny:"):
        return resolve_model_path(cfg.model)
    hub = parse_hub_id(cfg.model.path, cfg.model.revision)
    if hub is not None and not hub[1]:
        return hub[0]  # verl's workers fetch a Hub id themselves
    if hub is not None or cfg.model.path.lower().endswith(".gguf"):
        return str(resolve_model_path(cfg.model))  # a pinned revision's snapshot; a GGUF file's import
    return str(Path(cfg.model.path).expanduser().absolute())


def reward_source(cfg: Config, rows: list[PromptRow]) -> tuple[Path | str | None, str]:
    """(file to copy as reward_fn.py, or the text of a shim calling lite-verl's rules or reward.functions, or
    None for verl's own rules; function name)."""
    w = cfg.reward
    if w.model or w.url:
        return None, "compute_score"  # the reward model / endpoint replaces the rules (see the notes)
    if w.functions:
        specs = [{"fn": f.fn, "weight": f.weight, "name": f.name, "args": dict(f.args)} for f in w.functions]
        return FUNCTIONS_SHIM % json.dumps(specs), "compute_score"
    if w.function:
        target, _, name = w.function.rpartition(":")
        return _function_file(target), name
    if all(r.data_source in VERL_RULE_SOURCES for r in rows):
        return None, "compute_score"  # verl's own rule (the same as lite-verl's)
    return RULES_SHIM, "compute_score"


def _function_file(target: str) -> Path:
    if target.endswith(".py"):
        path = Path(target).expanduser()
        if not path.is_file():
            raise UserError(f"reward.function: file {target!r} does not exist; fix reward.function")
        return path
    try:
        spec = importlib.util.find_spec(target)
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        raise UserError(
            f"reward.function: cannot find the source file of module {target!r} to give verl; "
            "write it as reward.function=path/to/file.py:function"
        )
    return Path(spec.origin)


def _write_reward(src: Path | str, dst: Path) -> None:
    if isinstance(src, Path):
        shutil.copy(src, dst)
    else:
        dst.write_text(src)


# ----------------------------------------------------------------------------------------------------
# Rendering: Hydra's override grammar.
# ----------------------------------------------------------------------------------------------------

_BARE = re.compile(r"[A-Za-z_/~.][A-Za-z0-9_./:~+@\-]*")
_HYDRA_WORDS = ("true", "false", "null", "nan", "inf")


def hydra_value(value: Value, base: str) -> str:
    """`value` as Hydra reads it on the command line; InExport paths under `base`."""
    if isinstance(value, InExport):
        return hydra_value(f"{base}/{value.rel}", base)
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, tuple):
        return "[" + ",".join(hydra_value(v, base) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(f"{k}:{hydra_value(v, base)}" for k, v in value.items()) + "}"
    if _BARE.fullmatch(value) and value.lower() not in _HYDRA_WORDS:
        return value
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def override_line(o: Override, base: str) -> str:
    return f"{o.key}={hydra_value(o.value, base)}"


# ----------------------------------------------------------------------------------------------------
# The launch script and the list of what does not carry over.
# ----------------------------------------------------------------------------------------------------


def launch_script(plan: Plan, name: str) -> str:
    lines = []
    for o in plan.overrides:
        if isinstance(o.value, InExport):
            lines.append(f'{o.key}="$HERE/{o.value.rel}"')
        else:
            lines.append(shlex.quote(override_line(o, "")))
    body = "".join(f"    {line} \\\n" for line in lines)
    return (
        "#!/usr/bin/env bash\n"
        f"# verl launch of the lite-verl run '{name}', written by `lite-verl export-verl` for verl 0.9.\n"
        "# One node: run it where verl is installed. Several nodes: start a Ray cluster first (`ray start\n"
        "# --head` here, `ray start --address=HEAD:6379` on the others), then run it on the head node.\n"
        "# More overrides go on the end: bash run_verl.sh trainer.total_training_steps=10\n"
        "# What has no verl equivalent, and what the export did instead: UNSUPPORTED.md\n"
        "set -euo pipefail\n"
        'HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"\n'
        "python3 -m verl.trainer.main_ppo \\\n"
        f'{body}    "$@"\n'
    )


def unsupported_md(plan: Plan, name: str) -> str:
    rows = "".join(f"| `{n.setting}` | {n.verl} |\n" for n in plan.notes)
    return (
        f"# lite-verl run '{name}' as a verl job: what does not carry over\n\n"
        f"Every other setting maps to a verl key ({len(plan.overrides)} overrides: `overrides.txt`, "
        "launched by `run_verl.sh`).\n\n"
        "| lite-verl setting | in the verl job |\n|---|---|\n" + rows
    )
