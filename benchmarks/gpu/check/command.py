"""Verify attnzoo on a CUDA GPU with one command (issue 14).

    python benchmarks/gpu_check.py             # the full check, sized for < 10 minutes on an H100
    python benchmarks/gpu_check.py --quick     # fewer combinations and sizes, about 3 minutes
    python benchmarks/gpu_check.py --dry-run   # the CPU part at tiny sizes (what CI runs); forced without CUDA

Writes ``benchmarks/results/gpu-<device>.md`` (``gpu-<device>-quick.md`` with --quick) and the same results as JSON
beside it, rewritten after every section, and exits 1 if any check failed or raised. For every mechanism ×
position × MHA/GQA × dtype (fp32, and bf16 under autocast as training runs on CUDA), with a small model:

* numerics: the logits and the gradients of the device's fast path against the CPU float64 eager reference with the
  same weights and input, as relative errors ‖a − b‖ / ‖b‖ within the dtype's tolerance (``TOLERANCES``);
* cached decode: a prefill, single-token steps and a multi-token chunk on the device against its full forward;
* dispatch: the kernel attnzoo's ``attend`` picks (``attention/kernels/dispatch.py``) and the SDPA backend torch
  actually ran in a training step and a decode step (the fused kernel each SDPA call dispatched, or math when it
  dispatched none). On CUDA a mechanism on SDPA must never fall to SDPA's math path; the backends that can run it,
  tried one at a time under ``sdpa_kernel``, explain a fall.

Then ``torch.compile`` of a training step and of decoding (``generate(..., compile=True)``) for a subset of those
combinations: equal outputs and the recompile count. Last the speed at a size that fills a GPU: training tok/s,
peak memory and model FLOPs utilisation against MHA, and decode tok/s at batch 1 and 16, eager and compiled. A
combination the config refuses is recorded as refused with the reason; an error in one is recorded and the rest
run. Sections past the time budget (``--budget``) are recorded as skipped.

This module runs the sections in turn (``benchmarks/gpu_check.py`` is its entry point); their parts live beside it
in ``benchmarks/gpu/check/``: ``plan`` (the combinations,
sizes, tolerances and the report's records), ``numerics`` (against the reference, cached decoding, compile),
``dispatch`` (which kernel ran), ``speed`` and ``report`` (the Markdown and JSON).
"""

from __future__ import annotations

import argparse
import dataclasses
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

import attnzoo

from gpu.check.numerics import check_combo, check_compiled_decode, check_compiled_training
from gpu.check.plan import (
    PASS,
    SKIPPED,
    Check,
    Deadline,
    Plan,
    Report,
    error_check,
    free_memory,
    make_plan,
)
from gpu.check.report import fmt, report_path, write_report
from gpu.check.speed import matmul_tflops, measure_compiled_decoding, measure_decoding, measure_training

BENCHMARKS = Path(__file__).resolve().parents[2]
RESULTS_DIR = BENCHMARKS / "results"


def git_commit() -> str:
    """The checkout's commit, marked when tracked files differ from it: what the report verified."""
    try:
        run = dict(capture_output=True, text=True, timeout=10, cwd=BENCHMARKS)
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], **run).stdout.strip()
        dirty = subprocess.run(["git", "diff", "--quiet", "HEAD"], **run).returncode == 1
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return f"{commit} with uncommitted changes" if commit and dirty else commit or "unknown"


def device_name(device: str) -> str:
    if torch.device(device).type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"CPU ({platform.machine()})"


def new_report(plan: Plan, device: str, argv: list[str]) -> Report:
    speed = plan.speed
    return Report(
        meta={
            "device": device_name(device),
            "plan": plan.name,
            "torch": torch.__version__,
            "cuda": torch.version.cuda,
            "attnzoo": attnzoo.__version__,
            "commit": git_commit(),
            "command": " ".join(["python benchmarks/gpu_check.py", *argv]),
            "numerics_model": f"dim {plan.dim}, {plan.n_layers} layers, {plan.n_heads} heads (GQA: "
            f"{plan.n_heads // 2} kv heads; diff pairs as its paper does) at batch {plan.batch} × T {plan.seq_len}",
            "speed_model": f"dim {speed.dim}, {speed.n_layers} layers, {speed.n_heads} heads, "
            f"vocabulary {speed.vocab_size:,}",
            "tokens_per_step": speed.tokens_per_step,
            "decode_prompt": speed.decode_prompt,
            "decode_tokens": speed.decode_tokens,
            "matmul_n": speed.matmul_n,
            "budget_s": plan.budget_s,
            "float32_matmul_precision": torch.get_float32_matmul_precision(),
            "elapsed_s": 0.0,
            "sections_s": {},
            "finished": False,
        }
    )


