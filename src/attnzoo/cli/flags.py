"""Flags from the config dataclasses: one ``--flag`` per field of ModelConfig, DataConfig and TrainConfig.

Model and training options come from three layers, later ones winning: the defaults, a TOML file
(``--config``), and the flags given on the command line. A flag is stored only when given (``section.field``
in the Namespace), which is what lets the file fill the rest and lets ``train --resume`` name the model flags
it refuses.

Why this engine and not tyro, jsonargparse or simple_parsing: each of them builds the dataclass from defaults
plus flags, so the "given or not" that the TOML layering and ``--resume`` rely on would have to be recovered
from its own config-file mechanism (YAML or JSON first, with its own precedence and error messages), and
``--attention-option KEY=VALUE`` into a free-form dict, registry-driven choices and the ``--data`` alias would
each need a library-specific annotation. These ~100 lines of plain argparse keep every flag, message and
subparser as they are, and add no dependency.
"""

from __future__ import annotations

import argparse
import dataclasses
import types
import typing
from collections.abc import Callable
from typing import Any

from attnzoo.attention import ATTENTION
from attnzoo.cli.command import path_argument
from attnzoo.config import MLP_KINDS, NORM_KINDS, ModelConfig, attn_backends, parse_key_value
from attnzoo.positions import POSITIONS
from attnzoo.training.config import (
    DEFAULT_MODEL,
    DTYPES,
    PARALLEL_STRATEGIES,
    DataConfig,
    TrainConfig,
    default_model_settings,
    load_toml,
)

MODEL_HELP = {
    "dim": "width of the residual stream",
    "n_layers": "number of Transformer blocks",
    "n_heads": "query heads per layer",
    "n_kv_heads": "key/value heads: n_heads gives MHA, 1 MQA, a divisor in between GQA (default: n_heads)",
    "head_dim": "size of each head (default: dim / n_heads)",
    "mlp": "feed-forward kind",
    "mlp_hidden_dim": "feed-forward width (default: 8/3·dim rounded up to 32 for swiglu, 4·dim for gelu)",
    "norm": "normalisation layer",
    "norm_eps": "epsilon of the normalisation layers",
    "dropout": "dropout probability on residual branches and attention",
    "bias": "biases in linear layers and LayerNorm",
    "tie_embeddings": "share the input embedding and the output projection",
    "max_seq_len": "longest sequence the model serves (default: --seq-len)",
    "attention": "attention mechanism; configure it with --attention-option",
    "position": "positional scheme; configure it with --position-option",
    "attn_backend": "attention kernel: auto (each call runs the first kernel that serves it), eager (the reference) "
    "or one kernel by name; attnzoo info shows the one a config runs",
    "init_std": "standard deviation of the initial weights",
    "parallel_residual": "attention and MLP read the same block input (GPT-J, GPT-NeoX)",
    "embedding_norm": "normalise the token embeddings (BLOOM)",
    "scale_embeddings": "token embeddings N(0, 1/dim) times √dim, a unit sinusoidal table (Vaswani et al., fairseq)",
    "causal": "attend to earlier tokens only; --no-causal attends both ways (an encoder: no cache, no generate)",
}
MODEL_CHOICES = {
    "attention": ATTENTION.names(),
    "position": POSITIONS.names(),
    "mlp": list(MLP_KINDS),
    "norm": list(NORM_KINDS),
    "attn_backend": attn_backends(),
}
TRAIN_CHOICES = {"dtype": list(DTYPES), "parallel": list(PARALLEL_STRATEGIES)}
# Fields set otherwise: the vocabulary by the tokenizer, the options by --attention-option/--position-option.
MODEL_FIELDS_WITHOUT_FLAGS = ("vocab_size", "attention_options", "position_options")
SCHEMES = ("attention", "position")


def _plain_type(annotation: Any) -> type:
    """``int | None`` → ``int``: the type a flag's value is parsed as."""
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        return next(a for a in typing.get_args(annotation) if a is not type(None))
    return annotation


