"""Differential attention's fused CPU kernel (``attention/kernels/diff_flash.py``, ``kernels/csrc/diff_flash.cpp``)
against Eq. 1 of the paper computed in float64, and the seams around it: the layer's route, GQA, ALiBi, the fallback
without a compiler, float64, memory, cached decoding and the kernel's name.

Tolerances, each relative to the largest magnitude of the expected tensor (and at least 1): fp32 1e-5 (the kernel
sums in another order than float64; measured ≤ 1e-6), bf16 2e-2 (bf16 operands and output; the kernel computes in
fp32). The extension is built once per session; every test that needs it is skipped, naming the reason, where it
cannot be built.
"""

import math

import pytest
import torch
from conftest import tiny_model
from kernel_checks import CallCounter, assert_close, on_backend
from test_kernels import LargestTensor

from attnzoo import Transformer
from attnzoo.attention.kernels import build, cpu, diff_flash
from attnzoo.bench import sdpa_kernels
from attnzoo.cli import main

B, H, H_KV, D = 2, 4, 2, 8  # differential heads, their kv heads, the sub-head size d (values are 2d wide)
LENGTHS = [1, 7, 63, 65, 129, 300]
TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 2e-2}


@pytest.fixture(scope="module", autouse=True)
def built():
    if not build.available():
        pytest.skip(f"the fused CPU kernel cannot be built here: {build.status()}")


def equation_1(q, k, v, lam, slopes):
    """(softmax(S1) − λ·softmax(S2))·V in float64, S_m = q_m·k_mᵀ/√d + m_h·(j − i) over keys j ≤ i; sub-heads 2h and
    2h + 1 of head h, kv head h // (H / H_kv)."""
    q, k, v, lam, slopes = (x.double() for x in (q, k, v, lam, slopes))
    rep = q.shape[1] // 2 // v.shape[1]
    k1, k2, v = (x.repeat_interleave(rep, dim=1) for x in (k[:, 0::2], k[:, 1::2], v))
    length = q.shape[2]
    i = torch.arange(length, dtype=torch.float64)
    bias = slopes[:, None, None] * (i[None, :] - i[:, None])
    causal = torch.ones(length, length, dtype=torch.bool).tril()

    def softmax(q_m, k_m):
        scores = q_m @ k_m.transpose(-1, -2) / math.sqrt(q.shape[-1]) + bias
        return scores.masked_fill(~causal, -math.inf).softmax(-1)

    return (softmax(q[:, 0::2], k1) - lam * softmax(q[:, 1::2], k2)) @ v


def operands(length: int, dtype: torch.dtype, kv_heads: int = H_KV) -> list[torch.Tensor]:
    shapes = [(B, 2 * H, length, D), (B, 2 * kv_heads, length, D), (B, kv_heads, length, 2 * D)]
    return [torch.randn(shape).to(dtype).requires_grad_() for shape in shapes] + [torch.tensor(0.35).requires_grad_()]


def output_and_grads(attention, leaves, grad):
    out = attention(*leaves)
    return [out, *torch.autograd.grad(out, leaves, grad)]


# Small tiles put tile edges inside every length above 16, with key tiles shorter than query tiles and longer;
# bf16 runs the default tiles, whose edges fp32 already covers.
KERNEL_CASES = [
    pytest.param(torch.float32, None, id="fp32"),
    pytest.param(torch.float32, (32, 16), id="fp32-q32-k16"),
    pytest.param(torch.float32, (16, 32), id="fp32-q16-k32"),
    pytest.param(torch.bfloat16, None, id="bf16"),
]


