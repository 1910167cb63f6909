"""A claim measured at each model size of a ladder, and read across the sizes to one verdict.

Each size decides the claim on its own at the raw 5% level (:func:`at_size`); :func:`measure` reads them together:
the largest size that ran it decides; a paper's primary language-model claim needs at least :data:`MIN_SIZES` sizes
:data:`MIN_SIZE_RATIO`× apart, and on one rung of a ladder is **decided in the ladder**; two sizes deciding in
opposite directions make it **scale-dependent**. A verdict measured and judged waits for the family's adjusted p,
and :func:`settle` decides it by the rules of :mod:`attnzoo.claims.rules`.
"""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING

import numpy as np

from attnzoo.claims.gates import DIVERGED
from attnzoo.claims.regime import Regime, regime_of, task_regime
from attnzoo.claims.rules import MIN_SEEDS, MIN_SIZE_RATIO, MIN_SIZES, decide, p_value, seeds_to_decide
from attnzoo.claims.verdict import SizeVerdict, Verdict
from attnzoo.results.ladder import Ladder, head_dim, ladder_of, parameters
from attnzoo.stats import ALPHA, PairedDifference, paired_over_seeds, paired_over_seeds_and_blocks

if TYPE_CHECKING:
    from attnzoo.claims.claim import Claim, Values
    from attnzoo.results.comparison import CompareResults


def measure(claim: Claim, ladder: Ladder) -> Verdict:
    sizes = [at_size(claim, ladder, rung) for rung in ladder.rungs] if claim.is_run else []
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
            # A size the ladder trained whose gates stopped it: the remedy is there, not a new size.
            stopped = [size for size in ran if not size.judged]
            at_stopped = "".join(
                f"; at {size.parameters / 1e6:.2f}M (head {size.head_dim}) {size.outcome}: {size.reason}"
                for size in stopped
            )
            return dataclasses.replace(
                verdict,
                outcome="not measurable",
                reason=f"(e) sizes: judged at {len(judged)} size(s) ({shown}){at_stopped}; a "
                f"paper's primary language-model claim is judged across at least {MIN_SIZES} sizes, the largest "
                f"≥ {MIN_SIZE_RATIO:g}× the smallest, as the papers judge it",
                would_change=(
                    f"the gates passing at {', '.join(f'{size.parameters / 1e6:.2f}M' for size in stopped)} (more "
                    "seeds or steps there)"
                    if stopped
                    else f"the same comparison at a second model size {MIN_SIZE_RATIO:g}× apart (a ladder of "
                    "comparisons, or a GPU rung)"
                ),
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
    return at_size(claim, ladder, ladder.largest)


def _regime(claim: Claim, ladder: Ladder, ran: list[SizeVerdict]) -> Regime | None:
    """The sizes a language-model claim was measured at, read off their rungs; a task's claim, its task's regime at
    the size that decides it."""
    if claim.measure.task is not None:
        deciding = next(rung for rung in ladder.rungs if parameters(rung) == ran[-1].parameters)
        return task_regime(deciding.tasks[claim.measure.task], [claim.baseline, claim.variant])
    sizes = {size.parameters for size in ran}
    return regime_of([rung for rung in ladder.rungs if parameters(rung) in sizes], [claim.variant, claim.baseline])


def at_size(claim: Claim, ladder: Ladder, rung: CompareResults) -> SizeVerdict | str:
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
    p_raw = p_value(claim.rule, claim.smallest_effect, difference)
    outcome, reason = decide(claim.rule, claim.smallest_effect, difference, p_raw, p_raw)
    return dataclasses.replace(size, outcome=outcome, reason=reason, p_raw=p_raw)


def _read(claim: Claim, ladder: Ladder, rung: CompareResults, label: str) -> Values | None:
    across = claim.measure.across
    return across(ladder, rung, label) if across is not None else claim.measure.read(rung, label)


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


def settle(verdict: Verdict) -> Verdict:
    """A pending verdict decided: at its adjusted p for a primary, at its raw p for an exploratory claim."""
    claim, difference = verdict.claim, verdict.difference
    assert difference is not None and verdict.p_raw is not None
    p = verdict.p_adjusted if claim.primary else verdict.p_raw
    assert p is not None
    outcome, reason = decide(claim.rule, claim.smallest_effect, difference, verdict.p_raw, p)
    p_text = f"p {verdict.p_raw:.3g}" + (f", Holm-adjusted {p:.3g}" if claim.primary else " (exploratory)")
    if len(verdict.sizes) > 1:
        reason += "; at the largest size, with " + "; ".join(size.describe() for size in verdict.sizes)
    # The level the raw p must reach for the adjusted one to reach 5%: Holm multiplies this p by p_adjusted / p_raw.
    level = ALPHA * verdict.p_raw / p if p > 0 else ALPHA
    return dataclasses.replace(
        verdict,
        outcome=outcome,
        reason=f"{reason}; {p_text}",
        would_change=seeds_to_decide(claim.rule, claim.smallest_effect, outcome, difference, level),
    )


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