def _add_dataclass_flags(
    group: argparse._ArgumentGroup,
    cls: type,
    section: str,
    *,
    help_for: Callable[[dataclasses.Field], str],
    choices: dict[str, list[str]],
    skip: tuple[str, ...] = (),
    aliases: dict[str, str] | None = None,
) -> None:
    """One flag per field (``--n-kv-heads``), stored as ``section.field`` and only when given."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if f.name in skip or dataclasses.is_dataclass(hints[f.name]):
            continue
        kind = _plain_type(hints[f.name])
        flag = f"--{f.name.replace('_', '-')}"
        flags = [aliases[f.name], flag] if aliases and f.name in aliases else [flag]
        options: dict[str, Any] = {"dest": f"{section}.{f.name}", "default": argparse.SUPPRESS, "help": help_for(f)}
        if kind is bool:
            options["action"] = argparse.BooleanOptionalAction
        elif typing.get_origin(kind) is tuple:  # tuple[str, ...]: one or more values
            options.update(nargs="+", type=typing.get_args(kind)[0], metavar=f.name.upper())
        else:
            options.update(type=kind, metavar=f.name.upper())
            if f.name in choices:
                options.update(choices=choices[f.name], metavar="{" + ",".join(choices[f.name]) + "}")
        group.add_argument(*flags, **options)


def _key_value(text: str) -> tuple[str, Any]:
    try:
        return parse_key_value(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def add_config_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config",
        metavar="FILE.toml",
        type=path_argument,
        help="TOML file with [model], [data] and [train] tables",
    )


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("model (ModelConfig; unset fields take the defaults shown)")

    def help_for(f: dataclasses.Field) -> str:
        default = DEFAULT_MODEL.get(f.name, f.default)
        shown = "" if default is None or f.name == "max_seq_len" else f" (default: {default})"
        return MODEL_HELP.get(f.name, f"ModelConfig.{f.name}") + shown

    _add_dataclass_flags(
        group, ModelConfig, "model", help_for=help_for, choices=MODEL_CHOICES, skip=MODEL_FIELDS_WITHOUT_FLAGS
    )
    for kind in SCHEMES:
        group.add_argument(
            f"--{kind}-option",
            dest=f"{kind}_options",
            metavar="KEY=VALUE",
            type=_key_value,
            action="append",
            default=[],
            help=f'an option of the {kind} scheme; VALUE is JSON (1, 0.5, true, "x") or a bare string; repeatable',
        )


def add_train_arguments(parser: argparse.ArgumentParser) -> None:
    def help_for(f: dataclasses.Field) -> str:
        return f.metadata.get("help", "") + ("" if f.default == () else f" (default: {f.default})")

    data = parser.add_argument_group("data (the [data] table)")
    _add_dataclass_flags(
        data, DataConfig, "data", help_for=help_for, choices=TRAIN_CHOICES, aliases={"corpus": "--data"}
    )
    train = parser.add_argument_group("training (the [train] table)")
    _add_dataclass_flags(train, TrainConfig, "train", help_for=help_for, choices=TRAIN_CHOICES)


def given(args: argparse.Namespace, section: str) -> dict[str, Any]:
    """The fields of ``section`` (model, data or train) whose flags were given."""
    return {key.split(".", 1)[1]: value for key, value in vars(args).items() if key.startswith(section + ".")}


def train_config_from_args(args: argparse.Namespace, base: dict[str, Any] | None = None) -> TrainConfig:
    """``base`` (a TrainConfig dict) or the ``--config`` file, overridden by the flags given."""
    if base is None:
        file = load_toml(args.config) if getattr(args, "config", None) else {"train": {}, "data": {}}
        base = {**file["train"], "data": file["data"]}
    data = {**base.get("data", {}), **given(args, "data")}
    return TrainConfig.from_dict({**base, **given(args, "train"), "data": data})


def model_settings_from_args(
    args: argparse.Namespace, train: TrainConfig, base: dict[str, Any] | None = None
) -> dict[str, Any]:
    """ModelConfig fields from ``base`` (the defaults, without vocab_size, unless given: e.g. a pretrained
    model's config), the ``--config`` file and the flags. A scheme's options are kept only with the scheme:
    ``--attention selective`` over a base with another attention starts from selective's defaults."""
    base = default_model_settings(train) if base is None else base
    file = load_toml(args.config)["model"] if getattr(args, "config", None) else {}
    if "vocab_size" in file:  # the tokenizer's size replaced it, silently
        raise ValueError(
            f"config file {args.config}: [model] vocab_size = {file['vocab_size']!r} is set by the tokenizer: leave it "
            "out and name the tokenizer in [data] tokenizer"
        )
    settings = {**base, **file, **given(args, "model")}
    for kind in SCHEMES:
        inherited = base.get(f"{kind}_options", {}) if settings.get(kind) == base.get(kind) else {}
        from_file = file.get(f"{kind}_options", {})
        if not isinstance(from_file, dict):
            raise ValueError(
                f"config file {args.config}: {kind}_options={from_file!r} is invalid: must be a dict of options, "
                f"a table ([model.{kind}_options])"
            )
        options = {**inherited, **from_file}
        options.update(getattr(args, f"{kind}_options", []))
        settings[f"{kind}_options"] = options
    return settings


def model_flags_given(args: argparse.Namespace) -> list[str]:
    """The flags given that set the model, ``--config`` included."""
    flags = [f"--{name.replace('_', '-')}" for name in given(args, "model")]
    flags += [f"--{kind}-option" for kind in SCHEMES if getattr(args, f"{kind}_options", [])]
    return flags + (["--config"] if args.config else [])
