"""Paired statistics for variants trained on the same seeds and scored on the same text.

Seed k gives every variant the same data order, and every variant is scored on the same validation blocks, so
``variant − baseline`` is paired twice: by seed and by block. One difference per (seed, block) cell,
``d[s, b]``, is modelled as a two-way crossed random-effects design,

    d[s, b] = μ + a_s + c_b + e_sb,   a_s ~ (0, σ_a²), c_b ~ (0, σ_c²), e_sb ~ (0, σ_e²),

so the grand mean generalises to new seeds *and* new text: Var(mean) = σ_a²/S + σ_c²/B + σ_e²/(SB). The
components are estimated by the method of moments from the two-way ANOVA mean squares (negative estimates set
to zero), with Satterthwaite's degrees of freedom capped at seeds − 1; quantiles and p-values are Student t
(``scipy.stats.t``). The cap matters: with 3 seeds and 64 blocks Satterthwaite can reach 60 degrees of freedom
when the block term dominates, yet how much the seed term varies is still known from 3 values only.
With one value per seed (B = 1) this is exactly the paired t-test over seeds, ``scipy.stats.ttest_rel``.

Without the block term, a difference measured on one fixed validation set can look certain and then vanish on
another held-out set: the seeds do not sample the text.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats

CONFIDENCE = 0.95  # the interval every report shows
ALPHA = 1 - CONFIDENCE
SEEDS_ONLY = "paired t over seeds (scipy.stats.ttest_rel)"
SEEDS_AND_BLOCKS = (
    "seeds × validation blocks, crossed random effects: Var(mean) = σ²_seed/S + σ²_block/B + σ²_resid/(SB) from the "
    "two-way ANOVA mean squares, Satterthwaite degrees of freedom capped at seeds − 1, Student t (scipy.stats.t)"
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
class PairedDifference:
    """``variant − baseline``: its mean, standard error and degrees of freedom, and each seed's own difference."""

    per_seed: tuple[float, ...]
    mean: float
    se: float
    df: float
    blocks: int  # evaluation blocks per seed; 1 when only each seed's overall value is known
    method: str
    fixed_variance: float = 0.0  # the share of se² that more seeds do not shrink: σ²_block/B, the shared text

    @property
    def seeds(self) -> int:
        return len(self.per_seed)

    @property
    def has_spread(self) -> bool:
        return self.se > 0 and math.isfinite(self.df) and self.df > 0

    def interval(self, confidence: float = CONFIDENCE) -> tuple[float, float]:
        half = stats.t.ppf(0.5 + confidence / 2, self.df) * self.se
        return self.mean - half, self.mean + half

    def p_value(self, null: float = 0.0, alternative: str = "two-sided") -> float:
        """Of H0 "the true difference is ``null``": ``less`` and ``greater`` name the alternative's side."""
        t = (self.mean - null) / self.se
        if alternative == "less":
            return float(stats.t.cdf(t, self.df))
        if alternative == "greater":
            return float(stats.t.sf(t, self.df))
        return float(2 * stats.t.sf(abs(t), self.df))

    def p_beyond(self, effect: float) -> float:
        """The minimum-effect test on the estimate's side: of H0 "the true difference lies within ±``effect``"
        against "it lies beyond ``effect`` on the side the mean is on". Below 5% exactly when the 90% interval lies
        beyond ±``effect``."""
        if self.mean < 0:
            return self.p_value(null=-effect, alternative="less")
        return self.p_value(null=effect, alternative="greater")

    def seeds_needed(self, half_width: float, confidence: float = CONFIDENCE, most: int = 1000) -> int | None:
        """The fewest seeds whose interval's half-width falls below ``half_width`` at this spread, each n at its
        own n − 1 degrees of freedom (the block term, which more seeds do not shrink, is kept); None past ``most``.
        """
        if half_width <= 0:
            return None
        fixed = min(self.fixed_variance, self.se**2)
        seed_variance = (self.se**2 - fixed) * self.seeds  # the per-seed share, as σ²/n would give it
        for n in range(max(self.seeds, 2), most + 1):
            if stats.t.ppf(0.5 + confidence / 2, n - 1) * math.sqrt(fixed + seed_variance / n) < half_width:
                return n
        return None

    def format(self, digits: int = 4) -> str:
        if not self.has_spread:
            return f"{self.mean:+.{digits}f} (no interval)"
        low, high = self.interval()
        return f"{self.mean:+.{digits}f} [{low:+.{digits}f}, {high:+.{digits}f}]"


