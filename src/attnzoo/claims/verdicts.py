"""One verdict per registered claim, reached by rules fixed before the run: the papers' own protocol.

A claim is measured at every model size of the ladder that ran it (:class:`~attnzoo.results.ladder.Ladder`; one
comparison is a ladder of one size). In order, the first that applies:

1. **not run**: no size trained what the claim needs (a variant, a task, a GPU preset); or **not measurable** for a
   claim that a committed calibration shows no CPU size can measure (``Claim.cpu_calibration``), when every size
   ran on a CPU.
2. **not measurable**: the largest size that ran it fails the claim's gate (for a language model: the budget, the
   end state, the gap's stability or the models' competence, :class:`~attnzoo.claims.gates.LanguageModelGate`;
   for a task: the baseline did not learn it), or a run diverged; or, for a paper's primary language-model claim,
   fewer than two sizes 2× apart passed their gates. The levels reached are reported beside it.
   On one rung of a ladder (:func:`~attnzoo.results.ladder.ladder_of`), a paper's primary language-model claim is
   **decided in the ladder** instead: the ladder's report judges it across the sizes, and the rung's points there,
   with this size's own result beside it, so that no rung's report contradicts its ladder's.
3. **inconclusive**: fewer than :data:`MIN_SEEDS` seeds, or no spread to form an interval from.
4. **scale-dependent**: two sizes each decide the claim on their own, in opposite directions (each size's effect is
   shown). **LR-sensitive** (:mod:`attnzoo.claims.learning_rate`, where a learning-rate sweep ran): a verdict
   that differs at the largest size between the shared learning rate and each model at its own best one.
5. At the largest size, by the rules of :mod:`attnzoo.claims.rules`, with the paired difference
   ``variant − baseline`` (:mod:`attnzoo.stats`) and its 90% interval, for a directional claim: **supported** or
   **contradicted** when the interval lies beyond ± the smallest effect of interest δ on the claimed or the
   opposite side (the one-sided minimum-effect test at 5%, its p Holm-adjusted for a primary claim);
   **negligible** when it lies inside ±δ (two one-sided tests at 5%); **inconclusive** otherwise, including a
   difference shown to be nonzero but not shown to exceed δ. For a non-inferiority claim (the variant no worse
   than the baseline by more than the margin δ): **supported** when the interval's upper end is below the margin,
   **contradicted** when its lower end is above it (each the one-sided test at 5% on the estimate's side,
   Holm-adjusted for a primary); else **inconclusive**.

Each size is measured, and the sizes read together, by :mod:`attnzoo.claims.sizes`. A claim whose statement has
several parts (a spikier map *with* a smaller norm; the same perplexity, 11% faster *and* with 11% less memory)
measures each (:mod:`attnzoo.claims.parts`), each decided on its own at the raw 5% level, and holds only as a whole:
**contradicted** when any part is; else **negligible** when any part is; **supported** when every part is; else the
verdict of its first undecided part (its own measure first). A bench part has no seeds: it
is decided on the range of its timed repeats (the speed) or on one peak each (the memory), beyond ±δ in ln of the
ratio.

The primaries, one per paper, always form the family that Holm's procedure corrects: a primary not judged on this
run enters it with p = 1, so the correction never depends on which claims happened to be measurable, and a primary
of several parts with the largest of its parts' p (the intersection–union test). Every other claim is exploratory
and says so. :func:`verdicts_record` writes the verdicts as data (``verdicts.json``), a record like every other
(:func:`attnzoo.records.to_dict`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from attnzoo.claims.claim import CLAIMS, Claim
from attnzoo.claims.gates import Gate, GatePart
from attnzoo.claims.learning_rate import with_learning_rate_check
from attnzoo.claims.parts import judge_parts, with_parts
from attnzoo.claims.rules import EQUIVALENCE_CONFIDENCE, MIN_SEEDS, OUTCOMES
from attnzoo.claims.sizes import measure, settle
from attnzoo.claims.verdict import PartVerdict, Verdict
from attnzoo.records import to_dict
from attnzoo.results.ladder import Ladder, as_ladder, parameters
from attnzoo.stats import CONFIDENCE, PairedDifference, holm

if TYPE_CHECKING:
    from attnzoo.results.comparison import CompareResults

# What the comparison's report reads from here: the verdicts' outcomes and their threshold of seeds beside them.
__all__ = ["MIN_SEEDS", "OUTCOMES", "Verdict", "counts", "format_p", "judge", "judge_all", "verdicts_record"]


def judge_all(results: CompareResults | Ladder) -> list[Verdict]:
    """Every registered claim's verdict, in registration order, the primaries Holm-corrected together, and checked at
    each model's own best learning rate where the ladder holds a sweep."""
    ladder = as_ladder(results)
    verdicts = [measure(claim, ladder) for claim in CLAIMS.values()]
    judged_parts = [judge_parts(claim, ladder) for claim in CLAIMS.values()]
    family = [i for i, v in enumerate(verdicts) if v.claim.primary]
    p_values = [_family_p(verdicts[i], judged_parts[i]) for i in family]
    for i, p in zip(family, holm(p_values), strict=True):
        if verdicts[i].pending:
            verdicts[i] = dataclasses.replace(verdicts[i], p_adjusted=p)
    judged = [with_parts(settle(v) if v.pending else v, parts) for v, parts in zip(verdicts, judged_parts, strict=True)]
    return with_learning_rate_check(judged, ladder)


