"""One verdict per registered claim, reached by rules fixed before the run.

In order, the first that applies:

1. **not run**: the comparison did not train what the claim needs (a variant, a task, a GPU preset).
2. **not measurable**: the validity gate failed: the baseline did not learn the task, or the loss had not
   flattened; or a run diverged (a NaN or infinite value). The levels reached are reported beside it.
3. **inconclusive**: fewer than :data:`MIN_SEEDS` seeds, or no spread to form an interval from.
4. For a directional claim, with the paired difference ``variant − baseline`` (:mod:`attnzoo.compare.stats`):
   **negligible** when its 90% interval lies inside ± the smallest effect of interest (two one-sided tests at
   5%); else **supported** or **contradicted** when the test of zero rejects at 5% in the claimed or the
   opposite direction and the estimate is at least the smallest effect, using the Holm-adjusted p for a primary
   claim and the raw p for an exploratory one; else **inconclusive** (a nonzero difference smaller than the
   smallest effect included: it is neither shown to matter nor shown negligible).
5. For a non-inferiority claim (the variant no worse than the baseline by more than the margin): **supported**
   when the one-sided test of "worse by the margin or more" rejects at 5% (the 90% interval's upper end is below
   the margin); **contradicted** when its lower end is above the margin; else **inconclusive**.

The primaries, one per paper, form the family that Holm's procedure corrects: those judged on this run (past
their gates, with an interval). Every other claim is exploratory and says so.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from attnzoo.compare.claims import CLAIMS, DIVERGED, LOWER, NONINFERIOR, Claim
from attnzoo.compare.stats import (
    ALPHA,
    CONFIDENCE,
    PairedDifference,
    holm,
    paired_over_seeds,
    paired_over_seeds_and_blocks,
)

if TYPE_CHECKING:
    from attnzoo.compare.claims import Gate
    from attnzoo.compare.results import CompareResults

Outcome = Literal["supported", "contradicted", "negligible", "inconclusive", "not measurable", "not run"]
OUTCOMES: tuple[Outcome, ...] = ("supported", "contradicted", "negligible", "inconclusive", "not measurable", "not run")
MIN_SEEDS = 3
EQUIVALENCE_CONFIDENCE = 1 - 2 * ALPHA  # two one-sided tests at 5% each: the 90% interval


@dataclass(frozen=True)
class Verdict:
    claim: Claim
    outcome: Outcome
    reason: str
    gate: Gate | None = None
    difference: PairedDifference | None = None
    p_raw: float | None = None  # of the claim's test: zero difference, or the margin for non-inferiority
    p_adjusted: float | None = None  # Holm over the primaries judged; None for an exploratory claim
    would_change: str = ""
    conditions: str = ""  # this test's scale: seeds, tokens or steps per run, parameters
    levels: dict[str, float] = dataclasses.field(default_factory=dict)  # means reached, and chance where defined

    @property
    def interval(self) -> tuple[float, float] | None:
        return self.difference.interval(CONFIDENCE) if self.difference and self.difference.has_spread else None

    @property
    def role(self) -> str:
        return "primary" if self.claim.primary else "exploratory"


def judge_all(results: CompareResults) -> list[Verdict]:
    """Every registered claim's verdict on ``results``, in registration order, the primaries Holm-corrected."""
    verdicts = [_measure(claim, results) for claim in CLAIMS.values()]
    family = [i for i, v in enumerate(verdicts) if v.claim.primary and v.p_raw is not None]
    adjusted = holm([verdicts[i].p_raw for i in family])  # type: ignore[misc]
    for i, p in zip(family, adjusted, strict=True):
        verdicts[i] = dataclasses.replace(verdicts[i], p_adjusted=p)
    return [_decide(v) if v.p_raw is not None else v for v in verdicts]


def judge(claim: Claim, results: CompareResults) -> Verdict:
    """One claim's verdict on its own: a primary is then a family of one (its adjusted p is its raw p)."""
    verdict = _measure(claim, results)
    if verdict.p_raw is not None and claim.primary:
        verdict = dataclasses.replace(verdict, p_adjusted=verdict.p_raw)
    return _decide(verdict) if verdict.p_raw is not None else verdict


