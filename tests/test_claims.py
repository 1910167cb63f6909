"""The papers' claims as records, the verdict rules, and the stored claims run re-rendered by them."""

import dataclasses
import itertools
import json
import math
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from record_helpers import assert_same_record
from scipy import stats

from attnzoo.claims.checks import run_checks
from attnzoo.claims.claim import (
    CLAIMS,
    HIGHER,
    LOWER,
    NONINFERIOR,
    Claim,
    Measure,
    Part,
)
from attnzoo.claims.experiments import claim_tasks, claim_variants
from attnzoo.claims.gates import Gate, LanguageModelGate, TaskLearned
from attnzoo.claims.verdicts import judge, judge_all, verdicts_record
from attnzoo.compare import PRESETS, CompareResults
from attnzoo.compare.report import write_report
from attnzoo.config import ModelConfig
from attnzoo.model import Transformer, training_flops_per_token
from attnzoo.results.ladder import Ladder
from attnzoo.stats import holm, paired_over_seeds

FIXTURE = Path(__file__).parent / "fixtures" / "compare_micro"  # mha+rope and diff+rope, seeds 0 and 1
STORED = Path(__file__).parents[1] / "docs" / "claims-one-size"  # the one-size preset's run, as committed


class AlwaysPasses:
    """A language-model gate that lets every comparison through, for tests of the decision that follows it."""

    def describe(self) -> str:
        return "always passes"

    def check(self, results, claim) -> Gate:
        return Gate(True, self.describe(), {})


ALWAYS_PASSES = AlwaysPasses()


@pytest.fixture(scope="module")
def results():
    return CompareResults.load(FIXTURE / "results.json")


def twice_as_large(data: dict) -> CompareResults:
    """The same comparison as a rung of twice the parameters: the second size a primary is judged at."""
    data = json.loads(json.dumps(data))
    for variant in data["variants"].values():
        variant["parameters"] *= 2
        for run in variant["runs"]:
            run["parameters"] *= 2
    return CompareResults.from_dict(data)


@pytest.fixture(scope="module")
def ladder(results):
    """The fixture at two sizes, 2× apart, with the same values: where a primary language-model claim is judged."""
    return Ladder.of([results, twice_as_large(json.loads((FIXTURE / "results.json").read_text()))])


def _claim(values, rule=LOWER, effect=0.1, gate=ALWAYS_PASSES, primary=False, paper="a paper", id="test.claim"):
    """A claim on diff+rope against mha+rope whose measure returns ``values[label]`` (a list, one per seed)."""
    measure = Measure(
        "x", "the test's runs", lambda _, label: dict(enumerate(values[label])) if label in values else None
    )
    return Claim(
        id, paper, "A statement.", "a source", "diff+rope", "mha+rope", measure, rule, effect, "a reason", gate, primary
    )


@pytest.fixture
def registered():
    """Register claims for one test; the registry is restored after it."""
    saved = dict(CLAIMS)
    CLAIMS.clear()
    yield lambda *claims: CLAIMS.update({c.id: c for c in claims})
    CLAIMS.clear()
    CLAIMS.update(saved)


BASELINE = [2.0, 2.0, 2.1, 1.9]


@pytest.mark.parametrize(
    ("variant", "rule", "outcome"),
    [
        ([1.0, 1.1, 0.9, 1.05], LOWER, "supported"),  # every seed about 1 below the baseline
        ([1.0, 1.1, 0.9, 1.05], HIGHER, "contradicted"),
        ([2.1, 1.9, 2.05, 1.95], LOWER, "inconclusive"),  # the differences straddle zero, and reach past ±0.1
    ],
)
def test_a_directional_verdict_follows_the_paired_t_test(results, variant, rule, outcome):
    """The interval is scipy's paired t; the p decides by the minimum-effect rule: scipy's one-sided paired test of
    "the difference lies within ±δ" on the estimate's side (here δ = 0.1)."""
    verdict = judge(_claim({"diff+rope": variant, "mha+rope": BASELINE}, rule), results)
    assert verdict.outcome == outcome and verdict.role == "exploratory"
    expected = stats.ttest_rel(variant, BASELINE)
    interval = expected.confidence_interval(0.90)  # the interval the verdict is decided on, and shows
    assert verdict.interval == pytest.approx((interval.low, interval.high))
    lower = sum(variant) < sum(BASELINE)
    shifted = [b - 0.1 if lower else b + 0.1 for b in BASELINE]
    beyond = stats.ttest_rel(variant, shifted, alternative="less" if lower else "greater").pvalue
    assert verdict.p_raw == pytest.approx(beyond) and verdict.p_adjusted is None
    assert verdict.difference.per_seed == pytest.approx([v - b for v, b in zip(variant, BASELINE, strict=True)])
    assert verdict.levels == {"mha+rope": pytest.approx(2.0), "diff+rope": pytest.approx(sum(variant) / 4)}


def test_an_interval_inside_the_smallest_effect_is_negligible_even_when_it_excludes_zero(results):
    variant = [b - 0.01 + 0.001 * i for i, b in enumerate(BASELINE)]  # 0.01 lower, every seed
    small = judge(_claim({"diff+rope": variant, "mha+rope": BASELINE}, effect=0.05), results)
    assert small.difference.p_value() < 0.001 and small.outcome == "negligible" and "inside ±0.05" in small.reason
    # The same difference against a smaller smallest effect is a supported one.
    assert judge(_claim({"diff+rope": variant, "mha+rope": BASELINE}, effect=0.005), results).outcome == "supported"


def test_a_nonzero_difference_smaller_than_the_smallest_effect_is_not_a_support(results):
    """The graph task's 0.0047 nats (p 0.04) against a smallest effect of 0.005 was reported supported: a reviewer
    signs neither "it matters" nor "it is negligible" for a difference whose estimate is below what matters and whose
    interval reaches past it."""
    noisy = [b - 0.04 + d for b, d in zip(BASELINE, [0.0, -0.03, 0.02, -0.015], strict=True)]  # about 0.046 lower
    verdict = judge(_claim({"diff+rope": noisy, "mha+rope": BASELINE}, effect=0.05), results)
    low, high = verdict.interval
    assert verdict.difference.p_value() < 0.05 and abs(verdict.difference.mean) < 0.05 and low < -0.05 < high < 0
    assert verdict.outcome == "inconclusive" and "is nonzero at 5%, but the 90% interval" in verdict.reason
    assert "not shown to lie beyond ±0.05" in verdict.reason
    assert verdict.would_change.endswith("would make it negligible if the mean -0.0463 and spread held")
    # Nor is an estimate past δ whose 90% interval is not: 0.046 against δ = 0.04 is shown nonzero, not beyond 0.04.
    past = judge(_claim({"diff+rope": noisy, "mha+rope": BASELINE}, effect=0.04), results)
    assert past.outcome == "inconclusive" and past.difference.interval(0.9)[1] > -0.04
    # Against a δ the whole 90% interval lies beyond, the claim is supported.
    assert judge(_claim({"diff+rope": noisy, "mha+rope": BASELINE}, effect=0.005), results).outcome == "supported"


