"""Decode tokens/s, eager against compiled: ``generate(compile=True)``'s one-token step (issue 14).

    python benchmarks/bench_decode.py [--threads 2] [--repeats 3] [--batch-sizes 1 16] [--out PATH]

For each mechanism (parameter-matched to MHA of dim 256, 4 layers, 8 heads, byte vocab, RoPE, by
``attnzoo.variants``) and batch size, a prompt of ``--context`` tokens is prefilled eagerly (untimed), then
``--new-tokens`` greedy tokens are decoded one at a time, three ways:

* ``eager``: ``model(token, cache=cache)`` on a growing cache, what ``generate`` does without ``compile``;
* ``eager-static``: the same on a static cache (``new_cache(static=True)``), the compiled path's math run eagerly:
  every step attends over the whole buffers;
* ``compiled``: the step of ``generate(compile=True)`` (``attnzoo.decoding.CompiledDecoder``): inductor's default
  mode on the CPU, CUDA graphs ("reduce-overhead") on CUDA.

tok/s = batch × new tokens ÷ seconds, the median over ``--repeats`` (each after its own untimed prefill),
after one untimed warm-up, whose first compiled step is the compile time shown. "same tokens" says whether a path
decoded the greedy tokens eager did. Writes a markdown table and the raw numbers as JSON beside it (default
``benchmarks/results/decode-<cpu|cuda>.md``). Nothing here asserts on time.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch import Tensor

from attnzoo import ModelConfig, Transformer
from attnzoo.bench import DTYPES, machine_description
from attnzoo.decoding import CompiledDecoder
from attnzoo.io import atomic_write_text
from attnzoo.tables import Table, ratio, speed_header
from attnzoo.variants import Variant, matched_configs

MECHANISMS = ["mha", "diff", "diff_v2", "selective", "dcmha"]
PATHS = ("eager", "eager-static", "compiled")


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def greedy_decode(step: Callable[[Tensor], Tensor], first: Tensor, steps: int, device: torch.device):
    """Feed each step's argmax to the next: (tokens (B, steps), seconds, seconds of the first step)."""
    tokens, token = [], first
    synchronize(device)
    start = time.perf_counter()
    for i in range(steps):
        token = step(token).argmax(dim=-1, keepdim=True)
        tokens.append(token)
        if i == 0:
            synchronize(device)
            first_step = time.perf_counter() - start
    synchronize(device)
    return torch.cat(tokens, dim=1), time.perf_counter() - start, first_step


