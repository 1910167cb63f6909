import dataclasses
import math

import pytest
import torch
from conftest import tiny_config, tiny_model
from safetensors import safe_open

from attnzoo import ModelConfig, Transformer
from attnzoo.attention import AttentionContext, eager_attention, repeat_kv, sdpa_attention
from attnzoo.positions import POSITIONS

POSITION_NAMES = ["none", "learned", "sinusoidal", "rope", "alibi"]
KV_HEADS = {"mha": 4, "gqa": 2, "mqa": 1}  # with 4 query heads


def cached_logits(model, idx, prefill, single_steps):
    """Prefill, then token by token, then the rest as one multi-token chunk on a non-empty cache."""
    cache = model.new_cache(idx.shape[0], idx.shape[1])
    pieces = [model(idx[:, :prefill], cache=cache)]
    for t in range(prefill, prefill + single_steps):
        pieces.append(model(idx[:, t : t + 1], cache=cache))
    pieces.append(model(idx[:, prefill + single_steps :], cache=cache))
    assert cache.length == idx.shape[1]
    return torch.cat(pieces, dim=1)


@pytest.mark.parametrize("position", POSITION_NAMES)
@pytest.mark.parametrize("heads", KV_HEADS)
def test_eager_equals_sdpa(position, heads):
    cfg = tiny_config(position=position, n_kv_heads=KV_HEADS[heads], attn_backend="eager")
    eager = Transformer(cfg).eval()
    sdpa = Transformer(dataclasses.replace(cfg, attn_backend="sdpa")).eval()
    sdpa.load_state_dict(eager.state_dict())
    idx = torch.randint(0, 61, (2, 40))
    # fp32; the two kernels sum in different orders.
    torch.testing.assert_close(sdpa(idx), eager(idx), atol=1e-5, rtol=0)


@pytest.mark.parametrize("backend", ["eager", "sdpa"])
@pytest.mark.parametrize("position", POSITION_NAMES)
@pytest.mark.parametrize("heads", KV_HEADS)
def test_cached_decoding_equals_full_forward(position, heads, backend):
    model = tiny_model(position=position, n_kv_heads=KV_HEADS[heads], attn_backend=backend)
    idx = torch.randint(0, 61, (2, 40))
    full = model(idx)
    for prefill, steps in ((1, 6), (13, 5)):
        assert (cached_logits(model, idx, prefill, steps) - full).abs().max() <= 1e-5


@pytest.mark.parametrize("rope_type", ["linear", "yarn", "llama3"])
def test_cached_decoding_equals_full_forward_with_rope_scaling(rope_type):
    options = {"rope_type": rope_type, "factor": 4.0, "original_max_position_embeddings": 16}
    model = tiny_model(position_options={"partial_rotary_factor": 0.5, **options})
    idx = torch.randint(0, 61, (1, 40))
    assert (cached_logits(model, idx, 9, 4) - model(idx)).abs().max() <= 1e-5


def test_dynamic_ntk_cache_is_exact_within_the_original_context_only():
    # Dynamic NTK re-derives θ from the length so far (as HF does); cached keys keep the rotation they
    # were stored with, so past the original context a cache and a full forward differ by design.
    options = {"rope_type": "dynamic", "factor": 4.0, "original_max_position_embeddings": 24}
    model = tiny_model(position_options=options, init_std=0.3)
    idx = torch.randint(0, 61, (1, 40))
    within = cached_logits(model, idx[:, :24], 8, 4)
    assert (within - model(idx[:, :24])).abs().max() <= 1e-5
    assert (cached_logits(model, idx, 8, 4) - model(idx)).abs().max() > 1e-3


