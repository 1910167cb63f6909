"""The report of a comparison: ``report.md``, a self-contained ``report.html`` and the plots.

It is a pure function of a :class:`~attnzoo.compare.results.CompareResults` (what ``results.json`` loads
into) and the attention maps stored beside the runs, so ``write_report(CompareResults.load(path), out_dir)``
redraws it without training. It names no task and no mechanism: each task's columns and each mechanism's
map note come from their records.

The report is built once as a list of blocks (headings, paragraphs, tables, figures) and rendered twice, so
the markdown and the HTML always say the same thing. The HTML embeds every plot as a base64 PNG and needs
nothing beside itself. Matplotlib is imported only where plots are drawn.
"""

from __future__ import annotations

import base64
import html
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from attnzoo.compare.claims import INTERVAL_METHOD, Verdict, judge_all
from attnzoo.compare.results import ATTENTION_MAPS, BenchRatio, CompareResults, TaskResult
from attnzoo.compare.stats import NOISE_RULE, Difference, Summary, difference, rank
from attnzoo.io import atomic_write, atomic_write_text
from attnzoo.tables import Table, inline_html, memory_header, ratio, speed_header

PLOTS = "plots"


# ------------------------------------------------------------------------------------------------ the blocks


@dataclass
class Heading:
    level: int
    text: str


@dataclass
class Paragraph:
    text: str  # inline `code` and **bold** are rendered in HTML too


@dataclass
class Bullets:
    items: list[str]


@dataclass
class Image:
    path: str  # relative to the report
    caption: str


@dataclass
class Report:
    title: str
    blocks: list[Heading | Paragraph | Bullets | Table | Image] = field(default_factory=list)

    def add(self, *blocks: Heading | Paragraph | Bullets | Table | Image) -> None:
        self.blocks.extend(blocks)

    def to_markdown(self) -> str:
        parts = [f"# {self.title}"]
        for block in self.blocks:
            if isinstance(block, Heading):
                parts.append(f"{'#' * block.level} {block.text}")
            elif isinstance(block, Paragraph):
                parts.append(block.text)
            elif isinstance(block, Bullets):
                parts.append("\n".join(f"- {item}" for item in block.items))
            elif isinstance(block, Table):
                parts.append(block.to_markdown())
            else:
                parts.append(f"![{block.caption}]({block.path})\n\n*{block.caption}*")
        return "\n\n".join(parts) + "\n"

    def to_html(self, root: Path) -> str:
        """One file: styles inline and every image as a data URI read from ``root / path``."""
        parts = [f"<h1>{html.escape(self.title)}</h1>"]
        for block in self.blocks:
            if isinstance(block, Heading):
                parts.append(f"<h{block.level}>{html.escape(block.text)}</h{block.level}>")
            elif isinstance(block, Paragraph):
                parts.append(f"<p>{inline_html(block.text)}</p>")
            elif isinstance(block, Bullets):
                parts.append("<ul>" + "".join(f"<li>{inline_html(i)}</li>" for i in block.items) + "</ul>")
            elif isinstance(block, Table):
                parts.append(block.to_html())
            else:
                data = base64.b64encode((root / block.path).read_bytes()).decode("ascii")
                parts.append(
                    f'<figure><img src="data:image/png;base64,{data}" alt="{html.escape(block.caption)}">'
                    f"<figcaption>{inline_html(block.caption)}</figcaption></figure>"
                )
        return (
            '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            f"<title>{html.escape(self.title)}</title><style>{_CSS}</style></head>\n<body>\n"
            + "\n".join(parts)
            + "\n</body></html>\n"
        )


_CSS = (
    "body{font:15px/1.5 system-ui,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222}"
    "table{border-collapse:collapse;margin:1em 0;font-size:13px}th,td{border:1px solid #ccc;padding:3px 8px;"
    "text-align:left}th{background:#f3f3f3}code{background:#f3f3f3;padding:0 3px}img{max-width:100%}"
    "figcaption{font-style:italic;color:#555}"
)


# ------------------------------------------------------------------------------------------------ the tables


def _fmt(summary: Summary | None, digits: int = 3) -> str:
    """Mean ± std over seeds, or N/A where the metric does not exist."""
    return summary.format(digits) if summary is not None else "N/A"


