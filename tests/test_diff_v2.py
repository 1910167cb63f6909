"""DIFF V2 (``diff_v2``): the per-head formula, the official layout, the head pairing and the cache."""

import dataclasses
import math

import pytest
import torch
from conftest import TINY_MODEL, tiny_config

from attnzoo import ModelConfig, Transformer

VOCAB = TINY_MODEL["vocab_size"]
DIM, HEADS, HEAD_DIM = 64, 4, 16  # h = 4 differential heads, 2h = 8 query heads of size d = 16
KV_SETTINGS = [pytest.param(4, id="mha"), pytest.param(2, id="gqa2:1"), pytest.param(1, id="mqa")]
ALL_POSITIONS = ["none", "learned", "sinusoidal", "rope", "alibi"]


def make_model(n_kv_heads=HEADS, position="rope", backend="auto"):
    # init_std 0.1 makes the maps far from uniform, so layout or masking errors change the outputs.
    cfg = tiny_config(
        dim=DIM,
        n_heads=HEADS,
        n_kv_heads=n_kv_heads,
        attention="diff_v2",
        position=position,
        init_std=0.1,
        attn_backend=backend,
    )
    return Transformer(cfg).eval()


def with_backend(model, backend):
    twin = Transformer(dataclasses.replace(model.config, attn_backend=backend)).eval()
    twin.load_state_dict(model.state_dict())
    return twin


