import math

import pytest
import torch
from torch import nn

from attnzoo.config import ModelConfig
from attnzoo.evals import (
    DenoisingConfig,
    RandomWalkConfig,
    denoising_batch,
    denoising_risks,
    entropy_floor,
    evaluate_denoising,
    evaluate_random_walk,
    make_graph,
    random_walk_batch,
)
from attnzoo.evals.ssa_tasks import DenoisingBatch, Graph, bayes_optimal, naive_average, oracle_mean, random_walks

CFG = RandomWalkConfig(n_nodes=8, degrees=(1, 2, 4), walk_len=12)


class TrueTransitions(nn.Module):
    """Predicts the graph's own next-node distribution: the best any model can do."""

    def __init__(self, graph):
        super().__init__()
        self.register_buffer("log_transition", graph.transition.float().clamp(min=1e-30).log())
        self.anchor = nn.Parameter(torch.zeros(()))

    def forward(self, idx):
        return self.log_transition[idx] + self.anchor


def test_graph_has_the_requested_degrees_and_every_node_is_reachable():
    graph = make_graph(CFG)
    assert graph.degrees == [(1, 2, 4)[i % 3] for i in range(8)]
    assert all(i not in successors for i, successors in enumerate(graph.successors))
    reached, frontier = {0}, [0]
    while frontier:
        new = {j for i in frontier for j in graph.successors[i]} - reached
        reached |= new
        frontier = list(new)
    assert reached == set(range(8))
    assert torch.allclose(graph.transition.sum(dim=1), torch.ones(8, dtype=torch.float64))


def test_graph_is_fixed_by_its_seed():
    assert make_graph(CFG) == make_graph(CFG)
    assert make_graph(CFG) != make_graph(RandomWalkConfig(n_nodes=8, degrees=(1, 2, 4), walk_len=12, graph_seed=1))


def test_walks_follow_edges_and_targets_are_the_next_node():
    graph = make_graph(CFG)
    batch = random_walk_batch(CFG, 6, seed=0)
    assert batch.inputs.shape == batch.targets.shape == (6, 12)
    assert torch.equal(batch.inputs[:, 1:], batch.targets[:, :-1])  # every step is scored
    for row_in, row_out in zip(batch.inputs.tolist(), batch.targets.tolist(), strict=True):
        assert all(b in graph.successors[a] for a, b in zip(row_in, row_out, strict=True))


def test_determinism():
    a, b, c = (random_walk_batch(CFG, 6, seed=s) for s in (0, 0, 1))
    assert torch.equal(a.inputs, b.inputs) and torch.equal(a.targets, b.targets)
    assert not torch.equal(a.inputs, c.inputs)


def test_entropy_floor_on_a_two_node_graph_by_hand():
    # Node 0 always steps to 1; node 1 steps to 0 or stays, so only node 1 costs ln 2.
    # Start (1/2, 1/2): floor ln2/2. Then P(x=0) = 1/4: 3/4·ln 2. Then P(x=0) = 3/8: 5/8·ln 2.
    graph = Graph(((1,), (0, 1)))
    floor = entropy_floor(graph, 3)
    assert floor.tolist() == pytest.approx([math.log(2) / 2, 3 / 4 * math.log(2), 5 / 8 * math.log(2)])


def test_true_transitions_reach_the_floor():
    cfg = RandomWalkConfig(n_nodes=8, degrees=(1, 2, 4, 7), walk_len=16)
    result = evaluate_random_walk(TrueTransitions(make_graph(cfg)), cfg, n_samples=2048)
    # A Monte Carlo estimate of the floor: 32k predictions, so within a few hundredths.
    assert result["excess_loss"] == pytest.approx(0.0, abs=0.03)
    expected = sum(math.log(d) for d in (1, 2, 4, 7)) / 4  # uniform start over degrees 1, 2, 4, 7 in turn
    assert entropy_floor(make_graph(cfg), 1).item() == pytest.approx(expected)


def test_the_floor_starts_at_the_mean_log_degree_and_stays_between_its_extremes():
    floor = entropy_floor(make_graph(CFG), 30)
    assert floor[0].item() == pytest.approx(sum(math.log((1, 2, 4)[i % 3]) for i in range(8)) / 8)
    assert (floor >= 0).all() and (floor <= math.log(4)).all()


def test_walk_distribution_matches_the_transitions():
    graph = Graph(((1,), (0, 1)))
    walks = random_walks(graph, 4000, 1, seed=0)
    from_one = walks[walks[:, 0] == 1, 1]
    assert (walks[walks[:, 0] == 0, 1] == 1).all()
    assert abs(from_one.float().mean().item() - 0.5) < 0.05


def hand_batch(values, is_signal):
    values = torch.tensor(values, dtype=torch.float32)
    return DenoisingBatch(values=values, is_signal=torch.tensor(is_signal), target=torch.zeros(values.shape[0], 1))


