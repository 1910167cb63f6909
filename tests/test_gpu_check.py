"""benchmarks/gpu_check.py: its CPU dry run, its writers, its exit code, and the detectors its GPU verdicts rest on."""

import dataclasses
import json
import math
from pathlib import Path

import pytest
import torch
from benchmark_scripts import load_benchmark
from torch.nn.attention import SDPBackend, sdpa_kernel

from attnzoo import ModelConfig, Transformer
from attnzoo.attention.kernels import build, dcmha_fused

load_benchmark("gpu_check")  # puts benchmarks/ on sys.path, as running the script does
from gpu.check import command as gpu_check  # noqa: E402
from gpu.check import dispatch, numerics, report  # noqa: E402
from gpu.check import plan as plans  # noqa: E402

DRY_RUN_PLAN = plans.make_plan("dry run")


def tiny_plan(**changes):
    """The dry run cut to what a test needs: two mechanisms (one on SDPA, one on the chunked kernel), a position
    with a bias, both head layouts, fp32; a one-case speed section."""
    plan = DRY_RUN_PLAN
    speed = dataclasses.replace(plan.speed, seq_lens=(32,), tokens_per_step=64, decode_batches=(1,), decode_tokens=4)
    plan = dataclasses.replace(
        plan,
        mechanisms=("mha", "dcmha"),
        positions=("alibi",),
        dtypes=("fp32",),
        seq_len=16,
        compile_combos=(),
        speed=speed,
    )
    return dataclasses.replace(plan, **changes)


@pytest.fixture
def tiny(monkeypatch):
    """main() runs the tiny plan."""
    monkeypatch.setattr(gpu_check, "make_plan", lambda kind: tiny_plan(name=kind))


def read(out: Path) -> tuple[str, dict]:
    (md,) = out.glob("*.md")
    return md.read_text(), json.loads(md.with_suffix(".json").read_text())