def paired_over_seeds(variant: Sequence[float], baseline: Sequence[float]) -> PairedDifference:
    """One value per seed and variant: the paired t statistics (``scipy.stats.ttest_rel``'s)."""
    if np.shape(variant) != np.shape(baseline):  # numpy would broadcast one seed against every other
        raise ValueError(f"expected one value per seed for both, got shapes {np.shape(variant)}, {np.shape(baseline)}")
    differences = np.asarray(variant, dtype=np.float64) - np.asarray(baseline, dtype=np.float64)
    if differences.ndim != 1 or len(differences) < 1:
        raise ValueError(f"expected one value per seed for both, got shapes {np.shape(variant)}, {np.shape(baseline)}")
    n = len(differences)
    se = float(differences.std(ddof=1) / math.sqrt(n)) if n > 1 else 0.0
    return PairedDifference(tuple(differences.tolist()), float(differences.mean()), se, n - 1, 1, SEEDS_ONLY)


def paired_over_seeds_and_blocks(variant: np.ndarray, baseline: np.ndarray) -> PairedDifference:
    """``(seeds, blocks)`` values of both, block b being the same text for every seed and variant."""
    if np.shape(variant) != np.shape(baseline):
        raise ValueError(f"expected (seeds, blocks) arrays of one shape, got {np.shape(variant)}, {np.shape(baseline)}")
    d = np.asarray(variant, dtype=np.float64) - np.asarray(baseline, dtype=np.float64)
    if d.ndim != 2:
        raise ValueError(f"expected (seeds, blocks) arrays, got shape {d.shape}")
    n_seeds, n_blocks = d.shape
    if n_blocks == 1:
        return paired_over_seeds(d[:, 0], np.zeros(n_seeds))
    mean = float(d.mean())
    seed_means, block_means = d.mean(axis=1), d.mean(axis=0)
    ms_seed = n_blocks * float(((seed_means - mean) ** 2).sum()) / max(n_seeds - 1, 1)
    ms_block = n_seeds * float(((block_means - mean) ** 2).sum()) / (n_blocks - 1)
    residual = d - seed_means[:, None] - block_means[None, :] + mean
    ms_resid = float((residual**2).sum()) / max((n_seeds - 1) * (n_blocks - 1), 1)
    per_seed = tuple(seed_means.tolist())
    if n_seeds < 2:
        return PairedDifference(per_seed, mean, 0.0, 0, n_blocks, SEEDS_AND_BLOCKS)
    # S·B·Var(mean) = max(0, MS_seed − MS_resid) + max(0, MS_block − MS_resid) + MS_resid: a component whose
    # estimate is negative is set to zero. Satterthwaite's df for that combination of mean squares.
    use_seed, use_block = ms_seed > ms_resid, ms_block > ms_resid
    terms = [
        (float(use_seed), ms_seed, n_seeds - 1),
        (float(use_block), ms_block, n_blocks - 1),
        (1.0 - use_seed - use_block, ms_resid, (n_seeds - 1) * (n_blocks - 1)),
    ]
    total = sum(weight * ms for weight, ms, _ in terms)
    spread = sum((weight * ms) ** 2 / df for weight, ms, df in terms if weight)
    df = min(total**2 / spread, n_seeds - 1) if spread > 0 else 0.0
    fixed = (ms_block - ms_resid) / (n_seeds * n_blocks) if use_block else 0.0  # σ²_block / B
    se = math.sqrt(total / (n_seeds * n_blocks))
    return PairedDifference(per_seed, mean, se, df, n_blocks, SEEDS_AND_BLOCKS, fixed)


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values (family-wise error control), in the input's order.

    The i-th smallest p is multiplied by (m − i + 1), then made monotone over the ordered list and capped at 1.
    """
    order = sorted(range(len(p_values)), key=lambda i: p_values[i])
    adjusted, running = [0.0] * len(p_values), 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (len(p_values) - rank) * p_values[i]))
        adjusted[i] = running
    return adjusted
