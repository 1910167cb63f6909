"""A busy machine: the thread count comes from the free cores, and a measurement taken under contention is marked.
The load is injected, never read from this machine: the tests assert nothing about time."""

import math

import pytest

from attnzoo.machine import CpuLoad, choose_threads, is_busy


@pytest.mark.parametrize(
    ("cores", "load", "threads"),
    [(2, 0.2, 2), (2, 1.1, 1), (2, 4.5, 1), (8, 2.4, 6), (8, 0.0, 8), (2, math.nan, 2)],
)
def test_one_thread_per_free_core_and_at_least_one(cores, load, threads):
    assert choose_threads(CpuLoad(cores, load)).threads == threads


def test_a_busy_machine_is_said_in_one_line_naming_the_load_and_the_override():
    """Two OpenMP threads collapse when the other core is busy: the issue's compare ran 43 min for 1 min 41 s."""
    choice = choose_threads(CpuLoad(2, 4.52))
    assert choice.reason == (
        "busy machine: 2 cores, load average 4.52: computing with 1 torch thread(s), not 2 (set OMP_NUM_THREADS "
        "to choose)"
    )
    assert choose_threads(CpuLoad(2, 0.3)).reason is None  # nothing to say on a quiet machine


def test_omp_num_threads_wins_over_the_load_and_is_checked():
    assert choose_threads(CpuLoad(2, 5.0), "2") == choose_threads(CpuLoad(2, 0.0), "2")
    assert choose_threads(CpuLoad(2, 5.0), "2").threads == 2
    with pytest.raises(ValueError, match=r"OMP_NUM_THREADS='two' is invalid: must be an integer >= 1"):
        choose_threads(CpuLoad(2, 0.0), "two")


@pytest.mark.parametrize(("load", "busy"), [(1.9, False), (2.0, False), (2.01, True), (None, False), (math.nan, False)])
def test_a_measurement_is_busy_when_more_work_was_runnable_than_cores(load, busy):
    assert is_busy(load, cores=2) is busy


@pytest.mark.parametrize(("load", "threads", "said"), [(4.5, 1, True), (0.1, 2, False)])
def test_train_computes_with_the_free_cores_and_says_so(tmp_path, monkeypatch, capsys, load, threads, said):
    import json

    import torch
    from training_helpers import TINY_FLAGS, write_text_corpus

    from attnzoo import machine
    from attnzoo.cli import main

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(machine.CpuLoad, "now", classmethod(lambda cls: cls(2, load)))
    previous = torch.get_num_threads()
    text = write_text_corpus(tmp_path / "text.txt")
    try:
        assert main(["train", "--data", str(text), "--out", str(tmp_path / "run"), *TINY_FLAGS, "--steps", "1"]) == 0
    finally:
        torch.set_num_threads(previous)
    assert json.loads((tmp_path / "run" / "run.json").read_text())["torch_threads"] == threads
    assert (
        "busy machine: 2 cores, load average 4.50: computing with 1 torch thread(s)" in capsys.readouterr().err
    ) == said
