from attnzoo import ModelConfig
from attnzoo.bench import BenchCase, measure, ratio_table


def test_measure_runs_each_mode_in_a_fresh_process_and_tables_ratios():
    cfg = ModelConfig(vocab_size=32, dim=32, n_layers=1, n_heads=2, max_seq_len=32)
    results = [
        measure(BenchCase("base", cfg, batch_size=2, seq_len=16, mode="train"), repeats=2),
        measure(BenchCase("other", cfg, batch_size=2, seq_len=16, mode="train"), repeats=2),
        measure(BenchCase("base", cfg, batch_size=1, seq_len=8, mode="decode", decode_tokens=4), repeats=2),
        measure(BenchCase("nocache", cfg, 1, 8, mode="decode", decode_tokens=4, use_cache=False), repeats=2),
    ]
    for r in results:
        assert r.tokens_per_s_min <= r.tokens_per_s <= r.tokens_per_s_max and r.tokens_per_s > 0
        assert r.peak_mem_mb >= 0
    assert results[0].extra["params"] == results[1].extra["params"]
    table = ratio_table(results, baseline="base").splitlines()
    assert len(table) == 2 + 4
    assert "| base | train | 16 | 2 |" in table[2] and "| 1.00× |" in table[2]
    assert "| base | decode | 8 | 1 |" in table[4] and "| 1.00× |" in table[4]
    assert "| nocache | decode | 8 | 1 |" in table[5]
