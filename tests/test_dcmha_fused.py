"""The fused DCMHA CPU kernels (``attention/kernels/dcmha_fused.py``, ``csrc/dcmha_fused.cpp``) against the eager
reference.

The reference is the eager DCMHA attention in float64 (``dcmha_cases.reference``: full (B, N, T, S) scores composed
with the merged per-token matrices). Each output and gradient (q, k, v and every mixing weight) must agree to a
tolerance relative to that tensor's largest entry: fp32 2e-5 (the kernel computes in fp32: about 1e-6 is seen) and
bf16 2e-2 (operands rounded to bf16 on input and output; the math is fp32).
"""

import dataclasses

import pytest
import torch
from conftest import tiny_config
from dcmha_cases import CASES, Case, RecordShapes, make_inputs, reference, split
from kernel_checks import CallCounter, assert_close, on_backend

from attnzoo import Transformer
from attnzoo.attention.dcmha import key_matrices, query_matrices
from attnzoo.attention.kernels import Call, alibi_flash, build, choose, dcmha_fused
from attnzoo.bench import sdpa_kernels
from attnzoo.cli import main
from attnzoo.positions.alibi import alibi_slopes

TOLERANCE = {torch.float32: 2e-5, torch.bfloat16: 2e-2}

pytestmark = pytest.mark.skipif(not build.available(), reason="the fused CPU kernels cannot be built here")

CPU_CASES = {
    **CASES,
    "alibi": Case(window=None, length=45, position="alibi"),
    "mqa-two-groups": Case(batch=2, n_heads=4, n_kv_heads=1, groups=2, length=40),
    "one-token": Case(window=None, length=1),
    "window-wider-than-a-tile": Case(window=24, length=70),
    # 3 groups of 2 heads over 2 kv heads of 3 query heads each: the middle group reads both kv heads.
    "groups-straddling-kv-heads": Case(n_heads=6, n_kv_heads=2, groups=3, length=33),
}


def fused(leaves: list[torch.Tensor], case: Case, slopes: torch.Tensor | None = None) -> torch.Tensor:
    q, k, v, pre, post = split(leaves, case)
    matrices = []
    for mixing in (pre, post):
        if mixing is None:
            matrices += [None, None]
        else:
            matrices += [query_matrices(mixing, None), None if mixing.kw1 is None else key_matrices(mixing)]
    return dcmha_fused.dcmha_attention(q, k, v, matrices, slopes=slopes, groups=case.groups, window=case.window)


def official_slopes(case: Case) -> torch.Tensor | None:
    return torch.tensor(alibi_slopes(case.n_heads)) if case.position == "alibi" else None


def assert_matches_reference(case: Case, dtype: torch.dtype, rows: int | None = None) -> None:
    torch.manual_seed(0)
    leaves = make_inputs(case, dtype)
    slopes = official_slopes(case)
    out = fused(leaves, case, slopes)
    assert out.dtype == dtype and out.shape == leaves[0].shape
    grad_out = torch.randn(out.shape).to(dtype)
    grads = torch.autograd.grad(out, leaves, grad_out)

    ref_leaves = [x.detach().double().requires_grad_() for x in leaves]
    expected = reference(ref_leaves, case)
    expected_grads = torch.autograd.grad(expected, ref_leaves, grad_out.double())
    names = ["out", "q", "k", "v"] + [f"weight {i}" for i in range(len(leaves) - 3)]
    for name, got, want in zip(names, (out, *grads), (expected, *expected_grads), strict=True):
        assert got.shape == want.shape, name
        error = (got.double() - want).abs().max().item()
        scale = want.abs().max().item()
        assert error <= TOLERANCE[dtype] * scale, f"{name}: error {error:.3g} against largest entry {scale:.3g}"


