"""Selective self-attention (Zhang et al., NeurIPS 2024): temperatures on queries and values."""

import dataclasses
import math

import pytest
import torch
import torch.nn.functional as F
from conftest import TINY_MODEL, tiny_config

from attnzoo import ModelConfig, Transformer

POSITIONS = ["none", "learned", "sinusoidal", "rope", "alibi"]
KV_HEADS = [4, 2, 1]  # MHA, GQA 2:1, MQA for 4 query heads
VOCAB, SEQ_LEN = TINY_MODEL["vocab_size"], 12
TOL = 1e-5  # fp32: cached vs full and SDPA vs eager differ only by summation order
PTS = {"value_temperature": False, "token_temperature": False, "position_coefficient": "pts"}
# Beyond the default (weight-shared f, one α per layer): the separate MLP with per-head α, and the official PTS.
OTHER_FORMS = {"mlp-per-head": {"temperature_fn": "mlp", "per_head_coefficient": True}, "pts": PTS}


def make_config(attention="selective", position="rope", n_kv_heads=4, n_layers=2, backend="auto", **options):
    # init_std=0.1 makes attention far from uniform, so a wrong temperature visibly changes the output.
    return tiny_config(
        n_layers=n_layers,
        n_kv_heads=n_kv_heads,
        attention=attention,
        attention_options=options,
        position=position,
        attn_backend=backend,
        init_std=0.1,
    )


def make_model(**kwargs) -> Transformer:
    return Transformer(make_config(**kwargs)).eval()


def with_backend(model: Transformer, backend: str) -> Transformer:
    twin = Transformer(dataclasses.replace(model.config, attn_backend=backend)).eval()
    twin.load_state_dict(model.state_dict())
    return twin


def randomize_temperatures(model: Transformer) -> Transformer:
    """Give the zero-initialised last layer of f and the coefficients N(0, 1) values, so both parts of τ matter."""
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "_temperature." in name and ".w1." not in name:
                param.normal_(0.0, 1.0)
    return model


def tokens(batch=2, seq_len=SEQ_LEN):
    return torch.randint(0, VOCAB, (batch, seq_len))


def capture_attention_io(model: Transformer, idx: torch.Tensor, layer: int = 0):
    """Run the model; return the layer's attention input x, its AttentionContext and its output."""
    seen = {}
    attn = model.layers[layer].self_attn
    pre = attn.register_forward_pre_hook(lambda module, args: seen.update(x=args[0], ctx=args[1]))
    post = attn.register_forward_hook(lambda module, args, out: seen.update(out=out))
    try:
        with torch.no_grad():
            model(idx)
    finally:
        pre.remove()
        post.remove()
    return seen["x"], seen["ctx"], seen["out"]


def reference_selective(attn, x, slopes=None):
    """Written out per batch, head and query row t (n = t + 1):

    τ = 1 + tanh(w_h·GELU(p_h)) + σ(α)·log n (p = q for τ_q, p = v for τ_v);
    out_t = Σ_{s≤t} softmax_s(τ_q,t·q_t·k_s/√d − m_h·(t − s)) · τ_v,s·v_s, with query head h reading kv head
    h // (H / H_kv). Returns the layer output, the (B, H, T, T) probabilities and τ_q (B, H, T), τ_v (B, H_kv, T).
    """
    batch, seq_len, _ = x.shape
    n_heads, n_kv_heads, d = attn.n_heads, attn.n_kv_heads, attn.head_dim
    q = (x @ attn.q_proj.weight.T).view(batch, seq_len, n_heads, d)
    k = (x @ attn.k_proj.weight.T).view(batch, seq_len, n_kv_heads, d)
    v = (x @ attn.v_proj.weight.T).view(batch, seq_len, n_kv_heads, d)
    log_n = torch.log(torch.arange(1, seq_len + 1, dtype=torch.float32))[None, :, None]

    def tau(p, temperature):
        token = torch.tanh((F.gelu(p) * temperature.weight).sum(-1))
        return 1 + token + torch.sigmoid(temperature.alpha) * log_n

    tau_q, tau_v = tau(q, attn.q_temperature), tau(v, attn.v_temperature)  # (B, T, heads)
    out = torch.zeros(batch, seq_len, n_heads, d)
    probs = torch.zeros(batch, n_heads, seq_len, seq_len)
    for b in range(batch):
        for h in range(n_heads):
            g = h // (n_heads // n_kv_heads)
            for t in range(seq_len):
                logits = tau_q[b, t, h] * (k[b, : t + 1, g] @ q[b, t, h]) / math.sqrt(d)
                if slopes is not None:
                    logits = logits - slopes[h] * (t - torch.arange(t + 1))
                p = torch.softmax(logits, dim=0)
                probs[b, h, t, : t + 1] = p
                out[b, t, h] = p @ (tau_v[b, : t + 1, g, None] * v[b, : t + 1, g])
    layer_out = attn.o_proj(out.reshape(batch, seq_len, n_heads * d))
    return layer_out, probs, tau_q.transpose(1, 2), tau_v.transpose(1, 2)


