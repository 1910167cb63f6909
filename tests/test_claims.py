"""The papers' claims as records, and the verdict rules, on synthetic values and on a stored comparison."""

import dataclasses
import json
import shutil
from pathlib import Path

import pytest
from scipy import stats

from attnzoo.compare import PRESETS, CompareResults
from attnzoo.compare.claims import (
    CLAIMS,
    HIGHER,
    LOWER,
    RATIO,
    WITHIN,
    Claim,
    Measure,
    claim_variants,
    judge,
    judge_all,
)
from attnzoo.compare.report import write_report

FIXTURE = Path(__file__).parent / "fixtures" / "compare_micro"  # mha+rope and diff+rope, seeds 0 and 1


@pytest.fixture(scope="module")
def results():
    return CompareResults.load(FIXTURE / "results.json")


def _claim(values, rule=LOWER, target=0.0):
    """A claim on diff+rope against mha+rope whose measure returns ``values[label]`` (a list, one per seed)."""
    measure = Measure(
        "x", "the test's runs", lambda _, label: dict(enumerate(values[label])) if label in values else None
    )
    return Claim("test.claim", "a paper", "a statement", "diff+rope", "mha+rope", measure, rule, target)


@pytest.mark.parametrize(
    ("variant", "rule", "outcome"),
    [
        ([1.0, 1.1, 0.9, 1.05], LOWER, "supported"),  # every seed about 1 below the baseline
        ([1.0, 1.1, 0.9, 1.05], HIGHER, "contradicted"),
        ([2.1, 1.9, 2.05, 1.95], LOWER, "inconclusive"),  # the differences straddle zero
    ],
)
def test_the_verdict_follows_the_paired_interval(results, variant, rule, outcome):
    baseline = [2.0, 2.0, 2.1, 1.9]
    verdict = judge(_claim({"diff+rope": variant, "mha+rope": baseline}, rule), results)
    assert verdict.outcome == outcome
    expected = stats.ttest_rel(variant, baseline).confidence_interval(0.95)
    assert (verdict.low, verdict.high) == pytest.approx((expected.low, expected.high))
    assert verdict.effect == pytest.approx(sum(variant) / 4 - sum(baseline) / 4)
    assert verdict.seeds == (0, 1, 2, 3) and verdict.would_change
    assert verdict.parameters == results.variants["diff+rope"].parameters
    assert verdict.tokens_per_run == results.budget.tokens_per_run


def test_one_seed_and_all_equal_differences_are_inconclusive_with_the_reason(results):
    one = judge(_claim({"diff+rope": [1.0], "mha+rope": [2.0]}), results)
    assert one.outcome == "inconclusive" and "1 seed(s): a 95% interval needs at least 3" in one.reason
    same = judge(_claim({"diff+rope": [1.0, 1.5, 2.0], "mha+rope": [1.0, 1.5, 2.0]}), results)
    assert same.outcome == "inconclusive" and "no spread over seeds" in same.reason and same.effect == 0
    shifted = judge(_claim({"diff+rope": [0.5, 1.0, 1.5], "mha+rope": [1.0, 1.5, 2.0]}), results)
    assert shifted.outcome == "inconclusive" and "every seed gives the same difference (-0.5)" in shifted.reason


def test_a_margin_claim_is_supported_only_inside_the_margin(results):
    baseline = [2.0, 2.1, 1.9, 2.05]
    close = [2.005, 2.1, 1.91, 2.05]
    assert judge(_claim({"diff+rope": close, "mha+rope": baseline}, WITHIN, 0.05), results).outcome == "supported"
    far = [b + 0.5 + 0.01 * i for i, b in enumerate(baseline)]
    assert judge(_claim({"diff+rope": far, "mha+rope": baseline}, WITHIN, 0.05), results).outcome == "contradicted"
    assert judge(_claim({"diff+rope": far, "mha+rope": baseline}, WITHIN, 1.0), results).outcome == "supported"


def test_a_claim_whose_experiment_was_not_run_says_so(results):
    verdict = judge(_claim({"mha+rope": [1.0, 2.0, 3.0]}), results)
    assert verdict.outcome == "not run" and "for diff+rope" in verdict.reason and verdict.scale == "—"
    # The registered claims on this micro comparison: tasks and variants it never ran are "not run", never dropped.
    verdicts = {v.claim.id: v for v in judge_all(results)}
    assert set(verdicts) == set(CLAIMS)
    assert verdicts["dcmha.composition"].outcome == "not run"
    assert "needs task 'composition' for dcmha+rope" in verdicts["dcmha.composition"].reason
    assert verdicts["diff.multi_needle"].outcome == "inconclusive"  # run, but with 2 seeds
    assert verdicts["diff.attention_logit_outliers"].outcome == "inconclusive"  # the probes run with every model


