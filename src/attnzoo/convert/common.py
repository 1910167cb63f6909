"""What the converters share: refusals, source weights all accounted for, renaming, HF RoPE settings."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, MutableMapping
from pathlib import Path
from typing import Any, NamedTuple

import torch
from safetensors.torch import load_file
from torch import Tensor

from attnzoo.config import ModelConfig
from attnzoo.model import Transformer
from attnzoo.positions.rope import RopeOptions

# transformers 5 keeps every RoPE setting in `config.rope_parameters`; 4.x spread them over rope_theta,
# rope_scaling and per-model names, and its yarn ramp read a different length.
MIN_TRANSFORMERS_MAJOR = 5
SWIGLU_ACTIVATIONS = ("silu", "swish")  # HF names of the gate activation of a SwiGLU MLP
QKV = ("q_proj", "k_proj", "v_proj")  # attnzoo's projections, in the order a fused projection stacks them
# attnzoo's models have no special tokens; a transformers config defaults its ids to tokens of its own vocabulary
# (LLaMA's eos_token_id=2), and generate would stop at them. The exported tokenizer's ids replace these.
NO_SPECIAL_TOKENS = {"bos_token_id": None, "eos_token_id": None, "pad_token_id": None}

# HF rope_parameters keys read per rope_type, besides rope_type, rope_theta and partial_rotary_factor.
ROPE_KEYS: dict[str, tuple[str, ...]] = {
    "default": (),
    "linear": ("factor",),
    "dynamic": ("factor", "original_max_position_embeddings"),
    "yarn": (
        "factor",
        "original_max_position_embeddings",
        "attention_factor",
        "beta_fast",
        "beta_slow",
        "mscale",
        "mscale_all_dim",
        "truncate",
    ),
    "llama3": ("factor", "original_max_position_embeddings", "low_freq_factor", "high_freq_factor"),
}


def unsupported(source: str, field: str, value: Any, why: str) -> ValueError:
    """The converters' refusal: the source, the field and value it cannot reproduce, and why."""
    return ValueError(f"cannot convert {source}: {field}={value!r} {why}")


class Mismatch(NamedTuple):
    """A field of an attnzoo config that a transformers class cannot hold: its value, and what the class has."""

    field: str
    value: Any
    has: str

    def __str__(self) -> str:
        return f"{self.field}={self.value!r} (it has {self.has})"


def differences(*checks: tuple[str, Any, Any]) -> list[Mismatch]:
    """The (field, value, value the class has) checks whose value differs."""
    return [Mismatch(field, value, repr(held)) for field, value, held in checks if value != held]


def rope_mismatches(cfg: ModelConfig, *, partial_rotary: bool = False) -> list[Mismatch]:
    """What of ``cfg``'s positions an HF RoPE model cannot hold: it rotates half-split pairs, and whole heads
    unless ``partial_rotary`` (HF has every attnzoo rope type: :func:`hf_rope_parameters`)."""
    if cfg.position != "rope":
        return differences(("position", cfg.position, "rope"))
    rope = cfg.position_opts
    found = differences(("position_options.interleaved", rope.interleaved, False))
    if not partial_rotary:
        found += differences(("position_options.partial_rotary_factor", rope.partial_rotary_factor, 1.0))
    return found


def multi_head_mismatches(cfg: ModelConfig) -> list[Mismatch]:
    """What of ``cfg``'s heads a fused per-head qkv cannot hold (GPT-NeoX, BLOOM): it has one kv head per query
    head, each of dim / n_heads."""
    found = []
    if cfg.n_kv_heads != cfg.n_heads:
        found.append(Mismatch("n_kv_heads", cfg.n_kv_heads, f"n_kv_heads = n_heads = {cfg.n_heads}"))
    if cfg.head_dim * cfg.n_heads != cfg.dim:
        found.append(Mismatch("head_dim", cfg.head_dim, f"head_dim = dim / n_heads = {cfg.dim / cfg.n_heads:g}"))
    return found