def _measure(claim: Claim, results: CompareResults) -> Verdict:
    """Everything but the final decision, which waits for the family's adjusted p-values: a verdict with a raw p is
    still to be decided; any other is final."""
    if not claim.is_run:
        return Verdict(
            claim, "not run", f"no preset runs it yet: it needs {claim.experiment}", would_change="that experiment"
        )
    ours, theirs = claim.measure.read(results, claim.variant), claim.measure.read(results, claim.baseline)
    missing = [label for label, values in ((claim.variant, ours), (claim.baseline, theirs)) if values is None]
    missing = [label for label in claim.measure.trains if label not in results.variants] or missing
    if missing:
        gpu = " (a CUDA GPU)" if claim.needs_gpu else ""
        return Verdict(
            claim,
            "not run",
            f"needs {claim.measure.needs} for {' and '.join(missing)}, which this comparison did not run"
            + (f"; the {claim.preset} preset runs them on a GPU" if claim.needs_gpu else ""),
            would_change=f"run the {claim.preset} preset{gpu}",
        )
    assert ours is not None and theirs is not None
    seeds = sorted(ours.keys() & theirs.keys())  # paired by the seed's number: only the seeds both ran
    conditions = _conditions(claim, results, seeds)
    levels = _levels(claim, results, ours, theirs)
    gate = claim.gate.check(results, claim)

    def final(outcome: Outcome, reason: str, would_change: str, difference: PairedDifference | None = None) -> Verdict:
        return Verdict(
            claim, outcome, reason, gate, difference, would_change=would_change, conditions=conditions, levels=levels
        )

    if not gate.passed:
        remedy = gate.remedy or _what_would_measure(claim, gate.reason.endswith(DIVERGED))
        return final("not measurable", gate.reason, remedy)
    non_finite = [
        label
        for label, values in ((claim.variant, ours), (claim.baseline, theirs))
        if not all(math.isfinite(values[s]) for s in seeds)
    ]
    if non_finite:
        reason = f"{' and '.join(non_finite)} gave a non-finite {claim.measure.label} on some seed: {DIVERGED}"
        return final("not measurable", reason, _what_would_measure(claim, diverged=True))
    difference = _difference(claim, results, ours, theirs, seeds) if seeds else None
    if len(seeds) < MIN_SEEDS:
        reason = f"{len(seeds)} seed(s): an interval needs at least {MIN_SEEDS}"
        return final("inconclusive", reason, f"run at least {MIN_SEEDS} seeds (--seeds)", difference)
    assert difference is not None
    if not difference.has_spread:
        reason = (
            f"every seed gives the same difference ({difference.mean:+.4g}): with no spread no interval can be formed"
        )
        return final(
            "inconclusive", reason, "a measure that varies with the seed, or a check of why it does not", difference
        )
    if claim.rule == NONINFERIOR:
        p_raw = difference.p_value(null=claim.smallest_effect, alternative="less")
    else:
        p_raw = difference.p_value()
    return Verdict(claim, "inconclusive", "", gate, difference, p_raw, conditions=conditions, levels=levels)


def _difference(
    claim: Claim, results: CompareResults, ours: dict[int, float], theirs: dict[int, float], seeds: list[int]
) -> PairedDifference:
    if claim.measure.blocks is not None:
        ours_blocks = claim.measure.blocks(results, claim.variant)
        theirs_blocks = claim.measure.blocks(results, claim.baseline)
        if ours_blocks is not None and theirs_blocks is not None:
            return paired_over_seeds_and_blocks(
                np.stack([ours_blocks[s] for s in seeds]), np.stack([theirs_blocks[s] for s in seeds])
            )
    return paired_over_seeds([ours[s] for s in seeds], [theirs[s] for s in seeds])


