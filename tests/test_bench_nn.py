"""benchmarks/bench_nn.py: the two models it times compute the same function, and a tiny run writes its table."""

import json

import torch
from benchmark_scripts import load_benchmark

from attnzoo import ModelConfig, Transformer

bench_nn = load_benchmark("bench_nn")


def test_the_block_gpt_computes_the_transformers_logits():
    model = Transformer(ModelConfig(vocab_size=64, dim=32, n_layers=2, n_heads=4, attention="dcmha", max_seq_len=16))
    idx = torch.randint(0, 64, (2, 12))
    assert torch.equal(bench_nn.BlockGPT(model)(idx), model(idx))


def test_a_tiny_run_writes_its_ratios(tmp_path, monkeypatch):
    monkeypatch.setattr(bench_nn, "TOKENS_PER_STEP", 64)
    out = tmp_path / "nn.md"
    bench_nn.main(["--seq-lens", "16", "--mechanisms", "mha", "--rounds", "2", "--steps", "1", "--out", str(out)])
    rows = json.loads(out.with_suffix(".json").read_text())["rows"]
    assert [(row["attention"], row["seq_len"], len(row["ratios"])) for row in rows] == [("mha", 16, 2)]
    assert "| mha | 16 | 4 |" in out.read_text()
