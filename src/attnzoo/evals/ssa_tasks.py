"""The selective-attention (SSA) paper's synthetic tasks, as its review (``shared/seeds/002``) describes them.

SSA (Zhang et al., NeurIPS 2024) probes query selectivity with next-token prediction on a graph whose nodes
need different sparsity, and value selectivity with a denoising task scored against naive averaging and the
Bayes-optimal estimator. The paper's text and synthetic code were not available (eval_protocols.md §5.1), so
these follow the review's description, with the choices below.

* Graph next-token (``graph``, query selectivity). The review's form: a 1-layer attention over the embeddings
  E of all K tokens, whose attention matrix softmax(τ(E) ⊙ E·W·Eᵀ) *is* the next-token transition matrix,
  trained on next tokens sampled from an undirected graph's P*[i, j] = 1/deg(i) over i's neighbours. The graph
  is a union of cliques, so every node's degree is exactly its clique's size − 1 and nodes fall into degree
  classes (the review's "nodes with the same number of neighbours receive the same temperature"). Vanilla
  attention must make a degree-1 row spiky through ‖W‖ alone; a per-query temperature τ(e_i) scales each row.
  The claim: fewer neighbours → a larger inverse temperature (lower temperature) and lower error.
* Denoising (``denoising``, value selectivity). A direction q ~ U{1..d} per sequence; each of n context tokens
  is, with probability α, a signal token e_q + σ·z and otherwise a noise token σ·z (z ~ N(0, I_d)). Nothing
  marks a token's type, and since q is uniform the signal tokens point everywhere, so no linear function of a
  token tells signal from noise: the review's reason a nonlinear weighting (the value temperature) is needed.
  The model is attention-only (a read-in, one attention layer, a read-out at a final query token: no MLP that
  could do the selection instead), and its estimate of e_q is scored by squared error against naive averaging,
  the mean of the true signal tokens, and the Bayes-optimal posterior mean, which is exact in closed form.
* Random walks (``random_walk``, eval_protocols.md §5.2 form B). The graph is directed and fixed by
  ``graph_seed``, so its transitions are learned in the weights. Node i has exactly ``degrees[i % len(degrees)]``
  successors, one of them its successor on a random cycle through all nodes so that every node stays reachable,
  the others uniform among the rest (no self-loops). Walks start at a uniform node and step to a uniform
  successor. The exact floor is the cross-entropy of the true transitions: at step t it is
  E[H(P[x_t])] = Σ_i π_t(i)·log deg(i). This end-to-end form can be solved from bigrams without attention.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnzoo.evals.base import TINY_LOOP, TaskBatch, as_generator, evaluating, model_device, summed_loss
from attnzoo.evals.task import Task, TaskBudget, register_task
from attnzoo.validation import require

# Mechanisms whose map is one softmax of (temperature-scaled) q·kᵀ, which the graph model reads off directly.
GRAPH_MECHANISMS = ("mha", "selective")


@dataclass(frozen=True)
class RandomWalkConfig:
    n_nodes: int = 16
    degrees: tuple[int, ...] = (1, 2, 4, 8)  # out-degrees, given to the nodes in turn
    walk_len: int = 64  # tokens the model reads
    graph_seed: int = 0

    def __post_init__(self) -> None:
        require(self.n_nodes >= 2, "n_nodes", self.n_nodes, "must be >= 2")
        require(
            len(self.degrees) > 0 and all(1 <= d < self.n_nodes for d in self.degrees),
            "degrees",
            self.degrees,
            f"must be a non-empty tuple of degrees in [1, n_nodes - 1 = {self.n_nodes - 1}]",
        )
        require(self.walk_len >= 1, "walk_len", self.walk_len, "must be >= 1")


@dataclass(frozen=True)
class Graph:
    successors: tuple[tuple[int, ...], ...]  # node i steps to one of successors[i], uniformly

    @property
    def transition(self) -> Tensor:
        """(n, n) row-stochastic float64 matrix P[i, j] = 1/deg(i) for each successor j of i."""
        n = len(self.successors)
        matrix = torch.zeros(n, n, dtype=torch.float64)
        for i, successors in enumerate(self.successors):
            matrix[i, list(successors)] = 1 / len(successors)
        return matrix

    @property
    def degrees(self) -> list[int]:
        return [len(successors) for successors in self.successors]


def make_graph(cfg: RandomWalkConfig) -> Graph:
    generator = torch.Generator().manual_seed(cfg.graph_seed)
    cycle = torch.randperm(cfg.n_nodes, generator=generator).tolist()
    successors = []
    for node in range(cfg.n_nodes):
        on_cycle = cycle[(cycle.index(node) + 1) % cfg.n_nodes]
        others = [j for j in range(cfg.n_nodes) if j not in (node, on_cycle)]
        degree = cfg.degrees[node % len(cfg.degrees)]
        picked = torch.randperm(len(others), generator=generator)[: degree - 1].tolist()
        successors.append(tuple(sorted([on_cycle, *(others[k] for k in picked)])))
    return Graph(tuple(successors))


def vocab_size(cfg: RandomWalkConfig) -> int:
    return cfg.n_nodes


def random_walks(graph: Graph, batch_size: int, walk_len: int, seed: int | torch.Generator) -> Tensor:
    """(batch_size, walk_len + 1) node ids: a uniform start, then uniform steps to a successor."""
    generator = as_generator(seed)
    transition = graph.transition
    nodes = [torch.randint(len(graph.successors), (batch_size,), generator=generator)]
    for _ in range(walk_len):
        nodes.append(torch.multinomial(transition[nodes[-1]], 1, generator=generator).squeeze(1))
    return torch.stack(nodes, dim=1)


def random_walk_batch(cfg: RandomWalkConfig, batch_size: int, seed: int | torch.Generator) -> TaskBatch:
    """Next-node prediction at every step of a walk."""
    walks = random_walks(make_graph(cfg), batch_size, cfg.walk_len, seed)
    return TaskBatch(inputs=walks[:, :-1], targets=walks[:, 1:])


def entropy_floor(graph: Graph, walk_len: int) -> Tensor:
    """(walk_len,) the lowest expected cross-entropy, in nats, of the prediction at each step.

    The walk is Markov, so nothing but the current node helps: a perfect model predicts P[x_t] and pays
    its entropy. x_t is distributed as π_t = π_0·P^t with π_0 uniform.
    """
    transition = graph.transition
    step_entropy = -torch.special.xlogy(transition, transition).sum(dim=1)  # log deg(i) for node i
    occupancy = torch.full((len(graph.successors),), 1 / len(graph.successors), dtype=torch.float64)
    floor = []
    for _ in range(walk_len):
        floor.append(occupancy @ step_entropy)
        occupancy = occupancy @ transition
    return torch.stack(floor)


def evaluate_random_walk(
    model: nn.Module, cfg: RandomWalkConfig, n_samples: int = 256, seed: int = 0, batch_size: int = 64
) -> dict[str, float]:
    """Cross-entropy against the exact floor; ``excess_loss`` is what the model has yet to learn."""
    batch = random_walk_batch(cfg, n_samples, seed)
    total, count = summed_loss(model, batch.inputs, batch.targets, batch_size)
    floor = entropy_floor(make_graph(cfg), cfg.walk_len).mean().item()
    return {"loss": total / count, "entropy_floor": floor, "excess_loss": total / count - floor}


def _attention_context(position_encoding, seq_len: int, device: torch.device, causal: bool):
    """The context one attention layer needs for a fresh sequence of ``seq_len`` inputs."""
    from attnzoo.attention.base import AttentionContext
    from attnzoo.precision import compute_dtype

    positions = torch.arange(seq_len, device=device)
    dtype = compute_dtype(torch.get_default_dtype())
    return AttentionContext(
        positions=positions,
        start=0,
        position=position_encoding,
        position_state=position_encoding.prepare(positions, seq_len, dtype=dtype),
        causal=causal,
        dtype=dtype,
    )


def _attention_layer(model_config) -> tuple[nn.Module, nn.Module]:
    """One attention layer of the variant's mechanism, and its positional encoding."""
    from attnzoo.attention.base import ATTENTION
    from attnzoo.positions import POSITIONS

    attention = ATTENTION.get(model_config.attention)
    position = POSITIONS.get(model_config.position)(model_config, attention.qk_head_dim(model_config))
    return attention(model_config, 0), position


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

    def __init__(self, model_config, cfg: GraphConfig):
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
        self.attention, _ = _attention_layer(model_config)

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


