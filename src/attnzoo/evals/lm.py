"""Held-out language-model loss, perplexity and bits per byte, and train-short/test-long extrapolation.

There is one evaluator, :func:`evaluate_lm`: the trainer, ``attnzoo eval`` and ``compare`` all use it, and it
divides by the exact UTF-8 bytes of the scored tokens for bits per byte.

Protocol: ALiBi (Press et al., 2022) §4 and Appendix B, as summarised in eval_protocols.md §4. Nonoverlapping
evaluation cuts the stream into independent blocks, so every token is predicted once with only the context
inside its block. Sliding-window evaluation moves a window of ``block_len`` tokens by ``stride`` and scores
only the last ``stride`` predictions of each window after the first, so every scored token sees at least
``block_len - stride`` tokens of context; ``stride = block_len`` is the nonoverlapping case. Report both:
with nonoverlapping blocks the share of poorly-contextualised early tokens shrinks as blocks grow, which can
lower the loss of a model that makes no use of the longer context (the "early-token curse").
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from tqdm import tqdm

from attnzoo.data.batches import eval_window_starts, gather_windows
from attnzoo.distributed import Distributed
from attnzoo.evals.base import IGNORE_INDEX, model_device
from attnzoo.precision import compute_dtype
from attnzoo.validation import is_int, require


@dataclass(frozen=True)
class LMEvalConfig:
    block_len: int
    stride: int | None = None  # None → block_len: nonoverlapping blocks
    batch_size: int = 8
    max_windows: int | None = None  # nonoverlapping only: score at most this many blocks, spread evenly

    def __post_init__(self) -> None:
        require(is_int(self.block_len) and self.block_len >= 1, "block_len", self.block_len, "must be >= 1")
        if self.stride is not None:
            require(
                is_int(self.stride) and 1 <= self.stride <= self.block_len,
                "stride",
                self.stride,
                f"must be in [1, {self.block_len}]",
            )
        require(is_int(self.batch_size) and self.batch_size >= 1, "batch_size", self.batch_size, "must be >= 1")
        if self.max_windows is not None:
            require(
                is_int(self.max_windows) and self.max_windows >= 1 and self.stride is None,
                "max_windows",
                self.max_windows,
                "must be an integer >= 1, and only for nonoverlapping blocks (no stride)",
            )

    @property
    def step(self) -> int:
        """Tokens from one window's start to the next."""
        return self.block_len if self.stride is None else self.stride


@dataclass(frozen=True)
class LMScore:
    """What one evaluation scored: bits per byte divide by the exact UTF-8 bytes of the scored tokens."""

    loss: float  # mean cross-entropy, nats per token
    tokens: int  # predictions scored
    bytes: int
    block_len: int
    stride: int
    # The mean loss of each of a few contiguous groups of windows, in text order, when asked for: the same text for
    # every model scored on the same stream, so a comparison can count the text's sampling noise as well as the seeds'.
    block_losses: list[float] | None = None

    @property
    def perplexity(self) -> float:
        """Infinite for a loss past float's range (about 709.8 nats: a diverged model), where math.exp raises."""
        try:
            return math.exp(self.loss)
        except OverflowError:
            return math.inf

    @property
    def bits_per_byte(self) -> float:
        """Comparable across tokenizers: total information in bits over the text's UTF-8 length."""
        return self.loss * self.tokens / (self.bytes * math.log(2))

    def metrics(self) -> dict[str, float]:
        """What the trainer logs (as ``val_*``) and ``attnzoo eval --json`` prints."""
        return {
            "loss": self.loss,
            "perplexity": self.perplexity,
            "bits_per_byte": self.bits_per_byte,
            "tokens": self.tokens,
        }


def window_plan(num_tokens: int, cfg: LMEvalConfig) -> tuple[np.ndarray, np.ndarray]:
    """The windows that score each token after the first at most once: their start offsets, and how many
    leading targets of each the window before already scored (0 for nonoverlapping blocks).

    Windows start at 0, stride, 2·stride, … and the tail that does not fill a whole window is not scored.
    """
    if num_tokens < cfg.block_len + 1:
        raise ValueError(
            f"the stream has {num_tokens} tokens; one window of block_len + 1 = {cfg.block_len + 1} is needed"
        )
    if cfg.stride is None:
        starts = eval_window_starts(num_tokens, cfg.block_len, cfg.max_windows)
        return starts, np.zeros_like(starts)
    starts = np.arange(0, num_tokens - cfg.block_len, cfg.stride)
    overlap = np.full_like(starts, cfg.block_len - cfg.stride)
    overlap[0] = 0
    return starts, overlap


def windows(tokens: np.ndarray, starts: np.ndarray, overlap: np.ndarray, block_len: int) -> tuple[Tensor, Tensor]:
    """(windows, block_len) inputs and targets, IGNORE_INDEX on the targets an earlier window scored."""
    inputs, targets = gather_windows(tokens, starts, block_len)
    targets = targets.clone()  # a view of the same windows as the inputs
    targets[torch.arange(block_len)[None, :] < torch.from_numpy(overlap)[:, None]] = IGNORE_INDEX
    return inputs, targets


