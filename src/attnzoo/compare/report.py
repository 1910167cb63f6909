"""The report of a comparison: ``report.md``, a self-contained ``report.html`` and the plots, from results.json.

The report is built once as a list of blocks (headings, paragraphs, tables, figures) and rendered twice,
so the markdown and the HTML always say the same thing. The HTML embeds every plot as a base64 PNG and
needs nothing beside itself. Matplotlib is imported only where plots are drawn.
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

from attnzoo.compare.stats import NOISE_RULE, Summary, rank
from attnzoo.io import atomic_write, atomic_write_text
from attnzoo.tables import Table, inline_html, memory_header, ratio, speed_header

PLOTS = "plots"
ATTENTION_MAPS = "attention_maps.npy"  # beside each first-seed run: (layers, heads, T, T)
# How each mechanism's map is read off the model: its effective mixing weights (eval_protocols.md §2.3).
MAP_NOTES = {
    "diff": "the differential map softmax(A1) − λ·softmax(A2), signed (rows sum to 1 − λ)",
    "dcmha": "the post-composition map that actually mixes the values; composing heads can make it signed",
    "selective": "the map after the query-temperature scaling",
}


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


def _fmt(stats: dict[str, Any] | None, digits: int = 3) -> str:
    """A summary stored in results.json as mean ± std, or N/A where the metric does not exist."""
    return Summary(**stats).format(digits) if stats is not None else "N/A"


def _longest_multiple(results: dict[str, Any]) -> int:
    return max(results["spec"]["evals"]["extrapolation_multiples"])


def _bench_ratios(results: dict[str, Any]) -> list[dict[str, Any]]:
    """Each measurement with its throughput and memory relative to the baseline's in the same case."""
    measurements = results["bench"]["measurements"]
    base = {
        (m["mode"], m["seq_len"]): m
        for m in measurements
        if m["variant"] == results["baseline"] and "tokens_per_s" in m
    }
    rows = []
    for m in measurements:
        b = base.get((m["mode"], m["seq_len"]))
        ok = "tokens_per_s" in m and b is not None
        speed = m["tokens_per_s"] / b["tokens_per_s"] if ok else None
        memory = m["peak_mem_mb"] / b["peak_mem_mb"] if ok and b["peak_mem_mb"] > 0 else None
        rows.append({**m, "speed_ratio": speed, "memory_ratio": memory})
    return rows


def summary_table(results: dict[str, Any]) -> Table:
    """One row per variant: mean ± std over seeds, the noise verdict against the baseline, and the costs."""
    longest = _longest_multiple(results)
    ratios = [r for r in _bench_ratios(results) if r["mode"] == "train"]
    # Speed at the training length; memory at the longest training case, where attention's share shows.
    speed_at, memory_at = results["budget"]["seq_len"], max((r["seq_len"] for r in ratios), default=None)
    speed = {r["variant"]: r["speed_ratio"] for r in ratios if r["seq_len"] == speed_at}
    memory = {r["variant"]: r["memory_ratio"] for r in ratios if r["seq_len"] == memory_at}
    rows = []
    for label, variant in results["variants"].items():
        summary, versus = variant["summary"], results["versus_baseline"].get(label, {})
        loss_vs = versus.get("val_loss")
        rows.append(
            [
                label,
                f"{variant['parameters']:,}",
                _fmt(summary.get("val_loss"), 4),
                _fmt(summary.get("val_bits_per_byte"), 4),
                "baseline" if label == results["baseline"] else _difference_text(loss_vs, 4),
                _fmt(summary.get(f"loss_at_{longest}x"), 3),
                ratio(speed.get(label)),
                ratio(memory.get(label)),
            ]
        )
    header = [
        "variant",
        "params",
        "val loss",
        "val bits/byte",
        "Δ val loss vs baseline",
        f"loss at {longest}× length",
        f"train {speed_header('baseline')}, T={speed_at}",
        f"train {memory_header('baseline')}, T={memory_at}" if memory_at else f"train {memory_header('baseline')}",
    ]
    return Table(header, rows)


def _difference_text(diff: dict[str, Any] | None, digits: int) -> str:
    if diff is None:
        return "N/A"
    return f"{diff['delta']:+.{digits}f} ({diff['verdict']})"


