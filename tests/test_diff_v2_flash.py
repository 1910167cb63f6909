"""DIFF V2 on Diff's fused CPU kernel (``attention/kernels/diff_v2_flash.py``, ``csrc/diff_flash.cpp`` with shared keys
and a λ per row) against the official formula in float64 and against the PyTorch path (one SDPA call over 2h query
heads), and the seams around it: the layer's route, GQA, ALiBi, bf16, float64 and cached decoding.

Tolerances, each relative to the largest magnitude of the expected tensor (and at least 1): fp32 1e-5 (the kernel
sums in another order than float64; measured ≤ 1.1e-6), bf16 2e-2 (bf16 operands and output; the kernel computes in
fp32). The extension is built once per session; every test that needs it is skipped, naming the reason, where it
cannot be built.
"""

import dataclasses
import math

import pytest
import torch
from kernel_checks import CallCounter, assert_close, on_backend

from attnzoo import ModelConfig, Transformer
from attnzoo.attention.kernels import build, cpu, diff_flash

B, H, H_KV, D = 2, 4, 2, 8  # differential heads (2H query heads), kv heads, the head size d
LENGTHS = [1, 7, 65, 129, 300]
TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 2e-2}


@pytest.fixture(scope="module", autouse=True)
def built():
    if not build.available():
        pytest.skip(f"the fused CPU kernel cannot be built here: {build.status()}")


def official_v2(q, k, v, lambdas, slopes):
    """a_2i − λ_i(t)·a_2i+1 in float64, a_m = softmax(q_m·k_gᵀ/√d + s_i·(j − t))·v_g over keys j ≤ t, query head m
    reading kv head g = m // (2H / H_kv) (FlashAttention's grouping), the pair's slope that of head i."""
    q, k, v, lambdas, slopes = (x.double() for x in (q, k, v, lambdas, slopes))
    group = q.shape[1] // v.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    length = q.shape[2]
    t = torch.arange(length, dtype=torch.float64)
    bias = slopes.repeat_interleave(2)[:, None, None] * (t[None, :] - t[:, None])
    causal = torch.ones(length, length, dtype=torch.bool).tril()
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]) + bias
    heads = scores.masked_fill(~causal, -math.inf).softmax(-1) @ v
    return heads[:, 0::2] - lambdas[..., None] * heads[:, 1::2]


def operands(length: int, dtype: torch.dtype, kv_heads: int = H_KV) -> list[torch.Tensor]:
    shapes = [(B, 2 * H, length, D), (B, kv_heads, length, D), (B, kv_heads, length, D)]
    tensors = [torch.randn(shape) for shape in shapes] + [torch.rand(B, H, length)]
    return [x.to(dtype).requires_grad_() for x in tensors]


def output_and_grads(attention, leaves, grad):
    out = attention(*leaves)
    return [out, *torch.autograd.grad(out, leaves, grad)]


KERNEL_CASES = [
    pytest.param(torch.float32, None, id="fp32"),
    pytest.param(torch.float32, (32, 16), id="fp32-q32-k16"),
    pytest.param(torch.float32, (16, 32), id="fp32-q16-k32"),
    pytest.param(torch.bfloat16, None, id="bf16"),
]


@pytest.mark.parametrize("alibi", [False, True], ids=["no-bias", "alibi"])
@pytest.mark.parametrize("length", LENGTHS)
@pytest.mark.parametrize(("dtype", "tiles"), KERNEL_CASES)
def test_kernel_equals_the_official_formula_forward_and_every_gradient(monkeypatch, dtype, tiles, length, alibi):
    """Output and dq, dk, dv and every row's dλ equal the official V2 formula in float64, at odd lengths and tile edges
    (small tiles put edges inside every length above 16), GQA (2 kv heads for 8 query heads), batch 2, with and
    without ALiBi's slopes."""
    if tiles is not None:
        monkeypatch.setattr(cpu, "Q_TILE", tiles[0])
        monkeypatch.setattr(cpu, "K_TILE", tiles[1])
    slopes = torch.tensor([0.5, 0.25, 0.125, 0.0625]) if alibi else torch.zeros(H)
    leaves = operands(length, dtype)
    grad = torch.randn(B, H, length, D).to(dtype)
    fused = output_and_grads(lambda *x: diff_flash.flash_attention(*x, slopes if alibi else None), leaves, grad)
    expected = output_and_grads(lambda *x: official_v2(*x, slopes), leaves, grad)
    for actual, wanted, leaf in zip(fused, expected, [fused[0], *leaves], strict=True):
        assert actual.dtype == leaf.dtype
        assert_close(actual, wanted, TOLERANCE[dtype])


