import math

import pytest
import torch

from attnzoo import ModelConfig, Transformer
from attnzoo.positions import POSITIONS, alibi_slopes


def rope_module(head_dim=16, **options):
    cfg = ModelConfig(
        vocab_size=8, dim=head_dim * 2, n_heads=2, n_layers=1, max_seq_len=64, position="rope", position_options=options
    )
    return POSITIONS.get("rope")(cfg, head_dim)


def rotate(module, x, positions):
    return module.rotate(x, module.prepare(positions, int(positions[-1]) + 1))


@pytest.mark.parametrize("name", POSITIONS.names())
def test_adds_bias_says_whether_the_scheme_returns_a_bias(name):
    """Kernels pick their path from ``adds_bias`` without building the (H, T, S) bias: it must tell the truth."""
    cfg = ModelConfig(vocab_size=8, dim=32, n_heads=2, n_layers=1, max_seq_len=16, position=name)
    scheme = POSITIONS.get(name)(cfg, 16)
    positions = torch.arange(4)
    assert (scheme.bias(2, positions, positions) is not None) == scheme.adds_bias


# --- ALiBi -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("n", "expected"),
    [
        (8, [2.0**-k for k in range(1, 9)]),
        (16, [2.0 ** (-k / 2) for k in range(1, 17)]),
        (32, [2.0 ** (-k / 4) for k in range(1, 33)]),
        # Not a power of two: the 8 slopes of n=8, then every other slope of n=16, unsorted.
        (12, [2.0**-k for k in range(1, 9)] + [2.0**-0.5, 2.0**-1.5, 2.0**-2.5, 2.0**-3.5]),
        (6, [0.25, 0.0625, 0.015625, 0.00390625, 0.5, 0.125]),
    ],
)
def test_alibi_slopes_match_the_official_lists(n, expected):
    assert alibi_slopes(n) == pytest.approx(expected, rel=1e-12)


def test_alibi_relative_bias_equals_key_index_form_after_softmax():
    # The official code adds m·j (key index only); softmax is invariant to the per-row constant m·i.
    cfg = ModelConfig(vocab_size=8, dim=24, n_heads=6, n_layers=1, position="alibi")
    alibi = POSITIONS.get("alibi")(cfg, 4)
    T = 10
    positions = torch.arange(T)
    relative = alibi.bias(6, positions, positions)
    key_index = torch.tensor(alibi_slopes(6))[:, None, None] * positions[None, None, :].float()
    logits = torch.randn(6, T, T)
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    a = (logits + relative).masked_fill(~causal, -torch.inf).softmax(-1)
    b = (logits + key_index).masked_fill(~causal, -torch.inf).softmax(-1)
    torch.testing.assert_close(a, b, atol=1e-6, rtol=0)


def test_alibi_bias_is_added_after_the_scaling():
    cfg = ModelConfig(vocab_size=32, dim=32, n_heads=4, n_layers=1, position="alibi", attn_backend="eager")
    model = Transformer(cfg).eval()
    idx = torch.randint(0, 32, (1, 12))
    attn = model.layers[0].self_attn
    h = model.layers[0].input_layernorm(model.embed_tokens(idx))
    q = attn.q_proj(h).view(1, 12, 4, 8).transpose(1, 2)
    k = attn.k_proj(h).view(1, 12, 4, 8).transpose(1, 2)
    i = torch.arange(12)
    slopes = torch.tensor(alibi_slopes(4))
    logits = q @ k.transpose(-1, -2) / math.sqrt(8) - slopes[:, None, None] * (i[:, None] - i[None, :])
    expected = logits.masked_fill(i[None, :] > i[:, None], -torch.inf).softmax(-1)
    torch.testing.assert_close(model.attention_maps(idx)[0], expected, atol=1e-6, rtol=0)


