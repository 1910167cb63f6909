"""benchmarks/gpu_kit.py: its dry run end to end, the step arithmetic, and resuming where it stopped."""

import dataclasses
import json
import math
from types import SimpleNamespace

import pytest
from benchmark_scripts import load_benchmark

from attnzoo.compare import PRESETS
from attnzoo.compare.presets import LADDERS

load_benchmark("gpu_kit")  # puts benchmarks/ on sys.path, as running the script does
from gpu import kit as gpu_kit  # noqa: E402

STAGE_NAMES = [stage.name for stage in gpu_kit.STAGES]


# ------------------------------------------------------------------------------------------- step arithmetic


def plan(seconds_left, **changes):
    settings = {"seeds": 5, "max_steps": 2000, "min_steps": 200, "eval_steps_per_run": 10.0, **changes}
    return gpu_kit.plan_steps(seconds_left, {"mha": 0.1, "dcmha": 0.3}, **settings)


def test_the_steps_fill_the_time_left_less_the_reserve_and_the_evaluations():
    # A step of every run takes 5 × (0.1 + 0.3) = 2 s; 1000 s less 10% is 450 such rounds, 10 of them evaluation.
    assert gpu_kit.RESERVE == 0.10
    steps = plan(1000.0)
    assert (steps.steps, steps.affordable, steps.fits) == (440, 440, True)
    assert steps.estimated_s == pytest.approx(1000.0)


def test_the_steps_never_exceed_the_presets_and_never_fall_below_the_floor():
    capped = plan(1e6)
    assert capped.steps == 2000 and capped.affordable > 2000 and capped.fits
    assert capped.estimated_s == pytest.approx(2 * 2010 / 0.9)
    short = plan(100.0)  # 90 s: 45 rounds, 35 steps after the evaluations
    assert (short.steps, short.affordable, short.fits) == (200, 35, False)
    assert short.estimated_s == pytest.approx(2 * 210 / 0.9)
    assert plan(-50.0).affordable == 0  # the earlier stages overran the budget


def test_bad_step_arithmetic_inputs_are_refused_by_name():
    with pytest.raises(ValueError, match=r"seconds_per_step=\{'mha': 0.0\} is invalid"):
        gpu_kit.plan_steps(10.0, {"mha": 0.0}, seeds=1, max_steps=10, min_steps=1, eval_steps_per_run=0)
    with pytest.raises(ValueError, match=r"min_steps=20 is invalid: must be in \[1, max_steps=10\]"):
        gpu_kit.plan_steps(10.0, {"mha": 1.0}, seeds=1, max_steps=10, min_steps=20, eval_steps_per_run=0)


def test_the_evaluations_cost_a_third_of_a_step_per_scored_token_five_times_a_run():
    # 10,001 tokens hold 100 windows of 100; 64 are scored, 5 times: 32,000 tokens at 1/3 of 1,000 per step.
    assert gpu_kit.eval_steps_per_run(10_001, 100, 64, 1_000) == pytest.approx(32_000 / 3 / 1_000)
    assert gpu_kit.eval_steps_per_run(10_001, 100, 500, 1_000) == pytest.approx(50_000 / 3 / 1_000)


def test_the_scaled_preset_keeps_its_proportions_and_evaluates_four_times():
    preset = PRESETS["gpu-lm"]
    for steps in (1000, 1001, 333):
        train = gpu_kit.scaled_spec(preset, steps, budget_s=2400).train
        assert train.steps == steps
        assert train.warmup_steps == round(steps * preset.train.warmup_steps / preset.train.steps)
        evaluations = {s for s in range(1, steps + 1) if s % train.eval_interval == 0} | {steps}
        assert len(evaluations) == gpu_kit.TRAINER_EVALS
    scaled = gpu_kit.scaled_spec(preset, 1000, budget_s=2400)
    assert (scaled.train.checkpoint_interval, scaled.variants, scaled.seeds) == (125, preset.variants, preset.seeds)
    assert "scaled to 1,000 by the GPU kit for a 40-minute budget" in scaled.description


