"""One verdict per registered claim, reached by rules fixed before the run: the papers' own protocol.

A claim is measured at every model size of the ladder that ran it (:class:`~attnzoo.results.ladder.Ladder`; one
comparison is a ladder of one size). In order, the first that applies:

1. **not run**: no size trained what the claim needs (a variant, a task, a GPU preset); or **not measurable** for a
   claim that a committed calibration shows no CPU size can measure (``Claim.cpu_calibration``), when every size
   ran on a CPU.
2. **not measurable**: the largest size that ran it fails the claim's gate (for a language model: the budget, the
   end state, the gap's stability or the models' competence, :class:`~attnzoo.claims.claim.LanguageModelGate`;
   for a task: the baseline did not learn it), or a run diverged; or, for a paper's primary language-model claim,
   fewer than two sizes 2× apart passed their gates. The levels reached are reported beside it.
   On one rung of a ladder (:func:`~attnzoo.results.ladder.ladder_of`), a paper's primary language-model claim is
   **decided in the ladder** instead: the ladder's report judges it across the sizes, and the rung's points there,
   with this size's own result beside it, so that no rung's report contradicts its ladder's.
3. **inconclusive**: fewer than :data:`MIN_SEEDS` seeds, or no spread to form an interval from.
4. **scale-dependent**: two sizes each decide the claim on their own, in opposite directions (each size's effect is
   shown). **LR-sensitive** (:mod:`attnzoo.claims.learning_rate`, where a learning-rate sweep ran): a primary
   whose verdict at the largest size differs between the shared learning rate and each model at its own best one.
5. At the largest size, with the paired difference ``variant − baseline`` (:mod:`attnzoo.stats`) and its
   90% interval, for a directional claim: **supported** or **contradicted** when the interval lies beyond ± the
   smallest effect of interest δ on the claimed or the opposite side (the one-sided minimum-effect test at 5%, its
   p Holm-adjusted for a primary claim); **negligible** when it lies inside ±δ (two one-sided tests at 5%);
   **inconclusive** otherwise, including a difference shown to be nonzero but not shown to exceed δ. For a
   non-inferiority claim (the variant no worse than the baseline by more than the margin δ): **supported** when
   the interval's upper end is below the margin, **contradicted** when its lower end is above it (each the
   one-sided test at 5% on the estimate's side, Holm-adjusted for a primary); else **inconclusive**.

A claim whose statement has several parts (a spikier map *with* a smaller norm; the same perplexity, 11% faster
*and* with 11% less memory) measures each (:class:`~attnzoo.claims.claim.Part`,
:class:`~attnzoo.claims.claim.BenchPart`), each decided on its own at the raw 5% level, and holds only as a whole:
**contradicted** when any part is; else **negligible** when any part is; **supported** when every part is; else the
verdict of its first undecided part (its own measure first). A bench part has no seeds: it
is decided on the range of its timed repeats (the speed) or on one peak each (the memory), beyond ±δ in ln of the
ratio.

The primaries, one per paper, always form the family that Holm's procedure corrects: a primary not judged on this
run enters it with p = 1, so the correction never depends on which claims happened to be measurable, and a primary
of several parts with the largest of its parts' p (the intersection–union test). Every other claim is exploratory
and says so.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from attnzoo.claims.claim import CLAIMS, DIVERGED, LOWER, NONINFERIOR, BenchPart, Claim, Part
from attnzoo.claims.regime import Regime, regime_of
from attnzoo.results.ladder import Ladder, as_ladder, head_dim, ladder_of, parameters
from attnzoo.stats import (
    ALPHA,
    CONFIDENCE,
    PairedDifference,
    holm,
    paired_over_seeds,
    paired_over_seeds_and_blocks,
)

if TYPE_CHECKING:
    from attnzoo.claims.claim import Gate, Values
    from attnzoo.results.comparison import CompareResults

Outcome = Literal[
    "supported",
    "contradicted",
    "negligible",
    "scale-dependent",
    "LR-sensitive",
    "inconclusive",
    "decided in the ladder",
    "not measurable",
    "not run",
]
OUTCOMES: tuple[Outcome, ...] = (
    "supported",
    "contradicted",
    "negligible",
    "scale-dependent",
    "LR-sensitive",
    "inconclusive",
    "decided in the ladder",
    "not measurable",
    "not run",
)
MIN_SEEDS = 3
MIN_SIZES = 2  # a primary language-model claim is judged across at least this many sizes
MIN_SIZE_RATIO = 2.0  # the largest of them at least this many times the smallest
EQUIVALENCE_CONFIDENCE = 1 - 2 * ALPHA  # one-sided tests at 5% each: the 90% interval


@dataclass(frozen=True)
class SizeVerdict:
    """The claim at one model size, decided by that size alone at the raw 5% level."""

    parameters: int
    head_dim: int
    outcome: Outcome
    reason: str
    gate: Gate | None = None
    difference: PairedDifference | None = None
    p_raw: float | None = None  # of the claim's decisive test at this size
    conditions: str = ""
    levels: dict[str, float] = dataclasses.field(default_factory=dict)
    task: str | None = None  # a task's claim: its models are the task's own, run beside this size's

    @property
    def judged(self) -> bool:
        return self.p_raw is not None

    def describe(self) -> str:
        """The effect with the 90% interval the size was decided on, its verdict beside it."""
        d = self.difference
        if d is None:
            effect = "—"
        elif d.has_spread:
            low, high = d.interval(EQUIVALENCE_CONFIDENCE)
            effect = f"{d.mean:+.4f}, 90% [{low:+.4f}, {high:+.4f}]"
        else:
            effect = f"{d.mean:+.4f} (no interval)"
        size = f"{self.parameters / 1e6:.2f}M"
        where = f"task {self.task}, run with the {size} rung" if self.task else f"{size} (head {self.head_dim})"
        return f"{where}: {effect}, {self.outcome}"


DECIDED: tuple[Outcome, ...] = ("supported", "contradicted", "negligible")


@dataclass(frozen=True)
class PartVerdict:
    """A further part of a claim's statement, decided on its own at the raw 5% level. ``effect`` and ``bounds``: for
    a part measured over seeds, the paired difference's mean and 90% interval; for a bench part, ln of the ratio and
    the range of the timed repeats (one value for the memory)."""

    part: Part | BenchPart
    outcome: Outcome
    reason: str
    difference: PairedDifference | None = None
    p_raw: float | None = None
    levels: dict[str, float] = dataclasses.field(default_factory=dict)
    would_change: str = ""
    effect: float | None = None
    bounds: tuple[float, float] | None = None

    @property
    def name(self) -> str:
        return self.part.name


@dataclass(frozen=True)
class Verdict:
    claim: Claim
    outcome: Outcome
    reason: str
    gate: Gate | None = None  # at the deciding (largest) size
    difference: PairedDifference | None = None  # at the deciding size
    p_raw: float | None = None  # of the claim's test at the deciding size: beyond δ, or within the margin
    p_adjusted: float | None = None  # Holm over the primaries; None for an exploratory claim
    would_change: str = ""
    conditions: str = ""  # the deciding size's scale: seeds, tokens per run, parameters
    levels: dict[str, float] = dataclasses.field(default_factory=dict)  # means reached, and chance where defined
    sizes: tuple[SizeVerdict, ...] = ()  # every size that ran the claim, smallest first
    parts: tuple[PartVerdict, ...] = ()  # the statement's other parts; the outcome is the whole's
    regime: Regime | None = None  # the language-model sizes it was measured at; None for a task's claim or not run

    @property
    def interval(self) -> tuple[float, float] | None:
        """The 90% interval the verdict was decided on (the one-sided tests at 5%), shown beside it."""
        d = self.difference
        return d.interval(EQUIVALENCE_CONFIDENCE) if d and d.has_spread else None

    @property
    def role(self) -> str:
        return "primary" if self.claim.primary else "exploratory"


def judge_all(results: CompareResults | Ladder) -> list[Verdict]:
    """Every registered claim's verdict, in registration order, the primaries Holm-corrected together."""
    ladder = as_ladder(results)
    verdicts = [_measure(claim, ladder) for claim in CLAIMS.values()]
    judged_parts = [_judge_parts(claim, ladder) for claim in CLAIMS.values()]
    family = [i for i, v in enumerate(verdicts) if v.claim.primary]
    p_values = [_family_p(verdicts[i], judged_parts[i]) for i in family]
    for i, p in zip(family, holm(p_values), strict=True):
        if _pending(verdicts[i]):
            verdicts[i] = dataclasses.replace(verdicts[i], p_adjusted=p)
    return [
        _with_parts(_decide(v) if _pending(v) else v, parts) for v, parts in zip(verdicts, judged_parts, strict=True)
    ]