def run_numerics(report: Report, plan: Plan, device: str, deadline: Deadline) -> None:
    combos = plan.combos()
    for i, combo in enumerate(combos, 1):
        if deadline.left() < 0:
            report.add(Check(combo.label, "numerics", SKIPPED, detail="time budget"))
            continue
        try:
            checks = check_combo(combo, plan, device)
        except Exception as err:  # building the models failed: recorded, the next combination runs
            checks = [error_check(combo.label, "numerics", err)]
        for check in checks:
            report.add(check)
        bad = [f"{c.name} {c.status}" for c in checks if c.status != PASS]
        print(f"  [{i}/{len(combos)}] {combo.label:32s} {'; '.join(bad) or 'pass'}")
        sys.stdout.flush()
        free_memory()


def run_compile_checks(report: Report, plan: Plan, device: str, deadline: Deadline) -> None:
    for combo in plan.compile_combos:
        for name, check_fn in (("compile train", check_compiled_training), ("compile decode", check_compiled_decode)):
            if deadline.left() < 30:
                report.add(Check(combo.label, name, SKIPPED, detail="time budget"))
                continue
            try:
                check = report.add(check_fn(combo, plan, device))
            except Exception as err:
                check = report.add(error_check(combo.label, name, err))
            print(f"  {combo.label:32s} {name:15s} {check.status} {check.detail}")
            free_memory()
    torch._dynamo.reset()


def run_check(plan: Plan, device: str, out: Path, argv: list[str]) -> Report:
    """Every section in turn, cheapest and most important first, the report rewritten after each."""
    deadline = Deadline(plan.budget_s)
    if torch.device(device).type == "cuda":
        torch.set_float32_matmul_precision("highest")  # fp32 is fp32: TF32 would blur the fp32 tolerances
    report = new_report(plan, device, argv)
    path = report_path(out, report.meta["device"], plan)
    section_start = [0.0]

    def save(section: str) -> None:
        """Rewrite the report after a section, so a run cut short still leaves what it measured."""
        report.meta["elapsed_s"] = deadline.elapsed()
        report.meta["sections_s"][section] = round(deadline.elapsed() - section_start[0], 1)
        section_start[0] = deadline.elapsed()
        write_report(report, path)

    print(f"gpu_check: {plan.name} plan on {report.meta['device']}: {len(plan.combos())} combinations; report → {path}")
    run_numerics(report, plan, device, deadline)
    save("numerics")
    print("gpu_check: speed")
    seconds = 0.5 if torch.device(device).type == "cuda" else 0.05
    for label, dtype in (("bf16", torch.bfloat16), ("fp32", torch.float32)):
        report.matmul_tflops[label] = matmul_tflops(plan.speed.matmul_n, dtype, device, seconds)
    print("  matmul peak: " + ", ".join(f"{d} {t:,.1f} TFLOP/s" for d, t in report.matmul_tflops.items()))
    measure_training(report, plan, device, deadline)
    save("training speed")
    measure_decoding(report, plan, device, deadline)
    save("decoding speed")
    print("gpu_check: torch.compile")
    run_compile_checks(report, plan, device, deadline)
    save("compile")
    measure_compiled_decoding(report, plan, device, deadline)
    report.meta["finished"] = True
    save("compiled decoding speed")

    print(f"\ngpu_check: {'FAIL' if report.failures else 'PASS'}, {len(report.failures)} failure(s); wrote {path} "
          f"and {path.with_suffix('.json')} in {deadline.elapsed():.0f} s")  # fmt: skip
    for c in report.failures:
        print(f"  {c.status}: {c.case} {c.name} {fmt(c.value)} (limit {fmt(c.limit)}) {c.detail}")
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=None, help=f"directory of the report (default: {RESULTS_DIR})")
    parser.add_argument("--quick", action="store_true", help="fewer combinations and sizes (about 3 min on a GPU)")
    parser.add_argument("--dry-run", action="store_true", help="the CPU part at tiny sizes, even where CUDA is present")
    parser.add_argument("--budget", type=float, default=None, help="seconds after which sections are skipped")
    args = parser.parse_args(argv)
    argv = sys.argv[1:] if argv is None else argv
    if args.budget is not None and not args.budget > 0:
        parser.error(f"--budget={args.budget} is invalid: must be a number of seconds > 0")
    dry_run = args.dry_run or not torch.cuda.is_available()
    if dry_run and not args.dry_run:
        print("gpu_check: no CUDA device (torch.cuda.is_available() is False); nothing is verified on a GPU. "
              "Running the dry run of the CPU part instead.")  # fmt: skip
    plan = make_plan("dry run" if dry_run else "quick" if args.quick else "full")
    if args.budget is not None:
        plan = dataclasses.replace(plan, budget_s=args.budget)
    out = args.out or (Path(tempfile.mkdtemp(prefix="gpu-check-")) if dry_run else RESULTS_DIR)
    try:  # now, not when the first section is written minutes later
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        parser.error(f"--out={out} is invalid: cannot create the report's directory ({err.strerror})")
    report = run_check(plan, "cpu" if dry_run else "cuda", out, argv)
    return 1 if report.failures else 0
