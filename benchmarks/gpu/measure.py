"""One case measured in the worker: a training step's, a layer's or decoding's speed and memory, and MFU."""

from __future__ import annotations

import argparse
import contextlib
import gc
import statistics
import time
import traceback
from collections.abc import Callable
from typing import Any

import bench_dcmha_triton
import bench_decode
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from attnzoo import Transformer
from attnzoo.attention import Attention
from attnzoo.attention.kernels import KERNELS, Call
from attnzoo.bench import DTYPES
from attnzoo.model import training_flops_per_token
from attnzoo.positions import PositionalEncoding
from attnzoo.training.optim import parameter_groups

from gpu.plan import DECODE_PATHS, ERROR, MEASURED, SKIPPED, Case, Settings

# Dense bf16 tensor-core peaks in TFLOP/s, the most specific name first. NVIDIA's datasheets give the bf16 rates
# with 2:4 sparsity (H100 SXM and H200 1,979; H100 PCIe 1,513; H100 NVL and H200 NVL 1,671); MFU is taken against
# half of that, the dense rate, as nanoGPT and issue 36 (989) take it.
PEAK_BF16_TFLOPS = (("H100 PCIe", 756.5), ("H100 NVL", 835.5), ("H200 NVL", 835.5), ("H100", 989.5), ("H200", 989.5))
PEAK_SOURCE = "NVIDIA H100/H200 Tensor Core GPU datasheets: bf16 with sparsity, halved for the dense rate"


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def wall_s(fn: Callable[[], None], device: torch.device) -> float:
    synchronize(device)
    start = time.perf_counter()
    fn()
    synchronize(device)
    return time.perf_counter() - start


def timed_s(fn: Callable[[], None], device: torch.device) -> float:
    """``fn``'s time between two CUDA events (wall time on the CPU): from an idle queue, so launch time counts."""
    if device.type != "cuda":
        return wall_s(fn, device)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize(device)
    start.record()
    fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3


def compiled_graphs() -> int:
    return torch._dynamo.utils.counters["stats"]["unique_graphs"]


def kernel_refusal(
    model: Transformer, case: Case, device_type: str, dtype: torch.dtype
) -> tuple[list[str], str | None]:
    """The kernel each layer will run, and why the kernel the case names cannot run here (None where it runs)."""
    planned = model.planned_kernels(device_type=device_type, dtype=dtype, length=case.seq_len, compiling=case.compiled)
    names = [kernel.name for kernel in planned]
    named = case.config.attn_backend
    if named == "auto" or all(name == named for name in names):
        return names, None
    reason = named_kernel_refusal(case, model.layers[0].self_attn, model.position, device_type, dtype)
    return names, reason or f"{named} cannot run here: the layers would run {', '.join(names)}"


def named_kernel_refusal(
    case: Case, layer: Attention, position: PositionalEncoding, device_type: str, dtype: torch.dtype
) -> str | None:
    """Why the kernel the case names (its ``attn_backend``) cannot serve ``layer``'s calls here, or None."""
    named = case.config.attn_backend
    if named == "auto":
        return None
    kernel = KERNELS.get(named)
    call = Call.planned(
        case.config, position, device_type=device_type, dtype=dtype, length=case.seq_len, compiling=case.compiled
    )
    reason = kernel.static_refusal(case.config) or kernel.call_refusal(layer, call)
    return None if reason is None else f"{named} cannot run here: {reason}"


