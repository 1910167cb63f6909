"""Issue 53: each model at its own learning rate (LR-sensitive), the regime in every verdict, the spike rule, and the
variant spellings they need (+lrF, +unmatched), on constructed records and on the stored ladder."""

import copy
import dataclasses
import json
import math
from pathlib import Path

import pytest
from test_protocol import records

from attnzoo.claims.claim import CLAIMS
from attnzoo.claims.learning_rate import (
    best_learning_rates,
    check_learning_rates,
    own_lr_claim,
    sweep_of,
    swept_models,
    with_learning_rate_check,
)
from attnzoo.claims.measures import SpikeRule, loss_spikes
from attnzoo.claims.report import brief_table, scoped_answer
from attnzoo.claims.verdicts import judge, judge_all, verdicts_record
from attnzoo.compare import CompareResults
from attnzoo.compare.presets import LADDERS, PRESETS, own_lr_rung
from attnzoo.results.ladder import Ladder, RungPart, load_ladder, merge_parts
from attnzoo.variants import Variant, count_parameters, matched_configs

DOCS = Path(__file__).parent.parent / "docs"
# δ = 0.02, claimed lower, made a primary: contradicted where diff+rope is 0.05 behind, supported where 0.05 ahead.
PRIMARY = dataclasses.replace(CLAIMS["dcmha.lm_loss"], id="test.primary", variant="diff+rope", primary=True)


def _relabelled(data: dict, renames: dict[str, str]) -> dict:
    """``data`` with its variants renamed (``diff+rope`` → ``diff+rope+lr2``): the same runs, trained elsewhere."""
    data = copy.deepcopy(data)
    for old, new in renames.items():
        variant = data["variants"].pop(old)
        for run in variant["runs"]:
            run["variant"] = new
        data["variants"][new] = variant
    return data


def _ladder(gap: float, renames: dict[str, str] | None = None) -> Ladder:
    """Two sizes 2× apart with diff+rope ``gap`` nats from mha+rope at 50, 75 and 100% of training."""
    sizes = [records(gaps=(gap,) * 3, parameters=p) for p in (1000, 2000)]
    return Ladder.of([CompareResults.from_dict(_relabelled(data, renames or {})) for data in sizes])


def test_a_primary_whose_verdict_changes_at_each_models_own_learning_rate_is_lr_sensitive():
    shared = _ladder(+0.05)
    verdict = judge(PRIMARY, shared)
    assert verdict.outcome == "contradicted"
    best = {"mha+rope": 1.0, "diff+rope": 2.0}
    at_own = own_lr_claim(PRIMARY, best)
    assert not isinstance(at_own, str) and (at_own.variant, at_own.baseline) == ("diff+rope+lr2", "mha+rope")

    flipped = _ladder(-0.05, {"diff+rope": "diff+rope+lr2"})  # ahead at its own rate
    [checked] = check_learning_rates([verdict], shared, flipped, best)
    assert checked.outcome == "LR-sensitive"
    assert "contradicted" in checked.reason and "supported" in checked.reason and "diff+rope ×2" in checked.reason
    assert checked.p_raw == verdict.p_raw  # the shared rate's test is kept, its outcome withheld

    held = _ladder(+0.05, {"diff+rope": "diff+rope+lr2"})  # as far behind at its own rate
    [same] = check_learning_rates([verdict], shared, held, best)
    assert same.outcome == "contradicted" and "the same at each model's own best learning rate" in same.reason

    # An exploratory verdict is re-judged the same way where the largest size trained its models at their own rates,
    # and not checked where it did not.
    exploratory = dataclasses.replace(verdict, claim=dataclasses.replace(PRIMARY, primary=False))
    [moved] = check_learning_rates([exploratory], shared, flipped, best)
    assert moved.outcome == "LR-sensitive" and "diff+rope ×2" in moved.reason
    [untrained] = check_learning_rates([exploratory], shared, shared, best)
    assert untrained.outcome == "contradicted"
    assert "not checked at each model's own best learning rate (diff+rope+lr2 against mha+rope) at the largest" in (
        untrained.reason
    )
    assert "diff+rope+lr2, which this comparison did not run" in untrained.reason
    [held_at_x1] = check_learning_rates([exploratory], shared, flipped, {"mha+rope": 1.0, "diff+rope": 1.0})
    assert held_at_x1.outcome == "contradicted"
    assert "the same at each model's own best learning rate: the sweep's best for diff+rope and mha+rope is ×1" in (
        held_at_x1.reason
    )
    [unswept] = check_learning_rates([exploratory], shared, flipped, {"mha+rope": 1.0})
    assert "not checked at each model's own best learning rate: no learning-rate sweep ran diff+rope" in unswept.reason


