"""The fused DCMHA Triton kernel (``attention/kernels/dcmha_triton/``) against the eager reference.

Without CUDA the kernels run in Triton's interpreter on CPU tensors: ``conftest.py`` sets ``TRITON_INTERPRET=1``
before Triton is imported, since Triton reads it as ``@triton.jit`` decorates each function. With CUDA the same
tests run the compiled kernels on the GPU.

The reference is the eager DCMHA attention in float64 (full (B, N, T, S) scores composed with the merged
per-token matrices), fed the same inputs. Each output and gradient must agree to a tolerance relative to that
tensor's largest entry: fp32 2e-5 (the kernel's fp32 rounding; about 1e-6 is seen), fp16 4e-3 and bf16 3e-2 (it
rounds P' and dS to the input dtype before its matmuls, as flash attention does; about 5e-4 and 7e-3 are seen).
"""

import dataclasses
import runpy
import warnings
from functools import partial
from pathlib import Path

import pytest
import torch
from dcmha_cases import CASES, Case, RecordShapes, make_inputs, reference, split

from attnzoo import ModelConfig, Transformer

triton = pytest.importorskip("triton")

from attnzoo.attention.kernels.dcmha_triton import jit, op, tuning  # noqa: E402  (after the skip: needs triton)

pytestmark = pytest.mark.triton

INTERPRETED = jit.INTERPRETED
TOLERANCE = {torch.float32: 2e-5, torch.float16: 4e-3, torch.bfloat16: 3e-2}


@pytest.fixture
def device() -> str:
    """Where the kernels run: CPU tensors under the interpreter, else CUDA."""
    if INTERPRETED:
        return "cpu"
    if not torch.cuda.is_available():
        pytest.skip("Triton compiles (TRITON_INTERPRET is not 1) but there is no CUDA device")
    return "cuda"


def assert_kernel_matches_reference(
    case: Case, dtype: torch.dtype, device: str, heads_per_program: int | None = None
) -> None:
    leaves = make_inputs(case, dtype, device)
    q, k, v, pre, post = split(leaves, case)
    out = op.dcmha_attention(
        q, k, v, pre, post, num_groups=case.groups, window=case.window, block=16, heads_per_program=heads_per_program
    )
    assert out.dtype == dtype and out.shape == q.shape and out.device == q.device
    grad_out = torch.randn(out.shape).to(dtype)
    grads = torch.autograd.grad(out, leaves, grad_out.to(device))

    ref_leaves = [x.detach().double().cpu().requires_grad_() for x in leaves]
    expected = reference(ref_leaves, case)
    expected_grads = torch.autograd.grad(expected, ref_leaves, grad_out.double())
    names = ["out", "q", "k", "v"] + [f"weight {i}" for i in range(len(leaves) - 3)]
    for name, got, want in zip(names, (out, *grads), (expected, *expected_grads), strict=True):
        assert got.shape == want.shape, name
        error = (got.double().cpu() - want).abs().max().item()
        scale = want.abs().max().item()
        assert error <= TOLERANCE[dtype] * scale, f"{name}: error {error:.3g} against largest entry {scale:.3g}"


@pytest.mark.parametrize("name", CASES)
def test_kernel_matches_eager_reference_fp32(device, name):
    assert_kernel_matches_reference(CASES[name], torch.float32, device)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_kernel_matches_eager_reference_half_precision(device, dtype):
    assert_kernel_matches_reference(CASES["local"], dtype, device)


def one_tile(case: Case) -> Case:
    """``case`` over one tile of 16 rows: the interpreter's time grows with the tiles a program visits, and a test of
    the grid over heads or of the feature steps needs no partial or second tile (the cases above cover those)."""
    return dataclasses.replace(case, length=16)


# Programs that each accumulate some of a group's heads (the grid over head chunks), while every one of them forms all
# the group's scores: (case, heads a program). The cases above run a group in one program (4 heads a program).
HEAD_CHUNKS = {
    "local-2": (CASES["local"], 2),
    "local-pre-only-2": (CASES["local-pre-only"], 2),
    "global-query-wise-2": (CASES["global-query-wise"], 2),
    # head_dim 40: q·kᵀ and dO·vᵀ in three steps of 16 features (FEATURES_PER_STEP), the last one partial
    "global-40-features-2": (one_tile(dataclasses.replace(CASES["global"], head_dim=40)), 2),
}
SLOW_HEAD_CHUNKS = {
    "local-1": (one_tile(CASES["local"]), 1),
    "local-post-only-1": (one_tile(CASES["local-post-only"]), 1),
    # M = 3 padded to 4: the last program's head is padding
    "groups-padded-1": (one_tile(dataclasses.replace(CASES["groups-padded"], batch=1)), 1),
}


