"""Errors a user can fix. The CLI prints them as one line and exits with code 2, no traceback.

Anything else that escapes is a bug in lite-verl and keeps its traceback.
"""

from __future__ import annotations


def first_line(error: BaseException, limit: int = 160, last: bool = False) -> str:
    """An exception's message as one line for a one-line error: its first line (last=True: its last line,
    where e.g. torch puts the cause), cut to `limit` characters; the exception's type when it has none."""
    lines = str(error).strip().splitlines() or [type(error).__name__]
    return (lines[-1] if last else lines[0])[:limit]


class UserError(Exception):
    """A mistake in the user's input (config, model path, data, reward function). Exit code 2."""

    exit_code = 2


class ConfigError(UserError):
    """A config key, value or combination is wrong. The message names the field and the fix."""


class DataError(UserError):
    """A dataset file is missing, empty or has a malformed row. The message names file, row and field."""


class ModelError(UserError):
    """The model path is missing or is not a causal LM that transformers can load."""


class RewardError(UserError):
    """The reward function cannot be found, raises, or returns something that is not one float per sample."""


class MissingDependency(UserError):
    """An optional package the config asks for is not installed. The message gives the install command."""

    def __init__(self, package: str, extra: str, needed_for: str) -> None:
        super().__init__(
            f"{needed_for} needs the package '{package}', which is not installed; "
            f"install it with: pip install 'lite-verl[{extra}]'"
        )