@dataclass(frozen=True)
class DenoisingConfig:
    dim: int = 8  # d: the target is one of the d unit vectors e_q
    n_tokens: int = 32  # n context tokens before the query
    signal_fraction: float = 0.25  # α: each context token is signal with this probability
    noise_std: float = 0.5  # σ: the noise every token carries

    def __post_init__(self) -> None:
        for name in ("dim", "n_tokens"):
            require(getattr(self, name) >= 1, name, getattr(self, name), "must be >= 1")
        require(0 < self.signal_fraction <= 1, "signal_fraction", self.signal_fraction, "must be in (0, 1]")
        require(self.noise_std > 0, "noise_std", self.noise_std, "must be > 0")


@dataclass
class DenoisingBatch:
    values: Tensor  # (B, n, d) the context tokens x_i
    is_signal: Tensor  # (B, n) bool: the ground truth, which the model never sees
    target: Tensor  # (B, d) e_q

    @property
    def features(self) -> Tensor:
        """(B, n + 1, d + 1) model input: each token's x_i and a 0 flag, then the query token (0, …, 0, 1) last.
        The flag marks only where the answer is read; it says nothing about signal or noise."""
        batch_size, n_tokens, dim = self.values.shape
        context = torch.cat((self.values, self.values.new_zeros(batch_size, n_tokens, 1)), dim=-1)
        query = self.values.new_zeros(batch_size, 1, dim + 1)
        query[..., -1] = 1
        return torch.cat((context, query), dim=1)