def refuse_mismatches(hf_class: str, mismatches: list[Mismatch]) -> None:
    """Refuse to write a model as ``hf_class`` when the class cannot hold it, naming every field that differs."""
    if mismatches:
        raise ValueError(f"cannot write this model as {hf_class}: it cannot hold {', '.join(map(str, mismatches))}")


def check_swiglu_gate(config: Mapping[str, Any], source: str) -> None:
    """Refuse a gated MLP whose gate is not SiLU (e.g. GeGLU): attnzoo's gated MLP is SwiGLU."""
    if config["hidden_act"] not in SWIGLU_ACTIVATIONS:
        raise unsupported(
            source,
            "hidden_act",
            config["hidden_act"],
            f"is not supported; a SwiGLU gate is one of {SWIGLU_ACTIVATIONS}",
        )


HF_EXTRA = 'pip install -e ".[hf]" in the attnzoo checkout'


def require_transformers() -> Any:
    """Import transformers, refusing a missing or pre-5 installation with the fix."""
    try:
        import transformers
    except ImportError:
        raise ImportError(f"attnzoo.convert needs transformers: {HF_EXTRA}") from None
    if int(transformers.__version__.split(".")[0]) < MIN_TRANSFORMERS_MAJOR:
        raise ImportError(
            f"attnzoo.convert needs transformers>={MIN_TRANSFORMERS_MAJOR} (RoPE settings in rope_parameters); "
            f"found {transformers.__version__}: {HF_EXTRA}"
        )
    return transformers


class SourceWeights:
    """A source state dict whose tensors the converter takes by name; every tensor must be taken.

    A tensor no rule asked for belongs to a part of the source model attnzoo would not have (an extra bias,
    a norm, a new layer type), so ``check_all_taken`` refuses rather than convert without it.
    """

    def __init__(self, tensors: Mapping[str, Tensor], source: str):
        self.tensors = dict(tensors)
        self.source = source
        self.taken: set[str] = set()

    def __contains__(self, name: str) -> bool:
        return name in self.tensors

    def take(self, name: str) -> Tensor:
        if name not in self.tensors:
            raise ValueError(f"cannot convert {self.source}: its state dict has no {name!r}")
        self.taken.add(name)
        return self.tensors[name]

    def check_all_taken(self) -> None:
        left = sorted(set(self.tensors) - self.taken)
        if left:
            raise ValueError(
                f"cannot convert {self.source}: {len(left)} weight(s) have no attnzoo counterpart, so the converted "
                f"model would silently lack them: {left[:8]}"
            )


def renamer(layers: str, top: Mapping[str, str], per_layer: Mapping[str, str] | None = None) -> Callable[[str], str]:
    """attnzoo parameter name → source name by prefix swaps.

    ``layers.{i}.rest`` becomes ``{layers}{i}.rest`` with the first matching prefix of ``rest`` swapped by
    ``per_layer``; other names are swapped by ``top``. A name no prefix matches is kept: a wrong guess is
    caught as a missing source tensor, never loaded.
    """

    def swap(name: str, table: Mapping[str, str]) -> str:
        for ours, theirs in table.items():
            if name.startswith(ours):
                return theirs + name[len(ours) :]
        return name

    def rename(name: str) -> str:
        if name.startswith("layers."):
            _, index, rest = name.split(".", 2)
            return f"{layers}{index}.{swap(rest, per_layer or {})}"
        return swap(name, top)

    return rename


def load_converted(
    cfg: ModelConfig, source: SourceWeights, rename: Callable[[str], str], ready: Mapping[str, Tensor] | None = None
) -> Transformer:
    """A new fp32 ``Transformer(cfg)`` holding the source weights.

    Each attnzoo tensor comes from ``ready`` (rearranged by the converter, e.g. split from a fused qkv) or
    else from the source tensor ``rename(name)``; a source tensor left over is refused. Weights are copied,
    so the result shares no memory with the source.
    """
    model = Transformer(cfg)
    ready = ready or {}
    weights = {name: ready[name] if name in ready else source.take(rename(name)) for name in model.state_dict()}
    source.check_all_taken()
    model.load_state_dict(weights)
    return model


