import argparse
import base64
import contextlib
import dataclasses
import io
import itertools
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pytest
import torch
from training_helpers import write_text_corpus

from attnzoo.bench import BenchResult
from attnzoo.claims import CLAIMS
from attnzoo.claims.verdicts import counts, judge, judge_all
from attnzoo.cli.compare import add_arguments, run
from attnzoo.compare import (
    PRESETS,
    SCHEMA_VERSION,
    CompareResults,
    EvalSpec,
    TaskBudget,
    TaskSpec,
    resolve_spec,
    run_compare,
    runner,
    throughput,
)
from attnzoo.compare.presets import LADDERS
from attnzoo.compare.progress import Schedule
from attnzoo.compare.report import write_report
from attnzoo.compare.tasks import task_configs
from attnzoo.evals import TASKS, Task, TaskBatch, greedy_predictions, register_task, scored_accuracy
from attnzoo.evals.base import as_generator
from attnzoo.interrupts import Interrupted
from attnzoo.results.comparison import BenchRecord
from attnzoo.stats import Summary
from attnzoo.training import CheckpointError, read_checkpoint
from attnzoo.training.optim import learning_rate
from attnzoo.training.trainer import load_corpus
from attnzoo.variants import Variant, count_parameters, matched_configs

VARIANTS = ["mha+rope", "diff+rope"]
CPU = torch.device("cpu")
PNG = b"\x89PNG\r\n\x1a\n"


def _parse(*flags):
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(list(flags))


def _compare(out, text, **overrides):
    """The micro compare of VARIANTS, with ``overrides`` (resolve_spec's), its terminal output captured."""
    spec = resolve_spec("micro", **{"variants": VARIANTS, "corpus": str(text), **overrides})
    captured = io.StringIO()
    with contextlib.redirect_stdout(captured):
        result = run_compare(spec, out, progress=False)
    return result, captured.getvalue()


@pytest.fixture(scope="module")
def micro(tmp_path_factory):
    """One micro compare through the command-line pair: 2 variants × 2 seeds, every task, on a tiny corpus."""
    root = tmp_path_factory.mktemp("compare")
    text = write_text_corpus(root / "text.txt")
    out = root / "out"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("ATTNZOO_CACHE_DIR", str(root / "cache"))
        flags = ["--preset", "micro", "--out", str(out), "--variants", ",".join(VARIANTS), "--data", str(text)]
        captured = io.StringIO()
        with contextlib.redirect_stdout(captured):
            assert run(_parse(*flags, "--no-progress")) == 0
    return {"out": out, "text": text, "cache": root / "cache", "stdout": captured.getvalue()}


@pytest.fixture
def copy_of(micro, tmp_path, monkeypatch):
    """A private copy of the micro compare's output to resume or reuse, with the same corpus cache."""
    monkeypatch.setenv("ATTNZOO_CACHE_DIR", str(micro["cache"]))
    out = tmp_path / "out"
    shutil.copytree(micro["out"], out)
    return out


def _results(out):
    return CompareResults.load(out / "results.json")


def _val_losses(results):
    return {label: [record.val.loss for record in v.runs] for label, v in results.variants.items()}


def _mtimes(out):
    """Modification times of everything a finished run or task leaves, keyed by path."""
    watched = [*out.glob("runs/*/*/metrics.jsonl"), *out.glob("runs/*/*/compare_run.json")]
    watched += [*out.glob("runs/*/*/checkpoints/*/model.safetensors"), *out.glob("tasks/*/*/*/result.json")]
    return {str(p.relative_to(out)): p.stat().st_mtime_ns for p in [*watched, out / "bench.json"]}


# ------------------------------------------------------------------------------------------ the noise rule


def test_summary_is_mean_and_sample_std_over_seeds():
    s = Summary.of([1.0, 2.0, 4.0])
    assert (s.n, s.mean, s.min, s.max) == (3, 7 / 3, 1.0, 4.0)
    assert s.std == pytest.approx(math.sqrt(((1 - 7 / 3) ** 2 + (2 - 7 / 3) ** 2 + (4 - 7 / 3) ** 2) / 2))
    assert s.format(2) == "2.33 ± 1.53"
    one = Summary.of([0.5])
    assert one.std is None and one.format(2) == "0.50 (1 seed)"
    with pytest.raises(ValueError, match="at least one value"):
        Summary.of([])


# --------------------------------------------------------------------------------------- specs and presets


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            {"preset_or_spec": "huge"},
            r"preset 'huge' is unknown; choose one of "
            r"\['micro', 'quick', 'claims-one-size', 'gpu', 'gpu-lm', 'standard', 'full', 'claims-lr', "
            r"'claims-stability', 'claims-static', 'claims-extrapolation', 'claims-unmatched', 'claims-ablations', "
            r"'claims-ablations-large', 'gpu-ablations'\]",
        ),
        ({"variants": ["mha+bogus"]}, "variant 'mha\\+bogus': 'bogus' is not a known positional scheme"),
        ({"variants": ["diff+alibi+kvx"]}, "bad kv-head count 'x'"),
        ({"variants": ["mha+rope", "mha"]}, r"name \['mha\+rope'\] more than once"),
        ({"variants": []}, "must name at least one variant"),
        ({"seeds": []}, r"seeds=\(\) is invalid"),
        ({"seeds": [0, 0]}, "must be distinct"),
        ({"steps": 0}, "steps=0 is invalid"),
        ({"tasks": ["nope"]}, r"task='nope' is invalid: choose one of \['composition', 'denoising', 'graph', 'mqar'"),
    ],
)
def test_bad_overrides_are_refused_by_name(overrides, message):
    with pytest.raises(ValueError, match=message):
        resolve_spec(**{"preset_or_spec": "micro", **overrides})


def test_bad_specs_are_refused_by_name():
    micro = PRESETS["micro"]
    for build, message in [
        (lambda: TaskSpec("nope"), "task='nope' is invalid: choose one of"),
        (lambda: TaskSpec("mqar", TaskBudget(options={"seq_len": 63})), "seq_len=63 is invalid: must be even"),
        (
            lambda: TaskSpec("mqar", TaskBudget(options={"bogus": 1})),
            r"task 'mqar': bad options .*: unknown option\(s\) \['bogus'\]; allowed: \[.*'seq_len'",
        ),
        (
            lambda: TaskSpec("random_walk", TaskBudget(stop_at=0.9)),
            "random_walk is judged by excess_loss, which cannot stop",
        ),
        (lambda: TaskSpec("mqar", TaskBudget(sweep_lengths=(64,))), "mqar has no length × depth sweep"),
        (lambda: TaskBudget(model={"dim": 30, "n_heads": 4}), "n_heads=4 is invalid: must divide dim=30"),
        (lambda: TaskBudget(model={"vocab_size": 9}), r"must not set \['vocab_size'\]"),
        (lambda: replace(micro, model={"attention": "diff"}), r"must not set \['attention'\]"),
        (lambda: replace(micro, model={"width": 3}), r"unknown ModelConfig field\(s\) \['width'\]"),
        (lambda: EvalSpec(extrapolation_multiples=(2, 4)), "must be integers >= 1 that include 1"),
        (lambda: EvalSpec(bench_cases=(("decode", 1),)), "must be \\(mode, multiple\\) pairs"),
        (lambda: EvalSpec(val_windows=0), "val_windows=0 is invalid: must be None"),
        (lambda: EvalSpec(val_blocks=0), "val_blocks=0 is invalid"),
    ]:
        with pytest.raises(ValueError, match=message):
            build()
    with pytest.raises(ValueError, match="--seeds=0 is invalid"):
        run(_parse("--seeds", "0"))


