"""benchmarks/task_lr_sweep.py: a task claim judged at the shared rate and at each model's own best rate."""

import math

import pytest
from benchmark_scripts import load_benchmark

from attnzoo.claims import CLAIMS
from attnzoo.claims.learning_rate import LR_MULTIPLES
from attnzoo.compare.presets import LADDERS

task_lr_sweep = load_benchmark("task_lr_sweep")
CLAIM = CLAIMS["selective.value_temperature_denoising"]  # lower excess MSE claimed for the variant, δ 0.005


def _metric(variant: dict[float, float], baseline: dict[float, float]) -> dict[str, dict[float, list[float]]]:
    """Five seeds per multiple, each ``value ± 0.001`` so that an interval forms."""
    spread = (-0.002, -0.001, 0.0, 0.001, 0.002)
    return {
        CLAIM.variant: {m: [variant[m] + e for e in spread] for m in LR_MULTIPLES},
        CLAIM.baseline: {m: [baseline[m] + e for e in reversed(spread)] for m in LR_MULTIPLES},
    }


def test_a_task_claim_whose_outcome_changes_at_each_models_own_rate_is_lr_sensitive():
    # The baseline is 0.05 behind at the shared rate, 0.05 ahead at its own best (×2).
    metric = _metric({0.5: 0.30, 1.0: 0.25, 2.0: 0.28}, {0.5: 0.32, 1.0: 0.30, 2.0: 0.20})
    found = task_lr_sweep.check(CLAIM, metric, higher_is_better=False)
    assert found["best"] == {CLAIM.variant: 1.0, CLAIM.baseline: 2.0}
    assert found["at_shared"]["outcome"] == "supported" and math.isclose(found["at_shared"]["effect"], -0.05)
    assert found["at_own"]["outcome"] == "contradicted" and math.isclose(found["at_own"]["effect"], +0.05)
    assert found["check"] == "LR-sensitive"
    held = task_lr_sweep.check(
        CLAIM, _metric({m: 0.25 for m in LR_MULTIPLES}, {0.5: 0.31, 1.0: 0.30, 2.0: 0.35}), False
    )
    assert held["best"][CLAIM.baseline] == 1.0 and held["best"][CLAIM.variant] == 1.0  # a tie keeps ×1
    assert held["check"] == "the same"


def test_a_higher_is_better_metric_picks_the_highest_mean():
    metric = _metric({0.5: 0.9, 1.0: 0.8, 2.0: 0.7}, {0.5: 0.6, 1.0: 0.6, 2.0: 0.95})
    assert task_lr_sweep.check(CLAIM, metric, higher_is_better=True)["best"] == {
        CLAIM.variant: 0.5,
        CLAIM.baseline: 2.0,
    }


def test_the_sweep_trains_the_claims_models_on_its_task_at_every_multiple():
    rung = LADDERS["claims"].rungs[-1]
    task = next(t for t in rung.tasks if t.name == CLAIM.measure.task)
    tiny = task.replace(steps=4, warmup_steps=1, eval_interval=4, eval_samples=16)
    metric = task_lr_sweep.sweep(CLAIM, tiny, seeds=(0, 1))
    assert set(metric) == {CLAIM.variant, CLAIM.baseline}
    for by_multiple in metric.values():
        assert set(by_multiple) == set(LR_MULTIPLES) and all(len(v) == 2 for v in by_multiple.values())
        assert by_multiple[0.5] != by_multiple[2.0]  # the rate reached the optimizer


@pytest.mark.parametrize("claim", ["dcmha.lm_loss", "no.such.claim"])  # a language-model claim has claims-lr
def test_a_claim_not_on_a_task_is_refused_naming_the_ones_allowed(claim, capsys):
    with pytest.raises(SystemExit):
        task_lr_sweep.main(["--claim", claim])
    error = capsys.readouterr().err
    assert f"invalid choice: '{claim}'" in error and "selective.value_temperature_denoising" in error
