"""bf16 autocast against fp32 on a preset's baseline language model: do the loss curves agree within seed noise,
and which is faster here (issue 23)?

    python benchmarks/precision_check.py                      # claims preset, mha+rope, seeds 0 1 2
    python benchmarks/precision_check.py --seeds 0 1 --out runs/precision.md

Each seed trains the preset's baseline once in float32 and once under bf16 autocast (``TrainConfig.dtype``), same
data order, schedule and steps; the table gives each run's validation curve, its final loss and its training
tokens/s. The verdict it supports: bf16 is usable where its per-seed gap to fp32 stays within fp32's own spread
over seeds, and worth using where it is faster. Runs are sequential; tokens/s mean something only on a quiet
machine, and are printed with the thread count.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import tempfile
from pathlib import Path

import torch

from attnzoo.compare import PRESETS
from attnzoo.distributed import Distributed, resolve_device
from attnzoo.io import atomic_write_text
from attnzoo.tables import Table
from attnzoo.training.metrics import MetricsLog
from attnzoo.training.trainer import METRICS, Trainer, load_corpus
from attnzoo.variants import matched_configs

REPO = Path(__file__).resolve().parents[1]
DTYPES = ("float32", "bfloat16")


def run(model_config, train, corpus, env) -> dict:
    with tempfile.TemporaryDirectory(prefix="precision-") as run_dir:
        Trainer(model_config, train, corpus, run_dir, env=env, progress=False).fit()
        rows = MetricsLog(Path(run_dir) / METRICS).read()
    curve = [(r["step"], r["val_loss"]) for r in rows if "val_loss" in r]
    speeds = [r["tokens_per_s"] for r in rows if "tokens_per_s" in r]
    return {"curve": curve, "final": curve[-1][1], "tokens_per_s": statistics.median(speeds)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="claims", choices=sorted(PRESETS))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "precision.md")
    args = parser.parse_args(argv)
    if len(args.seeds) < 2:
        parser.error(f"--seeds={args.seeds} is invalid: give at least 2, so that fp32 has a spread over seeds")

    spec = PRESETS[args.preset]
    env = Distributed(device=resolve_device(spec.train.device))
    corpus = load_corpus(spec.train.data, env)
    baseline = spec.variants[0]
    model_config = matched_configs([baseline], spec.baseline_config(corpus.tokenizer.vocab_size))[baseline.label]
    results: dict[str, dict[int, dict]] = {dtype: {} for dtype in DTYPES}
    for seed in args.seeds:
        for dtype in DTYPES:
            train = dataclasses.replace(spec.train, seed=seed, dtype=dtype, checkpoint_interval=spec.train.steps)
            results[dtype][seed] = run(model_config, train, corpus, env)
            found = results[dtype][seed]
            print(
                f"seed {seed} {dtype:9s} val loss {found['final']:.4f} {found['tokens_per_s']:,.0f} tok/s", flush=True
            )

    steps = [step for step, _ in results["float32"][args.seeds[0]]["curve"]]
    rows = []
    for seed in args.seeds:
        for dtype in DTYPES:
            found = results[dtype][seed]
            losses = [f"{loss:.4f}" for _, loss in found["curve"]]
            rows.append([str(seed), dtype, *losses, f"{found['tokens_per_s']:,.0f}"])
    gaps = [results["bfloat16"][s]["final"] - results["float32"][s]["final"] for s in args.seeds]
    fp32_finals = [found["final"] for found in results["float32"].values()]
    spread = max(fp32_finals) - min(fp32_finals)
    speed = statistics.median(
        results["bfloat16"][s]["tokens_per_s"] / results["float32"][s]["tokens_per_s"] for s in args.seeds
    )
    header = ["seed", "dtype", *(f"val @ {step}" for step in steps), "tok/s (median)"]
    summary = (
        f"Final loss bf16 − fp32 per seed: {', '.join(f'{g:+.4f}' for g in gaps)} (mean {statistics.mean(gaps):+.4f}); "
        f"fp32's spread over seeds: {spread:.4f}. bf16 runs at {speed:.2f}× fp32's tokens/s (median over seeds)."
    )
    text = (
        f"# bf16 autocast against fp32: {spec.name} preset, {baseline.label}\n\n"
        f"`python benchmarks/precision_check.py {' '.join(sys.argv[1:])}`: {spec.train.steps:,} steps × "
        f"{spec.train.batch_size} × {spec.train.seq_len} tokens per run, the preset's schedule; validation loss "
        f"(nats/token) along training. torch {torch.__version__}, {torch.get_num_threads()} thread(s).\n\n"
        + Table(header, rows).to_markdown()
        + f"\n\n{summary}\n"
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(args.out, text)
    atomic_write_text(
        args.out.with_suffix(".json"), json.dumps({"preset": spec.name, "runs": results}, indent=2) + "\n"
    )
    print(summary)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
