"""KV-cache memory, predicted and measured: every mechanism's ``cache_layout`` formula against what its
``new_layer_cache`` allocates, and ``attnzoo info`` printing the same numbers."""

import pytest
import torch

from attnzoo import ModelConfig, Transformer
from attnzoo.attention import ATTENTION
from attnzoo.cache import SEQ_DIM
from attnzoo.cli import main
from attnzoo.model import cache_bytes

CASES = [
    ("mha", {}, {}),
    ("mha", {"n_kv_heads": 2}, {}),
    ("mha", {"n_kv_heads": 1}, {}),
    ("mha", {"head_dim": 24}, {}),
    ("diff", {}, {}),
    ("diff", {"n_kv_heads": 2}, {}),
    ("diff", {"n_kv_heads": 1, "head_dim": 12}, {}),
    ("diff_v2", {}, {}),
    ("diff_v2", {"n_kv_heads": 1}, {}),
    ("selective", {"n_kv_heads": 2}, {}),
    ("selective", {}, {"value_temperature": False, "temperature_fn": "mlp"}),
    ("dcmha", {}, {}),
    ("dcmha", {"n_kv_heads": 2}, {"num_groups": 2}),
    ("dcmha", {}, {"pre_compose": False}),
    ("dcmha", {}, {"pre_compose": False, "post_compose": False}),
    ("dcmha", {}, {"query_wise": True}),
    ("dcmha", {}, {"window_type": "LG", "window_size": 5}),  # the ring is capped at the window
    ("dcmha", {}, {"window_type": "L", "window_size": 64}),  # a window longer than the cache
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("attention", "fields", "options"), CASES)
def test_new_cache_allocates_exactly_the_formula(attention, fields, options, dtype):
    cfg = ModelConfig(
        vocab_size=32, dim=32, n_layers=4, n_heads=4, attention=attention, attention_options=options, **fields
    )
    model = Transformer(cfg)
    batch_size, max_len = 3, 17
    cache = model.new_cache(batch_size, max_len, dtype=dtype)
    mechanism = ATTENTION.get(attention)
    layout = mechanism.cache_layout(cfg)
    predicted = cache_bytes(cfg, batch_size, max_len, dtype)
    for layer_idx, layer in enumerate(cache.layers):
        assert layer.nbytes == predicted[layer_idx]
        # Buffer by buffer: the names, and the numbers per position, as the formula states them.
        assert list(layer.buffers) == [buffer.name for buffer in layout]
        window = mechanism.key_window(cfg, layer_idx)
        positions = max_len if window is None else min(window, max_len)
        for buffer, tensor in zip(layout, layer.buffers.values(), strict=True):
            assert tensor.shape[0] == batch_size and tensor.shape[SEQ_DIM] == positions
            assert tensor.numel() // (batch_size * positions) == buffer.numbers, buffer
            assert tensor.dtype == dtype
    assert cache.nbytes == sum(predicted)
    assert mechanism.cache_bytes_per_token(cfg, dtype) == sum(b.numbers for b in layout) * dtype.itemsize


def test_the_formulas_state_the_papers_accounting():
    def numbers(attention, **changes):
        cfg = ModelConfig(**{"dim": 64, "n_heads": 8, "attention": attention, **changes})
        return sum(buffer.numbers for buffer in ATTENTION.get(attention).cache_layout(cfg))

    assert numbers("mha") == 2 * 8 * 8  # 2·H·d
    assert numbers("mha", n_kv_heads=2) == 2 * 2 * 8  # GQA: 2·G·d
    assert numbers("mha", n_kv_heads=1) == 2 * 8  # MQA
    assert numbers("diff", n_heads=4, head_dim=16) == 2 * 4 * 16  # values of width 2d = 16 per kv head
    assert numbers("dcmha") == 2 * 8 * 8 + 2 * 8 * 8  # + C·N²/G key-side matrices
    assert numbers("dcmha", attention_options={"num_groups": 4, "pre_compose": False}) == 2 * 8 * 8 + 8 * 8 // 4


def test_info_prints_the_formula_and_the_size_at_a_context(capsys):
    flags = ["--attention", "dcmha", "--dim", "64", "--n-heads", "4", "--n-layers", "2", "--data", "pystdlib"]
    assert main(["info", *flags, "--context", "1000", "--cache-batch", "2"]) == 0
    out = capsys.readouterr().out
    cfg = ModelConfig(vocab_size=256, dim=64, n_heads=4, n_layers=2, attention="dcmha")
    assert "kw  32 numbers = C·N²/G = 2·4²/1" in out
    assert "per token per layer: 160 numbers = 640 B float32, 320 B bfloat16" in out
    assert "local layers [0] keep a ring of their window (256 positions)" in out
    total = sum(cache_bytes(cfg, 2, 1000, torch.float32))
    assert total == 2 * (256 + 1000) * 640
    assert f"at context 1,000 × batch 2, float32: {total:,} B" in out
    assert main(["info", *flags, "--context", "0"]) == 1
