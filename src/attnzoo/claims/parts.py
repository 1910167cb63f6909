"""The further parts of a claim's statement, each decided on its own at the raw 5% level, and the claim as a whole.

A part measured over seeds is the claim with the part's measure, rule and δ (:class:`~attnzoo.claims.claim.Part`);
a bench part (:class:`~attnzoo.claims.claim.BenchPart`) has no seeds: it is decided on the range of its timed
repeats (the speed) or on one peak each (the memory), beyond ±δ in ln of the ratio. The claim holds only as a whole
(:func:`attnzoo.claims.rules.whole`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable

from attnzoo.claims.claim import BenchPart, Claim, Part
from attnzoo.claims.rules import DECIDED, EQUIVALENCE_CONFIDENCE, decide_range, whole
from attnzoo.claims.sizes import measure, settle
from attnzoo.claims.verdict import PartVerdict, Verdict
from attnzoo.results.ladder import Ladder


def judge_parts(claim: Claim, ladder: Ladder) -> tuple[PartVerdict, ...]:
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
    verdict = measure(alone, ladder)
    verdict = settle(verdict) if verdict.pending else verdict
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
    delta = part.smallest_effect
    shown = (
        f"{part.variant} at {part.variant_multiple}L {'trains at' if speed else 'peaks at'} {math.exp(effect):.3g}× "
        f"{part.baseline}'s at "
        f"{part.baseline_multiple}L ({spread}); ±δ is ×{math.exp(-delta):.3g}–{math.exp(delta):.3g}"
    )
    outcome, why = decide_range(part.rule, delta, low, high)
    return PartVerdict(
        part,
        outcome,
        f"{shown}: {why}",
        levels=levels,
        would_change="" if outcome in DECIDED else "more bench repeats (bench_repeats, bench_rounds)",
        effect=effect,
        bounds=(low, high),
    )


def _and(items: Iterable[str]) -> str:
    items = list(items)
    return ", ".join(items[:-1]) + " and " + items[-1] if len(items) > 1 else "".join(items)


def with_parts(verdict: Verdict, parts: tuple[PartVerdict, ...]) -> Verdict:
    """The whole claim from its parts (its own measure first), by :func:`~attnzoo.claims.rules.whole`, every part's
    outcome and reason listed in its reason."""
    if not parts:
        return verdict
    entries = [(verdict.claim.measure.label, verdict.outcome, verdict.reason, verdict.would_change)]
    entries += [(part.name, part.outcome, part.reason, part.would_change) for part in parts]
    listed = " ".join(f"({i}) {name}: {outcome}: {reason}." for i, (name, outcome, reason, _) in enumerate(entries, 1))
    outcome, head, first = whole([outcome for _, outcome, _, _ in entries])
    would_change = verdict.would_change if first is None else entries[first][3]
    return dataclasses.replace(
        verdict,
        outcome=outcome,
        reason=f"{len(entries)} parts, the claim holding only as a whole: {head}. {listed}",
        would_change=would_change,
        parts=parts,
    )
