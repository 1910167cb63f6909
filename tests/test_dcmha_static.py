"""DCMHA's static-only composition (``static_only``): the paper's branch 1, Talking-Heads Attention.

The layer's output is held to Talking-Heads Attention written here from its equations (Shazeer et al., 2020, with
DCFormer's identity residual): logits A = QKᵀ/√d, A'[m] = Σ_n A[n]·(I + W_pre)[n, m] before the softmax and
P'[m] = Σ_n P[n]·(I + W_post)[n, m] after it, within each head group. The reference runs in float64; the layer
runs in float64 (to 1e-10) and in fp32, where every kernel is held to 2e-5 of the largest entry, the bound the
fused kernels' own tests hold them to against a float64 reference (fp32 rounding of composed scores,
tests/test_dcmha_fused.py).
"""

import dataclasses
import math

import pytest
import torch
import torch.nn.functional as F
from conftest import TINY_MODEL, tiny_config

from attnzoo import ModelConfig, Transformer
from attnzoo.attention.kernels import build, dcmha_fused
from attnzoo.attention.kernels.dcmha_triton import static_reasons as triton_static_reasons
from attnzoo.claims import CLAIMS
from attnzoo.claims.dcformer import STATIC_ONLY
from attnzoo.nn import SelfAttention
from attnzoo.variants import Variant, count_parameters, variant_config

FP32_BOUND = 2e-5  # of the reference's largest entry
FP64_BOUND = 1e-10
VOCAB = TINY_MODEL["vocab_size"]
needs_fused = pytest.mark.skipif(not build.available(), reason="the fused CPU kernels cannot be built here")
BACKENDS = ["eager", "chunked", pytest.param("auto", marks=needs_fused, id="dcmha-fused")]
CASES = {
    "global": dict(window_type="G", n_kv_heads=4),
    "local-grouped-gqa": dict(window_type="L", num_groups=2, n_kv_heads=2),
    "local-pre-only": dict(window_type="L", post_compose=False, n_kv_heads=1),
    "global-post-only": dict(window_type="G", pre_compose=False, n_kv_heads=2),
}


def static_layer(backend="auto", *, n_kv_heads=4, dtype=torch.float32, **options) -> SelfAttention:
    """A 32-wide layer of 4 heads without positions, local layers seeing 5 keys, W_b large enough to matter."""
    options = {"window_size": 5, "q_chunk_size": 4, **options}
    layer = SelfAttention(
        "dcmha", 32, 4, n_kv_heads=n_kv_heads, position="none", attn_backend=backend, static_only=True, **options
    )
    with torch.no_grad():
        layer.mechanism.static_w.normal_(std=0.5)
    return layer.to(dtype)