def test_an_uptrained_model_is_not_rejudged_when_its_sources_best_rate_moved():
    claim = CLAIMS["gqa.uptrained_close_to_mha"]
    reason = own_lr_claim(claim, {"mha+rope": 2.0})
    assert isinstance(reason, str) and "uptrained at its source's pre-training rate" in reason
    assert own_lr_claim(claim, {"mha+rope": 1.0}).variant == claim.variant  # type: ignore[union-attr]
    assert "no learning-rate sweep ran diff+rope" in own_lr_claim(CLAIMS["diff.lm_loss"], {"mha+rope": 1.0})
    # A compute multiple is read off the baseline at its own rate.
    at_own = own_lr_claim(CLAIMS["diff.lm_loss"], {"mha+rope": 0.5, "diff+rope": 1.0})
    assert at_own.baseline == "mha+rope+lr0.5" and at_own.measure.needs.startswith("mha+rope+lr0.5")  # type: ignore[union-attr]


def _sweep(losses: dict[str, list[float]]) -> CompareResults:
    """One size's comparison whose variants ran seeds 0–2 with these validation losses."""
    data = records()
    template = data["variants"]["mha+rope"]
    data["variants"] = {}
    for label, values in losses.items():
        variant = copy.deepcopy(template)
        for run, loss in zip(variant["runs"], values, strict=True):
            run["variant"], run["val"]["loss"] = label, loss
        data["variants"][label] = variant
    data["baseline"] = next(iter(losses))
    return CompareResults.from_dict(data)


def test_each_models_best_learning_rate_is_its_lowest_mean_validation_loss_over_the_seeds_every_rate_ran():
    sweep = _sweep(
        {
            "mha+rope": [2.00, 2.02, 2.01],
            "mha+rope+lr0.5": [2.10, 2.12, 2.11],
            "mha+rope+lr2": [1.99, 2.05, 2.02],  # 2.02 on average: ×1 wins
            "diff+rope+lr0.5": [2.30, 2.30, 2.30],
            "diff+rope+lr2": [2.00, 2.00, math.nan],  # one diverged seed: never the best
            "dcmha+rope+lr0.5": [2.40, 2.40, 2.40],
            "dcmha+rope+lr2": [1.90, 1.91, 1.92],
        }
    )
    stored = _sweep({"mha+rope": [2.0, 2.0, 2.0], "diff+rope": [2.2, 2.2, 2.2], "dcmha+rope": [2.0, 2.0, 2.0]})
    best = best_learning_rates([sweep, stored], ["mha+rope", "diff+rope", "dcmha+rope"])
    assert best == {"mha+rope": 1.0, "diff+rope": 1.0, "dcmha+rope": 2.0}
    tied = _sweep({"mha+rope": [2.0] * 3, "mha+rope+lr0.5": [2.0] * 3, "mha+rope+lr2": [2.0] * 3})
    assert best_learning_rates([tied], ["mha+rope"]) == {"mha+rope": 1.0}  # a tie keeps the shared rate
    with pytest.raises(ValueError, match=r"no run of selective\+rope\+lr0\.5"):
        best_learning_rates([sweep], ["selective+rope"])
    larger = CompareResults.from_dict(records(parameters=2000))
    with pytest.raises(ValueError, match="at one model size"):
        best_learning_rates([sweep, larger], ["mha+rope"])


