import itertools
import math

import pytest
import torch
from torch import nn

from attnzoo.config import ModelConfig
from attnzoo.evals import (
    DenoisingConfig,
    GraphConfig,
    RandomWalkConfig,
    bayes_optimal,
    clique_graph,
    denoising_batch,
    entropy_floor,
    evaluate_denoising,
    evaluate_graph,
    evaluate_random_walk,
    graph_batch,
    make_graph,
    random_walk_batch,
)
from attnzoo.evals.denoising import DenoisingBatch, naive_average, signal_mean
from attnzoo.evals.graph import Graph, GraphModel, graph_chance, graph_probe
from attnzoo.evals.random_walk import random_walks

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


def hand_batch(values, is_signal, direction, dim):
    values = torch.tensor(values, dtype=torch.float32)
    target = torch.nn.functional.one_hot(torch.tensor(direction), dim).float()
    return DenoisingBatch(values=values, is_signal=torch.tensor(is_signal), target=target)


def brute_force_posterior(values, cfg):
    """p(q | X) by summing the likelihood over every signal/noise assignment of the tokens: exponential in n."""
    n, dim = values.shape
    weights = torch.zeros(dim, dtype=torch.float64)
    normal = torch.distributions.Normal(0.0, cfg.noise_std)
    for q in range(dim):
        direction = torch.nn.functional.one_hot(torch.tensor(q), dim).double()
        for assignment in itertools.product((False, True), repeat=n):
            log_p = 0.0
            for x, signal in zip(values.double(), assignment, strict=True):
                mean = direction if signal else torch.zeros(dim, dtype=torch.float64)
                prior = cfg.signal_fraction if signal else 1 - cfg.signal_fraction
                log_p += math.log(prior) + normal.log_prob(x - mean).sum().item()
            weights[q] += math.exp(log_p)
    return weights / weights.sum()


def test_bayes_optimal_is_the_posterior_over_the_direction():
    cfg = DenoisingConfig(dim=3, n_tokens=4, signal_fraction=0.3, noise_std=0.8)
    batch = denoising_batch(cfg, 3, seed=0)
    posterior = bayes_optimal(batch, cfg)
    for row in range(3):
        expected = brute_force_posterior(batch.values[row], cfg)
        torch.testing.assert_close(posterior[row].double(), expected, rtol=1e-5, atol=1e-6)


def test_estimators_by_hand():
    # d = 2, σ = 1, α = 1/2. Tokens (2, 0) signal and (0, 0) noise, target e_0.
    batch = hand_batch([[[2.0, 0.0], [0.0, 0.0]]], [[True, False]], [0], 2)
    cfg = DenoisingConfig(dim=2, n_tokens=2, signal_fraction=0.5, noise_std=1.0)
    assert naive_average(batch).tolist() == [[1.0, 0.0]]
    assert signal_mean(batch).tolist() == [[2.0, 0.0]]
    # Coordinate 0: log(½ + ½e^{1.5}) + log(½ + ½e^{-0.5}); coordinate 1: 2·log(½ + ½e^{-0.5}).
    log_w0 = math.log(0.5 + 0.5 * math.exp(1.5)) + math.log(0.5 + 0.5 * math.exp(-0.5))
    log_w1 = 2 * math.log(0.5 + 0.5 * math.exp(-0.5))
    p0 = 1 / (1 + math.exp(log_w1 - log_w0))
    assert bayes_optimal(batch, cfg)[0].tolist() == pytest.approx([p0, 1 - p0])
    # Every token signal (α = 1): only the mean along each direction matters.
    certain = DenoisingConfig(dim=2, n_tokens=2, signal_fraction=1.0, noise_std=1.0)
    assert bayes_optimal(batch, certain)[0].tolist() == pytest.approx([1 / (1 + math.exp(-2)), 1 / (1 + math.exp(2))])


class NaiveAverage(nn.Module):
    def __init__(self):
        super().__init__()
        self.anchor = nn.Parameter(torch.zeros(()))

    def forward(self, features):
        return features[:, :-1, :-1].mean(dim=1) + self.anchor


def test_the_bayes_estimator_beats_the_others_and_the_model_is_scored_on_the_same_samples():
    cfg = DenoisingConfig()
    result = evaluate_denoising(NaiveAverage(), cfg, n_samples=4096)
    assert result["model"] == result["naive_average"]  # the features carry the token values
    assert result["bayes_optimal"] < min(result["naive_average"], result["signal_mean"], result["prior_mean"])
    assert result["prior_mean"] == pytest.approx(1 - 1 / cfg.dim)
    assert result["excess_mse"] == pytest.approx(result["model"] - result["bayes_optimal"])