def test_a_corpus_too_short_for_the_extrapolation_is_refused_before_any_training(tmp_path):
    text = write_text_corpus(tmp_path / "text.txt", n_words=1200)  # ~5,500 bytes: ~550 validation tokens
    long_evals = replace(PRESETS["micro"].evals, extrapolation_multiples=(1, 64))
    with pytest.raises(ValueError, match=r"has \d+ tokens; length extrapolation needs 4,097 \(2 blocks of 2048\)"):
        spec = resolve_spec(replace(PRESETS["micro"], evals=long_evals), corpus=str(text))
        run_compare(spec, tmp_path / "out", progress=False)
    assert not (tmp_path / "out" / "runs").exists()


@pytest.mark.parametrize("name", list(PRESETS))
def test_every_preset_matches_its_variants_and_never_ranks_on_one_seed(name):
    spec = PRESETS[name]
    assert len(spec.seeds) >= 2
    baseline = spec.baseline_config(vocab_size=256)
    target = count_parameters(baseline)
    variants = spec.variants
    configs = matched_configs(variants, baseline)
    for variant in variants:
        if not variant.matched:  # +unmatched: the baseline's MLP, the mechanism's parameters on top
            assert configs[variant.label].mlp_hidden_dim == baseline.mlp_hidden_dim
        elif variant.uptrain is None:
            assert abs(count_parameters(configs[variant.label]) - target) <= 0.02 * target
        else:  # its source's model with fewer kv heads, as GQA uptraining converts it: not re-matched
            expected = dataclasses.replace(configs[variant.source.label], n_kv_heads=variant.n_kv_heads)
            assert configs[variant.label] == expected
    for task in spec.tasks:  # each task builds the model of every variant it trains (the graph model refuses rope)
        variants = spec.task_variants(task)
        configs = task_configs(task, variants)
        assert list(configs) == [variant.label for variant in variants]
        with torch.device("meta"):
            for config in configs.values():
                task.task.new_model(config, task.config())


def test_overrides_replace_only_what_they_name():
    spec = resolve_spec("quick", variants=["mha+rope", "mha+rope+kv1"], seeds=range(3), steps=7, tasks=["mqar"])
    assert spec.variant_labels == ["mha+rope", "mha+rope+kv1"] and spec.seeds == (0, 1, 2)
    assert spec.train.steps == 7 and spec.train.seq_len == PRESETS["quick"].train.seq_len
    assert [t.name for t in spec.tasks] == ["mqar"]
    assert resolve_spec("quick", tasks=[]).tasks == ()
    assert resolve_spec("quick") is PRESETS["quick"]


def test_fewer_steps_keep_the_schedules_shares_so_the_loss_gate_still_has_its_points():
    """gpu-lm at --steps 300 once kept warmup 200 and evaluated only at the end: no validation slope to read."""
    preset = PRESETS["gpu-lm"].train
    train = resolve_spec("gpu-lm", steps=300, device="cpu").train
    assert (train.steps, train.warmup_steps) == (300, 30)
    assert train.steps // train.eval_interval == preset.steps // preset.eval_interval == 4
    assert abs(train.steps / train.checkpoint_interval - preset.steps / preset.checkpoint_interval) < 1
    assert train.seq_len == preset.seq_len and train.lr == preset.lr and train.device == "cpu"
    longer = resolve_spec("quick", steps=2500).train
    assert (longer.warmup_steps, longer.eval_interval) == (250, 10 * PRESETS["quick"].train.eval_interval)
    with pytest.raises(ValueError, match="steps"):
        PRESETS["quick"].train.with_steps(0)


# ------------------------------------------------------------------------------------------------ end to end


