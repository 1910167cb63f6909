"""A ladder end to end: two micro rungs run into their directories, the ladder's report judges them together, a
ladder copied together from rungs run apart gives the same verdicts, and the CPU and GPU ladders meet the budget by
construction."""

import contextlib
import dataclasses
import io
import json
import shutil

import pytest
from record_helpers import assert_same_record
from training_helpers import write_text_corpus

from attnzoo.compare.presets import LADDERS, PRESETS
from attnzoo.compare.report_ladder import write_ladder_report
from attnzoo.compare.runner import run_compare, run_ladder
from attnzoo.compare.spec import LadderSpec
from attnzoo.data.corpora import prepare_corpus
from attnzoo.results.ladder import load_ladder
from attnzoo.training.config import DataConfig
from attnzoo.variants import Variant, count_parameters, matched_configs


def _micro_ladder(text) -> LadderSpec:
    data = DataConfig(corpus=str(text))
    micro = PRESETS["micro"]
    small = dataclasses.replace(
        micro,
        name="small",
        train=dataclasses.replace(micro.train, data=data),
        variants=("mha+rope", "diff+rope", "mha+rope+kv1+up0.5"),
        tasks=(),
        evals=dataclasses.replace(micro.evals, bench_cases=(), val_windows=16),
    )
    large = dataclasses.replace(small, name="large", model={"dim": 48, "n_layers": 2, "n_heads": 2})
    return LadderSpec("micro-ladder", "two micro rungs", (small, large))


@pytest.fixture(scope="module")
def ladder_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("ladder")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("ATTNZOO_CACHE_DIR", str(root / "cache"))
        spec = _micro_ladder(write_text_corpus(root / "text.txt"))
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            result = run_ladder(spec, root / "out", progress=False)
    return root / "out", result, printed.getvalue()


def test_a_ladder_runs_each_rung_in_its_directory_and_judges_them_together(ladder_run):
    out, result, printed = ladder_run
    assert result.interrupted_by is None and [r.preset for r in result.ladder.rungs] == ["small", "large"]
    assert (out / "small" / "results.json").is_file() and (out / "large" / "report.md").is_file()
    verdicts = json.loads((out / "verdicts.json").read_text())
    assert verdicts["sizes"] == [r.variants["mha+rope"].parameters for r in result.ladder.rungs]
    diff = next(row for row in verdicts["claims"] if row["id"] == "diff.lm_loss")
    assert len(diff["sizes"]) == 2 and diff["outcome"] == "not measurable"  # 6 steps meet no budget
    # The screen ends with the ladder's answer, judged across the sizes, below the largest rung's one-size line.
    last = printed.splitlines()[-3:]
    assert last[0].startswith("primaries over 2 sizes") and "diff.lm_loss not measurable" in last[0]
    assert last[1].startswith("claims over 2 sizes: ") and last[2].startswith(f"ladder report: {out / 'report.md'}")
    assert "speed vs baseline" not in (out / "small" / "report.md").read_text()  # a rung benches nothing
    report = (out / "report.md").read_text()
    assert "| [small](small/report.md) |" in report and "## The papers' claims" in report
    uptrained = result.ladder.largest.versus_baseline("mha+rope+kv1+up0.5", "val_loss")
    assert (
        "## Uptraining by fraction" in report
        and f"| large | mha+rope+kv1+up0.5 | 50% | {uptrained.mean:+.4f} |" in report
    )


def test_rungs_run_apart_merge_by_being_copied_side_by_side(ladder_run, tmp_path):
    out, _, _ = ladder_run
    merged = tmp_path / "merged"
    for rung in ("large", "small"):  # from two "leases", in either order
        shutil.copytree(out / rung, merged / rung)
    ladder, dirs = load_ladder(merged)
    paths = write_ladder_report(ladder, dirs, merged)
    assert (
        json.loads(paths["verdicts"].read_text())["claims"] == json.loads((out / "verdicts.json").read_text())["claims"]
    )
    with pytest.raises(ValueError, match="holds no comparison"):
        load_ladder(tmp_path / "empty")