def test_non_inferiority_is_scipys_one_sided_test_against_the_margin(results):
    margin = 0.05
    close = [2.01, 2.005, 2.11, 1.905]  # about 0.01 worse (higher), well inside the margin
    verdict = judge(_claim({"diff+rope": close, "mha+rope": BASELINE}, NONINFERIOR, margin), results)
    expected = stats.ttest_rel(close, [b + margin for b in BASELINE], alternative="less").pvalue
    assert verdict.outcome == "supported" and verdict.p_raw == pytest.approx(expected)
    assert "upper end" in verdict.reason and verdict.interval[1] < margin
    worse = [b + 0.3 + 0.01 * i for i, b in enumerate(BASELINE)]
    contradicted = judge(_claim({"diff+rope": worse, "mha+rope": BASELINE}, NONINFERIOR, margin), results)
    beyond = stats.ttest_rel(worse, [b + margin for b in BASELINE], alternative="greater").pvalue
    assert contradicted.outcome == "contradicted" and contradicted.p_raw == pytest.approx(beyond) and beyond < 0.05
    assert "lower end is above the margin" in contradicted.reason
    spread = [2.1, 1.9, 2.2, 1.85]
    unclear = judge(_claim({"diff+rope": spread, "mha+rope": BASELINE}, NONINFERIOR, margin), results)
    assert unclear.outcome == "inconclusive" and "crosses the margin" in unclear.reason
    assert re.fullmatch(r"about \d+ seeds would make it supported if the mean .*", unclear.would_change)


def test_what_would_change_it_points_where_the_mean_points(results):
    toward_claim = judge(_claim({"diff+rope": [1.5, 2.1, 1.7, 2.0], "mha+rope": BASELINE}), results)
    against = judge(_claim({"diff+rope": [2.5, 1.9, 2.3, 2.0], "mha+rope": BASELINE}), results)
    assert toward_claim.outcome == against.outcome == "inconclusive"
    assert "make it supported" in toward_claim.would_change and "make it contradicted" in against.would_change
    n = int(re.search(r"about (\d+) seeds", toward_claim.would_change)[1])
    d = toward_claim.difference  # n is the first whose 90% interval at n − 1 degrees of freedom lies beyond −δ
    sd, room = d.se * 4**0.5, abs(d.mean) - 0.1
    assert stats.t.ppf(0.95, n - 1) * sd / n**0.5 < room <= stats.t.ppf(0.95, n - 2) * sd / (n - 1) ** 0.5


def test_too_few_seeds_or_no_spread_is_inconclusive_with_the_reason(results):
    one = judge(_claim({"diff+rope": [1.0, 1.2], "mha+rope": [2.0, 2.1]}), results)
    assert one.outcome == "inconclusive" and "2 seed(s): an interval needs at least 3" in one.reason
    shifted = judge(_claim({"diff+rope": [0.5, 1.0, 1.5], "mha+rope": [1.0, 1.5, 2.0]}), results)
    assert shifted.outcome == "inconclusive" and "every seed gives the same difference (-0.5)" in shifted.reason


def test_holm_corrects_the_primaries_together_and_leaves_the_rest_exploratory(ladder, registered):
    weak = [b + d for b, d in zip(BASELINE, (-0.12, -0.03, -0.10, -0.04), strict=True)]  # p 0.047 alone
    strong = [b - 1.0 + 0.01 * i for i, b in enumerate(BASELINE)]
    registered(
        _claim({"diff+rope": weak, "mha+rope": BASELINE}, effect=0.01, primary=True, paper="A", id="a.weak"),
        _claim({"diff+rope": strong, "mha+rope": BASELINE}, effect=0.01, primary=True, paper="B", id="b.strong"),
        _claim({"diff+rope": weak, "mha+rope": BASELINE}, effect=0.01, primary=True, paper="C", id="c.weak"),
        _claim({"diff+rope": weak, "mha+rope": BASELINE}, effect=0.01, paper="A", id="a.other"),
    )
    verdicts = {v.claim.id: v for v in judge_all(ladder)}  # primaries on a language model: judged at two sizes
    family = [verdicts[name] for name in ("a.weak", "b.strong", "c.weak")]
    assert [v.p_adjusted for v in family] == pytest.approx(holm([v.p_raw for v in family]))
    assert 0.025 < verdicts["a.weak"].p_raw < 0.05 < verdicts["a.weak"].p_adjusted  # significant alone only
    assert [v.outcome for v in family] == ["inconclusive", "supported", "inconclusive"]
    assert verdicts["a.other"].p_adjusted is None and verdicts["a.other"].outcome == "supported"  # exploratory


def test_the_task_gate_refuses_a_baseline_at_chance_or_a_variant_below_it(results):
    data = json.loads((FIXTURE / "results.json").read_text())
    needles = data["tasks"]["needles"]

    def with_accuracy(baseline, variant):
        for label, values in (("mha+rope", baseline), ("diff+rope", variant)):
            for run, value in zip(needles["runs"][label], values, strict=True):
                run["final"]["accuracy"] = value
        return CompareResults.from_dict(data)

    claim = dataclasses.replace(CLAIMS["diff.multi_needle"])
    at_chance = judge(claim, with_accuracy([0.01, 0.015], [0.6, 0.7]))
    assert at_chance.outcome == "not measurable" and "did not learn the task" in at_chance.reason
    assert at_chance.gate.levels["chance"] == pytest.approx(1 / 90) and at_chance.gate.levels["gate"] > 0.5
    failed = judge(claim, with_accuracy([0.8, 0.9], [0.7, 0.0]))
    assert failed.outcome == "not measurable" and "diff+rope ended at or beyond chance" in failed.reason
    assert "[1]" in failed.reason
    learned = judge(claim, with_accuracy([0.8, 0.9], [0.85, 0.95]))
    assert learned.gate.passed and learned.outcome == "inconclusive"  # judged, but 2 seeds