def test_a_ladder_whose_rungs_hold_a_sweep_as_their_parts_is_checked_at_each_models_own_learning_rate():
    small, large = (records(gaps=(0.05,) * 3, parameters=p) for p in (1000, 2000))
    sweep = _relabelled(records(gaps=(-0.05,) * 3, parameters=1000), {"diff+rope": "diff+rope+lr2"})
    for label in ("mha+rope+lr0.5", "mha+rope+lr2", "diff+rope+lr0.5"):
        sweep["variants"][label] = _relabelled(sweep, {"mha+rope": label})["variants"][label]
        for run in sweep["variants"][label]["runs"]:
            run["val"]["loss"] += 1.0  # far worse: MHA's best stays ×1, Diff's ×0.5 loses to its ×2
    own = _relabelled(records(gaps=(-0.05,) * 3, parameters=2000), {"diff+rope": "diff+rope+lr2"})
    del own["variants"]["mha+rope"]  # a part need not retrain the baseline
    own["baseline"] = "diff+rope+lr2"
    loaded = {name: CompareResults.from_dict(data) for name, data in locals().items() if name in ("small", "large")}
    ladder = Ladder.of(
        [
            merge_parts(loaded["small"], [CompareResults.from_dict(sweep)]),
            merge_parts(loaded["large"], [CompareResults.from_dict(own)]),
        ]
    )
    assert ladder.largest.baseline == "mha+rope" and "diff+rope+lr2" in ladder.largest.variants
    assert swept_models(ladder.rungs[0]) == ["mha+rope", "diff+rope"]
    shared = judge(PRIMARY, ladder)
    [checked] = with_learning_rate_check([shared], ladder)
    assert shared.outcome == "contradicted" and checked.outcome == "LR-sensitive" and "diff+rope ×2" in checked.reason
    assert with_learning_rate_check([shared], Ladder.of(list(loaded.values()))) == [shared]  # no sweep, no check

    other = copy.deepcopy(sweep)
    other["spec"]["train"]["steps"] = 1
    with pytest.raises(ValueError, match="is not a part of"):
        merge_parts(loaded["small"], [CompareResults.from_dict(other)])

    # Stored as a part, the sweep is read off its own runs alone: Diff's ×1 is the rung's (another machine's), so
    # only MHA, which the sweep ran at every multiple, is swept.
    part = RungPart(Path("lr-sweep"), CompareResults.from_dict(sweep), ladder.rungs[0].preset, ())
    stored = dataclasses.replace(ladder, parts=(part,))
    assert set(sweep_of(stored).variants) == set(sweep["variants"]) and swept_models(part.results) == ["mha+rope"]
    [noted] = with_learning_rate_check([shared], stored)
    assert noted.outcome == "contradicted" and "no learning-rate sweep ran diff+rope" in noted.reason
    with_own = copy.deepcopy(sweep)
    with_own["variants"]["diff+rope"] = small["variants"]["diff+rope"]
    whole = dataclasses.replace(part, results=CompareResults.from_dict(with_own))
    assert swept_models(sweep_of(dataclasses.replace(ladder, parts=(whole,)))) == ["mha+rope", "diff+rope"]
    only_moved = copy.deepcopy(sweep)
    del only_moved["variants"]["mha+rope"]
    moved = dataclasses.replace(part, results=CompareResults.from_dict(only_moved | {"baseline": "diff+rope+lr2"}))
    with pytest.raises(ValueError, match="a sweep trains its own ×1 runs"):
        sweep_of(dataclasses.replace(ladder, parts=(moved,)))