@pytest.mark.parametrize("backend", ["auto", "eager"])
@pytest.mark.parametrize(
    "off",
    [
        {"token_temperature": False, "position_temperature": False},
        {"query_temperature": False, "value_temperature": False},
    ],
    ids=["parts-off", "temperatures-off"],
)
def test_everything_off_is_exactly_mha(off, backend):
    mha = make_model(attention="mha", position="alibi", n_kv_heads=2, backend=backend)
    selective = make_model(position="alibi", n_kv_heads=2, backend=backend, **off)
    selective.load_state_dict(mha.state_dict())  # strict: no parameter beyond MHA's
    idx = tokens()
    with torch.no_grad():
        assert torch.equal(selective(idx), mha(idx))


def test_mha_checkpoint_loads_with_only_the_temperatures_missing():
    mha, selective = make_model(attention="mha"), make_model()
    missing, unexpected = selective.load_state_dict(mha.state_dict(), strict=False)
    assert unexpected == []
    assert sorted(missing) == sorted(name for name, _ in selective.named_parameters() if "_temperature." in name)
    assert len(missing) == 2 * 2 * 2  # (q, v) × (w, α) × 2 layers


@pytest.mark.parametrize("position,slopes", [("none", None), ("alibi", [2.0 ** (-8 * (h + 1) / 4) for h in range(4)])])
@pytest.mark.parametrize("backend", ["auto", "eager"])
def test_matches_the_written_out_formula(position, slopes, backend):
    model = randomize_temperatures(make_model(position=position, n_kv_heads=2, n_layers=1, backend=backend))
    idx = tokens()
    x, ctx, out = capture_attention_io(model, idx)
    attn = model.layers[0].self_attn
    with torch.no_grad():
        expected, probs, tau_q, tau_v = reference_selective(attn, x, slopes)
        temperatures = attn.temperatures(x, ctx.positions)
    assert (tau_q - 1).abs().max() > 0.3 and (tau_v - 1).abs().max() > 0.3  # the test is not trivial
    assert temperatures["query"].shape == (2, 4, SEQ_LEN) and temperatures["value"].shape == (2, 2, SEQ_LEN)
    torch.testing.assert_close(temperatures["query"], tau_q, atol=1e-6, rtol=0)
    torch.testing.assert_close(temperatures["value"], tau_v, atol=1e-6, rtol=0)
    torch.testing.assert_close(out, expected, atol=TOL, rtol=0)
    torch.testing.assert_close(model.attention_maps(idx)[0], probs, atol=1e-6, rtol=0)


def grid():
    cases = [pytest.param(position, kv, {}, id=f"{position}-kv{kv}") for position in POSITIONS for kv in KV_HEADS]
    for name, options in OTHER_FORMS.items():
        cases += [
            pytest.param("rope", 2, options, id=f"rope-kv2-{name}"),
            pytest.param("alibi", 1, options, id=f"alibi-kv1-{name}"),
        ]
    return cases


@pytest.mark.parametrize("position,n_kv_heads,options", grid())
def test_sdpa_folded_into_q_equals_eager_logit_row_scaling(position, n_kv_heads, options):
    model = randomize_temperatures(make_model(position=position, n_kv_heads=n_kv_heads, **options))
    eager = with_backend(model, "eager")
    idx = tokens()
    with torch.no_grad():
        fast, reference = model(idx), eager(idx)
    assert (fast - reference).abs().max() <= TOL


@pytest.mark.parametrize("backend", ["auto", "eager"])
@pytest.mark.parametrize("position,n_kv_heads,options", grid())
def test_cached_decoding_equals_full_forward(position, n_kv_heads, options, backend):
    model = with_backend(
        randomize_temperatures(make_model(position=position, n_kv_heads=n_kv_heads, **options)), backend
    )
    idx = tokens()
    with torch.no_grad():
        full = model(idx)
        cache = model.new_cache(2, SEQ_LEN)
        steps = [model(idx[:, :5], cache=cache)] + [model(idx[:, t : t + 1], cache=cache) for t in range(5, SEQ_LEN)]
        assert (torch.cat(steps, dim=1) - full).abs().max() <= TOL
        cache = model.new_cache(2, SEQ_LEN)
        chunks = [model(idx[:, a:b], cache=cache) for a, b in ((0, 4), (4, 9), (9, SEQ_LEN))]
        assert (torch.cat(chunks, dim=1) - full).abs().max() <= TOL


