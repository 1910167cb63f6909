"""``AttnzooForCausalLM``: attnzoo's ``Transformer`` as a transformers causal LM.

The wrapped model is the submodule ``model``, unchanged, so parameter names are attnzoo's behind a ``model.``
prefix (``model.layers.0.self_attn.q_proj.weight``, the names of HF Llama's projections) and the forward pass is
attnzoo's, kernels included. transformers supplies the rest: loading and saving, the loss, ``generate``,
``Trainer``, PEFT.
"""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import Tensor, nn
from transformers import GenerationConfig, GenerationMixin, PreTrainedModel
from transformers import initialization as init
from transformers.generation.configuration_utils import GenerationMode
from transformers.modeling_outputs import CausalLMOutputWithPast
from transformers.utils.generic import can_return_tuple

from attnzoo.attention import ATTENTION
from attnzoo.cache import KVCache
from attnzoo.hf.cache import AttnzooCache
from attnzoo.hf.configuration import AttnzooConfig
from attnzoo.model import Transformer
from attnzoo.positions import POSITIONS


class AttnzooForCausalLM(PreTrainedModel, GenerationMixin):
    config_class = AttnzooConfig
    base_model_prefix = "model"
    main_input_name = "input_ids"
    _no_split_modules: ClassVar[list[str]] = ["Block"]
    # Tied where tie_embeddings (transformers reads it as tie_word_embeddings): saved once, under the embedding.
    _tied_weights_keys: ClassVar[dict[str, str]] = {"model.lm_head.weight": "model.embed_tokens.weight"}

    def __init__(self, config: AttnzooConfig, model: Transformer | None = None):
        super().__init__(config)
        model_config = config.to_model_config()
        if model is not None and model.config != model_config:
            raise ValueError(f"the model's config {model.config} is not {model_config}, the one given")
        self.model = Transformer(model_config) if model is None else model
        # Built off the meta device, attnzoo has initialised (or trained) it already; built on it (from_pretrained),
        # it is initialised by initialize_weights once transformers has loaded what the checkpoint holds.
        self._initialised = self.model.embed_tokens.weight.device.type != "meta"
        self.post_init()

    @classmethod
    def from_attnzoo(cls, model: Transformer, **config_kwargs) -> AttnzooForCausalLM:
        """``model`` wrapped, its parameters shared (not copied); ``config_kwargs`` set transformers' own settings
        (``eos_token_id``, ...). :meth:`to_attnzoo` gives it back."""
        return cls(AttnzooConfig.from_model_config(model.config, **config_kwargs), model)

    def to_attnzoo(self) -> Transformer:
        """The attnzoo ``Transformer`` this model runs (the same module, not a copy)."""
        return self.model

    def get_input_embeddings(self) -> nn.Embedding:
        return self.model.embed_tokens

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.model.embed_tokens = value

    def get_output_embeddings(self) -> nn.Linear:
        return self.model.lm_head

    def set_output_embeddings(self, value: nn.Linear) -> None:
        self.model.lm_head = value

    @torch.no_grad()
    def initialize_weights(self) -> None:
        """Initialise what transformers did not load from a checkpoint as attnzoo does: ``reset_parameters`` and
        the norms' own init, whose ``nn.init`` calls transformers turns into no-ops on loaded tensors here; and
        the positional scheme's buffers, derived from the config and never saved."""
        if self._initialised:
            return
        with init.guard_torch_init_functions():
            self.model.reset_parameters()
            for module in self.model.modules():
                if isinstance(module, (nn.RMSNorm, nn.LayerNorm)):
                    module.reset_parameters()
        cfg = self.config.to_model_config()
        with torch.device("cpu"):
            fresh = POSITIONS.get(cfg.position)(cfg, ATTENTION.get(cfg.attention).qk_head_dim(cfg))
        for name, buffer in fresh.named_buffers():
            self.model.position.get_buffer(name).copy_(buffer)
        self._initialised = True

    def _prepare_cache_for_generation(
        self,
        generation_config: GenerationConfig,
        model_kwargs: dict,
        generation_mode: GenerationMode,
        batch_size: int,
        max_cache_length: int,
    ) -> None:
        """``generate``'s cache: an :class:`AttnzooCache` of the generation's length, in place of transformers'
        own caches, which store keys and values only."""
        if model_kwargs.get("cache") is not None or generation_config.use_cache is False:
            return super()._prepare_cache_for_generation(
                generation_config, model_kwargs, generation_mode, batch_size, max_cache_length
            )
        if generation_config.cache_implementation is not None:
            raise ValueError(
                f"cache_implementation={generation_config.cache_implementation!r} is not available to an attnzoo "
                "model, which caches what its mechanism needs in an AttnzooCache: leave cache_implementation unset"
            )
        model_kwargs["cache"] = AttnzooCache(max_cache_length)

    @can_return_tuple
    def forward(
        self,
        input_ids: Tensor | None = None,
        attention_mask: Tensor | None = None,
        position_ids: Tensor | None = None,
        cache: AttnzooCache | None = None,
        inputs_embeds: Tensor | None = None,
        labels: Tensor | None = None,
        use_cache: bool | None = None,
        logits_to_keep: int | Tensor = 0,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        **kwargs,
    ) -> CausalLMOutputWithPast:
        """Logits (B, T, vocab) and, with ``labels`` (B, T), transformers' causal-LM loss: the labels are shifted
        inside (position t predicts ``labels[:, t + 1]``), -100 ignored, so ``labels=input_ids`` trains the
        model.

        With ``cache`` (an :class:`AttnzooCache`), ``input_ids`` continue the cached sequence and are appended
        to it; ``use_cache`` does not create one (``generate`` does, sized to the generation). attnzoo numbers
        positions from the cache, the same for every sequence: ``position_ids``, where given, must be those
        positions, and ``attention_mask`` all ones, or in an uncached forward of a causal model right padding
        (a collator's padded training batch, -100 labels at the pads), which no real token attends to.
        """
        if output_attentions or output_hidden_states:
            raise ValueError(
                "output_attentions and output_hidden_states are not available from an attnzoo model; its attention "
                "maps come from model.to_attnzoo().attention_maps(input_ids)"
            )
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("pass exactly one of input_ids and inputs_embeds")
        if inputs_embeds is not None and cache is not None:
            raise ValueError("inputs_embeds cannot continue a cache; pass input_ids, or no cache")
        batch, length = (input_ids if input_ids is not None else inputs_embeds).shape[:2]
        kv = self._attnzoo_cache(cache, batch)
        start = 0 if kv is None else kv.length
        real = _real_tokens(attention_mask, batch, start + length, right_padding=kv is None and self.config.causal)
        _check_positions(position_ids, start, real[:, start:])
        hidden = self.model._hidden(input_ids, kv) if inputs_embeds is None else self.model.encode(inputs_embeds)
        kept = slice(-logits_to_keep, None) if isinstance(logits_to_keep, int) else logits_to_keep
        logits = self.model.lm_head(hidden[:, kept])
        loss = None
        if labels is not None:
            loss = self.loss_function(logits=logits, labels=labels, vocab_size=self.config.vocab_size, **kwargs)
        return CausalLMOutputWithPast(loss=loss, logits=logits, cache=cache)

    def _attnzoo_cache(self, cache: AttnzooCache | None, batch_size: int) -> KVCache | None:
        if cache is None:
            return None
        if not isinstance(cache, AttnzooCache):
            raise ValueError(
                f"an attnzoo model reads its cache as an AttnzooCache, not a {type(cache).__name__}: pass "
                "attnzoo.hf.AttnzooCache(max_len), or let generate make it"
            )
        return cache.for_model(self.model, batch_size)