def per_head_qkv(source: SourceWeights, fused_name: str, n_layers: int, n_heads: int) -> dict[str, Tensor]:
    """Every layer's q/k/v_proj weight and bias from a fused projection laid out head by head (GPT-NeoX, BLOOM).

    The fused rows are [q_0; k_0; v_0; q_1; k_1; v_1; ...], d rows each; ``fused_name`` holds ``{i}`` for the
    layer and ends before ``.weight`` / ``.bias``.
    """
    weights = {}
    for i in range(n_layers):
        for kind in ("weight", "bias"):
            per_head = source.take(f"{fused_name.format(i=i)}.{kind}").unflatten(0, (n_heads, 3, -1))
            for j, proj in enumerate(QKV):
                weights[f"layers.{i}.self_attn.{proj}.{kind}"] = per_head[:, j].flatten(0, 1)
    return weights


def fuse_per_head_qkv(
    weights: MutableMapping[str, Tensor], fused_name: str, n_layers: int, n_heads: int
) -> dict[str, Tensor]:
    """The inverse of :func:`per_head_qkv`: every layer's q/k/v_proj weight and bias, taken out of the attnzoo
    state dict ``weights``, fused head by head into the tensors ``fused_name`` names."""
    fused = {}
    for i in range(n_layers):
        for kind in ("weight", "bias"):
            parts = [weights.pop(f"layers.{i}.self_attn.{proj}.{kind}").unflatten(0, (n_heads, -1)) for proj in QKV]
            fused[f"{fused_name.format(i=i)}.{kind}"] = torch.stack(parts, dim=1).flatten(0, 2)
    return fused


def renamed(weights: Mapping[str, Tensor], rename: Callable[[str], str]) -> dict[str, Tensor]:
    """An attnzoo state dict under the source's names: the writers' use of a reader's ``renamer``."""
    return {rename(name): tensor for name, tensor in weights.items()}


def rope_options(config: Mapping[str, Any], source: str, *, partial_rotary: bool = False) -> dict[str, Any]:
    """attnzoo RoPE ``position_options`` from an HF config's ``rope_parameters``, as HF computes the tables.

    Refuses rope types attnzoo does not implement, partial rotary where the HF model rotates whole heads
    (``partial_rotary=False``), and keys outside those HF reads for the type: transformers 5 ignores them
    too, but a later version that read one would then compute a model this conversion silently is not.
    """
    if "rope_parameters" not in config:
        raise unsupported(source, "rope_parameters", None, "is missing: the config predates transformers 5")
    params = dict(config["rope_parameters"] or {})
    rope_type = params.pop("rope_type", "default")
    legacy_type = params.pop("type", rope_type)  # transformers 4's name, which HF keeps beside rope_type
    if legacy_type != rope_type:
        raise unsupported(source, "rope_parameters.type", legacy_type, f"disagrees with rope_type={rope_type!r}")
    if rope_type not in ROPE_KEYS:
        raise unsupported(
            source, "rope_parameters.rope_type", rope_type, f"is not supported; attnzoo's RoPE has {list(ROPE_KEYS)}"
        )
    unknown = sorted(set(params) - {"rope_theta", "partial_rotary_factor", *ROPE_KEYS[rope_type]})
    if unknown:
        raise unsupported(source, "rope_parameters", unknown, f"are keys rope_type={rope_type!r} does not use here")

    options: dict[str, Any] = {"rope_type": rope_type, "rope_theta": float(params.pop("rope_theta"))}
    partial = params.pop("partial_rotary_factor", 1.0)
    if partial != 1.0:
        if not partial_rotary:
            raise unsupported(
                source,
                "rope_parameters.partial_rotary_factor",
                partial,
                "is not supported: this model rotates whole heads",
            )
        options["partial_rotary_factor"] = float(partial)
    max_len = config["max_position_embeddings"]
    if rope_type == "dynamic":
        # HF's dynamic NTK grows θ past max_position_embeddings, whatever original_max_position_embeddings says.
        options.update(factor=params["factor"], original_max_position_embeddings=max_len)
    elif rope_type == "yarn":
        original = params["original_max_position_embeddings"]
        factor = params.get("factor")
        options.update(
            factor=max_len / original if factor is None else factor,
            original_max_position_embeddings=original,
            attention_factor=params.get("attention_factor"),
            beta_fast=params.get("beta_fast") or 32.0,  # HF reads both with `or`, so 0 means the default too
            beta_slow=params.get("beta_slow") or 1.0,
            mscale=params.get("mscale"),
            mscale_all_dim=params.get("mscale_all_dim"),
            truncate=params.get("truncate", True),
        )
    else:
        options.update(params)  # linear: factor; llama3: factor, low/high_freq_factor, original length
    return options


