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
* dispatch: the kernel attnzoo's ``attend`` picks (``attention/kernels.py``) and the SDPA backend torch actually
  ran in a training step and a decode step (the fused kernel each SDPA call dispatched, or math when it dispatched
  none). On CUDA a mechanism on SDPA must never fall to SDPA's math path; the backends that can run it, tried one
  at a time under ``sdpa_kernel``, explain a fall.

Then ``torch.compile`` of a training step and of decoding (``generate(..., compile=True)``) for a subset of those
combinations: equal outputs and the recompile count. Last the speed at a size that fills a GPU: training tok/s,
peak memory and model FLOPs utilisation against MHA, and decode tok/s at batch 1 and 16, eager and compiled. A
combination the config refuses is recorded as refused with the reason; an error in one is recorded and the rest
run. Sections past the time budget (``--budget``) are recorded as skipped.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gc
import inspect
import json
import math
import platform
import re
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

import attnzoo
from attnzoo.attention import ATTENTION, kernels
from attnzoo.bench import SDPA_KERNELS, BenchCase, BenchResult, measure_here, ratio_table
from attnzoo.config import ModelConfig
from attnzoo.io import atomic_write_text
from attnzoo.model import Transformer
from attnzoo.positions import POSITIONS
from attnzoo.tables import Table, ratio, speed_header
from attnzoo.variants import Variant, matched_configs, variant_config

SCRIPT_DIR = Path(__file__).resolve().parent
RESULTS_DIR = SCRIPT_DIR / "results"

PASS, FAIL, ERROR = "pass", "FAIL", "error"
REFUSED, UNAVAILABLE, SKIPPED, OUT_OF_MEMORY = "refused", "not available", "skipped", "out of memory"
FAILING = (FAIL, ERROR)

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
HEADS = ("MHA", "GQA")  # GQA: half as many kv heads as query heads

# Relative error ‖a − b‖ / ‖b‖ allowed, per dtype. "forward": logits against the CPU float64 reference;
# "backward": all gradients as one vector against it; "cached decode": cached against full forward on the device;
# "compile": a compiled training step's gradients against the eager step's; "greedy gap": how far below the eager
# model's best logit each token of compiled greedy decoding may be, as a fraction of the logits' range. fp32 allows
# 10–100× what fp32 rounding gives (about 1e-7 to 3e-7 on the CPU at the dry run's sizes); bf16 about 8 units of
# bf16 rounding (2⁻⁸ ≈ 3.9e-3; the CPU gives 3e-3 to 7e-3, Diff's difference of two maps the most).
TOLERANCES = {
    "fp32": {"forward": 1e-5, "backward": 2e-5, "cached decode": 1e-5, "compile": 2e-5, "greedy gap": 1e-4},
    "bf16": {"forward": 3e-2, "backward": 3e-2, "cached decode": 2e-2, "compile": 3e-2, "greedy gap": 5e-2},
}
BACKENDS = {
    "flash": SDPBackend.FLASH_ATTENTION,
    "memory-efficient": SDPBackend.EFFICIENT_ATTENTION,
    "cuDNN": SDPBackend.CUDNN_ATTENTION,
    "math": SDPBackend.MATH,
}


# ------------------------------------------------------------------------------------------------ plans


@dataclass(frozen=True)
class Combo:
    """One combination of the numerics matrix."""

    attention: str
    position: str
    heads: str  # "MHA" or "GQA"
    dtype: str  # "fp32" or "bf16"

    @property
    def label(self) -> str:
        return f"{self.attention}+{self.position} {self.heads} {self.dtype}"


@dataclass(frozen=True)
class SpeedPlan:
    """The speed section: each mechanism matched to the parameters of MHA of this size (``variants``)."""

    dim: int
    n_layers: int
    n_heads: int
    vocab_size: int
    seq_lens: tuple[int, ...]
    tokens_per_step: int  # a training step's batch is this // T sequences
    decode_batches: tuple[int, ...]
    decode_prompt: int
    decode_tokens: int
    compiled_decode: tuple[str, ...]  # mechanisms whose compiled decoding is timed, in order, while budget remains
    repeats: int
    matmul_n: int