ABLATION_CLAIMS = ["dcmha.post_beats_pre", "dcmha.query_wise_slightly_worse", "selective.position_temperature_dilution"]


def test_a_claim_no_comparison_ran_says_what_would_run_it(results):
    assert judge(_claim({"mha+rope": [1.0, 2.0, 3.0]}), results).outcome == "not run"
    verdicts = {v.claim.id: v for v in judge_all(results)}
    assert set(verdicts) == set(CLAIMS)  # none is dropped
    assert "needs task 'denoising'" in verdicts["selective.value_temperature_denoising"].reason
    static = verdicts["dcmha.dynamic_beats_static"]  # its baseline, DCMHA's static-only option, is built
    assert static.outcome == "not run" and static.reason.startswith("needs the language-model runs for dcmha+rope and")
    gpu = dataclasses.replace(CLAIMS["diff.lm_loss"], variant="diff+alibi", preset="gpu-lm", needs_gpu=True)
    gpu_verdict = judge(gpu, results)
    assert gpu_verdict.reason.endswith("; the gpu-lm preset runs them on a GPU")
    assert gpu_verdict.would_change == "run the gpu-lm preset (a CUDA GPU)"
    for ablation in ABLATION_CLAIMS:
        assert verdicts[ablation].outcome == "not run"
        assert verdicts[ablation].reason.endswith("; the gpu-ablations preset runs them on a GPU")


def test_the_ablations_preset_trains_exactly_the_variants_its_claims_compare():
    ablations = [claim for claim in CLAIMS.values() if claim.preset == "gpu-ablations"]
    assert sorted(claim.id for claim in ablations) == ABLATION_CLAIMS
    assert all(claim.is_run and claim.needs_gpu for claim in ablations)
    compared = {label for claim in ablations for label in (claim.variant, claim.baseline)}
    spec = PRESETS["gpu-ablations"]
    assert set(spec.variant_labels) == compared | {"mha+rope"} and spec.variant_labels[0] == "mha+rope"
    assert spec.train.device == "cuda" and not spec.tasks


def test_implementation_checks_are_never_a_papers_verdict(results, tmp_path):
    data = json.loads((FIXTURE / "results.json").read_text())
    kv2 = json.loads(json.dumps(data["variants"]["mha+rope"]))
    kv2["config"]["n_kv_heads"] = kv2["config"]["n_heads"] // 2
    kv2["kv_cache_bytes_per_token"] = data["variants"]["mha+rope"]["kv_cache_bytes_per_token"] // 2
    data["variants"]["mha+rope+kv2"] = kv2
    with_gqa = CompareResults.from_dict(data)
    (check,) = run_checks(with_gqa)
    assert check.status == "pass" and check.expected.startswith("2×")
    kv2["kv_cache_bytes_per_token"] *= 2  # did not shrink
    assert run_checks(CompareResults.from_dict(data))[0].status == "fail"
    # The report: the check in its own table, after the verdicts, and in no count of them.
    shutil.copytree(FIXTURE, tmp_path / "out")
    markdown = write_report(with_gqa, tmp_path / "out")["markdown"].read_text()
    claims_part, checks_part = markdown.split("### Implementation checks")
    assert "mha+rope+kv2: KV-cache bytes per token" in checks_part and "KV-cache" not in claims_part
    record = verdicts_record(with_gqa, judge_all(with_gqa))
    assert sum(record["counts"].values()) == len(CLAIMS) == len(record["claims"])
    assert all("KV-cache" not in row["measure"] for row in record["claims"])


def test_every_claim_cites_its_source_and_each_paper_names_one_primary():
    papers = {claim.paper for claim in CLAIMS.values()}
    assert {paper for claim in CLAIMS.values() if claim.primary for paper in [claim.paper]} == papers
    for claim in CLAIMS.values():
        text = f"{claim.statement} {claim.source} {claim.smallest_effect_source} {claim.paper_scale}"
        assert "verify" not in text.lower() and claim.statement.endswith(".")
        assert claim.source and claim.smallest_effect > 0 and claim.smallest_effect_source
        assert claim.is_run or claim.experiment  # either a preset runs it or it says what would
    claims = PRESETS["claims-one-size"]
    assert set(claim_variants(one_size=True)) <= set(claims.variant_labels)
    tasks = {task.name: {v.label for v in claims.task_variants(task)} for task in claims.tasks}
    assert set(tasks) == {task.name for task in claim_tasks("claims")}
    for claim in CLAIMS.values():
        if not claim.is_run or claim.preset != "claims" or claim.measure.across is not None:
            continue  # a compute multiple is read across the ladder's sizes, never at one
        if claim.measure.task is None:
            assert {claim.variant, claim.baseline} <= set(claims.variant_labels)
        else:
            assert isinstance(claim.gate, TaskLearned) and {claim.variant, claim.baseline} <= tasks[claim.measure.task]


def test_holm_equals_the_closed_testing_of_bonferroni_intersections():
    """Holm's adjusted p is the largest Bonferroni p over every intersection hypothesis that contains it."""
    p = [0.01, 0.04, 0.03, 0.005, 0.2]
    closed = []
    for i in range(len(p)):
        subsets = [s for k in range(1, len(p) + 1) for s in itertools.combinations(range(len(p)), k) if i in s]
        closed.append(max(min(1.0, len(s) * min(p[j] for j in s)) for s in subsets))
    assert holm(p) == pytest.approx(closed)
    assert holm([0.01, 0.02, 0.03]) == pytest.approx([0.03, 0.04, 0.04])


def test_the_stored_claims_run_re_renders_to_the_committed_report(tmp_path):
    """docs/claims-one-size is a pure function of its results.json: the verdicts, the table and verdicts.json agree."""
    out = tmp_path / "claims"
    shutil.copytree(STORED, out)
    paths = write_report(CompareResults.load(out / "results.json"), out)
    assert_same_record(json.loads(paths["verdicts"].read_text()), json.loads((STORED / "verdicts.json").read_text()))
    assert paths["markdown"].read_text() == (STORED / "report.md").read_text()


