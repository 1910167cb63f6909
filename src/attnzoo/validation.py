"""The project's standard checks for configuration values. A leaf: it imports nothing from attnzoo, so any
module (configs, mechanisms, positions, evals) can validate its options without an import cycle."""

from __future__ import annotations

from typing import Any


def require(ok: bool, name: str, value: Any, allowed: str) -> None:
    """Raise the project's standard config error: the field, its bad value, and what is allowed."""
    if not ok:
        raise ValueError(f"{name}={value!r} is invalid: {allowed}")


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
