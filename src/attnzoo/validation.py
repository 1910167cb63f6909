"""The project's standard checks for configuration values. A leaf: it imports nothing from attnzoo, so any
module (configs, mechanisms, positions, evals) can validate its options without an import cycle."""

from __future__ import annotations

import math
from typing import Any

MAX_SEED = 2**63 - 1  # torch.manual_seed and numpy take any seed in [0, 2**63 - 1]
# Optimizer steps, benchmark rounds and the like: a billion is decades of steps at any rate a run reaches, so a
# larger count is a typo (an extra digit or two), refused before it starts a run that would never finish.
MAX_COUNT = 10**9


def require(ok: bool, name: str, value: Any, allowed: str) -> None:
    """Raise the project's standard config error: the field, its bad value, and what is allowed."""
    if not ok:
        beyond = " (beyond float32's range, ±3.4e38)" if _beyond_float32(value) else ""
        raise ValueError(f"{name}={value!r} is invalid: {allowed}{beyond}")


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


FLOAT32_MAX = 3.4028234663852886e38


def is_number(value: Any) -> bool:
    """A finite int or float that float32, the dtype models compute in, can hold: not inf or nan, not 1e39."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return False
    try:
        return math.isfinite(value) and abs(value) <= FLOAT32_MAX
    except OverflowError:  # an int too large for a float
        return False


def _beyond_float32(value: Any) -> bool:
    try:
        return isinstance(value, (int, float)) and math.isfinite(value) and abs(value) > FLOAT32_MAX
    except OverflowError:
        return True


def is_count(value: Any, minimum: int = 1) -> bool:
    """An integer in ``[minimum, MAX_COUNT]``: a number of steps, rounds or repeats some run could finish."""
    return is_int(value) and minimum <= value <= MAX_COUNT


def is_seed(value: Any) -> bool:
    return is_int(value) and 0 <= value <= MAX_SEED
