"""MHA eager vs SDPA: forward+backward tokens/s and peak memory at T = 256, 1024, 4096 (issue 2).

    python benchmarks/bench_backends.py [--threads 2] [--repeats 3] [--out benchmarks/results/backends.md]

Model: dim 256, 4 layers, 8 heads, byte vocab, RoPE, fp32. Batch × T = 4096 tokens per step, so every row
does the same number of tokens and only the attention's cost grows with T.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from attnzoo import ModelConfig
from attnzoo.bench import BenchCase, machine_description, measure, write_results

TOKENS_PER_STEP = 4096


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seq-lens", type=int, nargs="+", default=[256, 1024, 4096])
    parser.add_argument(
        "--out", type=Path, default=Path("benchmarks/results/backends.md"), help="markdown table; JSON beside it"
    )
    args = parser.parse_args()

    results = []
    for seq_len in args.seq_lens:
        for backend in ("sdpa", "eager"):
            cfg = ModelConfig(vocab_size=256, dim=256, n_layers=4, n_heads=8, max_seq_len=seq_len, attn_backend=backend)
            case = BenchCase(f"mha-{backend}", cfg, batch_size=max(1, TOKENS_PER_STEP // seq_len), seq_len=seq_len)
            result = measure(case, repeats=args.repeats, threads=args.threads)
            results.append(result)
            print(f"T={seq_len:5d} {backend:5s} {result.tokens_per_s:9,.0f} tok/s  {result.peak_mem_mb:8,.0f} MB")
    header = f"Machine: {machine_description(args.threads)}. Forward+backward, fp32, {TOKENS_PER_STEP} tokens/step."
    write_results(args.out, header, results, baseline="mha-sdpa")


if __name__ == "__main__":
    main()
