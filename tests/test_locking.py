"""One writer per run or compare directory: a second one is refused with the holder's pid, and a holder that
dies (however it dies) leaves nothing stuck."""

import os
import signal
import subprocess
import sys
import textwrap
import threading

import pytest
from training_helpers import TINY_FLAGS, write_text_corpus

from attnzoo.cli import main
from attnzoo.compare import run_compare
from attnzoo.io import LOCK_NAME, DirectoryLocked, locked_directory

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="directory locks use fcntl.flock")

HOLDER = textwrap.dedent(
    """
    import sys, time
    from attnzoo.io import locked_directory
    with locked_directory(sys.argv[1]):
        print("locked", flush=True)
        time.sleep(120)
    """
)


@pytest.fixture
def holder():
    """Start a process that locks a directory and keeps it until killed; yields a function that starts it."""
    started = []

    def hold(directory):
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
        process = subprocess.Popen(
            [sys.executable, "-c", HOLDER, str(directory)], stdout=subprocess.PIPE, text=True, env=env
        )
        started.append(process)
        assert process.stdout.readline().strip() == "locked"
        return process

    yield hold
    for process in started:
        process.kill()
        process.wait()


def test_a_second_holder_is_refused_with_the_first_ones_pid(tmp_path, holder):
    process = holder(tmp_path / "run")
    with pytest.raises(DirectoryLocked, match=rf"pid {process.pid}\b") as info, locked_directory(tmp_path / "run"):
        pass
    assert info.value.pid == process.pid


def test_a_killed_holder_leaves_no_stale_lock(tmp_path, holder):
    process = holder(tmp_path / "run")
    process.send_signal(signal.SIGKILL)  # no cleanup runs: the OS drops the flock with the process
    process.wait()
    assert (tmp_path / "run" / LOCK_NAME).is_file()
    with locked_directory(tmp_path / "run"):
        assert (tmp_path / "run" / LOCK_NAME).read_text() == f"{os.getpid()}\n"


def _flock_without_pid(directory):
    """A holder in the window around its pid: the lock taken (another open file of this process conflicts, as a
    flock belongs to one open file) and the pid not in the file."""
    import fcntl

    directory.mkdir()
    fd = os.open(directory / LOCK_NAME, os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    return fd


def test_a_contender_waits_for_the_pid_a_new_holder_is_about_to_write(tmp_path):
    """The window between a holder's flock and its pid: the contender waits and names the pid once written."""
    fd = _flock_without_pid(tmp_path / "run")
    writer = threading.Timer(0.2, lambda: os.pwrite(fd, b"4242\n", 0))
    writer.start()
    try:
        with pytest.raises(DirectoryLocked, match=r"pid 4242\b"), locked_directory(tmp_path / "run"):
            pass
    finally:
        writer.join()
        os.close(fd)


def test_a_contender_takes_the_lock_a_finishing_holder_lets_go(tmp_path):
    """The window between a holder clearing its pid and letting go: the contender waits and takes the lock."""
    fd = _flock_without_pid(tmp_path / "run")
    closer = threading.Timer(0.2, lambda: os.close(fd))
    closer.start()
    try:
        with locked_directory(tmp_path / "run"):
            assert (tmp_path / "run" / LOCK_NAME).read_text() == f"{os.getpid()}\n"
    finally:
        closer.join()


def test_the_lock_nests_within_one_process_and_is_released_after(tmp_path):
    with locked_directory(tmp_path / "d"), locked_directory(tmp_path / "d"):
        pass
    # Released: another process can take it now.
    done = subprocess.run(
        [sys.executable, "-c", HOLDER.replace("time.sleep(120)", "pass"), str(tmp_path / "d")],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        timeout=120,
    )
    assert done.returncode == 0 and done.stdout.strip() == "locked", done.stderr


def test_train_into_a_directory_another_process_writes_is_refused(tmp_path, holder, capsys):
    text = write_text_corpus(tmp_path / "text.txt")
    run = tmp_path / "run"
    process = holder(run)
    assert main(["train", "--data", str(text), "--out", str(run), *TINY_FLAGS, "--steps", "2"]) == 1
    err = capsys.readouterr().err
    assert f"attnzoo train: error: {run} is in use" in err and f"pid {process.pid}" in err
    assert not (run / "metrics.jsonl").exists() and not (run / "config.json").exists()


def test_resume_while_another_process_writes_the_run_is_refused(tmp_path, holder, capsys):
    text = write_text_corpus(tmp_path / "text.txt")
    run = tmp_path / "run"
    flags = [*TINY_FLAGS, "--steps", "2", "--checkpoint-interval", "1"]
    assert main(["train", "--data", str(text), "--out", str(run), *flags]) == 0
    capsys.readouterr()
    metrics = (run / "metrics.jsonl").read_text()
    process = holder(run)
    assert main(["train", "--resume", str(run), "--steps", "4"]) == 1
    assert f"pid {process.pid}" in capsys.readouterr().err
    assert (run / "metrics.jsonl").read_text() == metrics


@pytest.mark.slow
def test_two_trainings_started_together_into_one_directory_one_is_refused(tmp_path):
    text = write_text_corpus(tmp_path / "text.txt")
    run = tmp_path / "run"
    flags = ["--data", str(text), "--out", str(run), *TINY_FLAGS, "--steps", "30"]
    command = [sys.executable, "-m", "attnzoo", "train", *flags]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "OMP_NUM_THREADS": "1"}
    processes = [
        subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env) for _ in range(2)
    ]
    outcomes = [(p.wait(timeout=300), p.stderr.read(), p.pid) for p in processes]
    for process in processes:
        process.stdout.close()
        process.stderr.close()
    codes = sorted(code for code, _, _ in outcomes)
    assert codes == [0, 1], outcomes
    (refused_err,) = [err for code, err, _ in outcomes if code == 1]
    (winner,) = [pid for code, _, pid in outcomes if code == 0]
    # Refused while the other ran (its pid named), or after it finished (the directory already holds a run).
    assert f"pid {winner}" in refused_err or "already holds a run" in refused_err, refused_err
    steps = [line for line in (run / "metrics.jsonl").read_text().splitlines() if "train_loss" in line]
    assert len(steps) == 30  # one writer's records, not two interleaved


def test_a_compare_into_a_directory_another_process_writes_is_refused(tmp_path, holder):
    process = holder(tmp_path / "out")
    with pytest.raises(DirectoryLocked, match=rf"pid {process.pid}\b.*compare directory"):
        run_compare("micro", tmp_path / "out", progress=False)
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [LOCK_NAME]