def test_baseline_estimates_by_hand():
    # One signal token at 2 and one noise token at 4 (d = 1), σ = 1: the naive mean is 3, the signal mean 2,
    # and Bayes shrinks the single observation halfway to the prior mean: 2 / (1 + 1) = 1.
    batch = hand_batch([[[2.0], [4.0]], [[5.0], [-1.0]]], [[True, False], [False, False]])
    cfg = DenoisingConfig(dim=1, n_tokens=2, signal_std=1.0)
    assert naive_average(batch).flatten().tolist() == [3.0, 2.0]
    assert oracle_mean(batch).flatten().tolist() == [2.0, 0.0]  # no signal: the prior mean
    assert bayes_optimal(batch, cfg).flatten().tolist() == [1.0, 0.0]
    # With σ = 2 the prior weighs as much as four observations: 2 / (1 + 4).
    assert bayes_optimal(batch, DenoisingConfig(dim=1, n_tokens=2, signal_std=2.0))[0].item() == pytest.approx(0.4)


def test_closed_form_risks_by_hand():
    # n = 1, σ = 1, σ_noise = 3; n_s is 0 or 1 with probability 1/2 each.
    # Bayes: (1 + 1/2) / 2. Signal mean: (1 + 1) / 2. Naive: (1 + 9 + 0 + 1) / 2.
    risks = denoising_risks(DenoisingConfig(dim=1, n_tokens=1, signal_std=1.0, noise_std=3.0))
    assert risks == pytest.approx({"bayes_optimal": 0.75, "oracle_mean": 1.0, "naive_average": 5.5})


class NaiveAverage(nn.Module):
    def __init__(self):
        super().__init__()
        self.anchor = nn.Parameter(torch.zeros(()))

    def forward(self, features):
        return features[:, :-1, 3:].mean(dim=1) + self.anchor


def test_empirical_mse_matches_the_closed_form_risks():
    cfg = DenoisingConfig(dim=4, n_tokens=8)
    result = evaluate_denoising(NaiveAverage(), cfg, n_samples=20000)
    risks = denoising_risks(cfg)
    for name, risk in risks.items():
        assert result[name] == pytest.approx(risk, rel=0.05)
    assert result["model"] == result["naive_average"]  # the features carry the same token values
    assert risks["bayes_optimal"] < risks["oracle_mean"] < risks["naive_average"]


def test_denoising_batch_layout_and_determinism():
    cfg = DenoisingConfig(dim=3, n_tokens=5)
    batch = denoising_batch(cfg, 400, seed=0)
    assert batch.values.shape == (400, 5, 3) and batch.is_signal.shape == (400, 5) and batch.target.shape == (400, 3)
    features = batch.features
    assert features.shape == (400, 6, 6)
    assert torch.equal(features[:, :-1, 0].bool(), batch.is_signal) and torch.equal(features[:, :-1, 3:], batch.values)
    assert (features[:, -1] == torch.tensor([0, 0, 1, 0, 0, 0.0])).all()  # the query token
    assert set(batch.is_signal.sum(dim=1).tolist()) == set(range(6))  # n_s takes every value 0..n
    # Signal tokens scatter around μ with σ = 1; noise tokens around 0 with σ_noise = 3.
    signal_error = (batch.values - batch.target[:, None])[batch.is_signal]
    assert signal_error.std().item() == pytest.approx(1.0, rel=0.1)
    assert batch.values[~batch.is_signal].std().item() == pytest.approx(3.0, rel=0.1)
    again, other = denoising_batch(cfg, 400, seed=0), denoising_batch(cfg, 400, seed=1)
    assert torch.equal(again.values, batch.values) and torch.equal(again.is_signal, batch.is_signal)
    assert not torch.equal(other.values, batch.values)


def test_the_denoising_model_reads_features_and_trains_on_the_squared_error():
    from attnzoo.compare import run_task
    from attnzoo.evals import get_task

    task = get_task("denoising")
    cfg = DenoisingConfig(dim=3, n_tokens=5)
    model = task.new_model(ModelConfig(vocab_size=1, dim=16, n_layers=1, n_heads=2, position="none"), cfg)
    batch = task.make_batch(cfg, 4, 0)
    estimate, loss = model(batch.inputs, batch.targets)
    assert estimate.shape == (4, 3)
    torch.testing.assert_close(loss, ((estimate - batch.targets) ** 2).mean())
    run = run_task("denoising", "selective[query_temperature=false]+none", scale="micro", progress=False)
    assert run.final["excess_mse"] == pytest.approx(run.final["model"] - run.final["bayes_optimal"])
    assert run.variant == "selective[query_temperature=false]+none" and run.steps == 3
