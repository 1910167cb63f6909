"""The audit of the stored claims ladder (issue 53, point 5): each defect it found, shown on a stored run or on
constructed records, and shown mended."""

from pathlib import Path

import numpy as np
import pytest

from attnzoo.claims.claim import CLAIMS, _mean_gap
from attnzoo.claims.report import brief_table, verdict_table
from attnzoo.claims.verdicts import judge_all
from attnzoo.results import CompareResults
from attnzoo.results.ladder import load_ladder

LADDER = Path(__file__).parents[1] / "docs" / "claims"
LARGE = LADDER / "large" / "results.json"


@pytest.fixture(scope="module")
def large() -> CompareResults:
    return CompareResults.load(LARGE)


def _at(run, fraction: float) -> float:
    steps = run.steps
    return dict(run.val_curve)[round(fraction * steps)]


@pytest.mark.parametrize("fraction", [0.5, 0.75, 1.0])
def test_two_uptrained_models_are_compared_at_matched_points_of_their_budgets(large, fraction):
    """MQA and GQA uptrained over the same 5% of the steps: MQA's gap to GQA at 50% of its uptraining is read
    against GQA at 50% of its own, not against GQA's end (+0.246 at 50% read that way, +0.158 matched)."""
    claim = CLAIMS["gqa.mqa_behind_gqa"]
    mqa, gqa = large.variants[claim.variant].runs, large.variants[claim.baseline].runs
    matched = np.mean([_at(m, fraction) - _at(g, fraction) for m, g in zip(mqa, gqa, strict=True)])
    assert _mean_gap(large, claim, fraction) == pytest.approx(matched, abs=1e-12)


def test_an_uptrained_model_is_still_set_against_the_end_of_the_run_it_continues(large):
    """GQA uptrained from MHA: at 50% of its uptraining it is compared with MHA's end, where it started from."""
    claim = CLAIMS["gqa.uptrained_close_to_mha"]
    gqa, mha = large.variants[claim.variant].runs, large.variants[claim.baseline].runs
    expected = np.mean([_at(g, 0.5) - _at(m, 1.0) for g, m in zip(gqa, mha, strict=True)])
    assert _mean_gap(large, claim, 0.5) == pytest.approx(expected, abs=1e-12)


@pytest.fixture(scope="module")
def ladder_verdicts():
    return {v.claim.id: v for v in judge_all(load_ladder(LADDER)[0])}


def test_every_interval_printed_beside_a_verdict_is_the_90_percent_one_it_was_decided_on(ladder_verdicts):
    """A 95% interval beside a verdict decided on the 90% one misreads: "−0.5910 [−1.0004, −0.1817], contradicted"
    looks as if it reached inside δ."""
    verdict = ladder_verdicts["dcmha.compute_equivalence"]
    for size in verdict.sizes:
        low, high = size.difference.interval(0.90)
        assert f"90% [{low:+.4f}, {high:+.4f}]" in size.describe()
    low, high = verdict.difference.interval(0.90)
    assert verdict.interval == (low, high)
    table = brief_table(list(ladder_verdicts.values())).to_markdown()
    row = next(line for line in table.splitlines() if "`dcmha.compute_equivalence`" in line)
    assert f"[{low:+.4g}, {high:+.4g}]" in row and "effect [90% interval, as decided]" in table
    assert "95%" not in table and "95%" not in verdict_table(list(ladder_verdicts.values())).to_markdown()