def test_micro_compare_writes_results_report_and_plots(micro):
    out = micro["out"]
    results = _results(out)
    stored = json.loads((out / "results.json").read_text())
    assert stored["schema_version"] == SCHEMA_VERSION
    for key in ("spec", "seeds", "budget", "machine", "corpus", "variants", "bench", "tasks"):
        assert key in stored
    assert results.baseline == "mha+rope" and results.seeds == [0, 1]
    budget = results.budget
    assert budget.runs == 4 and budget.tokens_per_run == 6 * 8 * 32 and budget.train_seconds_total > 0
    target = results.variants["mha+rope"].parameters
    for variant in results.variants.values():
        assert abs(variant.parameters - target) <= 0.02 * target
        assert [record.seed for record in variant.runs] == [0, 1]
        losses = [record.val.loss for record in variant.runs]
        assert variant.summary()["val_loss"].mean == pytest.approx(sum(losses) / 2)
        for record in variant.runs:
            run_dir = out / record.run_dir
            assert read_checkpoint(run_dir).train_config.seed == record.seed
            # The compare's own evaluation scores the whole validation split, in blocks the verdicts resample.
            windows = (results.corpus.val_tokens - 1) // 32
            assert record.val.tokens == windows * 32 and len(record.val.block_losses) == min(64, windows)
            assert min(record.val.block_losses) <= record.val.loss <= max(record.val.block_losses)
            assert [p.multiple for p in record.extrapolation] == [1, 2, 4]
            assert record.probes["top1_attention_logit"] == max(record.probes[f"layer{i}/top_logit"] for i in (0, 1))
            assert 0 < record.probes["spikiness_long"] <= 1
            assert all(math.isfinite(p.score.loss) for p in record.extrapolation)
    versus = results.versus_baseline("diff+rope", "val_loss")  # paired by seed and validation block
    assert versus.seeds == 2 and versus.blocks == len(results.variants["diff+rope"].runs[0].val.block_losses)
    assert results.variants["diff+rope"].map_note.startswith("the differential map")
    assert {m.variant for m in results.bench.measurements} == set(VARIANTS)
    tasks = results.tasks
    assert set(tasks) == {"passkey", "needles", "mqar", "random_walk", "composition", "denoising"}
    assert all(len(runs) == 2 for task in tasks.values() for runs in task.runs.values())
    needles = tasks["needles"].runs["diff+rope"][0]
    assert {key.split("/")[1] for key in needles.probe} == {"answer", "distractors", "sink", "question", "noise"}
    assert needles.sweep.lengths == [48, 96] and len(needles.sweep.accuracy) == 2
    assert tasks["mqar"].runs["mha+rope"][0].stop_at == 0.99

    plots = sorted(p.name for p in (out / "plots").iterdir())
    expected = ["attention_maps", "extrapolation", "loss_curves", "throughput_memory"]
    expected += [f"attention_heads_{label}" for label in VARIANTS]
    assert plots == sorted(f"{name}.png" for name in [*expected, *(f"task_{t}" for t in tasks)])
    assert all((out / "plots" / name).read_bytes().startswith(PNG) for name in plots)

    markdown = (out / "report.md").read_text()
    # Two seeds judge no claim: the side-by-side table leads, then where verdicts come from, then the claims.
    assert markdown.startswith("# attnzoo compare: micro\n\n## Side by side")
    assert "the statistic the verdicts use" in markdown and "`attnzoo compare --preset claims`" in markdown
    assert markdown.index("## Side by side") < markdown.index("## The papers' claims")
    assert json.loads((out / "verdicts.json").read_text())["preset"] == "micro"
    assert "| variant | params | val loss (nats/token) | val bits/byte | Δ val loss vs baseline |" in markdown
    for label in VARIANTS:
        row = next(line for line in markdown.splitlines() if line.startswith(f"| {label} | "))
        assert f"{results.variants[label].summary()['val_loss'].mean:.4f} ± " in row
    assert "| attention to answer | attention noise |" in markdown  # the needles task's declared columns
    linked = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", markdown)
    assert sorted(Path(p).name for p in linked) == plots and all((out / p).is_file() for p in linked)

    page = (out / "report.html").read_text()
    assert page.startswith("<!DOCTYPE html>") and page.count("<table>") >= 4
    images = re.findall(r'<img src="data:image/png;base64,([A-Za-z0-9+/=]+)"', page)
    assert len(images) == len(plots) and all(base64.b64decode(data).startswith(PNG) for data in images)
    assert 'src="plots/' not in page  # nothing outside the file

    stdout = micro["stdout"]
    assert stdout.count("Δ loss vs baseline") == 4  # the table after each of the 4 runs, as they finish
    # The answer closes the terminal output: the side-by-side table, the claims counted in one line (each claim and
    # its reason is the report's), what the stored claims ladder decided (this run decides no primary), and where
    # the report is.
    assert not re.search(r"diff\.lm_loss\s+not measurable", stdout)
    lines = stdout.rstrip("\n").splitlines()
    at = max(i for i, line in enumerate(lines) if line.startswith("claims: "))
    table_end, claims, report = lines[at - 3], lines[at], lines[-1]
    assert lines[at + 2].startswith("This micro run decides none of the papers' primary claims, by design")
    assert table_end.startswith(VARIANTS[-1]) and report.startswith(f"report: {out / 'report.md'}")
    found = counts(judge_all(CompareResults.load(out / "results.json")))
    tally = ", ".join(f"{n} {outcome}" for outcome, n in found.items() if n)
    assert claims == f"claims: {tally} — every claim with its reason in {out / 'report.md'}"
    assert re.search(r"estimated time: about \d+(m\d\ds|s) for the training left", stdout)
    assert re.search(r"── \[2/4\] diff\+rope · seed 0 · \d+(m\d\ds|s) elapsed · about \d+(m\d\ds|s) left ──", stdout)
    assert re.search(r"diff\+rope\s+2\s+\d\.\d{4} ± \d\.\d{4}", stdout)  # mean ± std once both seeds are in


def test_each_run_records_the_learning_rate_its_last_step_applied(micro):
    """Gate (a) reads whether the schedule reached its floor from the run's own log, not from the plan."""
    out = micro["out"]
    for variant in _results(out).variants.values():
        for record in variant.runs:
            metrics = [json.loads(line) for line in (out / record.run_dir / "metrics.jsonl").read_text().splitlines()]
            logged = [m["lr"] for m in metrics if "lr" in m]
            config = read_checkpoint(out / record.run_dir).train_config
            assert record.final_lr == logged[-1] == learning_rate(config.steps - 1, config)


def test_without_a_train_bench_the_estimate_comes_from_steps_timed_here(micro, copy_of, monkeypatch):
    """A ladder benches nothing: each variant with a run left is timed for a few steps, not estimated at 0 s."""
    spec = resolve_spec("micro", variants=VARIANTS, corpus=str(micro["text"]), tasks=[])
    comparison = runner.Comparison(spec, copy_of, progress=False)
    corpus = load_corpus(spec.train.data, comparison.env)
    configs, no_bench = comparison.lm.configs(corpus), BenchRecord({}, "", [])
    assert comparison.lm_estimates(no_bench, configs, corpus) == {label: 0.0 for label in VARIANTS}  # all finished
    shutil.rmtree(copy_of / "runs" / "diff+rope" / "seed1")
    timed = []
    monkeypatch.setattr(runner, "seconds_per_step", lambda config, *_: timed.append(config) or 0.5)
    estimates = comparison.lm_estimates(no_bench, configs, corpus)
    assert estimates == {"mha+rope": 0.0, "diff+rope": 0.5 * spec.train.steps} and timed == [configs["diff+rope"]]


def test_the_schedule_scales_what_is_left_by_how_the_estimates_held():
    schedule = Schedule({"a": 10.0, "b": 20.0, "c": 30.0})
    assert schedule.remaining() == 60.0
    schedule.finish("a", None)  # reused: no work, so it says nothing about the estimates
    assert schedule.remaining() == 50.0
    schedule.finish("b", 40.0)  # twice as slow as estimated
    assert schedule.remaining() == 60.0
    schedule.finish("c", 30.0)
    assert schedule.remaining() == 0.0


def test_the_schedule_follows_the_recent_jobs_not_the_average_since_the_start():
    """The estimate swung 40 → 148 → 78 → 36 min as the machine's load came and went."""
    schedule = Schedule({job: 10.0 for job in "abcde"})
    schedule.finish("a", 40.0)  # a busy spell: 4× the estimate
    for job in "bc":
        schedule.finish(job, 10.0)  # quiet again: as estimated
    assert schedule.factor == pytest.approx(0.25 * 4 + 0.75 * 1)  # the average since the start says 2.0
    assert schedule.remaining() == pytest.approx(1.75 * 20.0)


def test_a_second_invocation_reuses_every_finished_run(micro, copy_of):
    before, results_before = _mtimes(copy_of), _results(copy_of)
    result, stdout = _compare(copy_of, micro["text"])
    assert result.interrupted_by is None
    assert _mtimes(copy_of) == before  # nothing retrained, re-evaluated or re-measured
    assert "reusing 4 of 4 runs finished earlier" in stdout and "attnzoo 0.1.0 →" not in stdout  # no trainer
    assert stdout.count("reusing") == 2 and "── [" not in stdout  # the runs and the bench, a line each
    assert _val_losses(_results(copy_of)) == _val_losses(results_before)