def _difference_text(diff: Difference | None, digits: int) -> str:
    return diff.format(digits) if diff is not None else "N/A"


def summary_table(results: CompareResults) -> Table:
    """One row per variant: mean ± std over seeds, the noise verdict against the baseline, and the costs."""
    longest = max(results.evals.extrapolation_multiples)
    ratios = [r for r in results.bench.ratios(results.baseline) if r.measurement.mode == "train"]
    # Speed at the training length; memory at the longest training case, where attention's share shows.
    speed_at = results.budget.seq_len
    memory_at = max((r.measurement.seq_len for r in ratios), default=None)
    speed = {r.measurement.variant: r.speed for r in ratios if r.measurement.seq_len == speed_at}
    memory = {r.measurement.variant: r.memory for r in ratios if r.measurement.seq_len == memory_at}
    rows = []
    for label, variant in results.variants.items():
        summary = variant.summary()
        versus = (
            "baseline" if label == results.baseline else _difference_text(results.versus_baseline(label, "val_loss"), 4)
        )
        rows.append(
            [
                label,
                f"{variant.parameters:,}",
                _fmt(summary.get("val_loss"), 4),
                _fmt(summary.get("val_bits_per_byte"), 4),
                versus,
                _fmt(summary.get(f"loss_at_{longest}x"), 3),
                ratio(speed.get(label)),
                ratio(memory.get(label)),
            ]
        )
    header = [
        "variant",
        "params",
        "val loss (nats/token)",
        "val bits/byte",
        "Δ val loss vs baseline",
        f"loss at {longest}× length (nats/token)",
        f"train {speed_header('baseline')}, T={speed_at}",
        f"train {memory_header('baseline')}, T={memory_at}" if memory_at else f"train {memory_header('baseline')}",
    ]
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


def _bench_table(results: CompareResults) -> Table:
    rows = []
    for r in results.bench.ratios(results.baseline):
        m = r.measurement
        where, t = [m.variant, m.mode, str(m.seq_len), str(m.batch_size)], m.timing
        if t is None:
            rows.append([*where, "N/A", "N/A", "N/A", "N/A"])
            continue
        rows.append(
            [
                *where,
                f"{t.tokens_per_s:,.0f} ({t.tokens_per_s_min:,.0f}–{t.tokens_per_s_max:,.0f})",
                ratio(r.speed),
                f"{t.peak_mem_mb:,.1f}",
                ratio(r.memory),
            ]
        )
    header = ["variant", "mode", "T", "batch", "tok/s median (min–max)", speed_header("baseline"), "peak MB"]
    return Table([*header, memory_header("baseline")], rows)


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


def _task_table(results: CompareResults, task: TaskResult) -> Table:
    """A row per variant: the metric over seeds and against the baseline, then whatever the task declares."""
    stop_at, swept = task.budget.stop_at, bool(task.budget.sweep_lengths)
    base = task.summary(results.baseline)
    rows = []
    for label, runs in task.runs.items():
        summary = task.summary(label)
        row = [
            label,
            str(len(runs)),
            summary.format(4),
            "baseline" if label == results.baseline else _difference_text(difference(summary, base), 4),
            ", ".join(str(r.steps) for r in runs),
        ]
        if stop_at is not None:
            row.append(", ".join(str(r.steps_to_threshold or "not reached") for r in runs))
        if swept:
            row.append(", ".join(str((r.sweep.largest_length(0.9) if r.sweep else None) or "none") for r in runs))
        row += [task.probe_summary(label, key).format(3) for key in task.probe_columns]
        rows.append(row)
    direction = "higher" if task.higher_is_better else "lower"
    header = ["variant", "seeds", f"{task.metric} ({direction} is better)", "Δ vs baseline", "steps run (per seed)"]
    if stop_at is not None:
        header.append(f"steps to {stop_at}")
    if swept:
        header.append("largest length ≥ 90%")
    header += list(task.probe_columns.values())
    return Table(header, rows)