@torch.no_grad()
def measure(
    model: Transformer,
    batch: int,
    args: argparse.Namespace,
    device: torch.device,
    *,
    paths: tuple[str, ...] | None = None,
    backend: str = "inductor",
) -> list[dict]:
    """One row per path (``paths``, default :data:`PATHS`; the first gives the tokens the others are held to).
    ``backend``: the compiled path's torch.compile backend (a dry run traces with dynamo's "eager", no codegen)."""
    prompt = torch.randint(0, model.config.vocab_size, (batch, args.context), device=device)
    length = args.context + args.new_tokens
    rows, reference = [], None
    for path in PATHS if paths is None else paths:
        if path == "compiled":
            decoder = CompiledDecoder(model, batch, length, backend=backend)
            cache = decoder.cache

            def step(token: Tensor, decoder=decoder) -> Tensor:
                return decoder.step(model, token)
        else:
            cache = model.new_cache(batch, length, static=path == "eager-static")

            def step(token: Tensor, cache=cache) -> Tensor:
                return model(token, cache=cache)[:, -1]

        rates, compile_s, tokens = [], None, None
        for repeat in range(args.repeats + 1):  # the first is the warm-up (and, compiled, the compile)
            # A fresh, untimed prefill each repeat: rewinding cache.length would not restore a ring (DCMHA's local
            # layers), whose slots the previous repeat overwrote with later positions.
            cache.reset()
            first = model(prompt, cache=cache)[:, -1].argmax(dim=-1, keepdim=True)
            tokens, seconds, first_step = greedy_decode(step, first, args.new_tokens, device)
            if repeat == 0:
                compile_s = first_step if path == "compiled" else None
            else:
                rates.append(batch * args.new_tokens / seconds)
        reference = tokens if reference is None else reference
        rows.append(
            {
                "path": path,
                "batch": batch,
                "tokens_per_s": statistics.median(rates),
                "tokens_per_s_min": min(rates),
                "tokens_per_s_max": max(rates),
                "compile_s": compile_s,
                "same_tokens": bool(torch.equal(tokens, reference)),
            }
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--context", type=int, default=512, help="prompt tokens prefilled before decoding")
    parser.add_argument("--new-tokens", type=int, default=32, help="tokens decoded and timed per repeat")
    parser.add_argument("--mechanisms", nargs="+", default=MECHANISMS, choices=MECHANISMS)
    parser.add_argument("--dim", type=int, default=256)
    parser.add_argument("--n-layers", type=int, default=4)
    parser.add_argument("--n-heads", type=int, default=8)
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="float32", help="of the weights and the cache")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--out", type=Path, help="markdown table, JSON beside it (default: decode-<device>.md)")
    args = parser.parse_args()
    for name in ("threads", "repeats", "context", "new_tokens", *(() if args.batch_sizes else ("batch_sizes",))):
        value = getattr(args, name)
        if not isinstance(value, int) or value < 1:
            parser.error(f"--{name.replace('_', '-')}={value} is invalid: must be an integer >= 1")
    if min(args.batch_sizes) < 1:
        parser.error(f"--batch-sizes={args.batch_sizes} is invalid: each must be >= 1")
    device = torch.device(args.device)
    out = args.out or Path(f"benchmarks/results/decode-{device.type}.md")
    torch.set_num_threads(args.threads)

    machine = machine_description(args.threads)
    baseline = ModelConfig(
        vocab_size=256,
        dim=args.dim,
        n_layers=args.n_layers,
        n_heads=args.n_heads,
        max_seq_len=args.context + args.new_tokens,
    )
    configs = matched_configs([Variant(m, "rope") for m in args.mechanisms], baseline)
    results = []
    for label, cfg in configs.items():
        torch.manual_seed(0)
        model = Transformer(cfg).to(device=device, dtype=DTYPES[args.dtype]).eval()
        for batch in args.batch_sizes:
            for row in measure(model, batch, args, device):
                results.append({"case": label.removesuffix("+rope"), **row})
                compile_note = f"  compile {row['compile_s']:.1f} s" if row["compile_s"] is not None else ""
                print(
                    f"{results[-1]['case']:10s} batch {batch:3d} {row['path']:13s} {row['tokens_per_s']:10,.1f} tok/s"
                    f"{compile_note}",
                    flush=True,
                )

    load_end = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    header = (
        f"Machine: {machine}, {load_end:.2f} at the end. {args.dtype}; greedy decoding of "
        f"{args.new_tokens} tokens after a {args.context}-token prefill; median of {args.repeats} repeats."
    )
    eager = {(r["case"], r["batch"]): r["tokens_per_s"] for r in results if r["path"] == "eager"}
    table = Table(
        [
            "case",
            "batch",
            "path",
            "tok/s (median)",
            "spread (min–max)",
            speed_header("eager"),
            "compile s",
            "same tokens",
        ],
        [
            [
                r["case"],
                str(r["batch"]),
                r["path"],
                f"{r['tokens_per_s']:,.1f}",
                f"{r['tokens_per_s_min']:,.1f}–{r['tokens_per_s_max']:,.1f}",
                ratio(r["tokens_per_s"] / eager[r["case"], r["batch"]]),
                "–" if r["compile_s"] is None else f"{r['compile_s']:.1f}",
                "yes" if r["same_tokens"] else "no",
            ]
            for r in results
        ],
    ).to_markdown()
    print(f"\n{header}\n\n{table}")
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out, f"{header}\n\n{table}\n")
    atomic_write_text(out.with_suffix(".json"), json.dumps({"header": header, "results": results}, indent=2))
    print(f"\nwrote {out} and {out.with_suffix('.json')}")


if __name__ == "__main__":
    main()