@dataclass(frozen=True)
class Plan:
    name: str
    mechanisms: tuple[str, ...]
    positions: tuple[str, ...]
    dtypes: tuple[str, ...]
    dim: int
    n_layers: int
    n_heads: int
    seq_len: int
    batch: int
    compile_combos: tuple[Combo, ...]
    compile_backend: str  # "inductor"; "eager" in the dry run exercises dynamo's capture and counters quickly
    compile_decode: bool  # False in the dry run: generate(compile=True) compiles with inductor, minutes on a CPU
    speed: SpeedPlan
    budget_s: float

    def combos(self) -> list[Combo]:
        return [Combo(a, p, h, d) for a in self.mechanisms for p in self.positions for h in HEADS for d in self.dtypes]


def mechanism_names() -> tuple[str, ...]:
    """Every registered mechanism, the baseline first."""
    return ("mha", *sorted(name for name in ATTENTION.names() if name != "mha"))


def make_plan(kind: str) -> Plan:
    """The full check, the quick one, or the CPU dry run."""
    mechanisms = mechanism_names()
    full = Plan(
        name="full",
        mechanisms=mechanisms,
        positions=tuple(POSITIONS.names()),
        dtypes=tuple(DTYPES),
        dim=256,
        n_layers=2,
        n_heads=8,
        seq_len=256,
        batch=2,
        compile_combos=(*(Combo(m, "rope", "GQA", "bf16") for m in mechanisms), Combo("mha", "alibi", "MHA", "fp32")),
        compile_backend="inductor",
        compile_decode=True,
        speed=SpeedPlan(
            dim=1024,
            n_layers=12,
            n_heads=16,
            vocab_size=32768,
            seq_lens=(1024, 4096, 16384),
            tokens_per_step=16384,
            decode_batches=(1, 16),
            decode_prompt=1024,
            decode_tokens=128,
            compiled_decode=mechanisms,
            repeats=3,
            matmul_n=8192,
        ),
        budget_s=480.0,
    )
    if kind == "full":
        return full
    if kind == "quick":
        speed = dataclasses.replace(
            full.speed, seq_lens=(1024, 4096), decode_prompt=512, decode_tokens=64, compiled_decode=("mha",)
        )
        compile_combos = (Combo("mha", "rope", "GQA", "bf16"), Combo("dcmha", "rope", "GQA", "bf16"))
        return dataclasses.replace(
            full, name=kind, positions=("rope", "alibi"), dim=128, seq_len=128, compile_combos=compile_combos,
            speed=speed, budget_s=200.0,
        )  # fmt: skip
    if kind == "dry run":
        speed = SpeedPlan(
            dim=64, n_layers=2, n_heads=4, vocab_size=256, seq_lens=(64,), tokens_per_step=256, decode_batches=(1, 2),
            decode_prompt=16, decode_tokens=8, compiled_decode=(), repeats=2, matmul_n=128,
        )  # fmt: skip
        compile_combos = (Combo("mha", "rope", "GQA", "fp32"), Combo("dcmha", "alibi", "MHA", "bf16"))
        return dataclasses.replace(
            full, name=kind, positions=("rope", "alibi"), dim=32, n_heads=4, seq_len=32, compile_combos=compile_combos,
            compile_backend="eager", compile_decode=False, speed=speed, budget_s=120.0,
        )  # fmt: skip
    raise ValueError(f"plan {kind!r} is unknown: choose 'full', 'quick' or 'dry run'")


