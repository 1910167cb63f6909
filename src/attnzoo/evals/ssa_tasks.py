"""The selective-attention (SSA) paper's synthetic tasks, as reconstructed in eval_protocols.md §5.2.

SSA (Zhang et al., NeurIPS 2024) probes query selectivity with next-token prediction on a graph whose nodes
need different sparsity, and value selectivity with a denoising task scored against naive averaging and the
Bayes-optimal estimator. Neither the paper's text nor its synthetic code was available (§5.1), so the setups
here are the notes' reconstructions [R], with these choices:

* Random walks (form B). The graph is directed and fixed by ``graph_seed``, so its transitions are learned
  in the weights. Node i has exactly ``degrees[i % len(degrees)]`` successors, one of them its successor on
  a random cycle through all nodes so that every node stays reachable, the others uniform among the rest
  (no self-loops). Walks start at a uniform node and step to a uniform successor. The exact floor is the
  cross-entropy of the true transitions: at step t it is E[H(P[x_t])] = Σ_i π_t(i)·log deg(i).
* Denoising. μ ~ N(0, I_d); of n context tokens, n_s ~ U{0..n} (at random places) are signal μ + σ·z, the
  rest noise σ_noise·z, and each token's type is part of its input. The estimate of μ is read at a final
  query token. Baselines and their risks are in closed form (per-coordinate MSE).
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


@dataclass(frozen=True)
class DenoisingConfig:
    dim: int = 8  # d
    n_tokens: int = 32  # n context tokens before the query
    signal_std: float = 1.0  # σ
    noise_std: float = 3.0  # σ_noise

    def __post_init__(self) -> None:
        for name in ("dim", "n_tokens"):
            require(getattr(self, name) >= 1, name, getattr(self, name), "must be >= 1")
        for name in ("signal_std", "noise_std"):
            require(getattr(self, name) > 0, name, getattr(self, name), "must be > 0")


@dataclass
class DenoisingBatch:
    values: Tensor  # (B, n, d) the context tokens' vectors u_i
    is_signal: Tensor  # (B, n) bool
    target: Tensor  # (B, d) μ

    @property
    def features(self) -> Tensor:
        """(B, n + 1, 3 + d) model input: one-hot type (signal, noise, query) and u, the query last with u = 0."""
        batch_size, _, dim = self.values.shape
        kind = F.one_hot((~self.is_signal).long(), 3).to(self.values.dtype)  # signal → 0, noise → 1
        query = torch.zeros(batch_size, 1, 3 + dim, dtype=self.values.dtype)
        query[..., 2] = 1
        return torch.cat((torch.cat((kind, self.values), dim=-1), query), dim=1)


def denoising_batch(cfg: DenoisingConfig, batch_size: int, seed: int | torch.Generator) -> DenoisingBatch:
    generator = as_generator(seed)
    mu = torch.randn(batch_size, cfg.dim, generator=generator)
    n_signal = torch.randint(0, cfg.n_tokens + 1, (batch_size, 1), generator=generator)
    # The n_signal lowest of a random ranking are the signal tokens: a uniform subset of that size.
    rank = torch.rand(batch_size, cfg.n_tokens, generator=generator).argsort(dim=1).argsort(dim=1)
    is_signal = rank < n_signal
    noise = torch.randn(batch_size, cfg.n_tokens, cfg.dim, generator=generator)
    values = torch.where(is_signal[..., None], mu[:, None, :] + cfg.signal_std * noise, cfg.noise_std * noise)
    return DenoisingBatch(values=values, is_signal=is_signal, target=mu)


def naive_average(batch: DenoisingBatch) -> Tensor:
    """The mean of all context tokens, signal and noise alike."""
    return batch.values.mean(dim=1)


def oracle_mean(batch: DenoisingBatch) -> Tensor:
    """The mean of the signal tokens (0 when there are none): perfect selection, but no shrinkage."""
    n_signal = batch.is_signal.sum(dim=1, keepdim=True)
    return _signal_sum(batch) / n_signal.clamp(min=1)


def bayes_optimal(batch: DenoisingBatch, cfg: DenoisingConfig) -> Tensor:
    """The posterior mean of μ given the signal tokens: Σ_signal u_i / (n_s + σ²), shrunk toward the prior 0."""
    n_signal = batch.is_signal.sum(dim=1, keepdim=True)
    return _signal_sum(batch) / (n_signal + cfg.signal_std**2)


def _signal_sum(batch: DenoisingBatch) -> Tensor:
    return (batch.values * batch.is_signal[..., None]).sum(dim=1)


def mse(estimate: Tensor, target: Tensor) -> float:
    """Squared error per coordinate, averaged over coordinates and samples."""
    return (estimate - target).pow(2).mean().item()


def denoising_task_batch(cfg: DenoisingConfig, batch_size: int, seed: int | torch.Generator) -> TaskBatch:
    """A training batch: the features as inputs, μ as the target."""
    batch = denoising_batch(cfg, batch_size, seed)
    return TaskBatch(inputs=batch.features, targets=batch.target)


class DenoisingModel(nn.Module):
    """A Transformer over the denoising features, answering μ from the query's final hidden state.

    The features (type one-hot and u) are projected to the model's width in place of token embeddings, and a
    linear read-out maps the query position's hidden state to the estimate (§5.2's "+ linear read-out").
    """

    def __init__(self, model_config, cfg: DenoisingConfig):
        from attnzoo.model import Transformer  # the model imports the mechanisms; a task module need not

        super().__init__()
        self.read_in = nn.Linear(3 + cfg.dim, model_config.dim)
        self.transformer = Transformer(model_config)
        self.read_out = nn.Linear(model_config.dim, cfg.dim)

    def forward(self, features: Tensor, target: Tensor | None = None) -> Tensor | tuple[Tensor, Tensor]:
        """(B, n + 1, 3 + d) features → the (B, d) estimate of μ; with ``target``, also the mean squared error."""
        estimate = self.read_out(self.transformer.encode(self.read_in(features))[:, -1])
        if target is None:
            return estimate
        return estimate, F.mse_loss(estimate.float(), target.float())


def denoising_risks(cfg: DenoisingConfig) -> dict[str, float]:
    """The expected per-coordinate MSE of each baseline, exactly, averaging over n_s ~ U{0..n}.

    Given n_s, with prior variance 1: Bayes' is the posterior variance σ²/(σ² + n_s); the oracle mean's is
    σ²/n_s, or 1 when it answers 0; the naive average's is the squared bias (1 - n_s/n)² of weighting μ by
    n_s/n plus the variance (n_s·σ² + (n - n_s)·σ_noise²)/n² of the averaged noise.
    """
    n, signal_var, noise_var = cfg.n_tokens, cfg.signal_std**2, cfg.noise_std**2
    risks = {"naive_average": 0.0, "oracle_mean": 0.0, "bayes_optimal": 0.0}
    for n_s in range(n + 1):
        risks["naive_average"] += (1 - n_s / n) ** 2 + (n_s * signal_var + (n - n_s) * noise_var) / n**2
        risks["oracle_mean"] += signal_var / n_s if n_s else 1.0
        risks["bayes_optimal"] += signal_var / (signal_var + n_s)
    return {name: risk / (n + 1) for name, risk in risks.items()}


def evaluate_denoising(
    model: nn.Module, cfg: DenoisingConfig, n_samples: int = 1024, seed: int = 0, batch_size: int = 256
) -> dict[str, float]:
    """MSE of ``model`` and of each baseline on the same samples; ``excess_mse`` is the model's above Bayes'.

    ``model`` maps a batch's ``features``, (B, n + 1, 3 + d), to its estimate of μ, (B, d).
    """
    batch = denoising_batch(cfg, n_samples, seed)
    features = batch.features.to(model_device(model))
    with evaluating(model):
        estimate = torch.cat([model(chunk).float().cpu() for chunk in features.split(batch_size)])
    risks = {
        "model": mse(estimate, batch.target),
        "naive_average": mse(naive_average(batch), batch.target),
        "oracle_mean": mse(oracle_mean(batch), batch.target),
        "bayes_optimal": mse(bayes_optimal(batch, cfg), batch.target),
    }
    return {**risks, "excess_mse": risks["model"] - risks["bayes_optimal"]}


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


# One block (attention and MLP) and a linear read-out, as §5.2(b) with its MLP; the context is a set, so the
# claim's variants use no positions.
_DENOISING_QUICK = TaskBudget(
    model={"dim": 32, "n_layers": 1, "n_heads": 2},
    steps=400,
    batch_size=64,
    lr=3e-3,
    warmup_steps=40,
    eval_interval=100,
    eval_samples=2048,
)
register_task(
    Task(
        name="denoising",
        config=DenoisingConfig,
        make_batch=denoising_task_batch,
        evaluate=evaluate_denoising,
        vocab_size=lambda cfg: 1,  # no tokens: DenoisingModel reads the features through its own projection
        build_model=DenoisingModel,
        measures="estimating μ from signal tokens hidden among noise tokens, scored by MSE above the Bayes-optimal "
        "estimator",
        paper="Selective attention (Zhang et al., 2024)",
        metric="excess_mse",
        # Answering the prior mean 0 costs 1 per coordinate.
        chance=lambda cfg: 1.0 - denoising_risks(cfg)["bayes_optimal"],
        solved=0.0,
        higher_is_better=False,
        budgets={
            "micro": TaskBudget(**TINY_LOOP),
            "claims": _DENOISING_QUICK,
            "standard": dataclasses.replace(_DENOISING_QUICK, steps=2000, eval_interval=250),
        },
    )
)
