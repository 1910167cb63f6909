"""``attnzoo compare``: attention variants trained side by side under one budget, with the evidence.

>>> from attnzoo.compare import run_compare, run_task
>>> run_compare("quick", "runs/compare-quick")                       # doctest: +SKIP
>>> run_compare("micro", "out", variants=["mha+rope", "diff+alibi"])  # doctest: +SKIP
>>> run_task("mqar", "diff+rope", steps=500)                          # doctest: +SKIP

See :mod:`attnzoo.compare.spec` for the presets, :mod:`attnzoo.compare.runner` for the output directory and
how a compare resumes, :mod:`attnzoo.compare.paper_claims` for the papers' claims and
:mod:`attnzoo.compare.verdicts` for how each is judged (:mod:`attnzoo.compare.stats`: the paired statistics).
"""

from attnzoo.compare.results import SCHEMA_VERSION, CompareResults, TaskResult, TaskRun
from attnzoo.compare.runner import CompareResult, run_compare
from attnzoo.compare.spec import DEFAULT_VARIANTS, PRESETS, CompareSpec, EvalSpec, resolve_spec
from attnzoo.compare.stats import PairedDifference, Summary, holm, paired_over_seeds, paired_over_seeds_and_blocks
from attnzoo.compare.tasks import run_task
from attnzoo.compare.verdicts import Verdict, judge, judge_all
from attnzoo.evals.task import TaskBudget, TaskSpec

__all__ = [
    "DEFAULT_VARIANTS",
    "PRESETS",
    "SCHEMA_VERSION",
    "CompareResult",
    "CompareResults",
    "CompareSpec",
    "EvalSpec",
    "PairedDifference",
    "Summary",
    "TaskBudget",
    "TaskResult",
    "TaskRun",
    "TaskSpec",
    "Verdict",
    "holm",
    "judge",
    "judge_all",
    "paired_over_seeds",
    "paired_over_seeds_and_blocks",
    "resolve_spec",
    "run_compare",
    "run_task",
]
