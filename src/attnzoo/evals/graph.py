"""Graph next-token prediction by one attention map (``graph``): the selective-attention (SSA) paper's probe of
query selectivity, as its review (``shared/seeds/002``) describes it.

SSA (Zhang et al., NeurIPS 2024) probes query selectivity with next-token prediction on a graph whose nodes need
different sparsity. The paper's text and synthetic code were not available (eval_protocols.md §5.1), so this
follows the review's form: a 1-layer attention over the embeddings E of all K tokens, whose attention matrix
softmax(τ(E) ⊙ E·W·Eᵀ) *is* the next-token transition matrix, trained on next tokens sampled from an undirected
graph's P*[i, j] = 1/deg(i) over i's neighbours. The graph is a union of cliques, so every node's degree is exactly
its clique's size − 1 and nodes fall into degree classes (the review's "nodes with the same number of neighbours
receive the same temperature"). Vanilla attention must make a degree-1 row spiky through ‖W‖ alone; a per-query
temperature τ(e_i) scales each row. The claim: fewer neighbours → a larger inverse temperature (lower
temperature) and lower error. :class:`Graph` is the random walks' directed graph (``random_walk``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnzoo.config import ModelConfig
from attnzoo.evals.base import TaskBatch, as_generator, evaluating
from attnzoo.evals.random_walk import Graph
from attnzoo.evals.single_layer import attention_layer
from attnzoo.evals.task import Task, TaskBudget, register_task
from attnzoo.validation import require

# Mechanisms whose map is one softmax of (temperature-scaled) q·kᵀ, which the graph model reads off directly.
GRAPH_MECHANISMS = ("mha", "selective")


@dataclass(frozen=True)
class GraphConfig:
    # A node in a clique of s nodes has s − 1 neighbours: here degrees 1, 2, 4 and 8, each class ≥ 4 nodes.
    clique_sizes: tuple[int, ...] = (2, 2, 3, 3, 5, 9)
    graph_seed: int = 0  # which token ids form which clique

    def __post_init__(self) -> None:
        require(
            len(self.clique_sizes) >= 2 and all(isinstance(s, int) and s >= 2 for s in self.clique_sizes),
            "clique_sizes",
            self.clique_sizes,
            "must list at least two cliques, each of >= 2 nodes (every node needs a neighbour)",
        )

    @property
    def n_nodes(self) -> int:
        return sum(self.clique_sizes)


def clique_graph(cfg: GraphConfig) -> Graph:
    """The undirected union of cliques of ``cfg.clique_sizes``, on token ids shuffled by ``cfg.graph_seed``."""
    ids = torch.randperm(cfg.n_nodes, generator=torch.Generator().manual_seed(cfg.graph_seed)).tolist()
    successors: list[tuple[int, ...]] = [()] * cfg.n_nodes
    start = 0
    for size in cfg.clique_sizes:
        members = ids[start : start + size]
        for node in members:
            successors[node] = tuple(sorted(set(members) - {node}))
        start += size
    return Graph(tuple(successors))


def graph_batch(cfg: GraphConfig, batch_size: int, seed: int | torch.Generator) -> TaskBatch:
    """Uniform current tokens (inputs) and their next tokens sampled from P* (targets), both (B, 1)."""
    generator = as_generator(seed)
    current = torch.randint(cfg.n_nodes, (batch_size, 1), generator=generator)
    following = torch.multinomial(clique_graph(cfg).transition[current[:, 0]], 1, generator=generator)
    return TaskBatch(inputs=current, targets=following)


class GraphModel(nn.Module):
    """Token embeddings E and one attention layer whose map over all K tokens is the transition matrix.

    Row i is softmax(τ_q(e_i)·(W_q e_i)ᵀ(W_k e_j)/√d) over every token j, itself included: the review's
    att(E, W) = S(τ(E) ⊙ E·W·Eᵀ), with τ ≡ 1 for vanilla attention. One head, so the row is one map.
    """

    def __init__(self, model_config: ModelConfig, cfg: GraphConfig):
        super().__init__()
        require(
            model_config.position == "none",
            "position",
            model_config.position,
            "must be 'none': the graph model's tokens are a set, so a variant for it is written '<mechanism>+none'",
        )
        require(
            model_config.attention in GRAPH_MECHANISMS,
            "attention",
            model_config.attention,
            f"the graph model reads the map as softmax(τ·q·kᵀ), which holds for {list(GRAPH_MECHANISMS)}",
        )
        require(model_config.n_heads == 1, "n_heads", model_config.n_heads, "must be 1: one map is one matrix")
        self.embed = nn.Embedding(cfg.n_nodes, model_config.dim)
        self.attention, _ = attention_layer(model_config)

    def inverse_temperatures(self) -> Tensor | None:
        """(K,) τ_q of each token's row, or None for vanilla attention."""
        if getattr(self.attention, "q_temperature", None) is None:
            return None
        x = self.embed.weight[None]
        return self.attention.temperatures(x, torch.arange(x.shape[1], device=x.device))["query"][0, 0]

    def log_transition(self) -> Tensor:
        """(K, K) log P̂: row i is token i's next-token distribution."""
        x = self.embed.weight[None]
        head_dim = self.attention.head_dim
        logits = self.attention.q_proj(x)[0] @ self.attention.k_proj(x)[0].T / math.sqrt(head_dim)
        tau = self.inverse_temperatures()
        if tau is not None:
            logits = logits * tau[:, None]
        return torch.log_softmax(logits.float(), dim=-1)

    def forward(self, current: Tensor, following: Tensor | None = None) -> Tensor | tuple[Tensor, Tensor]:
        """(B, 1) tokens → (B, 1, K) log-probabilities of the next; with ``following``, also their cross-entropy."""
        log_probs = self.log_transition()[current]
        if following is None:
            return log_probs
        return log_probs, F.nll_loss(log_probs.flatten(0, 1), following.flatten())


