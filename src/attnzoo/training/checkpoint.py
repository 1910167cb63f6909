"""Checkpoints: self-contained directories that a run resumes from and that load as pretrained models.

::

    RUN/checkpoints/step-0000500/
        config.json          model config      ┐ what Transformer.from_pretrained reads
        model.safetensors    weights           ┘
        tokenizer.json       the tokenizer the model was trained with (a Hugging Face one included whole)
        train_state.pt       optimizer state and every rank's RNG state (torch.save; loaded weights_only)
        checkpoint.json      step, train config, versions, the sha256 of every other file and of itself;
                             written last

Every file is written atomically (temp file, fsync, rename) and ``checkpoint.json`` last, so a directory
that has one is complete: a crash mid-save leaves the previous checkpoint as the latest. The hashes turn a
truncated, corrupted or edited file (a weight, a digit of ``config.json`` or of the manifest's train config)
into a clear error instead of a failure deep inside torch or a silently different model or run; a manifest
that does not hash every file is refused.
"""

from __future__ import annotations

import hashlib
import json
import logging
import pickle
import shutil
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

import torch
from safetensors.torch import load_model, save_file
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_optimizer_state_dict,
)

from attnzoo import __version__
from attnzoo.config import ModelConfig
from attnzoo.data.corpora import sha256_file
from attnzoo.data.tokenizers import Tokenizer, tokenizer_from_dict
from attnzoo.distributed import Distributed
from attnzoo.io import atomic_write, atomic_write_text
from attnzoo.model import CONFIG_NAME, WEIGHTS_NAME, Transformer
from attnzoo.training.config import TrainConfig
from attnzoo.weights import check_dtypes, check_finite, stored_dtypes

CHECKPOINTS = "checkpoints"
MANIFEST = "checkpoint.json"
TOKENIZER = "tokenizer.json"
TRAIN_STATE = "train_state.pt"
FORMAT_VERSION = 2
HASHED = (CONFIG_NAME, WEIGHTS_NAME, TOKENIZER, TRAIN_STATE)  # every file of a checkpoint but the manifest
# The files each readable manifest format must hash; format 1 (attnzoo 0.1.0) hashed the binary files alone.
READABLE_FORMATS = {1: (WEIGHTS_NAME, TRAIN_STATE), 2: HASHED}


log = logging.getLogger(__name__)


class CheckpointError(RuntimeError):
    """A checkpoint is missing, damaged, or does not fit the model or run it is loaded into."""


@dataclass(frozen=True)
class Checkpoint:
    """What a checkpoint directory describes, read and verified without loading any tensor."""

    directory: Path
    model_config: ModelConfig
    tokenizer: Tokenizer | None  # None only for a pretrained directory that has no tokenizer.json
    step: int | None = None  # None for a plain pretrained directory, which has no training state
    train_config: TrainConfig | None = None
    world_size: int | None = None

    @property
    def resumable(self) -> bool:
        return self.train_config is not None

    def require_tokenizer(self) -> Tokenizer:
        if self.tokenizer is None:
            raise CheckpointError(f"{self.directory} has no {TOKENIZER}, so its text cannot be encoded or decoded")
        return self.tokenizer


def step_directory(run_dir: Path, step: int) -> Path:
    return Path(run_dir) / CHECKPOINTS / f"step-{step:07d}"


def complete_checkpoints(run_dir: Path) -> list[Path]:
    """The run's complete checkpoint directories, oldest first."""
    root = Path(run_dir) / CHECKPOINTS
    return sorted(p for p in root.glob("step-*") if (p / MANIFEST).is_file()) if root.is_dir() else []


def latest_checkpoint(run_dir: Path) -> Path | None:
    found = complete_checkpoints(run_dir)
    return found[-1] if found else None


def resolve_checkpoint(path: str | Path) -> Path:
    """A run directory means its latest checkpoint; a checkpoint or pretrained directory means itself."""
    path = Path(path)
    if (path / CONFIG_NAME).is_file() and (path / WEIGHTS_NAME).is_file():
        return path
    latest = latest_checkpoint(path)
    if latest is not None:
        return latest
    if not path.exists():
        raise CheckpointError(f"{path} does not exist")
    raise CheckpointError(
        f"{path} holds no checkpoint: expected a run directory with {CHECKPOINTS}/step-*/{MANIFEST}, "
        f"or a model directory with {CONFIG_NAME} and {WEIGHTS_NAME}"
    )


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise CheckpointError(f"{path} is missing") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise CheckpointError(f"{path} is damaged (not readable JSON: {err})") from None


