"""A pre-norm decoder-only Transformer whose attention and positions are chosen by name.

config → Transformer(config) → model(idx) / model(idx, targets) → generate → save/from_pretrained
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from safetensors.torch import load_model, save_model
from torch import Tensor, nn

from attnzoo.attention import ATTENTION, AttentionContext
from attnzoo.attention.base import residual_linear
from attnzoo.attention.kernels import Call, Kernel, choose
from attnzoo.cache import KVCache, LayerCache
from attnzoo.config import ModelConfig
from attnzoo.decoding import CompiledDecoder, cache_capacity
from attnzoo.generation import check_sampling_args, sample_next_token
from attnzoo.io import atomic_write, check_memory
from attnzoo.positions import POSITIONS
from attnzoo.precision import compute_dtype
from attnzoo.validation import is_int, require
from attnzoo.weights import check_dtypes, check_finite, stored_dtypes

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"


def _tensors(value: object, seen: set[int] | None = None) -> list[Tensor]:
    """Every tensor reachable through a cache's attributes, lists and dicts, once each."""
    seen = set() if seen is None else seen
    if isinstance(value, Tensor):
        return [] if id(value) in seen or seen.add(id(value)) else [value]
    if isinstance(value, (list, tuple)):
        return [t for item in value for t in _tensors(item, seen)]
    if isinstance(value, dict):
        return [t for item in value.values() for t in _tensors(item, seen)]
    if hasattr(value, "__dict__"):
        return [t for item in vars(value).values() for t in _tensors(item, seen)]
    return []


def make_norm(cfg: ModelConfig) -> nn.Module:
    if cfg.norm == "rmsnorm":
        return nn.RMSNorm(cfg.dim, eps=cfg.norm_eps)
    return nn.LayerNorm(cfg.dim, eps=cfg.norm_eps, bias=cfg.bias)


def cache_bytes(cfg: ModelConfig, batch_size: int, max_len: int, dtype: torch.dtype) -> list[int]:
    """The bytes each layer's cache takes for ``batch_size`` sequences of up to ``max_len`` positions at ``dtype``,
    from the mechanism's formula (``Attention.cache_bytes``): what ``Transformer.new_cache`` allocates."""
    attention = ATTENTION.get(cfg.attention)
    return [attention.cache_bytes(cfg, i, batch_size, max_len, dtype) for i in range(cfg.n_layers)]


def training_flops_per_token(cfg: ModelConfig, seq_len: int) -> float:
    """FLOPs of a training step (forward and backward) per token, for one sequence of ``seq_len`` tokens, as torch's
    FLOP counter counts the matrix products of the eager attention path: a mechanism's own products (DCMHA's
    composition and weight projection, Diff's second map) are counted where a fused kernel would hide them, and the
    scores of every key, masked ones too, for every mechanism alike."""
    from torch.utils.flop_counter import FlopCounterMode  # here: it imports Triton, a third of a second

    require(is_int(seq_len) and seq_len >= 1, "seq_len", seq_len, "must be an integer >= 1")
    # The eager path holds every head's seq_len × seq_len scores of a layer at once (float32): 10**12 tokens asked
    # for terabytes, tried before anything said no.
    scores = cfg.n_heads * seq_len * seq_len * 4
    check_memory(scores, f"the eager attention scores of one layer at seq_len={seq_len:,}", "cpu", {"seq_len": seq_len})
    model = Transformer(dataclasses.replace(cfg, attn_backend="eager", max_seq_len=max(cfg.max_seq_len, seq_len)))
    idx = torch.zeros(1, seq_len, dtype=torch.long)
    with FlopCounterMode(display=False) as counter:
        model(idx, idx)[1].backward()
    return counter.get_total_flops() / seq_len


def init_linear(module: nn.Linear, std: float, n_layers: int) -> None:
    """GPT-2's init of one projection: weights N(0, std), scaled by 1/√(2·n_layers) where the projection writes into
    the residual stream (``residual_linear``), biases 0."""
    scale = 1 / math.sqrt(2 * n_layers) if getattr(module, "is_residual_projection", False) else 1
    nn.init.normal_(module.weight, std=std * scale)
    if module.bias is not None:
        nn.init.zeros_(module.bias)


