"""Where presets live: presets/NAME.yaml in a checkout, shipped in the wheel as the package lite_verl.presets.

A preset may also be given as a path to a YAML file. `auto` has no file: `train`, `plan` and `validate`
resolve it from this machine's GPUs (lite_verl/tools/auto.py), and the config it makes records `auto-NAME`, NAME
being the shipped preset it started from; `auto-NAME` loads as NAME, so such a config re-runs anywhere.
"""

from __future__ import annotations

import difflib
from importlib import resources
from pathlib import Path

from lite_verl.errors import ConfigError

AUTO = "auto"


def _preset_dir() -> Path:
    checkout = Path(__file__).resolve().parents[2] / "presets"  # lite_verl/config/presets.py -> repo root
    if checkout.is_dir():  # running from a checkout (tests, editable install)
        return checkout
    return Path(str(resources.files("lite_verl.presets")))  # installed wheel


def preset_names() -> list[str]:
    """The preset files; `auto` has none and is not listed (the CLI's messages and `presets` add it)."""
    return sorted(p.stem for p in _preset_dir().glob("*.yaml"))


def preset_path(name: str) -> Path:
    if name.endswith((".yaml", ".yml")):
        return Path(name)
    if name == AUTO:
        raise ConfigError(
            f"preset '{AUTO}' is chosen from this machine's GPUs by lite-verl train, plan and validate; "
            f"here name a preset: {', '.join(preset_names())}"
        )
    if name.startswith(f"{AUTO}-"):  # what --preset auto started from (a resolved auto config says so)
        name = name[len(AUTO) + 1 :]
    path = _preset_dir() / f"{name}.yaml"
    if not path.is_file():
        names = [AUTO, *preset_names()]
        near = difflib.get_close_matches(name, names, n=1)
        hint = f"did you mean '{near[0]}'? " if near else ""
        raise ConfigError(f"unknown preset '{name}'; {hint}available: {', '.join(names)}")
    return path
