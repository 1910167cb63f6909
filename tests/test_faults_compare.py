"""The comparison's surface under hostile use (issue 55): nothing is written into a directory before every check has
passed and its lock is held, stored numbers are checked on every way in (report-only, merge, resume, rung folders),
an executor the user named is never silently swapped for another, and local workers end with their driver."""

import contextlib
import dataclasses
import io
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
from training_helpers import write_text_corpus

from attnzoo.cli import main
from attnzoo.compare import resolve_spec, run_compare
from attnzoo.compare.executors import ExecutorConfig
from attnzoo.compare.runner import run_ladder
from attnzoo.compare.spec import LadderSpec
from attnzoo.io import DirectoryLocked
from attnzoo.results.comparison import READABLE_VERSIONS

FIXTURE = Path(__file__).parent / "fixtures" / "compare_micro"
RUN = Path("runs/mha+rope/seed0")
RECORD = RUN / "compare_run.json"


def _spec(text: Path, variants=("mha+rope",)):
    spec = resolve_spec("micro", variants=list(variants), seeds=[0], corpus=str(text), tasks=[])
    return dataclasses.replace(spec, evals=dataclasses.replace(spec.evals, bench_cases=()))


def _compare(spec, out, **options):
    with contextlib.redirect_stdout(io.StringIO()) as printed:
        result = run_compare(spec, out, progress=False, **options)
    assert result.interrupted_by is None
    return printed.getvalue()


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """One finished run of a one-variant comparison, made as on another machine: the source of every merge here."""
    root = tmp_path_factory.mktemp("faults")
    text = write_text_corpus(root / "text.txt")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("ATTNZOO_CACHE_DIR", str(root / "cache"))
        _compare(_spec(text), root / "source")
    return {"source": root / "source", "text": text, "cache": root / "cache"}


@pytest.fixture
def spec(made, monkeypatch):
    monkeypatch.setenv("ATTNZOO_CACHE_DIR", str(made["cache"]))
    return _spec(made["text"])


@pytest.fixture
def source(made, tmp_path):
    """A copy of the made source, to edit."""
    return Path(shutil.copytree(made["source"], tmp_path / "source"))


def _edit_record(source: Path, change) -> None:
    path = source / RECORD
    record = json.loads(path.read_text())
    change(record)
    path.write_text(json.dumps(record))


# ------------------------------------------------------------------------------------------------- --merge-from


HOLDER = textwrap.dedent(
    """
    import sys, time
    from attnzoo.io import locked_directory
    with locked_directory(sys.argv[1]):
        print("locked", flush=True)
        time.sleep(120)
    """
)


def test_a_merge_into_a_directory_another_compare_holds_is_refused_and_copies_nothing(spec, source, tmp_path):
    """Runs were copied into a folder that another compare held locked."""
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(out)], stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(DirectoryLocked, match=rf"pid {holder.pid}\b"):
            run_compare(spec, out, progress=False, merge_from=[source])
    finally:
        holder.kill()
        holder.wait()
    assert not (out / "runs").exists()


def test_a_merge_whose_flags_are_refused_copies_nothing(made, source, tmp_path, capsys, monkeypatch):
    """70 runs were copied in before a bad --variants was refused."""
    monkeypatch.setenv("ATTNZOO_CACHE_DIR", str(made["cache"]))
    out = tmp_path / "out"
    argv = ["compare", "--preset", "micro", "--out", str(out), "--merge-from", str(source), "--data", str(made["text"])]
    assert main([*argv, "--variants", "mha+rope", "mha+nope"]) == 1
    assert "mha+nope" in capsys.readouterr().err
    assert not (out / "runs").exists()


def test_a_merge_never_deletes_an_unfinished_run_it_did_not_write(spec, source, tmp_path):
    """An unfinished run of another comparison in --out lost 6 of its 12 steps: the finished one replaced it."""
    out = tmp_path / "out"
    unfinished = out / RUN
    unfinished.mkdir(parents=True)
    (unfinished / "metrics.jsonl").write_text('{"step": 1, "train_loss": 5.0}\n')
    with pytest.raises(
        ValueError, match=re.escape(f"{unfinished} holds an unfinished run, which merging would replace")
    ):
        run_compare(spec, out, progress=False, merge_from=[source])
    assert (unfinished / "metrics.jsonl").read_text() == '{"step": 1, "train_loss": 5.0}\n'
    assert [p.name for p in unfinished.iterdir()] == ["metrics.jsonl"]


def _nan_loss(record):
    record["val"]["loss"] = math.nan


def _negative_loss(record):
    record["val"]["loss"] = -1.0


def _edited_parameters(record):
    record["parameters"] = 0


def _no_provenance(record):
    record["provenance"] = None


def _another_evaluation(record):
    record["evals"]["val_blocks"] += 1


