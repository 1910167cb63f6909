"""The first call of a GPU lease (issue 36): training and decoding speed on CUDA in bf16, within one command.

    timeout -s TERM 560 python3 benchmarks/gpu_speed.py --out runs/gpu-speed; cp runs/gpu-speed/* "$OUT"/  # CUDA
    python benchmarks/gpu_speed.py --dry-run --out runs/gpu-speed   # every case at toy sizes on the CPU (CI)

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
   stage runs it (``gpu_kit.gpu_tests_command``), recorded with every failed test's id.

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
there with the kernel's reason, and the tests narrowed to a few quick ones (``gpu_kit.DRY_RUN_TESTS``).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gc
import importlib.metadata
import json
import math
import multiprocessing
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from multiprocessing.connection import Connection
from pathlib import Path
from types import FrameType
from typing import Any

import bench_dcmha_triton
import bench_decode
import gpu_kit
import torch
from gpu_check import git_commit
from torch.nn.attention import SDPBackend, sdpa_kernel

from attnzoo import ModelConfig, Transformer
from attnzoo.attention import Attention
from attnzoo.attention.kernels import KERNELS, Call
from attnzoo.bench import DTYPES, machine_description
from attnzoo.cli.command import path_argument
from attnzoo.io import atomic_write_text
from attnzoo.model import training_flops_per_token
from attnzoo.positions import PositionalEncoding
from attnzoo.tables import Table, ratio
from attnzoo.training.optim import parameter_groups
from attnzoo.variants import Variant, matched_configs

MEASURED, SKIPPED, ERROR, CUT_OFF, NOT_RUN = "measured", "skipped", "error", "cut off", "not run"
# Issue 36's priority: the mechanisms' training, the DCMHA layer against flash attention, decoding, the nanoGPT anchor
GROUPS = (1, 4, 3, 2, 5)
TESTS_GROUP = 5  # pytest -m "cuda or triton": not a case, run after every case with the budget they left
REPOSITORY = Path(__file__).resolve().parent.parent  # where the tests' paths start
MIN_TESTS_S = 30.0  # less left than this, and the tests are not started
MECHANISMS = ("mha", "dcmha", "diff", "selective")
# The kernels timed by name besides each mechanism's default ("auto"; DCMHA's is its Triton kernel, so it runs named).
NAMED_KERNELS = {"dcmha": ("dcmha-triton", "chunked"), "diff": ("diff-halves", "diff-stacked")}
# Eager first, every mechanism, since a compile costs what several eager cases do; DCMHA on the chunked PyTorch path
# before its kernel (the cheap route, the one the official DCFormer code takes), and the kernel's cases after
# the other mechanisms', since its first call autotunes it (a compile per config); Diff's one-call layouts come last
# when compiled, where the budget may cut them before selective.
EAGER_ORDER = (
    "mha",
    "dcmha[chunked]",
    "diff",
    "diff[diff-halves]",
    "diff[diff-stacked]",
    "selective",
    "dcmha[dcmha-triton]",
)
COMPILED_ORDER = (
    "mha",
    "dcmha[chunked]",
    "diff",
    "selective",
    "dcmha[dcmha-triton]",
    "diff[diff-halves]",
    "diff[diff-stacked]",
)
# The DCMHA layer against MHA on flash attention (bench_dcmha_triton's paths), eager, then compiled (the Triton kernel
# as a custom operator inside the layer's graph).
LAYER_PATHS = (
    ("mha-flash", False),
    ("dcmha-triton", False),
    ("dcmha-pytorch", False),
    ("dcmha-triton", True),
    ("mha-flash", True),
    ("dcmha-pytorch", True),
)
RATIO_SIZES = ("gpu-lm", "185m")  # the sizes whose training cases are ratios to MHA's
DECODE_PATHS = ("eager", "compiled")
DECODE_BATCHES = (1, 16)
GRACE_S = 10.0  # how long past its budget a case may run before the worker is stopped
# Dense bf16 tensor-core peaks in TFLOP/s, the most specific name first. NVIDIA's datasheets give the bf16 rates
# with 2:4 sparsity (H100 SXM and H200 1,979; H100 PCIe 1,513; H100 NVL and H200 NVL 1,671); MFU is taken against
# half of that, the dense rate, as nanoGPT and issue 36 (989) take it.
PEAK_BF16_TFLOPS = (("H100 PCIe", 756.5), ("H100 NVL", 835.5), ("H200 NVL", 835.5), ("H100", 989.5), ("H200", 989.5))
PEAK_SOURCE = "NVIDIA H100/H200 Tensor Core GPU datasheets: bf16 with sparsity, halved for the dense rate"


@dataclass(frozen=True)
class Settings:
    """How every case is run and timed."""

    device: str
    dtype: str  # training's autocast dtype and decoding's weights: "bfloat16" on CUDA, "float32" in the dry run
    compile_backend: str  # torch.compile's: "inductor"; the dry run's "eager" traces with dynamo alone
    warmup_steps: int  # untimed training steps, the first of which compiles
    rounds: int  # timed rounds of a training case: the spread is theirs
    steps_per_round: int
    decode_context: int
    decode_new_tokens: int
    decode_repeats: int
    test_args: tuple[str, ...]  # narrows the tests' pytest (gpu_kit.gpu_tests_command)


@dataclass(frozen=True)
class Sizes:
    lm: ModelConfig  # the gpu-lm baseline (MHA), which every mechanism is matched to
    lm_batch: int
    anchor: ModelConfig  # the nanoGPT-124M-like MHA
    anchor_batch: int
    large: ModelConfig  # the 185M MHA of the earlier leases' speed checks, which DCMHA is matched to there
    large_batch: int
    seq_len: int
    layer_dim: int  # the DCMHA layer bench's: one layer of layer_heads heads at layer_seq_len
    layer_heads: int
    layer_seq_len: int
    layer_batch: int


@dataclass(frozen=True)
class Case:
    name: str
    group: int
    kind: str  # "train", "layer" or "decode"
    size: str  # "gpu-lm", "nanogpt-124m", "185m" or "dcmha-layer"
    label: str  # the mechanism, with the kernel it names: "mha", "dcmha[chunked]"; a layer case's path
    config: ModelConfig
    batch_size: int
    seq_len: int
    compiled: bool

    @property
    def mode(self) -> str:
        return "compiled" if self.compiled else "eager"

    @property
    def similar(self) -> tuple[str, str, bool]:
        """The cases whose time predicts this one's."""
        return self.kind, self.size, self.compiled


