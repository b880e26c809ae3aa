"""Nested dicts <-> Config, with a type check per key; the dotted keys and their help.

`from_dict` builds a Config from the merged layers: an unknown key is an error that names the nearest
valid key, a wrong type names the key and the expected type, a value outside a `Literal` names the key
and lists the allowed values. `to_dict` is its inverse for YAML/JSON output (tuples as lists).
`all_keys` and `describe` walk the schema: every dotted key, and its help from the field metadata;
`where_keys` the keys a preset may set (devices and memory knobs, not maths).
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import types
import typing
from collections.abc import Sequence
from typing import Any, Literal

from lite_verl.config.schema import Config
from lite_verl.errors import ConfigError


@functools.cache  # the schema is fixed: evaluate its annotations once, not at every --set and check
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _sections(cls: type, prefix: str) -> typing.Iterator[tuple[str, Any, dataclasses.Field[Any] | None]]:
    """(dotted key, type, field) of every key under `cls`, sections walked in order."""
    hints, fields = _hints(cls), {f.name: f for f in dataclasses.fields(cls)}
    for name, tp in hints.items():
        if dataclasses.is_dataclass(tp):
            yield from _sections(typing.cast(type, tp), f"{prefix}{name}.")
        else:
            yield f"{prefix}{name}", tp, fields.get(name)


def key_types(cls: type = Config, prefix: str = "") -> list[tuple[str, Any]]:
    """(dotted key, field type) of every key, e.g. ("model.dtype", Literal["float32", ...])."""
    return [(k, tp) for k, tp, _ in _sections(cls, prefix)]


def all_keys(cls: type = Config, prefix: str = "") -> list[str]:
    """Every dotted key a config accepts, e.g. `trainer.total_steps`."""
    return [k for k, _, _ in _sections(cls, prefix)]


def choices(tp: Any) -> tuple[Any, ...]:
    """The allowed values of a `Literal` type, or of the items of a tuple of one (empty for any other type)."""
    if typing.get_origin(tp) is tuple:
        return choices(typing.get_args(tp)[0])
    return typing.get_args(tp) if typing.get_origin(tp) is Literal else ()


def describe(cls: type = Config, prefix: str = "") -> list[tuple[str, str]]:
    """(dotted key, help) pairs; a key with a fixed set of values starts its help with them (a | b: help)."""
    out = []
    for k, tp, f in _sections(cls, prefix):
        text = f.metadata.get("help", "") if f is not None else ""
        allowed = choices(tp)
        out.append((k, f"{' | '.join(map(str, allowed))}: {text}" if allowed else text))
    return out


@functools.cache  # the schema is fixed; every layer a config is built from asks
def where_keys(cls: type = Config, prefix: str = "") -> frozenset[str]:
    """The dotted keys that say where and how things run (schema `key(..., where=True)`): a preset's."""
    return frozenset(k for k, _, f in _sections(cls, prefix) if f is not None and f.metadata.get("where"))


def set_keys(data: typing.Mapping[str, Any]) -> list[str]:
    """The dotted keys a layer (nested dict) sets; a mapping-valued key (cost.price_per_hour) is one key."""
    return list(flat_values(data))


def flat_values(data: typing.Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """A layer or to_dict(config) as {dotted key: value}; a mapping-valued key is one value."""
    out: dict[str, Any] = {}
    for k, v in data.items():
        dotted = f"{prefix}{k}"
        if isinstance(v, dict) and dotted not in _mapping_set():
            out.update(flat_values(v, dotted + "."))
        else:
            out[dotted] = v
    return out


@functools.cache
def _mapping_set() -> frozenset[str]:
    return frozenset(mapping_keys())


def mapping_keys(cls: type = Config, prefix: str = "") -> list[str]:
    """The dotted keys whose value is a mapping (cost.price_per_hour): --set can add or change one entry."""
    return [k for k, tp, _ in _sections(cls, prefix) if typing.get_origin(tp) is dict]


def unknown_key(key: str) -> ConfigError:
    """The error for a key the schema does not have: what lite-verl calls it when it is a verl, TRL or
    Unsloth key (config/foreign.py), else the nearest valid one."""
    from lite_verl.config.foreign import foreign_hint

    foreign = foreign_hint(key, frozenset(all_keys()))
    if foreign is not None:
        return ConfigError(f"unknown config key '{key}'; {foreign}")
    near = difflib.get_close_matches(key, all_keys(), n=1, cutoff=0.5)
    if not near:  # try the last part alone: `lr` -> `train.lr`
        tail = key.rsplit(".", 1)[-1]
        near = [k for k in all_keys() if k.rsplit(".", 1)[-1] == tail][:1]
    hint = f"; did you mean '{near[0]}'?" if near else "; `lite-verl validate --keys` lists the valid keys"
    return ConfigError(f"unknown config key '{key}'{hint}")


def not_one_of(key: str, value: object, allowed: Sequence[str]) -> ConfigError:
    """`key=value` is outside `allowed`: the error lists them and names the nearest."""
    near = difflib.get_close_matches(str(value), list(allowed), n=1)
    hint = f"; did you mean '{near[0]}'?" if near else ""
    listed = ", ".join(allowed[:-1]) + f" or {allowed[-1]}" if len(allowed) > 1 else "".join(allowed)
    return ConfigError(f"{key}={value!r} must be {listed}{hint}")


def _article(name: str) -> str:
    """'an int', 'a float', 'a list of ...': the type's name as an error sentence reads it."""
    return f"an {name}" if name[:1] in "aeiou" else f"a {name}"


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if _optional(tp) is not None:
        return f"{_type_name(_optional(tp))} or null"
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type_name(a) for a in typing.get_args(tp))
    if origin is Literal:
        return " or ".join(repr(a) for a in typing.get_args(tp))
    if origin is tuple:
        return f"list of {_type_name(typing.get_args(tp)[0])}"
    if origin is dict:
        k, v = typing.get_args(tp)
        return f"mapping of {_type_name(k)} to {_type_name(v)}"
    if dataclasses.is_dataclass(tp):
        return f"mapping with keys {', '.join(_hints(typing.cast(type, tp)))}"
    return getattr(tp, "__name__", str(tp))


