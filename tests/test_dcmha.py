"""DCMHA (DCFormer): composition math, the three computation paths, windows, the cache, options.

All comparisons are in fp32; the tolerance of each is stated where it is asserted.
"""

import dataclasses
import math
from functools import cache

import pytest
import torch
from conftest import TINY_MODEL, tiny_config
from torch.utils._python_dispatch import TorchDispatchMode

from attnzoo import ModelConfig, Transformer
from attnzoo.attention.dcmha import (
    POST_K,
    POST_Q,
    PRE_K,
    PRE_Q,
    DynamicWeightProjection,
    Mixing,
    compose_low_rank,
    compose_merged,
    key_matrices,
    query_matrices,
)
from attnzoo.attention.kernels import build, dcmha_compiled
from attnzoo.attention.kernels.dcmha_compiled import compiled_compose, compose_sum

POSITIONS = ["none", "learned", "sinusoidal", "rope", "alibi"]
KV_HEADS = {"mha": 4, "gqa": 2, "mqa": 1}
VOCAB = TINY_MODEL["vocab_size"]


def make_model(position="rope", n_kv_heads=4, backend="auto", n_layers=2, strong=True, **options) -> Transformer:
    """A tiny DCMHA model whose dynamic weights are large enough that composition changes the output."""
    options = {"window_size": 5, "q_chunk_size": 4, **options}
    cfg = tiny_config(
        n_layers=n_layers,
        n_kv_heads=n_kv_heads,
        max_seq_len=128,
        attention="dcmha",
        attention_options=options,
        position=position,
        attn_backend=backend,
    )
    model = Transformer(cfg).eval()
    if strong:
        with torch.no_grad():
            for name, param in model.named_parameters():
                if "dyn_w_proj" in name or "static_w" in name:
                    param.normal_(std=0.5)
    return model


def with_backend(model: Transformer, backend: str) -> Transformer:
    twin = Transformer(dataclasses.replace(model.config, attn_backend=backend)).eval()
    twin.load_state_dict(model.state_dict())
    return twin


def tokens(batch=2, length=20):
    return torch.randint(0, VOCAB, (batch, length))


# ---------------------------------------------------------------------------------------------------
# The composition itself


def random_mixing(batch, groups, heads_per_group, query_len, key_len, rank=2, key_wise=True) -> Mixing:
    def w(length):
        return torch.randn(batch, groups, length, rank, heads_per_group)

    def dd(length):
        return torch.randn(batch, groups, length, heads_per_group)

    key_side = (w(key_len), w(key_len), dd(key_len)) if key_wise else (None, None, None)
    return Mixing(w(query_len), w(query_len), dd(query_len), *key_side)


def explicit_composition(scores, mixing: Mixing, static_w=None):
    """A'[:, t, s] = Wᵀ·A[:, t, s] with W = I + W_b + QW_t + KW_s, one N×N matrix per (b, t, s).

    Each group's M×M matrix is built from the factors and placed on the diagonal of W, so heads of
    different groups never mix.
    """
    batch, n_heads, query_len, key_len = scores.shape
    groups = mixing.qw1.shape[1]
    out = torch.empty_like(scores)
    for b in range(batch):
        for t in range(query_len):
            for s in range(key_len):
                blocks = []
                for g in range(groups):
                    block = mixing.qw1[b, g, t].T @ mixing.qw2[b, g, t] + torch.diag(mixing.qdd[b, g, t])
                    if mixing.kw1 is not None:
                        block = block + mixing.kw1[b, g, s].T @ mixing.kw2[b, g, s] + torch.diag(mixing.kdd[b, g, s])
                    if static_w is not None:
                        block = block + static_w[g]
                    blocks.append(block)
                matrix = torch.eye(n_heads) + torch.block_diag(*blocks)
                out[b, :, t, s] = matrix.T @ scores[b, :, t, s]
    return out