def test_the_gpu_preset_refuses_without_cuda_and_says_what_it_needs(monkeypatch):
    from attnzoo.compare import resolve_spec

    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    with pytest.raises(ValueError, match=r"preset 'gpu' runs on a CUDA GPU \(device='cuda'\), and torch sees none"):
        resolve_spec("gpu")
    gpu = PRESETS["gpu"]
    assert len(gpu.seeds) >= 3 and set(claim_variants(one_size=True)) <= set(gpu.variant_labels)
    assert {task.name for task in gpu.tasks} == {task.name for task in claim_tasks("standard")}


def test_the_probes_of_a_model_with_local_layers_summarise_every_layer():
    import torch

    from attnzoo import ModelConfig, Transformer
    from attnzoo.compare.lm_run import lm_probes
    from attnzoo.evals.probes import probe_model

    options = {"window_size": 8, "window_type": "LG"}  # layer 0 sees at most 8 keys of the 64-token window
    config = ModelConfig(vocab_size=64, dim=32, n_layers=2, n_heads=2, attention="dcmha", attention_options=options)
    model, tokens = Transformer(config), torch.randint(0, 64, (2, 64))
    local, full = (layer.spikiness_by_length for layer in probe_model(model, tokens))
    # The local layer's longest rows (it has none of 32 keys or more); the global layer's 33 rows of 32–64 keys.
    expected = (list(local.values())[-1] + (32 * full["32-63"] + full["64-127"]) / 33) / 2
    assert lm_probes(model, tokens)["spikiness_long"] == pytest.approx(expected)


def test_training_flops_per_token_counts_what_a_mechanism_adds():
    """MHA's count is the matrix products a reader can write down: 6 FLOPs per weight of every linear layer, the
    output head included (the forward's 2 and the backward's 4), plus the attention scores and values, 12·T·d per
    layer at T keys (all of them, as the eager path computes); DCMHA adds its composition and weight projection."""
    cfg = ModelConfig(vocab_size=64, dim=32, n_layers=2, n_heads=4, max_seq_len=16, mlp="gelu")
    blocks = sum(p.numel() for name, p in Transformer(cfg).named_parameters() if p.dim() == 2 and "embed" not in name)
    assert training_flops_per_token(cfg, 16) == 6 * (blocks + 64 * 32) + 2 * 12 * 16 * 32
    dcmha = dataclasses.replace(cfg, attention="dcmha")
    assert training_flops_per_token(dcmha, 16) > training_flops_per_token(cfg, 16)


def test_a_non_finite_value_never_passes_a_gate_or_reaches_a_verdict(results):
    """A diverged run (NaN or inf) did not learn: every comparison with a NaN is false, so a gate written as
    "refuse when below" would let it through."""
    data = json.loads((FIXTURE / "results.json").read_text())
    needles = data["tasks"]["needles"]
    for label, values in (("mha+rope", [float("nan"), float("nan")]), ("diff+rope", [0.85, 0.95])):
        for run, value in zip(needles["runs"][label], values, strict=True):
            run["final"]["accuracy"] = value
    nan_task = judge(CLAIMS["diff.multi_needle"], CompareResults.from_dict(data))
    assert nan_task.outcome == "not measurable" and not nan_task.gate.passed and "non-finite" in nan_task.reason

    data = json.loads((FIXTURE / "results.json").read_text())
    for variant in data["variants"].values():
        for run in variant["runs"]:
            run["val_curve"] = [[step, 3.0] for step in (100, 200, 300)] + [[400, float("nan")]]
    gate = LanguageModelGate(loss_effect=0.02)
    claim = _claim({"diff+rope": [1.0, 1.1, 1.2], "mha+rope": [1.5, 1.6, 1.8]}, gate=gate)
    nan_curve = judge(claim, CompareResults.from_dict(data))
    assert nan_curve.outcome == "not measurable" and "non-finite" in nan_curve.reason

    inf = judge(_claim({"diff+rope": [1.0, float("inf"), 1.2], "mha+rope": [1.5, 1.6, 1.8]}), results)
    assert inf.outcome == "not measurable" and "non-finite" in inf.reason and inf.p_raw is None
    assert "does not diverge" in inf.would_change and "does not diverge" in nan_task.would_change


def test_seeds_are_paired_by_their_number_and_a_missing_seed_is_not_a_crash(results):
    """A variant and baseline trained on different seeds are compared on the seeds they share, and said so."""

    def keyed(values):  # seed → value
        return Measure("x", "the test's runs", lambda _, label: values.get(label))

    def claim(values):
        return dataclasses.replace(_claim({}), measure=keyed(values))

    disjoint = judge(claim({"diff+rope": {0: 1.0, 1: 1.1, 2: 1.2}, "mha+rope": {3: 2.0, 4: 2.1, 5: 2.2}}), results)
    assert disjoint.outcome == "inconclusive" and "0 seed(s)" in disjoint.reason
    partial = {"diff+rope": {0: 1.0, 1: 1.1, 2: 1.3}, "mha+rope": {0: 2.0, 1: 2.05, 2: 2.2, 3: 9.0}}
    verdict = judge(claim(partial), results)
    assert verdict.difference.per_seed == pytest.approx([-1.0, -0.95, -0.9]) and verdict.outcome == "supported"

    data = json.loads((FIXTURE / "results.json").read_text())
    data["variants"]["diff+rope"]["runs"] = data["variants"]["diff+rope"]["runs"][1:]  # seed 1 only
    one_seed = CompareResults.from_dict(data)
    lm = judge(dataclasses.replace(CLAIMS["dcmha.lm_loss"], variant="diff+rope", gate=ALWAYS_PASSES), one_seed)
    assert lm.outcome == "inconclusive" and "1 seed(s)" in lm.reason and lm.conditions.startswith("1 seed(s)")
    seed_1 = next(run for run in one_seed.variants["mha+rope"].runs if run.seed == 1)
    assert lm.difference.per_seed == pytest.approx([one_seed.variants["diff+rope"].runs[0].val.loss - seed_1.val.loss])
    # The summary table's paired difference pairs the same seeds, rather than broadcasting one run against two.
    summary = one_seed.versus_baseline("diff+rope", "val_loss")
    assert summary.seeds == 1 and summary.mean == pytest.approx(lm.difference.mean)
    with pytest.raises(ValueError, match="one value per seed"):
        paired_over_seeds([1.0], [1.0, 2.0])