@pytest.mark.parametrize("alibi", [False, True], ids=["no-bias", "alibi"])
@pytest.mark.parametrize("length", LENGTHS)
@pytest.mark.parametrize(("dtype", "tiles"), KERNEL_CASES)
def test_kernel_equals_equation_1_forward_and_every_gradient(monkeypatch, dtype, tiles, length, alibi, tile_products):
    """Output and dq, dk, dv, dλ of the kernel equal Eq. 1 in float64, at odd lengths and tile edges, GQA (2 kv heads
    for 4 heads), batch 2, with and without ALiBi's slopes."""
    if tiles is not None:
        monkeypatch.setattr(cpu, "Q_TILE", tiles[0])
        monkeypatch.setattr(cpu, "K_TILE", tiles[1])
    slopes = torch.tensor([0.5, 0.25, 0.125, 0.0625]) if alibi else torch.zeros(H)
    leaves = operands(length, dtype)
    grad = torch.randn(B, H, length, 2 * D).to(dtype)
    fused = output_and_grads(lambda *x: diff_flash.diff_attention(*x, slopes if alibi else None), leaves, grad)
    expected = output_and_grads(lambda *x: equation_1(*x, slopes), leaves, grad)
    for actual, wanted, leaf in zip(fused, expected, [fused[0], *leaves], strict=True):
        assert actual.dtype == leaf.dtype
        assert_close(actual, wanted, TOLERANCE[dtype])


def test_multi_query_attention(monkeypatch):
    """Every head reads the one kv head: the key-side gradients sum over all of them."""
    leaves = operands(97, torch.float32, kv_heads=1)
    grad = torch.randn(B, H, 97, 2 * D)
    slopes = torch.zeros(H)
    fused = output_and_grads(lambda *x: diff_flash.diff_attention(*x, None), leaves, grad)
    expected = output_and_grads(lambda *x: equation_1(*x, slopes), leaves, grad)
    for actual, wanted in zip(fused, expected, strict=True):
        assert_close(actual, wanted, TOLERANCE[torch.float32])


# ---------------------------------------------------------------------------------------------------
# The layer's route


def fused_spy(monkeypatch) -> CallCounter:
    """Counts the layer's calls of the fused kernel."""
    return CallCounter(monkeypatch, diff_flash, "diff_attention")


def diff_model(position: str = "rope", max_seq_len: int = 160, dtype: torch.dtype = torch.float32) -> Transformer:
    settings = {"attention": "diff", "position": position, "max_seq_len": max_seq_len}
    return tiny_model(vocab_size=32, dim=64, n_heads=2, n_kv_heads=1, **settings).to(dtype)


def loss_and_grads(model: Transformer, idx: torch.Tensor) -> list[torch.Tensor]:
    model.zero_grad(set_to_none=True)
    loss = model(idx, idx)[1]
    loss.backward()
    return [loss.detach(), *(p.grad.clone() for p in model.parameters())]


@pytest.mark.parametrize("position", ["rope", "alibi", "none", "learned"])
def test_a_training_step_equals_the_pytorch_path(monkeypatch, position):
    """The loss and every parameter's gradient (λ's vectors and subln's weight among them) of a diff model on the
    kernel equal the model on its two SDPA calls (fp32, 1e-5), for each positional scheme: RoPE rotates q and k
    before the kernel, ALiBi's bias is added inside it, and MQA (1 kv head) shares k and v."""
    model, idx = diff_model(position), torch.randint(0, 32, (2, 150))
    spy = fused_spy(monkeypatch)
    fused = loss_and_grads(model, idx)
    assert spy.calls == model.config.n_layers
    reference = loss_and_grads(on_backend(model, "sdpa"), idx)
    assert spy.calls == model.config.n_layers
    for actual, wanted in zip(fused, reference, strict=True):
        assert_close(actual, wanted, TOLERANCE[torch.float32])


def test_bf16_under_autocast_equals_the_pytorch_path(monkeypatch):
    """bf16 autocast, as training on a CPU may run: the loss agrees with the two SDPA calls within bf16's 2e-2."""
    model, idx = diff_model(), torch.randint(0, 32, (2, 100))
    spy = fused_spy(monkeypatch)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        fused = model(idx, idx)[1]
        reference = on_backend(model, "sdpa")(idx, idx)[1]
    assert spy.calls == model.config.n_layers
    assert_close(fused, reference, TOLERANCE[torch.bfloat16])


