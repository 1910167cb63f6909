"""Start a run from a pretrained model, with its attention swapped if asked, and train part of the model.

:func:`init_from_pretrained` loads a pretrained model's weights into a model whose configuration may
differ in its attention: a mechanism that ``extends`` the source's (selective and dcmha extend mha) adds
parameters, and each layer starts them where it still computes what the source did, as far as its math
allows (:meth:`~attnzoo.attention.Attention.init_added_parameters_as_identity`). Loading is non-strict but
checked: every pretrained tensor must land in the model with its shape, and only the attention layers may
have parameters the checkpoint lacks. :func:`freeze_all_but` then leaves only some parameters trainable
(``train_only``), e.g. the added ones: the SSA paper's fine-tuning setting.
"""

from __future__ import annotations

import dataclasses
import re
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file
from torch import Tensor, nn

from attnzoo.attention import ATTENTION
from attnzoo.config import ModelConfig, function_neutral
from attnzoo.data.tokenizers import Tokenizer
from attnzoo.model import WEIGHTS_NAME, Transformer
from attnzoo.positions import POSITIONS
from attnzoo.training.checkpoint import TOKENIZER, Checkpoint, CheckpointError
from attnzoo.weights import check_dtypes, check_finite

ATTENTION_PARAMETER = re.compile(r"layers\.(\d+)\.self_attn\.(.+)")


@dataclass(frozen=True)
class PretrainedInit:
    """What initialising from a pretrained model did: the run header and ``run.json`` report it."""

    source: Path
    step: int | None  # the source checkpoint's training step; None for a plain pretrained directory
    has_tokenizer: bool  # False: the source does not say which tokens its ids mean
    changes: dict[str, tuple[Any, Any]]  # model settings that differ from the source's: (source, new)
    added: tuple[str, ...]  # parameters the source lacked, started by their layer's identity hook
    not_identity: tuple[str, ...]  # why the model may not start computing what the source did; () if it does

    def describe(self) -> list[str]:
        """Lines for the run header."""
        step = f" (step {self.step})" if self.step is not None else ""
        lines = [f"init   from {self.source}{step}, {len(self.added)} tensor(s) added"]
        lines += [f"       {name}: {old!r} → {new!r}" for name, (old, new) in self.changes.items()]
        if not self.has_tokenizer:
            lines.append("       it has no tokenizer.json: its token ids are taken to be this run's tokenizer's")
        if self.not_identity:
            lines.append(f"       warning: the model may not start computing what {self.source} computed:")
            lines += [f"         {reason}" for reason in self.not_identity]
        else:
            at_identity = ", the added parameters at identity" if self.added else ""
            lines.append(f"       the model starts computing what {self.source} did{at_identity}")
        return lines

    def to_dict(self) -> dict[str, Any]:
        return {
            "source": str(self.source),
            "step": self.step,
            "has_tokenizer": self.has_tokenizer,
            "changes": {name: list(values) for name, values in self.changes.items()},
            "added": list(self.added),
            "identity": not self.not_identity,
            "not_identity": list(self.not_identity),
        }


def check_tokenizer(checkpoint: Checkpoint, tokenizer: Tokenizer) -> None:
    """Refuse pretrained weights whose token ids would mean other tokens than ``tokenizer`` gives them."""
    source = checkpoint.tokenizer
    if source is not None and source != tokenizer:
        raise CheckpointError(
            f"{checkpoint.directory} was trained with another tokenizer ({source.kind}, {source.vocab_size} "
            f"tokens) than this run's ({tokenizer.kind}, {tokenizer.vocab_size} tokens): its embeddings would "
            "be read as other tokens"
        )
    vocab_size = checkpoint.model_config.vocab_size
    if vocab_size != tokenizer.vocab_size:
        # Converted from a directory without a tokenizer.json, the model's own tokenizer may still be named.
        hint = (
            f"; it has no {TOKENIZER}: if its model has one, name it with --tokenizer hf:PATH" if source is None else ""
        )
        raise CheckpointError(
            f"{checkpoint.directory} has vocab_size {vocab_size} but this run's {tokenizer.kind} tokenizer has "
            f"{tokenizer.vocab_size} tokens: the model can only continue on ids from the vocabulary it was "
            f"trained with{hint}"
        )


