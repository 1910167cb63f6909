"""The decision rules, fixed before any run: pure functions of a claim's rule, its smallest effect of interest δ and
what was measured, so each can be read, and tested, on its own.

For a directional claim: **supported** or **contradicted** when the 90% interval of ``variant − baseline`` lies
beyond ±δ on the claimed or the opposite side (the one-sided minimum-effect test at 5%), **negligible** when it lies
inside ±δ (two one-sided tests at 5%), **inconclusive** otherwise. For a non-inferiority claim: **supported** when
the interval's upper end is below the margin δ, **contradicted** when its lower end is above it. A bench part is
decided on the range of its repeats in ln of the ratio, and a claim of several parts holds only as a whole.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from attnzoo.claims.claim import LOWER, NONINFERIOR, Rule
from attnzoo.stats import ALPHA, PairedDifference

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
DECIDED: tuple[Outcome, ...] = ("supported", "contradicted", "negligible")
MIN_SEEDS = 3
MIN_SIZES = 2  # a primary language-model claim is judged across at least this many sizes
MIN_SIZE_RATIO = 2.0  # the largest of them at least this many times the smallest
EQUIVALENCE_CONFIDENCE = 1 - 2 * ALPHA  # one-sided tests at 5% each: the 90% interval
_DECISIVE: tuple[Outcome, ...] = ("contradicted", "negligible")  # one part so decides the whole claim


def p_value(rule: Rule, delta: float, difference: PairedDifference) -> float:
    """Of the test that decides the claim, on the estimate's side: for non-inferiority, "worse by the margin or
    more" where the estimate is below the margin and "within the margin" where it is above; else the minimum-effect
    test "within ±δ" against "beyond δ on the estimate's side". So a primary is contradicted, as it is supported,
    only past Holm's adjustment."""
    if rule == NONINFERIOR:
        below = difference.mean < delta
        return difference.p_value(null=delta, alternative="less" if below else "greater")
    return difference.p_beyond(delta)


def decide(rule: Rule, delta: float, difference: PairedDifference, p_raw: float, p: float) -> tuple[Outcome, str]:
    """The outcome and its reason: ``p`` is ``p_raw`` Holm-adjusted where the claim is a primary judged as a
    family."""
    low90, high90 = difference.interval(EQUIVALENCE_CONFIDENCE)
    interval90 = f"the 90% interval [{low90:+.4g}, {high90:+.4g}]"
    held_back = p_raw < ALPHA <= p
    if rule == NONINFERIOR:
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
        claimed = (difference.mean < 0) == (rule == LOWER)
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


def seeds_to_decide(
    rule: Rule, delta: float, outcome: Outcome, difference: PairedDifference, level: float = ALPHA
) -> str:
    """Sign-aware: which verdict more seeds would reach if the mean and spread held, and how many, each n at its own
    n − 1 degrees of freedom. ``level``: what the raw p must fall below for the claim's own test to reject (below
    5% for a primary held back by Holm's adjustment); a one-sided test at ``level`` is the (1 − 2·level) interval."""
    n, mean = difference.seeds, difference.mean
    if outcome in DECIDED:
        return f"settled at this size with {n} seeds; a larger model or more tokens may differ"
    if rule == NONINFERIOR:
        if mean < delta:
            toward, needed = "supported", difference.seeds_needed(delta - mean, 1 - 2 * level)
        else:
            toward, needed = "contradicted", difference.seeds_needed(mean - delta, EQUIVALENCE_CONFIDENCE)
    elif abs(mean) < delta:
        toward = "negligible"
        needed = difference.seeds_needed(delta - abs(mean), EQUIVALENCE_CONFIDENCE)
    else:
        claimed = (mean < 0) == (rule == LOWER)
        toward = "supported" if claimed else "contradicted"
        needed = difference.seeds_needed(abs(mean) - delta, 1 - 2 * level)
    if needed is None:
        return f"no feasible number of seeds at this spread: the effect {mean:+.3g} is too close to the boundary"
    block = " (the evaluation-text term does not shrink with seeds)" if difference.blocks > 1 else ""
    return f"about {needed} seeds would make it {toward} if the mean {mean:+.3g} and spread held{block}"


def decide_range(rule: Rule, delta: float, low: float, high: float) -> tuple[Outcome, str]:
    """A bench part, from the range ``[low, high]`` of ln(variant's ÷ baseline's) over its repeats (one value for a
    peak memory): beyond ±δ on the claimed or the opposite side, inside ±δ, or reaching across it."""
    sign = -1 if rule == LOWER else 1
    claimed_low, claimed_high = sorted((sign * low, sign * high))  # on the claimed side: above +δ
    if claimed_low > delta:
        return "supported", "beyond δ on the claimed side"
    if claimed_high < -delta:
        return "contradicted", "beyond δ on the side opposite to the claim"
    if -delta < low and high < delta:
        return "negligible", "inside ±δ"
    return "inconclusive", "reaching across ±δ"


def whole(outcomes: Sequence[Outcome]) -> tuple[Outcome, str, int | None]:
    """A claim of several parts from its parts' outcomes (its own measure first): contradicted when any part is;
    else negligible when any part is (the claimed effect is absent there); supported when every part is; else its
    first undecided part's outcome. With the outcome: its reason's head, and the index of the part whose remedy is the
    whole's (None: the claim's own)."""
    decisive = next((o for o in _DECISIVE if o in outcomes), None)
    if decisive is not None:  # one part shown false, or shown absent, is the whole claim's
        parts = ", ".join(str(i) for i, o in enumerate(outcomes, 1) if o == decisive)
        return decisive, f"{decisive} in part {parts}", None
    if all(o == "supported" for o in outcomes):
        return "supported", "every part supported", None
    first = next(i for i, o in enumerate(outcomes) if o not in DECIDED)
    return outcomes[first], f"part {first + 1} is {outcomes[first]}, so the whole claim is", first
