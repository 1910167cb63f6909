"""Runs of one comparison made in several places (machines, executors, leases) gathered into one directory.

A compare directory is its own state: a finished run (``runs/<variant>/seed<k>`` with its record) is reused by the
next compare into that directory. So merging is copying the finished runs of each source into the target, and it
is part of a compare (``run_compare(..., merge_from=...)``): under the target's lock, after every check the compare
makes of its flags, every run of every source is checked by the comparison (:meth:`Comparison.merge
<attnzoo.compare.runner.Comparison.merge>`) before the first is copied. Nothing the target holds is replaced or
deleted: a run it holds finished must be the same run, and one it holds unfinished is refused by name.
"""

from __future__ import annotations

import filecmp
import os
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

RUN_RECORD = "compare_run.json"
TASK_RECORD = "result.json"


@dataclass(frozen=True, order=True)
class FinishedRun:
    """A finished language-model run (``runs/<variant>/seed<k>``) or task run (``tasks/<task>/<variant>/seed<k>``)
    of a source directory."""

    source: Path
    relative: Path

    @property
    def path(self) -> Path:
        return self.source / self.relative

    @property
    def is_task(self) -> bool:
        return self.relative.parts[0] == "tasks"

    @property
    def record_name(self) -> str:
        return TASK_RECORD if self.is_task else RUN_RECORD

    @property
    def record(self) -> Path:
        return self.path / self.record_name


def finished_runs(sources: Sequence[str | os.PathLike], out: Path) -> list[FinishedRun]:
    """Every finished run of ``sources``, each once. A source that is no compare directory, or is ``out`` itself,
    is refused by name, and so is a run finished in two sources with different records, rather than one chosen."""
    found: dict[Path, FinishedRun] = {}
    for source in map(Path, sources):
        if not (source / "runs").is_dir():
            raise ValueError(f"--merge-from {source} holds no compare runs (no {source / 'runs'} directory)")
        if source.resolve() == out.resolve():
            raise ValueError(f"--merge-from {source} is the output directory itself")
        records = [*source.glob(f"runs/*/seed*/{RUN_RECORD}"), *source.glob(f"tasks/*/*/seed*/{TASK_RECORD}")]
        for run in sorted(FinishedRun(source, record.parent.relative_to(source)) for record in records):
            seen = found.setdefault(run.relative, run)
            if seen is not run and not filecmp.cmp(seen.record, run.record, shallow=False):
                raise ValueError(
                    f"{run.relative} finished both in {seen.source} and in {source} with different records: keep one "
                    "(leave the other source out, or delete its run) and merge again"
                )
    return list(found.values())


def runs_to_copy(runs: Sequence[FinishedRun], out: Path) -> list[FinishedRun]:
    """The runs ``out`` lacks. One it holds finished must be the same (its record identical); one it holds
    unfinished is refused by name, since the merge never deletes what it did not write."""
    missing = []
    for run in runs:
        target = out / run.relative
        if (target / run.record_name).is_file():
            if not filecmp.cmp(run.record, target / run.record_name, shallow=False):
                raise ValueError(
                    f"{run.relative} finished both in {run.source} and in {out} with different records: keep one "
                    "(delete the other run's directory) and merge again"
                )
        elif target.exists() or target.is_symlink():
            raise ValueError(
                f"{target} holds an unfinished run, which merging would replace with the one finished in "
                f"{run.source}: delete it yourself to take that one, or run the compare without --merge-from to "
                "finish it"
            )
        else:
            missing.append(run)
    return missing


def copy_runs(runs: Sequence[FinishedRun], out: Path) -> None:
    """Each run copied whole: under a scratch name beside its place, then renamed, so that a merge cut short
    leaves no half-copied run that a compare would take for an unfinished one."""
    for run in runs:
        target = out / run.relative
        scratch = target.with_name(f".{target.name}.merging")
        shutil.rmtree(scratch, ignore_errors=True)  # a merge cut short left it; merges write under the lock alone
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copytree(run.path, scratch)
        scratch.rename(target)
