"""Each mechanism against parameter-matched MHA, measured in one run (issues 4, 5 and 6).

    python benchmarks/bench_mechanisms.py [--threads 2] [--repeats 3] [--out benchmarks/results/mechanisms.md]

Training: forward+backward tokens/s and peak memory at T = 256, 1024, 2048, 4096 tokens per step, fp32.
Decode: tokens/s of single-token steps with the cache after a 1024-token prefill (batch 1), and without
the cache (recomputing the prefix) for MHA. Baseline: `mha+rope` on the SDPA path; `mha-eager` is listed too,
since DCMHA's target is stated against it. Configs: dim 256, 4 layers, 8 heads, byte vocab, matched to the
baseline's parameter count within 2% by `attnzoo.variants.matched_configs`.
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from attnzoo import ModelConfig
from attnzoo.bench import BenchCase, machine_description, measure, write_results
from attnzoo.variants import Variant, matched_configs

TOKENS_PER_STEP = 4096
MECHANISMS = ["mha", "diff", "diff_v2", "selective", "dcmha"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seq-lens", type=int, nargs="+", default=[256, 1024, 2048])
    parser.add_argument("--decode-context", type=int, default=1024)
    parser.add_argument("--mechanisms", nargs="+", default=MECHANISMS)
    parser.add_argument(
        "--out", type=Path, default=Path("benchmarks/results/mechanisms.md"), help="markdown table; JSON beside it"
    )
    args = parser.parse_args()

    results = []

    def run(case: BenchCase) -> None:
        result = measure(case, repeats=args.repeats, threads=args.threads)
        results.append(result)
        print(
            f"{case.label:12s} {case.mode:7s} T={case.seq_len:5d} {result.tokens_per_s:9,.0f} tok/s "
            f"{result.peak_mem_mb:8,.0f} MB",
            flush=True,
        )

    for seq_len in args.seq_lens:
        baseline = ModelConfig(vocab_size=256, dim=256, n_layers=4, n_heads=8, max_seq_len=seq_len)
        configs = matched_configs([Variant(m, "rope") for m in args.mechanisms], baseline)
        batch = max(1, TOKENS_PER_STEP // seq_len)
        for label, cfg in configs.items():
            run(BenchCase(label.removesuffix("+rope"), cfg, batch, seq_len))
        eager = dataclasses.replace(configs["mha+rope"], attn_backend="eager")
        run(BenchCase("mha-eager", eager, batch, seq_len))

    context = args.decode_context
    baseline = ModelConfig(vocab_size=256, dim=256, n_layers=4, n_heads=8, max_seq_len=context + 64)
    for label, cfg in matched_configs([Variant(m, "rope") for m in args.mechanisms], baseline).items():
        run(BenchCase(label.removesuffix("+rope"), cfg, 1, context, mode="decode", decode_tokens=32))
    mha = matched_configs([Variant("mha", "rope")], baseline)["mha+rope"]
    run(BenchCase("mha", mha, 1, context, mode="decode-nocache", decode_tokens=32))

    header = (
        f"Machine: {machine_description(args.threads)}. fp32; training rows do {TOKENS_PER_STEP} tokens per "
        f"forward+backward step; decode rows time 32 single-token steps after a {context}-token prefill."
    )
    write_results(args.out, header, results, baseline="mha")


if __name__ == "__main__":
    main()