@pytest.mark.parametrize("groups", [1, 2])
@pytest.mark.parametrize("key_wise", [True, False])
@pytest.mark.parametrize("static", [False, True])
def test_low_rank_and_merged_equal_explicit_matrix_form(groups, key_wise, static):
    batch, n_heads, query_len, key_len = 2, 4, 5, 6
    heads_per_group = n_heads // groups
    scores = torch.randn(batch, n_heads, query_len, key_len)
    mixing = random_mixing(batch, groups, heads_per_group, query_len, key_len, key_wise=key_wise)
    static_w = torch.randn(groups, heads_per_group, heads_per_group) if static else None
    expected = explicit_composition(scores, mixing, static_w)

    low_rank = compose_low_rank(scores, mixing, static_w)
    key_w = key_matrices(mixing) if key_wise else None
    merged = compose_merged(scores, query_matrices(mixing, static_w), key_w)
    # Sums of a few dozen O(1) products in fp32.
    torch.testing.assert_close(low_rank, expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(merged, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("groups", [1, 2])
@pytest.mark.parametrize("key_wise", [True, False])
def test_compiled_composition_form_and_its_backward_equal_merged(groups, key_wise, monkeypatch):
    """The sum form and the hand-written backward of the compiled composition, run eagerly (compiling nothing):
    float64 ``gradcheck`` of the Function, and its value against ``compose_merged``."""
    monkeypatch.setattr(dcmha_compiled, "_compiled", lambda function: function)
    batch, n_heads, query_len, key_len = 2, 4, 5, 6
    mixing = random_mixing(batch, groups, n_heads // groups, query_len, key_len, key_wise=key_wise)
    inputs = [torch.randn(batch, n_heads, query_len, key_len), query_matrices(mixing, None)]
    inputs.append(key_matrices(mixing) if key_wise else None)
    inputs = [None if x is None else x.double().requires_grad_() for x in inputs]
    assert torch.autograd.gradcheck(compiled_compose, inputs)
    torch.testing.assert_close(compose_sum(*inputs), compose_merged(*inputs), atol=1e-12, rtol=1e-12)


def test_single_query_merged_form_equals_explicit():
    """One decoding step takes its own branch (W[s] = QW + KW[s] as one broadcast multiply-sum)."""
    scores = torch.randn(3, 4, 1, 7)
    mixing = random_mixing(3, 2, 2, 1, 7)
    merged = compose_merged(scores, query_matrices(mixing, None), key_matrices(mixing))
    torch.testing.assert_close(merged, explicit_composition(scores, mixing), atol=1e-5, rtol=1e-5)


def test_grouped_composition_keeps_groups_apart():
    """With G = 2, output heads of group 1 do not depend on the scores of group 0's heads."""
    scores = torch.randn(1, 4, 3, 5, requires_grad=True)
    mixing = random_mixing(1, 2, 2, 3, 5)
    out = compose_merged(scores, query_matrices(mixing, None), key_matrices(mixing))
    (grad,) = torch.autograd.grad(out[:, 2:].sum(), scores)
    assert grad[:, :2].abs().max() == 0
    assert grad[:, 2:].abs().min() > 0


def test_zero_dynamic_weights_are_identity():
    scores = torch.randn(2, 4, 3, 5)
    zeros = Mixing(*(torch.zeros_like(w) for w in random_mixing(2, 1, 4, 3, 5)))
    # rms_norm of an all-zero w1 stays zero, so the identity residual is all that is left: exactly A.
    assert torch.equal(compose_merged(scores, query_matrices(zeros, None), key_matrices(zeros)), scores)


# ---------------------------------------------------------------------------------------------------
# The model: reference, training path and cache agree


@pytest.mark.parametrize("position", ["rope", "alibi"])
def test_all_dynamic_weights_zero_is_exactly_mha(position):
    dcmha = make_model(position, window_type="G", q_chunk_size=8, strong=False)
    with torch.no_grad():
        for param in dcmha.parameters():
            if param.dim() >= 3:  # dw1, qkw, dd: the only ≥3-D parameters
                param.zero_()
    mha = Transformer(dataclasses.replace(dcmha.config, attention="mha", attention_options={})).eval()
    mha.load_state_dict(dcmha.state_dict(), strict=False)
    idx = tokens(length=20)
    # Same projections and attention; the two differ only in summation order (fp32 rounding).
    torch.testing.assert_close(dcmha(idx), mha(idx), atol=1e-5, rtol=0)
    torch.testing.assert_close(with_backend(dcmha, "eager")(idx), mha(idx), atol=1e-5, rtol=0)

    strong = make_model(position, window_type="G", q_chunk_size=8)
    mha.load_state_dict(strong.state_dict(), strict=False)
    assert (strong(idx) - mha(idx)).abs().max() > 1e-2  # the check above is not vacuous


VARIANTS = {
    "default": {},
    "pre_only": {"post_compose": False},
    "post_only": {"pre_compose": False},
    "query_wise": {"query_wise": True},
    "grouped_static_qknorm": {"num_groups": 2, "static_proj": True, "qk_norm": True},
    "no_compose": {"pre_compose": False, "post_compose": False},
}


@pytest.fixture(params=["chunked", "dcmha-fused"])
def training_path(request) -> str:
    """The CPU training path under test, as the attn_backend that pins it: the chunked PyTorch composition, or the
    fused C++ kernel (skipped where it cannot be built here)."""
    if request.param == "dcmha-fused" and not build.available():
        pytest.skip(f"the fused CPU kernels cannot be built here: {build.status()}")
    return request.param


@pytest.mark.parametrize("variant", VARIANTS)
def test_training_path_equals_eager_reference(variant, training_path):
    """The chunked path recomputes each block in the backward pass (``RecomputedBlock``), the fused kernel each tile;
    local and global layers, GQA (2 kv heads), ALiBi."""
    model = make_model("alibi", n_kv_heads=2, window_type="LG", backend=training_path, **VARIANTS[variant])
    model.train()  # dropout is 0; train mode exercises the same path the trainer runs
    eager = with_backend(model, "eager").train()
    idx, targets = tokens(length=22), tokens(length=22)  # 22 = 5 chunks of 4 + a partial one
    logits, loss = model(idx, targets)
    ref_logits, ref_loss = eager(idx, targets)
    torch.testing.assert_close(logits, ref_logits, atol=1e-5, rtol=0)
    loss.backward()
    ref_loss.backward()
    for (name, param), ref_param in zip(model.named_parameters(), eager.parameters(), strict=True):
        if param.grad is None:
            assert ref_param.grad is None, name
            continue
        # Gradients of the training paths equal the reference's to fp32 rounding, which the strong random
        # composition amplifies: 1e-4 of the largest gradient entry.
        assert (param.grad - ref_param.grad).abs().max() <= 1e-4 * ref_param.grad.abs().max(), name


def test_chunked_path_never_builds_full_score_tensor():

    class RecordShapes(TorchDispatchMode):
        """Shapes of every op's outputs, and of the scores each softmax normalises."""

        def __init__(self):
            super().__init__()
            self.outputs, self.softmax = [], []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if func is torch.ops.aten._softmax.default:
                self.softmax.append(tuple(args[0].shape))
            for tensor in out if isinstance(out, (tuple, list)) else (out,):
                if isinstance(tensor, torch.Tensor):
                    self.outputs.append(tuple(tensor.shape))
            return out

    def long_axes(shape):
        return sum(size >= length for size in shape)

    length, chunk, window = 128, 8, 5  # length exceeds every feature size (vocab 61, MLP 96, dw1 64)
    idx = tokens(1, length)
    for window_type, keys in (("G", length), ("L", chunk + window - 1)):
        model = make_model(window_type=window_type, q_chunk_size=chunk, window_size=window, backend="chunked")
        with torch.no_grad(), RecordShapes() as fast:
            model(idx)
        with torch.no_grad(), RecordShapes() as eager:
            with_backend(model, "eager")(idx)
        assert max(map(long_axes, eager.outputs)) == 2  # the reference builds (B, N, T, T): the check can fail
        assert max(map(long_axes, fast.outputs)) == 1  # nothing is T×T, composition temporaries included
        # Each block's scores are (B, N, chunk, keys in reach): O(T·chunk), and O(chunk·window) when local.
        assert all(shape[-2] <= chunk and shape[-1] <= keys for shape in fast.softmax)


def saved_for_backward_bytes(model: Transformer, length: int) -> int:
    """Bytes of the distinct storages autograd keeps for the backward pass of one training forward."""
    storages: dict[int, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storages[tensor.untyped_storage().data_ptr()] = tensor.untyped_storage().nbytes()
        return tensor

    idx = tokens(2, length)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        model(idx, idx)
    return sum(storages.values())


def test_training_path_keeps_memory_linear_in_length(training_path):
    """Autograd keeps no block's scores: what it saves doubles with T (projections, dynamic weights, outputs),
    where the eager reference's (B, N, T, T) scores make it grow much faster. Global layers, 8-query blocks."""
    model = make_model(window_type="G", q_chunk_size=8, n_layers=1, backend=training_path).train()
    eager = with_backend(model, "eager").train()
    growth = saved_for_backward_bytes(model, 128) / saved_for_backward_bytes(model, 64)
    eager_growth = saved_for_backward_bytes(eager, 128) / saved_for_backward_bytes(eager, 64)
    assert growth < 2.1  # measured 1.87: linear, plus a constant (parameters)
    assert eager_growth > 2.5  # measured 2.9 (and the chunked path without recomputation 2.85)


def test_compiled_composition_compiles_once_for_every_block_and_length(monkeypatch):
    """Blocks of every query and key length share one graph for the composition and one for its weight gradients,
    at any sequence length; a block of one query compiles both once more (dynamo specialises axes of size 1).
    Counted with dynamo's counting backend, which compiles nothing, so the test is fast; the inductor path's
    numerics are checked by the slow test below."""
    from torch._dynamo.testing import CompileCounter

    counter = CompileCounter()
    monkeypatch.setattr(dcmha_compiled, "_compiled", cache(lambda function: torch.compile(function, backend=counter)))
    torch._dynamo.reset()
    try:
        model = make_model(window_type="LG", compile_composition=True).train()
        for length in (22, 31, 40):  # blocks of 4 queries, then a last block of 2, 3 and 4
            model(tokens(length=length), tokens(length=length))[1].backward()
        assert counter.frame_count == 2
        model(tokens(length=21), tokens(length=21))[1].backward()  # a last block of one query
        assert counter.frame_count == 4
    finally:
        torch._dynamo.reset()


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["default", "query_wise", "grouped_static_qknorm"])
def test_compiled_composition_equals_eager_reference(variant):
    """The inductor-compiled composition against the eager reference (eager backend, composition not compiled),
    output and every gradient, as the plain training path is checked above; then the same model at another length
    reuses the compiled graphs."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    model = make_model("alibi", n_kv_heads=2, window_type="LG", compile_composition=True, **VARIANTS[variant])
    eager = Transformer(
        dataclasses.replace(
            model.config,
            attn_backend="eager",
            attention_options=model.config.attention_options | {"compile_composition": False},
        )
    ).train()
    eager.load_state_dict(model.state_dict())
    model.train()
    for length in (22, 27):  # last blocks of 2 and 3 queries
        model.zero_grad()
        eager.zero_grad()
        idx, targets = tokens(length=length), tokens(length=length)
        logits, loss = model(idx, targets)
        ref_logits, ref_loss = eager(idx, targets)
        torch.testing.assert_close(logits, ref_logits, atol=1e-5, rtol=0)
        loss.backward()
        ref_loss.backward()
        for (name, param), ref_param in zip(model.named_parameters(), eager.parameters(), strict=True):
            assert (param.grad - ref_param.grad).abs().max() <= 1e-4 * ref_param.grad.abs().max(), name
        if length == 22:
            graphs = counters["stats"]["unique_graphs"]
    assert graphs >= 1  # the composition did compile
    assert counters["stats"]["unique_graphs"] == graphs  # the second length compiled nothing new
    torch._dynamo.reset()


@pytest.mark.parametrize("kv", KV_HEADS)
@pytest.mark.parametrize("position", POSITIONS)
def test_cached_decoding_equals_full_forward(position, kv):
    """Layer 0 is local (window 5, a ring of 5), layer 1 global; 20 tokens run well past the window."""
    model = make_model(position, n_kv_heads=KV_HEADS[kv], window_type="LG")
    idx = tokens(length=20)
    full = model(idx)
    # Prefill shorter than the window, a chunk longer than the ring on a non-empty cache, then single tokens.
    for schedule in ([3, 6] + [1] * 11, [9, 2] + [1] * 9):
        cache = model.new_cache(2, 24)
        outs, start = [], 0
        for length in schedule:
            outs.append(model(idx[:, start : start + length], cache=cache))
            start += length
        torch.testing.assert_close(torch.cat(outs, dim=1), full, atol=1e-5, rtol=0)


@pytest.mark.parametrize("variant", VARIANTS)
def test_cached_decoding_equals_full_forward_for_every_variant(variant):
    model = make_model("rope", n_kv_heads=2, window_type="LG", **VARIANTS[variant])
    idx = tokens(length=14)
    cache = model.new_cache(2, 14)
    outs = [model(idx[:, :7], cache=cache)] + [model(idx[:, t : t + 1], cache=cache) for t in range(7, 14)]
    torch.testing.assert_close(torch.cat(outs, dim=1), model(idx), atol=1e-5, rtol=0)


def test_local_cache_keeps_only_the_window():
    model = make_model(window_type="LG", window_size=5)
    cache = model.new_cache(2, 40)
    local, global_ = cache.layers
    assert local.buffers["k"].shape[2] == 5
    assert global_.buffers["k"].shape[2] == 40
    # Merged pre and post KW per key: (B, 2·N·N, positions) for G = 1.
    assert local.buffers["kw"].shape == (2, 2 * 4 * 4, 5)
    assert "kw" not in make_model(query_wise=True).new_cache(2, 40).layers[0].buffers


def test_generate_with_cache_matches_without():
    model = make_model(window_type="LG")
    prompt = tokens(length=6)
    with_cache = model.generate(prompt, 12, temperature=0)
    without = model.generate(prompt, 12, temperature=0, use_cache=False)
    assert torch.equal(with_cache, without)


# ---------------------------------------------------------------------------------------------------
# Windows, query-wise composition, inspection


def test_a_local_query_sees_exactly_window_keys_including_itself():
    window, length = 4, 12
    model = make_model(window_type="L", window_size=window, n_layers=1)
    (probs,) = model.attention_maps(tokens(1, length))
    t, s = torch.arange(length)[:, None], torch.arange(length)[None, :]
    visible = (t - s >= 0) & (t - s < window)
    assert torch.all(probs[0][:, ~visible] == 0)
    assert torch.all(probs[0][:, visible] != 0)

    # The output at t changes with the token at p iff t - p < window (one layer, so nothing else carries it).
    idx = tokens(1, length)
    changed = idx.clone()
    p = 3
    changed[0, p] = (idx[0, p] + 1) % VOCAB
    differs = (model(idx) - model(changed)).abs().amax(dim=-1)[0]
    assert torch.all(differs[:p] == 0)
    assert torch.all(differs[p : p + window] > 0)
    assert torch.all(differs[p + window :] == 0)


def test_layer_pattern():
    model = make_model(window_type="LLG", n_layers=4, window_size=7)
    assert [block.self_attn.window for block in model.layers] == [7, 7, None, 7]


@pytest.mark.parametrize(
    ("options", "zeroed_slots"),
    [
        ({"query_wise": True}, (PRE_K, POST_K)),
        ({"post_compose": False}, (POST_Q, POST_K)),
        ({"pre_compose": False}, (PRE_Q, PRE_K)),
    ],
)
def test_switched_off_terms_equal_zero_weights_in_their_slots(options, zeroed_slots):
    """Query-wise only = full composition with zero key-side weights; pre- or post-only likewise.

    This also pins the slot order [pre_q, pre_k, post_q, post_k] that official checkpoints rely on.
    """
    restricted = make_model(**options)
    full = Transformer(dataclasses.replace(restricted.config, attention_options={"window_size": 5, "q_chunk_size": 4}))
    full.load_state_dict(restricted.state_dict())
    full.eval()
    idx = tokens()
    assert (full(idx) - restricted(idx)).abs().max() > 1e-2
    with torch.no_grad():
        for block in full.layers:
            proj = block.self_attn.dyn_w_proj
            for slot in zeroed_slots:
                proj.qkw[:, slot] = 0  # w1 = w2 = 0
                proj.dd.unflatten(-1, (4, -1))[:, :, slot] = 0  # dd = tanh(0) = 0
    torch.testing.assert_close(full(idx), restricted(idx), atol=1e-5, rtol=0)


def test_dynamic_weights_follow_the_paper_formulas():
    """h = GELU(x·dw1), [w1 | w2] = h·qkw, w1 RMS-normalised over heads (eps 1e-6), dd = tanh(x·dd)."""
    dim, groups, heads_per_group, rank, hidden = 6, 2, 3, 2, 5
    proj = DynamicWeightProjection(dim, groups * heads_per_group, groups, rank, hidden)
    proj.reset_parameters()
    with torch.no_grad():
        proj.qkw.normal_()
        proj.dd.normal_()  # tanh well outside its linear range
    x = torch.randn(2, 4, dim)
    w1, w2, dd = proj(x)
    for b in range(2):
        for t in range(4):
            for g in range(groups):
                for c in range(4):
                    h = torch.nn.functional.gelu(x[b, t] @ proj.dw1[:, g, c])
                    w = torch.einsum("k,kim->im", h, proj.qkw[g, c])
                    first = w[:rank] / torch.sqrt(w[:rank].pow(2).mean(-1, keepdim=True) + 1e-6)
                    gate = torch.tanh(x[b, t] @ proj.dd[:, g]).view(4, heads_per_group)[c]
                    torch.testing.assert_close(w1[b, g, t, c], first, atol=1e-6, rtol=1e-5)
                    torch.testing.assert_close(w2[b, g, t, c], w[rank:], atol=1e-6, rtol=1e-5)
                    torch.testing.assert_close(dd[b, g, t, c], gate, atol=1e-6, rtol=1e-5)


def test_attention_maps_are_the_weights_applied_to_values():
    model = make_model(window_type="L", n_layers=1)
    idx = tokens(2, 10)
    (probs,) = model.attention_maps(idx)
    attn = model.layers[0].self_attn
    x = model.layers[0].input_layernorm(model.embed_tokens(idx))
    v = attn.v_proj(x).view(2, 10, 4, 8).transpose(1, 2)
    expected = attn.o_proj((probs @ v).transpose(1, 2).reshape(2, 10, 32))
    hidden = model.embed_tokens(idx) + expected
    hidden = hidden + model.layers[0].mlp(model.layers[0].post_attention_layernorm(hidden))
    torch.testing.assert_close(model.lm_head(model.norm(hidden)), model(idx), atol=1e-5, rtol=0)
    # Post-composition weights are not a softmax: rows need not sum to 1.
    assert (probs.sum(-1) - 1).abs().max() > 1e-3


# ---------------------------------------------------------------------------------------------------
# Parameters, init, options


def test_parameter_shapes_follow_the_official_layout():
    cfg = ModelConfig(dim=64, n_layers=1, n_heads=8, attention="dcmha", attention_options={"num_groups": 2})
    proj = Transformer(cfg).layers[0].self_attn.dyn_w_proj
    # D=64, G=2, M=N/G=4, R=2, K=2·R·M=16.
    assert proj.dw1.shape == (64, 2, 4, 16)
    assert proj.qkw.shape == (2, 4, 16, 4, 4)
    assert proj.dd.shape == (64, 2, 16)


def test_init_follows_the_official_jax_values():
    dim, n_heads = 128, 8
    cfg = ModelConfig(dim=dim, n_layers=1, n_heads=n_heads, attention="dcmha", attention_options={"static_proj": True})
    attn = Transformer(cfg).layers[0].self_attn
    hidden, rank = 4 * n_heads, 2
    expected = {
        "dw1": math.sqrt(2 / (dim + hidden)),
        "qkw": math.sqrt(1 / hidden) * 2 / (n_heads + rank) * 0.01,
        "dd": math.sqrt(2 / (dim + n_heads)) * 0.005,
    }
    for name, std in expected.items():
        param = getattr(attn.dyn_w_proj, name)
        assert abs(param.std().item() / std - 1) < 0.1, name  # ≥ 4096 samples: std within 10%
        assert abs(param.mean().item()) < 0.1 * std, name
    assert abs(attn.static_w.std().item() / (math.sqrt(1 / n_heads) * 0.1) - 1) < 0.25  # 128 samples


def test_save_and_load_round_trip(tmp_path):
    model = make_model(num_groups=2, static_proj=True, qk_norm=True)
    model.save_pretrained(tmp_path)
    idx = tokens()
    torch.testing.assert_close(Transformer.from_pretrained(tmp_path).eval()(idx), model(idx), atol=0, rtol=0)


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"num_groups": 3}, "num_groups"),
        ({"num_groups": 0}, "num_groups"),
        ({"rank": 0}, "rank"),
        ({"window_size": 0}, "window_size"),
        ({"q_chunk_size": 1.5}, "q_chunk_size"),
        ({"dynamic_w_hidden_dim": 0}, "dynamic_w_hidden_dim"),
        ({"window_type": "LX"}, "window_type"),
        ({"window_type": ""}, "window_type"),
        ({"query_wise": 1}, "query_wise"),
        ({"windows": 3}, "windows"),
    ],
)
def test_bad_options_are_refused(options, field):
    with pytest.raises(ValueError, match=field):
        ModelConfig(n_heads=4, dim=32, attention="dcmha", attention_options=options)


def test_the_identity_hook_zeroes_the_dynamic_weights_and_says_what_it_cannot_start_at_identity():
    dcmha = make_model("rope", window_type="G", q_chunk_size=8, static_proj=True)
    mha = Transformer(dataclasses.replace(dcmha.config, attention="mha", attention_options={})).eval()
    mha.load_state_dict(dcmha.state_dict(), strict=False)
    mha_names = set(mha.layers[0].self_attn.state_dict())

    def added(model):
        return {name for name, _ in model.layers[0].self_attn.named_parameters()} - mha_names

    dw1 = dcmha.layers[0].self_attn.dyn_w_proj.dw1.clone()
    with torch.no_grad():
        for block in dcmha.layers:
            assert block.self_attn.init_added_parameters_as_identity(added(dcmha), mha.config) == []
    assert torch.equal(dcmha.layers[0].self_attn.dyn_w_proj.dw1, dw1)  # kept random, so qkw gets a gradient
    idx = tokens(length=20)
    torch.testing.assert_close(dcmha(idx), mha(idx), atol=1e-5, rtol=0)  # fp32 summation order

    local = make_model(qk_norm=True)  # window_type "LG": layer 0 sees 5 keys, layer 1 all
    assert added(local) >= {"q_norm.weight", "k_norm.weight", "dyn_w_proj.qkw"}
    local_reasons, global_reasons = (
        block.self_attn.init_added_parameters_as_identity(added(local), mha.config) for block in local.layers
    )
    assert "qk_norm normalises queries and keys" in global_reasons[0] and len(global_reasons) == 1
    assert local_reasons[1].startswith("a query sees the last 5 keys where the source's saw all")


def test_a_compiled_training_step_on_the_chunked_path_is_one_graph_and_equals_eager():
    """Under torch.compile each query block is a checkpoint, not the eager path's recomputing autograd.Function, whose
    backward (autograd.grad) dynamo cannot trace: the model is one graph, and AOT autograd's forward and backward
    (``aot_eager``: traced, nothing generated) give the eager step's loss and gradients (fp32, 1e-5)."""
    import torch._dynamo

    model = make_model(backend="chunked", window_type="LG").train()  # 4 queries a block, windows of 5 keys
    idx = tokens(length=19)
    loss = model(idx, idx)[1]
    expected = torch.autograd.grad(loss, list(model.parameters()))
    torch._dynamo.reset()
    try:
        assert torch._dynamo.explain(model)(idx, idx).graph_break_count == 0
        compiled_loss = torch.compile(model, backend="aot_eager", fullgraph=True)(idx, idx)[1]
        got = torch.autograd.grad(compiled_loss, list(model.parameters()))
    finally:
        torch._dynamo.reset()
    torch.testing.assert_close(compiled_loss, loss, rtol=0, atol=1e-5)
    for name, grad, want in zip(dict(model.named_parameters()), got, expected, strict=True):
        torch.testing.assert_close(grad, want, rtol=0, atol=1e-5 * max(want.abs().max().item(), 1.0), msg=name)