@pytest.mark.parametrize(
    ("damage", "words"),
    [
        (_nan_loss, r"compare_run.json.val.loss = nan is invalid: must be a finite number"),
        (_negative_loss, r"compare_run.json.val.loss = -1.0 is invalid: must be >= 0"),
        (_edited_parameters, r"compare_run.json.parameters = 0 is invalid: must be >= 1"),
        (_no_provenance, r"records no provenance \(the host, device and commit that trained it\)"),
        (_another_evaluation, r"was evaluated under other settings than this comparison's"),
    ],
)
def test_a_merged_run_is_checked_as_report_only_checks_a_stored_one(spec, source, tmp_path, damage, words):
    """A NaN loss ended in AttributeError ('float' object has no attribute 'numerator'), a negative or edited one
    was merged and rendered, a run without provenance merged without a word."""
    _edit_record(source, damage)
    out = tmp_path / "out"
    with pytest.raises(ValueError, match=words):
        run_compare(spec, out, progress=False, merge_from=[source])
    assert not (out / "runs").exists()


def test_a_merged_run_of_another_comparison_is_refused_by_name(spec, source, tmp_path):
    shutil.copytree(source / RUN, source / "runs/mha+alibi/seed0")
    with pytest.raises(ValueError, match=r"runs/mha\+alibi/seed0 is not a run of this comparison \(its variants"):
        run_compare(spec, tmp_path / "out", progress=False, merge_from=[source])
    assert not (tmp_path / "out" / "runs").exists()


def test_a_merged_task_run_of_a_task_this_comparison_does_not_train_is_refused(spec, source, tmp_path):
    task_run = source / "tasks/mqar/mha+rope/seed0"
    task_run.mkdir(parents=True)
    (task_run / "result.json").write_text("{}")
    with pytest.raises(ValueError, match=r"tasks/mqar/mha\+rope/seed0 is not a task run of this comparison \(its tas"):
        run_compare(spec, tmp_path / "out", progress=False, merge_from=[source])
    assert not (tmp_path / "out" / "runs").exists()


def test_a_merged_run_short_of_its_last_step_is_refused(spec, source, tmp_path):
    last = sorted((source / RUN / "checkpoints").iterdir())[-1]
    shutil.rmtree(last)
    with pytest.raises(ValueError, match=r"is not a finished run of this comparison: its last checkpoint is step 3 o"):
        run_compare(spec, tmp_path / "out", progress=False, merge_from=[source])


def test_a_merge_checks_every_run_before_it_copies_the_first(spec, source, tmp_path):
    """Two sources, the second's run damaged: the first's is not copied either."""
    other = Path(shutil.copytree(source, tmp_path / "other"))
    shutil.rmtree(source / "runs/mha+rope")
    shutil.copytree(other / RUN, source / RUN)
    _edit_record(other, _negative_loss)
    with pytest.raises(ValueError, match=r"finished both in .* with different records"):
        run_compare(spec, tmp_path / "out", progress=False, merge_from=[source, other])
    assert not (tmp_path / "out" / "runs").exists()


def test_a_good_merge_copies_the_run_and_reuses_it(spec, source, tmp_path):
    printed = _compare(spec, tmp_path / "out", merge_from=[source])
    assert f"merged 1 finished run(s) from {source} into {tmp_path / 'out'}" in printed
    assert "reusing 1 of 1 runs finished earlier" in printed
    assert (tmp_path / "out" / RECORD).read_bytes() == (source / RECORD).read_bytes()


def test_a_ladder_merged_from_a_folder_holding_none_of_its_rungs_is_refused(tmp_path, capsys):
    """`--preset claims --merge-from` such a folder merged nothing and started training all 35 runs silently."""
    empty = tmp_path / "elsewhere"
    (empty / "runs").mkdir(parents=True)  # a comparison's folder, not a ladder's
    out = tmp_path / "out"
    assert main(["compare", "--preset", "claims", "--out", str(out), "--merge-from", str(empty)]) == 1
    err = capsys.readouterr().err
    assert f"--merge-from {empty} holds no rung of ladder 'claims': its rungs are subfolders ['small', 'large']" in err
    assert not out.exists()


def test_a_ladder_checks_every_rungs_merge_before_its_first_rung_writes(spec, made, tmp_path):
    """A damaged run in the second rung's source is refused before the first rung merges or trains anything."""
    rungs = tuple(dataclasses.replace(spec, name=name) for name in ("small", "large"))
    elsewhere = tmp_path / "elsewhere"
    for name in ("small", "large"):
        shutil.copytree(made["source"], elsewhere / name)
    _edit_record(elsewhere / "large", _nan_loss)
    out = tmp_path / "out"
    with pytest.raises(ValueError, match=r"large/runs/mha\+rope/seed0/compare_run.json.val.loss = nan is invalid"):
        run_ladder(LadderSpec("two", "two rungs", rungs), out, progress=False, merge_from=[elsewhere])
    assert not (out / "small" / "runs").exists()