@pytest.fixture(params=["default-tiles", "16x16-tiles", "16x5-tiles"])
def tiles(request, monkeypatch) -> str:
    """The default tiles (one tile, one key block for these lengths), or 16-row tiles in key blocks of 16 or 5
    columns, which put tile and block edges inside them and inside a vector's 8 or 16 lanes."""
    if request.param != "default-tiles":
        monkeypatch.setattr(dcmha_fused, "MAX_ROWS", 16)
        monkeypatch.setattr(dcmha_fused, "K_BLOCK", int(request.param.split("x")[1].split("-")[0]))
    return request.param


@pytest.mark.parametrize("name", CPU_CASES)
def test_kernel_matches_eager_reference_fp32(name, tiles, tile_products):
    assert_matches_reference(CPU_CASES[name], torch.float32)


def test_kernel_matches_eager_reference_bf16(tiles, tile_products):
    assert_matches_reference(CPU_CASES["local"], torch.bfloat16)


def test_the_comparison_can_fail():
    """A kernel that skipped post-composition would be caught: leaving it out changes the output."""
    case = CPU_CASES["local"]
    leaves = make_inputs(case, torch.float32)
    q, k, v, pre, _ = split(leaves, case)
    matrices = [query_matrices(pre, None), key_matrices(pre), None, None]
    without_post = dcmha_fused.dcmha_attention(q, k, v, matrices, slopes=None, groups=1, window=case.window)
    assert (without_post.double() - reference(leaves, case)).abs().max() > 0.1