def test_the_gpu_plan_runs_the_preset_as_it_is_and_the_dry_run_a_cpu_toy():
    gpu, dry = gpu_kit.make_plan(dry_run=False), gpu_kit.make_plan(dry_run=True, budget_min=3)
    assert gpu.spec is PRESETS["gpu-lm"] and gpu.budget_s == 40 * 60 and gpu.gpu_check_args == ("--quick",)
    assert gpu.timing_steps == 50
    assert dry.budget_s == 180 and dry.spec.train.device == "cpu"
    assert dry.gpu_check_args == ("--dry-run", "--budget", "10")  # its own tests cover gpu_check's sections
    assert dry.spec.variants == gpu.spec.variants and dry.spec.train.data == gpu.spec.train.data


def test_the_gpu_lm_preset_scores_the_whole_validation_split_at_its_own_scale():
    spec = PRESETS["gpu-lm"]
    assert spec.train.data.corpus == "pysource" and spec.train.seq_len == 512 and len(spec.seeds) == 5
    assert spec.train.steps * spec.train.tokens_per_step == 65_536_000
    # Each evaluation during training scores 8.4M tokens of the split; the final one scores all of it.
    assert spec.train.eval_windows * spec.train.seq_len > 8_000_000 and spec.evals.val_windows is None
    assert PRESETS["gpu"].model == spec.model and PRESETS["gpu"].train.data == spec.train.data


def test_the_steps_fall_on_whole_quarters_so_the_gap_gate_finds_its_evaluations():
    # 1000 s less 10% is 450 rounds of 2 s, 10 of them evaluation: 440; 1010 s would afford 444.5 → 444, not 445.
    assert plan(1000.0).steps % gpu_kit.TRAINER_EVALS == 0
    odd = plan(1010.0)
    assert (odd.affordable, odd.steps) == (444, 444)
    assert plan(1012.0).affordable == 445 and plan(1012.0).steps == 444


def test_a_gpu_ladder_rung_runs_that_rung_and_never_a_floor_over_the_budget():
    small = gpu_kit.make_plan(dry_run=False, preset="gpu-ladder", rung="small")
    assert small.spec is LADDERS["gpu-ladder"].rungs[0] and small.label == "gpu-ladder rung small"
    assert small.min_steps == gpu_kit.TRAINER_EVALS  # shrink rather than overrun the lease's call
    assert small.identity["ladder"] == "gpu-ladder" and small.identity["preset"] == "small"
    assert "ladder" not in gpu_kit.make_plan(dry_run=False).identity  # gpu-lm folders of before resume
    dry = {rung: gpu_kit.make_plan(dry_run=True, preset="gpu-ladder", rung=rung).spec for rung in ("small", "large")}
    assert dry["small"].train.device == "cpu" and dry["small"].model["n_layers"] < dry["large"].model["n_layers"]
    with pytest.raises(ValueError, match=r"rung 'huge' is not one of gpu-ladder's rungs \['small', 'large'\]"):
        gpu_kit.make_plan(dry_run=False, preset="gpu-ladder", rung="huge")
    with pytest.raises(ValueError, match=r"preset 'claims' is not one of the GPU presets .* or GPU ladders"):
        gpu_kit.make_plan(dry_run=False, preset="claims", rung="small")  # the CPU ladder
    with pytest.raises(ValueError, match="rung 'small' goes with a GPU ladder"):
        gpu_kit.make_plan(dry_run=False, preset="gpu-ablations", rung="small")


