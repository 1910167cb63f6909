import pytest
import torch

from attnzoo import ModelConfig, Transformer
from attnzoo.evals import IGNORE_INDEX, NeedlesConfig, attention_noise_probe, attention_shares, needles_batch
from attnzoo.evals.needles import needle_key_sets, score_needles, vocabulary

CFG = NeedlesConfig(context_len=96, n_needles=4, n_queries=2, n_digits=3, n_keys=8, n_noise_words=20)


def words(cfg, tokens):
    return vocabulary(cfg).decode(tokens).split()


def test_shapes_and_layout():
    batch = needles_batch(CFG, 5, seed=0)
    assert batch.inputs.shape == batch.targets.shape == (5, 96)
    assert batch.needle_spans.shape == (5, 4, 2) and batch.answer_positions.shape == (5, 2, 3)
    assert batch.inputs.max() < len(vocabulary(CFG))
    for row, spans in zip(batch.inputs, batch.needle_spans, strict=True):
        covered = torch.zeros(96, dtype=torch.int)
        for start, end in spans.tolist():
            needle = words(CFG, row[start:end])
            assert needle[:3] == ["the", "special", "magic"] and needle[4:7] == ["number", "is", ":"]
            assert needle[-1] == "." and len(needle) == 8 + 3
            covered[start:end] += 1
        assert covered.max() == 1  # needles never overlap
        hay = covered == 0
        hay[0] = False
        hay[batch.question_start :] = False
        assert all(w.startswith("w") for w in words(CFG, row[hay]))
        question = words(CFG, row[batch.question_start :])
        assert question[:7] == ["what", "are", "the", "special", "magic", "numbers", "for"]


def test_labels_are_the_digits_of_the_needles_asked_for():
    batch = needles_batch(CFG, 5, seed=0)
    for b in range(5):
        row, spans = batch.inputs[b], batch.needle_spans[b].tolist()
        by_city = {words(CFG, row[s:e])[3]: row[e - 4 : e - 1].tolist() for s, e in spans}
        assert len(by_city) == 4 and len({tuple(d) for d in by_city.values()}) == 4  # distinct keys and numbers
        question = words(CFG, row[batch.question_start :])
        asked = [question[7], question[9]]  # "... for <city> and <city> ?"
        assert question[8] == "and" and question[10] == "?"
        # Row 0 of the spans is the answer needle: the first city asked.
        assert words(CFG, row[spans[0][0] : spans[0][1]])[3] == asked[0]
        for r, city in enumerate(asked):
            assert batch.targets[b, batch.answer_positions[b, r]].tolist() == by_city[city]
        scored = batch.targets[b] != IGNORE_INDEX
        assert scored.sum() == 2 * 3 and scored[batch.answer_positions[b].flatten()].all()


@pytest.mark.parametrize("depth", [0.0, 0.5, 1.0])
def test_answer_needle_depth(depth):
    cfg = NeedlesConfig(context_len=96, n_needles=1, n_queries=1, n_digits=3, n_keys=4, n_noise_words=20, depth=depth)
    batch = needles_batch(cfg, 3, seed=0)
    # With one needle, the noise words before it are the requested share of the haystack.
    haystack = cfg.haystack_len
    assert batch.needle_spans[:, 0, 0].tolist() == [1 + round(depth * haystack)] * 3
    assert torch.allclose(batch.depth, torch.full((3,), round(depth * haystack) / haystack))
    question = words(cfg, batch.inputs[0, batch.question_start :])
    assert question[:7] == ["what", "is", "the", "special", "magic", "number", "for"] and question[8] == "?"


def test_determinism():
    a, b, c = (needles_batch(CFG, 3, seed=s) for s in (4, 4, 5))
    assert torch.equal(a.inputs, b.inputs) and torch.equal(a.targets, b.targets)
    assert torch.equal(a.needle_spans, b.needle_spans)
    assert not torch.equal(a.inputs, c.inputs)


def test_score_counts_each_queried_needle():
    batch = needles_batch(CFG, 2, seed=0)
    predictions = batch.targets.clamp(min=0).clone()
    assert score_needles(predictions, batch) == (1.0, 1.0)
    # Sample 0 misses one digit of its second answer: 3 of 4 needles exact, 11 of 12 digits right.
    position = batch.answer_positions[0, 1, 2]
    predictions[0, position] = (predictions[0, position] + 1) % 7
    assert score_needles(predictions, batch) == (0.75, pytest.approx(11 / 12))


