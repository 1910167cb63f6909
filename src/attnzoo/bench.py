"""Throughput and peak memory, reported as ratios to a baseline measured in the same run (``attnzoo bench``).

Every case runs in a fresh spawned process. On the CPU there is no allocator statistic, so peak memory is
the rise of the process's resident high-water mark over its resident size before the first step: on Linux
the mark (``VmHWM``) is reset first through ``/proc/self/clear_refs``, since a child otherwise inherits its
parent's; elsewhere it falls back to ``ru_maxrss``. On CUDA it is ``max_memory_allocated``.
Throughput is the median over repeats, with min and max to show the spread; nothing here asserts on time.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import platform
import queue as queue_module
import resource
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from tqdm import tqdm

from attnzoo.attention.kernels import kernel_ops
from attnzoo.config import ModelConfig
from attnzoo.interrupts import sigint_ignored
from attnzoo.io import atomic_write_text
from attnzoo.machine import is_busy
from attnzoo.model import Transformer
from attnzoo.tables import Table, memory_header, ratio, speed_header
from attnzoo.validation import DEVICE_NAMES, is_device_name, require, require_count
from attnzoo.variants import Variant, matched_configs

MODES = ("train", "train+adamw", "prefill", "decode", "decode-nocache")
TRAINING_MODES = ("train", "train+adamw")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
# The fused kernels SDPA may dispatch to; SDPA's math fallback decomposes into ordinary ops and shows as none.
SDPA_BACKENDS = {
    "_scaled_dot_product_flash_attention_for_cpu": "flash (CPU)",
    "_scaled_dot_product_flash_attention": "flash",
    "_scaled_dot_product_efficient_attention": "memory-efficient",
    "_scaled_dot_product_cudnn_attention": "cuDNN",
}


def fused_ops() -> dict[str, str]:
    """{operator: label} of the fused attention ops a trace can show: SDPA's backends, and the operators of attnzoo's
    own kernels as their records name them (``Kernel.ops``)."""
    return kernel_ops() | SDPA_BACKENDS


@dataclass(frozen=True)
class BenchCase:
    label: str
    config: ModelConfig
    batch_size: int
    seq_len: int
    # train: forward+backward; train+adamw: and an AdamW step; prefill: forward; decode(-nocache): new tokens after T
    mode: str = "train"
    decode_tokens: int = 32
    dtype: str = "float32"  # bfloat16 runs under autocast, as training does on CUDA

    def __post_init__(self):
        if self.mode not in MODES:
            raise ValueError(f"mode={self.mode!r} is invalid: choose one of {list(MODES)}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype={self.dtype!r} is invalid: choose one of {list(DTYPES)}")


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


def _reset_peak_rss() -> bool:
    """Reset the kernel's resident high-water mark (Linux); False where that is not possible."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _rss_mb(field: str) -> float:
    """``VmRSS`` (current) or ``VmHWM`` (high-water mark) from /proc/self/status, in MiB."""
    with open("/proc/self/status", encoding="utf-8") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    raise OSError(f"{field} not in /proc/self/status")


def _max_rss_mb() -> float:
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss / 2**20 if sys.platform == "darwin" else rss / 2**10  # bytes on macOS, KiB on Linux