def test_the_loss_gate_reads_seeds_logged_at_different_steps(results):
    """Each seed's slope from its own curve: seeds whose validation points differ (a resumed run) are still read,
    and a loss rising over the last quarter fails the end-state part."""
    data = json.loads((FIXTURE / "results.json").read_text())
    for variant in data["variants"].values():
        for i, run in enumerate(variant["runs"]):
            steps = (100, 200, 300, 400) if i == 0 else (150, 250, 350, 400)
            run["val_curve"] = [[step, 3.0 + 0.05 * step / 100] for step in steps]
    claim = _claim({"diff+rope": [1.0, 1.1, 1.2], "mha+rope": [1.5, 1.6, 1.8]}, gate=LanguageModelGate(0.02))
    rising = judge(claim, CompareResults.from_dict(data))
    end_state = next(part for part in rising.gate.parts if part.name == "(b) end state")
    assert (
        rising.outcome == "not measurable" and not end_state.passed and "mha+rope rose 0.050 nats" in end_state.detail
    )


def test_a_primary_held_back_by_holm_says_so_and_asks_for_more_than_the_seeds_it_has(ladder, registered):
    """Raw p below 5%, Holm-adjusted above: the reason must not describe an interval that crosses the margin, and
    "what would change it" must count the seeds for the adjusted test, not the raw one it already passes."""
    weak = [b + d for b, d in zip(BASELINE, (-0.12, -0.03, -0.10, -0.04), strict=True)]  # p 0.047 alone
    strong = [b - 1.0 + 0.01 * i for i, b in enumerate(BASELINE)]
    close = [b + d for b, d in zip(BASELINE, (0.0, 0.03, -0.02, 0.01), strict=True)]
    registered(
        _claim({"diff+rope": weak, "mha+rope": BASELINE}, effect=0.01, primary=True, paper="A", id="a.weak"),
        _claim({"diff+rope": strong, "mha+rope": BASELINE}, effect=0.01, primary=True, paper="B", id="b.strong"),
        _claim({"diff+rope": close, "mha+rope": BASELINE}, NONINFERIOR, 0.033, primary=True, paper="C", id="c.close"),
    )
    verdicts = {v.claim.id: v for v in judge_all(ladder)}
    weak_verdict, close_verdict = verdicts["a.weak"], verdicts["c.close"]
    assert weak_verdict.p_raw < 0.05 < weak_verdict.p_adjusted and weak_verdict.outcome == "inconclusive"
    assert int(re.search(r"about (\d+) seeds", weak_verdict.would_change)[1]) > 4
    assert close_verdict.p_raw < 0.05 < close_verdict.p_adjusted and close_verdict.outcome == "inconclusive"
    assert close_verdict.interval is not None and "crosses the margin" not in close_verdict.reason
    assert "Holm" in close_verdict.reason
    assert int(re.search(r"about (\d+) seeds", close_verdict.would_change)[1]) > 4


def test_each_smallest_effects_stated_reason_agrees_with_the_numbers_it_cites():
    """The reasons quote figures: a binomial standard error at the claims budget's own evaluation samples; MHA's
    losses at 1× and 1.5× the compute in the stored claims run; and half a paper's multiple in log-compute. The
    figure quoted must be the figure."""
    from attnzoo.claims.protocol import LM_EFFECT, LM_EFFECT_SOURCE
    from attnzoo.evals.task import TaskSpec

    for claim in CLAIMS.values():
        if claim.measure.task is None or "binomial" not in claim.smallest_effect_source:
            continue
        found = re.search(r"([\d.]+) binomial standard errors .*?at (\d+) samples", claim.smallest_effect_source)
        assert found, claim.id
        samples = TaskSpec.at_scale(claim.measure.task, "claims").budget.eval_samples
        assert int(found[2]) == samples, claim.id
        assert float(found[1]) == pytest.approx(claim.smallest_effect / (0.25 / samples) ** 0.5, rel=0.05), claim.id
    stored = CompareResults.load(STORED / "results.json")
    one, more = (
        sum(run.val.loss for run in stored.variants[label].runs) / 3 for label in ("mha+rope", "mha+rope+x1.5")
    )
    assert f"{one:.4f} → {more:.4f} nats" in LM_EFFECT_SOURCE and "about a quarter" in LM_EFFECT_SOURCE
    assert 0.2 < LM_EFFECT / (one - more) < 0.3
    for claim_id, multiple in (("dcmha.compute_equivalence", 1.67), ("diff.lm_loss", 1 / 0.65)):
        claim = CLAIMS[claim_id]
        assert claim.smallest_effect == pytest.approx(math.log(multiple) / 2)
        assert f"{math.log(multiple) / 2:.3f}" in claim.smallest_effect_source
        assert f"{math.sqrt(multiple):.2f}×" in claim.smallest_effect_source


def test_a_mechanism_probe_is_not_read_off_a_variant_that_did_not_learn_the_task():
    """The attention shares of a Diff model that retrieves nothing say nothing about differential attention: a
    probe claim needs the variant, too, past the gate (the accuracy claim may still say it is worse)."""
    data = json.loads((FIXTURE / "results.json").read_text())
    needles = data["tasks"]["needles"]
    for label, values in (("mha+rope", [0.8, 0.9]), ("diff+rope", [0.03, 0.04])):  # chance 0.011, gate 0.51
        for run, value in zip(needles["runs"][label], values, strict=True):
            run["final"]["accuracy"] = value
    barely = CompareResults.from_dict(data)
    for name in ("diff.attention_to_answer", "diff.attention_noise"):
        verdict = judge(CLAIMS[name], barely)
        assert verdict.outcome == "not measurable" and "diff+rope reached the gate" in verdict.reason, name
        assert "on 0 of 2 seeds, fewer than 2" in verdict.reason, name
    accuracy = judge(CLAIMS["diff.multi_needle"], barely)
    assert accuracy.gate.passed  # judged: failing where the baseline learns is evidence against the claim


def test_the_docs_state_the_rules_the_report_states():
    """docs/jobs/compare.md's "How a verdict is reached" is the report's own paragraph, word for word."""
    from attnzoo.claims.report import HOW_A_VERDICT_IS_REACHED

    text = (Path(__file__).parents[1] / "docs" / "jobs" / "compare.md").read_text()
    assert HOW_A_VERDICT_IS_REACHED.removeprefix("**How a verdict is reached.** ") in text


