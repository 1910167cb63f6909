"""Speed at a size that fills a GPU: matmul peak, training tok/s, memory and MFU, decoding tok/s."""

from __future__ import annotations

import math
import time

import torch
from torch import Tensor
from torch.utils.flop_counter import FlopCounterMode

from attnzoo.bench import BenchCase, measure_here
from attnzoo.config import ModelConfig
from attnzoo.model import Transformer
from attnzoo.variants import Variant, matched_configs

from gpu.check.numerics import autocast, generate_compiles
from gpu.check.plan import (
    ERROR,
    OUT_OF_MEMORY,
    PASS,
    SKIPPED,
    UNAVAILABLE,
    Check,
    Deadline,
    Plan,
    Report,
    SpeedPlan,
    error_check,
    free_memory,
)


def matmul_tflops(n: int, dtype: torch.dtype, device: str, seconds: float) -> float:
    """The best of timings of an n×n by n×n matmul repeated for ``seconds``, in TFLOP/s: the peak MFU is measured
    against."""
    a, b = (torch.randn(n, n, device=device, dtype=dtype) for _ in range(2))
    best = math.inf
    deadline = time.perf_counter() + seconds
    for _ in range(3):
        a @ b  # warm-up
    while time.perf_counter() < deadline or best == math.inf:
        synchronize(device)
        start = time.perf_counter()
        for _ in range(5):
            a @ b
        synchronize(device)
        best = min(best, (time.perf_counter() - start) / 5)
    return 2 * n**3 / best / 1e12


def synchronize(device: str) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def speed_configs(plan: SpeedPlan, mechanisms: tuple[str, ...], seq_len: int) -> dict[str, ModelConfig]:
    baseline = ModelConfig(
        vocab_size=plan.vocab_size, dim=plan.dim, n_layers=plan.n_layers, n_heads=plan.n_heads, max_seq_len=seq_len
    )
    return matched_configs([Variant(m, "rope") for m in mechanisms], baseline)


def train_flops_per_token(cfg: ModelConfig, seq_len: int, device: str) -> float:
    """Model FLOPs of one training token: every matmul of a forward and backward over one sequence, as
    ``torch.utils.flop_counter`` counts them, with SDPA's causal attention at half its T×S (the visible triangle)."""
    torch.manual_seed(0)
    with torch.device(device):  # initialised where it runs: the large model's init on a CPU takes seconds
        model = Transformer(cfg)
    idx = torch.randint(0, cfg.vocab_size, (1, seq_len), device=device)
    counter = FlopCounterMode(display=False)
    with counter, autocast(device, "bf16"):
        model(idx, idx)[1].backward()
    counts = counter.get_flop_counts()["Global"]
    total = sum(counts.values()) - sum(n for op, n in counts.items() if "scaled_dot_product" in str(op)) / 2
    return total / seq_len