def judge(claim: Claim, results: CompareResults | Ladder) -> Verdict:
    """One claim's verdict on its own: a primary is then a family of one (its adjusted p is its raw p)."""
    ladder = as_ladder(results)
    verdict, parts = _measure(claim, ladder), _judge_parts(claim, ladder)
    if _pending(verdict) and claim.primary:
        verdict = dataclasses.replace(verdict, p_adjusted=_family_p(verdict, parts))
    return _with_parts(_decide(verdict) if _pending(verdict) else verdict, parts)


def _family_p(verdict: Verdict, parts: tuple[PartVerdict, ...]) -> float:
    """A primary's p in Holm's family: 1 where its own measure was not judged; else the largest of its parts' p,
    the intersection–union test of "every part holds" (a bench part has no p: it must hold on its own)."""
    if not _pending(verdict):
        return 1.0
    assert verdict.p_raw is not None
    return max([verdict.p_raw, *(part.p_raw for part in parts if part.p_raw is not None)])


def _pending(verdict: Verdict) -> bool:
    """Measured and waiting for the family's adjusted p: every other verdict is final."""
    return verdict.p_raw is not None and verdict.outcome == "inconclusive" and not verdict.reason


def _measure(claim: Claim, ladder: Ladder) -> Verdict:
    sizes = [_at_size(claim, ladder, rung) for rung in ladder.rungs] if claim.is_run else []
    ran = [size for size in sizes if not isinstance(size, str)]
    if not ran and claim.cpu_calibration and all(rung.machine.device == "cpu" for rung in ladder.rungs):
        unbuilt = "" if claim.is_run else f"; and no preset runs it yet: it needs {claim.experiment}"
        where = f"the {claim.preset} preset" if claim.needs_gpu else claim.experiment or "its runs"
        return Verdict(
            claim,
            "not measurable",
            f"on the CPU: {claim.cpu_calibration}{unbuilt}",
            would_change=f"{where} on a GPU, at a size the calibration finds competent",
        )
    if not claim.is_run:
        return Verdict(
            claim, "not run", f"no preset runs it yet: it needs {claim.experiment}", would_change="that experiment"
        )
    if not ran:
        gpu = " (a CUDA GPU)" if claim.needs_gpu else ""
        return Verdict(
            claim,
            "not run",
            str(sizes[-1]) + (f"; the {claim.preset} preset runs them on a GPU" if claim.needs_gpu else ""),
            would_change=f"run the {claim.preset} preset{gpu}",
        )
    deciding = ran[-1]
    regime = _regime(claim, ladder, ran)
    ladder_name = ladder_of(ladder.largest) if len(ladder.rungs) == 1 else None
    if claim.primary and claim.measure.task is None and ladder_name is not None:
        alone = deciding.describe() if deciding.judged else f"{deciding.outcome}: {deciding.reason}"
        return Verdict(
            claim,
            "decided in the ladder",
            f"a paper's primary language-model claim is decided across the sizes of the {ladder_name} ladder, in "
            f"its report (../report.md from this rung's folder), never at one rung; at this size alone: {alone}",
            deciding.gate,
            deciding.difference,
            conditions=deciding.conditions,
            levels=deciding.levels,
            sizes=(deciding,),
            would_change="nothing at this rung: the ladder's report has the verdict",
            regime=regime,
        )
    verdict = Verdict(
        claim,
        deciding.outcome,
        deciding.reason,
        deciding.gate,
        deciding.difference,
        conditions=deciding.conditions,
        levels=deciding.levels,
        sizes=tuple(ran),
        regime=regime,
    )
    if not deciding.judged:  # not measurable, or inconclusive for want of seeds or spread, at the largest size
        return dataclasses.replace(verdict, would_change=_remedy(claim, deciding))
    judged = [size for size in ran if size.judged]
    if claim.primary and claim.measure.task is None:
        spread = judged[-1].parameters / judged[0].parameters
        if len(judged) < MIN_SIZES or spread < MIN_SIZE_RATIO:
            shown = "; ".join(size.describe() for size in judged)
            return dataclasses.replace(
                verdict,
                outcome="not measurable",
                reason=f"(e) sizes: judged at {len(judged)} size(s) ({shown}); a "
                f"paper's primary language-model claim is judged across at least {MIN_SIZES} sizes, the largest "
                f"≥ {MIN_SIZE_RATIO:g}× the smallest, as the papers judge it",
                would_change=f"the same comparison at a second model size {MIN_SIZE_RATIO:g}× apart (a ladder of "
                "comparisons, or a GPU rung)",
            )
    directions = {size.outcome for size in judged} & {"supported", "contradicted"}
    if len(directions) > 1:
        return dataclasses.replace(
            verdict,
            outcome="scale-dependent",
            reason="sizes decide it in opposite directions: " + "; ".join(size.describe() for size in judged),
            p_raw=deciding.p_raw,
            would_change="a larger size, to see which way the effect goes as the model grows",
        )
    return dataclasses.replace(verdict, outcome="inconclusive", reason="", p_raw=deciding.p_raw)