def test_a_baseline_on_the_tasks_shortcut_has_not_learned_it():
    """A task's shortcut (the score of skipping the step it tests) raises the gate where it lies above it."""
    data = json.loads((FIXTURE / "results.json").read_text())
    needles = data["tasks"]["needles"]
    for label, values in (("mha+rope", [0.55, 0.6]), ("diff+rope", [0.7, 0.8])):
        for run, value in zip(needles["runs"][label], values, strict=True):
            run["final"]["accuracy"] = value
    assert judge(CLAIMS["diff.multi_needle"], CompareResults.from_dict(data)).gate.passed  # above half the gap
    needles["shortcut"] = 0.7  # but a random needle would have scored 0.7
    gated = judge(CLAIMS["diff.multi_needle"], CompareResults.from_dict(data))
    assert gated.outcome == "not measurable" and gated.gate.levels["gate"] == 0.7
    assert gated.gate.levels["shortcut"] == 0.7


def test_training_flops_per_token_refuses_a_bad_length_by_name():
    cfg = ModelConfig(vocab_size=64, dim=32, n_layers=1, n_heads=4, max_seq_len=16)
    with pytest.raises(ValueError, match="seq_len=0 is invalid"):
        training_flops_per_token(cfg, 0)


def test_the_task_gate_counts_seeds_not_the_mean_and_compares_the_counts_exactly():
    """Composition passed on its mean with 3 of 5 MHA seeds on the shortcut: a baseline learns a task when at least
    4 of 5 seeds pass; the seeds that learned it on each side are compared by Fisher's exact test."""
    stored = json.loads((STORED / "results.json").read_text())
    composition = stored["tasks"]["composition"]
    claim = CLAIMS["dcmha.composition"]

    def with_accuracy(baseline, variant):
        for label, values in (("mha+rope", baseline), ("dcmha+rope", variant)):
            for run, value in zip(composition["runs"][label], values, strict=True):
                run["final"]["accuracy"] = value
        return judge(claim, CompareResults.from_dict(stored))

    high_mean = with_accuracy([1.0, 1.0, 0.5, 0.5, 0.5], [0.9, 0.9, 0.9, 0.9, 0.5])  # mean 0.7, above the gate
    gate = high_mean.gate.levels["gate"]
    assert 0.5 < gate < 0.7 and not high_mean.gate.passed and "on 2 of 5 seeds, fewer than 4" in high_mean.reason
    learned = with_accuracy([1.0, 1.0, 1.0, 1.0, 0.5], [0.9, 0.5, 0.5, 0.5, 0.5])
    assert learned.gate.passed
    levels = learned.gate.levels
    assert levels["mha+rope: seeds past the gate"] == 4 and levels["dcmha+rope: seeds past the gate"] == 1
    assert levels["Fisher's exact p of the counts"] == pytest.approx(stats.fisher_exact([[1, 4], [4, 1]]).pvalue)


# ------------------------------------------------------------------------- each claim measures what it says

GRAPH_SELECTIVE = "selective[position_temperature=false,value_temperature=false]+none"
ROWS = {1: 4, 2: 6, 4: 5, 8: 9}  # the graph task's degree classes and their rows (cliques of 2, 2, 3, 3, 5, 9)
JITTER = (-0.02, 0.01, 0.0, 0.015, -0.005)  # one per seed: a spread to form an interval from


def graph_records(norms, taus, spikiness=None) -> CompareResults:
    """The stored claims run with the graph task's probes replaced: ``norms[label]`` and ``spikiness[label]`` one
    value per seed, ``taus`` one {degree: τ_q} per seed of selective attention."""
    data = json.loads((STORED / "results.json").read_text())
    for label, runs in data["tasks"]["graph"]["runs"].items():
        for i, run in enumerate(runs):
            probe = {k: v for k, v in run["probe"].items() if not k.startswith("inverse_temperature/")}
            probe["qk_operator_norm"] = norms[label][i]
            if label == GRAPH_SELECTIVE:
                probe |= {f"inverse_temperature/degree_{d}": tau for d, tau in taus[i].items()}
            if spikiness is not None:
                probe["spikiness"] = spikiness[label][i]
            run["probe"] = probe
    return CompareResults.from_dict(data)


VANILLA_NORMS = [1.8 + j for j in JITTER]


def test_the_norm_judged_is_the_parameter_norm_the_paper_states_with_the_logits_scale_reported_beside_it():
    """ "A smaller attention-map parameter norm" (002:30) is ‖W_q W_kᵀ‖, judged as stated: halved under τ_q = 2 on
    every row it is smaller, though τ̄·‖W_q W_kᵀ‖, the logits' effective scale, is vanilla attention's (a
    reparameterisation): that product is reported beside it, the row-weighted mean τ_q times the norm, by hand."""
    claim = CLAIMS["selective.query_temperature_norm"]
    halved = [n / 2 + 0.01 * j for n, j in zip(VANILLA_NORMS, (1, -1, 2, 0, -2), strict=True)]
    ceiling = graph_records({"mha+none": VANILLA_NORMS, GRAPH_SELECTIVE: halved}, [dict.fromkeys(ROWS, 2.0)] * 5)
    verdict = judge(claim, ceiling)
    assert verdict.difference.mean == pytest.approx(np.mean(halved) - np.mean(VANILLA_NORMS))
    assert "(1) attention-map parameter norm ‖W_q W_kᵀ‖" in verdict.reason and ": supported:" in verdict.reason
    assert verdict.levels[f"{GRAPH_SELECTIVE}: τ_q, mean over the rows"] == pytest.approx(2.0)
    scale = f"{GRAPH_SELECTIVE}: τ̄_q·‖W_q W_kᵀ‖, the logits' effective scale (reported, not judged)"
    assert verdict.levels[scale] == pytest.approx(2 * np.mean(halved))
    assert verdict.levels["mha+none: τ̄_q·‖W_q W_kᵀ‖, the logits' effective scale (reported, not judged)"] == (
        pytest.approx(np.mean(VANILLA_NORMS))  # τ ≡ 1
    )
    taus = [{1: 1.9, 2: 1.5, 4: 1.2, 8: 1.0}] * 5
    uneven = judge(claim, graph_records({"mha+none": VANILLA_NORMS, GRAPH_SELECTIVE: halved}, taus))
    mean_tau = (4 * 1.9 + 6 * 1.5 + 5 * 1.2 + 9 * 1.0) / 24
    assert uneven.levels[scale] == pytest.approx(mean_tau * np.mean(halved))