def test_the_sweep_and_the_own_rate_rung_train_what_the_check_reads():
    sweep = PRESETS["claims-lr"]
    small = LADDERS["claims"].rungs[0]
    assert sweep.model == small.model and sweep.train == small.train and len(sweep.seeds) >= 2
    assert {v.lr for v in sweep.variants} == {0.5, 1.0, 2.0}
    assert sweep.train_for(Variant.parse("dcmha+rope+lr2")).lr == 2 * small.train.lr
    assert own_lr_rung({"mha+rope": 1.0, "dcmha+rope": 1.0, "mha+alibi": 2.0}) is None  # no ALiBi at the large rung
    for claim in ("alibi.in_distribution_vs_rope", "gqa.close_to_mha", "dcmha.post_beats_pre"):
        # a decided exploratory claim's models are swept, so its verdict says whether their own rates would move it
        models = (CLAIMS[claim].variant, CLAIMS[claim].baseline)
        assert {f"{model}+lr{m}" for model in models for m in ("0.5", "2")} <= set(sweep.variant_labels), claim
    rung = own_lr_rung({"mha+rope": 1.0, "dcmha+rope": 2.0})
    assert (
        rung is not None
        and rung.variant_labels == ["dcmha+rope+lr2"]
        and rung.model == LADDERS["claims"].rungs[1].model
    )
    # a model of the large rung's ablations part moves too: an exploratory claim decided there is re-judged
    post_alone = own_lr_rung({"dcmha+rope": 1.0, "dcmha[pre_compose=false]+rope": 2.0})
    assert post_alone is not None and post_alone.variant_labels == ["dcmha[pre_compose=false]+rope+lr2"]
    assert "minutes" in sweep.description


def test_the_floor_a_run_at_its_own_learning_rate_is_gated_at_is_its_own():
    data = _relabelled(records(), {"diff+rope": "diff+rope+lr2"})
    floor = data["budget"]["min_lr"]
    for label, variant in data["variants"].items():
        for run in variant["runs"]:
            run["final_lr"] = floor * Variant.parse(label).lr
    claim = dataclasses.replace(PRIMARY, primary=False, variant="diff+rope+lr2")
    assert judge(claim, CompareResults.from_dict(data)).gate.passed
    data["variants"]["diff+rope+lr2"]["runs"][0]["final_lr"] = floor  # the shared rate's floor: not its schedule's
    gate = judge(claim, CompareResults.from_dict(data)).gate
    assert not gate.passed and "not its schedule's floor 0.0004" in gate.reason


def test_a_verdict_names_the_regime_read_off_its_stored_runs_and_the_papers_own():
    ladder, _ = load_ladder(DOCS / "claims")
    verdicts = {v.claim.id: v for v in judge_all(ladder)}
    dcmha = verdicts["dcmha.compute_equivalence"]
    assert dcmha.regime is not None and dcmha.regime.confounded
    assert dcmha.regime.describe() == (
        "0.12–0.25M parameters (2 layers, 4 heads × 16–24), shakespeare (byte tokens), 21 tokens per parameter, peak "
        "learning rate 0.003 for every model (5% warmup, cosine to 0.1× the peak); head size and model size change "
        "together across the sizes (16 → 24), so their effects are confounded"
    )
    assert scoped_answer(dcmha) == (
        "not reproduced at 0.12–0.25M parameters, heads ≤ 24: the effect goes the other way (head size grows with "
        "model size there: the two confounded)"
    )
    assert scoped_answer(verdicts["selective.lm_loss"]).startswith("no effect beyond the smallest of interest at 0.12")
    row = next(r for r in verdicts_record(ladder, list(verdicts.values()))["claims"] if r["id"] == "diff.lm_loss")
    assert row["regime"]["head_dims"] == [16, 24] and row["regime"]["confounded"]
    assert "head dim 128" in row["paper_regime"]
    denoising = verdicts["selective.value_temperature_denoising"].regime  # a task's claim: its task's model
    assert denoising is not None and denoising.describe() == (
        "0.013M parameters (1 layer, 2 heads × 16), the denoising task (synthetic tokens), 471 tokens per parameter, "
        "peak learning rate 0.01 for every model (the task's budget: 100 warmup steps of 3000)"
    )
    assert scoped_answer(verdicts["selective.value_temperature_denoising"]) == (
        "reproduced at 0.013M parameters, heads ≤ 16"
    )
    table = brief_table(list(verdicts.values())).to_markdown()
    assert "| measured at |" in table and "head size confounded with size" in table
    one = {v.claim.id: v for v in judge_all(CompareResults.load(DOCS / "claims-one-size" / "results.json"))}
    assert not one["diff.lm_loss"].regime.confounded  # type: ignore[union-attr]
    assert all(c.paper_regime for c in CLAIMS.values() if c.primary)


