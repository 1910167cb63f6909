"""The report's figures: loss curves, extrapolation, throughput and memory, attention maps, each task, and a ladder's
loss against compute.

Each function draws one PNG from a :class:`~attnzoo.results.comparison.CompareResults` (and, for the maps, the arrays
stored beside the runs). Matplotlib is imported only here, and only when a figure is drawn.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from attnzoo.claims.measures import flops_per_token
from attnzoo.io import atomic_write
from attnzoo.results.comparison import ATTENTION_MAPS, BenchRatio, CompareResults, TaskResult
from attnzoo.variants import Variant


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
    labels = list(dict.fromkeys(r.measurement.variant for r in rows))  # models: a +xC variant is its model's
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
    for level, name, style in ((task.chance, "chance", ":"), (task.solved, "solved", "--")):
        if level is not None:
            history_axes.axhline(level, color="0.4", linestyle=style, linewidth=1, label=f"{name} ({level:.3g})")
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
            for level, style in ((task.chance, ":"), (task.solved, "--")):
                if level is not None:
                    axes.axhline(level, color="0.4", linestyle=style, linewidth=1)
            axes.set_ylim(-0.05, 1.05)
            axes.grid(alpha=0.3)
    _save(figure, path)


def training_compute(rung: CompareResults, label: str) -> list[tuple[float, float]]:
    """``(training FLOPs, validation loss)`` of each seed of ``label`` at one size; an uptrained model counts its
    source's pre-training, as the budget gate does."""
    found = rung.variants[label]
    variant = Variant.parse(label)
    source = rung.variants.get(variant.source.label) if variant.uptrain is not None else None
    points = []
    for run in found.runs:
        flops = flops_per_token(found.config, rung.budget.seq_len) * run.tokens
        if source is not None:
            before = next(r for r in source.runs if r.seed == run.seed)
            flops += flops_per_token(source.config, rung.budget.seq_len) * before.tokens
        points.append((flops, run.val.loss))
    return points


def plot_loss_against_compute(rungs: Sequence[CompareResults], variant: str, baseline: str, path: Path) -> None:
    """``baseline``'s validation loss against training compute at every size, the power law ``ln L = a + b·ln C``
    fitted through every seed, and ``variant``'s points beside it, each labelled with the compute multiple read off
    the line: the compute the baseline would need for the variant's loss, over the variant's own."""
    from matplotlib.ticker import FormatStrFormatter

    figure, (axes,) = _figure(1, width=6.4, height=4.4)
    colors = _colors([baseline, variant])
    fit = _power_law([p for rung in rungs if baseline in rung.variants for p in training_compute(rung, baseline)])
    for label in (baseline, variant):
        sizes = [(rung, training_compute(rung, label)) for rung in rungs if label in rung.variants]
        for _, seeds in sizes:
            axes.scatter(*zip(*seeds, strict=True), s=10, color=colors[label], alpha=0.35, linewidths=0)
        means = [(float(np.mean([c for c, _ in seeds])), float(np.mean([v for _, v in seeds]))) for _, seeds in sizes]
        axes.plot(*zip(*means, strict=True), "o", color=colors[label], label=label, markersize=6)
        for (rung, _), (compute, loss) in zip(sizes, means, strict=True):
            size = f"{rung.variants[label].parameters / 1e6:.2f}M"
            note = size if label == baseline or fit is None else f"{size}: ×{_multiple(fit, compute, loss):.2g}"
            axes.annotate(note, (compute, loss), textcoords="offset points", xytext=(6, 4), fontsize=8)
    if fit is not None:
        low, high = axes.get_xlim()
        line = np.geomspace(low, high, 50)
        axes.plot(line, np.exp(fit[0] + fit[1] * np.log(line)), "--", color=colors[baseline], linewidth=1)
    axes.set_xscale("log")
    axes.set_yscale("log")
    axes.yaxis.set_major_formatter(FormatStrFormatter("%.2f"))
    axes.yaxis.set_minor_formatter(FormatStrFormatter("%.2f"))
    axes.set(xlabel="training compute (FLOPs)", ylabel="validation loss (nats / token)")
    axes.set_title(f"{variant} against {baseline}'s loss-compute line", fontsize=10)
    axes.grid(alpha=0.3, which="both")
    axes.legend(fontsize=8)
    _save(figure, path)


def _power_law(points: Sequence[tuple[float, float]]) -> tuple[float, float] | None:
    """``(a, b)`` of ``ln L = a + b·ln C`` by least squares; None without two distinct computes to fit."""
    if len({c for c, _ in points}) < 2:
        return None
    slope, intercept = np.polyfit(np.log([c for c, _ in points]), np.log([v for _, v in points]), 1)
    return float(intercept), float(slope)


def _multiple(fit: tuple[float, float], compute: float, loss: float) -> float:
    """The compute at which the fitted line reaches ``loss``, over ``compute``."""
    intercept, slope = fit
    return math.exp((math.log(loss) - intercept) / slope) / compute