def test_multi_query_attention():
    """Every query head reads the one kv head: dk and dv sum over all of them, both maps of each pair included."""
    leaves = operands(97, torch.float32, kv_heads=1)
    grad = torch.randn(B, H, 97, D)
    fused = output_and_grads(lambda *x: diff_flash.flash_attention(*x, None), leaves, grad)
    expected = output_and_grads(lambda *x: official_v2(*x, torch.zeros(H)), leaves, grad)
    for actual, wanted in zip(fused, expected, strict=True):
        assert_close(actual, wanted, TOLERANCE[torch.float32])


# ---------------------------------------------------------------------------------------------------
# The layer's route


def v2_model(position: str = "rope", n_kv_heads: int = 2, dtype: torch.dtype = torch.float32) -> Transformer:
    cfg = ModelConfig(
        vocab_size=32, dim=64, n_layers=2, n_heads=4, n_kv_heads=n_kv_heads, attention="diff_v2", position=position,
        max_seq_len=160, init_std=0.1,
    )  # fmt: skip
    torch.manual_seed(0)
    return Transformer(cfg).to(dtype)


def loss_and_grads(model: Transformer, idx: torch.Tensor) -> list[torch.Tensor]:
    model.zero_grad(set_to_none=True)
    loss = model(idx, idx)[1]
    loss.backward()
    return [loss.detach(), *(p.grad.clone() for p in model.parameters())]


@pytest.mark.parametrize("n_kv_heads", [4, 2, 1], ids=["mha", "gqa2:1", "mqa"])
@pytest.mark.parametrize("position", ["rope", "alibi", "none"])
def test_a_training_step_equals_the_pytorch_path(monkeypatch, position, n_kv_heads):
    """The loss and every parameter's gradient (``lambda_proj``'s among them) of a V2 model on the kernel equal the
    model on its SDPA call (fp32, 1e-5), for RoPE (rotated before the kernel), ALiBi (in the kernel) and no positions,
    with 4, 2 and 1 kv heads; every layer runs the kernel, and the pinned SDPA model never does."""
    model, idx = v2_model(position, n_kv_heads), torch.randint(0, 32, (2, 150))
    spy = CallCounter(monkeypatch, diff_flash, "flash_attention")
    fused = loss_and_grads(model, idx)
    assert spy.calls == model.config.n_layers
    assert model.attention_kernels(idx) == ["diff-v2-flash"] * model.config.n_layers
    reference = loss_and_grads(on_backend(model, "sdpa"), idx)
    assert spy.calls == 2 * model.config.n_layers  # attention_kernels ran the model once more
    for actual, wanted in zip(fused, reference, strict=True):
        assert_close(actual, wanted, TOLERANCE[torch.float32])


def test_bf16_under_autocast_equals_the_pytorch_path(monkeypatch):
    """bf16 autocast: the loss agrees with the SDPA call within bf16's 2e-2."""
    model, idx = v2_model(), torch.randint(0, 32, (2, 100))
    spy = CallCounter(monkeypatch, diff_flash, "flash_attention")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        fused = model(idx, idx)[1]
        reference = on_backend(model, "sdpa")(idx, idx)[1]
    assert spy.calls == model.config.n_layers
    assert_close(fused, reference, TOLERANCE[torch.bfloat16])


def test_float64_takes_the_pytorch_path(monkeypatch):
    """The kernel computes in fp32, so a float64 model never enters it."""
    spy = CallCounter(monkeypatch, diff_flash, "flash_attention")
    v2_model(dtype=torch.float64)(torch.randint(0, 32, (1, 20)))
    assert spy.calls == 0


def test_cached_decoding_equals_the_full_forward(monkeypatch):
    """The full forward (kernel), a prefill (kernel, on an empty cache) and one-token steps (the SDPA call) give the
    same logits (fp32, 1e-5), with ALiBi."""
    spy = CallCounter(monkeypatch, diff_flash, "flash_attention")
    model = v2_model("alibi").eval()
    idx = torch.randint(0, 32, (2, 41))
    with torch.no_grad():
        full = model(idx)
        cache = model.new_cache(2, 41)
        pieces = [model(idx[:, :29], cache=cache)]
        pieces += [model(idx[:, t : t + 1], cache=cache) for t in range(29, 41)]
    assert spy.calls == 2 * model.config.n_layers
    assert_close(torch.cat(pieces, dim=1), full, TOLERANCE[torch.float32])


def test_dropout_and_recorded_maps_take_the_pytorch_path(monkeypatch):
    """Training with attention dropout runs the SDPA call, and recorded maps the eager reference; neither enters the
    kernel."""
    model, idx = v2_model(), torch.randint(0, 32, (1, 20))
    dropout = Transformer(dataclasses.replace(model.config, dropout=0.1)).train()
    assert dropout.attention_kernels(idx) == ["sdpa"] * 2
    spy = CallCounter(monkeypatch, diff_flash, "flash_attention")
    assert model.eval().attention_maps(idx)[0].shape == (1, 4, 20, 20)
    assert spy.calls == 0