def test_query_head_h_reads_kv_head_h_over_n_rep():
    batch, n_heads, n_kv_heads, T, d = 2, 6, 2, 9, 8
    q, k, v = (
        torch.randn(batch, n_heads, T, d),
        torch.randn(batch, n_kv_heads, T, d),
        torch.randn(batch, n_kv_heads, T, d),
    )
    cfg = ModelConfig(vocab_size=8, dim=48, n_heads=6, n_kv_heads=2, n_layers=1, position="none")
    ctx = AttentionContext(torch.arange(T), 0, POSITIONS.get("none")(cfg, d), None)
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    expected = torch.stack(
        [
            (q[:, h] @ k[:, h // 3].transpose(-1, -2) / math.sqrt(d)).masked_fill(~causal, -torch.inf).softmax(-1)
            @ v[:, h // 3]
            for h in range(n_heads)
        ],
        dim=1,
    )
    torch.testing.assert_close(eager_attention(q, k, v, ctx)[0], expected, atol=1e-6, rtol=0)
    torch.testing.assert_close(sdpa_attention(q, k, v, ctx), expected, atol=1e-6, rtol=0)
    assert torch.equal(repeat_kv(k, 3), k.repeat_interleave(3, dim=1))


def test_sdpa_training_saves_no_per_head_t_by_t_tensor():
    # Memory linear in T: nothing of shape (..., T, T) may be kept for backward on the SDPA path.
    T = 64

    def saved_square_tensors(backend):
        model = Transformer(tiny_config(attn_backend=backend, max_seq_len=T))
        squares = []

        def pack(tensor):
            if tensor.dim() >= 2 and tensor.shape[-2:] == (T, T):
                squares.append(tuple(tensor.shape))
            return tensor

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
            model(torch.randint(0, 61, (2, T)), torch.randint(0, 61, (2, T)))[1].backward()
        return squares

    assert saved_square_tensors("eager"), "the probe must see the eager path's (T, T) probabilities"
    assert saved_square_tensors("sdpa") == []


def test_attention_maps_are_causal_distributions():
    model = tiny_model()
    maps = model.attention_maps(torch.randint(0, 61, (2, 10)))
    assert len(maps) == 2 and maps[0].shape == (2, 4, 10, 10)
    torch.testing.assert_close(maps[1].sum(-1), torch.ones(2, 4, 10))
    assert maps[0].triu(diagonal=1).abs().max() == 0


# --- generation -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("position", POSITION_NAMES)
def test_greedy_generation_with_and_without_cache_agree(position):
    model = tiny_model(position=position, n_kv_heads=2)
    prompt = torch.randint(0, 61, (2, 5))
    cached = model.generate(prompt, 20, temperature=0)
    assert cached.shape == (2, 25) and torch.equal(cached[:, :5], prompt)
    assert torch.equal(cached, model.generate(prompt, 20, temperature=0, use_cache=False))


def test_sampling_is_reproducible_and_cache_independent():
    model = tiny_model()
    prompt = torch.randint(0, 61, (3, 4))

    def sample(use_cache, seed=7):
        generator = torch.Generator().manual_seed(seed)
        return model.generate(
            prompt, 12, temperature=1.0, top_k=20, top_p=0.9, generator=generator, use_cache=use_cache
        )

    assert torch.equal(sample(True), sample(False))
    assert not torch.equal(sample(True, seed=7), sample(True, seed=8))


def test_top_k_one_and_tiny_top_p_are_greedy():
    model = tiny_model()
    prompt = torch.randint(0, 61, (2, 4))
    greedy = model.generate(prompt, 8, temperature=0)
    assert torch.equal(model.generate(prompt, 8, temperature=1.5, top_k=1), greedy)
    assert torch.equal(model.generate(prompt, 8, temperature=1.5, top_p=1e-6), greedy)


def test_sampling_respects_top_k():
    from attnzoo.generation import sample_next_token

    logits = torch.arange(10.0).repeat(500, 1)
    tokens = sample_next_token(logits, temperature=5.0, top_k=3, generator=torch.Generator().manual_seed(0))
    assert set(tokens.tolist()) == {7, 8, 9}


def test_generation_stops_at_eos_and_pads_finished_rows():
    model = tiny_model()
    prompt = torch.randint(0, 61, (2, 4))
    greedy = model.generate(prompt, 6, temperature=0)
    eos = int(greedy[0, 4])  # row 0's first new token
    out = model.generate(prompt, 6, temperature=0, eos_token_id=eos)
    assert out[0, 4] == eos and (out[0, 4:] == eos).all()
    if eos not in greedy[1, 4:].tolist():
        assert torch.equal(out[1], greedy[1])  # row 1 never finishes, so it runs the full length


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(temperature=-1.0), "temperature=-1.0"),
        (dict(top_k=0), "top_k=0"),
        (dict(top_p=1.5), "top_p=1.5"),
        (dict(max_new_tokens=-1), "max_new_tokens=-1"),
    ],
)
def test_generate_rejects_bad_arguments(kwargs, message):
    model = tiny_model()
    with pytest.raises(ValueError, match=message.replace(".", r"\.")):
        model.generate(torch.zeros(1, 2, dtype=torch.long), **{"max_new_tokens": 3, **kwargs})


