"""DCMHA's composition of one block of scores, forward + backward, in each form and at several head counts (issue 13).

    python benchmarks/bench_composition.py            # N = 8, 16, 32 → benchmarks/results/composition.md

One block as the training path composes it: (B, N, rows, keys) scores with a query side QW and a key side KW,
both needing gradients, the block of a sequence of ``--seq-len`` tokens (keys = T / 2, the causal average).
Forms, each timed fwd+bwd on the same inputs:

* ``merged``: :func:`~attnzoo.attention.dcmha.compose_merged`, the model's eager form (einsums with N×N matrices);
* ``rank-R``: :func:`~attnzoo.attention.dcmha.compose_low_rank`, the official ``_cross_head_proj`` form;
* ``compiled``: :func:`~attnzoo.attention.kernels.dcmha_compiled.compiled_compose` (``compile_composition``),
  inductor's fused loops; its first call, a warmup, compiles.

Alongside the time, the rate at which each form does the composition's multiply-adds (2·N²/G per score for the
merged map's two sides; the rank-R form does fewer, 4·R·N + 2·N), against one matmul of the same
multiply-adds measured in the same run, which is what a kernel at the matmul's efficiency would take.
Nothing else may run meanwhile (``../shared/notes/cpu_perf.md``).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch

from attnzoo.attention.dcmha import Mixing, compose_low_rank, compose_merged, key_matrices, query_matrices
from attnzoo.attention.kernels.dcmha_compiled import compiled_compose
from attnzoo.bench import machine_description
from attnzoo.io import atomic_write_text
from attnzoo.tables import Table


def timed(step: Callable[[], None], repeats: int) -> float:
    """Median seconds of ``step`` over ``repeats`` runs after one warmup."""
    step()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def random_mixing(batch: int, heads: int, rows: int, keys: int, rank: int) -> Mixing:
    def factor(length: int) -> torch.Tensor:
        return torch.randn(batch, 1, length, rank, heads) * 0.1

    def diagonal(length: int) -> torch.Tensor:
        return torch.randn(batch, 1, length, heads) * 0.1

    return Mixing(factor(rows), factor(rows), diagonal(rows), factor(keys), factor(keys), diagonal(keys))


def measure(batch: int, heads: int, rows: int, keys: int, rank: int, repeats: int) -> list[list[str]]:
    scores = torch.randn(batch, heads, rows, keys)
    mixing = random_mixing(batch, heads, rows, keys, rank)
    query_w, key_w = query_matrices(mixing, None), key_matrices(mixing)
    grad = torch.randn_like(scores)
    leaves = {
        "merged": (scores, query_w, key_w),
        "rank-R": (scores, *mixing),
        "compiled": (scores, query_w, key_w),
    }
    forms: dict[str, Callable[..., torch.Tensor]] = {
        "merged": compose_merged,
        "rank-R": lambda a, *m: compose_low_rank(a, Mixing(*m), None),
        "compiled": compiled_compose,
    }
    n_scores = scores.numel()
    merged_macs = 2 * heads * n_scores  # per score: N multiply-adds from QW, N from KW
    # The same multiply-adds as one matmul, the rate a kernel at the matmul's efficiency would reach.
    side = round((merged_macs / 2) ** (1 / 3) / 16) * 16
    left, right = torch.randn(side, 2 * side), torch.randn(2 * side, side)
    matmul_rate = side * 2 * side * side / timed(lambda: left @ right, repeats)
    rows_out = []
    for name, form in forms.items():
        inputs = [x.detach().requires_grad_() for x in leaves[name]]
        seconds = timed(lambda form=form, inputs=inputs: form(*inputs).backward(grad), repeats)
        # fwd + bwd: the map forward, the map transposed for the scores' gradient, products for the weights'
        rate = 3 * merged_macs / seconds
        rows_out.append(
            [
                str(heads),
                name,
                f"{seconds * 1e3:,.1f}",
                f"{rate / 1e9:,.1f}",
                f"{3 * merged_macs / matmul_rate * 1e3:,.1f}",
                f"{seconds * matmul_rate / (3 * merged_macs):,.1f}×",
            ]
        )
    return rows_out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--heads", type=int, nargs="+", default=[8, 16, 32])
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--rows", type=int, default=128, help="queries per block (q_chunk_size)")
    parser.add_argument("--seq-len", type=int, default=2048, help="T; the block sees T / 2 keys")
    parser.add_argument("--rank", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/composition.md"))
    args = parser.parse_args()
    counts = {name: [getattr(args, name)] for name in ("batch", "rows", "rank", "repeats", "threads")}
    for name, values in {**counts, "heads": args.heads}.items():
        if min(values) < 1:
            parser.error(f"--{name} {' '.join(map(str, values))} is invalid: must be >= 1")
    if args.seq_len < 2:
        parser.error(f"--seq-len {args.seq_len} is invalid: must be >= 2 (the block sees T / 2 keys)")
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    keys = args.seq_len // 2
    header = (
        f"Machine: {machine_description(args.threads)}. One block of (B = {args.batch}, N, {args.rows} queries, "
        f"{keys} keys) fp32 scores, query- and key-side composition, forward + backward, median of {args.repeats}."
    )
    rows = []
    for heads in args.heads:
        rows += measure(args.batch, heads, args.rows, keys, args.rank, args.repeats)
        print("\n".join("  ".join(row) for row in rows[-3:]), flush=True)
    table = Table(
        ["N", "form", "ms", "GMAC/s (merged map's)", "ms at matmul rate", "× matmul time"],
        rows,
    )
    text = f"{header}\n\n{table.to_markdown()}\n"
    print(text)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(args.out, text)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