def test_a_rung_run_on_its_own_merges_with_the_other_to_the_verdicts_of_one_run_holding_both(ladder_run, tmp_path):
    """A GPU ladder grows a rung per lease: the large rung trained alone, as a later lease runs it, then copied beside
    the small one, is judged as the ladder that trained both in one run."""
    out, _, _ = ladder_run
    root = out.parent
    large = next(rung for rung in _micro_ladder(root / "text.txt").rungs if rung.name == "large")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("ATTNZOO_CACHE_DIR", str(root / "cache"))
        alone = run_compare(large, tmp_path / "second-lease" / "large", progress=False)
    assert alone.interrupted_by is None
    merged = tmp_path / "merged"
    shutil.copytree(out / "small", merged / "small")
    shutil.copytree(tmp_path / "second-lease" / "large", merged / "large")
    ladder, dirs = load_ladder(merged)
    assert [d.name for d in dirs] == ["small", "large"]
    paths = write_ladder_report(ladder, dirs, merged)
    merged_verdicts = json.loads(paths["verdicts"].read_text())
    one_run = json.loads((out / "verdicts.json").read_text())
    assert merged_verdicts["sizes"] == one_run["sizes"] and merged_verdicts["claims"] == one_run["claims"]
    # The large rung's losses themselves, not only the verdicts drawn from them, are those of the run holding both.
    assert ladder.largest.variants["diff+rope"].runs[0].val.loss == pytest.approx(
        load_ladder(out)[0].largest.variants["diff+rope"].runs[0].val.loss, rel=0, abs=0
    )


def test_a_comparison_at_a_rungs_model_and_schedule_stored_beside_it_is_a_part_merged_into_it(ladder_run, tmp_path):
    """An ablation or a learning-rate sweep run later at a rung's setup adds its variants to that rung, the rung
    keeping its own runs of a label both ran; the ladder's report names the part, its commits and machine. A
    comparison of another schedule at that size is no part but a second rung, refused."""
    out, _, _ = ladder_run
    copied = tmp_path / "ladder"
    for rung in ("small", "large"):
        shutil.copytree(out / rung, copied / rung)
    part = json.loads((out / "small" / "results.json").read_text())
    ablation = part["variants"].pop("diff+rope")
    for run in ablation["runs"]:
        run["variant"] = "diff+rope+unmatched"  # the same runs, named as another variant for the test
        run["provenance"]["commit"] = "0123456789abcdef"
    retrained = part["variants"]["mha+rope"]
    retrained["runs"][0]["val"]["loss"] += 0.01  # the part's own MHA, trained elsewhere: the rung's is kept
    part["variants"] = {"mha+rope": retrained, "diff+rope+unmatched": ablation}
    (copied / "small-part").mkdir()
    (copied / "small-part" / "results.json").write_text(json.dumps(part))
    ladder, dirs = load_ladder(copied)
    own, _ = load_ladder(out)
    assert [d.name for d in dirs] == ["small", "large"]
    assert set(ladder.rungs[0].variants) == {"mha+rope", "diff+rope", "mha+rope+kv1+up0.5", "diff+rope+unmatched"}
    assert ladder.rungs[0].variants["mha+rope"] == own.rungs[0].variants["mha+rope"]
    assert [(p.path.name, p.rung, p.added) for p in ladder.parts] == [("small-part", "small", ("diff+rope+unmatched",))]
    report = write_ladder_report(ladder, dirs, copied)["markdown"].read_text()
    assert "## The rungs' parts" in report
    row = "| [small](small-part/report.md) | small | mha+rope (the rung's runs judged), diff+rope+unmatched | "
    row += "0123456789ab"
    assert row in report
    assert "## The rungs' parts" not in (out / "report.md").read_text()

    part["spec"]["train"]["steps"] += 1  # another schedule at the small rung's size: not a part, a second rung
    (copied / "small-part" / "results.json").write_text(json.dumps(part))
    with pytest.raises(ValueError, match="two comparisons share a baseline size"):
        load_ladder(copied)


def test_every_rung_of_the_cpu_ladder_meets_the_budget_part_by_construction():
    """Gate (a): at least 20 tokens per parameter and at most 4 passes, from the spec and the corpus it names."""
    for rung in LADDERS["claims"].rungs:
        corpus = prepare_corpus(rung.train.data.corpus, rung.train.data.tokenizer, rung.train.data.val_fraction)
        parameters = count_parameters(rung.baseline_config(corpus.tokenizer.vocab_size))
        tokens = rung.train.steps * rung.train.tokens_per_step
        assert tokens / parameters >= 20 and tokens / len(corpus.train) <= 4, rung.name
        assert rung.train.steps % 4 == 0 and rung.train.eval_interval * 4 == rung.train.steps  # 50, 75, 100%
        assert rung.train.eval_windows >= 1024
    sizes = [count_parameters(r.baseline_config(256)) for r in LADDERS["claims"].rungs]
    assert sizes[-1] >= 2 * sizes[0]


# pysource on the GPU image is at least the standard library's and torch's and transformers' sources (10.7M + 90.4M
# bytes, benchmarks/results/gpu-2026-11-26b), 90% of it the training split; the kit's corpus stage counts the rest.
GPU_IMAGE_MIN_TRAIN_TOKENS = int(0.9 * (10.7e6 + 90.4e6))