def test_attention_shares_on_a_hand_made_map():
    # One layer, two heads, five tokens: sink | answer answer | noise | question (the query row).
    attention = torch.zeros(1, 2, 5, 5)
    attention[0, 0, 4] = torch.tensor([0.1, 0.2, 0.3, 0.15, 0.25])
    attention[0, 1, 4] = torch.tensor([0.0, 0.0, 1.0, 0.0, 0.0])
    attention[0, :, 3] = 1 / 4  # another row, which must not count
    sets = {
        "sink": torch.tensor([[1, 0, 0, 0, 0]]).bool(),
        "answer": torch.tensor([[0, 1, 1, 0, 0]]).bool(),
        "noise": torch.tensor([[0, 0, 0, 1, 0]]).bool(),
        "question": torch.tensor([[0, 0, 0, 0, 1]]).bool(),
    }
    rows = torch.tensor([[0, 0, 0, 0, 1]]).bool()
    shares = attention_shares([attention], rows, sets)
    assert shares.shares["answer"].tolist() == [[pytest.approx(0.5), pytest.approx(1.0)]]
    assert shares.mean() == pytest.approx({"sink": 0.05, "answer": 0.75, "noise": 0.075, "question": 0.125})
    assert shares.last_layer() == pytest.approx(shares.mean())


def test_attention_shares_of_a_signed_differential_map():
    # A1 - λ·A2 can be negative: raw mass keeps the sign, the positive part renormalises per row.
    attention = torch.tensor([0.5, -0.1, 0.4, -0.2, 0.2]).view(1, 1, 1, 5)
    sets = {"answer": torch.tensor([[0, 1, 1, 0, 0]]).bool(), "rest": torch.tensor([[1, 0, 0, 1, 1]]).bool()}
    rows = torch.ones(1, 1, dtype=torch.bool)
    raw = attention_shares([attention], rows, sets).mean()
    assert raw == pytest.approx({"answer": 0.3, "rest": 0.5})
    positive = attention_shares([attention], rows, sets, positive_part=True).mean()
    assert positive == pytest.approx({"answer": 0.4 / 1.1, "rest": 0.7 / 1.1})


def test_attention_shares_average_over_rows_and_layers():
    first, second = torch.zeros(2, 1, 3, 3), torch.zeros(2, 1, 3, 3)
    first[0, 0, 2, 0], first[1, 0, 1, 1] = 1.0, 1.0  # rows (0, 2) and (1, 1): one on key 0, one on key 1
    second[:, 0, :, 0] = 1.0
    sets = {"zero": torch.tensor([[1, 0, 0], [1, 0, 0]]).bool()}
    rows = torch.tensor([[0, 0, 1], [0, 1, 0]]).bool()
    shares = attention_shares([first, second], rows, sets)
    assert shares.per_layer() == {"zero": [0.5, 1.0]}
    assert shares.mean() == {"zero": 0.75} and shares.last_layer() == {"zero": 1.0}


def test_key_sets_partition_the_context_and_the_probe_runs_on_a_transformer():
    batch = needles_batch(CFG, 2, seed=0)
    sets = needle_key_sets(batch)
    assert torch.stack(list(sets.values())).sum(dim=0).eq(1).all()
    assert sets["sink"][:, 0].all() and sets["answer"].sum(dim=1).eq(8 + 3).all()
    assert sets["distractors"].sum(dim=1).eq(3 * (8 + 3)).all()

    cfg = ModelConfig(vocab_size=len(vocabulary(CFG)), dim=16, n_layers=2, n_heads=2, max_seq_len=96)
    model = Transformer(cfg).train()
    shares = attention_noise_probe(model, batch)
    assert model.training  # the caller's mode is restored
    assert set(shares.shares) == {"answer", "distractors", "sink", "question", "noise"}
    assert all(share.shape == (2, 2) for share in shares.shares.values())
    # Softmax rows add to one over a partition of the keys.
    assert torch.allclose(sum(shares.shares.values()), torch.ones(2, 2), atol=1e-5)


@pytest.mark.parametrize("queries", [1, 2, 4])
def test_the_shortcut_level_is_what_answering_with_a_needle_not_yet_answered_scores(queries):
    """The strategy a 2-layer MHA learned at R = N = 4 (task_calibration_notes.md): each answer copies a random
    needle among those the answer so far (teacher-forced: the true earlier answers) has not given, never reading
    the question. It scores elimination_shortcut's level."""
    from attnzoo.evals.needles import elimination_shortcut

    cfg = NeedlesConfig(context_len=96, n_needles=4, n_queries=queries, n_digits=2, n_keys=16)
    batch = needles_batch(cfg, 3000, seed=0)
    generator = torch.Generator().manual_seed(1)
    digits_at = 7  # "the special magic <city> number is :" precede a needle's digits
    predictions = torch.zeros_like(batch.inputs)
    for row in range(len(batch.inputs)):
        for r in range(queries):
            picked = r + int(torch.randint(cfg.n_needles - r, (), generator=generator))  # needle r is asked r-th
            start = int(batch.needle_spans[row, picked, 0]) + digits_at
            digits = batch.inputs[row, start : start + cfg.n_digits]
            predictions[row, batch.answer_positions[row, r]] = digits
    accuracy, _ = score_needles(predictions, batch)
    assert accuracy == pytest.approx(elimination_shortcut(cfg), abs=0.025)
    assert elimination_shortcut(cfg) == pytest.approx(sum(1 / (4 - r) for r in range(queries)) / queries)