def test_gradients_are_the_same_bits_at_any_timing_and_close_at_any_thread_count(monkeypatch):
    """Each (batch, group) splits its query tiles into parts, one per thread that would otherwise idle, whose
    key-side sums are reduced in a fixed order: two runs agree bit for bit, and runs with another number of parts
    agree to fp32 rounding (the parts add in another order)."""
    monkeypatch.setattr(dcmha_fused, "MAX_ROWS", 16)
    monkeypatch.setattr(dcmha_fused, "K_BLOCK", 32)
    case = dataclasses.replace(CPU_CASES["global"], length=100)  # 7 query tiles of 16, key blocks of 32
    leaves = make_inputs(case, torch.float32)
    grad_out = torch.randn(leaves[0].shape)
    threads = torch.get_num_threads()

    def gradients(n_threads: int) -> list[torch.Tensor]:
        torch.set_num_threads(n_threads)
        try:
            return list(torch.autograd.grad(fused(leaves, case), leaves, grad_out))
        finally:
            torch.set_num_threads(threads)

    three, again, one = gradients(3), gradients(3), gradients(1)
    for a, b, c in zip(three, again, one, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
        torch.testing.assert_close(a, c, rtol=0, atol=1e-5 * c.abs().max().item())


# ---------------------------------------------------------------------------------------------------
# The decoding step (dcmha_decode_forward): one query against a cache's slots, in any order


def decode_step(leaves: list[torch.Tensor], case: Case, query: int, slots: torch.Tensor) -> torch.Tensor:
    """The kernel's step for query ``query`` over a cache holding positions ``slots`` (in that slot order), with
    the key-side matrices read as the cache holds them: a view whose matrices lie ``capacity`` floats apart."""
    q, k, v, pre, post = (x if x is None or isinstance(x, tuple) else x.detach() for x in split(leaves, case))
    capacity = len(slots) + 3
    matrices = []
    for mixing in (pre, post):
        if mixing is None:
            matrices += [None, None]
            continue
        mixing = type(mixing)(*(None if w is None else w.detach() for w in mixing))
        matrices.append(query_matrices(mixing, None)[:, :, query : query + 1])
        if mixing.kw1 is None:
            matrices.append(None)
            continue
        key_w = key_matrices(mixing)[..., slots]
        buffer = torch.zeros(*key_w.shape[:-1], capacity)
        buffer[..., : len(slots)] = key_w
        matrices.append(buffer[..., : len(slots)])
    return dcmha_fused.decode_attention(
        q[:, :, query : query + 1],
        k[:, :, slots],
        v[:, :, slots],
        matrices,
        slopes=official_slopes(case),
        key_positions=slots,
        query_position=query,
        groups=case.groups,
        window=case.window,
    )


@pytest.mark.parametrize("name", list(CPU_CASES))
def test_the_decoding_step_matches_the_eager_reference(name):
    """Each query of a case, decoded against every position (so later ones are hidden by causality and, on a local
    layer, earlier ones by the window), the slots in a shuffled order as a ring holds them: the reference's row of
    that query in float64, to fp32's 2e-5 of its largest entry."""
    case = CPU_CASES[name]
    torch.manual_seed(0)
    leaves = make_inputs(case, torch.float32)
    expected = reference([x.detach().double() for x in leaves], case)
    slots = torch.randperm(case.length)
    for query in sorted({0, case.length // 2, max(0, case.length - 2), case.length - 1}):
        got = decode_step(leaves, case, query, slots)
        want = expected[:, :, query : query + 1]
        assert got.shape == want.shape
        error = (got.double() - want).abs().max().item()
        assert error <= TOLERANCE[torch.float32] * want.abs().max().item(), f"query {query}: error {error:.3g}"


def test_the_decoding_comparison_can_fail():
    """The same check catches a step that leaves out the key-side matrices."""
    case = CPU_CASES["global"]
    torch.manual_seed(0)
    leaves = make_inputs(case, torch.float32)
    expected = reference([x.detach().double() for x in leaves], case)[:, :, -1:]
    no_key_side = dataclasses.replace(case, key_wise=False)
    trimmed = leaves[:3] + leaves[3:6] + leaves[9:12]  # each mixing's query side only
    got = decode_step(trimmed, no_key_side, case.length - 1, torch.arange(case.length))
    assert (got.double() - expected).abs().max() > TOLERANCE[torch.float32] * expected.abs().max()


def step_spy(monkeypatch) -> CallCounter:
    """Counts the layer's calls of the decoding step."""
    return CallCounter(monkeypatch, dcmha_fused, "decode_attention")


@pytest.mark.parametrize("backend", ["auto", "chunked"], ids=["kernel", "pytorch-path"])
def test_cached_decoding_runs_the_kernels_and_equals_the_full_forward(monkeypatch, backend):
    """A prefill into an empty cache takes the fresh-sequence kernel and each later token the decoding step, its
    composition matrices formed by ``dcmha_step_weights`` (on either kernel), in both layers (the local one's ring
    of 5 wraps many times); the logits equal the full forward's, with the kernels or on the
    chunked PyTorch path.

    Each is held to the float64 forward (the chunked path in float64), not the one to the other at fp32's own
    rounding: with composition weights of std 0.5 the fp32 full forward itself sits 1.2e-5 of the largest logit from
    float64 on an AMD EPYC with AVX512-VP2INTERSECT (2026-11-29), where a 1e-5 bound between the two fp32 paths
    failed by rounding alone (the cached logits were the nearer to float64)."""
    kernel = backend == "auto"
    model = on_backend(dcmha_model(), backend).eval()
    exact = on_backend(model, "chunked").double()
    idx = torch.randint(0, 61, (2, 40))
    fresh, steps = kernel_spy(monkeypatch), step_spy(monkeypatch)
    formed = CallCounter(monkeypatch, dcmha_fused, "step_weights")  # the matrices of a step's token by the op
    with torch.no_grad():
        full = model(idx)
        cache = model.new_cache(2, 40)
        cached = torch.cat(
            [model(idx[:, :12], cache=cache)] + [model(idx[:, t : t + 1], cache=cache) for t in range(12, 40)], 1
        )
    assert (fresh.calls, steps.calls) == ((2 + 2, 2 * 28) if kernel else (0, 0))
    assert formed.calls == 2 * 28
    with torch.no_grad():
        want = exact(idx)
    bound = TOLERANCE[torch.float32] * want.abs().max().item()
    torch.testing.assert_close(cached.double(), want, rtol=0, atol=bound)
    torch.testing.assert_close(full.double(), want, rtol=0, atol=bound)


def test_a_prefill_forms_each_tokens_key_side_matrices_once(monkeypatch):
    """The cache and the fresh-sequence kernel share one KW per composition: 2 layers × 2 compositions × 1 call, where
    each formed its own before (8)."""
    from attnzoo.attention import dcmha

    model = dcmha_model().eval()
    formed = CallCounter(monkeypatch, dcmha, "key_matrices")
    fresh = kernel_spy(monkeypatch)
    with torch.no_grad():
        model(torch.randint(0, 61, (2, 12)), cache=model.new_cache(2, 12))
    assert fresh.calls == 2 and formed.calls == 2 * 2


def weight_kernel(layer, x: torch.Tensor, *, static: bool = False) -> str:
    """The kernel of the composition weights the dispatcher picks for a cached call of ``x``'s tokens (a dynamic
    step unless ``static``), as the layer's forward asks: the call is read off the queries, which share x's device,
    dtype and autograd state."""
    call = Call(
        device_type=x.device.type, dtype=x.dtype, key_dtype=x.dtype, queries=x.shape[1], keys=8, start=7, cached=True,
        static=static, records_scores=False, dropout=0.0, compiling=False, position=None,
        autograd=torch.is_grad_enabled() and x.requires_grad,
    )  # fmt: skip
    return choose(layer, call, layer.weight_kernels).name


STEP_OPTIONS = {
    "both": {},
    "post-only": {"pre_compose": False},
    "pre-only": {"post_compose": False},
    "query-wise": {"query_wise": True},
    "static": {"static_proj": True},
    "two-groups": {"num_groups": 2},
    "rank-3": {"rank": 3},
}


@pytest.mark.parametrize("options", STEP_OPTIONS.values(), ids=STEP_OPTIONS.keys())
def test_a_tokens_composition_matrices_from_one_call_equal_the_pytorch_paths(options):
    """``dcmha_step_weights`` against the layer's projection, ``query_matrices`` and ``key_matrices``, within 1e-6
    of the largest entry, with dynamic weights (and W_b) large enough that every term counts."""
    layer = dcmha_model(**options).eval().layers[1].self_attn
    with torch.no_grad():
        if layer.static_w is not None:
            layer.static_w.normal_(std=0.5)
        x = torch.randn(3, 1, 32)
        queries, keys = dcmha_fused.step_weights(layer, x)
        pre, post = layer._mixings(x)
        expected_queries, expected_keys = layer._query_matrices(pre, post), layer._key_matrices(pre, post)
    assert queries.keys() == expected_queries.keys() and keys.keys() == expected_keys.keys()
    for which, expected in expected_queries.items():
        assert_close(queries[which], expected, 1e-6)
    for which, expected in expected_keys.items():
        assert_close(keys[which], expected, 1e-6)


def test_decoding_forms_each_tokens_matrices_in_one_call_and_leaves_the_rest_to_pytorch():
    """A cached one-token fp32 step without autograd takes the op; several tokens, a static step, the eager backend,
    autocast, bf16 or autograd take the PyTorch path, which stays the reference."""
    layer = dcmha_model().eval().layers[1].self_attn
    x = torch.randn(2, 1, 32)
    step, pytorch = dcmha_fused.DCMHA_STEP_WEIGHTS.name, dcmha_fused.PYTORCH_WEIGHTS.name
    with torch.no_grad():
        assert weight_kernel(layer, x) == step
        assert weight_kernel(layer, torch.randn(2, 2, 32)) == pytorch
        assert weight_kernel(layer, x, static=True) == pytorch  # compiled decoding's step
        reference = on_backend(dcmha_model(), "eager").eval().layers[1].self_attn
        assert [kernel.name for kernel in reference.weight_kernels] == [pytorch]  # the eager reference throughout
        with torch.autocast("cpu", dtype=torch.bfloat16):
            assert weight_kernel(layer, x) == pytorch
        assert weight_kernel(layer.bfloat16(), x.bfloat16()) == pytorch
    assert weight_kernel(layer.float(), x) == pytorch  # autograd on: the weights want gradients
    with torch.no_grad():
        assert weight_kernel(layer, x.requires_grad_()) == step  # no grad mode: nothing is recorded


def test_a_bf16_cache_is_decoded_on_the_pytorch_path(monkeypatch):
    """The step kernel reads fp32 caches only (a bf16 one would be upcast whole at every step): a bf16 model decodes
    on the PyTorch path, and its tokens still follow the full forward's to bf16 rounding (2e-2 of the largest)."""
    model = dcmha_model().eval().to(torch.bfloat16)
    idx = torch.randint(0, 61, (1, 20))
    steps = step_spy(monkeypatch)
    with torch.no_grad():
        full = model(idx).float()
        cache = model.new_cache(1, 20)
        cached = torch.cat(
            [model(idx[:, :8], cache=cache)] + [model(idx[:, t : t + 1], cache=cache) for t in range(8, 20)], 1
        )
    assert steps.calls == 0
    torch.testing.assert_close(cached.float(), full, rtol=0, atol=2e-2 * full.abs().max().item())


# ---------------------------------------------------------------------------------------------------
# The layer's route to the kernel, its name, its fallback and its memory


def kernel_spy(monkeypatch) -> CallCounter:
    """Counts the layer's calls of the fused kernel."""
    return CallCounter(monkeypatch, dcmha_fused, "dcmha_attention")


def dcmha_model(**options) -> Transformer:
    cfg = tiny_config(
        n_kv_heads=2,
        max_seq_len=256,
        attention="dcmha",
        attention_options={"window_size": 5, "window_type": "LG", **options},
        position="alibi",
    )
    model = Transformer(cfg)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "dyn_w_proj" in name:
                param.normal_(std=0.5)  # composition strong enough to change the output
    return model


def logits_and_grads(model: Transformer, idx: torch.Tensor) -> list[torch.Tensor]:
    model.zero_grad()
    logits, loss = model(idx, idx)
    loss.backward()
    return [logits.detach(), *(p.grad.clone() for p in model.parameters())]


def test_a_training_step_runs_the_kernel_and_the_model_agrees_with_the_pytorch_path(monkeypatch):
    """Both layers (local and global) of a training step take the kernel; logits and every parameter's gradient
    equal the chunked PyTorch path's to fp32 rounding (1e-5 of the logits, 1e-4 of each largest gradient entry)."""
    model = dcmha_model().train()
    idx = torch.randint(0, 61, (2, 40))
    spy = kernel_spy(monkeypatch)
    fused_run = logits_and_grads(model, idx)
    assert spy.calls == 2
    chunked = logits_and_grads(on_backend(model, "chunked"), idx)
    assert spy.calls == 2
    for got, want in zip(fused_run, chunked, strict=True):
        assert (got - want).abs().max() <= 1e-4 * want.abs().max()


def test_without_a_compiler_dcmha_falls_back_with_one_warning(monkeypatch, tmp_path):
    """A machine without a compiler: one RuntimeWarning that names why, however many calls follow, and the PyTorch
    path's numbers, equal to the kernel's (fp32, 1e-5 of the largest logit)."""
    model = dcmha_model().eval()
    idx = torch.randint(0, 61, (2, 40))
    with torch.no_grad():
        fused_logits = model(idx)
    monkeypatch.setenv("CXX", "/nonexistent/c++")
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "extensions"))
    monkeypatch.setattr(build, "_loaded", None)
    monkeypatch.setattr(build, "_failure", None)
    spy = kernel_spy(monkeypatch)
    with torch.no_grad(), pytest.warns(RuntimeWarning) as warned:
        fallback = model(idx)
        again = model(idx)
    assert len(warned) == 1 and "/nonexistent/c++" in str(warned[0].message)
    assert spy.calls == 0
    assert model.attention_kernels(idx) == ["chunked", "chunked"]
    torch.testing.assert_close(fallback, fused_logits, rtol=0, atol=1e-5 * fused_logits.abs().max().item())
    torch.testing.assert_close(again, fallback, rtol=0, atol=0)


def test_no_tensor_is_quadratic_in_length():
    """A training step's forward and backward allocate nothing T×T: every torch op's output has at most one axis
    as long as T (the kernel's per-tile scratch is its own); the eager reference's scores break the same check."""

    length = 200  # past every feature size (vocab 61, MLP, dw1)
    idx = torch.randint(0, 61, (1, length))
    model = dcmha_model(window_type="G").train()
    with RecordShapes() as fused_run:
        model(idx, idx)[1].backward()
    assert max(sum(size >= length for size in shape) for shape in fused_run.shapes) == 1
    eager = Transformer(dataclasses.replace(model.config, attn_backend="eager"))
    with torch.no_grad(), RecordShapes() as eager_run:
        eager(idx)
    assert max(sum(size >= length for size in shape) for shape in eager_run.shapes) == 2


def test_the_kernel_is_named_where_it_runs(capsys):
    """``attnzoo info`` and the benchmarks' kernel column name the fused kernel for DCMHA on the CPU, and the decoding
    step's for a decode row; a configuration it does not serve (compiled composition) names the chunked kernel."""
    assert main(["info", "--attention", "dcmha"]) == 0
    assert (
        f"attention kernel (CPU, fp32 training)\n  dcmha-fused: {dcmha_fused.KERNEL_NAME}, built"
        in capsys.readouterr().out
    )
    model = dcmha_model().eval()
    idx = torch.randint(0, 61, (1, 16))
    assert sdpa_kernels(model, idx) == [dcmha_fused.KERNEL_NAME]
    assert sdpa_kernels(model, idx, decoding=True) == [dcmha_fused.DECODE_KERNEL_NAME]
    compiled_composition = dataclasses.replace(
        model.config, attention_options=model.config.attention_options | {"compile_composition": True}
    )
    assert [kernel.name for kernel in compiled_composition.kernel_chain] == ["dcmha-triton", "chunked", "eager"]


def test_torch_compile_traces_the_pytorch_path(monkeypatch):
    """The op has no fake kernel, so what dynamo traces is the chunked composition, never the kernel; the compiled
    model agrees with the kernel (fp32, 1e-5 of the largest logit)."""
    import torch._dynamo

    model = dcmha_model().eval()
    idx = torch.randint(0, 61, (2, 24))
    with torch.no_grad():
        want = model(idx)
    spy = kernel_spy(monkeypatch)
    torch._dynamo.reset()
    try:
        with torch.no_grad():
            got = torch.compile(model, backend="eager")(idx)
    finally:
        torch._dynamo.reset()
    assert spy.calls == 0
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5 * want.abs().max().item())


