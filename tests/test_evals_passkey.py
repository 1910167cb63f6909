import pytest
import torch
import torch.nn.functional as F
from torch import nn

from attnzoo import ModelConfig, Transformer
from attnzoo.evals import IGNORE_INDEX, PasskeyConfig, evaluate_passkey, passkey_batch, passkey_sweep
from attnzoo.evals.passkey import HEADER, NEEDLE, QUESTION, VOCAB

PASS_KEY_IS = VOCAB.encode("pass key is")
# The model reads <bos>, header, needle with two copies of a 5-digit key, question, and four of the five
# answer digits: everything but the filler.
FIXED = len(HEADER.split()) + len(" ".join(NEEDLE).split()) + len(QUESTION.split()) + 3 * 5


def find(row, pattern):
    row = row.tolist()
    return next(i for i in range(len(row)) if row[i : i + len(pattern)] == pattern)


def needle_key(row, n_digits):
    start = find(row, PASS_KEY_IS) + len(PASS_KEY_IS)
    return row[start : start + n_digits].tolist()


class Retriever(nn.Module):
    """Reads the key off the needle and recites it after the question; refuses inputs longer than max_len."""

    def __init__(self, n_digits, max_len=10**9):
        super().__init__()
        self.n_digits, self.max_len = n_digits, max_len
        self.anchor = nn.Parameter(torch.zeros(()))

    def forward(self, idx):
        if idx.shape[1] > self.max_len:
            raise ValueError(f"sequence length {idx.shape[1]} exceeds {self.max_len}")
        predictions = torch.zeros_like(idx)
        for b, row in enumerate(idx):
            predictions[b, -self.n_digits :] = torch.tensor(needle_key(row, self.n_digits))
        return 100 * F.one_hot(predictions, len(VOCAB)).float() + self.anchor


def test_shapes_labels_and_depth():
    cfg = PasskeyConfig(context_len=FIXED + 12, n_digits=5, depth=0.5)
    batch = passkey_batch(cfg, 3, seed=0)
    assert batch.inputs.shape == batch.targets.shape == (3, FIXED + 12)
    assert batch.inputs.max() < len(VOCAB)
    assert batch.inputs[:, 0].eq(VOCAB.ids["<bos>"]).all()
    for row, targets in zip(batch.inputs, batch.targets, strict=True):
        key = needle_key(row, 5)
        # Only the last five predictions are scored, and they are the key stated in the needle.
        assert (targets[:-5] == IGNORE_INDEX).all() and targets[-5:].tolist() == key
        assert VOCAB.words[key[0]] != "0"
        assert row[-4:].tolist() == key[:4]  # the model reads all but the last digit
        # Half of the 12 filler words precede the needle.
        assert find(row, PASS_KEY_IS) - 1 == 1 + len(HEADER.split()) + 6
    assert torch.allclose(batch.depth, torch.full((3,), 0.5))


@pytest.mark.parametrize("depth, words_before", [(0.0, 0), (1.0, 12)])
def test_depth_extremes(depth, words_before):
    batch = passkey_batch(PasskeyConfig(context_len=FIXED + 12, depth=depth), 2, seed=0)
    for row in batch.inputs:
        assert find(row, PASS_KEY_IS) - 1 == 1 + len(HEADER.split()) + words_before


def test_random_depth_is_spread_over_the_filler():
    depths = passkey_batch(PasskeyConfig(context_len=120), 64, seed=0).depth
    assert depths.min() < 0.2 and depths.max() > 0.8


def test_determinism():
    cfg = PasskeyConfig(context_len=100)
    a, b, c = (passkey_batch(cfg, 4, seed=s) for s in (1, 1, 2))
    assert torch.equal(a.inputs, b.inputs) and torch.equal(a.targets, b.targets) and torch.equal(a.depth, b.depth)
    assert not torch.equal(a.inputs, c.inputs)
    generator = torch.Generator().manual_seed(1)
    first, second = passkey_batch(cfg, 4, generator), passkey_batch(cfg, 4, generator)
    assert torch.equal(first.inputs, a.inputs) and not torch.equal(second.inputs, a.inputs)


def test_too_short_a_context_is_refused():
    with pytest.raises(ValueError, match="context_len"):
        PasskeyConfig(context_len=FIXED - 1)


def test_accuracy_of_a_perfect_and_a_half_wrong_retriever():
    cfg = PasskeyConfig(context_len=90)
    assert evaluate_passkey(Retriever(5), cfg, n_samples=8) == {"accuracy": 1.0, "digit_accuracy": 1.0}

    class FirstHalfOffByOneDigit(Retriever):
        def forward(self, idx):
            logits = super().forward(idx)
            logits[: len(idx) // 2, -1] = logits[: len(idx) // 2, -1].roll(1, dims=-1)  # last digit wrong
            return logits

    # Half the samples miss one digit in five: exact match 0.5, digits 1 - 0.5/5.
    result = evaluate_passkey(FirstHalfOffByOneDigit(5), cfg, n_samples=8, batch_size=8)
    assert result == {"accuracy": 0.5, "digit_accuracy": pytest.approx(0.9)}


def test_sweep_marks_refused_lengths_and_finds_the_largest_retrieved_length():
    cfg = PasskeyConfig()
    sweep = passkey_sweep(Retriever(5, max_len=100), cfg, lengths=(80, 100, 120), depths=(0.0, 1.0), samples_per_cell=3)
    assert [(c.context_len, c.depth) for c in sweep.cells] == [(n, d) for n in (80, 100, 120) for d in (0.0, 1.0)]
    assert sweep.accuracy_by_length() == {80: 1.0, 100: 1.0, 120: None}
    assert "exceeds 100" in sweep.unavailable[120]
    assert sweep.largest_length(0.9) == 100


def test_sweep_with_a_transformer_with_learned_positions():
    model = Transformer(
        ModelConfig(vocab_size=len(VOCAB), dim=16, n_layers=1, n_heads=2, position="learned", max_seq_len=96)
    )
    sweep = passkey_sweep(model, PasskeyConfig(), lengths=(90, 128), depths=(0.5,), samples_per_cell=2)
    assert sweep.cells[0].accuracy is not None and 0 <= sweep.cells[0].token_accuracy <= 1
    assert sweep.cells[1].accuracy is None and "max_seq_len=96" in sweep.unavailable[128]
