"""A count-based n-gram language model: the "competent model" level that every trained LM must beat.

The verdict machinery fits an interpolated Kneser–Ney trigram on a run's training split and scores it on the same
validation split, with the same tokens; a trained LM whose validation loss is not below that level has learned
less than counting does, so no claim about its attention mechanism is judged on it.

The model is interpolated Kneser–Ney in the standard form of Chen & Goodman (1998, "An Empirical Study of
Smoothing Techniques for Language Modeling", TR-10-98, eqs. 17–19; after Kneser & Ney 1995, "Improved
backing-off for m-gram language modeling"), with one discount ``D`` at every order. For an n-gram context ``h``
(its last n − 1 tokens) and the next token ``w``, with ``h'`` the context less its first token:

    P_n(w | h) = max(c_n(hw) − D, 0) / c_n(h•)  +  D · N1+(h•) / c_n(h•) · P_{n−1}(w | h')

* ``c_n`` at the highest order is the raw count of the n-gram in the training stream; at every lower order it is
  the continuation count N1+(•hw), the number of distinct tokens seen immediately before ``hw``.
* ``c_n(h•) = Σ_w c_n(hw)`` and ``N1+(h•)`` is the number of tokens ``w`` with ``c_n(hw) > 0``.
* The recursion ends in the uniform distribution, ``P_0(w) = 1 / V``.
* A context with ``c_n(h•) = 0`` (never seen at that order) gives all its weight to ``P_{n−1}(w | h')``.

Every ``P_n(· | h)`` sums to 1 over the vocabulary because every seen count is at least 1 > D. The validation
stream is scored on its own: its token ``i`` is predicted from its ``min(i, order − 1)`` preceding validation tokens
with ``P_{min(i, order − 1) + 1}``, so the first ``order − 1`` tokens use shorter contexts and the lower-order
(continuation) distributions, and nothing crosses from the training split.

N-grams are encoded as base-``V`` integers in uint64 (``V ** order ≤ 2 ** 64``: four 16-bit tokens fit) and
counted with sorts (``np.unique``) and binary searches (``np.searchsorted``), so the cost is a few sorts of the
stream per order and nothing loops over tokens in Python.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from attnzoo.validation import is_int, is_number, require

MAX_ORDER_CODES = 2**64  # n-gram codes are uint64; V ** order distinct codes must fit

Tokens = np.ndarray | torch.Tensor | Sequence[int]


@dataclass(frozen=True)
class NGramLevel:
    """The validation loss of an n-gram model fitted on a training split: the level a trained LM must beat."""

    order: int  # 3 for a trigram
    smoothing: str  # human-readable, e.g. "interpolated Kneser-Ney, discount 0.75 at every order, ..."
    val_loss: float  # mean nats per validation token
    train_tokens: int
    val_tokens: int


@dataclass(frozen=True)
class _Level:
    """One order's tables, all sorted by code: its n-grams with their (raw or continuation) counts, and its
    contexts with ``c(h•)`` and ``N1+(h•)``."""

    keys: np.ndarray  # uint64 n-gram codes
    counts: np.ndarray  # int64
    context_keys: np.ndarray  # uint64 (n − 1)-gram codes; 0 is the empty context of the unigram level
    context_totals: np.ndarray  # int64, c(h•)
    context_types: np.ndarray  # int64, N1+(h•)


def _as_tokens(tokens: Tokens, name: str, vocab_size: int) -> np.ndarray:
    """``tokens`` as a 1-D uint64 array, refused unless every entry is an integer id in ``[0, vocab_size)``."""
    if isinstance(tokens, torch.Tensor):
        tokens = tokens.detach().cpu().numpy()
    array = np.asarray(tokens)
    require(array.ndim == 1, f"{name} (shape)", array.shape, "must be a 1-D stream of token ids")
    require(array.size > 0, f"{name} (length)", array.size, "must hold at least one token")
    integral = np.issubdtype(array.dtype, np.integer) and array.dtype != np.bool_
    require(integral, f"{name} (dtype)", str(array.dtype), "must be an integer type")
    low, high = int(array.min()), int(array.max())
    bad = low if low < 0 else high
    require(low >= 0 and high < vocab_size, f"{name} token", bad, f"must be in [0, vocab_size) = [0, {vocab_size})")
    return array.astype(np.uint64, copy=False)


def _codes(tokens: np.ndarray, n: int, vocab_size: int) -> np.ndarray:
    """The base-``vocab_size`` code of every n-gram in ``tokens``, in stream order (first token most significant)."""
    length = len(tokens) - n + 1
    if length <= 0:
        return np.zeros(0, dtype=np.uint64)
    codes = tokens[:length].copy()
    base = np.uint64(vocab_size)
    for k in range(1, n):
        codes *= base
        codes += tokens[k : k + length]
    return codes


def _lookup(keys: np.ndarray, values: np.ndarray, queries: np.ndarray) -> np.ndarray:
    """``values`` at each query's position in the sorted ``keys``; 0 for a query not among them."""
    if len(keys) == 0:
        return np.zeros(len(queries), dtype=values.dtype)
    at = np.minimum(np.searchsorted(keys, queries), len(keys) - 1)
    return np.where(keys[at] == queries, values[at], 0)


