"""Each model at its own best learning rate: the papers' reading of a comparison, set against the shared rate's.

The claims ladder trains every model at one peak learning rate, the one chosen for MHA. A verdict that another rate
could flip is a verdict on the rate, not on the mechanism. So a sweep (the ``claims-lr`` preset: each model it swept
at ×0.5 and ×2 the shared rate at the small rung, ``+lrF``, beside the ladder's own ×1 runs) picks each model's best
multiple by its mean validation loss (:func:`best_learning_rates`), the large rung trains each model at it
(:func:`attnzoo.compare.presets.own_lr_rung`), and :func:`check_learning_rates` re-judges every verdict there, each
model at its own best rate, beside the shared rate on the same seeds. A verdict that differs at that size between
the two is **LR-sensitive**: not decided. Both runs are parts of the ladder's rungs, stored beside them in
its folder (:func:`attnzoo.results.ladder.load_ladder` merges them), and :func:`attnzoo.claims.verdicts.judge_all`
makes the check wherever the smallest rung holds a sweep (:func:`with_learning_rate_check`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence

import numpy as np

from attnzoo.claims.claim import Claim
from attnzoo.claims.measures import compute_multiple
from attnzoo.claims.rules import DECIDED
from attnzoo.claims.sizes import judge_largest
from attnzoo.claims.verdict import Verdict
from attnzoo.results import CompareResults, Ladder
from attnzoo.results.ladder import merge_parts
from attnzoo.variants import Variant

LR_MULTIPLES = (0.5, 1.0, 2.0)  # of the shared peak rate: the sweep's grid, ×1 being the ladder's own runs


def at_learning_rate(label: str, multiple: float) -> str:
    """``label`` trained at ``multiple`` times the comparison's peak rate: ``diff+rope``, 2 → ``diff+rope+lr2``."""
    return dataclasses.replace(Variant.parse(label), lr=multiple).label


def best_learning_rates(
    sweep: Sequence[CompareResults], models: Sequence[str], multiples: Sequence[float] = LR_MULTIPLES
) -> dict[str, float]:
    """Each model's multiple with the lowest mean validation loss, over the seeds every multiple of it ran; the
    runs of each multiple may come from any of ``sweep``'s comparisons (of one size: the ladder's ×1 rung beside
    the sweep's others). A diverged run counts as infinitely bad. Ties go to the multiple nearest ×1."""
    sizes = {rung.variants[rung.baseline].parameters for rung in sweep}
    if len(sizes) != 1:
        raise ValueError(f"a learning-rate sweep is read at one model size; these comparisons have {sorted(sizes)}")
    best = {}
    for model in models:
        losses: dict[float, dict[int, float]] = {}
        for multiple in multiples:
            label = at_learning_rate(model, multiple)
            found = next((rung.variants[label] for rung in sweep if label in rung.variants), None)
            if found is None:
                raise ValueError(f"the sweep has no run of {label}: it needs {model} at every multiple {multiples}")
            losses[multiple] = {run.seed: run.val.loss for run in found.runs}
        seeds = sorted(set.intersection(*(set(by_seed) for by_seed in losses.values())))
        if not seeds:
            raise ValueError(f"no seed of {model} ran at every multiple {multiples}")
        best[model] = best_multiple({m: _mean([by_seed[seed] for seed in seeds]) for m, by_seed in losses.items()})
    return best


def best_multiple(means: Mapping[float, float]) -> float:
    """The multiple whose mean (lower is better) is lowest; a tie goes to the multiple nearest ×1."""
    return min(means, key=lambda m: (means[m], abs(math.log(m))))


def _mean(values: Sequence[float]) -> float:
    """A mean validation loss, infinite where any run diverged."""
    return float(np.mean(values)) if all(math.isfinite(v) for v in values) else math.inf


def _swept_as(label: str) -> str:
    """The model whose sweep sets ``label``'s rate: an uptrained model trains at its source's."""
    variant = Variant.parse(label)
    return (variant.source if variant.uptrain is not None else variant).label


def _swept_models_of(claim: Claim) -> list[str]:
    """The models whose sweep sets the rates of ``claim``'s runs, each once."""
    return list(dict.fromkeys(_swept_as(label) for label in (claim.variant, claim.baseline, *claim.measure.trains)))


def own_lr_claim(claim: Claim, best: Mapping[str, float]) -> Claim | str:
    """``claim`` with its variant and baseline at their own best multiples (a compute multiple read off the baseline
    at its own); a string says why it cannot be: a model no sweep ran, or an uptrained one, which trains at its
    source's pre-training rate, whose best is not ×1."""
    labels = {}
    for label in (claim.variant, claim.baseline, *claim.measure.trains):
        variant, model = Variant.parse(label), _swept_as(label)
        if model not in best:
            return f"no learning-rate sweep ran {model}"
        if variant.uptrain is not None and best[model] != 1:
            return (
                f"{label} is uptrained at its source's pre-training rate, and {model}'s best is ×{best[model]:g}: "
                "the uptraining at that rate is not run"
            )
        labels[label] = label if variant.uptrain is not None else at_learning_rate(label, best[model])
    measure = compute_multiple(labels[claim.baseline]) if claim.measure.across is not None else claim.measure
    return dataclasses.replace(claim, variant=labels[claim.variant], baseline=labels[claim.baseline], measure=measure)


def on_seeds(rung: CompareResults, seeds: Sequence[int]) -> CompareResults:
    """``rung`` with only ``seeds``' runs: the shared rate judged on the seeds the own rates ran."""
    kept = {
        label: dataclasses.replace(found, runs=[run for run in found.runs if run.seed in seeds])
        for label, found in rung.variants.items()
    }
    return dataclasses.replace(rung, variants=kept)