def talking_heads(x: torch.Tensor, layer: SelfAttention) -> torch.Tensor:
    """Talking-Heads Attention with the layer's weights, every sum over heads an explicit einsum."""
    attn, opts = layer.mechanism, layer.config.attention_opts
    batch, length, _ = x.shape
    n_heads, n_kv_heads, head_dim = attn.n_heads, attn.n_kv_heads, attn.head_dim
    q = F.linear(x, attn.q_proj.weight).view(batch, length, n_heads, head_dim)
    k, v = (F.linear(x, w).view(batch, length, n_kv_heads, head_dim) for w in (attn.k_proj.weight, attn.v_proj.weight))
    k, v = (t.repeat_interleave(n_heads // n_kv_heads, dim=2) for t in (k, v))  # query head h reads kv h·H_kv/H
    # (N, N) mixing [input head, output head]: block-diagonal over the groups, I + W_b within each.
    eye = torch.eye(n_heads // opts.num_groups, dtype=x.dtype)
    pre, post = (torch.block_diag(*(eye + w for w in attn.static_w[c])) for c in (0, 1))
    logits = torch.einsum("btnd,bsnd->bnts", q, k) / math.sqrt(head_dim)
    if opts.pre_compose:
        logits = torch.einsum("bnts,nm->bmts", logits, pre)
    t, s = torch.arange(length)[:, None], torch.arange(length)[None, :]
    window = attn.window or length
    visible = (s <= t) & (t - s < window)
    probs = torch.softmax(logits.masked_fill(~visible, -math.inf), dim=-1)
    if opts.post_compose:
        probs = torch.einsum("bnts,nm->bmts", probs, post)
    out = torch.einsum("bnts,bsnd->btnd", probs, v).reshape(batch, length, n_heads * head_dim)
    return F.linear(out, attn.o_proj.weight)


def largest(t: torch.Tensor) -> float:
    return t.abs().max().item()


# ---------------------------------------------------------------------------------------------------
# The forward pass and its gradients


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("backend", ["eager", "chunked"])
def test_float64_forward_equals_talking_heads(case, backend):
    layer = static_layer(backend, dtype=torch.float64, **CASES[case])
    x = torch.randn(2, 13, 32, dtype=torch.float64)
    torch.testing.assert_close(layer(x), talking_heads(x, layer), rtol=0, atol=FP64_BOUND)


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("backend", BACKENDS)
def test_fp32_forward_equals_talking_heads_on_every_kernel(case, backend, monkeypatch):
    """13 tokens: windows of 5 wrap, q_chunk_size 4 leaves a partial block. ``auto`` on the CPU is dcmha-fused."""
    calls = []
    fused = dcmha_fused.dcmha_attention
    monkeypatch.setattr(dcmha_fused, "dcmha_attention", lambda *a, **k: calls.append(1) or fused(*a, **k))
    layer = static_layer(backend, **CASES[case])
    x = torch.randn(2, 13, 32)
    with torch.no_grad():
        got = layer(x)
        want = talking_heads(x.double(), layer.double())
    assert len(calls) == (backend == "auto")
    torch.testing.assert_close(got.double(), want, rtol=0, atol=FP32_BOUND * largest(want))


def test_the_reference_comparison_can_fail():
    """W_b moves the output well past the bound: the comparison sees the static composition."""
    layer = static_layer(dtype=torch.float64, **CASES["global"])
    x = torch.randn(2, 13, 32, dtype=torch.float64)
    want = talking_heads(x, layer)
    with torch.no_grad():
        layer.mechanism.static_w[1, 0, 0, 1] += 0.1
    assert largest(layer(x) - want) > 100 * FP32_BOUND * largest(want)


@pytest.mark.parametrize("case", CASES)
def test_float64_gradients_equal_talking_heads(case):
    """The eager reference's gradients (x and every parameter, W_b included) against autograd through the einsums."""
    layer = static_layer("eager", dtype=torch.float64, **CASES[case])
    x = torch.randn(2, 11, 32, dtype=torch.float64, requires_grad=True)
    upstream = torch.randn(2, 11, 32, dtype=torch.float64)
    leaves = [x, *layer.parameters()]
    got = torch.autograd.grad(layer(x), leaves, upstream)
    want = torch.autograd.grad(talking_heads(x, layer), leaves, upstream)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=0, atol=FP64_BOUND * max(largest(w), 1.0))


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("backend", BACKENDS[1:])
def test_every_kernels_gradients_equal_the_eager_references(case, backend, monkeypatch):
    """fp32, each gradient (x, q/k/v/o_proj, W_b) within 1e-4 of its largest entry: W_b's sums over every (t, s)."""
    calls = []
    fused = dcmha_fused.dcmha_attention
    monkeypatch.setattr(dcmha_fused, "dcmha_attention", lambda *a, **k: calls.append(1) or fused(*a, **k))
    eager = static_layer("eager", **CASES[case])
    layer = static_layer(backend, **CASES[case])
    layer.load_state_dict(eager.state_dict())
    x = torch.randn(2, 13, 32)
    upstream = torch.randn(2, 13, 32)
    grads = []
    for model in (layer, eager):
        leaf = x.clone().requires_grad_()
        grads.append(torch.autograd.grad(model(leaf), [leaf, *model.parameters()], upstream))
    assert len(calls) == (backend == "auto")
    names = ["x", *(name for name, _ in layer.named_parameters())]
    for name, got, want in zip(names, *grads, strict=True):
        assert largest(got - want) <= 1e-4 * largest(want), name


@pytest.mark.slow
def test_the_compiled_composition_equals_the_eager_reference():
    """``compile_composition`` on the chunked path (inductor compiles it, tens of seconds): output and every gradient
    within 1e-5 of each largest entry (fp32; measured 7e-7)."""
    import torch._dynamo

    eager = static_layer("eager", **CASES["local-grouped-gqa"])
    compiled = static_layer("chunked", compile_composition=True, **CASES["local-grouped-gqa"])
    compiled.load_state_dict(eager.state_dict())
    x, upstream = torch.randn(2, 13, 32), torch.randn(2, 13, 32)
    results = []
    try:
        for layer in (compiled, eager):
            leaf = x.clone().requires_grad_()
            out = layer(leaf)
            results.append([out.detach(), *torch.autograd.grad(out, [leaf, *layer.parameters()], upstream)])
    finally:
        torch._dynamo.reset()
    for got, want in zip(*results, strict=True):
        assert largest(got - want) <= 1e-5 * largest(want)


# ---------------------------------------------------------------------------------------------------
# Cached decoding


def static_model(backend="auto", position="rope", **options) -> Transformer:
    """Two layers: 0 local (a ring of 5), 1 global; W_b large enough to matter."""
    options = {"window_type": "LG", "window_size": 5, "q_chunk_size": 4, "static_only": True, **options}
    cfg = tiny_config(n_kv_heads=2, max_seq_len=48, position=position, attention="dcmha", attention_options=options,
                      attn_backend=backend)  # fmt: skip
    model = Transformer(cfg).eval()
    with torch.no_grad():
        for block in model.layers:
            block.self_attn.static_w.normal_(std=0.5)
    return model


@pytest.mark.parametrize("options", [{}, {"num_groups": 2}, {"pre_compose": False}], ids=["both", "grouped", "post"])
@pytest.mark.parametrize("backend", ["chunked", pytest.param("auto", marks=needs_fused, id="dcmha-kernels")])
def test_cached_decoding_equals_the_full_forward(backend, options, monkeypatch):
    """A prefill, a chunk that continues the cache past the ring, then single tokens (``auto``: the fused prefill and
    the dcmha-decode step on the CPU), 20 tokens through a window of 5; fp32, 1e-5 as tests/test_dcmha.py."""
    steps = []
    decode = dcmha_fused.decode_attention
    monkeypatch.setattr(dcmha_fused, "decode_attention", lambda *a, **k: steps.append(1) or decode(*a, **k))
    model = static_model(backend, **options)
    idx = torch.randint(0, VOCAB, (2, 20))
    cache = model.new_cache(2, 24)
    assert all(set(layer.buffers) == {"k", "v"} for layer in cache.layers)  # no key-side matrices to keep
    with torch.no_grad():
        full = model(idx)
        outs = [model(idx[:, :3], cache=cache), model(idx[:, 3:9], cache=cache)]
        outs += [model(idx[:, t : t + 1], cache=cache) for t in range(9, 20)]
    assert len(steps) == (2 * 11 if backend == "auto" else 0)
    torch.testing.assert_close(torch.cat(outs, dim=1), full, atol=1e-5, rtol=0)


@pytest.mark.parametrize("position", ["rope", "alibi"])
def test_static_step_decoding_equals_the_full_forward(position):
    """A cache made with ``static=True`` (every step attends over the whole buffers, the mask by position), the local
    layer's ring wrapping; fp32, 1e-5."""
    model = static_model(position=position)
    idx = torch.randint(0, VOCAB, (2, 17))
    cache = model.new_cache(2, 20, static=True)
    with torch.no_grad():
        outs = [model(idx[:, :4], cache=cache)] + [model(idx[:, t : t + 1], cache=cache) for t in range(4, 17)]
        full = model(idx)
    torch.testing.assert_close(torch.cat(outs, dim=1), full, atol=1e-5, rtol=0)


# ---------------------------------------------------------------------------------------------------
# Parameters, the identity start, the options


def test_the_layer_has_w_b_alone_in_the_official_layout():
    """W_b keeps static_proj's name and (2, G, M, M) shape; no dynamic-weight projection is allocated."""
    model = static_model(num_groups=2)
    attn = model.layers[0].self_attn
    assert attn.dyn_w_proj is None
    assert {name for name, _ in attn.named_parameters()} == {"static_w", *(f"{p}_proj.weight" for p in "qkvo")}
    assert attn.static_w.shape == (2, 2, 2, 2)
    mha = Transformer(dataclasses.replace(model.config, attention="mha", attention_options={}))
    assert model.num_parameters() - mha.num_parameters() == 2 * 2 * (2 * 2) * 2  # layers · C · G·M²
    with_proj = dataclasses.replace(model.config, attention_options={"num_groups": 2, "static_proj": True})
    assert Transformer(with_proj).layers[0].self_attn.static_w.shape == attn.static_w.shape


def test_the_init_draws_w_b_as_the_official_jax_code():
    """N(0, √(2/(M+M))·0.1) as static_proj's W_b: 2·8·8 = 128 samples per layer, std within 25%."""
    layer = SelfAttention("dcmha", 64, 8, static_only=True)
    assert abs(layer.mechanism.static_w.std().item() / (math.sqrt(1 / 8) * 0.1) - 1) < 0.25


def test_from_an_mha_checkpoint_the_identity_start_computes_mha():
    """W_b = 0 (the only added parameter) makes I + W_b = I: the layer computes MHA's function (fp32, 1e-5)."""
    model = static_model(window_type="G")
    mha = Transformer(dataclasses.replace(model.config, attention="mha", attention_options={})).eval()
    missing, unexpected = model.load_state_dict(mha.state_dict(), strict=False)
    assert not unexpected and {name.split(".")[-1] for name in missing} == {"static_w"}
    with torch.no_grad():
        for block in model.layers:
            assert block.self_attn.init_added_parameters_as_identity({"static_w"}, mha.config) == []
            assert not block.self_attn.static_w.any()
    idx = torch.randint(0, VOCAB, (2, 20))
    torch.testing.assert_close(model(idx), mha(idx), atol=1e-5, rtol=0)


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"query_wise": True}, "query_wise=True is invalid: must be false with static_only"),
        ({"static_proj": True}, "static_proj=True is invalid: must be false with static_only"),
        ({"rank": 4}, r"rank=4 is invalid: must stay 2 \(the default\) with static_only"),
        ({"dynamic_w_hidden_dim": 8}, "dynamic_w_hidden_dim=8 is invalid: must be null with static_only"),
        ({"pre_compose": False, "post_compose": False}, r"pre_compose, post_compose=\(False, False\) is invalid"),
        ({"static_only": 1}, "static_only=1 is invalid: must be true or false"),
    ],
)
def test_options_that_contradict_static_only_are_refused(options, field):
    with pytest.raises(ValueError, match=field):
        ModelConfig(n_heads=4, dim=32, attention="dcmha", attention_options={"static_only": True, **options})
    with pytest.raises(ValueError, match=field):
        SelfAttention("dcmha", 32, 4, **{"static_only": True, **options})