def judge_largest(claim: Claim, ladder: Ladder) -> SizeVerdict | str:
    """The claim at the ladder's largest size alone, decided there at the raw 5% level (a string: why it did not
    run there)."""
    return _at_size(claim, ladder, ladder.largest)


def _regime(claim: Claim, ladder: Ladder, ran: list[SizeVerdict]) -> Regime | None:
    """The sizes a language-model claim was measured at, read off their rungs."""
    if claim.measure.task is not None:
        return None
    sizes = {size.parameters for size in ran}
    return regime_of([rung for rung in ladder.rungs if parameters(rung) in sizes], [claim.variant, claim.baseline])


def _at_size(claim: Claim, ladder: Ladder, rung: CompareResults) -> SizeVerdict | str:
    """The claim measured at one size and decided there at the raw 5% level; a string says why it did not run."""
    across = sum(claim.baseline in other.variants for other in ladder.rungs)
    if claim.measure.across is not None and across < MIN_SIZES and claim.variant in rung.variants:
        return SizeVerdict(
            parameters(rung),
            head_dim(rung),
            "not measurable",
            f"(e) sizes: {claim.measure.label} is read off {claim.baseline}'s loss against compute across at least "
            f"{MIN_SIZES} model sizes, and this ladder has {claim.baseline} at {across}",
            claim.gate.check(rung, claim),
            conditions=_conditions(claim, rung, []),
        )
    ours, theirs = _read(claim, ladder, rung, claim.variant), _read(claim, ladder, rung, claim.baseline)
    missing = [label for label, values in ((claim.variant, ours), (claim.baseline, theirs)) if values is None]
    missing = [label for label in claim.measure.trains if label not in rung.variants] or missing
    task = rung.tasks.get(claim.measure.task) if claim.measure.task is not None else None
    if missing and task is not None and all(label in task.runs for label in missing):
        return (
            f"the {task.name} task ran {' and '.join(missing)}, but these stored runs do not record "
            f"{claim.measure.label}: they were made before the task's probe recorded it, and a run of the task now "
            "would measure it"
        )
    if missing:
        return f"needs {claim.measure.needs} for {' and '.join(missing)}, which this comparison did not run"
    assert ours is not None and theirs is not None
    seeds = sorted(ours.keys() & theirs.keys())  # paired by the seed's number: only the seeds both ran
    size = SizeVerdict(
        parameters(rung),
        head_dim(rung),
        "inconclusive",
        "",
        claim.gate.check(rung, claim),
        conditions=_conditions(claim, rung, seeds),
        levels=_levels(claim, rung, ours, theirs),
        task=claim.measure.task,
    )
    if not size.gate.passed:  # type: ignore[union-attr]
        return dataclasses.replace(size, outcome="not measurable", reason=size.gate.reason)  # type: ignore[union-attr]
    non_finite = [
        label
        for label, values in ((claim.variant, ours), (claim.baseline, theirs))
        if not all(math.isfinite(values[s]) for s in seeds)
    ]
    if non_finite:
        reason = f"{' and '.join(non_finite)} gave a non-finite {claim.measure.label} on some seed: {DIVERGED}"
        return dataclasses.replace(size, outcome="not measurable", reason=reason)
    difference = _difference(claim, rung, ours, theirs, seeds) if seeds else None
    size = dataclasses.replace(size, difference=difference)
    if len(seeds) < MIN_SEEDS:
        return dataclasses.replace(size, reason=f"{len(seeds)} seed(s): an interval needs at least {MIN_SEEDS}")
    assert difference is not None
    if not difference.has_spread:
        reason = (
            f"every seed gives the same difference ({difference.mean:+.4g}): with no spread no interval can be formed"
        )
        return dataclasses.replace(size, reason=reason)
    p_raw = _p_value(claim, difference)
    outcome, reason = _outcome(claim, difference, p_raw, p_raw)
    return dataclasses.replace(size, outcome=outcome, reason=reason, p_raw=p_raw)


