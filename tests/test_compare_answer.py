"""The main command says what it can: a run that decides no primary claim ends with the stored ladder's answer."""

import json
from pathlib import Path

from attnzoo.compare.progress import final_summary
from attnzoo.compare.stored_answer import REPRODUCE, stored_answer
from attnzoo.results import CompareResults

DOCS = Path(__file__).parents[1] / "docs"
PATHS = {"markdown": Path("out/report.md")}


def test_the_quick_run_ends_with_the_stored_ladders_primaries_and_the_command_that_reproduces_them():
    text = final_summary(CompareResults.load(DOCS / "compare-quick" / "results.json"), PATHS)
    assert "This quick run decides none of the papers' primary claims, by design" in text
    stored = json.loads((DOCS / "claims" / "verdicts.json").read_text())["claims"]
    primaries = [row for row in stored if row["role"] == "primary"]
    assert len(primaries) == 5
    lines = text.splitlines()
    for row in primaries:  # one line a paper, with the verdict the stored ladder reached
        [line] = [line for line in lines if line.startswith(f"  {row['paper']}: ")]
        assert row["outcome"] in line
        if row["outcome"] in ("supported", "contradicted", "negligible"):
            assert f"{row['effect']:+.4g}" in line and "at 0.12–0.25M parameters" in line  # the regime it holds in
    assert f"Reproduce it: {REPRODUCE}" in text
    assert lines[-1].startswith("report: ")  # where this run's own report is stays last


def test_without_the_repository_beside_the_package_it_says_where_the_answer_lives(tmp_path):
    lines = stored_answer("quick", root=tmp_path)
    assert lines[1] == "The stored claims ladder's answer is in the attnzoo repository's docs/claims/report.md."
    assert not any(line.startswith("  ") for line in lines) and lines[-1].startswith(f"Reproduce it: {REPRODUCE}")


def test_a_rung_whose_primaries_its_ladder_decides_does_not_repeat_the_stored_answer():
    text = final_summary(CompareResults.load(DOCS / "claims" / "large" / "results.json"), PATHS)
    assert "decides none of the papers' primary claims" not in text and REPRODUCE not in text