@pytest.mark.parametrize("name", HEAD_CHUNKS)
def test_programs_of_a_head_chunk_match_eager_reference(device, name):
    case, heads_per_program = HEAD_CHUNKS[name]
    assert_kernel_matches_reference(case, torch.float32, device, heads_per_program)


@pytest.mark.slow
@pytest.mark.parametrize("name", SLOW_HEAD_CHUNKS)
def test_programs_of_one_head_match_eager_reference(device, name):
    case, heads_per_program = SLOW_HEAD_CHUNKS[name]
    assert_kernel_matches_reference(case, torch.float32, device, heads_per_program)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_programs_of_a_head_chunk_in_half_precision(device, dtype):
    assert_kernel_matches_reference(CASES["local"], dtype, device, heads_per_program=2)


def test_the_comparison_can_fail(device):
    """A kernel that skipped post-composition would be caught: leaving it out changes the output."""
    case = CASES["local"]
    leaves = make_inputs(case, torch.float32, device)
    q, k, v, pre, _ = split(leaves, case)
    out = op.dcmha_attention(q, k, v, pre, None, num_groups=1, window=case.window, block=16)
    assert (out.double().cpu() - reference(leaves, case)).abs().max() > 0.1


def test_no_tensor_is_quadratic_in_length(device):
    """Forward and backward allocate nothing T×T: every torch op's output has at most one axis as long as T."""

    case = CASES["global"]  # T = 37 exceeds every other size (heads, head_dim, rank)
    leaves = make_inputs(case, torch.float32, device)
    q, k, v, pre, post = split(leaves, case)
    with RecordShapes() as recorded:
        out = op.dcmha_attention(q, k, v, pre, post, num_groups=1, window=None, block=16)
        torch.autograd.grad(out, leaves, torch.randn_like(out))
    assert (1, 4, 37, 16) in recorded.shapes  # the recording sees the kernels' outputs
    assert max(sum(size >= case.length for size in shape) for shape in recorded.shapes) == 1
    with RecordShapes() as eager:  # the check can fail: the reference's (B, N, T, T) scores break it
        reference(leaves, case)
    assert max(sum(size >= case.length for size in shape) for shape in eager.shapes) == 2


def test_any_gradient_layout(device):
    """The gradient of a sum reaches the kernel with every stride 0; it must act as the dense ones."""
    case = CASES["local-pre-only"]
    leaves = make_inputs(case, torch.float32, device)
    q, k, v, pre, _ = split(leaves, case)
    out = op.dcmha_attention(q, k, v, pre, None, num_groups=1, window=case.window, block=16)
    dense = torch.autograd.grad(out, leaves, torch.ones_like(out), retain_graph=True)
    of_sum = torch.autograd.grad(out.sum(), leaves)
    for got, want in zip(of_sum, dense, strict=True):
        torch.testing.assert_close(got, want, atol=0, rtol=0)


@pytest.mark.parametrize("name", ["local", "global-query-wise", "groups-padded"])
def test_a_compiled_call_is_one_graph_and_equals_the_eager_call(device, name):
    """The kernels are custom operators: dynamo traces the layer's call as one graph (no break at the launch), and AOT
    autograd's forward and backward (``aot_eager``: traced, nothing generated) give the eager call's output and every
    gradient exactly, since both launch the same kernels."""
    import torch._dynamo

    case = one_tile(CASES[name])
    leaves = make_inputs(case, torch.float32, device)

    def attention(*tensors: torch.Tensor) -> torch.Tensor:
        q, k, v, pre, post = split(list(tensors), case)
        return op.dcmha_attention(q, k, v, pre, post, num_groups=case.groups, window=case.window)

    out = attention(*leaves)
    grad_out = torch.randn_like(out)
    expected = torch.autograd.grad(out, leaves, grad_out)
    torch._dynamo.reset()
    try:
        assert torch._dynamo.explain(attention)(*leaves).graph_break_count == 0
        compiled = torch.compile(attention, backend="aot_eager", fullgraph=True)(*leaves)
        got = torch.autograd.grad(compiled, leaves, grad_out)
    finally:
        torch._dynamo.reset()
    torch.testing.assert_close(compiled, out, rtol=0, atol=0)
    for grad, want in zip(got, expected, strict=True):
        torch.testing.assert_close(grad, want, rtol=0, atol=0)


