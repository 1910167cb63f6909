"""The report of a comparison: ``report.md``, a self-contained ``report.html`` and the plots.

It is a pure function of a :class:`~attnzoo.results.comparison.CompareResults` (what ``results.json`` loads
into) and the attention maps stored beside the runs, so ``write_report(CompareResults.load(path), out_dir)``
redraws it without training. It names no task and no mechanism: each task's columns and each mechanism's
map note come from their records.

The report is a list of blocks (:mod:`attnzoo.document`) rendered as markdown and HTML; the figures are
drawn by :mod:`attnzoo.compare.plots` and the verdicts section by :mod:`attnzoo.claims.report`. Beside the
report, ``verdicts.json`` holds the same verdicts as data. A run that can judge claims opens with them, each paper's
primary claim first; one that cannot (too few seeds, or none of the claims' experiments) opens with what it
measured side by side.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from attnzoo.claims.report import answer_section, claims_section
from attnzoo.claims.verdicts import MIN_SEEDS, Verdict, judge_all, verdicts_record
from attnzoo.compare.plots import (
    plot_attention_heads,
    plot_attention_maps,
    plot_extrapolation,
    plot_loss_curves,
    plot_task,
    plot_throughput_memory,
)
from attnzoo.compare.presets import LADDERS
from attnzoo.document import Bullets, Heading, Image, Paragraph, Report
from attnzoo.io import atomic_write_text
from attnzoo.results.comparison import ATTENTION_MAPS, BenchRecord, CompareResults, Provenance, TaskResult
from attnzoo.stats import CONFIDENCE, PairedDifference, Summary, paired_over_seeds
from attnzoo.tables import Table, memory_header, ratio, speed_header
from attnzoo.variants import Variant

PLOTS = "plots"
VERDICTS = "verdicts.json"


# ------------------------------------------------------------------------------------------------ the tables


def _fmt(summary: Summary | None, digits: int = 3) -> str:
    """Mean ± std over seeds, or N/A where the metric does not exist."""
    return summary.format(digits) if summary is not None else "N/A"


def _difference_text(diff: PairedDifference | None, digits: int) -> str:
    """The paired difference with its 95% interval: the same statistic the verdicts use."""
    return diff.format(digits) if diff is not None else "N/A"


def summary_table(results: CompareResults) -> Table:
    """One row per variant: mean ± std over seeds, the paired difference from the baseline, and the costs (a
    variant trained with more compute costs what its model does per token), left out where the comparison benched
    nothing (a ladder's rungs, a kit run with --no-bench) rather than shown as columns of N/A."""
    longest = max(results.evals.extrapolation_multiples)
    ratios = [r for r in results.bench.ratios(results.baseline) if r.measurement.mode == "train"]
    # Speed at the training length; memory at the longest training case, where attention's share shows.
    speed_at = results.budget.seq_len
    memory_at = max((r.measurement.seq_len for r in ratios), default=None)
    speed = {r.measurement.variant: r.speed for r in ratios if r.measurement.seq_len == speed_at}
    memory = {r.measurement.variant: r.memory for r in ratios if r.measurement.seq_len == memory_at}
    benched = bool(results.bench.measurements)
    rows = []
    for label, variant in results.variants.items():
        summary = variant.summary()
        versus = (
            "baseline" if label == results.baseline else _difference_text(results.versus_baseline(label, "val_loss"), 4)
        )
        row = [
            label,
            f"{variant.parameters:,}",
            _fmt(summary.get("val_loss"), 4),
            _fmt(summary.get("val_bits_per_byte"), 4),
            versus,
            _fmt(summary.get(f"loss_at_{longest}x"), 3),
        ]
        if benched:
            model = Variant.parse(label).model_label
            row += [ratio(speed.get(model)), ratio(memory.get(model))]
        rows.append(row)
    header = [
        "variant",
        "params",
        "val loss (nats/token)",
        "val bits/byte",
        "Δ val loss vs baseline",
        f"loss at {longest}× length (nats/token)",
    ]
    if benched:
        memory_column = f"train {memory_header('baseline')}" + (f", T={memory_at}" if memory_at else "")
        header += [f"train {speed_header('baseline')}, T={speed_at}", memory_column]
    return Table(header, rows)


PROBE_COLUMNS = {
    "top1_attention_logit": "largest |attention logit| (over layers)",
    "hidden_outlier_ratio": "largest ÷ median |hidden state| (over layers)",
    "spikiness_long": "spikiness of rows seeing ≥ T/2 keys (‖p‖₂/‖p‖₁)",
}


def _probe_table(results: CompareResults) -> Table:
    """The trained models' outliers and spikiness (attnzoo.evals.probes), mean ± std over seeds."""
    rows = []
    for label, variant in results.variants.items():
        cells = []
        for key in PROBE_COLUMNS:
            values = [run.probes[key] for run in variant.runs if key in run.probes]
            cells.append(Summary.of(values).format(3) if len(values) == len(variant.runs) else "N/A")
        rows.append([label, *cells])
    return Table(["variant", *PROBE_COLUMNS.values()], rows)


def _per_seed_table(results: CompareResults) -> Table:
    multiples = results.evals.extrapolation_multiples
    header = ["variant", "seed", "train time", "train tok/s", "final train loss (nats/token)", "val loss (nats/token)"]
    header += ["val bits/byte", *[f"loss {m}× (nats/token)" for m in multiples]]
    rows = []
    for label, variant in results.variants.items():
        for run in variant.runs:
            row = [label, str(run.seed), f"{run.train_seconds:.0f} s", f"{run.train_tokens_per_s:,.0f}"]
            row += [f"{run.final_train_loss:.4f}", f"{run.val.loss:.4f}", f"{run.val.bits_per_byte:.4f}"]
            row += [f"{p.score.loss:.3f}" if p.score else "N/A" for p in run.extrapolation]
            rows.append(row)
    return Table(header, rows)


def _extrapolation_table(results: CompareResults) -> tuple[Table, list[str]]:
    multiples, seq_len = results.evals.extrapolation_multiples, results.budget.seq_len
    rows, reasons = [], []
    for label, variant in results.variants.items():
        summary = variant.summary()
        rows.append([label, *[_fmt(summary.get(f"loss_at_{m}x"), 3) for m in multiples]])
        refused = [p for p in variant.runs[0].extrapolation if p.score is None]
        if refused:
            lengths = ", ".join(str(p.block_len) for p in refused)
            reasons.append(f"{label} at {lengths} tokens: N/A — {refused[0].unavailable}")
    header = ["variant: val loss (nats/token) at", *[f"{m}× ({m * seq_len} tokens)" for m in multiples]]
    return Table(header, rows), reasons


def _bench_order(bench: BenchRecord) -> str:
    """How the cases were ordered, read from the record (a run stored before rounds measured them back to back)."""
    rounds = max((m.timing.rounds for m in bench.measurements if m.timing is not None), default=1)
    if rounds == 1:
        return "the cases back to back"
    return f"the cases measured in turn in {rounds} rounds, so a change in the machine's load falls on every variant"


def _bench_table(results: CompareResults) -> Table:
    rows = []
    for r in results.bench.ratios(results.baseline):
        m = r.measurement
        where, t = [m.variant, m.mode, str(m.seq_len), str(m.batch_size)], m.timing
        if t is None:
            rows.append([*where, "N/A", "N/A", "N/A", "N/A", "N/A"])
            continue
        speed = f"{ratio(r.speed)} ({ratio(r.speed_low)}–{ratio(r.speed_high)})"
        rows.append(
            [
                *where,
                f"{t.tokens_per_s:,.0f} ({t.tokens_per_s_min:,.0f}–{t.tokens_per_s_max:,.0f})",
                speed + (" unreliable: busy machine" if r.busy else ""),
                f"{t.peak_mem_mb:,.1f}",
                ratio(r.memory),
                " / ".join(f"{load:.2f}" for load in t.round_load_averages)
                or ("–" if t.load_average is None else f"{t.load_average:.2f}"),
            ]
        )
    header = ["variant", "mode", "T", "batch", "tok/s median (min–max)", f"{speed_header('baseline')} (min–max)"]
    return Table([*header, "peak MB", memory_header("baseline"), "load average (each round)"], rows)


def _sweep_table(task: TaskResult) -> tuple[Table, list[str]]:
    """Accuracy by context length (mean over depths and seeds), and why any length is N/A."""
    lengths = sorted(task.budget.sweep_lengths)
    rows, reasons = [], []
    for label, runs in task.runs.items():
        by_length = [run.sweep.accuracy_by_length() for run in runs if run.sweep is not None]
        row = [label]
        for length in lengths:
            values = [accuracy[length] for accuracy in by_length]
            row.append("N/A" if None in values else Summary.of(values).format(3))  # type: ignore[arg-type]
        rows.append(row)
        unavailable = runs[0].sweep.unavailable if runs[0].sweep is not None else {}
        if unavailable:
            first = next(iter(unavailable.values()))
            reasons.append(f"{label} at {', '.join(unavailable)} tokens: N/A — {first}")
    return Table(["variant", *[f"{length} tokens" for length in lengths]], rows), reasons


def _task_table(task: TaskResult) -> Table:
    """A row per variant: the metric over seeds and against the task's baseline (its first variant), then whatever
    the task declares."""
    stop_at, swept = task.budget.stop_at, bool(task.budget.sweep_lengths)
    baseline = next(iter(task.runs))  # the task's own: an attention-only task compares with mha+none
    rows = []
    for label, runs in task.runs.items():
        summary = task.summary(label)
        row = [
            label,
            str(len(runs)),
            summary.format(4),
            "baseline" if label == baseline else _difference_text(_task_difference(task, label, baseline), 4),
            ", ".join(str(r.steps) for r in runs),
        ]
        if stop_at is not None:
            row.append(", ".join(str(r.steps_to_threshold or "not reached") for r in runs))
        if swept:
            row.append(", ".join(str((r.sweep.largest_length(0.9) if r.sweep else None) or "none") for r in runs))
        row += [task.probe_summary(label, key).format(3) for key in task.probe_columns]
        rows.append(row)
    direction = "higher" if task.higher_is_better else "lower"
    header = ["variant", "seeds", f"{task.metric} ({direction} is better)", f"Δ vs {baseline}", "steps run (per seed)"]
    if stop_at is not None:
        header.append(f"steps to {stop_at}")
    if swept:
        header.append("largest length ≥ 90%")
    header += list(task.probe_columns.values())
    return Table(header, rows)


def _task_difference(task: TaskResult, label: str, baseline: str) -> PairedDifference:
    """``label − baseline`` paired by seed on the task's metric."""
    ours = {run.seed: run.final[task.metric] for run in task.runs[label]}
    theirs = {run.seed: run.final[task.metric] for run in task.runs[baseline]}
    seeds = sorted(ours.keys() & theirs.keys())
    return paired_over_seeds([ours[s] for s in seeds], [theirs[s] for s in seeds])


# ----------------------------------------------------------------------------------------------- the report


def _provenance(results: CompareResults) -> str:
    """Each (commit, host, device, executor) the runs were made at, with how many runs."""

    def place(where: Provenance | None) -> str:
        if where is None:
            return "not recorded (written before runs recorded it)"
        commit = where.commit or "unknown (not a git checkout)"
        return f"commit {commit} on {where.host} ({where.device}, {where.executor})"

    found = Counter(place(run.provenance) for variant in results.variants.values() for run in variant.runs)
    return "; ".join(f"{place}: {n} run(s)" for place, n in found.items())


def build_report(results: CompareResults, plots: dict[str, str]) -> Report:
    budget, machine, corpus, evals = results.budget, results.machine, results.corpus, results.evals
    seeds, baseline = results.seeds, results.baseline
    report = Report(f"attnzoo compare: {results.preset}")
    verdicts = judge_all(results)
    summary = [
        Heading(2, "Side by side"),
        Paragraph(
            "Mean ± sample standard deviation over seeds. Losses are cross-entropies in nats per token (with the "
            "byte tokenizer, nats per byte); bits per byte divide by the exact UTF-8 bytes scored. The difference "
            f"from the baseline is paired by seed (and by validation block, where stored), with its {CONFIDENCE:.0%} "
            f"interval: the statistic the verdicts use.{_few_seeds(seeds)}"
        ),
        summary_table(results),
    ]
    claims = claims_section(results, verdicts)
    if _judges_claims(results, verdicts):
        report.add(*answer_section(verdicts), *claims, *summary)
    else:
        report.add(*summary, Paragraph(_verdicts_elsewhere(results)), *claims)
    report.add(
        Heading(2, "Setup"),
        Paragraph(
            f"{len(results.variants)} variants × {len(seeds)} seed(s) {seeds}, trained on the same data in the "
            f"same order under the same budget; **{baseline}** is the baseline. Parameters are matched to the "
            f"baseline within 2% by the MLP width, except an uptrained variant (+upF), which keeps its source's model "
            f"with fewer kv heads, as GQA uptraining does."
            + (
                " A +lenN variant trains on sequences N times as long, N times fewer a step (the same tokens); every "
                "variant is scored on the same tokens at the training length and its multiples, so a +lenN "
                "variant's loss at N× is in distribution."
                if any(Variant.parse(label).length != 1 for label in results.variants)
                else ""
            )
        ),
        Bullets(
            [
                f"corpus `{corpus.name}` ({corpus.tokenizer} tokenizer): "
                f"{corpus.train_tokens:,} train / {corpus.val_tokens:,} validation tokens",
                f"training: {budget.steps} steps × {budget.batch_size} sequences × {budget.seq_len} tokens = "
                f"{budget.tokens_per_run:,} tokens per run, {budget.runs} runs; AdamW lr {budget.lr:g}, "
                f"warmup {budget.warmup_steps}, cosine to {budget.min_lr:g}",
                f"seeds {seeds}: seed k fixes the initialisation and the data order of every variant",
                f"wall time: {budget.train_seconds_total:.0f} s of training steps over all runs; "
                f"{budget.wall_seconds_this_invocation:.0f} s for the invocation that wrote this report "
                "(finished runs are reused, so a resumed compare counts only its own work)",
                f"machine: {machine.description}, {_load(machine.load_average_end)} at the end (on a shared "
                "machine every figure that depends on time is slower and noisier)",
                f"attnzoo {results.attnzoo_version}, {results.created}",
                f"runs trained at: {_provenance(results)}",
            ]
        ),
        Heading(2, "Training curves"),
        Image(plots["loss_curves"], "Training and validation loss by step (mean over seeds, band: min–max)."),
    )
    table, reasons = _extrapolation_table(results)
    report.add(
        Heading(2, "Length extrapolation"),
        Paragraph(
            f"Trained at {budget.seq_len} tokens, evaluated on nonoverlapping blocks of each length over the "
            f"same {evals.extrapolation_blocks} × {max(evals.extrapolation_multiples) * budget.seq_len:,} "
            "validation tokens (train short, test long: ALiBi §4). Validation loss in nats per token."
        ),
        table,
    )
    if reasons:
        report.add(Bullets(reasons))
    report.add(
        Image(plots["extrapolation"], "Validation loss against evaluation length (mean ± std over seeds)."),
        Heading(2, "Throughput and memory"),
    )
    if "throughput_memory" in plots:
        report.add(
            Paragraph(
                f"Every case in a fresh process, {_bench_order(results.bench)}; medians over "
                f"{evals.bench_repeats} repeats, with the spread. Speed is tokens/s ÷ the baseline's (above 1 is "
                "faster); memory is peak ÷ the baseline's (above 1 is more). On the CPU, peak memory is the rise of "
                "the process's resident high-water mark, reset for the case, over its resident size before the first "
                "step (attnzoo.bench); a case whose ratio is N/A had no measurable rise. "
                f"Machine: {results.bench.machine}."
            ),
            _bench_table(results),
            Image(plots["throughput_memory"], "Training speed and peak memory relative to the baseline."),
        )
    else:
        report.add(Paragraph("Not measured: this comparison's evaluations list no bench cases."))
    report.add(
        Heading(2, "Attention maps"),
        Paragraph(
            f"Each layer's effective attention map of the seed-{seeds[0]} model, averaged over heads, on the first "
            f"{evals.map_tokens} validation tokens (rows: queries, columns: keys)."
        ),
        Bullets([f"{label}: {variant.map_note}" for label, variant in results.variants.items()]),
    )
    if "attention_maps" in plots:
        report.add(Image(plots["attention_maps"], "Attention maps by variant (rows) and layer (columns)."))
        report.add(
            Paragraph(
                "Per head, since per-head structure is what Diff and DCMHA change (rows: layers, columns: heads):"
            ),
            *[
                Image(plots[f"attention_heads_{label}"], f"{label}: every head of every layer.")
                for label in results.variants
            ],
        )
    else:
        report.add(Paragraph("The stored attention maps were not found beside the runs, so no figure is drawn."))
    for name, task in results.tasks.items():
        report.add(Heading(2, f"Task: {name}"), Paragraph(_task_text(task)), _task_table(task))
        if task.budget.sweep_lengths:
            table, reasons = _sweep_table(task)
            report.add(Paragraph("Accuracy by context length, mean over needle depths (± std over seeds):"), table)
            if reasons:
                report.add(Bullets(reasons))
        report.add(Image(plots[f"task_{name}"], f"{name}: {_task_caption(task)}"))
    report.add(
        Heading(2, "Outliers and spikiness of the trained models"),
        Paragraph(
            f"On {evals.probe_windows} validation windows of {budget.seq_len} tokens (attnzoo.evals.probes): the "
            "top-1 attention logit and the hidden-state outliers of the Diff Transformer paper, and the row "
            "spikiness of the selective-attention paper; every layer's values are in `results.json`."
        ),
        _probe_table(results),
        Heading(2, "Every run"),
        _per_seed_table(results),
        Paragraph(
            "Training tokens/s are measured during training on a possibly shared machine; the throughput table "
            "above is the controlled comparison. Everything here is in `results.json`."
        ),
    )
    return report


def _judges_claims(results: CompareResults, verdicts: list[Verdict]) -> bool:
    """Whether this run reaches any verdict beyond "not run" and too few seeds: then the verdicts lead."""
    return len(results.seeds) >= MIN_SEEDS and any(v.outcome != "not run" for v in verdicts)


def _verdicts_elsewhere(results: CompareResults) -> str:
    return (
        f"**Verdicts on the papers' claims** need at least {MIN_SEEDS} seeds and each claim's own experiment: "
        f"`attnzoo compare --preset claims` runs {LADDERS['claims'].description}. This run ({results.preset}, "
        f"{len(results.seeds)} seed(s)) lists them below only for completeness."
    )


def _few_seeds(seeds: list[int]) -> str:
    if len(seeds) >= 3:
        return ""
    return (
        f" With {len(seeds)} seed(s) the standard deviations are themselves rough: read the verdicts as indicative "
        "and confirm a difference with more seeds (`--seeds`, or the standard preset) before relying on it."
    )


def _load(values: list[float] | None) -> str:
    return f"load average {values[0]:.2f}" if values else "load average unknown"


def _task_caption(task: TaskResult) -> str:
    caption = f"`{task.metric}` on the evaluation set by training step, each seed"
    return caption + ("; accuracy by context length and by needle depth." if task.budget.sweep_lengths else ".")


def _task_text(task: TaskResult) -> str:
    budget = task.budget
    model = ", ".join(f"{k} {v}" for k, v in budget.model.items())
    options = ", ".join(f"{k}={v}" for k, v in budget.options.items()) or "the task's default options"
    stop = f", stopping early at {budget.stop_at}" if budget.stop_at is not None else ""
    direction = "higher" if task.higher_is_better else "lower"
    seconds = sum(run.seconds for runs in task.runs.values() for run in runs)
    return (
        f"**What it measures:** {task.measures} (from {task.paper}). Trained from scratch for every variant × "
        f"seed on fresh batches ({options}); model {model}, parameter matched; up to {budget.steps} steps × "
        f"{budget.batch_size} samples, lr {budget.lr:g}{stop}. Scored by `{task.metric}` ({direction} is better) "
        f"on one fixed set of {budget.eval_samples} samples{_levels(task)}. Training and evaluation took "
        f"{seconds:.0f} s over all runs."
    )


def _levels(task: TaskResult) -> str:
    levels = [
        f"{name} {value:.4g}" for name, value in (("chance", task.chance), ("solved", task.solved)) if value is not None
    ]
    return f" ({', '.join(levels)})" if levels else ""


# ------------------------------------------------------------------------------------------------ the files


def write_report(results: CompareResults, out_dir: Path) -> dict[str, Path]:
    """Draw the plots and write report.md and report.html into ``out_dir``; returns their paths."""
    plots = {
        "loss_curves": f"{PLOTS}/loss_curves.png",
        "extrapolation": f"{PLOTS}/extrapolation.png",
        **{f"task_{name}": f"{PLOTS}/task_{name}.png" for name in results.tasks},
    }
    if results.bench.measurements:
        plots["throughput_memory"] = f"{PLOTS}/throughput_memory.png"
    maps = {
        "attention_maps": f"{PLOTS}/attention_maps.png",
        **{f"attention_heads_{label}": f"{PLOTS}/attention_heads_{label}.png" for label in results.variants},
    }
    # The maps are drawn from the seed-0 runs' files; a report re-rendered where only its plots were kept (a stored
    # comparison, --report-only) keeps the maps those runs drew.
    draw_maps = all((out_dir / v.runs[0].run_dir / ATTENTION_MAPS).is_file() for v in results.variants.values())
    if draw_maps or all((out_dir / path).is_file() for path in maps.values()):
        plots |= maps
    (out_dir / PLOTS).mkdir(parents=True, exist_ok=True)
    plot_loss_curves(results, out_dir / plots["loss_curves"])
    plot_extrapolation(results, out_dir / plots["extrapolation"])
    if "throughput_memory" in plots:
        plot_throughput_memory(results, out_dir / plots["throughput_memory"])
    if draw_maps:
        plot_attention_maps(results, out_dir, out_dir / plots["attention_maps"])
        for label in results.variants:
            plot_attention_heads(results, label, out_dir, out_dir / plots[f"attention_heads_{label}"])
    for name, task in results.tasks.items():
        plot_task(task, out_dir / plots[f"task_{name}"])
    report = build_report(results, plots)
    atomic_write_text(out_dir / "report.md", report.to_markdown())
    atomic_write_text(out_dir / "report.html", report.to_html(out_dir))
    write_verdicts(results, out_dir / VERDICTS)
    paths = {"markdown": out_dir / "report.md", "html": out_dir / "report.html", "verdicts": out_dir / VERDICTS}
    return paths | {"plots": out_dir / PLOTS}


def write_verdicts(results: CompareResults, path: Path, verdicts: list[Verdict] | None = None) -> None:
    """``verdicts.json``: every claim's verdict as data, derived from ``results`` by the report's own rules."""
    record = verdicts_record(results, verdicts if verdicts is not None else judge_all(results))
    atomic_write_text(path, json.dumps(record, indent=2) + "\n")
