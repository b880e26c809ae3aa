"""The config's layers and the one function that resolves them into a validated Config.

Layers, later wins: dataclass defaults < recipe (recipes/NAME.yaml: what is computed) < preset
(presets/NAME.yaml: where it runs) < `machine` (what `--preset auto` chose for this machine:
tools/auto.py) < user YAML (--config FILE) < `--set a.b=c` overrides. Both a named preset
(`load_config(preset, file, sets)`) and `--preset auto` (`load_config(base, file, sets, machine=...,
recorded_as="auto-BASE")`) go through `load_config`, so the order is written once. A preset that sets a
key of what is computed, or a recipe that sets one of where it runs, is refused (rule: same maths on
every machine).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from lite_verl.config.convert import all_keys, from_dict, mapping_keys, set_keys, unknown_key, where_keys
from lite_verl.config.presets import preset_path, recipe_path
from lite_verl.config.schema import Config
from lite_verl.config.validation import validate_config
from lite_verl.errors import ConfigError

DEFAULT_PRESET = "laptop"


def merge(base: dict[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """Deep merge of nested dicts; `over` wins. Lists are replaced, not concatenated."""
    out = dict(base)
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = merge(out[k], v)
        else:
            out[k] = v
    return out


def parse_override(item: str) -> dict[str, Any]:
    """`a.b=c` -> {"a": {"b": c}} with c parsed as YAML (`3` int, `[0,1]` list, `true` bool)."""
    if "=" not in item:
        raise ConfigError(f"--set {item!r} is not key=value; write e.g. --set trainer.total_steps=10")
    key, raw = item.split("=", 1)
    key = key.strip()
    # one entry of a mapping, its name kept whole: --set "cost.price_per_hour.RTX 4090=0.5"
    mapping = next((k for k in mapping_keys() if key.startswith(k + ".") and key != k + "."), None)
    if key not in all_keys() and mapping is None:
        raise unknown_key(key)
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    if value is None:
        value = ""
    out: dict[str, Any] = {}
    node = out
    parts = mapping.split(".") + [key[len(mapping) + 1 :]] if mapping else key.split(".")
    for p in parts[:-1]:
        node = node.setdefault(p, {})
    node[parts[-1]] = value
    return out


def read_yaml(path: str | Path, what: str) -> dict[str, Any]:
    """A YAML file holding a mapping ({} when empty); `what` names it in the one-line error."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"{what} {str(p)!r} does not exist; give the path of a YAML file")
    try:
        data = yaml.safe_load(p.read_text())
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise ConfigError(f"{what} {str(p)!r} is not valid YAML{where}; fix its syntax") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{what} {str(p)!r} must hold a mapping of sections (model:, data:, ...)")
    return data


def load_config(
    preset: str | None = None,
    config_file: str | Mapping[str, Any] | None = None,
    overrides: Sequence[str] = (),
    *,
    recipe: str | None = None,
    machine: Mapping[str, Any] | None = None,
    recorded_as: str | None = None,
) -> Config:
    """Resolve the layers into a validated Config. Raises ConfigError with a one-line message.

    No `preset`: the one the config file names (a resolved run config records it), else laptop; the same
    for `recipe`, else none. `config_file` may be the file's mapping, already read (a run's config with the
    changes its resumes made: run/rundir.py). `machine` goes between the preset and the config file;
    `recorded_as` is the config's `preset` key (default: the preset's name).
    """
    if isinstance(config_file, Mapping):
        user = dict(config_file)
    else:
        user = read_yaml(config_file, "config file") if config_file else {}
    # a resolved run config names its preset and recipe; --preset / --recipe on the command line win
    preset = preset or user.get("preset") or DEFAULT_PRESET
    recipe = recipe or user.get("recipe") or ""
    data = recipe_layer(recipe) if recipe else {}
    data = merge(data, preset_layer(preset))
    data = merge(data, machine or {})
    data = merge(data, user)
    for item in overrides:
        data = merge(data, parse_override(item))
    data["preset"], data["recipe"] = recorded_as or preset, recipe
    return validate_config(from_dict(data))


def preset_layer(name: str) -> dict[str, Any]:
    """A preset's keys; one that says what is computed (not a `where` key) is refused."""
    data = read_yaml(preset_path(name), f"preset '{name}'")
    known, where = set(all_keys()), where_keys()
    wrong = [k for k in set_keys(data) if k in known and k not in where]
    if wrong:
        raise ConfigError(
            f"preset '{name}' sets {wrong[0]}, which says what is computed: a preset says only where and "
            "how things run; move it to a recipe, --config or --set"
        )
    return data


def recipe_layer(name: str) -> dict[str, Any]:
    """A recipe's keys; one that says where things run (a `where` key) is refused."""
    data = read_yaml(recipe_path(name), f"recipe '{name}'")
    wrong = [k for k in set_keys(data) if k in where_keys() or k in ("preset", "recipe")]
    if wrong:
        raise ConfigError(
            f"recipe '{name}' sets {wrong[0]}, which says where things run: a recipe says only what is "
            "computed; move it to a preset, --config or --set"
        )
    return data