def judge(claim: Claim, results: CompareResults | Ladder) -> Verdict:
    """One claim's verdict on its own: a primary is then a family of one (its adjusted p is its raw p)."""
    ladder = as_ladder(results)
    verdict, parts = measure(claim, ladder), judge_parts(claim, ladder)
    if verdict.pending and claim.primary:
        verdict = dataclasses.replace(verdict, p_adjusted=_family_p(verdict, parts))
    return with_parts(settle(verdict) if verdict.pending else verdict, parts)


def _family_p(verdict: Verdict, parts: tuple[PartVerdict, ...]) -> float:
    """A primary's p in Holm's family: 1 where its own measure was not judged; else the largest of its parts' p,
    the intersection–union test of "every part holds" (a bench part has no p: it must hold on its own)."""
    if not verdict.pending:
        return 1.0
    assert verdict.p_raw is not None
    return max([verdict.p_raw, *(part.p_raw for part in parts if part.p_raw is not None)])


def counts(verdicts: list[Verdict]) -> dict[str, int]:
    return {outcome: sum(v.outcome == outcome for v in verdicts) for outcome in OUTCOMES}


def format_p(p: float | None) -> str:
    if p is None:
        return "—"
    return f"{p:.2g}" if p >= 1e-3 else "<0.001"


# ------------------------------------------------------------------------------------------------ the record
# JSON's own types: an outcome and a rule are their strings, so the file reads back by records.from_dict.


@dataclass(frozen=True)
class GateRecord:
    passed: bool
    reason: str
    levels: dict[str, float]
    parts: tuple[GatePart, ...]


@dataclass(frozen=True)
class SizeRecord:
    parameters: int
    head_dim: int
    task: str | None  # a task's claim: the task's own models, run beside this size
    outcome: str  # an Outcome
    reason: str
    effect: float | None
    interval90: tuple[float, float] | None
    p_raw: float | None
    levels: dict[str, float]
    gate: GateRecord | None


@dataclass(frozen=True)
class PartRecord:
    measure: str
    rule: str  # a Rule
    smallest_effect: float
    outcome: str  # an Outcome
    reason: str
    effect: float | None
    bounds: tuple[float, float] | None
    p_raw: float | None
    levels: dict[str, float]