def init_from_pretrained(model: Transformer, checkpoint: Checkpoint) -> PretrainedInit:
    """Load ``checkpoint``'s weights into ``model``, whose attention may differ, and start the added
    parameters at identity. Raises :class:`CheckpointError` for a swap or tensor that does not carry over."""
    source, config = checkpoint.model_config, model.config
    new_mechanism = ATTENTION.get(config.attention)
    if config.attention != source.attention and source.attention not in new_mechanism.extends:
        extending = [name for name in ATTENTION.names() if source.attention in ATTENTION.get(name).extends]
        raise CheckpointError(
            f"cannot initialise {config.attention} attention from {checkpoint.directory}, whose attention is "
            f"{source.attention}: {config.attention} does not extend {source.attention} (it lays out or reads its "
            f"projections its own way), so the pretrained tensors would not mean the same there. Mechanisms "
            f"that extend {source.attention}: {extending or 'none'}"
        )
    weights = _read_weights(checkpoint.directory / WEIGHTS_NAME, next(model.parameters()).dtype)
    added = _parameters_to_add(weights, model, checkpoint.directory)
    model.load_state_dict(weights, strict=False)
    reasons = _start_added_at_identity(model, added, source)
    changes = _changes(source, config)
    reasons += [
        f"{name} changes ({old!r} → {new!r})"
        for name, (old, new) in changes.items()
        # The attention layers' identity hooks answer for the attention settings.
        if name not in function_neutral(config.position) and not name.startswith("attention")
    ]
    return PretrainedInit(
        source=checkpoint.directory,
        step=checkpoint.step,
        has_tokenizer=checkpoint.tokenizer is not None,
        changes=changes,
        added=tuple(added),
        not_identity=tuple(reasons),
    )


def _read_weights(path: Path, model_dtype: torch.dtype) -> dict[str, Tensor]:
    try:
        weights = load_file(path)
    except Exception as err:  # safetensors raises its own types for missing and unreadable files
        raise CheckpointError(f"cannot read {path}: {err}") from None
    try:
        check_dtypes({name: tensor.dtype for name, tensor in weights.items()}, path, model_dtype)
        check_finite(((name, tensor.to(model_dtype)) for name, tensor in weights.items()), path)
    except ValueError as err:
        raise CheckpointError(str(err)) from None
    return weights


def _parameters_to_add(weights: dict[str, Tensor], model: nn.Module, directory: Path) -> list[str]:
    """The model's tensors the checkpoint lacks, all in attention layers, after checking that every
    checkpoint tensor lands in the model with its shape."""
    expected = model.state_dict(keep_vars=True)
    mismatched = [
        f"{name} is {tuple(tensor.shape)} there but {tuple(expected[name].shape)} here"
        for name, tensor in weights.items()
        if name in expected and tensor.shape != expected[name].shape
    ]
    if mismatched:
        raise CheckpointError(
            f"{len(mismatched)} tensor(s) of {directory} have another shape in the new model, whose configuration "
            f"lays them out differently, so their values cannot carry over: {'; '.join(mismatched[:4])}"
        )
    unexpected = sorted(set(weights) - set(expected))
    if unexpected:
        raise CheckpointError(
            f"{directory} holds {len(unexpected)} tensor(s) the new model has no place for, so what they learned "
            f"would be dropped: {unexpected[:6]}"
        )
    # Names of one tensor (a tied output matrix): the checkpoint stores it once, under any of them.
    aliases: dict[int, list[str]] = defaultdict(list)
    for name, tensor in expected.items():
        aliases[id(tensor)].append(name)
    missing = []
    for names in aliases.values():
        stored = [name for name in names if name in weights]
        if len(stored) > 1:
            raise CheckpointError(
                f"{directory} holds {stored} as separate tensors, which the new model ties into one "
                "(tie_embeddings): one of them would be lost"
            )
        if not stored:
            missing += names
    outside = [name for name in missing if not ATTENTION_PARAMETER.fullmatch(name)]
    if outside:
        raise CheckpointError(
            f"the new model has {len(outside)} tensor(s) outside its attention layers that {directory} lacks: "
            f"{outside[:6]}. Only a change of attention may add parameters; the rest must come pretrained"
        )
    return missing