# --- RoPE ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("interleaved", [False, True])
def test_rope_equals_complex_rotation(interleaved):
    head_dim, T = 16, 9
    module = rope_module(head_dim, interleaved=interleaved, rope_theta=500.0)
    x = torch.randn(2, 3, T, head_dim)
    out = rotate(module, x, torch.arange(T))
    # Reference: pair channels into complex numbers and multiply by e^{i·n·θ_k}, θ_k = base^(-2k/d).
    if interleaved:
        pairs = torch.complex(x[..., 0::2], x[..., 1::2])
    else:
        pairs = torch.complex(x[..., : head_dim // 2], x[..., head_dim // 2 :])
    theta = 500.0 ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    angle = torch.arange(T, dtype=torch.float64)[:, None] * theta[None, :]
    rotated = pairs.to(torch.complex128) * torch.polar(torch.ones_like(angle), angle)
    if interleaved:
        expected = torch.stack((rotated.real, rotated.imag), dim=-1).flatten(-2)
    else:
        expected = torch.cat((rotated.real, rotated.imag), dim=-1)
    torch.testing.assert_close(out.double(), expected, atol=1e-5, rtol=0)


def test_interleaved_rope_equals_half_split_after_channel_permutation():
    # Permuting q/k output channels per head (even channels first, then odd) turns a GPT-J/RoFormer
    # interleaved model into a NeoX/LLaMA half-split model with identical logits.
    common = dict(vocab_size=50, dim=64, n_heads=4, n_kv_heads=2, n_layers=2, position="rope")
    interleaved = Transformer(ModelConfig(**common, position_options={"interleaved": True})).eval()
    half = Transformer(ModelConfig(**common)).eval()
    state = interleaved.state_dict()
    head_dim = 16
    perm = torch.cat((torch.arange(0, head_dim, 2), torch.arange(1, head_dim, 2)))
    for name, tensor in list(state.items()):
        if name.endswith(("q_proj.weight", "k_proj.weight")):
            heads = tensor.shape[0] // head_dim
            state[name] = tensor.view(heads, head_dim, -1)[:, perm].reshape_as(tensor)
    half.load_state_dict(state)
    idx = torch.randint(0, 50, (2, 20))
    torch.testing.assert_close(half(idx), interleaved(idx), atol=1e-5, rtol=0)


def test_partial_rotary_rotates_only_the_leading_fraction_with_its_own_frequencies():
    head_dim, factor, T = 16, 0.25, 7
    partial = rope_module(head_dim, partial_rotary_factor=factor)
    rotary_dim = 4
    assert partial.rotary_dim == rotary_dim
    expected_inv_freq = 10000.0 ** (-torch.arange(0, rotary_dim, 2, dtype=torch.float64) / rotary_dim)
    torch.testing.assert_close(partial.inv_freq.double(), expected_inv_freq, rtol=1e-6, atol=0)

    x = torch.randn(1, 2, T, head_dim)
    out = rotate(partial, x, torch.arange(T))
    assert torch.equal(out[..., rotary_dim:], x[..., rotary_dim:])
    full_on_slice = rope_module(rotary_dim)
    torch.testing.assert_close(out[..., :rotary_dim], rotate(full_on_slice, x[..., :rotary_dim], torch.arange(T)))


@pytest.mark.parametrize("options", [{}, {"interleaved": True}, {"partial_rotary_factor": 0.5}, {"rope_type": "yarn"}])
def test_rope_logits_depend_only_on_relative_position(options):
    module = rope_module(16, **{"factor": 4.0, **options} if options.get("rope_type") else options)
    q, k = torch.randn(1, 1, 1, 16), torch.randn(1, 1, 1, 16)

    def logit(m, n):
        return (rotate(module, q, torch.tensor([m])) * rotate(module, k, torch.tensor([n]))).sum()

    torch.testing.assert_close(logit(5, 2), logit(40, 37), atol=1e-4, rtol=0)
    assert not torch.allclose(logit(5, 2), logit(5, 4), atol=1e-3)


def test_rope_tables_are_fp32_for_low_precision_inputs():
    module = rope_module(16)
    cos, sin = module.prepare(torch.arange(4096), 4096)
    assert cos.dtype == sin.dtype == torch.float32
    x = torch.randn(1, 1, 4096, 16)
    out = module.rotate(x.bfloat16(), (cos, sin))
    assert out.dtype == torch.bfloat16
    # Rotating in fp32 then rounding once stays within bf16 resolution of the fp32 result.
    torch.testing.assert_close(out.float(), module.rotate(x.bfloat16().float(), (cos, sin)), atol=3e-2, rtol=1e-2)


def base_inv_freq(dim, theta=10000.0):
    return [theta ** (-2 * i / dim) for i in range(dim // 2)]


def test_linear_scaling_divides_frequencies():
    module = rope_module(16, rope_type="linear", factor=4.0)
    torch.testing.assert_close(
        module.inv_freq.double(), torch.tensor(base_inv_freq(16), dtype=torch.float64) / 4, rtol=1e-6, atol=0
    )


def test_llama3_scaling_formula():
    options = dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0)
    module = rope_module(64, rope_theta=500000.0, original_max_position_embeddings=64, **options)
    expected = []
    for f in base_inv_freq(64, 500000.0):
        wavelen = 2 * math.pi / f
        if wavelen < 64 / 4:
            expected.append(f)
        elif wavelen > 64 / 1:
            expected.append(f / 8)
        else:
            s = (64 / wavelen - 1) / (4 - 1)
            expected.append((1 - s) * f / 8 + s * f)
    # All three regimes occur at these sizes, so each branch is exercised.
    assert module.inv_freq[0] == pytest.approx(expected[0]) and expected[0] == base_inv_freq(64, 500000.0)[0]
    torch.testing.assert_close(module.inv_freq.double(), torch.tensor(expected, dtype=torch.float64), rtol=1e-6, atol=0)


def test_yarn_scaling_formula():
    dim, theta, factor, original = 32, 10000.0, 4.0, 64
    module = rope_module(dim, rope_type="yarn", factor=factor, original_max_position_embeddings=original)

    def correction_dim(rotations):
        return dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low, high = max(math.floor(correction_dim(32)), 0), min(math.ceil(correction_dim(1)), dim - 1)
    expected = []
    for i, f in enumerate(base_inv_freq(dim)):
        ramp = min(max((i - low) / (high - low), 0.0), 1.0)
        expected.append(f / factor * ramp + f * (1 - ramp))
    torch.testing.assert_close(module.inv_freq.double(), torch.tensor(expected, dtype=torch.float64), rtol=1e-6, atol=0)
    assert module.attention_factor == pytest.approx(0.1 * math.log(factor) + 1)
    cos, _ = module.prepare(torch.arange(1), 1)
    assert cos[0, 0].item() == pytest.approx(module.attention_factor)  # cos(0) · attention factor


def test_dynamic_ntk_changes_theta_only_past_the_original_length():
    module = rope_module(16, rope_type="dynamic", factor=2.0, original_max_position_embeddings=32)
    positions = torch.arange(10)
    default = rope_module(16)
    torch.testing.assert_close(module.prepare(positions, 32)[0], default.prepare(positions, 32)[0])
    theta = 10000.0 * (2.0 * 48 / 32 - 1) ** (16 / 14)
    expected = rope_module(16, rope_theta=theta).prepare(positions, 48)
    torch.testing.assert_close(module.prepare(positions, 48)[0], expected[0], atol=1e-6, rtol=0)


# --- absolute ---------------------------------------------------------------------------------------------


def test_sinusoidal_embedding_formula():
    cfg = ModelConfig(vocab_size=8, dim=8, n_heads=2, n_layers=1, position="sinusoidal")
    table = POSITIONS.get("sinusoidal")(cfg, 4).embed(torch.arange(50))
    amplitude = math.sqrt(2) * cfg.init_std
    for n in (0, 7, 49):
        for i in range(4):
            angle = n / 10000 ** (2 * i / 8)
            assert table[n, 2 * i].item() == pytest.approx(amplitude * math.sin(angle), abs=1e-7)
            assert table[n, 2 * i + 1].item() == pytest.approx(amplitude * math.cos(angle), abs=1e-7)


def test_sinusoidal_table_has_the_scale_of_the_token_embeddings():
    # A unit table drowns N(0, init_std) token embeddings; its RMS per element must be init_std, as theirs.
    cfg = ModelConfig(vocab_size=8, dim=64, n_heads=2, n_layers=1, position="sinusoidal", init_std=0.05)
    table = POSITIONS.get("sinusoidal")(cfg, 32).embed(torch.arange(100))
    assert table.pow(2).mean().sqrt().item() == pytest.approx(0.05, rel=1e-5)


def test_learned_positions_refuse_lengths_past_max_seq_len():
    model = Transformer(ModelConfig(vocab_size=8, dim=16, n_heads=2, n_layers=1, max_seq_len=8, position="learned"))
    model(torch.zeros(1, 8, dtype=torch.long))
    with pytest.raises(ValueError, match="sequence length 9 exceeds max_seq_len=8"):
        model(torch.zeros(1, 9, dtype=torch.long))
    cache = model.new_cache(1, 8)
    model(torch.zeros(1, 8, dtype=torch.long), cache=cache)
    with pytest.raises(ValueError, match="max_len=8"):
        model(torch.zeros(1, 1, dtype=torch.long), cache=cache)
    with pytest.raises(ValueError, match="exceeds max_seq_len=8"):
        model.new_cache(1, 9)


@pytest.mark.parametrize("position", ["rope", "alibi", "sinusoidal", "none"])
def test_extrapolating_schemes_run_past_max_seq_len(position):
    model = Transformer(ModelConfig(vocab_size=8, dim=16, n_heads=2, n_layers=1, max_seq_len=8, position=position))
    assert model(torch.zeros(1, 20, dtype=torch.long)).shape == (1, 20, 8)