class _KernelRecorder(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops: set[str] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.add(func.__name__.split(".")[0])
        return func(*args, **(kwargs or {}))


def sdpa_kernels(model: Transformer, idx: torch.Tensor, *, decoding: bool = False) -> list[str]:
    """The fused attention kernels one forward pass over ``idx`` dispatches to, or with ``decoding`` one cached
    single-token step after ``idx`` is prefilled (empty for SDPA's math path and for mechanisms that compute their
    scores themselves)."""
    with torch.no_grad():
        if decoding:
            cache = model.new_cache(idx.shape[0], idx.shape[1] + 1)
            model(idx, cache=cache)
        with _KernelRecorder() as recorder:
            if decoding:
                model(idx[:, -1:], cache=cache)
            else:
                model(idx)
    return sorted(label for op, label in fused_ops().items() if op in recorder.ops)


def attention_kernels(model: Transformer, idx: torch.Tensor, *, decoding: bool = False) -> list[str]:
    """The kernel each layer's attention runs (``attention.kernels.choose``) on the pass :func:`sdpa_kernels`
    watches: a forward over ``idx``, or with ``decoding`` the cached step after it."""
    if not decoding:
        return model.attention_kernels(idx)
    cache = model.new_cache(idx.shape[0], idx.shape[1] + 1)
    model.attention_kernels(idx, cache=cache)
    return model.attention_kernels(idx[:, -1:], cache=cache)


def kernel_cell(result: BenchResult) -> str:
    """The table's kernel column: the attention kernels the layers ran (results since they were recorded), then the
    fused ops they dispatched."""
    ops = ", ".join(result.extra.get("sdpa_kernels", [])) or "none"
    names = result.extra.get("attention_kernels")
    return ops if names is None else f"{', '.join(dict.fromkeys(names))}: {ops}"


def _run_case(case: BenchCase, repeats: int, warmup: int, threads: int, device: str) -> BenchResult:
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    model = Transformer(case.config).to(device)
    idx = torch.randint(0, case.config.vocab_size, (case.batch_size, case.seq_len), device=device)
    new_tokens = torch.randint(0, case.config.vocab_size, (case.batch_size, case.decode_tokens), device=device)
    on_cuda = device.startswith("cuda")
    dtype = DTYPES[case.dtype]
    autocast = torch.autocast(device_type=torch.device(device).type, dtype=dtype, enabled=dtype != torch.float32)
    measured: dict[str, float] = {}

    def timed(fn) -> float:
        if on_cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        with autocast:
            fn()
        if on_cuda:
            torch.cuda.synchronize()
        return time.perf_counter() - start

    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4) if case.mode == "train+adamw" else None

    def train() -> tuple[int, float]:
        def step():
            model.zero_grad(set_to_none=True)
            model(idx, idx)[1].backward()
            if optimizer is not None:
                optimizer.step()

        return idx.numel(), timed(step)

    @torch.no_grad()
    def prefill() -> tuple[int, float]:
        return idx.numel(), timed(lambda: model(idx))

    @torch.no_grad()
    def decode() -> tuple[int, float]:
        # Only the new tokens are timed: single-token steps after an untimed prefill into the cache.
        cache = model.new_cache(case.batch_size, case.seq_len + case.decode_tokens, dtype=dtype)
        measured["cache_bytes"] = cache.nbytes  # what the buffers hold, allocated up front
        with autocast:
            model(idx, cache=cache)

        def steps():
            for t in range(case.decode_tokens):
                model(new_tokens[:, t : t + 1], cache=cache)

        return new_tokens.numel(), timed(steps)

    @torch.no_grad()
    def decode_without_cache() -> tuple[int, float]:
        # What each new token costs when the whole prefix is recomputed.
        sequence = torch.cat((idx, new_tokens), dim=1)

        def steps():
            for t in range(case.decode_tokens):
                model(sequence[:, : case.seq_len + t + 1])

        return new_tokens.numel(), timed(steps)

    modes = {"train": train, "train+adamw": train, "prefill": prefill, "decode": decode}
    step = {**modes, "decode-nocache": decode_without_cache}[case.mode]
    model.train(case.mode in TRAINING_MODES)
    measured["load_average"] = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")

    def peak_mb() -> float:
        if on_cuda:
            return torch.cuda.max_memory_allocated() / 2**20
        return _rss_mb("VmHWM") if resettable else _max_rss_mb()

    resettable = not on_cuda and _reset_peak_rss()
    if on_cuda:
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated() / 2**20
    else:
        base = _rss_mb("VmRSS") if resettable else _max_rss_mb()
    rates = []
    for i in range(warmup + repeats):
        tokens, seconds = step()
        if i >= warmup:
            rates.append(tokens / seconds)
    peak = peak_mb() - base
    with autocast:
        watched = idx[:, : min(case.seq_len, 256)]
        kernels = sdpa_kernels(model.eval(), watched, decoding=case.mode == "decode")
        names = attention_kernels(model, watched, decoding=case.mode == "decode")
    return BenchResult(
        case=case.label,
        mode=case.mode,
        seq_len=case.seq_len,
        batch_size=case.batch_size,
        tokens_per_s=statistics.median(rates),
        tokens_per_s_min=min(rates),
        tokens_per_s_max=max(rates),
        peak_mem_mb=peak,
        extra={
            "params": model.num_parameters(),
            "dtype": case.dtype,
            "sdpa_kernels": kernels,
            "attention_kernels": names,
            "rates": rates,
            **measured,
        },
    )


