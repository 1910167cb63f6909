"""Which kernel each call runs, pinned for a matrix of configurations: the kernel records and their dispatcher
(``attention/kernels/``) choose what the layers chose when each picked its own (the table was taken from that code),
with the fused C++ kernels built or not (everything falls back to the PyTorch path); and how ``attn_backend`` names
a kernel.

The kernels are observed from outside, by counting calls of their entry points, so the table holds whatever code
makes the choice.
"""

from __future__ import annotations

import dataclasses
import json
import re
import warnings
from types import ModuleType

import pytest
import torch
import torch.nn.functional as F
from kernel_checks import CallCounter, on_backend
from training_helpers import TINY_FLAGS, write_text_corpus

from attnzoo import ModelConfig, Transformer
from attnzoo.attention import ATTENTION
from attnzoo.attention.kernels import (
    Call,
    alibi_flash,
    build,
    choose,
    chunked,
    dcmha_compiled,
    dcmha_fused,
    diff_decode,
    diff_flash,
    diff_v2_flash,
    dispatch,
    eager,
    sdpa,
)
from attnzoo.cli import main
from attnzoo.config import attn_backends
from attnzoo.positions import POSITIONS as POSITIONS_REGISTRY
from attnzoo.training import read_checkpoint

# label → the entry points whose calls show that kernel ran
ENTRY_POINTS: dict[str, list[tuple[ModuleType, str]]] = {
    "sdpa": [(F, "scaled_dot_product_attention")],
    "sdpa-causal-bias": [(sdpa, "sdpa_with_causal_bias")],
    "alibi-flash": [(alibi_flash, "alibi_flash_attention")],
    "chunked": [(chunked, "chunked_attention")],
    "eager": [(eager, "eager_attention"), (chunked, "eager_attention")],
    "diff-flash": [(diff_flash, "diff_attention")],
    "diff-decode": [(diff_decode, "decode_attention")],
    "diff-v2-flash": [(diff_v2_flash, "diff_v2_attention")],
    "dcmha-fused": [(dcmha_fused, "dcmha_attention")],
    "dcmha-decode": [(dcmha_fused, "decode_attention")],
}


class Spy:
    def __init__(self, monkeypatch):
        self.seen: set[str] = set()
        for label, points in ENTRY_POINTS.items():
            for module, name in points:
                monkeypatch.setattr(module, name, self.counting(label, getattr(module, name)))
        # The kernel of DCMHA's composition weights that forms a decoding step's token in one fused call.
        monkeypatch.setattr(dcmha_fused, "step_weights", self.counting("dcmha-step-weights", dcmha_fused.step_weights))

    def counting(self, label, fn):
        def wrapper(*args, **kwargs):
            self.seen.add(label)
            return fn(*args, **kwargs)

        return wrapper

    def take(self) -> str:
        seen, self.seen = self.seen, set()
        return "+".join(sorted(seen))


MECHANISMS = ["mha", "selective", "diff", "diff_v2", "dcmha"]  # the table's: built in, each with its own row
POSITION_NAMES = POSITIONS_REGISTRY.names()
BACKENDS = ["auto", "eager", "sdpa"]
POSITIONS = ["rope", "alibi"]
# (name, config changes, dtype): the variations that change a choice
VARIANTS = [
    ("plain", {}, torch.float32),
    ("dropout", {"dropout": 0.1}, torch.float32),
    ("bidirectional", {"causal": False}, torch.float32),
    ("bf16", {}, torch.bfloat16),
]


def model_of(attention: str, backend: str, position: str, changes: dict, dtype: torch.dtype) -> Transformer:
    options = {"window_size": 3, "q_chunk_size": 4} if attention == "dcmha" else {}
    if attention == "dcmha" and backend == "sdpa":
        backend = "auto"  # deprecated: runs as 'auto' (tests/test_kernels.py)
    cfg = ModelConfig(
        vocab_size=32,
        dim=32,
        n_layers=2,
        n_heads=4,
        n_kv_heads=2,
        max_seq_len=32,
        attention=attention,
        attention_options=options,
        position=position,
        attn_backend=backend,
        **changes,
    )
    return Transformer(cfg).to(dtype)


