"""``attnzoo viz``: attention heatmaps per layer and head for a prompt and a trained model.

Each mechanism records its *effective* map (``Transformer.attention_maps``): softmax probabilities for
MHA and selective attention, A1 − λ·A2 for Diff (signed, so it gets a diverging colour scale), the
post-composition weights for DCMHA.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from matplotlib.figure import Figure  # the object API: no pyplot state, no display backend
from torch import Tensor

from attnzoo.io import atomic_write, check_memory
from attnzoo.training.checkpoint import load_pretrained

MAX_TICK_LABELS = 48  # past this many tokens, axis labels are unreadable
HEADS_PER_ROW = 4


def plot_attention_grid(
    panels: Sequence[Sequence[np.ndarray]],
    titles: Sequence[Sequence[str]],
    path: Path,
    *,
    suptitle: str = "",
    tokens: Sequence[str] | None = None,
    clip_quantile: float = 1.0,
    scale_per_row: bool = True,
) -> None:
    """The one attention-map plotter: a grid of (queries × keys) heatmaps, written to ``path`` as PNG.

    ``panels[r][c]`` is a (T, S) map. Each grid row (or, without ``scale_per_row``, the whole grid) shares one
    colour scale, up to the ``clip_quantile`` of its absolute values: below 1, the first rows of a causal map,
    which put all their mass on a few keys, no longer wash out the rest. Negative weights (Diff's A1 − λ·A2)
    get a diverging scale.
    """
    n_rows, n_cols = len(panels), max(len(row) for row in panels)
    figure = Figure(figsize=(2.8 * n_cols + 0.8, 2.8 * n_rows + 0.4), dpi=110, layout="constrained")
    axes_grid = figure.subplots(n_rows, n_cols, squeeze=False)
    labelled = tokens is not None and len(tokens) <= MAX_TICK_LABELS

    def scale(maps: Sequence[np.ndarray]) -> tuple[float, bool]:
        values = np.stack([np.asarray(m, dtype=np.float32) for m in maps])
        return float(np.quantile(np.abs(values), clip_quantile)) or 1.0, bool((values < 0).any())

    whole = scale([m for row in panels for m in row])
    for row, row_titles, row_axes in zip(panels, titles, axes_grid, strict=True):
        limit, signed = scale(row) if scale_per_row else whole
        style = dict(cmap="RdBu_r", vmin=-limit, vmax=limit) if signed else dict(cmap="viridis", vmin=0.0, vmax=limit)
        for i, axes in enumerate(row_axes):
            if i >= len(row):
                axes.axis("off")
                continue
            image = axes.imshow(np.asarray(row[i], dtype=np.float32), interpolation="nearest", **style)
            axes.set_title(row_titles[i], fontsize=8)
            if labelled:
                axes.set_xticks(range(len(tokens)), tokens, rotation=90, fontsize=6)
                axes.set_yticks(range(len(tokens)), tokens, fontsize=6)
            else:
                axes.set_xlabel("key position", fontsize=7)
                axes.set_ylabel("query position", fontsize=7)
                axes.tick_params(labelsize=6)
        figure.colorbar(image, ax=list(row_axes), shrink=0.8, label="signed weight" if signed else "weight")
    if suptitle:
        figure.suptitle(suptitle)
    atomic_write(path, lambda tmp: figure.savefig(tmp, format="png"))


def plot_attention_maps(maps: list[Tensor], tokens: list[str], out_dir: Path, name: str) -> list[Path]:
    """Write ``layer{i}.png``, every head of layer i, for each (1, heads, T, T) map of one sequence."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for layer, attention_map in enumerate(maps):
        heads = list(attention_map[0].float().cpu().numpy())
        rows = [heads[i : i + HEADS_PER_ROW] for i in range(0, len(heads), HEADS_PER_ROW)]
        titles = [
            [f"head {i + j}" for j in range(len(row))]
            for i, row in zip(range(0, len(heads), HEADS_PER_ROW), rows, strict=True)
        ]
        path = out_dir / f"layer{layer}.png"
        plot_attention_grid(rows, titles, path, suptitle=f"{name}: layer {layer}", tokens=tokens, scale_per_row=False)
        paths.append(path)
    return paths


def _display(token: str) -> str:
    return {"\n": "↵", " ": "␣", "\t": "⇥"}.get(token, token)


def draw_attention_maps(path: Path, prompt: str, out: Path | None = None, device: str = "cpu") -> list[Path]:
    """Write ``layer{i}.png`` for each layer of the model in ``path`` (a run or checkpoint directory) reading
    ``prompt`` into ``out`` (default: ``path/attention``); returns the paths."""
    if not prompt:
        raise ValueError("--prompt is empty: the heatmaps need at least one token")
    model, checkpoint = load_pretrained(path, device)
    tokenizer = checkpoint.require_tokenizer()
    ids = torch.from_numpy(tokenizer.encode(prompt).astype("int64"))[None].to(device)
    length, cfg = ids.shape[1], model.config
    # Every layer's maps are held at once, tokens × tokens per head: a long prompt is refused before allocating.
    check_memory(4 * cfg.n_layers * cfg.n_heads * length * length, f"the attention maps of {length:,} tokens",
                 device, {"prompt": length})  # fmt: skip
    maps = model.attention_maps(ids)
    tokens = [_display(tokenizer.decode([i])) for i in ids[0].tolist()]
    name = f"{cfg.attention}+{cfg.position}"
    return plot_attention_maps(maps, tokens, out or Path(path) / "attention", name)
