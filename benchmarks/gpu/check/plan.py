"""The check's plan (which combinations, sizes and budget), its verdicts and the report they fill."""

from __future__ import annotations

import dataclasses
import gc
import math
import time
from dataclasses import dataclass, field

import torch
from torch import Tensor
from torch.nn.attention import SDPBackend

from attnzoo.attention import ATTENTION
from attnzoo.bench import BenchResult
from attnzoo.config import ModelConfig
from attnzoo.positions import POSITIONS
from attnzoo.variants import Variant, variant_config

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