@dataclass(frozen=True)
class ClaimRecord:
    id: str
    paper: str
    role: str
    outcome: str  # an Outcome
    reason: str
    variant: str
    baseline: str
    measure: str
    rule: str  # a Rule
    smallest_effect: float
    effect: float | None
    interval: tuple[float, float] | None  # the 95% interval
    interval90: tuple[float, float] | None  # the one the verdict was decided on
    per_seed_differences: tuple[float, ...] | None
    interval_method: str | None
    degrees_of_freedom: float | None
    p_raw: float | None
    p_adjusted: float | None
    levels: dict[str, float]
    gate: GateRecord | None
    sizes: tuple[SizeRecord, ...]
    parts: tuple[PartRecord, ...]
    conditions: str
    regime: dict[str, Any] | None
    paper_regime: str | None
    would_change: str


@dataclass(frozen=True)
class VerdictsRecord:
    """``verdicts.json``: every claim's verdict as data, so two runs can be diffed or gated on."""

    attnzoo_version: str
    results_created: tuple[str, ...]  # of each size's results, smallest first
    preset: str  # of the largest size
    sizes: tuple[int, ...]  # parameters of each size
    counts: dict[str, int]
    primaries_counts: dict[str, int]
    claims: tuple[ClaimRecord, ...]


def verdicts_record(results: CompareResults | Ladder, verdicts: list[Verdict]) -> dict[str, Any]:
    """The verdicts as JSON-ready values, derived from ``results`` alone."""
    ladder = as_ladder(results)
    largest = ladder.largest
    record = VerdictsRecord(
        attnzoo_version=largest.attnzoo_version,
        results_created=tuple(rung.created for rung in ladder.rungs),
        preset=largest.preset,
        sizes=tuple(parameters(rung) for rung in ladder.rungs),
        counts=counts(verdicts),
        primaries_counts=counts([v for v in verdicts if v.claim.primary]),
        claims=tuple(_claim_record(v) for v in verdicts),
    )
    return to_dict(record)


def _claim_record(v: Verdict) -> ClaimRecord:
    d = v.difference
    return ClaimRecord(
        id=v.claim.id,
        paper=v.claim.paper,
        role=v.role,
        outcome=v.outcome,
        reason=v.reason,
        variant=v.claim.variant,
        baseline=v.claim.baseline,
        measure=v.claim.measure.label,
        rule=v.claim.rule,
        smallest_effect=v.claim.smallest_effect,
        effect=d.mean if d else None,
        interval=_interval(d, CONFIDENCE),
        interval90=_interval(d, EQUIVALENCE_CONFIDENCE),
        per_seed_differences=tuple(d.per_seed) if d else None,
        interval_method=d.method if d else None,
        degrees_of_freedom=d.df if d else None,
        p_raw=v.p_raw,
        p_adjusted=v.p_adjusted,
        levels=v.levels,
        gate=_gate_record(v.gate),
        sizes=tuple(
            SizeRecord(
                parameters=s.parameters,
                head_dim=s.head_dim,
                task=s.task,
                outcome=s.outcome,
                reason=s.reason,
                effect=s.difference.mean if s.difference else None,
                interval90=_interval(s.difference, EQUIVALENCE_CONFIDENCE),
                p_raw=s.p_raw,
                levels=s.levels,
                gate=_gate_record(s.gate),
            )
            for s in v.sizes
        ),
        parts=tuple(
            PartRecord(
                measure=part.name,
                rule=part.part.rule,
                smallest_effect=part.part.smallest_effect,
                outcome=part.outcome,
                reason=part.reason,
                effect=part.effect,
                bounds=part.bounds,
                p_raw=part.p_raw,
                levels=part.levels,
            )
            for part in v.parts
        ),
        conditions=v.conditions,
        regime=v.regime.record() if v.regime else None,
        paper_regime=v.claim.paper_regime or None,
        would_change=v.would_change,
    )


def _gate_record(gate: Gate | None) -> GateRecord | None:
    return None if gate is None else GateRecord(gate.passed, gate.reason, gate.levels, gate.parts)


def _interval(difference: PairedDifference | None, confidence: float) -> tuple[float, float] | None:
    return difference.interval(confidence) if difference is not None and difference.has_spread else None