def test_denoising_batch_carries_no_type_marker_and_is_deterministic():
    cfg = DenoisingConfig(dim=4, n_tokens=6, signal_fraction=0.25, noise_std=0.5)
    batch = denoising_batch(cfg, 4000, seed=0)
    features = batch.features
    assert features.shape == (4000, 7, 5)
    assert torch.equal(features[:, :-1, :-1], batch.values) and (features[:, :-1, -1] == 0).all()
    assert (features[:, -1] == torch.tensor([0, 0, 0, 0, 1.0])).all()  # the query token
    assert batch.is_signal.float().mean().item() == pytest.approx(0.25, abs=0.01)
    assert (batch.target.sum(dim=1) == 1).all() and batch.target.mean(dim=0).tolist() == pytest.approx(
        [0.25] * 4, abs=0.02
    )
    # Signal tokens are e_q plus noise of σ = 0.5; noise tokens are the noise alone.
    residual = batch.values - batch.is_signal[..., None] * batch.target[:, None]
    assert residual.std().item() == pytest.approx(0.5, rel=0.02)
    again, other = denoising_batch(cfg, 4000, seed=0), denoising_batch(cfg, 4000, seed=1)
    assert torch.equal(again.values, batch.values) and not torch.equal(other.values, batch.values)


def test_the_denoising_model_is_attention_only():
    from attnzoo.compare import run_task
    from attnzoo.evals import get_task

    task = get_task("denoising")
    cfg = DenoisingConfig(dim=3, n_tokens=5)
    model = task.new_model(ModelConfig(vocab_size=1, dim=16, n_layers=1, n_heads=2, position="none"), cfg)
    assert {name.split(".")[0] for name, _ in model.named_parameters()} == {"read_in", "attention", "read_out"}
    batch = task.make_batch(cfg, 4, 0)
    estimate, loss = model(batch.inputs, batch.targets)
    assert estimate.shape == (4, 3)
    torch.testing.assert_close(loss, ((estimate - batch.targets) ** 2).sum(dim=1).mean())
    run = run_task("denoising", "selective[query_temperature=false]+none", scale="micro", progress=False)
    assert run.final["excess_mse"] == pytest.approx(run.final["model"] - run.final["bayes_optimal"])
    assert run.variant == "selective[query_temperature=false]+none" and run.steps == 3


def test_clique_graph_degrees_symmetry_and_seed():
    cfg = GraphConfig(clique_sizes=(2, 3, 5))
    graph = clique_graph(cfg)
    assert sorted(graph.degrees) == [1, 1, 2, 2, 2, 4, 4, 4, 4, 4]
    transition = graph.transition
    assert torch.equal(transition > 0, (transition > 0).T)  # undirected
    assert (transition.diagonal() == 0).all()
    assert torch.allclose(transition.sum(dim=1), torch.ones(10, dtype=torch.float64))
    assert clique_graph(cfg) == graph and clique_graph(GraphConfig(clique_sizes=(2, 3, 5), graph_seed=1)) != graph


def test_graph_batches_sample_the_true_transitions():
    cfg = GraphConfig(clique_sizes=(2, 4))
    batch = graph_batch(cfg, 20000, seed=0)
    transition = clique_graph(cfg).transition
    counts = torch.zeros(6, 6, dtype=torch.float64)
    counts.index_put_(
        (batch.inputs[:, 0], batch.targets[:, 0]), torch.ones(20000, dtype=torch.float64), accumulate=True
    )
    empirical = counts / counts.sum(dim=1, keepdim=True)
    assert (empirical - transition).abs().max().item() < 0.03
    again, other = graph_batch(cfg, 50, seed=3), graph_batch(cfg, 50, seed=4)
    assert torch.equal(graph_batch(cfg, 50, seed=3).targets, again.targets)
    assert not torch.equal(other.inputs, again.inputs)


def graph_model(variant_attention, options=None):
    cfg = GraphConfig(clique_sizes=(2, 3, 5))
    model_cfg = ModelConfig(
        vocab_size=cfg.n_nodes,
        dim=8,
        n_layers=1,
        n_heads=1,
        position="none",
        attention=variant_attention,
        attention_options=options or {},
    )
    return cfg, GraphModel(model_cfg, cfg)


