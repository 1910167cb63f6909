"""The fused CPU ALiBi kernel (``attention/kernels/alibi_flash.py``, ``kernels/csrc/alibi_flash.cpp``) against
attnzoo's eager reference with the materialised bias, and the seams around it: the route the dispatcher takes between it
and SDPA, the fallback without a compiler, memory, cached decoding, the kernel's name.

Tolerances, each relative to the largest magnitude of the expected tensor (and at least 1, for gradients that are
exactly 0, such as dq at T = 1): fp32 1e-5 (the kernel and the reference sum in other orders; measured ≤ 5e-7
against float64), bf16 2e-2 (the reference rounds its probabilities to bf16 before ·V, the kernel does not).

The extension is built once per session (about a minute the first time on a fresh cache, then loaded from the
torch extensions directory); every test that needs it is skipped, naming the reason, where it cannot be built.
"""

import math

import pytest
import torch
from kernel_checks import CallCounter, assert_close
from test_kernels import LargestTensor

from attnzoo import ModelConfig, Transformer
from attnzoo.attention import AttentionContext
from attnzoo.attention.kernels import Call, alibi_flash, build, choose, cpu, eager_attention
from attnzoo.bench import sdpa_kernels
from attnzoo.cli import main
from attnzoo.positions import POSITIONS

B, H, H_KV, D = 2, 4, 2, 8
LENGTHS = [1, 7, 63, 65, 129, 300]
TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 2e-2}


@pytest.fixture(scope="module", autouse=True)
def built():
    if not build.available():
        pytest.skip(f"the fused CPU kernel cannot be built here: {build.status()}")


def context(length: int, dtype: torch.dtype = torch.float32) -> AttentionContext:
    cfg = ModelConfig(vocab_size=8, dim=H * D, n_heads=H, n_layers=1, position="alibi")
    scheme = POSITIONS.get("alibi")(cfg, D)
    positions = torch.arange(length)
    state = scheme.prepare(positions, length)
    return AttentionContext(
        positions, 0, scheme, state, dtype=torch.float64 if dtype == torch.float64 else torch.float32
    )


def qkv(length: int, dtype: torch.dtype, value_dim: int = D) -> list[torch.Tensor]:
    shapes = [(B, H, length, D), (B, H_KV, length, D), (B, H_KV, length, value_dim)]
    return [torch.randn(shape).to(dtype).requires_grad_() for shape in shapes]


def output_and_grads(attention, leaves, grad):
    out = attention(*leaves)
    return [out, *torch.autograd.grad(out, leaves, grad)]


def fused_spy(monkeypatch) -> CallCounter:
    """Counts the calls of the fused kernel."""
    return CallCounter(monkeypatch, alibi_flash, "alibi_flash_attention")


def alibi_model(**fields) -> Transformer:
    cfg = ModelConfig(vocab_size=32, dim=H * D, n_layers=2, n_heads=H, n_kv_heads=H_KV, position="alibi", **fields)
    return Transformer(cfg)


LAYER = alibi_model().layers[0].self_attn


def routed(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ctx: AttentionContext) -> torch.Tensor:
    """A layer's attention with ALiBi on the kernel the dispatcher chooses for the call: the fused kernel where its
    record serves it, else SDPA."""
    return choose(LAYER, Call.of(LAYER, q, k, ctx, cached=False)).run(LAYER, q, k, v, ctx)


# ---------------------------------------------------------------------------------------------------
# The kernel against the eager reference


# Small tiles put tile edges inside every length above 16, with key tiles shorter than query tiles (rows that see
# none of a tile) and longer; bf16 runs the default tiles, whose edges fp32 already covers.
KERNEL_CASES = [
    pytest.param(torch.float32, None, id="fp32"),
    pytest.param(torch.float32, (32, 16), id="fp32-q32-k16"),
    pytest.param(torch.float32, (16, 32), id="fp32-q16-k32"),
    pytest.param(torch.bfloat16, None, id="bf16"),
]


