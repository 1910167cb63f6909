"""Each mechanism against parameter-matched MHA, measured in one run, at 1 and 2 threads (issues 4–6 and 13).

    python benchmarks/bench_mechanisms.py     # the full sweep below; writes benchmarks/results/mechanisms.md

Training rows: forward + backward + AdamW (mode ``train+adamw``), fp32, 4096 tokens per step (batch = 4096 // T,
at least 1, so T = 8192 runs one sequence of 8192 tokens), at T = 256, 1024, 2048, 4096, 8192. Decode rows:
single-token steps with the cache after a prefill of 1024 and 4096 tokens (batch 1). Peak memory is the rise of
the case process's resident high-water mark (``attnzoo.bench``). Mechanisms: ``mha`` (RoPE, SDPA: the baseline),
``alibi`` (MHA with ALiBi), ``diff``, ``diff_v2``, ``selective``, ``dcmha`` and ``dcmha-compiled`` (DCMHA with
``compile_composition``; its first step, a warmup, compiles), all but ``alibi`` with RoPE, matched to the
baseline's parameter count within 2% (``attnzoo.variants``). Dim 256, 4 layers, 8 heads, byte vocab.

Each thread count is one section of the output, headed by the machine and the load average at its start; every
case also records the load average when it started (in the JSON). Times are only comparable within a section
and on a quiet machine: run nothing else, never two benchmarks at once (``../shared/notes/cpu_perf.md``).

Run time: the sweep is 7 mechanisms × 5 lengths of training plus 7 × 2 decode cases, at 2 thread counts, each
case warmup + 3 repeats in a fresh process. DCMHA's quadratic composition dominates: at T = 8192 one eager DCMHA
step takes about 80 s on 1 thread. With ``--repeats 2`` the whole sweep took 40 minutes on a quiet 2-core machine
(``--seq-lens``, ``--mechanisms``, ``--threads``, ``--repeats`` and ``--rounds`` scale it).
A case that dies (out of memory) is listed under its section and the sweep goes on. Each section opens with
the ratios at a glance (one row per mechanism, "speed× / memory×" against MHA per length), then every measured row.

``--rounds R`` runs the whole list of cases R times in turn and pools each case's repeats over its rounds: the
machine's drift over minutes (even at 1 thread, MHA's own rate moved by ±10% between cases in one sweep) then falls
on every case alike instead of on the cases that happened to run during it. Each round pays a warmup per case.

``--malloc-mmap-threshold BYTES`` (e.g. 131072) fixes glibc's mmap threshold in every case process: tensors above
it are then mapped and unmapped one by one, so the resident peak follows the tensors alive rather than glibc's
heap high-water mark, which its default dynamic threshold inflates with fragmentation (for DCMHA's many
score-sized blocks of changing sizes most of all). It also changes the allocator's speed: use it for memory.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
from pathlib import Path

from attnzoo import ModelConfig
from attnzoo.bench import (
    BenchCase,
    BenchResult,
    machine_description,
    measure,
    pool_rounds,
    ratio_matrix,
    ratio_table,
)
from attnzoo.io import atomic_write_text
from attnzoo.variants import Variant, matched_configs

TOKENS_PER_STEP = 4096
# label → (mechanism, position, attention options added to the matched config)
MECHANISMS: dict[str, tuple[str, str, dict]] = {
    "mha": ("mha", "rope", {}),
    "alibi": ("mha", "alibi", {}),
    "diff": ("diff", "rope", {}),
    "diff_v2": ("diff_v2", "rope", {}),
    "selective": ("selective", "rope", {}),
    "dcmha": ("dcmha", "rope", {}),
    "dcmha-compiled": ("dcmha", "rope", {"compile_composition": True}),
}


def configs(labels: list[str], baseline: ModelConfig) -> dict[str, ModelConfig]:
    """Each label's config, matched to ``baseline``'s parameter count."""
    variants = {label: Variant(*MECHANISMS[label][:2]) for label in labels}
    matched = matched_configs(list(dict.fromkeys(variants.values())), baseline)
    out = {}
    for label, variant in variants.items():
        cfg = matched[variant.label]
        extra = MECHANISMS[label][2]
        out[label] = dataclasses.replace(cfg, attention_options={**cfg.attention_options, **extra}) if extra else cfg
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--repeats", type=int, default=3, help="timed steps per case process, after one warmup")
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="measure the whole case list this many times in turn, pooling each case's repeats (see above)",
    )
    parser.add_argument("--seq-lens", type=int, nargs="+", default=[256, 1024, 2048, 4096, 8192])
    parser.add_argument("--decode-contexts", type=int, nargs="+", default=[1024, 4096])
    parser.add_argument("--decode-tokens", type=int, default=32)
    parser.add_argument("--mechanisms", nargs="+", default=list(MECHANISMS), choices=list(MECHANISMS))
    parser.add_argument("--tokens-per-step", type=int, default=TOKENS_PER_STEP)
    parser.add_argument("--dim", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--malloc-mmap-threshold", type=int, metavar="BYTES", help="see above; default: glibc's own")
    parser.add_argument(
        "--out", type=Path, default=Path("benchmarks/results/mechanisms.md"), help="markdown tables; JSON beside it"
    )
    parser.add_argument(
        "--render", action="store_true", help="measure nothing: rewrite --out's markdown from the JSON beside it"
    )
    args = parser.parse_args()
    for name in ("repeats", "rounds"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} {getattr(args, name)} is invalid: must be >= 1")
    if args.render:
        source = args.out.with_suffix(".json")
        if not source.is_file():
            parser.error(f"--render reads {source}, which does not exist: run the sweep first")
        write(json.loads(source.read_text(encoding="utf-8")), args.out)
        return
    if "mha" not in args.mechanisms:
        parser.error("--mechanisms must include mha, the baseline every ratio is taken against")
    if args.malloc_mmap_threshold is not None:
        os.environ["MALLOC_MMAP_THRESHOLD_"] = str(args.malloc_mmap_threshold)  # read by each spawned case process

    def baseline(max_seq_len: int) -> ModelConfig:
        return ModelConfig(
            vocab_size=256, dim=args.dim, n_layers=args.layers, n_heads=args.heads, max_seq_len=max_seq_len
        )

    cases = []
    for seq_len in args.seq_lens:
        batch = max(1, args.tokens_per_step // seq_len)
        for label, cfg in configs(args.mechanisms, baseline(seq_len)).items():
            cases.append(BenchCase(label, cfg, batch, seq_len, mode="train+adamw"))
    for context in args.decode_contexts:
        for label, cfg in configs(args.mechanisms, baseline(context + args.decode_tokens)).items():
            cases.append(BenchCase(label, cfg, 1, context, mode="decode", decode_tokens=args.decode_tokens))

    allocator = (
        "glibc's default malloc"
        if args.malloc_mmap_threshold is None
        else f"MALLOC_MMAP_THRESHOLD_={args.malloc_mmap_threshold}"
    )
    payload: list[dict] = []
    for threads in args.threads:
        header = (
            f"### {threads} thread(s)\n\nMachine: {machine_description(threads)}. fp32; {allocator}; training rows "
            f"do forward + backward + AdamW on {args.tokens_per_step} tokens per step (batch × T, batch ≥ 1); decode "
            f"rows time {args.decode_tokens} single-token steps after a prefill of T tokens."
        )
        failed = []
        rounds: dict[int, list[BenchResult]] = {index: [] for index in range(len(cases))}
        for round_index in range(args.rounds):
            for index, case in enumerate(cases):
                if index not in rounds:  # failed in an earlier round
                    continue
                try:
                    result = measure(case, repeats=args.repeats, threads=threads)
                except RuntimeError as err:  # a case that runs out of memory is reported, and the sweep goes on
                    failed.append(f"- {case.label} {case.mode} T={case.seq_len}: {err}")
                    print(failed[-1], flush=True)
                    del rounds[index]
                    continue
                rounds[index].append(result)
                print(
                    f"{threads}t round {round_index + 1}/{args.rounds} {case.label:15s} {case.mode:11s} "
                    f"T={case.seq_len:5d} {result.tokens_per_s:9,.0f} tok/s {result.peak_mem_mb:8,.0f} MB  "
                    f"load {result.extra['load_average']:.2f}",
                    flush=True,
                )
        results = [pool_rounds(measured) for measured in rounds.values()]
        payload.append(
            {
                "threads": threads,
                "header": header,
                "results": [dataclasses.asdict(r) for r in results],
                "failed": failed,
            }
        )
        print(f"\n{render_section(payload[-1])}\n", flush=True)
        write(payload, args.out)  # after each section: a sweep stopped part-way keeps the thread counts it finished


def render_section(section: dict) -> str:
    """One thread count's markdown: its header, the ratios at a glance, every measured row, and what failed."""
    results = [BenchResult(**r) for r in section["results"]]
    parts = [section["header"], ratio_matrix(results, baseline="mha").to_markdown()]
    parts += [ratio_table(results, baseline="mha").to_markdown()]
    if section.get("failed"):
        parts.append("Not measured:\n" + "\n".join(section["failed"]))
    return "\n\n".join(parts)


def write(payload: list[dict], out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out, "\n\n".join(map(render_section, payload)) + "\n")
    atomic_write_text(out.with_suffix(".json"), json.dumps(payload, indent=2))
    print(f"wrote {out} and {out.with_suffix('.json')}")


if __name__ == "__main__":
    main()
