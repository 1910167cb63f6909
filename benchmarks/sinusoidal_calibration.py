"""Does a sinusoidal model learn its context at the CPU ladder's sizes? The calibration ALiBi's claims rest on.

    OMP_NUM_THREADS=1 python benchmarks/sinusoidal_calibration.py [--jobs 2] [--out runs/sinusoidal-calibration]

ALiBi's claims set it against sinusoidal positions, and a comparison is judged only where every model it reads beats
a trigram count model (gate (d) of the protocol): one that never learned its context can lose a comparison, never
win or tie one. At the claims preset's size the sinusoidal model ended at 2.46 nats/token, no better than a bigram
count model, where RoPE reached 1.79. This trains, at each rung of the CPU ladder (its model, tokens, schedule and
seed 0), MHA with RoPE, MHA with attnzoo's sinusoidal table (amplitude √2·init_std beside N(0, init_std) token
embeddings), and MHA with the ALiBi paper's fairseq layout (``scale_embeddings``: token embeddings N(0, 1/d) times
√d beside a unit table), and reads each one's validation loss on the whole split against the trigram level. The
smallest rung where the sinusoidal model passes is where ALiBi's sinusoidal claims can be judged on a CPU; if none
does, they are not measurable on the CPU, and the GPU rung runs them.

Writes ``benchmarks/results/sinusoidal_calibration.{md,json}``. ``--toy`` runs the same at toy sizes (the tests).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import multiprocessing
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import torch

from attnzoo.compare import CompareSpec, run_compare
from attnzoo.compare.presets import LADDERS, PRESETS
from attnzoo.compare.provenance import source_commit
from attnzoo.io import atomic_write_text
from attnzoo.results import CompareResults
from attnzoo.tables import Table

LAYOUTS = {
    "rope": ("mha+rope", False),
    "sinusoidal": ("mha+sinusoidal", False),
    "sinusoidal, fairseq layout": ("mha+sinusoidal", True),
}


def cells(toy: bool) -> list[tuple[str, str, CompareSpec]]:
    """(rung, layout, the one-run comparison) for every rung of the CPU ladder and every layout."""
    found = []
    for rung in LADDERS["claims"].rungs:
        if toy:
            micro = PRESETS["micro"]
            rung = dataclasses.replace(rung, model={**micro.model, "n_layers": rung.model["n_layers"]})
            rung = dataclasses.replace(rung, train=dataclasses.replace(micro.train, steps=8, eval_interval=4))
            rung = dataclasses.replace(rung, evals=dataclasses.replace(micro.evals, val_windows=16, bench_cases=()))
        for layout, (variant, scaled) in LAYOUTS.items():
            spec = dataclasses.replace(
                rung,
                name=f"sinusoidal-calibration-{rung.name}",
                description=f"the CPU ladder's {rung.name} rung, {layout}, seed 0",
                model={**rung.model, "scale_embeddings": scaled},
                variants=(variant,),
                seeds=(0,),
                tasks=(),
            )
            found.append((rung.name, layout, spec))
    return found


def train(spec: CompareSpec, out: Path) -> CompareResults:
    torch.set_num_threads(1)
    result = run_compare(spec, out, progress=False)
    if result.results is None:
        raise SystemExit(f"{out}: the comparison was interrupted")
    return result.results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=2, help="runs trained at once, one thread each (default 2)")
    parser.add_argument("--out", type=Path, default=Path("runs/sinusoidal-calibration"))
    parser.add_argument("--results", type=Path, default=Path("benchmarks/results/sinusoidal_calibration"))
    parser.add_argument("--toy", action="store_true", help="toy sizes, seconds (the tests)")
    args = parser.parse_args(argv)
    if args.jobs < 1:
        parser.error(f"--jobs={args.jobs} is invalid: must be an integer >= 1")
    planned = cells(args.toy)
    commit = source_commit()  # the code that trains: the tree may change while it runs
    started = time.perf_counter()
    context = multiprocessing.get_context("spawn")  # a fork would share torch's threads
    with ProcessPoolExecutor(args.jobs, context) as pool:
        futures = [
            pool.submit(train, spec, args.out / rung / layout.replace(", ", "-").replace(" ", "-"))
            for rung, layout, spec in planned
        ]
        done = [future.result() for future in futures]
    rows, records = [], []
    for (rung, layout, spec), results in zip(planned, done, strict=True):
        (run,) = results.variants[spec.variant_labels[0]].runs
        assert results.corpus.ngram is not None  # a comparison counts its corpus's level (attnzoo.compare.assemble)
        trigram = results.corpus.ngram.val_loss
        record = {
            "rung": rung,
            "layout": layout,
            "variant": spec.variant_labels[0],
            "scale_embeddings": spec.model["scale_embeddings"],
            "parameters": run.parameters,
            "tokens": run.tokens,
            "val_loss": run.val.loss,
            "trigram_level": trigram,
            "beats_trigram": run.val.loss < trigram,
        }
        records.append(record)
        rows.append([rung, layout, f"{run.parameters:,}", f"{run.tokens:,}", f"{run.val.loss:.4f}", f"{trigram:.4f}",
                     "yes" if record["beats_trigram"] else "no"])  # fmt: skip
    sinusoidal = [r for r in records if r["variant"] == "mha+sinusoidal" and r["beats_trigram"]]
    smallest = min(sinusoidal, key=lambda r: r["parameters"], default=None)
    conclusion = (
        f"the smallest rung where a sinusoidal model beats the trigram level: {smallest['rung']} "
        f"({smallest['layout']}, {smallest['parameters']:,} parameters)"
        if smallest
        else "no rung of the CPU ladder has a sinusoidal model below the trigram level, in either layout: ALiBi's "
        "sinusoidal claims are not measurable on the CPU"
    )
    minutes = (time.perf_counter() - started) / 60
    header = (
        f"Sinusoidal calibration{' (toy sizes)' if args.toy else ''}: seed 0 of each CPU ladder rung's budget, "
        f"validation loss (nats/token) on the whole split; attnzoo {commit}, {done[0].machine.description}, "
        f"{args.jobs} run(s) at once, {minutes:.1f} min. Conclusion: {conclusion}."
    )
    table = Table(
        ["rung", "positions", "parameters", "tokens", "val loss", "trigram level", "below the trigram level"], rows
    )
    print(f"\n{header}\n\n{table.to_text()}")
    atomic_write_text(args.results.with_suffix(".md"), f"{header}\n\n{table.to_markdown()}\n")
    payload = {"commit": commit, "toy": args.toy, "conclusion": conclusion, "runs": records}
    atomic_write_text(args.results.with_suffix(".json"), json.dumps(payload, indent=1) + "\n")
    print(f"\nwrote {args.results.with_suffix('.md')} and .json")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
