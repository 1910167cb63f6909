"""The attention kernels (``attention/kernels/``): the eager reference's hooks, the chunked and SDPA forms
against it, the backend choice ``attend`` makes, and the seams around it (cache, options, validation).

All comparisons are in fp32; each tolerance is stated where it is asserted.
"""

import ast
import dataclasses
import inspect
import math
import pathlib

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

import attnzoo
from attnzoo import ModelConfig, Transformer
from attnzoo.attention import ATTENTION, AttentionContext
from attnzoo.attention.kernels import (
    KERNELS,
    Hooks,
    alibi_flash,
    build,
    chunked,
    chunked_attention,
    dcmha_fused,
    diff_flash,
    diff_v2_flash,
    eager,
    eager_attention,
    sdpa,
    sdpa_attention,
)
from attnzoo.cache import WindowCache
from attnzoo.positions import POSITIONS, alibi_slopes

B, H, H_KV, T, D = 2, 4, 2, 7, 8
SRC = pathlib.Path(attnzoo.__file__).parent


def context(position="alibi", length=T, start=0, maps=None) -> AttentionContext:
    cfg = ModelConfig(vocab_size=8, dim=H * D, n_heads=H, n_layers=1, position=position)
    scheme = POSITIONS.get(position)(cfg, D)
    positions = torch.arange(start, start + length)
    return AttentionContext(positions, start, scheme, scheme.prepare(positions, start + length), maps)


def qkv(query_len=T, key_len=T, value_dim=D):
    return (
        torch.randn(B, H, query_len, D),
        torch.randn(B, H_KV, key_len, D),
        torch.randn(B, H_KV, key_len, value_dim),
    )


