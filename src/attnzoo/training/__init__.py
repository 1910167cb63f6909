"""Training: configuration, the loop, checkpoints, evaluation and distributed execution.

The public names are imported on first use (PEP 562), as in :mod:`attnzoo`: a command that reads a checkpoint
(``attnzoo info RUN``) does not load the training loop and what it imports.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from attnzoo.distributed import Distributed, init_distributed, shutdown_distributed
    from attnzoo.training.checkpoint import Checkpoint, CheckpointError, load_pretrained, read_checkpoint
    from attnzoo.training.config import DataConfig, TrainConfig, load_toml
    from attnzoo.training.finetune import PretrainedInit, freeze_all_but, init_from_pretrained
    from attnzoo.training.trainer import Trainer, TrainingDiverged, TrainResult, load_corpus

_HOMES = {
    **dict.fromkeys(["Checkpoint", "CheckpointError", "load_pretrained", "read_checkpoint"], "training.checkpoint"),
    **dict.fromkeys(["DataConfig", "TrainConfig", "load_toml"], "training.config"),
    **dict.fromkeys(["Distributed", "init_distributed", "shutdown_distributed"], "distributed"),
    **dict.fromkeys(["PretrainedInit", "freeze_all_but", "init_from_pretrained"], "training.finetune"),
    **dict.fromkeys(["Trainer", "TrainingDiverged", "TrainResult", "load_corpus"], "training.trainer"),
}


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module 'attnzoo.training' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"attnzoo.{_HOMES[name]}"), name)
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_HOMES])


__all__ = [
    "Checkpoint",
    "CheckpointError",
    "DataConfig",
    "Distributed",
    "PretrainedInit",
    "TrainConfig",
    "TrainResult",
    "Trainer",
    "TrainingDiverged",
    "freeze_all_but",
    "init_distributed",
    "init_from_pretrained",
    "load_corpus",
    "load_pretrained",
    "load_toml",
    "read_checkpoint",
    "shutdown_distributed",
]