def test_another_gpu_preset_runs_whole_in_the_kits_own_compare_folder_and_resumes_by_its_name(tmp_path):
    kit = gpu_kit.Kit(gpu_kit.make_plan(dry_run=True, preset="gpu-ablations"), tmp_path)
    assert kit.compare_dir == tmp_path / "compare"
    gpu_kit.write_summary(kit, gpu_kit.STAGES)
    assert f"--out {tmp_path} --preset gpu-ablations`" in (tmp_path / gpu_kit.SUMMARY).read_text()
    gpu_kit.write_summary(new_kit(tmp_path / "lm"), gpu_kit.STAGES)  # gpu-lm, the default, resumes without it
    assert "--preset" not in (tmp_path / "lm" / gpu_kit.SUMMARY).read_text().split("Resume")[-1]
    plan = gpu_kit.make_plan(dry_run=False, preset="gpu-ablations")
    assert plan.spec is PRESETS["gpu-ablations"] and plan.ladder is None and plan.label == "gpu-ablations"
    assert plan.identity["preset"] == "gpu-ablations" and "ladder" not in plan.identity
    assert set(gpu_kit.GPU_PRESETS) == {"gpu", "gpu-lm", "gpu-ablations"}
    dry = gpu_kit.make_plan(dry_run=True, preset="gpu-ablations").spec
    assert dry.train.device == "cpu" and dry.variant_labels == PRESETS["gpu-ablations"].variant_labels


def test_a_rungs_comparison_sits_beside_the_other_rungs_and_its_kit_files_apart(tmp_path):
    plan = gpu_kit.make_plan(dry_run=True, preset="gpu-ladder", rung="large")
    kit = gpu_kit.Kit(plan, tmp_path / "kit-large")
    assert kit.compare_dir == tmp_path / "large" and kit.relative(kit.compare_dir / "report.md") == "../large/report.md"
    assert new_kit(tmp_path).compare_dir == tmp_path / "compare"


def test_a_compare_below_twenty_tokens_per_parameter_is_said_at_the_top_of_the_summary(tmp_path):
    kit = gpu_kit.Kit(gpu_kit.make_plan(dry_run=True, preset="gpu-ladder", rung="small"), tmp_path / "kit-small")
    timing = gpu_kit.Stage("timing", "", None)
    kit.record(
        timing, gpu_kit.Outcome(gpu_kit.PASSED, data={"steps": 20, "preset_steps": 40, "tokens_per_parameter": 12.5}), 1
    )
    gpu_kit.write_summary(kit, gpu_kit.STAGES)
    summary = (kit.out / gpu_kit.SUMMARY).read_text()
    assert "**BELOW THE PROTOCOL'S BUDGET: the compare trains 12.5 tokens per parameter, under the 20" in summary
    assert "affords 20 of the preset's 40 steps" in summary and "--preset gpu-ladder --rung small" in summary
    kit.record(
        timing, gpu_kit.Outcome(gpu_kit.PASSED, data={"steps": 40, "preset_steps": 40, "tokens_per_parameter": 21.0}), 1
    )
    gpu_kit.write_summary(kit, gpu_kit.STAGES)
    assert "BELOW" not in (kit.out / gpu_kit.SUMMARY).read_text()


# ------------------------------------------------------------------------------------------------ resuming


class Recorder:
    """Fake stages that record their calls; ``behaviour[name]`` says what one does instead of passing."""

    def __init__(self, behaviour=None):
        self.calls, self.behaviour = [], dict(behaviour or {})

    def stages(self, names=("a", "b", "c")):
        return [gpu_kit.Stage(name, f"stage {name}", self.runner(name)) for name in names]

    def runner(self, name):
        def run(kit):
            self.calls.append(name)
            action = self.behaviour.pop(name, None)
            if action is not None:
                return action()
            return gpu_kit.Outcome(gpu_kit.PASSED, f"{name} ran", data={"ran": name})

        return run


def crash():
    raise RuntimeError("CUDA error: device lost")


def killed():
    raise KeyboardInterrupt  # the kit itself stopped mid-stage: nothing is recorded


def new_kit(out, budget_min=2):
    return gpu_kit.Kit(gpu_kit.make_plan(dry_run=True, budget_min=budget_min), out)