def _decide(verdict: Verdict) -> Verdict:
    claim, difference = verdict.claim, verdict.difference
    assert difference is not None and verdict.p_raw is not None
    p = verdict.p_adjusted if claim.primary else verdict.p_raw
    assert p is not None
    delta = claim.smallest_effect
    low90, high90 = difference.interval(EQUIVALENCE_CONFIDENCE)
    interval90 = f"the 90% interval [{low90:+.4g}, {high90:+.4g}]"
    p_text = f"p {verdict.p_raw:.3g}" + (f", Holm-adjusted {p:.3g}" if claim.primary else " (exploratory)")
    if claim.rule == NONINFERIOR:
        if p < ALPHA:
            outcome, reason = "supported", f"the 90% interval's upper end {high90:+.4g} is below the margin {delta:g}"
        elif low90 > delta:
            outcome, reason = "contradicted", f"the 90% interval's lower end {low90:+.4g} is above the margin {delta:g}"
        elif high90 < delta:  # the raw test rejects; the Holm-adjusted one does not
            outcome, reason = (
                "inconclusive",
                f"the 90% interval's upper end {high90:+.4g} is below the margin {delta:g}, but not after Holm's "
                "adjustment",
            )
        else:
            outcome, reason = (
                "inconclusive",
                f"{interval90} crosses the margin {delta:g}",
            )
    elif -delta < low90 and high90 < delta:
        outcome = "negligible"
        reason = f"{interval90} lies inside ±{delta:g}, the smallest effect of interest"
    elif p < ALPHA and abs(difference.mean) < delta:
        # Real, but smaller than what the claim says matters: neither shown to matter nor shown negligible.
        outcome = "inconclusive"
        reason = (
            f"the difference {difference.mean:+.4g} is nonzero at 5% but smaller than the smallest effect of "
            f"interest {delta:g}, and {interval90} reaches past ±{delta:g}"
        )
    elif p < ALPHA:
        claimed = (difference.mean < 0) == (claim.rule == LOWER)
        outcome = "supported" if claimed else "contradicted"
        reason = "the difference is " + ("in the claimed direction" if claimed else "opposite to the claim")
    else:
        after = " after Holm's adjustment" if verdict.p_raw < ALPHA else ""
        outcome, reason = "inconclusive", f"the test of zero difference does not reject at 5%{after}"
    # The level the raw p must reach for the adjusted one to reach 5%: Holm multiplies this p by p_adjusted / p_raw.
    level = ALPHA * verdict.p_raw / p if p > 0 else ALPHA
    return dataclasses.replace(
        verdict,
        outcome=outcome,
        reason=f"{reason}; {p_text}",
        would_change=_would_change(claim, outcome, difference, level),
    )


def _would_change(claim: Claim, outcome: Outcome, difference: PairedDifference, level: float = ALPHA) -> str:
    """Sign-aware: which verdict more seeds would reach if the mean and spread held, and how many, each n at its own
    n − 1 degrees of freedom. ``level``: what the raw p must fall below for the claim's own test to reject (below
    5% for a primary held back by Holm's adjustment)."""
    n, mean, delta = difference.seeds, difference.mean, claim.smallest_effect
    if outcome in ("supported", "contradicted", "negligible"):
        return f"settled at this scale with {n} seeds; a larger model or more tokens may differ"
    if claim.rule == NONINFERIOR:
        if mean < delta:  # the one-sided test at ``level``: the (1 − 2·level) interval's upper end below the margin
            toward, needed = "supported", difference.seeds_needed(delta - mean, 1 - 2 * level)
        else:
            toward, needed = "contradicted", difference.seeds_needed(mean - delta, EQUIVALENCE_CONFIDENCE)
    elif abs(mean) < delta:
        toward = "negligible"
        needed = difference.seeds_needed(delta - abs(mean), EQUIVALENCE_CONFIDENCE)
    else:
        claimed = (mean < 0) == (claim.rule == LOWER)
        toward = "supported" if claimed else "contradicted"
        needed = difference.seeds_needed(abs(mean), 1 - level)
    if needed is None:
        return f"no feasible number of seeds at this spread: the effect {mean:+.3g} is too close to the boundary"
    block = " (the evaluation-text term does not shrink with seeds)" if difference.blocks > 1 else ""
    return f"about {needed} seeds would make it {toward} if the mean {mean:+.3g} and spread held{block}"