# ------------------------------------------------------------------------- stored numbers on every other way in


def test_a_resumed_compare_refuses_a_stored_run_whose_numbers_cannot_be(spec, made, tmp_path):
    out = Path(shutil.copytree(made["source"], tmp_path / "out"))
    (out / "results.json").unlink()
    _edit_record(out, _nan_loss)
    with pytest.raises(ValueError, match=r"compare_run.json.val.loss = nan is invalid: must be a finite number"):
        run_compare(spec, out, progress=False)
    assert not (out / "results.json").exists()


def _edit_results(path: Path, change) -> None:
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


def _more_parameters(data):
    variant = data["variants"]["mha+rope"]
    variant["parameters"] *= 4
    for run in variant["runs"]:
        run["parameters"] *= 4


def test_report_only_refuses_a_parameter_count_its_configuration_does_not_build(tmp_path, capsys):
    out = Path(shutil.copytree(FIXTURE, tmp_path / "out"))
    _edit_results(out / "results.json", _more_parameters)
    assert main(["compare", "--out", str(out), "--report-only"]) == 1
    err = capsys.readouterr().err
    assert (
        "results.json.variants.mha+rope.parameters = " in err and "the stored configuration of mha+rope builds" in err
    )


def test_a_rung_whose_parameter_counts_were_edited_is_no_second_size(tmp_path, capsys):
    """A copy of a rung with its counts edited passed --report-only as a size of its own."""
    ladder = tmp_path / "ladder"
    shutil.copytree(FIXTURE, ladder / "small")
    shutil.copytree(FIXTURE, ladder / "large")
    _edit_results(ladder / "large" / "results.json", _more_parameters)
    assert main(["compare", "--out", str(ladder), "--report-only"]) == 1
    err = capsys.readouterr().err
    assert f"{ladder / 'large' / 'results.json'}.variants.mha+rope.parameters = " in err, err
    assert not (ladder / "report.md").exists()


def test_a_schema_version_written_as_text_is_refused_naming_its_type(tmp_path, capsys):
    out = Path(shutil.copytree(FIXTURE, tmp_path / "out"))
    _edit_results(out / "results.json", lambda data: data.update(schema_version="3"))
    assert main(["compare", "--out", str(out), "--report-only"]) == 1
    err = capsys.readouterr().err
    readable = ", ".join(map(str, READABLE_VERSIONS))
    assert f"schema_version = '3' is invalid: must be the integer {readable} (a number, not str)" in err, err


# --------------------------------------------------------------------------------------------------- executors


def test_slurm_where_there_is_none_is_refused_before_any_work(spec, tmp_path, monkeypatch):
    """submitit fell back to local processes: every run trained here, and the compare exited 0 without a word."""
    pytest.importorskip("submitit", reason="the slurm extra is not installed (the dev extra installs it)")
    (tmp_path / "bin").mkdir()
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))  # no sbatch
    with pytest.raises(ValueError, match=r"--executor slurm: Slurm is not installed here \(no sbatch on PATH\)"):
        run_compare(spec, tmp_path / "out", progress=False, executor=ExecutorConfig("slurm"))
    assert not (tmp_path / "out" / "runs").exists()


def test_an_unknown_slurm_option_is_named_with_the_ones_allowed(spec, tmp_path):
    """submitit ended in its own traceback (a NameError listing every executor's parameters)."""
    pytest.importorskip("submitit", reason="the slurm extra is not installed (the dev extra installs it)")
    executor = ExecutorConfig("slurm", options={"partition": "gpu"})
    with pytest.raises(ValueError, match=r"option\(s\) \['partition'\] mean nothing to executor 'slurm'.*slurm_partit"):
        run_compare(spec, tmp_path / "out", progress=False, executor=executor)


@pytest.mark.parametrize(("engine", "module"), [("slurm", "submitit"), ("ray", "ray")])
def test_an_engine_that_cannot_start_is_refused_before_the_bench(engine, module, made, tmp_path, monkeypatch):
    """Whether Ray or submitit could start was found out after the bench had run."""
    monkeypatch.setenv("ATTNZOO_CACHE_DIR", str(made["cache"]))
    monkeypatch.setitem(sys.modules, module, None)
    spec = resolve_spec("micro", variants=["mha+rope"], seeds=[0], corpus=str(made["text"]), tasks=[])
    with pytest.raises(ValueError, match=rf"runs on {module}, which is not installed"):
        run_compare(spec, tmp_path / "out", progress=False, executor=ExecutorConfig(engine))
    assert not any((tmp_path / "out" / name).exists() for name in ("bench.json", "bench.partial.json", "runs"))