@pytest.mark.parametrize("length", LENGTHS)
@pytest.mark.parametrize(("dtype", "tiles"), KERNEL_CASES)
def test_kernel_equals_the_eager_reference_forward_and_every_gradient(monkeypatch, dtype, tiles, length, tile_products):
    """Output and dq, dk, dv of the fused kernel equal the eager kernel with the (H, T, T) bias, at odd lengths, GQA
    (2 kv heads for 4 query heads), batch 2."""
    if tiles is not None:
        monkeypatch.setattr(cpu, "Q_TILE", tiles[0])
        monkeypatch.setattr(cpu, "K_TILE", tiles[1])
    spy = fused_spy(monkeypatch)
    leaves = qkv(length, dtype)
    grad = torch.randn(B, H, length, D).to(dtype)
    fused = output_and_grads(lambda *x: routed(*x, context(length)), leaves, grad)
    assert spy.calls == (1 if length > 1 else 0)  # one token is its own output: plain SDPA, no bias needed
    expected = output_and_grads(lambda *x: eager_attention(*x, context(length))[0], leaves, grad)
    for actual, wanted in zip(fused, expected, strict=True):
        assert actual.dtype == dtype
        assert_close(actual, wanted, TOLERANCE[dtype])


def test_subheads_sharing_a_slope_and_wider_values():
    """Diff's layout: adjacent query heads share one bias head (``bias_repeat`` 2) and values are 2d wide; the kernel
    takes both as they are (no zero-padding of q and k)."""
    length = 129
    leaves = qkv(length, torch.float32, value_dim=2 * D)
    grad = torch.randn(B, H, length, 2 * D)
    ctx = context(length)
    fused = output_and_grads(lambda *x: alibi_flash.alibi_attention(*x, ctx, bias_repeat=2)[0], leaves, grad)
    eager = output_and_grads(lambda *x: eager_attention(*x, ctx, bias_repeat=2)[0], leaves, grad)
    for actual, wanted in zip(fused, eager, strict=True):
        assert_close(actual, wanted, TOLERANCE[torch.float32])


def test_float64_keeps_the_float64_path(monkeypatch):
    """The kernel computes in fp32, so float64 does not enter it: it runs SDPA's flash kernel with the float64 bias,
    equal to the eager reference in float64 (≤ 1e-12)."""
    spy = fused_spy(monkeypatch)
    length = 65
    leaves = qkv(length, torch.float64)
    grad = torch.randn(B, H, length, D, dtype=torch.float64)
    ctx = context(length, dtype=torch.float64)
    on_sdpa = output_and_grads(lambda *x: routed(*x, ctx), leaves, grad)
    eager = output_and_grads(lambda *x: eager_attention(*x, context(length, torch.float64))[0], leaves, grad)
    assert spy.calls == 0
    for actual, wanted in zip(on_sdpa, eager, strict=True):
        assert_close(actual, wanted, 1e-12)


# ---------------------------------------------------------------------------------------------------
# Memory, decoding, names


def test_a_training_step_makes_no_tensor_as_large_as_the_bias(monkeypatch):
    """Forward and backward of a model with ALiBi at T = 300: no operator returns a tensor of H·T·T elements or more
    (the (H, T, T) bias), where today's path (SDPA with the bias) does."""
    length = 300
    idx = torch.randint(0, 32, (1, length))
    model = alibi_model(max_seq_len=length)

    def step() -> int:
        model.zero_grad(set_to_none=True)
        with LargestTensor() as largest:
            model(idx, idx)[1].backward()
        return largest.numel

    assert step() < H * length * length
    monkeypatch.setattr(build, "_loaded", False)  # as after a failed build: SDPA runs the calls
    monkeypatch.setattr(build, "_failure", "no compiler (simulated)")
    assert step() >= H * length * length  # the check sees the bias where there is one


def test_without_a_compiler_alibi_falls_back_with_one_warning(monkeypatch, tmp_path):
    """A fresh machine without a compiler (CXX names none; an empty extensions cache): one RuntimeWarning saying why,
    however many calls follow, and the PyTorch path's numbers, equal to the fused kernel's (fp32, 1e-5)."""
    length = 129
    leaves = qkv(length, torch.float32)
    grad = torch.randn(B, H, length, D)
    fused = output_and_grads(lambda *x: routed(*x, context(length)), leaves, grad)

    monkeypatch.setenv("CXX", "/nonexistent/c++")
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "extensions"))
    monkeypatch.setattr(build, "_loaded", None)  # this process has not tried yet
    monkeypatch.setattr(build, "_failure", None)
    spy = fused_spy(monkeypatch)
    with pytest.warns(RuntimeWarning) as warned:
        fallback = output_and_grads(lambda *x: routed(*x, context(length)), leaves, grad)
        again = routed(*leaves, context(length))
    assert len(warned) == 1
    message = str(warned[0].message)
    assert "/nonexistent/c++" in message and "\n" not in message
    assert spy.calls == 0 and build.status().startswith("unavailable")
    refusal = alibi_flash.ALIBI_FLASH.call_refusal(LAYER, Call.of(LAYER, *leaves[:2], context(length), cached=False))
    assert refusal == f"the fused CPU kernels are {build.status()}"
    for actual, wanted in zip(fallback, fused, strict=True):
        assert_close(actual, wanted, TOLERANCE[torch.float32])
    torch.testing.assert_close(again, fallback[0], rtol=0, atol=0)