def test_decode_step_uses_the_absolute_position():
    model = make_model(position="none", n_layers=1, **PTS)
    attn = model.layers[0].self_attn
    with torch.no_grad():
        attn.q_temperature.beta.fill_(0.0)  # coefficient exp(−1) ≈ 0.37: log 6 and log 1 are far apart
    idx = tokens(seq_len=6)
    seen = {}
    hook = attn.register_forward_pre_hook(lambda module, args: seen.update(x=args[0], ctx=args[1]))
    with torch.no_grad():
        cache = model.new_cache(2, 6)
        model(idx[:, :5], cache=cache)
        step = model(idx[:, 5:], cache=cache)
        hook.remove()
        tau = attn.temperatures(seen["x"], seen["ctx"].positions)["query"]
        assert torch.allclose(tau, torch.full_like(tau, 1 + math.exp(-1) * math.log(6)), atol=1e-6, rtol=0)
        assert (step - model(idx)[:, 5:]).abs().max() <= TOL
        # Had the step used n = 1 (τ = 1), its logits would be those of the model without position part.
        unscaled = Transformer(dataclasses.replace(model.config, attention="mha", attention_options={})).eval()
        unscaled.load_state_dict(model.state_dict(), strict=False)
        assert (step - unscaled(idx)[:, 5:]).abs().max() > 1e-2


@pytest.mark.parametrize("temperature_fn", ["shared", "mlp"])
def test_at_init_the_token_part_is_zero_and_the_coefficient_is_official(temperature_fn):
    model = Transformer(make_config(n_kv_heads=2, temperature_fn=temperature_fn))
    x, positions = torch.randn(2, SEQ_LEN, 32), torch.arange(SEQ_LEN)
    coefficient = math.exp(-math.exp(1.5))
    assert coefficient == pytest.approx(0.0113, abs=1e-4)
    for block in model.layers:
        attn = block.self_attn
        for temperature in (attn.q_temperature, attn.v_temperature):
            assert temperature.coefficient().item() == pytest.approx(coefficient, rel=1e-6)
        expected = 1 + coefficient * torch.log(positions.float() + 1)
        with torch.no_grad():
            for tau in attn.temperatures(x, positions).values():
                # tanh(f(x)) is exactly 0, so τ is exactly its position part.
                torch.testing.assert_close(tau, expected.expand_as(tau), atol=1e-7, rtol=0)
    pts = Transformer(make_config(**PTS))
    assert all(block.self_attn.q_temperature.beta.item() == 1.5 for block in pts.layers)


def test_pts_equals_the_official_formula():
    model = make_model(position="none", n_layers=1, **PTS)
    attn = model.layers[0].self_attn
    assert [name for name, _ in attn.named_parameters() if "_temperature." in name] == ["q_temperature.beta"]
    assert attn.q_temperature.beta.shape == (1,)  # one value per layer, as the official `beta` (not 0-dim: FSDP2)
    with torch.no_grad():
        attn.q_temperature.beta.fill_(0.3)
    for backend in ("auto", "eager"):
        model = with_backend(model, backend)
        attn = model.layers[0].self_attn
        x, _, out = capture_attention_io(model, tokens())
        batch, seq_len, _ = x.shape
        q = (x @ attn.q_proj.weight.T).view(batch, seq_len, 4, 8).transpose(1, 2)
        k = (x @ attn.k_proj.weight.T).view(batch, seq_len, 4, 8).transpose(1, 2)
        v = (x @ attn.v_proj.weight.T).view(batch, seq_len, 4, 8).transpose(1, 2)
        # As in the official lit_gpt/gpt_2_PTS.py: att * (1 + exp(−exp(β))·log(row + 1)), then mask and softmax.
        att = (q @ k.transpose(-2, -1)) / math.sqrt(8)
        row_length = torch.arange(1, seq_len + 1, dtype=torch.float32)[:, None]
        att = att * (1 + torch.exp(-torch.exp(torch.tensor(0.3))) * torch.log(row_length))
        att = att.masked_fill(~torch.ones(seq_len, seq_len, dtype=torch.bool).tril(), float("-inf"))
        y = (torch.softmax(att, dim=-1) @ v).transpose(1, 2).reshape(batch, seq_len, 32)
        with torch.no_grad():
            torch.testing.assert_close(out, attn.o_proj(y), atol=TOL, rtol=0)


