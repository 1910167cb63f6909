"""The first call of a GPU lease (issue 36): training and decoding speed on CUDA in bf16, within one command.

    timeout -s TERM 560 python3 benchmarks/gpu_speed.py --out runs/gpu-speed; cp runs/gpu-speed/* "$OUT"/  # CUDA
    python benchmarks/gpu_speed.py --dry-run --out runs/gpu-speed   # every case at toy sizes on the CPU (CI)
    python benchmarks/gpu_speed.py --routes-from benchmarks/results/gpu-DATE/summary.json   # the CUDA routes

The cases, in the order they run, which is the order issue 36 ranks them in (groups 1, 4, 3, 2, 5):

1. Training steps (forward, backward, AdamW; bf16 autocast) at the ``gpu-lm`` preset's size (dim 384, 6 layers, 6
   heads of 64, byte vocabulary) at T = 1024, 32 sequences a step, for mha, dcmha, diff and selective with RoPE,
   parameter-matched to MHA (``attnzoo.variants``): eager, then ``torch.compile`` of the whole model. DCMHA runs with
   its kernel named (``attn_backend``): ``dcmha-triton``, the fused Triton kernel, and ``chunked``, the PyTorch path;
   Diff with its default (two SDPA calls) and with each one-call layout, ``diff-halves`` and ``diff-stacked``; the
   others with "auto". Speed and memory are ratios to MHA in the same mode, measured in this run.
4. One attention layer at ``bench_dcmha_triton``'s size (dim 1024, 16 heads of 64, T = 2048, 8 sequences), forward
   and backward: MHA restricted to flash attention, DCMHA on its Triton kernel and on the chunked PyTorch path, eager
   and compiled, for the layer's speed against FlashAttention; then the
   registers, spills and shared memory of every Triton kernel variant that case compiled.
3. Decoding at the same size: greedy tok/s at batch 1 and 16 with bf16 weights after a 512-token prompt, eager and
   ``generate(compile=True)``'s step (CUDA graphs), by ``bench_decode.measure``.
2. The anchor: MHA at a nanoGPT-124M-like size (dim 768, 12 layers, 12 heads, GELU, LayerNorm, learned positions,
   vocabulary 50,304; nanoGPT's 12 × 1024 tokens a step), eager and compiled, for its MFU (nanoGPT ≈ 33% on one H100);
   then the 185M size of gpu_check's speed plan (dim 1024, 12 layers, 16 heads, vocabulary 32,768, 16 × 1024 tokens):
   MHA compiled (issue 36's MFU target), DCMHA's chunked path compiled, then both eager, DCMHA on its kernel.
5. Last, with the budget left (at least :data:`MIN_TESTS_S`): ``pytest -m "cuda or triton"``, as the GPU kit's tests
   stage runs it (``kit.gpu_tests_command``), recorded with every failed test's id.

MFU is ``attnzoo.model.training_flops_per_token`` × tok/s ÷ the device's dense bf16 peak (:data:`PEAK_BF16_TFLOPS`,
from NVIDIA's datasheets; ``--peak-tflops`` for another device). The AdamW step is fused on CUDA, as attnzoo's trainer
runs it there (``training.optim.build_optimizer``), with the trainer's parameter groups.

Budget: ``--budget-s`` (480 by default) bounds the cases' time from the start. A case is skipped before it starts
when a finished case of its kind (training or decoding, eager or compiled, same size) took longer than what is left;
a training case measures its first step (the compile) and one more, then times only the rounds that fit and is
skipped if none does; whatever still runs past the budget (a compile, a decode case) is stopped 10 s after it.
Each skip is recorded with its reason.

Measurement: the cases run in turn in one worker process (CUDA's start and the imports paid once), which is
replaced after a case that fails, since an error can leave a CUDA context unusable. Between cases the worker resets
dynamo and frees the allocator's cache; peak memory is ``max_memory_allocated`` over the timed steps after
``reset_peak_memory_stats`` (weights, gradients and optimizer state included). Timed steps are rounds of several
steps between two CUDA events, as a training loop runs them, after warmup steps whose first compiles; the compile
time shown is the first step's wall time less a timed step's.

Output: ``--out DIR`` gets ``gpu-speed.md`` (the ratios at a glance, then every row, then what was not measured and
why), ``gpu-speed.json`` (the raw numbers, device, versions, commit) and ``summary.json`` (issue 36's figures, each
with the row it came from: :func:`headline`), all rewritten atomically after every case, so a run cut off keeps
what it measured and names the cases it did not reach; the tests add ``tests-junit.xml``. The dry run forces the
CPU, toy sizes, fp32, and dynamo's "eager" compile backend (the compiled path traced, no code generated: inductor took
41 s for one toy MHA on a 2-core CPU), so its numbers check the script, not a speed; the Triton cases are skipped
there with the kernel's reason, and the tests narrowed to a few quick ones (``kit.DRY_RUN_TESTS``).

Routes: ``summary.json`` holds every training row's speed against MHA's (``train_speed_vs_mha``), from which
``--routes-from SUMMARY`` decides the kernel each mechanism runs first on CUDA, per mode, and writes
``src/attnzoo/attention/kernels/cuda_routes.json`` (``gpu/routes.py``; the rule: ``attnzoo.attention.kernels.routes``).

The parts live beside this module in ``benchmarks/gpu/``: ``plan``, ``measure``, ``worker``, ``pytest_stage``,
``report`` and ``routes``.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import math
import signal
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch

from attnzoo import ModelConfig, Transformer
from attnzoo.attention.kernels.routes import ROUTES_FILE
from attnzoo.bench import machine_description
from attnzoo.cli.command import path_argument

from gpu.check.command import git_commit
from gpu.measure import add_mfu, device_peak
from gpu.plan import (
    CUT_OFF,
    DRY_RUN_SETTINGS,
    DRY_RUN_SIZES,
    ERROR,
    GPU_SETTINGS,
    GPU_SIZES,
    GROUPS,
    MEASURED,
    NOT_RUN,
    SKIPPED,
    Case,
    plan_cases,
)
from gpu.pytest_stage import REPOSITORY, TESTS_GROUP, run_tests, tests_line
from gpu.report import progress_line, render_markdown, write_report
from gpu.routes import routes_line, write_routes
from gpu.worker import GRACE_S, Stopped, Worker, on_signal, skip_before_start


def describe(cfg: ModelConfig) -> str:
    with torch.device("meta"):  # counted, never initialised: the anchor's 124M parameters take seconds on a CPU
        model = Transformer(cfg)
    return (
        f"dim {cfg.dim}, {cfg.n_layers} layers, {cfg.n_heads} heads of {cfg.head_dim}, {cfg.mlp}, {cfg.norm}, "
        f"{cfg.position} positions, vocabulary {cfg.vocab_size:,} ({model.num_parameters() / 1e6:.1f}M "
        "parameters as MHA)"
    )


def package_version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def directory_problem(directory: Path) -> str | None:
    """Why a report cannot be written into ``directory``, found now (it is created where absent, and a scratch file
    written and removed) rather than when the first result is written minutes later; None where it can."""
    if directory.exists() and not directory.is_dir():
        return "it is a file, not a directory"
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=directory):
            pass
    except OSError as err:
        return f"cannot write there ({err.strerror or err})"
    return None


def install_routes(parser: argparse.ArgumentParser, summary: Path, routes_file: Path) -> int:
    """``--routes-from``: the routes ``summary`` decides, written to ``routes_file``; a summary that cannot decide
    them (missing, unreadable, a dry run's) is refused in one line before anything is written."""
    if not summary.is_file():
        parser.error(f"--routes-from={summary} is invalid: no such file (a lease's summary.json)")
    try:
        document = write_routes(summary, routes_file)
    except (ValueError, KeyError) as err:  # json's decode error is a ValueError
        parser.error(f"--routes-from={summary} is invalid: {err}")
    print(f"gpu_speed: wrote {routes_file}: {routes_line(document)}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--out", type=path_argument, help="folder for gpu-speed.md and .json (default benchmarks/results/gpu-DATE)"
    )
    parser.add_argument("--budget-s", type=float, default=480.0, help="seconds for all the cases (default 480)")
    parser.add_argument("--dry-run", action="store_true", help="every case at toy sizes on the CPU, fp32")
    parser.add_argument("--groups", type=int, nargs="+", choices=GROUPS, default=list(GROUPS), help="in this order")
    parser.add_argument("--peak-tflops", type=float, help="the dense bf16 peak for MFU, where the device has none here")
    parser.add_argument("--commit", help="the commit measured, where the copy has no .git (default: git's answer)")
    parser.add_argument(
        "--routes-from",
        type=path_argument,
        metavar="SUMMARY",
        help="run nothing: decide each mechanism's CUDA route from a lease's summary.json and write the routes file",
    )
    parser.add_argument(
        "--routes-file",
        type=path_argument,
        default=ROUTES_FILE,
        help=f"where --routes-from writes (default {ROUTES_FILE.relative_to(REPOSITORY)}, the package's)",
    )
    args = parser.parse_args(argv)
    if args.routes_from is not None:
        return install_routes(parser, args.routes_from, args.routes_file)
    if not (math.isfinite(args.budget_s) and args.budget_s > 0):  # NaN passes any comparison's "not <= 0"
        parser.error(f"--budget-s={args.budget_s} is invalid: must be a finite number of seconds > 0")
    if args.peak_tflops is not None and not (math.isfinite(args.peak_tflops) and args.peak_tflops > 0):
        parser.error(f"--peak-tflops={args.peak_tflops} is invalid: must be a finite number > 0")
    if not args.dry_run and not torch.cuda.is_available():
        print(
            "gpu_speed: needs a CUDA device, and none is visible; --dry-run runs every case on the CPU", file=sys.stderr
        )
        return 2
    today = datetime.now(timezone.utc).date().isoformat()
    out = args.out or Path("runs/gpu-speed-dry-run" if args.dry_run else f"benchmarks/results/gpu-{today}")
    problem = directory_problem(out)
    if problem is not None:
        parser.error(f"--out={out} is invalid: {problem}")
    start = time.perf_counter()
    settings, sizes = (DRY_RUN_SETTINGS, DRY_RUN_SIZES) if args.dry_run else (GPU_SETTINGS, GPU_SIZES)
    device = "CPU" if args.dry_run else torch.cuda.get_device_name()
    peak, peak_source = device_peak(device, args.peak_tflops)
    cases = plan_cases(sizes, args.groups)
    described = {
        "gpu-lm": f"{describe(sizes.lm)}, matched per mechanism (attnzoo.variants), {sizes.lm_batch} × {sizes.seq_len} "
        "tokens a step",
        "nanogpt-124m": f"{describe(sizes.anchor)}, {sizes.anchor_batch} × {sizes.seq_len} tokens a step",
        "185m": f"{describe(sizes.large)}, DCMHA matched to it, {sizes.large_batch} × {sizes.seq_len} tokens a step",
    }
    meta: dict[str, Any] = {
        "device": device,
        "machine": machine_description(torch.get_num_threads()),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "triton": package_version("triton"),
        "commit": args.commit or git_commit(),
        "command": " ".join(["python benchmarks/gpu_speed.py", *(sys.argv[1:] if argv is None else argv)]),
        "date": today,
        "dry_run": args.dry_run,
        "settings": settings,
        "sizes": described,
        "peak_tflops": peak,
        "peak_source": peak_source,
        "budget_s": args.budget_s,
        "elapsed_s": 0.0,
        "finished": False,
        "stopped": None,
        "tests": {"status": NOT_RUN, "reason": "the script ended before it"} if TESTS_GROUP in args.groups else None,
    }
    records = {c.name: {"status": NOT_RUN, "reason": "the script ended before it"} for c in cases}
    print(f"gpu_speed: {len(cases)} cases on {device}, {args.budget_s:.0f} s budget, writing {out}", flush=True)
    write_report(out, meta, cases, records)
    done: list[tuple[Case, dict[str, Any]]] = []
    flops: dict[tuple[str, str], float] = {}
    worker: Worker | None = None
    current: Case | None = None
    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        for case in cases:
            left = args.budget_s - (time.perf_counter() - start)
            reason = skip_before_start(case, left, done)
            if reason is not None:
                record: dict[str, Any] = {"status": SKIPPED, "reason": reason}
            else:
                current, worker, began = case, worker or Worker(settings), time.perf_counter()
                outcome = worker.run(case, left)
                if outcome is None:
                    worker = None
                    outcome = {"status": CUT_OFF, "reason": f"still running {GRACE_S:.0f} s past the budget"}
                elif outcome["status"] == ERROR:
                    worker.stop()
                    worker = None
                outcome.setdefault("wall_s", time.perf_counter() - began)  # the worker's, unless it never answered
                record, current = outcome, None
                if case.kind == "train" and record["status"] == MEASURED:
                    add_mfu(case, record, flops, peak)
                done.append((case, record))
            records[case.name] = record
            meta["elapsed_s"] = time.perf_counter() - start
            write_report(out, meta, cases, records)
            print(f"[{meta['elapsed_s']:5.0f} s] {case.name}: {progress_line(case, record)}", flush=True)
        if meta["tests"] is not None:
            if worker is not None:  # its CUDA context would hold memory the tests need
                worker.stop()
                worker = None
            meta["tests"] = {"status": CUT_OFF, "reason": "running when the script was stopped"}
            meta["tests"] = run_tests(out, settings, args.budget_s - (time.perf_counter() - start))
            meta["elapsed_s"] = time.perf_counter() - start
            print(f"[{meta['elapsed_s']:5.0f} s] tests: {tests_line(meta['tests'])}", flush=True)
        meta["finished"] = True
    except Stopped as stop:
        meta["stopped"] = f"stopped by {stop} after {time.perf_counter() - start:.0f} s"
        if current is not None:
            records[current.name] = {"status": CUT_OFF, "reason": f"{stop} arrived while it ran"}
        for record in records.values():
            if record["status"] == NOT_RUN:
                record["reason"] = f"{stop} arrived before it"
    finally:
        if worker is not None:
            worker.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    meta["elapsed_s"] = time.perf_counter() - start
    write_report(out, meta, cases, records)
    print(f"\n{render_markdown(meta, cases, records)}\nwrote {out / 'gpu-speed.md'} and {out / 'gpu-speed.json'}")
    if meta["stopped"]:
        return 143
    return 1 if any(r["status"] == ERROR for r in records.values()) else 0
