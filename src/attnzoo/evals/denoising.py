"""Denoising with attention alone (``denoising``): the selective-attention (SSA) paper's probe of value
selectivity, as its review (``shared/seeds/002``) describes it.

SSA (Zhang et al., NeurIPS 2024) probes value selectivity with a denoising task scored against naive averaging and
the Bayes-optimal estimator. The paper's text and synthetic code were not available (eval_protocols.md §5.1), so
this follows the review's description. A direction q ~ U{1..d} per sequence; each of n context tokens is, with
probability α, a signal token e_q + σ·z and otherwise a noise token σ·z (z ~ N(0, I_d)). Nothing marks a token's
type, and since q is uniform the signal tokens point everywhere, so no linear function of a token tells signal
from noise: the review's reason a nonlinear weighting (the value temperature) is needed. The model is
attention-only (a read-in, one attention layer, a read-out at a final query token: no MLP that could do the
selection instead), and its estimate of e_q is scored by squared error against naive averaging, the mean of the
true signal tokens, and the Bayes-optimal posterior mean, which is exact in closed form.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnzoo.config import ModelConfig
from attnzoo.evals.base import TINY_LOOP, TaskBatch, as_generator, evaluating, model_device
from attnzoo.evals.single_layer import attention_context, attention_layer
from attnzoo.evals.task import Task, TaskBudget, register_task
from attnzoo.validation import require


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

    def __init__(self, model_config: ModelConfig, cfg: DenoisingConfig):
        super().__init__()
        self.model_config = model_config
        self.read_in = nn.Linear(cfg.dim + 1, model_config.dim)
        self.attention, self.position = attention_layer(model_config)
        self.read_out = nn.Linear(model_config.dim, cfg.dim)

    def forward(self, features: Tensor, target: Tensor | None = None) -> Tensor | tuple[Tensor, Tensor]:
        """(B, n + 1, d + 1) features → the (B, d) estimate of e_q; with ``target``, also the squared error."""
        x = self.read_in(features)
        ctx = attention_context(self.position, x.shape[1], x.device, causal=True)
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