def reference(q, k, v, *, start=0, scores=None, probs=None, allowed=None, row_scale=None, window=None):
    """The eager kernel written out per head: GQA by repeat_interleave, the ALiBi bias, a causal mask."""
    k, v = k.repeat_interleave(H // H_KV, dim=1), v.repeat_interleave(H // H_KV, dim=1)
    logits = q @ k.transpose(-1, -2) / math.sqrt(D)
    if row_scale is not None:
        logits = logits * row_scale[..., None]
    t = torch.arange(start, start + q.shape[2])[:, None]
    s = torch.arange(k.shape[2])[None, :]
    logits = logits - torch.tensor(alibi_slopes(H))[:, None, None] * (t - s)
    if scores is not None:
        logits = scores(logits)
    if allowed is None:
        allowed = (s <= t) if window is None else (s <= t) & (t - s < window)
    p = logits.masked_fill(~allowed, -torch.inf).softmax(-1)
    if probs is not None:
        p = probs(p)
    return p @ v, p


# ---------------------------------------------------------------------------------------------------
# The eager reference and its hooks


def test_score_hook_acts_on_biased_logits_before_the_mask():
    q, k, v = qkv()
    hook = lambda logits: logits.flip(1) * 1.5 + 0.25  # noqa: E731  (mixes heads: the order of steps matters)
    out, probs = eager_attention(q, k, v, context(), hooks=Hooks(scores=hook))
    expected_out, expected_probs = reference(q, k, v, scores=hook)
    torch.testing.assert_close(out, expected_out, atol=1e-6, rtol=0)
    torch.testing.assert_close(probs, expected_probs, atol=1e-6, rtol=0)
    assert (out - eager_attention(q, k, v, context())[0]).abs().max() > 1e-2  # the hook changed something


def test_probability_hook_weighs_the_values_and_is_what_is_returned():
    q, k, v = qkv()
    hook = lambda p: p - 0.5 * p.roll(1, dims=1)  # noqa: E731  (a differential-style mix of heads)
    out, probs = eager_attention(q, k, v, context(), hooks=Hooks(probs=hook))
    expected_out, expected_probs = reference(q, k, v, probs=hook)
    torch.testing.assert_close(out, expected_out, atol=1e-6, rtol=0)
    torch.testing.assert_close(probs, expected_probs, atol=1e-6, rtol=0)
    assert probs.sum(-1).sub(1).abs().max() > 0.1  # the returned map is the hooked one, not the softmax


def test_mask_override_replaces_the_causal_mask():
    q, k, v = qkv()
    diagonal = torch.eye(T, dtype=torch.bool)
    out, _ = eager_attention(q, k, v, context(), hooks=Hooks(mask=diagonal))
    # Each query sees only its own key, so it returns that key's value exactly.
    torch.testing.assert_close(out, v.repeat_interleave(H // H_KV, dim=1), atol=1e-6, rtol=0)
    everything = torch.ones(T, T, dtype=torch.bool)  # not causal: the future is visible
    out, _ = eager_attention(q, k, v, context(), hooks=Hooks(mask=everything))
    torch.testing.assert_close(out, reference(q, k, v, allowed=everything)[0], atol=1e-6, rtol=0)


def test_window_and_query_scale():
    q, k, v = qkv()
    tau = torch.rand(B, H, T) + 0.5
    out, _ = eager_attention(q, k, v, context(), query_scale=tau, window=3)
    expected, _ = reference(q, k, v, row_scale=tau, window=3)
    torch.testing.assert_close(out, expected, atol=1e-6, rtol=0)


@pytest.mark.parametrize("start", [0, 5])
def test_sdpa_expresses_the_row_scale_exactly(start):
    """SDPA folds query_scale into q; it equals the eager row scale before the bias (fp32, ≤ 1e-5)."""
    q, k, v = qkv(key_len=start + T)
    tau = torch.rand(B, H, T) + 0.5
    ctx = context(start=start)
    expected, _ = reference(q, k, v, start=start, row_scale=tau)
    torch.testing.assert_close(eager_attention(q, k, v, ctx, query_scale=tau)[0], expected, atol=1e-6, rtol=0)
    torch.testing.assert_close(sdpa_attention(q, k, v, ctx, query_scale=tau), expected, atol=1e-5, rtol=0)


@pytest.mark.parametrize("length", [7, 300])  # 300: several of the flash kernel's query and key blocks
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_alibi_with_the_causal_flag_equals_the_masked_form(monkeypatch, length, dtype):
    """On CPU a fresh ALiBi sequence passes the bias with the causal flag (``sdpa_with_causal_bias``): equal to
    SDPA with the one additive mask, in output and in the gradients to q, k and v (GQA, 2 kv heads). This is SDPA's
    path for the calls the fused ALiBi kernel does not serve (tests/test_alibi_flash.py)."""
    spy = KernelSpy(monkeypatch)
    ctx = context(length=length)
    leaves = [x.to(dtype).requires_grad_() for x in qkv(length, length)]
    twins = [x.detach().clone().requires_grad_() for x in leaves]
    out = sdpa_attention(*leaves, ctx)
    assert spy.calls["sdpa"] == 1 and sdpa.sdpa_takes_bias_with_causal(*leaves, 0.0)
    k, v = (eager.repeat_kv(x, H // H_KV) for x in twins[1:])
    masked = F.scaled_dot_product_attention(twins[0], k, v, attn_mask=ctx.sdpa_mask(H, length, 1, dtype))
    # fp32: the same sums in other blocks (≤ 1e-5); bf16: the kernels round their partial sums differently.
    atol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(out, masked, atol=atol, rtol=0)
    grad = torch.randn_like(out)
    grads = torch.autograd.grad(out, leaves, grad), torch.autograd.grad(masked, twins, grad)
    for leaf_grad, twin_grad in zip(*grads, strict=True):
        torch.testing.assert_close(leaf_grad, twin_grad, atol=10 * atol, rtol=0)
    if dtype == torch.float32:
        torch.testing.assert_close(out, reference(*(x.detach() for x in leaves))[0], atol=1e-5, rtol=0)


class LargestTensor(TorchDispatchMode):
    """The most elements of any tensor an operator returns while the mode is active."""

    def __init__(self):
        super().__init__()
        self.numel = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for tensor in torch.utils._pytree.tree_leaves(out):
            if isinstance(tensor, torch.Tensor):
                self.numel = max(self.numel, tensor.numel())
        return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_alibi_inference_in_query_blocks_equals_one_call_without_a_t_by_t_bias(monkeypatch, dtype):
    """Without autograd recording, a fresh ALiBi sequence longer than BIAS_BLOCK_ROWS runs in query blocks, each with
    its own bias and causal mask: equal to the one call with the whole bias (what training runs), and no tensor as
    large as the (H, T, T) bias is made (GQA, 2 kv heads; the last block shorter than the others). This is SDPA's
    path for the calls the fused ALiBi kernel does not serve (tests/test_alibi_flash.py)."""
    monkeypatch.setattr(sdpa, "BIAS_BLOCK_ROWS", 64)
    length = 3 * 64 + 37
    q, k, v = (x.to(dtype) for x in qkv(length, length))
    with torch.no_grad(), LargestTensor() as largest:
        blocks = sdpa_attention(q, k, v, context(length=length))
    assert largest.numel < H * length * length
    leaves = [x.detach().requires_grad_() for x in (q, k, v)]  # recording: the one call with the whole bias
    whole = sdpa_attention(*leaves, context(length=length))
    assert whole.requires_grad
    # The same keys, bias and block order for every row: fp32 agrees to rounding; bf16 to its own rounding of the
    # probabilities, which the masked and the causal kernels do in different places.
    atol = 1e-6 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(blocks, whole.detach(), atol=atol, rtol=0)
    if dtype == torch.float32:
        torch.testing.assert_close(blocks, reference(q, k, v)[0], atol=1e-5, rtol=0)


@pytest.mark.cuda
def test_alibi_on_cuda_keeps_the_additive_mask():
    """The bias-with-causal kernel is CPU's: on CUDA SDPA gets the one additive mask and equals the reference."""
    ctx = context(length=64)
    q, k, v = (x.cuda() for x in qkv(64, 64))
    ctx.positions = ctx.positions.cuda()
    assert not sdpa.sdpa_takes_bias_with_causal(q, k, v, 0.0)
    expected = reference(*(x.cpu() for x in (q, k, v)))[0]
    torch.testing.assert_close(sdpa_attention(q, k, v, ctx).cpu(), expected, atol=1e-4, rtol=0)


@pytest.mark.parametrize("pad", [True, False])
def test_sdpa_with_values_wider_than_queries(monkeypatch, pad):
    monkeypatch.setattr(sdpa, "sdpa_pads_queries", lambda device: pad)
    q, k, v = qkv(value_dim=2 * D)
    torch.testing.assert_close(sdpa_attention(q, k, v, context()), reference(q, k, v)[0], atol=1e-5, rtol=0)


# ---------------------------------------------------------------------------------------------------
# The chunked form equals the full eager kernel


def block_hooks(length):
    """Hooks that depend on the block: a per-(t, s) term on the scores and a per-row factor on the probs."""
    extra, factor = torch.randn(length, length), torch.rand(length) + 0.5

    def hooks(rows, cols, inputs):
        return Hooks(scores=lambda s: s + extra[rows, cols], probs=lambda p: p * factor[rows, None])

    return hooks


@pytest.mark.parametrize("window", [None, 3])
def test_chunked_equals_eager(window):
    length = 11  # 3 blocks of 4 and a partial one
    q, k, v = qkv(length, length)
    ctx, hooks = context(length=length), block_hooks(length)
    full, _ = eager_attention(q, k, v, ctx, hooks=hooks(slice(None), slice(None), ()), window=window)
    seen = []

    def spy(rows, cols, inputs):
        seen.append((rows, cols))
        return hooks(rows, cols, inputs)

    chunked = chunked_attention(q, k, v, ctx, hooks=spy, chunk=4, window=window)
    torch.testing.assert_close(chunked, full, atol=1e-6, rtol=0)
    # Each block reads only the keys it can see: its causal range, or its window.
    first_key = (lambda row: 0) if window is None else (lambda row: max(0, row - window + 1))
    # Blocks run from the last to the first (see chunked_attention).
    assert seen == [(slice(r, min(r + 4, length)), slice(first_key(r), min(r + 4, length))) for r in (8, 4, 0)]


def test_recomputed_block_replays_dropout_and_gives_each_input_its_gradient():
    """The block runs again in the backward pass with the same dropout mask; inputs that need no gradient (or are
    None) get None."""
    x, weight, fixed = torch.randn(6, 5, requires_grad=True), torch.randn(5, requires_grad=True), torch.randn(5)

    def run(x, weight, fixed, absent):
        return F.dropout(x * weight + fixed, p=0.5).pow(2)

    grad = torch.randn(6, 5)
    torch.manual_seed(0)
    out = chunked.RecomputedBlock.apply(run, True, x, weight, fixed, None)
    torch.rand(100)  # the generator moves on before the backward pass, which must replay the first draw
    grads = torch.autograd.grad(out, (x, weight), grad)
    torch.manual_seed(0)
    expected = run(x, weight, fixed, None)
    torch.testing.assert_close(out, expected, atol=0, rtol=0)
    for got, want in zip(grads, torch.autograd.grad(expected, (x, weight), grad), strict=True):
        torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-6)
    assert (out == 0).any()  # dropout did drop something: the replay matters


def test_chunked_keys_at_explicit_positions_are_masked_by_position():
    """A ring cache hands keys over in slot order with their positions: the same attention as in order."""
    start, length, window = 6, 3, 4
    q, k, v = qkv(length, start + length)
    ctx = context(length=length, start=start)
    order = torch.randperm(start + length)
    expected, _ = reference(q, k, v, start=start, window=window)
    out, _ = chunked.chunked_call(q, k[:, :, order], v[:, :, order], ctx, window=window, key_positions=order, chunk=2)
    torch.testing.assert_close(out, expected, atol=1e-6, rtol=0)


# ---------------------------------------------------------------------------------------------------
# The backend choice


class KernelSpy:
    """Counts the kernels attend reaches: SDPA itself (the torch function, its CPU kernel called directly with a
    bias and the causal flag, or on CPU the fused ALiBi kernel that replaces both), the chunked form and eager
    calls, and DCMHA's, Diff's and DIFF V2's fused CPU kernels, which their layers call in attend's place."""

    def __init__(self, monkeypatch):
        self.calls = {"sdpa": 0, "chunked": 0, "fused": 0, "eager": 0}
        for name, module, attr in (
            ("sdpa", F, "scaled_dot_product_attention"),
            ("sdpa", sdpa, "sdpa_with_causal_bias"),
            ("sdpa", alibi_flash, "alibi_flash_attention"),
            ("chunked", chunked, "chunked_attention"),
            ("fused", dcmha_fused, "dcmha_attention"),
            ("fused", diff_flash, "diff_attention"),
            ("fused", diff_v2_flash, "diff_v2_attention"),
            ("eager", eager, "eager_attention"),
            ("eager", chunked, "eager_attention"),
        ):
            monkeypatch.setattr(module, attr, self.counting(name, getattr(module, attr)))

    def counting(self, name, fn):
        def wrapper(*args, **kwargs):
            self.calls[name] += 1
            return fn(*args, **kwargs)

        return wrapper

    def used(self) -> set[str]:
        return {name for name, count in self.calls.items() if count}


MECHANISMS = ATTENTION.names()  # plugins included: a mechanism added later is tested, not skipped
FUSED_KERNELS = {"diff-flash", "diff-v2-flash", "dcmha-fused"}  # the C++ kernels KernelSpy counts as "fused"


def documented_kernels(attention: str, backend: str) -> set[str]:
    """What the ModelConfig docstring and the README promise for each backend: "eager" runs the reference, "sdpa"
    SDPA; "auto" runs a mechanism's fused C++ kernel where it names one and a compiler is present, else SDPA, or the
    chunked form (which runs the eager kernel per block) for a mechanism that acts on the scores."""
    mechanism = ATTENTION.get(attention)
    if backend == "eager":
        return {"eager"}
    if backend == "auto" and FUSED_KERNELS & set(mechanism.kernels) and build.available():
        return {"fused"}
    return {"chunked", "eager"} if mechanism.needs_scores else {"sdpa"}


def tiny_model(attention, backend):
    options = {"window_size": 3, "q_chunk_size": 4} if attention == "dcmha" else {}
    cfg = ModelConfig(
        vocab_size=32,
        dim=32,
        n_layers=2,
        n_heads=4,
        n_kv_heads=2,
        attention=attention,
        attention_options=options,
        position="alibi",
        attn_backend=backend,
    )
    return Transformer(cfg).eval()


@pytest.mark.parametrize("backend", ["eager", "sdpa", "auto"])
@pytest.mark.parametrize("attention", MECHANISMS)
def test_backend_picks_the_documented_kernel(monkeypatch, attention, backend):
    if backend == "sdpa" and ATTENTION.get(attention).needs_scores:
        # Deprecated, no longer refused at once: it runs as 'auto', and a saved config of it still loads.
        deprecated = rf"attn_backend='sdpa' with {attention}, .* deprecated .* from attnzoo 0.2"
        with pytest.warns(FutureWarning, match=deprecated):
            model = tiny_model(attention, backend)
        assert model.config.attn_backend == "auto"
        backend = "auto"
    else:
        model = tiny_model(attention, backend)
    idx = torch.randint(0, 32, (2, 10))
    spy = KernelSpy(monkeypatch)
    with torch.no_grad():
        model(idx)
    assert spy.used() == documented_kernels(attention, backend)

    # Recording maps always takes the eager reference over the full scores: one map per layer.
    spy.calls = dict.fromkeys(spy.calls, 0)
    maps = model.attention_maps(idx)
    assert spy.used() == {"eager"} and len(maps) == 2 and maps[0].shape == (2, 4, 10, 10)


def test_auto_and_sdpa_agree_where_both_apply():
    """With RoPE "auto" runs SDPA, bit for bit; with ALiBi it runs ALiBi's fused kernel where built, and "sdpa" SDPA
    alone (the bias as a tensor), within 1e-5 of the largest logit (fp32: the kernels sum in other orders)."""
    alibi = tiny_model("selective", "sdpa")
    idx = torch.randint(0, 32, (2, 10))
    for position in ("rope", "alibi"):
        sdpa = Transformer(dataclasses.replace(alibi.config, position=position)).eval()
        sdpa.load_state_dict(alibi.state_dict())
        auto = Transformer(dataclasses.replace(sdpa.config, attn_backend="auto")).eval()
        auto.load_state_dict(sdpa.state_dict())
        expected = sdpa(idx)
        if position == "rope":
            assert torch.equal(auto(idx), expected)
        else:
            torch.testing.assert_close(auto(idx), expected, rtol=0, atol=1e-5 * expected.abs().max().item())


def test_the_sdpa_kernel_refuses_a_mechanism_that_acts_on_the_scores():
    """SDPA cannot run score hooks: its record refuses DCMHA for every call, so 'auto' never offers it."""
    cfg = ModelConfig(attention="dcmha")
    assert KERNELS.get("sdpa").static_refusal(cfg) == "dcmha acts on the attention scores, which SDPA does not expose"
    assert "sdpa" not in [kernel.name for kernel in cfg.kernel_chain]


def test_old_configs_keep_loading():
    for backend in ("auto", "eager", "sdpa"):
        text = ModelConfig(attn_backend=backend).to_json()
        assert ModelConfig.from_json(text).attn_backend == backend
    dcmha = ModelConfig(attention="dcmha").to_json().replace('"auto"', '"sdpa"')
    with pytest.warns(FutureWarning, match="set attn_backend='auto' or 'eager'"):  # deprecated: loads, as 'auto'
        assert ModelConfig.from_json(dcmha).attn_backend == "auto"


KERNEL_ENTRY_POINTS = (
    "diff_attention(",
    "dcmha_attention(",
    "decode_attention(",
    "fused_attention(",
    "sdpa_attention(",
)


@pytest.mark.parametrize("name", ATTENTION.names())
def test_no_mechanism_picks_a_kernel(name):
    """Mechanisms call attend and never choose a kernel themselves (the behaviour is tested above and in
    tests/test_kernel_choice.py): no mechanism's module reads the backend or calls a kernel's entry point, and no
    kernel hangs on a module switch."""
    source = pathlib.Path(inspect.getfile(ATTENTION.get(name))).read_text()
    assert "backend" not in source and "use_eager" not in source, name
    assert not any(call in source for call in KERNEL_ENTRY_POINTS), name
    assert not any("USE_KERNEL" in path.read_text() for path in SRC.rglob("*.py"))


# ---------------------------------------------------------------------------------------------------
# The seams: the window cache, typed mechanisms, the validation leaf


def test_window_cache_lives_in_cache_and_keeps_a_ring_of_the_window():
    assert WindowCache.__module__ == "attnzoo.cache"
    values = torch.arange(10.0).view(1, 1, 10, 1)  # the value stored at position p is p
    cache = WindowCache(3, k=torch.zeros(1, 1, 3, 1))

    def extend(start, stop):
        positions, entries = cache.extend(context("none", stop - start, start), k=values[:, :, start:stop])
        assert torch.equal(entries.flatten(), positions.float())  # every entry is its position's
        return positions.tolist()

    assert extend(0, 2) == [0, 1]
    assert extend(2, 3) == [0, 1, 2]
    assert extend(3, 4) == [3, 1, 2]  # slot order: position 3 overwrote position 0
    assert extend(4, 9) == [2, 3, 4, 5, 6, 7, 8]  # longer than the ring: the window of its first query too
    assert cache.buffers["k"].flatten().tolist() == [6, 7, 8]


OVERRIDES = (
    "__init__",
    "forward",
    "new_layer_cache",
    "validate_config",
    "paired_overrides",
    "qk_head_dim",
    "reset_mechanism_parameters",
    "init_added_parameters_as_identity",
)


@pytest.mark.parametrize("name", MECHANISMS)
def test_mechanism_overrides_are_annotated_and_options_typed(name):
    cls = ATTENTION.get(name)
    for method in OVERRIDES:
        if method not in vars(cls):
            continue
        signature = inspect.signature(inspect.unwrap(getattr(cls, method)))
        unannotated = [p for p in signature.parameters.values() if p.annotation is inspect.Parameter.empty]
        assert [p.name for p in unannotated] in ([], ["self"], ["cls"]), f"{name}.{method}"
        assert signature.return_annotation is not inspect.Signature.empty, f"{name}.{method}"
    layer = cls(ModelConfig(attention=name), 0)
    assert isinstance(layer.options, cls.Options)


def test_dcmha_inherits_mhas_projections():
    mha, dcmha = ATTENTION.get("mha"), ATTENTION.get("dcmha")
    assert issubclass(dcmha, mha)
    assert "_project" not in vars(dcmha)
    layer = dcmha(ModelConfig(attention="dcmha"), 0)
    mha_names = set(mha(ModelConfig(), 0).state_dict())
    assert mha_names < set(layer.state_dict())


def imports_of(path: pathlib.Path) -> list[tuple[str, list[str]]]:
    return [
        (node.module or "", [alias.name for alias in node.names])
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ImportFrom)
    ] + [
        (alias.name, [])
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Import)
        for alias in node.names
    ]


def test_validation_is_a_leaf_and_the_only_source_of_its_helpers():
    assert all(not module.startswith("attnzoo") for module, _ in imports_of(SRC / "validation.py"))
    helpers = {"require", "is_int", "is_number"}
    tests = pathlib.Path(__file__).parent
    for path in [*SRC.rglob("*.py"), *tests.rglob("*.py")]:
        for module, names in imports_of(path):
            assert not (module == "attnzoo.config" and helpers & set(names)), path