def check_learning_rates(
    verdicts: Sequence[Verdict], shared: Ladder, own: Ladder, best: Mapping[str, float]
) -> list[Verdict]:
    """Every decided or inconclusive language-model verdict re-judged at the largest size with each model at its
    own best rate (``own``: the ladder whose rungs hold the models at their best multiples) and at the shared rate
    (``shared``, restricted to the seeds ``own`` ran there), each at the raw 5% level of one size; **LR-sensitive**
    where the two outcomes differ and both were judged. The others keep their verdicts, the check's result added to
    the reason. An exploratory claim whose models' best are all ×1 is the same without a re-judging: the runs it
    was judged on, at whichever size, are the runs at each model's own rate. Not checked where no sweep ran a
    model, or where the largest size did not train a model at its own rate."""
    checked = []
    for verdict in verdicts:
        claim = verdict.claim
        if claim.measure.task is not None or verdict.outcome not in (*DECIDED, "inconclusive"):
            checked.append(verdict)
            continue
        at_own = own_lr_claim(claim, best)
        if isinstance(at_own, str):
            checked.append(_noted(verdict, f"not checked at each model's own best learning rate: {at_own}"))
            continue
        if not claim.primary and (at_own.variant, at_own.baseline) == (claim.variant, claim.baseline):
            swept = " and ".join(_swept_models_of(claim))
            checked.append(
                _noted(verdict, f"the same at each model's own best learning rate: the sweep's best for {swept} is ×1")
            )
            continue
        theirs = judge_largest(at_own, own)
        if isinstance(theirs, str):
            checked.append(
                _noted(
                    verdict,
                    f"not checked at each model's own best learning rate ({at_own.variant} against "
                    f"{at_own.baseline}) at the largest size: {theirs}",
                )
            )
            continue
        seeds = _seeds(own, at_own)
        ours = judge_largest(claim, Ladder(tuple(on_seeds(rung, seeds) for rung in shared.rungs)))
        rates = ", ".join(f"{model} ×{best[model]:g}" for model in _swept_models_of(claim))
        if isinstance(ours, str) or not (ours.judged and theirs.judged):
            why = ours if isinstance(ours, str) else f"{ours.outcome} at the shared rate, {theirs.outcome} at its own"
            checked.append(_noted(verdict, f"the learning-rate check was not judged on both sides ({why})"))
            continue
        both = f"at the shared rate {ours.describe()}; at each model's own best ({rates}) {theirs.describe()}"
        if ours.outcome == theirs.outcome:
            checked.append(_noted(verdict, f"the same at each model's own best learning rate: {both}"))
        else:
            checked.append(
                dataclasses.replace(
                    verdict,
                    outcome="LR-sensitive",
                    reason=f"the verdict at the largest size changes with the learning rate, seeds {seeds}: {both}; "
                    f"as judged at the shared rate: {verdict.outcome}: {verdict.reason}",
                    would_change="a sweep that finds one rate best for every model, or more seeds at each model's own",
                )
            )
    return checked


def swept_models(rung: CompareResults, multiples: Sequence[float] = LR_MULTIPLES) -> list[str]:
    """The models ``rung`` holds at every multiple of the sweep (a learning-rate sweep merged into the ladder's
    rung as its part, :func:`attnzoo.results.ladder.merge_parts`)."""
    return [
        label
        for label in rung.variants
        if at_learning_rate(label, 1.0) == label and all(at_learning_rate(label, m) in rung.variants for m in multiples)
    ]


def sweep_of(ladder: Ladder) -> CompareResults | None:
    """The learning-rate sweep at the ladder's smallest size: its parts together (:class:`~attnzoo.results.ladder.
    RungPart`) where any holds a multiple other than ×1, else the rung itself where it holds every multiple; None
    where neither does. A sweep stored as parts is read off the parts alone, never the rung's own ×1 runs: those
    may come from another machine, and one seed retrained on another CPU ends some hundredths of a nat apart, as
    much as the multiples differ by."""
    smallest = ladder.rungs[0]
    parts = [part.results for part in ladder.parts if part.rung == smallest.preset]
    if any(Variant.parse(label).lr != 1 for part in parts for label in part.variants):
        together = merge_parts(parts[0], parts[1:])
        multiples = {label for label in together.variants if Variant.parse(label).lr != 1}
        if not swept_models(together):
            raise ValueError(
                f"the learning-rate sweep's parts hold {sorted(multiples)} but no model at every multiple "
                f"{LR_MULTIPLES}: a sweep trains its own ×1 runs, on its own machine"
            )
        return together
    return smallest if swept_models(smallest) else None


def with_learning_rate_check(verdicts: Sequence[Verdict], ladder: Ladder) -> list[Verdict]:
    """``verdicts`` checked at each model's own best learning rate where the ladder holds a sweep at its smallest
    size (:func:`sweep_of`), the best multiples read there and the models at them at the largest size; as they are
    where it holds none."""
    sweep = sweep_of(ladder)
    if sweep is None:
        return list(verdicts)
    return check_learning_rates(verdicts, ladder, ladder, best_learning_rates([sweep], swept_models(sweep)))


def _seeds(ladder: Ladder, claim: Claim) -> list[int]:
    """The seeds the claim's variant and baseline both ran at the ladder's largest size."""
    rung = ladder.largest
    ran = [{run.seed for run in rung.variants[label].runs} for label in (claim.variant, claim.baseline)]
    return sorted(ran[0] & ran[1])


def _noted(verdict: Verdict, note: str) -> Verdict:
    return dataclasses.replace(verdict, reason=f"{verdict.reason}; {note}")
