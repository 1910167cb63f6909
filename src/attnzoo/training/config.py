"""Training configuration: typed, validated dataclasses with a JSON round trip, plus TOML files.

A run is described by a :class:`~attnzoo.ModelConfig` (what is trained) beside a :class:`TrainConfig`
(how: data, optimisation, evaluation, checkpoints, hardware). A TOML file holds both::

    [model]
    attention = "mha"
    dim = 128

    [model.attention_options]    # the mechanism's own options

    [data]
    corpus = "shakespeare"

    [train]
    steps = 2000
    lr = 2e-3
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from attnzoo.config import ModelConfig
from attnzoo.data.tokenizers import TOKENIZER_CHOICES, is_tokenizer_name
from attnzoo.io import file_kind
from attnzoo.records import check_keys
from attnzoo.validation import (
    DEVICE_NAMES,
    MAX_COUNT,
    MAX_SEED,
    is_count,
    is_device_name,
    is_number,
    is_seed,
    require,
    require_count,
)

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

# The model `attnzoo train` builds unless told otherwise: about 0.84M parameters with the byte vocabulary,
# a few minutes of training on two CPU cores. vocab_size comes from the tokenizer, max_seq_len from seq_len.
DEFAULT_MODEL: dict[str, Any] = {"dim": 128, "n_layers": 4, "n_heads": 4}

PARALLEL_STRATEGIES = ("ddp", "fsdp")
# Settings that change how a run executes or reports, not which updates it makes: a resumed run may change them.
RESUME_OVERRIDABLE = frozenset(
    {
        "device",
        "dtype",
        "compile",
        "parallel",
        "log_interval",
        "eval_interval",
        "eval_windows",
        "checkpoint_interval",
        "keep_checkpoints",
    }
)
DTYPES = ("auto", "float32", "bfloat16")


def option(default: Any, help: str) -> Any:
    """A dataclass field whose help text the command line shows."""
    return field(default=default, metadata={"help": help})


def _from_dict(cls: type, data: dict[str, Any], section: str) -> Any:
    if not isinstance(data, dict):
        raise ValueError(f"[{section}] must be a table of settings, got {type(data).__name__}")
    check_keys(cls, data, f"[{section}] setting(s)")
    return cls(**data)


@dataclass(frozen=True)
class DataConfig:
    corpus: str = option("shakespeare", "'shakespeare', 'pystdlib', 'pysource', or a path to a text file or directory")
    tokenizer: str = option(
        "byte",
        "'byte' (256 ids, any text), 'char' (the corpus's characters) or 'hf:PATH' (a Hugging Face tokenizer.json, "
        "or a directory holding one); a run started with --init-from uses its model's tokenizer unless one is named",
    )
    val_fraction: float = option(0.1, "share of the token stream, at its end, held out for validation")

    def __post_init__(self) -> None:
        require(isinstance(self.corpus, str) and self.corpus != "", "corpus", self.corpus, "must be a name or path")
        require(is_tokenizer_name(self.tokenizer), "tokenizer", self.tokenizer, f"choose {TOKENIZER_CHOICES}")
        require(
            is_number(self.val_fraction) and 0 < self.val_fraction < 1,
            "val_fraction",
            self.val_fraction,
            "must be in (0, 1)",
        )

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DataConfig:
        return _from_dict(cls, data, "data")


@dataclass(frozen=True)
class TrainConfig:
    """How a model is trained. ``batch_size`` is global: sequences per optimizer step over all ranks and
    accumulation steps, so changing the number of processes leaves the optimisation unchanged."""

    data: DataConfig = field(default_factory=DataConfig)
    seq_len: int = option(128, "tokens per training sequence (the context length trained on)")
    batch_size: int = option(16, "sequences per optimizer step, summed over ranks and accumulation steps")
    grad_accum: int = option(1, "micro-batches per optimizer step on each rank")
    steps: int = option(1200, "optimizer steps")
    lr: float = option(2e-3, "peak learning rate, reached after warmup")
    min_lr_ratio: float = option(0.1, "final learning rate as a fraction of lr, reached by cosine decay")
    warmup_steps: int = option(100, "steps of linear warmup from lr/warmup_steps to lr")
    weight_decay: float = option(0.1, "AdamW decoupled weight decay of matrices (never norms, biases, embeddings)")
    beta1: float = option(0.9, "AdamW β1")
    beta2: float = option(0.95, "AdamW β2")
    grad_clip: float = option(1.0, "clip the global gradient norm to this; 0 disables clipping")
    train_only: tuple[str, ...] = option(
        (), "train only the parameters whose name contains one of these (e.g. temperature); freeze the rest"
    )
    eval_interval: int = option(200, "evaluate on the validation subset every this many steps (and at the end)")
    eval_windows: int = option(256, "validation subset: this many non-overlapping seq_len windows")
    log_interval: int = option(10, "append training metrics to metrics.jsonl every this many steps")
    checkpoint_interval: int = option(400, "write a checkpoint every this many steps (and at the end)")
    keep_checkpoints: int = option(2, "how many of the latest checkpoints to keep")
    seed: int = option(0, "seeds the initialisation, the data order and dropout")
    device: str = option("auto", "'auto' (cuda if present, else cpu), 'cpu', 'cuda' or 'cuda:N'")
    dtype: str = option("auto", "'auto' (bfloat16 autocast on CUDA, float32 on CPU), 'float32' or 'bfloat16'")
    compile: bool = option(False, "torch.compile each Transformer block")
    parallel: str = option("ddp", "under torchrun: 'ddp' (replicate the model) or 'fsdp' (FSDP2 sharding)")

    def __post_init__(self) -> None:
        if isinstance(self.data, dict):
            object.__setattr__(self, "data", DataConfig.from_dict(self.data))
        require(isinstance(self.data, DataConfig), "data", self.data, "must be a DataConfig")
        for name in (
            "seq_len",
            "batch_size",
            "grad_accum",
            "steps",
            "eval_interval",
            "eval_windows",
            "log_interval",
            "checkpoint_interval",
            "keep_checkpoints",
        ):
            require_count(name, getattr(self, name))
        require_count("warmup_steps", self.warmup_steps, minimum=0)
        require(is_seed(self.seed), "seed", self.seed, f"must be an integer in [0, {MAX_SEED}]")
        require(is_number(self.lr) and self.lr > 0, "lr", self.lr, "must be a finite number > 0")
        require(
            is_number(self.min_lr_ratio) and 0 <= self.min_lr_ratio <= 1,
            "min_lr_ratio",
            self.min_lr_ratio,
            "must be in [0, 1]",
        )
        require(
            is_number(self.weight_decay) and self.weight_decay >= 0, "weight_decay", self.weight_decay, "must be >= 0"
        )
        for name in ("beta1", "beta2"):
            value = getattr(self, name)
            require(is_number(value) and 0 <= value < 1, name, value, "must be in [0, 1)")
        require(
            is_number(self.grad_clip) and self.grad_clip >= 0,
            "grad_clip",
            self.grad_clip,
            "must be a finite number >= 0",
        )
        if isinstance(self.train_only, list):  # from JSON, TOML or flags: a tuple, so a JSON round trip is equal
            object.__setattr__(self, "train_only", tuple(self.train_only))
        require(
            isinstance(self.train_only, tuple) and all(isinstance(p, str) and p for p in self.train_only),
            "train_only",
            self.train_only,
            "must be a list of non-empty parameter-name fragments, e.g. ['temperature']",
        )
        require(is_device_name(self.device), "device", self.device, DEVICE_NAMES)
        require(self.dtype in DTYPES, "dtype", self.dtype, f"choose one of {list(DTYPES)}")
        require(isinstance(self.compile, bool), "compile", self.compile, "must be true or false")
        strategies = list(PARALLEL_STRATEGIES)
        require(self.parallel in strategies, "parallel", self.parallel, f"choose one of {strategies}")

    @property
    def tokens_per_step(self) -> int:
        return self.batch_size * self.seq_len

    def with_steps(self, steps: int) -> TrainConfig:
        """This schedule stretched or shrunk to ``steps``: warmup, evaluations, logs and checkpoints keep their
        share of the run, so a shortened preset still warms up for the same fraction and still logs the
        validation points its loss-flattening gate reads."""
        require(is_count(steps), "steps", steps, f"must be an integer in [1, {MAX_COUNT}]")

        def scaled(every: int) -> int:
            return max(1, math.ceil(every * steps / self.steps))

        return dataclasses.replace(
            self,
            steps=steps,
            warmup_steps=round(self.warmup_steps * steps / self.steps),
            eval_interval=scaled(self.eval_interval),
            log_interval=scaled(self.log_interval),
            checkpoint_interval=scaled(self.checkpoint_interval),
        )

    def warnings(self) -> list[str]:
        """Settings that are valid but almost certainly not what was meant."""
        found = []
        if self.warmup_steps >= self.steps:
            found.append(
                f"warmup_steps={self.warmup_steps} >= steps={self.steps}: the learning rate is still warming up when "
                f"the run ends and never reaches lr={self.lr:g} (nor decays); set --warmup-steps below --steps, "
                f"e.g. {max(1, self.steps // 10)}"
            )
        return found

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrainConfig:
        return _from_dict(cls, data, "train")

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str) -> TrainConfig:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as err:
            raise ValueError(f"train config is not valid JSON ({err})") from None
        return cls.from_dict(data)


def default_model_settings(train: TrainConfig) -> dict[str, Any]:
    """ModelConfig fields `attnzoo train` sets unless the user does: :data:`DEFAULT_MODEL` and the context."""
    return {**DEFAULT_MODEL, "max_seq_len": train.seq_len}


def check_model_for_training(model: ModelConfig, train: TrainConfig, vocab_size: int) -> None:
    require(
        model.vocab_size == vocab_size,
        "vocab_size",
        model.vocab_size,
        f"must equal the tokenizer's vocabulary size {vocab_size}",
    )
    require(
        model.max_seq_len >= train.seq_len,
        "max_seq_len",
        model.max_seq_len,
        f"must be >= the training seq_len={train.seq_len}",
    )
    require(
        model.causal,
        "causal",
        model.causal,
        "cannot train on next-token prediction: a bidirectional model sees the token it is asked to predict",
    )


TOML_TABLES = ("model", "data", "train")


def read_toml(path: str | os.PathLike) -> dict[str, Any]:
    """A config file's TOML document; a file that is missing, not a regular file, not UTF-8 or not TOML is refused
    by name."""
    if Path(path).exists() and not Path(path).is_file():  # a FIFO would block the open until a writer came
        raise ValueError(f"config file {path} is a {file_kind(Path(path))}, not a file: name a TOML file")
    try:
        with open(Path(path), "rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        raise FileNotFoundError(f"config file {path} not found") from None
    except UnicodeDecodeError as err:
        raise ValueError(
            f"config file {path} is not UTF-8 text (byte 0x{err.object[err.start]:02x} at offset {err.start}): "
            "name a TOML file"
        ) from None
    except tomllib.TOMLDecodeError as err:
        raise ValueError(f"config file {path} is not valid TOML: {err}") from None


def load_toml(path: str | os.PathLike) -> dict[str, dict[str, Any]]:
    """The ``[model]``, ``[data]`` and ``[train]`` tables of a TOML file (missing ones are empty)."""
    document = read_toml(path)
    unknown = sorted(set(document) - set(TOML_TABLES))
    if unknown:
        raise ValueError(f"config file {path} has unknown table(s) or key(s) {unknown}; allowed tables: {TOML_TABLES}")
    for table in TOML_TABLES:
        if not isinstance(document.get(table, {}), dict):
            raise ValueError(f"config file {path}: {table} must be a table ([{table}]), not a single value")
    return {table: dict(document.get(table, {})) for table in TOML_TABLES}