def denoising_batch(cfg: DenoisingConfig, batch_size: int, seed: int | torch.Generator) -> DenoisingBatch:
    generator = as_generator(seed)
    direction = torch.randint(cfg.dim, (batch_size,), generator=generator)
    target = F.one_hot(direction, cfg.dim).float()
    is_signal = torch.rand(batch_size, cfg.n_tokens, generator=generator) < cfg.signal_fraction
    noise = cfg.noise_std * torch.randn(batch_size, cfg.n_tokens, cfg.dim, generator=generator)
    values = noise + is_signal[..., None] * target[:, None, :]
    return DenoisingBatch(values=values, is_signal=is_signal, target=target)


def naive_average(batch: DenoisingBatch) -> Tensor:
    """The mean of all context tokens, signal and noise alike."""
    return batch.values.mean(dim=1)


def signal_mean(batch: DenoisingBatch) -> Tensor:
    """The mean of the true signal tokens (0 when there are none): the ground-truth set given, no prior used."""
    n_signal = batch.is_signal.sum(dim=1, keepdim=True)
    return (batch.values * batch.is_signal[..., None]).sum(dim=1) / n_signal.clamp(min=1)


def bayes_optimal(batch: DenoisingBatch, cfg: DenoisingConfig) -> Tensor:
    """The posterior mean of e_q given the tokens alone, which is the posterior over q itself.

    Each token is e_q + σz with probability α, else σz; dividing both likelihoods by the q-free factor
    exp(−‖x‖²/2σ²) leaves p(x_i | q) ∝ 1 − α + α·exp((x_iq − ½)/σ²), so
    log p(q | X) = Σ_i log(1 − α + α·exp((x_iq − ½)/σ²)) + const under the uniform prior on q.
    """
    alpha, variance = cfg.signal_fraction, cfg.noise_std**2
    evidence = torch.logaddexp(
        torch.tensor(math.log1p(-alpha) if alpha < 1 else -math.inf, dtype=torch.float64),
        math.log(alpha) + (batch.values.double() - 0.5) / variance,
    )
    return torch.softmax(evidence.sum(dim=1), dim=-1).to(batch.values.dtype)


def squared_error(estimate: Tensor, target: Tensor) -> float:
    """‖estimate − target‖², summed over coordinates, averaged over samples."""
    return (estimate - target).pow(2).sum(dim=-1).mean().item()


def prior_mean_risk(cfg: DenoisingConfig) -> float:
    """The risk of answering the prior mean (1/d, …, 1/d) without looking: 1 − 1/d."""
    return 1 - 1 / cfg.dim


def denoising_task_batch(cfg: DenoisingConfig, batch_size: int, seed: int | torch.Generator) -> TaskBatch:
    """A training batch: the features as inputs, e_q as the target."""
    batch = denoising_batch(cfg, batch_size, seed)
    return TaskBatch(inputs=batch.features, targets=batch.target)


class DenoisingModel(nn.Module):
    """Attention only: a linear read-in of each token, one attention layer, a linear read-out at the query.

    No MLP and no norm, so nothing but the attention (vanilla, or with a value temperature) can weigh the
    tokens; causal attention lets the final query token see every context token. The context is a set, so the
    claim's variants use no positions ('+none'); any other scheme applies as in the language model.
    """

    def __init__(self, model_config, cfg: DenoisingConfig):
        super().__init__()
        self.model_config = model_config
        self.read_in = nn.Linear(cfg.dim + 1, model_config.dim)
        self.attention, self.position = _attention_layer(model_config)
        self.read_out = nn.Linear(model_config.dim, cfg.dim)

    def forward(self, features: Tensor, target: Tensor | None = None) -> Tensor | tuple[Tensor, Tensor]:
        """(B, n + 1, d + 1) features → the (B, d) estimate of e_q; with ``target``, also the squared error."""
        x = self.read_in(features)
        ctx = _attention_context(self.position, x.shape[1], x.device, causal=True)
        position_embedding = self.position.embed(ctx.positions)
        if position_embedding is not None:
            x = x + position_embedding.to(x.dtype)
        estimate = self.read_out(self.attention(x, ctx)[:, -1])
        if target is None:
            return estimate
        return estimate, (estimate.float() - target.float()).pow(2).sum(dim=-1).mean()


