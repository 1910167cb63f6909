"""The lease's reports: ``gpu-speed.md`` (its tables), ``gpu-speed.json`` and ``summary.json``."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import bench_dcmha_triton

from attnzoo.io import atomic_write_text
from attnzoo.tables import Table, ratio

from gpu.plan import MEASURED, RATIO_SIZES, Case, Settings
from gpu.pytest_stage import tests_line


def training_record(records: dict[str, dict[str, Any]], size: str, label: str, mode: str) -> dict[str, Any] | None:
    record = records.get(f"{size} {label} {mode}")
    return record if record is not None and record["status"] == MEASURED else None


def speed_memory(record: dict[str, Any] | None, base: dict[str, Any] | None) -> str:
    if record is None or base is None:
        return "–"
    speed = ratio(record["tokens_per_s"] / base["tokens_per_s"])
    if record["peak_mem_mib"] is None or not base["peak_mem_mib"]:
        return speed
    return f"{speed} / {ratio(record['peak_mem_mib'] / base['peak_mem_mib'])}"


def percent(value: float | None) -> str:
    return "–" if value is None else f"{value:.1%}"


def number(value: float | None, fmt: str) -> str:
    return "–" if value is None else format(value, fmt)


def glance_tables(cases: list[Case], records: dict[str, dict[str, Any]]) -> list[str]:
    parts = []
    for size in RATIO_SIZES:
        labels = list(dict.fromkeys(c.label for c in cases if c.kind == "train" and c.size == size))
        header = [size, "eager: speed / memory vs mha", "compiled: speed / memory vs mha", "compiled ÷ eager"]
        rows = []
        for label in labels:
            eager, compiled = (training_record(records, size, label, mode) for mode in ("eager", "compiled"))
            base_eager, base_compiled = (training_record(records, size, "mha", mode) for mode in ("eager", "compiled"))
            gain = ratio(compiled["tokens_per_s"] / eager["tokens_per_s"]) if eager and compiled else "–"
            mfu = [percent(r.get("mfu")) if r else "–" for r in (eager, compiled)]
            rows.append([label, speed_memory(eager, base_eager), speed_memory(compiled, base_compiled), gain, *mfu])
        if rows:
            parts.append(Table([*header, "MFU eager", "MFU compiled"], rows).to_markdown())
    anchor = [
        [mode, number(r["tokens_per_s"], ",.0f"), percent(r["mfu"])] if r else [mode, "–", "–"]
        for mode in ("eager", "compiled")
        for r in [training_record(records, "nanogpt-124m", "mha", mode)]
    ]
    parts.append(Table(["nanogpt-124m mha", "tok/s", "MFU (nanoGPT: ≈ 33% on one H100)"], anchor).to_markdown())
    decode_rows = []
    for case in (c for c in cases if c.kind == "decode"):
        record = records.get(case.name, {})
        paths = {row["path"]: row["tokens_per_s"] for row in record.get("rows", [])}
        eager, compiled = paths.get("eager"), paths.get("compiled")
        gain = ratio(compiled / eager) if eager and compiled else "–"
        decode_rows.append([case.label, str(case.batch_size), number(eager, ",.1f"), number(compiled, ",.1f"), gain])
    header = ["decode", "batch", "eager tok/s", "compiled tok/s", "compiled ÷ eager"]
    parts.append(Table(header, decode_rows).to_markdown())
    return parts


def training_table(cases: list[Case], records: dict[str, dict[str, Any]]) -> Table:
    header = [
        "case",
        "kernel",
        "params",
        "batch × T",
        "tok/s (median)",
        "spread (min–max)",
        "ms/step (min–max)",
        "peak MiB",
    ]
    header += ["GFLOP/token", "MFU", "first step s", "compile s", "graphs, recompiles", "note"]
    rows = []
    for case in cases:
        r = records[case.name]
        if case.kind != "train" or r["status"] != MEASURED:
            continue
        rows.append(
            [
                case.name,
                ", ".join(dict.fromkeys(r["kernels"])),
                f"{r['params'] / 1e6:.2f}M",
                f"{case.batch_size} × {case.seq_len}",
                f"{r['tokens_per_s']:,.0f}",
                f"{r['tokens_per_s_min']:,.0f}–{r['tokens_per_s_max']:,.0f}",
                f"{r['ms_per_step']:.2f} ({r['ms_min']:.2f}–{r['ms_max']:.2f})",
                number(r["peak_mem_mib"], ",.0f"),
                f"{r['flops_per_token'] / 1e9:.4g}",
                percent(r["mfu"]),
                f"{r['first_step_s']:.1f}",
                number(r["compile_s"], ".1f"),
                f"{r['graphs']}, {r['recompiles']}" if case.compiled else "–",
                r["reason"] or "–",
            ]
        )
    return Table(header, rows)


def layer_speeds(cases: list[Case], records: dict[str, dict[str, Any]]) -> dict[str, float]:
    """Each measured layer case's speed against MHA on flash attention, eager: FlashAttention's time ÷ its time."""
    base = records.get("layer mha-flash eager", {})
    if base.get("status") != MEASURED:
        return {}
    return {
        case.name: base["ms_per_step"] / records[case.name]["ms_per_step"]
        for case in cases
        if case.kind == "layer" and records[case.name]["status"] == MEASURED
    }


def layer_table(cases: list[Case], records: dict[str, dict[str, Any]]) -> Table:
    speeds = layer_speeds(cases, records)
    header = ["case", "batch × T", "ms/step (min–max)", "tok/s", "speed vs mha-flash eager", "peak MiB", "compile s"]
    rows = [
        [
            case.name,
            f"{case.batch_size} × {case.seq_len}",
            f"{r['ms_per_step']:.2f} ({r['ms_min']:.2f}–{r['ms_max']:.2f})",
            f"{r['tokens_per_s']:,.0f}",
            ratio(speeds[case.name]) if case.name in speeds else "–",
            number(r["peak_mem_mib"], ",.0f"),
            number(r["compile_s"], ".1f"),
        ]
        for case in cases
        if case.kind == "layer" and (r := records[case.name])["status"] == MEASURED
    ]
    return Table(header, rows)


def decode_table(cases: list[Case], records: dict[str, dict[str, Any]]) -> Table:
    header = ["case", "path", "tok/s (median)", "spread (min–max)", "vs eager", "compile s", "same tokens as eager"]
    rows = []
    for case in cases:
        r = records[case.name]
        if case.kind != "decode" or r["status"] != MEASURED:
            continue
        eager = next(row["tokens_per_s"] for row in r["rows"] if row["path"] == "eager")
        rows += [
            [
                case.name,
                row["path"],
                f"{row['tokens_per_s']:,.1f}",
                f"{row['tokens_per_s_min']:,.1f}–{row['tokens_per_s_max']:,.1f}",
                ratio(row["tokens_per_s"] / eager),
                number(row["compile_s"], ".1f"),
                "yes" if row["same_tokens"] else "no",
            ]
            for row in r["rows"]
        ]
    return Table(header, rows)


def render_markdown(meta: dict[str, Any], cases: list[Case], records: dict[str, dict[str, Any]]) -> str:
    settings: Settings = meta["settings"]
    state = "finished" if meta["finished"] else f"not finished ({meta['stopped'] or 'in progress or cut off'})"
    autocast = "bf16 autocast" if settings.dtype == "bfloat16" else settings.dtype
    lines = [
        f"# GPU speed (issue 36): {meta['device']}{' — dry run at toy sizes' if meta['dry_run'] else ''}",
        "",
        f"- {meta['machine']}; triton {meta['triton']}; attnzoo at {meta['commit']}",
        f"- `{meta['command']}`: {state}, {meta['elapsed_s']:.0f} s of a {meta['budget_s']:.0f} s budget",
        *(f"- {size}: {text}" for size, text in meta["sizes"].items()),
        f"- training: {autocast}, forward + backward + AdamW (fused on CUDA), {settings.rounds} rounds of "
        f"{settings.steps_per_round} steps timed after {settings.warmup_steps} untimed; compiled: torch.compile "
        f"of the whole model, backend {settings.compile_backend!r}; peak memory: the CUDA allocator's peak over the "
        "timed steps",
        f"- MFU against {number(meta['peak_tflops'], 'g')} TFLOP/s ({meta['peak_source']}); FLOPs per token by "
        "`attnzoo.model.training_flops_per_token` (every matrix product, all T × T scores)",
        f"- decoding: greedy, {settings.dtype} weights, {settings.decode_new_tokens} tokens after a "
        f"{settings.decode_context}-token prompt, median of {settings.decode_repeats}; compiled is "
        "`generate(compile=True)`'s step",
        "",
        "## At a glance",
        "",
        "Speed is tok/s ÷ MHA's in the same mode, memory peak ÷ MHA's (above 1: faster, more).",
        "",
    ]
    lines += [part + "\n" for part in glance_tables(cases, records)]
    lines += ["## Training, every row", "", training_table(cases, records).to_markdown(), ""]
    layer = next((c for c in cases if c.kind == "layer"), None)
    if layer is not None:
        lines += [
            f"## The DCMHA layer against flash attention (dim {layer.config.dim}, {layer.config.n_heads} heads, "
            "forward + backward, projections included)",
            "",
            layer_table(cases, records).to_markdown(),
            "",
        ]
        kernel = records.get("layer dcmha-triton eager", {})
        ran = "triton_kernels" in kernel or "triton_kernels_error" in kernel
        lines += (
            bench_dcmha_triton.kernel_report_lines(kernel)
            if ran
            else [
                "What each compiled Triton kernel uses (ptxas): not recorded: the kernel's layer case did not run",
                "",
            ]
        )
    lines += ["## Decoding, every row", "", decode_table(cases, records).to_markdown(), ""]
    missing = [[c.name, records[c.name]["status"], records[c.name]["reason"]] for c in cases]
    missing = [row for row in missing if row[1] != MEASURED]
    lines += ["## The CUDA and Triton tests", "", f'`pytest -m "cuda or triton"`: {tests_line(meta["tests"])}', ""]
    failed = (meta["tests"] or {}).get("failed_tests", [])
    lines += [*(f"- failed: `{name}`" for name in failed), *([""] if failed else [])]
    lines += ["## Not measured", "", Table(["case", "status", "why"], missing).to_markdown() if missing else "none"]
    return "\n".join(lines) + "\n"


def summary(cases: list[Case], records: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The figures issue 36 asks after, from the rows above: training speed against MHA per size and mode."""
    speed: dict[str, dict[str, dict[str, float]]] = {}
    for case in cases:
        record, base = records[case.name], training_record(records, case.size, "mha", case.mode)
        if case.kind == "train" and case.size in RATIO_SIZES and record["status"] == MEASURED and base:
            by_mode = speed.setdefault(case.size, {})
            by_mode.setdefault(case.mode, {})[case.label] = record["tokens_per_s"] / base["tokens_per_s"]
    decode = {
        f"{case.label} batch {case.batch_size} {row['path']}": row["tokens_per_s"]
        for case in cases
        if case.kind == "decode" and records[case.name]["status"] == MEASURED
        for row in records[case.name]["rows"]
    }
    mfu = {name: r["mfu"] for name, r in records.items() if r["status"] == MEASURED and "mfu" in r}
    layer = layer_speeds(cases, records)
    return {"train_speed_vs_mha": speed, "layer_speed_vs_flash": layer, "mfu": mfu, "decode_tokens_per_s": decode}