def test_parameter_overhead():
    def count(attention, **options):
        cfg = ModelConfig(dim=256, n_layers=4, n_heads=8, attention=attention, attention_options=options)
        return Transformer(cfg).num_parameters()

    base = count("mha")
    n_layers, dim, n_heads, head_dim = 4, 256, 8, 32
    shared = n_layers * (n_heads * head_dim + n_heads * head_dim + 2)  # w per q and v head, α for each side
    assert count("selective") - base == shared
    assert shared / base < 0.005  # the paper's "< 0.5% new parameters"
    hidden = dim // 4
    separate = n_layers * 2 * (dim * hidden + hidden * n_heads + 1)  # W1, W2 and α for each side
    assert count("selective", temperature_fn="mlp") - base == separate


def test_temperatures_learn_from_init():
    model = make_model().train()
    idx = tokens()
    _, loss = model(idx, idx)
    loss.backward()
    for block in model.layers:
        attn = block.self_attn
        for temperature in (attn.q_temperature, attn.v_temperature):
            # The zero-initialised w still gets a gradient: d tanh(f)/dw = GELU(p) at f = 0.
            assert temperature.weight.grad.abs().max() > 0 and temperature.alpha.grad.abs() > 0


@pytest.mark.parametrize("options", [{}, PTS, {"temperature_fn": "mlp", "per_head_coefficient": True}])
def test_save_and_load_round_trip(tmp_path, options):
    model = randomize_temperatures(make_model(**options))
    model.save_pretrained(tmp_path)
    loaded = Transformer.from_pretrained(tmp_path).eval()
    idx = tokens()
    with torch.no_grad():
        assert torch.equal(loaded(idx), model(idx))


@pytest.mark.parametrize(
    "options,field",
    [
        ({"temperature_fn": "conv"}, "temperature_fn"),
        ({"position_coefficient": "softplus"}, "position_coefficient"),
        ({"query_temperature": "yes"}, "query_temperature"),
        ({"per_head_coefficient": 1}, "per_head_coefficient"),
        ({"temperature_fn": "mlp", "temperature_hidden_dim": 0}, "temperature_hidden_dim"),
        ({"temperature_hidden_dim": 16}, "temperature_hidden_dim"),
        ({"token_temperature": False, "temperature_fn": "mlp"}, "temperature_fn"),
        ({"position_temperature": False, "position_coefficient": "pts"}, "position_coefficient"),
        ({"position_temperature": False, "per_head_coefficient": True}, "per_head_coefficient"),
        ({"temperature": True}, "temperature"),
    ],
)
def test_bad_options_are_refused(options, field):
    with pytest.raises(ValueError, match=field):
        make_config(**options)


def test_the_linear_coefficient_starts_at_exactly_mha_and_the_identity_hook_returns_there():
    mha = make_model(attention="mha", position="alibi", n_kv_heads=2)
    selective = make_model(position="alibi", n_kv_heads=2, position_coefficient="linear")
    attn = selective.layers[0].self_attn
    assert [name for name, _ in attn.q_temperature.named_parameters()] == ["weight", "c"]
    selective.load_state_dict(mha.state_dict(), strict=False)
    idx = tokens()
    with torch.no_grad():
        assert torch.equal(selective(idx), mha(idx))  # f's last layer is 0 and c = 0: τ is exactly 1
        randomize_temperatures(selective)
        assert (selective(idx) - mha(idx)).abs().max() > 1e-2
        added = {name for name, _ in attn.named_parameters() if "_temperature." in name}
        assert all(
            block.self_attn.init_added_parameters_as_identity(added, mha.config) == [] for block in selective.layers
        )
        assert torch.equal(selective(idx), mha(idx))


@pytest.mark.parametrize(("options", "parameter"), [({}, "alpha"), (PTS, "beta")], ids=["sigmoid", "pts"])
def test_the_identity_hook_says_why_a_positive_coefficient_cannot_start_at_identity(options, parameter):
    attn = make_model(**options).layers[0].self_attn
    added = {name for name, _ in attn.named_parameters() if "_temperature." in name}
    coefficient = attn.q_temperature.get_parameter(parameter).clone()
    reasons = attn.init_added_parameters_as_identity(added, make_config(attention="mha"))
    assert len(set(reasons)) == 1 and "position_coefficient='linear' starts at c = 0" in reasons[0]
    assert torch.equal(attn.q_temperature.get_parameter(parameter), coefficient)  # left at its training init