def manifest_digest(manifest: dict[str, Any]) -> str:
    """The sha256 of a manifest's own content (its ``self_sha256`` left out), so an edited step, train config or
    hash in ``checkpoint.json`` is caught like a damaged weight file."""
    rest = {key: value for key, value in manifest.items() if key != "self_sha256"}
    return hashlib.sha256(json.dumps(rest, sort_keys=True).encode()).hexdigest()


def _verify_manifest(directory: Path, manifest: Any) -> tuple[TrainConfig, int, int]:
    """Check a manifest's format, its own hash and the hash of every file it must cover; its (train config,
    step, world size)."""
    where = directory / MANIFEST
    if not isinstance(manifest, dict):
        raise CheckpointError(f"{where} is invalid: a JSON object is expected, not {type(manifest).__name__}")
    version = manifest.get("format_version")
    if type(version) is not int or version not in READABLE_FORMATS:
        raise CheckpointError(
            f"{directory} has checkpoint format {version}; this attnzoo reads formats "
            f"{', '.join(map(str, READABLE_FORMATS))}"
        )
    hashes = manifest.get("sha256")
    required = READABLE_FORMATS[version]
    if not isinstance(hashes, dict) or not set(required) <= set(hashes):
        lacking = sorted(set(required) - set(hashes)) if isinstance(hashes, dict) else list(required)
        raise CheckpointError(
            f"{where} records no sha256 for {', '.join(lacking)}: a checkpoint's manifest hashes every file, so "
            "this one was edited or damaged and its files cannot be trusted"
        )
    if version >= 2 and manifest.get("self_sha256") != manifest_digest(manifest):
        raise CheckpointError(
            f"checkpoint {directory} is damaged: {MANIFEST} does not match its own recorded sha256 (edited or "
            "corrupted). Delete this checkpoint directory to resume from the one before."
        )
    for name, expected in hashes.items():
        file = directory / name
        if PurePosixPath(name).name != name or not file.is_file():
            raise CheckpointError(f"checkpoint {directory} is incomplete: {name} is missing")
        if sha256_file(file) != expected:
            raise CheckpointError(
                f"checkpoint {directory} is damaged: {name} does not match the sha256 recorded when it was "
                "written (truncated, corrupted or edited). Delete this checkpoint directory to resume from the "
                "one before."
            )
    if version < 2:
        log.warning(
            "%s is a format-%s checkpoint, whose manifest does not hash %s or itself: their integrity is not checked",
            directory,
            version,
            ", ".join(sorted(set(HASHED) - set(required))),
        )
    try:
        train_config = TrainConfig.from_dict(manifest["train_config"])
        return train_config, int(manifest["step"]), int(manifest["world_size"])
    except (KeyError, TypeError, ValueError) as err:
        raise CheckpointError(f"{where} is invalid: {err!r}") from None


def read_checkpoint(path: str | Path) -> Checkpoint:
    """Read and verify the checkpoint at ``path`` (see :func:`resolve_checkpoint`): hashes first, then configs
    and tokenizer."""
    directory = resolve_checkpoint(path)
    complete = (directory / MANIFEST).is_file()
    config_dict = _read_json(directory / CONFIG_NAME)
    # A plain pretrained directory (save_pretrained, a converted model) may come without a tokenizer, or
    # with the Hugging Face tokenizer.json of the model it was converted from, whose embeddings may be padded.
    has_tokenizer = complete or (directory / TOKENIZER).is_file()
    tokenizer_dict = _read_json(directory / TOKENIZER) if has_tokenizer else None
    training = _verify_manifest(directory, _read_json(directory / MANIFEST)) if complete else None
    try:
        model_config = ModelConfig.from_saved(config_dict, directory / CONFIG_NAME)
        tokenizer = tokenizer_from_dict(tokenizer_dict).padded_to(model_config.vocab_size) if has_tokenizer else None
    except (ValueError, TypeError) as err:
        raise CheckpointError(f"{directory} has an invalid config or tokenizer: {err}") from None
    if tokenizer is not None and tokenizer.vocab_size != model_config.vocab_size:
        raise CheckpointError(
            f"{directory}: the tokenizer has {tokenizer.vocab_size} tokens but the model's vocab_size is "
            f"{model_config.vocab_size}"
        )
    if training is None:
        return Checkpoint(directory, model_config, tokenizer)
    train_config, step, world_size = training
    return Checkpoint(directory, model_config, tokenizer, step, train_config, world_size)