def _compare_again(out, spec):
    """The micro compare's runs compared under another ``spec``: finished runs are reused, the rest trained."""
    (out / "results.json").unlink()  # the report of the first spec, which the new one may not overwrite
    with contextlib.redirect_stdout(io.StringIO()):
        assert run_compare(spec, out, progress=False).interrupted_by is None
    return _results(out)


def test_the_tasks_train_their_own_seeds(micro, copy_of):
    """A task run costs seconds, so a spec may give the tasks more seeds than its language models."""
    spec = resolve_spec("micro", variants=VARIANTS, corpus=str(micro["text"]), tasks=["mqar"])
    results = _compare_again(copy_of, replace(spec, task_seeds=(0, 1, 2)))
    assert results.seeds == [0, 1] and [r.seed for r in results.tasks["mqar"].runs["diff+rope"]] == [0, 1, 2]
    with pytest.raises(ValueError, match=r"task_seeds=\(1, 1\) is invalid: must be one or more distinct"):
        replace(spec, task_seeds=(1, 1))
    assert resolve_spec(replace(spec, task_seeds=(0, 1, 2)), seeds=[0]).task_seed_list == (0,)


def test_a_variant_with_more_compute_trains_the_same_model_longer(micro, copy_of):
    """``+x2``: twice the steps of the same model, which the bench measures once, under the model's label."""
    spec = resolve_spec("micro", variants=[*VARIANTS, "mha+rope+x2"], corpus=str(micro["text"]), tasks=[])
    results = _compare_again(copy_of, spec)
    longer, base = results.variants["mha+rope+x2"], results.variants["mha+rope"]
    assert [run.steps for run in longer.runs] == [12, 12] and longer.runs[0].tokens == 2 * base.runs[0].tokens
    assert longer.config == base.config and {m.variant for m in results.bench.measurements} == set(VARIANTS)


def test_a_variant_at_its_own_learning_rate_or_unmatched_trains_as_its_label_says(micro, copy_of):
    """``+lr2``: the same model at twice the peak rate, its schedule's floor twice as high too, as its log records;
    ``+unmatched``: the mechanism's parameters on top of the baseline's MLP width, not paid for by a narrower one."""
    labels = ["diff+rope+lr2", "selective+rope+unmatched"]
    spec = resolve_spec("micro", variants=[*VARIANTS, *labels], corpus=str(micro["text"]), tasks=[])
    results = _compare_again(copy_of, spec)
    fast, base = results.variants["diff+rope+lr2"], results.variants["diff+rope"]
    assert fast.config == base.config
    for record in fast.runs:
        trained = read_checkpoint(copy_of / record.run_dir).train_config
        assert trained.lr == 2 * spec.train.lr and record.final_lr == pytest.approx(2 * results.budget.min_lr)
    unmatched, baseline = results.variants["selective+rope+unmatched"], results.variants["mha+rope"]
    assert unmatched.config["mlp_hidden_dim"] == baseline.config["mlp_hidden_dim"]
    assert unmatched.parameters > baseline.parameters