def _real_tokens(attention_mask: Tensor | None, batch: int, end: int, *, right_padding: bool) -> Tensor:
    """(B, end) bool, True at the tokens ``attention_mask`` says are real. attnzoo attends over every position, so
    a mask may only say that all are, or (``right_padding``) mark pads after every real token of a causal model's
    uncached forward: causal attention never lets a real token see them, so its output is exact."""
    if attention_mask is None:
        return torch.ones(batch, end, dtype=torch.bool)
    if attention_mask.shape != (batch, end):
        shape = tuple(attention_mask.shape)
        raise ValueError(f"attention_mask must have shape ({batch}, {end}), the cached and new tokens; got {shape}")
    real = attention_mask.bool()
    if bool(real.all()) or (right_padding and bool((real[:, :-1] >= real[:, 1:]).all())):
        return real
    raise ValueError(
        "attention_mask masks tokens before real ones (left padding, or padding with a cache), which an attnzoo "
        "model does not support: it numbers positions alike for every sequence. Pad on the right for training, "
        "and generate from prompts of one length (or one at a time)"
    )


def _check_positions(position_ids: Tensor | None, start: int, real: Tensor) -> None:
    """Positions come from the cache; ``position_ids`` (which generate derives from the mask) must agree at the
    ``real`` tokens (B, T)."""
    if position_ids is None:
        return
    length = real.shape[1]
    expected = torch.arange(start, start + length, device=position_ids.device)
    if position_ids.shape[-1] != length or not bool(((position_ids == expected) | ~real.to(position_ids.device)).all()):
        raise ValueError(
            f"position_ids must be {start}..{start + length - 1}, the positions after the cached {start}: an attnzoo "
            "model numbers positions itself (no left padding or packed sequences)"
        )
