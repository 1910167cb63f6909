import pytest
import torch
import torch.nn.functional as F
from torch import nn

from attnzoo import ModelConfig, Transformer
from attnzoo.evals import IGNORE_INDEX, MQARConfig, evaluate_mqar, mqar_batch, steps_to_threshold

CFG = MQARConfig(vocab_size=64, seq_len=32, num_kv_pairs=4)


class Recall(nn.Module):
    """Answers each token that is a key of the context pairs with the value that followed it."""

    def __init__(self, cfg, wrong_every=0):
        super().__init__()
        self.cfg, self.wrong_every = cfg, wrong_every
        self.anchor = nn.Parameter(torch.zeros(()))

    def forward(self, idx):
        context = 2 * self.cfg.num_kv_pairs
        predictions = torch.zeros_like(idx)
        for b, row in enumerate(idx):
            pairs = dict(zip(row[0:context:2].tolist(), row[1:context:2].tolist(), strict=True))
            for t in range(context, idx.shape[1]):
                predictions[b, t] = pairs.get(int(row[t]), 0)
        if self.wrong_every:
            predictions[:: self.wrong_every] += 1  # one past the right value: wrong at every query
        return 100 * F.one_hot(predictions % self.cfg.vocab_size, self.cfg.vocab_size).float() + self.anchor


@pytest.mark.parametrize("random_non_queries", [False, True])
def test_shapes_and_labels(random_non_queries):
    cfg = MQARConfig(vocab_size=64, seq_len=32, num_kv_pairs=4, random_non_queries=random_non_queries)
    batch = mqar_batch(cfg, 50, seed=0)
    assert batch.inputs.shape == batch.targets.shape == (50, 32)
    keys, values = batch.inputs[:, 0:8:2], batch.inputs[:, 1:8:2]
    assert ((keys >= 1) & (keys < 32)).all() and ((values >= 32) & (values < 64)).all()
    for b in range(50):
        assert len(set(keys[b].tolist())) == 4 and len(set(values[b].tolist())) == 4
        scored = (batch.targets[b] != IGNORE_INDEX).nonzero().flatten()
        # Each key is queried once, after the pairs, on an even slot; its target is the value paired with it.
        assert len(scored) == 4 and (scored >= 8).all() and (scored % 2 == 0).all()
        assert sorted(batch.inputs[b, scored].tolist()) == sorted(keys[b].tolist())
        pairs = dict(zip(keys[b].tolist(), values[b].tolist(), strict=True))
        assert [pairs[int(k)] for k in batch.inputs[b, scored]] == batch.targets[b, scored].tolist()
    filler = batch.targets == IGNORE_INDEX
    filler[:, :8] = False
    if random_non_queries:
        assert (batch.inputs[filler] != 0).float().mean() > 0.9  # uniform tokens, rarely 0
    else:
        assert (batch.inputs[filler] == 0).all()


def test_queries_favour_short_gaps():
    # p(slot i) ∝ i^(a - 1): with a = 0.01 the first of 12 slots weighs ~12× the last. Four draws without
    # replacement flatten the counts, but the first slot stays far ahead.
    batch = mqar_batch(MQARConfig(vocab_size=64, seq_len=32, num_kv_pairs=4, power_a=0.01), 2000, seed=0)
    slots = ((batch.targets != IGNORE_INDEX).nonzero()[:, 1] - 8) // 2
    counts = torch.bincount(slots, minlength=12)
    assert counts[0] > 4 * counts[-1]
    uniform = mqar_batch(MQARConfig(vocab_size=64, seq_len=32, num_kv_pairs=4, power_a=1.0), 2000, seed=0)
    uniform_counts = torch.bincount(((uniform.targets != IGNORE_INDEX).nonzero()[:, 1] - 8) // 2, minlength=12)
    assert uniform_counts.max() < 1.3 * uniform_counts.min()


def test_determinism_and_online_generation():
    a, b, c = (mqar_batch(CFG, 8, seed=s) for s in (3, 3, 4))
    assert torch.equal(a.inputs, b.inputs) and torch.equal(a.targets, b.targets)
    assert not torch.equal(a.inputs, c.inputs)
    generator = torch.Generator().manual_seed(3)
    assert torch.equal(mqar_batch(CFG, 8, generator).inputs, a.inputs)
    assert not torch.equal(mqar_batch(CFG, 8, generator).inputs, a.inputs)  # a fresh batch every step


def test_config_is_validated():
    with pytest.raises(ValueError, match="num_kv_pairs"):
        MQARConfig(vocab_size=64, seq_len=32, num_kv_pairs=9)
    with pytest.raises(ValueError, match="vocab_size"):
        MQARConfig(vocab_size=32, seq_len=32)


def test_accuracy_of_recall_and_of_a_model_that_misses_a_quarter():
    assert evaluate_mqar(Recall(CFG), CFG, n_samples=40) == {"accuracy": 1.0}
    # Every fourth example is wrong at all its queries: accuracy 3/4.
    assert evaluate_mqar(Recall(CFG, wrong_every=4), CFG, n_samples=40, batch_size=40) == {"accuracy": 0.75}


def test_untrained_transformer_is_near_chance():
    model = Transformer(ModelConfig(vocab_size=64, dim=16, n_layers=1, n_heads=2, max_seq_len=32))
    assert evaluate_mqar(model, CFG, n_samples=64)["accuracy"] < 0.2


def test_steps_to_threshold():
    history = [(250, 0.01), (500, 0.25), (750, 0.991), (1000, 0.98), (1250, 1.0)]
    assert steps_to_threshold(history) == 750
    assert steps_to_threshold(history, threshold=0.995) == 1250
    assert steps_to_threshold(list(reversed(history))) == 750
    assert steps_to_threshold([(250, 0.5), (500, 0.98)]) is None
    assert steps_to_threshold([(100, 0.99)]) == 100  # reaching the threshold counts
