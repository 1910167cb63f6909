"""Static decoding and compiled generation: ``attnzoo.cache``, ``attnzoo.decoding``, ``generate(compile=True)``.

* The static step (a cache made with ``static=True``: every one-token step attends over the whole buffers, the mask
  built from the position tensor) equals the growing cache and the full forward, for every mechanism × positional
  scheme × MHA/GQA/MQA, eagerly (fp32, ≤ 1e-5 absolute on logits of magnitude ~1: they differ only in how many
  masked slots the sums run over).
* ``decode_step`` traces into one graph (``fullgraph=True``) that serves every step: one frame, no recompiles.
* Compiled greedy decoding equals eager greedy decoding token for token, and later calls do not recompile.
"""

import copy
import io
import itertools
import json

import pytest
import torch
from conftest import TINY_MODEL, tiny_config
from torch._dynamo.testing import CompileCounter
from torch._dynamo.utils import counters

from attnzoo import ModelConfig, Transformer
from attnzoo.attention import ATTENTION, AttentionContext
from attnzoo.cache import WindowCache
from attnzoo.cli import main
from attnzoo.data.tokenizers import ByteTokenizer
from attnzoo.decoding import CAPACITY_QUANTUM, CompiledDecoder, cache_capacity
from attnzoo.positions import POSITIONS

MECHANISMS = ATTENTION.names()  # plugins included: a mechanism or scheme added later is tested, not skipped
POSITION_NAMES = POSITIONS.names()
KV_HEADS = {"mha": 4, "gqa": 2, "mqa": 1}  # with 4 query heads
VOCAB = TINY_MODEL["vocab_size"]
TOL = 1e-5  # fp32 logits; measured worst case 2.4e-7
SCALED = {"factor": 4.0, "original_max_position_embeddings": 8}  # RoPE scaling that acts within 14 tokens


def make_model(attention="mha", position="rope", n_kv_heads=2, **fields) -> Transformer:
    """A tiny model whose every parameter is drawn at std 0.3, so that each mechanism's own parameters (DCMHA's
    dynamic weights, selective's temperatures, Diff's λ) change the output. DCMHA alternates a local layer, whose
    cache is a ring of 5, with a global one."""
    options = {"window_type": "LG", "window_size": 5, "q_chunk_size": 4} if attention == "dcmha" else {}
    options = {**options, **fields.pop("attention_options", {})}
    # max_seq_len 48: the compiled decoder rounds its cache up within it (test_compiled_generate_equals_eager_...).
    fields = {"max_seq_len": 48, **fields}
    cfg = tiny_config(
        **fields, n_kv_heads=n_kv_heads, attention=attention, position=position, attention_options=options
    )
    model = Transformer(cfg).eval()
    with torch.no_grad():
        for param in model.parameters():
            param.normal_(std=0.3)
    return model


def decode_logits(model, idx, prefill, *, static):
    """Logits of a prefill of ``prefill`` tokens, then of one token at a time, on a growing or static cache."""
    cache = model.new_cache(idx.shape[0], idx.shape[1] + 3, static=static)  # spare slots: unwritten ones are read
    with torch.no_grad():
        pieces = [model(idx[:, :prefill], cache=cache)]
        pieces += [model(idx[:, t : t + 1], cache=cache) for t in range(prefill, idx.shape[1])]
    return torch.cat(pieces, dim=1)


def static_context(position, last):
    cfg = ModelConfig(vocab_size=8, dim=8, n_heads=1, n_layers=1, position=position)
    scheme = POSITIONS.get(position)(cfg, 8)
    positions = torch.tensor([last])
    return AttentionContext(positions, None, scheme, None, static=True)


# --- the static path, eager ---------------------------------------------------------------------------------


def test_static_key_positions_are_what_each_slot_holds():
    # A ring of 3 after positions 0..4: slots hold 3, 4, 2. Before it fills, unwritten slots get their future
    # position, which the causal mask excludes; a buffer of max_len slots is 0 .. max_len−1 whatever the step.
    assert static_context("none", 4).key_positions(3).tolist() == [3, 4, 2]
    assert static_context("none", 0).key_positions(3).tolist() == [0, 1, 2]
    assert static_context("none", 1).key_positions(3).tolist() == [0, 1, 2]
    assert static_context("none", 2).key_positions(8).tolist() == list(range(8))
    ctx = static_context("none", 1)
    assert ctx.allowed(3).tolist() == [[True, True, False]]
    assert ctx.allowed(3, window=2).tolist() == [[True, True, False]]
    assert static_context("none", 4).allowed(3, window=2).tolist() == [[True, True, False]]  # 3 and 4, not 2


