"""AdamW with decay on matrices only, and the warmup + cosine learning-rate schedule."""

from __future__ import annotations

import math

import torch
from torch import nn

from attnzoo.training.config import TrainConfig


def parameter_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Decay the ≥2-D weights of linear maps; never norms, biases, gates or embeddings (GPT-2/nanoGPT practice).

    Embeddings include the tied output matrix. Frozen parameters are left out of the optimizer entirely.
    """
    embeddings = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    decay, no_decay = [], []
    for param in model.parameters():
        if param.requires_grad:
            (decay if param.dim() >= 2 and id(param) not in embeddings else no_decay).append(param)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def build_optimizer(model: nn.Module, cfg: TrainConfig) -> torch.optim.AdamW:
    """AdamW over :func:`parameter_groups`. On CUDA its fused kernel, as torchtitan and nanoGPT use there: one launch
    per group instead of a few per parameter list, the same update to rounding; elsewhere torch's default path, so
    CPU runs keep their numbers."""
    groups = parameter_groups(model, cfg.weight_decay)
    params = [param for group in groups for param in group["params"]]
    fused = bool(params) and all(param.is_cuda for param in params)
    return torch.optim.AdamW(groups, lr=learning_rate(0, cfg), betas=(cfg.beta1, cfg.beta2), fused=fused)


def learning_rate(step: int, cfg: TrainConfig) -> float:
    """The learning rate of the update that follows ``step`` completed ones: linear warmup, then cosine
    decay from ``lr`` to ``lr·min_lr_ratio`` at the last step. A pure function of the step, so resuming
    needs no scheduler state."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    min_lr = cfg.lr * cfg.min_lr_ratio
    progress = (step - cfg.warmup_steps) / max(1, cfg.steps - 1 - cfg.warmup_steps)
    return min_lr + 0.5 * (1 + math.cos(math.pi * min(progress, 1.0))) * (cfg.lr - min_lr)
