"""A transformers causal LM (an object, or a local ``save_pretrained`` directory) or an official DCFormer
checkpoint directory → an fp32 attnzoo ``Transformer``, by the converter registered for its class."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from torch import Tensor

from attnzoo.convert import bloom, dcformer, diffllama, gpt_neox, llama
from attnzoo.convert.common import load_pickled_tensors, pickled_weights, read_state_dict, require_transformers
from attnzoo.model import Transformer

if TYPE_CHECKING:
    from transformers import PreTrainedModel

Converter = Callable[[Mapping[str, Any], Mapping[str, Tensor]], Transformer]

# Model class name → converter of (config dict, state dict).
CONVERTERS: dict[str, Converter] = {
    "LlamaForCausalLM": llama.from_hf,
    "MistralForCausalLM": llama.from_hf,
    "GPTNeoXForCausalLM": gpt_neox.from_hf,
    "BloomForCausalLM": bloom.from_hf,
    "DiffLlamaForCausalLM": diffllama.from_hf,
    "DCFormer": dcformer.from_official,  # the hub's remote-code class
}


def from_hf(model_or_dir: PreTrainedModel | str | os.PathLike) -> Transformer:
    """A transformers model object, or a local checkpoint directory, → an attnzoo ``Transformer``."""
    if isinstance(model_or_dir, (str, os.PathLike)):
        return _from_directory(Path(model_or_dir))
    require_transformers()  # a 4.x model's config would lack rope_parameters
    name = type(model_or_dir).__name__
    if name not in CONVERTERS:
        raise ValueError(f"cannot convert {name}: no converter; supported: {sorted(CONVERTERS)}")
    return CONVERTERS[name](model_or_dir.config.to_dict(), model_or_dir.state_dict())


def _from_directory(directory: Path) -> Transformer:
    config_path = directory / "config.json"
    if not config_path.is_file():
        raise FileNotFoundError(f"{config_path} not found; pass a directory written by save_pretrained")
    try:
        config = json.loads(config_path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"{config_path} is not a JSON model config: {err}") from None
    if not isinstance(config, dict):
        raise ValueError(f"{config_path} must hold a JSON object, not {type(config).__name__}")
    if config.get("model_type") == dcformer.MODEL_TYPE:
        # Its hub class is remote code; the official layout is read directly instead of running it.
        return dcformer.from_official(config, read_state_dict(directory))
    unknown = [name for name in config.get("architectures") or [] if name not in CONVERTERS]
    if unknown:
        raise ValueError(
            f"cannot convert {directory}: architectures {unknown} have no converter; supported: {sorted(CONVERTERS)}"
        )
    for path in pickled_weights(directory):
        load_pickled_tensors(path)  # transformers' refusal of a pickle that holds code advises running it
    transformers = require_transformers()
    model, info = transformers.AutoModelForCausalLM.from_pretrained(
        directory, local_files_only=True, output_loading_info=True
    )
    # Weights the directory lacks would be freshly initialised: refuse rather than convert random ones.
    absent = sorted(info["missing_keys"]) + sorted(str(key) for key in info["mismatched_keys"])
    if absent:
        raise ValueError(f"cannot convert {directory}: its weights lack or mismatch {absent[:8]}")
    return from_hf(model)
