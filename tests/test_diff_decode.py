"""Differential attention's decoding kernel (``attention/kernels/diff_decode.py``, ``csrc/diff_flash.cpp``): one query
row over a growing cache, (A1 − λA2)·V in one product, against Eq. 1 in float64, the two-SDPA-call path, the eager
reference (A1·V − λ·A2·V with explicit fp32 maps) and the full forward, and where it serves.

Tolerance: fp32 1e-5 relative to the largest magnitude of the expected tensor (and at least 1): the op sums in
another order, and takes the difference before the product with V (measured ≤ 2e-7 against float64). The extension
is built once per session; the tests that need it are skipped, naming the reason, where it cannot be built.
"""

import dataclasses
import math

import pytest
import torch
from kernel_checks import CallCounter, assert_close, on_backend

from attnzoo import ModelConfig, Transformer
from attnzoo.attention.kernels import KERNELS, Call, build, diff_decode

VOCAB = 40
TOLERANCE = 1e-5
KV_SETTINGS = [pytest.param(4, id="mha"), pytest.param(2, id="gqa2:1"), pytest.param(1, id="mqa")]


@pytest.fixture(scope="module", autouse=True)
def built():
    if not build.available():
        pytest.skip(f"the fused CPU kernel cannot be built here: {build.status()}")


def diff_model(n_kv_heads: int = 4, position: str = "rope") -> Transformer:
    # init_std 0.1 makes the maps far from uniform, so a head or sub-head read from the wrong place changes the output.
    cfg = ModelConfig(
        vocab_size=VOCAB, dim=64, n_layers=2, n_heads=4, n_kv_heads=n_kv_heads, attention="diff", position=position,
        max_seq_len=32, init_std=0.1,
    )  # fmt: skip
    torch.manual_seed(0)
    return Transformer(cfg).eval()


@torch.no_grad()
def decoded(model: Transformer, idx: torch.Tensor, prompt: int, *, static: bool = False) -> torch.Tensor:
    """Logits of a prefill of ``prompt`` tokens, then one-token steps over the rest, on a growing or static cache."""
    cache = model.new_cache(idx.shape[0], idx.shape[1], static=static)
    pieces = [model(idx[:, :prompt], cache=cache)]
    pieces += [model(idx[:, t : t + 1], cache=cache) for t in range(prompt, idx.shape[1])]
    return torch.cat(pieces, dim=1)


def equation_1(q, k, v, lam, slopes):
    """(softmax(S1) − λ·softmax(S2))·V of the one query row at position S − 1, in float64: sub-head 2h + m of head h
    against key sub-head 2j + m of kv head j = h // (H / H_kv), S_m = q_m·k_mᵀ/√d + m_h·(j − (S − 1))."""
    heads, kv_heads, keys, d = q.shape[1] // 2, v.shape[1], k.shape[2], q.shape[-1]
    bias = slopes.double()[:, None] * (torch.arange(keys, dtype=torch.float64) - (keys - 1))
    out = torch.empty(q.shape[0], heads, 1, v.shape[-1], dtype=torch.float64)
    for h in range(heads):
        j = h // (heads // kv_heads)
        maps = [
            (q[:, 2 * h + m].double() @ k[:, 2 * j + m].double().transpose(-1, -2) / math.sqrt(d) + bias[h]).softmax(-1)
            for m in (0, 1)
        ]
        out[:, h] = (maps[0] - lam * maps[1]) @ v[:, j].double()
    return out