def _optional(tp: Any) -> Any:
    """T for `T | None` (a key that may be null), else None."""
    args = typing.get_args(tp)
    if typing.get_origin(tp) in (typing.Union, types.UnionType) and len(args) == 2 and type(None) in args:
        return next(a for a in args if a is not type(None))
    return None


def _coerce_choice(key: str, value: Any, allowed: tuple[Any, ...]) -> Any:
    """A Literal key: a scalar is read as a str key reads it (`--set model.dtype=16` is '16'), then checked."""
    scalar = isinstance(value, (str, int, float)) and not isinstance(value, bool)
    text = str(value) if scalar else value
    if text not in allowed:
        raise not_one_of(key, text, allowed)
    return text


def _coerce(key: str, value: Any, tp: Any) -> Any:
    """Check `value` against the field type `tp`; return it in the dataclass's representation."""
    if isinstance(value, str) and "${" in value and "}" in value and tp is not str:
        raise ConfigError(f"{key}={value!r} is an OmegaConf/Hydra interpolation; lite-verl reads plain YAML: "
                          "write the value itself")  # fmt: skip
    bad = ConfigError(
        f"{key} must be {_article(_type_name(tp))}, got {value!r} ({type(value).__name__}); fix its value (--set or the config file)"
    )
    origin = typing.get_origin(tp)
    if _optional(tp) is not None:
        return None if value is None else _coerce(key, value, _optional(tp))
    # a union such as bool | Literal["auto"]: the first member that takes the value
    if origin in (typing.Union, types.UnionType):
        for member in typing.get_args(tp):
            try:
                return _coerce(key, value, member)
            except ConfigError:
                continue
        raise bad
    if origin is Literal:
        return _coerce_choice(key, value, typing.get_args(tp))
    if origin is tuple:
        if (
            isinstance(value, (str, int, float))
            and not isinstance(value, bool)
            and typing.get_args(tp)[0] is not str
        ):
            value = [value]  # `--set train.gpus=0` means [0]
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, (list, tuple)):
            raise bad
        return tuple(_coerce(f"{key}[{i}]", v, typing.get_args(tp)[0]) for i, v in enumerate(value))
    if origin is dict:
        if not isinstance(value, dict):
            raise bad
        kt, vt = typing.get_args(tp)
        return {_coerce(f"{key} key", k, kt): _coerce(f"{key}.{k}", v, vt) for k, v in value.items()}
    if dataclasses.is_dataclass(tp):  # an entry of a list of small sections (reward.functions)
        if isinstance(value, str) and "fn" in _hints(typing.cast(type, tp)):
            value = {"fn": value}  # TRL's reward_funcs: a list of functions, here by name
        if not isinstance(value, dict):
            raise bad
        names = _hints(typing.cast(type, tp))
        unknown = next((k for k in value if k not in names), None)
        if unknown is not None:
            raise ConfigError(f"{key}: unknown key {unknown!r}; its keys are {', '.join(names)}")
        return _build(typing.cast(type, tp), value, f"{key}.")
    if tp is bool:
        if not isinstance(value, bool):
            raise bad
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise bad
        return value
    if tp is float:
        if isinstance(value, str):  # YAML 1.1 reads 1e-3 (no dot) as a string
            try:
                value = float(value)
            except ValueError:
                raise bad from None
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise bad
        return float(value)
    if tp is str:
        if isinstance(value, bool) or not isinstance(value, (str, int, float)):
            raise bad
        return str(value)
    raise bad  # pragma: no cover


def _build(cls: type, data: dict[str, Any], prefix: str = "") -> Any:
    hints = _hints(cls)
    kwargs: dict[str, Any] = {}
    for name, value in data.items():
        key = f"{prefix}{name}"
        if name not in hints:
            raise unknown_key(key)
        tp = hints[name]
        if dataclasses.is_dataclass(tp):
            if value is None:
                continue
            if not isinstance(value, dict):
                raise ConfigError(f"{key} must be a section (a mapping of keys), got {value!r}")
            kwargs[name] = _build(typing.cast(type, tp), value, f"{key}.")
        else:
            kwargs[name] = _coerce(key, value, tp)
    return cls(**kwargs)


def from_dict(data: dict[str, Any]) -> Config:
    """A Config from nested dicts (unchecked as a whole: validation.validate_config does that)."""
    cfg: Config = _build(Config, data)
    return cfg


def to_dict(cfg: Any) -> dict[str, Any]:
    """Plain nested dict (tuples as lists) for YAML/JSON output."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(cfg):
        v = getattr(cfg, f.name)
        if dataclasses.is_dataclass(v):
            out[f.name] = to_dict(v)
        elif isinstance(v, tuple):
            out[f.name] = [to_dict(x) if dataclasses.is_dataclass(x) else x for x in v]
        elif isinstance(v, dict):
            out[f.name] = dict(v)
        else:
            out[f.name] = v
    return out