def test_every_rung_of_the_gpu_ladder_meets_the_budget_part_by_construction():
    """Gate (a) for every variant of each rung (tokens per parameter of its own matched model, passes over the least
    pysource a GPU image holds), heads of 48, 2× apart, one protocol across the rungs, 3 seeds of the primaries."""
    ladder = LADDERS["gpu-ladder"]
    sizes = []
    for rung in ladder.rungs:
        configs = matched_configs(rung.variants, rung.baseline_config(256))  # pysource: bytes as tokens
        tokens = rung.train.steps * rung.train.tokens_per_step
        for label, config in configs.items():
            assert tokens / count_parameters(config) >= 20, (rung.name, label)
            # Diff pairs MHA's 4 heads into 2 of twice the size, over the whole width (see the comment on _gpu_rung).
            expected = 96 if label.startswith("diff") else 48
            assert (config.head_dim or config.dim // config.n_heads) == expected, (rung.name, label)
        assert tokens / GPU_IMAGE_MIN_TRAIN_TOKENS <= 1, rung.name  # read at most once
        # The kit's steps, shrunk by up to 4% for a slower GPU than estimated, still meet gate (a).
        assert 0.96 * tokens / max(count_parameters(c) for c in configs.values()) >= 20, rung.name
        assert rung.train.steps % 4 == 0 and rung.train.eval_interval * 4 == rung.train.steps  # 50, 75, 100%
        assert rung.train.eval_windows >= 1024 and rung.train.device == "cuda"
        assert rung.variant_labels == ["mha+rope", "diff+rope", "selective+rope", "dcmha+rope"]
        assert rung.seeds == (0, 1, 2) and rung.train.data.corpus == "pysource"
        sizes.append(count_parameters(configs["mha+rope"]))
    assert sizes[1] >= 2 * sizes[0]
    # What Ladder.of holds fixed across rungs.
    assert len({(r.train.data, r.train.seq_len, r.train.lr, r.train.min_lr_ratio) for r in ladder.rungs}) == 1


def test_the_alibi_ladder_trains_at_the_gpu_ladders_sizes_on_the_same_tokens_and_benches_l_against_2l():
    """gpu-alibi: gate (a) for every variant at both sizes, the sinusoidal model at 2L on the same tokens a step (half
    the sequences), scored at L, 2L and 16L, and a bench at L and 2L for the primary's speed and memory."""
    alibi, ladder = LADDERS["gpu-alibi"], LADDERS["gpu-ladder"]
    for rung, same_size in zip(alibi.rungs, ladder.rungs, strict=True):
        assert (rung.model, rung.train, rung.seeds) == (same_size.model, same_size.train, same_size.seeds)
        assert rung.variant_labels == ["mha+rope", "mha+alibi", "mha+sinusoidal", "mha+sinusoidal+len2"]
        configs = matched_configs(rung.variants, rung.baseline_config(256))
        for variant in rung.variants:
            train = rung.train_for(variant)
            assert train.tokens_per_step == rung.train.tokens_per_step and train.steps == rung.train.steps
            assert train.steps * train.tokens_per_step / count_parameters(configs[variant.label]) >= 20
            assert configs[variant.label].max_seq_len == train.seq_len
        assert rung.train_for(Variant.parse("mha+sinusoidal+len2")).seq_len == 2 * rung.train.seq_len
        assert {1, 2, 16} <= set(rung.evals.extrapolation_multiples)
        assert {("train", 1), ("train", 2)} <= set(rung.evals.bench_cases)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["gpu-ladder", "gpu-alibi"])
def test_a_gpu_ladders_time_estimate_follows_from_the_stored_h100_steps(name):
    """The description's minutes: gpu-lm's timed steps on an H100 scaled by FLOPs per token at each run's own length,
    3 seeds × 4 variants; a model with no timed step (ALiBi's, sinusoidal's) at MHA + RoPE's time per FLOP."""
    from pathlib import Path

    from attnzoo.model import training_flops_per_token

    timing = Path(__file__).parents[1] / "benchmarks" / "results" / "gpu-2026-11-25" / "timing.json"
    measured = json.loads(timing.read_text())["seconds_per_step"]
    gpu_lm = PRESETS["gpu-lm"]
    measured_at = matched_configs(Variant.parse_all(list(measured)), gpu_lm.baseline_config(256))
    minutes = []
    for rung in LADDERS[name].rungs:
        configs = matched_configs(rung.variants, rung.baseline_config(256))
        seconds = 0.0
        for variant in rung.variants:
            timed, train = variant.label if variant.label in measured else "mha+rope", rung.train_for(variant)
            ratio = training_flops_per_token(configs[variant.label], train.seq_len) / training_flops_per_token(
                measured_at[timed], gpu_lm.train.seq_len
            )
            per_token = measured[timed] / gpu_lm.train.tokens_per_step * ratio
            seconds += len(rung.seeds) * train.steps * train.tokens_per_step * per_token
        minutes.append(f"{seconds / 60:.1f}")
    assert f"estimated {minutes[0]} and {minutes[1]} minutes of H100 training" in LADDERS[name].description