GPU_SETTINGS = Settings("cuda", "bfloat16", "inductor", 3, 5, 5, 512, 64, 3, ())
DRY_RUN_SETTINGS = Settings("cpu", "float32", "eager", 2, 2, 1, 16, 8, 1, gpu_kit.DRY_RUN_TESTS)
GPU_SIZES = Sizes(
    lm=ModelConfig(vocab_size=256, dim=384, n_layers=6, n_heads=6, max_seq_len=1024),
    lm_batch=32,
    anchor=ModelConfig(
        vocab_size=50304,
        dim=768,
        n_layers=12,
        n_heads=12,
        mlp="gelu",
        norm="layernorm",
        position="learned",
        max_seq_len=1024,
    ),
    anchor_batch=12,
    # gpu_check's speed plan (benchmarks/gpu_checks/plan.py): MHA's MFU there was 22.7-24.4% eager.
    large=ModelConfig(vocab_size=32768, dim=1024, n_layers=12, n_heads=16, max_seq_len=1024),
    large_batch=16,
    seq_len=1024,
    layer_dim=bench_dcmha_triton.DIM,
    layer_heads=bench_dcmha_triton.HEADS,
    layer_seq_len=2048,
    layer_batch=8,  # bench_dcmha_triton's 16,384 tokens a step
)
DRY_RUN_SIZES = Sizes(
    lm=ModelConfig(vocab_size=64, dim=32, n_layers=2, n_heads=2, max_seq_len=32),
    lm_batch=2,
    anchor=ModelConfig(
        vocab_size=128, dim=48, n_layers=2, n_heads=2, mlp="gelu", norm="layernorm", position="learned", max_seq_len=32
    ),
    anchor_batch=2,
    large=ModelConfig(vocab_size=128, dim=64, n_layers=2, n_heads=4, max_seq_len=32),
    large_batch=2,
    seq_len=32,
    layer_dim=64,
    layer_heads=4,
    layer_seq_len=48,
    layer_batch=2,
)


