import pytest
import torch

from attnzoo import ModelConfig, Transformer
from attnzoo.evals import (
    IGNORE_INDEX,
    TASKS,
    CompositionConfig,
    DenoisingConfig,
    GraphConfig,
    LengthDepthSweep,
    MQARConfig,
    NeedlesConfig,
    PasskeyConfig,
    RandomWalkConfig,
    SweepCell,
    WordVocab,
    exact_match,
    largest_passing_length,
    scored_accuracy,
)

SMALL = {
    "passkey": PasskeyConfig(context_len=80),
    "needles": NeedlesConfig(context_len=64, n_needles=2, n_queries=1, n_keys=8, n_noise_words=16),
    "mqar": MQARConfig(vocab_size=64, seq_len=32, num_kv_pairs=4),
    "random_walk": RandomWalkConfig(n_nodes=8, degrees=(1, 2, 4), walk_len=16),
    "composition": CompositionConfig(n_facts=2),
    "denoising": DenoisingConfig(dim=3, n_tokens=5),
    "graph": GraphConfig(clique_sizes=(2, 3)),
}
# The graph model reads its tokens as a set (no positions), and its one head is the transition matrix.
OWN_MODEL_SETTINGS = {"graph": {"position": "none", "n_heads": 1}}


def test_scored_accuracy_and_exact_match_by_hand():
    targets = torch.tensor([[IGNORE_INDEX, 3, 4], [IGNORE_INDEX, IGNORE_INDEX, 5]])
    predictions = torch.tensor([[9, 3, 0], [9, 9, 5]])  # 2 of 3 scored positions right; unscored ones ignored
    assert scored_accuracy(predictions, targets) == pytest.approx(2 / 3)
    assert exact_match(predictions, targets).tolist() == [False, True]
    with pytest.raises(ValueError, match="no position"):
        scored_accuracy(predictions, torch.full_like(targets, IGNORE_INDEX))


def test_largest_passing_length_stops_at_the_first_failure():
    assert largest_passing_length({128: 1.0, 256: 0.95, 512: 0.5, 1024: 0.95}) == 256
    assert largest_passing_length({512: 0.9, 128: 1.0, 256: 0.92}) == 512  # order of the mapping is irrelevant
    assert largest_passing_length({128: 1.0, 256: None, 512: 1.0}) == 128  # N/A ends the run too
    assert largest_passing_length({128: 0.89}) is None
    assert largest_passing_length({128: 0.3, 256: 0.2}, threshold=0.2) == 256


def test_sweep_accuracy_by_length_averages_depths():
    sweep = LengthDepthSweep(
        cells=[
            SweepCell(64, 0.0, 1.0, 1.0),
            SweepCell(64, 1.0, 0.8, 0.9),
            SweepCell(128, 0.0, 0.5, 0.7),
            SweepCell(128, 1.0, 0.9, 0.9),
            SweepCell(256, 0.0, None, None),
        ],
        unavailable={256: "too long"},
    )
    assert sweep.accuracy_by_length() == pytest.approx({64: 0.9, 128: 0.7, 256: None})
    assert sweep.largest_length(0.9) == 64 and sweep.largest_length(0.7) == 128


def test_word_vocab():
    vocab = WordVocab(["<bos>", "the", "key", "."])
    assert vocab.encode("the key .") == [1, 2, 3] and vocab.decode([1, 2, 3]) == "the key ."
    with pytest.raises(ValueError, match="twice"):
        WordVocab(["a", "a"])


@pytest.mark.parametrize("name", sorted(TASKS))
def test_every_task_generates_valid_batches_and_evaluates_a_transformer(name):
    task, cfg = TASKS[name], SMALL[name]
    assert isinstance(cfg, task.config)
    batch = task.make_batch(cfg, 4, 0)
    assert batch.inputs.shape[0] == batch.targets.shape[0] == 4
    # An int seed gives a fixed set; one generator gives fresh batches.
    assert torch.equal(task.make_batch(cfg, 4, 0).inputs, batch.inputs)
    generator = torch.Generator().manual_seed(0)
    task.make_batch(cfg, 4, generator)
    assert not torch.equal(task.make_batch(cfg, 4, generator).inputs, batch.inputs)
    vocab_size = task.vocab_size(cfg)
    settings = {"dim": 16, "n_layers": 1, "n_heads": 2, **OWN_MODEL_SETTINGS.get(name, {})}
    model_cfg = ModelConfig(vocab_size=vocab_size, max_seq_len=batch.inputs.shape[1], **settings)
    if task.build_model is None:  # the language model reads token ids and predicts them
        assert batch.inputs.dtype == batch.targets.dtype == torch.long and batch.inputs.shape == batch.targets.shape
        assert batch.inputs.min() >= 0 and batch.inputs.max() < vocab_size
        scored = batch.targets[batch.targets != IGNORE_INDEX]
        assert scored.numel() > 0 and scored.min() >= 0 and scored.max() < vocab_size
    model = task.new_model(model_cfg, cfg)
    assert isinstance(model, Transformer) == (task.build_model is None)
    _, loss = model(batch.inputs, batch.targets)
    assert loss.dim() == 0 and torch.isfinite(loss)
    metrics = task.evaluate(model, cfg, n_samples=4, seed=0, batch_size=2)
    assert metrics and all(isinstance(v, float) and v == v for v in metrics.values())