def _what_would_measure(claim: Claim, diverged: bool = False) -> str:
    if diverged:
        return "a training that does not diverge (a lower learning rate, or a check of why it did)"
    if claim.measure.task is not None:
        return "a task budget at which the baseline learns the task (more steps, or an easier configuration)"
    return "more training tokens, until the validation loss flattens (a longer run, or the GPU preset)"


def _levels(
    claim: Claim, results: CompareResults, ours: dict[int, float], theirs: dict[int, float]
) -> dict[str, float]:
    """The measure's mean over seeds for both, and the level of a uniform guess where the measure has one."""
    levels = {claim.baseline: float(np.mean(list(theirs.values()))), claim.variant: float(np.mean(list(ours.values())))}
    if claim.measure.task is not None:
        task = results.tasks[claim.measure.task]
        levels |= {
            name: value for name, value in (("chance", task.chance), ("solved", task.solved)) if value is not None
        }
    elif claim.measure.blocks is not None:  # the validation loss: a uniform guess over the vocabulary
        levels["chance"] = math.log(results.variants[claim.baseline].config["vocab_size"])
    return levels


def _conditions(claim: Claim, results: CompareResults, paired: list[int]) -> str:
    """This test's own scale, never the paper's: ``paired`` are the seeds both sides ran."""
    seeds = f"{len(paired)} seed(s)"
    if claim.measure.task is not None:
        task = results.tasks[claim.measure.task]
        run = task.runs[claim.variant][0]
        scale = f"{run.steps} steps, {run.tokens:,} tokens/run, {run.parameters / 1e6:.2f}M params"
        return f"{seeds}; task {task.name}: {scale}"
    budget, found = results.budget, results.variants[claim.variant]
    return (
        f"{seeds}; {found.runs[0].tokens:,} tokens/run at T={budget.seq_len}, {found.parameters / 1e6:.2f}M params, "
        f"{results.corpus.name}"
    )


def counts(verdicts: list[Verdict]) -> dict[str, int]:
    return {outcome: sum(v.outcome == outcome for v in verdicts) for outcome in OUTCOMES}


def verdicts_record(results: CompareResults, verdicts: list[Verdict]) -> dict[str, Any]:
    """The verdicts as JSON-ready values, derived from ``results`` alone, so two runs can be diffed or gated on."""
    rows = []
    for v in verdicts:
        d = v.difference
        interval = v.interval
        rows.append(
            {
                "id": v.claim.id,
                "paper": v.claim.paper,
                "role": v.role,
                "outcome": v.outcome,
                "reason": v.reason,
                "variant": v.claim.variant,
                "baseline": v.claim.baseline,
                "measure": v.claim.measure.label,
                "rule": v.claim.rule,
                "smallest_effect": v.claim.smallest_effect,
                "effect": d.mean if d else None,
                "interval": list(interval) if interval else None,
                "per_seed_differences": list(d.per_seed) if d else None,
                "interval_method": d.method if d else None,
                "p_raw": v.p_raw,
                "p_adjusted": v.p_adjusted,
                "levels": v.levels,
                "gate": {"passed": v.gate.passed, "reason": v.gate.reason, "levels": v.gate.levels} if v.gate else None,
                "conditions": v.conditions,
                "would_change": v.would_change,
            }
        )
    return {
        "attnzoo_version": results.attnzoo_version,
        "results_created": results.created,
        "preset": results.preset,
        "counts": counts(verdicts),
        "primaries_counts": counts([v for v in verdicts if v.claim.primary]),
        "claims": rows,
    }


def format_p(p: float | None) -> str:
    if p is None:
        return "—"
    return f"{p:.2g}" if p >= 1e-3 else "<0.001"