def test_the_corpus_stage_fails_a_corpus_a_run_would_read_more_than_once(tmp_path):
    """A gpu-lm run read pystdlib's 9.6M training tokens 6.8 times on an H100 and overfit (gpu-2026-11-26b)."""
    text = tmp_path / "small.txt"
    text.write_text("def f(x):\n    return x + 1\n" * 200)
    kit = new_kit(tmp_path / "kit")
    small = dataclasses.replace(kit.plan.spec.train.data, corpus=str(text))
    spec = dataclasses.replace(kit.plan.spec, train=dataclasses.replace(kit.plan.spec.train, data=small))
    kit.plan = dataclasses.replace(kit.plan, spec=spec)
    outcome = gpu_kit.corpus_stage(kit)
    record = json.loads((kit.out / "corpus.json").read_text())
    assert record["passes_per_run"] == pytest.approx(
        spec.train.steps * spec.train.tokens_per_step / record["train_tokens"]
    )
    assert record["passes_per_run"] > 1 and outcome.status == gpu_kit.FAILED and "overfit" in outcome.note


def test_the_compare_trains_nothing_after_the_corpus_stage_failed(tmp_path):
    kit = new_kit(tmp_path)
    kit.stages["timing"] = {"completed": True, "status": gpu_kit.PASSED, "data": {"steps": 4}}
    kit.stages["corpus"] = {"completed": True, "status": gpu_kit.FAILED}
    outcome = gpu_kit.compare_stage(kit)
    assert outcome.status == gpu_kit.NOT_RUN and not outcome.completed and "corpus stage failed" in outcome.note
    assert not (tmp_path / "compare").exists()


def test_a_crashed_stage_is_recorded_incomplete_the_rest_run_and_a_resume_runs_only_it(tmp_path, capsys):
    first = Recorder({"b": crash})
    assert gpu_kit.run_stages(new_kit(tmp_path), first.stages()) == 1
    assert first.calls == ["a", "b", "c"]
    state = json.loads((tmp_path / gpu_kit.STATE).read_text())["stages"]
    assert state["b"]["status"] == gpu_kit.ERROR and not state["b"]["completed"]
    assert "RuntimeError: CUDA error: device lost" in state["b"]["note"]
    summary = (tmp_path / gpu_kit.SUMMARY).read_text()
    assert "| b | stage b | ERROR (incomplete: runs again on resume) |" in summary
    assert "- b: ERROR (incomplete: runs again on resume): RuntimeError: CUDA error: device lost" in summary

    again = Recorder()
    assert gpu_kit.run_stages(new_kit(tmp_path), again.stages()) == 0
    assert again.calls == ["b"]
    assert "a: completed earlier (passed), skipped" in capsys.readouterr().out
    state = json.loads((tmp_path / gpu_kit.STATE).read_text())["stages"]
    assert all(state[name]["completed"] for name in "abc")
    assert "None." in (tmp_path / gpu_kit.SUMMARY).read_text()


def test_a_kit_stopped_mid_stage_runs_that_stage_and_the_later_ones_on_resume(tmp_path):
    with pytest.raises(KeyboardInterrupt):
        gpu_kit.run_stages(new_kit(tmp_path), Recorder({"b": killed}).stages())
    state = json.loads((tmp_path / gpu_kit.STATE).read_text())["stages"]
    assert list(state) == ["a"]
    again = Recorder()
    assert gpu_kit.run_stages(new_kit(tmp_path), again.stages()) == 0
    assert again.calls == ["b", "c"]


def test_a_stage_stopped_by_a_signal_stops_the_kit_with_its_exit_code(tmp_path):
    stopped = gpu_kit.Outcome(gpu_kit.INTERRUPTED, "signal 2", completed=False, exit_code=130)
    recorder = Recorder({"b": lambda: stopped})
    assert gpu_kit.run_stages(new_kit(tmp_path), recorder.stages()) == 130
    assert recorder.calls == ["a", "b"]


def test_redo_runs_a_completed_stage_again_and_the_budget_counts_every_attempt(tmp_path, monkeypatch):
    clock = iter(range(0, 1000, 10))  # each perf_counter call 10 s later
    monkeypatch.setattr(gpu_kit.time, "perf_counter", lambda: next(clock))
    gpu_kit.run_stages(new_kit(tmp_path), Recorder().stages(["a"]))
    first = json.loads((tmp_path / gpu_kit.STATE).read_text())["stages"]["a"]["seconds"]
    recorder = Recorder()
    gpu_kit.run_stages(new_kit(tmp_path), recorder.stages(["a"]), redo=["a"])
    assert recorder.calls == ["a"]
    assert json.loads((tmp_path / gpu_kit.STATE).read_text())["stages"]["a"]["seconds"] == 2 * first > 0


