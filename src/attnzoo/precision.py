"""The dtype that numerically sensitive steps compute in.

Softmax, normalisation, temperatures, rotations and positional biases run in fp32 when the model is fp32, bf16
or fp16 (the half-precision formats round too coarsely for them), and in float64 when the model is float64, so
a float64 model is float64 end to end (``torch.autograd.gradcheck`` passes on it).
"""

from __future__ import annotations

import torch


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """``torch.promote_types(dtype, float32)``: float32 for fp32/bf16/fp16 tensors, float64 for float64 ones."""
    return torch.promote_types(dtype, torch.float32)