def test_the_operators_registrations_pass_torchs_own_checks(device):
    """``torch.library.opcheck``: the schema, the fake (shape) implementation against the real one, and the autograd
    registration of the forward operator, on the smallest case."""
    case = one_tile(CASES["local"])
    q, k, v, pre, post = split(make_inputs(case, torch.float32, device), case)
    spec = op.KernelSpec(1, case.n_heads, case.rank, True, True, True, case.window, 0.25, 16, heads_per_program=2)
    query_w = op.pack_weights([(m.qw1, m.qw2, m.qdd) for m in (pre, post)], q)
    key_w = op.pack_weights([(m.kw1, m.kw2, m.kdd) for m in (pre, post)], q)
    args = (q, k, v, query_w.detach().requires_grad_(), key_w.detach().requires_grad_(), *spec.as_args())
    torch.library.opcheck(op.dcmha_forward, args)


@pytest.mark.parametrize("kernel", sorted(tuning.KERNEL_GRID))
def test_the_autotuner_always_times_the_kernels_own_tiles(kernel):
    """On a GPU each kernel is autotuned; for every group size and rank the layer allows, the configs left after
    pruning include the tiles, heads a program, features a step, warps and stages the kernel runs without tuning, so
    tuning can only keep its choice or find a faster one. (The tuned launch itself needs a GPU; these are the configs
    it chooses among.)"""
    max_stages = tuning.KERNEL_GRID[kernel][1]
    configs = tuning.tuning_configs(kernel)
    assert all(c.num_stages <= (max_stages or 3) for c in configs)
    for heads_per_group in range(1, 33):
        for rank in range(1, 5):
            spec = op.KernelSpec(1, heads_per_group, rank, True, True, True, None, 0.125)
            own, options = tuning.untuned_launch(kernel, spec, 64)
            kept = tuning.prune_tiles(configs, {}, **own)
            chosen = [(c.kwargs["BT"], c.kwargs["BS"], c.kwargs["MC"], c.kwargs["DF"], c.num_warps, c.num_stages)
                      for c in kept]  # fmt: skip
            untuned = (own["BT"], own["BS"], own["MC"], own["DF"], options["num_warps"], options["num_stages"])
            assert untuned in chosen, (heads_per_group, rank)
            assert all(mc <= own["MP"] and df <= own["DP"] for _, _, mc, df, _, _ in chosen)
            assert len(set(chosen)) == len(chosen)
            assert all(own["MP"] * own["RP"] * bt * bs <= tuning.MAX_MIX_PRODUCTS or bt == 16
                       for bt, bs, *_ in chosen)  # fmt: skip


def test_every_launch_caps_registers_at_a_programs_share_of_the_register_file(monkeypatch):
    """ptxas otherwise keeps as few as 32 registers a thread and spills (benchmarks/dcmha_triton_sm90.py): every tuning
    candidate and the untuned launch set .maxnreg to one program's share of the SM's registers, at most 255."""
    for config in (c for kernel in tuning.KERNEL_GRID for c in tuning.tuning_configs(kernel)):
        assert config.maxnreg == tuning.register_cap(config.num_warps)
    for warps, cap in ((4, 255), (8, 255), (16, 128), (32, 64)):
        assert tuning.register_cap(warps) == cap and cap * 32 * warps <= tuning.REGISTER_FILE
    launched = {}

    class Recorder:
        def __getitem__(self, grid):
            return lambda *args, **options: launched.update(options)

    monkeypatch.setitem(jit.KERNELS_BY_NAME, "forward", Recorder())
    spec = op.KernelSpec(1, 16, 2, True, True, True, None, 0.125, block=16)
    tuning.launch("forward", spec, 64, 128, 2)
    assert launched["num_warps"] == 8 and launched["maxnreg"] == 255


def time_tuning_with(monkeypatch, timer) -> None:
    """Every kernel's autotuner with an empty cache, timing each config by ``timer(kernel name)``, a stand-in for
    do_bench (set over the cached property, which asks for a GPU)."""
    for name, tuner in tuning.TUNED.items():
        monkeypatch.setitem(tuner.__dict__, "do_bench", timer(name))
        monkeypatch.setattr(tuner, "cache", {})


def output_and_grads(case: Case, leaves: list[torch.Tensor], block: int | None) -> list[torch.Tensor]:
    """The kernel's output and the gradients of its sum with respect to every leaf."""
    q, k, v, pre, post = split(leaves, case)
    out = op.dcmha_attention(q, k, v, pre, post, num_groups=case.groups, window=case.window, block=block)
    return [out, *torch.autograd.grad(out, leaves, torch.ones_like(out))]