def observe(monkeypatch, model: Transformer) -> dict[str, str]:
    """The kernels of a training forward, an inference forward, a prefill, a cached step and a recording of maps."""
    spy = Spy(monkeypatch)
    idx = torch.randint(0, 32, (2, 10))
    seen = {}
    model.train()(idx)
    seen["train"] = spy.take()
    model.eval()
    with torch.no_grad():
        model(idx)
        seen["inference"] = spy.take()
        if model.config.causal:
            cache = model.new_cache(2, 12)
            model(idx[:, :6], cache=cache)
            seen["prefill"] = spy.take()
            model(idx[:, 6:7], cache=cache)
            model(idx[:, 7:8], cache=cache)
            seen["step"] = spy.take()
            model.attention_maps(idx)
            seen["maps"] = spy.take()
    return seen


def cases():
    for attention in MECHANISMS:
        for position in POSITIONS:
            for backend in BACKENDS:
                yield attention, position, backend, "plain"
            if position == "alibi" and not ATTENTION.get(attention).needs_scores:  # ALiBi's kernel runs SDPA's calls
                yield attention, position, "alibi-flash", "plain"
            for variant, _, _ in VARIANTS[1:]:
                yield attention, position, "auto", variant


def kernel_table(monkeypatch) -> dict[tuple[str, str, str, str], dict[str, str]]:
    table = {}
    for attention, position, backend, variant in cases():
        _, changes, dtype = next(v for v in VARIANTS if v[0] == variant)
        model = model_of(attention, backend, position, changes, dtype)
        with warnings.catch_warnings():  # a pinned kernel's fallback to the reference is said (tested below)
            warnings.simplefilter("ignore", RuntimeWarning)
            table[attention, position, backend, variant] = observe(monkeypatch, model)
    return table


S, E, C = "sdpa", "eager", "chunked+eager"
MAPS = {"maps": E}


def generic(train=S, inference=S, prefill=S, step=S):
    return {"train": train, "inference": inference, "prefill": prefill, "step": step, **MAPS}


def bidirectional(train=S, inference=S):
    return {"train": train, "inference": inference}


EAGER = generic(E, E, E, E)
# ALiBi on a fresh causal sequence: the fused kernel on the CPU (fp32, bf16, without dropout); the prefill runs the
# blocks only past BIAS_BLOCK_ROWS rows, so at 6 it is one call too. A step attends with one additive mask (SDPA).
ALIBI = generic("alibi-flash", "alibi-flash", "alibi-flash", S)
# Dropout is on in training only: there SDPA takes the bias as one additive mask with the causal one.
ALIBI_DROPOUT = generic(S, "alibi-flash", "alibi-flash", S)
# attn_backend="sdpa" is SDPA alone: on a fresh sequence its CPU kernel takes the bias with the causal flag.
SDPA_ALIBI = generic("sdpa-causal-bias", "sdpa-causal-bias", "sdpa-causal-bias", S)
# attn_backend="alibi-flash" is ALiBi's kernel alone: a cached step, which it does not serve, runs on the reference.
ALIBI_PINNED = generic("alibi-flash", "alibi-flash", "alibi-flash", E)
# A one-token step: Diff's fused decoding kernel, fp32 only (a bf16 cache would be copied every step).
DIFF = generic("diff-flash", "diff-flash", "diff-flash", "diff-decode")
DIFF_BF16 = generic("diff-flash", "diff-flash", "diff-flash", S)
DIFF_DROPOUT = generic(S, "diff-flash", "diff-flash", "diff-decode")
V2 = generic("diff-v2-flash", "diff-v2-flash", "diff-v2-flash", S)
V2_DROPOUT = generic(S, "diff-v2-flash", "diff-v2-flash", S)
DCMHA = generic("dcmha-fused", "dcmha-fused", "dcmha-fused", "dcmha-decode+dcmha-step-weights")
DCMHA_BF16 = generic("dcmha-fused", "dcmha-fused", "dcmha-fused", C)
DCMHA_PYTORCH = generic(C, C, C, C)

