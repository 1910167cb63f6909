from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import pytest
import torch

if TYPE_CHECKING:  # imported where used: Triton reads TRITON_INTERPRET (below) when attnzoo is first imported
    from attnzoo import ModelConfig, Transformer

# Two OpenMP threads collapse when the two CI cores are shared with anything else; one is steady.
torch.set_num_threads(1)

# Without CUDA, Triton's interpreter runs the fused DCMHA kernel on CPU tensors (tests/test_dcmha_triton.py).
# Triton reads the variable as @triton.jit decorates each function: its own library's when triton.language is first
# imported (importing attnzoo or torch._dynamo does), attnzoo's kernels when attnzoo is. So it is set here, before
# any test module is imported; never with CUDA, where Triton compiles (inductor's kernels too).
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


# The tests' model: two layers of width 32 and four heads of 8, a prime vocabulary (a vocabulary-sized axis confused
# with another shows) and room for the sequences the tests feed it. Tests import the builders from here
# (``from conftest import tiny_model``) and override what they test.
TINY_MODEL: dict[str, Any] = {"vocab_size": 61, "dim": 32, "n_layers": 2, "n_heads": 4, "max_seq_len": 64}


def tiny_config(**overrides: Any) -> ModelConfig:
    """The tests' small ModelConfig, ``overrides`` replacing any field (validated as any ModelConfig is)."""
    from attnzoo import ModelConfig

    return ModelConfig(**{**TINY_MODEL, **overrides})


def tiny_model(*, seed: int | None = 0, **overrides: Any) -> Transformer:
    """``tiny_config(**overrides)``'s Transformer in eval mode, its weights drawn after ``torch.manual_seed(seed)``
    (the same weights whatever the test drew before; ``seed=None`` draws them from the RNG as it stands, for a second
    model that must differ from the first)."""
    from attnzoo import Transformer

    if seed is not None:
        torch.manual_seed(seed)
    return Transformer(tiny_config(**overrides)).eval()


@pytest.fixture(autouse=True)
def _one_thread_whatever_the_load(monkeypatch):
    """The commands choose their threads from the machine's load average and say so on a busy machine; tests pin
    one thread, as CI runs them, so no output depends on what else the machine is doing (tests/test_machine.py
    injects the load it tests)."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture(autouse=True)
def _private_data_cache(tmp_path, monkeypatch):
    """Every test prepares its corpora in its own cache, never the user's (~/.cache/attnzoo)."""
    monkeypatch.setenv("ATTNZOO_CACHE_DIR", str(tmp_path / "cache"))


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip_cuda = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip_cuda)


@pytest.fixture(params=["blas", "aten"])
def tile_products(request):
    """Runs a fused kernel's test twice: its tile products on BLAS called directly, then on ATen's matmul
    (``build.use_blas``); skips the first where PyTorch's BLAS exports no ``sgemm_``."""
    from attnzoo.attention.kernels import build

    if not build.available():
        pytest.skip("the fused CPU kernels cannot be built here")
    if build.use_blas(request.param == "blas") != (request.param == "blas"):
        pytest.skip("the BLAS PyTorch links exports no sgemm_")
    yield request.param
    build.use_blas(True)