def _read(claim: Claim, ladder: Ladder, rung: CompareResults, label: str) -> Values | None:
    measure = claim.measure
    return measure.across(ladder, rung, label) if measure.across is not None else measure.read(rung, label)


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


def _p_value(claim: Claim, difference: PairedDifference) -> float:
    """Of the test that decides the claim, on the estimate's side: for non-inferiority, "worse by the margin or
    more" where the estimate is below the margin and "within the margin" where it is above; else the minimum-effect
    test "within ±δ" against "beyond δ on the estimate's side". So a primary is contradicted, as it is supported,
    only past Holm's adjustment."""
    if claim.rule == NONINFERIOR:
        below = difference.mean < claim.smallest_effect
        return difference.p_value(null=claim.smallest_effect, alternative="less" if below else "greater")
    return difference.p_beyond(claim.smallest_effect)


def _outcome(claim: Claim, difference: PairedDifference, p_raw: float, p: float) -> tuple[Outcome, str]:
    """The decision at one size: ``p`` is ``p_raw`` Holm-adjusted where the claim is a primary judged as a family."""
    delta = claim.smallest_effect
    low90, high90 = difference.interval(EQUIVALENCE_CONFIDENCE)
    interval90 = f"the 90% interval [{low90:+.4g}, {high90:+.4g}]"
    held_back = p_raw < ALPHA <= p
    if claim.rule == NONINFERIOR:
        end, side = ("upper", "below") if difference.mean < delta else ("lower", "above")
        if p < ALPHA:
            return (
                "supported" if side == "below" else "contradicted",
                f"{interval90}'s {end} end is {side} the margin {delta:g}",
            )
        if held_back:
            return (
                "inconclusive",
                f"{interval90}'s {end} end is {side} the margin {delta:g}, but not after Holm's adjustment",
            )
        return "inconclusive", f"{interval90} crosses the margin {delta:g}"
    if p < ALPHA:
        claimed = (difference.mean < 0) == (claim.rule == LOWER)
        side = f"below −{delta:g}" if difference.mean < 0 else f"above +{delta:g}"
        verdict: Outcome = "supported" if claimed else "contradicted"
        return verdict, f"{interval90} lies {side}, " + ("the claimed side" if claimed else "opposite to the claim")
    if -delta < low90 and high90 < delta:
        return "negligible", f"{interval90} lies inside ±{delta:g}, the smallest effect of interest"
    if held_back:
        return "inconclusive", f"{interval90} lies beyond ±{delta:g}, but not after Holm's adjustment"
    if difference.p_value() < ALPHA:
        return "inconclusive", (
            f"the difference {difference.mean:+.4g} is nonzero at 5%, but {interval90} is not shown to lie beyond "
            f"±{delta:g}, the smallest effect of interest"
        )
    return "inconclusive", f"{interval90} includes zero and reaches past ±{delta:g}"