def test_report_only_on_a_folder_of_rungs_judges_the_ladder(ladder_run, tmp_path, capsys):
    from attnzoo.cli import main

    out, _, _ = ladder_run
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    (copy / "verdicts.json").unlink()
    assert main(["compare", "--out", str(copy), "--report-only"]) == 0
    said = capsys.readouterr().out.splitlines()
    assert said[0].startswith(
        "primaries over 2 sizes (Holm-corrected together): alibi.short_matches_long not measurable;"
    )
    assert said[1].startswith("claims over 2 sizes: ") and f"report: {copy / 'report.md'}" in said[2]
    assert (
        json.loads((copy / "verdicts.json").read_text())["claims"]
        == json.loads((out / "verdicts.json").read_text())["claims"]
    )


def test_a_ladder_preset_refuses_the_flags_that_would_break_its_protocol(capsys):
    from attnzoo.cli import main

    assert main(["compare", "--preset", "claims", "--steps", "10"]) == 1
    assert (
        "--preset claims is a ladder whose sizes share one protocol: --steps would break it" in capsys.readouterr().err
    )


def test_the_stored_ladder_re_renders_to_the_committed_report(tmp_path):
    """docs/claims is a pure function of its rungs' results.json: the verdicts and the report agree."""
    from pathlib import Path

    stored = Path(__file__).parents[1] / "docs" / "claims"
    copy = tmp_path / "claims"
    shutil.copytree(stored, copy)
    ladder, dirs = load_ladder(copy)
    paths = write_ladder_report(ladder, dirs, copy)
    assert_same_record(json.loads(paths["verdicts"].read_text()), json.loads((stored / "verdicts.json").read_text()))
    assert paths["markdown"].read_text() == (stored / "report.md").read_text()


def test_a_claim_a_calibration_rules_out_on_the_cpu_is_not_measurable_there_and_not_run_elsewhere():
    """ALiBi's sinusoidal claims: the stored ladder (on a CPU) trained no sinusoidal model, and the committed
    calibration says no CPU size would have made a competent one; the same runs labelled as a GPU's leave them "not
    run", since a GPU size might."""
    from pathlib import Path

    from attnzoo.claims import CLAIMS, judge
    from attnzoo.results.ladder import Ladder

    ladder, _ = load_ladder(Path(__file__).parents[1] / "docs" / "claims")
    on_gpu = Ladder.of(
        [dataclasses.replace(r, machine=dataclasses.replace(r.machine, device="cuda:0")) for r in ladder.rungs]
    )
    for claim_id in ("alibi.in_distribution_vs_sinusoidal", "alibi.short_matches_long"):
        claim = CLAIMS[claim_id]
        on_cpu = judge(claim, ladder)
        assert on_cpu.outcome == "not measurable"
        assert f"on the CPU: {claim.cpu_calibration}" in on_cpu.reason
        assert judge(claim, on_gpu).outcome == "not run"
    # ALiBi's primary names the GPU ladder that trains its sinusoidal model at 2L.
    short = CLAIMS["alibi.short_matches_long"]
    assert judge(short, ladder).would_change.startswith("the gpu-alibi preset on a GPU, at a size the calibration")
    needs = "needs extrapolation to 2× for mha+alibi and mha+sinusoidal+len2, which this comparison did not run"
    assert f"{needs}; the gpu-alibi preset runs them on a GPU" in judge(short, on_gpu).reason
    # A claim with no calibration is "not run" on the CPU as well.
    assert judge(CLAIMS["alibi.extrapolation_vs_rope"], ladder).outcome == "not run"


def test_a_primary_whose_gate_stops_it_at_one_size_names_that_gate_not_a_missing_size():
    """The stored ladder: Diff's gap to MHA at 0.12M still moved 0.0125 nats over the last quarter (gate (c) allows
    0.01), so the primary is judged at 0.25M alone; the verdict says which gate stopped the other size, and the remedy
    is at that size, which the ladder has."""
    from pathlib import Path

    from attnzoo.claims import CLAIMS, judge

    ladder, _ = load_ladder(Path(__file__).parents[1] / "docs" / "claims")
    diff = judge(CLAIMS["diff.lm_loss"], ladder)
    assert diff.outcome == "not measurable" and len(ladder.rungs) == 2
    assert "at 0.12M (head 16) not measurable: (c) gap stability: the gap moved 0.0125 nats" in diff.reason
    assert diff.would_change == "the gates passing at 0.12M (more seeds or steps there)"
