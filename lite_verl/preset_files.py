"""Where presets live: presets/NAME.yaml in a checkout, shipped in the wheel as the package lite_verl.presets.

A preset may also be given as a path to a YAML file.
"""

from __future__ import annotations

import difflib
from importlib import resources
from pathlib import Path

from lite_verl.errors import ConfigError


def _preset_dir() -> Path:
    checkout = Path(__file__).resolve().parent.parent / "presets"
    if checkout.is_dir():  # running from a checkout (tests, editable install)
        return checkout
    return Path(str(resources.files("lite_verl.presets")))  # installed wheel


def preset_names() -> list[str]:
    return sorted(p.stem for p in _preset_dir().glob("*.yaml"))


def preset_path(name: str) -> Path:
    if name.endswith((".yaml", ".yml")):
        return Path(name)
    path = _preset_dir() / f"{name}.yaml"
    if not path.is_file():
        names = preset_names()
        near = difflib.get_close_matches(name, names, n=1)
        hint = f"did you mean '{near[0]}'? " if near else ""
        raise ConfigError(f"unknown preset '{name}'; {hint}available: {', '.join(names)}")
    return path
