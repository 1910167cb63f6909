import math
from collections import Counter

import numpy as np
import pytest
import torch

from attnzoo.evals.ngram import KneserNey, NGramLevel, kneser_ney_level

# The hand-worked corpus: vocabulary {0, 1, 2, 3}, where 3 never occurs in training.
#   index:  0 1 2 3 4 5 6 7 8 9 10 11
TRAIN = [0, 1, 0, 1, 2, 0, 1, 1, 2, 0, 0, 1]
# Its n-grams, worked out once for the expected values below:
#   bigrams  (11): 01 10 01 12 20 01 11 12 20 00 01
#                  raw counts 01:4 10:1 12:2 20:2 11:1 00:1; six distinct
#   trigrams (10): 010 101 012 120 201 011 112 120 200 001
#                  raw counts 120:2, the other eight 1
#   unigram continuation counts (distinct bigrams ending in w): 0: {10, 20, 00} = 3, 1: {01, 11} = 2,
#                  2: {12} = 1, 3: 0; total over w = 6 distinct bigrams, 3 tokens with a nonzero count
#   bigram continuation counts (distinct trigrams ending in hw): 01: {101, 201, 001} = 3, 10: {010} = 1,
#                  12: {012, 112} = 2, 20: {120} = 1, 11: {011} = 1, 00: {200} = 1
D = 0.5

# P1, the continuation unigram: (max(N1+(•w) − D, 0) + D · 3 tokens seen · 1/4) / 6
P1_0 = (3 - D + D * 3 / 4) / 6  # N1+(•0) = 3
P1_1 = (2 - D + D * 3 / 4) / 6  # N1+(•1) = 2
P1_3 = (0 + D * 3 / 4) / 6  # token 3 has no continuation: only the uniform share


def test_trigram_by_hand():
    val = [1, 2, 0, 3, 1, 0]
    expected = [
        # token 1, no context: the continuation unigram
        P1_1,
        # token 2 after [1]: bigram continuation counts after 1 are 10:1, 12:2, 11:1 (total 4, 3 types)
        (2 - D + D * 3 * ((1 - D + D * 3 / 4) / 6)) / 4,  # P1(2) = (N1+(•2) = 1 − D + D · 3/4) / 6
        # token 0 after [1, 2]: trigram counts after 12 are 120:2 (total 2, 1 type)
        (2 - D + D * 1 * (
            # P2(0 | 2): continuation counts after 2 are 20:1 (total 1, 1 type)
            (1 - D + D * 1 * P1_0) / 1
        )) / 2,
        # token 3 after [2, 0]: trigrams after 20 are 201:1, 200:1 (total 2, 2 types), none is 203
        (0 + D * 2 * (
            # P2(3 | 0): continuation counts after 0 are 01:3, 00:1 (total 4, 2 types), none is 03
            (0 + D * 2 * P1_3) / 4
        )) / 2,
        # token 1 after [0, 3]: context 03 never seen, nor 3 at the bigram order: P1 with weight 1
        P1_1,
        # token 0 after [3, 1]: context 31 never seen, so P2(0 | 1) with weight 1 (10:1 of total 4, 3 types)
        (1 - D + D * 3 * P1_0) / 4,
    ]  # fmt: skip
    # The same values worked to decimals, as a check on the expressions above.
    assert expected == pytest.approx([0.3125, 0.4296875, 0.93489583333, 0.0078125, 0.3125, 0.3046875], abs=1e-10)

    model = KneserNey.fit(TRAIN, vocab_size=4, order=3, discount=D)
    np.testing.assert_allclose(model.token_probs(val), expected, rtol=0, atol=1e-12)
    level = kneser_ney_level(TRAIN, val, vocab_size=4, order=3, discount=D)
    assert level == NGramLevel(3, level.smoothing, level.val_loss, 12, 6)
    assert level.val_loss == pytest.approx(-np.mean(np.log(expected)), abs=1e-12)
    assert "Kneser-Ney" in level.smoothing and "discount 0.5" in level.smoothing