def rope_half_split(x, positions):
    """NeoX-style RoPE on the last dim (size d): pairs (k, k + d/2) rotate by position·10000^(−2k/d)."""
    d = x.shape[-1]
    angles = positions[:, None].double() * 10000.0 ** (-torch.arange(0, d, 2).double() / d)
    cos, sin = angles.cos().float(), angles.sin().float()
    first, second = x[..., : d // 2], x[..., d // 2 :]
    return torch.cat((first * cos - second * sin, second * cos + first * sin), dim=-1)


@torch.no_grad()
def reference_diff_v2(attn, x, position):
    """The official V2 formula per differential head, in float64.

    Query head m (rows [m·d, (m+1)·d) of q_proj) reads kv head m // (2h / h_kv), as FlashAttention groups
    heads; differential head i is a_2i − sigmoid(x·lambda_proj[i])·a_2i+1. Returns the output and the maps.
    """
    n_heads, n_kv_heads, d = attn.n_heads, attn.n_kv_heads, attn.head_dim
    x = x.double()
    w_q, w_k, w_v, w_o, w_lambda = (
        p.weight.double() for p in (attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj, attn.lambda_proj)
    )
    group = 2 * n_heads // n_kv_heads
    seq_len = x.shape[1]
    positions = torch.arange(seq_len)
    distance = (positions[:, None] - positions[None, :]).double()
    slopes = [2.0 ** (-8 * (i + 1) / n_heads) for i in range(n_heads)]  # ALiBi over h heads, h a power of two

    def head(m):
        j = m // group
        q, k, v = x @ w_q[m * d : (m + 1) * d].T, x @ w_k[j * d : (j + 1) * d].T, x @ w_v[j * d : (j + 1) * d].T
        if position == "rope":
            q, k = rope_half_split(q.float(), positions).double(), rope_half_split(k.float(), positions).double()
        logits = q @ k.transpose(-1, -2) / math.sqrt(d)
        if position == "alibi":
            logits = logits - slopes[m // 2] * distance
        probs = logits.masked_fill(distance < 0, float("-inf")).softmax(dim=-1)
        return probs, probs @ v

    outputs, maps = [], []
    for i in range(n_heads):
        lam = torch.sigmoid(x @ w_lambda[i])[..., None]  # (B, T, 1)
        (probs1, out1), (probs2, out2) = head(2 * i), head(2 * i + 1)
        outputs.append(out1 - lam * out2)
        maps.append(probs1 - lam * probs2)
    return torch.cat(outputs, dim=-1) @ w_o.T, torch.stack(maps, dim=1)


def run_layer(model, idx, layer_idx=1):
    """The attention input and output of one layer during ``model(idx)``."""
    captured = {}
    hook = model.layers[layer_idx].self_attn.register_forward_hook(
        lambda module, args, out: captured.update(x=args[0], out=out)
    )
    with torch.no_grad():
        model(idx)
    hook.remove()
    return captured["x"], captured["out"]


@pytest.mark.parametrize("n_kv_heads", KV_SETTINGS)
@pytest.mark.parametrize("position", ["none", "rope", "alibi"])
def test_layer_matches_per_head_reference(position, n_kv_heads):
    """Eager and SDPA both equal the explicit per-head loop (fp32 vs float64, ≤ 1e-5); so do the maps."""
    model = make_model(n_kv_heads, position)
    attn = model.layers[1].self_attn
    idx = torch.randint(0, VOCAB, (2, 12))
    for backend in ("eager", "sdpa"):
        x, out = run_layer(with_backend(model, backend), idx)
        expected, expected_maps = reference_diff_v2(attn, x, position)
        torch.testing.assert_close(out.double(), expected, atol=1e-5, rtol=0)
    maps = model.attention_maps(idx)[1]
    assert maps.shape == (2, HEADS, 12, 12)
    torch.testing.assert_close(maps.double(), expected_maps, atol=1e-6, rtol=0)


@pytest.mark.parametrize("n_kv_heads", KV_SETTINGS)
@pytest.mark.parametrize("position", ALL_POSITIONS)
def test_cached_decoding_matches_full_forward(position, n_kv_heads):
    model = make_model(n_kv_heads, position)
    idx = torch.randint(0, VOCAB, (2, 12))
    with torch.no_grad():
        full = model(idx)
        cache = model.new_cache(2, 12)
        steps = [model(idx[:, :6], cache=cache)] + [model(idx[:, t : t + 1], cache=cache) for t in range(6, 12)]
        cache = model.new_cache(2, 12)
        chunks = [model(idx[:, :5], cache=cache), model(idx[:, 5:9], cache=cache), model(idx[:, 9:], cache=cache)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=0)
    torch.testing.assert_close(torch.cat(chunks, dim=1), full, atol=1e-5, rtol=0)


def test_refuses_pairs_that_straddle_kv_groups():
    # h = 3, h_kv = 2: 6 query heads in groups of 3, so heads 2 and 3 (differential head 1) would split.
    with pytest.raises(ValueError, match="n_kv_heads=2 is invalid"):
        ModelConfig(dim=48, n_heads=3, n_kv_heads=2, attention="diff_v2")


def test_parameter_count_against_mha():
    """V2 adds h·d query rows and the h-row lambda_proj to MHA with h heads of size d."""
    v2 = make_model(2)
    mha = Transformer(dataclasses.replace(v2.config, attention="mha"))
    assert v2.num_parameters() - mha.num_parameters() == 2 * (HEADS * HEAD_DIM * DIM + HEADS * DIM)


def test_official_state_dict_loads_strictly():
    """A state dict in the official MultiheadFlashDiffV2 layout (h = 4, h_kv = 2, d = 16) loads as it is."""
    n_kv_heads = 2
    official = {
        "q_proj.weight": torch.randn(2 * HEADS * HEAD_DIM, DIM),
        "k_proj.weight": torch.randn(n_kv_heads * HEAD_DIM, DIM),
        "v_proj.weight": torch.randn(n_kv_heads * HEAD_DIM, DIM),
        "o_proj.weight": torch.randn(DIM, HEADS * HEAD_DIM),
        "lambda_proj.weight": torch.randn(HEADS, DIM),
    }
    attn = make_model(n_kv_heads).layers[0].self_attn
    assert sorted(attn.state_dict()) == sorted(official)
    attn.load_state_dict(official, strict=True)
    for name, value in attn.state_dict().items():
        assert torch.equal(value, official[name]), name
