"""The config's layers and the one function that resolves them into a validated Config.

Layers, later wins: dataclass defaults < preset (presets/NAME.yaml) < `machine` (what `--preset auto`
chose for this machine: tools/auto.py) < user YAML (--config FILE) < `--set a.b=c` overrides. Both a
named preset (`load_config(preset, file, sets)`) and `--preset auto` (`load_config(base, file, sets,
machine=..., recorded_as="auto-BASE")`) go through `load_config`, so the order is written once.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from lite_verl.config.convert import all_keys, from_dict, mapping_keys, unknown_key
from lite_verl.config.presets import preset_path
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
    config_file: str | None = None,
    overrides: Sequence[str] = (),
    *,
    machine: Mapping[str, Any] | None = None,
    recorded_as: str | None = None,
) -> Config:
    """Resolve the layers into a validated Config. Raises ConfigError with a one-line message.

    No `preset`: the one the config file names (a resolved run config records it), else laptop.
    `machine` goes between the preset and the config file; `recorded_as` is the config's `preset` key
    (default: the preset's name).
    """
    user = read_yaml(config_file, "config file") if config_file else {}
    # a resolved run config names its preset; --preset on the command line wins
    preset = preset or user.get("preset") or DEFAULT_PRESET
    data = merge(read_yaml(preset_path(preset), f"preset '{preset}'"), machine or {})
    data = merge(data, user)
    for item in overrides:
        data = merge(data, parse_override(item))
    data["preset"] = recorded_as or preset
    return validate_config(from_dict(data))
