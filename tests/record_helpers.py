"""Comparing a re-rendered record (verdicts.json) with the committed one."""

import math
from typing import Any

# numpy's and scipy's reductions round differently with the CPU's vector width: the stored verdicts re-rendered on a
# second AMD EPYC differed from the committed ones in the last one or two digits of a p-value or an interval
# (0.0026079851246389204 against 0.002607985124638922). Everything else must match exactly.
REL_TOL = 1e-9


def assert_same_record(ours: Any, stored: Any, where: str = "record") -> None:
    """Equal structure, equal strings and integers, floats equal to ``REL_TOL``."""
    if isinstance(stored, float) and isinstance(ours, float):
        assert math.isclose(ours, stored, rel_tol=REL_TOL) or (math.isnan(ours) and math.isnan(stored)), where
    elif isinstance(stored, dict) and isinstance(ours, dict):
        assert ours.keys() == stored.keys(), where
        for key in stored:
            assert_same_record(ours[key], stored[key], f"{where}.{key}")
    elif isinstance(stored, list) and isinstance(ours, list):
        assert len(ours) == len(stored), where
        for i, (mine, theirs) in enumerate(zip(ours, stored, strict=True)):
            assert_same_record(mine, theirs, f"{where}[{i}]")
    else:
        assert ours == stored and type(ours) is type(stored), f"{where}: {ours!r} != {stored!r}"