def test_a_variant_at_twice_the_length_trains_on_the_same_tokens_and_is_scored_on_the_same_ones(micro, copy_of):
    """``+len2``: sequences twice as long, half as many a step; every run is scored at multiples of the comparison's
    length on the same tokens, which alibi.short_matches_long reads at 2L (ALiBi at L against sinusoidal at 2L)."""
    labels = ["mha+alibi", "mha+sinusoidal+len2"]
    spec = resolve_spec("micro", variants=[*VARIANTS, *labels], corpus=str(micro["text"]), tasks=[])
    results = _compare_again(copy_of, spec)
    longer, short = results.variants["mha+sinusoidal+len2"], results.variants["mha+alibi"]
    trained = json.loads((copy_of / longer.runs[0].run_dir / "train_config.json").read_text())
    assert (trained["seq_len"], trained["batch_size"]) == (2 * spec.train.seq_len, spec.train.batch_size // 2)
    assert longer.config["max_seq_len"] == 2 * spec.train.seq_len and longer.runs[0].tokens == short.runs[0].tokens
    for record in (*longer.runs, *short.runs):
        assert [(p.multiple, p.block_len) for p in record.extrapolation] == [
            (m, m * spec.train.seq_len) for m in spec.evals.extrapolation_multiples
        ]
    measure = CLAIMS["alibi.short_matches_long"].measure
    for label in labels:
        runs = results.variants[label].runs
        at_2l = {r.seed: next(p.score.loss for p in r.extrapolation if p.multiple == 2) for r in runs}
        assert measure.read(results, label) == at_2l
    # The claim is read at the micro size, whose toy models its gate then turns away.
    sizes = judge(CLAIMS["alibi.short_matches_long"], results).sizes
    assert [size.outcome for size in sizes] == ["not measurable"] and not sizes[0].gate.passed
    with pytest.raises(ValueError, match=r"train.batch_size=7 is invalid: must be a multiple of 2: mha\+sinusoidal"):
        replace(spec, train=replace(spec.train, batch_size=7))


def test_an_uptrained_variant_starts_from_its_sources_pooled_weights(micro, copy_of):
    """``+kv1+up0.5``: the same seed's trained mha+rope, its kv heads mean-pooled, trained for half the steps."""
    spec = resolve_spec("micro", variants=[*VARIANTS, "mha+rope+kv1+up0.5"], corpus=str(micro["text"]), tasks=[])
    results = _compare_again(copy_of, spec)
    up, source = results.variants["mha+rope+kv1+up0.5"], results.variants["mha+rope"]
    assert up.config == {**source.config, "n_kv_heads": 1} and up.parameters < source.parameters
    assert [record.steps for record in up.runs] == [3, 3]
    for record, origin in zip(up.runs, source.runs, strict=True):
        first_loss = record.train_curve[0][1]  # already near where the source ended, far below a fresh model's
        assert first_loss < origin.train_curve[0][1] - 0.1
        assert (copy_of / "runs" / "mha+rope+kv1+up0.5" / f"seed{record.seed}-converted" / "config.json").is_file()
    with pytest.raises(ValueError, match=r"uptrain mha\+rope\+kv1\+up0\.5 from mha\+rope, which must be compared"):
        resolve_spec("micro", variants=["diff+rope", "mha+rope+kv1+up0.5"])


def test_uptraining_rewarms_decays_to_the_floor_and_spends_its_fraction_of_the_steps(tmp_path):
    """Ainslie et al.'s recipe: pre-training's schedule again over α of its steps, from a fresh warmup to the floor."""
    rung = LADDERS["claims"].rungs[-1]
    pretraining = rung.train
    for fraction in (0.05, 0.1, 0.2):
        _, up, _ = runner.Comparison(rung, tmp_path, progress=False).lm.plan(
            Variant.parse(f"mha+rope+kv2+up{fraction:g}"), 3
        )
        rates = [learning_rate(step, up) for step in range(up.steps)]
        assert up.steps == round(fraction * pretraining.steps) and up.seed == 3
        assert up.warmup_steps / up.steps == pytest.approx(pretraining.warmup_steps / pretraining.steps, abs=0.01)
        assert rates[0] < pretraining.lr / 2 and max(rates) == pytest.approx(pretraining.lr)  # re-warmed
        assert rates[-1] == pytest.approx(pretraining.lr * pretraining.min_lr_ratio)  # pre-training's floor
        after_warmup = rates[up.warmup_steps - 1 :]
        assert all(a >= b for a, b in itertools.pairwise(after_warmup))
        assert up.eval_interval * 4 == up.steps  # the gates' 50, 75 and 100%


def test_an_interrupted_compare_resumes_where_it_stopped(micro, copy_of):
    # As if stopped during diff+rope seed 1 (after its step-3 checkpoint), before mha+rope seed 1 saved
    # anything, and before the mqar task of diff+rope seed 1 finished.
    shutil.rmtree(copy_of / "runs/diff+rope/seed1/checkpoints/step-0000006")
    (copy_of / "runs/diff+rope/seed1/compare_run.json").unlink()
    shutil.rmtree(copy_of / "runs/mha+rope/seed1/checkpoints")
    (copy_of / "tasks/mqar/diff+rope/seed1/result.json").unlink()
    for name in ("results.json", "report.md", "report.html"):
        (copy_of / name).unlink()
    untouched = {k: v for k, v in _mtimes(copy_of).items() if "seed0" in k}

    result, stdout = _compare(copy_of, micro["text"])
    assert result.interrupted_by is None
    assert f"resumed from {copy_of / 'runs/diff+rope/seed1/checkpoints/step-0000003'} at step 3" in stdout
    assert stdout.count("attnzoo 0.1.0 →") == 2  # only the two unfinished runs trained
    assert {k: v for k, v in _mtimes(copy_of).items() if "seed0" in k} == untouched
    metrics = (copy_of / "runs/diff+rope/seed1/metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in metrics if "train_loss" in line] == [1, 2, 3, 4, 5, 6]
    # Resumed and restarted runs make exactly the updates of the uninterrupted compare.
    resumed, original = _results(copy_of), _results(micro["out"])
    assert _val_losses(resumed) == _val_losses(original)
    mqar = [r.final for r in resumed.tasks["mqar"].runs["diff+rope"]]
    assert mqar == [r.final for r in original.tasks["mqar"].runs["diff+rope"]]
    assert (copy_of / "report.html").is_file()


def test_a_run_from_another_configuration_is_refused_not_overwritten(micro, copy_of):
    with pytest.raises(ValueError, match=r"holds the report of another comparison \(it differs in \['train'\]\)"):
        _compare(copy_of, micro["text"], steps=9)
    with pytest.raises(ValueError, match=r"it differs in \['variants'\]"):
        _compare(copy_of, micro["text"], variants=["mha+rope", "mha+rope+kv1"])
    (copy_of / "results.json").unlink()  # without the report, each run is still checked before it is touched
    with pytest.raises(CheckpointError, match="holds a run with another configuration than this compare's"):
        _compare(copy_of, micro["text"], steps=9)
    assert read_checkpoint(copy_of / "runs/mha+rope/seed0").step == 6


def _bench_result(case, tokens_per_s, repeats=1, load=0.5):
    return BenchResult(
        case.label,
        case.mode,
        case.seq_len,
        case.batch_size,
        tokens_per_s,
        tokens_per_s,
        tokens_per_s,
        5.0,
        extra={"rates": [tokens_per_s] * repeats, "load_average": load},
    )


def test_the_bench_measures_the_cases_in_interleaved_rounds_and_pools_them(tmp_path, monkeypatch):
    """A load change during one variant's cases once decided its ratio: each round now visits every case in turn,
    and a stop in the second round keeps the first round's measurements."""
    spec = resolve_spec("micro", variants=VARIANTS)
    spec = replace(spec, evals=replace(spec.evals, bench_rounds=2, bench_repeats=3))
    configs = matched_configs([Variant.parse(v) for v in VARIANTS], spec.baseline_config(64))
    visits = []

    def measured(case, *, repeats, **settings):
        if len(visits) == 2 and not stopped:
            stopped.append(case.label)
            raise Interrupted(signal.SIGTERM)
        visits.append((case.label, repeats))
        return _bench_result(case, 100.0 * len(visits), repeats, load=0.5 * len(visits))

    stopped = []
    monkeypatch.setattr(throughput, "measure", measured)
    with contextlib.redirect_stdout(io.StringIO()):
        assert throughput.run_bench(spec, configs, tmp_path, CPU, print) == (None, signal.SIGTERM)
        bench, stop = throughput.run_bench(spec, configs, tmp_path, CPU, print)
    assert stop is None and stopped == ["mha+rope"]
    # Round 1 over both variants, then round 2 over both, each round 2 of the 3 repeats (rounded up); the resumed
    # bench measured only what round 2 lacked.
    assert visits == [("mha+rope", 2), ("diff+rope", 2), ("mha+rope", 2), ("diff+rope", 2)]
    mha, diff = (m.timing for m in bench.measurements)
    assert mha.rates == (100.0, 100.0, 300.0, 300.0) and mha.tokens_per_s == 200.0 and mha.rounds == 2
    assert mha.round_load_averages == (0.5, 1.5) and mha.load_average == 1.5
    assert diff.tokens_per_s_min == 200.0 and diff.tokens_per_s_max == 400.0


@pytest.mark.parametrize(("dtype", "benched"), [("auto", "float32"), ("bfloat16", "bfloat16")])
def test_the_bench_times_each_case_in_the_dtype_the_runs_train_in(tmp_path, monkeypatch, dtype, benched):
    """On CUDA 'auto' trains in bf16 autocast (resolve_dtype), and a bench in fp32 there timed another regime."""
    spec = resolve_spec("micro", variants=VARIANTS)
    spec = replace(spec, train=replace(spec.train, dtype=dtype), evals=replace(spec.evals, bench_rounds=1))
    configs = matched_configs([Variant.parse(v) for v in VARIANTS], spec.baseline_config(64))
    dtypes = []

    def measured(case, *, repeats, **settings):
        dtypes.append(case.dtype)
        return _bench_result(case, 100.0, repeats, load=0.5)

    monkeypatch.setattr(throughput, "measure", measured)
    with contextlib.redirect_stdout(io.StringIO()):
        bench, _ = throughput.run_bench(spec, configs, tmp_path, CPU, print)
    assert dtypes == [benched] * len(VARIANTS) and bench.key["dtype"] == benched


def test_a_compare_stopped_during_the_bench_keeps_the_cases_measured(micro, copy_of, monkeypatch):
    """The bench inside compare started from scratch after every interruption."""
    (copy_of / "bench.json").unlink()
    measured = []

    def stopped_at_the_second_case(case, **settings):
        if measured:
            raise Interrupted(signal.SIGINT)
        measured.append(case.label)
        return _bench_result(case, 100.0)

    monkeypatch.setattr(throughput, "measure", stopped_at_the_second_case)
    result, stdout = _compare(copy_of, micro["text"])
    assert result.interrupted_by == signal.SIGINT and "compare interrupted; run the same command again" in stdout
    partial = json.loads((copy_of / "bench.partial.json").read_text())
    assert [m["variant"] for m in partial["measurements"]] == ["mha+rope"] and not (copy_of / "bench.json").exists()

    def the_rest(case, **settings):
        measured.append(case.label)
        return _bench_result(case, 50.0)

    monkeypatch.setattr(throughput, "measure", the_rest)
    result, stdout = _compare(copy_of, micro["text"])
    assert result.interrupted_by is None and measured == ["mha+rope", "diff+rope"]  # the first case not again
    assert "keeping the 1 of 2 cases measured before the interruption" in stdout
    bench = json.loads((copy_of / "bench.json").read_text())
    timings = [(m["variant"], m["timing"]["tokens_per_s"]) for m in bench["measurements"]]
    assert timings == [("mha+rope", 100.0), ("diff+rope", 50.0)]
    assert "resumed after an interruption" in bench["machine"] and not (copy_of / "bench.partial.json").exists()


def test_sigterm_during_the_task_phase_stops_the_compare_with_a_message(micro, copy_of, monkeypatch):
    """It ended the process with status -15 and no word."""
    shutil.rmtree(copy_of / "tasks")
    (copy_of / "results.json").unlink()

    def terminated(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # the signal's handler raises before this ends
        raise AssertionError("SIGTERM did not stop the compare")

    def unhandled(signum, frame):  # instead of ending pytest, as SIGTERM's default action would
        raise AssertionError("the compare left SIGTERM to its default action")

    monkeypatch.setattr(runner, "train_task", terminated)
    previous = signal.signal(signal.SIGTERM, unhandled)
    try:
        result, stdout = _compare(copy_of, micro["text"])
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert result.interrupted_by == signal.SIGTERM and "compare interrupted; run the same command again" in stdout
    assert not (copy_of / "results.json").exists()


def test_a_comparison_other_than_the_presets_gets_its_own_directory():
    from attnzoo.cli.compare import default_out

    def out(*flags):
        return default_out(_parse("--preset", "quick", *flags))

    assert out() == Path("runs/compare-quick")
    assert default_out(_parse("--preset", "claims")) == Path("runs/compare-claims")
    other = out("--variants", "mha+rope", "diff+alibi", "--tasks", "mqar")
    assert other.name.startswith("compare-quick-") and other == out(
        "--variants", "mha+rope", "diff+alibi", "--tasks", "mqar"
    )
    assert other != out("--variants", "mha+rope", "diff+alibi")


@pytest.mark.slow
def test_sigint_stops_a_compare_that_the_same_command_then_finishes(tmp_path):
    text = write_text_corpus(tmp_path / "text.txt")
    out = tmp_path / "out"
    flags = ["--preset", "micro", "--out", str(out), "--variants", "mha+rope", "--data", str(text)]
    flags += ["--steps", "400", "--seeds", "1", "--tasks", "--no-progress"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "ATTNZOO_CACHE_DIR": str(tmp_path / "cache")}
    process = subprocess.Popen(
        [sys.executable, "-m", "attnzoo", "compare", *flags],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    metrics = out / "runs/mha+rope/seed0/metrics.jsonl"
    deadline = time.monotonic() + 120
    while not metrics.exists() and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    process.send_signal(signal.SIGINT)
    output, _ = process.communicate(timeout=120)
    assert process.returncode == 128 + signal.SIGINT, output
    assert "compare interrupted; run the same command again" in output and "Traceback" not in output
    stopped_at = read_checkpoint(out / "runs/mha+rope/seed0").step
    assert 0 < stopped_at < 400 and not (out / "results.json").exists()

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("ATTNZOO_CACHE_DIR", str(tmp_path / "cache"))
        captured = io.StringIO()
        with contextlib.redirect_stdout(captured):
            assert run(_parse(*flags)) == 0
    assert f"at step {stopped_at}" in captured.getvalue()
    results = _results(out)
    assert [record.steps for record in results.variants["mha+rope"].runs] == [400]
    assert (out / "report.md").read_text().startswith("# attnzoo compare: micro\n\n## Side by side")


# ----------------------------------------------------------------------------------- tasks and results as records


@dataclass(frozen=True)
class EchoConfig:
    vocab_size: int = 16
    seq_len: int = 8


def echo_batch(cfg, batch_size, seed):
    """Predict the token just read: the smallest task there is."""
    inputs = torch.randint(0, cfg.vocab_size, (batch_size, cfg.seq_len), generator=as_generator(seed))
    return TaskBatch(inputs, inputs.clone())


def evaluate_echo(model, cfg, n_samples, seed, batch_size=32):
    batch = echo_batch(cfg, n_samples, seed)
    return {"accuracy": scored_accuracy(greedy_predictions(model, batch.inputs, batch_size), batch.targets)}


def echo_confidence(model, cfg, n_samples):
    batch = echo_batch(cfg, n_samples, 1)
    with torch.no_grad():
        return {"confidence": model(batch.inputs).softmax(-1).amax(-1).mean().item()}


@pytest.fixture
def echo_task():
    """A task registered by a test, as a plugin would: one record, and nothing in compare/ or report knows it."""
    task = register_task(
        Task(
            name="echo",
            config=EchoConfig,
            make_batch=echo_batch,
            evaluate=evaluate_echo,
            vocab_size=lambda cfg: cfg.vocab_size,
            measures="copying the token just read",
            paper="this test",
            probe=echo_confidence,
            probe_columns={"confidence": "mean top probability"},
            budgets={
                "micro": TaskBudget(
                    model={"dim": 16, "n_layers": 1, "n_heads": 2},
                    steps=2,
                    batch_size=4,
                    warmup_steps=1,
                    eval_samples=8,
                )
            },
        )
    )
    yield task
    del TASKS[task.name]


def test_a_registered_task_is_trained_and_reported_with_no_edit_to_compare(micro, copy_of, echo_task):
    (copy_of / "results.json").unlink()  # its report compares the tasks before this one; the runs are reused
    result, stdout = _compare(copy_of, micro["text"])  # the micro preset runs every task with a micro budget
    assert list(result.results.tasks) == [*_results(micro["out"]).tasks, "echo"]
    echo = result.results.tasks["echo"]
    assert (echo.metric, echo.measures, echo.budget.steps) == ("accuracy", "copying the token just read", 2)
    assert [run.steps for run in echo.runs["diff+rope"]] == [2, 2]
    assert all(0 < run.probe["confidence"] <= 1 for runs in echo.runs.values() for run in runs)
    markdown = (copy_of / "report.md").read_text()
    assert "## Task: echo" in markdown and "copying the token just read (from this test)" in markdown
    echo_section = markdown.split("## Task: echo")[1]
    header = next(line for line in echo_section.splitlines() if line.startswith("| variant | seeds | accuracy"))
    assert header.endswith("| mean top probability |")
    assert (copy_of / "plots" / "task_echo.png").read_bytes().startswith(PNG)
    assert "echo mha+rope seed 1: accuracy" in stdout


def test_a_task_budget_is_taken_at_the_nearest_larger_scale():
    passkey = TASKS["passkey"]
    assert passkey.budget("quick") is passkey.budgets["claims"]  # passkey has no quick budget
    assert TASKS["random_walk"].budget("full") is TASKS["random_walk"].budgets["standard"]  # none larger: the largest
    assert [t.name for t in resolve_spec("quick", tasks=["passkey"]).tasks] == ["passkey"]
    with pytest.raises(ValueError, match="scale='huge' is invalid"):
        passkey.budget("huge")


FIXTURE = Path(__file__).parent / "fixtures" / "compare_micro"


def test_the_report_redraws_from_a_stored_results_file_without_training(tmp_path):
    """``tests/fixtures/compare_micro`` is a micro compare's results.json and first-seed maps (regenerate it
    with ``python tests/fixtures/make_compare_fixture.py`` when the schema changes)."""
    out = tmp_path / "out"
    shutil.copytree(FIXTURE, out)
    results = CompareResults.load(out / "results.json")
    paths = write_report(results, out)
    markdown = paths["markdown"].read_text()
    for label, variant in results.variants.items():
        row = next(line for line in markdown.splitlines() if line.startswith(f"| {label} | {variant.parameters:,} |"))
        assert f"| {variant.summary()['val_loss'].format(4)} |" in row
    for name, task in results.tasks.items():
        assert f"## Task: {name}" in markdown and task.measures in markdown
    linked = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", markdown)
    assert "plots/attention_maps.png" in linked and all((out / p).read_bytes().startswith(PNG) for p in linked)
    assert (out / "report.html").read_text().count("<table>") >= 4


def test_a_report_re_rendered_without_its_runs_keeps_the_maps_they_drew_and_only_those(tmp_path):
    """A stored comparison keeps its report and plots, not its runs: re-rendered (--report-only), it dropped the
    attention maps while their images stayed in plots/."""
    out = tmp_path / "out"
    shutil.copytree(FIXTURE, out)
    results = CompareResults.load(out / "results.json")
    write_report(results, out)
    drawn = (out / "plots/attention_maps.png").read_bytes()
    shutil.rmtree(out / "runs")
    linked = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", write_report(results, out)["markdown"].read_text())
    assert "plots/attention_maps.png" in linked and (out / "plots/attention_maps.png").read_bytes() == drawn
    assert {f"plots/attention_heads_{label}.png" for label in results.variants} <= set(linked)
    (out / "plots/attention_heads_diff+rope.png").unlink()  # one variant's image gone: no maps claimed for any
    linked = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", write_report(results, out)["markdown"].read_text())
    assert not any("attention_" in path for path in linked) and "extrapolation" in " ".join(linked)


def test_a_compare_that_lists_no_bench_cases_reports_without_them(tmp_path):
    """``EvalSpec(bench_cases=())`` is valid (a GPU lease spends its minutes on training): the report says the
    throughput was not measured and draws no plot of it, where it divided by zero before (2026-11-26, on an H100)."""
    out = tmp_path / "out"
    shutil.copytree(FIXTURE, out)
    data = json.loads((out / "results.json").read_text())
    data["bench"]["measurements"] = []
    (out / "results.json").write_text(json.dumps(data))
    paths = write_report(CompareResults.load(out / "results.json"), out)
    markdown = paths["markdown"].read_text()
    assert "Not measured: this comparison's evaluations list no bench cases." in markdown
    assert "throughput_memory.png" not in markdown and not (out / "plots" / "throughput_memory.png").exists()
    assert json.loads(paths["verdicts"].read_text())["claims"]
    # The side-by-side table leaves the speed and memory columns out, where it showed two columns of N/A.
    assert "speed vs baseline" not in markdown and "memory vs baseline" not in markdown
    with_bench = write_report(CompareResults.load(FIXTURE / "results.json"), tmp_path / "with-bench")
    assert "train speed vs baseline (>1 faster), T=" in with_bench["markdown"].read_text()


@pytest.mark.parametrize("flag", [[], ["--claims"]])
def test_the_last_screen_counts_the_claims_in_one_line_and_lists_them_only_with_claims(tmp_path, capsys, flag):
    """The quick compare ended with 30 rows of claims, 22 "not run", below the table a user ran it for."""
    from attnzoo.cli import main

    out = tmp_path / "out"
    shutil.copytree(FIXTURE, out)
    assert main(["compare", "--out", str(out), "--report-only", *flag]) == 0
    printed = capsys.readouterr().out
    verdicts = judge_all(CompareResults.load(out / "results.json"))
    rows = [v for v in verdicts if re.search(rf"^{re.escape(v.claim.id)} +{v.outcome}  ", printed, re.M)]
    assert len(rows) == (len(verdicts) if flag else 0)
    lines = printed.rstrip("\n").splitlines()
    claims, report = next(line for line in lines if line.startswith("claims: ")), lines[-1]
    tally = ", ".join(f"{n} {outcome}" for outcome, n in counts(verdicts).items() if n)
    assert claims == f"claims: {tally} — every claim with its reason in {out / 'report.md'}"
    assert report.startswith(f"report: {out / 'report.md'}")


def _stored(data):
    first = next(iter(data["variants"]))
    return data["variants"][first]["runs"][0]


def _nan_loss(data):
    _stored(data)["val"]["loss"] = math.nan  # json.dumps writes NaN, which json.load reads back


def _negative_loss(data):
    _stored(data)["val"]["loss"] = -1.0


def _negative_final_lr(data):
    _stored(data)["final_lr"] = -1.0  # found by scripts/audit_inputs.py as the field was added


def _zero_seconds(data):
    _stored(data)["train_seconds"] = 0.0  # the tokens/s column divided by it


def _accuracy_above_one(data):
    task = next(t for t in data["tasks"].values() if any(r["sweep"] for runs in t["runs"].values() for r in runs))
    run = next(r for runs in task["runs"].values() for r in runs if r["sweep"])
    run["sweep"]["accuracy"][0][0] = 1.5


def _bad_variant_config(data):
    next(iter(data["variants"].values()))["config"]["dim"] = -1


def _negative_probe(data):
    _stored(data)["probes"]["layer0/entropy"] = -0.5


def _bench_repeats_as_text(data):
    data["bench"]["key"]["repeats"] = "x"


def _zeroth_order_ngram(data):
    data["corpus"]["ngram"] = {"order": 0, "smoothing": "none", "val_loss": 2.0, "train_tokens": 9, "val_tokens": 9}


@pytest.mark.parametrize(
    ("damage", "words"),
    [
        # Found by scripts/audit_inputs.py: a stored config, the probes, the bench's key and the n-gram level
        # were rendered whatever they held.
        (_bad_variant_config, r"variants.\S+.config is not a model configuration attnzoo builds: dim=-1 is invalid"),
        (_negative_probe, r"runs\[0\].probes.layer0/entropy = -0.5 is invalid: must be >= 0"),
        (_bench_repeats_as_text, r"bench.key.repeats = 'x' is invalid: must be an integer >= 1"),
        (_zeroth_order_ngram, r"corpus.ngram.order = 0 is invalid: must be >= 1"),
        (_nan_loss, r"results.json.variants.\S+.runs\[0\].val.loss = nan is invalid: must be a finite number"),
        (_negative_loss, r"results.json.variants.\S+.runs\[0\].val.loss = -1.0 is invalid: must be >= 0"),
        (_zero_seconds, r"runs\[0\].train_seconds = 0.0 is invalid: must be > 0"),
        (_negative_final_lr, r"runs\[0\].final_lr = -1.0 is invalid: must be >= 0"),
        (_accuracy_above_one, r"sweep.accuracy\[0\]\[0\] = 1.5 is invalid: must be in \[0, 1\]"),
    ],
)
def test_report_only_refuses_stored_numbers_that_cannot_be(tmp_path, capsys, damage, words):
    """NaN ended in AttributeError ('float' object has no attribute 'numerator'); a negative loss was drawn."""
    from attnzoo.cli import main

    out = tmp_path / "out"
    shutil.copytree(FIXTURE, out)
    data = json.loads((out / "results.json").read_text())
    damage(data)
    (out / "results.json").write_text(json.dumps(data))
    assert main(["compare", "--out", str(out), "--report-only"]) == 1
    err = capsys.readouterr().err
    assert re.search(words, err) and len(err.splitlines()) == 1, err
    assert not (out / "report.md").exists()


@pytest.mark.parametrize(
    ("make", "words"),
    [
        (lambda p: p.write_text(FIXTURE.joinpath("results.json").read_text()[:5000]), r"is not valid JSON \(.* line"),
        (lambda p: p.write_text(""), r"is empty, not a compare's results"),
        (lambda p: p.write_bytes(bytes(range(128, 256))), r"is not UTF-8 text \(byte 0x80 at offset 0\)"),
        (os.mkfifo, r"is a FIFO, not a results file"),
        (os.mkdir, r"is a directory, not a results file"),
    ],
    ids=["truncated", "empty", "binary", "fifo", "directory"],
)
def test_report_only_names_a_results_file_it_cannot_read(tmp_path, capsys, make, words):
    """A truncated, empty or binary file was refused naming no file; a FIFO or a directory 'does not exist'."""
    from attnzoo.cli import main

    make(tmp_path / "results.json")
    assert main(["compare", "--out", str(tmp_path), "--report-only"]) == 1
    err = capsys.readouterr().err
    assert re.search(re.escape(str(tmp_path / "results.json")) + " " + words, err) and len(err.splitlines()) == 1, err


def test_report_only_refuses_the_flags_it_would_ignore(tmp_path, capsys):
    """--steps, --seeds and --variants were silently ignored: the report looked like theirs and was not."""
    from attnzoo.cli import main

    out = tmp_path / "out"
    shutil.copytree(FIXTURE, out)
    argv = ["compare", "--out", str(out), "--report-only", "--steps", "5", "--seeds", "3", "--variants", "mha+rope"]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert "--variants, --seeds, --steps would change nothing there; leave them out" in err, err
    assert not (out / "report.md").exists()


class _Payload:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


@pytest.mark.parametrize("stored", ["pickle", "shape"])
def test_stored_maps_that_are_not_a_float_array_are_refused_naming_the_file(tmp_path, stored):
    """A pickled attention_maps.npy was refused with numpy's message, which does not name the file."""
    out = tmp_path / "out"
    shutil.copytree(FIXTURE, out)
    path = out / "runs/diff+rope/seed0/attention_maps.npy"
    if stored == "pickle":
        np.save(path, np.array([_Payload(tmp_path / "payload-ran")], dtype=object), allow_pickle=True)
        words = r"is not a stored array of attention maps \(Object arrays cannot be loaded"
    else:
        np.save(path, np.zeros((2, 3)))
        words = r"holds a float64 array of shape \(2, 3\), not attention maps"
    with pytest.raises(ValueError, match=re.escape(str(path)) + " " + words):
        write_report(CompareResults.load(out / "results.json"), out)
    assert not (tmp_path / "payload-ran").exists()


def test_results_of_another_schema_are_refused_naming_the_version_or_the_field(tmp_path):
    data = json.loads((FIXTURE / "results.json").read_text())
    path = tmp_path / "results.json"
    for version, change in ((1, lambda d: d.pop("schema_version")), (99, lambda d: d.update(schema_version=99))):
        old = json.loads(json.dumps(data))
        change(old)
        path.write_text(json.dumps(old))
        with pytest.raises(ValueError, match=f"has results schema version {version}; this attnzoo reads versions 2, 3"):
            CompareResults.load(path)
    data["budget"]["steps_run"] = data["budget"].pop("steps")
    path.write_text(json.dumps(data))
    with pytest.raises(
        ValueError, match=r"\.budget: missing field\(s\) \['steps'\], unknown field\(s\) \['steps_run'\]"
    ):
        CompareResults.load(path)


def test_report_only_on_a_file_without_its_ngram_level_counts_it_or_says_why_not(tmp_path, capsys):
    """A results file written before the corpus's trigram level was kept: its corpus (a temporary file then) is gone,
    so the report is drawn without the level, the competent-model gate says so, and the terminal says why."""
    from attnzoo.cli import main

    out = tmp_path / "out"
    shutil.copytree(FIXTURE, out)
    assert main(["compare", "--out", str(out), "--report-only"]) == 0
    assert "no n-gram level recorded, and none counted: corpus '/tmp/" in capsys.readouterr().err
    diff = next(row for row in json.loads((out / "verdicts.json").read_text())["claims"] if row["id"] == "diff.lm_loss")
    competent = next(part for part in diff["gate"]["parts"] if part["name"] == "(d) competent models")
    assert not competent["passed"] and "records no n-gram level" in competent["detail"]