def _level(keys: np.ndarray, counts: np.ndarray, vocab_size: int) -> _Level:
    contexts = keys // np.uint64(vocab_size)  # keys are sorted, so their contexts are too
    context_keys, starts, types = np.unique(contexts, return_index=True, return_counts=True)
    totals = np.add.reduceat(counts, starts) if len(keys) else np.zeros(0, dtype=np.int64)
    return _Level(keys, counts.astype(np.int64), context_keys, totals.astype(np.int64), types.astype(np.int64))


class KneserNey:
    """An interpolated Kneser–Ney n-gram model (see the module docstring for its equations), fitted with
    :meth:`fit`; :func:`kneser_ney_level` is the gate's entry point."""

    def __init__(self, levels: list[_Level], vocab_size: int, discount: float) -> None:
        self.levels = levels  # levels[n - 1] is order n
        self.vocab_size = vocab_size
        self.discount = discount

    @property
    def order(self) -> int:
        return len(self.levels)

    @classmethod
    def fit(cls, train: Tokens, vocab_size: int, order: int = 3, discount: float = 0.75) -> KneserNey:
        _check_options(vocab_size, order, discount)
        tokens = _as_tokens(train, "train", vocab_size)
        top_keys, top_counts = np.unique(_codes(tokens, order, vocab_size), return_counts=True)
        levels = [_level(top_keys, top_counts, vocab_size)]
        above = top_keys  # the distinct (n + 1)-grams of the stream, while building order n
        for n in range(order - 1, 0, -1):
            # The continuation count of an n-gram is the number of distinct (n + 1)-grams that end in it.
            keys, counts = np.unique(above % np.uint64(vocab_size**n), return_counts=True)
            levels.append(_level(keys, counts, vocab_size))
            # Not `keys`: the stream's first n-gram has no token before it, so it may be missing from them.
            above = np.unique(_codes(tokens, n, vocab_size)) if n > 1 else above
        return cls(levels[::-1], vocab_size, discount)

    def _probs(self, codes: np.ndarray, n: int) -> np.ndarray:
        """P_n of the last token of each n-gram in ``codes`` given its first n − 1 tokens."""
        probs = np.full(len(codes), 1.0 / self.vocab_size)
        base = np.uint64(self.vocab_size)
        for m in range(1, n + 1):
            level = self.levels[m - 1]
            grams = codes if m == n else codes % np.uint64(self.vocab_size**m)
            counts = _lookup(level.keys, level.counts, grams)
            contexts = grams // base
            totals = _lookup(level.context_keys, level.context_totals, contexts)
            types = _lookup(level.context_keys, level.context_types, contexts)
            seen = totals > 0
            mass = np.maximum(counts - self.discount, 0.0) + self.discount * types * probs
            probs = np.where(seen, mass / np.where(seen, totals, 1), probs)
        return probs

    def token_probs(self, val: Tokens) -> np.ndarray:
        """The probability of each token of the stream ``val`` given the validation tokens before it (at most
        ``order − 1`` of them), float64."""
        tokens = _as_tokens(val, "val", self.vocab_size)
        probs = np.empty(len(tokens))
        head = min(self.order - 1, len(tokens))
        for i in range(head):  # at most order − 1 tokens, each with a shorter context
            probs[i] = self._probs(_codes(tokens[: i + 1], i + 1, self.vocab_size), i + 1)[0]
        probs[head:] = self._probs(_codes(tokens, self.order, self.vocab_size), self.order)
        return probs

    def next_token_probs(self, context: Tokens) -> np.ndarray:
        """P(w | context) for every token w of the vocabulary, (vocab_size,) float64; only the context's last
        ``order − 1`` tokens count, and an empty context gives the unigram distribution."""
        if isinstance(context, torch.Tensor):
            context = context.detach().cpu().numpy()
        context = np.asarray(context)
        history = _as_tokens(context, "context", self.vocab_size) if context.size else np.zeros(0, dtype=np.uint64)
        history = history[len(history) - min(len(history), self.order - 1) :]
        code = 0
        for token in history.tolist():
            code = code * self.vocab_size + int(token)
        grams = np.uint64(code) * np.uint64(self.vocab_size) + np.arange(self.vocab_size, dtype=np.uint64)
        return self._probs(grams, len(history) + 1)


