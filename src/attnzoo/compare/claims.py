"""The papers' claims as records: what each paper says, the experiment here that tests it, and how it is judged.

A :class:`Claim` names its paper, says what the paper found in one sentence with the paper's own figure and
where that figure is printed (``source``), and fixes, before any run, everything its verdict depends on:

* the experiment: a variant against a baseline, and the :class:`Measure` read off each seed's run;
* the claimed direction (:data:`LOWER`, :data:`HIGHER`) or a non-inferiority margin (:data:`NONINFERIOR`);
* the **smallest effect of interest** and where that number comes from: an effect whose interval lies inside
  it is *negligible*, whatever its sign;
* the **validity gate**: a claim on a task is judged only where the baseline learned the task
  (:class:`TaskLearned`), a language-model claim only where the validation loss has flattened
  (:class:`LossFlattened`);
* whether it is its paper's **primary** claim: the primaries are corrected together for multiplicity (Holm),
  every other claim is exploratory;
* the preset that runs it: a claim whose experiment needs a GPU, or that no preset runs yet, is registered all
  the same and reported as *not run*, never left out.

:mod:`attnzoo.compare.verdicts` turns a comparison's results into one verdict per claim;
:mod:`attnzoo.compare.paper_claims` registers the claims themselves.
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import numpy as np
from scipy import stats

from attnzoo.config import ModelConfig
from attnzoo.model import training_flops_per_token

if TYPE_CHECKING:
    from attnzoo.compare.results import CompareResults

LOWER, HIGHER, NONINFERIOR = "lower", "higher", "noninferior"
# lower/higher: the claimed sign of variant − baseline. noninferior: variant − baseline stays below the margin,
# for a measure where lower is better (a loss): the variant is no worse than the baseline by more than it.
Rule = Literal["lower", "higher", "noninferior"]

DIVERGED = "a diverged training"  # how a gate's reason ends when a value is NaN or infinite
Values = dict[int, float]  # seed → the measure
Blocks = dict[int, np.ndarray]  # seed → the measure on each evaluation block (the same blocks for every variant)


@dataclass(frozen=True)
class Measure:
    """A quantity read off a comparison for one variant: one value per seed, or None where it was not run.

    ``blocks``, where the measure is an average over evaluation blocks, reads each block's value, so the
    interval can include the sampling of the evaluation text as well as the seeds.
    """

    label: str  # with its unit
    needs: str  # what the comparison must run to measure it, for the "not run" reason
    read: Callable[[CompareResults, str], Values | None]
    task: str | None = None  # the synthetic task it is read from; None: the language model
    blocks: Callable[[CompareResults, str], Blocks | None] | None = None
    trains: tuple[str, ...] = ()  # language-model variants it reads besides the claim's variant and baseline


# ------------------------------------------------------------------------------------------------- the gates


@dataclass(frozen=True)
class Gate:
    """Whether a comparison can show the claim at all; ``levels`` are what it reached, for the report."""

    passed: bool
    reason: str
    levels: dict[str, float]
    remedy: str | None = None  # what would make a failed gate pass, where the claim's default advice is wrong


@dataclass(frozen=True)
class LossFlattened:
    """Judged only where the validation loss of both models moved by less than ``max_fall`` nats, down or up, over
    the last ``window`` of training (a least-squares line through each seed's curve, or its last two points when the
    window holds fewer; the mean over seeds). A model still improving faster than the effect sought is measured
    mid-descent, where a difference in speed of learning passes for a difference in the end state; one whose loss
    rises as fast has passed its minimum: overfitting where the runs read their training split more than once (the
    end state then measures how the models memorise rather than how they model the text)."""

    max_fall: float
    window: float = 0.25

    def describe(self) -> str:
        return (
            f"validation loss fell or rose by less than {self.max_fall:g} nats over the last {self.window:.0%} of "
            "training"
        )

    def check(self, results: CompareResults, claim: Claim) -> Gate:
        levels, falling, rising = {}, [], []
        for label in (claim.baseline, claim.variant):
            found = results.variants.get(label)
            fall = _last_fall(found.runs, self.window) if found else None
            if fall is None:
                return Gate(False, f"{label} logged fewer than two validation points: the slope cannot be read", {})
            if not math.isfinite(fall):
                return Gate(False, f"{label}'s validation loss is non-finite near the end: {DIVERGED}", {})
            levels[f"{label}: fall over the last {self.window:.0%} (nats)"] = fall
            if fall >= self.max_fall:
                falling.append(f"{label} still fell {fall:.3f} nats")
            elif -fall >= self.max_fall:
                rising.append(f"{label} rose {-fall:.3f} nats")
        window = f"over the last {self.window:.0%} of training, against the {self.max_fall:g} allowed"
        if falling:
            return Gate(False, f"{' and '.join(falling)} {window}: the loss had not flattened", levels)
        if rising:
            rose = f"{' and '.join(rising)} {window}"
            runs = [run for label in (claim.baseline, claim.variant) for run in results.variants[label].runs]
            passes = max(run.tokens for run in runs) / results.corpus.train_tokens
            if passes > 1:
                return Gate(
                    False,
                    f"{rose}: the models overfit a training split they read {passes:.1f} times, so the end state "
                    "measures memorising, not modelling the text",
                    levels,
                    remedy="a training split larger than a run's tokens (a bigger corpus, or fewer tokens a run)",
                )
            return Gate(
                False,
                f"{rose}, within one pass over the training split: the loss passed its minimum before the end",
                levels,
                remedy="a schedule under which the validation loss settles (a lower learning rate or a check of why "
                "it rose)",
            )
        return Gate(True, self.describe(), levels)


def _last_fall(runs, window: float) -> float | None:
    """The mean over seeds of each seed's fall, from its own curve (for seeds logged at the same steps, the fall of
    the mean curve); None where a seed logged fewer than two points."""
    falls = [_run_fall(run.val_curve, window) for run in runs]
    return None if not falls or any(f is None for f in falls) else float(np.mean(falls))


def _run_fall(val_curve, window: float) -> float | None:
    steps = [step for step, _ in val_curve]
    if len(steps) < 2:
        return None
    curve = np.asarray([loss for _, loss in val_curve], dtype=np.float64)
    start = steps[-1] - window * steps[-1]
    inside = [i for i, step in enumerate(steps) if step >= start]
    if len(inside) < 2:
        inside = [len(steps) - 2, len(steps) - 1]
    fit = stats.linregress([steps[i] for i in inside], curve[inside])
    return float(-fit.slope * window * steps[-1])


@dataclass(frozen=True)
class TaskLearned:
    """Judged only where the baseline closed at least ``share`` of the gap from chance to the solved level
    (mean over seeds), and beat the task's shortcut (the score of skipping the step it tests, e.g. answering with a
    random needle) where the task declares one; and no seed of the variant ended at or beyond chance: a model worse
    than a uniform guess failed to train, and says nothing about its mechanism. ``variant_too``, for a claim read off
    a probe of the mechanism (attention shares) rather than the task's metric: the variant must pass the same gate,
    since a model that did not learn the task says nothing about how its mechanism solves it."""

    share: float = 0.5
    variant_too: bool = False

    def describe(self) -> str:
        who = "the baseline and the variant each" if self.variant_too else "the baseline"
        return f"{who} closed ≥ {self.share:.0%} of the gap from chance to solved, and beat any shortcut"

    def check(self, results: CompareResults, claim: Claim) -> Gate:
        task = results.tasks[claim.measure.task]  # type: ignore[index]
        if task.chance is None or task.solved is None:
            return Gate(False, f"task {task.name!r} declares no chance and solved levels to gate on", {})
        sign = 1 if task.higher_is_better else -1
        threshold = task.chance + self.share * (task.solved - task.chance)
        if task.shortcut is not None:  # a model on the shortcut has not learned the step the task tests
            threshold = max(threshold, task.shortcut) if sign > 0 else min(threshold, task.shortcut)
        finals = {label: [run.final[task.metric] for run in task.runs[label]] for label in task.runs}
        baseline, variant = np.mean(finals[claim.baseline]), np.mean(finals[claim.variant])
        diverged = [label for label in (claim.baseline, claim.variant) if not np.all(np.isfinite(finals[label]))]
        if diverged:
            return Gate(False, f"{' and '.join(diverged)} ended with a non-finite {task.metric}: {DIVERGED}", {})
        levels = {
            f"{claim.baseline} (baseline)": float(baseline),
            f"{claim.variant}": float(variant),
            "chance": task.chance,
            "gate": threshold,
            "solved": task.solved,
        }
        if task.shortcut is not None:
            levels["shortcut"] = task.shortcut
        if sign * (baseline - threshold) < 0 or (task.shortcut is not None and baseline == task.shortcut):
            return Gate(
                False,
                f"the baseline reached {task.metric} {baseline:.3g}, short of the gate {threshold:.3g} (chance "
                f"{task.chance:.3g}, solved {task.solved:g}): it did not learn the task",
                levels,
            )
        if self.variant_too and sign * (variant - threshold) < 0:
            return Gate(
                False,
                f"{claim.variant} reached {task.metric} {variant:.3g}, short of the gate {threshold:.3g} (chance "
                f"{task.chance:.3g}, solved {task.solved:g}): a probe of a model that did not learn the task",
                levels,
            )
        failed = [run.seed for run in task.runs[claim.variant] if sign * (run.final[task.metric] - task.chance) <= 0]
        if failed:
            return Gate(
                False,
                f"{claim.variant} ended at or beyond chance ({task.chance:.3g}) on seed(s) {failed}: a failed training",
                levels,
            )
        return Gate(True, self.describe(), levels)


# ------------------------------------------------------------------------------------------------ the record


@dataclass(frozen=True)
class Claim:
    id: str
    paper: str
    statement: str  # one sentence, with the paper's own figure, or "figure not available"
    source: str  # where the figure is printed: a review in shared/seeds/ (file and line) or the paper's address
    variant: str  # the variant label the claim is about
    baseline: str  # what it is compared with
    measure: Measure
    rule: Rule
    smallest_effect: float  # the smallest |variant − baseline| of interest, in the measure's unit (the margin, for
    smallest_effect_source: str  # NONINFERIOR), and where that number comes from
    gate: LossFlattened | TaskLearned
    primary: bool = False  # the paper's one primary claim; at most one per paper
    paper_scale: str = ""  # where the paper measured it
    checks: tuple[str, ...] = ()  # what was checked to rule out a setup error, shown with every verdict
    preset: str = "claims"  # the preset that runs its experiment
    needs_gpu: bool = False
    experiment: str = ""  # for a claim no preset runs yet: what would test it

    def __post_init__(self) -> None:
        if self.smallest_effect <= 0:
            raise ValueError(f"claim {self.id!r}: smallest_effect must be > 0, got {self.smallest_effect}")
        if isinstance(self.gate, TaskLearned) != (self.measure.task is not None):
            raise ValueError(f"claim {self.id!r}: a task's measure takes TaskLearned, a language model's LossFlattened")

    @property
    def is_run(self) -> bool:
        """Whether some preset's experiment measures it: the CPU claims preset or a GPU preset."""
        return not self.experiment