def test_the_kv_cache_claim_is_exact(results):
    data = json.loads((FIXTURE / "results.json").read_text())
    kv2 = json.loads(json.dumps(data["variants"]["mha+rope"]))
    kv2["config"]["n_kv_heads"] = kv2["config"]["n_heads"] // 2
    kv2["kv_cache_bytes_per_token"] = data["variants"]["mha+rope"]["kv_cache_bytes_per_token"] // 2
    data["variants"]["mha+rope+kv2"] = kv2
    with_gqa = CompareResults.from_dict(data)
    verdict = judge(CLAIMS["gqa.cache_gqa"], with_gqa)
    assert verdict.outcome == "supported" and verdict.effect == 2.0 and "exactly" in verdict.reason
    kv2["kv_cache_bytes_per_token"] = data["variants"]["mha+rope"]["kv_cache_bytes_per_token"]  # did not shrink
    assert judge(CLAIMS["gqa.cache_gqa"], CompareResults.from_dict(data)).outcome == "contradicted"
    assert CLAIMS["gqa.cache_mqa"].rule == RATIO


def test_every_claim_names_its_paper_figure_and_the_claims_preset_runs_its_experiment():
    claims = PRESETS["claims"]
    assert len(claims.seeds) >= 3
    assert set(claim_variants()) <= set(claims.variant_labels)
    tasks = {task.name: set(claims.task_variants(task)) for task in claims.tasks}
    for claim in CLAIMS.values():
        assert claim.paper and claim.statement.endswith(".") and claim.measure.label
        if claim.measure.task is None:
            assert {claim.variant, claim.baseline} <= set(claims.variant_labels)
        else:
            assert {claim.variant, claim.baseline} <= tasks[claim.measure.task]
    # An ablation that only a task measures trains that task alone, not a language model.
    denoising = CLAIMS["selective.value_temperature_denoising"]
    assert denoising.variant in tasks["denoising"] and denoising.variant not in claims.variant_labels


def test_the_report_opens_with_what_this_run_says(results, tmp_path):
    out = tmp_path / "out"
    shutil.copytree(FIXTURE, out)
    markdown = write_report(results, out)["markdown"].read_text()
    opening = markdown.split("## ")[1]
    assert opening.startswith("What this run says")
    assert "| paper | claim | verdict | measured (variant − baseline) | effect [95% interval] | scale |" in opening
    assert opening.count("\n| ") == len(CLAIMS) + 1  # the header and one row a claim
    assert "**not run**" in opening and "**inconclusive**: 2 seed(s)" in opening


def test_a_contradiction_lists_what_was_checked(results, tmp_path):
    contradicted = _claim({"diff+rope": [3.0, 3.1, 2.9], "mha+rope": [2.0, 2.05, 1.9]})
    contradicted = dataclasses.replace(contradicted, checks=("λ_init by depth", "parameter matching"))
    CLAIMS[contradicted.id] = contradicted
    try:
        out = tmp_path / "out"
        shutil.copytree(FIXTURE, out)
        markdown = write_report(results, out)["markdown"].read_text()
    finally:
        del CLAIMS[contradicted.id]
    assert "**contradicted**" in markdown
    assert (
        "Before reading `test.claim` as a contradiction, these were checked: λ_init by depth; parameter matching"
        in (markdown)
    )


def test_the_gpu_preset_refuses_without_cuda_and_says_what_it_needs(monkeypatch):
    from attnzoo.compare import resolve_spec

    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    with pytest.raises(ValueError, match=r"preset 'gpu' runs on a CUDA GPU \(device='cuda'\), and torch sees none"):
        resolve_spec("gpu")
    gpu = PRESETS["gpu"]
    assert len(gpu.seeds) >= 3 and set(claim_variants()) <= set(gpu.variant_labels)
    assert {task.name for task in gpu.tasks} == {c.measure.task for c in CLAIMS.values() if c.measure.task}


def test_the_probes_of_a_model_with_local_layers_summarise_every_layer():
    import torch

    from attnzoo import ModelConfig, Transformer
    from attnzoo.compare.runner import lm_probes
    from attnzoo.evals.probes import probe_model

    options = {"window_size": 8, "window_type": "LG"}  # layer 0 sees at most 8 keys of the 64-token window
    config = ModelConfig(vocab_size=64, dim=32, n_layers=2, n_heads=2, attention="dcmha", attention_options=options)
    model, tokens = Transformer(config), torch.randint(0, 64, (2, 64))
    local, full = (layer.spikiness_by_length for layer in probe_model(model, tokens))
    # The local layer's longest rows (it has none of 32 keys or more); the global layer's 33 rows of 32–64 keys.
    expected = (list(local.values())[-1] + (32 * full["32-63"] + full["64-127"]) / 33) / 2
    assert lm_probes(model, tokens)["spikiness_long"] == pytest.approx(expected)