@pytest.mark.parametrize("alibi", [False, True], ids=["no-bias", "alibi"])
@pytest.mark.parametrize(("heads", "kv_heads", "keys"), [(4, 2, 9), (4, 4, 300), (4, 1, 33), (2, 2, 1)])
def test_the_op_equals_equation_1(heads, kv_heads, keys, alibi):
    """The op over a cache's strided views (a buffer longer than the keys) equals Eq. 1 in float64 (fp32, 1e-5), for
    GQA 2:1, MHA, MQA and a single key, with and without ALiBi's slopes."""
    d, batch = 8, 2
    q = torch.randn(batch, 2 * heads, 1, d)
    k = torch.randn(batch, 2 * kv_heads, keys + 5, d)[:, :, :keys]
    v = torch.randn(batch, kv_heads, keys + 5, 2 * d)[:, :, :keys]
    slopes = torch.tensor([0.5, 0.25, 0.125, 0.0625][:heads]) if alibi else torch.zeros(heads)
    lam = torch.tensor(0.3)
    out = diff_decode.decode_attention(q, k, v, lam, slopes if alibi else None)
    assert_close(out, equation_1(q, k, v, 0.3, slopes), TOLERANCE)


@pytest.mark.parametrize("n_kv_heads", KV_SETTINGS)
@pytest.mark.parametrize("position", ["rope", "alibi", "none"])
def test_steps_equal_the_two_sdpa_calls_the_reference_and_the_full_forward(monkeypatch, position, n_kv_heads):
    """Every one-token step's logits equal the same model's on two SDPA calls, on the eager reference and in the full
    forward (fp32, 1e-5), for the MHA, GQA 2:1 and MQA layouts, with RoPE, ALiBi (one bias for both maps) and no
    positions; each step of each layer runs this kernel, and the pinned backends never do."""
    model, idx = diff_model(n_kv_heads, position), torch.randint(0, VOCAB, (2, 30))
    spy = CallCounter(monkeypatch, diff_decode, "decode_attention")
    steps = decoded(model, idx, 20)
    assert spy.calls == 10 * model.config.n_layers
    for backend in ("sdpa", "eager"):
        assert_close(steps, decoded(on_backend(model, backend), idx, 20), TOLERANCE)
    with torch.no_grad():
        assert_close(steps, model(idx), TOLERANCE)
    assert spy.calls == 10 * model.config.n_layers


def test_where_it_serves():
    """An fp32 one-token step over a growing cache on the CPU, without recorded maps or dropout; not a prefill, a
    fresh sequence, a static step (its buffers hold slots the query may not see), bf16, CUDA, a compiled step or one
    autograd records."""
    model = diff_model()
    layer, kernel = model.layers[0].self_attn, KERNELS.get("diff-decode")
    step = dataclasses.replace(
        Call.planned(model.config, model.position, length=1), cached=True, start=20, keys=21, build=True
    )
    assert kernel.call_refusal(layer, step) is None
    refused = {
        "prefill": {"queries": 5, "keys": 25},
        "fresh": {"cached": False, "start": 0, "keys": 1},
        "static": {"static": True, "start": None},
        "bf16": {"dtype": torch.bfloat16, "key_dtype": torch.bfloat16},
        "cuda": {"device_type": "cuda"},
        "compiled": {"compiling": True},
        "maps": {"records_scores": True},
        "dropout": {"dropout": 0.1},
        "autograd": {"autograd": True},  # the op has no backward: a step autograd records takes SDPA's
    }
    for name, changes in refused.items():
        assert kernel.call_refusal(layer, dataclasses.replace(step, **changes)) is not None, name


def test_a_static_step_and_bf16_keep_the_sdpa_path(monkeypatch):
    """The steps it refuses still decode what the full forward gives: a static cache (fp32, 1e-5) and a bf16 model
    (its steps against its own full forward, bf16's 2e-2), without entering the op."""
    model, idx = diff_model(2, "alibi"), torch.randint(0, VOCAB, (2, 24))
    spy = CallCounter(monkeypatch, diff_decode, "decode_attention")
    with torch.no_grad():
        assert_close(decoded(model, idx, 16, static=True), model(idx), TOLERANCE)
        model = model.to(torch.bfloat16)
        assert_close(decoded(model, idx, 16), model(idx), 2e-2)
    assert spy.calls == 0
