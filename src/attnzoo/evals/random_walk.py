"""Random walks over a fixed directed graph of unequal out-degrees (``random_walk``): the selective-attention
(SSA) paper's graph task in the end-to-end form of eval_protocols.md §5.2 (form B).

SSA (Zhang et al., NeurIPS 2024) probes query selectivity with next-token prediction on a graph whose nodes need
different sparsity; ``graph`` is its review's form (``shared/seeds/002``), read off one attention map, and this is
the form a whole language model trains on. The graph is directed and fixed by ``graph_seed``, so its transitions
are learned in the weights. Node i has exactly ``degrees[i % len(degrees)]`` successors, one of them its successor
on a random cycle through all nodes so that every node stays reachable, the others uniform among the rest (no
self-loops). Walks start at a uniform node and step to a uniform successor. The exact floor is the cross-entropy
of the true transitions: at step t it is E[H(P[x_t])] = Σ_i π_t(i)·log deg(i). This end-to-end form can be solved
from bigrams without attention.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from attnzoo.evals.base import TINY_LOOP, TaskBatch, as_generator, summed_loss
from attnzoo.evals.task import Task, TaskBudget, register_task
from attnzoo.validation import require


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
