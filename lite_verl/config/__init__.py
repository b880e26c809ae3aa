"""Typed, frozen config: the schema (one dataclass per section), its layering and its checks.

    from lite_verl.config import Config, load_config

schema.py     the sections, each key's type, default and help; enumerated keys are Literal types
convert.py    nested dicts <-> Config with a type check per key; the dotted keys and their help
paths.py      a run's local paths made absolute, so that RUN/config.yaml means the same from anywhere
layers.py     defaults < preset < (--preset auto's choices) < --config < --set, resolved by load_config
validation.py the checks on a whole config, and those on this machine (check_environment)
presets.py    where the preset files live

Modules of this package import each other directly (lite_verl.config.schema, ...), never this one.
"""

from lite_verl.config.convert import all_keys, describe, from_dict, to_dict
from lite_verl.config.layers import load_config, merge, parse_override, read_yaml
from lite_verl.config.schema import (
    ALL_LINEAR,
    FULL_BACKENDS,
    AlgorithmConfig,
    Config,
    CostConfig,
    CriticConfig,
    DataConfig,
    ModelConfig,
    RewardConfig,
    RolloutConfig,
    SyncConfig,
    TrainConfig,
    TrainerConfig,
)
from lite_verl.config.validation import validate_config

__all__ = [
    "ALL_LINEAR",
    "ModelConfig",
    "DataConfig",
    "RolloutConfig",
    "TrainConfig",
    "AlgorithmConfig",
    "CriticConfig",
    "RewardConfig",
    "SyncConfig",
    "TrainerConfig",
    "CostConfig",
    "Config",
    "FULL_BACKENDS",
    "all_keys",
    "merge",
    "parse_override",
    "read_yaml",
    "from_dict",
    "to_dict",
    "load_config",
    "validate_config",
    "describe",
]
