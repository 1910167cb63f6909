"""Probes of attention noise, outliers and spikiness, per layer, for any trained model.

Pure metric functions on a map, a logit record or an activation, and one entry point, :func:`probe_model`,
which runs a batch of token windows through the model once and returns one :class:`LayerProbe` per layer.

* **Activation outliers** (Diff Transformer, Ye et al. 2024, Table 5; the maintainers' statistic in
  microsoft/unilm issue 1666): the top-1 attention logit, the largest |q·kᵀ/√d| (plus positional bias, as it
  enters the softmax) over every entry a query may see; and the largest and the median absolute hidden-state
  activation at each layer's output, with their ratio. For Diff both maps' logits count (|q1k1ᵀ/√d| and
  |q2k2ᵀ/√d|); for DCMHA the logits after the pre-composition, which are what enter its softmax.
* **Attention spikiness** (selective attention, Zhang et al. 2024): per attention row, :func:`row_spikiness`,
  averaged over the rows whose context length (the number of keys the query sees) falls in one power-of-two
  bucket, since the value's range depends on that length.
* **Attention entropy**, per layer and head (:func:`row_entropy`), in nats.

Maps are each layer's *effective* map (``Transformer.attention_maps``), which is signed for Diff and may be
for DCMHA; spikiness and entropy read a row as the distribution |p| / ‖p‖₁, which for a softmax row is the
row itself.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from attnzoo.attention import ATTENTION
from attnzoo.attention.base import visible
from attnzoo.evals.base import evaluating, model_device
from attnzoo.tables import Table


@dataclass(frozen=True)
class Outliers:
    """Absolute activations of one tensor: the largest, the median and their ratio."""

    top: float
    median: float
    ratio: float


@dataclass(frozen=True)
class LayerProbe:
    """The probes of one layer."""

    layer: int
    top_logit: float  # largest |logit| entering the softmax, over heads, rows and visible keys
    top_logit_per_head: list[float]
    hidden_top: float  # largest |activation| of the layer's output (the residual stream after the block)
    hidden_median: float
    hidden_ratio: float  # hidden_top / hidden_median
    entropy: float  # mean attention entropy over heads, rows and the batch, nats
    entropy_per_head: list[float]
    spikiness: float  # mean row spikiness over heads, rows and the batch (rows with one key excluded)
    spikiness_by_length: dict[str, float]  # context-length bucket → mean row spikiness


def activation_outliers(activations: Tensor) -> Outliers:
    """The largest and the median |x| over every element, and their ratio (inf when the median is 0).

    The median is ``torch.median``'s: for an even count, the lower of the two middle values.
    """
    magnitudes = activations.detach().abs().flatten().float()
    top, median = magnitudes.max().item(), magnitudes.median().item()
    return Outliers(top, median, top / median if median > 0 else float("inf"))


def top_logit(logits: Tensor) -> Tensor:
    """Per head, the largest |logit| of (B, H, T, S) ``logits`` recorded with 0 where masked → (H,)."""
    return logits.detach().abs().amax(dim=(0, 2, 3))


def _as_distribution(probs: Tensor) -> Tensor:
    """Rows as |p| / ‖p‖₁ (a softmax row is unchanged; a signed differential row becomes a distribution)."""
    magnitude = probs.detach().float().abs()
    return magnitude / magnitude.sum(dim=-1, keepdim=True).clamp(min=torch.finfo(torch.float32).tiny)


def row_spikiness(probs: Tensor) -> Tensor:
    """‖p‖₂ / ‖p‖₁ of each row (…, S) → (…): 1 for a one-hot row, 1/√L for a row uniform over L keys.

    The ratio is scale-free (it reads a signed or unnormalised row as |p|) and lies in [1/√L, 1] for a row
    over L keys, higher meaning spikier: the reciprocal of the ℓ1/ℓ2 sparsity ratio ‖p‖₁/‖p‖₂ ∈ [1, √L]. A
    review of the selective-attention paper writes the normalisation ‖s‖₁/(‖s‖₂·L); it is not used here, since
    it gives 1/L to a one-hot row and 1/√L to a uniform one, so both ends move with L and a value cannot be read
    without its length. Instead the raw ratio is averaged within context-length buckets
    (:func:`spikiness_by_length`), where a uniform row is the bucket's floor ≈ 1/√L.
    """
    magnitude = probs.detach().float().abs()
    l1 = magnitude.sum(dim=-1)
    return torch.linalg.vector_norm(magnitude, dim=-1) / l1.clamp(min=torch.finfo(torch.float32).tiny)


def row_entropy(probs: Tensor) -> Tensor:
    """−Σ p·log p in nats of each row (…, S) → (…), read as |p| / ‖p‖₁: 0 for one-hot, log L for uniform."""
    p = _as_distribution(probs)
    return -(p * torch.log(p.clamp(min=torch.finfo(torch.float32).tiny))).sum(dim=-1)


def length_bucket(length: int) -> str:
    """The power-of-two bucket of a context length: 1, 2–3, 4–7, 8–15, …"""
    low = 1 << (int(length).bit_length() - 1)
    return "1" if low == 1 else f"{low}-{2 * low - 1}"


def spikiness_by_length(probs: Tensor, lengths: Tensor) -> dict[str, float]:
    """Mean :func:`row_spikiness` of (B, H, T, S) ``probs`` by the bucket of each row's context length.

    ``lengths`` (T,) is the number of keys query t sees. Buckets come in increasing order.
    """
    spikiness = row_spikiness(probs).mean(dim=(0, 1))  # (T,): over the batch and heads
    buckets: dict[str, list[Tensor]] = {}
    for length in sorted(set(lengths.tolist())):
        buckets.setdefault(length_bucket(length), []).append(spikiness[lengths == length])
    return {bucket: torch.cat(rows).mean().item() for bucket, rows in buckets.items()}


def _context_lengths(model: nn.Module, layer_idx: int, seq_len: int, device: torch.device) -> Tensor:
    """(T,) keys each query of layer ``layer_idx`` sees in a fresh sequence of ``seq_len`` tokens."""
    cfg = model.config
    window = ATTENTION.get(cfg.attention).key_window(cfg, layer_idx)
    positions = torch.arange(seq_len, device=device)
    return visible(positions, positions, window, cfg.causal).sum(dim=-1)


def probe_model(model: nn.Module, tokens: Tensor) -> list[LayerProbe]:
    """One forward of ``tokens`` (B, T) on the eager reference, recording maps, logits and layer outputs;
    one :class:`LayerProbe` per layer. The model's training mode is restored afterwards."""
    device = model_device(model)
    hidden: list[Tensor] = []
    handles = [
        block.register_forward_hook(lambda module, args, output: hidden.append(output.detach()))
        for block in model.layers
    ]
    logits: dict[int, list[Tensor]] = {}
    try:
        with evaluating(model):
            maps = model.attention_maps(tokens.to(device), logits=logits)
    finally:
        for handle in handles:
            handle.remove()
    seq_len = tokens.shape[1]
    probes = []
    for layer, (attention, output) in enumerate(zip(maps, hidden, strict=True)):
        # Over the layer's kernel calls: Diff's two maps count alike.
        per_head = torch.stack([top_logit(call) for call in logits[layer]]).amax(dim=0)
        outliers = activation_outliers(output)
        entropy = row_entropy(attention).mean(dim=(0, 2))  # (H,)
        lengths = _context_lengths(model, layer, seq_len, attention.device)
        spiky = row_spikiness(attention)[:, :, lengths > 1]
        probes.append(
            LayerProbe(
                layer=layer,
                top_logit=per_head.max().item(),
                top_logit_per_head=per_head.tolist(),
                hidden_top=outliers.top,
                hidden_median=outliers.median,
                hidden_ratio=outliers.ratio,
                entropy=entropy.mean().item(),
                entropy_per_head=entropy.tolist(),
                spikiness=spiky.mean().item() if spiky.numel() else 1.0,
                spikiness_by_length=spikiness_by_length(attention, lengths),
            )
        )
    return probes