# Today's choice with the fused C++ kernels built: the mechanisms that act on a single map (mha, selective) share one
# row, as the table of SDPA's own branches.
BUILT: dict[tuple[str, str, str, str], dict[str, str]] = {}
for _mechanism in ("mha", "selective"):
    BUILT |= {
        (_mechanism, "rope", "auto", "plain"): generic(),
        (_mechanism, "rope", "eager", "plain"): EAGER,
        (_mechanism, "rope", "sdpa", "plain"): generic(),
        (_mechanism, "rope", "auto", "dropout"): generic(),
        (_mechanism, "rope", "auto", "bidirectional"): bidirectional(),
        (_mechanism, "rope", "auto", "bf16"): generic(),
        (_mechanism, "alibi", "auto", "plain"): ALIBI,
        (_mechanism, "alibi", "eager", "plain"): EAGER,
        (_mechanism, "alibi", "sdpa", "plain"): SDPA_ALIBI,
        (_mechanism, "alibi", "alibi-flash", "plain"): ALIBI_PINNED,
        (_mechanism, "alibi", "auto", "dropout"): ALIBI_DROPOUT,
        (_mechanism, "alibi", "auto", "bidirectional"): bidirectional(),
        (_mechanism, "alibi", "auto", "bf16"): ALIBI,
    }
BUILT |= {
    ("diff", "rope", "auto", "plain"): DIFF,
    ("diff", "rope", "eager", "plain"): EAGER,
    ("diff", "rope", "sdpa", "plain"): generic(),
    ("diff", "rope", "auto", "dropout"): DIFF_DROPOUT,
    ("diff", "rope", "auto", "bidirectional"): bidirectional(),
    ("diff", "rope", "auto", "bf16"): DIFF_BF16,
    ("diff", "alibi", "auto", "plain"): DIFF,
    ("diff", "alibi", "eager", "plain"): EAGER,
    ("diff", "alibi", "sdpa", "plain"): SDPA_ALIBI,
    ("diff", "alibi", "alibi-flash", "plain"): ALIBI_PINNED,
    ("diff", "alibi", "auto", "dropout"): DIFF_DROPOUT,
    ("diff", "alibi", "auto", "bidirectional"): bidirectional(),
    ("diff", "alibi", "auto", "bf16"): DIFF_BF16,
    ("diff_v2", "rope", "auto", "plain"): V2,
    ("diff_v2", "rope", "eager", "plain"): EAGER,
    ("diff_v2", "rope", "sdpa", "plain"): generic(),
    ("diff_v2", "rope", "auto", "dropout"): V2_DROPOUT,
    ("diff_v2", "rope", "auto", "bidirectional"): bidirectional(),
    ("diff_v2", "rope", "auto", "bf16"): V2,
    ("diff_v2", "alibi", "auto", "plain"): V2,
    ("diff_v2", "alibi", "eager", "plain"): EAGER,
    ("diff_v2", "alibi", "sdpa", "plain"): SDPA_ALIBI,
    ("diff_v2", "alibi", "alibi-flash", "plain"): ALIBI_PINNED,
    ("diff_v2", "alibi", "auto", "dropout"): V2_DROPOUT,
    ("diff_v2", "alibi", "auto", "bidirectional"): bidirectional(),
    ("diff_v2", "alibi", "auto", "bf16"): V2,
    ("dcmha", "rope", "auto", "plain"): DCMHA,
    ("dcmha", "rope", "eager", "plain"): EAGER,
    ("dcmha", "rope", "sdpa", "plain"): DCMHA,  # 'sdpa' runs as 'auto'
    ("dcmha", "rope", "auto", "dropout"): generic(C, "dcmha-fused", "dcmha-fused", "dcmha-decode+dcmha-step-weights"),
    ("dcmha", "rope", "auto", "bidirectional"): bidirectional(C, C),
    ("dcmha", "rope", "auto", "bf16"): DCMHA_BF16,
    ("dcmha", "alibi", "auto", "plain"): DCMHA,
    ("dcmha", "alibi", "eager", "plain"): EAGER,
    ("dcmha", "alibi", "sdpa", "plain"): DCMHA,
    ("dcmha", "alibi", "auto", "dropout"): generic(C, "dcmha-fused", "dcmha-fused", "dcmha-decode+dcmha-step-weights"),
    ("dcmha", "alibi", "auto", "bidirectional"): bidirectional(C, C),
    ("dcmha", "alibi", "auto", "bf16"): DCMHA_BF16,
}