def plan_cases(sizes: Sizes, groups: Sequence[int] = GROUPS) -> list[Case]:
    """Every case, in the order they run: ``groups`` in the order given."""
    matched = matched_configs([Variant(m, "rope") for m in MECHANISMS], sizes.lm)
    large_dcmha = matched_configs([Variant("dcmha", "rope")], sizes.large)["dcmha+rope"]
    auto = {mechanism: matched[f"{mechanism}+rope"] for mechanism in MECHANISMS}
    by_label = {label: cfg for label, cfg in auto.items() if label != "dcmha"}
    for mechanism, kernels in NAMED_KERNELS.items():
        for kernel in kernels:
            by_label[f"{mechanism}[{kernel}]"] = dataclasses.replace(auto[mechanism], attn_backend=kernel)

    def train(size: str, label: str, cfg: ModelConfig, batch: int, compiled: bool, group: int) -> Case:
        mode = "compiled" if compiled else "eager"
        return Case(f"{size} {label} {mode}", group, "train", size, label, cfg, batch, sizes.seq_len, compiled)

    def layer(path: str, compiled: bool) -> Case:
        cfg = bench_dcmha_triton.layer_config(path, "G", sizes.layer_seq_len, sizes.layer_dim, sizes.layer_heads)
        mode = "compiled" if compiled else "eager"
        return Case(f"layer {path} {mode}", 4, "layer", "dcmha-layer", path, cfg, sizes.layer_batch,
                    sizes.layer_seq_len, compiled)  # fmt: skip

    cases = {
        1: [train("gpu-lm", label, by_label[label], sizes.lm_batch, False, 1) for label in EAGER_ORDER]
        + [train("gpu-lm", label, by_label[label], sizes.lm_batch, True, 1) for label in COMPILED_ORDER],
        4: [layer(path, compiled) for path, compiled in LAYER_PATHS],
        3: [
            Case(f"decode {mechanism} batch {batch}", 3, "decode", "gpu-lm", mechanism, cfg, batch, 0, True)
            for mechanism, cfg in auto.items()
            for batch in DECODE_BATCHES
        ],
        2: [train("nanogpt-124m", "mha", sizes.anchor, sizes.anchor_batch, compiled, 2) for compiled in (False, True)]
        + [
            train("185m", label, cfg, sizes.large_batch, compiled, 2)
            for label, cfg, compiled in (
                ("mha", sizes.large, True),
                ("dcmha[chunked]", dataclasses.replace(large_dcmha, attn_backend="chunked"), True),
                ("mha", sizes.large, False),
                ("dcmha[dcmha-triton]", dataclasses.replace(large_dcmha, attn_backend="dcmha-triton"), False),
            )
        ],
    }
    return [case for group in groups for case in cases.get(group, [])]


# The worker: runs one case at a time, in its own process.


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


def worker_main(conn: Connection, settings: Settings) -> None:
    # The parent alone answers timeout's SIGTERM and a Ctrl-C: it records the case in flight, then stops this process.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    bench_dcmha_triton.listen_to_tuning()
    while (message := conn.recv()) is not None:
        case, seconds = message
        conn.send(run_case(case, settings, seconds))


