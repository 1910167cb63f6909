"""The CUDA route of each mechanism, decided by a lease's summary.json (benchmarks/gpu_speed.py --routes-from) and
followed by the dispatcher (attnzoo/attention/kernels/routes.py); without a routes file every chain is today's."""

import dataclasses
import json

import pytest
from benchmark_scripts import load_benchmark

from attnzoo import ModelConfig, Transformer
from attnzoo.attention.kernels import Call, choose, routes

load_benchmark("gpu_speed")  # puts benchmarks/ on sys.path, as running the script does
from gpu import speed as gpu_speed  # noqa: E402


@pytest.fixture
def routes_file(tmp_path, monkeypatch):
    """Where the dispatcher reads the routes from, for one test: absent until the test writes it."""
    path = tmp_path / "cuda_routes.json"
    monkeypatch.setattr(routes, "ROUTES_FILE", path)
    routes.cuda_routes.cache_clear()
    yield path
    routes.cuda_routes.cache_clear()


def lease_summary(tmp_path, train_speed: dict, device: str = "NVIDIA H100 80GB HBM3"):
    """A summary.json as a lease writes it, with the gpu-lm training rows given (speed ÷ MHA's, same mode)."""
    path = tmp_path / "summary.json"
    summary = {"device": device, "commit": "abc1234", "date": "2026-12-02", "dtype": "bfloat16"}
    path.write_text(json.dumps({**summary, "train_speed_vs_mha": {"gpu-lm": train_speed}}))
    return path


# DCMHA: the chunked path beats the kernel by far in both modes. Diff: eager, diff-halves is 3% faster than the two
# SDPA calls (within the margin: the simpler stays); compiled, diff-stacked is 20% faster than both others.
LEASE = {
    "eager": {"mha": 1.0, "dcmha[chunked]": 0.40, "dcmha[dcmha-triton]": 0.20, "diff": 0.80,
              "diff[diff-halves]": 0.824, "diff[diff-stacked]": 0.70, "selective": 0.9},
    "compiled": {"mha": 1.0, "dcmha[chunked]": 0.60, "dcmha[dcmha-triton]": 0.30, "diff": 0.80,
                 "diff[diff-halves]": 0.81, "diff[diff-stacked]": 0.96},
}  # fmt: skip


def test_the_rule_takes_the_fastest_unless_a_simpler_route_is_within_five_percent_of_its_step():
    assert routes.decide_route("dcmha", {"chunked": 0.4, "dcmha-triton": 0.2}) == "chunked"
    assert routes.decide_route("dcmha", {"chunked": 0.2, "dcmha-triton": 0.4}) == "dcmha-triton"
    assert routes.decide_route("dcmha", {"chunked": 0.39, "dcmha-triton": 0.4}) == "chunked"  # 2.5%: simpler
    assert routes.decide_route("dcmha", {"chunked": 0.37, "dcmha-triton": 0.4}) == "dcmha-triton"  # 8%
    assert routes.decide_route("diff", {"sdpa": 0.8, "diff-halves": 0.9, "diff-stacked": 0.93}) == "diff-halves"
    assert routes.decide_route("dcmha", {"chunked": 0.4}) is None  # the kernel's case was not measured


