"""How long one training step takes here: what an estimate of a run's time is made from."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import statistics
import tempfile
from pathlib import Path

from attnzoo.config import ModelConfig
from attnzoo.data.corpora import Corpus
from attnzoo.distributed import Distributed
from attnzoo.training.config import TrainConfig
from attnzoo.training.metrics import MetricsLog
from attnzoo.training.trainer import METRICS, Trainer


def seconds_per_step(config: ModelConfig, train: TrainConfig, corpus: Corpus, env: Distributed, steps: int) -> float:
    """Median seconds of a training step of ``config`` trained as ``train`` says, from the trainer's own throughput
    log over ``steps`` steps; the first log interval is left out, since it holds CUDA's start-up, cuDNN's choices
    and Triton's compilation."""
    interval = max(1, steps // 5)
    train = dataclasses.replace(
        train,
        steps=steps,
        warmup_steps=0,
        log_interval=interval,
        eval_interval=steps,
        eval_windows=1,
        checkpoint_interval=steps,
        keep_checkpoints=1,
    )
    # The timing's banner and log lines would read as a run of the caller's.
    with tempfile.TemporaryDirectory(prefix="attnzoo-timing-") as run_dir, contextlib.redirect_stdout(io.StringIO()):
        Trainer(config, train, corpus, run_dir, env=env, progress=False).fit()
        rates = [r["tokens_per_s"] for r in MetricsLog(Path(run_dir) / METRICS).read() if "tokens_per_s" in r]
    return train.tokens_per_step / statistics.median(rates[1:] or rates)