def test_float64_takes_the_pytorch_path(monkeypatch):
    """The kernel computes in fp32, so a float64 model never enters it."""
    spy = fused_spy(monkeypatch)
    model = diff_model(dtype=torch.float64)
    model(torch.randint(0, 32, (1, 20)))
    assert spy.calls == 0


def test_cached_decoding_equals_the_full_forward(monkeypatch):
    """The full forward (kernel), a prefill (kernel, on an empty cache) and one-token steps (the PyTorch path) give
    the same logits (fp32, 1e-5), with ALiBi."""
    spy = fused_spy(monkeypatch)
    model = diff_model("alibi").eval()
    idx = torch.randint(0, 32, (2, 41))
    with torch.no_grad():
        full = model(idx)
        cache = model.new_cache(2, 41)
        pieces = [model(idx[:, :29], cache=cache)]
        pieces += [model(idx[:, t : t + 1], cache=cache) for t in range(29, 41)]
    assert spy.calls == 2 * model.config.n_layers
    assert_close(torch.cat(pieces, dim=1), full, TOLERANCE[torch.float32])


def test_a_training_step_makes_no_tensor_of_the_maps_size(monkeypatch):
    """Forward and backward at T = 300 with ALiBi: no operator returns a tensor of H·T·T elements or more, where the
    PyTorch path without the fused ALiBi kernel (two SDPA calls with the (H, T, T) bias) does."""
    model, idx = diff_model("alibi", max_seq_len=300), torch.randint(0, 32, (1, 300))

    def largest_tensor() -> int:
        with LargestTensor() as largest:
            loss_and_grads(model, idx)
        return largest.numel

    assert largest_tensor() < 2 * 300 * 300
    model = on_backend(model, "sdpa")
    monkeypatch.setattr(build, "_loaded", False)  # as after a failed build: the fused ALiBi kernel refuses too
    monkeypatch.setattr(build, "_failure", "no compiler (simulated)")
    assert largest_tensor() >= 2 * 300 * 300  # the check sees the bias where there is one


def test_without_a_compiler_diff_falls_back_with_one_warning(monkeypatch, tmp_path):
    """No compiler (CXX names none; an empty extensions cache): one RuntimeWarning saying why, however many calls
    follow, and the PyTorch path's numbers, equal to the kernel's (fp32, 1e-5)."""
    model, idx = diff_model(), torch.randint(0, 32, (2, 65))
    fused = loss_and_grads(model, idx)
    monkeypatch.setenv("CXX", "/nonexistent/c++")
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "extensions"))
    monkeypatch.setattr(build, "_loaded", None)
    monkeypatch.setattr(build, "_failure", None)
    spy = fused_spy(monkeypatch)
    with pytest.warns(RuntimeWarning) as warned:
        fallback = loss_and_grads(model, idx)
        loss_and_grads(model, idx)
    assert len(warned) == 1 and "/nonexistent/c++" in str(warned[0].message)
    assert spy.calls == 0 and model.attention_kernels(idx) == ["sdpa"] * model.config.n_layers
    for actual, wanted in zip(fallback, fused, strict=True):
        assert_close(actual, wanted, TOLERANCE[torch.float32])


def test_the_kernel_is_named_where_it_runs(capsys):
    """``attnzoo info`` and the benchmarks' kernel column name the kernel for diff on the CPU."""
    assert main(["info", "--attention", "diff"]) == 0
    assert f"diff-flash: {diff_flash.KERNEL_NAME}, built" in capsys.readouterr().out
    assert sdpa_kernels(diff_model().eval(), torch.randint(0, 32, (1, 16))) == [diff_flash.KERNEL_NAME]