def test_cached_decoding_equals_the_full_forward(monkeypatch):
    """mha + ALiBi (GQA): the full forward (the fused kernel) and a prefill (the fused kernel, on an empty cache)
    followed by one-token steps give the same logits (fp32, 1e-5). Each step runs SDPA's CPU flash kernel with a
    (1, H, 1, S) bias, never SDPA's math path, which a 3-D mask selects (a decoding step at 0.6× MHA's speed)."""
    spy = fused_spy(monkeypatch)
    model = alibi_model(max_seq_len=64).eval()
    idx = torch.randint(0, 32, (2, 41))
    with torch.no_grad():
        full = model(idx)
        cache = model.new_cache(2, 41)
        pieces = [model(idx[:, :29], cache=cache)]
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            pieces += [model(idx[:, t : t + 1], cache=cache) for t in range(29, 41)]
    assert spy.calls == 2 * model.config.n_layers
    ran = {event.key: event.count for event in prof.key_averages()}
    assert "aten::_scaled_dot_product_attention_math" not in ran
    assert ran["aten::_scaled_dot_product_flash_attention_for_cpu"] == 12 * model.config.n_layers
    assert_close(torch.cat(pieces, dim=1), full, TOLERANCE[torch.float32])


def test_the_kernel_is_named_where_it_runs(capsys):
    """``attnzoo info`` and the benchmarks' kernel column name the fused kernel for ALiBi on the CPU, SDPA's flash
    kernel for an ALiBi decoding step, and SDPA's flash kernel for RoPE."""
    assert main(["info", "--position", "alibi"]) == 0
    said = capsys.readouterr().out
    assert f"attention kernel (CPU, fp32 training)\n  alibi-flash: {alibi_flash.KERNEL_NAME}, built" in said
    idx = torch.randint(0, 32, (1, 16))
    assert sdpa_kernels(alibi_model().eval(), idx) == [alibi_flash.KERNEL_NAME]
    assert sdpa_kernels(alibi_model().eval(), idx, decoding=True) == ["flash (CPU)"]
    rope = Transformer(ModelConfig(vocab_size=32, dim=H * D, n_layers=1, n_heads=H)).eval()
    assert sdpa_kernels(rope, idx) == ["flash (CPU)"]


def test_scale_is_the_inverse_square_root_of_the_head_size_by_default():
    """With no scale given the kernel uses 1/√d of the queries' width, also for wider values."""
    length = 33
    q, k, v = (x.detach() for x in qkv(length, torch.float32, value_dim=2 * D))
    slopes = context(length).bias_slopes(H)
    default, _ = alibi_flash.alibi_attention(q, k, v, context(length))
    explicit = alibi_flash.alibi_flash_attention(q, k, v, slopes, 1 / math.sqrt(D))
    torch.testing.assert_close(default, explicit, rtol=0, atol=0)


def test_torch_compile_keeps_the_sdpa_path_whole():
    """The op has no fake kernel: a compiled model traces SDPA's biased path without a graph break, and agrees."""
    import torch._dynamo

    model = Transformer(ModelConfig(vocab_size=64, dim=32, n_layers=1, n_heads=2, position="alibi")).eval()
    tokens = torch.randint(0, 64, (2, 16))
    torch._dynamo.reset()
    explained = torch._dynamo.explain(model)(tokens)
    assert explained.graph_break_count == 0
    compiled = torch.compile(model, backend="eager", fullgraph=True)
    torch.testing.assert_close(compiled(tokens), model(tokens), rtol=1e-5, atol=1e-5)


def test_use_blas_refuses_a_non_bool_by_name():
    with pytest.raises(ValueError, match="enabled=1 is invalid"):
        build.use_blas(1)
