"""attnzoo.compare.provenance: what a run records of the code that trained it."""

import subprocess
from types import SimpleNamespace

import pytest
import torch

from attnzoo.compare import provenance

CLEAN, EDITED = "a" * 40, "b" * 40


@pytest.fixture
def checkout_changing_under_the_process(monkeypatch):
    """git answers as a checkout does that is committed to and edited while the process runs: each read of the
    commit finds another state (HEAD, then `git status --porcelain`, per read)."""
    answers = iter([CLEAN, "", EDITED, " M src/attnzoo/model.py"])
    calls = []

    def git(command, **kwargs):
        calls.append(command)
        return SimpleNamespace(returncode=0, stdout=next(answers))

    monkeypatch.setattr(subprocess, "run", git)
    provenance.source_commit.cache_clear()
    yield calls
    provenance.source_commit.cache_clear()  # the next reader reads the real checkout


def test_every_run_of_a_process_records_the_commit_it_loaded(checkout_changing_under_the_process):
    """The GPU kit's ladder dry run failed on a busy shared checkout: its two runs, trained by one process, recorded
    two commits (the second "-dirty": a file was edited between them) and the comparison refused to pool them."""
    cpu = torch.device("cpu")
    first, second = (provenance.provenance(cpu, "inline").commit for _ in range(2))
    assert first == second == CLEAN
    assert len(checkout_changing_under_the_process) == 2  # HEAD and status, read once
