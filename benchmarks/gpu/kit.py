"""Everything to run the day a CUDA GPU is lent, from one command, within a stated budget (issue 23).

    bash scripts/gpu_kit.sh                            # about 40 minutes → benchmarks/results/gpu-<date>/
    bash scripts/gpu_kit.sh --budget-min 30 --out DIR  # another budget or folder
    bash scripts/gpu_kit.sh --dry-run --out DIR        # every stage at toy sizes on a CPU (1-2 min), as CI runs it

A lease shorter than the whole kit (15 minutes, 2026-11-26) runs part of it: ``--skip`` leaves stages out (they
run on a later resume without it), ``--variants`` / ``--seeds`` narrow the compare to one claim's runs, ``--steps``
fixes their length and ``--no-bench`` leaves out the throughput cases (4 minutes of an H100 on 2026-11-25), e.g.
``--budget-min 12 --skip gpu_check tests dcmha_triton --variants mha+rope diff+rope --seeds 3 --no-bench``.

``--preset gpu-ablations`` runs another GPU comparison instead of gpu-lm (the ablations' claims, one call of a
lease); ``--preset gpu-ladder --rung small`` (then ``large`` on a later lease) runs one rung of the GPU ladder: its
comparison goes to ``OUT/<rung>/`` and the kit's own files to ``OUT/kit-<rung>/``, so the rungs of
different leases unpacked into one ``OUT`` form the ladder (:func:`attnzoo.results.ladder.load_ladder`), which the
compare stage judges as soon as ``OUT`` holds two rungs (``attnzoo compare --out OUT --report-only`` does it later).

The stages, in order, each writing under ``OUT``:

1. ``corpus``: the preset's corpus prepared offline (gpu-lm's pysource: the ``.py`` files of the standard library
   and the installed packages, each in path order, bytes as tokens, the last 10% the validation split); its files,
   tokens, sha256 and the passes a run makes over its training split → ``corpus.json``;
2. ``gpu_check``: ``benchmarks/gpu_check.py --quick`` → ``gpu-check/``;
3. ``tests``: ``pytest -m "cuda or triton"``, the CUDA and compiled-Triton tests → ``tests/junit.xml`` (the dry run:
   the quick ones of tests/test_dcmha_triton.py);
4. ``dcmha_triton``: ``benchmarks/bench_dcmha_triton.py`` → ``dcmha-triton.md`` and ``.json``;
5. ``timing``: 50 training steps of each variant, and the steps the preset can afford in the time the budget has
   left (:func:`plan_steps`; fewer tokens per parameter than gate (a) asks is said at the top of the summary) →
   ``timing.md`` and ``.json``;
6. ``compare``: the preset at those steps → ``compare/report.md`` (a rung: ``../<rung>/report.md``), ``results.json``,
   ``plots/``.

``summary.md`` (what ran, the device, the times, every failure) is rewritten after each stage, and each stage's
output goes to ``logs/<stage>.log`` as well as the terminal. A failing stage does not stop the next.

Resuming: ``kit_state.json`` records each stage when it completes, that is, when its command ran to its own end
whatever it found (a gpu_check with failing checks, a pytest with failing tests, a benchmark that refused for want of
CUDA). Run the same command with the same ``--out`` again and the completed stages are skipped; one that crashed or
was cut off (the GPU went away) runs again, and the compare reuses its finished runs and resumes the interrupted one
from its last checkpoint. The timing stage's step count is stored, so a resumed compare trains exactly the runs it
started. ``--redo STAGE`` runs a completed stage again. The budget counts the seconds the stages spent, over all
invocations, so time between them is not charged.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import platform
import subprocess
import sys
import time
import traceback
import xml.etree.ElementTree as ElementTree
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import date, datetime, timezone
from pathlib import Path
from typing import Any

import torch

import attnzoo
from attnzoo.claims.claim import LanguageModelGate
from attnzoo.compare import PRESETS, CompareSpec, run_compare
from attnzoo.compare.presets import LADDERS
from attnzoo.compare.report_ladder import write_ladder_report
from attnzoo.data.corpora import prepare_corpus
from attnzoo.distributed import Distributed, resolve_device
from attnzoo.io import atomic_write_text, describe_os_error, file_kind, locked_directory
from attnzoo.results.ladder import load_ladder
from attnzoo.tables import Table
from attnzoo.training.timing import seconds_per_step
from attnzoo.training.trainer import load_corpus
from attnzoo.validation import MAX_COUNT, is_count
from attnzoo.variants import Variant, count_parameters, matched_configs

REPO = Path(__file__).resolve().parents[2]
STATE, SUMMARY = "kit_state.json", "summary.md"
STATE_VERSION = 3  # 3: the plan identity holds the steps and bench cases
# The kit's own files in its folder (the comparison's folder keeps its own rules). A folder the kit has not taken
# (no STATE) that holds one of them is refused: the kit never replaces a file it did not create.
KIT_FILES = (SUMMARY, "corpus.json", "timing.md", "timing.json", "dcmha-triton.md", "dcmha-triton.json", "gpu-check",
             "tests", "logs")  # fmt: skip
PRESET = "gpu-lm"
# The comparisons that train on a GPU, the kit's --preset (gpu-lm the default) beside a GPU ladder's rung.
GPU_PRESETS = tuple(name for name, spec in PRESETS.items() if spec.train.device == "cuda")
# The ladders whose rungs train on a GPU: the kit runs one rung a lease (--preset LADDER --rung NAME).
GPU_LADDERS = tuple(name for name, ladder in LADDERS.items() if ladder.rungs[0].train.device == "cuda")
# Gate (a) of every language-model claim: a compare scaled below it is judged "not measurable" on all of them.
MIN_TOKENS_PER_PARAMETER = LanguageModelGate.min_tokens_per_parameter

# The quick GPU check is the gpu_check stage's own run; the tests stage leaves out the test that repeats it (3 min).
REPEATED_TEST = "tests/test_gpu_check.py::test_the_quick_check_passes_on_this_gpu"
# A dry run's tests stage: pytest run and its junit file read, on a few quick tests of one file; the full suite
# already runs the Triton tests on a CPU.
DRY_RUN_TESTS = ("tests/test_dcmha_triton.py", "-k", "bad_input or runs_on or cannot_compute")

PASSED, FAILED, NOT_RUN, ERROR, INTERRUPTED = "passed", "FAILED", "not run", "ERROR", "interrupted"
PENDING = "pending"

# The step arithmetic's assumptions (plan_steps). A scaled run is evaluated TRAINER_EVALS times by the trainer
# (eval_interval = steps / TRAINER_EVALS) and once more by the compare, each time on the whole validation split; a
# scored token costs a third of a trained one (a forward pass, 2N of the 6N FLOPs). RESERVE is the share of the time
# left kept for the rest of the compare: its bench (a fresh process per variant and case), length extrapolation,
# probes, checkpoints and start-up, none of which the 50 timed steps measure.
TRAINER_EVALS = 4
EVALS_PER_RUN = TRAINER_EVALS + 1
SCORED_TOKEN_COST = 1 / 3
RESERVE = 0.10


# ------------------------------------------------------------------------------------------- step arithmetic


@dataclass(frozen=True)
class StepPlan:
    """How many steps each compare run trains, and what that is estimated to cost."""

    steps: int
    affordable: int  # what the time left allows, before the preset's cap and the floor
    estimated_s: float  # of the compare at ``steps``, the reserve included
    fits: bool  # whether ``estimated_s`` is within the time left


def plan_steps(
    seconds_left: float,
    seconds_per_step: Mapping[str, float],
    *,
    seeds: int,
    max_steps: int,
    min_steps: int,
    eval_steps_per_run: float,
) -> StepPlan:
    """The most steps (at most ``max_steps``, the preset's own) such that ``seeds`` runs of every variant, each
    trained ``steps`` and evaluated for the time of ``eval_steps_per_run`` of its training steps, fit in
    ``seconds_left`` less the reserve, rounded down to a multiple of TRAINER_EVALS so that the evaluations fall on
    50, 75 and 100% of training, the steps the claims' gap-stability gate reads. Fewer than ``min_steps`` would not
    show the claims; the plan then runs ``min_steps`` anyway and says it does not fit, since a GPU lent for less is
    better used than returned."""
    if not seconds_per_step or any(not (s > 0 and math.isfinite(s)) for s in seconds_per_step.values()):
        raise ValueError(f"seconds_per_step={dict(seconds_per_step)} is invalid: needs a time > 0 for each variant")
    if not 1 <= min_steps <= max_steps:
        raise ValueError(f"min_steps={min_steps} is invalid: must be in [1, max_steps={max_steps}]")
    seconds_per_round = seeds * sum(seconds_per_step.values())  # one step of every run
    usable = max(0.0, seconds_left) * (1 - RESERVE)
    affordable = max(0, math.floor(usable / seconds_per_round - eval_steps_per_run))
    steps = max(min_steps, min(max_steps, affordable - affordable % TRAINER_EVALS))
    estimated = seconds_per_round * (steps + eval_steps_per_run) / (1 - RESERVE)
    return StepPlan(steps, affordable, estimated, fits=affordable >= steps)


def eval_steps_per_run(val_tokens: int, seq_len: int, eval_windows: int, tokens_per_step: int) -> float:
    """One run's evaluations in units of its training steps: EVALS_PER_RUN scorings of the windows evaluated."""
    scored = min((val_tokens - 1) // seq_len, eval_windows) * seq_len
    return EVALS_PER_RUN * scored * SCORED_TOKEN_COST / tokens_per_step


def tokens_per_parameter(spec: CompareSpec, vocab_size: int, steps: int) -> float:
    """The tokens a run of ``steps`` trains per parameter of the spec's largest variant: gate (a) counts each model's
    own, so the largest decides whether all of them meet it."""
    configs = matched_configs(spec.variants, spec.baseline_config(vocab_size))
    return steps * spec.train.tokens_per_step / max(count_parameters(config) for config in configs.values())


def scaled_spec(spec: CompareSpec, steps: int, budget_s: float) -> CompareSpec:
    """The preset at ``steps`` (TrainConfig.with_steps), evaluated TRAINER_EVALS times as plan_steps assumes."""
    scaled = dataclasses.replace(spec.train.with_steps(steps), eval_interval=math.ceil(steps / TRAINER_EVALS))
    description = f"{spec.description}; steps scaled to {steps:,} by the GPU kit for a {budget_s / 60:g}-minute budget"
    return dataclasses.replace(spec, train=scaled, description=description)


# ------------------------------------------------------------------------------------------------- the plan


@dataclass(frozen=True)
class KitPlan:
    """What each stage runs: the GPU sizes, or toy sizes for a dry run on a CPU."""

    name: str
    budget_s: float
    spec: CompareSpec  # the preset (or the ladder's rung) before its steps are scaled
    gpu_check_args: tuple[str, ...]
    bench_args: tuple[str, ...]
    timing_steps: int
    min_steps: int
    # Narrows the tests stage's pytest (after -m "cuda or triton"): the dry run checks that the stage runs pytest and
    # reads its junit file, on one small file; the full suite already runs the Triton tests on a CPU.
    test_args: tuple[str, ...] = ()
    ladder: str | None = None  # the ladder whose rung ``spec`` is; None: a GPU preset (gpu-lm, gpu-ablations, ...)

    @property
    def identity(self) -> dict[str, Any]:
        """What a resumed kit must share with the one that started the folder."""
        return {
            "plan": self.name,
            "budget_s": self.budget_s,
            **({"ladder": self.ladder} if self.ladder else {}),  # a gpu-lm folder started before ladders resumes
            "preset": self.spec.name,
            "variants": self.spec.variant_labels,
            "seeds": list(self.spec.seeds),
            "steps": self.spec.train.steps,
            "bench": [list(case) for case in self.spec.evals.bench_cases],
        }

    @property
    def label(self) -> str:
        return f"{self.ladder} rung {self.spec.name}" if self.ladder else self.spec.name


def make_plan(
    dry_run: bool,
    budget_min: float | None = None,
    variants: Sequence[str] = (),
    seeds: int | None = None,
    steps: int | None = None,
    bench: bool = True,
    preset: str = PRESET,
    rung: str | None = None,
) -> KitPlan:
    """The GPU plan, or the dry run's toy, of a GPU ``preset`` (gpu-lm, gpu-ablations, ...) or of one ``rung`` of a
    GPU ladder named by ``preset``; ``variants`` (the first the baseline) and ``seeds`` narrow the compare, ``steps``
    fixes its length (the timing stage then only says whether it fits) and ``bench=False`` leaves out its throughput
    cases: a short lease spends its minutes on the runs a verdict reads."""
    if preset in GPU_LADDERS:
        rungs = {spec.name: spec for spec in LADDERS[preset].rungs}
        if rung not in rungs:
            raise ValueError(f"rung {rung!r} is not one of {preset}'s rungs {list(rungs)}: a ladder runs one a lease")
        plan = _make_plan(dry_run, budget_min, rungs[rung], preset)
    elif preset in GPU_PRESETS:
        if rung is not None:
            raise ValueError(f"rung {rung!r} goes with a GPU ladder ({', '.join(GPU_LADDERS)}), not with {preset!r}")
        plan = _make_plan(dry_run, budget_min, PRESETS[preset], None)
    else:
        raise ValueError(
            f"preset {preset!r} is not one of the GPU presets {list(GPU_PRESETS)} or GPU ladders {list(GPU_LADDERS)}"
        )
    narrowed: dict[str, Any] = {}
    if variants:
        narrowed["variants"] = Variant.parse_all(variants)
    if seeds is not None:
        narrowed["seeds"] = tuple(range(seeds))
    if steps is not None:
        narrowed["train"] = plan.spec.train.with_steps(steps)
        plan = dataclasses.replace(plan, min_steps=steps)
    if not bench:
        narrowed["evals"] = dataclasses.replace(plan.spec.evals, bench_cases=())
    return dataclasses.replace(plan, spec=dataclasses.replace(plan.spec, **narrowed)) if narrowed else plan


def _make_plan(dry_run: bool, budget_min: float | None, preset: CompareSpec, ladder: str | None) -> KitPlan:
    if not dry_run:
        budget_s = 60.0 * (40 if budget_min is None else budget_min)
        # gpu-lm's floor, 200 steps (6.5M tokens per run, 0.6 per parameter), is already near the CPU claims
        # preset's 0.4 tokens per parameter, where issue 23 found every LM difference smaller than 100 steps of
        # progress. A rung has none: it runs in one call of a lease, and one the call's timeout cuts off leaves no
        # results at all, where a shrunk rung still records its curves (and says loudly that gate (a) fails).
        min_steps = TRAINER_EVALS if ladder else 200
        return KitPlan("gpu", budget_s, preset, ("--quick",), (), timing_steps=50, min_steps=min_steps, ladder=ladder)
    micro = PRESETS["micro"]
    toy = dataclasses.replace(
        preset,
        # A rung keeps its depth at micro's width, so that toy rungs differ in size as a ladder's must.
        model={**micro.model, "n_layers": preset.model["n_layers"]} if ladder else micro.model,
        train=dataclasses.replace(
            preset.train,
            seq_len=32,
            batch_size=8,
            steps=40,
            warmup_steps=4,
            eval_interval=10,
            eval_windows=64,
            checkpoint_interval=10,
            device="cpu",
        ),
        seeds=(0, 1),
        # The toy scores 64 validation windows, not the whole split the GPU preset scores.
        evals=dataclasses.replace(micro.evals, val_windows=64),
    )
    bench_args = ("--seq-lens", "64", "--tokens", "128", "--window-types", "L", "--repeats", "1", "--warmup", "1")
    budget_s = 60.0 * (2 if budget_min is None else budget_min)
    tests = DRY_RUN_TESTS
    # gpu_check's own tests cover its sections; here 10 s of them show the stage's plumbing, the rest recorded as
    # skipped (its compile sections alone take a minute of inductor on a CPU).
    check = ("--dry-run", "--budget", "10")
    return KitPlan(
        "dry run", budget_s, toy, check, bench_args, timing_steps=6, min_steps=4, test_args=tests, ladder=ladder
    )


# ----------------------------------------------------------------------------------------- stages and state


@dataclass(frozen=True)
class Outcome:
    """What a stage found. ``completed``: it ran to its own end, so a resumed kit skips it."""

    status: str
    note: str = ""
    outputs: tuple[str, ...] = ()  # relative to OUT
    completed: bool = True
    data: dict[str, Any] = field(default_factory=dict)  # what later stages read
    exit_code: int | None = None  # set: stop the kit with this code (a signal stopped the stage)


@dataclass(frozen=True)
class Stage:
    name: str
    what: str
    run: Callable[[Kit], Outcome]


class Kit:
    """One invocation: the plan, the output folder and the state of every stage, as read and as written."""

    def __init__(self, plan: KitPlan, out: Path):
        self.plan, self.out = plan, out
        self.fresh = not (out / STATE).is_file()  # no kit has taken the folder yet
        self.state = self._read_state()
        self.stage_started = time.perf_counter()

    def _read_state(self) -> dict[str, Any]:
        path = self.out / STATE
        if not path.is_file():
            return {"version": STATE_VERSION, "identity": self.plan.identity, "stages": {}}
        state = json.loads(path.read_text(encoding="utf-8"))
        stored, wanted = dict(state.get("identity") or {}), self.plan.identity
        old_budget = stored.pop("budget_s", None)
        if state.get("version") != STATE_VERSION or stored != {k: v for k, v in wanted.items() if k != "budget_s"}:
            raise ValueError(
                f"{self.out} holds a GPU kit run of another plan ({state.get('identity')}, not "
                f"{wanted}): resume it with the flags it started with, or choose another --out"
            )
        if old_budget != self.plan.budget_s:
            # The budget decides nothing until the timing stage plans the compare's steps from it.
            if state["stages"].get("timing", {}).get("completed"):
                raise ValueError(
                    f"{self.out}: its timing stage planned the compare's steps for a {old_budget / 60:g}-minute "
                    f"budget; resume it with --budget-min {old_budget / 60:g}, or choose another --out"
                )
            state["identity"] = wanted
        return state

    @property
    def stages(self) -> dict[str, dict[str, Any]]:
        return self.state["stages"]

    def completed(self, name: str) -> bool:
        return self.stages.get(name, {}).get("completed", False)

    def spent_s(self) -> float:
        """Seconds the stages have spent over every invocation, the running one's so far included."""
        recorded = sum(record["seconds"] for record in self.stages.values())
        return recorded + time.perf_counter() - self.stage_started

    def record(self, stage: Stage, outcome: Outcome, seconds: float) -> None:
        earlier = self.stages.get(stage.name, {}).get("seconds", 0.0)
        self.stages[stage.name] = {
            "status": outcome.status,
            "completed": outcome.completed,
            "note": outcome.note,
            "outputs": list(outcome.outputs),
            "data": outcome.data,
            "seconds": round(earlier + seconds, 1),  # every attempt's: the budget counts them all
            "at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        }
        self.save()

    def save(self) -> None:
        atomic_write_text(self.out / STATE, json.dumps(self.state, indent=2) + "\n")

    @property
    def compare_dir(self) -> Path:
        """gpu-lm's comparison is the kit folder's ``compare/``; a rung's sits beside the other rungs in the
        ladder's folder, the kit folder's parent, where load_ladder finds them."""
        return self.out.parent / self.plan.spec.name if self.plan.ladder else self.out / "compare"

    def relative(self, path: Path) -> str:
        return Path(os.path.relpath(path, self.out)).as_posix()


def run_stages(kit: Kit, stages: Sequence[Stage], redo: Sequence[str] = (), skip: Sequence[str] = ()) -> int:
    """Run every stage not yet completed (and those in ``redo``), in order, but those in ``skip``, which are recorded
    as not run; 0 if every stage run completed and none failed, 1 otherwise, or the exit code of a stage that a
    signal stopped."""
    for stage in stages:
        if stage.name in skip:
            if not kit.completed(stage.name):
                kit.record(stage, Outcome(NOT_RUN, "left out by --skip", completed=False), 0.0)
            say(f"{stage.name}: left out (--skip)")
            continue
        if kit.completed(stage.name) and stage.name not in redo:
            say(f"{stage.name}: completed earlier ({kit.stages[stage.name]['status']}), skipped")
            continue
        say(f"\n=== {stage.name}: {stage.what} ({kit.spent_s() / 60:.1f} of {kit.plan.budget_s / 60:g} min spent)")
        kit.stage_started = time.perf_counter()
        try:
            outcome = stage.run(kit)
        except Exception as err:  # a stage's crash (a lost GPU, a bug) is recorded; the next stages still run
            traceback.print_exc()
            outcome = Outcome(ERROR, f"{type(err).__name__}: {err}", completed=False)
        seconds = time.perf_counter() - kit.stage_started
        kit.stage_started = time.perf_counter()
        kit.record(stage, outcome, seconds)
        write_summary(kit, stages)
        say(f"{stage.name}: {outcome.status} in {seconds:.0f} s{': ' + outcome.note if outcome.note else ''}")
        if outcome.exit_code is not None:
            return outcome.exit_code
    run = [s.name for s in stages if s.name not in skip]
    bad = [name for name in run if not kit.completed(name) or kit.stages[name]["status"] in (FAILED, ERROR)]
    return 1 if bad else 0


def say(message: str) -> None:
    print(message, flush=True)


def run_logged(kit: Kit, name: str, command: Sequence[str]) -> tuple[int, str]:
    """Run ``command`` from the repository root, its output to the terminal and to ``logs/<name>.log``."""
    log = kit.out / "logs" / f"{name}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    say("$ " + " ".join(command))
    lines = []
    with (
        open(log, "w", encoding="utf-8") as f,
        subprocess.Popen(
            command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace"
        ) as process,
    ):
        assert process.stdout is not None
        for line in process.stdout:
            sys.stdout.write(line)
            f.write(line)
            lines.append(line)
    return process.returncode, "".join(lines)


# ---------------------------------------------------------------------------------------------- the stages


def corpus_stage(kit: Kit) -> Outcome:
    data = kit.plan.spec.train.data
    corpus = prepare_corpus(data.corpus, data.tokenizer, data.val_fraction)
    info = {key: value for key, value in corpus.info.items() if key not in ("cache", "self_sha256")}
    train = kit.plan.spec.train
    # Gate (a)'s two figures at the preset's steps, before the timing stage scales them.
    passes = train.steps * train.tokens_per_step / len(corpus.train)
    per_parameter = tokens_per_parameter(kit.plan.spec, corpus.tokenizer.vocab_size, train.steps)
    record = {
        **info,
        "train_tokens": len(corpus.train),
        "val_tokens": len(corpus.val),
        "passes_per_run": passes,
        "tokens_per_parameter": per_parameter,
    }
    atomic_write_text(kit.out / "corpus.json", json.dumps(record, indent=2) + "\n")
    note = (
        f"{corpus.name}: {len(corpus.tokens):,} tokens ({len(corpus.train):,} train, {len(corpus.val):,} val) "
        f"from {info.get('files', 0):,} files, Python {info.get('python_version', '?')}, tokens sha256 "
        f"{info['files_sha256']['tokens.bin'][:12]}; a run of {train.steps:,} steps is {per_parameter:.1f} tokens "
        f"per parameter and reads the training split {passes:.2f} times"
    )
    if passes > 1:  # the validation loss then rises as the models memorise it (gpu-2026-11-26b), no verdict reads
        return Outcome(FAILED, f"{note}: more than once, so the models would overfit it", ("corpus.json",))
    return Outcome(PASSED, note, ("corpus.json",))


def gpu_check_stage(kit: Kit) -> Outcome:
    out = kit.out / "gpu-check"
    command = [sys.executable, "benchmarks/gpu_check.py", *kit.plan.gpu_check_args, "--out", str(out)]
    code, _ = run_logged(kit, "gpu_check", command)
    reports = [json.loads(p.read_text(encoding="utf-8")) for p in sorted(out.glob("*.json"))]
    finished = [r for r in reports if r.get("meta", {}).get("finished")]
    # 1 is also a crash's exit code: only a finished report says the check ran to its end.
    if code not in (0, 1) or not finished:
        return Outcome(ERROR, f"exited {code} before its report was finished (logs/gpu_check.log)", completed=False)
    outputs = tuple(kit.relative(p) for p in sorted(out.iterdir()) if p.suffix in (".md", ".json"))
    failures = finished[0].get("failures", 0)
    return Outcome(PASSED if code == 0 else FAILED, f"{failures} failing check(s)", outputs)


# pytest's exit codes of a run that reached its end: 0 all passed, 1 some failed, 5 none collected; the others
# (interrupted, internal or usage error) did not.
PYTEST_FINISHED = (0, 1, 5)


def gpu_tests_command(args: Sequence[str], junit: Path) -> list[str]:
    """``pytest -m "cuda or triton"`` narrowed by ``args``, without :data:`REPEATED_TEST`, writing ``junit``. One
    process (-n 0, not the suite's worker per core from pyproject's addopts): the CUDA tests share one GPU."""
    command = [sys.executable, "-m", "pytest", "-m", "cuda or triton", "-q", "-p", "no:cacheprovider", "-n", "0"]
    return [*command, *args, "--deselect", REPEATED_TEST, f"--junitxml={junit}"]


def junit_counts(junit: Path) -> dict[str, Any]:
    """passed, failed (failures and errors) and skipped of a pytest junit file, and the failed tests' ids."""
    suite = ElementTree.parse(junit).getroot()
    suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
    counts = {key: int(suite.get(key, 0)) for key in ("tests", "failures", "errors", "skipped")}
    failed = [
        f"{case.get('classname')}::{case.get('name')}"
        for case in suite.iter("testcase")
        if case.find("failure") is not None or case.find("error") is not None
    ]
    return {
        "passed": counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"],
        "failed": counts["failures"] + counts["errors"],
        "skipped": counts["skipped"],
        "failed_tests": failed,
    }


def tests_stage(kit: Kit) -> Outcome:
    junit = kit.out / "tests" / "junit.xml"
    junit.parent.mkdir(parents=True, exist_ok=True)
    code, _ = run_logged(kit, "tests", gpu_tests_command(kit.plan.test_args, junit))
    if code not in PYTEST_FINISHED or not junit.is_file():
        return Outcome(ERROR, f"pytest exited {code} (logs/tests.log)", completed=False)
    counts = junit_counts(junit)
    note = f"{counts['passed']} passed, {counts['failed']} failed, {counts['skipped']} skipped"
    status = {0: PASSED, 1: FAILED, 5: NOT_RUN}[code]
    return Outcome(status, note, (kit.relative(junit),))


def dcmha_triton_stage(kit: Kit) -> Outcome:
    out = kit.out / "dcmha-triton.md"
    command = [sys.executable, "benchmarks/bench_dcmha_triton.py", *kit.plan.bench_args, "--out", str(out)]
    code, text = run_logged(kit, "dcmha_triton", command)
    if code == 0 and out.is_file():
        return Outcome(PASSED, "", (kit.relative(out), kit.relative(out.with_suffix(".json"))))
    # Its one refusal (no CUDA, or no Triton) is a result: the stage cannot measure on this machine.
    refusal = [line for line in text.splitlines() if line.endswith("nothing was measured")]
    if code == 2 and refusal:
        return Outcome(NOT_RUN, refusal[0].removeprefix("bench_dcmha_triton: "))
    return Outcome(ERROR, f"exited {code} (logs/dcmha_triton.log)", completed=False)


def timing_stage(kit: Kit) -> Outcome:
    spec, plan = kit.plan.spec, kit.plan
    env = Distributed(device=resolve_device(spec.train.device))
    corpus = load_corpus(spec.train.data, env)
    train = spec.train
    configs = matched_configs(spec.variants, spec.baseline_config(corpus.tokenizer.vocab_size))
    per_step = {  # each at its own length (+lenN), on the same tokens a step
        v.label: seconds_per_step(configs[v.label], spec.train_for(v), corpus, env, plan.timing_steps)
        for v in spec.variants
    }
    largest = max(count_parameters(config) for config in configs.values())
    baseline = per_step[spec.variant_labels[0]]
    evals = eval_steps_per_run(len(corpus.val), train.seq_len, train.eval_windows, train.tokens_per_step)
    left = plan.budget_s - kit.spent_s()
    steps = plan_steps(
        left,
        per_step,
        seeds=len(spec.seeds),
        max_steps=train.steps,
        min_steps=plan.min_steps,
        eval_steps_per_run=evals,
    )
    rows = [
        [label, f"{seconds * 1e3:,.1f}", f"{train.tokens_per_step / seconds:,.0f}", f"{seconds / baseline:.2f}×"]
        for label, seconds in per_step.items()
    ]
    table = Table(["variant", "ms/step", "tokens/s", "time vs baseline"], rows).to_markdown()
    tokens = steps.steps * train.tokens_per_step
    per_parameter = tokens / largest
    fixed = plan.min_steps == train.steps  # --steps: the length is given, not chosen
    of = "(--steps)" if fixed else f"of the preset's {train.steps:,}"
    verdict = (
        f"{steps.steps:,} steps {of} ({tokens:,} tokens per run, {per_parameter:.1f} per parameter), estimated "
        f"{steps.estimated_s / 60:.1f} min of the {left / 60:.1f} min left"
    )
    if not steps.fits:
        floor = "" if fixed else f", below the floor of {plan.min_steps}"
        verdict += f": over the budget, which affords {steps.affordable:,} steps{floor}"
    if per_parameter < MIN_TOKENS_PER_PARAMETER:
        verdict += f"; BELOW the {MIN_TOKENS_PER_PARAMETER:g} tokens per parameter of gate (a) (summary.md)"
    text = (
        f"# GPU kit: step timing ({plan.name})\n\n{plan.timing_steps} training steps of each {spec.name} variant "
        f"({train.batch_size} × {train.seq_len} tokens a step, {env.device.type}); the median of the logged "
        f"intervals after the first.\n\n{table}\n\nEach run is also scored {EVALS_PER_RUN}× on "
        f"{min((len(corpus.val) - 1) // train.seq_len, train.eval_windows):,} validation windows "
        f"(≈ {evals:,.1f} training steps at a third of a step's cost per token), and {RESERVE:.0%} of the time left "
        f"is kept for the compare's bench, extrapolation and start-up.\n\n**Plan:** {verdict}.\n"
    )
    atomic_write_text(kit.out / "timing.md", text)
    data = {
        "seconds_per_step": per_step,
        "eval_steps_per_run": evals,
        "seconds_left": left,
        **dataclasses.asdict(steps),
        "preset_steps": train.steps,
        "tokens_per_parameter": per_parameter,
    }
    atomic_write_text(kit.out / "timing.json", json.dumps(data, indent=2) + "\n")
    return Outcome(PASSED, verdict, ("timing.md", "timing.json"), data=data)


def compare_stage(kit: Kit) -> Outcome:
    if not kit.completed("timing"):
        return Outcome(NOT_RUN, "the timing stage has not completed: nothing says how many steps fit", completed=False)
    if kit.stages.get("corpus", {}).get("status") == FAILED:  # its runs would overfit: no verdict would read them
        note = "the corpus stage failed (a run would read its training split more than once): fewer --steps"
        return Outcome(NOT_RUN, note, completed=False)
    spec = scaled_spec(kit.plan.spec, kit.stages["timing"]["data"]["steps"], kit.plan.budget_s)
    out = kit.compare_dir
    result = run_compare(spec, out, progress=sys.stderr.isatty())
    if result.interrupted_by is not None:
        note = f"stopped by signal {result.interrupted_by}; run the kit again to resume it"
        return Outcome(INTERRUPTED, note, completed=False, exit_code=128 + result.interrupted_by)
    outputs = tuple(kit.relative(out / name) for name in ("report.md", "report.html", "results.json"))
    note = f"{spec.train.steps:,} steps per run; see {kit.relative(out / 'report.md')}"
    if kit.plan.ladder:
        note += "; " + judge_ladder(out.parent)
    return Outcome(PASSED, note, outputs)


def judge_ladder(folder: Path) -> str:
    """The ladder's report over every rung in ``folder`` once it holds two: a rung brought back from an earlier
    lease and this one, side by side."""
    try:
        ladder, dirs = load_ladder(folder)
    except ValueError as err:  # rungs of another protocol or of one size: each rung's own report still stands
        return f"its rungs do not form one ladder: {err}"
    if len(ladder.rungs) < 2:
        return (
            f"the ladder's other rungs are not in {folder} yet: copy them there and judge them with "
            f"`attnzoo compare --out {folder} --report-only`"
        )
    paths = write_ladder_report(ladder, dirs, folder)
    return f"the ladder of {len(ladder.rungs)} rungs judged in {paths['markdown']}"


STAGES = (
    Stage("corpus", "the preset's corpus prepared offline", corpus_stage),
    Stage("gpu_check", "benchmarks/gpu_check.py", gpu_check_stage),
    Stage("tests", 'pytest -m "cuda or triton"', tests_stage),
    Stage("dcmha_triton", "benchmarks/bench_dcmha_triton.py", dcmha_triton_stage),
    Stage("timing", "training steps of each variant, and the steps that fit", timing_stage),
    Stage("compare", "the preset (gpu-lm, or a GPU ladder's rung) at those steps", compare_stage),
)


# ------------------------------------------------------------------------------------------------- summary


def device_description(plan: KitPlan) -> str:
    if plan.name != "dry run" and torch.cuda.is_available():
        return f"{torch.cuda.get_device_name()} (CUDA {torch.version.cuda})"
    return f"CPU ({platform.machine()}, {os.cpu_count()} cores)"


def source_commit() -> str:
    try:
        done = subprocess.run(["git", "describe", "--always", "--dirty"], cwd=REPO, capture_output=True, text=True)
    except OSError:
        return "unknown (no git)"
    return done.stdout.strip() if done.returncode == 0 else "unknown (not a git checkout)"


def write_summary(kit: Kit, stages: Sequence[Stage]) -> None:
    plan = kit.plan
    rows = []
    for stage in stages:
        record = kit.stages.get(stage.name)
        if record is None:
            rows.append([stage.name, stage.what, PENDING, "–", "", ""])
            continue
        status = record["status"] + ("" if record["completed"] else " (incomplete: runs again on resume)")
        outputs = ", ".join(f"[{path}]({path})" for path in record["outputs"])
        rows.append([stage.name, stage.what, status, f"{record['seconds'] / 60:.1f}", outputs, record["note"]])
    problems = [row for row in rows if row[2] not in (PASSED, NOT_RUN, PENDING)]
    # The folder and flags that resume it: a rung's kit folder is inside the ladder's, which --out names.
    resume_out = kit.out.parent if plan.ladder else kit.out
    if plan.ladder:
        resume_flags = f" --preset {plan.ladder} --rung {plan.spec.name}"
    else:
        resume_flags = "" if plan.spec.name == PRESET else f" --preset {plan.spec.name}"
    lines = [
        f"# attnzoo GPU kit: {device_description(plan)}" + (" (dry run, toy sizes)" if plan.name == "dry run" else ""),
        "",
        f"attnzoo {attnzoo.__version__} at commit {source_commit()}, torch {torch.__version__}, Python "
        f"{platform.python_version()}. Budget {plan.budget_s / 60:g} min; the stages have spent "
        f"{sum(r['seconds'] for r in kit.stages.values()) / 60:.1f} min. Updated "
        f"{datetime.now(timezone.utc).isoformat(timespec='seconds')}.",
        "",
        f"The {plan.label} verdicts are at this run's scale (the compare report states its tokens per run and "
        "parameters), never at the papers'.",
        "",
        *budget_warning(kit),
        Table(["stage", "what", "status", "minutes", "outputs", "note"], rows).to_markdown(),
        "",
        "## Failures",
        "",
        *([f"- {row[0]}: {row[2]}: {row[5] or 'see its log under logs/'}" for row in problems] or ["None."]),
        "",
        f"Resume (or finish) with `bash scripts/gpu_kit.sh{' --dry-run' if plan.name == 'dry run' else ''} "
        f"--out {resume_out}{resume_flags}`; `{kit.relative(kit.compare_dir / 'runs')}/` holds checkpoints and is "
        "not meant to be committed.",
        "",
    ]
    atomic_write_text(kit.out / SUMMARY, "\n".join(lines))


def budget_warning(kit: Kit) -> list[str]:
    """Said at the top of the summary when the compare trains fewer tokens per parameter than gate (a) asks: every
    language-model claim it judges is then "not measurable", whatever its curves show."""
    timing = kit.stages.get("timing", {}).get("data", {})
    per_parameter = timing.get("tokens_per_parameter")
    if per_parameter is None or per_parameter >= MIN_TOKENS_PER_PARAMETER:
        return []
    steps, preset_steps = timing["steps"], timing["preset_steps"]
    why = (
        f"the time measured affords {steps:,} of the preset's {preset_steps:,} steps: give it a longer budget or a "
        "faster GPU for a verdict"
        if steps < preset_steps
        else "the preset's own steps are that few"
    )
    return [
        f"**BELOW THE PROTOCOL'S BUDGET: the compare trains {per_parameter:.1f} tokens per parameter, under the "
        f"{MIN_TOKENS_PER_PARAMETER:g} that gate (a) asks, so every language-model claim it judges is not "
        f"measurable; {why}.**",
        "",
    ]


# -------------------------------------------------------------------------------------------------- command


def out_argument(text: str) -> Path:
    """``--out ''`` is the repository root to pathlib (the script runs from there): refused, not written into."""
    if not text:
        raise argparse.ArgumentTypeError("the path is empty: name a folder for the kit's results")
    return Path(text)


def check_out(out: Path) -> None:
    """``out`` can be the kit's folder: a directory, or one that can be made, and never the checkout itself or a
    folder above it, where its files would mix with the clone's."""
    if out == REPO or out in REPO.parents:
        raise ValueError(f"--out {out} holds this checkout ({REPO}): name a folder of its own, e.g. {REPO}/runs/kit")
    if out.exists() and not out.is_dir():
        kind = "file" if out.is_file() else file_kind(out)
        raise ValueError(f"--out {out} is a {kind}, not a folder: name a folder to write into")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ValueError(f"--out {out} cannot be made: {describe_os_error(err)}") from None


def keep_out_of_git(out: Path, ignored: str) -> None:
    """Give ``out`` the kit's .gitignore where it has none. One it has (the user's, another project's) is left as it
    is, with the lines it lacks said: the kit never replaces a file it did not create."""
    path = out / ".gitignore"
    if not (path.exists() or path.is_symlink()):
        atomic_write_text(path, ignored)
        return
    present = path.read_text(encoding="utf-8", errors="replace").splitlines() if path.is_file() else []
    lacking = [line for line in ignored.splitlines() if line not in present]
    if lacking:
        say(f"{path} is not the kit's: left as it is; add {', '.join(lacking)} to it to keep the runs out of git")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    default_out = REPO / "benchmarks" / "results" / f"gpu-{date.today().isoformat()}"
    parser.add_argument(
        "--out", type=out_argument, default=default_out, help=f"where everything goes (default {default_out})"
    )
    parser.add_argument("--budget-min", type=float, help="minutes of device time for every stage (default 40; 2 dry)")
    parser.add_argument("--dry-run", action="store_true", help="every stage at toy sizes on the CPU, as CI runs it")
    names = [stage.name for stage in STAGES]
    parser.add_argument("--redo", nargs="+", default=[], choices=names, metavar="STAGE", help=f"from {names}")
    parser.add_argument(
        "--skip", nargs="+", default=[], choices=names, metavar="STAGE", help="stages left out of this invocation"
    )
    parser.add_argument(
        "--preset",
        choices=[*GPU_PRESETS, *GPU_LADDERS],
        default=PRESET,
        help=f"what the compare runs: {PRESET} (default), another GPU preset, or one rung of a GPU ladder (with "
        "--rung), each rung in its own folder inside --out beside the rungs of other leases",
    )
    rungs = sorted({rung.name for name in GPU_LADDERS for rung in LADDERS[name].rungs})
    parser.add_argument("--rung", choices=rungs, help="the ladder's rung this lease runs (with --preset LADDER)")
    parser.add_argument("--variants", nargs="+", default=[], metavar="SPEC", help="default: the preset's own")
    parser.add_argument("--seeds", type=int, help="train seeds 0..N-1 (default: the preset's)")
    parser.add_argument(
        "--steps", type=int, help="train exactly this many steps a run (default: as many as fit, at most the preset's)"
    )
    parser.add_argument("--no-bench", action="store_true", help="the compare measures no throughput cases")
    args = parser.parse_args(argv)
    if args.budget_min is not None and not (math.isfinite(args.budget_min) and args.budget_min > 0):
        parser.error(f"--budget-min={args.budget_min} is invalid: must be a number of minutes > 0")
    if args.seeds is not None and args.seeds < 1:
        parser.error(f"--seeds={args.seeds} is invalid: must be an integer >= 1")
    if args.steps is not None and not is_count(args.steps):
        parser.error(f"--steps={args.steps} is invalid: must be an integer in [1, {MAX_COUNT}]")
    if overlap := sorted(set(args.skip) & set(args.redo)):
        parser.error(f"--skip and --redo both name {overlap}: a stage is either left out or run again")
    if not args.dry_run and not torch.cuda.is_available():
        parser.error("no CUDA device is visible (torch.cuda.is_available() is False): run it on a GPU, or --dry-run")
    ladder = args.preset if args.preset in GPU_LADDERS else None
    if (ladder is None) != (args.rung is None):
        parser.error(f"--rung goes with a ladder's --preset ({', '.join(GPU_LADDERS)}), and a ladder needs --rung")
    try:
        plan = make_plan(
            args.dry_run,
            args.budget_min,
            args.variants,
            args.seeds,
            args.steps,
            not args.no_bench,
            args.preset,
            args.rung,
        )
    except ValueError as err:
        parser.error(str(err))
    out = args.out.resolve()  # the stages' commands run from the repository root
    try:
        check_out(out)
    except ValueError as err:
        parser.error(str(err))
    # A rung's kit folder (its state, summary, timing and logs) is kit-RUNG inside the ladder's folder, beside the
    # rung's comparison, so that rungs run on different leases unpack into one folder without colliding.
    kit_dir = out / f"kit-{args.rung}" if ladder else out
    foreign = [] if (kit_dir / STATE).is_file() else [name for name in KIT_FILES if (kit_dir / name).exists()]
    if foreign:  # before the lock, whose file would be the first written
        parser.error(
            f"--out {kit_dir} holds {', '.join(foreign)}, which no GPU kit wrote (it has no {STATE}): the kit never "
            "replaces a file it did not create; choose another --out, or move them"
        )
    with locked_directory(kit_dir, "GPU kit folder"):
        kit = Kit(plan, kit_dir)
        if "timing" in args.redo and "compare" in kit.stages:
            parser.error(
                "--redo timing is refused: the compare in this folder has begun with the steps the timing chose, "
                "and new ones would not match its runs; choose another --out"
            )
        if kit.fresh:
            kit.save()  # taken: what it writes from here is its own, and a kit stopped in its first stage resumes
        keep_out_of_git(out, "*/runs/\n*/.attnzoo.lock\n" if ladder else "compare/runs/\n.attnzoo.lock\n")
        say(f"GPU kit ({plan.name}, {plan.label}, {plan.budget_s / 60:g} min) on {device_description(plan)} → {out}")
        code = run_stages(kit, STAGES, args.redo, args.skip)
        write_summary(kit, STAGES)
    say(f"\nGPU kit: {'done' if code == 0 else f'exit {code}'}; summary in {kit_dir / SUMMARY}")
    return code