def _child(queue, case, repeats, warmup, threads, device):
    try:
        queue.put(asdict(_run_case(case, repeats, warmup, threads, device)))
    except Exception as err:  # reported to the parent, which names the case
        queue.put({"error": f"{type(err).__name__}: {err}"})


def measure(
    case: BenchCase, *, repeats: int = 5, warmup: int = 1, threads: int = 1, device: str = "cpu"
) -> BenchResult:
    """Measure one case in a fresh process.

    The child ignores SIGINT: a Ctrl-C in the terminal reaches the whole process group, and the child would die
    printing a traceback from inside ``multiprocessing``. The parent alone takes the KeyboardInterrupt (or any
    other exception), stops the child and lets it propagate.
    """
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    process = ctx.Process(target=_child, args=(queue, case, repeats, warmup, threads, device))
    with sigint_ignored():  # a spawned child starts with the dispositions of its parent; Python keeps SIG_IGN
        process.start()
    try:
        while True:  # a child that dies without reporting (killed, out of memory) must not hang the parent
            try:
                result = queue.get(timeout=1.0)
                break
            except queue_module.Empty:
                if not process.is_alive():
                    raise RuntimeError(
                        f"benchmark case {case.label!r} (T={case.seq_len}, {case.mode}) died with exit code "
                        f"{process.exitcode} before reporting"
                    ) from None
    except BaseException:
        process.terminate()
        process.join()
        raise
    process.join()
    if "error" in result:
        raise RuntimeError(f"benchmark case {case.label!r} (T={case.seq_len}, {case.mode}) failed: {result['error']}")
    return BenchResult(**result)


def measure_here(case: BenchCase, *, repeats: int = 5, warmup: int = 1, device: str = "cpu") -> BenchResult:
    """Measure one case in this process at its thread count: no process start per case, which a GPU check of
    dozens of cases cannot afford, but the case shares the caller's allocator, so the caller frees between cases
    (peak memory is still the case's own: the allocator's peak is reset first and its base subtracted)."""
    return _run_case(case, repeats, warmup, torch.get_num_threads(), device)


def ratio_table(results: list[BenchResult], baseline: str) -> Table:
    """Each case's throughput and peak memory, and their ratios to ``baseline`` at the same sequence length and
    mode: speed is tok/s ÷ the baseline's (above 1 is faster), memory is peak ÷ the baseline's. Decode with a
    cache also shows the bytes its cache buffers hold (T + decoded tokens positions, measured on the allocation)."""
    base = {(r.mode, r.seq_len): r for r in results if r.case == baseline}
    header = ["case", "mode", "T", "batch", "tok/s (median)", "spread (min–max)", speed_header(baseline)]
    header += ["peak MB", memory_header(baseline), "KV cache MB", "kernel", "load average"]
    rows = []
    for r in results:
        b = base.get((r.mode, r.seq_len))
        speed = r.tokens_per_s / b.tokens_per_s if b else None
        busy = measured_busy(r) or (b is not None and measured_busy(b))
        memory = r.peak_mem_mb / b.peak_mem_mb if b and b.peak_mem_mb > 0 else None
        rows.append(
            [
                r.case,
                r.mode,
                str(r.seq_len),
                str(r.batch_size),
                f"{r.tokens_per_s:,.0f}",
                f"{r.tokens_per_s_min:,.0f}–{r.tokens_per_s_max:,.0f}",
                ratio(speed) + (" unreliable: busy machine" if busy and speed is not None else ""),
                f"{r.peak_mem_mb:,.0f}",
                ratio(memory),
                f"{r.extra['cache_bytes'] / 2**20:,.2f}" if "cache_bytes" in r.extra else "–",
                kernel_cell(r),
                _load_averages(r),
            ]
        )
    return Table(header, rows)


