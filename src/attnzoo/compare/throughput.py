"""A comparison's bench phase: every variant's throughput and peak memory, measured back to back so the ratios
share machine conditions, before any training.

``OUT/bench.json`` holds the measurements, reused only if nothing about the measurement has changed;
``OUT/bench.partial.json`` the cases measured so far, while the bench is unfinished.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from itertools import product
from pathlib import Path

import torch

from attnzoo.bench import BenchCase, machine_description, measure
from attnzoo.compare.spec import CompareSpec
from attnzoo.compare.stored import jsonable, read_record, write_record
from attnzoo.config import ModelConfig
from attnzoo.interrupts import Interrupted, stop_on_signals
from attnzoo.results.comparison import BenchMeasurement, BenchRecord, BenchTiming
from attnzoo.training.trainer import resolve_dtype

BENCH = "bench.json"
BENCH_PARTIAL = "bench.partial.json"  # the cases measured so far, while the bench is unfinished


def run_bench(
    spec: CompareSpec,
    configs: dict[str, ModelConfig],
    out_dir: Path,
    device: torch.device,
    say: Callable[[str], None],
) -> tuple[BenchRecord | None, int | None]:
    """Every variant's throughput and peak memory, the case list measured in turn ``bench_rounds`` times so
    that a change in the machine's load falls on every variant alike; reused only if nothing about the
    measurement has changed. The record, or ``None`` and the signal that stopped it.

    Each finished round of a case is kept in ``bench.partial.json`` as it ends, so a compare stopped during the
    bench measures only the rounds left when run again; its record's machine line then names every sitting.
    """
    evals, train = spec.evals, spec.train
    threads = torch.get_num_threads()
    # The dtype the runs train in (bf16 autocast on CUDA): a bench in fp32 there times another regime.
    dtype = str(resolve_dtype(train.dtype, device)).removeprefix("torch.")
    key = jsonable(
        {
            "configs": {label: configs[label].to_dict() for label in spec.variant_labels},
            "cases": [list(case) for case in evals.bench_cases],
            "batch_size": train.batch_size,
            "seq_len": train.seq_len,
            "repeats": evals.bench_repeats,
            "rounds": evals.bench_rounds,
            "warmup": evals.bench_warmup,
            "threads": threads,
            "device": str(device),
            "dtype": dtype,
        }
    )
    stored = read_record(BenchRecord, out_dir / BENCH)
    if stored is not None and stored.key == key:
        say(f"reusing {out_dir / BENCH}")
        return stored, None
    # A variant trained with more compute is another variant's model: measured once, under the model's label.
    models: dict[str, str] = {}  # the model's label → the first variant that trains it
    for variant in spec.variants:
        models.setdefault(variant.model_label, variant.label)
    cases = [
        BenchCase(
            model, configs[label], max(1, train.batch_size // multiple), train.seq_len * multiple, mode, dtype=dtype
        )
        for (mode, multiple), (model, label) in product(evals.bench_cases, models.items())
    ]
    partial = read_record(BenchRecord, out_dir / BENCH_PARTIAL)
    kept = {_case_key(m): m for m in partial.measurements} if partial is not None and partial.key == key else {}
    machine = machine_description(threads)
    rounds = evals.bench_rounds
    if cases:  # a ladder's rungs bench nothing
        say(
            f"── throughput and memory of the untrained models: {rounds} round(s) over the cases, each case in a "
            "fresh process ──"
        )
    if kept and partial is not None:
        say(f"keeping the {len(kept)} of {len(cases)} cases measured before the interruption")
        machine = f"{partial.machine}; resumed after an interruption on {machine}"
    wheres = [(case.label, case.mode, case.seq_len) for case in cases]
    measured = {where: kept.get(where) for where in wheres}
    try:
        with stop_on_signals():
            for round_number in range(1, rounds + 1):
                for case, where in zip(cases, wheres, strict=True):
                    done = measured[where]
                    if done is not None and (done.timing is None or done.timing.rounds >= round_number):
                        continue  # measured in an earlier sitting, or unavailable
                    timing = None if done is None else done.timing
                    measured[where] = _measure_round(spec, case, timing, round_number, device, say)
                    partial = BenchRecord(key, machine, [m for m in measured.values() if m is not None])
                    write_record(partial, out_dir / BENCH_PARTIAL)  # atomic: a stop leaves the last one
    except Interrupted as stop:
        return None, stop.signum
    bench = BenchRecord(key, machine, [m for m in measured.values() if m is not None])
    write_record(bench, out_dir / BENCH)
    (out_dir / BENCH_PARTIAL).unlink(missing_ok=True)
    return bench, None


def _measure_round(
    spec: CompareSpec,
    case: BenchCase,
    earlier: BenchTiming | None,
    round_number: int,
    device: torch.device,
    say: Callable[[str], None],
) -> BenchMeasurement:
    """One more round of ``case``, pooled with its ``earlier`` rounds (None: this is its first)."""
    evals = spec.evals
    where = {"variant": case.label, "mode": case.mode, "seq_len": case.seq_len, "batch_size": case.batch_size}
    try:
        result = measure(
            case,
            repeats=-(-evals.bench_repeats // evals.bench_rounds),  # ceil: every round times at least one
            warmup=evals.bench_warmup,
            threads=torch.get_num_threads(),
            device=str(device),
        )
    except RuntimeError as err:  # e.g. learned positions past max_seq_len: N/A, with the reason
        say(f"{case.mode} T={case.seq_len} {case.label}: N/A")
        return BenchMeasurement(**where, timing=None, unavailable=str(err))
    load = result.extra.get("load_average")
    rates = result.extra["rates"]
    if earlier is None:
        loads = [] if load is None else [load]
        timing = BenchTiming.of_rounds(rates, result.peak_mem_mb, loads, os.cpu_count())
    else:
        timing = earlier.with_round(rates, result.peak_mem_mb, load)
    shown = "unknown" if load is None else f"{load:.2f}"
    busy = " (unreliable: busy machine)" if timing.busy else ""
    say(
        f"round {round_number}/{evals.bench_rounds} {case.mode} T={case.seq_len} {case.label}: "
        f"{result.tokens_per_s:,.0f} tok/s ({result.tokens_per_s_min:,.0f}–{result.tokens_per_s_max:,.0f}), "
        f"load average {shown}{busy}"
    )
    return BenchMeasurement(**where, timing=timing)


def _case_key(measurement: BenchMeasurement) -> tuple[str, str, int]:
    return measurement.variant, measurement.mode, measurement.seq_len
