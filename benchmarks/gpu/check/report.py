"""The report: its Markdown tables and the JSON beside it."""

from __future__ import annotations

import json
import re
from dataclasses import asdict
from pathlib import Path

from attnzoo.bench import ratio_table
from attnzoo.io import atomic_write_text
from attnzoo.tables import Table, ratio, speed_header

from gpu.check.plan import ERROR, FAIL, OUT_OF_MEMORY, PASS, SKIPPED, TOLERANCES, UNAVAILABLE, Check, Plan, Report


def device_slug(name: str) -> str:
    """'NVIDIA H100 80GB HBM3' → 'nvidia-h100-80gb-hbm3'."""
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "device"


def report_path(out: Path, device_name: str, plan: Plan) -> Path:
    suffix = {"full": "", "quick": "-quick", "dry run": "-dry-run"}[plan.name]
    return out / f"gpu-{device_slug(device_name)}{suffix}.md"


def fmt(value: float | None) -> str:
    return "–" if value is None else f"{value:.1e}"


def cell(checks: dict[str, Check], name: str) -> str:
    check = checks.get(name)
    if check is None:
        return "–"
    if check.status == PASS:
        return fmt(check.value) if check.value is not None else "ok"
    if check.status == FAIL:
        return f"**FAIL {fmt(check.value)}**" if check.value is not None else "**FAIL**"
    return check.status


def dispatch_cell(check: Check | None, key: str) -> str:
    if check is None or key not in check.extra:
        return "–"
    return ", ".join(check.extra[key]) or "none"


def numerics_table(report: Report) -> Table:
    by_case: dict[str, dict[str, Check]] = {}
    for check in report.checks:
        if check.name in ("config", "forward", "backward", "cached decode", "dispatch"):
            by_case.setdefault(check.case, {})[check.name] = check
    header = ["combination", "forward", "backward", "cached decode", "attend picks"]
    header += ["SDPA in training", "SDPA in decode", "SDPA backends that run it", "status"]
    rows = []
    for case, checks in by_case.items():
        if "config" in checks:
            rows.append([case, *(["–"] * 7), f"refused: {checks['config'].detail}"])
            continue
        dispatch = checks.get("dispatch")
        backends = dispatch.extra.get("backends", {}) if dispatch else {}
        runs = ", ".join(b for b, outcome in backends.items() if outcome == "ok") or "–"
        statuses = {c.status for c in checks.values()}
        status = FAIL if FAIL in statuses else ERROR if ERROR in statuses else PASS
        cells = [cell(checks, n) for n in ("forward", "backward", "cached decode")]
        dispatched = [dispatch_cell(dispatch, k) for k in ("attend", "sdpa train", "sdpa decode")]
        if dispatch is not None and dispatch.status != PASS:
            dispatched[0] = f"**{dispatch.status}** {dispatched[0]}"
        rows.append([case, *cells, *dispatched, runs, status])
    return Table(header, rows)


def compile_table(report: Report) -> Table:
    rows = []
    for check in report.checks:
        if check.name in ("compile train", "compile decode"):
            what = "training step" if check.name == "compile train" else "generate(compile=True)"
            rows.append([check.case, what, check.status, fmt(check.value), fmt(check.limit), check.detail])
    return Table(["combination", "compiled", "status", "error", "tolerance", "detail"], rows)


def training_table(report: Report, baseline: str) -> Table:
    table = ratio_table(report.train_speed, baseline)
    mfu = [f"{r.extra['mfu']:.1%}" if r.extra.get("mfu") is not None else "N/A" for r in report.train_speed]
    flops = [f"{r.extra['flops_per_token'] / 1e9:.3g}" for r in report.train_speed]
    keep = [i for i, name in enumerate(table.header) if name not in ("mode", "KV cache MB")]
    header = [table.header[i] for i in keep] + ["GFLOP/token", "MFU (bf16 peak)"]
    rows = [[row[i] for i in keep] + [f, m] for row, f, m in zip(table.rows, flops, mfu, strict=True)]
    return Table(header, rows)


def decoding_table(report: Report, baseline: str) -> Table:
    base = {r["batch"]: r["eager_tok_s"] for r in report.decode_speed if r["case"] == baseline}
    header = [
        "case",
        "batch",
        "eager tok/s",
        speed_header(baseline),
        "compiled tok/s",
        "compiled vs eager",
        "compile s",
    ]
    rows = []
    for r in report.decode_speed:
        compiled = r.get("compiled_tok_s")
        rows.append(
            [
                r["case"],
                str(r["batch"]),
                f"{r['eager_tok_s']:,.0f}",
                ratio(r["eager_tok_s"] / base[r["batch"]] if r["batch"] in base else None),
                f"{compiled:,.0f}" if compiled is not None else r.get("compiled", SKIPPED),
                ratio(compiled / r["eager_tok_s"] if compiled is not None else None),
                f"{r['compile_s']:.1f}" if "compile_s" in r else "–",
            ]
        )
    return Table(header, rows)