def test_the_graph_model_is_one_attention_map_and_its_errors_are_exact():
    cfg, model = graph_model("mha")
    log_transition = model.log_transition()
    assert log_transition.shape == (10, 10)
    torch.testing.assert_close(log_transition.exp().sum(dim=1), torch.ones(10))
    # A model that predicts the true transitions has no excess; the uniform one has the chance level.
    graph = clique_graph(cfg)
    model.log_transition = lambda: graph.transition.clamp(min=1e-300).log()
    assert evaluate_graph(model, cfg) == pytest.approx({"excess_loss": 0.0, "err_map": 0.0}, abs=1e-9)
    model.log_transition = lambda: torch.full((10, 10), -math.log(10), dtype=torch.float64)
    assert evaluate_graph(model, cfg)["excess_loss"] == pytest.approx(graph_chance(cfg))
    assert graph_chance(cfg) == pytest.approx(math.log(10) - (2 * math.log(1) + 3 * math.log(2) + 5 * math.log(4)) / 10)


def test_the_graph_probe_measures_how_spiky_the_rows_are_by_hand():
    """‖p‖₂/‖p‖₁, the largest weight and the entropy of each row, against the true map (a degree-d row is uniform
    over d neighbours: ‖p‖₂ = 1/√d, entropy log d) and the uniform one (1/√K, 1/K, log K)."""
    cfg, model = graph_model("mha")  # cliques of 2, 3 and 5: degrees 1 (2 rows), 2 (3) and 4 (5)
    graph = clique_graph(cfg)
    model.log_transition = lambda: graph.transition.clamp(min=1e-300).log()
    probe = graph_probe(model, cfg)
    assert probe["spikiness"] == pytest.approx((2 * 1 + 3 / math.sqrt(2) + 5 / 2) / 10)
    assert probe["spikiness/degree_2"] == pytest.approx(1 / math.sqrt(2))
    assert probe["max_attention"] == pytest.approx((2 * 1 + 3 / 2 + 5 / 4) / 10)
    assert probe["attention_entropy"] == pytest.approx((3 * math.log(2) + 5 * math.log(4)) / 10)
    model.log_transition = lambda: torch.full((10, 10), -math.log(10), dtype=torch.float64)
    uniform = graph_probe(model, cfg)
    assert uniform["spikiness"] == pytest.approx(1 / math.sqrt(10)) and uniform["max_attention"] == pytest.approx(0.1)
    assert uniform["attention_entropy"] == pytest.approx(math.log(10))
    assert uniform["spikiness"] < probe["spikiness"]


def test_the_graph_model_reads_the_query_temperature():
    _, vanilla = graph_model("mha")
    assert vanilla.inverse_temperatures() is None
    cfg, selective = graph_model("selective", {"value_temperature": False, "position_temperature": False})
    with torch.no_grad():
        selective.attention.q_temperature.weight.fill_(0.5)
    tau = selective.inverse_temperatures()
    assert tau.shape == (10,) and not torch.allclose(tau, torch.ones(10))
    x = selective.embed.weight
    logits = selective.attention.q_proj(x) @ selective.attention.k_proj(x).T / math.sqrt(8)
    torch.testing.assert_close(selective.log_transition(), torch.log_softmax(logits * tau[:, None], dim=-1))
    probe = graph_probe(selective, cfg)
    assert set(probe) == {"qk_operator_norm", "spikiness", "max_attention", "attention_entropy"} | {
        f"{name}/degree_{d}" for name in ("excess_loss", "spikiness", "inverse_temperature") for d in (1, 2, 4)
    }
    with pytest.raises(ValueError, match="n_heads"):
        GraphModel(ModelConfig(vocab_size=10, dim=8, n_layers=1, n_heads=2, position="none"), cfg)
    with pytest.raises(ValueError, match="attention"):
        GraphModel(ModelConfig(vocab_size=10, dim=8, n_layers=1, n_heads=1, position="none", attention="diff"), cfg)
    with pytest.raises(ValueError, match="position"):
        GraphModel(ModelConfig(vocab_size=10, dim=8, n_layers=1, n_heads=1, position="rope"), cfg)


def test_a_graph_run_learns_and_the_temperature_keeps_the_norm_smaller():
    from attnzoo.compare import run_task

    vanilla = run_task("graph", "mha+none", scale="claims", progress=False)
    selective = run_task("graph", "selective[value_temperature=false,position_temperature=false]+none", progress=False)
    chance = graph_chance(GraphConfig())
    assert vanilla.final["excess_loss"] < chance / 10 and selective.final["excess_loss"] < chance / 10
    assert selective.probe["qk_operator_norm"] < vanilla.probe["qk_operator_norm"]