def test_bigram_and_unigram_by_hand():
    # At the highest order the counts are raw: after 0 the bigrams are 01:4, 00:1 (total 5, 2 types).
    bigram = [P1_0, (4 - D + D * 2 * P1_1) / 5]
    np.testing.assert_allclose(KneserNey.fit(TRAIN, 4, 2, D).token_probs([0, 1]), bigram, rtol=0, atol=1e-12)
    # Order 1 is the raw unigram over 12 tokens (0: 5, 1: 5, 2: 2, 3: 0; 3 tokens seen) with the uniform base.
    unigram = [(5 - D + D * 3 / 4) / 12, (2 - D + D * 3 / 4) / 12, (0 + D * 3 / 4) / 12]
    np.testing.assert_allclose(KneserNey.fit(TRAIN, 4, 1, D).token_probs([1, 2, 3]), unigram, rtol=0, atol=1e-12)


def reference_probs(train, val, vocab_size, order, discount):
    """Interpolated Kneser–Ney straight from Chen & Goodman's equations, with dicts and loops."""
    train, val = [int(t) for t in train], [int(t) for t in val]

    def grams(seq, n):
        return [tuple(seq[i : i + n]) for i in range(len(seq) - n + 1)]

    counts = {order: Counter(grams(train, order))}  # raw counts at the highest order
    for n in range(order - 1, 0, -1):
        # continuation count: how many distinct tokens precede the n-gram
        counts[n] = Counter(gram[1:] for gram in set(grams(train, n + 1)))
    totals = {n: Counter() for n in counts}
    types = {n: Counter() for n in counts}
    for n, table in counts.items():
        for gram, count in table.items():
            totals[n][gram[:-1]] += count
            types[n][gram[:-1]] += 1

    def prob(history, w):
        n = len(history) + 1
        lower = 1 / vocab_size if n == 1 else prob(history[1:], w)
        if totals[n][history] == 0:
            return lower
        seen = max(counts[n][(*history, w)] - discount, 0)
        return (seen + discount * types[n][history] * lower) / totals[n][history]

    return np.array([prob(tuple(val[max(0, i - order + 1) : i]), val[i]) for i in range(len(val))])


def markov_stream(rng, length, vocab_size):
    """Tokens from a random sparse second-order Markov chain: repeated n-grams, unlike uniform noise."""
    table = rng.dirichlet(np.full(vocab_size, 0.1), size=(vocab_size, vocab_size))
    tokens = [0, 1]
    for _ in range(length - 2):
        tokens.append(int(rng.choice(vocab_size, p=table[tokens[-2], tokens[-1]])))
    return np.array(tokens)


@pytest.mark.parametrize("order", [1, 2, 3, 4])
def test_matches_reference(order):
    rng = np.random.default_rng(order)
    stream = markov_stream(rng, 3500, 20)
    train, val = stream[:3000], stream[3000:].copy()
    val[::37] = 19  # a token that may be rare or unseen in training
    for discount in (0.75, 0.3):
        ours = KneserNey.fit(train, 20, order, discount).token_probs(val)
        np.testing.assert_allclose(ours, reference_probs(train, val, 20, order, discount), rtol=0, atol=1e-10)
        level = kneser_ney_level(torch.from_numpy(train), torch.from_numpy(val), 20, order, discount)
        assert level.val_loss == pytest.approx(-np.log(ours).mean(), abs=1e-12)
        assert (level.train_tokens, level.val_tokens) == (3000, 500)


@pytest.mark.parametrize(
    ("train", "val", "order"),
    [([1], [0, 1, 2, 1], 3), ([2, 1], [2, 1, 0], 4), ([0, 0, 0, 0], [0, 1, 0, 0, 0], 2), ([3, 1, 2], [2], 3)],
)
def test_matches_reference_on_streams_shorter_than_the_order(train, val, order):
    ours = KneserNey.fit(train, 4, order).token_probs(val)
    np.testing.assert_allclose(ours, reference_probs(train, val, 4, order, 0.75), rtol=0, atol=1e-12)


def test_sixteen_bit_tokens_at_order_four():
    # 65,536 ** 4 = 2 ** 64 codes: the largest n-gram code, 2 ** 64 − 1, needs every bit of uint64.
    rng = np.random.default_rng(0)
    ids = np.array([0, 1, 65534, 65535])
    stream = ids[markov_stream(rng, 1200, 4)].astype(np.uint16)
    train, val = stream[:1000], stream[1000:]
    ours = KneserNey.fit(train, 65536, 4).token_probs(val)
    np.testing.assert_allclose(ours, reference_probs(train, val, 65536, 4, 0.75), rtol=0, atol=1e-12)
    model = KneserNey.fit(train, 65536, 4)
    assert model.next_token_probs([65535, 65535, 65535]).sum() == pytest.approx(1, abs=1e-12)