def test_the_dry_run_passes_and_writes_the_table_and_the_json(tiny, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert gpu_check.main(["--out", str(tmp_path)]) == 0
    assert "no CUDA device" in capsys.readouterr().out
    text, payload = read(tmp_path)
    assert text.startswith("# attnzoo GPU check: CPU")
    assert "**PASS**" in text
    assert payload["failures"] == 0 and payload["meta"]["finished"]
    checks = {(c["case"], c["name"]): c for c in payload["checks"]}
    for case in ("mha+alibi MHA fp32", "mha+alibi GQA fp32", "dcmha+alibi MHA fp32", "dcmha+alibi GQA fp32"):
        assert f"| {case} |" in text
        for name in ("forward", "backward", "cached decode", "dispatch"):
            assert checks[(case, name)]["status"] == "pass", checks[(case, name)]
        assert 0 <= checks[(case, "forward")]["value"] <= plans.TOLERANCES["fp32"]["forward"]
    # The kernels attend picked: for mha SDPA, and ALiBi's fused C++ kernel for the training step where it is built;
    # for dcmha no SDPA, and where its fused C++ kernels are built they run the training step and the decode step
    # (else the chunked kernel does).
    fused = build.available()
    dcmha_dispatch = checks[("dcmha+alibi MHA fp32", "dispatch")]["extra"]
    assert checks[("mha+alibi MHA fp32", "dispatch")]["extra"]["attend"] == (
        ["alibi-flash", "sdpa"] if fused else ["sdpa"]
    )
    assert dcmha_dispatch["attend"] == (["dcmha-decode", "dcmha-fused"] if fused else ["chunked"])
    assert dcmha_dispatch["sdpa train"] == ([dcmha_fused.KERNEL_NAME] if fused else [])
    assert dcmha_dispatch["sdpa decode"] == ([dcmha_fused.DECODE_KERNEL_NAME] if fused else [])
    assert {r["case"] for r in payload["train_speed"]} == {"mha+rope", "dcmha+rope"}
    assert all(r["extra"]["flops_per_token"] > 0 for r in payload["train_speed"])
    assert {r["case"] for r in payload["decode_speed"]} == {"mha+rope", "dcmha+rope"}
    assert set(payload["matmul_tflops"]) == {"bf16", "fp32"}


def test_a_failing_comparison_fails_the_run_and_is_reported(tiny, tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(plans.TOLERANCES, "fp32", {**plans.TOLERANCES["fp32"], "forward": 0.0})
    assert gpu_check.main(["--dry-run", "--out", str(tmp_path)]) == 1
    text, payload = read(tmp_path)
    assert "**FAIL**" in text and "## Failures" in text
    failed = {(c["case"], c["name"]) for c in payload["checks"] if c["status"] == "FAIL"}
    assert failed == {(case, "forward") for case in ("mha+alibi MHA fp32", "mha+alibi GQA fp32",
                                                      "dcmha+alibi MHA fp32", "dcmha+alibi GQA fp32")}  # fmt: skip
    assert payload["failures"] == 4
    assert "FAIL: mha+alibi MHA fp32 forward" in capsys.readouterr().out


def test_an_error_in_one_combination_is_recorded_and_the_others_still_run(tiny, tmp_path, monkeypatch):
    original = numerics.build_pair

    def broken_for_dcmha(cfg, device):
        if cfg.attention == "dcmha":
            raise RuntimeError("injected")
        return original(cfg, device)

    monkeypatch.setattr(numerics, "build_pair", broken_for_dcmha)
    assert gpu_check.main(["--dry-run", "--out", str(tmp_path)]) == 1
    _, payload = read(tmp_path)
    statuses = {(c["case"], c["name"]): c["status"] for c in payload["checks"]}
    assert statuses[("dcmha+alibi MHA fp32", "numerics")] == "error"
    assert statuses[("mha+alibi GQA fp32", "forward")] == "pass"
    assert any(c["detail"] == "RuntimeError: injected" for c in payload["checks"])
    assert payload["train_speed"], "the speed section still ran"


def test_a_refused_combination_is_recorded_with_the_reason_and_does_not_fail(tiny, tmp_path, monkeypatch):
    original = numerics.check_config

    def refuse_gqa_dcmha(combo, plan):
        if combo.attention == "dcmha" and combo.heads == "GQA":
            raise ValueError("num_groups=3 is invalid: must divide n_heads=4")
        return original(combo, plan)

    monkeypatch.setattr(numerics, "check_config", refuse_gqa_dcmha)
    assert gpu_check.main(["--dry-run", "--out", str(tmp_path)]) == 0
    text, payload = read(tmp_path)
    (refused,) = [c for c in payload["checks"] if c["status"] == "refused"]
    assert refused["case"] == "dcmha+alibi GQA fp32" and "must divide" in refused["detail"]
    assert "refused: num_groups=3 is invalid" in text


def test_the_sdpa_detector_sees_the_fused_kernel_and_the_math_fallback():
    q, k, v = (torch.randn(1, 2, 8, 16) for _ in range(3))

    def call():
        torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)

    assert dispatch.sdpa_backends(call) == ["flash (CPU)"]
    with sdpa_kernel([SDPBackend.MATH]):
        assert dispatch.sdpa_backends(call) == ["math"]
    assert dispatch.sdpa_backends(lambda: q @ k.transpose(-1, -2)) == []
    outcomes = dispatch.runnable_backends(call)
    assert outcomes["flash"] == "ok" and outcomes["math"] == "ok" and outcomes["memory-efficient"] != "ok"


def test_math_on_cuda_fails_the_dispatch_check_and_sdpa_for_a_scores_mechanism_fails_too():
    status = dispatch.dispatch_status
    mha, dcmha = ModelConfig(dim=32, n_heads=4), ModelConfig(dim=32, n_heads=4, attention="dcmha")
    assert status(mha, "cuda", {"sdpa"}, ["flash"], ["memory-efficient"]) == "pass"
    assert status(mha, "cuda", {"sdpa"}, ["flash"], ["math"]) == "FAIL"
    assert status(mha, "cpu", {"sdpa"}, ["math"], ["math"]) == "pass"  # recorded on the CPU, not enforced
    diff = ModelConfig(dim=32, n_heads=4, attention="diff", position="alibi")
    assert status(diff, "cpu", {"diff-flash", "diff-decode"}, [], []) == "pass"  # its own CPU kernels
    assert status(diff, "cpu", {"alibi-flash", "sdpa"}, ["flash (CPU)"], []) == "pass"  # the scheme's
    assert status(diff, "cpu", {"diff-flash", "eager"}, [], []) == "FAIL"  # never the eager reference
    assert status(mha, "cuda", {"chunked"}, [], []) == "FAIL"  # attend did not pick SDPA
    assert status(dcmha, "cuda", {"chunked"}, [], []) == "pass"
    assert status(dcmha, "cuda", {"chunked", "sdpa"}, ["flash"], []) == "FAIL"


def test_relative_error_and_greedy_gap():
    assert plans.rel_error(torch.tensor([1.0, 2.0]), torch.tensor([1.0, 2.0])) == 0.0
    assert plans.rel_error(torch.tensor([0.0, 1.0]), torch.tensor([0.0, 2.0])) == pytest.approx(0.5)
    assert plans.rel_error(torch.zeros(2), torch.zeros(2)) == 0.0
    assert plans.rel_error(torch.ones(2), torch.zeros(2)) == math.inf
    assert plans.within(math.nan, 1.0) == "FAIL"

    model = Transformer(ModelConfig(vocab_size=32, dim=32, n_layers=1, n_heads=4, max_seq_len=16)).eval()
    prompt = torch.randint(0, 32, (2, 4))
    with torch.no_grad():
        tokens = model.generate(prompt, 6, temperature=0.0)
        assert numerics.greedy_gap(model, tokens, 4) == pytest.approx(0.0, abs=1e-12)
        worst = model(tokens[:, :-1])[0, -1].argmin()
        tokens[0, -1] = worst  # the least likely token: the whole range below the best
        assert numerics.greedy_gap(model, tokens, 4) == pytest.approx(1.0)


def test_a_compiled_training_step_is_compared_and_its_recompiles_counted():
    plan = tiny_plan()
    check = numerics.check_compiled_training(plans.Combo("mha", "rope", "GQA", "fp32"), plan, "cpu")
    assert check.status == "pass", check
    assert check.extra["graphs"] >= 1 and check.extra["recompiles"] == 0


def test_compiled_decoding_is_not_available_without_generates_compile(monkeypatch):
    monkeypatch.setattr(numerics, "generate_compiles", lambda: False)
    check = numerics.check_compiled_decode(plans.Combo("mha", "rope", "MHA", "bf16"), tiny_plan(), "cpu")
    assert check.status == "not available"


def test_report_names_follow_the_device_and_plan(tmp_path):
    assert report.device_slug("NVIDIA H100 80GB HBM3") == "nvidia-h100-80gb-hbm3"
    full, quick = plans.make_plan("full"), plans.make_plan("quick")
    assert report.report_path(tmp_path, "NVIDIA H100 80GB HBM3", full).name == "gpu-nvidia-h100-80gb-hbm3.md"
    assert report.report_path(tmp_path, "NVIDIA H100 80GB HBM3", quick).name == "gpu-nvidia-h100-80gb-hbm3-quick.md"
    # The full plan covers every mechanism × position × MHA/GQA × dtype; training speed at T = 1024, 4096, 16384.
    assert len(full.combos()) == 5 * 5 * 2 * 2
    assert full.speed.seq_lens == (1024, 4096, 16384) and full.speed.decode_batches == (1, 16)


def test_a_bad_budget_is_refused(capsys):
    with pytest.raises(SystemExit):
        gpu_check.main(["--budget", "0"])
    assert "--budget=0.0 is invalid" in capsys.readouterr().err


@pytest.mark.cuda
@pytest.mark.slow
def test_the_quick_check_passes_on_this_gpu(tmp_path):
    assert gpu_check.main(["--quick", "--out", str(tmp_path)]) == 0
    text, payload = read(tmp_path)
    assert payload["meta"]["device"] == torch.cuda.get_device_name()
    assert "**PASS**" in text


def test_an_out_that_cannot_be_a_directory_is_refused_before_any_check(tiny, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(gpu_check, "run_check", lambda *args: pytest.fail("ran the checks"))
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(SystemExit):
        gpu_check.main(["--dry-run", "--out", str(blocker / "report")])
    assert f"--out={blocker / 'report'} is invalid: cannot create the report's directory" in capsys.readouterr().err