@pytest.mark.parametrize(
    ("losses", "spikes"),
    [
        ([3.0 - 0.05 * i for i in range(20)], 0),  # a falling curve
        ([2.0] * 6 + [2.15] + [2.0] * 6, 1),  # one step 0.15 nats above the median of the five before
        ([2.0] * 6 + [2.08] + [2.0] * 6, 0),  # 0.08: noise
        ([2.0] * 6 + [2.3] * 4 + [2.0] * 3, 3),  # a plateau: counted until it is the median (3 of its 4 steps)
        ([9.0, 2.0, 2.0, 2.0, 2.0, 2.0, 2.0], 0),  # the first window only sets the median
        ([2.0] * 6 + [math.nan], 1),  # a non-finite loss is a spike
    ],
)
def test_the_spike_rule_counts_steps_above_the_running_median_by_its_margin(losses, spikes):
    assert SpikeRule(window=5, nats=0.1).count(losses) == spikes


def test_mqa_less_stable_is_read_from_each_runs_logged_training_losses():
    claim = CLAIMS["gqa.mqa_less_stable"]
    assert claim.is_run and claim.preset == "claims-stability" and "median of the 5" in claim.measure.label
    data = _relabelled(records(), {"mha+rope": "mha+rope+kv2", "diff+rope": "mha+rope+kv1"})
    data["baseline"], data["preset"] = "mha+rope+kv2", "claims-stability"
    for seed, run in enumerate(data["variants"]["mha+rope+kv1"]["runs"]):
        run["train_curve"] = [[20 * i, 2.0 + (0.5 if i in (8, 12)[: seed + 1] else 0.0)] for i in range(16)]
    measure = loss_spikes(SpikeRule(), "claims-stability")
    assert measure.read(CompareResults.from_dict(data), "mha+rope+kv1") == {0: 1.0, 1: 2.0, 2: 2.0}
    data["preset"] = "claims"  # the same models at another comparison's learning rate: not the claim's experiment
    assert measure.read(CompareResults.from_dict(data), "mha+rope+kv1") is None
    assert PRESETS["claims-stability"].variant_labels == ["mha+rope+kv2", "mha+rope+kv1"]


def test_an_unmatched_variant_keeps_the_baselines_mlp_and_adds_its_mechanisms_parameters():
    variant = Variant.parse("dcmha+rope+unmatched")
    assert not variant.matched and variant.label == "dcmha+rope+unmatched" and variant.training_parts == ()
    rung = PRESETS["claims-unmatched"]
    baseline = rung.baseline_config(256)
    configs = matched_configs(Variant.parse_all(["dcmha+rope", "dcmha+rope+unmatched"]), baseline)
    assert configs["dcmha+rope+unmatched"].mlp_hidden_dim == baseline.mlp_hidden_dim
    assert configs["dcmha+rope"].mlp_hidden_dim < baseline.mlp_hidden_dim  # today's: paid for by the MLP
    added = count_parameters(configs["dcmha+rope+unmatched"]) / count_parameters(baseline)
    assert 1.05 < added < 1.1 and PRESETS["claims-unmatched"].variant_labels == ["dcmha+rope+unmatched"]
    judged = CLAIMS["dcmha.compute_equivalence_unmatched"]
    tokens = rung.train.steps * rung.train.tokens_per_step
    assert tokens / count_parameters(configs[judged.variant]) >= judged.gate.min_tokens_per_parameter
    labels = {v.label: v for v in Variant.parse_all(["diff+rope+lr2", "mha+rope+kv2+x1.5+lr0.5"])}
    assert labels["diff+rope+lr2"].training_parts == ("+lr2",) and labels["mha+rope+kv2+x1.5+lr0.5"].lr == 0.5
    with pytest.raises(ValueError, match=r"drop \+lrF"):
        Variant.parse("mha+rope+kv2+up0.05+lr2")
    with pytest.raises(ValueError, match="bad learning-rate multiple"):
        Variant.parse("mha+rope+lr0")