def test_the_budget_may_change_until_the_timing_stage_has_planned_the_steps(tmp_path):
    """A device lent for less time than the kit started with: the first slices of 2026-11-25 needed the state
    edited by hand to resume under a smaller budget."""
    gpu_kit.run_stages(new_kit(tmp_path), Recorder().stages(["a"]))
    smaller = new_kit(tmp_path, budget_min=3)
    assert smaller.state["identity"]["budget_s"] == 180.0 and smaller.completed("a")
    smaller.record(gpu_kit.Stage("timing", "", None), gpu_kit.Outcome(gpu_kit.PASSED, data={"steps": 7}), 1.0)
    with pytest.raises(ValueError, match=r"planned the compare's steps for a 3-minute budget; .*--budget-min 3"):
        new_kit(tmp_path, budget_min=5)


def test_a_folder_of_another_plan_is_refused(tmp_path):
    gpu_kit.run_stages(new_kit(tmp_path), Recorder().stages(["a"]))
    with pytest.raises(ValueError, match=r"holds a GPU kit run of another plan .*choose another --out"):
        gpu_kit.Kit(gpu_kit.make_plan(dry_run=False, budget_min=2), tmp_path)


def test_a_resumed_compare_trains_the_steps_the_timing_stage_chose(tmp_path, monkeypatch):
    kit = new_kit(tmp_path)
    assert gpu_kit.compare_stage(kit).status == gpu_kit.NOT_RUN  # nothing says how many steps fit yet
    timing = gpu_kit.Outcome(gpu_kit.PASSED, data={"steps": 7})
    kit.record(gpu_kit.Stage("timing", "", None), timing, 1.0)
    seen = []

    def fake_compare(spec, out, progress):
        seen.append(spec)
        return SimpleNamespace(interrupted_by=None)

    monkeypatch.setattr(gpu_kit, "run_compare", fake_compare)
    outcome = gpu_kit.compare_stage(new_kit(tmp_path))  # a later invocation reads the stored steps
    assert outcome.status == gpu_kit.PASSED
    assert seen[0].train.steps == 7 and seen[0].train.eval_interval == math.ceil(7 / gpu_kit.TRAINER_EVALS)


def test_skip_leaves_stages_out_and_a_later_resume_without_it_runs_them(tmp_path, capsys):
    """A 15-minute lease runs part of the kit: the stages left out are recorded as not run, count as no failure,
    and run when the folder is resumed without --skip."""
    first = Recorder()
    assert gpu_kit.run_stages(new_kit(tmp_path), first.stages(), skip=["a", "b"]) == 0
    assert first.calls == ["c"]
    state = json.loads((tmp_path / gpu_kit.STATE).read_text())["stages"]
    assert state["a"]["status"] == gpu_kit.NOT_RUN and state["a"]["note"] == "left out by --skip"
    assert not state["a"]["completed"] and "a: left out (--skip)" in capsys.readouterr().out
    again = Recorder()
    assert gpu_kit.run_stages(new_kit(tmp_path), again.stages()) == 0
    assert again.calls == ["a", "b"]


def test_variants_and_seeds_narrow_the_compare_to_one_claims_runs(tmp_path):
    plan = gpu_kit.make_plan(dry_run=False, variants=["mha+rope", "diff+rope"], seeds=3)
    assert plan.spec.variant_labels == ["mha+rope", "diff+rope"] and plan.spec.seeds == (0, 1, 2)
    assert plan.spec.train == PRESETS["gpu-lm"].train  # the steps are still the timing stage's to scale
    gpu_kit.run_stages(gpu_kit.Kit(plan, tmp_path), Recorder().stages(["a"]))
    with pytest.raises(ValueError, match=r"holds a GPU kit run of another plan"):
        gpu_kit.Kit(gpu_kit.make_plan(dry_run=False, variants=["mha+rope", "dcmha+rope"], seeds=3), tmp_path)


