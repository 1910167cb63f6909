"""A task claim at each model's own learning rate: the learning-rate check of ``attnzoo.claims.learning_rate``, for a
claim on a synthetic task (issue 53).

    python benchmarks/task_lr_sweep.py                               # selective.value_temperature_denoising
    python benchmarks/task_lr_sweep.py --claim selective.graph_temperature --out runs/graph-lr.md

The claims ladder trains a task's models at the task budget's one peak rate, at the rung where the ladder runs the
task. Here the claim's variant and baseline train the same task, budget and seeds at ×0.5, ×1 and ×2 that rate (the
``claims-lr`` grid), each model's best multiple is its lowest (or, for a higher-is-better metric, highest) mean
final metric over the seeds, and the claim is judged twice at the raw 5% level, on the same seeds: every model at
the shared rate, and each at its own best. Different outcomes make the claim LR-sensitive. Runs are sequential on
one thread; nothing here times anything. Writes markdown and the raw numbers as JSON beside it.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from attnzoo.claims import CLAIMS, Claim
from attnzoo.claims.learning_rate import LR_MULTIPLES, best_multiple
from attnzoo.claims.rules import EQUIVALENCE_CONFIDENCE, decide, p_value
from attnzoo.compare.presets import LADDERS
from attnzoo.compare.tasks import task_configs, train_task
from attnzoo.evals.task import TaskSpec
from attnzoo.io import atomic_write_text
from attnzoo.stats import paired_over_seeds
from attnzoo.tables import Table
from attnzoo.variants import Variant

REPO = Path(__file__).resolve().parents[1]


def sweep(claim: Claim, task: TaskSpec, seeds: Sequence[int]) -> dict[str, dict[float, list[float]]]:
    """The claim's variant and baseline trained on ``task`` at every multiple of its peak rate × ``seeds``: each
    run's final metric, by model and multiple."""
    models = (claim.variant, claim.baseline)
    configs = task_configs(task, Variant.parse_all(models))
    metric: dict[str, dict[float, list[float]]] = {model: {} for model in models}
    for model in models:
        for multiple in LR_MULTIPLES:
            at_rate = task.replace(lr=task.budget.lr * multiple)
            metric[model][multiple] = [
                train_task(at_rate, configs[model], seed, torch.device("cpu"), False, model).final[task.task.metric]
                for seed in seeds
            ]
            print(f"{model} ×{multiple:g}: {metric[model][multiple]}", file=sys.stderr, flush=True)
    return metric


def check(claim: Claim, metric: dict[str, dict[float, list[float]]], higher_is_better: bool) -> dict[str, Any]:
    """Each model's best multiple (its best mean metric over the seeds; a tie keeps ×1, as claims-lr does), the claim
    judged at the shared rate and at each model's own best on the same seeds, and whether the two outcomes agree."""
    sign = -1.0 if higher_is_better else 1.0
    best = {
        model: best_multiple({m: sign * float(np.mean(values)) for m, values in by_multiple.items()})
        for model, by_multiple in metric.items()
    }

    def judged(variant_multiple: float, baseline_multiple: float) -> dict[str, Any]:
        difference = paired_over_seeds(
            metric[claim.variant][variant_multiple], metric[claim.baseline][baseline_multiple]
        )
        p = p_value(claim.rule, claim.smallest_effect, difference)
        outcome, reason = decide(claim.rule, claim.smallest_effect, difference, p, p)
        interval = difference.interval(EQUIVALENCE_CONFIDENCE)
        return {"effect": difference.mean, "interval90": interval, "p_raw": p, "outcome": outcome, "reason": reason}

    at_shared, at_own = judged(1.0, 1.0), judged(best[claim.variant], best[claim.baseline])
    same = at_shared["outcome"] == at_own["outcome"]
    return {"best": best, "at_shared": at_shared, "at_own": at_own, "check": "the same" if same else "LR-sensitive"}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    on_tasks = sorted(claim_id for claim_id, claim in CLAIMS.items() if claim.measure.task is not None)
    parser.add_argument(
        "--claim", default="selective.value_temperature_denoising", choices=on_tasks, help="a claim on a task"
    )
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "task-lr-denoising.md")
    args = parser.parse_args(argv)
    claim = CLAIMS[args.claim]
    rungs = [r for r in LADDERS["claims"].rungs if any(t.name == claim.measure.task for t in r.tasks)]
    if not rungs:
        parser.error(f"--claim {args.claim}: the claims ladder does not run its task {claim.measure.task!r}")
    torch.set_num_threads(1)
    rung = rungs[-1]
    task = next(t for t in rung.tasks if t.name == claim.measure.task)
    seeds = rung.task_seeds or rung.seeds
    metric = sweep(claim, task, seeds)
    found = check(claim, metric, task.task.higher_is_better)
    best, at_shared, at_own = found["best"], found["at_shared"], found["at_own"]
    record = {
        "claim": claim.id,
        "task": task.name,
        "metric": task.task.metric,
        "peak_lr": task.budget.lr,
        "seeds": list(seeds),
        "runs": {model: {f"{m:g}": values for m, values in by.items()} for model, by in metric.items()},
        **found,
        "threads": torch.get_num_threads(),
        "cpu": _cpu(),
    }
    rows = [
        [model, *(f"{np.mean(metric[model][m]):.4f}" + (" (best)" if best[model] == m else "") for m in LR_MULTIPLES)]
        for model in metric
    ]
    table = Table(["model", *(f"×{m:g}" for m in LR_MULTIPLES)], rows).to_markdown()
    text = (
        f"# {claim.id} at each model's own learning rate\n\n"
        f"The {task.name} task at its claims-ladder budget (peak {task.budget.lr:g}, {task.budget.steps} steps), "
        f"seeds {list(seeds)}, mean final {task.task.metric} at each multiple of the peak; {record['cpu']}, 1 thread. "
        f"Made by `python benchmarks/task_lr_sweep.py --claim {claim.id}`.\n\n{table}\n\n"
        f"- at the shared rate: {_judged(at_shared)}\n"
        f"- at each model's own best ({', '.join(f'{m} ×{best[m]:g}' for m in metric)}): {_judged(at_own)}\n\n"
        f"The learning-rate check: **{found['check']}**.\n"
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(args.out, text)
    atomic_write_text(args.out.with_suffix(".json"), json.dumps(record, indent=2) + "\n")
    print(text)
    return 0


def _judged(judged: dict[str, Any]) -> str:
    low, high = judged["interval90"]
    return f"{judged['effect']:+.4f}, 90% [{low:+.4f}, {high:+.4f}], {judged['outcome']}"


def _cpu() -> str:
    names = (
        [
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ]
        if Path("/proc/cpuinfo").exists()
        else []
    )
    return names[0] if names else "an unknown CPU"


if __name__ == "__main__":
    sys.exit(main())