@pytest.mark.parametrize("order", [1, 2, 3, 4])
def test_distributions_sum_to_one(order):
    rng = np.random.default_rng(1)
    model = KneserNey.fit(markov_stream(rng, 2000, 12), 12, order)
    contexts = [[], [0], [0, 1], [5, 3, 7], [11, 11, 11, 11, 11], torch.tensor([2, 9]), np.array([4], np.uint8)]
    for context in contexts:
        probs = model.next_token_probs(context)
        assert probs.shape == (12,) and (probs > 0).all()
        assert probs.sum() == pytest.approx(1, abs=1e-12)
    # The distribution is the one the stream is scored with: the last order − 1 tokens of the context count.
    stream = np.array([5, 3, 7, 2, 9, 4])
    for i in range(len(stream)):
        expected = model.next_token_probs(stream[max(0, i - order + 1) : i])[stream[i]]
        assert model.token_probs(stream)[i] == pytest.approx(expected, abs=1e-15)
        assert model.next_token_probs(stream[:i])[stream[i]] == pytest.approx(expected, abs=1e-15)


def english(rng, sentences):
    templates = [
        "the cat sat on the mat. ",
        "a dog ran in the park and barked at the birds. ",
        "she sells sea shells by the sea shore. ",
        "to be or not to be, that is the question. ",
        "all that glitters is not gold. ",
        "the quick brown fox jumps over the lazy dog. ",
        "now is the winter of our discontent. ",
        "a rose by any other name would smell as sweet. ",
    ]
    text = "".join(templates[i] for i in rng.integers(0, len(templates), sentences))
    return np.frombuffer(text.encode(), dtype=np.uint8)


def test_higher_orders_model_text_better():
    rng = np.random.default_rng(0)
    train, val = english(rng, 300), english(rng, 40)
    losses = [kneser_ney_level(train, val, 256, order).val_loss for order in (1, 2, 3)]
    assert losses[0] > losses[1] > losses[2] > 0
    assert losses[0] < math.log(256)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"order": 0}, "order=0 is invalid"),
        ({"order": -2}, "order=-2 is invalid"),
        ({"order": 2.0}, "order=2.0 is invalid"),
        ({"discount": 0.0}, r"discount=0.0 is invalid: must be a number in \(0, 1\)"),
        ({"discount": 1}, r"discount=1 is invalid: must be a number in \(0, 1\)"),
        ({"discount": 1.5}, "discount=1.5 is invalid"),
        ({"discount": float("nan")}, "discount=nan is invalid"),
        ({"vocab_size": 0}, "vocab_size=0 is invalid"),
        ({"train": []}, r"train \(length\)=0 is invalid: must hold at least one token"),
        ({"val": np.zeros(0, np.int64)}, r"val \(length\)=0 is invalid"),
        ({"val": torch.zeros(0, dtype=torch.long)}, r"val \(length\)=0 is invalid"),
        ({"train": [0, 1, -1]}, r"train token=-1 is invalid: must be in \[0, vocab_size\) = \[0, 4\)"),
        ({"val": [0, 4]}, r"val token=4 is invalid: must be in \[0, vocab_size\) = \[0, 4\)"),
        ({"val": [0.0, 1.0]}, r"val \(dtype\)='float64' is invalid: must be an integer type"),
        ({"train": [[0, 1], [1, 0]]}, r"train \(shape\)=\(2, 2\) is invalid: must be a 1-D stream"),
        ({"vocab_size": 65537, "order": 4}, r"vocab_size\*\*order=\d+ is invalid: must be at most 2\*\*64"),
        ({"vocab_size": 2**22, "order": 3}, r"vocab_size\*\*order=\d+ is invalid"),
    ],
)
def test_bad_input(kwargs, message):
    arguments = {"train": [0, 1, 2, 3], "val": [1, 2], "vocab_size": 4, "order": 3, "discount": 0.75, **kwargs}
    with pytest.raises(ValueError, match=message):
        kneser_ney_level(**arguments)


def test_bad_context():
    model = KneserNey.fit(TRAIN, 4, 3)
    with pytest.raises(ValueError, match=r"context token=7 is invalid"):
        model.next_token_probs([0, 7])