def test_cache_rejects_a_different_batch_and_overflow():
    model = tiny_model()
    cache = model.new_cache(2, 5)
    with pytest.raises(ValueError, match="batch size 1 differs from the cache's batch_size=2"):
        model(torch.zeros(1, 2, dtype=torch.long), cache=cache)
    model(torch.zeros(2, 5, dtype=torch.long), cache=cache)
    with pytest.raises(ValueError, match="holds 5 of max_len=5"):
        model(torch.zeros(2, 1, dtype=torch.long), cache=cache)


def test_bad_inputs_are_clear_errors():
    model = tiny_model()
    with pytest.raises(ValueError, match=r"\(batch, seq_len\)"):
        model(torch.zeros(5, dtype=torch.long))
    with pytest.raises(ValueError, match=r"\(batch, seq_len\)"):
        model.generate(torch.zeros(5, dtype=torch.long), 2)
    with pytest.raises(ValueError, match="no tokens"):
        model(torch.zeros(1, 0, dtype=torch.long))
    with pytest.raises(ValueError, match=r"integer token ids; got dtype torch\.float32"):
        model(torch.zeros(1, 3))
    with pytest.raises(ValueError, match=r"token id 61 is outside the vocabulary \[0, 61\)"):
        model(torch.tensor([[1, 61]]))
    with pytest.raises(ValueError, match="token id -1"):
        model(torch.tensor([[-1, 2]]))
    with pytest.raises(ValueError, match=r"targets must have the shape of idx \(1, 3\); got \(1, 2\)"):
        model(torch.zeros(1, 3, dtype=torch.long), torch.zeros(1, 2, dtype=torch.long))


def test_generation_can_fill_a_learned_table_exactly():
    # The last sampled token is never fed back, so a full max_seq_len prompt can still take one more token.
    model = tiny_model(position="learned", max_seq_len=16)
    prompt = torch.randint(0, 61, (1, 16))
    cached = model.generate(prompt, 1, temperature=0)
    assert cached.shape == (1, 17) and torch.equal(cached, model.generate(prompt, 1, temperature=0, use_cache=False))
    with pytest.raises(ValueError, match="exceeds max_seq_len=16"):
        model.generate(prompt, 2, temperature=0)