def test_a_lease_summary_decides_the_routes_and_the_cuda_chain_follows_them(tmp_path, routes_file, capsys):
    dcmha = ModelConfig(vocab_size=32, dim=64, n_layers=1, n_heads=4, attention="dcmha")
    diff = ModelConfig(vocab_size=32, dim=64, n_layers=1, n_heads=4, attention="diff")

    def planned(cfg: ModelConfig, **call) -> str:
        (name,) = {kernel.name for kernel in Transformer(cfg).planned_kernels(**call)}
        return name

    def every_route(cfg: ModelConfig) -> list[str]:
        return [planned(cfg, device_type=device, compiling=compiling) for device in ("cpu", "cuda")
                for compiling in (False, True)]  # fmt: skip

    before = {cfg.attention: (every_route(cfg), [k.name for k in cfg.kernel_chain]) for cfg in (dcmha, diff)}
    assert before["dcmha"][0] == ["dcmha-fused", "chunked", "dcmha-triton", "dcmha-triton"]
    assert before["diff"][0] == ["diff-flash", "sdpa", "sdpa", "sdpa"]

    summary = lease_summary(tmp_path, LEASE)
    assert gpu_speed.main(["--routes-from", str(summary), "--routes-file", str(routes_file)]) == 0
    written = json.loads(routes_file.read_text())
    assert written["routes"] == {
        "dcmha": {"eager": "chunked", "compiled": "chunked"},
        "diff": {"eager": "sdpa", "compiled": "diff-stacked"},
    }
    assert (written["device"], written["commit"], written["date"]) == ("NVIDIA H100 80GB HBM3", "abc1234", "2026-12-02")
    assert written["train_speed_vs_mha"]["diff"]["eager"] == {"sdpa": 0.80, "diff-halves": 0.824, "diff-stacked": 0.70}
    assert "dcmha eager: chunked" in capsys.readouterr().out

    routes.cuda_routes.cache_clear()
    # On CUDA the routed kernel runs first, in the modes it won; the CPU's choices are today's.
    assert every_route(dcmha) == ["dcmha-fused", "chunked", "chunked", "chunked"]
    assert every_route(diff) == ["diff-flash", "sdpa", "sdpa", "diff-stacked"]
    # Routed only for fresh sequences: a cached CUDA call of Diff keeps its own order.
    model = Transformer(diff)
    fresh = Call.planned(diff, model.position, device_type="cuda", compiling=True)
    layer = model.layers[0].self_attn
    assert choose(layer, fresh).name == "diff-stacked"
    assert choose(layer, dataclasses.replace(fresh, cached=True)).name == "sdpa"

    # A routes file that decides nothing (a lease whose kernel cases were cut off) keeps every chain.
    cut_off = {mode: {"mha": 1.0, "dcmha[chunked]": 0.4, "diff": 0.8} for mode in ("eager", "compiled")}
    assert (
        gpu_speed.main(["--routes-from", str(lease_summary(tmp_path, cut_off)), "--routes-file", str(routes_file)]) == 0
    )
    routes.cuda_routes.cache_clear()
    assert {cfg.attention: (every_route(cfg), [k.name for k in cfg.kernel_chain]) for cfg in (dcmha, diff)} == before


def test_without_a_routes_file_every_chain_is_todays(routes_file):
    assert not routes_file.exists() and routes.cuda_routes() == {}
    cfg = ModelConfig(vocab_size=32, dim=64, n_layers=1, n_heads=4, attention="dcmha")
    assert [kernel.name for kernel in cfg.kernel_chain] == [
        "dcmha-triton", "dcmha-fused", "dcmha-decode", "chunked", "eager"
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("device", "said"),
    [("CPU", "a dry run's toy timings decide no CUDA route"), (None, "the summary's device is None")],
)
def test_a_summary_that_cannot_decide_is_refused_in_one_line_and_nothing_is_written(
    tmp_path, routes_file, capsys, device, said
):
    summary = lease_summary(tmp_path, LEASE, device=device)
    with pytest.raises(SystemExit) as stop:
        gpu_speed.main(["--routes-from", str(summary), "--routes-file", str(routes_file)])
    assert stop.value.code == 2 and said in capsys.readouterr().err and not routes_file.exists()
    with pytest.raises(SystemExit):
        gpu_speed.main(["--routes-from", str(tmp_path / "missing.json"), "--routes-file", str(routes_file)])
    assert "no such file" in capsys.readouterr().err


def test_a_routes_file_naming_a_kernel_that_was_never_a_candidate_is_refused(routes_file):
    routes_file.write_text(json.dumps({"routes": {"dcmha": {"eager": "sdpa", "compiled": None}}}))
    with pytest.raises(ValueError, match=r"route dcmha/eager='sdpa' is invalid: .* the kernels chunked, dcmha-triton"):
        routes.cuda_routes()
