"""``AttnzooConfig``: an attnzoo ``ModelConfig`` as a transformers config, field for field."""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

from transformers import PreTrainedConfig

from attnzoo.config import ModelConfig


class AttnzooConfig(PreTrainedConfig):
    """Every :class:`~attnzoo.config.ModelConfig` field, under its own name and with its default, plus
    transformers' common settings. Constructing one validates it as ``ModelConfig`` does (the same
    ``ValueError``\\s) and resolves the derived fields, so ``config.json`` records the whole architecture; the
    standard names transformers reads (``hidden_size``, ``num_hidden_layers``, ``tie_word_embeddings``, ...) are
    aliases of attnzoo's."""

    model_type = "attnzoo"
    attribute_map: ClassVar[dict[str, str]] = {
        "hidden_size": "dim",
        "num_hidden_layers": "n_layers",
        "num_attention_heads": "n_heads",
        "num_key_value_heads": "n_kv_heads",
        "intermediate_size": "mlp_hidden_dim",
        "max_position_embeddings": "max_seq_len",
        "tie_word_embeddings": "tie_embeddings",
    }

    # ModelConfig's fields, in its order and with its defaults (tests/test_hf_model.py holds them equal).
    vocab_size: int = 256
    dim: int = 256
    n_layers: int = 4
    n_heads: int = 8
    n_kv_heads: int | None = None
    head_dim: int | None = None
    mlp: str = "swiglu"
    mlp_hidden_dim: int | None = None
    norm: str = "rmsnorm"
    norm_eps: float = 1e-5
    dropout: float = 0.0
    bias: bool = False
    tie_embeddings: bool = True
    parallel_residual: bool = False
    embedding_norm: bool = False
    scale_embeddings: bool = False
    max_seq_len: int = 1024
    attention: str = "mha"
    attention_options: dict[str, Any] = dataclasses.field(default_factory=dict)
    position: str = "rope"
    position_options: dict[str, Any] = dataclasses.field(default_factory=dict)
    attn_backend: str = "auto"
    init_std: float = 0.02
    causal: bool = True

    def __post_init__(self, **kwargs: Any) -> None:
        super().__post_init__(**kwargs)
        for name, value in self.to_model_config().to_dict().items():  # validated, derived fields resolved
            setattr(self, name, value)

    @classmethod
    def from_model_config(cls, config: ModelConfig, **kwargs: Any) -> AttnzooConfig:
        """``config`` as a transformers config; ``kwargs`` set transformers' own settings (``eos_token_id``, ...)."""
        return cls(**config.to_dict(), **kwargs)

    def to_model_config(self) -> ModelConfig:
        return ModelConfig.from_dict(
            {field.name: getattr(self, field.name) for field in dataclasses.fields(ModelConfig)}
        )

    def to_diff_dict(self) -> dict[str, Any]:
        """What ``save_pretrained`` writes: transformers leaves out values equal to the class defaults, but every
        architecture field is written, as attnzoo writes its own ``config.json``, so that a file keeps meaning the
        same model when a default changes."""
        return {**super().to_diff_dict(), **self.to_model_config().to_dict()}
