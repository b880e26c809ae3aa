"""Shared fixtures. The tiny model is built once per session into a temp cache (no download)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# a few prompts and samples per step: fast CPU runs of the real loop
SMALL = [
    "trainer.batch_size=4",
    "rollout.n=4",
    "data.task_size=64",
    "data.val_size=0",
    "trainer.progress=false",
]

# before any test module is collected: huggingface_hub and datasets read it once, when first imported
os.environ["HF_HUB_OFFLINE"] = "1"

REPO = Path(__file__).resolve().parent.parent
SHARED_GSM8K = REPO.parent / "shared" / "data" / "gsm8k"


@pytest.fixture(scope="session", autouse=True)
def _offline_cache(tmp_path_factory):
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if "LITE_VERL_CACHE" not in os.environ:
        os.environ["LITE_VERL_CACHE"] = str(tmp_path_factory.mktemp("cache"))
    # datasets caches every file it reads (Arrow); keep the tests' copies out of the user's cache
    os.environ.setdefault("HF_DATASETS_CACHE", str(tmp_path_factory.mktemp("datasets-cache")))
    yield


@pytest.fixture(scope="session")
def tiny_dir(_offline_cache) -> Path:
    from lite_verl.model.tiny import resolve_tiny

    return resolve_tiny("tiny:qwen2")


def has_cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:  # pragma: no cover
        return False


def assert_refused(overrides: list[str], message: str, preset: str = "laptop") -> None:
    """load_config refuses the overrides with a one-line ConfigError matching `message`."""
    from lite_verl.config import load_config
    from lite_verl.errors import ConfigError

    with pytest.raises(ConfigError, match=message) as e:
        load_config(preset, None, overrides)
    assert "\n" not in str(e.value)