def test_steps_fix_the_compares_length_and_no_bench_leaves_out_its_throughput_cases(tmp_path):
    plan = gpu_kit.make_plan(dry_run=False, variants=["mha+rope", "selective+rope"], seeds=3, steps=4000, bench=False)
    preset = PRESETS["gpu-lm"].train
    assert plan.spec.train == preset.with_steps(4000) and plan.spec.train.warmup_steps == 2 * preset.warmup_steps
    assert plan.spec.evals.bench_cases == () and plan.min_steps == 4000
    # The timing stage can then only confirm the length: the most that fits is never fewer steps than asked.
    fixed = gpu_kit.plan_steps(60.0, {"mha+rope": 0.03}, seeds=3, max_steps=4000, min_steps=4000, eval_steps_per_run=0)
    assert fixed.steps == 4000 and not fixed.fits
    gpu_kit.run_stages(gpu_kit.Kit(plan, tmp_path), Recorder().stages(["a"]))
    for other in ({"steps": 3000, "bench": False}, {"steps": 4000, "bench": True}):
        with pytest.raises(ValueError, match=r"holds a GPU kit run of another plan"):
            gpu_kit.Kit(gpu_kit.make_plan(False, None, ["mha+rope", "selective+rope"], 3, **other), tmp_path)


def test_bad_flags_are_refused_by_name(tmp_path, capsys, monkeypatch):
    with pytest.raises(SystemExit):
        gpu_kit.main(["--dry-run", "--budget-min", "0", "--out", str(tmp_path)])
    assert "--budget-min=0.0 is invalid: must be a number of minutes > 0" in capsys.readouterr().err
    monkeypatch.setattr(gpu_kit.torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit):
        gpu_kit.main(["--out", str(tmp_path)])
    assert "no CUDA device is visible" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        gpu_kit.main(["--dry-run", "--redo", "nothing", "--out", str(tmp_path)])
    assert "invalid choice: 'nothing'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        gpu_kit.main(["--dry-run", "--seeds", "0", "--out", str(tmp_path)])
    assert "--seeds=0 is invalid: must be an integer >= 1" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        gpu_kit.main(["--dry-run", "--steps", "0", "--out", str(tmp_path)])
    assert "--steps=0 is invalid: must be an integer in [1, 1000000000]" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # a typo's extra digits, which started a compare that would never end
        gpu_kit.main(["--dry-run", "--steps", str(10**11), "--out", str(tmp_path)])
    assert "--steps=100000000000 is invalid: must be an integer in [1, 1000000000]" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        gpu_kit.main(["--dry-run", "--skip", "tests", "--redo", "tests", "--out", str(tmp_path)])
    assert "--skip and --redo both name ['tests']" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        gpu_kit.main(["--dry-run", "--variants", "mha+nowhere", "--out", str(tmp_path)])
    assert "nowhere" in capsys.readouterr().err