def test_the_tuned_launch_times_each_pruned_config_and_computes_what_the_untuned_one_does(device, monkeypatch):
    """The launch a GPU takes without a block, run on the interpreter: each kernel's autotuner runs every config left
    after pruning once (timed here by a stand-in that counts, making the first the fastest), keeps one per shape, and
    the output and every gradient equal the untuned tiles' (fp32 2e-5 of the largest entry: other tiles sum in
    another order). On a GPU every call without a block takes this launch, so there the test is moot.

    The interpreter ignores warps and stages, so each tuner holds one config per distinct set of constants (tiles,
    heads a program, features a step) here: every program the tuned launch can run, once. The case is the smallest
    that prunes none of them (2 heads, rank 1; head_dim 32, so that whole rows a step differ from 16 features) and
    still shares a kv head (GQA): the interpreter's time is the test's."""
    if not INTERPRETED:
        pytest.skip("on a GPU every model-level test already launches through the autotuners")
    runs: dict[str, int] = {}

    def counter(name: str):
        def count(kernel_call, quantiles):
            kernel_call()
            runs[name] = runs.get(name, 0) + 1
            return [float(runs[name])] * len(quantiles)

        return count

    def constants(configs: list[triton.Config]) -> set[tuple]:
        return {tuple(sorted(c.kwargs.items())) for c in configs}

    time_tuning_with(monkeypatch, counter)
    for tuner in tuning.TUNED.values():
        distinct = {tuple(sorted(c.kwargs.items())): c for c in reversed(tuner.configs)}
        monkeypatch.setattr(tuner, "configs", list(distinct.values()))
    case = dataclasses.replace(CASES["local"], n_heads=2, n_kv_heads=1, rank=1, length=16, head_dim=32)
    leaves = make_inputs(case, torch.float32, device)
    untuned = output_and_grads(case, leaves, 16)
    monkeypatch.setattr(jit, "INTERPRETED", False)
    tuned = output_and_grads(case, leaves, None)
    for got, want in zip(tuned, untuned, strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=2e-5 * want.abs().max().item())
    spec = op.KernelSpec(1, case.n_heads, case.rank, True, True, True, case.window, 0.25).constants(32)
    for name, tuner in tuning.TUNED.items():
        every = tuning.prune_tiles(tuning.tuning_configs(name), {}, **spec)
        timed = tuning.prune_tiles(tuner.configs, {}, **spec)
        assert constants(timed) == constants(every) and len(constants(every)) > 1, name
        if name != "forward":
            assert {c.kwargs["DF"] for c in timed} == {16, 32}, name
        assert runs[name] == len(timed) and len(tuner.cache) == 1, name