def measured_busy(result: BenchResult) -> bool:
    """Whether any round of ``result`` ran while more work was runnable than cores (its speed is unreliable)."""
    loads = result.extra.get("round_load_averages") or [result.extra.get("load_average")]
    return any(is_busy(load, os.cpu_count() or 1) for load in loads)


def _load_averages(result: BenchResult) -> str:
    loads = result.extra.get("round_load_averages") or [result.extra.get("load_average")]
    return " ".join("–" if load is None else f"{load:.2f}" for load in loads)


def pool_rounds(rounds: list[BenchResult]) -> BenchResult:
    """One case measured in several rounds (each in its own process) as one result: the median, min and max over
    every round's repeats, the highest peak memory, and each round's load average (``round_load_averages``).
    Rounds that interleave the cases of a sweep spread the machine's slow drift over all of them, where
    back-to-back repeats leave it to whichever case ran during it."""
    first = rounds[0]
    if any((r.case, r.mode, r.seq_len) != (first.case, first.mode, first.seq_len) for r in rounds):
        raise ValueError(
            f"pool_rounds takes rounds of one case; got {sorted({(r.case, r.mode, r.seq_len) for r in rounds})}"
        )
    rates = [rate for r in rounds for rate in r.extra["rates"]]
    extra = {**first.extra, "rates": rates}
    if len(rounds) > 1 and "load_average" in first.extra:
        extra["round_load_averages"] = [r.extra["load_average"] for r in rounds]
    return replace(
        first,
        tokens_per_s=statistics.median(rates),
        tokens_per_s_min=min(rates),
        tokens_per_s_max=max(rates),
        peak_mem_mb=max(r.peak_mem_mb for r in rounds),
        extra=extra,
    )


def ratio_matrix(results: list[BenchResult], baseline: str) -> Table:
    """:func:`ratio_table` folded to one row per case and one column per (mode, T): each cell is the case's speed
    and peak memory against ``baseline`` at that mode and length, "speed× / memory×" ("–" where either was not
    measured), so a sweep's ratios read at a glance."""
    columns = list(dict.fromkeys((r.mode, r.seq_len) for r in results))
    cases = list(dict.fromkeys(r.case for r in results))
    measured = {(r.case, r.mode, r.seq_len): r for r in results}
    rows = []
    for case in cases:
        cells = []
        for mode, seq_len in columns:
            r, b = measured.get((case, mode, seq_len)), measured.get((baseline, mode, seq_len))
            if r is None or b is None:
                cells.append("–")
                continue
            memory = ratio(r.peak_mem_mb / b.peak_mem_mb) if b.peak_mem_mb > 0 else "–"
            cells.append(f"{ratio(r.tokens_per_s / b.tokens_per_s)} / {memory}")
        rows.append([case, *cells])
    header = [f"speed / memory vs {baseline}", *(f"{mode} T={seq_len}" for mode, seq_len in columns)]
    return Table(header, rows)


# ------------------------------------------------------------------------------------------ attnzoo bench


@dataclass(frozen=True)
class BenchSweep:
    """What ``attnzoo bench`` measures: every variant at every sequence length and mode, each variant matched to
    the parameter count of plain MHA of ``dim`` × ``n_layers`` × ``n_heads``."""

    variants: tuple[str, ...] = ("mha+rope", "diff+rope", "diff_v2+rope", "selective+rope", "dcmha+rope")
    seq_lens: tuple[int, ...] = (256, 1024)
    modes: tuple[str, ...] = ("train", "prefill", "decode", "decode-nocache")
    tokens_per_step: int = 4096  # the train and prefill batch is this // T sequences (at least 1)
    decode_tokens: int = 32
    dim: int = 256
    n_layers: int = 4
    n_heads: int = 8
    dtype: str = "float32"
    repeats: int = 3  # timed repeats per case, spread over the rounds
    # The case list is measured in turn this many times, each case in a fresh process every round, and each case's
    # repeats pooled: the machine's drift (another job starting) then falls on every case alike.
    rounds: int = 2
    threads: int = field(default_factory=torch.get_num_threads)
    device: str = field(default_factory=lambda: "cuda" if torch.cuda.is_available() else "cpu")

    def __post_init__(self) -> None:
        if not self.variants:
            raise ValueError("variants=() is invalid: name at least one, the baseline")
        for spec in self.variants:
            Variant.parse(spec).require_model_only("the bench times each model as it is, at every --seq-lens")
        if not self.seq_lens or not all(_positive_int(t) for t in self.seq_lens):
            raise ValueError(f"seq_lens={list(self.seq_lens)} is invalid: each must be an integer >= 1")
        for seq_len in self.seq_lens:
            require_count("seq_lens", seq_len)
        if not self.modes or not set(self.modes) <= set(MODES):
            raise ValueError(f"modes={list(self.modes)} is invalid: choose among {list(MODES)}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype={self.dtype!r} is invalid: choose one of {list(DTYPES)}")
        for name in ("tokens_per_step", "decode_tokens", "repeats", "rounds", "threads"):
            require_count(name, getattr(self, name))
        require(is_device_name(self.device), "device", self.device, DEVICE_NAMES)
        self.baseline(max(self.seq_lens))  # refuses a bad model size before anything is measured

    def baseline(self, seq_len: int) -> ModelConfig:
        """Plain MHA of this size, with room for the decoded tokens: what every variant is matched to."""
        return ModelConfig(
            vocab_size=256,
            dim=self.dim,
            n_layers=self.n_layers,
            n_heads=self.n_heads,
            max_seq_len=seq_len + self.decode_tokens,
        )


