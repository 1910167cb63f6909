"""Training: configuration, the loop, checkpoints, evaluation and distributed execution."""

from attnzoo.distributed import Distributed, init_distributed, shutdown_distributed
from attnzoo.training.checkpoint import Checkpoint, CheckpointError, load_pretrained, read_checkpoint
from attnzoo.training.config import DataConfig, TrainConfig, load_toml
from attnzoo.training.finetune import PretrainedInit, freeze_all_but, init_from_pretrained
from attnzoo.training.trainer import Trainer, TrainingDiverged, TrainResult, load_corpus

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