def claims_table(verdicts: list[Verdict]) -> Table:
    """The papers' claims and this run's verdict on each: the report's first table."""
    rows = []
    for v in verdicts:
        if v.effect is None:
            effect = "—"
        elif v.low is None or v.high is None:
            effect = f"{v.effect:+.4g}"
        elif v.claim.rule == "ratio":
            effect = f"{v.effect:g}× (exact)"
        else:
            effect = f"{v.effect:+.4g} [{v.low:+.4g}, {v.high:+.4g}]"
        rows.append(
            [
                v.claim.paper,
                v.claim.statement,
                f"**{v.outcome}**: {v.reason}",
                f"{v.claim.variant} − {v.claim.baseline}: {v.claim.measure.label}",
                effect,
                v.scale,
                v.would_change,
            ]
        )
    header = ["paper", "claim", "verdict", "measured (variant − baseline)", "effect [95% interval]", "scale"]
    return Table([*header, "what would change it"], rows)


def _claims_caveats(results: CompareResults, verdicts: list[Verdict]) -> list[str]:
    counts = {
        o: sum(v.outcome == o for v in verdicts) for o in ("supported", "contradicted", "inconclusive", "not run")
    }
    caveats = [
        ", ".join(f"{n} {outcome}" for outcome, n in counts.items()) + f" of {len(verdicts)} claims.",
        f"Intervals: {INTERVAL_METHOD}. A verdict needs at least 3 seeds; this run has {len(results.seeds)}.",
        f"Scale: {results.budget.tokens_per_run:,} tokens per language-model run and models of about "
        f"{results.variants[results.baseline].parameters / 1e6:.2f}M parameters, orders of magnitude below the "
        "papers' (each claim names its own); a verdict here says what holds at this scale, not at the paper's.",
    ]
    if counts["not run"]:
        caveats.append(
            "Not run: the claim needs a variant or task this comparison did not include; `--preset claims` runs "
            "every claim's experiment."
        )
    for v in verdicts:
        if v.outcome == "contradicted" and v.claim.checks:
            caveats.append(
                f"Before reading `{v.claim.id}` as a contradiction, these were checked: " + "; ".join(v.claim.checks)
            )
    return caveats


# ----------------------------------------------------------------------------------------------- the report


def build_report(results: CompareResults, plots: dict[str, str]) -> Report:
    budget, machine, corpus, evals = results.budget, results.machine, results.corpus, results.evals
    seeds, baseline = results.seeds, results.baseline
    report = Report(f"attnzoo compare: {results.preset}")
    verdicts = judge_all(results)
    report.add(
        Heading(2, "What this run says"),
        Paragraph("Each paper's claims, the experiment here that tests it, and the verdict of this run's seeds."),
        claims_table(verdicts),
        Bullets(_claims_caveats(results, verdicts)),
        Heading(2, "Setup"),
        Paragraph(
            f"{len(results.variants)} variants × {len(seeds)} seed(s) {seeds}, trained on the same data in the "
            f"same order under the same budget; **{baseline}** is the baseline. Parameters are matched to the "
            f"baseline within 2% by the MLP width."
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
            ]
        ),
        Heading(2, "Summary"),
        Paragraph(
            "Mean ± sample standard deviation over seeds. Losses are cross-entropies in nats per token (with the "
            f"byte tokenizer, nats per byte); bits per byte divide by the exact UTF-8 bytes scored. "
            f"**Noise rule.** {NOISE_RULE}{_few_seeds(seeds)}"
        ),
        summary_table(results),
        Paragraph(_ranking_text(results)),
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
        Paragraph(
            "Every case in a fresh process, back to back, so the ratios compare like with like; medians over "
            f"{evals.bench_repeats} repeats with the spread. Speed is tokens/s ÷ the baseline's (above 1 is faster); "
            "memory is peak ÷ the baseline's (above 1 is more). On the CPU, peak memory is the rise of the process's "
            "resident high-water mark, reset for the case, over its resident size before the first step "
            "(attnzoo.bench); a case whose ratio is N/A had no measurable rise. "
            f"Machine: {results.bench.machine}."
        ),
        _bench_table(results),
        Image(plots["throughput_memory"], "Training speed and peak memory relative to the baseline."),
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
        report.add(Heading(2, f"Task: {name}"), Paragraph(_task_text(task)), _task_table(results, task))
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


def _few_seeds(seeds: list[int]) -> str:
    if len(seeds) >= 3:
        return ""
    return (
        f" With {len(seeds)} seed(s) the standard deviations are themselves rough: read the verdicts as indicative "
        "and confirm a difference with more seeds (`--seeds`, or the standard preset) before relying on it."
    )


