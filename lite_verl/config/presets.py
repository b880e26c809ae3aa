"""Where presets and recipes live: presets/NAME.yaml and recipes/NAME.yaml in a checkout, shipped in the
wheel as the packages lite_verl.presets and lite_verl.recipes. Either may also be given as a YAML path.

A preset says *where and how* things run (config keys marked `where` in schema.py); a recipe says *what*
is computed (data, prompts, rewards, hyper-parameters for a model size) and no `where` key.
`auto` has no preset file: `train`, `plan` and `validate` resolve it from this machine's GPUs
(lite_verl/tools/auto.py), and the config it makes records `auto-NAME`, NAME being the shipped preset it
started from; `auto-NAME` loads as NAME, so such a config re-runs anywhere.
"""

from __future__ import annotations

import difflib
from importlib import resources
from pathlib import Path

from lite_verl.errors import ConfigError

AUTO = "auto"


def _shipped_dir(kind: str) -> Path:
    """`kind` = presets | recipes: the checkout's folder, else the installed package's."""
    checkout = Path(__file__).resolve().parents[2] / kind  # lite_verl/config/presets.py -> repo root
    if checkout.is_dir():  # running from a checkout (tests, editable install)
        return checkout
    return Path(str(resources.files(f"lite_verl.{kind}")))  # installed wheel


def preset_names() -> list[str]:
    """The preset files; `auto` has none and is not listed (the CLI's messages and `presets` add it)."""
    return sorted(p.stem for p in _shipped_dir("presets").glob("*.yaml"))


def recipe_names() -> list[str]:
    return sorted(p.stem for p in _shipped_dir("recipes").glob("*.yaml"))


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
    return _named("preset", name, "presets", [AUTO, *preset_names()])


def recipe_path(name: str) -> Path:
    if name.endswith((".yaml", ".yml")):
        return Path(name)
    return _named("recipe", name, "recipes", recipe_names())


def _named(what: str, name: str, kind: str, names: list[str]) -> Path:
    path = _shipped_dir(kind) / f"{name}.yaml"
    if not path.is_file():
        near = difflib.get_close_matches(name, names, n=1)
        hint = f"did you mean '{near[0]}'? " if near else ""
        raise ConfigError(f"unknown {what} '{name}'; {hint}available: {', '.join(names)} (lite-verl {kind})")
    return path


def launch_line(path: Path) -> str:
    """The `# Launch:` line of a preset or recipe file's header."""
    lines = path.read_text().splitlines()
    return next((ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("# Launch:")), "")
