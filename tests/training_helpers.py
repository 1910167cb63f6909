"""Tiny corpora and configurations shared by the data, training, checkpoint, CLI and distributed tests."""

from __future__ import annotations

import random
from pathlib import Path

from attnzoo import ModelConfig
from attnzoo.training import DataConfig, TrainConfig

WORDS = [
    "the", "king", "and", "queen", "of", "rome", "sat", "on", "a", "stone", "throne",
    "while", "his", "fool", "sang", "songs", "to", "them",
]  # fmt: skip


def write_text_corpus(path: Path, n_words: int = 6000, seed: int = 0) -> Path:
    """A small deterministic English-like text file."""
    rng = random.Random(seed)
    lines = [" ".join(rng.choice(WORDS) for _ in range(12)) for _ in range(n_words // 12)]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def tiny_model_config(**changes) -> ModelConfig:
    """The shared tiny model (conftest.tiny_config) as TINY_FLAGS trains it: the byte vocabulary, 2 heads, 32 tokens."""
    from conftest import tiny_config  # here: scripts import this module for its corpora, outside pytest

    return tiny_config(**{"vocab_size": 256, "n_heads": 2, "max_seq_len": 32, **changes})


def tiny_train_config(corpus: Path, **changes) -> TrainConfig:
    settings = {
        "data": DataConfig(corpus=str(corpus)),
        "seq_len": 32,
        "batch_size": 8,
        "steps": 6,
        "warmup_steps": 2,
        "eval_interval": 3,
        "eval_windows": 8,
        "log_interval": 1,
        "checkpoint_interval": 3,
        "keep_checkpoints": 10,
        "device": "cpu",
    }
    return TrainConfig(**{**settings, **changes})


# Flags that make `attnzoo train` as small as tiny_model_config / tiny_train_config.
TINY_FLAGS = [
    "--dim", "32", "--n-layers", "2", "--n-heads", "2", "--seq-len", "32", "--batch-size", "8",
    "--warmup-steps", "2", "--eval-windows", "8", "--log-interval", "1", "--device", "cpu", "--no-progress",
]  # fmt: skip
