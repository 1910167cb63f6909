"""The project's standard checks for configuration values. A leaf: it imports nothing from attnzoo, so any
module (configs, mechanisms, positions, evals) can validate its options without an import cycle."""

from __future__ import annotations

import math
import re
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


DEVICE_NAMES = "use 'auto', 'cpu', 'cuda' or 'cuda:N'"


def is_device_name(value: Any) -> bool:
    """A device the commands run on, by name alone (whether it is here is :func:`attnzoo.distributed.resolve_device`'s
    to say): torch would also take 'cpu:99' or 'meta', which nothing here runs on."""
    return isinstance(value, str) and re.fullmatch(r"auto|cpu|cuda(:[0-9]{1,4})?", value) is not None


def require_count(name: str, value: Any, minimum: int = 1) -> None:
    """A size or a count (heads, layers, steps, windows ...): an integer of at least ``minimum``, and at most
    :data:`MAX_COUNT`, so that a typo is refused by name before it reaches an allocator or a C ``long``."""
    require(is_int(value) and value >= minimum, name, value, f"must be an integer >= {minimum}")
    require(value <= MAX_COUNT, name, value, f"must be an integer in [{minimum}, {MAX_COUNT}]")


def is_seed(value: Any) -> bool:
    return is_int(value) and 0 <= value <= MAX_SEED
