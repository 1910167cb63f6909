"""A float64 model computes in float64 end to end: no step inside a mechanism or a positional scheme rounds to
fp32, so ``torch.autograd.gradcheck`` (finite differences at eps=1e-6, which fp32 rounding swamps) passes on
every mechanism × positional scheme × kernel."""

import pytest
import torch
from conftest import tiny_model

from attnzoo import ModelConfig, Transformer
from attnzoo.attention import ATTENTION
from attnzoo.precision import compute_dtype

# Every code path that used to round to fp32: the eager kernel, DCMHA's composition, RoPE's rotation, Diff's λ
# and subln, the selective temperatures (token and position parts), the ALiBi bias.
MECHANISMS = {
    "mha": {},
    "diff": {},
    "diff_v2": {},
    "selective": {"position_coefficient": "sigmoid"},
    "dcmha": {"static_proj": True, "window_size": 3, "q_chunk_size": 2},
}
BATCH, SEQ_LEN = 1, 5


def test_every_registered_mechanism_is_covered():
    assert set(MECHANISMS) >= set(ATTENTION.names())


def test_compute_dtype_keeps_float64_and_lifts_half_precision_to_fp32():
    assert compute_dtype(torch.float64) == torch.float64
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        assert compute_dtype(dtype) == torch.float32


def _model(attention: str, position: str, backend: str) -> Transformer:
    # Half the tiny width: gradcheck's finite differences cost a forward per input element.
    model = tiny_model(
        vocab_size=16,
        dim=16,
        n_heads=2,
        max_seq_len=16,
        attention=attention,
        position=position,
        attn_backend=backend,
        attention_options=MECHANISMS[attention],
    ).double()
    for parameter in model.parameters():  # off their identity init, so every path contributes
        parameter.data.add_(0.1 * torch.randn_like(parameter))
    return model


@pytest.mark.parametrize("backend", ["eager", "auto"])
@pytest.mark.parametrize("position", ["rope", "alibi"])
@pytest.mark.parametrize("attention", list(MECHANISMS))
def test_gradcheck_passes_on_every_mechanism_in_float64(attention, position, backend):
    model = _model(attention, position, backend)
    layer = model.layers[1].self_attn  # layer 1: dcmha's global layer; diff's λ_init of a later layer
    ctx = model._context(BATCH, SEQ_LEN, cache=None, maps=None)
    x = torch.randn(BATCH, SEQ_LEN, 16, dtype=torch.float64, requires_grad=True)
    assert layer(x, ctx).dtype == torch.float64
    assert torch.autograd.gradcheck(lambda x: layer(x, ctx), (x,), eps=1e-6, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("attention", list(MECHANISMS))
def test_gradcheck_passes_through_the_whole_float64_model_and_its_loss(attention):
    model = _model(attention, "rope", "auto")
    idx = torch.randint(0, 16, (BATCH, SEQ_LEN))
    _, loss = model(idx, idx)
    assert loss.dtype == torch.float64

    embedding = model.embed_tokens.weight.detach().clone().requires_grad_()

    def loss_from_embeddings(weight):
        """The loss as a function of the token embeddings: through every layer, the output head and the loss."""
        return torch.func.functional_call(model, {"embed_tokens.weight": weight}, (idx, idx))[1]

    assert torch.autograd.gradcheck(loss_from_embeddings, (embedding,), eps=1e-6, atol=1e-5, rtol=1e-4)


def test_the_alibi_bias_of_a_float64_model_is_float64_and_fp32_stays_fp32():
    for dtype in (torch.float32, torch.float64):
        model = Transformer(ModelConfig(vocab_size=16, dim=16, n_layers=1, n_heads=2, position="alibi")).to(dtype)
        ctx = model._context(BATCH, SEQ_LEN, cache=None, maps=None)
        assert ctx.score_bias(2, SEQ_LEN).dtype == dtype
