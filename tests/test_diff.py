"""Differential attention (``diff``): the paper's formula, the official layout, the fast paths and the cache."""

import dataclasses
import math

import pytest
import torch
from conftest import TINY_MODEL, tiny_config
from torch.profiler import profile

from attnzoo import ModelConfig, Transformer
from attnzoo.attention.kernels import build, sdpa

VOCAB = TINY_MODEL["vocab_size"]
DIM, HEADS = 64, 4  # d = 64 / 4 / 2 = 8
KV_SETTINGS = [pytest.param(4, id="mha"), pytest.param(2, id="gqa2:1"), pytest.param(1, id="mqa")]
ALL_POSITIONS = ["none", "learned", "sinusoidal", "rope", "alibi"]


def make_model(n_kv_heads=HEADS, position="rope", n_layers=2, backend="auto", **options):
    # init_std 0.1 makes the maps far from uniform, so layout or masking errors change the outputs.
    cfg = tiny_config(
        dim=DIM,
        n_layers=n_layers,
        n_heads=HEADS,
        n_kv_heads=n_kv_heads,
        attention="diff",
        attention_options=options,
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
def reference_diff_attention(attn, x, position):
    """Eq. 1–3 written out per differential head from the official weight layout, in float64.

    Rows [2i·d, (2i+1)·d) of q_proj give Q1 of head i and rows [(2i+1)·d, (2i+2)·d) give Q2; kv head
    j = i // n_rep takes K1, K2 from the same stripes of k_proj and its 2d-wide V from rows [2j·d, 2(j+1)·d)
    of v_proj. Returns the layer output and the (B, H, T, T) maps A_i.
    """
    n_heads, n_kv_heads, d = attn.n_heads, attn.n_kv_heads, attn.head_dim
    x = x.double()
    w_q, w_k, w_v, w_o = (p.weight.double() for p in (attn.q_proj, attn.k_proj, attn.v_proj, attn.out_proj))
    lam_q1, lam_k1, lam_q2, lam_k2 = (
        p.double() for p in (attn.lambda_q1, attn.lambda_k1, attn.lambda_q2, attn.lambda_k2)
    )
    lam = math.exp(lam_q1 @ lam_k1) - math.exp(lam_q2 @ lam_k2) + attn.lambda_init
    gain = attn.subln.weight.double() if attn.subln.weight is not None else torch.ones(2 * d, dtype=torch.float64)
    seq_len = x.shape[1]
    positions = torch.arange(seq_len)
    distance = (positions[:, None] - positions[None, :]).double()
    slopes = [2.0 ** (-8 * (i + 1) / n_heads) for i in range(n_heads)]  # ALiBi, n_heads a power of two

    def softmax_map(q, k, head):
        if position == "rope":
            q, k = rope_half_split(q.float(), positions).double(), rope_half_split(k.float(), positions).double()
        logits = q @ k.transpose(-1, -2) / math.sqrt(d)
        if position == "alibi":
            logits = logits - slopes[head] * distance
        return logits.masked_fill(distance < 0, float("-inf")).softmax(dim=-1)

    outputs, maps = [], []
    for i in range(n_heads):
        j = i // (n_heads // n_kv_heads)
        q1, q2 = x @ w_q[2 * i * d : (2 * i + 1) * d].T, x @ w_q[(2 * i + 1) * d : (2 * i + 2) * d].T
        k1, k2 = x @ w_k[2 * j * d : (2 * j + 1) * d].T, x @ w_k[(2 * j + 1) * d : (2 * j + 2) * d].T
        v = x @ w_v[2 * j * d : 2 * (j + 1) * d].T
        a = softmax_map(q1, k1, i) - lam * softmax_map(q2, k2, i)
        o = a @ v
        o = o / torch.sqrt(o.pow(2).mean(dim=-1, keepdim=True) + 1e-5) * gain
        outputs.append(o * (1 - attn.lambda_init))
        maps.append(a)
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
def test_layer_matches_per_head_formula(position, n_kv_heads):
    """Eq. 1–3 with the striped layout; n_kv_heads < H checks the flash GQA pairing i → kv head i // n_rep."""
    model = make_model(n_kv_heads, position)
    attn = model.layers[1].self_attn  # depth 1: λ_init = 0.3555, so (1 − λ_init) is visible
    with torch.no_grad():
        attn.subln.weight.uniform_(0.5, 1.5)
    idx = torch.randint(0, VOCAB, (2, 12))
    for backend in ("eager", "sdpa"):
        x, out = run_layer(with_backend(model, backend), idx)
        expected, expected_maps = reference_diff_attention(attn, x, position)
        torch.testing.assert_close(out.double(), expected, atol=1e-5, rtol=0)
    maps = model.attention_maps(idx)[1]
    assert maps.shape == (2, HEADS, 12, 12)
    torch.testing.assert_close(maps.double(), expected_maps, atol=1e-6, rtol=0)


def test_subln_without_affine_weight():
    model = make_model(2, subln_affine=False)
    attn = model.layers[1].self_attn
    assert attn.subln.weight is None and "subln.weight" not in attn.state_dict()
    x, out = run_layer(model, torch.randint(0, VOCAB, (2, 12)))
    torch.testing.assert_close(out.double(), reference_diff_attention(attn, x, "rope")[0], atol=1e-5, rtol=0)


def test_lambda_init_table_and_fixed_option():
    model = make_model(n_layers=5)
    published = [0.2000, 0.3555, 0.4707, 0.5561, 0.6193]  # depth 0..4 (paper §2.1, official lambda_init_fn)
    assert [layer.self_attn.lambda_init for layer in model.layers] == pytest.approx(published, abs=5e-5)
    fixed = make_model(n_layers=3, lambda_init=0.5)
    assert [layer.self_attn.lambda_init for layer in fixed.layers] == [0.5, 0.5, 0.5]


def test_lambda_vectors_init_and_fp32_lambda():
    cfg = ModelConfig(vocab_size=VOCAB, dim=256, n_layers=1, n_heads=2, attention="diff")  # d = 64
    attn = Transformer(cfg).layers[0].self_attn
    vectors = torch.cat([attn.lambda_q1, attn.lambda_k1, attn.lambda_q2, attn.lambda_k2]).detach()
    assert vectors.shape == (4 * 64,)
    assert abs(vectors.mean().item()) < 0.02 and 0.085 < vectors.std().item() < 0.115  # N(0, 0.1), not init_std
    attn.to(torch.bfloat16)
    lam = attn.lambda_full()
    q1, k1, q2, k2 = (p.detach().double() for p in (attn.lambda_q1, attn.lambda_k1, attn.lambda_q2, attn.lambda_k2))
    assert lam.dtype == torch.float32
    assert lam.item() == pytest.approx(math.exp(q1 @ k1) - math.exp(q2 @ k2) + 0.2, abs=1e-6)


@pytest.mark.parametrize("pad_queries", [True, False], ids=["padded-queries", "wide-values"])
@pytest.mark.parametrize("n_kv_heads", [4, 2])
@pytest.mark.parametrize("position", ["none", "rope", "alibi"])
def test_sdpa_call_patterns_match_eager(monkeypatch, position, n_kv_heads, pad_queries):
    """Both SDPA call patterns equal the eager maps (fp32, ≤ 1e-5), fresh (is_causal) and on a cache (mask)."""
    monkeypatch.setattr(sdpa, "sdpa_pads_queries", lambda device: pad_queries)
    eager = make_model(n_kv_heads, position, backend="eager")
    fast = with_backend(eager, "sdpa")
    idx = torch.randint(0, VOCAB, (2, 12))
    with torch.no_grad():
        torch.testing.assert_close(fast(idx), eager(idx), atol=1e-5, rtol=0)
        caches = [m.new_cache(2, 12) for m in (eager, fast)]
        chunks = [[m(idx[:, :7], cache=c), m(idx[:, 7:], cache=c)] for m, c in zip((eager, fast), caches, strict=True)]
    torch.testing.assert_close(chunks[1][1], chunks[0][1], atol=1e-5, rtol=0)


@pytest.mark.parametrize("backend", ["auto", "sdpa"], ids=["diff-kernel", "two-sdpa-calls"])
def test_cpu_fast_path_never_builds_the_map(backend):
    """A fresh sequence on the CPU runs the fused diff kernel (tests/test_diff_flash.py), and the PyTorch path it falls
    back to runs SDPA's flash kernel: neither hits SDPA's math fallback (which would build the T×T map)."""
    fused_kernel = backend == "auto" and build.available()
    model = make_model(2, backend=backend)
    with torch.no_grad(), profile() as prof:
        model(torch.randint(0, VOCAB, (1, 32)))
    ops = {event.name for event in prof.events()}
    expected = "attnzoo::diff_flash_forward" if fused_kernel else "aten::_scaled_dot_product_flash_attention_for_cpu"
    assert expected in ops, sorted(ops)
    assert "aten::_scaled_dot_product_attention_math" not in ops


@pytest.mark.parametrize("n_kv_heads", KV_SETTINGS)
@pytest.mark.parametrize("position", ALL_POSITIONS)
def test_cached_decoding_matches_full_forward(position, n_kv_heads):
    model = make_model(n_kv_heads, position)
    idx = torch.randint(0, VOCAB, (2, 12))
    with torch.no_grad():
        full = model(idx)
        cache = model.new_cache(2, 12)
        stepwise = torch.cat(
            [model(idx[:, :6], cache=cache)] + [model(idx[:, t : t + 1], cache=cache) for t in range(6, 12)], dim=1
        )
        cache = model.new_cache(2, 12)
        chunked = torch.cat(
            [model(idx[:, :5], cache=cache), model(idx[:, 5:9], cache=cache), model(idx[:, 9:], cache=cache)], dim=1
        )
    torch.testing.assert_close(stepwise, full, atol=1e-5, rtol=0)
    torch.testing.assert_close(chunked, full, atol=1e-5, rtol=0)


@pytest.mark.parametrize("subln_affine", [True, False])
def test_parameter_count_matches_mha_with_twice_the_heads(subln_affine):
    diff_model = make_model(2, subln_affine=subln_affine)
    cfg = dataclasses.replace(
        diff_model.config, attention="mha", attention_options={}, n_heads=8, n_kv_heads=4, head_dim=None
    )
    d = DIM // HEADS // 2
    extra_per_layer = 4 * d + (2 * d if subln_affine else 0)  # λ_q1, λ_k1, λ_q2, λ_k2 and subln's weight
    assert diff_model.num_parameters() - Transformer(cfg).num_parameters() == 2 * extra_per_layer


def test_official_state_dict_loads_strictly():
    """A state dict in the official MultiheadFlashDiff1 layout (E = 64, H = 4, H_kv = 2) loads as it is."""
    embed_dim, n_rep, d = DIM, 2, DIM // HEADS // 2
    official = {
        "q_proj.weight": torch.randn(embed_dim, embed_dim),
        "k_proj.weight": torch.randn(embed_dim // n_rep, embed_dim),
        "v_proj.weight": torch.randn(embed_dim // n_rep, embed_dim),
        "out_proj.weight": torch.randn(embed_dim, embed_dim),
        "lambda_q1": torch.randn(d),
        "lambda_k1": torch.randn(d),
        "lambda_q2": torch.randn(d),
        "lambda_k2": torch.randn(d),
        "subln.weight": torch.randn(2 * d),
    }
    attn = make_model(HEADS // n_rep).layers[0].self_attn
    assert sorted(attn.state_dict()) == sorted(official)
    attn.load_state_dict(official, strict=True)
    for name, value in attn.state_dict().items():
        assert torch.equal(value, official[name]), name


def test_bfloat16_forward_with_cache():
    model = make_model(2)
    idx = torch.randint(0, VOCAB, (2, 12))
    with torch.no_grad():
        reference = model(idx)
        model.to(torch.bfloat16)
        cache = model.new_cache(2, 12)
        logits = torch.cat([model(idx[:, :8], cache=cache), model(idx[:, 8:], cache=cache)], dim=1)
    assert logits.dtype == torch.bfloat16
    assert (logits.float() - reference).abs().max() < 0.05 * reference.abs().max()  # bf16 has 8 mantissa bits


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (dict(dim=36), "head_dim=9 is invalid: must be even"),
        (dict(attention_options={"lambda_init": 1.0}), "lambda_init=1.0 is invalid"),
        (dict(attention_options={"lambda_init": True}), "lambda_init=True is invalid"),
        (dict(attention_options={"subln_affine": "yes"}), "subln_affine='yes' is invalid"),
    ],
)
def test_refuses_invalid_configs(overrides, message):
    with pytest.raises(ValueError, match=message):
        ModelConfig(**{"dim": DIM, "n_heads": HEADS, "attention": "diff", **overrides})
