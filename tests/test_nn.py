"""attnzoo.nn: a mechanism as a layer of anyone's model computes what it computes inside attnzoo's Transformer."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from training_helpers import write_text_corpus

from attnzoo import ModelConfig, Transformer
from attnzoo.attention import ATTENTION
from attnzoo.nn import Block, SelfAttention

REPO = Path(__file__).resolve().parents[1]
POSITIONS = ("rope", "alibi", "none", "learned", "sinusoidal")
HEADS = {"mha": 4, "gqa": 2, "mqa": 1}  # kv heads of 4 query heads
TOL = 1e-5  # fp32: cached decoding against the full forward, as tests/test_decoding.py; measured worst 4.5e-8


def tiny_model(attention: str, position: str, kv_heads: int, **fields) -> Transformer:
    cfg = ModelConfig(vocab_size=32, dim=64, n_layers=2, n_heads=4, n_kv_heads=kv_heads, attention=attention,
                      position=position, max_seq_len=32, **fields)  # fmt: skip
    return Transformer(cfg)


def layer_call(model: Transformer, layer_idx: int, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The input and output of layer ``layer_idx``'s attention in a forward pass of ``model`` over ``idx``."""
    seen = {}

    def keep(module, args, output):
        seen["x"], seen["out"] = args[0], output

    handle = model.layers[layer_idx].self_attn.register_forward_hook(keep)
    model(idx)
    handle.remove()
    return seen["x"], seen["out"]


@pytest.mark.parametrize("heads", HEADS)
@pytest.mark.parametrize("position", POSITIONS)
@pytest.mark.parametrize("attention", ATTENTION.names())
def test_a_layer_equals_the_same_layer_inside_the_transformer_bit_for_bit(attention, position, heads):
    model = tiny_model(attention, position, HEADS[heads])
    layer = SelfAttention.from_transformer(model, 1)
    x, inside = layer_call(model, 1, torch.randint(0, 32, (2, 12)))
    assert torch.equal(layer(x), inside)

    x = x.detach().requires_grad_()
    inside = model.layers[1].self_attn(x, model._context(2, 12, None, None))  # the same call, from a leaf input
    outside_x = x.detach().requires_grad_()
    outside = layer(outside_x)

    upstream = torch.randn_like(inside)
    inside_grads = torch.autograd.grad(inside, [x, *model.layers[1].self_attn.parameters()], upstream)
    outside_grads = torch.autograd.grad(outside, [outside_x, *layer.mechanism.parameters()], upstream)
    for ours, theirs in zip(outside_grads, inside_grads, strict=True):
        assert torch.equal(ours, theirs)


@pytest.mark.parametrize("heads", HEADS)
@pytest.mark.parametrize("position", ("rope", "alibi", "none"))
@pytest.mark.parametrize("attention", ATTENTION.names())
def test_cached_decoding_with_a_layer_equals_its_full_forward(attention, position, heads):
    layer = SelfAttention(attention, 64, 4, n_kv_heads=HEADS[heads], position=position, max_seq_len=32, layer_idx=1)
    x = torch.randn(2, 11, 64)
    cache = layer.new_cache(2, 11)
    steps = [layer(x[:, :5], cache=cache), *(layer(x[:, t : t + 1], cache=cache) for t in range(5, 11))]
    torch.testing.assert_close(torch.cat(steps, dim=1), layer(x), atol=TOL, rtol=0)
    assert cache.length == 11


def test_weights_go_from_a_model_to_a_layer_and_back():
    model = tiny_model("dcmha", "rope", 2)
    layer = SelfAttention.from_transformer(model, 0)
    assert layer.mechanism.state_dict().keys() == model.layers[0].self_attn.state_dict().keys()
    with torch.no_grad():
        for parameter in layer.parameters():
            parameter.add_(1)
    model.layers[0].self_attn.load_state_dict(layer.mechanism.state_dict())
    for name, tensor in model.layers[0].self_attn.state_dict().items():
        assert torch.equal(tensor, layer.mechanism.state_dict()[name]), name


@pytest.mark.parametrize("attention", ("mha", "diff", "dcmha"))
def test_a_block_equals_the_transformer_block(attention):
    model = tiny_model(attention, "rope", 2)
    block = Block.from_transformer(model, 1)
    seen = {}
    handle = model.layers[1].register_forward_hook(lambda m, args, out: seen.update(x=args[0], out=out))
    model(torch.randint(0, 32, (2, 9)))
    handle.remove()
    assert torch.equal(block(seen["x"]), seen["out"])


def test_rotary_positions_offset_every_token_alike_leave_attention_unchanged():
    layer = SelfAttention("mha", 64, 4, position="rope", max_seq_len=64, init_std=0.5)  # scores far from uniform
    x = torch.randn(2, 8, 64)
    shifted = layer(x, positions=torch.arange(20, 28))
    # Angles 20..27 and 0..7 round differently in fp32; at init_std 0.5 outputs reach ~10: measured worst 2.3e-5.
    torch.testing.assert_close(shifted, layer(x), atol=1e-4, rtol=1e-4)
    assert not torch.allclose(layer(x, positions=torch.arange(8).flip(0)), layer(x), atol=1e-3)


