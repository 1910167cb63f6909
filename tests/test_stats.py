"""The paired statistics the verdicts use: against scipy's own tests, and by simulation of the crossed design."""

import numpy as np
import pytest
from scipy import stats

from attnzoo.stats import (
    SEEDS_AND_BLOCKS,
    SEEDS_ONLY,
    Summary,
    paired_over_seeds,
    paired_over_seeds_and_blocks,
)


def test_seeds_only_is_scipys_paired_t_test():
    variant, baseline = [1.0, 1.3, 0.8, 1.25, 1.1], [1.2, 1.35, 1.0, 1.3, 1.4]
    ours, scipys = paired_over_seeds(variant, baseline), stats.ttest_rel(variant, baseline)
    interval = scipys.confidence_interval(0.95)
    assert ours.method == SEEDS_ONLY and ours.df == 4 and ours.blocks == 1
    assert ours.interval() == pytest.approx((interval.low, interval.high))
    assert ours.p_value() == pytest.approx(scipys.pvalue)
    assert ours.p_value(alternative="less") == pytest.approx(
        stats.ttest_rel(variant, baseline, alternative="less").pvalue
    )
    shifted = stats.ttest_rel(variant, [b + 0.1 for b in baseline], alternative="less").pvalue
    assert ours.p_value(null=0.1, alternative="less") == pytest.approx(shifted)


def test_one_block_is_the_seeds_only_test_and_no_spread_has_no_interval():
    rng = np.random.default_rng(0)
    variant, baseline = rng.normal(size=(4, 1)), rng.normal(size=(4, 1))
    blocks = paired_over_seeds_and_blocks(variant, baseline)
    seeds = paired_over_seeds(variant[:, 0], baseline[:, 0])
    assert (blocks.mean, blocks.se, blocks.df) == pytest.approx((seeds.mean, seeds.se, seeds.df))
    assert not paired_over_seeds([1.0, 2.0], [0.5, 1.5]).has_spread


def _coverage(simulations, seeds, blocks, sd_seed, sd_block, sd_resid, use_blocks):
    rng = np.random.default_rng(1234)
    covered = 0
    for _ in range(simulations):
        d = (
            0.3
            + rng.normal(0, sd_seed, (seeds, 1))
            + rng.normal(0, sd_block, (1, blocks))
            + rng.normal(0, sd_resid, (seeds, blocks))
        )
        if use_blocks:
            estimate = paired_over_seeds_and_blocks(d, np.zeros_like(d))
        else:
            estimate = paired_over_seeds(d.mean(axis=1), np.zeros(seeds))
        low, high = estimate.interval(0.95)
        covered += low <= 0.3 <= high
    return covered / simulations


@pytest.mark.parametrize(("sd_seed", "sd_block"), [(0.05, 0.05), (0.01, 0.05), (0.05, 0.005)])
def test_the_crossed_interval_covers_the_true_difference_at_its_level(sd_seed, sd_block):
    """Over new seeds and new text, the 95% interval of the crossed design holds 95% (to simulation error)."""
    assert 0.92 <= _coverage(600, 5, 32, sd_seed, sd_block, 0.05, use_blocks=True) <= 0.99


def test_seeds_alone_undercover_when_the_text_is_shared():
    """The reason for the block term: one fixed validation text makes every seed's difference share its error."""
    assert _coverage(600, 5, 32, 0.01, 0.05, 0.05, use_blocks=False) < 0.85
    assert paired_over_seeds_and_blocks(np.ones((3, 4)), np.zeros((3, 4))).method == SEEDS_AND_BLOCKS


def test_seeds_needed_uses_each_ns_own_degrees_of_freedom():
    d = paired_over_seeds([0.1, -0.05, 0.2, 0.0], [0.0, 0.0, 0.0, 0.0])
    n = d.seeds_needed(abs(d.mean))
    sd = d.se * 2  # √4 seeds
    assert stats.t.ppf(0.975, n - 1) * sd / np.sqrt(n) < abs(d.mean)
    assert stats.t.ppf(0.975, n - 2) * sd / np.sqrt(n - 1) >= abs(d.mean)
    assert d.seeds_needed(0.0) is None and d.seeds_needed(1e-9, most=50) is None


def test_summary_is_mean_and_sample_std():
    s = Summary.of([1.0, 2.0, 4.0])
    assert s.mean == pytest.approx(7 / 3) and s.std == pytest.approx(np.std([1, 2, 4], ddof=1))
    assert Summary.of([0.5]).format(2) == "0.50 (1 seed)"
    with pytest.raises(ValueError, match="at least one value"):
        Summary.of([])


def test_seeds_needed_keeps_the_block_term_that_more_seeds_do_not_shrink():
    """With the text shared by every seed, σ²_block/B stays whatever the seeds: a half-width below its own t-scaled
    square root cannot be reached by seeds, and any other needs more seeds than the seed term alone would."""
    rng = np.random.default_rng(3)
    d = 0.05 + rng.normal(0, 0.01, (4, 1)) + rng.normal(0, 0.05, (1, 16)) + rng.normal(0, 0.01, (4, 16))
    diff = paired_over_seeds_and_blocks(d, np.zeros_like(d))
    seed_means = paired_over_seeds(d.mean(axis=1), np.zeros(4))
    ms_block = 4 * ((d.mean(axis=0) - d.mean()) ** 2).sum() / 15
    resid = d - d.mean(axis=1, keepdims=True) - d.mean(axis=0, keepdims=True) + d.mean()
    ms_resid = (resid**2).sum() / (3 * 15)
    block_variance = max(0.0, ms_block - ms_resid) / (4 * 16)  # σ²_block / B
    assert block_variance > 0.5 * diff.se**2  # the text dominates here
    assert diff.seeds_needed(np.sqrt(block_variance), most=10_000) is None
    half = 2 * np.sqrt(block_variance)
    n = diff.seeds_needed(half)
    assert n is not None
    at_n = block_variance + (diff.se**2 - block_variance) * 4 / n
    assert stats.t.ppf(0.975, n - 1) * np.sqrt(at_n) < half
    assert n > seed_means.seeds_needed(half)
