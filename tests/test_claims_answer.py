"""The answer first: a claims report opens with each paper's primary claim and its loss-against-compute picture."""

import math
import re
from pathlib import Path

import pytest

from attnzoo.claims import CLAIMS
from attnzoo.compare.plots import _multiple, _power_law

DOCS = Path(__file__).parents[1] / "docs"
PRIMARIES = [claim for claim in CLAIMS.values() if claim.primary]


def _headings(text: str) -> list[str]:
    return re.findall(r"^## (.+)$", text, flags=re.MULTILINE)


def test_the_ladders_report_opens_with_the_primaries_and_a_picture_per_paper_that_trained():
    text = (DOCS / "claims" / "report.md").read_text()
    assert _headings(text)[:3] == ["The answer", "The sizes", "Uptraining by fraction"]
    answer = text.split("## The sizes")[0]
    rows = [line for line in answer.splitlines() if line.startswith("| ") and "`" in line]
    assert [re.search(r"`([a-z_.]+)`", row)[1] for row in rows] == [claim.id for claim in PRIMARIES]
    for claim in PRIMARIES:
        picture = f"plots/compute_{claim.id}.png"
        if claim.variant == "mha+alibi":  # ALiBi trains at one size, its sinusoidal baseline at none: said, not drawn
            assert picture not in answer and f"No picture for {claim.paper} ({claim.baseline})" in answer
            assert not (DOCS / "claims" / picture).exists()
        else:
            assert f"]({picture})" in answer and (DOCS / "claims" / picture).is_file()
    assert "0.12–0.25M parameters, heads ≤ 24" in answer  # the regime beside each decided verdict


@pytest.mark.parametrize("folder", ["claims-one-size", "claims/small"])
def test_a_single_comparisons_claims_report_opens_with_the_primaries(folder):
    text = (DOCS / folder / "report.md").read_text()
    assert _headings(text)[:2] == ["The answer", "The papers' claims"]
    answer = text.split("## The papers' claims")[0]
    assert all(f"`{claim.id}`" in answer for claim in PRIMARIES)


def test_the_compute_multiple_is_read_off_the_baselines_power_law():
    fit = _power_law([(1e12, 2.0), (4e12, 2.0 * 4**-0.1)])  # L = 2·(C/1e12)^-0.1
    assert fit is not None and fit[1] == pytest.approx(-0.1)
    assert _multiple(fit, 1e12, 2.0) == pytest.approx(1.0)  # on the line: the same compute
    assert _multiple(fit, 1e12, 2.0 * 2**-0.1) == pytest.approx(2.0)  # MHA needs twice the compute for that loss
    assert _multiple(fit, 4e12, 2.0) == pytest.approx(0.25)  # a variant that needs 4× MHA's compute
    assert _power_law([(1e12, 2.0), (1e12, 1.9)]) is None and math.isfinite(fit[0])