def _start_added_at_identity(model: Transformer, added: list[str], source: ModelConfig) -> list[str]:
    """Ask every layer to start its added parameters at identity; the reasons it gives, with their layers."""
    by_layer: dict[int, set[str]] = defaultdict(set)
    for name in added:
        layer, rest = ATTENTION_PARAMETER.fullmatch(name).groups()
        by_layer[int(layer)].add(rest)
    layers_by_reason: dict[str, list[int]] = {}
    with torch.no_grad():
        # Every layer, including those with nothing added: a structural change (a window) is a reason too.
        for index, block in enumerate(model.layers):
            for reason in dict.fromkeys(block.self_attn.init_added_parameters_as_identity(by_layer[index], source)):
                layers_by_reason.setdefault(reason, []).append(index)
    return [f"{_layers(layers, len(model.layers))}: {reason}" for reason, layers in layers_by_reason.items()]


def _layers(indices: list[int], n_layers: int) -> str:
    if len(indices) == n_layers:
        return "every layer"
    return f"layer {indices[0]}" if len(indices) == 1 else f"layers {', '.join(map(str, indices))}"


def _changes(source: ModelConfig, new: ModelConfig) -> dict[str, tuple[Any, Any]]:
    """Model settings that differ. Options go key by key under an unchanged scheme (``attention_options.rank``);
    under a swapped one, each side lists those it sets away from its scheme's defaults."""
    theirs, ours = source.to_dict(), new.to_dict()
    changes: dict[str, tuple[Any, Any]] = {}
    for name, value in ours.items():
        if not name.endswith("_options"):
            if theirs[name] != value:
                changes[name] = (theirs[name], value)
            continue
        scheme = name.removesuffix("_options")
        if theirs[scheme] == ours[scheme]:
            changes.update(
                (f"{name}.{key}", (theirs[name][key], option))
                for key, option in value.items()
                if theirs[name][key] != option
            )
            continue
        before = _non_default(scheme, theirs[scheme], theirs[name])
        after = _non_default(scheme, ours[scheme], value)
        if before or after:
            changes[name] = (before, after)
    return changes


def _non_default(scheme: str, name: str, options: dict[str, Any]) -> dict[str, Any]:
    """The ``options`` of attention or position scheme ``name`` that differ from its defaults."""
    defaults = dataclasses.asdict({"attention": ATTENTION, "position": POSITIONS}[scheme].parse_options(name, {}))
    return {key: value for key, value in options.items() if value != defaults[key]}


def freeze_all_but(model: nn.Module, fragments: Sequence[str]) -> None:
    """Train only the parameters whose name contains one of ``fragments``; freeze the rest.

    A tied parameter trains if any of its names matches. A fragment that matches nothing is refused, with the
    names there are, since a typo would otherwise silently freeze what it was meant to train.
    """
    named = list(model.named_parameters(remove_duplicate=False))
    unmatched = [fragment for fragment in fragments if not any(fragment in name for name, _ in named)]
    if unmatched:
        names = list(dict.fromkeys(re.sub(r"\.\d+\.", ".*.", name) for name, _ in named))
        raise ValueError(
            f"train_only={list(fragments)!r} is invalid: {unmatched} match(es) no parameter name; the names, with "
            f"layer indices as *, are {names}"
        )
    trainable = {id(parameter) for name, parameter in named if any(fragment in name for fragment in fragments)}
    for _, parameter in named:
        parameter.requires_grad_(id(parameter) in trainable)


def count_trainable(model: nn.Module) -> int:
    return sum(parameter.numel() for parameter in model.parameters() if parameter.requires_grad)