@torch.no_grad()
def evaluate_lm(
    model: nn.Module,
    tokens: np.ndarray,
    token_bytes: np.ndarray,
    cfg: LMEvalConfig,
    *,
    env: Distributed | None = None,
    autocast: contextlib.AbstractContextManager | None = None,
    progress: bool = False,
    blocks: int | None = None,
) -> LMScore:
    """Loss, perplexity and bits per byte of ``model`` on a 1-D token stream: the one LM evaluator, used by the
    trainer, ``attnzoo eval`` and ``compare``. ``token_bytes[i]`` is the UTF-8 length of token i. ``progress``
    shows a bar over the windows, with an ETA, on stderr (rank 0). ``blocks`` also returns the mean loss of that
    many contiguous groups of windows (``LMScore.block_losses``).

    Each rank scores a disjoint, equal share of the windows and the sums are all-reduced, so every rank runs
    the same number of forward passes, as FSDP requires. Without ``env``: one process, on the model's device.
    """
    env = env or Distributed(device=model_device(model))
    tokens = np.asarray(tokens)
    starts, overlap = window_plan(len(tokens), cfg)
    require(
        blocks is None or (is_int(blocks) and 1 <= blocks <= len(starts)),
        "blocks",
        blocks,
        f"must be an integer in [1, {len(starts)}] (the windows scored)",
    )
    all_windows = len(starts)
    per_rank = len(starts) // env.world_size
    if per_rank == 0:
        raise ValueError(f"{len(starts)} evaluation window(s) cannot be shared by {env.world_size} ranks")
    mine = slice(env.rank * per_rank, (env.rank + 1) * per_rank)
    starts, overlap = starts[mine], overlap[mine]
    byte_lengths = torch.from_numpy(np.asarray(token_bytes)).to(env.device)
    was_training = model.training
    model.eval()
    totals = torch.zeros(3, dtype=torch.float64, device=env.device)  # nats, tokens, bytes
    # nats and tokens of every window, this rank's filled in, so the groups are all-reduced like the totals
    per_window = torch.zeros(2, all_windows, dtype=torch.float64, device=env.device)
    bar = tqdm(total=len(starts), desc="eval", unit="window", disable=not (progress and env.is_main))
    for i in range(0, len(starts), cfg.batch_size):
        batch = slice(i, i + cfg.batch_size)
        inputs, targets = (t.to(env.device) for t in windows(tokens, starts[batch], overlap[batch], cfg.block_len))
        with autocast or contextlib.nullcontext():
            logits = model(inputs)
        scored = targets != IGNORE_INDEX
        upcast = logits.to(compute_dtype(logits.dtype))  # fp32, or float64 for a float64 model
        nats = F.cross_entropy(upcast.transpose(1, 2), targets, ignore_index=IGNORE_INDEX, reduction="none").sum(1)
        first = env.rank * per_rank + i
        per_window[0, first : first + len(nats)] = nats.double()
        per_window[1, first : first + len(nats)] = scored.sum(1).double()
        totals[0] += nats.double().sum()
        totals[1] += scored.sum()
        totals[2] += byte_lengths[targets[scored]].sum()
        bar.update(len(starts[batch]))
    bar.close()
    model.train(was_training)
    nats, count, num_bytes = env.all_reduce_sum(totals).tolist()
    block_losses = None
    if blocks is not None:
        used = env.world_size * per_rank  # windows past an even share across ranks are not scored
        groups = env.all_reduce_sum(per_window)[:, :used].tensor_split(blocks, dim=1)
        block_losses = [float(group[0].sum() / group[1].sum()) for group in groups]
    return LMScore(nats / count, int(count), int(num_bytes), cfg.block_len, cfg.step, block_losses)


@dataclass
class ExtrapolationPoint:
    multiple: int
    block_len: int
    result: LMScore | None  # None: the model cannot run this length (N/A)
    reason: str | None = None  # why it is N/A


def length_extrapolation(
    model: nn.Module,
    tokens: np.ndarray,
    token_bytes: np.ndarray,
    cfg: LMEvalConfig,
    multiples: Sequence[int] = (1, 2, 4, 8, 16),
    blocks: int | None = None,
) -> list[ExtrapolationPoint]:
    """Evaluate at each ``multiple × cfg.block_len``, where ``cfg.block_len`` is the training length.

    ``blocks`` also keeps the mean loss of that many contiguous groups of windows at every length; a stream of whole
    blocks of the longest length puts the same tokens in group b at every length, so a rise can be read group by
    group.

    A sliding ``cfg.stride`` is scaled by the same multiple, so each length keeps the same share of context
    per scored token and the same cost per token. A length the model refuses with ``ValueError`` (learned
    positions past ``max_seq_len``) is N/A with the model's reason, never clamped. The stream must hold a
    whole block at the largest length.
    """
    longest = max(multiples) * cfg.block_len
    if len(tokens) <= longest:
        raise ValueError(f"the stream has {len(tokens)} tokens; a block of {longest} needs {longest + 1}")
    points = []
    for multiple in multiples:
        stride = None if cfg.stride is None else multiple * cfg.stride
        length_cfg = dataclasses.replace(cfg, block_len=multiple * cfg.block_len, stride=stride)
        try:
            result = evaluate_lm(model, tokens, token_bytes, length_cfg, blocks=blocks)
        except ValueError as err:
            points.append(ExtrapolationPoint(multiple, length_cfg.block_len, None, str(err)))
        else:
            points.append(ExtrapolationPoint(multiple, length_cfg.block_len, result))
    return points