def test_runs_on_several_processes_refuse_a_longer_variants_batch_they_cannot_share(spec, tmp_path):
    """mha+rope+len4 trains on batch_size 8 / 4 = 2 sequences a step, which 4 processes cannot share: it failed
    inside its worker after the others had trained, where the inline executor refuses it first."""
    longer = _spec(spec.train.data.corpus, variants=("mha+rope", "mha+rope+len4"))
    executor = ExecutorConfig("local", jobs=1, options={"nproc_per_run": 4})
    with pytest.raises(ValueError, match=r"nproc_per_run=4 shares each step's batch_size=2 of mha\+rope\+len4"):
        run_compare(longer, tmp_path / "out", progress=False, executor=executor)
    assert not (tmp_path / "out").exists()


DRIVER = textwrap.dedent(
    """
    import dataclasses, sys
    from attnzoo.compare import resolve_spec, run_compare
    from attnzoo.compare.executors import ExecutorConfig

    if __name__ == "__main__":
        text, out, jobs, nproc = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
        spec = resolve_spec("micro", variants=["mha+rope"], seeds=[0, 1], steps=100000, corpus=text, tasks=[])
        spec = dataclasses.replace(spec, evals=dataclasses.replace(spec.evals, bench_cases=()))
        options = {"threads": 1, "nproc_per_run": nproc}
        run_compare(spec, out, progress=False, executor=ExecutorConfig("local", jobs=jobs, options=options))
    """
)


def _descendants(pid: int) -> set[int]:
    """The processes below ``pid``: its children, theirs, and so on."""
    parents = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, IndexError, ValueError):
            parents[int(stat.parent.name)] = int(stat.read_text().rsplit(")", 1)[1].split()[1])
    found, frontier = set(), {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def _running(pid: int, marker: bytes) -> bool:
    """Running (neither gone nor a zombie waiting to be reaped), with ``marker`` in its command line."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        return state != "Z" and marker in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


@pytest.mark.slow
@pytest.mark.skipif(sys.platform != "linux", reason="finds the workers through /proc")
@pytest.mark.parametrize(
    ("jobs", "nproc", "marker"),
    [(2, 1, b"spawn_main"), (1, 2, b"attnzoo.compare.ranks")],
    ids=["workers", "a-runs-ranks-under-torchrun"],
)
def test_the_workers_of_a_local_compare_end_when_its_driver_is_killed(made, tmp_path, jobs, nproc, marker):
    """kill -9 of the driver left its workers alive, idle on their pipe, for as long as anyone watched (and a
    run's ranks under torchrun training on)."""
    script = tmp_path / "driver.py"
    script.write_text(DRIVER)
    env = {**os.environ, "ATTNZOO_CACHE_DIR": str(made["cache"]), "PYTHONPATH": os.pathsep.join(sys.path)}
    argv = [sys.executable, str(script), str(made["text"]), str(tmp_path / "out"), str(jobs), str(nproc)]
    driver = subprocess.Popen(argv, env=env)
    below: set[int] = set()
    try:
        deadline = time.monotonic() + 300
        while len({pid for pid in _descendants(driver.pid) if _running(pid, marker)}) < 2:
            assert driver.poll() is None and time.monotonic() < deadline, "the driver never started its workers"
            time.sleep(0.2)
        below = _descendants(driver.pid)
        driver.send_signal(signal.SIGKILL)
        driver.wait()
        deadline = time.monotonic() + 20
        while any(_running(pid, b"") for pid in below) and time.monotonic() < deadline:
            time.sleep(0.1)
        left = [Path(f"/proc/{pid}/cmdline").read_bytes()[:80] for pid in below if _running(pid, b"")]
        assert not left, f"processes outlived their driver: {left}"
    finally:
        driver.kill()
        driver.wait()
        for pid in below:  # a failure leaves none behind either
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


# ----------------------------------------------------------------------------------------------- vague messages


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_device_cuda_without_cuda_blames_the_flag_not_the_preset(tmp_path, capsys):
    assert main(["compare", "--preset", "micro", "--device", "cuda", "--out", str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err
    assert "device='cuda' is invalid: torch sees no CUDA device here; use 'cpu'" in err and "preset" not in err, err
    assert not (tmp_path / "out").exists()


def test_pool_commits_beside_report_only_is_refused(tmp_path, capsys):
    out = Path(shutil.copytree(FIXTURE, tmp_path / "out"))
    for argv in (["--out", str(out)], ["--preset", "micro"]):
        assert main(["compare", *argv, "--report-only", "--pool-commits"]) == 1
        err = capsys.readouterr().err
        assert "trains nothing: --pool-commits would change nothing there; leave it out" in err, err
    assert not (out / "report.md").exists()