# --- save / load ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("tie", [True, False])
def test_save_and_load_round_trip(tmp_path, tie):
    model = tiny_model(tie_embeddings=tie, position="learned", n_kv_heads=2)
    model.save_pretrained(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json", "model.safetensors"]
    loaded = Transformer.from_pretrained(tmp_path).eval()
    assert loaded.config == model.config
    idx = torch.randint(0, 61, (2, 16))
    assert torch.equal(loaded(idx), model(idx))
    with safe_open(tmp_path / "model.safetensors", "pt") as f:
        stored = set(f.keys())
    assert ("lm_head.weight" in stored) != tie  # a tied head is stored once, under the embedding
    assert (loaded.lm_head.weight is loaded.embed_tokens.weight) == tie


def test_loading_refuses_mismatched_or_missing_files(tmp_path):
    Transformer(tiny_config()).save_pretrained(tmp_path)
    tiny_config(dim=64, n_heads=4).to_json(tmp_path / "config.json")
    with pytest.raises(ValueError, match="cannot read weights"):
        Transformer.from_pretrained(tmp_path)
    (tmp_path / "model.safetensors").write_bytes(b"\x00" * 10)
    with pytest.raises(ValueError, match="cannot read weights"):
        Transformer.from_pretrained(tmp_path)
    with pytest.raises(FileNotFoundError, match=r"model\.safetensors"):
        Transformer.from_pretrained(tmp_path / "missing")


# --- block variants used by converted models ----------------------------------------------------------------


def test_parallel_residual_block_formula():
    # GPT-NeoX: both branches read the block input: x + attn(norm1(x)) + mlp(norm2(x)).
    model = tiny_model(n_layers=1, parallel_residual=True, norm="layernorm", bias=True, mlp="gelu")
    idx = torch.randint(0, 61, (2, 9))
    block = model.layers[0]
    x = model.embed_tokens(idx)
    ctx = model._context(2, 9, cache=None, maps=None)
    expected = x + block.self_attn(block.input_layernorm(x), ctx) + block.mlp(block.post_attention_layernorm(x))
    torch.testing.assert_close(model(idx), model.lm_head(model.norm(expected)))


def test_embedding_norm_and_tanh_gelu():
    model = tiny_model(embedding_norm=True, mlp="gelu_tanh", norm="layernorm", bias=True)
    assert model.embed_norm is not None
    h = torch.randn(3, 32)
    mlp = model.layers[0].mlp
    up = mlp.up_proj(h)
    tanh_gelu = 0.5 * up * (1 + torch.tanh(math.sqrt(2 / math.pi) * (up + 0.044715 * up**3)))
    torch.testing.assert_close(mlp(h), mlp.down_proj(tanh_gelu), atol=1e-6, rtol=0)
    with torch.no_grad():
        model.embed_norm.weight.zero_()
        model.embed_norm.bias.fill_(0.5)
    # With a constant embedding norm the first block's input no longer depends on the tokens.
    maps = model.attention_maps(torch.randint(0, 61, (2, 6)))
    torch.testing.assert_close(maps[0][0], maps[0][1])


def test_scaled_embeddings_are_the_fairseq_layout_and_decode_as_the_full_forward():
    # Vaswani et al. §3.4 / fairseq: x = √d·E[token] + PE with a unit sinusoidal table, E ~ N(0, 1/d), tied to the head.
    torch.manual_seed(0)
    config = tiny_config(dim=64, position="sinusoidal", scale_embeddings=True)
    model = Transformer(config).eval()
    assert model.embed_tokens.weight.std().item() == pytest.approx(1 / 8, rel=0.05)  # 1/√64, not init_std
    assert model.lm_head.weight is model.embed_tokens.weight
    idx = torch.randint(0, 61, (2, 12))
    table = model.position.embed(torch.arange(12))
    torch.testing.assert_close(table.pow(2).mean(), torch.tensor(0.5), rtol=0.02, atol=0)  # a = 1: sin² + cos² = 1
    hidden = model.embed_tokens(idx) * 8 + table
    for block in model.layers:
        hidden = block(hidden, model._context(2, 12, cache=None, maps=None), None)
    torch.testing.assert_close(model(idx), model.lm_head(model.norm(hidden)), rtol=0, atol=0)
    # encode scales the vectors that take the embeddings' place, as it scales the embeddings
    torch.testing.assert_close(model.lm_head(model.encode(model.embed_tokens(idx))), model(idx), rtol=0, atol=0)
    torch.testing.assert_close(cached_logits(model, idx, prefill=5, single_steps=4), model(idx), rtol=1e-5, atol=1e-5)
    prompt = idx[:1, :4]
    cached = model.generate(prompt, 6, temperature=0)
    assert torch.equal(cached, model.generate(prompt, 6, temperature=0, use_cache=False))
    unscaled = Transformer(dataclasses.replace(config, scale_embeddings=False))
    assert unscaled.embed_tokens.weight.std().item() == pytest.approx(config.init_std, rel=0.05)
    assert unscaled.position.amplitude == pytest.approx(math.sqrt(2) * config.init_std)
    with pytest.raises(ValueError, match=r"scale_embeddings.*must be true or false"):
        tiny_config(scale_embeddings="yes")


def test_encode_takes_embeddings_in_place_of_tokens():
    model = tiny_model(vocab_size=32, dim=16, n_heads=2, position="sinusoidal")
    idx = torch.randint(0, 32, (2, 9))
    torch.testing.assert_close(model.lm_head(model.encode(model.embed_tokens(idx))), model(idx), rtol=0, atol=0)
    with pytest.raises(ValueError, match=r"embeddings must have shape \(batch >= 1, seq_len >= 1, dim=16\)"):
        model.encode(torch.zeros(2, 9, 8))