def probe_tables(probes: list[LayerProbe]) -> list[Table]:
    """Three tables with one row per layer, each narrow enough for a terminal: the outliers with the mean
    entropy and spikiness; the entropy of each head; the spikiness of each context-length bucket."""
    summary = Table(
        ["layer", "top logit", "hidden top", "hidden median", "top/median", "entropy", "spikiness"],
        [
            [
                str(p.layer),
                f"{p.top_logit:.3f}",
                f"{p.hidden_top:.3f}",
                f"{p.hidden_median:.4f}",
                f"{p.hidden_ratio:.1f}",
                f"{p.entropy:.3f}",
                f"{p.spikiness:.3f}",
            ]
            for p in probes
        ],
    )
    heads = max(len(p.entropy_per_head) for p in probes)
    by_head = Table(
        ["entropy by head", *(f"head {h}" for h in range(heads))],
        [
            [f"layer {p.layer}", *(f"{h:.2f}" for h in p.entropy_per_head)] + [""] * (heads - len(p.entropy_per_head))
            for p in probes
        ],
    )
    buckets = list(dict.fromkeys(bucket for p in probes for bucket in p.spikiness_by_length))
    by_length = Table(
        ["spikiness by context length", *buckets],
        [[f"layer {p.layer}", *(_cell(p.spikiness_by_length.get(bucket)) for bucket in buckets)] for p in probes],
    )
    return [summary, by_head, by_length]


def _cell(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}"  # a local layer sees no context that long