def test_a_tuning_that_fails_warns_once_and_the_kernel_runs_untuned(device, monkeypatch):
    """A candidate Triton cannot compile (beyond running out of resources, which the autotuner skips itself) stops the
    tuning, not the call: each kernel warns once with the error, runs its untuned tiles, and the result is theirs."""
    if not INTERPRETED:
        pytest.skip("needs the interpreter's stand-in for timing, to make a tuning fail")

    def broken(kernel_call, quantiles):
        raise RuntimeError("PassManager::run failed")

    time_tuning_with(monkeypatch, lambda name: broken)
    monkeypatch.setattr(tuning, "UNTUNABLE", set())
    case = CASES["local-pre-only"]
    leaves = make_inputs(case, torch.float32, device)
    spec = op.KernelSpec(1, case.n_heads, case.rank, True, False, True, case.window, 0.25).constants(16)
    untuned = output_and_grads(case, leaves, spec["BT"])
    monkeypatch.setattr(jit, "INTERPRETED", False)
    with pytest.warns(RuntimeWarning, match="PassManager::run failed") as warned:
        first = output_and_grads(case, leaves, None)
    assert len(warned) == 3 and set(tuning.TUNED) == tuning.UNTUNABLE  # once per kernel
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # untuned from now on: no tuning, so no warning
        second = output_and_grads(case, leaves, None)
    for got, again, want in zip(first, second, untuned, strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
        torch.testing.assert_close(again, want, rtol=0, atol=0)


# ---------------------------------------------------------------------------------------------------
# The layer's dispatch: the kernel where it applies, the PyTorch path everywhere else


def make_model(device: str, **overrides) -> Transformer:
    options = {"window_size": 6, "window_type": "LG", **overrides.pop("attention_options", {})}
    cfg = ModelConfig(
        vocab_size=31,
        dim=32,
        n_layers=2,
        n_heads=4,
        n_kv_heads=2,
        max_seq_len=64,
        attention="dcmha",
        attention_options=options,
        **{"position": "rope", **overrides},
    )
    model = Transformer(cfg)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "dyn_w_proj" in name or "static_w" in name:
                param.normal_(std=0.5)  # composition strong enough to change the output
    return model.to(device)


@pytest.fixture
def kernel_calls(device, monkeypatch) -> list[int]:
    """Count the calls that reach the kernel; on CPU, let the layer route to it (the interpreter runs it)."""
    calls = []
    run = op.dcmha_attention

    def counted(*args, **kwargs):
        calls.append(1)
        return run(*args, **kwargs)

    if device == "cpu":
        monkeypatch.setattr(op, "runs_on", lambda device_type: True)
    monkeypatch.setattr(op, "dcmha_attention", counted)
    return calls


def test_layer_uses_the_kernel_and_matches_the_pytorch_path(device, kernel_calls):
    model = make_model(device).train()  # dropout 0: training mode is what the trainer runs
    idx, targets = (torch.randint(0, 31, (2, 21), device=device) for _ in range(2))
    _, loss = model(idx, targets)
    loss.backward()
    assert len(kernel_calls) == 2  # both layers, local and global
    fused_grads = {name: p.grad.clone() for name, p in model.named_parameters()}
    model.zero_grad()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(op, "runs_on", lambda device_type: False)
        _, ref_loss = model(idx, targets)
        ref_loss.backward()
    assert len(kernel_calls) == 2
    torch.testing.assert_close(loss, ref_loss, atol=1e-5, rtol=0)
    for name, param in model.named_parameters():
        # fp32 rounding, amplified by the strong composition: 1e-4 of the largest entry, as tests/test_dcmha.py.
        assert (fused_grads[name] - param.grad).abs().max() <= 1e-4 * param.grad.abs().max(), name


FALLBACKS = {
    "alibi": dict(position="alibi"),
    "static_proj": dict(attention_options={"static_proj": True}),
    "dropout": dict(dropout=0.1),
    "eager backend": dict(attn_backend="eager"),
    "bidirectional": dict(causal=False, attention_options={"window_type": "G"}),
    "float64": dict(),
    "attention maps": dict(),
    "cached decoding": dict(),
}


@pytest.mark.parametrize("name", FALLBACKS)
def test_what_the_kernel_cannot_compute_takes_the_pytorch_path(device, kernel_calls, name):
    model = make_model(device, **FALLBACKS[name]).train(name == "dropout")
    if name == "float64":
        model = model.double()
    idx = torch.randint(0, 31, (2, 9), device=device)
    if name == "attention maps":
        model.attention_maps(idx)
    elif name == "cached decoding":
        cache = model.new_cache(2, 9)
        model(idx[:, :5], cache=cache)
        model(idx[:, 5:6], cache=cache)
    else:
        model(idx)
    assert kernel_calls == []


def test_runs_on_needs_cuda_and_triton(monkeypatch):
    assert not op.runs_on("cpu")  # CPU tensors: the PyTorch path, whatever is installed
    monkeypatch.setattr(op, "triton", None)
    assert not op.runs_on("cuda")
    with pytest.raises(RuntimeError, match=r'pip install -e "\.\[triton\]"'):
        op.dcmha_attention(*(torch.zeros(1, 1, 1, 16),) * 3, None, None, num_groups=1, window=None)


def test_bad_input_is_refused():
    q = torch.zeros(1, 4, 8, 16)
    attention = partial(op.dcmha_attention, pre=None, post=None, window=None)
    with pytest.raises(ValueError, match=r"block=24 .*power of 2"):
        attention(q, q, q, num_groups=1, block=24)
    with pytest.raises(ValueError, match=r"q\.dtype=torch\.float64"):
        attention(q.double(), q.double(), q.double(), num_groups=1)
    with pytest.raises(ValueError, match="k, v shapes"):
        attention(q, q[:, :, :5], q[:, :, :5], num_groups=1)  # keys at other positions: a cached call
    with pytest.raises(ValueError, match="num_groups=3 is invalid: must divide n_heads=4"):
        attention(q, q, q, num_groups=3)
    with pytest.raises(ValueError, match=r"heads_per_program=3 .*power of 2"):
        attention(q, q, q, num_groups=1, heads_per_program=3)


def test_benchmark_refuses_without_cuda(capsys):
    """benchmarks/bench_dcmha_triton.py measures on a GPU only; elsewhere it says so and exits 2."""
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is visible: the benchmark would run")
    path = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_dcmha_triton.py"
    main = runpy.run_path(str(path), run_name="bench_dcmha_triton")["main"]
    assert main(["--seq-lens", "2048", "--window-types", "L"]) == 2
    assert "needs a CUDA device" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--tokens", "0"])
    assert "'0' is not an integer >= 1" in capsys.readouterr().err