def unbuilt(key: tuple[str, str, str, str], choice: dict[str, str]) -> dict[str, str]:
    """The choice where the fused C++ kernels cannot be built: DCMHA's chunked PyTorch path, and SDPA for the rest,
    with a linear bias and the causal flag in one call of its CPU kernel; the reference where a C++ kernel is named."""
    fallback = E if key[2] == "alibi-flash" else "sdpa-causal-bias" if key[1] == "alibi" else S

    def without_extension(scenario: str, kernel: str) -> str:
        if kernel in (S, E, C):
            return kernel
        if key[0] == "dcmha":
            return C
        return S if scenario == "step" else fallback  # a cached step's bias and mask are one additive mask

    return {scenario: without_extension(scenario, kernel) for scenario, kernel in choice.items()}


def test_the_table_covers_the_matrix():
    assert set(BUILT) == set(cases())


def test_each_call_runs_the_kernel_it_ran_before_the_records(monkeypatch):
    if not build.available():
        pytest.skip("the fused CPU kernels cannot be built here")
    monkeypatch.setattr(dcmha_compiled, "_compiled", lambda function: function)
    assert kernel_table(monkeypatch) == BUILT


def test_without_the_extension_each_call_runs_its_pytorch_path(monkeypatch):
    monkeypatch.setattr(build, "_loaded", False)  # as after a failed build
    monkeypatch.setattr(build, "_failure", "no compiler (simulated)")
    monkeypatch.setattr(dcmha_compiled, "_compiled", lambda function: function)
    assert kernel_table(monkeypatch) == {key: unbuilt(key, choice) for key, choice in BUILT.items()}


def test_compile_composition_keeps_the_chunked_path(monkeypatch):
    """The compiled composition is a PyTorch path: the fused C++ kernels leave it to the chunked kernel, though a
    cached step still forms its token's matrices in one fused call."""
    monkeypatch.setattr(dcmha_compiled, "_compiled", lambda function: function)
    cfg = dict(window_size=3, q_chunk_size=4, compile_composition=True)
    model = Transformer(
        ModelConfig(vocab_size=32, dim=32, n_layers=2, n_heads=4, max_seq_len=32, attention="dcmha",
                    attention_options=cfg)
    )  # fmt: skip
    expected = generic(C, C, C, "chunked+dcmha-step-weights+eager") if build.available() else DCMHA_PYTORCH
    assert observe(monkeypatch, model) == expected


class BuildAsked(Exception):
    pass


def never_build():
    raise BuildAsked("build.available() was called")


def meta_model(attention: str) -> Transformer:
    with torch.device("meta"):
        cfg = ModelConfig(vocab_size=32, dim=32, n_layers=2, n_heads=4, attention=attention, position="alibi")
        return Transformer(cfg).eval()


def blocks(model: Transformer, length: int, cache=None):
    """The hidden states of ``length`` new tokens through every block: the device part of a forward, which on the
    meta device skips the token-id checks that read values."""
    x = torch.zeros(2, length, model.config.dim, device="meta")
    out = model._blocks(x, model._context(2, length, cache, None), cache)
    if cache is not None:
        cache.length += length
    return out