def hf_rope_parameters(options: RopeOptions, max_seq_len: int) -> tuple[dict[str, Any], int]:
    """The inverse of :func:`rope_options`: HF ``(rope_parameters, max_position_embeddings)``."""
    params: dict[str, Any] = {"rope_type": options.rope_type, "rope_theta": options.rope_theta}
    original = options.original_max_position_embeddings or max_seq_len
    if options.rope_type == "dynamic":
        # HF's dynamic NTK scales against max_position_embeddings, so that is the original length.
        return {**params, "factor": options.factor}, original
    if options.rope_type == "linear":
        params["factor"] = options.factor
    elif options.rope_type == "yarn":
        params.update(
            factor=options.factor,
            original_max_position_embeddings=original,
            beta_fast=options.beta_fast,
            beta_slow=options.beta_slow,
            truncate=options.truncate,
        )
        for name in ("attention_factor", "mscale", "mscale_all_dim"):
            if getattr(options, name) is not None:
                params[name] = getattr(options, name)
    elif options.rope_type == "llama3":
        params.update(
            factor=options.factor,
            original_max_position_embeddings=original,
            low_freq_factor=options.low_freq_factor,
            high_freq_factor=options.high_freq_factor,
        )
    return params, max_seq_len


def pickled_weights(directory: str | os.PathLike) -> list[Path]:
    """The ``pytorch_model*.bin`` files a checkpoint directory is read from: those of one without safetensors."""
    directory = Path(directory)
    return [] if any(directory.glob("*.safetensors")) else sorted(directory.glob("pytorch_model*.bin"))


def load_pickled_tensors(path: Path) -> dict[str, Tensor]:
    """A pickled state dict, refused unless it holds tensors alone (``weights_only``: its code never runs)."""
    try:
        loaded = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # unpickling raises many types
        # torch's message advises weights_only=False, i.e. running the file's code: never pass that on.
        raise ValueError(
            f"{path} holds more than tensors ({type(err).__name__}), so it is not loaded: a pickle may run "
            "code. Convert it to safetensors with a tool you trust, or use the model's *.safetensors files"
        ) from None
    if not isinstance(loaded, dict) or not all(isinstance(v, Tensor) for v in loaded.values()):
        raise ValueError(f"{path} is not a state dict of tensors")
    return loaded


def read_state_dict(directory: str | os.PathLike) -> dict[str, Tensor]:
    """All tensors of a checkpoint directory: its ``*.safetensors`` shards, else its ``pytorch_model*.bin``."""
    directory = Path(directory)
    files = sorted(directory.glob("*.safetensors")) or pickled_weights(directory)
    if not files:
        raise FileNotFoundError(f"{directory} holds no *.safetensors or pytorch_model*.bin weights")
    state: dict[str, Tensor] = {}
    for path in files:
        state.update(load_file(path) if path.suffix == ".safetensors" else load_pickled_tensors(path))
    return state
