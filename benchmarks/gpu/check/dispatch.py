"""Which kernel ran: the SDPA backends torch dispatched to, and the kernel attnzoo's ``attend`` picked."""

from __future__ import annotations

import contextlib
import re
import warnings
from collections.abc import Callable, Iterator

import torch
import torch.nn.functional as F
from torch.nn.attention import sdpa_kernel
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from attnzoo.attention import ATTENTION
from attnzoo.attention.kernels import dcmha_fused, dispatch
from attnzoo.bench import fused_ops
from attnzoo.config import ModelConfig
from attnzoo.positions import POSITIONS

from gpu.check.plan import BACKENDS, FAIL, PASS


class _FusedKernels(TorchDispatchMode):
    """The fused SDPA kernels dispatched (``bench.fused_ops``), in order, and those among them called directly
    rather than by ``F.scaled_dot_product_attention`` (kernels/sdpa.py calls the CPU flash kernel itself for ALiBi's
    bias with the causal flag). SDPA's math path never shows here: it decomposes into ordinary ops before the
    dispatcher reaches a mode."""

    def __init__(self) -> None:
        super().__init__()
        self.ran: list[str] = []
        self.direct: list[str] = []
        self.in_sdpa_call = False
        self.labels = fused_ops()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        label = self.labels.get(func.__name__.split(".")[0])
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
    """The names of the kernels attnzoo's ``attend`` picks while the block runs (``attention.kernels.choose``, which
    it calls through its module's global, so a counting wrapper there sees every choice)."""
    chosen: set[str] = set()
    choose = dispatch.choose

    def counted(*args, **kwargs):
        kernel = choose(*args, **kwargs)
        chosen.add(kernel.name)
        return kernel

    dispatch.choose = counted
    try:
        yield chosen
    finally:
        dispatch.choose = choose


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
    """What attnzoo should run: a mechanism that acts on the scores (``needs_scores``) its own fused kernels (DCMHA's
    C++ kernels on the CPU, where built: the fresh sequence's and the decoding step's) or its chunked eager kernel,
    and no SDPA; every other one SDPA, and on CUDA a fused SDPA backend, never the math path."""
    if ATTENTION.get(cfg.attention).needs_scores:
        return "its own fused kernels or the chunked eager kernel, no SDPA (the mechanism acts on the scores)"
    if torch.device(device).type == "cuda":
        return "SDPA, a fused backend (flash, memory-efficient or cuDNN), never math"
    return "SDPA or the mechanism's and scheme's own CPU kernels, never the eager reference (backends only recorded)"


def dispatch_status(cfg: ModelConfig, device: str, chosen: set[str], train: list[str], decode: list[str]) -> str:
    """PASS or FAIL for what ``attend`` chose and the SDPA backends that ran, against :func:`expected_dispatch`."""
    if ATTENTION.get(cfg.attention).needs_scores:
        own = {dcmha_fused.KERNEL_NAME, dcmha_fused.DECODE_KERNEL_NAME}
        return PASS if "sdpa" not in chosen and set(train + decode) <= own else FAIL
    if torch.device(device).type != "cuda":  # the fused C++ kernels of the mechanism (Diff's) or scheme (ALiBi's)
        own = {"sdpa", *ATTENTION.get(cfg.attention).kernels, *POSITIONS.get(cfg.position).kernels}
        return PASS if chosen and chosen <= own else FAIL
    if "sdpa" not in chosen or not train or not decode:
        return FAIL  # attend did not pick SDPA, or SDPA never ran
    if torch.device(device).type == "cuda" and "math" in {*train, *decode}:
        return FAIL
    return PASS
