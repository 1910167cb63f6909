"""Numerics against the CPU float64 reference, cached decoding, dispatch, and ``torch.compile``."""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
from collections.abc import Callable

import torch
from torch import Tensor

from attnzoo.config import ModelConfig
from attnzoo.model import Transformer

from gpu.check.dispatch import attend_choices, dispatch_status, expected_dispatch, runnable_backends, sdpa_backends
from gpu.check.plan import (
    DTYPES,
    FAIL,
    PASS,
    REFUSED,
    SKIPPED,
    TOLERANCES,
    UNAVAILABLE,
    Check,
    Combo,
    Plan,
    check_config,
    error_check,
    rel_error,
    within,
)
from gpu.check.report import fmt


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