@pytest.mark.parametrize("attention", MECHANISMS)
def test_a_forward_off_the_cpu_never_asks_for_the_cpu_extension(monkeypatch, attention):
    """Off the CPU (the meta device stands for CUDA here: only the device type is read; RoPE tables cannot be built
    there, so ALiBi) the C++ kernels cannot run,
    so nothing may build or load them: neither a fresh forward nor a prefill and a cached step."""
    monkeypatch.setattr(build, "available", never_build)
    model = meta_model(attention)
    with torch.no_grad():
        assert blocks(model, 6).device.type == "meta"
        cache = model.new_cache(2, 8)
        blocks(model, 5, cache)
        assert blocks(model, 1, cache).device.type == "meta"


# ---------------------------------------------------------------------------------------------------
# attn_backend names a kernel; the records and the dispatcher


def chain(**changes) -> list[str]:
    cfg = ModelConfig(vocab_size=32, dim=32, n_layers=1, n_heads=4, **changes)
    return [kernel.name for kernel in cfg.kernel_chain]


def test_each_mechanism_declares_its_kernels_in_order_and_the_reference_follows():
    assert chain() == ["sdpa", "eager"]
    assert chain(attention="diff") == ["diff-flash", "diff-decode", "sdpa", "eager"]
    assert chain(attention="dcmha") == ["dcmha-triton", "dcmha-fused", "dcmha-decode", "chunked", "eager"]
    assert chain(attn_backend="eager", attention="dcmha") == ["eager"]
    assert chain(attn_backend="chunked") == ["chunked"]  # the reference runs what it cannot serve, and says so
    # Static reasons drop a kernel once, for every call: bidirectional, the compiled composition.
    assert chain(attention="diff", causal=False) == ["sdpa", "eager"]
    compiled = {"compile_composition": True}
    assert chain(attention="dcmha", attention_options=compiled) == ["dcmha-triton", "chunked", "eager"]


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        (
            dict(attn_backend="diff-flash"),
            "attn_backend='diff-flash' is invalid: the kernel cannot run mha here: it serves diff only",
        ),
        (dict(attn_backend="dcmha-fused", attention="dcmha", causal=False), "the model is bidirectional"),
        (
            dict(attn_backend="dcmha-decode", attention="dcmha", attention_options={"compile_composition": True}),
            "compile_composition asks for the compiled PyTorch composition",
        ),
        (dict(attn_backend="dcmha-triton", attention="dcmha", attention_options={"static_proj": True}), "static_proj"),
        (dict(attn_backend="flash"), "choose one of ['auto', 'alibi-flash', 'chunked', 'dcmha-decode'"),
        (
            dict(attn_backend="alibi-flash"),
            "the kernel cannot run mha here: it computes a positional scheme's bias, "
            "and position='rope' does not bring it; use 'auto' or 'eager'",
        ),
        (
            dict(attn_backend="alibi-flash", position="alibi", attention="dcmha"),
            "it runs the calls of 'sdpa', which cannot: dcmha acts on the attention scores",
        ),
        (dict(attn_backend="alibi-flash", position="alibi", causal=False), "the model is bidirectional"),
    ],
)
def test_a_kernel_that_cannot_serve_the_config_is_refused_with_its_reason(changes, reason):
    with pytest.raises(ValueError, match=re.escape(reason)):
        ModelConfig(vocab_size=32, dim=32, n_layers=1, n_heads=4, **changes)


def test_alibis_kernel_goes_before_sdpa_with_auto_and_runs_alone_where_named():
    """With "auto" ALiBi's kernel is tried just before SDPA (after Diff's own); a kernel named runs alone: "sdpa" is
    SDPA without ALiBi's kernel, and "alibi-flash", which ``attn_backend`` lists, ALiBi's kernel without SDPA."""
    assert "alibi-flash" in attn_backends()
    assert chain(position="alibi") == ["alibi-flash", "sdpa", "eager"]
    diff = chain(position="alibi", attention="diff")
    assert diff[0] == "diff-flash" and diff[-3:] == ["alibi-flash", "sdpa", "eager"]
    assert chain(position="alibi", attention="dcmha") == chain(attention="dcmha")  # no SDPA: nothing to specialise
    assert chain(position="alibi", attn_backend="sdpa") == ["sdpa"]
    assert chain(position="alibi", attn_backend="alibi-flash") == ["alibi-flash"]
    assert chain(position="alibi", attention="diff", attn_backend="alibi-flash") == ["alibi-flash"]


