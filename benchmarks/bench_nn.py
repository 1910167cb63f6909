"""What attnzoo.nn costs: a training step of a GPT built from ``attnzoo.nn.Block`` against attnzoo's ``Transformer`` of
the same config and weights (issue 51).

    python benchmarks/bench_nn.py [--seq-lens 256 1024] [--rounds 5] [--out benchmarks/results/nn-overhead.md]

Both models compute the same function (a test holds a block equal to the Transformer's bit for bit), so the ratio is
the price of the layer's own per-call work: its checks, its context, and the user model's Python. Each case is
forward + backward + AdamW at dim 256, 4 layers, 8 heads, byte vocab, RoPE, fp32, 4096 tokens a step (batch
4096 // T), 1 thread. The two models alternate step by step over ``--rounds`` rounds of ``--steps`` steps after a
warm-up, so drift in the machine falls on both alike; the ratio is the median of the per-round ratios. Writes a
markdown table (the machine and its load in the header) and the raw numbers as JSON beside it. Nothing asserts on
time.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from attnzoo import ModelConfig, Transformer
from attnzoo.bench import machine_description
from attnzoo.io import atomic_write_text
from attnzoo.nn import Block

MECHANISMS = ("mha", "diff", "selective", "dcmha")
TOKENS_PER_STEP = 4096


class BlockGPT(nn.Module):
    """A user's GPT: its own embedding and head around ``attnzoo.nn.Block``s, weights taken from ``model``."""

    def __init__(self, model: Transformer):
        super().__init__()
        self.embed = nn.Embedding.from_pretrained(model.embed_tokens.weight.detach().clone(), freeze=False)
        self.blocks = nn.ModuleList(Block.from_transformer(model, i) for i in range(model.config.n_layers))
        self.norm = nn.RMSNorm(model.config.dim, eps=model.config.norm_eps)
        self.norm.load_state_dict(model.norm.state_dict())

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.embed(idx)
        for block in self.blocks:
            x = block(x)
        return self.norm(x) @ self.embed.weight.T  # tied, as the Transformer's head


def step_seconds(model: nn.Module, optimizer: torch.optim.Optimizer, idx: torch.Tensor) -> float:
    start = time.perf_counter()
    logits = model(idx[:, :-1])
    logits = logits[0] if isinstance(logits, tuple) else logits
    F.cross_entropy(logits.flatten(0, 1), idx[:, 1:].flatten()).backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return time.perf_counter() - start


def measure(attention: str, seq_len: int, rounds: int, steps: int) -> dict:
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=256, dim=256, n_layers=4, n_heads=8, attention=attention, max_seq_len=seq_len)
    transformer = Transformer(cfg)
    gpt = BlockGPT(transformer)
    idx = torch.randint(0, 256, (max(1, TOKENS_PER_STEP // seq_len), seq_len + 1))
    models = {"transformer": transformer, "attnzoo.nn": gpt}
    optimizers = {name: torch.optim.AdamW(model.parameters(), lr=1e-4) for name, model in models.items()}
    for name, model in models.items():  # warm-up: allocator, kernels' first calls
        step_seconds(model, optimizers[name], idx)
    times: dict[str, list[float]] = {name: [] for name in models}
    ratios = []
    for _ in range(rounds):
        spent = dict.fromkeys(models, 0.0)
        for _ in range(steps):
            for name, model in models.items():
                spent[name] += step_seconds(model, optimizers[name], idx)
        for name in models:
            times[name].append(spent[name] / steps)
        ratios.append(spent["attnzoo.nn"] / spent["transformer"])
    return {
        "attention": attention,
        "seq_len": seq_len,
        "batch": idx.shape[0],
        "step_s": {name: statistics.median(values) for name, values in times.items()},
        "ratios": ratios,
        "ratio": statistics.median(ratios),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seq-lens", type=int, nargs="+", default=[256, 1024])
    parser.add_argument("--mechanisms", nargs="+", default=list(MECHANISMS))
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=3, help="steps of each model per round")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/nn-overhead.md"))
    args = parser.parse_args(argv)
    for name in ("rounds", "steps"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} {getattr(args, name)} is invalid: must be >= 1")
    if args.out.is_dir():
        parser.error(f"--out {args.out} is a directory: name the markdown file to write")
    torch.set_num_threads(1)
    header = machine_description(1)
    rows = []
    for attention in args.mechanisms:
        for seq_len in args.seq_lens:
            row = measure(attention, seq_len, args.rounds, args.steps)
            rows.append(row)
            print(f"{attention} T={seq_len}: attnzoo.nn / Transformer {row['ratio']:.3f}", flush=True)
    lines = [
        "# attnzoo.nn against Transformer: training-step time",
        "",
        f"{header}. fwd + bwd + AdamW, fp32, dim 256, 4 layers, 8 heads, RoPE, {TOKENS_PER_STEP} tokens a step; "
        f"{args.rounds} rounds of {args.steps} alternating steps; `python benchmarks/bench_nn.py`.",
        "",
        "| mechanism | T | batch | Transformer step (s) | attnzoo.nn step (s) | time ratio (median; per round) |",
        "|---|---|---|---|---|---|",
    ]
    for row in rows:
        per_round = ", ".join(f"{r:.3f}" for r in row["ratios"])
        lines.append(
            f"| {row['attention']} | {row['seq_len']} | {row['batch']} | {row['step_s']['transformer']:.4f} | "
            f"{row['step_s']['attnzoo.nn']:.4f} | **{row['ratio']:.3f}** ({per_round}) |"
        )
    atomic_write_text(args.out, "\n".join(lines) + "\n")
    atomic_write_text(args.out.with_suffix(".json"), json.dumps({"machine": header, "rows": rows}, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
