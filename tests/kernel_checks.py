"""What the fused kernels' tests share: a counter of a kernel's calls and the tolerance check they state."""

from __future__ import annotations

import dataclasses
from types import ModuleType

import torch

from attnzoo import Transformer


class CallCounter:
    """Counts the calls of ``module.name`` while a test runs (patched through ``monkeypatch``), passing each on: a
    layer's route to a kernel shows in the count."""

    def __init__(self, monkeypatch, module: ModuleType, name: str):
        self.calls = 0
        original = getattr(module, name)

        def counted(*args, **kwargs):
            self.calls += 1
            return original(*args, **kwargs)

        monkeypatch.setattr(module, name, counted)


def assert_close(actual: torch.Tensor, expected: torch.Tensor, tolerance: float) -> None:
    """|actual − expected| ≤ tolerance · max(max |expected|, 1), elementwise, compared in float64."""
    scale = max(expected.abs().max().item(), 1.0)
    torch.testing.assert_close(actual.double(), expected.double(), rtol=0, atol=tolerance * scale)


def on_backend(model: Transformer, backend: str) -> Transformer:
    """The same weights, dtype, device and mode with ``attn_backend=backend``: how a test pins a kernel (or the eager
    reference) for a comparison."""
    parameter = next(model.parameters())
    twin = Transformer(dataclasses.replace(model.config, attn_backend=backend)).to(parameter.device, parameter.dtype)
    twin.load_state_dict(model.state_dict())
    return twin.train(model.training)