def _positive_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def run_bench(sweep: BenchSweep, out: Path, *, progress: bool = True) -> list[BenchResult]:
    """Measure every case of ``sweep`` in ``sweep.rounds`` interleaved rounds, printing a line per case and round
    under a progress bar (an ETA), then print the ratio table of the pooled rounds and write it to
    ``out/bench.md`` with the raw results in ``out/bench.json``."""
    variants = [Variant.parse(spec) for spec in sweep.variants]
    baseline_label = variants[0].label
    cases = []
    for seq_len in sweep.seq_lens:
        configs = matched_configs(variants, sweep.baseline(seq_len))
        for mode in sweep.modes:
            batch = max(1, sweep.tokens_per_step // seq_len) if mode in (*TRAINING_MODES, "prefill") else 1
            for label, cfg in configs.items():
                cases.append(BenchCase(label, cfg, batch, seq_len, mode, sweep.decode_tokens, sweep.dtype))
    per_round = -(-sweep.repeats // sweep.rounds)  # ceil: every round times at least one repeat
    rounds: dict[int, list[BenchResult]] = {i: [] for i in range(len(cases))}
    with tqdm(total=len(cases) * sweep.rounds, desc="bench", unit="case", disable=not progress) as bar:
        for round_number in range(1, sweep.rounds + 1):
            for i, case in enumerate(cases):
                bar.set_postfix_str(f"round {round_number}/{sweep.rounds}: {case.label} {case.mode} T={case.seq_len}")
                result = measure(case, repeats=per_round, threads=sweep.threads, device=sweep.device)
                rounds[i].append(result)
                busy = "  unreliable: busy machine" if measured_busy(result) else ""
                tqdm.write(
                    f"round {round_number}/{sweep.rounds} {case.label:20s} {case.mode:15s} T={case.seq_len:<6d} "
                    f"{result.tokens_per_s:>10,.0f} tok/s {result.peak_mem_mb:>8,.0f} MB  "
                    f"load average {_load_averages(result)}{busy}"
                )
                sys.stdout.flush()
                bar.update(1)
    results = [pool_rounds(measured) for measured in rounds.values()]
    header = f"Machine: {machine_description(sweep.threads)}; {sweep.dtype}; baseline {baseline_label}."
    write_results(out / "bench.md", header, results, baseline_label)
    return results


def write_results(path: Path, header: str, results: list[BenchResult], baseline: str) -> None:
    """Print the ratio table under ``header`` and write it to ``path`` (markdown), the raw results beside it
    as JSON (same name, ``.json``)."""
    table = ratio_table(results, baseline).to_markdown()
    print(f"\n{header}\n\n{table}")
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, f"{header}\n\n{table}\n")
    payload = {"header": header, "baseline": baseline, "results": [asdict(r) for r in results]}
    atomic_write_text(path.with_suffix(".json"), json.dumps(payload, indent=2))
    print(f"\nwrote {path} and {path.with_suffix('.json')}")