def load_weights(checkpoint: Checkpoint, model: nn.Module) -> None:
    """Load the checkpoint's weights into an unwrapped model built from a matching config."""
    weights = checkpoint.directory / WEIGHTS_NAME
    try:
        check_dtypes(stored_dtypes(weights), weights, next(model.parameters()).dtype)
    except ValueError as err:
        raise CheckpointError(str(err)) from None
    try:
        missing, unexpected = load_model(model, str(weights), strict=False, device=str(_device_of(model)))
    except Exception as err:  # safetensors raises its own types for unreadable files and shape mismatches
        raise CheckpointError(f"cannot load {weights} into the model: {err}") from None
    if missing or unexpected:
        raise CheckpointError(
            f"{weights} does not match the model: missing {sorted(missing)[:6]}, unexpected {sorted(unexpected)[:6]}"
        )
    try:
        check_finite(model.state_dict().items(), weights)
    except ValueError as err:
        raise CheckpointError(str(err)) from None


def _device_of(model: nn.Module) -> torch.device:
    return next(model.parameters()).device


def load_pretrained(path: str | Path, device: str | torch.device = "cpu") -> tuple[Transformer, Checkpoint]:
    """A model ready for inference (eval mode) from a run, checkpoint or pretrained directory."""
    checkpoint = read_checkpoint(path)
    Transformer.check_fits(checkpoint.model_config, device)
    model = Transformer(checkpoint.model_config).to(device)
    load_weights(checkpoint, model)
    return model.eval(), checkpoint


def rng_state(device: torch.device) -> dict[str, torch.Tensor]:
    state = {"cpu": torch.get_rng_state()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def set_rng_state(state: dict[str, torch.Tensor], device: torch.device) -> None:
    torch.set_rng_state(state["cpu"])
    if device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"], device)


def save_checkpoint(
    run_dir: Path,
    *,
    step: int,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    model_config: ModelConfig,
    train_config: TrainConfig,
    tokenizer: Tokenizer,
    env: Distributed,
    tied_names: set[str],
) -> Path:
    """Write the checkpoint of ``step``. Called on every rank (gathering sharded state is collective);
    rank 0 alone writes, then keeps only the newest ``train_config.keep_checkpoints``."""
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    weights = get_model_state_dict(model, options=options)
    optimizer_state = get_optimizer_state_dict(model, optimizer, options=options)
    rng_states = env.gather(rng_state(env.device))
    directory = step_directory(run_dir, step)
    if env.is_main:
        directory.mkdir(parents=True, exist_ok=True)
        # One tensor per storage: the tied output matrix is stored once, as save_pretrained does.
        unique = {name: tensor.contiguous() for name, tensor in weights.items() if name not in tied_names}
        atomic_write(directory / WEIGHTS_NAME, lambda tmp: save_file(unique, str(tmp), metadata={"format": "pt"}))
        state = {"optimizer": optimizer_state, "rng": rng_states}
        atomic_write(directory / TRAIN_STATE, lambda tmp: torch.save(state, tmp))
        model_config.to_json(directory / CONFIG_NAME)
        atomic_write_text(directory / TOKENIZER, json.dumps(tokenizer.to_dict()) + "\n")
        manifest = {
            "format_version": FORMAT_VERSION,
            "step": step,
            "world_size": env.world_size,
            "attnzoo_version": __version__,
            "torch_version": torch.__version__,
            "train_config": train_config.to_dict(),
            "sha256": {name: sha256_file(directory / name) for name in HASHED},
        }
        manifest["self_sha256"] = manifest_digest(manifest)
        atomic_write_text(directory / MANIFEST, json.dumps(manifest, indent=2) + "\n")
        for old in complete_checkpoints(run_dir)[: -train_config.keep_checkpoints]:
            shutil.rmtree(old)
    env.barrier()
    return directory


def load_train_state(
    checkpoint: Checkpoint, model: nn.Module, optimizer: torch.optim.Optimizer, env: Distributed
) -> bool:
    """Restore optimizer state and this rank's RNG state; ``False`` if the RNG could not be restored because
    the checkpoint was written by a different number of ranks."""
    path = checkpoint.directory / TRAIN_STATE
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
        set_optimizer_state_dict(model, optimizer, state["optimizer"], options=StateDictOptions(full_state_dict=True))
    except pickle.UnpicklingError:  # torch's message advises weights_only=False, running the file's code: not here
        raise CheckpointError(
            f"cannot restore the optimizer from {path}: it holds objects other than tensors and plain values, so it "
            "is not loaded (a pickle may run code)"
        ) from None
    except Exception as err:  # unpickling and state-dict mismatches raise many types; all mean "unusable"
        raise CheckpointError(f"cannot restore the optimizer from {path}: {err}") from None
    if len(state["rng"]) != env.world_size:
        return False
    set_rng_state(state["rng"][env.rank], env.device)
    return True


def tied_parameter_names(model: nn.Module) -> set[str]:
    """Names that refer to a parameter already named earlier (e.g. a tied output matrix)."""
    every = {name for name, _ in model.named_parameters(remove_duplicate=False)}
    return every - {name for name, _ in model.named_parameters()}