def _per_seed_table(results: dict[str, Any]) -> Table:
    multiples = results["spec"]["evals"]["extrapolation_multiples"]
    header = ["variant", "seed", "train time", "train tok/s", "final train loss", "val loss", "val bits/byte"]
    header += [f"loss {m}×" for m in multiples]
    rows = []
    for label, variant in results["variants"].items():
        for run in variant["runs"]:
            row = [label, str(run["seed"]), f"{run['train_seconds']:.0f} s", f"{run['train_tokens_per_s']:,.0f}"]
            row += [f"{run['final_train_loss']:.4f}", f"{run['val']['loss']:.4f}", f"{run['val']['bits_per_byte']:.4f}"]
            row += [f"{p['loss']:.3f}" if "loss" in p else "N/A" for p in run["extrapolation"]]
            rows.append(row)
    return Table(header, rows)


def _extrapolation_table(results: dict[str, Any]) -> tuple[Table, list[str]]:
    multiples = results["spec"]["evals"]["extrapolation_multiples"]
    seq_len = results["budget"]["seq_len"]
    rows, reasons = [], []
    for label, variant in results["variants"].items():
        row = [label]
        for m in multiples:
            row.append(_fmt(variant["summary"].get(f"loss_at_{m}x"), 3))
        rows.append(row)
        refused = [p for p in variant["runs"][0]["extrapolation"] if "unavailable" in p]
        if refused:
            lengths = ", ".join(str(p["block_len"]) for p in refused)
            reasons.append(f"{label} at {lengths} tokens: N/A — {refused[0]['unavailable']}")
    return Table(["variant", *[f"{m}× ({m * seq_len})" for m in multiples]], rows), reasons


def _bench_table(results: dict[str, Any]) -> Table:
    rows = []
    for r in _bench_ratios(results):
        if "tokens_per_s" not in r:
            rows.append([r["variant"], r["mode"], str(r["seq_len"]), str(r["batch_size"]), "N/A", "N/A", "N/A", "N/A"])
            continue
        rows.append(
            [
                r["variant"],
                r["mode"],
                str(r["seq_len"]),
                str(r["batch_size"]),
                f"{r['tokens_per_s']:,.0f} ({r['tokens_per_s_min']:,.0f}–{r['tokens_per_s_max']:,.0f})",
                ratio(r["speed_ratio"]),
                f"{r['peak_mem_mb']:,.1f}",
                ratio(r["memory_ratio"]),
            ]
        )
    header = ["variant", "mode", "T", "batch", "tok/s median (min–max)", speed_header("baseline"), "peak MB"]
    return Table([*header, memory_header("baseline")], rows)


def _sweep_table(task: dict[str, Any]) -> tuple[Table, list[str]]:
    """Accuracy by context length (mean over depths and seeds), and why any length is N/A."""
    lengths = sorted(task["spec"]["sweep_lengths"])
    rows, reasons = [], []
    for label, runs in task["runs"].items():
        row = [label]
        for length in lengths:
            values = [r["sweep"]["accuracy_by_length"][str(length)] for r in runs]
            row.append("N/A" if None in values else Summary.of(values).format(3))
        rows.append(row)
        unavailable = runs[0]["sweep"]["unavailable"]
        if unavailable:
            first = next(iter(unavailable.values()))
            reasons.append(f"{label} at {', '.join(unavailable)} tokens: N/A — {first}")
    return Table(["variant", *[f"{length} tokens" for length in lengths]], rows), reasons


def _task_table(results: dict[str, Any], name: str) -> Table:
    task = results["tasks"][name]
    metric = task["metric"]
    rows = []
    for label, runs in task["runs"].items():
        row = [
            label,
            str(len(runs)),
            _fmt(task["summary"][label], 4),
            "baseline" if label == results["baseline"] else _difference_text(task["versus_baseline"].get(label), 4),
            ", ".join(str(r["steps"]) for r in runs),
        ]
        if "stop_at" in task["spec"] and task["spec"]["stop_at"] is not None:
            row.append(", ".join(str(r.get("steps_to_threshold") or "not reached") for r in runs))
        if task["spec"]["sweep_lengths"]:
            row.append(", ".join(str(r["sweep"]["largest_length_90"] or "none") for r in runs))
        if name == "needles":
            answer = Summary.of([r["probe"]["mean"]["answer"] for r in runs])
            noise = Summary.of([r["probe"]["mean"]["noise"] for r in runs])
            row += [answer.format(3), noise.format(3)]
        rows.append(row)
    header = ["variant", "seeds", f"{metric} (mean ± std)", "Δ vs baseline", "steps run (per seed)"]
    if "stop_at" in task["spec"] and task["spec"]["stop_at"] is not None:
        header.append(f"steps to {task['spec']['stop_at']}")
    if task["spec"]["sweep_lengths"]:
        header.append("largest length ≥ 90%")
    if name == "needles":
        header += ["attention to answer", "attention noise"]
    return Table(header, rows)


