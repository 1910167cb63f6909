"""Throughput and peak-memory measurement, reported as ratios to a baseline measured in the same run.

Every case runs in a fresh spawned process: on the CPU there is no allocator statistic, so peak memory
is the rise of the process's resident high-water mark (``ru_maxrss``) over its level before the first
step, which a fresh process attributes to that case alone. On CUDA it is ``max_memory_allocated``.
Times are medians over repeats, with min and max to show the spread; nothing here asserts on time.
"""

from __future__ import annotations

import multiprocessing
import os
import platform
import resource
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field

import torch

from attnzoo.config import ModelConfig
from attnzoo.model import Transformer


@dataclass(frozen=True)
class BenchCase:
    label: str
    config: ModelConfig
    batch_size: int
    seq_len: int
    mode: str = "train"  # "train": forward+backward; "prefill": forward; "decode": cached tokens after a prefill
    decode_tokens: int = 32
    use_cache: bool = True


@dataclass
class BenchResult:
    case: str
    mode: str
    seq_len: int
    batch_size: int
    tokens_per_s: float  # median over repeats
    tokens_per_s_min: float
    tokens_per_s_max: float
    peak_mem_mb: float
    extra: dict = field(default_factory=dict)


def machine_description(threads: int) -> str:
    if torch.cuda.is_available():
        return f"{torch.cuda.get_device_name()} (CUDA {torch.version.cuda}), torch {torch.__version__}"
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return (
        f"{_cpu_name()}, {os.cpu_count()} cores, {threads} thread(s), torch {torch.__version__}, "
        f"load average {load:.2f} at start"
    )


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _max_rss_mb() -> float:
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss / 2**20 if sys.platform == "darwin" else rss / 2**10  # bytes on macOS, KiB on Linux


def _run_case(case: BenchCase, repeats: int, warmup: int, threads: int, device: str) -> BenchResult:
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    model = Transformer(case.config).to(device)
    vocab = case.config.vocab_size
    idx = torch.randint(0, vocab, (case.batch_size, case.seq_len), device=device)
    on_cuda = device.startswith("cuda")

    def synchronize() -> None:
        if on_cuda:
            torch.cuda.synchronize()

    def timed(fn) -> float:
        synchronize()
        start = time.perf_counter()
        fn()
        synchronize()
        return time.perf_counter() - start

    if case.mode == "train":
        model.train()

        def step() -> tuple[int, float]:
            def train_step():
                model.zero_grad(set_to_none=True)
                model(idx, idx)[1].backward()

            return idx.numel(), timed(train_step)

    elif case.mode == "prefill":
        model.eval()

        def step() -> tuple[int, float]:
            with torch.no_grad():
                return idx.numel(), timed(lambda: model(idx))

    elif case.mode == "decode":
        model.eval()
        # Only the new tokens are timed: with the cache, single-token steps after an untimed prefill; without
        # it, the full-prefix recomputation that each new token costs.
        new_tokens = torch.randint(0, vocab, (case.batch_size, case.decode_tokens), device=device)

        def step() -> tuple[int, float]:
            with torch.no_grad():
                if case.use_cache:
                    cache = model.new_cache(case.batch_size, case.seq_len + case.decode_tokens)
                    model(idx, cache=cache)

                    def decode():
                        for t in range(case.decode_tokens):
                            model(new_tokens[:, t : t + 1], cache=cache)

                else:
                    sequence = torch.cat((idx, new_tokens), dim=1)

                    def decode():
                        for t in range(case.decode_tokens):
                            model(sequence[:, : case.seq_len + t + 1])

                return case.batch_size * case.decode_tokens, timed(decode)

    else:
        raise ValueError(f"mode={case.mode!r} is invalid: choose train, prefill or decode")

    if on_cuda:
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    else:
        base = _max_rss_mb()
    rates = []
    for i in range(warmup + repeats):
        tokens, seconds = step()
        if i >= warmup:
            rates.append(tokens / seconds)
    peak = (torch.cuda.max_memory_allocated() - base) / 2**20 if on_cuda else _max_rss_mb() - base
    return BenchResult(
        case=case.label,
        mode=case.mode,
        seq_len=case.seq_len,
        batch_size=case.batch_size,
        tokens_per_s=statistics.median(rates),
        tokens_per_s_min=min(rates),
        tokens_per_s_max=max(rates),
        peak_mem_mb=peak,
        extra={"params": model.num_parameters()},
    )


def _child(queue, case, repeats, warmup, threads, device):
    try:
        queue.put(asdict(_run_case(case, repeats, warmup, threads, device)))
    except Exception as err:  # reported to the parent, which names the case
        queue.put({"error": f"{type(err).__name__}: {err}"})


def measure(
    case: BenchCase, *, repeats: int = 5, warmup: int = 1, threads: int = 1, device: str = "cpu"
) -> BenchResult:
    """Measure one case in a fresh process."""
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    process = ctx.Process(target=_child, args=(queue, case, repeats, warmup, threads, device))
    process.start()
    result = queue.get()
    process.join()
    if "error" in result:
        raise RuntimeError(f"benchmark case {case.label!r} (T={case.seq_len}, {case.mode}) failed: {result['error']}")
    return BenchResult(**result)


def ratio_table(results: list[BenchResult], baseline: str) -> str:
    """Markdown table: each case's throughput and peak memory, and their ratios to ``baseline`` at the same
    sequence length and mode. A cost ratio > 1 means slower than the baseline (baseline tok/s ÷ tok/s)."""
    base = {(r.mode, r.seq_len): r for r in results if r.case == baseline}
    lines = [
        "| case | mode | T | batch | tok/s (median) | spread (min–max) | cost vs "
        f"{baseline} | peak MB | memory vs {baseline} |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        b = base.get((r.mode, r.seq_len))
        cost = f"{b.tokens_per_s / r.tokens_per_s:.2f}×" if b else "n/a"
        memory = f"{r.peak_mem_mb / b.peak_mem_mb:.2f}×" if b and b.peak_mem_mb > 0 else "n/a"
        lines.append(
            f"| {r.case} | {r.mode} | {r.seq_len} | {r.batch_size} | {r.tokens_per_s:,.0f} | "
            f"{r.tokens_per_s_min:,.0f}–{r.tokens_per_s_max:,.0f} | {cost} | {r.peak_mem_mb:,.0f} | {memory} |"
        )
    return "\n".join(lines)
