"""``attnzoo compare``: attention variants trained side by side under one budget, with the evidence.

>>> from attnzoo.compare import resolve_spec, run_compare, run_task
>>> run_compare("quick", "runs/compare-quick")                                    # doctest: +SKIP
>>> run_compare(resolve_spec("micro", variants=["mha+rope", "diff+alibi"]), "out")  # doctest: +SKIP
>>> run_task("mqar", "diff+rope", steps=500)                                       # doctest: +SKIP

See :mod:`attnzoo.compare.presets` for the presets and :mod:`attnzoo.compare.runner` for the output directory and
how a compare resumes. What a compare writes is :mod:`attnzoo.results`; the papers' claims, and how each is judged
on it, are :mod:`attnzoo.claims`.
"""

import importlib
import warnings
from typing import Any

from attnzoo.compare.presets import PRESETS
from attnzoo.compare.resolve import resolve_spec
from attnzoo.compare.runner import CompareResult, run_compare
from attnzoo.compare.spec import DEFAULT_VARIANTS, CompareSpec
from attnzoo.compare.tasks import run_task
from attnzoo.evals.spec import EvalSpec
from attnzoo.evals.task import TaskBudget, TaskSpec
from attnzoo.results import SCHEMA_VERSION, CompareResults, TaskResult, TaskRun

__all__ = [
    "DEFAULT_VARIANTS",
    "PRESETS",
    "SCHEMA_VERSION",
    "CompareResult",
    "CompareResults",
    "CompareSpec",
    "EvalSpec",
    "TaskBudget",
    "TaskResult",
    "TaskRun",
    "TaskSpec",
    "resolve_spec",
    "run_compare",
    "run_task",
]

# Names attnzoo.compare exported until the claims became their own package: each still resolves, with a warning,
# until it is removed in 0.2.
_MOVED = {
    "PairedDifference": "attnzoo.stats",
    "Summary": "attnzoo.stats",
    "holm": "attnzoo.stats",
    "paired_over_seeds": "attnzoo.stats",
    "paired_over_seeds_and_blocks": "attnzoo.stats",
    "Verdict": "attnzoo.claims",
    "judge": "attnzoo.claims",
    "judge_all": "attnzoo.claims",
}


def __getattr__(name: str) -> Any:
    if name not in _MOVED:
        raise AttributeError(f"module 'attnzoo.compare' has no attribute {name!r}")
    home = _MOVED[name]
    warnings.warn(
        f"attnzoo.compare.{name} moved to {home}.{name}; the old name is removed in attnzoo 0.2: "
        f"from {home} import {name}",
        FutureWarning,
        stacklevel=2,
    )
    return getattr(importlib.import_module(home), name)