@pytest.mark.parametrize("attention", ["mha", "diff"])
def test_alibi_flash_sdpa_and_the_eager_reference_agree(monkeypatch, attention):
    """The same weights on attn_backend "alibi-flash" (the fused kernel, the bias in its tiles), "sdpa" (the bias as a
    tensor beside the causal flag, never ALiBi's kernel) and "eager": a training forward's logits, and every
    parameter's gradient, within 1e-5 of the largest of the reference's (fp32, CPU, GQA; the kernels sum in other
    orders)."""
    if not build.available():
        pytest.skip(f"the fused CPU kernels cannot be built here: {build.status()}")
    cfg = ModelConfig(
        vocab_size=32, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, max_seq_len=48, attention=attention,
        position="alibi", attn_backend="alibi-flash",
    )  # fmt: skip
    fused = Transformer(cfg).train()
    idx = torch.randint(0, 32, (2, 40))
    fused_calls = CallCounter(monkeypatch, alibi_flash, "alibi_flash_attention")

    def logits_and_grads(model: Transformer) -> list[torch.Tensor]:
        logits = model(idx)
        logits.square().mean().backward()
        return [logits.detach(), *(p.grad for p in model.parameters())]

    results = {}
    for backend in ("alibi-flash", "sdpa", "eager"):
        model = fused if backend == "alibi-flash" else on_backend(fused, backend)
        fused_calls.calls = 0
        results[backend] = logits_and_grads(model)
        assert (fused_calls.calls >= cfg.n_layers) if backend == "alibi-flash" else fused_calls.calls == 0
        assert model.attention_kernels(idx) == [backend] * cfg.n_layers
    for backend in ("alibi-flash", "sdpa"):
        for actual, expected in zip(results[backend], results["eager"], strict=True):
            torch.testing.assert_close(actual, expected, rtol=0, atol=1e-5 * max(1.0, expected.abs().max().item()))


def test_alibi_flash_named_without_the_extension_is_refused_before_training(tmp_path, capsys, monkeypatch):
    """Where the C++ kernels cannot be built, ALiBi's kernel serves no call: a run naming it is refused with that
    reason before anything is written (with "auto" SDPA would run it)."""
    monkeypatch.setattr(build, "_loaded", False)  # as after a failed build
    monkeypatch.setattr(build, "_failure", "no compiler (simulated)")
    run = tmp_path / "run"
    text = write_text_corpus(tmp_path / "text.txt")
    flags = ["--position", "alibi", "--attn-backend", "alibi-flash", "--steps", "1"]
    assert main(["train", "--data", str(text), "--out", str(run), *TINY_FLAGS, *flags]) == 1
    said = capsys.readouterr().err
    assert "attn_backend='alibi-flash'" in said and "the fused CPU kernels are unavailable (no compiler" in said
    assert not (run / "run.json").exists()