def test_the_spikier_half_is_not_measurable_on_the_graph_task_whose_target_fixes_the_map():
    """The graph task's map is its next-token distribution: a model that fits the target has the target's
    ‖p‖₂/‖p‖₁, so the two cannot differ there by their mechanism. Measured, it is reported and not judged, and the
    whole claim is not measurable; a larger norm still contradicts the whole; a run without the probe leaves it
    not run."""
    claim = CLAIMS["selective.query_temperature_norm"]
    smaller = [n - 0.3 + j for n, j in zip(VANILLA_NORMS, JITTER[::-1], strict=True)]
    flat_tau = [dict.fromkeys(ROWS, 1.0)] * 5
    spiky = {"mha+none": [0.40] * 5, GRAPH_SELECTIVE: [0.50 + j for j in JITTER]}
    verdict = judge(claim, graph_records({"mha+none": VANILLA_NORMS, GRAPH_SELECTIVE: smaller}, flat_tau, spiky))
    [spikiness] = verdict.parts
    assert spikiness.outcome == "not measurable" and spikiness.p_raw is None
    assert "the target fixes" in spikiness.reason and "measured +0.1" in spikiness.reason
    assert verdict.outcome == "not measurable" and "part 2 is not measurable, so the whole claim is" in verdict.reason
    larger = [n + 0.3 + j for n, j in zip(VANILLA_NORMS, JITTER[::-1], strict=True)]
    against = judge(claim, graph_records({"mha+none": VANILLA_NORMS, GRAPH_SELECTIVE: larger}, flat_tau, spiky))
    assert against.outcome == "contradicted" and "contradicted in part 1" in against.reason
    unprobed = judge(claim, graph_records({"mha+none": VANILLA_NORMS, GRAPH_SELECTIVE: smaller}, flat_tau))
    assert unprobed.parts[0].outcome == "not run" and "part 2 is not run, so the whole claim is" in unprobed.reason


def test_fewer_neighbours_lower_temperature_is_read_off_the_temperature_by_degree():
    """Half 2 of selective.graph_temperature: Pearson's r of τ_q against log₂ degree per seed (scipy's), against
    vanilla attention's 0; τ falling with the degree (fewer neighbours, lower temperature) supports it, τ rising
    contradicts the whole claim whatever the error says."""
    claim = CLAIMS["selective.graph_temperature"]
    norms = {"mha+none": VANILLA_NORMS, GRAPH_SELECTIVE: VANILLA_NORMS}
    falling = [{1: 1.99, 2: 1.9 + j, 4: 1.7 - j, 8: 1.5} for j in JITTER]
    records = graph_records(norms, falling)
    values = claim.parts[0].measure.read(records, GRAPH_SELECTIVE)
    degrees = sorted(ROWS)
    expected = stats.pearsonr([math.log2(d) for d in degrees], [falling[1][d] for d in degrees]).statistic
    assert values[1] == pytest.approx(expected) and claim.parts[0].measure.read(records, "mha+none") == dict.fromkeys(
        range(5), 0.0
    )
    verdict = judge(claim, records)
    assert verdict.parts[0].outcome == "supported"
    assert verdict.outcome == judge(dataclasses.replace(claim, parts=()), records).outcome  # the error half decides
    rising = judge(claim, graph_records(norms, [{d: 4 - t for d, t in tau.items()} for tau in falling]))
    assert rising.parts[0].outcome == "contradicted" and rising.outcome == "contradicted"


def bench_records(alibi_rates, sinusoidal_rates, alibi_mb=100.0, sinusoidal_mb=100.0, at=2) -> CompareResults:
    """The stored claims run with two more bench measurements: mha+alibi at L and mha+sinusoidal at ``at``·L."""
    data = json.loads((STORED / "results.json").read_text())
    length = data["budget"]["seq_len"]
    cores = 2
    for label, rates, mb, multiple in (
        ("mha+alibi", alibi_rates, alibi_mb, 1),
        ("mha+sinusoidal", sinusoidal_rates, sinusoidal_mb, at),
    ):
        measurements = data["bench"]["measurements"]
        measurements[:] = [m for m in measurements if not (m["variant"] == label and m["seq_len"] == multiple * length)]
        timing = {
            "tokens_per_s": float(np.median(rates)),
            "tokens_per_s_min": min(rates),
            "tokens_per_s_max": max(rates),
            "peak_mem_mb": mb,
            "load_average": 0.5,
            "cores": cores,
            "rates": list(rates),
            "round_load_averages": [0.5],
            "rounds": 1,
        }
        measurements.append(
            {"variant": label, "mode": "train", "seq_len": multiple * length, "batch_size": 8, "timing": timing}
        )
    return CompareResults.from_dict(data)


def test_alibis_speed_and_memory_halves_are_read_off_the_bench_at_l_against_2l():
    """The stored run, on a CPU, cannot measure the loss half (the sinusoidal calibration), and its bench holds
    mha+sinusoidal at 1× and 8× the training length, not 2×: both bench halves not run, saying so. With a 2L case:
    decided on the repeats' range beyond ±ln(1.11)/2 (speed) and on the peaks (memory); a slower or heavier ALiBi
    contradicts the whole primary though its loss half is not built."""
    claim = CLAIMS["alibi.short_matches_long"]
    stored = judge(claim, CompareResults.load(STORED / "results.json"))
    assert stored.outcome == "not measurable"
    assert "(1) validation loss at 2L (nats/token): not measurable: on the CPU: at neither size" in stored.reason
    assert [p.outcome for p in stored.parts] == ["not run", "not run"]
    assert "no 'train' bench of mha+sinusoidal at 2L = 512 tokens" in stored.parts[0].reason
    assert "at 256 and 2,048 tokens, the claims preset's bench cases being 1× and 8×" in stored.parts[0].reason
    assert stored.parts[1].levels["mha+alibi at 256 (peak MB)"] == pytest.approx(104.734375)

    def halves(*args, **kwargs):
        verdict = judge(claim, bench_records(*args, **kwargs))
        return verdict.outcome, [p.outcome for p in verdict.parts], verdict.parts

    outcome, parts, found = halves([130, 135, 140], [95, 100, 105], alibi_mb=80)
    assert parts == ["supported", "supported"] and outcome == "not measurable"  # the loss at 2L, on a CPU
    assert found[0].effect == pytest.approx(math.log(135 / 100))
    assert found[0].bounds == pytest.approx((math.log(130 / 105), math.log(140 / 95)))
    assert found[1].effect == pytest.approx(math.log(0.8)) and found[1].bounds == (found[1].effect,) * 2
    assert halves([101, 104, 130], [95, 100, 105])[1][0] == "inconclusive"  # the ranges reach across +δ
    assert halves([99, 100, 101], [99, 100, 101])[1] == ["negligible", "negligible"]
    outcome, parts, _ = halves([60, 62, 64], [95, 100, 105], alibi_mb=120)
    assert parts == ["contradicted", "contradicted"] and outcome == "contradicted"


