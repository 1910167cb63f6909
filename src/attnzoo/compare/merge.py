"""Runs of one comparison made in several places (machines, executors, leases) gathered into one directory.

A compare directory is its own state: a finished run (``runs/<variant>/seed<k>`` with its record) is reused by the
next compare into that directory. So merging is copying the finished runs of each source into the target; the
compare run there afterwards reuses them, trains what is still missing, checks that every run matches its spec
(the model and training configuration of each checkpoint) and refuses runs from different commits unless told.
"""

from __future__ import annotations

import filecmp
import shutil
from collections.abc import Sequence
from pathlib import Path

RUN_RECORD = "compare_run.json"
TASK_RECORD = "result.json"


def merge_runs(sources: Sequence[str | Path], out: str | Path) -> list[str]:
    """Copy every finished run and task result of ``sources`` into ``out``; the paths copied, relative to it. A
    run finished in two places with different records is refused rather than one of them chosen."""
    out, copied = Path(out), []
    for source in map(Path, sources):
        if not (source / "runs").is_dir():
            raise ValueError(f"--merge-from {source} holds no compare runs (no {source / 'runs'} directory)")
        if source.resolve() == out.resolve():
            raise ValueError(f"--merge-from {source} is the output directory itself")
        finished = [r.parent for r in source.glob(f"runs/*/seed*/{RUN_RECORD}")]
        finished += [r.parent for r in source.glob(f"tasks/*/*/seed*/{TASK_RECORD}")]
        for run_dir in sorted(finished):
            relative = run_dir.relative_to(source)
            target = out / relative
            record = RUN_RECORD if relative.parts[0] == "runs" else TASK_RECORD
            if (target / record).is_file():
                if not filecmp.cmp(run_dir / record, target / record, shallow=False):
                    raise ValueError(
                        f"{relative} finished both in {source} and in {out} with different records: keep one "
                        "(delete the other run's directory) and merge again"
                    )
                continue
            shutil.rmtree(target, ignore_errors=True)  # an unfinished run: the finished one replaces it
            shutil.copytree(run_dir, target)
            copied.append(str(relative))
    return copied
