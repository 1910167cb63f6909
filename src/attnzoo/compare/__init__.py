"""``attnzoo compare``: attention variants trained side by side under one budget, with the evidence.

>>> from attnzoo.compare import run_compare, run_task
>>> run_compare("quick", "runs/compare-quick")                       # doctest: +SKIP
>>> run_compare("micro", "out", variants=["mha+rope", "diff+alibi"])  # doctest: +SKIP
>>> run_task("mqar", "diff+rope", steps=500)                          # doctest: +SKIP

See :mod:`attnzoo.compare.spec` for the presets, :mod:`attnzoo.compare.runner` for the output directory and
how a compare resumes, and :mod:`attnzoo.compare.stats` for the seed-noise rule every report states.
"""

from attnzoo.compare.results import SCHEMA_VERSION, CompareResults, TaskResult, TaskRun
from attnzoo.compare.runner import CompareResult, run_compare
from attnzoo.compare.spec import DEFAULT_VARIANTS, PRESETS, CompareSpec, EvalSpec, resolve_spec
from attnzoo.compare.stats import NOISE_RULE, Difference, Summary, difference, rank
from attnzoo.compare.tasks import run_task
from attnzoo.evals.task import TaskBudget, TaskSpec

__all__ = [
    "DEFAULT_VARIANTS",
    "NOISE_RULE",
    "PRESETS",
    "SCHEMA_VERSION",
    "CompareResult",
    "CompareResults",
    "CompareSpec",
    "Difference",
    "EvalSpec",
    "Summary",
    "TaskBudget",
    "TaskResult",
    "TaskRun",
    "TaskSpec",
    "difference",
    "rank",
    "resolve_spec",
    "run_compare",
    "run_task",
]
