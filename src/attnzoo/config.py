"""Model configuration: one typed, validated dataclass with a JSON round trip."""

from __future__ import annotations

import dataclasses
import json
import os
import warnings
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from attnzoo.records import check_keys
from attnzoo.validation import is_int, is_number, require, require_count

if TYPE_CHECKING:
    from attnzoo.attention.kernels import Kernel

MLP_KINDS = ("swiglu", "gelu", "gelu_tanh")
# Fields that do not change what a trained model computes (training-time dropout, the initialisation, the choice
# among kernels that agree within tolerance): a saved config may leave them out (ModelConfig.from_saved).
NOT_ARCHITECTURE = ("dropout", "init_std", "attn_backend")
DERIVED = ("n_kv_heads", "head_dim", "mlp_hidden_dim")  # None: resolved from the other fields
NORM_KINDS = ("rmsnorm", "layernorm")
SDPA_REFUSED_FROM = "attnzoo 0.2"  # for a mechanism that acts on the scores; until then it warns


def attn_backends() -> list[str]:
    """The values ``attn_backend`` takes: "auto", or a registered kernel's name ("eager", "sdpa", ...)."""
    from attnzoo.attention.kernels import backend_names

    return ["auto", *backend_names()]


def function_neutral(position: Any) -> tuple[str, ...]:
    """:data:`NOT_ARCHITECTURE` for a model with the positional scheme ``position``: sinusoidal positions scale
    their table by ``init_std`` (``positions/absolute.py``), so there it is architecture."""
    return tuple(name for name in NOT_ARCHITECTURE if not (name == "init_std" and position == "sinusoidal"))


def parse_key_value(text: str) -> tuple[str, Any]:
    """``KEY=VALUE`` → (key, value): the value as JSON (true, 3, 0.5, "x"), else the bare word as a string."""
    key, sep, value = text.strip().partition("=")
    require(bool(sep and key), "option", text, "must be KEY=VALUE")
    try:
        return key.strip(), json.loads(value)
    except json.JSONDecodeError:
        return key.strip(), value.strip()  # a bare word is a string: variant=v2 as well as variant="v2"


