"""Seed statistics: mean ± std over seeds, and when a difference between two variants is within seed noise.

At the sizes a CPU trains, variants differ by a few hundredths of a nat, about as much as two seeds of one
variant do (eval_protocols.md §7.4), so every claimed difference must clear the seed noise. The rule is
deliberately conservative and stated in every report (:data:`NOISE_RULE`).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

NOISE_RULE = (
    "A difference between two variants counts as beyond seed noise only if |Δmean| ≥ 2 × the pooled standard "
    "deviation over seeds AND the min–max ranges over seeds do not overlap; otherwise it is within seed noise. "
    "With fewer than 2 seeds per variant no verdict is given, and variants are never ranked."
)


@dataclass(frozen=True)
class Summary:
    """One metric over seeds. ``std`` is the sample standard deviation (n − 1), None for a single seed."""

    n: int
    mean: float
    std: float | None
    min: float
    max: float

    @classmethod
    def of(cls, values: Sequence[float]) -> Summary:
        if not values:
            raise ValueError("a summary needs at least one value")
        std = statistics.stdev(values) if len(values) > 1 else None
        return cls(len(values), statistics.fmean(values), std, min(values), max(values))

    def format(self, digits: int = 3) -> str:
        if self.std is None:
            return f"{self.mean:.{digits}f} (1 seed)"
        return f"{self.mean:.{digits}f} ± {self.std:.{digits}f}"


@dataclass(frozen=True)
class Difference:
    """``variant − baseline`` in one metric, with the :data:`NOISE_RULE` verdict."""

    delta: float
    pooled_std: float | None  # None with fewer than 2 seeds on either side
    ranges_overlap: bool

    @property
    def within_noise(self) -> bool | None:
        """True or False by the rule; None when there are too few seeds to say."""
        if self.pooled_std is None:
            return None
        return abs(self.delta) < 2 * self.pooled_std or self.ranges_overlap

    @property
    def verdict(self) -> str:
        return {None: "no verdict (1 seed)", True: "within seed noise", False: "beyond seed noise"}[self.within_noise]

    def format(self, digits: int = 3) -> str:
        return f"{self.delta:+.{digits}f} ({self.verdict})"


def pooled_std(a: Summary, b: Summary) -> float | None:
    """√(((n_a − 1)·s_a² + (n_b − 1)·s_b²) / (n_a + n_b − 2)); None unless both have 2 or more seeds."""
    if a.std is None or b.std is None:
        return None
    return math.sqrt(((a.n - 1) * a.std**2 + (b.n - 1) * b.std**2) / (a.n + b.n - 2))


def difference(variant: Summary, baseline: Summary) -> Difference:
    overlap = variant.min <= baseline.max and baseline.min <= variant.max
    return Difference(variant.mean - baseline.mean, pooled_std(variant, baseline), overlap)


@dataclass(frozen=True)
class Ranked:
    label: str
    summary: Summary
    versus_best: Difference | None  # None for the best itself


def rank(summaries: Mapping[str, Summary], higher_is_better: bool = False) -> list[Ranked] | None:
    """Variants best first by mean, each judged against the best by the noise rule; None if any has 1 seed.

    Variants within noise of the best are not worse than it by this evidence: the order among them is
    only the order of the means.
    """
    if any(s.std is None for s in summaries.values()):
        return None
    order = sorted(summaries, key=lambda label: summaries[label].mean, reverse=higher_is_better)
    best = summaries[order[0]]
    return [
        Ranked(label, summaries[label], difference(summaries[label], best) if i else None)
        for i, label in enumerate(order)
    ]