# ----------------------------------------------------------------------------------------------- the report


def build_report(results: dict[str, Any], plots: dict[str, str]) -> Report:
    spec, budget, machine = results["spec"], results["budget"], results["machine"]
    train, seeds = spec["train"], results["seeds"]
    baseline = results["baseline"]
    report = Report(f"attnzoo compare: {results['preset']}")
    report.add(
        Paragraph(
            f"{len(results['variants'])} variants × {len(seeds)} seed(s) {seeds}, trained on the same data in the "
            f"same order under the same budget; **{baseline}** is the baseline. Parameters are matched to the "
            f"baseline within 2% by the MLP width."
        ),
        Heading(2, "Setup"),
        Bullets(
            [
                f"corpus `{results['corpus']['name']}` ({results['corpus']['tokenizer']} tokenizer): "
                f"{results['corpus']['train_tokens']:,} train / {results['corpus']['val_tokens']:,} validation tokens",
                f"training: {budget['steps']} steps × {budget['batch_size']} sequences × {budget['seq_len']} tokens = "
                f"{budget['tokens_per_run']:,} tokens per run, {budget['runs']} runs; AdamW lr {train['lr']:g}, "
                f"warmup {train['warmup_steps']}, cosine to {train['lr'] * train['min_lr_ratio']:g}",
                f"seeds {seeds}: seed k fixes the initialisation and the data order of every variant",
                f"wall time: {budget['train_seconds_total']:.0f} s of training steps over all runs; "
                f"{budget['wall_seconds_this_invocation']:.0f} s for the invocation that wrote this report "
                "(finished runs are reused, so a resumed compare counts only its own work)",
                f"machine: {machine['description']}, {_load(machine['load_average_end'])} at the end (on a shared "
                "machine every figure that depends on time is slower and noisier)",
                f"attnzoo {results['attnzoo_version']}, {results['created']}",
            ]
        ),
        Heading(2, "Summary"),
        Paragraph(f"Mean ± sample standard deviation over seeds. **Noise rule.** {NOISE_RULE}{_few_seeds(seeds)}"),
        summary_table(results),
        Paragraph(_ranking_text(results)),
    )
    report.add(
        Heading(2, "Training curves"),
        Image(plots["loss_curves"], "Training and validation loss by step (mean over seeds, band: min–max)."),
    )
    table, reasons = _extrapolation_table(results)
    report.add(
        Heading(2, "Length extrapolation"),
        Paragraph(
            f"Trained at {budget['seq_len']} tokens, evaluated on nonoverlapping blocks of each length over the "
            f"same {spec['evals']['extrapolation_blocks']} × {_longest_multiple(results) * budget['seq_len']:,} "
            "validation tokens (train short, test long: ALiBi §4). Validation loss in nats per token."
        ),
        table,
    )
    if reasons:
        report.add(Bullets(reasons))
    report.add(Image(plots["extrapolation"], "Validation loss against evaluation length (mean ± std over seeds)."))
    report.add(
        Heading(2, "Throughput and memory"),
        Paragraph(
            "Every case in a fresh process, in one sitting, so the ratios compare like with like; medians over "
            f"{spec['evals']['bench_repeats']} repeats with the spread. Speed ratio > 1 is faster than the baseline. "
            "On the CPU, peak memory is the rise of the process's resident high-water mark, reset for the case, "
            "over its resident size before the first step (attnzoo.bench); a case whose ratio is N/A had no "
            f"measurable rise. Machine: {results['bench']['machine']}."
        ),
        _bench_table(results),
        Image(plots["throughput_memory"], "Training speed and peak memory relative to the baseline."),
    )
    notes = [
        f"{label}: {MAP_NOTES[v['config']['attention']]}"
        for label, v in results["variants"].items()
        if v["config"]["attention"] in MAP_NOTES
    ]
    report.add(
        Heading(2, "Attention maps"),
        Paragraph(
            f"Each layer's effective attention map of the seed-{seeds[0]} model, averaged over heads, on the first "
            f"{spec['evals']['map_tokens']} validation tokens (rows: queries, columns: keys)."
        ),
    )
    if notes:
        report.add(Bullets(notes))
    report.add(Image(plots["attention_maps"], "Attention maps by variant (rows) and layer (columns)."))
    for name, task in results["tasks"].items():
        report.add(Heading(2, f"Task: {name}"), Paragraph(_task_text(task)), _task_table(results, name))
        if task["spec"]["sweep_lengths"]:
            table, reasons = _sweep_table(task)
            report.add(Paragraph("Accuracy by context length, mean over needle depths (± std over seeds):"), table)
            if reasons:
                report.add(Bullets(reasons))
        report.add(Image(plots[f"task_{name}"], f"{name}: {_task_caption(task)}"))
    report.add(
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
    return f"{values[0]:.2f}" if values else "unknown"


def _ranking_text(results: dict[str, Any]) -> str:
    summaries = {
        label: Summary(**v["summary"]["val_bits_per_byte"])
        for label, v in results["variants"].items()
        if "val_bits_per_byte" in v["summary"]
    }
    ranked = rank(summaries) if len(summaries) > 1 else None
    if ranked is None:
        return "**No ranking**: it needs at least 2 seeds per variant and at least 2 variants."
    parts = [f"{ranked[0].label} (best mean)"]
    parts += [f"{e.label} ({e.versus_best.delta:+.4f} vs the best, {e.versus_best.verdict})" for e in ranked[1:]]
    tied = [e.label for e in ranked[1:] if e.versus_best.within_noise]
    conclusion = (
        f"{', '.join(tied)} {'is' if len(tied) == 1 else 'are'} within seed noise of the best, so these seeds "
        "do not separate them from it."
        if tied
        else "Every other variant is beyond seed noise of the best."
    )
    return f"**Ranking by validation bits per byte** (lower is better): {'; '.join(parts)}. {conclusion}"


def _task_caption(task: dict[str, Any]) -> str:
    caption = f"`{task['metric']}` on the evaluation set by training step, each seed"
    return caption + ("; accuracy by context length and by needle depth." if task["spec"]["sweep_lengths"] else ".")


def _task_text(task: dict[str, Any]) -> str:
    spec = task["spec"]
    model = ", ".join(f"{k} {v}" for k, v in spec["model"].items())
    options = ", ".join(f"{k}={v}" for k, v in spec["options"].items()) or "the task's defaults"
    stop = f", stopping early at {spec['stop_at']}" if spec["stop_at"] is not None else ""
    direction = "higher" if task["higher_is_better"] else "lower"
    seconds = sum(run["seconds"] for runs in task["runs"].values() for run in runs)
    return (
        f"Trained from scratch for every variant × seed on fresh batches ({options}); model {model}, parameter "
        f"matched; up to {spec['steps']} steps × {spec['batch_size']} samples, lr {spec['lr']:g}{stop}. "
        f"Scored by `{task['metric']}` ({direction} is better) on one fixed set of {spec['eval_samples']} samples. "
        f"Training and evaluation took {seconds:.0f} s over all runs."
    )


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


def _mean_curve(curves: list[list[list[float]]]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Steps common to every seed, and the mean, min and max over seeds there."""
    steps = sorted(set.intersection(*[{s for s, _ in c} for c in curves]))
    values = np.array([[dict(map(tuple, c))[s] for s in steps] for c in curves])
    return np.array(steps), values.mean(axis=0), values.min(axis=0), values.max(axis=0)


def _length_axis(axes: Any, lengths: Sequence[int]) -> None:
    """A log-2 axis ticked at exactly the lengths evaluated."""
    axes.set_xscale("log", base=2)
    axes.set_xticks(list(lengths), [str(length) for length in lengths])
    axes.minorticks_off()


def plot_loss_curves(results: dict[str, Any], path: Path) -> None:
    figure, (train_axes, val_axes) = _figure(2)
    colors = _colors(list(results["variants"]))
    for label, variant in results["variants"].items():
        for axes, key in ((train_axes, "train"), (val_axes, "val")):
            steps, mean, low, high = _mean_curve([run["curve"][key] for run in variant["runs"]])
            axes.plot(steps, mean, "-" if key == "train" else "o-", color=colors[label], label=label, markersize=3)
            axes.fill_between(steps, low, high, color=colors[label], alpha=0.2, linewidth=0)
    for axes, title in ((train_axes, "training loss"), (val_axes, "validation loss")):
        axes.set(xlabel="step", ylabel="loss (nats / token)", title=title)
        axes.grid(alpha=0.3)
    val_axes.legend(fontsize=8)
    _save(figure, path)


def plot_extrapolation(results: dict[str, Any], path: Path) -> None:
    figure, (axes,) = _figure(1, width=6.5, height=4.2)
    colors = _colors(list(results["variants"]))
    seq_len = results["budget"]["seq_len"]
    for label, variant in results["variants"].items():
        points = [
            (m * seq_len, Summary(**variant["summary"][f"loss_at_{m}x"]))
            for m in results["spec"]["evals"]["extrapolation_multiples"]
            if f"loss_at_{m}x" in variant["summary"]
        ]
        lengths = [length for length, _ in points]
        means = [s.mean for _, s in points]
        errors = [s.std or 0.0 for _, s in points]
        axes.errorbar(lengths, means, yerr=errors, fmt="o-", color=colors[label], label=label, capsize=3, markersize=4)
    axes.axvline(seq_len, color="grey", linestyle=":", label="training length")
    _length_axis(axes, [m * seq_len for m in results["spec"]["evals"]["extrapolation_multiples"]])
    axes.set(
        xlabel="evaluation length (tokens)", ylabel="validation loss (nats / token)", title="train short, test long"
    )
    axes.grid(alpha=0.3)
    axes.legend(fontsize=8)
    _save(figure, path)


def plot_throughput_memory(results: dict[str, Any], path: Path) -> None:
    rows = _bench_ratios(results)
    cases = list(dict.fromkeys((r["mode"], r["seq_len"]) for r in rows))
    labels = list(results["variants"])
    colors = _colors(labels)
    figure, (speed_axes, memory_axes) = _figure(2)
    width = 0.8 / len(labels)
    for i, label in enumerate(labels):
        by_case = {(r["mode"], r["seq_len"]): r for r in rows if r["variant"] == label}
        x = np.arange(len(cases)) + (i - (len(labels) - 1) / 2) * width
        for axes, key in ((speed_axes, "speed_ratio"), (memory_axes, "memory_ratio")):
            heights = [by_case[c][key] if by_case[c][key] is not None else math.nan for c in cases]
            axes.bar(x, heights, width, color=colors[label], label=label)
    for axes, title in (
        (speed_axes, "throughput ÷ baseline (higher is faster)"),
        (memory_axes, "peak memory ÷ baseline"),
    ):
        axes.axhline(1.0, color="grey", linewidth=0.8)
        axes.set_xticks(np.arange(len(cases)), [f"{mode}, T={t}" for mode, t in cases])
        axes.set(title=title)
        axes.grid(alpha=0.3, axis="y")
    figure.legend(*speed_axes.get_legend_handles_labels(), loc="outside lower center", ncols=len(labels), fontsize=8)
    _save(figure, path)


def plot_attention_maps(results: dict[str, Any], out_dir: Path, path: Path) -> None:
    from matplotlib.figure import Figure

    maps = {
        label: np.load(out_dir / variant["runs"][0]["run_dir"] / ATTENTION_MAPS).mean(axis=1)
        for label, variant in results["variants"].items()
    }  # (layers, T, T) after averaging the heads
    n_layers = max(m.shape[0] for m in maps.values())
    figure = Figure(figsize=(2.6 * n_layers + 0.6, 2.6 * len(maps)), dpi=110, layout="constrained")
    for row, (label, layer_maps) in enumerate(maps.items()):
        signed = bool((layer_maps < 0).any())
        # The first rows of a causal map put all their mass on a few keys; the 99th percentile keeps them
        # from washing out the rest of the picture.
        scale = float(np.quantile(np.abs(layer_maps), 0.99)) or 1.0
        for layer, attention in enumerate(layer_maps):
            axes = figure.add_subplot(len(maps), n_layers, row * n_layers + layer + 1)
            if signed:
                image = axes.imshow(attention, cmap="RdBu_r", vmin=-scale, vmax=scale)
            else:
                image = axes.imshow(attention, cmap="viridis", vmin=0, vmax=scale)
            axes.set_xticks([])
            axes.set_yticks([])
            axes.set_title(f"{label} · layer {layer}", fontsize=8)
        figure.colorbar(image, ax=axes, shrink=0.8)
    _save(figure, path)


def plot_task(results: dict[str, Any], name: str, path: Path) -> None:
    task = results["tasks"][name]
    swept = bool(task["spec"]["sweep_lengths"])
    figure, panels = _figure(3 if swept else 1)
    colors = _colors(list(task["runs"]))
    history_axes = panels[0]
    for label, runs in task["runs"].items():
        for i, run in enumerate(runs):
            steps, values = zip(*run["history"], strict=True)
            history_axes.plot(steps, values, "o-", color=colors[label], markersize=3, label=label if i == 0 else None)
    history_axes.set(xlabel="step", ylabel=task["metric"], title=f"{name}: evaluation during training (each seed)")
    history_axes.grid(alpha=0.3)
    history_axes.legend(fontsize=8)
    if swept:
        length_axes, depth_axes = panels[1], panels[2]
        lengths = sorted(task["spec"]["sweep_lengths"])
        # Depth is shown at the training length when it was swept: elsewhere length effects mix in.
        depth_length = task["context_len"] if task["context_len"] in lengths else lengths[0]
        for label, runs in task["runs"].items():
            sweeps = [run["sweep"] for run in runs]
            lengths = sweeps[0]["lengths"]
            by_length = [[s["accuracy_by_length"][str(length)] for s in sweeps] for length in lengths]
            shown = [(length, np.mean(v)) for length, v in zip(lengths, by_length, strict=True) if None not in v]
            if shown:
                length_axes.plot(*zip(*shown, strict=True), "o-", color=colors[label], label=label)
            row = lengths.index(depth_length)
            at_length = np.array([s["accuracy"][row] for s in sweeps], dtype=float).mean(axis=0)
            depth_axes.plot(sweeps[0]["depths"], at_length, "o-", color=colors[label], label=label)
        _length_axis(length_axes, lengths)
        length_axes.set(xlabel="context length (tokens)", ylabel="accuracy", title="by length (mean over depths)")
        depth_axes.set(xlabel="needle depth", ylabel="accuracy", title=f"by depth at {depth_length} tokens")
        for axes in (length_axes, depth_axes):
            axes.set_ylim(-0.05, 1.05)
            axes.grid(alpha=0.3)
    _save(figure, path)


# ------------------------------------------------------------------------------------------------ the files


def write_report(results: dict[str, Any], out_dir: Path) -> dict[str, Path]:
    """Draw the plots and write report.md and report.html; returns their paths."""
    plots_dir = out_dir / PLOTS
    plots = {
        "loss_curves": f"{PLOTS}/loss_curves.png",
        "extrapolation": f"{PLOTS}/extrapolation.png",
        "throughput_memory": f"{PLOTS}/throughput_memory.png",
        "attention_maps": f"{PLOTS}/attention_maps.png",
        **{f"task_{name}": f"{PLOTS}/task_{name}.png" for name in results["tasks"]},
    }
    plots_dir.mkdir(parents=True, exist_ok=True)
    plot_loss_curves(results, out_dir / plots["loss_curves"])
    plot_extrapolation(results, out_dir / plots["extrapolation"])
    plot_throughput_memory(results, out_dir / plots["throughput_memory"])
    plot_attention_maps(results, out_dir, out_dir / plots["attention_maps"])
    for name in results["tasks"]:
        plot_task(results, name, out_dir / plots[f"task_{name}"])
    report = build_report(results, plots)
    atomic_write_text(out_dir / "report.md", report.to_markdown())
    atomic_write_text(out_dir / "report.html", report.to_html(out_dir))
    return {"markdown": out_dir / "report.md", "html": out_dir / "report.html", "plots": plots_dir}