def _decide(verdict: Verdict) -> Verdict:
    claim, difference = verdict.claim, verdict.difference
    assert difference is not None and verdict.p_raw is not None
    p = verdict.p_adjusted if claim.primary else verdict.p_raw
    assert p is not None
    outcome, reason = _outcome(claim, difference, verdict.p_raw, p)
    p_text = f"p {verdict.p_raw:.3g}" + (f", Holm-adjusted {p:.3g}" if claim.primary else " (exploratory)")
    if len(verdict.sizes) > 1:
        reason += "; at the largest size, with " + "; ".join(size.describe() for size in verdict.sizes)
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
    5% for a primary held back by Holm's adjustment); a one-sided test at ``level`` is the (1 − 2·level) interval."""
    n, mean, delta = difference.seeds, difference.mean, claim.smallest_effect
    if outcome in ("supported", "contradicted", "negligible"):
        return f"settled at this size with {n} seeds; a larger model or more tokens may differ"
    if claim.rule == NONINFERIOR:
        if mean < delta:
            toward, needed = "supported", difference.seeds_needed(delta - mean, 1 - 2 * level)
        else:
            toward, needed = "contradicted", difference.seeds_needed(mean - delta, EQUIVALENCE_CONFIDENCE)
    elif abs(mean) < delta:
        toward = "negligible"
        needed = difference.seeds_needed(delta - abs(mean), EQUIVALENCE_CONFIDENCE)
    else:
        claimed = (mean < 0) == (claim.rule == LOWER)
        toward = "supported" if claimed else "contradicted"
        needed = difference.seeds_needed(abs(mean) - delta, 1 - 2 * level)
    if needed is None:
        return f"no feasible number of seeds at this spread: the effect {mean:+.3g} is too close to the boundary"
    block = " (the evaluation-text term does not shrink with seeds)" if difference.blocks > 1 else ""
    return f"about {needed} seeds would make it {toward} if the mean {mean:+.3g} and spread held{block}"


