"""Two gloo processes on the CPU, launched by torchrun exactly as a user would, against one process.

Ranks average gradients in a different order than one process sums them, so the runs agree to float32
rounding (relative 1e-5 on losses over a few steps), not bitwise.
"""

import json
import os
import shutil
import subprocess
import sys

import pytest
from safetensors.torch import load_file
from training_helpers import TINY_FLAGS, write_text_corpus

from attnzoo.cli import main
from attnzoo.training import read_checkpoint

# Each test launches torchrun, which starts three Python processes.
pytestmark = pytest.mark.slow

STEPS = ["--steps", "4", "--eval-interval", "2", "--checkpoint-interval", "2", "--keep-checkpoints", "5"]


def _torchrun(*args, nproc=2):
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run([*command, "-m", "attnzoo", *args], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "terminate called" not in done.stderr, done.stderr[-3000:]  # no rank aborted, even after its work
    return done.stdout


def _records(run_dir, key):
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return {r["step"]: r[key] for r in map(json.loads, lines) if key in r}


def _assert_same_training(a, b):
    assert _records(a, "train_loss") == pytest.approx(_records(b, "train_loss"), rel=1e-5)
    assert _records(a, "val_loss") == pytest.approx(_records(b, "val_loss"), rel=1e-5)
    weights_a = load_file(read_checkpoint(a).directory / "model.safetensors")
    weights_b = load_file(read_checkpoint(b).directory / "model.safetensors")
    assert weights_a.keys() == weights_b.keys()
    for name in weights_a:
        assert weights_a[name].allclose(weights_b[name], rtol=1e-4, atol=1e-6), name


@pytest.fixture
def single(tmp_path):
    """The reference: one process training on the same global batches."""
    text = write_text_corpus(tmp_path / "text.txt")
    assert main(["train", "--data", str(text), "--out", str(tmp_path / "single"), *TINY_FLAGS, *STEPS]) == 0
    return text, tmp_path / "single"


@pytest.mark.parametrize("parallel", ["ddp", "fsdp"])
def test_two_gloo_ranks_match_one_process_on_the_same_global_batch(single, tmp_path, parallel):
    text, reference = single
    run = tmp_path / parallel
    out = _torchrun("train", "--data", str(text), "--out", str(run), *TINY_FLAGS, *STEPS, "--parallel", parallel)
    assert out.count("done: step 4") == 1  # rank 0 alone reports
    assert read_checkpoint(run).world_size == 2
    _assert_same_training(run, reference)


def test_resume_under_ddp_continues_the_same_run(single, tmp_path):
    reference = single[1]
    run = tmp_path / "resumed"
    shutil.copytree(reference, run)
    # Written by one process, resumed by two: the batches of a step do not depend on the world size.
    shutil.rmtree(run / "checkpoints" / "step-0000004")
    out = _torchrun("train", "--resume", str(run))
    assert "resumed from" in out and out.count("done: step 4") == 1
    assert read_checkpoint(run).world_size == 2
    _assert_same_training(run, reference)


def test_fsdp2_shards_mechanisms_with_per_layer_scalars(tmp_path):
    # FSDP2 cannot shard 0-dim parameters; selective's per-layer coefficients are shaped (1,) for this.
    text = write_text_corpus(tmp_path / "text.txt")
    run = tmp_path / "selective"
    flags = [*TINY_FLAGS, *STEPS, "--parallel", "fsdp", "--attention", "selective"]
    out = _torchrun("train", "--data", str(text), "--out", str(run), *flags)
    assert out.count("done: step 4") == 1
    assert read_checkpoint(run).model_config.attention == "selective"