# Selective attention's position temperature reads each query's index, which the pads shift: left out here.
@pytest.mark.parametrize(
    ("attention", "options"),
    [("mha", {}), ("diff", {}), ("selective", {"position_temperature": False}), ("dcmha", {})],
)
def test_a_padding_mask_makes_a_left_padded_sequence_attend_as_the_sequence_alone(attention, options):
    layer = SelfAttention(attention, 64, 4, n_kv_heads=2, position="alibi", max_seq_len=32, **options)
    sequence = torch.randn(1, 6, 64)
    padded = torch.cat((torch.randn(1, 3, 64), sequence), dim=1).requires_grad_()
    mask = torch.tensor([[False] * 3 + [True] * 6])
    out = layer(padded, padding_mask=mask)
    # ALiBi and the causal mask read positions by token order, so the pads only shift every position alike.
    torch.testing.assert_close(out[:, 3:], layer(sequence), atol=TOL, rtol=0)
    out.sum().backward()
    assert torch.isfinite(padded.grad).all()


def test_a_padding_mask_with_a_cache_covers_the_cached_tokens_too():
    layer = SelfAttention("mha", 64, 4, position="rope", max_seq_len=32)
    x = torch.randn(2, 7, 64)
    mask = torch.tensor([[True] * 7, [False, False] + [True] * 5])
    cache = layer.new_cache(2, 7)
    steps = [layer(x[:, :4], cache=cache, padding_mask=mask[:, :4])]
    steps += [layer(x[:, t : t + 1], cache=cache, padding_mask=mask[:, : t + 1]) for t in range(4, 7)]
    torch.testing.assert_close(torch.cat(steps, dim=1), layer(x, padding_mask=mask), atol=TOL, rtol=0)


def test_a_layer_compiles_to_one_graph():
    layer = SelfAttention("diff", 64, 4, n_kv_heads=2, position="rope", max_seq_len=32)
    explanation = torch._dynamo.explain(layer)(torch.randn(2, 8, 64))
    assert (explanation.graph_count, explanation.graph_break_count) == (1, 0)


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: SelfAttention("mha", 60, 8), "n_heads=8 is invalid: must divide dim=60"),
        (lambda: SelfAttention("mha", 64, 4, n_kv_heads=3), "n_kv_heads=3 is invalid: must divide n_heads=4"),
        (lambda: SelfAttention("mha", 64, 4, position="learned"), "give the layer position='none'"),
        (lambda: SelfAttention("dcmha", 64, 4, no_such_option=1), "no_such_option"),
        (lambda: SelfAttention("flash", 64, 4), "flash"),
    ],
)
def test_a_layer_refuses_what_a_model_refuses_in_the_same_words(build, message):
    with pytest.raises(ValueError, match=message):
        build()


def test_a_layer_refuses_bad_calls_by_name():
    layer = SelfAttention("mha", 64, 4, position="rope", max_seq_len=16)
    x = torch.randn(2, 4, 64)
    with pytest.raises(ValueError, match=r"position 16 is outside \[0, max_seq_len=16\)"):
        layer(x, positions=torch.arange(13, 17))
    with pytest.raises(ValueError, match="input batch size 2 differs from the cache's batch_size=3"):
        layer(x, cache=layer.new_cache(3, 8))
    with pytest.raises(ValueError, match=r"the cache holds torch\.float64 and x is torch\.float32"):
        layer(x, cache=layer.new_cache(2, 8, dtype=torch.float64))
    with pytest.raises(ValueError, match="laid out as"):
        layer(x, cache=SelfAttention("dcmha", 64, 4, max_seq_len=16).new_cache(2, 8))
    with pytest.raises(ValueError, match=r"x must have shape \(batch >= 1, seq_len >= 1, dim=64\)"):
        layer(torch.randn(2, 4, 32))
    with pytest.raises(ValueError, match=r"padding_mask must be a \(2, 4\) bool tensor"):
        layer(x, padding_mask=torch.ones(2, 3, dtype=torch.bool))
    with pytest.raises(ValueError, match="rotates nothing"):
        SelfAttention("mha", 64, 4, position="alibi", max_seq_len=16)(x, positions=torch.arange(4))


@pytest.mark.slow
@pytest.mark.parametrize("attention", ATTENTION.names())
def test_the_nanogpt_example_trains_and_samples(attention, tmp_path, capsys, monkeypatch):
    monkeypatch.syspath_prepend(str(REPO / "examples"))
    sys.modules.pop("nanogpt", None)
    import nanogpt

    text = write_text_corpus(tmp_path / "text.txt")
    flags = ["--data", str(text), "--attention", attention, "--steps", "50", "--dim", "32", "--n-layers", "2",
             "--block-size", "32", "--batch-size", "8"]  # fmt: skip
    nanogpt.main(flags)
    lines = capsys.readouterr().out.splitlines()
    losses = [float(line.split("loss ")[1]) for line in lines if line.startswith("step ")]
    assert losses[-1] < losses[0] - 1, losses
    assert lines[-1].startswith("ROMEO:") and len(lines[-1]) > len("ROMEO:")


@pytest.mark.slow
@pytest.mark.parametrize("attention", ("diff", "dcmha"))
def test_ddp_and_fsdp2_wrap_blocks_and_give_one_process_gradients(attention):
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
               str(REPO / "tests" / "fixtures" / "nn_parallel.py"), attention]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "terminate called" not in done.stderr, done.stderr[-3000:]  # no rank aborted, even after its work
    errors = json.loads(done.stdout.strip().splitlines()[-1])
    # Two ranks average gradients in another order than one process sums them: float32 rounding, measured 7e-10.
    assert errors["ddp"] < 1e-6 and errors["fsdp"] < 1e-6, errors