def _remedy(claim: Claim, size: SizeVerdict) -> str:
    """What would let a claim that stopped short of a decision at its largest size reach one."""
    if size.outcome == "inconclusive":
        return f"run at least {MIN_SEEDS} seeds (--seeds)" if "seed(s)" in size.reason else "a measure that varies"
    if size.reason.endswith(DIVERGED):
        return "a training that does not diverge (a lower learning rate, or a check of why it did)"
    if size.gate is not None and size.gate.remedy:
        return size.gate.remedy
    if claim.measure.task is not None:
        return "a task budget at which the baseline learns the task (more steps, or an easier configuration)"
    return "a budget that meets the language-model protocol (see the gate's parts)"


def _levels(
    claim: Claim, results: CompareResults, ours: dict[int, float], theirs: dict[int, float]
) -> dict[str, float]:
    """The measure's mean over seeds for both, what else the measure shows of each, and the level of a uniform guess
    where the measure has one."""
    levels = {claim.baseline: float(np.mean(list(theirs.values()))), claim.variant: float(np.mean(list(ours.values())))}
    if claim.measure.levels is not None:
        for label in (claim.baseline, claim.variant):
            levels |= {f"{label}: {name}": value for name, value in claim.measure.levels(results, label).items()}
    if claim.measure.task is not None:
        task = results.tasks[claim.measure.task]
        levels |= {
            name: value for name, value in (("chance", task.chance), ("solved", task.solved)) if value is not None
        }
    elif claim.measure.blocks is not None and claim.measure.label.startswith("validation loss"):
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
        f"{seeds}; {found.runs[0].tokens:,} tokens/run at T={budget.seq_len}, {found.parameters / 1e6:.2f}M params "
        f"(head size {head_dim(results)}), {results.corpus.name}"
    )


# ------------------------------------------------------------------------------------------------ the parts


def _judge_parts(claim: Claim, ladder: Ladder) -> tuple[PartVerdict, ...]:
    return tuple(
        _judge_bench(part, ladder) if isinstance(part, BenchPart) else _judge_part(claim, part, ladder)
        for part in claim.parts
    )


def _judge_part(claim: Claim, part: Part, ladder: Ladder) -> PartVerdict:
    """A part measured over seeds: the claim with the part's measure, rule and δ, decided at the raw 5% level."""
    alone = dataclasses.replace(
        claim,
        measure=part.measure,
        rule=part.rule,
        smallest_effect=part.smallest_effect,
        smallest_effect_source=part.smallest_effect_source,
        primary=False,
        experiment="",
        parts=(),
    )
    verdict = _measure(alone, ladder)
    verdict = _decide(verdict) if _pending(verdict) else verdict
    d = verdict.difference
    bounds = d.interval(EQUIVALENCE_CONFIDENCE) if d and d.has_spread else None
    if part.fixed_by_task and d is not None:  # measured where it cannot differ: reported, not judged
        shown = f"measured {d.mean:+.4g}" + (f", 90% [{bounds[0]:+.4g}, {bounds[1]:+.4g}]" if bounds else "")
        return PartVerdict(
            part,
            "not measurable",
            f"{part.fixed_by_task} ({shown}: reported, not judged)",
            d,
            levels=verdict.levels,
            would_change="the same measure on a task whose target leaves it free",
            effect=d.mean,
            bounds=bounds,
        )
    return PartVerdict(
        part,
        verdict.outcome,
        verdict.reason,
        d,
        verdict.p_raw,
        verdict.levels,
        verdict.would_change,
        d.mean if d else None,
        bounds,
    )


