import json

import pytest
from benchmark_scripts import load_benchmark

from attnzoo.compare.spec import LADDERS

calibration = load_benchmark("sinusoidal_calibration")


def test_every_ladder_rung_is_calibrated_at_its_own_budget_in_both_sinusoidal_layouts_beside_rope():
    planned = calibration.cells(toy=False)
    rungs = {rung.name: rung for rung in LADDERS["ladder"].rungs}
    assert [(rung, layout) for rung, layout, _ in planned] == [
        (rung, layout) for rung in rungs for layout in ("rope", "sinusoidal", "sinusoidal, fairseq layout")
    ]
    for rung, layout, spec in planned:
        ladder_rung = rungs[rung]
        assert spec.train == ladder_rung.train and spec.seeds == (0,) and not spec.tasks
        assert {k: v for k, v in spec.model.items() if k != "scale_embeddings"} == ladder_rung.model
        assert spec.model["scale_embeddings"] == (layout == "sinusoidal, fairseq layout")
        assert spec.variant_labels == ["mha+rope" if layout == "rope" else "mha+sinusoidal"]


@pytest.mark.slow
def test_the_toy_calibration_reads_each_runs_loss_against_the_trigram_level(tmp_path):
    results = tmp_path / "calibration"
    assert calibration.main(["--toy", "--jobs", "1", "--out", str(tmp_path / "runs"), "--results", str(results)]) == 0
    written = json.loads(results.with_suffix(".json").read_text())
    assert written["toy"] and len(written["runs"]) == 6
    for run in written["runs"]:
        assert run["beats_trigram"] == (run["val_loss"] < run["trigram_level"])
    assert "Conclusion: " in results.with_suffix(".md").read_text()