def measure_training(report: Report, plan: Plan, device: str, deadline: Deadline) -> None:
    speed = plan.speed
    for seq_len in speed.seq_lens:
        configs = speed_configs(speed, plan.mechanisms, seq_len)
        batch = max(1, speed.tokens_per_step // seq_len)
        for label, cfg in configs.items():
            case = f"{label} T={seq_len}"
            if deadline.left() < 20:
                report.add(Check(case, "speed train", SKIPPED, detail="time budget"))
                continue
            try:
                bench_case = BenchCase(label, cfg, batch, seq_len, "train", dtype="bfloat16")
                result = measure_here(bench_case, repeats=speed.repeats, warmup=2, device=device)
                flops = train_flops_per_token(cfg, seq_len, device)
                peak = report.matmul_tflops.get("bf16")
                result.extra["flops_per_token"] = flops
                result.extra["mfu"] = flops * result.tokens_per_s / (peak * 1e12) if peak else None
                report.train_speed.append(result)
                report.add(Check(case, "speed train", PASS, result.tokens_per_s, detail="tok/s"))
                print(f"  train {case:28s} {result.tokens_per_s:>12,.0f} tok/s {result.peak_mem_mb:>10,.0f} MB")
            except torch.OutOfMemoryError:
                report.add(Check(case, "speed train", OUT_OF_MEMORY, detail=f"batch {batch} × T {seq_len}"))
                print(f"  train {case:28s} out of memory")
            except Exception as err:
                report.add(error_check(case, "speed train", err))
            free_memory()


def time_generate(model: Transformer, idx: Tensor, new_tokens: int, compile_: bool = False) -> float:
    kwargs = {"compile": True} if compile_ else {}
    synchronize(str(idx.device))
    start = time.perf_counter()
    model.generate(idx, new_tokens, temperature=0.0, **kwargs)
    synchronize(str(idx.device))
    return time.perf_counter() - start


def decode_model(cfg: ModelConfig, batch: int, prompt_len: int, device: str) -> tuple[Transformer, Tensor]:
    """A model with bf16 weights, as one decodes on a GPU, and a random prompt (the same for a given config)."""
    torch.manual_seed(0)
    with torch.device(device):
        model = Transformer(cfg)
    model = model.to(dtype=torch.bfloat16).eval()
    return model, torch.randint(0, cfg.vocab_size, (batch, prompt_len), device=device)


def measure_decoding(report: Report, plan: Plan, device: str, deadline: Deadline) -> None:
    """Eager greedy ``generate``: tok/s = batch × new tokens / the call's wall time, prefill included."""
    speed = plan.speed
    configs = speed_configs(speed, plan.mechanisms, speed.decode_prompt + speed.decode_tokens)
    for label, cfg in configs.items():
        for batch in speed.decode_batches:
            case = f"{label} batch {batch}"
            if deadline.left() < 20:
                report.add(Check(case, "speed decode", SKIPPED, detail="time budget"))
                continue
            try:
                model, idx = decode_model(cfg, batch, speed.decode_prompt, device)
                time_generate(model, idx, 2)  # warm-up
                tok_s = batch * speed.decode_tokens / time_generate(model, idx, speed.decode_tokens)
                report.decode_speed.append({"case": label, "batch": batch, "eager_tok_s": tok_s})
                report.add(Check(case, "speed decode", PASS, tok_s, detail="eager tok/s"))
                print(f"  decode {case:27s} {tok_s:>12,.0f} tok/s")
            except torch.OutOfMemoryError:
                report.add(Check(case, "speed decode", OUT_OF_MEMORY, detail=f"batch {batch}"))
            except Exception as err:
                report.add(error_check(case, "speed decode", err))
            free_memory()


def measure_compiled_decoding(report: Report, plan: Plan, device: str, deadline: Deadline) -> None:
    """``generate(..., compile=True)`` timed like the eager rows, after a first call that compiles (its time is
    reported too), for the plan's mechanisms in order while the budget lasts."""
    speed = plan.speed
    if not plan.compile_decode or not generate_compiles():
        why = "this attnzoo's generate takes no compile" if plan.compile_decode else "dry run"
        for row in report.decode_speed:
            row["compiled"] = UNAVAILABLE if plan.compile_decode else SKIPPED
        report.add(Check("decoding", "speed compiled decode", UNAVAILABLE if plan.compile_decode else SKIPPED,
                         detail=why))  # fmt: skip
        return
    configs = speed_configs(speed, plan.mechanisms, speed.decode_prompt + speed.decode_tokens)
    for row in report.decode_speed:
        mechanism = row["case"].split("+")[0]
        case = f"{row['case']} batch {row['batch']}"
        if mechanism not in speed.compiled_decode:
            row["compiled"] = "not in this plan"
            continue
        if deadline.left() < 90:  # a compile of the large model takes about a minute
            row["compiled"] = SKIPPED
            report.add(Check(case, "speed compiled decode", SKIPPED, detail="time budget"))
            continue
        try:
            torch._dynamo.reset()
            model, idx = decode_model(configs[row["case"]], row["batch"], speed.decode_prompt, device)
            row["compile_s"] = time_generate(model, idx, speed.decode_tokens, compile_=True)
            row["compiled_tok_s"] = (
                row["batch"] * speed.decode_tokens / time_generate(model, idx, speed.decode_tokens, compile_=True)
            )
            report.add(Check(case, "speed compiled decode", PASS, row["compiled_tok_s"], detail="compiled tok/s"))
            print(f"  compiled decode {case:27s} {row['compiled_tok_s']:>12,.0f} tok/s ({row['compile_s']:.0f} s)")
        except torch.OutOfMemoryError:
            row["compiled"] = OUT_OF_MEMORY
            report.add(Check(case, "speed compiled decode", OUT_OF_MEMORY))
        except Exception as err:
            row["compiled"] = ERROR
            report.add(error_check(case, "speed compiled decode", err))
        free_memory()
    torch._dynamo.reset()
