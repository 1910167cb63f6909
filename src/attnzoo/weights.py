"""Checks on stored weights before a model is built from them: nothing loads silently changed or broken.

A ``model.safetensors`` may come from anywhere (another tool, a hand edit, a diverged run). Loading copies
each tensor into the model's float32 (or float64) parameters, which casts whatever is stored:

* an integer or boolean tensor would become floats that no training produced: refused, naming the tensor;
* a float16 or bfloat16 tensor widens exactly, and a float64 one rounds: loaded, with a warning naming the
  stored dtype, so neither happens unnoticed;
* NaN or ±inf (stored, or a float64 beyond float32's range) would make every output NaN: refused, naming the
  tensor and how many of its values.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from pathlib import Path

import torch
from safetensors import safe_open
from torch import Tensor

log = logging.getLogger(__name__)

# safetensors' names of the dtypes a model's weights may be stored in (the header says which, per tensor).
FLOAT_DTYPES = {"F16": torch.float16, "BF16": torch.bfloat16, "F32": torch.float32, "F64": torch.float64}
# ... and of the others, as torch names them, for the messages that refuse them.
OTHER_DTYPES = {"BOOL": "bool", "U8": "uint8", "I8": "int8", "I16": "int16", "I32": "int32", "I64": "int64",
                "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2"}  # fmt: skip


def stored_dtypes(path: Path) -> dict[str, str]:
    """Each tensor's dtype as ``path``'s safetensors header records it ('F32', 'I64' ...), read without the data."""
    try:
        with safe_open(str(path), framework="pt") as f:
            return {name: f.get_slice(name).get_dtype() for name in f.keys()}  # noqa: SIM118 (not a dict)
    except Exception as err:  # safetensors raises its own error types for unreadable headers
        raise ValueError(f"cannot read weights from {path}: {err}") from None


def check_dtypes(dtypes: Mapping[str, str | torch.dtype], path: Path, model_dtype: torch.dtype) -> None:
    """Refuse tensors not stored as 16- to 64-bit floats; warn when floats are stored in another dtype than the
    model's.

    ``dtypes``: each tensor's dtype, a safetensors name or a torch dtype.
    """
    names = {name: _dtype_name(dtype) for name, dtype in dtypes.items()}
    floats = {str(dtype).removeprefix("torch.") for dtype in FLOAT_DTYPES.values()}
    wrong = {name: dtype for name, dtype in names.items() if dtype not in floats}
    if wrong:
        first, dtype = next(iter(sorted(wrong.items())))
        more = f" (and {len(wrong) - 1} more tensor(s))" if len(wrong) > 1 else ""
        raise ValueError(
            f"{path}: tensor {first!r} is stored as {dtype}{more}, but a model's weights must be stored as "
            f"{', '.join(sorted(floats))}: not loaded, since casting it would make up weights"
        )
    model_name = _dtype_name(model_dtype)
    others = sorted(set(names.values()) - {model_name})
    if others:
        exact = all(torch.finfo(_torch_dtype(d)).bits < torch.finfo(model_dtype).bits for d in others)
        how = "widened exactly" if exact else "rounded"
        log.warning(
            "%s stores %s weights; they are loaded into a %s model, %s",
            path,
            " and ".join(others),
            model_name,
            how,
        )


def check_finite(tensors: Iterable[tuple[str, Tensor]], path: Path) -> None:
    """Refuse NaN and ±inf, which make every output NaN; ``tensors`` as loaded (after any cast)."""
    for name, tensor in tensors:
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            bad = int((~torch.isfinite(tensor)).sum())
            raise ValueError(
                f"{path}: tensor {name!r} holds {bad:,} NaN or infinite value(s) of {tensor.numel():,} (after "
                f"loading as {_dtype_name(tensor.dtype)}): the weights are broken (a diverged run, or values beyond "
                "the model's dtype), so they are not loaded"
            )


def _dtype_name(dtype: str | torch.dtype) -> str:
    if isinstance(dtype, torch.dtype):
        return str(dtype).removeprefix("torch.")
    return _dtype_name(FLOAT_DTYPES[dtype]) if dtype in FLOAT_DTYPES else OTHER_DTYPES.get(dtype, dtype)


def _torch_dtype(name: str) -> torch.dtype:
    return getattr(torch, name)
