"""The decision rules on their own (attnzoo.claims.rules), and the verdicts' record as a strict record."""

import json
from pathlib import Path

import pytest

from attnzoo.claims.claim import HIGHER, LOWER, NONINFERIOR
from attnzoo.claims.rules import decide, decide_range, p_value, seeds_to_decide, whole
from attnzoo.claims.verdicts import VerdictsRecord
from attnzoo.records import from_dict, to_dict
from attnzoo.stats import PairedDifference

DOCS = Path(__file__).parents[1] / "docs"


def difference(mean: float, se: float, seeds: int = 5) -> PairedDifference:
    return PairedDifference((mean,) * seeds, mean, se, seeds - 1, 1, "t")


def test_an_interval_beyond_delta_decides_the_side_and_holms_p_can_hold_it_back():
    d = difference(-0.5, 0.05)  # the 90% interval ≈ [-0.61, -0.39], far below -0.1
    p = p_value(LOWER, 0.1, d)
    assert p < 0.05
    assert decide(LOWER, 0.1, d, p, p)[0] == "supported"
    assert decide(HIGHER, 0.1, d, p, p)[0] == "contradicted"
    outcome, reason = decide(LOWER, 0.1, d, p, 0.2)  # raw p past 5%, the adjusted one not
    assert outcome == "inconclusive" and "not after Holm's adjustment" in reason


def test_an_interval_inside_delta_is_negligible_and_one_across_it_inconclusive():
    inside = difference(0.001, 0.01)
    assert decide(LOWER, 0.1, inside, p_value(LOWER, 0.1, inside), 1.0)[0] == "negligible"
    across = difference(0.1, 0.1)
    outcome, reason = decide(LOWER, 0.1, across, p_value(LOWER, 0.1, across), 1.0)
    assert outcome == "inconclusive" and "reaches past ±0.1" in reason


def test_noninferiority_is_decided_on_the_margins_side():
    within = difference(-0.2, 0.02)  # well below the margin 0.05
    p = p_value(NONINFERIOR, 0.05, within)
    outcome, reason = decide(NONINFERIOR, 0.05, within, p, p)
    assert outcome == "supported" and "upper end is below the margin 0.05" in reason
    worse = difference(0.3, 0.02)
    p = p_value(NONINFERIOR, 0.05, worse)
    assert decide(NONINFERIOR, 0.05, worse, p, p)[0] == "contradicted"


def test_seeds_to_decide_names_the_verdict_more_seeds_would_reach():
    d = difference(-0.3, 0.2, seeds=3)
    assert "would make it supported" in seeds_to_decide(LOWER, 0.1, "inconclusive", d)
    assert "would make it contradicted" in seeds_to_decide(HIGHER, 0.1, "inconclusive", d)
    assert seeds_to_decide(LOWER, 0.1, "supported", d).startswith("settled at this size with 3 seeds")


@pytest.mark.parametrize(
    ("rule", "low", "high", "expected"),
    [
        (HIGHER, 0.2, 0.3, "supported"),
        (LOWER, 0.2, 0.3, "contradicted"),
        (LOWER, -0.3, -0.2, "supported"),
        (HIGHER, -0.05, 0.05, "negligible"),
        (HIGHER, -0.05, 0.3, "inconclusive"),
    ],
)
def test_a_bench_range_is_decided_beyond_or_inside_delta(rule, low, high, expected):
    assert decide_range(rule, 0.1, low, high)[0] == expected


def test_a_claim_of_several_parts_holds_only_as_a_whole():
    assert whole(["supported", "contradicted", "negligible"]) == ("contradicted", "contradicted in part 2", None)
    assert whole(["supported", "negligible"])[0] == "negligible"
    assert whole(["supported", "supported"]) == ("supported", "every part supported", None)
    assert whole(["supported", "not run", "inconclusive"]) == (
        "not run",
        "part 2 is not run, so the whole claim is",
        1,
    )


@pytest.mark.parametrize("folder", ["claims", "claims/small", "claims/large", "claims-one-size"])
def test_a_stored_verdicts_file_is_a_verdicts_record(folder):
    """Written by records.to_dict, read back strictly: every key known, none missing, each of its type."""
    stored = json.loads((DOCS / folder / "verdicts.json").read_text())
    assert to_dict(from_dict(VerdictsRecord, stored)) == stored
