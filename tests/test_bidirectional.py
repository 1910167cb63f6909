"""Bidirectional (encoder) attention, ``causal=False``: every mechanism attends both ways on every path, ALiBi's
bias is symmetric, a local window is symmetric, and what needs a causal model (a cache, generate, next-token
training) is refused with the reason."""

import pytest
import torch
from conftest import tiny_model

from attnzoo import ModelConfig
from attnzoo.attention import ATTENTION
from attnzoo.attention.base import AttentionContext, visible
from attnzoo.positions import POSITIONS
from attnzoo.positions.alibi import alibi_slopes
from attnzoo.training import TrainConfig
from attnzoo.training.config import check_model_for_training

MECHANISMS = ATTENTION.names()  # plugins included: a mechanism added later is tested, not skipped
POSITIONS_TESTED = ("rope", "alibi", "learned", "none")


def model_of(attention, position="rope", backend="auto", **changes):
    options = {"q_chunk_size": 3, "window_type": "LG", "window_size": 4} if attention == "dcmha" else {}
    settings = {"vocab_size": 40, "n_kv_heads": 2, "max_seq_len": 16, "attention_options": options, **changes}
    model = tiny_model(attention=attention, position=position, attn_backend=backend, **settings)
    with torch.no_grad():  # mechanism parameters away from their (identity-like) init
        for name, param in model.named_parameters():
            if "temperature" in name or "dyn_w_proj" in name or "lambda" in name:
                param.normal_(0, 0.2)
    return model


@pytest.mark.parametrize("position", POSITIONS_TESTED)
@pytest.mark.parametrize("attention", MECHANISMS)
def test_a_later_token_changes_an_earlier_output_only_when_not_causal(attention, position):
    idx = torch.randint(0, 40, (2, 10))
    changed = idx.clone()
    changed[:, 8] = (changed[:, 8] + 1) % 40
    for causal in (True, False):
        model = model_of(attention, position, causal=causal)
        with torch.no_grad():
            before, after = model(idx), model(changed)
        assert torch.allclose(before[:, :8], after[:, :8]) == causal, causal
        assert not torch.allclose(before[:, 8:], after[:, 8:])


@pytest.mark.parametrize("position", POSITIONS_TESTED)
@pytest.mark.parametrize("attention", MECHANISMS)
def test_eager_equals_every_fast_path_when_not_causal(attention, position):
    idx = torch.randint(0, 40, (2, 11))
    backends = ["eager", "auto"] + ([] if ATTENTION.get(attention).needs_scores else ["sdpa"])
    logits = {}
    for backend in backends:
        with torch.no_grad():
            logits[backend] = model_of(attention, position, backend, causal=False)(idx)
    for backend in backends[1:]:
        torch.testing.assert_close(logits[backend], logits["eager"], atol=2e-5, rtol=1e-4)


def test_alibi_bias_is_symmetric_minus_m_times_distance():
    cfg = ModelConfig(n_heads=4, dim=32, position="alibi")
    alibi = POSITIONS.get("alibi")(cfg, cfg.head_dim)
    positions = torch.arange(6)
    bias = alibi.bias(4, positions, positions, causal=False)
    slopes = torch.tensor(alibi_slopes(4))
    distance = (positions[:, None] - positions[None, :]).abs().float()
    torch.testing.assert_close(bias, -slopes[:, None, None] * distance)
    torch.testing.assert_close(bias, bias.transpose(1, 2))
    # The causal bias is the paper's −m·(i − j), and the two agree on every entry a causal query sees.
    causal_bias = alibi.bias(4, positions, positions)
    torch.testing.assert_close(causal_bias, -slopes[:, None, None] * (positions[:, None] - positions).float())
    seen = visible(positions, positions)
    torch.testing.assert_close(bias[:, seen], causal_bias[:, seen])
    ctx = AttentionContext(positions, 0, alibi, None, causal=False)
    torch.testing.assert_close(ctx.score_bias(4, 6), bias)


def test_the_eager_kernel_adds_the_symmetric_bias_both_ways():
    """One head, zero queries and keys: the logits are the bias alone, so the map is softmax(−m·|i − j|)."""
    model = model_of("mha", "alibi", "eager", causal=False, n_heads=1, n_kv_heads=1)
    attention = model.layers[0].self_attn
    with torch.no_grad():
        attention.q_proj.weight.zero_()
        maps = model.attention_maps(torch.randint(0, 40, (1, 5)))
    positions = torch.arange(5)
    expected = torch.softmax(-alibi_slopes(1)[0] * (positions[:, None] - positions).abs().float(), dim=-1)
    torch.testing.assert_close(maps[0][0, 0], expected)


def test_a_local_window_becomes_symmetric():
    positions = torch.arange(6)
    mask = visible(positions, positions, window=2, causal=False)
    assert mask.tolist()[2] == [False, True, True, True, False, False]  # |t − s| < 2
    model = model_of("dcmha", "rope", "eager", causal=False)  # layer 0 local (window 4), layer 1 global
    maps = model.attention_maps(torch.randint(0, 40, (1, 12)))
    distance = (torch.arange(12)[:, None] - torch.arange(12)).abs()
    assert torch.all(maps[0][0][:, distance >= 4] == 0)
    assert torch.all(maps[0][0][:, distance < 4] != 0)
    assert torch.all(maps[1][0] != 0)  # global: every key, ahead and behind


def test_contexts_default_to_causal():
    ctx = AttentionContext(torch.arange(3), 0, None, None)
    assert ctx.causal and ctx.allowed(3).tolist() == [[True, False, False], [True, True, False], [True, True, True]]


@pytest.mark.parametrize("attention", MECHANISMS)
def test_cache_generate_and_training_are_refused_with_the_reason(attention):
    model = model_of(attention, causal=False)
    with pytest.raises(ValueError, match=r"a KV cache needs a causal model.*attend to later tokens"):
        model.new_cache(1, 8)
    for use_cache in (True, False):
        with pytest.raises(ValueError, match="generate needs a causal model"):
            model.generate(torch.zeros(1, 2, dtype=torch.long), 3, use_cache=use_cache)
    with pytest.raises(ValueError, match="causal=False is invalid: cannot train on next-token prediction"):
        check_model_for_training(model.config, TrainConfig(seq_len=16), 40)


def test_causal_round_trips_and_old_configs_are_causal():
    cfg = ModelConfig(causal=False)
    assert ModelConfig.from_json(cfg.to_json()).causal is False
    text = ModelConfig().to_json().replace('  "causal": true,\n', "")
    assert '"causal"' not in text and ModelConfig.from_json(text).causal is True
    with pytest.raises(ValueError, match="causal='no' is invalid: must be true or false"):
        ModelConfig(causal="no")