def _load(values: list[float] | None) -> str:
    return f"load average {values[0]:.2f}" if values else "load average unknown"


def _ranking_text(results: CompareResults) -> str:
    summaries = {
        label: summary["val_bits_per_byte"]
        for label, variant in results.variants.items()
        if "val_bits_per_byte" in (summary := variant.summary())
    }
    ranked = rank(summaries) if len(summaries) > 1 else None
    if ranked is None:
        return "**No ranking**: it needs at least 2 seeds per variant and at least 2 variants."
    parts = [f"{ranked[0].label} (best mean)"]
    parts += [
        f"{e.label} ({e.versus_best.delta:+.4f} vs the best; pooled std {e.versus_best.pooled_std:.4f}, threshold "
        f"{2 * e.versus_best.pooled_std:.4f}; ranges {'overlap' if e.versus_best.ranges_overlap else 'apart'}; "
        f"{e.versus_best.verdict})"
        for e in ranked[1:]
    ]
    tied = [e.label for e in ranked[1:] if e.versus_best.within_noise]
    conclusion = (
        f"{', '.join(tied)} {'is' if len(tied) == 1 else 'are'} within seed noise of the best, so these seeds "
        "do not separate them from it."
        if tied
        else "Every other variant is beyond seed noise of the best."
    )
    return f"**Ranking by validation bits per byte** (lower is better): {'; '.join(parts)}. {conclusion}"


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


# ------------------------------------------------------------------------------------------------ the plots


def _figure(n_panels: int, width: float = 5.2, height: float = 3.8):
    from matplotlib.figure import Figure

    figure = Figure(figsize=(width * n_panels, height), dpi=110, layout="constrained")
    return figure, [figure.add_subplot(1, n_panels, i + 1) for i in range(n_panels)]


def _save(figure: Any, path: Path) -> None:
    atomic_write(path, lambda tmp: figure.savefig(tmp, format="png"))


def _colors(labels: Sequence[str]) -> dict[str, Any]:
    from matplotlib import colormaps

    palette = colormaps["tab10"]
    return {label: palette(i % 10) for i, label in enumerate(labels)}


