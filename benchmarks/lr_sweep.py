"""A one-seed learning-rate sweep of a compare preset's language-model variants (issue 23).

    python benchmarks/lr_sweep.py                                   # claims preset, 4 variants × 3 rates
    python benchmarks/lr_sweep.py --variants mha+rope --lrs 1e-3 3e-3 1e-2 --out runs/lr.md

Each variant (parameter-matched to the preset's baseline, as compare builds it) is trained once per rate with the
preset's schedule, data, steps and seed 0; the table gives the final validation loss of each and marks each
variant's best rate. It answers two questions a shared learning rate raises: was the baseline's rate well chosen,
and would any variant's ranking against the baseline change at the variant's own best rate. One seed: a gap
smaller than the seed spread of the compare run is no finding. Writes markdown and the raw numbers as JSON beside
it. Runs are sequential; nothing here times anything.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
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
from attnzoo.variants import Variant, matched_configs

REPO = Path(__file__).resolve().parents[1]
PRIMARY = ("mha+rope", "diff+rope", "selective+rope", "dcmha+rope")


def final_val_loss(run_dir: Path) -> float:
    losses = [r["val_loss"] for r in MetricsLog(run_dir / METRICS).read() if "val_loss" in r]
    return losses[-1] if losses else math.nan


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="claims", choices=sorted(PRESETS))
    parser.add_argument("--variants", nargs="+", default=list(PRIMARY), help="the first is the baseline")
    parser.add_argument("--lrs", nargs="+", type=float, default=[1e-3, 3e-3, 1e-2])
    parser.add_argument("--steps", type=int, help="default: the preset's")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "lr_sweep.md")
    args = parser.parse_args(argv)
    if any(not (lr > 0 and math.isfinite(lr)) for lr in args.lrs):
        parser.error(f"--lrs={args.lrs} is invalid: each must be a number > 0")
    if args.steps is not None and args.steps < 1:
        parser.error(f"--steps={args.steps} is invalid: must be an integer >= 1")
    try:
        variants = [Variant.parse(v) for v in args.variants]
    except ValueError as err:
        parser.error(str(err))

    spec = PRESETS[args.preset]
    train = spec.train if args.steps is None else spec.train.with_steps(args.steps)
    env = Distributed(device=resolve_device(train.device))
    corpus = load_corpus(train.data, env)
    labels = [v.label for v in variants]
    configs = matched_configs(variants, spec.baseline_config(corpus.tokenizer.vocab_size))
    results: dict[str, dict[str, float]] = {}
    for label in labels:
        results[label] = {}
        for lr in args.lrs:
            run_train = dataclasses.replace(train, lr=lr, seed=0, checkpoint_interval=train.steps)
            with tempfile.TemporaryDirectory(prefix="lr-sweep-") as run_dir:
                Trainer(configs[label], run_train, corpus, run_dir, env=env, progress=False).fit()
                loss = final_val_loss(Path(run_dir))
            results[label][f"{lr:g}"] = loss
            print(f"{label:20s} lr {lr:<8g} val loss {loss:.4f}", flush=True)

    baseline = labels[0]
    rows = []
    for label in labels:
        losses = results[label]
        best = min(losses, key=lambda k: losses[k] if math.isfinite(losses[k]) else math.inf)
        cells = [f"**{v:.4f}**" if k == best else f"{v:.4f}" for k, v in losses.items()]
        own_best = losses[best] - min(results[baseline].values())
        rows.append([label, *cells, best, f"{own_best:+.4f}"])
    header = ["variant", *(f"lr {lr:g}" for lr in args.lrs), "best lr", "best − baseline's best (nats)"]
    text = (
        f"# Learning-rate sweep: {spec.name} preset, seed 0\n\n"
        f"`python benchmarks/lr_sweep.py {' '.join(sys.argv[1:])}`: each variant trained once per rate, "
        f"{train.steps:,} steps × {train.batch_size} × {train.seq_len} tokens, warmup {train.warmup_steps}, cosine "
        f"to {train.min_lr_ratio:g}× the rate; final validation loss (nats/token), the best of each row in bold. "
        f"torch {torch.__version__}, {torch.get_num_threads()} thread(s). One seed: gaps smaller than the compare "
        "run's seed spread are no finding.\n\n" + Table(header, rows).to_markdown() + "\n"
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(args.out, text)
    payload = {"preset": spec.name, "steps": train.steps, "lrs": args.lrs, "val_loss": results}
    atomic_write_text(args.out.with_suffix(".json"), json.dumps(payload, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
