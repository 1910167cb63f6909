"""MHA → GQA/MQA uptraining (Ainslie et al., 2023) at CPU scale, through the command line.

    OMP_NUM_THREADS=1 python benchmarks/gqa_uptraining.py [--steps 400] [--out runs/gqa-uptraining]

1. ``attnzoo train`` an MHA model (the default 0.84M-parameter model, 4 heads, on Shakespeare) for N steps;
2. ``attnzoo convert --from`` it to GQA (2 kv heads) and MQA (1 kv head) by mean-pooling each group's kv heads;
3. ``attnzoo train --init-from`` each converted model for 5% of N, the paper's uptraining proportion α = 0.05;
4. ``attnzoo train`` GQA and MQA from scratch for the same total, 1.05·N steps;

then scores every model, the converted ones before uptraining included, on the same validation windows with
the one LM evaluator, and writes the table to ``benchmarks/results/gqa_uptraining.md``. Uptraining continues
at the learning rate pre-training ended with (lr 2e-3 × min_lr_ratio 0.1 = 2e-4), constant after a short warmup
of the fresh optimizer: the paper continues the pre-training recipe, and a restart at the peak rate on 5% of the
steps would spend them undoing noise.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from attnzoo.cli import main as attnzoo
from attnzoo.data.corpora import prepare_corpus
from attnzoo.distributed import Distributed
from attnzoo.evals.lm import LMEvalConfig, evaluate_lm
from attnzoo.io import atomic_write_text
from attnzoo.tables import Table
from attnzoo.training.checkpoint import load_pretrained

UPTRAIN_FRACTION = 0.05  # α in the GQA paper
UPTRAIN_LR = 2e-4  # where the default pre-training schedule ends: lr 2e-3 × min_lr_ratio 0.1
SEQ_LEN = 128
EVAL_WINDOWS = 128


def run(*argv: str) -> None:
    code = attnzoo([str(a) for a in argv])
    if code != 0:
        raise SystemExit(f"attnzoo {' '.join(map(str, argv))} exited with {code}")


def score(path: Path) -> tuple[float, float]:
    model, checkpoint = load_pretrained(path)
    tokenizer = checkpoint.require_tokenizer()
    corpus = prepare_corpus("shakespeare", tokenizer, 0.1)
    result = evaluate_lm(
        model,
        corpus.val,
        tokenizer.token_bytes(),
        LMEvalConfig(SEQ_LEN, batch_size=16, max_windows=EVAL_WINDOWS),
        env=Distributed(),
    )
    return result.loss, result.bits_per_byte


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=400, help="N, the MHA pre-training steps (default: 400)")
    parser.add_argument("--out", type=Path, default=Path("runs/gqa-uptraining"))
    parser.add_argument("--results", type=Path, default=Path("benchmarks/results/gqa_uptraining.md"))
    args = parser.parse_args()
    n = args.steps
    uptrain = max(1, round(UPTRAIN_FRACTION * n))
    total = n + uptrain
    out = args.out
    common = ["--seq-len", SEQ_LEN, "--eval-windows", 32, "--no-progress", "--device", "cpu"]
    started = time.perf_counter()

    warmup = ["--warmup-steps", min(100, max(1, n // 4))]  # the default 100, or a quarter of a short run
    run("train", *common, *warmup, "--steps", n, "--eval-interval", n, "--out", out / "mha")
    rows: list[tuple[str, int, Path]] = [("MHA (source)", n, out / "mha")]
    for kv, name in ((2, "GQA-2"), (1, "MQA")):
        converted = out / f"kv{kv}-converted"
        run("convert", "--from", out / "mha", "--out", converted, "--kv-heads", kv)
        uptrain_flags = ["--steps", uptrain, "--eval-interval", uptrain, "--warmup-steps", max(1, uptrain // 4)]
        uptrain_flags += ["--lr", UPTRAIN_LR, "--min-lr-ratio", 1.0]
        run("train", *common, *uptrain_flags, "--init-from", converted, "--out", out / f"kv{kv}-up")
        scratch = ["--steps", total, "--eval-interval", total, "--n-kv-heads", kv, "--out", out / f"kv{kv}"]
        run("train", *common, *warmup, *scratch)
        rows += [
            (f"{name} converted, not uptrained", n, converted),
            (f"{name} converted + uptrained {uptrain} steps ({UPTRAIN_FRACTION:.0%})", total, out / f"kv{kv}-up"),
            (f"{name} from scratch", total, out / f"kv{kv}"),
        ]
    cells = []
    for label, steps, path in rows:
        loss, bpb = score(path)
        cells.append([label, str(steps), f"{loss:.4f}", f"{bpb:.4f}"])
    table = Table(["model", "training steps in all", "val loss (nats/byte)", "val bits/byte"], cells)
    minutes = (time.perf_counter() - started) / 60
    header = (
        f"MHA {n} steps; uptraining {uptrain} steps at lr {UPTRAIN_LR:g}; from scratch {total} steps. Val loss on "
        f"{EVAL_WINDOWS} windows of {SEQ_LEN} bytes; {minutes:.1f} min in all."
    )
    print(f"\n{header}\n\n{table.to_text()}")
    atomic_write_text(args.results, f"{header}\n\n{table.to_markdown()}\n")
    print(f"\nwrote {args.results}")


if __name__ == "__main__":
    main()