def _mean_curve(curves: list[list[tuple[int, float]]]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Steps common to every seed, and the mean, min and max over seeds there."""
    steps = sorted(set.intersection(*[{s for s, _ in c} for c in curves]))
    values = np.array([[dict(c)[s] for s in steps] for c in curves])
    return np.array(steps), values.mean(axis=0), values.min(axis=0), values.max(axis=0)


def _length_axis(axes: Any, lengths: Sequence[int]) -> None:
    """A log-2 axis ticked at exactly the lengths evaluated."""
    axes.set_xscale("log", base=2)
    axes.set_xticks(list(lengths), [str(length) for length in lengths])
    axes.minorticks_off()


def plot_loss_curves(results: CompareResults, path: Path) -> None:
    figure, (train_axes, val_axes) = _figure(2)
    colors = _colors(list(results.variants))
    for label, variant in results.variants.items():
        for axes, curves, style in (
            (train_axes, [run.train_curve for run in variant.runs], "-"),
            (val_axes, [run.val_curve for run in variant.runs], "o-"),
        ):
            steps, mean, low, high = _mean_curve(curves)
            axes.plot(steps, mean, style, color=colors[label], label=label, markersize=3)
            axes.fill_between(steps, low, high, color=colors[label], alpha=0.2, linewidth=0)
    for axes, title in ((train_axes, "training loss"), (val_axes, "validation loss")):
        axes.set(xlabel="step", ylabel="loss (nats / token)", title=title)
        axes.grid(alpha=0.3)
    val_axes.legend(fontsize=8)
    _save(figure, path)


def plot_extrapolation(results: CompareResults, path: Path) -> None:
    figure, (axes,) = _figure(1, width=6.5, height=4.2)
    colors = _colors(list(results.variants))
    seq_len, multiples = results.budget.seq_len, results.evals.extrapolation_multiples
    for label, variant in results.variants.items():
        summary = variant.summary()
        points = [(m * seq_len, summary[f"loss_at_{m}x"]) for m in multiples if f"loss_at_{m}x" in summary]
        lengths = [length for length, _ in points]
        means = [s.mean for _, s in points]
        errors = [s.std or 0.0 for _, s in points]
        axes.errorbar(lengths, means, yerr=errors, fmt="o-", color=colors[label], label=label, capsize=3, markersize=4)
    axes.axvline(seq_len, color="grey", linestyle=":", label="training length")
    _length_axis(axes, [m * seq_len for m in multiples])
    axes.set(
        xlabel="evaluation length (tokens)", ylabel="validation loss (nats / token)", title="train short, test long"
    )
    axes.grid(alpha=0.3)
    axes.legend(fontsize=8)
    _save(figure, path)


def plot_throughput_memory(results: CompareResults, path: Path) -> None:
    rows: list[BenchRatio] = results.bench.ratios(results.baseline)
    cases = list(dict.fromkeys((r.measurement.mode, r.measurement.seq_len) for r in rows))
    labels = list(results.variants)
    colors = _colors(labels)
    figure, (speed_axes, memory_axes) = _figure(2)
    width = 0.8 / len(labels)
    for i, label in enumerate(labels):
        by_case = {(r.measurement.mode, r.measurement.seq_len): r for r in rows if r.measurement.variant == label}
        x = np.arange(len(cases)) + (i - (len(labels) - 1) / 2) * width
        speeds = [by_case[c].speed if by_case[c].speed is not None else math.nan for c in cases]
        # The bars' whiskers span the slowest to the fastest repeat, against the baseline's median.
        spread = np.array(
            [
                [s - (by_case[c].speed_low or s), (by_case[c].speed_high or s) - s]
                for s, c in zip(speeds, cases, strict=True)
            ]
        ).T
        speed_axes.bar(x, speeds, width, yerr=spread, capsize=2, color=colors[label], label=label)
        memory = [by_case[c].memory if by_case[c].memory is not None else math.nan for c in cases]
        memory_axes.bar(x, memory, width, color=colors[label], label=label)
    for axes, title, ylabel in (
        (speed_axes, "training speed (higher is faster)", "tokens/s ÷ baseline's"),
        (memory_axes, "peak memory (higher is more)", "peak memory ÷ baseline's"),
    ):
        axes.axhline(1.0, color="grey", linewidth=0.8)
        axes.set_xticks(np.arange(len(cases)), [f"{mode}, T={t}" for mode, t in cases])
        axes.set(title=title, ylabel=ylabel)
        axes.grid(alpha=0.3, axis="y")
    figure.legend(*speed_axes.get_legend_handles_labels(), loc="outside lower center", ncols=len(labels), fontsize=8)
    _save(figure, path)


def load_attention_maps(path: Path) -> np.ndarray:
    """A run's stored maps, (layers, heads, T, T) floats; a file that holds anything else (pickled objects, which
    are never loaded, or an array of another shape) is refused naming it."""
    fix = "delete it to draw the report without the maps"
    try:
        maps = np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError) as err:
        raise ValueError(f"{path} is not a stored array of attention maps ({err}); {fix}") from None
    if not (isinstance(maps, np.ndarray) and maps.ndim == 4 and np.issubdtype(maps.dtype, np.floating)):
        what = f"{maps.dtype} array of shape {maps.shape}" if isinstance(maps, np.ndarray) else type(maps).__name__
        raise ValueError(f"{path} holds a {what}, not attention maps (floats: layers, heads, T, T); {fix}")
    return maps


def plot_attention_heads(results: CompareResults, label: str, out_dir: Path, path: Path) -> None:
    """One variant's first-seed map: layers (rows) × heads (columns), each layer on its own colour scale."""
    from attnzoo.viz import plot_attention_grid

    maps = load_attention_maps(out_dir / results.variants[label].runs[0].run_dir / ATTENTION_MAPS)
    titles = [[f"layer {layer} · head {head}" for head in range(maps.shape[1])] for layer in range(maps.shape[0])]
    plot_attention_grid([list(layer) for layer in maps], titles, path, suptitle=label, clip_quantile=0.99)