def test_static_ring_writes_in_place_and_returns_the_whole_ring():
    values = torch.arange(10.0).view(1, 1, 10, 1)  # the value stored at position p is p
    cache = WindowCache(3, k=torch.full((1, 1, 3, 1), -1.0))
    for p in range(7):
        positions, entries = cache.extend(static_context("none", p), k=values[:, :, p : p + 1])
        assert entries.shape == (1, 1, 3, 1)  # the same shape every step
        written = [slot for slot in range(3) if slot <= p]
        assert [entries.flatten()[s].item() for s in written] == [positions[s].item() for s in written]
    assert cache.buffers["k"].flatten().tolist() == [6, 4, 5]


@pytest.mark.parametrize("heads", KV_HEADS)
@pytest.mark.parametrize(("attention", "position"), list(itertools.product(MECHANISMS, POSITION_NAMES)))
def test_static_step_equals_growing_cache_and_full_forward(attention, position, heads):
    model = make_model(attention, position, KV_HEADS[heads])
    idx = torch.randint(0, VOCAB, (2, 14))  # 11 single steps: DCMHA's ring of 5 wraps twice
    static = decode_logits(model, idx, 3, static=True)
    torch.testing.assert_close(static, decode_logits(model, idx, 3, static=False), atol=TOL, rtol=0)
    with torch.no_grad():
        torch.testing.assert_close(static, model(idx), atol=TOL, rtol=0)


@pytest.mark.parametrize(
    ("attention", "fields"),
    [
        pytest.param("mha", {"attn_backend": "eager"}, id="mha-eager"),
        pytest.param("diff", {"attn_backend": "eager", "position": "alibi"}, id="diff-eager-alibi"),
        pytest.param("selective", {"attention_options": {"temperature_fn": "mlp"}}, id="selective-mlp"),
        pytest.param("dcmha", {"attn_backend": "eager", "position": "alibi"}, id="dcmha-eager-alibi"),
        pytest.param("dcmha", {"attention_options": {"query_wise": True}}, id="dcmha-query-wise"),
        pytest.param("dcmha", {"attention_options": {"pre_compose": False}}, id="dcmha-post-only"),
        pytest.param(
            "dcmha", {"attention_options": {"num_groups": 2, "static_proj": True, "qk_norm": True}}, id="dcmha-grouped"
        ),
        # A window longer than the cache: the local layer's buffer is max_len long, not a ring.
        pytest.param("dcmha", {"attention_options": {"window_type": "L", "window_size": 64}}, id="dcmha-long-window"),
        pytest.param("mha", {"position_options": {"rope_type": "yarn", **SCALED}}, id="rope-yarn"),
        pytest.param("mha", {"position_options": {"rope_type": "llama3", **SCALED}}, id="rope-llama3"),
        pytest.param(
            "mha",
            {"position_options": {"rope_type": "linear", "factor": 2.0, "partial_rotary_factor": 0.5}},
            id="rope-linear-partial",
        ),
        pytest.param("mha", {"dtype": torch.float64}, id="float64"),
    ],
)
def test_static_step_equals_growing_cache_for_backends_options_and_rope_scaling(attention, fields):
    fields = dict(fields)
    dtype = fields.pop("dtype", torch.float32)
    model = make_model(attention, **fields).to(dtype)
    idx = torch.randint(0, VOCAB, (2, 14))
    torch.testing.assert_close(
        decode_logits(model, idx, 3, static=True), decode_logits(model, idx, 3, static=False), atol=TOL, rtol=0
    )


def test_dynamic_rope_static_step_computes_theta_from_the_position_tensor():
    # Dynamic NTK recomputes θ from the length so far; past original_max_position_embeddings = 8 it changes every
    # step, which the static step must follow with a tensor, not a Python branch.
    options = {"rope_type": "dynamic", "factor": 4.0, "original_max_position_embeddings": 8}
    model = make_model(position_options=options)
    idx = torch.randint(0, VOCAB, (2, 16))
    static = decode_logits(model, idx, 3, static=True)
    torch.testing.assert_close(static, decode_logits(model, idx, 3, static=False), atol=TOL, rtol=0)
    with torch.no_grad():  # the cache keeps each key's rotation, so past the original context it is not the full one
        assert (static - model(idx)).abs().max() > 1e-3


def test_reset_clears_a_static_cache_whose_masked_slots_are_read():
    model = make_model()
    idx = torch.randint(0, VOCAB, (2, 8))
    cache = model.new_cache(2, 12, static=True)
    with torch.no_grad():
        expected = model(idx, cache=cache)
        for layer in cache.layers:
            for buffer in layer.buffers.values():
                buffer.fill_(float("nan"))  # what an earlier sequence may have left
        cache.length = 7
        assert model(idx[:, 7:8], cache=cache).isnan().all()  # a masked slot enters as 0·NaN
        cache.reset()
        steps = [model(idx[:, :1], cache=cache)] + [model(idx[:, t : t + 1], cache=cache) for t in range(1, 8)]
    torch.testing.assert_close(torch.cat(steps, dim=1), expected, atol=TOL, rtol=0)


