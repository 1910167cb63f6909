import json
from pathlib import Path

import pytest
from benchmark_scripts import load_benchmark

from attnzoo.claims import CLAIMS
from attnzoo.compare.presets import LADDERS
from attnzoo.variants import count_parameters

STORED = Path(__file__).parents[1] / "benchmarks" / "results" / "sinusoidal_calibration.json"

calibration = load_benchmark("sinusoidal_calibration")


def test_every_ladder_rung_is_calibrated_at_its_own_budget_in_both_sinusoidal_layouts_beside_rope():
    planned = calibration.cells(toy=False)
    rungs = {rung.name: rung for rung in LADDERS["claims"].rungs}
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


def test_the_claims_called_not_measurable_on_the_cpu_rest_on_the_committed_calibration_of_every_cpu_ladder_rung():
    """Claim.cpu_calibration is a finding, not a default: the stored calibration has, at every CPU ladder rung's own
    size and tokens, every sinusoidal model above the trigram level, and every claim judged against a sinusoidal
    baseline cites it."""
    stored = json.loads(STORED.read_text())
    rungs = {rung.name: rung for rung in LADDERS["claims"].rungs}
    sinusoidal = [run for run in stored["runs"] if run["variant"] == "mha+sinusoidal"]
    assert not stored["toy"] and sorted({run["rung"] for run in sinusoidal}) == sorted(rungs)
    for run in sinusoidal:
        rung = rungs[run["rung"]]
        assert run["parameters"] == count_parameters(rung.baseline_config(256))
        assert run["tokens"] == rung.train.steps * rung.train.batch_size * rung.train.seq_len
        assert run["val_loss"] > run["trigram_level"], run
    against_sinusoidal = {c.id for c in CLAIMS.values() if c.baseline.startswith("mha+sinusoidal")}
    assert against_sinusoidal == {c.id for c in CLAIMS.values() if c.cpu_calibration}
    assert all("benchmarks/results/sinusoidal_calibration.md" in CLAIMS[i].cpu_calibration for i in against_sinusoidal)