def test_the_kernels_that_cannot_compute_it_say_why():
    """The Triton kernel forms its matrices from the dynamic weights: its record refuses; the fused step weights
    have no projection to run, and the PyTorch path forms I + W_b."""
    cfg = static_model().config
    assert "static_only composes with the static matrix W_b alone" in " ".join(triton_static_reasons(cfg))
    assert dcmha_fused.DCMHA_STEP_WEIGHTS.static_refusal(cfg).startswith("static_only")
    assert [kernel.name for kernel in static_model().layers[0].self_attn.weight_kernels] == ["dcmha-weights"]


# ---------------------------------------------------------------------------------------------------
# The layer outside the model, the variant, the claim


def test_an_nn_layer_equals_the_models_layer():
    """``SelfAttention("dcmha", 64, 4, static_only=True)``, weights loaded into a model's layer 1 (global): the same
    output bit for bit, as tests/test_nn.py holds every mechanism."""
    layer = SelfAttention("dcmha", 64, 4, static_only=True, layer_idx=1, n_layers=2, max_seq_len=32)
    cfg = ModelConfig(vocab_size=32, dim=64, n_layers=2, n_heads=4, max_seq_len=32, attention="dcmha",
                      attention_options={"static_only": True})  # fmt: skip
    model = Transformer(cfg)
    model.layers[1].self_attn.load_state_dict(layer.mechanism.state_dict())
    seen = {}
    handle = model.layers[1].self_attn.register_forward_hook(lambda m, args, out: seen.update(x=args[0], out=out))
    model(torch.randint(0, 32, (2, 12)))
    handle.remove()
    assert torch.equal(layer(seen["x"]), seen["out"])
    assert torch.equal(SelfAttention.from_transformer(model, 1)(seen["x"]), seen["out"])


def test_the_variant_parses_builds_and_its_claim_runs():
    variant = Variant.parse(STATIC_ONLY)
    assert variant.options == (("static_only", True),)
    baseline = tiny_config(max_seq_len=48)
    cfg = variant_config(variant, baseline)
    assert cfg.attention == "dcmha" and cfg.attention_opts.static_only
    assert Transformer(cfg).layers[0].self_attn.dyn_w_proj is None
    dynamic = variant_config(Variant.parse("dcmha+rope"), baseline)
    assert count_parameters(cfg) < count_parameters(dynamic)
    claim = CLAIMS["dcmha.dynamic_beats_static"]
    assert claim.baseline == STATIC_ONLY and claim.is_run