def _judge_bench(part: BenchPart, ladder: Ladder) -> PartVerdict:
    """A bench part at the largest size: ln(variant's ÷ baseline's), decided beyond ±δ on the range of every timed
    repeat (the slowest against the fastest, both ways) for the speed, on the one peak each for the memory."""
    rung = ladder.largest
    length = rung.budget.seq_len
    speed = part.quantity == "speed"
    unit = "tokens/s" if speed else "peak MB"
    benched = {(m.variant, m.seq_len): m for m in rung.bench.measurements if m.mode == part.mode}
    levels = {
        f"{label} at {seq_len:,} ({unit})": m.timing.tokens_per_s if speed else m.timing.peak_mem_mb
        for (label, seq_len), m in sorted(benched.items(), key=lambda item: (item[0][0] != part.variant, item[0][1]))
        if label in (part.variant, part.baseline) and m.timing is not None
    }
    wanted = ((part.variant, part.variant_multiple), (part.baseline, part.baseline_multiple))
    for label, multiple in wanted:
        found = benched.get((label, multiple * length))
        if found is not None and found.timing is not None:
            continue
        lengths = sorted(seq for (other, seq), m in benched.items() if other == label and m.timing is not None)
        cases = sorted({seq // length for (_, seq) in benched if seq % length == 0})
        if not benched:
            why = f"the {rung.preset} preset ran no {part.mode!r} bench (its bench_cases hold none)"
        elif not lengths:
            why = f"the bench measured no {label}"
        else:
            why = (
                f"the bench measured {label} at {_and(f'{seq:,}' for seq in lengths)} tokens, the {rung.preset} "
                f"preset's bench cases being {_and(f'{c}×' for c in cases)} the training length"
            )
        unavailable = f" ({found.unavailable})" if found is not None and found.unavailable else ""
        return PartVerdict(
            part,
            "not run",
            f"no {part.mode!r} bench of {label} at {multiple}L = {multiple * length:,} tokens{unavailable}: {why}, "
            "so this part is not measured",
            levels=levels,
            would_change=f"a bench case ({part.mode!r}, {multiple}) in the preset's bench_cases",
        )
    ours = benched[part.variant, part.variant_multiple * length].timing
    theirs = benched[part.baseline, part.baseline_multiple * length].timing
    assert ours is not None and theirs is not None
    if speed and (ours.busy or theirs.busy):
        load = max(ours.load_average or 0, theirs.load_average or 0)
        return PartVerdict(
            part,
            "not measurable",
            f"the bench measured it on a busy machine (load average {load:.2f} on {ours.cores} cores): its speeds "
            "are unreliable",
            levels=levels,
            would_change="a bench on an idle machine",
        )
    if speed:
        effect = math.log(ours.tokens_per_s / theirs.tokens_per_s)
        low, high = (
            math.log(ours.tokens_per_s_min / theirs.tokens_per_s_max),
            math.log(ours.tokens_per_s_max / theirs.tokens_per_s_min),
        )
        spread = f"the repeats' range {math.exp(low):.3g}–{math.exp(high):.3g}×"
    else:
        if ours.peak_mem_mb <= 0 or theirs.peak_mem_mb <= 0:
            return PartVerdict(
                part,
                "not measurable",
                "a peak memory of 0 or less was recorded",
                levels=levels,
                would_change="a bench whose peak memory is measured",
            )
        effect = low = high = math.log(ours.peak_mem_mb / theirs.peak_mem_mb)
        spread = "one peak each: no interval"
    delta, sign = part.smallest_effect, -1 if part.rule == LOWER else 1
    claimed_low, claimed_high = sorted((sign * low, sign * high))  # on the claimed side: above +δ
    shown = (
        f"{part.variant} at {part.variant_multiple}L {'trains at' if speed else 'peaks at'} {math.exp(effect):.3g}× "
        f"{part.baseline}'s at "
        f"{part.baseline_multiple}L ({spread}); ±δ is ×{math.exp(-delta):.3g}–{math.exp(delta):.3g}"
    )
    outcome: Outcome
    if claimed_low > delta:
        outcome, why = "supported", "beyond δ on the claimed side"
    elif claimed_high < -delta:
        outcome, why = "contradicted", "beyond δ on the side opposite to the claim"
    elif -delta < low and high < delta:
        outcome, why = "negligible", "inside ±δ"
    else:
        outcome, why = "inconclusive", "reaching across ±δ"
    return PartVerdict(
        part,
        outcome,
        f"{shown}: {why}",
        levels=levels,
        would_change="" if outcome in DECIDED else "more bench repeats (bench_repeats, bench_rounds)",
        effect=effect,
        bounds=(low, high),
    )


def _and(items) -> str:
    items = list(items)
    return ", ".join(items[:-1]) + " and " + items[-1] if len(items) > 1 else "".join(items)


def _with_parts(verdict: Verdict, parts: tuple[PartVerdict, ...]) -> Verdict:
    """The whole claim from its parts: contradicted when any part is; else negligible when any part is (the claimed
    effect is absent there); supported when every part is; else its first undecided part's verdict (its own measure
    first)."""
    if not parts:
        return verdict
    entries = [(verdict.claim.measure.label, verdict.outcome, verdict.reason, verdict.would_change)]
    entries += [(part.name, part.outcome, part.reason, part.would_change) for part in parts]
    listed = " ".join(f"({i}) {name}: {outcome}: {reason}." for i, (name, outcome, reason, _) in enumerate(entries, 1))
    outcomes = [outcome for _, outcome, _, _ in entries]
    would_change = verdict.would_change
    outcome: Outcome
    decisive = next((o for o in ("contradicted", "negligible") if o in outcomes), None)
    if decisive is not None:  # one part shown false, or shown absent, is the whole claim's
        outcome = decisive
        head = f"{decisive} in part " + ", ".join(str(i) for i, o in enumerate(outcomes, 1) if o == decisive)
    elif all(o == "supported" for o in outcomes):
        outcome, head = "supported", "every part supported"
    else:
        first = next(i for i, o in enumerate(outcomes) if o not in DECIDED)
        outcome, would_change = outcomes[first], entries[first][3]
        head = f"part {first + 1} is {outcome}, so the whole claim is"
    return dataclasses.replace(
        verdict,
        outcome=outcome,
        reason=f"{len(entries)} parts, the claim holding only as a whole: {head}. {listed}",
        would_change=would_change,
        parts=parts,
    )


def counts(verdicts: list[Verdict]) -> dict[str, int]:
    return {outcome: sum(v.outcome == outcome for v in verdicts) for outcome in OUTCOMES}


def _gate_record(gate: Gate | None) -> dict[str, Any] | None:
    if gate is None:
        return None
    return {
        "passed": gate.passed,
        "reason": gate.reason,
        "levels": gate.levels,
        "parts": [{"name": p.name, "passed": p.passed, "detail": p.detail} for p in gate.parts],
    }


def _interval(difference: PairedDifference | None, confidence: float) -> list[float] | None:
    return list(difference.interval(confidence)) if difference is not None and difference.has_spread else None


def verdicts_record(results: CompareResults | Ladder, verdicts: list[Verdict]) -> dict[str, Any]:
    """The verdicts as JSON-ready values, derived from ``results`` alone, so two runs can be diffed or gated on."""
    ladder = as_ladder(results)
    rows = []
    for v in verdicts:
        d = v.difference
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
                "interval": _interval(d, CONFIDENCE),
                "interval90": _interval(d, EQUIVALENCE_CONFIDENCE),
                "per_seed_differences": list(d.per_seed) if d else None,
                "interval_method": d.method if d else None,
                "degrees_of_freedom": d.df if d else None,
                "p_raw": v.p_raw,
                "p_adjusted": v.p_adjusted,
                "levels": v.levels,
                "gate": _gate_record(v.gate),
                "sizes": [
                    {
                        "parameters": s.parameters,
                        "head_dim": s.head_dim,
                        **({"task": s.task} if s.task else {}),  # the task's own models, run beside this size
                        "outcome": s.outcome,
                        "reason": s.reason,
                        "effect": s.difference.mean if s.difference else None,
                        "interval90": _interval(s.difference, EQUIVALENCE_CONFIDENCE),
                        "p_raw": s.p_raw,
                        "levels": s.levels,
                        "gate": _gate_record(s.gate),
                    }
                    for s in v.sizes
                ],
                "parts": [
                    {
                        "measure": part.name,
                        "rule": part.part.rule,
                        "smallest_effect": part.part.smallest_effect,
                        "outcome": part.outcome,
                        "reason": part.reason,
                        "effect": part.effect,
                        "bounds": list(part.bounds) if part.bounds else None,
                        "p_raw": part.p_raw,
                        "levels": part.levels,
                    }
                    for part in v.parts
                ],
                "conditions": v.conditions,
                "regime": v.regime.record() if v.regime else None,
                "paper_regime": v.claim.paper_regime or None,
                "would_change": v.would_change,
            }
        )
    largest = ladder.largest
    return {
        "attnzoo_version": largest.attnzoo_version,
        "results_created": [rung.created for rung in ladder.rungs],
        "preset": largest.preset,
        "sizes": [parameters(rung) for rung in ladder.rungs],
        "counts": counts(verdicts),
        "primaries_counts": counts([v for v in verdicts if v.claim.primary]),
        "claims": rows,
    }


def format_p(p: float | None) -> str:
    if p is None:
        return "—"
    return f"{p:.2g}" if p >= 1e-3 else "<0.001"