class Worker:
    """The worker process, seen from the parent."""

    def __init__(self, settings: Settings):
        context = multiprocessing.get_context("spawn")
        self.conn, child = context.Pipe()
        # Not a daemon: inductor compiles in a pool of processes, which a daemon may not start.
        self.process = context.Process(target=worker_main, args=(child, settings))
        self.process.start()
        child.close()

    def run(self, case: Case, seconds: float) -> dict[str, Any] | None:
        """The case's record, or None when it ran ``GRACE_S`` past ``seconds`` (the worker is then stopped)."""
        self.conn.send((case, seconds))
        limit = time.perf_counter() + seconds + GRACE_S
        while not self.conn.poll(0.5):
            if not self.process.is_alive():
                return {"status": ERROR, "reason": f"the worker process died (exit code {self.process.exitcode})"}
            if time.perf_counter() > limit:
                self.stop()
                return None
        try:
            return self.conn.recv()
        except EOFError:
            return {"status": ERROR, "reason": f"the worker process died (exit code {self.process.exitcode})"}

    def stop(self) -> None:
        if self.process.is_alive():
            self.process.kill()
        self.process.join()
        self.conn.close()


# The parent: plans, keeps the budget, writes the report.


def run_tests(out: Path, settings: Settings, seconds: float) -> dict[str, Any]:
    """``pytest -m "cuda or triton"`` in a subprocess, stopped after ``seconds``: its counts and failed tests, from the
    junit file it writes beside the report."""
    if seconds < MIN_TESTS_S:
        return {
            "status": SKIPPED,
            "reason": f"{max(seconds, 0):.0f} s of the budget were left, under {MIN_TESTS_S:.0f}",
        }
    junit = (out / "tests-junit.xml").resolve()
    command = gpu_kit.gpu_tests_command(settings.test_args, junit)
    start = time.perf_counter()
    try:
        completed = subprocess.run(command, cwd=REPOSITORY, capture_output=True, text=True, timeout=seconds)
    except subprocess.TimeoutExpired:
        return {"status": CUT_OFF, "reason": f"still running when the budget's {seconds:.0f} s left to it ran out"}
    record: dict[str, Any] = {"command": " ".join(command[1:]), "wall_s": time.perf_counter() - start}
    if completed.returncode not in gpu_kit.PYTEST_FINISHED or not junit.is_file():
        tail = (completed.stdout + completed.stderr)[-2000:]
        return {"status": ERROR, "reason": f"pytest exited {completed.returncode}", "output_tail": tail, **record}
    return {"status": MEASURED, "reason": "", **gpu_kit.junit_counts(junit), **record}


def tests_line(tests: dict[str, Any] | None) -> str:
    if tests is None:
        return "not asked for (--groups without 5)"
    if tests["status"] != MEASURED:
        return f"{tests['status']}: {tests['reason']}"
    return f"{tests['passed']} passed, {tests['failed']} failed, {tests['skipped']} skipped"


class Stopped(Exception):
    """SIGTERM (timeout's) or SIGINT arrived."""


def on_signal(signum: int, frame: FrameType | None) -> None:
    raise Stopped(signal.Signals(signum).name)


def skip_before_start(case: Case, left: float, done: list[tuple[Case, dict[str, Any]]]) -> str | None:
    """Why ``case`` is not started with ``left`` seconds of the budget, or None: when the quickest finished case of
    its kind took longer than that."""
    if left <= 0:
        return "the budget was spent before it"
    times = [(record["wall_s"], other.name) for other, record in done if other.similar == case.similar]
    if times and min(times)[0] > left:
        seconds, name = min(times)
        return f"{name} took {seconds:.0f} s and {left:.0f} s of the budget were left"
    return None


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
    args = parser.parse_args(argv)
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


if __name__ == "__main__":
    sys.exit(main())
