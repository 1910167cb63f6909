"""Differential attention's one-call SDPA layouts (``attention/kernels/diff_sdpa.py``: ``diff-halves`` and
``diff-stacked``) against the eager reference, Eq. 1 with explicit fp32 maps: output and every parameter's gradient,
GQA and MQA, each positional scheme, cached decoding on a growing and a static cache, and the calls each refuses.

Tolerance: fp32 1e-5, relative to the largest magnitude of the expected tensor (and at least 1): SDPA sums in
another order than the reference (measured ≤ 1e-6 here).
"""

import dataclasses

import pytest
import torch
from conftest import tiny_model
from kernel_checks import assert_close, on_backend

from attnzoo import ModelConfig, Transformer
from attnzoo.attention.kernels import KERNELS, Call

LAYOUTS = ["diff-halves", "diff-stacked"]
TOLERANCE = 1e-5


def diff_model(position: str = "rope", n_kv_heads: int = 4, backend: str = "eager", **overrides) -> Transformer:
    settings = {"n_kv_heads": n_kv_heads, "attention": "diff", "position": position, "attn_backend": backend}
    return tiny_model(vocab_size=32, dim=64, max_seq_len=48, **settings, **overrides)


def loss_and_grads(model: Transformer, idx: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    model.zero_grad(set_to_none=True)
    logits, loss = model(idx, idx)
    loss.backward()
    return logits.detach(), {name: p.grad for name, p in model.named_parameters()}


@pytest.mark.parametrize("n_kv_heads", [4, 2, 1], ids=["mha", "gqa", "mqa"])
@pytest.mark.parametrize("position", ["rope", "alibi", "sinusoidal", "none"])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_training_step_equals_the_eager_reference(layout, position, n_kv_heads):
    """Logits and every parameter's gradient (λ's four vectors and subln included) equal the reference's, at a
    length that is no power of two: ALiBi's slope of a differential head reaches each of its copies, and each query
    head reads its own kv head's keys and values under GQA and MQA."""
    reference = diff_model(position, n_kv_heads)
    idx = torch.randint(0, 32, (2, 37))
    expected_logits, expected_grads = loss_and_grads(reference, idx)
    model = on_backend(reference, layout)
    logits, grads = loss_and_grads(model, idx)
    assert model.attention_kernels(idx) == [layout] * model.config.n_layers
    assert_close(logits, expected_logits, TOLERANCE)
    for name, grad in expected_grads.items():
        assert_close(grads[name], grad, TOLERANCE)


@pytest.mark.parametrize("static", [False, True], ids=["growing", "static"])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_cached_decoding_equals_the_full_forward(layout, static):
    """A prefill and one-token steps, which the layout serves, give the full forward's logits, with ALiBi and GQA
    (fp32, 1e-5)."""
    model = on_backend(diff_model("alibi", n_kv_heads=2), layout).eval()
    idx = torch.randint(0, 32, (2, 41))
    with torch.no_grad():
        full = model(idx)
        cache = model.new_cache(2, 41, static=static)
        pieces = [model(idx[:, :29], cache=cache)]
        pieces += [model(idx[:, t : t + 1], cache=cache) for t in range(29, 41)]
        probe = model.new_cache(2, 41, static=static)
        model(idx[:, :29], cache=probe)
        step_kernels = model.attention_kernels(idx[:, 29:30], cache=probe)
    assert step_kernels == [layout] * model.config.n_layers
    assert_close(torch.cat(pieces, dim=1), full, TOLERANCE)


def training_call(model: Transformer, dropout: float = 0.0, records_scores: bool = False) -> Call:
    planned = Call.planned(model.config, model.position, length=16)
    return dataclasses.replace(planned, dropout=dropout, records_scores=records_scores)


def test_dropout_is_refused_by_the_halves_and_served_by_the_stacked_layout():
    """Each half of a map's values sits in its own head in ``diff-halves``, where dropout would draw a mask per half;
    ``diff-stacked`` drops each map once, as the reference does."""
    model = diff_model(backend="diff-halves", dropout=0.1)
    layer = model.layers[0].self_attn
    assert "dropout" in KERNELS.get("diff-halves").call_refusal(layer, training_call(model, dropout=0.1))
    assert KERNELS.get("diff-stacked").call_refusal(layer, training_call(model, dropout=0.1)) is None
    assert KERNELS.get("diff-halves").call_refusal(layer, training_call(model)) is None


@pytest.mark.parametrize("layout", LAYOUTS)
def test_recorded_maps_take_the_reference(layout):
    """Only the eager reference returns the maps: a recording call is refused, so the layer runs the reference."""
    model = diff_model(backend=layout)
    layer = model.layers[0].self_attn
    assert "recorded" in KERNELS.get(layout).call_refusal(layer, training_call(model, records_scores=True))


@pytest.mark.parametrize("layout", LAYOUTS)
def test_the_layouts_serve_diff_only(layout):
    """Another mechanism naming the layout is refused when its config is built, with the reason."""
    with pytest.raises(ValueError, match=f"{layout}.*serves diff only"):
        ModelConfig(dim=64, n_heads=4, attn_backend=layout)
