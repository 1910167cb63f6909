"""benchmarks/bench_decode.py: every repeat decodes what the warm-up did (its timings are not tested)."""

import argparse

import torch
from benchmark_scripts import load_benchmark

from attnzoo import ModelConfig, Transformer


def test_every_repeat_decodes_the_same_tokens_with_a_ring_cache(monkeypatch):
    # Rewinding cache.length between repeats left DCMHA's local ring holding the previous repeat's later
    # positions: the repeats decoded other tokens than the warm-up, and both eager paths alike, so "same tokens"
    # still said yes.
    bench_decode = load_benchmark("bench_decode")
    cfg = ModelConfig(
        vocab_size=64, dim=32, n_layers=2, n_heads=4, max_seq_len=32, attention="dcmha",
        attention_options={"window_size": 4, "window_type": "LG"},
    )  # fmt: skip
    model = Transformer(cfg).eval()
    with torch.no_grad():
        for param in model.parameters():
            param.normal_(std=0.3)
    decoded = []
    greedy_decode = bench_decode.greedy_decode

    def recording(*args):
        result = greedy_decode(*args)
        decoded.append(result[0])
        return result

    monkeypatch.setattr(bench_decode, "greedy_decode", recording)
    monkeypatch.setattr(bench_decode, "PATHS", ("eager", "eager-static"))  # "compiled" runs inductor: minutes
    args = argparse.Namespace(context=10, new_tokens=12, repeats=2)
    rows = bench_decode.measure(model, 2, args, torch.device("cpu"))
    assert [row["same_tokens"] for row in rows] == [True, True]
    assert len(decoded) == 6 and all(torch.equal(tokens, decoded[0]) for tokens in decoded)