@dataclass(frozen=True)
class ModelConfig:
    """Architecture of a decoder-only Transformer.

    Derived fields (``n_kv_heads``, ``head_dim``, ``mlp_hidden_dim``) may be left as ``None`` and are
    resolved on construction; the options dicts are completed with their defaults, so ``to_json`` writes
    the full architecture. Every bad field raises ``ValueError`` naming the field, the value and what is
    allowed. ``dataclasses.replace`` derives a re-validated copy but keeps the resolved derived fields: set
    them back to ``None`` to re-derive them, e.g. ``replace(cfg, dim=512, head_dim=None, mlp_hidden_dim=None)``.

    ``attn_backend`` picks the attention kernels (``attention/kernels/``, where ``attend`` makes the choice):

    * ``"auto"`` (default): each call runs the first of the mechanism's kernels (``Attention.kernels``, in order
      of preference) that serves it: on the CPU Diff's and DCMHA's fused C++ kernels where built, on CUDA DCMHA's
      Triton kernel; SDPA where it computes the mechanism exactly (mha, selective with τ_q folded into the
      queries, diff, diff_v2), and the chunked eager kernel for a mechanism whose score hooks SDPA cannot run
      (dcmha); a positional scheme's kernels just before the kernel each specialises (ALiBi's fused C++ kernel
      before SDPA);
    * ``"eager"``: the reference everywhere, explicit fp32 scores and softmax;
    * a kernel's name (``"sdpa"``, ``"chunked"``, ``"diff-flash"``, ``"alibi-flash"``, ...): that kernel alone
      wherever it serves the call (``"sdpa"`` with ALiBi is SDPA with the bias as a mask, without ALiBi's kernel),
      the eager reference elsewhere; a kernel that can never serve the model is refused here, with the reason.

    Recording attention maps (``model.attention_maps``) always takes the eager reference, the one kernel that
    returns the probabilities.
    """

    vocab_size: int = 256
    dim: int = 256
    n_layers: int = 4
    n_heads: int = 8
    n_kv_heads: int | None = None  # None → n_heads (MHA); 1 → MQA; in between → GQA
    head_dim: int | None = None  # None → dim // n_heads
    mlp: str = "swiglu"
    mlp_hidden_dim: int | None = None  # None → 4·dim for gelu, 8/3·dim rounded up to 32 for swiglu
    norm: str = "rmsnorm"
    norm_eps: float = 1e-5
    dropout: float = 0.0
    bias: bool = False
    tie_embeddings: bool = True
    parallel_residual: bool = False  # GPT-J / GPT-NeoX: x + attn(norm1(x)) + mlp(norm2(x))
    embedding_norm: bool = False  # BLOOM: a norm right after the token embedding
    # Vaswani et al. §3.4, fairseq's transformer_lm (the ALiBi paper's code): token embeddings drawn N(0, 1/dim) and
    # multiplied by √dim, so the residual stream starts at unit scale, and a sinusoidal table at unit amplitude.
    scale_embeddings: bool = False
    max_seq_len: int = 1024
    attention: str = "mha"
    attention_options: dict[str, Any] = field(default_factory=dict)
    position: str = "rope"
    position_options: dict[str, Any] = field(default_factory=dict)
    attn_backend: str = "auto"
    init_std: float = 0.02
    # False: every query sees every key (an encoder, DCFormer's DCViT); a local window becomes symmetric. Such a
    # model has no cache and does not generate.
    causal: bool = True

    def __post_init__(self) -> None:
        # The config sits above the mechanisms it names (pyproject's import contract), which see it only as a type.
        # Imported here rather than at the top so that reading the config's defaults (the command line's --help)
        # does not load torch.
        from attnzoo.attention import ATTENTION
        from attnzoo.attention.kernels import backend_refusal
        from attnzoo.positions import POSITIONS

        for name in ("vocab_size", "dim", "n_layers", "n_heads"):
            require_count(name, getattr(self, name))
        # Bounded at the end, after the positional scheme has said what it serves (rope: up to 2**24).
        require(is_int(self.max_seq_len) and self.max_seq_len >= 1, "max_seq_len", self.max_seq_len,
                "must be an integer >= 1")  # fmt: skip

        if self.n_kv_heads is None:
            self._set("n_kv_heads", self.n_heads)
        require(
            is_int(self.n_kv_heads) and 1 <= self.n_kv_heads <= self.n_heads,
            "n_kv_heads",
            self.n_kv_heads,
            f"must be an integer in [1, n_heads={self.n_heads}]",
        )
        require(
            self.n_heads % self.n_kv_heads == 0,
            "n_kv_heads",
            self.n_kv_heads,
            f"must divide n_heads={self.n_heads} (query heads share kv heads)",
        )
        if self.head_dim is None:
            require(
                self.dim % self.n_heads == 0,
                "n_heads",
                self.n_heads,
                f"must divide dim={self.dim} when head_dim is not given",
            )
            self._set("head_dim", self.dim // self.n_heads)
        require_count("head_dim", self.head_dim)

        require(self.mlp in MLP_KINDS, "mlp", self.mlp, f"choose one of {list(MLP_KINDS)}")
        if self.mlp_hidden_dim is None:
            hidden = -(-8 * self.dim // 3 // 32) * 32 if self.mlp == "swiglu" else 4 * self.dim
            self._set("mlp_hidden_dim", hidden)
        require_count("mlp_hidden_dim", self.mlp_hidden_dim)
        require(self.norm in NORM_KINDS, "norm", self.norm, f"choose one of {list(NORM_KINDS)}")
        require(
            is_number(self.norm_eps) and self.norm_eps > 0, "norm_eps", self.norm_eps, "must be a finite number > 0"
        )
        require(is_number(self.dropout) and 0 <= self.dropout < 1, "dropout", self.dropout, "must be in [0, 1)")
        require(
            is_number(self.init_std) and self.init_std > 0, "init_std", self.init_std, "must be a finite number > 0"
        )
        for name in ("bias", "tie_embeddings", "parallel_residual", "embedding_norm", "scale_embeddings", "causal"):
            require(isinstance(getattr(self, name), bool), name, getattr(self, name), "must be true or false")
        require(
            self.attn_backend in attn_backends(),
            "attn_backend",
            self.attn_backend,
            f"choose one of {attn_backends()}",
        )

        for registry, name, options_field in (
            (ATTENTION, self.attention, "attention_options"),
            (POSITIONS, self.position, "position_options"),
        ):
            options = getattr(self, options_field)
            require(isinstance(options, dict), options_field, options, "must be a dict of options")
            typed = registry.parse_options(name, options)
            self._set(options_field, dataclasses.asdict(typed))

        attention_cls = ATTENTION.get(self.attention)
        if self.attn_backend == "sdpa" and attention_cls.needs_scores:
            # Refused outright by 0.1.0's development, which broke saved configs silently: deprecated instead.
            warnings.warn(
                f"attn_backend='sdpa' with {self.attention}, which acts on the attention scores that SDPA cannot "
                f"compute, runs as 'auto' (its chunked eager kernel); this is deprecated and will be refused from "
                f"{SDPA_REFUSED_FROM}: set attn_backend='auto' or 'eager'",
                FutureWarning,
                stacklevel=3,  # the caller's ModelConfig(...)
            )
            self._set("attn_backend", "auto")
        attention_cls.validate_config(self)
        POSITIONS.get(self.position).validate_config(self, attention_cls.qk_head_dim(self))
        require_count("max_seq_len", self.max_seq_len)
        refusal = backend_refusal(self, POSITIONS.get(self.position).kernels)
        require(refusal is None, "attn_backend", self.attn_backend, refusal or "")

    def _set(self, name: str, value: Any) -> None:
        object.__setattr__(self, name, value)

    @property
    def attention_opts(self) -> Any:
        """The typed ``Options`` dataclass of the attention mechanism."""
        from attnzoo.attention import ATTENTION

        return ATTENTION.parse_options(self.attention, self.attention_options)

    @property
    def kernel_chain(self) -> tuple[Kernel, ...]:
        """The kernels each attention layer may run, in order (``attention.kernels.kernel_chain``)."""
        from attnzoo.attention.kernels import kernel_chain
        from attnzoo.positions import POSITIONS

        return kernel_chain(self, POSITIONS.get(self.position).kernels)

    @property
    def position_opts(self) -> Any:
        """The typed ``Options`` dataclass of the positional scheme."""
        from attnzoo.positions import POSITIONS

        return POSITIONS.parse_options(self.position, self.position_options)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelConfig:
        if not isinstance(data, dict):
            raise ValueError(f"ModelConfig.from_dict({data!r:.80}) is invalid: needs a dict of field: value")
        check_keys(cls, data, "ModelConfig field(s)")
        return cls(**data)

    @classmethod
    def from_saved(cls, data: Any, source: str | os.PathLike) -> ModelConfig:
        """The config of a saved model (``source``, its ``config.json``), which must record every field that shapes
        what the model computes.

        A missing field is an error naming it and the default it would get, never filled in: a default is
        today's choice and may not be what the model was trained with (a model saved with another ``norm_eps`` or
        ``rope_theta`` would load with the same weights and other logits). attnzoo writes every field, options
        included, so only a hand-written or foreign file lacks one; adding the key is the fix. The fields in
        :data:`NOT_ARCHITECTURE` do not change a trained model's outputs and take their defaults
        (:func:`function_neutral`: ``init_std`` does for sinusoidal positions).
        """
        if not isinstance(data, dict):
            raise ValueError(f"{source} must hold a JSON object of ModelConfig fields, not {type(data).__name__}")
        defaults = {
            f.name: f.default_factory() if f.default is dataclasses.MISSING else f.default  # type: ignore[misc]
            for f in dataclasses.fields(cls)
        }
        neutral = function_neutral(data.get("position", defaults["position"]))
        missing = {name: defaults[name] for name in defaults if name not in data and name not in neutral}
        if not missing:  # the options are checked once the config has resolved their defaults
            config = cls.from_dict(data)
            for options in ("attention_options", "position_options"):
                resolved = getattr(config, options)
                missing |= {f"{options}.{key}": resolved[key] for key in resolved if key not in data[options]}
        if missing:
            listed = ", ".join(
                f"{name} (default {'derived' if name in DERIVED else repr(value)})" for name, value in missing.items()
            )
            raise ValueError(
                f"{source} does not record {listed}: a saved model's config must record its whole architecture, "
                "since a default may not be what it was trained with; add the key(s) with the model's values"
            )
        return config

    def to_json(self, path: str | os.PathLike | None = None) -> str:
        text = json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n"
        if path is not None:
            from attnzoo.io import atomic_write_text

            atomic_write_text(path, text)
        return text

    @classmethod
    def from_json(cls, path_or_text: str | os.PathLike) -> ModelConfig:
        text = str(path_or_text)
        if text.lstrip()[:1] not in ("{", "["):  # a file name; JSON text is an object (or a mistaken array)
            try:
                with open(path_or_text, encoding="utf-8") as f:
                    text = f.read()
            except UnicodeDecodeError as err:
                raise ValueError(f"model config {path_or_text} is not UTF-8 text ({err})") from None
        try:
            data = json.loads(text)
        except json.JSONDecodeError as err:
            raise ValueError(f"model config is not valid JSON ({err}): {str(path_or_text)[:200]}") from None
        if not isinstance(data, dict):
            raise ValueError(f"model config JSON must be an object, got {type(data).__name__}")
        return cls.from_dict(data)