def plot_attention_maps(results: CompareResults, out_dir: Path, path: Path) -> None:
    """Variants (rows) × layers (columns), each the head average of the first seed's effective map."""
    from attnzoo.viz import plot_attention_grid

    maps = {
        label: load_attention_maps(out_dir / variant.runs[0].run_dir / ATTENTION_MAPS).mean(axis=1)
        for label, variant in results.variants.items()
    }  # (layers, T, T)
    panels = [list(layer_maps) for layer_maps in maps.values()]
    titles = [[f"{label} · layer {layer}" for layer in range(len(m))] for label, m in maps.items()]
    plot_attention_grid(panels, titles, path, clip_quantile=0.99)


def plot_task(task: TaskResult, path: Path) -> None:
    swept = bool(task.budget.sweep_lengths)
    figure, panels = _figure(3 if swept else 1)
    colors = _colors(list(task.runs))
    history_axes = panels[0]
    for label, runs in task.runs.items():
        for i, run in enumerate(runs):
            steps, values = zip(*run.history, strict=True)
            history_axes.plot(steps, values, "o-", color=colors[label], markersize=3, label=label if i == 0 else None)
    history_axes.set(xlabel="step", ylabel=task.metric, title=f"{task.name}: evaluation during training (each seed)")
    history_axes.grid(alpha=0.3)
    history_axes.legend(fontsize=8)
    if swept:
        length_axes, depth_axes = panels[1], panels[2]
        lengths = sorted(task.budget.sweep_lengths)
        # Depth is shown at the training length when it was swept: elsewhere length effects mix in.
        depth_length = task.context_len if task.context_len in lengths else lengths[0]
        for label, runs in task.runs.items():
            sweeps = [run.sweep for run in runs if run.sweep is not None]
            by_length = [[s.accuracy_by_length()[length] for s in sweeps] for length in lengths]
            shown = [(length, np.mean(v)) for length, v in zip(lengths, by_length, strict=True) if None not in v]
            if shown:
                length_axes.plot(*zip(*shown, strict=True), "o-", color=colors[label], label=label)
            row = sweeps[0].lengths.index(depth_length)
            at_length = np.array([s.accuracy[row] for s in sweeps], dtype=float).mean(axis=0)
            depth_axes.plot(sweeps[0].depths, at_length, "o-", color=colors[label], label=label)
        _length_axis(length_axes, lengths)
        length_axes.set(xlabel="context length (tokens)", ylabel="accuracy", title="by length (mean over depths)")
        depth_axes.set(xlabel="needle depth", ylabel="accuracy", title=f"by depth at {depth_length} tokens")
        for axes in (length_axes, depth_axes):
            axes.set_ylim(-0.05, 1.05)
            axes.grid(alpha=0.3)
    _save(figure, path)


# ------------------------------------------------------------------------------------------------ the files


def write_report(results: CompareResults, out_dir: Path) -> dict[str, Path]:
    """Draw the plots and write report.md and report.html into ``out_dir``; returns their paths."""
    plots = {
        "loss_curves": f"{PLOTS}/loss_curves.png",
        "extrapolation": f"{PLOTS}/extrapolation.png",
        "throughput_memory": f"{PLOTS}/throughput_memory.png",
        **{f"task_{name}": f"{PLOTS}/task_{name}.png" for name in results.tasks},
    }
    if all((out_dir / variant.runs[0].run_dir / ATTENTION_MAPS).is_file() for variant in results.variants.values()):
        plots["attention_maps"] = f"{PLOTS}/attention_maps.png"
        plots |= {f"attention_heads_{label}": f"{PLOTS}/attention_heads_{label}.png" for label in results.variants}
    (out_dir / PLOTS).mkdir(parents=True, exist_ok=True)
    plot_loss_curves(results, out_dir / plots["loss_curves"])
    plot_extrapolation(results, out_dir / plots["extrapolation"])
    plot_throughput_memory(results, out_dir / plots["throughput_memory"])
    if "attention_maps" in plots:
        plot_attention_maps(results, out_dir, out_dir / plots["attention_maps"])
        for label in results.variants:
            plot_attention_heads(results, label, out_dir, out_dir / plots[f"attention_heads_{label}"])
    for name, task in results.tasks.items():
        plot_task(task, out_dir / plots[f"task_{name}"])
    report = build_report(results, plots)
    atomic_write_text(out_dir / "report.md", report.to_markdown())
    atomic_write_text(out_dir / "report.html", report.to_html(out_dir))
    return {"markdown": out_dir / "report.md", "html": out_dir / "report.html", "plots": out_dir / PLOTS}