def evaluate_denoising(
    model: nn.Module, cfg: DenoisingConfig, n_samples: int = 4096, seed: int = 0, batch_size: int = 1024
) -> dict[str, float]:
    """Squared error of ``model`` and of each estimator on the same samples; ``excess_mse`` is the model's above
    the Bayes-optimal estimator's."""
    batch = denoising_batch(cfg, n_samples, seed)
    features = batch.features.to(model_device(model))
    with evaluating(model):
        estimate = torch.cat([model(chunk).float().cpu() for chunk in features.split(batch_size)])
    risks = {
        "model": squared_error(estimate, batch.target),
        "naive_average": squared_error(naive_average(batch), batch.target),
        "signal_mean": squared_error(signal_mean(batch), batch.target),
        "bayes_optimal": squared_error(bayes_optimal(batch, cfg), batch.target),
        "prior_mean": prior_mean_risk(cfg),
    }
    return {**risks, "excess_mse": risks["model"] - risks["bayes_optimal"]}


def denoising_chance(cfg: DenoisingConfig) -> float:
    """The excess of the prior mean over the Bayes-optimal risk, the latter estimated on 16,384 fixed samples."""
    batch = denoising_batch(cfg, 16384, seed=0)
    return prior_mean_risk(cfg) - squared_error(bayes_optimal(batch, cfg), batch.target)


# One layer, as the SSA reconstruction (§5.2): the task needs only the current node, so it is cheap.
_QUICK = TaskBudget(
    options={"walk_len": 32},
    model={"dim": 32, "n_layers": 1, "n_heads": 2},
    steps=150,
    batch_size=32,
    lr=3e-3,
    warmup_steps=15,
    eval_interval=50,
    eval_samples=256,
)
_STANDARD = dataclasses.replace(_QUICK, options={}, steps=1000, eval_interval=100, eval_samples=512)
register_task(
    Task(
        name="random_walk",
        config=RandomWalkConfig,
        make_batch=random_walk_batch,
        evaluate=evaluate_random_walk,
        vocab_size=vocab_size,
        measures="next-node prediction on random walks over nodes of unequal degree, scored above the entropy floor",
        paper="Selective attention (Zhang et al., 2024)",
        metric="excess_loss",
        chance=lambda cfg: math.log(cfg.n_nodes) - entropy_floor(make_graph(cfg), cfg.walk_len).mean().item(),
        solved=0.0,
        higher_is_better=False,
        budgets={
            "micro": TaskBudget(options={"n_nodes": 8, "degrees": (1, 2, 4), "walk_len": 16}, **TINY_LOOP),
            "quick": _QUICK,
            "standard": _STANDARD,
            "full": _STANDARD,
        },
    )
)


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


# Attention only (a read-in, one attention layer, a read-out), as the review's model; no positions. Calibrated
# (benchmarks/results/task_calibration.md): vanilla attention flattens by 3,000 steps, 15-30 s per run.
_DENOISING_CLAIMS = TaskBudget(
    model={"dim": 32, "n_layers": 1, "n_heads": 2},
    steps=3000,
    batch_size=64,
    lr=1e-2,
    warmup_steps=100,
    eval_interval=500,
    eval_samples=4096,
)
register_task(
    Task(
        name="denoising",
        config=DenoisingConfig,
        make_batch=denoising_task_batch,
        evaluate=evaluate_denoising,
        vocab_size=lambda cfg: 1,  # no tokens: DenoisingModel reads the features through its own projection
        build_model=DenoisingModel,
        measures="recovering a direction from unmarked signal tokens among noise tokens with attention alone, scored "
        "by squared error above the Bayes-optimal estimator",
        paper="Selective attention (Zhang et al., 2024)",
        metric="excess_mse",
        chance=denoising_chance,
        solved=0.0,
        higher_is_better=False,
        budgets={
            "micro": TaskBudget(options={"dim": 3, "n_tokens": 5}, **TINY_LOOP),
            "claims": _DENOISING_CLAIMS,
            "standard": dataclasses.replace(_DENOISING_CLAIMS, steps=10000, eval_interval=1000),
        },
    )
)