def test_an_out_that_cannot_be_the_kits_folder_is_refused_by_name(tmp_path, capsys, monkeypatch):
    """`--out ''` took the checkout's root (the script runs from there) and replaced its .gitignore; a file and a
    folder under /proc ended in raw FileExistsError and FileNotFoundError."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "file").write_text("a file\n")
    every_stage = ["--dry-run", "--skip", *STAGE_NAMES]  # so that a kit that took the folder returns at once
    refusals = [
        ("", "argument --out: the path is empty"),
        (str(gpu_kit.REPO), f"--out {gpu_kit.REPO} holds this checkout"),
        (str(gpu_kit.REPO.parent), "holds this checkout"),
        (str(tmp_path / "file"), f"--out {tmp_path / 'file'} is a file, not a folder"),
        ("/proc/attnzoo-kit", "--out /proc/attnzoo-kit cannot be made: "),
    ]
    for out, words in refusals:
        with pytest.raises(SystemExit) as stop:
            gpu_kit.main([*every_stage, "--out", out])
        assert stop.value.code == 2 and words in capsys.readouterr().err
    assert sorted(path.name for path in tmp_path.iterdir()) == ["file"]


# ------------------------------------------------------------------------------------------------ dry run


@pytest.mark.slow
def test_the_dry_run_runs_every_stage_and_a_second_run_resumes_with_nothing_left(tmp_path, capsys):
    out = tmp_path / "kit"
    # --no-bench: the bench's cases, each in a fresh process, are a minute of this test on 2 cores and are
    # test_bench's and test_compare's to check; one seed: a second repeats the first's stages. The flags are the
    # folder's identity, so the resume repeats them.
    flags = ["--dry-run", "--no-bench", "--seeds", "1", "--out", str(out)]
    assert gpu_kit.main(flags) == 0
    state = json.loads((out / gpu_kit.STATE).read_text())["stages"]
    assert list(state) == STAGE_NAMES and all(record["completed"] for record in state.values())
    summary = (out / gpu_kit.SUMMARY).read_text()
    assert summary.startswith("# attnzoo GPU kit: ") and "(dry run, toy sizes)" in summary
    for name in STAGE_NAMES:
        assert f"| {name} | " in summary
    for record in state.values():
        assert all((out / path).is_file() for path in record["outputs"])
    assert state["corpus"]["outputs"] == ["corpus.json"]
    corpus = json.loads((out / "corpus.json").read_text())
    assert corpus["name"] == "pysource" and 0 < corpus["passes_per_run"] < 1
    assert any(path.endswith(".md") for path in state["gpu_check"]["outputs"])
    assert state["gpu_check"]["status"] == state["tests"]["status"] == gpu_kit.PASSED
    assert (out / "tests" / "junit.xml").is_file()
    if gpu_kit.torch.cuda.is_available():
        assert state["dcmha_triton"]["status"] == gpu_kit.PASSED
    else:  # the benchmark's one refusal, not a typo in its flags
        assert state["dcmha_triton"]["status"] == gpu_kit.NOT_RUN
        assert "needs a CUDA device" in state["dcmha_triton"]["note"]
    steps = state["timing"]["data"]["steps"]
    assert 4 <= steps <= 40
    assert set(state["timing"]["data"]["seconds_per_step"]) == set(PRESETS["gpu-lm"].variant_labels)
    results = json.loads((out / "compare" / "results.json").read_text())
    assert results["budget"]["steps"] == steps and results["bench"]["measurements"] == []  # --no-bench
    assert {"compare/report.md", "compare/results.json"} <= set(state["compare"]["outputs"])
    for name in ("gpu_check", "tests", "dcmha_triton"):  # the stages run as commands
        assert (out / "logs" / f"{name}.log").is_file()
    pytest_command = next(line for line in capsys.readouterr().out.splitlines() if " -m pytest " in line)
    assert " -n 0 " in pytest_command  # one process, not a worker per core: the CUDA tests share one GPU

    assert gpu_kit.main(flags) == 0
    printed = capsys.readouterr().out
    for name in STAGE_NAMES:
        assert f"{name}: completed earlier" in printed


@pytest.mark.slow
def test_the_dry_run_of_two_gpu_ladder_rungs_in_one_folder_forms_the_ladder_and_judges_it(tmp_path):
    """Two leases' rungs at toy sizes on a CPU: each rung's comparison beside the other, the kit's files apart, and
    the second rung's compare stage writes the ladder's report over both."""
    out = tmp_path / "gpu-ladder"
    # Two variants and one seed keep it to the stages' plumbing: the ladder's verdicts are test_ladder's to check.
    flags = ["--dry-run", "--preset", "gpu-ladder", "--skip", "gpu_check", "tests", "dcmha_triton"]
    flags += ["--variants", "mha+rope", "dcmha+rope", "--seeds", "1", "--out", str(out)]
    for rung in ("small", "large"):
        assert gpu_kit.main([*flags, "--rung", rung]) == 0  # the stages left out by --skip are no failure
        state = json.loads((out / f"kit-{rung}" / gpu_kit.STATE).read_text())["stages"]
        assert state["compare"]["status"] == gpu_kit.PASSED and (out / rung / "results.json").is_file()
        assert f"../{rung}/results.json" in state["compare"]["outputs"]
        assert "tokens_per_parameter" in json.loads((out / f"kit-{rung}" / "corpus.json").read_text())
        assert "BELOW THE PROTOCOL'S BUDGET" in (out / f"kit-{rung}" / gpu_kit.SUMMARY).read_text()  # toy sizes
    assert "the ladder of 2 rungs judged in" in state["compare"]["note"]
    assert json.loads((out / "verdicts.json").read_text())["sizes"] == sorted(
        json.loads((out / rung / "results.json").read_text())["variants"]["mha+rope"]["parameters"]
        for rung in ("small", "large")
    )
    assert (out / ".gitignore").read_text() == "*/runs/\n*/.attnzoo.lock\n"


@pytest.mark.slow
def test_the_dry_run_of_an_alibi_rung_trains_sinusoidal_at_2l_and_reads_alibis_primary_off_it(tmp_path):
    """ALiBi's GPU ladder at toy sizes on a CPU: the sinusoidal model trains on sequences of 2L, half as many a step,
    and alibi.short_matches_long is read at that size (a toy fails its gate; no run is missing)."""
    out = tmp_path / "gpu-alibi"
    flags = ["--dry-run", "--preset", "gpu-alibi", "--rung", "small", "--skip", "gpu_check", "tests", "dcmha_triton"]
    assert gpu_kit.main([*flags, "--out", str(out)]) == 0
    toy = gpu_kit.make_plan(dry_run=True, preset="gpu-alibi", rung="small").spec.train
    trained = json.loads((out / "small/runs/mha+sinusoidal+len2/seed0/train_config.json").read_text())
    assert (trained["seq_len"], trained["batch_size"]) == (2 * toy.seq_len, toy.batch_size // 2)
    claims = {row["id"]: row for row in json.loads((out / "small" / "verdicts.json").read_text())["claims"]}
    assert [size["outcome"] for size in claims["alibi.short_matches_long"]["sizes"]] == ["not measurable"]
    assert claims["alibi.short_matches_long"]["sizes"][0]["gate"]["passed"] is False


def test_the_test_the_tests_stage_leaves_out_exists():
    """A renamed test would make --deselect a silent no-op and the stage 3 minutes longer."""
    path, name = gpu_kit.REPEATED_TEST.split("::")
    assert f"def {name}(" in (gpu_kit.REPO / path).read_text()


def test_the_kit_never_replaces_a_file_it_did_not_create(tmp_path, capsys):
    """A folder's own .gitignore (a folder holding secrets/ and *.key in it) was replaced with the kit's two lines;
    it is left as it is, and the lines it lacks are said. A summary.md in a folder the kit has not taken is refused
    before anything is written."""
    every_stage = ["--dry-run", "--skip", *STAGE_NAMES]  # the kit takes the folder and returns at once
    out = tmp_path / "mine"
    out.mkdir()
    (out / ".gitignore").write_text("secrets/\n*.key\n")
    assert gpu_kit.main([*every_stage, "--out", str(out)]) == 0
    assert (out / ".gitignore").read_text() == "secrets/\n*.key\n"
    assert f"{out / '.gitignore'} is not the kit's: left as it is; add compare/runs/, .attnzoo.lock" in (
        capsys.readouterr().out
    )
    fresh = tmp_path / "fresh"
    assert gpu_kit.main([*every_stage, "--out", str(fresh)]) == 0
    assert (fresh / ".gitignore").read_text() == "compare/runs/\n.attnzoo.lock\n"  # its own, created
    assert gpu_kit.main([*every_stage, "--out", str(fresh)]) == 0  # resumed: its own files are its to write

    taken = tmp_path / "notes"
    taken.mkdir()
    (taken / "summary.md").write_text("my notes\n")
    with pytest.raises(SystemExit) as stop:
        gpu_kit.main([*every_stage, "--out", str(taken)])
    assert stop.value.code == 2
    assert f"--out {taken} holds summary.md, which no GPU kit wrote" in capsys.readouterr().err
    assert sorted(path.name for path in taken.iterdir()) == ["summary.md"]
    assert (taken / "summary.md").read_text() == "my notes\n"
