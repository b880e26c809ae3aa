"""Typed, frozen config: the schema (one dataclass per section), its layering and its checks.

    from lite_verl.config import Config, load_config
"""

from lite_verl.config.schema import (
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
    all_keys,
    describe,
    from_dict,
    load_config,
    merge,
    parse_override,
    read_yaml,
    to_dict,
)

__all__ = [
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
    "all_keys",
    "merge",
    "parse_override",
    "read_yaml",
    "from_dict",
    "to_dict",
    "load_config",
    "describe",
]