def run_training(case: Case, settings: Settings, deadline: float) -> dict[str, Any]:
    device = torch.device(settings.device)
    dtype = DTYPES[settings.dtype]
    torch.manual_seed(0)
    with torch.device(device):
        model = Transformer(case.config)
    kernels, refusal = kernel_refusal(model, case, device.type, dtype)
    result: dict[str, Any] = {"kernels": kernels, "params": model.num_parameters()}
    if refusal is not None:
        return {"status": SKIPPED, "reason": refusal, **result}
    model.train()
    optimizer = torch.optim.AdamW(parameter_groups(model, 0.1), lr=1e-4, fused=device.type == "cuda")
    forward = torch.compile(model, backend=settings.compile_backend) if case.compiled else model
    idx = torch.randint(0, case.config.vocab_size, (case.batch_size, case.seq_len), device=device)
    autocast = torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32)

    def step() -> None:
        with autocast:
            loss = forward(idx, idx)[1]
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    def steps() -> None:
        for _ in range(settings.steps_per_round):
            step()

    graphs_before = compiled_graphs()
    result["first_step_s"] = wall_s(step, device)
    result["graphs"] = compiled_graphs() - graphs_before
    step_s = wall_s(step, device)
    for _ in range(settings.warmup_steps - 2):
        step_s = wall_s(step, device)
    # What fits: the rounds planned, or fewer, judged on the last untimed step.
    round_s = max(step_s * settings.steps_per_round, 1e-9)
    rounds = min(settings.rounds, int((deadline - time.perf_counter()) // round_s))
    if rounds < 1:
        left = deadline - time.perf_counter()
        reason = (
            f"would overrun the budget: its first step took {result['first_step_s']:.1f} s, a round of "
            f"{settings.steps_per_round} steps needs about {round_s:.1f} s and {max(left, 0):.0f} s were left"
        )
        return {"status": SKIPPED, "reason": reason, **result}
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    step_ms = [timed_s(steps, device) / settings.steps_per_round * 1e3 for _ in range(rounds)]
    tokens = case.batch_size * case.seq_len
    median_ms = statistics.median(step_ms)
    result.update(
        ms_per_step=median_ms,
        ms_min=min(step_ms),
        ms_max=max(step_ms),
        tokens_per_s=tokens / median_ms * 1e3,
        tokens_per_s_min=tokens / max(step_ms) * 1e3,
        tokens_per_s_max=tokens / min(step_ms) * 1e3,
        rounds=rounds,
        steps_per_round=settings.steps_per_round,
        peak_mem_mib=torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else None,
        compile_s=result["first_step_s"] - median_ms / 1e3 if case.compiled else None,
        recompiles=compiled_graphs() - graphs_before - result["graphs"],
    )
    reason = "" if rounds == settings.rounds else f"{rounds} of {settings.rounds} rounds: the budget"
    return {"status": MEASURED, "reason": reason, **result}


def run_layer(case: Case, settings: Settings) -> dict[str, Any]:
    """One attention layer's forward and backward, projections included, as ``bench_dcmha_triton`` times it; after
    the Triton kernel's case, what each compiled kernel uses (``bench_dcmha_triton.kernel_report``)."""
    device = torch.device(settings.device)
    dtype = DTYPES[settings.dtype]
    torch.manual_seed(0)
    layer, ctx = bench_dcmha_triton.make_layer(case.config, settings.device)
    reason = named_kernel_refusal(case, layer, ctx.position, device.type, dtype)
    if reason is not None:
        return {"status": SKIPPED, "reason": reason}
    forward = torch.compile(layer, backend=settings.compile_backend) if case.compiled else layer
    x = torch.randn(case.batch_size, case.seq_len, case.config.dim, device=device, requires_grad=True)
    grad = torch.randn_like(x)
    autocast = torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32)

    def step() -> None:
        x.grad = None
        layer.zero_grad(set_to_none=True)
        flash = case.label == "mha-flash"
        with sdpa_kernel([SDPBackend.FLASH_ATTENTION]) if flash else contextlib.nullcontext(), autocast:
            out = forward(x, ctx)
        out.backward(grad.to(out.dtype))

    first_step_s = wall_s(step, device)
    for _ in range(settings.warmup_steps - 1):
        wall_s(step, device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    step_ms = [timed_s(step, device) * 1e3 for _ in range(settings.rounds * settings.steps_per_round)]
    median_ms = statistics.median(step_ms)
    record = {
        "status": MEASURED,
        "reason": "",
        "ms_per_step": median_ms,
        "ms_min": min(step_ms),
        "ms_max": max(step_ms),
        "steps": len(step_ms),
        "tokens_per_s": case.batch_size * case.seq_len / median_ms * 1e3,
        "peak_mem_mib": torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else None,
        "first_step_s": first_step_s,
        "compile_s": first_step_s - median_ms / 1e3 if case.compiled else None,
    }
    if case.config.attn_backend == "dcmha-triton":
        record |= bench_dcmha_triton.kernel_report()
    return record


def run_decode(case: Case, settings: Settings) -> dict[str, Any]:
    device = torch.device(settings.device)
    torch.manual_seed(0)
    with torch.device(device):
        model = Transformer(case.config)
    model = model.to(dtype=DTYPES[settings.dtype]).eval()
    args = argparse.Namespace(
        context=settings.decode_context, new_tokens=settings.decode_new_tokens, repeats=settings.decode_repeats
    )
    rows = bench_decode.measure(
        model, case.batch_size, args, device, paths=DECODE_PATHS, backend=settings.compile_backend
    )
    return {"status": MEASURED, "reason": "", "params": model.num_parameters(), "rows": rows}


def run_case(case: Case, settings: Settings, seconds: float) -> dict[str, Any]:
    """One case's record; an exception is recorded as the case's error."""
    start = time.perf_counter()
    try:
        if case.kind == "train":
            record = run_training(case, settings, start + seconds)
        elif case.kind == "layer":
            record = run_layer(case, settings)
        else:
            record = run_decode(case, settings)
    except Exception as err:
        message = str(err).strip().splitlines()
        record = {
            "status": ERROR,
            "reason": f"{type(err).__name__}: {message[0] if message else ''}",
            "traceback": traceback.format_exc()[-4000:],
        }
    finally:
        torch._dynamo.reset()  # each case compiles from scratch and stays under dynamo's recompile limit
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    record["wall_s"] = time.perf_counter() - start
    return record


def device_peak(device_name: str, given: float | None) -> tuple[float | None, str]:
    """The dense bf16 peak MFU is taken against (TFLOP/s), and where it comes from."""
    if given is not None:
        return given, "given by --peak-tflops"
    for name, tflops in PEAK_BF16_TFLOPS:
        if name in device_name:
            return tflops, f"{name}: {PEAK_SOURCE}"
    return None, f"no datasheet peak for {device_name}: pass --peak-tflops"


def add_mfu(case: Case, record: dict[str, Any], flops: dict[tuple[str, str], float], peak: float | None) -> None:
    """FLOPs per token (counted once per mechanism and size: the kernel does not change them) and MFU."""
    key = (case.size, case.config.attention)
    if key not in flops:
        flops[key] = training_flops_per_token(case.config, case.seq_len)
    record["flops_per_token"] = flops[key]
    record["mfu"] = flops[key] * record["tokens_per_s"] / (peak * 1e12) if peak else None