def _check_options(vocab_size: int, order: int, discount: float) -> None:
    require(is_int(vocab_size) and vocab_size >= 1, "vocab_size", vocab_size, "must be an integer ≥ 1")
    require(is_int(order) and order >= 1, "order", order, "must be an integer ≥ 1 (1 unigram, 2 bigram, 3 trigram)")
    require(is_number(discount) and 0 < discount < 1, "discount", discount, "must be a number in (0, 1)")
    require(
        vocab_size**order <= MAX_ORDER_CODES,
        "vocab_size**order",
        vocab_size**order,
        f"must be at most 2**64 so that n-grams fit uint64 codes (vocab_size={vocab_size}, order={order}); "
        "lower the order",
    )


def kneser_ney_level(train: Tokens, val: Tokens, vocab_size: int, order: int = 3, discount: float = 0.75) -> NGramLevel:
    """Fit interpolated Kneser–Ney of ``order`` on ``train`` and return its mean loss, in nats per token, on
    ``val``: the level the verdict gate requires every trained LM to beat (with ``order=3``) on the same split.

    ``train`` and ``val`` are 1-D streams of token ids in ``[0, vocab_size)`` (numpy arrays, memmaps, torch
    tensors or sequences); the equations are in the module docstring (Chen & Goodman 1998, eqs. 17–19).
    """
    _check_options(vocab_size, order, discount)
    train_tokens = _as_tokens(train, "train", vocab_size)
    val_tokens = _as_tokens(val, "val", vocab_size)  # refused before the fit, which may take minutes
    probs = KneserNey.fit(train_tokens, vocab_size, order, discount).token_probs(val_tokens)
    smoothing = (
        f"interpolated Kneser-Ney (Chen & Goodman 1998), discount {discount} at every order, continuation counts "
        f"below the highest order, uniform base over the {vocab_size}-token vocabulary"
    )
    return NGramLevel(
        order=order,
        smoothing=smoothing,
        val_loss=float(-np.log(probs).mean()),
        train_tokens=len(train_tokens),
        val_tokens=len(probs),
    )


__all__ = ["KneserNey", "NGramLevel", "kneser_ney_level"]