def check_config(combo: Combo, plan: Plan) -> ModelConfig:
    """The combination's config, paired with the MHA baseline as the mechanism's paper does (``variant_config``).
    DCMHA's window and query blocks are a quarter of the sequence, so its local layer, ring cache and chunks are
    exercised. Raises ValueError when the config refuses the combination."""
    baseline = ModelConfig(
        vocab_size=256, dim=plan.dim, n_layers=plan.n_layers, n_heads=plan.n_heads, max_seq_len=plan.seq_len
    )
    kv = plan.n_heads // 2 if combo.heads == "GQA" else None
    cfg = variant_config(Variant(combo.attention, combo.position, kv), baseline)
    if combo.attention == "dcmha":
        quarter = max(4, plan.seq_len // 4)
        cfg = dataclasses.replace(cfg, attention_options={"window_size": quarter, "q_chunk_size": quarter})
    return cfg


# ------------------------------------------------------------------------------------------- results


@dataclass
class Check:
    case: str
    name: str  # "forward", "backward", "cached decode", "dispatch", "compile train", "compile decode", "speed ..."
    status: str
    value: float | None = None
    limit: float | None = None
    detail: str = ""
    extra: dict = field(default_factory=dict)


@dataclass
class Report:
    meta: dict
    checks: list[Check] = field(default_factory=list)
    train_speed: list[BenchResult] = field(default_factory=list)
    decode_speed: list[dict] = field(default_factory=list)
    matmul_tflops: dict[str, float] = field(default_factory=dict)

    @property
    def failures(self) -> list[Check]:
        return [c for c in self.checks if c.status in FAILING]

    def add(self, check: Check) -> Check:
        self.checks.append(check)
        return check


def rel_error(actual: Tensor, reference: Tensor) -> float:
    """‖a − b‖ / ‖b‖ in float64 on the CPU; 0 when both are 0, inf when only b is; NaN propagates (and fails)."""
    a, b = actual.detach().double().cpu(), reference.detach().double().cpu()
    diff, norm = float((a - b).norm()), float(b.norm())
    if norm == 0:
        return 0.0 if diff == 0 else math.inf
    return diff / norm


def within(value: float, limit: float) -> str:
    return PASS if value <= limit else FAIL  # NaN compares false: a failure


def error_check(case: str, name: str, err: BaseException) -> Check:
    return Check(case, name, ERROR, detail=f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}")


def free_memory() -> None:
    """Return what the last case held to the GPU before the next one (tracebacks and cycles included)."""
    if torch.cuda.is_available():
        gc.collect()
        torch.cuda.empty_cache()


class Deadline:
    def __init__(self, seconds: float):
        self.start, self.seconds = time.perf_counter(), seconds

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def left(self) -> float:
        return self.seconds - self.elapsed()


# ------------------------------------------------------------------------------------------- numerics


def autocast(device: str, dtype: str) -> contextlib.AbstractContextManager:
    """bf16 runs under autocast over fp32 weights, as the trainer does on CUDA; fp32 runs as is."""
    return torch.autocast(torch.device(device).type, dtype=DTYPES[dtype], enabled=dtype != "fp32")


def build_pair(cfg: ModelConfig, device: str) -> tuple[Transformer, Transformer]:
    """(the device model with the config's backend, its CPU float64 eager reference), holding the same weights."""
    torch.manual_seed(0)
    model = Transformer(cfg)
    reference = Transformer(dataclasses.replace(cfg, attn_backend="eager"))
    reference.load_state_dict(model.state_dict())
    return model.to(device), reference.double()


def train_step(
    model: Transformer, idx: Tensor, context: contextlib.AbstractContextManager, call: Callable | None = None
) -> tuple[Tensor, dict[str, Tensor]]:
    """Logits and every parameter's gradient, by name, after one forward and backward on ``idx`` (targets = idx);
    ``call`` runs the model in its place (its compiled form)."""
    model.zero_grad(set_to_none=True)
    with context:
        logits, loss = (model if call is None else call)(idx, idx)
        loss.backward()
    grads = {name: p.grad.detach().clone() for name, p in model.named_parameters() if p.grad is not None}
    return logits.detach(), grads


def gradient_errors(grads: dict[str, Tensor], reference: dict[str, Tensor]) -> tuple[float, float, str]:
    """The relative error of all gradients as one vector, the worst single parameter's and that parameter's name.

    The first is the criterion: a parameter whose gradient is tiny (Diff's λ vectors, selective's temperature
    scale) has a relative error that bf16 rounding alone makes large; the worst one is shown to locate a fault."""
    if set(grads) != set(reference):
        raise RuntimeError(f"gradients differ in which parameters have one: {sorted(set(grads) ^ set(reference))[:4]}")
    names = sorted(reference)
    errors = {name: rel_error(grads[name], reference[name]) for name in names}
    worst = max(names, key=lambda n: errors[n])
    flat = torch.cat([grads[n].double().cpu().flatten() for n in names])
    overall = rel_error(flat, torch.cat([reference[n].double().cpu().flatten() for n in names]))
    return overall, errors[worst], worst


def cached_logits(model: Transformer, idx: Tensor, cache_dtype: torch.dtype) -> Tensor:
    """The logits of ``idx`` fed through a cache as a prefill, five single tokens and the rest as one chunk."""
    length = idx.shape[1]
    prefill = max(1, length // 2 - 3)
    cache = model.new_cache(idx.shape[0], length, dtype=cache_dtype)
    pieces = [model(idx[:, :prefill], cache=cache)]
    steps = min(5, length - prefill - 1)
    pieces += [model(idx[:, t : t + 1], cache=cache) for t in range(prefill, prefill + steps)]
    pieces.append(model(idx[:, prefill + steps :], cache=cache))
    return torch.cat(pieces, dim=1)


class _FusedKernels(TorchDispatchMode):
    """The fused SDPA kernels dispatched (``bench.SDPA_KERNELS``), in order, and those among them called directly
    rather than by ``F.scaled_dot_product_attention`` (kernels.py calls the CPU flash kernel itself for ALiBi's
    bias with the causal flag). SDPA's math path never shows here: it decomposes into ordinary ops before the
    dispatcher reaches a mode."""

    def __init__(self) -> None:
        super().__init__()
        self.ran: list[str] = []
        self.direct: list[str] = []
        self.in_sdpa_call = False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        label = SDPA_KERNELS.get(func.__name__.split(".")[0])
        if label is not None:
            self.ran.append(label)
            if not self.in_sdpa_call:
                self.direct.append(label)
        return func(*args, **(kwargs or {}))


class SdpaCalls(TorchFunctionMode):
    """The backend each ``F.scaled_dot_product_attention`` call ran: the fused kernel dispatched during the call,
    or "math" when the call dispatched none. ``fused.direct`` holds the fused kernels called without it."""

    def __init__(self) -> None:
        super().__init__()
        self.fused = _FusedKernels()
        self.backends: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is not F.scaled_dot_product_attention:
            return func(*args, **(kwargs or {}))
        before = len(self.fused.ran)
        self.fused.in_sdpa_call = True
        try:
            out = func(*args, **(kwargs or {}))
        finally:
            self.fused.in_sdpa_call = False
        ran = self.fused.ran[before:]
        self.backends.append(ran[0] if ran else "math")
        return out


def sdpa_backends(fn: Callable[[], object]) -> list[str]:
    """The SDPA backends the calls inside ``fn`` ran, each once, direct calls of a fused kernel included; empty
    when nothing called SDPA."""
    with SdpaCalls() as calls, calls.fused:
        fn()
    return sorted({*calls.backends, *calls.fused.direct})


@contextlib.contextmanager
def attend_choices() -> Iterator[set[str]]:
    """The kernels attnzoo's ``attend`` picks while the block runs: it calls them through ``kernels``' module
    globals, so counting wrappers there see every call. The eager kernel counts only where ``attend`` calls it
    itself, not inside the chunked kernel's blocks (which the backward pass recomputes, outside the kernel's call)."""
    chosen: set[str] = set()
    originals = {name: getattr(kernels, name) for name in ("sdpa_attention", "chunked_attention", "eager_attention")}
    depth = [0]

    def wrap(name: str, label: str) -> Callable:
        original = originals[name]

        def counted(*args, **kwargs):
            if depth[0] == 0:
                chosen.add(label)
            depth[0] += 1
            try:
                return original(*args, **kwargs)
            finally:
                depth[0] -= 1

        return counted

    block_call = kernels._Block.__call__

    def inside_block(*args, **kwargs):  # a chunked block, also when its backward pass recomputes it
        depth[0] += 1
        try:
            return block_call(*args, **kwargs)
        finally:
            depth[0] -= 1

    try:
        for name, label in (("sdpa_attention", "sdpa"), ("chunked_attention", "chunked"), ("eager_attention", "eager")):
            setattr(kernels, name, wrap(name, label))
        kernels._Block.__call__ = inside_block
        yield chosen
    finally:
        for name, original in originals.items():
            setattr(kernels, name, original)
        kernels._Block.__call__ = block_call


def runnable_backends(fn: Callable[[], object]) -> dict[str, str]:
    """Each SDPA backend tried alone under ``sdpa_kernel``: "ok", or the first reason torch gives for refusing."""
    outcomes = {}
    for label, backend in BACKENDS.items():
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                with sdpa_kernel([backend]):
                    fn()
                outcomes[label] = "ok"
            except RuntimeError as err:
                reasons = [_reason(str(w.message)) for w in caught]
                reasons = [r for r in reasons if r and "not used because" not in r]
                outcomes[label] = reasons[0] if reasons else _reason(str(err))
    return outcomes


def _reason(message: str) -> str:
    return re.sub(r"\s*\(Triggered internally at .*", "", message.strip().splitlines()[0] if message.strip() else "")


def expected_dispatch(cfg: ModelConfig, device: str) -> str:
    """What attnzoo should run: a mechanism that acts on the scores (``needs_scores``) its chunked eager kernel and
    no SDPA; every other one SDPA, and on CUDA a fused SDPA backend, never the math path."""
    if ATTENTION.get(cfg.attention).needs_scores:
        return "chunked eager kernel, no SDPA (the mechanism acts on the scores)"
    if torch.device(device).type == "cuda":
        return "SDPA, a fused backend (flash, memory-efficient or cuDNN), never math"
    return "SDPA (any backend: on the CPU only recorded)"


def dispatch_status(cfg: ModelConfig, device: str, chosen: set[str], train: list[str], decode: list[str]) -> str:
    """PASS or FAIL for what ``attend`` chose and the SDPA backends that ran, against :func:`expected_dispatch`."""
    if ATTENTION.get(cfg.attention).needs_scores:
        return PASS if "sdpa" not in chosen and not (train or decode) else FAIL
    if "sdpa" not in chosen or not train or not decode:
        return FAIL  # attend did not pick SDPA, or SDPA never ran
    if torch.device(device).type == "cuda" and "math" in {*train, *decode}:
        return FAIL
    return PASS


def check_combo(combo: Combo, plan: Plan, device: str) -> list[Check]:
    """Numerics, cached decode and dispatch of one combination; a refused config is one ``refused`` check."""
    try:
        cfg = check_config(combo, plan)
    except ValueError as err:
        return [Check(combo.label, "config", REFUSED, detail=str(err))]
    tol = TOLERANCES[combo.dtype]
    checks = []
    model, reference = build_pair(cfg, device)
    torch.manual_seed(1)
    idx = torch.randint(0, cfg.vocab_size, (plan.batch, plan.seq_len))
    context = autocast(device, combo.dtype)

    def run(name: str, fn: Callable[[], Check]) -> None:
        try:
            checks.append(fn())
        except Exception as err:  # recorded; the other checks of this combination still run
            checks.append(error_check(combo.label, name, err))

    reference_logits, reference_grads = train_step(reference, idx, contextlib.nullcontext())
    logits, grads = None, None

    def forward() -> Check:
        nonlocal logits, grads
        logits, grads = train_step(model, idx.to(device), context)
        value = rel_error(logits, reference_logits)
        return Check(combo.label, "forward", within(value, tol["forward"]), value, tol["forward"])

    def backward() -> Check:
        if grads is None:
            return Check(combo.label, "backward", SKIPPED, detail="the forward pass failed")
        value, worst_value, worst = gradient_errors(grads, reference_grads)
        detail = f"worst parameter: {worst} {fmt(worst_value)}"
        return Check(combo.label, "backward", within(value, tol["backward"]), value, tol["backward"], detail)

    def cached_decode() -> Check:
        model.eval()
        with torch.no_grad(), context:
            full = model(idx.to(device))
            cached = cached_logits(model, idx.to(device), DTYPES[combo.dtype])
        value = rel_error(cached, full)
        limit = tol["cached decode"]
        return Check(combo.label, "cached decode", within(value, limit), value, limit)

    def dispatch() -> Check:
        model.train()
        on_device = idx.to(device)
        # The decode step sees an odd number of keys, as most steps do: a kernel that needs aligned lengths and
        # falls back otherwise shows here, not only at round lengths.
        prefill = plan.seq_len - 4
        cache = model.new_cache(plan.batch, plan.seq_len, dtype=DTYPES[combo.dtype])
        with torch.no_grad(), context:
            model(on_device[:, :prefill], cache=cache)

        def decode_step() -> None:
            with torch.no_grad(), context:
                model(on_device[:, prefill : prefill + 1], cache=cache)

        with attend_choices() as chosen:
            train = sdpa_backends(lambda: train_step(model, on_device, context))
            decode = sdpa_backends(decode_step)

        def forward_only() -> None:
            with torch.no_grad(), context:
                model(on_device)

        backends = runnable_backends(forward_only) if train else {}
        extra = {"attend": sorted(chosen), "sdpa train": train, "sdpa decode": decode, "backends": backends}
        status = dispatch_status(cfg, device, chosen, train, decode)
        detail = f"expected: {expected_dispatch(cfg, device)}"
        return Check(combo.label, "dispatch", status, detail=detail, extra=extra)

    run("forward", forward)
    run("backward", backward)
    run("cached decode", cached_decode)
    run("dispatch", dispatch)
    return checks


# -------------------------------------------------------------------------------------------- compile


def compiled_graphs() -> int:
    """Graphs dynamo has compiled in this process: a rise between two calls of equal shapes is a recompile."""
    return torch._dynamo.utils.counters["stats"]["unique_graphs"]


def check_compiled_training(combo: Combo, plan: Plan, device: str) -> Check:
    """A compiled training step against the eager one, on one model; then two more steps of the same shapes must
    compile nothing."""
    cfg = check_config(combo, plan)
    torch._dynamo.reset()  # a fresh cache: each model's graphs are counted alone and stay under the recompile limit
    model, _ = build_pair(cfg, device)
    compiled = torch.compile(model, backend=plan.compile_backend)
    context = autocast(device, combo.dtype)
    torch.manual_seed(2)
    batches = [torch.randint(0, cfg.vocab_size, (plan.batch, plan.seq_len), device=device) for _ in range(3)]
    _, eager_grads = train_step(model, batches[0], context)
    before = compiled_graphs()
    _, grads = train_step(model, batches[0], context, call=compiled)
    graphs = compiled_graphs() - before
    for idx in batches[1:]:
        train_step(model, idx, context, call=compiled)
    recompiles = compiled_graphs() - before - graphs
    value, _, worst = gradient_errors(grads, eager_grads)
    limit = TOLERANCES[combo.dtype]["compile"]
    status = PASS if value <= limit and recompiles == 0 else FAIL
    detail = (
        f"gradients as one vector (worst parameter: {worst}); "
        f"{graphs} graph(s) compiled, {recompiles} recompile(s) in 2 more steps"
    )
    extra = {"graphs": graphs, "recompiles": recompiles, "backend": plan.compile_backend}
    return Check(combo.label, "compile train", status, value, limit, detail, extra)


def generate_compiles() -> bool:
    """Whether this attnzoo's ``generate`` takes ``compile`` (the static-shape decode of issue 14, part 2)."""
    return "compile" in inspect.signature(Transformer.generate).parameters


def greedy_gap(model: Transformer, tokens: Tensor, prompt_len: int) -> float:
    """How far below the best logit of the eager full forward each generated token's logit is, as a fraction of
    the row's range; 0 when every token is the eager model's argmax. Robust to near ties, which legitimately
    flip between kernels that round differently."""
    logits = model(tokens[:, :-1])[:, prompt_len - 1 :].double()
    chosen = logits.gather(-1, tokens[:, prompt_len:, None]).squeeze(-1)
    best, worst = logits.max(dim=-1).values, logits.min(dim=-1).values
    return float(((best - chosen) / (best - worst).clamp_min(1e-30)).max())


def check_compiled_decode(combo: Combo, plan: Plan, device: str) -> Check:
    """``generate(..., compile=True)``: every greedy token the eager model's argmax within the tolerance, and a
    second call of the same shapes compiling nothing."""
    if not generate_compiles():
        return Check(combo.label, "compile decode", UNAVAILABLE, detail="this attnzoo's generate takes no compile")
    if not plan.compile_decode:
        return Check(combo.label, "compile decode", SKIPPED, detail="dry run: inductor compiles for minutes on a CPU")
    cfg = check_config(combo, plan)
    torch._dynamo.reset()
    model, _ = build_pair(cfg, device)
    model.eval()
    context = autocast(device, combo.dtype)
    prompt_len, new_tokens = plan.seq_len // 4, plan.seq_len // 4
    torch.manual_seed(3)
    prompts = [torch.randint(0, cfg.vocab_size, (plan.batch, prompt_len), device=device) for _ in range(2)]
    with torch.no_grad(), context:
        before = compiled_graphs()
        tokens = model.generate(prompts[0], new_tokens, temperature=0.0, compile=True)
        graphs = compiled_graphs() - before
        model.generate(prompts[1], new_tokens, temperature=0.0, compile=True)
        recompiles = compiled_graphs() - before - graphs
        eager = model.generate(prompts[0], new_tokens, temperature=0.0)
        gap = greedy_gap(model, tokens, prompt_len)
    limit = TOLERANCES[combo.dtype]["greedy gap"]
    same = int((tokens == eager).all(dim=0).int().cumprod(0).sum()) - prompt_len
    status = PASS if gap <= limit and recompiles == 0 else FAIL
    detail = (
        f"{same} of {new_tokens} tokens equal to eager generate before the first difference; "
        f"{graphs} graph(s) compiled, {recompiles} recompile(s) in a second call"
    )
    return Check(
        combo.label, "compile decode", status, gap, limit, detail, {"graphs": graphs, "recompiles": recompiles}
    )


# ---------------------------------------------------------------------------------------------- speed


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


# -------------------------------------------------------------------------------------------- writers


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
        "math; dcmha acts on the scores and runs its chunked eager kernel, no SDPA. Likely backends: flash or cuDNN "
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


# ----------------------------------------------------------------------------------------------- main


def git_commit() -> str:
    """The checkout's commit, marked when tracked files differ from it: what the report verified."""
    try:
        run = dict(capture_output=True, text=True, timeout=10, cwd=SCRIPT_DIR)
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


if __name__ == "__main__":
    sys.exit(main())
