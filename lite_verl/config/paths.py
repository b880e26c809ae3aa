"""A run's config with its local paths made absolute, so that RUN/config.yaml means the same from any
directory: `lite-verl train --resume RUN`, `lite-verl eval RUN` and `train --config RUN/config.yaml` are often
typed elsewhere than the first `train`. Only values that name something existing relative to the working
directory change; Hub ids, `tiny:` models, built-in rewards and `module:function` specs stay as they are.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from lite_verl.config.schema import Config


def with_absolute_paths(cfg: Config, base: Path | None = None) -> Config:
    """`cfg` with every local path that exists from `base` (default: the working directory) made absolute."""
    base = base or Path.cwd()
    d, r, w = cfg.data, cfg.rollout, cfg.reward
    return replace(
        cfg,
        model=replace(cfg.model, path=_path(cfg.model.path, base)),
        data=replace(
            d,
            train_files=tuple(_path(f, base) for f in d.train_files),
            val_files=tuple(_path(f, base) for f in d.val_files),
        ),
        rollout=replace(r, quantized_path=_path(r.quantized_path, base)),
        reward=replace(
            w,
            function=_function(w.function, base),
            functions=tuple(replace(f, fn=_function(f.fn, base)) for f in w.functions),
            model=_path(w.model, base),
        ),
    )


def _path(value: str, base: Path) -> str:
    """An existing relative path -> absolute; anything else (empty, absolute, a Hub id) as it is."""
    if not value or Path(value).is_absolute() or not (base / value).exists():
        return value
    return str((base / value).resolve())


def _function(spec: str, base: Path) -> str:
    """`path/to/file.py:function` with the file made absolute; other specs as they are."""
    target, sep, name = spec.rpartition(":")
    if not sep or not target.endswith(".py"):
        return spec
    return f"{_path(target, base)}:{name}"