def test_a_named_kernels_fallback_while_compiling_leaves_the_told_record_alone():
    """While torch.compile traces, a pinned kernel's fallback is neither said nor recorded: the record of what was
    told is not touched (a graph would break on it), and an eager call afterwards still says it once."""
    model = Transformer(ModelConfig(vocab_size=32, dim=32, n_layers=1, n_heads=4, attn_backend="chunked"))
    layer = model.layers[0].self_attn
    maps = dataclasses.replace(Call.planned(model.config, model.position), records_scores=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        dispatch._tell_fallback(layer, dataclasses.replace(maps, compiling=True))
    assert layer not in dispatch._FALLBACKS_TOLD
    with pytest.warns(RuntimeWarning, match="attn_backend='chunked' cannot serve a call of layer 0"):
        dispatch._tell_fallback(layer, maps)
    assert dispatch._FALLBACKS_TOLD[layer] == {("chunked", "attention maps or logits are recorded: only the eager "
                                                           "reference returns them")}  # fmt: skip


def test_auto_falls_back_in_the_declared_order(monkeypatch):
    """Diff in training with dropout: diff-flash refuses the call (dropout), SDPA runs it; with maps recorded both
    refuse and the reference runs. Off the CPU DCMHA's C++ kernels refuse before asking for the extension."""
    model = Transformer(ModelConfig(vocab_size=32, dim=32, n_layers=2, n_heads=4, attention="diff", dropout=0.1))
    idx = torch.randint(0, 32, (2, 8))
    assert model.train().attention_kernels(idx) == ["sdpa", "sdpa"]
    if build.available():
        assert model.eval().attention_kernels(idx) == ["diff-flash", "diff-flash"]
    dcmha = meta_model("dcmha")
    layer, call = dcmha.layers[0].self_attn, Call.planned(dcmha.config, dcmha.position)
    monkeypatch.setattr(build, "available", never_build)
    off_the_cpu = dataclasses.replace(call, device_type="cuda", build=True)
    assert choose(layer, off_the_cpu).name == "chunked"
    assert [kernel.call_refusal(layer, off_the_cpu) for kernel in layer.kernel_chain[1:3]] == [
        "the tensors are not on the CPU"
    ] * 2


def test_a_pinned_kernel_runs_where_it_serves_the_call_and_the_reference_elsewhere():
    model = Transformer(ModelConfig(vocab_size=32, dim=32, n_layers=2, n_heads=4, attn_backend="chunked")).eval()
    reference = Transformer(dataclasses.replace(model.config, attn_backend="eager")).eval()
    reference.load_state_dict(model.state_dict())
    idx = torch.randint(0, 32, (2, 9))
    assert model.attention_kernels(idx) == ["chunked", "chunked"]
    with torch.no_grad():
        torch.testing.assert_close(model(idx), reference(idx), atol=1e-5, rtol=0)
    maps: list = []
    with torch.no_grad():
        model._hidden(idx, None, maps=maps, kernels=(recorded := {}))
    assert recorded == {0: "eager", 1: "eager"} and len(maps) == 2


@pytest.mark.parametrize(
    ("backend", "reason"),
    [("dcmha-triton", "the kernel runs on CUDA, with Triton installed"), ("dcmha-decode", "do not continue a cache")],
)
def test_a_named_kernel_that_cannot_serve_the_training_steps_is_refused_before_training(
    tmp_path, capsys, backend, reason
):
    """On the CPU the Triton kernel serves no call, and the decoding kernel serves no training step: each would have
    left every step to the eager reference. The run is refused with the kernel's reason before anything is written."""
    run = tmp_path / "run"
    text = write_text_corpus(tmp_path / "text.txt")
    flags = ["--attention", "dcmha", "--attn-backend", backend, "--steps", "1"]
    assert main(["train", "--data", str(text), "--out", str(run), *TINY_FLAGS, *flags]) == 1
    said = capsys.readouterr().err
    assert f"attn_backend={backend!r}" in said and reason in said and "'auto'" in said
    assert not (run / "run.json").exists() and not (run / "checkpoints").exists()


def test_a_named_kernel_that_serves_the_training_steps_trains_on_it(tmp_path):
    run = tmp_path / "run"
    text = write_text_corpus(tmp_path / "text.txt")
    flags = ["--attn-backend", "chunked", "--steps", "1", "--eval-interval", "1"]
    assert main(["train", "--data", str(text), "--out", str(run), *TINY_FLAGS, *flags]) == 0
    assert json.loads((run / "run.json").read_text())["attention_kernels"] == ["chunked", "chunked"]


def test_a_named_kernel_that_cannot_serve_a_call_says_once_per_layer_that_the_reference_ran_it():
    """Only a call tells that maps are recorded, which only the eager reference returns: a named kernel's fallback is
    said, once per layer and reason however many calls fall back; "auto" falls back in silence, as it is meant to."""
    cfg = ModelConfig(vocab_size=32, dim=32, n_layers=2, n_heads=4, attn_backend="chunked")
    idx = torch.randint(0, 32, (2, 9))
    model = Transformer(cfg)
    with warnings.catch_warnings(record=True) as told:
        warnings.simplefilter("always")
        model.attention_maps(idx)
        model.attention_maps(idx)
        Transformer(dataclasses.replace(cfg, attn_backend="auto")).attention_maps(idx)
    messages = [str(warning.message) for warning in told if warning.category is RuntimeWarning]
    assert messages == [
        f"attn_backend='chunked' cannot serve a call of layer {layer} (attention maps or logits are recorded: only "
        "the eager reference returns them); the eager reference runs it"
        for layer in (0, 1)
    ]


@pytest.mark.parametrize(("attention", "position"), [("mha", "alibi"), ("diff", "rope"), ("dcmha", "rope")])
def test_info_names_the_kernel_a_training_forward_runs(attention, position):
    """``attnzoo info`` plans the call on a meta model, building nothing; a CPU fp32 training forward runs it."""
    from attnzoo.cli import info

    cfg = ModelConfig(vocab_size=32, dim=32, n_layers=2, n_heads=4, attention=attention, position=position)
    ran = Transformer(cfg).train().attention_kernels(torch.randint(0, 32, (2, 12)))
    with torch.device("meta"):
        described = info.cpu_kernels(Transformer(cfg))
    assert len(set(ran)) == 1 and len(described) == 1
    assert described[0].startswith(f"{ran[0]}: ")


@pytest.mark.parametrize(("attention", "position"), [("diff", "alibi"), ("dcmha", "rope")])
def test_info_names_the_kernel_a_run_records(tmp_path, capsys, attention, position):
    """A tiny CPU run records each layer's kernel in run.json, the kernel its training forward runs; ``attnzoo info``
    of the run names the same one."""
    run = tmp_path / "run"
    text = write_text_corpus(tmp_path / "text.txt")
    flags = ["--attention", attention, "--position", position, "--steps", "1", "--eval-interval", "1"]
    assert main(["train", "--data", str(text), "--out", str(run), *TINY_FLAGS, *flags]) == 0
    recorded = json.loads((run / "run.json").read_text())["attention_kernels"]
    model = Transformer.from_pretrained(read_checkpoint(run).directory)
    assert model.train().attention_kernels(torch.randint(0, 256, (2, 32))) == recorded
    capsys.readouterr()
    assert main(["info", str(run)]) == 0
    named = re.search(r"attention kernel \(CPU, fp32 training\)\n  ([\w-]+): ", capsys.readouterr().out)
    assert named is not None and recorded == [named[1]] * model.config.n_layers


@pytest.mark.parametrize("n_kv_heads", [4, 2, 1], ids=["mha", "gqa", "mqa"])
@pytest.mark.parametrize("position", POSITION_NAMES)
@pytest.mark.parametrize("attention", ATTENTION.names())
def test_every_mechanism_runs_through_the_dispatcher_and_equals_the_eager_reference(attention, position, n_kv_heads):
    """Whatever kernels the dispatcher picks for each call (fused, SDPA, chunked), a training forward, and a prefill
    with cached steps, equal the eager reference to 1e-5 of the largest logit (fp32, the CPU)."""
    options = {"window_size": 3, "q_chunk_size": 4} if attention == "dcmha" else {}
    cfg = ModelConfig(
        vocab_size=32,
        dim=32,
        n_layers=2,
        n_heads=4,
        n_kv_heads=n_kv_heads,
        max_seq_len=32,
        attention=attention,
        attention_options=options,
        position=position,
    )
    model = Transformer(cfg).eval()
    reference = on_backend(model, "eager")
    idx = torch.randint(0, 32, (2, 12))
    with torch.no_grad():
        full, expected = model(idx), reference(idx)
        atol = 1e-5 * expected.abs().max().item()
        torch.testing.assert_close(full, expected, rtol=0, atol=atol)
        cache = model.new_cache(2, 12)
        pieces = [model(idx[:, :7], cache=cache)] + [model(idx[:, t : t + 1], cache=cache) for t in range(7, 12)]
    torch.testing.assert_close(torch.cat(pieces, dim=1), expected, rtol=0, atol=atol)
