"""Variant specs ("diff+alibi+kv2") and parameter-matched configs for side-by-side comparisons.

A variant is an attention mechanism × positional scheme × kv-head count applied to a baseline config. Each
mechanism pairs itself with the baseline as its paper does (``Attention.paired_overrides``: Diff halves
the head count and doubles the head size), then the MLP width is adjusted so that every variant's total
parameter count matches the baseline's within a tolerance, unless the variant says ``+unmatched`` (the mechanism's
own parameters added on top of the baseline's MLP, as e.g. DCFormer pairs DCMHA with MHA).
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch

from attnzoo.attention import ATTENTION
from attnzoo.config import ModelConfig, parse_key_value
from attnzoo.positions import POSITIONS

SPEC_FORMAT = (
    "ATTENTION[KEY=VALUE,...]+POSITION+unmatched+kvN+upF+lenN+xC+lrF, the options, position, unmatched, kv, "
    "uptraining, length, compute and learning-rate parts optional, e.g. 'mha+rope', 'diff+alibi', 'mha+rope+kv2', "
    "'selective[value_temperature=false]+none', 'mha+rope+x1.5', 'mha+rope+kv2+up0.05', 'mha+sinusoidal+len2', "
    "'dcmha+rope+unmatched', 'diff+rope+lr2'"
)
_SPEC = re.compile(r"(?P<attention>[^+\[\]]+)(?:\[(?P<options>[^\]]*)\])?(?P<rest>(?:\+[^+\[\]]+)*)")


@dataclass(frozen=True)
class Variant:
    """An attention mechanism with its options × a positional scheme × a kv-head count, trained with ``compute``
    times the comparison's training tokens (``+x1.5``: the same model, 1.5× the steps), so that a mechanism can
    be set against the baseline at several budgets (DCFormer's compute-equivalence claim), on sequences ``length``
    times the comparison's (``+len2``: half as many sequences a step, so the same tokens; ALiBi's "trained at L
    matches sinusoidal trained at 2L"), at ``lr`` times the comparison's peak learning rate (``+lr2``: each variant
    at its own best rate, the papers' reading of a comparison). ``matched``: the MLP width closes the parameter gap
    to the baseline; ``+unmatched`` leaves the baseline's width, the mechanism's own parameters added on top."""

    attention: str
    position: str = "rope"
    n_kv_heads: int | None = None  # None keeps the baseline's
    options: tuple[tuple[str, Any], ...] = ()  # attention options, sorted by name; the rest keep their defaults
    compute: float = 1.0
    # GQA uptraining (Ainslie et al., 2023, ``+upF``): converted from the same seed's trained model without the kv
    # part (its kv heads mean-pooled), then trained for F × the steps; None: trained from scratch.
    uptrain: float | None = None
    length: int = 1
    lr: float = 1.0  # the multiple of the comparison's peak (and floor) learning rate it trains at
    matched: bool = True

    @property
    def model_label(self) -> str:
        """The label of the model alone, whatever its training budget."""
        options = ",".join(f"{key}={_spelled(value)}" for key, value in self.options)
        kv = f"+kv{self.n_kv_heads}" if self.n_kv_heads is not None else ""
        up = f"+up{self.uptrain:g}" if self.uptrain is not None else ""
        unmatched = "" if self.matched else "+unmatched"
        return f"{self.attention}{f'[{options}]' if options else ''}+{self.position}{unmatched}{kv}{up}"

    @property
    def label(self) -> str:
        length = f"+len{self.length}" if self.length != 1 else ""
        compute = f"+x{self.compute:g}" if self.compute != 1 else ""
        return self.model_label + length + compute + (f"+lr{self.lr:g}" if self.lr != 1 else "")

    @property
    def training_parts(self) -> tuple[str, ...]:
        """The label's parts that say how a comparison trains the model rather than what it is: +lenN, +upF, +xC,
        +lrF."""
        length = (f"+len{self.length}",) if self.length != 1 else ()
        up = (f"+up{self.uptrain:g}",) if self.uptrain is not None else ()
        compute = (f"+x{self.compute:g}",) if self.compute != 1 else ()
        lr = (f"+lr{self.lr:g}",) if self.lr != 1 else ()
        return (*length, *up, *compute, *lr)

    def require_model_only(self, why: str) -> None:
        """Refuse a label with :attr:`training_parts` where nothing reads them: ``why`` says what the caller does
        instead (the bench times the model as it is; a task trains it on the task's own budget)."""
        parts = self.training_parts
        if parts:
            says, them = ("says", "it") if len(parts) == 1 else ("say", "them")
            raise ValueError(
                f"variant {self.label!r}: {' '.join(parts)} {says} how a comparison trains the model, and {why}: "
                f"drop {them}"
            )

    @property
    def source(self) -> Variant:
        """The model an uptrained variant is converted from: itself with the baseline's kv heads."""
        return dataclasses.replace(self, n_kv_heads=None, uptrain=None)

    def steps(self, steps: int) -> int:
        """This variant's share of a run of ``steps`` steps."""
        return max(1, round(steps * (self.uptrain if self.uptrain is not None else self.compute)))

    @classmethod
    def parse(cls, spec: str) -> Variant:
        match = _SPEC.fullmatch(spec.strip())
        if match is None:
            raise ValueError(f"variant {spec!r} is invalid: expected {SPEC_FORMAT}")
        attention = match["attention"].strip()
        rest = [p.strip() for p in match["rest"].split("+")[1:]]
        lr = _multiple(spec, rest, "lr", "learning-rate multiple", "lrF with 0 < F <= 100", 100.0)
        compute = _multiple(spec, rest, "x", "compute multiple", "xC with 0 < C <= 100", 100.0)
        length = 1
        if rest and re.fullmatch(r"len[0-9]*", rest[-1]):
            digits = rest.pop()[3:]
            if not digits.isdigit() or not 2 <= int(digits) <= 64:
                raise ValueError(
                    f"variant {spec!r} has a bad length multiple {digits!r}: expected lenN with 2 <= N <= 64"
                )
            length = int(digits)
        uptrain = _multiple(spec, rest, "up", "uptraining fraction", "upF with 0 < F <= 1", 1.0)
        if uptrain is not None and compute is not None:
            raise ValueError(f"variant {spec!r}: an uptrained variant (+upF) trains F of the steps; drop +xC")
        if uptrain is not None and length != 1:
            raise ValueError(f"variant {spec!r}: an uptrained variant (+upF) trains at its source's length; drop +lenN")
        if uptrain is not None and lr is not None:
            raise ValueError(
                f"variant {spec!r}: an uptrained variant (+upF) trains at its source's pre-training rate; drop +lrF"
            )
        kv = None
        if rest and rest[-1].startswith("kv"):
            digits = rest.pop()[2:]
            if not digits.isdigit() or int(digits) < 1:
                raise ValueError(f"variant {spec!r} has a bad kv-head count {digits!r}: expected kvN with N >= 1")
            kv = int(digits)
        matched = not (rest and rest[-1] == "unmatched")
        if not matched:
            rest.pop()
        if len(rest) > 1:
            raise ValueError(f"variant {spec!r} is invalid: expected {SPEC_FORMAT}")
        position = rest[0] if rest else "rope"
        for registry, name in ((ATTENTION, attention), (POSITIONS, position)):
            if name not in registry.names():
                raise ValueError(
                    f"variant {spec!r}: {name!r} is not a known {registry.kind}; choose one of {registry.names()}"
                )
        try:
            pairs = [parse_key_value(item) for item in (match["options"] or "").split(",") if item.strip()]
            options = dict(pairs)
            for key in options:
                values = [json.dumps(value) for name, value in pairs if name == key]
                if len(values) > 1:
                    raise ValueError(f"option {key} is given more than once ({', '.join(values)}): give it once")
            ATTENTION.parse_options(attention, options)
        except ValueError as err:
            raise ValueError(f"variant {spec!r}: {err}") from None
        if uptrain is not None and kv is None:
            raise ValueError(f"variant {spec!r}: uptraining (+upF) converts to fewer kv heads; name them with +kvN")
        return cls(
            attention, position, kv, tuple(sorted(options.items())), compute or 1.0, uptrain, length, lr or 1.0, matched
        )

    @classmethod
    def parse_all(cls, specs: Iterable[Variant | str]) -> tuple[Variant, ...]:
        """Records for a list that may hold labels as a user wrote them (a preset, a config file, ``--variants``)."""
        return tuple(spec if isinstance(spec, Variant) else cls.parse(spec) for spec in specs)


def _multiple(spec: str, parts: list[str], prefix: str, what: str, expected: str, most: float) -> float | None:
    """Pop a trailing ``PREFIX<number>`` part (``x1.5``, ``up0.05``) off ``parts``; None if there is none."""
    if not parts or not re.fullmatch(rf"{prefix}[0-9.]+", parts[-1]):
        return None
    text = parts.pop()[len(prefix) :]
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not 0 < value <= most:
        raise ValueError(f"variant {spec!r} has a bad {what} {text!r}: expected {expected}")
    return value


def _spelled(value: Any) -> str:
    """An option value as a label writes it: JSON, but a word that parses back as itself stays bare (``fn=mlp``),
    since labels name directories."""
    if isinstance(value, str) and parse_key_value(f"_={value}")[1] == value and not set(value) & set(',[]+"='):
        return value
    return json.dumps(value)


def count_parameters(cfg: ModelConfig) -> int:
    """Parameter count without allocating weights."""
    from attnzoo.model import Transformer

    with torch.device("meta"):
        return Transformer(cfg).num_parameters()


def variant_config(variant: Variant, baseline: ModelConfig) -> ModelConfig:
    """The baseline with this variant's attention, position and kv heads, paired as the mechanism's paper does."""
    changes: dict = {"attention": variant.attention, "attention_options": dict(variant.options)}
    if variant.position != baseline.position:
        changes.update(position=variant.position, position_options={})
    if variant.n_kv_heads is not None:
        changes["n_kv_heads"] = variant.n_kv_heads
    if variant.length != 1:  # room for the longer sequences it trains on (learned positions: a longer table)
        changes["max_seq_len"] = baseline.max_seq_len * variant.length
    paired = dataclasses.replace(baseline, **changes)
    return dataclasses.replace(paired, **ATTENTION.get(variant.attention).paired_overrides(paired))


def match_parameters(cfg: ModelConfig, target: int, tolerance: float = 0.02) -> ModelConfig:
    """Adjust ``mlp_hidden_dim`` (in steps of 8) so the parameter count is as close to ``target`` as possible.

    Raises ``ValueError`` if even the best width misses ``target`` by more than ``tolerance`` (relative).
    """
    per_unit = count_parameters(dataclasses.replace(cfg, mlp_hidden_dim=cfg.mlp_hidden_dim + 8))
    per_unit = (per_unit - count_parameters(cfg)) / 8
    hidden = cfg.mlp_hidden_dim + round((target - count_parameters(cfg)) / per_unit / 8) * 8
    matched = dataclasses.replace(cfg, mlp_hidden_dim=max(8, hidden))
    error = abs(count_parameters(matched) - target) / target
    if error > tolerance:
        raise ValueError(
            f"cannot match {cfg.attention}+{cfg.position} to {target:,} parameters within {tolerance:.0%} by the MLP "
            f"width alone (best: {count_parameters(matched):,}, off by {error:.1%}); use a larger model"
        )
    return matched


def matched_configs(
    variants: Iterable[Variant], baseline: ModelConfig, tolerance: float = 0.02
) -> dict[str, ModelConfig]:
    """Parameter-matched configs keyed by variant label; the target is the baseline's parameter count. An
    ``+unmatched`` variant keeps the baseline's MLP width: its mechanism's parameters come on top."""
    target = count_parameters(baseline)
    configs = {}
    for v in variants:
        trained = v.source if v.uptrain is not None else v
        config = variant_config(trained, baseline)
        if v.matched:
            config = match_parameters(config, target, tolerance)
        # An uptrained variant is its source's model with its kv heads pooled: fewer parameters, as in the paper.
        configs[v.label] = dataclasses.replace(config, n_kv_heads=v.n_kv_heads) if v.uptrain is not None else config
    return configs