def test_a_primary_of_several_halves_enters_holm_with_its_largest_p(ladder, registered):
    """ "Every half holds" is an intersection–union test: its p is the largest of the halves', so a strong half never
    carries a weak one through Holm's family."""
    strong = {"diff+rope": [1.0, 1.1, 0.9, 1.05], "mha+rope": BASELINE}
    weak = {"diff+rope": [1.6, 1.95, 1.4, 1.85], "mha+rope": BASELINE}
    own = _claim(strong, primary=True, id="test.halves")
    half_measure = Measure("y", "the test's runs", lambda _, label: dict(enumerate(weak[label])))
    claim = dataclasses.replace(own, parts=(Part(half_measure, LOWER, 0.1, "a reason"),))
    registered(claim)
    [verdict] = judge_all(ladder)
    p_own = paired_over_seeds(strong["diff+rope"], BASELINE).p_beyond(0.1)
    p_half = paired_over_seeds(weak["diff+rope"], BASELINE).p_beyond(0.1)
    assert p_own < p_half and verdict.p_raw == pytest.approx(p_own)
    assert verdict.p_adjusted == pytest.approx(p_half)  # a family of one: Holm leaves the largest p as it is
    assert verdict.parts[0].p_raw == pytest.approx(p_half)


def test_the_stored_run_says_what_each_rewritten_claim_measured():
    """docs/claims-one-size re-rendered (nothing trained): the parameter norm is smaller under selective attention as
    the paper says, the logits' effective scale, reported beside it, larger (its τ sits near the ceiling 2), the
    spikiness is not in the stored probes, τ_q falls with the degree while the
    error's half stays inconclusive, and ALiBi's speed and memory halves are not benched at 2L."""
    verdicts = {v.claim.id: v for v in judge_all(CompareResults.load(STORED / "results.json"))}
    norm = verdicts["selective.query_temperature_norm"]
    assert norm.difference.mean < -0.1 and norm.levels[GRAPH_SELECTIVE] < norm.levels["mha+none"]
    scale = ": τ̄_q·‖W_q W_kᵀ‖, the logits' effective scale (reported, not judged)"
    assert norm.levels[GRAPH_SELECTIVE + scale] - norm.levels["mha+none" + scale] == pytest.approx(0.3896, abs=1e-3)
    assert norm.parts[0].outcome == "not run" and "made before the task's probe recorded it" in norm.parts[0].reason
    assert norm.outcome == "not run" and ": supported:" in norm.reason
    # a task's models are its own, not the comparison's 0.12M language models beside which they ran
    assert norm.sizes[0].describe().startswith(f"task graph, run with the 0.12M rung: {norm.difference.mean:+.4f}")
    graph = verdicts["selective.graph_temperature"]
    assert graph.outcome == "inconclusive" and graph.parts[0].outcome == "supported"
    assert graph.parts[0].effect == pytest.approx(-0.6729, abs=1e-3)
    assert verdicts["alibi.short_matches_long"].outcome == "not measurable"
    record = verdicts_record(CompareResults.load(STORED / "results.json"), list(verdicts.values()))
    rows = {row["id"]: row for row in record["claims"]}
    assert [p["outcome"] for p in rows["alibi.short_matches_long"]["parts"]] == ["not run", "not run"]
    assert rows["selective.graph_temperature"]["parts"][0]["bounds"] == pytest.approx(
        list(graph.parts[0].bounds), abs=1e-12
    )


SEEDS_DIR = Path(__file__).parents[2] / "shared" / "seeds"  # the reviews the sources cite, beside the clone


@pytest.mark.skipif(not SEEDS_DIR.is_dir(), reason="the reviews in shared/seeds are not beside this clone")
def test_a_statement_that_quotes_a_review_quotes_it_verbatim():
    quoted = 0
    for claim in CLAIMS.values():
        for quote in re.findall(r'"([^"]*[\uac00-\ud7a3][^"]*)"', claim.statement):  # a quote in Korean
            number = re.search(r"shared/seeds/(\d{3})", claim.source)[1]
            [review] = SEEDS_DIR.glob(f"{number}_*.txt")
            assert quote in review.read_text(encoding="utf-8"), (claim.id, quote)
            quoted += 1
    assert quoted >= 2


@pytest.mark.parametrize(
    "name, home", [("judge_all", "attnzoo.claims"), ("Verdict", "attnzoo.claims"), ("holm", "attnzoo.stats")]
)
def test_the_names_compare_exported_before_the_claims_package_resolve_with_a_warning(name, home):
    import importlib

    import attnzoo.compare

    with pytest.warns(
        FutureWarning, match=rf"attnzoo.compare.{name} moved to {home}.{name}; .* removed in attnzoo 0.2"
    ):
        moved = getattr(attnzoo.compare, name)
    assert moved is getattr(importlib.import_module(home), name)
    with pytest.raises(AttributeError, match="has no attribute 'judge_everything'"):
        attnzoo.compare.judge_everything  # noqa: B018


def test_a_stored_run_is_judged_without_importing_the_compare_package():
    """The claims sit below compare: judging a results.json loads the claims and the records, not the runner."""
    code = (
        "import sys; from attnzoo.claims import judge_all; from attnzoo.results import CompareResults; "
        f"verdicts = judge_all(CompareResults.load({str(STORED / 'results.json')!r})); "
        "print(len(verdicts), sorted(m for m in sys.modules if m.startswith('attnzoo.compare')))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.split(maxsplit=1) == [str(len(CLAIMS)), "[]\n"]