CLAIMS: dict[str, Claim] = {}


def register_claim(claim: Claim) -> Claim:
    if claim.id in CLAIMS:
        raise ValueError(f"claim {claim.id!r} is already registered")
    if claim.primary and any(c.primary and c.paper == claim.paper for c in CLAIMS.values()):
        raise ValueError(f"claim {claim.id!r}: {claim.paper} already has a primary claim")
    CLAIMS[claim.id] = claim
    return claim


# ---------------------------------------------------------------------------------------------- the measures


def lm_metric(name: str, label: str) -> Measure:
    """A language-model metric of :meth:`VariantResult.metric_values` (e.g. ``val_loss``); ``val_loss`` also
    reads each validation block's loss where the run stored them."""

    def read(results: CompareResults, variant: str) -> Values | None:
        found = results.variants.get(variant)
        values = found.metric_values().get(name) if found else None
        return {run.seed: value for run, value in zip(found.runs, values, strict=True)} if values else None

    def blocks(results: CompareResults, variant: str) -> Blocks | None:
        found = results.variants.get(variant)
        if found is None or any(run.val.block_losses is None for run in found.runs):
            return None
        return {run.seed: np.asarray(run.val.block_losses) for run in found.runs}

    return Measure(label, "the language-model runs", read, blocks=blocks if name == "val_loss" else None)


