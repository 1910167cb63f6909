"""Held-out language-model loss, perplexity and bits per byte, and train-short/test-long extrapolation.

Protocol: ALiBi (Press et al., 2022) §4 and Appendix B, as summarised in eval_protocols.md §4. Nonoverlapping
evaluation cuts the stream into independent blocks, so every token is predicted once with only the context
inside its block. Sliding-window evaluation moves a window of ``block_len`` tokens by ``stride`` and scores
only the last ``stride`` predictions of each window after the first, so every scored token sees at least
``block_len - stride`` tokens of context; ``stride = block_len`` is the nonoverlapping case. Report both:
with nonoverlapping blocks the share of poorly-contextualised early tokens shrinks as blocks grow, which can
lower the loss of a model that makes no use of the longer context (the "early-token curse").
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass

from torch import Tensor, nn

from attnzoo.evals.base import IGNORE_INDEX, summed_loss
from attnzoo.validation import require


@dataclass(frozen=True)
class LMEvalConfig:
    block_len: int
    stride: int | None = None  # None → block_len: nonoverlapping blocks
    bytes_per_token: float = 1.0  # of the tokenizer on this text: 1 for byte-level
    batch_size: int = 8

    def __post_init__(self) -> None:
        require(self.block_len >= 1, "block_len", self.block_len, "must be >= 1")
        if self.stride is not None:
            require(1 <= self.stride <= self.block_len, "stride", self.stride, f"must be in [1, {self.block_len}]")
        require(self.bytes_per_token > 0, "bytes_per_token", self.bytes_per_token, "must be > 0")
        require(self.batch_size >= 1, "batch_size", self.batch_size, "must be >= 1")

    @property
    def step(self) -> int:
        """Tokens from one window's start to the next."""
        return self.block_len if self.stride is None else self.stride


@dataclass
class LMResult:
    loss: float  # mean cross-entropy, nats per token
    perplexity: float
    bits_per_byte: float
    tokens: int  # predictions scored
    block_len: int
    stride: int


def windows(tokens: Tensor, cfg: LMEvalConfig) -> tuple[Tensor, Tensor]:
    """The (windows, block_len) inputs and targets that score each token after the first at most once.

    Windows start at 0, stride, 2·stride, … and the tail that does not fill a whole window is not scored.
    """
    if tokens.dim() != 1 or tokens.numel() < cfg.block_len + 1:
        raise ValueError(
            f"tokens must be a 1-D stream of at least block_len + 1 = {cfg.block_len + 1} tokens; "
            f"got shape {tuple(tokens.shape)}"
        )
    spans = tokens.unfold(0, cfg.block_len + 1, cfg.step)
    inputs, targets = spans[:, :-1], spans[:, 1:].clone()
    # Later windows overlap the previous one by block_len - stride targets; those were already scored.
    targets[1:, : cfg.block_len - cfg.step] = IGNORE_INDEX
    return inputs, targets


def evaluate_lm(model: nn.Module, tokens: Tensor, cfg: LMEvalConfig) -> LMResult:
    """Loss, perplexity and bits per byte of ``model`` on a 1-D token stream."""
    inputs, targets = windows(tokens, cfg)
    total, count = summed_loss(model, inputs, targets, cfg.batch_size)
    loss = total / count
    return LMResult(
        loss=loss,
        perplexity=math.exp(loss),
        # bits/byte = (nats/token ÷ ln 2) × tokens/byte
        bits_per_byte=loss / math.log(2) / cfg.bytes_per_token,
        tokens=count,
        block_len=cfg.block_len,
        stride=cfg.step,
    )


@dataclass
class ExtrapolationPoint:
    multiple: int
    block_len: int
    result: LMResult | None  # None: the model cannot run this length (N/A)
    reason: str | None = None  # why it is N/A


def length_extrapolation(
    model: nn.Module, tokens: Tensor, cfg: LMEvalConfig, multiples: Sequence[int] = (1, 2, 4, 8, 16)
) -> list[ExtrapolationPoint]:
    """Evaluate at each ``multiple × cfg.block_len``, where ``cfg.block_len`` is the training length.

    A sliding ``cfg.stride`` is scaled by the same multiple, so each length keeps the same share of context
    per scored token and the same cost per token. A length the model refuses with ``ValueError`` (learned
    positions past ``max_seq_len``) is N/A with the model's reason, never clamped. The stream must hold a
    whole block at the largest length.
    """
    longest = max(multiples) * cfg.block_len
    if tokens.numel() <= longest:
        raise ValueError(f"the stream has {tokens.numel()} tokens; a block of {longest} needs {longest + 1}")
    points = []
    for multiple in multiples:
        stride = None if cfg.stride is None else multiple * cfg.stride
        length_cfg = dataclasses.replace(cfg, block_len=multiple * cfg.block_len, stride=stride)
        try:
            result = evaluate_lm(model, tokens, length_cfg)
        except ValueError as err:
            points.append(ExtrapolationPoint(multiple, length_cfg.block_len, None, str(err)))
        else:
            points.append(ExtrapolationPoint(multiple, length_cfg.block_len, result))
    return points
