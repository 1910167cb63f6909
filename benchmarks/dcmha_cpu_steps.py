"""DCMHA's training step against MHA's in CPU time, one process, steps interleaved (issue 52, item 3).

    OMP_NUM_THREADS=1 python benchmarks/dcmha_cpu_steps.py --rounds 4 --out benchmarks/results/x.json
    ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2 ... (the AVX2 build of everything)

The models and steps of ``bench_mechanisms.py`` (dim 256, 4 layers, 8 heads, byte vocab, parameter-matched, fp32,
forward + backward + AdamW, 2048 tokens a step: T = 256 B8 and T = 1024 B2, the issue's shapes), but every model
lives in this one process and each round runs one step of each in turn, timed by the thread's CPU time
(``time.thread_time``) rather than the wall clock: on a shared machine whose load is several times its cores, a
step's wall time measures the scheduler, its CPU time still mostly the step (caches shared with other processes
still slow it). Ratios are per round against MHA's step of the same round; the medians over rounds are printed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import torch
from bench_mechanisms import configs

from attnzoo import ModelConfig, Transformer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--seq-lens", type=int, nargs="+", default=[256, 1024])
    parser.add_argument("--tokens-per-step", type=int, default=2048)
    parser.add_argument("--mechanisms", nargs="+", default=["mha", "dcmha", "alibi", "diff"])
    parser.add_argument("--out", type=Path, help="JSON of every step's CPU time")
    args = parser.parse_args()
    torch.set_num_threads(1)
    steps = {}
    for seq_len in args.seq_lens:
        batch = max(1, args.tokens_per_step // seq_len)
        baseline = ModelConfig(vocab_size=256, dim=256, n_layers=4, n_heads=8, max_seq_len=seq_len)
        for label, cfg in configs(args.mechanisms, baseline).items():
            torch.manual_seed(0)
            model = Transformer(cfg)
            optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
            idx = torch.randint(0, 256, (batch, seq_len))

            def step(model=model, optimizer=optimizer, idx=idx) -> float:
                start = time.thread_time()
                model.zero_grad(set_to_none=True)
                model(idx, idx)[1].backward()
                optimizer.step()
                return time.thread_time() - start

            step()  # warmup
            steps[(label, seq_len, batch)] = (step, [])
    loads = [os.getloadavg()[0]]
    for _ in range(args.rounds):
        for step, times in steps.values():
            times.append(step())
        loads.append(os.getloadavg()[0])
    rows = []
    for (label, seq_len, batch), (_, times) in steps.items():
        base = steps[("mha", seq_len, batch)][1]
        ratios = [t / b for t, b in zip(times, base, strict=True)]
        rows.append(
            {
                "mechanism": label,
                "seq_len": seq_len,
                "batch": batch,
                "step_cpu_s": times,
                "ratio_to_mha": ratios,
                "median_step_cpu_s": statistics.median(times),
                "median_ratio": statistics.median(ratios),
            }
        )
        print(
            f"T={seq_len:5d} B{batch} {label:6s} step {statistics.median(times) * 1e3:7.0f} ms CPU  ×MHA "
            f"{statistics.median(ratios):.3f} (rounds: {' '.join(f'{r:.2f}' for r in ratios)})",
            flush=True,
        )
    capability = torch.backends.cpu.get_cpu_capability()
    print(f"capability {capability}, load average (1 min) over the rounds {' '.join(f'{x:.1f}' for x in loads)}")
    if args.out is not None:
        payload = {"capability": capability, "threads": 1, "load_averages": loads, "rows": rows}
        args.out.write_text(json.dumps(payload, indent=2))


if __name__ == "__main__":
    main()