class MLP(nn.Module):
    """SwiGLU, down(silu(gate(x)) ⊙ up(x)) (Shazeer, 2020), or GELU, down(gelu(up(x))), exact or tanh-approximated."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.gated = cfg.mlp == "swiglu"
        self.gelu_approximate = "tanh" if cfg.mlp == "gelu_tanh" else "none"
        if self.gated:
            self.gate_proj = nn.Linear(cfg.dim, cfg.mlp_hidden_dim, bias=cfg.bias)
        self.up_proj = nn.Linear(cfg.dim, cfg.mlp_hidden_dim, bias=cfg.bias)
        self.down_proj = residual_linear(cfg.mlp_hidden_dim, cfg.dim, bias=cfg.bias)

    def forward(self, x: Tensor) -> Tensor:
        if self.gated:
            hidden = F.silu(self.gate_proj(x)) * self.up_proj(x)
        else:
            hidden = F.gelu(self.up_proj(x), approximate=self.gelu_approximate)
        return self.down_proj(hidden)


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int):
        super().__init__()
        self.input_layernorm = make_norm(cfg)
        self.self_attn = ATTENTION.get(cfg.attention)(cfg, layer_idx)
        self.post_attention_layernorm = make_norm(cfg)
        self.mlp = MLP(cfg)
        self.dropout = nn.Dropout(cfg.dropout)
        self.parallel_residual = cfg.parallel_residual

    def forward(self, x: Tensor, ctx: AttentionContext, cache: LayerCache | None) -> Tensor:
        attention_out = self.dropout(self.self_attn(self.input_layernorm(x), ctx, cache))
        if self.parallel_residual:
            return x + attention_out + self.dropout(self.mlp(self.post_attention_layernorm(x)))
        x = x + attention_out
        return x + self.dropout(self.mlp(self.post_attention_layernorm(x)))


class Transformer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        shapes_only = torch.get_default_device().type == "meta"
        if not shapes_only:  # refused by name, not by the allocator midway
            self.check_fits(cfg, torch.get_default_device())
        self.config = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.embed_norm = make_norm(cfg) if cfg.embedding_norm else None
        self.embed_scale = math.sqrt(cfg.dim) if cfg.scale_embeddings else 1.0
        self.position = POSITIONS.get(cfg.position)(cfg, ATTENTION.get(cfg.attention).qk_head_dim(cfg))
        self.dropout = nn.Dropout(cfg.dropout)
        self.layers = nn.ModuleList(Block(cfg, i) for i in range(cfg.n_layers))
        self.norm = make_norm(cfg)
        self.lm_head = nn.Linear(cfg.dim, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        self._decoder: CompiledDecoder | None = None  # generate(compile=True)'s, kept between calls
        if not shapes_only:  # nothing to initialise on the meta device (where torch's init imports torch._dynamo)
            self.reset_parameters()

    def __getstate__(self) -> dict[str, Any]:
        """The module's state without the compiled decoder: its step is a function made at run time, which pickle
        cannot name, and a copy (``copy.deepcopy``) would carry a second cache. A copy compiles its own."""
        return {**super().__getstate__(), "_decoder": None}

    def reset_parameters(self) -> None:
        """GPT-2 init: N(0, init_std), residual projections scaled by 1/√(2·n_layers), token embeddings N(0, 1/dim)
        where they are scaled by √dim (``scale_embeddings``); then each mechanism initialises its own parameters."""
        std = self.config.init_std
        for module in self.modules():
            if isinstance(module, nn.Linear):
                init_linear(module, std, self.config.n_layers)
            elif isinstance(module, nn.Embedding):
                nn.init.normal_(module.weight, std=std)
        if self.config.scale_embeddings:  # after the loop: a tied output projection shares the weight, as in fairseq
            nn.init.normal_(self.embed_tokens.weight, std=1 / self.embed_scale)
        for block in self.layers:
            block.self_attn.reset_mechanism_parameters()

    @classmethod
    def check_fits(cls, cfg: ModelConfig, device: torch.device | str = "cpu") -> None:
        """Refuse, before allocating anything, a model whose weights and buffers ``device`` cannot hold (e.g.
        learned positions for max_seq_len = 10**11): laid out on the meta device first, which costs no memory."""
        with torch.device("meta"):
            model = cls(cfg)
        tensors = {id(t): t for t in [*model.parameters(), *model.buffers()]}.values()
        nbytes = sum(t.numel() * t.element_size() for t in tensors)
        sizes = {"dim": cfg.dim, "n_layers": cfg.n_layers, "mlp_hidden_dim": cfg.mlp_hidden_dim,
                 "vocab_size": cfg.vocab_size, "max_seq_len": cfg.max_seq_len}  # fmt: skip
        check_memory(nbytes, f"the model ({model.num_parameters():,} parameters, buffers included)", device, sizes)

    def num_parameters(self, exclude_embeddings: bool = False) -> int:
        n = sum(p.numel() for p in self.parameters())
        if exclude_embeddings:
            n -= self.embed_tokens.weight.numel()
        return n

    def cache_bytes(self, batch_size: int, max_len: int) -> int:
        """The size of :meth:`new_cache`'s buffers, from the same cache laid out on the meta device (no memory)."""
        dtype = self.embed_tokens.weight.dtype
        meta = torch.device("meta")
        layers = [
            block.self_attn.new_layer_cache(batch_size, max_len, device=meta, dtype=dtype) for block in self.layers
        ]
        return sum(t.numel() * t.element_size() for t in _tensors(layers))

    def new_cache(
        self, batch_size: int, max_len: int, *, dtype: torch.dtype | None = None, static: bool = False
    ) -> KVCache:
        """A preallocated cache for ``batch_size`` sequences of up to ``max_len`` positions. ``static``: its
        one-token steps attend over the whole buffers, every step the same shapes (``attnzoo.cache``), which
        :meth:`decode_step` and ``torch.compile`` need; otherwise they read views that grow with the cache."""
        if batch_size < 1 or max_len < 1:
            raise ValueError(f"batch_size={batch_size} and max_len={max_len} must both be >= 1")
        self._require_causal("a KV cache")
        self.position.check_length(max_len)
        weight = self.embed_tokens.weight
        dtype = dtype or weight.dtype
        layers = [
            block.self_attn.new_layer_cache(batch_size, max_len, device=weight.device, dtype=dtype)
            for block in self.layers
        ]
        return KVCache(layers, batch_size, max_len, static=static)

    def _context(
        self,
        batch: int,
        seq_len: int,
        cache: KVCache | None,
        maps: list | None,
        logits: dict | None = None,
        kernels: dict | None = None,
    ) -> AttentionContext:
        if cache is not None:
            cache.check_fits(batch, seq_len)
        start = cache.length if cache is not None else 0
        end = start + seq_len
        self.position.check_length(end)
        positions = torch.arange(start, end, device=self.embed_tokens.weight.device)
        if cache is not None and cache.static and seq_len == 1:
            return self._static_context(positions, maps, logits, kernels)
        dtype = compute_dtype(self.embed_tokens.weight.dtype)
        return AttentionContext(
            positions=positions,
            start=start,
            position=self.position,
            position_state=self.position.prepare(positions, end, dtype=dtype),
            causal=self.config.causal,
            attention_maps=maps,
            attention_logits=logits,
            kernels=kernels,
            dtype=dtype,
        )

    def _static_context(
        self, position: Tensor, maps: list | None = None, logits: dict | None = None, kernels: dict | None = None
    ) -> AttentionContext:
        """The context of a static one-token step at ``position`` (1,): built from the tensor alone, with no Python
        int that changes from step to step, so a compiled step is captured once."""
        dtype = compute_dtype(self.embed_tokens.weight.dtype)
        return AttentionContext(
            positions=position,
            start=None,
            position=self.position,
            position_state=self.position.prepare(position, position + 1, dtype=dtype),
            causal=self.config.causal,
            attention_maps=maps,
            attention_logits=logits,
            kernels=kernels,
            dtype=dtype,
            static=True,
        )

    def _hidden(
        self,
        idx: Tensor,
        cache: KVCache | None,
        maps: list | None = None,
        logits: dict | None = None,
        kernels: dict | None = None,
    ) -> Tensor:
        if idx.dim() != 2:
            raise ValueError(f"idx must have shape (batch, seq_len); got {tuple(idx.shape)}")
        if idx.dtype.is_floating_point or idx.dtype.is_complex or idx.dtype == torch.bool:
            raise ValueError(f"idx must hold integer token ids; got dtype {idx.dtype}")
        batch, seq_len = idx.shape
        if batch == 0:
            raise ValueError("idx holds no sequences (batch=0)")
        if seq_len == 0:
            raise ValueError("idx has no tokens (seq_len=0)")
        if not torch.compiler.is_compiling():
            low, high = torch.stack(torch.aminmax(idx)).tolist()  # one reduction, one host sync
            if low < 0 or high >= self.config.vocab_size:
                bad = low if low < 0 else high
                raise ValueError(f"token id {bad} is outside the vocabulary [0, {self.config.vocab_size})")
        ctx = self._context(batch, seq_len, cache, maps, logits, kernels)
        hidden = self._blocks(self.embed_tokens(idx), ctx, cache)
        if cache is not None:
            cache.length += seq_len
        return hidden

    def encode(self, embeddings: Tensor) -> Tensor:
        """Final hidden states (B, T, dim) of input vectors that take the token embeddings' place (HF's
        ``inputs_embeds``), for tasks whose inputs are not tokens. They are scaled (``scale_embeddings``) and given
        positions as tokens are."""
        if embeddings.dim() != 3 or embeddings.shape[-1] != self.config.dim or 0 in embeddings.shape[:2]:
            raise ValueError(
                f"embeddings must have shape (batch >= 1, seq_len >= 1, dim={self.config.dim}); "
                f"got {tuple(embeddings.shape)}"
            )
        batch, seq_len, _ = embeddings.shape
        return self._blocks(embeddings, self._context(batch, seq_len, None, None), None)

    def _blocks(self, x: Tensor, ctx: AttentionContext, cache: KVCache | None) -> Tensor:
        """Token (or input) embeddings ``x`` through positions, every block and the final norm: the part of a
        forward that runs on the device alone."""
        if self.config.scale_embeddings:
            x = x * self.embed_scale
        position_embedding = self.position.embed(ctx.positions)
        if position_embedding is not None:
            x = x + position_embedding.to(x.dtype)
        if self.embed_norm is not None:
            x = self.embed_norm(x)
        x = self.dropout(x)
        for i, block in enumerate(self.layers):
            x = block(x, ctx, cache.layers[i] if cache is not None else None)
        return self.norm(x)

    def decode_step(self, token: Tensor, position: Tensor, cache: KVCache) -> Tensor:
        """Logits (B, vocab) of one token per sequence, ``token`` (B, 1) at ``position`` (1,) (int64, on the
        model's device), stored into a static ``cache`` (``new_cache(..., static=True)``): the step that
        ``generate(compile=True)`` compiles.

        Every call has the same shapes and the position is a tensor, so nothing here syncs with the host or
        branches on a value: the caller checks that the position fits and keeps ``cache.length`` (``generate``
        does), which ``model(token, cache=cache)`` does for itself on the same path.
        """
        return self.lm_head(self._blocks(self.embed_tokens(token), self._static_context(position), cache))[:, -1]

    def forward(
        self, idx: Tensor, targets: Tensor | None = None, *, cache: KVCache | None = None
    ) -> Tensor | tuple[Tensor, Tensor]:
        """Logits (B, T, vocab); with ``targets`` (B, T), also the mean cross-entropy (-100 is ignored).

        With a ``cache``, ``idx`` continues the cached sequence and is appended to it.
        """
        if targets is not None and targets.shape != idx.shape:
            raise ValueError(f"targets must have the shape of idx {tuple(idx.shape)}; got {tuple(targets.shape)}")
        logits = self.lm_head(self._hidden(idx, cache))
        if targets is None:
            return logits
        if targets.dtype.is_floating_point or targets.dtype.is_complex or targets.dtype == torch.bool:
            raise ValueError(f"targets must hold integer token ids; got dtype {targets.dtype}")
        if not torch.compiler.is_compiling():
            outside = (targets != -100) & ((targets < 0) | (targets >= self.config.vocab_size))
            if bool(outside.any()):
                bad = targets[outside][0].item()
                raise ValueError(
                    f"target {bad} is outside the vocabulary [0, {self.config.vocab_size}) and is not the ignored -100"
                )
        upcast = logits.to(compute_dtype(logits.dtype))  # fp32, or float64 in a float64 model
        loss = F.cross_entropy(upcast.flatten(0, 1), targets.flatten(), ignore_index=-100)
        return logits, loss

    @torch.no_grad()
    def attention_maps(self, idx: Tensor, *, logits: dict[int, list[Tensor]] | None = None) -> list[Tensor]:
        """Each layer's effective attention map, (B, heads, T, T) in fp32, from the eager path.

        With ``logits`` a dict, also files under each layer's index the fp32 logits (B, H, T, T) that enter the
        softmax in each of its kernel calls, 0 where masked (``AttentionContext.record_logits``).
        """
        maps: list[Tensor] = []
        self._hidden(idx, cache=None, maps=maps, logits=logits)
        return maps

    @torch.no_grad()
    def attention_kernels(self, idx: Tensor, *, cache: KVCache | None = None) -> list[str]:
        """The name of the kernel each layer's attention runs over ``idx`` (continuing ``cache``, which it extends,
        where given), in the model's current mode: a forward pass whose output is dropped, which the tests hold
        :meth:`planned_kernels` to."""
        kernels: dict[int, str] = {}
        self._hidden(idx, cache, kernels=kernels)
        return [kernels[layer] for layer in range(len(self.layers))]

    def planned_kernels(
        self,
        *,
        device_type: str = "cpu",
        dtype: torch.dtype = torch.float32,
        length: int = 2,
        compiling: bool = False,
        build: bool = False,
    ) -> list[Kernel]:
        """The kernel :func:`~attnzoo.attention.kernels.choose` picks for each layer's attention on a fresh training
        sequence (:meth:`Call.planned <attnzoo.attention.kernels.Call.planned>`, whose arguments these are), without
        running the model: what a run records in ``run.json`` and ``attnzoo info`` names."""
        call = Call.planned(
            self.config,
            self.position,
            device_type=device_type,
            dtype=dtype,
            length=length,
            compiling=compiling,
            build=build,
        )
        return [choose(block.self_attn, call) for block in self.layers]

    @torch.no_grad()
    def generate(
        self,
        idx: Tensor,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_k: int | None = None,
        top_p: float | None = None,
        eos_token_id: int | None = None,
        generator: torch.Generator | None = None,
        use_cache: bool = True,
        compile: bool = False,
    ) -> Tensor:
        """Extend ``idx`` (B, T) by up to ``max_new_tokens``; greedy when ``temperature`` is 0.

        Sequences that emit ``eos_token_id`` are padded with it until all have finished. ``use_cache=False``
        recomputes the whole prefix each step: the reference the cached path must reproduce. ``compile=True``
        prefills eagerly and decodes every later token with one compiled static-shape step (``attnzoo.decoding``;
        CUDA graphs on CUDA), kept on the model with its cache so that later calls of the same batch size and at
        most the same length reuse it without recompiling.
        """
        check_sampling_args(temperature, top_k, top_p)
        self._require_causal("generate")
        require(is_int(max_new_tokens) and max_new_tokens >= 0, "max_new_tokens", max_new_tokens, "must be an int >= 0")
        require(isinstance(compile, bool), "compile", compile, "must be true or false")
        require(use_cache or not compile, "compile", compile, "needs use_cache=True: the compiled step is cached")
        vocab = self.config.vocab_size
        require(
            eos_token_id is None or (is_int(eos_token_id) and 0 <= eos_token_id < vocab),
            "eos_token_id",
            eos_token_id,
            f"must be None or a token id in [0, {vocab})",
        )
        if idx.dim() != 2:
            raise ValueError(f"idx must have shape (batch, seq_len); got {tuple(idx.shape)}")
        batch, prompt_len = idx.shape
        if batch == 0:
            raise ValueError("idx holds no sequences (batch=0)")
        # The last sampled token is returned, never fed back: the cache needs one position less than the output.
        cache_len = prompt_len + max_new_tokens - 1
        cache, decoder = None, None
        if use_cache and max_new_tokens:
            self.position.check_length(cache_len)
            if compile:
                decoder = self._compiled_decoder(batch, cache_len, {"max_new_tokens": max_new_tokens, "batch": batch})
                cache = decoder.cache
                cache.reset()
            else:
                check_memory(
                    self.cache_bytes(batch, cache_len),
                    "the KV cache",
                    idx.device,
                    {"max_new_tokens": max_new_tokens, "batch": batch},
                )
                cache = self.new_cache(batch, cache_len)
        finished = torch.zeros(batch, dtype=torch.bool, device=idx.device)
        step_input = idx
        for step in range(max_new_tokens):
            if not use_cache:
                logits = self(idx)[:, -1]
            elif decoder is not None and step > 0:
                logits = decoder.step(self, step_input)
            else:
                logits = self(step_input, cache=cache)[:, -1]
            next_token = sample_next_token(
                logits, temperature=temperature, top_k=top_k, top_p=top_p, generator=generator
            )
            if eos_token_id is not None:
                next_token = next_token.masked_fill(finished, eos_token_id)
                finished |= next_token == eos_token_id
            idx = torch.cat((idx, next_token[:, None]), dim=1)
            step_input = next_token[:, None]
            if eos_token_id is not None and bool(finished.all()):
                break
        return idx

    def _compiled_decoder(self, batch_size: int, length: int, settings: dict[str, int]) -> CompiledDecoder:
        """The model's compiled decoder if it serves ``batch_size`` sequences of ``length`` positions, else a new one
        (whose first step compiles), kept for the next call."""
        if self._decoder is None or not self._decoder.fits(self, batch_size, length):
            self._decoder = None  # the old cache is freed before the new one is allocated
            capacity = cache_capacity(length, self.config.max_seq_len)
            check_memory(
                self.cache_bytes(batch_size, capacity),
                "the KV cache",
                self.embed_tokens.weight.device,
                settings,
            )
            self._decoder = CompiledDecoder(self, batch_size, capacity)
        return self._decoder

    def _require_causal(self, what: str) -> None:
        if not self.config.causal:
            raise ValueError(
                f"{what} needs a causal model, and this one has causal=False: its queries attend to later tokens, "
                "so the output at a position changes when a token is appended, and neither cached keys nor "
                "left-to-right sampling stay valid. Use it as an encoder: model(idx) over whole sequences"
            )

    def save_pretrained(self, directory: str | os.PathLike) -> None:
        """Write ``config.json`` and ``model.safetensors`` (tied weights stored once); each atomically."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        self.config.to_json(directory / CONFIG_NAME)
        atomic_write(directory / WEIGHTS_NAME, lambda tmp: save_model(self, str(tmp)))

    @classmethod
    def from_pretrained(cls, directory: str | os.PathLike, *, device: str | torch.device = "cpu") -> Transformer:
        """The model saved in ``directory`` (``save_pretrained``), in float32.

        Refused with ``ValueError``: a ``config.json`` that is not a JSON object or lacks a field that shapes
        the model (:meth:`ModelConfig.from_saved`), weights that are not floats or not finite
        (:mod:`attnzoo.weights`). Weights stored in another float dtype load with a warning.
        """
        directory = Path(directory)
        config_path, weights_path = directory / CONFIG_NAME, directory / WEIGHTS_NAME
        for path in (config_path, weights_path):
            if not path.is_file():
                raise FileNotFoundError(
                    f"{path} not found; a saved model directory holds {CONFIG_NAME} and {WEIGHTS_NAME}"
                )
        try:
            data = json.loads(config_path.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as err:
            raise ValueError(f"{config_path} is not a JSON model config: {err}") from None
        config = ModelConfig.from_saved(data, config_path)
        cls.check_fits(config, device)
        model = cls(config)
        check_dtypes(stored_dtypes(weights_path), weights_path, next(model.parameters()).dtype)
        try:
            missing, unexpected = load_model(model, str(weights_path), strict=False, device=str(device))
        except Exception as err:  # safetensors raises its own error types for corrupt files
            raise ValueError(f"cannot read weights from {weights_path}: {err}") from None
        if missing or unexpected:
            raise ValueError(
                f"{weights_path} does not match {config_path}: missing {sorted(missing)[:8]}, "
                f"unexpected {sorted(unexpected)[:8]}"
            )
        check_finite(model.state_dict().items(), weights_path)
        return model.to(device)