def test_the_kernels_leave_the_threads_floating_point_mode_as_they_found_it():
    """Both fused kernels flush subnormals while they run (FTZ/DAZ); afterwards this thread's arithmetic keeps
    them again, and so does every other PyTorch op: a subnormal times 1 is not 0."""
    subnormal = torch.tensor(torch.finfo(torch.float32).tiny / 4)
    assert (subnormal * 1.0).item() > 0
    case = CPU_CASES["global"]
    leaves = make_inputs(case, torch.float32)
    torch.autograd.grad(fused(leaves, case).sum(), leaves)
    q, k, v = (x.detach() for x in leaves[:3])
    alibi = alibi_flash.alibi_flash_attention(q, k, v, torch.tensor(alibi_slopes(case.n_heads)), 0.25)
    assert alibi.isfinite().all()
    assert (subnormal * 1.0).item() > 0


def test_float64_is_routed_to_the_pytorch_path(monkeypatch):
    """The kernel computes in fp32, so a float64 model never reaches it: its logits equal the float64 eager
    reference's to float64 rounding (1e-12 of the largest logit)."""
    model = dcmha_model().double().eval()
    idx = torch.randint(0, 61, (2, 30))
    spy = kernel_spy(monkeypatch)
    eager = Transformer(dataclasses.replace(model.config, attn_backend="eager")).double().eval()
    eager.load_state_dict(model.state_dict())
    with torch.no_grad():
        got, want = model(idx), eager(idx)
    assert spy.calls == 0 and got.dtype == torch.float64
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12 * want.abs().max().item())
