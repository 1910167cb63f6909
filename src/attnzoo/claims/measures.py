"""The measures a claim reads off a comparison: one value per seed of a variant, or None where it was not run.

Each is a :class:`attnzoo.claims.claim.Measure` built by a function of what it reads: a language-model metric or
probe, the rise of the loss past the training length, a task's metric or probe, or the compute multiple read off
the baseline's scaling curve across a ladder's sizes.
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from attnzoo.claims.claim import Blocks, Measure, Values
from attnzoo.config import ModelConfig
from attnzoo.evals.lm import LMScore
from attnzoo.model import training_flops_per_token
from attnzoo.results import CompareResults, Ladder


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

    loss = name == "val_loss"
    return Measure(label, "the language-model runs", read, blocks=blocks if loss else None, loss_sign=1 if loss else 0)


def _scores_at(results: CompareResults, variant: str, multiple: int) -> dict[int, LMScore] | None:
    """Each seed's score at ``multiple`` times the comparison's length, on the tokens every run scores there; None
    unless every seed has one."""
    found = results.variants.get(variant)
    if found is None:
        return None
    at = {run.seed: {p.multiple: p.score for p in run.extrapolation}.get(multiple) for run in found.runs}
    return None if any(score is None for score in at.values()) else at


def loss_rise(multiple: int) -> Measure:
    """How much the validation loss rises from the training length to ``multiple`` times it. Every length scores the
    same tokens, so where the runs stored each extrapolation block's loss the rise is also read block by block, and
    the interval counts the sampling of the text as the in-distribution loss does."""

    def points(results: CompareResults, variant: str):
        short, long = _scores_at(results, variant, 1), _scores_at(results, variant, multiple)
        return {seed: (short[seed], long[seed]) for seed in short} if short and long else None

    def read(results: CompareResults, variant: str) -> Values | None:
        pairs = points(results, variant)
        return {seed: long.loss - short.loss for seed, (short, long) in pairs.items()} if pairs else None

    def blocks(results: CompareResults, variant: str) -> Blocks | None:
        pairs = points(results, variant)
        if not pairs or any(short.block_losses is None or long.block_losses is None for short, long in pairs.values()):
            return None
        return {seed: np.subtract(long.block_losses, short.block_losses) for seed, (short, long) in pairs.items()}

    return Measure(
        f"loss at {multiple}× − loss at 1× (nats/token)", f"extrapolation to {multiple}×", read, blocks=blocks
    )


def loss_at(multiple: int) -> Measure:
    """The loss at ``multiple`` times the comparison's length, where every run scores the same tokens whatever
    length it trained at: a model trained at that length (``+lenN``) is read in distribution, the others past their
    training length (ALiBi trained at L against sinusoidal positions trained at 2L, both scored at 2L)."""

    def read(results: CompareResults, variant: str) -> Values | None:
        found = _scores_at(results, variant, multiple)
        return {seed: score.loss for seed, score in found.items()} if found else None

    def blocks(results: CompareResults, variant: str) -> Blocks | None:
        found = _scores_at(results, variant, multiple)
        if not found or any(score.block_losses is None for score in found.values()):
            return None
        return {seed: np.asarray(score.block_losses) for seed, score in found.items()}

    return Measure(
        f"validation loss at {multiple}L (nats/token)",
        f"extrapolation to {multiple}×",
        read,
        blocks=blocks,
        loss_sign=1,
    )


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


def compute_multiple(baseline: str) -> Measure:
    """The compute multiple at which ``baseline``'s scaling curve reaches the variant's loss, in natural log: the
    papers' unit (DCFormer's "performs like a Transformer with 1.7–2× the compute", Diff's "65% of the model size or
    training tokens"), read as they read it, off the baseline's loss against training compute fitted across model
    sizes trained at one tokens-per-parameter (never more tokens at one size).

    Per seed, ``ln L = ln A − α·ln C`` is fitted by least squares through that seed's baseline at every size of the
    ladder (C: training FLOPs, :func:`training_flops_per_token` times the tokens), and a variant at one size, with
    loss ``L_v`` after ``C_v`` FLOPs, matches the baseline at ``ln C* = (ln A − ln L_v)/α``; its value is
    ``ln(C*/C_v)``, so a variant that costs more per token is charged for it. The baseline's own value is 0 (a
    multiple of 1) by definition. Needs the baseline at two sizes or more with the seed."""

    def across(ladder: Ladder, rung: CompareResults, label: str) -> Values | None:
        if baseline not in rung.variants or label not in rung.variants:
            return None
        if label == baseline:
            return {run.seed: 0.0 for run in rung.variants[label].runs}
        curve: dict[int, list[tuple[float, float]]] = {}
        for size in ladder.rungs:
            found = size.variants.get(baseline)
            if found is None:
                continue
            per_token = flops_per_token(found.config, size.budget.seq_len)
            for run in found.runs:
                curve.setdefault(run.seed, []).append((math.log(per_token * run.tokens), math.log(run.val.loss)))
        found = rung.variants[label]
        per_token = flops_per_token(found.config, rung.budget.seq_len)
        values = {}
        for run in found.runs:
            points = curve.get(run.seed, [])
            if len(points) < 2 or not math.isfinite(run.val.loss) or run.val.loss <= 0:
                continue
            x, y = np.array(points).T
            if np.ptp(x) == 0:
                continue
            slope, intercept = np.polyfit(x, y, 1)  # ln L = intercept + slope · ln C, slope = −α
            values[run.seed] = (math.log(run.val.loss) - intercept) / slope - math.log(per_token * run.tokens)
        return values or None

    return Measure(
        "ln of the compute multiple at which the baseline's scaling curve matches",
        f"{baseline} at two model sizes or more",
        lambda results, label: None,
        across=across,
        loss_sign=-1,
    )


def flops_per_token(config: dict[str, Any], seq_len: int) -> float:
    """:func:`training_flops_per_token` of a stored variant's config (``results.json``'s), counted once per
    process."""
    return _flops_per_token(json.dumps(config, sort_keys=True), seq_len)


@functools.cache
def _flops_per_token(config_json: str, seq_len: int) -> float:
    """:func:`training_flops_per_token` of a stored variant's config, counted once per process: a report reads the
    measure for every view of it, and a count builds and runs the model."""
    return training_flops_per_token(ModelConfig.from_dict(json.loads(config_json)), seq_len)


@dataclass(frozen=True)
class SpikeRule:
    """A loss spike, stated before the run: a logged training loss more than ``nats`` above the median of the
    ``window`` losses logged before it, or a non-finite one. The median of the points before, not a fit, so a
    falling curve does not raise the bar and one spike does not hide the next."""

    window: int = 5
    nats: float = 0.1

    def describe(self) -> str:
        return (
            f"a logged training loss more than {self.nats:g} nats above the median of the {self.window} logged before "
            "it, or a non-finite one"
        )

    def count(self, losses: Sequence[float]) -> int:
        return sum(
            not math.isfinite(loss) or loss > float(np.median(losses[i - self.window : i])) + self.nats
            for i, loss in enumerate(losses)
            if i >= self.window
        )


def loss_spikes(rule: SpikeRule, preset: str) -> Measure:
    """The number of loss spikes by ``rule`` in each run's logged training losses, read only off ``preset``'s runs:
    the learning rate a spike count means something at is the preset's, not any comparison's that ran the models."""

    def read(results: CompareResults, variant: str) -> Values | None:
        found = results.variants.get(variant)
        if found is None or results.preset != preset:
            return None
        return {run.seed: float(rule.count([loss for _, loss in run.train_curve])) for run in found.runs}

    label = f"loss spikes over training (count per run: {rule.describe()})"
    return Measure(label, f"the {preset} preset's language-model runs", read)


def not_built(label: str, needs: str, task: str | None = None) -> Measure:
    """A measure no preset produces yet: every comparison reports the claim as not run, with ``needs``."""
    return Measure(label, needs, lambda results, variant: None, task)
