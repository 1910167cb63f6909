"""``attnzoo viz``: attention heatmaps per layer and head for a prompt and a trained model.

Each mechanism records its *effective* map (``Transformer.attention_maps``): softmax probabilities for
MHA and selective attention, A1 − λ·A2 for Diff (signed, so it gets a diverging colour scale), the
post-composition weights for DCMHA.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch
from matplotlib.figure import Figure  # the object API: no pyplot state, no display backend
from torch import Tensor

from attnzoo.training.checkpoint import load_pretrained

MAX_TICK_LABELS = 48  # past this many tokens, axis labels are unreadable


def plot_layer(attention_map: Tensor, tokens: list[str], title: str, path: Path) -> None:
    """One PNG with a heatmap per head of a (heads, T, T) map; rows are queries, columns keys."""
    heads = attention_map.shape[0]
    columns = min(heads, 4)
    rows = math.ceil(heads / columns)
    fig = Figure(figsize=(3.2 * columns, 3.2 * rows))
    axes = fig.subplots(rows, columns, squeeze=False)
    signed = bool((attention_map < 0).any())
    limit = float(attention_map.abs().max()) or 1.0
    style = dict(cmap="RdBu_r", vmin=-limit, vmax=limit) if signed else dict(cmap="viridis", vmin=0.0, vmax=limit)
    for head, ax in enumerate(axes.flat):
        if head >= heads:
            ax.axis("off")
            continue
        image = ax.imshow(attention_map[head].numpy(), interpolation="nearest", **style)
        ax.set_title(f"head {head}", fontsize=9)
        if len(tokens) <= MAX_TICK_LABELS:
            ax.set_xticks(range(len(tokens)), tokens, rotation=90, fontsize=6)
            ax.set_yticks(range(len(tokens)), tokens, fontsize=6)
        else:
            ax.set_xticks([])
            ax.set_yticks([])
    fig.colorbar(image, ax=axes.ravel().tolist(), shrink=0.8, label="signed weight" if signed else "weight")
    fig.suptitle(title)
    fig.savefig(path, dpi=110, bbox_inches="tight")


def plot_attention_maps(maps: list[Tensor], tokens: list[str], out_dir: Path, name: str) -> list[Path]:
    """Write ``layer{i}.png`` for each (1, heads, T, T) map of one sequence; returns the paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for layer, attention_map in enumerate(maps):
        path = out_dir / f"layer{layer}.png"
        plot_layer(attention_map[0].float().cpu(), tokens, f"{name}: layer {layer}", path)
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
    maps = model.attention_maps(ids)
    tokens = [_display(tokenizer.decode([i])) for i in ids[0].tolist()]
    cfg = model.config
    name = f"{cfg.attention}+{cfg.position}"
    return plot_attention_maps(maps, tokens, out or Path(path) / "attention", name)