def tolerance_table() -> Table:
    names = list(TOLERANCES["fp32"])
    return Table(["dtype", *names], [[d, *(f"{TOLERANCES[d][n]:.0e}" for n in names)] for d in TOLERANCES])


def render_markdown(report: Report) -> str:
    meta = report.meta
    counts: dict[str, int] = {}
    for check in report.checks:
        counts[check.status] = counts.get(check.status, 0) + 1
    verdict = "FAIL" if report.failures else "PASS"
    lines = [
        f"# attnzoo GPU check: {meta['device']}",
        "",
        f"{meta['plan']} plan; torch {meta['torch']}, CUDA {meta['cuda']}, attnzoo {meta['attnzoo']} "
        f"(commit {meta['commit']}); {meta['elapsed_s']:.0f} s{'' if meta['finished'] else ' so far, unfinished'} ("
        + ", ".join(f"{name} {s:.0f} s" for name, s in meta["sections_s"].items())
        + ").",
        f"Command: `{meta['command']}`",
        "",
        f"**{verdict}**: " + ", ".join(f"{n} {s}" for s, n in sorted(counts.items())),
        "",
    ]
    if report.failures:
        rows = [[c.case, c.name, c.status, fmt(c.value), fmt(c.limit), c.detail] for c in report.failures]
        lines += ["## Failures", "", Table(["case", "check", "status", "value", "limit", "detail"], rows).to_markdown()]
        lines.append("")
    lines += [
        "## Numerics, cached decoding and SDPA dispatch",
        "",
        f"Each combination is a {meta['numerics_model']}. bf16 runs under autocast over fp32 weights. Errors are "
        "relative, ‖a − b‖ / ‖b‖: forward and backward against the CPU float64 eager reference with the same "
        "weights and input (backward: all gradients as one vector; the JSON names the worst parameter), cached "
        "decode against the device's own full forward. Tolerances:",
        "",
        tolerance_table().to_markdown(),
        "",
        "Dispatch: `attend picks` is the kernel attnzoo's `attend` chose (kernels.py); the SDPA columns are the "
        "backends torch ran in a training step and a decode step (the fused kernel each SDPA call dispatched, or "
        "math where it dispatched none); the last column lists the backends that run the training forward when "
        "forced one at a time. Enforced on CUDA: every mechanism but dcmha runs SDPA on a fused backend, never "
        "math; dcmha acts on the scores and runs its own fused kernel (Triton on CUDA, C++ on the CPU) or its "
        "chunked eager kernel, no SDPA. Likely backends: flash or cuDNN "
        "in bf16 without a bias; memory-efficient for fp32 (flash and cuDNN take half precision only), ALiBi's "
        "additive mask and Diff, whose values are twice as wide as its queries.",
        "",
        numerics_table(report).to_markdown(),
        "",
    ]
    compiled = compile_table(report)
    if compiled.rows:
        lines += ["## torch.compile", "", compiled.to_markdown(), ""]
    if report.matmul_tflops or report.train_speed or report.decode_speed:
        lines += ["## Speed", ""]
        peaks = ", ".join(f"{d} {t:,.1f} TFLOP/s" for d, t in report.matmul_tflops.items())
        lines += [f"Matmul peak measured in this run ({meta['matmul_n']}² × {meta['matmul_n']}²): {peaks}.", ""]
        baseline = "mha+rope"
        if report.train_speed:
            lines += [
                f"Training (forward + backward, bf16 autocast) of a {meta['speed_model']}, each variant matched to "
                "its parameters; batch × T = "
                f"{meta['tokens_per_step']:,} tokens per step. Model FLOPs count every matmul (torch's flop "
                "counter), SDPA's causal attention at half its T×S.",
                "",
                training_table(report, baseline).to_markdown(),
                "",
            ]
        if report.decode_speed:
            lines += [
                f"Greedy decoding (`generate`) with bf16 weights: a {meta['decode_prompt']}-token prompt and "
                f"{meta['decode_tokens']} new tokens; tok/s = batch × new tokens / the call's wall time.",
                "",
                decoding_table(report, baseline).to_markdown(),
                "",
            ]
    skipped = [c for c in report.checks if c.status in (SKIPPED, OUT_OF_MEMORY, UNAVAILABLE)]
    if skipped:
        rows = [[c.case, c.name, c.status, c.detail] for c in skipped]
        lines += ["## Not run", "", Table(["case", "check", "status", "why"], rows).to_markdown(), ""]
    return "\n".join(lines)


def write_report(report: Report, path: Path) -> None:
    """The markdown report at ``path`` and the same results as JSON beside it; both written atomically."""
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, render_markdown(report))
    payload = {
        "meta": report.meta,
        "tolerances": TOLERANCES,
        "failures": len(report.failures),
        "checks": [asdict(c) for c in report.checks],
        "train_speed": [asdict(r) for r in report.train_speed],
        "decode_speed": report.decode_speed,
        "matmul_tflops": report.matmul_tflops,
    }
    atomic_write_text(path.with_suffix(".json"), json.dumps(payload, indent=2, default=str) + "\n")