def headline(meta: dict[str, Any], cases: list[Case], records: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """``summary.json``: the figures issue 36 names, each the best measured row of its kind (None where none was
    measured), with ``sources`` naming the row each came from or why it is None."""
    figures = summary(cases, records)
    sources: dict[str, str] = {}

    def best_ratio(key: str, mechanism: str, size: str = "gpu-lm") -> float | None:
        by_mode = figures["train_speed_vs_mha"].get(size, {})
        rows = [(value, mode, label) for mode, by in by_mode.items() for label, value in by.items()]
        rows = [row for row in rows if row[2] == mechanism or row[2].startswith(f"{mechanism}[")]
        if not rows:
            sources[key] = f"no {size} {mechanism} training row measured with mha's in the same mode"
            return None
        value, mode, label = max(rows)
        sources[key] = f"{size} {label} {mode} ÷ {size} mha {mode}, tok/s"
        return value

    def best_mfu(key: str, size: str) -> float | None:
        rows = [(r["mfu"], name) for name, r in records.items() if name.startswith(f"{size} mha ") and r.get("mfu")]
        sources[key] = max(rows)[1] if rows else f"no {size} mha row measured"
        return max(rows)[0] if rows else None

    decode = records.get("decode mha batch 1", {})
    rows = decode.get("rows", []) if decode.get("status") == MEASURED else []
    compiled = next((row["tokens_per_s"] for row in rows if row["path"] == "compiled"), None)
    layers = [(value, name) for name, value in figures["layer_speed_vs_flash"].items() if " dcmha-" in name]
    layer_case = next((c for c in cases if c.kind == "layer"), None)
    if layers:
        sources["dcmha_layer_vs_flash_T2048"] = f"{max(layers)[1]} ÷ layer mha-flash eager, at T = {layer_case.seq_len}"
    else:
        sources["dcmha_layer_vs_flash_T2048"] = "no DCMHA layer case and mha-flash eager both measured"
    sources["decode_mha_b1_tok_s_compiled"] = (
        "decode mha batch 1, generate(compile=True)'s step" if compiled else "no compiled decode row of mha at batch 1"
    )
    return {
        "device": meta["device"],
        "commit": meta["commit"],
        "date": meta["date"],
        "dtype": meta["settings"].dtype,
        "dcmha_vs_mha_train_bf16": best_ratio("dcmha_vs_mha_train_bf16", "dcmha"),
        "dcmha_vs_mha_train_bf16_185m": best_ratio("dcmha_vs_mha_train_bf16_185m", "dcmha", "185m"),
        "diff_vs_mha_train_bf16": best_ratio("diff_vs_mha_train_bf16", "diff"),
        "selective_vs_mha_train_bf16": best_ratio("selective_vs_mha_train_bf16", "selective"),
        "dcmha_layer_vs_flash_T2048": max(layers)[0] if layers else None,
        "mha_mfu_185m": best_mfu("mha_mfu_185m", "185m"),
        "mha_mfu_nanogpt_124m": best_mfu("mha_mfu_nanogpt_124m", "nanogpt-124m"),
        "decode_mha_b1_tok_s_compiled": compiled,
        "tests": tests_line(meta["tests"]),
        "sources": sources,
        # Every training row against MHA's in the same mode: what the CUDA routes are decided from (gpu/routes.py).
        "train_speed_vs_mha": figures["train_speed_vs_mha"],
    }


def write_report(out: Path, meta: dict[str, Any], cases: list[Case], records: dict[str, dict[str, Any]]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "gpu-speed.md", render_markdown(meta, cases, records))
    atomic_write_text(out / "summary.json", json.dumps(headline(meta, cases, records), indent=2))
    payload = {
        "meta": {**meta, "settings": dataclasses.asdict(meta["settings"])},
        "summary": summary(cases, records),
        "cases": [
            {
                "name": c.name,
                "group": c.group,
                "kind": c.kind,
                "mode": c.mode,
                "batch_size": c.batch_size,
                "seq_len": c.seq_len,
                "config": c.config.to_dict(),
                **records[c.name],
            }
            for c in cases
        ],
    }
    atomic_write_text(out / "gpu-speed.json", json.dumps(payload, indent=2))


def progress_line(case: Case, record: dict[str, Any]) -> str:
    if record["status"] != MEASURED:
        return f"{record['status']}: {record['reason']}"
    if case.kind == "decode":
        return ", ".join(f"{row['path']} {row['tokens_per_s']:,.1f} tok/s" for row in record["rows"])
    if case.kind == "layer":
        return f"{record['ms_per_step']:.2f} ms/step, {record['tokens_per_s']:,.0f} tok/s"
    speed = f"{record['tokens_per_s']:,.0f} tok/s, {record['ms_per_step']:.2f} ms/step, MFU {percent(record['mfu'])}"
    return speed if record["compile_s"] is None else f"{speed}, compile {record['compile_s']:.1f} s"