def loss_rise(multiple: int) -> Measure:
    """How much the validation loss rises from the training length to ``multiple`` times it."""

    def read(results: CompareResults, variant: str) -> Values | None:
        found = results.variants.get(variant)
        if found is None:
            return None
        rises = {}
        for run in found.runs:
            at_1 = run.extrapolation_loss(1)
            at_m = run.extrapolation_loss(multiple) if any(p.multiple == multiple for p in run.extrapolation) else None
            if at_1 is None or at_m is None:
                return None
            rises[run.seed] = at_m - at_1
        return rises

    return Measure(f"loss at {multiple}× − loss at 1× (nats/token)", f"extrapolation to {multiple}×", read)


def lm_probe(key: str, label: str) -> Measure:
    """A probe of the trained language model (attention outliers, spikiness), stored with each run."""

    def read(results: CompareResults, variant: str) -> Values | None:
        found = results.variants.get(variant)
        if found is None or any(key not in run.probes for run in found.runs):
            return None
        return {run.seed: run.probes[key] for run in found.runs}

    return Measure(label, f"the language-model probe {key!r}", read)


def task_metric(task: str, label: str) -> Measure:
    """A task's own metric on its fixed evaluation set, for the final model."""

    def read(results: CompareResults, variant: str) -> Values | None:
        found = results.tasks.get(task)
        runs = found.runs.get(variant) if found else None
        return {run.seed: run.final[found.metric] for run in runs} if runs else None

    return Measure(label, f"task {task!r}", read, task)