def test_cache_capacity_rounds_up_within_max_seq_len():
    assert cache_capacity(20, 48) == 48
    assert cache_capacity(300, 4096) == 2 * CAPACITY_QUANTUM
    assert cache_capacity(512, 4096) == 512
    assert cache_capacity(100, 64) == 100  # RoPE past max_seq_len: never less than needed


def test_generate_refuses_compile_without_a_cache_or_as_a_non_bool():
    model = make_model()
    prompt = torch.zeros(1, 2, dtype=torch.long)
    with pytest.raises(ValueError, match="compile=True is invalid: needs use_cache=True"):
        model.generate(prompt, 2, compile=True, use_cache=False)
    with pytest.raises(ValueError, match="compile='yes' is invalid: must be true or false"):
        model.generate(prompt, 2, compile="yes")


# --- tracing: one graph for every step -----------------------------------------------------------------------


@pytest.fixture
def fresh_dynamo():
    """Compiled entries live on the step's code object: each test starts without any."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def trace_every_step(model, length=16, prefill=3) -> CompileCounter:
    """Decode with a :class:`CompiledDecoder` under dynamo alone (no code generation, so fast) and
    ``fullgraph=True``, which fails on any graph break, for every step past the prefill; return the counter of
    compiled frames."""
    counter = CompileCounter()
    decoder = CompiledDecoder(model, 2, length, backend=counter)
    idx = torch.randint(0, VOCAB, (2, length))
    with torch.no_grad():
        model(idx[:, :prefill], cache=decoder.cache)
        steps = [decoder.step(model, idx[:, t : t + 1]) for t in range(prefill, length)]
    assert decoder.cache.length == length and len(steps) == length - prefill
    return counter


# Every mechanism and every positional scheme at least once, paired in turn, with the ring of DCMHA's local layers;
# RoPE is dynamic, its θ changing every step past the original context.
TRACED = [
    (MECHANISMS[i % len(MECHANISMS)], POSITION_NAMES[i % len(POSITION_NAMES)])
    for i in range(max(len(MECHANISMS), len(POSITION_NAMES)))
]
DYNAMIC_ROPE = {"position_options": {"rope_type": "dynamic", "factor": 2.0, "original_max_position_embeddings": 8}}


@pytest.mark.parametrize(("attention", "position"), TRACED, ids=[f"{a}-{p}" for a, p in TRACED])
def test_decode_step_is_one_graph_for_every_step(attention, position, fresh_dynamo):
    fields = DYNAMIC_ROPE if position == "rope" else {}
    assert trace_every_step(make_model(attention, position, **fields)).frame_count == 1


def test_each_decoder_counts_its_own_recompiles(fresh_dynamo):
    # Dynamo's recompile limit is per code object: with it at 1, decoders sharing one would fail from the second
    # model on (fullgraph), as a check over every mechanism would at the default limit of 8.
    mechanisms = ["mha", "diff_v2", "selective"]
    counters = [CompileCounter() for _ in mechanisms]
    with torch._dynamo.config.patch(recompile_limit=1):
        for attention, counter in zip(mechanisms, counters, strict=True):
            model = make_model(attention, n_layers=1)
            decoder = CompiledDecoder(model, 1, 4, backend=counter)
            with torch.no_grad():
                model(torch.zeros(1, 1, dtype=torch.long), cache=decoder.cache)
                decoder.step(model, torch.zeros(1, 1, dtype=torch.long))
    assert [counter.frame_count for counter in counters] == [1, 1, 1]


def test_a_model_with_a_compiled_decoder_pickles_and_copies_without_it(fresh_dynamo):
    # The compiled step's function is made at run time (_own_step), which pickle cannot find by name: torch.save of
    # the whole model failed once it had decoded with compile=True.
    model = make_model(n_layers=1)
    model._decoder = CompiledDecoder(model, 1, 4, backend=CompileCounter())
    buffer = io.BytesIO()
    torch.save(model, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)
    assert loaded._decoder is None and model._decoder is not None
    assert copy.deepcopy(model)._decoder is None  # a copy compiles its own, rather than carry a second cache
    idx = torch.randint(0, VOCAB, (1, 5))
    with torch.no_grad():
        assert torch.equal(loaded(idx), model(idx))


# --- compiled generation (inductor) ---------------------------------------------------------------------------


def graphs() -> int:
    return counters["stats"]["unique_graphs"]


def test_compiled_generate_equals_eager_and_does_not_recompile(fresh_dynamo):
    model = make_model("mha", "rope", n_kv_heads=2)
    prompt = torch.randint(0, VOCAB, (2, 5))
    eager = model.generate(prompt, 20, temperature=0)
    before = graphs()
    compiled = model.generate(prompt, 20, temperature=0, compile=True)
    assert torch.equal(compiled, eager)
    assert graphs() == before + 1  # 19 compiled steps, one graph
    decoder = model._decoder
    assert decoder.cache.max_len == 48  # rounded up within max_seq_len

    # Another prompt, another length and sampling: the same decoder and cache, and no new graph.
    other = torch.randint(0, VOCAB, (2, 9))
    assert torch.equal(model.generate(other, 12, temperature=0, compile=True), model.generate(other, 12, temperature=0))

    def sample(compile):
        generator = torch.Generator().manual_seed(3)
        return model.generate(other, 12, temperature=1.0, top_k=20, generator=generator, compile=compile)

    assert torch.equal(sample(compile=True), sample(compile=False))
    assert model._decoder is decoder and graphs() == before + 1


@pytest.mark.slow
@pytest.mark.parametrize(
    ("attention", "position"),
    [("diff", "alibi"), ("diff_v2", "rope"), ("selective", "learned"), ("dcmha", "alibi"), ("dcmha", "rope")],
)
def test_compiled_generate_equals_eager_for_every_mechanism(attention, position, fresh_dynamo):
    # One layer compiles in half the time; DCMHA keeps two, its local layer's ring and a global one.
    model = make_model(attention, position, n_kv_heads=2, n_layers=2 if attention == "dcmha" else 1)
    prompt = torch.randint(0, VOCAB, (2, 4))
    before = graphs()
    # 24 new tokens: DCMHA's ring of 5 wraps several times under the compiled step.
    assert torch.equal(
        model.generate(prompt, 24, temperature=0, compile=True), model.generate(prompt, 24, temperature=0)
    )
    assert graphs() == before + 1


def test_cli_generate_compile_passes_compile(tmp_path, monkeypatch, capsys):
    model = Transformer(ModelConfig(vocab_size=256, dim=16, n_layers=1, n_heads=2))
    model.save_pretrained(tmp_path)
    (tmp_path / "tokenizer.json").write_text(json.dumps(ByteTokenizer().to_dict()))
    seen = []
    generate = Transformer.generate

    def spy(self, *args, **kwargs):
        seen.append(kwargs["compile"])
        return generate(self, *args, **{**kwargs, "compile": False})

    monkeypatch.setattr(Transformer, "generate", spy)
    argv = ["generate", str(tmp_path), "--prompt", "ab", "--max-new-tokens", "3", "--temperature", "0"]
    assert main(argv) == 0 and main([*argv, "--compile"]) == 0
    assert seen == [False, True]
    first, second = capsys.readouterr().out.splitlines()[:2]
    assert first == second


@pytest.mark.cuda
def test_compiled_generate_on_cuda_uses_cuda_graphs_and_equals_eager(fresh_dynamo):
    model = make_model("dcmha", "rope", n_kv_heads=2).cuda()
    prompt = torch.randint(0, VOCAB, (2, 4), device="cuda")
    before = graphs()
    compiled = model.generate(prompt, 24, temperature=0, compile=True)
    assert torch.equal(compiled, model.generate(prompt, 24, temperature=0))
    assert torch.equal(model.generate(prompt, 24, temperature=0, compile=True), compiled)  # replayed, not recompiled
    assert graphs() == before + 1
    assert isinstance(model._decoder, CompiledDecoder) and counters["inductor"]["cudagraph_skips"] == 0


@pytest.mark.cuda
def test_an_eager_decode_step_on_cuda_leaves_cudnn_attention_out():
    """cuDNN's attention builds an execution graph for each new key length, which a growing cache brings at every
    step (kernels.DECODE_BACKENDS); the step runs flash or memory-efficient attention instead, and still equals the
    full forward."""
    model = make_model("mha", "rope").cuda()
    idx = torch.randint(0, VOCAB, (2, 9), device="cuda")
    cache = model.new_cache(2, 12)
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        full = model(idx)
        model(idx[:, :8], cache=cache)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            step = model(idx[:, 8:], cache=cache)
    ran = {event.key for event in prof.key_averages()}
    fused = {"aten::_scaled_dot_product_flash_attention", "aten::_scaled_dot_product_efficient_attention"}
    assert "aten::_scaled_dot_product_cudnn_attention" not in ran and ran & fused, sorted(ran)
    assert (step[:, -1].float() - full[:, -1].float()).abs().max().item() <= 2e-2  # bf16, as gpu_check's tolerance
