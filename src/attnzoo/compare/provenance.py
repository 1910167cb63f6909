"""Where a run was trained and by what code: the host, the device, the git commit of the source, the executor.
Runs made elsewhere are merged and pooled on what this records (:class:`attnzoo.results.comparison.Provenance`)."""

from __future__ import annotations

import functools
import platform
import subprocess
from pathlib import Path

import torch

from attnzoo.results.comparison import Provenance


@functools.cache
def source_commit() -> str | None:
    """The git commit of the attnzoo source this process runs, "-dirty" if it has uncommitted changes; None when
    it is not a git checkout (an installed wheel). Read once a process: a process runs the code it loaded, whatever
    is committed or edited in the checkout later, so every run it trains records the same commit. (Read at each
    run's end, two runs of one comparison straddling an edit were refused as trained by two commits.)"""
    source = Path(__file__).resolve().parent

    def git(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["git", "-C", str(source), *args], capture_output=True, text=True, timeout=30)

    try:
        head = git("rev-parse", "HEAD")
        if head.returncode != 0:
            return None
        dirty = git("status", "--porcelain", "--untracked-files=no", "--", str(source)).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return head.stdout.strip() + ("-dirty" if dirty else "")


def provenance(device: torch.device, executor: str) -> Provenance:
    """This process's host, its device (a GPU's name, or the CPU with its threads) and source commit, and the
    executor that ran it."""
    threads = f"cpu, {torch.get_num_threads()} thread(s)"
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else threads
    return Provenance(platform.node(), name, source_commit(), executor)