def test_the_ablations_are_parts_of_the_ladders_rungs_at_their_model_and_schedule():
    small, large = LADDERS["claims"].rungs
    for name, rung, labels in (
        ("claims-static", small, PRESETS["claims-static"].variant_labels),
        ("claims-unmatched", large, ["dcmha+rope+unmatched"]),
        ("claims-lr", small, PRESETS["claims-lr"].variant_labels),
        ("claims-ablations", small, PRESETS["claims-ablations"].variant_labels),
        ("claims-ablations-large", large, PRESETS["claims-ablations-large"].variant_labels),
    ):
        part = PRESETS[name]
        assert (part.model, part.train, part.evals) == (rung.model, rung.train, rung.evals)
        assert part.variant_labels == labels and labels[-1] not in rung.variant_labels
    claim = CLAIMS["dcmha.dynamic_beats_static"]
    # its own sweep: both its models at every multiple, so its report checks the verdict at each one's best rate
    models = (claim.variant, claim.baseline)
    swept = {f"{model}+lr{multiple}" for model in models for multiple in ("0.5", "2")}
    assert swept | set(models) == set(PRESETS["claims-static"].variant_labels)
    assert claim.baseline == "dcmha[static_only=true]+rope" and claim.is_run and claim.preset == "claims-static"
    assert CLAIMS["dcmha.compute_equivalence_unmatched"].preset == "claims-unmatched"
    extras = set(PRESETS["claims-ablations"].variant_labels)
    claims = ("gqa.close_to_mha", "alibi.in_distribution_vs_rope", "dcmha.post_beats_pre")
    for claim in (*claims, "dcmha.query_wise_slightly_worse", "selective.position_temperature_dilution"):
        # each exploratory claim the part is for finds both its models in the rung with the part merged
        assert {CLAIMS[claim].variant, CLAIMS[claim].baseline} <= extras | set(small.variant_labels), claim
    extras = set(PRESETS["claims-ablations-large"].variant_labels)
    for claim in ("dcmha.post_beats_pre", "gqa.close_to_mha", "dcmha.query_wise_slightly_worse"):
        assert {CLAIMS[claim].variant, CLAIMS[claim].baseline} <= extras | set(large.variant_labels), claim
    assert json.dumps(dataclasses.asdict(PRESETS["claims-stability"].train))  # a preset as a config writes it


def test_the_extrapolation_preset_scores_16L_at_the_small_rungs_model_and_schedule():
    small = LADDERS["claims"].rungs[0]
    alone = PRESETS["claims-extrapolation"]
    assert (alone.model, alone.train, alone.seeds) == (small.model, small.train, small.seeds)
    assert alone.evals.extrapolation_multiples == (1, 2, 16) and 16 not in small.evals.extrapolation_multiples
    claim = CLAIMS["alibi.extrapolation_vs_rope"]
    assert claim.is_run and claim.preset == "claims-extrapolation" and claim.measure.label.startswith("loss at 16×")
    assert alone.variant_labels[:2] == [claim.baseline, claim.variant]
    models = (claim.variant, claim.baseline)  # and its own sweep: each at every multiple
    assert set(alone.variant_labels) == set(models) | {f"{m}+lr{x}" for m in models for x in ("0.5", "2")}