def task_probe(task: str, key: str, label: str) -> Measure:
    """A value of the task's probe (e.g. the needles task's attention shares)."""

    def read(results: CompareResults, variant: str) -> Values | None:
        found = results.tasks.get(task)
        runs = found.runs.get(variant) if found else None
        return {run.seed: run.probe[key] for run in runs} if runs and all(key in r.probe for r in runs) else None

    return Measure(label, f"task {task!r} with its probe", read, task)


def compute_to_match(references: dict[float, str]) -> Measure:
    """The compute multiple at which the baseline's validation loss matches the variant's: per seed, the baseline
    trained with each multiple of the tokens in ``references`` (multiple → variant label, 1 the baseline itself),
    interpolated linearly in log-tokens, and extrapolated from the nearest two beyond them; that tokens multiple
    divided by the variant's training FLOPs per token over the baseline's (:func:`training_flops_per_token`), since
    the variant trained on 1× the tokens spent that much more compute. The baseline's own value is 1 by definition,
    so variant − baseline is the multiple's excess over 1."""
    multiples = sorted(references)

    def read(results: CompareResults, label: str) -> Values | None:
        runs = {m: results.variants.get(references[m]) for m in multiples}
        if any(found is None for found in runs.values()):
            return None
        if label == references[1.0]:
            return {run.seed: 1.0 for run in runs[1.0].runs}  # type: ignore[union-attr]
        found = results.variants.get(label)
        if found is None:
            return None
        flops = [
            _flops_per_token(json.dumps(variant.config, sort_keys=True), results.budget.seq_len)
            for variant in (found, runs[1.0])
        ]
        by_seed = {m: {run.seed: run.val.loss for run in runs[m].runs} for m in multiples}  # type: ignore[union-attr]
        return {
            run.seed: matching_multiple(multiples, [by_seed[m][run.seed] for m in multiples], run.val.loss)
            * flops[1]
            / flops[0]
            for run in found.runs
            if all(run.seed in by_seed[m] for m in multiples)
        }

    trained = ", ".join(f"{m:g}×" for m in multiples)
    return Measure(
        "compute multiple at which the baseline matches (×)",
        f"the baseline trained at {trained} the tokens",
        read,
        trains=tuple(references.values()),
    )


@functools.cache
def _flops_per_token(config_json: str, seq_len: int) -> float:
    """:func:`training_flops_per_token` of a stored variant's config, counted once per process: a report reads the
    measure for every view of it, and a count builds and runs the model."""
    return training_flops_per_token(ModelConfig.from_dict(json.loads(config_json)), seq_len)


def matching_multiple(multiples: list[float], losses: list[float], target: float) -> float:
    """Where the loss-against-log-compute line through ``(multiples, losses)`` reaches ``target``: between the two
    points that bracket it, else along the end segment nearest to it, bounded to [1/16, 16]."""
    log_m, loss = np.log(np.asarray(multiples, dtype=float)), np.asarray(losses, dtype=float)
    inside = [i for i in range(len(loss) - 1) if min(loss[i], loss[i + 1]) <= target <= max(loss[i], loss[i + 1])]
    i = inside[0] if inside else (0 if target > loss[0] else len(loss) - 2)
    if loss[i + 1] == loss[i]:
        return float(np.exp(log_m[i]))
    fraction = (target - loss[i]) / (loss[i + 1] - loss[i])
    return float(np.clip(np.exp(log_m[i] + fraction * (log_m[i + 1] - log_m[i])), 1 / 16, 16))


def not_built(label: str, needs: str, task: str | None = None) -> Measure:
    """A measure no preset produces yet: every comparison reports the claim as not run, with ``needs``."""
    return Measure(label, needs, lambda results, variant: None, task)
