import dataclasses

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from attnzoo import ModelConfig, Transformer
from attnzoo.evals import IGNORE_INDEX, CompositionConfig, composition_batch, evaluate_composition
from attnzoo.evals.composition import World, score_composition, vocabulary

CFG = CompositionConfig(n_names=6, n_objects=12, n_categories=3, n_heldout_objects=4, n_bindings=3, n_facts=4)
VOCAB = vocabulary(CFG)


def parse(row):
    """(facts as {object: category}, bindings as {name: object}, the name asked about)."""
    words = VOCAB.decode(row).split()
    episode = words.index("<")
    facts = {words[i]: words[i + 5] for i in range(1, episode, 7)}
    bindings = {words[i]: words[i + 2] for i in range(episode + 1, words.index(">"), 4)}
    assert words[-5:] == [words[-5], "has", "a", "kind", "of"]
    return facts, bindings, words[-5]


def category(world, obj):
    return f"cat{int(world.category_of[int(obj.removeprefix('obj'))])}"


class TwoHop(nn.Module):
    """Composes the binding read from the context with the world's object → category map."""

    def __init__(self, world, use_binding=True):
        super().__init__()
        self.world, self.use_binding = world, use_binding
        self.anchor = nn.Parameter(torch.zeros(()))

    def forward(self, idx):
        predictions = torch.zeros_like(idx)
        for b, row in enumerate(idx):
            _, bindings, asked = parse(row)
            obj = bindings[asked] if self.use_binding else next(iter(bindings.values()))
            predictions[b, -1] = VOCAB.ids[category(self.world, obj)]
        return 100 * F.one_hot(predictions, len(VOCAB)).float() + self.anchor


@pytest.mark.parametrize("split", ["train", "eval"])
def test_shapes_and_labels(split):
    cfg = dataclasses.replace(CFG, split=split)
    world = World.build(cfg)
    batch = composition_batch(cfg, 20, seed=0)
    assert batch.inputs.shape == batch.targets.shape == (20, cfg.context_len)
    for row, targets in zip(batch.inputs, batch.targets, strict=True):
        facts, bindings, asked = parse(row)
        assert len(facts) == 4 and len(bindings) == 3 and len(set(bindings.values())) == 3
        # The answer is the category of the object bound to the name asked about.
        assert VOCAB.words[targets[-1]] == category(world, bindings[asked])
        # Facts are true, and never about an episode object, so the answer is not in the context.
        assert all(category(world, obj) == cat for obj, cat in facts.items())
        assert not set(facts) & set(bindings.values())
        scored = VOCAB.decode(targets[targets != IGNORE_INDEX]).split()
        if split == "train":  # the facts' categories are learned too
            assert scored == [*facts.values(), category(world, bindings[asked])]
        else:
            assert scored == [category(world, bindings[asked])]


def test_held_out_objects_appear_only_in_facts_in_training_and_are_asked_about_in_eval():
    world = World.build(CFG)
    heldout = {f"obj{i}" for i in world.heldout.nonzero().flatten().tolist()}
    assert len(heldout) == 4
    train = composition_batch(CFG, 50, seed=0)
    evaluation = composition_batch(dataclasses.replace(CFG, split="eval"), 50, seed=0)
    in_facts = set()
    for row in train.inputs:
        facts, bindings, _ = parse(row)
        assert not set(bindings.values()) & heldout
        in_facts |= set(facts)
    assert heldout <= in_facts
    for row in evaluation.inputs:
        _, bindings, asked = parse(row)
        assert bindings[asked] in heldout and len(set(bindings.values()) & heldout) == 1


def test_world_is_fixed_by_its_seed_with_balanced_categories():
    world = World.build(CFG)
    assert torch.equal(world.category_of, World.build(CFG).category_of)
    assert torch.bincount(world.category_of).tolist() == [4, 4, 4]
    other = World.build(dataclasses.replace(CFG, world_seed=1))
    assert not torch.equal(world.category_of, other.category_of)
    # The batch seed draws episodes, never the world.
    a, b, c = (composition_batch(CFG, 8, seed=s) for s in (0, 0, 1))
    assert torch.equal(a.inputs, b.inputs) and torch.equal(a.targets, b.targets)
    assert not torch.equal(a.inputs, c.inputs)


def test_accuracy_of_two_hop_and_of_ignoring_the_question():
    world = World.build(CFG)
    assert evaluate_composition(TwoHop(world), CFG, n_samples=30) == {"accuracy": 1.0, "seen_accuracy": 1.0}
    # Answering with the first binding's object is right exactly when that is the one asked about, or it
    # happens to share its category.
    batch = composition_batch(dataclasses.replace(CFG, split="eval"), 30, seed=0)
    expected = 0.0
    for row in batch.inputs:
        _, bindings, asked = parse(row)
        expected += category(world, next(iter(bindings.values()))) == category(world, bindings[asked])
    result = evaluate_composition(TwoHop(world, use_binding=False), CFG, n_samples=30)
    assert result["accuracy"] == pytest.approx(expected / 30) and result["accuracy"] < 1


def test_runs_on_an_untrained_transformer():
    model = Transformer(ModelConfig(vocab_size=len(VOCAB), dim=16, n_layers=1, n_heads=2, max_seq_len=64))
    result = evaluate_composition(model, CFG, n_samples=16)
    assert set(result) == {"accuracy", "seen_accuracy"} and all(0 <= v <= 1 for v in result.values())


def test_heldout_objects_spread_evenly_over_categories_so_a_constant_answer_scores_chance():
    cfg = CompositionConfig()
    world = World.build(cfg)
    counts = torch.bincount(world.category_of[world.heldout], minlength=cfg.n_categories)
    assert counts.tolist() == [cfg.n_heldout_objects // cfg.n_categories] * cfg.n_categories
    uneven = World.build(CompositionConfig(n_heldout_objects=10))
    assert sorted(torch.bincount(uneven.category_of[uneven.heldout], minlength=8).tolist()) == [1] * 6 + [2] * 2
    batch = composition_batch(dataclasses.replace(cfg, split="eval"), 4000, seed=0)
    for category in range(cfg.n_categories):
        constant = torch.full_like(batch.targets, vocabulary(cfg).ids[f"cat{category}"])
        assert score_composition(constant, batch) == pytest.approx(1 / cfg.n_categories, abs=0.02)


def test_the_shortcut_level_is_what_answering_from_a_random_binding_scores():
    from attnzoo.evals.composition import shortcut_accuracy

    cfg = CompositionConfig(split="eval")
    vocab, world = vocabulary(cfg), World.build(cfg)
    batch = composition_batch(cfg, 4000, seed=0)
    generator = torch.Generator().manual_seed(1)
    first_object, first_category = vocab.ids["obj0"], vocab.ids["cat0"]
    predictions = torch.zeros_like(batch.targets)
    for row, tokens in enumerate(batch.inputs.tolist()):
        episode = tokens[tokens.index(vocab.ids["<"]) : tokens.index(vocab.ids[">"])]
        objects = [t - first_object for t in episode if first_object <= t < first_object + cfg.n_objects]
        picked = objects[int(torch.randint(len(objects), (), generator=generator))]
        predictions[row, -1] = first_category + int(world.category_of[picked])
    assert score_composition(predictions, batch) == pytest.approx(shortcut_accuracy(cfg), abs=0.025)