def graph_errors(log_transition: Tensor, graph: Graph) -> dict[str, Tensor]:
    """Per row i (K,): ``excess_loss`` KL(P*_i ‖ P̂_i), the cross-entropy above the row's floor log deg(i), and
    ``err_map`` ‖P̂_i − P*_i‖₁, the review's approximation error."""
    truth = graph.transition
    estimate = log_transition.double()
    kl = (torch.special.xlogy(truth, truth) - truth * estimate.masked_fill(truth == 0, 0)).sum(dim=1)
    return {"excess_loss": kl, "err_map": (estimate.exp() - truth).abs().sum(dim=1)}


def evaluate_graph(
    model: nn.Module, cfg: GraphConfig, n_samples: int = 0, seed: int = 0, batch_size: int = 0
) -> dict[str, float]:
    """Exact, from the whole transition matrix against P*, so no sample is drawn (the arguments that size and
    seed an evaluation set are accepted for the task interface and unused)."""
    with evaluating(model):
        errors = graph_errors(model.log_transition(), clique_graph(cfg))
    return {name: per_row.mean().item() for name, per_row in errors.items()}


def graph_probe(model: nn.Module, cfg: GraphConfig, n_samples: int = 0) -> dict[str, float]:
    """‖W_q W_kᵀ‖ (operator norm, the 1/√d scale included), which the review says the temperature keeps smaller;
    how spiky the map's rows are, which it says the temperature makes spikier, as means over the K rows:
    ``spikiness`` ‖p‖₂/‖p‖₁ (selective.spikiness's measure; 1 for a one-hot row, 1/√K for a uniform one),
    ``max_attention`` the largest weight and ``attention_entropy`` the entropy in nats; and by degree class, the
    excess loss, the spikiness and, for selective attention, the mean inverse temperature τ_q."""
    graph = clique_graph(cfg)
    degrees = torch.tensor(graph.degrees)
    with evaluating(model):
        log_transition = model.log_transition().double()
        errors = graph_errors(log_transition, graph)
        tau = model.inverse_temperatures()
        attention = model.attention
        bilinear = attention.q_proj.weight.T @ attention.k_proj.weight / math.sqrt(attention.head_dim)
        probe = {"qk_operator_norm": torch.linalg.matrix_norm(bilinear.double(), ord=2).item()}
    rows_p = log_transition.exp()
    spikiness = rows_p.norm(dim=1) / rows_p.sum(dim=1)
    probe["spikiness"] = spikiness.mean().item()
    probe["max_attention"] = rows_p.max(dim=1).values.mean().item()
    probe["attention_entropy"] = -torch.special.xlogy(rows_p, rows_p).sum(dim=1).mean().item()
    for degree in sorted(set(graph.degrees)):
        rows = degrees == degree
        probe[f"excess_loss/degree_{degree}"] = errors["excess_loss"][rows].mean().item()
        probe[f"spikiness/degree_{degree}"] = spikiness[rows].mean().item()
        if tau is not None:
            probe[f"inverse_temperature/degree_{degree}"] = tau[rows].mean().item()
    return probe


def graph_chance(cfg: GraphConfig) -> float:
    """The excess loss of the uniform prediction: the mean over rows of log K − log deg(i)."""
    degrees = torch.tensor(clique_graph(cfg).degrees, dtype=torch.float64)
    return (math.log(cfg.n_nodes) - degrees.log()).mean().item()


# The review's form: one attention layer, one head, no positions (the tokens are a set). Calibrated
# (benchmarks/results/task_calibration.md): width 8 < 24 tokens, so the map is low-rank and sparsity costs norm;
# about 1 s per run on one CPU thread.
_GRAPH_CLAIMS = TaskBudget(
    model={"dim": 8, "n_layers": 1, "n_heads": 1},
    steps=1000,
    batch_size=64,
    lr=1e-2,
    warmup_steps=50,
    eval_interval=250,
    eval_samples=1,  # the evaluation is exact
    probe_samples=1,
)
register_task(
    Task(
        name="graph",
        config=GraphConfig,
        make_batch=graph_batch,
        evaluate=evaluate_graph,
        vocab_size=lambda cfg: cfg.n_nodes,
        build_model=GraphModel,
        measures="next-token prediction on a graph of unequal degrees by one attention map, scored by KL from the "
        "true transitions (query selectivity: a sparser row needs a lower temperature)",
        paper="Selective attention (Zhang et al., 2024)",
        metric="excess_loss",
        chance=graph_chance,
        solved=0.0,
        higher_is_better=False,
        probe=graph_probe,
        probe_columns={"qk_operator_norm": "‖W_q W_kᵀ‖", "excess_loss/degree_1": "excess loss, degree 1"},
        budgets={
            # Only the claims scale: presets that run every task run every variant, and this model is
            # vanilla or selective attention alone (a run takes a second, so tests use this budget too).
            "claims": _GRAPH_CLAIMS,
        },
    )
)
