"""Where a verdict was measured, read from the stored runs, so that no verdict reads as a statement about a mechanism
at every scale: its sizes, depth, heads × head size, corpus and tokenizer, tokens per parameter and learning-rate rule;
for a synthetic task's claim, the task's own model and budget (:func:`task_regime`).

A paper's own regime is its claim's record (:attr:`attnzoo.claims.claim.Claim.paper_regime`). Where head size and
model size change together across a ladder's sizes, a trend over the sizes cannot tell the two apart: the regime
says they are confounded.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from attnzoo.records import from_dict, to_dict
from attnzoo.results import CompareResults, TaskResult
from attnzoo.results.ladder import head_dim, parameters
from attnzoo.variants import Variant


@dataclass(frozen=True)
class Regime:
    """The baseline's model and training at each size a claim was measured at, smallest first."""

    parameters: tuple[int, ...]
    layers: tuple[int, ...]
    heads: tuple[int, ...]
    head_dims: tuple[int, ...]
    corpus: str
    tokenizer: str
    tokens_per_parameter: tuple[float, ...]
    lr_rule: str

    @property
    def confounded(self) -> bool:
        """Head size and model size change together across the sizes: their effects cannot be told apart."""
        return len(set(self.head_dims)) > 1 and len(set(self.parameters)) > 1

    @property
    def _millions(self) -> str:
        """The sizes in millions: two decimals, or two significant digits below 0.1M (a task's model)."""
        millions = [p / 1e6 for p in self.parameters]
        return _span(millions, ".2f" if min(millions) >= 0.1 else ".2g")

    @property
    def scope(self) -> str:
        """The sizes and head sizes in a few words: "0.12–0.25M parameters, heads ≤ 24"."""
        return f"{self._millions}M parameters, heads ≤ {max(self.head_dims)}"

    def describe(self) -> str:
        heads = f"{_counted(self.heads, 'head')} × {_span(self.head_dims, 'd')}"
        text = (
            f"{self._millions}M parameters ({_counted(self.layers, 'layer')}, "
            f"{heads}), {self.corpus} ({self.tokenizer} tokens), {_span(self.tokens_per_parameter, '.0f')} tokens per "
            f"parameter, {self.lr_rule}"
        )
        if self.confounded:
            text += (
                f"; head size and model size change together across the sizes ({' → '.join(map(str, self.head_dims))}"
                "), so their effects are confounded"
            )
        return text

    def brief(self) -> str:
        """:meth:`describe` in a table cell's words."""
        text = (
            f"{self._millions}M params, {_counted(self.layers, 'layer')}, "
            f"{_counted(self.heads, 'head')} × {_span(self.head_dims, 'd')}, {self.corpus} ({self.tokenizer}), "
            f"{_span(self.tokens_per_parameter, '.0f')} tokens/param, {self.lr_rule.split(' (')[0]}"
        )
        return text + ("; head size confounded with size" if self.confounded else "")

    def record(self) -> dict[str, Any]:
        """Its fields as JSON-ready values, with what they imply in words beside them."""
        return {**to_dict(self), "confounded": self.confounded, "text": self.describe()}

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> Regime:
        """:meth:`record` read back (what it adds in words is derived again, not read)."""
        return from_dict(cls, {key: value for key, value in record.items() if key not in ("confounded", "text")})


def regime_of(rungs: Sequence[CompareResults], labels: Sequence[str] = ()) -> Regime:
    """The regime of ``rungs`` (one comparison per size, smallest first), read off each one's baseline; ``labels``
    (the claim's models) say whether any trained at a learning rate of its own (``+lrF``)."""
    if not rungs:
        raise ValueError("a regime needs at least one comparison")
    configs = [rung.variants[rung.baseline].config for rung in rungs]
    first = rungs[0]
    budget = first.budget
    rule = _lr_rule(budget.lr, labels)
    warmup = budget.warmup_steps / budget.steps
    return Regime(
        parameters=tuple(parameters(rung) for rung in rungs),
        layers=tuple(config["n_layers"] for config in configs),
        heads=tuple(config["n_heads"] for config in configs),
        head_dims=tuple(head_dim(rung) for rung in rungs),
        corpus=first.corpus.name,
        tokenizer=first.corpus.tokenizer,
        tokens_per_parameter=tuple(rung.budget.tokens_per_run / parameters(rung) for rung in rungs),
        lr_rule=f"{rule} ({warmup:.0%} warmup, cosine to {budget.min_lr / budget.lr:g}× the peak)",
    )


def task_regime(task: TaskResult, labels: Sequence[str]) -> Regime | None:
    """The regime of a task's claim, one size: its baseline's (``labels[0]``) model and budget, read off its first
    run; the "corpus" is the task, its tokens synthetic. None for runs stored before a run recorded its model."""
    run = task.runs[labels[0]][0]
    model = run.identity.get("model")
    if model is None:
        return None
    budget = task.budget
    rule = _lr_rule(budget.lr, labels)
    return Regime(
        parameters=(run.parameters,),
        layers=(model["n_layers"],),
        heads=(model["n_heads"],),
        head_dims=(model["head_dim"],),
        corpus=f"the {task.name} task",
        tokenizer="synthetic",
        tokens_per_parameter=(run.tokens / run.parameters,),
        lr_rule=f"{rule} (the task's budget: {budget.warmup_steps} warmup steps of {budget.steps})",
    )


def _lr_rule(peak: float, labels: Sequence[str]) -> str:
    """One peak learning rate for every model, or the models that trained at a multiple of it (``+lrF``)."""
    own = [f"{label} at {peak * Variant.parse(label).lr:g}" for label in labels if Variant.parse(label).lr != 1]
    return f"peak learning rate {peak:g} for every model" if not own else f"peak {peak:g}, {', '.join(own)}"


def _counted(values: Sequence[int], noun: str) -> str:
    """``values`` of ``noun``, plural unless every one is 1: "2 layers", "1 head", "4–8 heads"."""
    return f"{_span(values, 'd')} {noun}{'' if set(values) == {1} else 's'}"


def _span(values: Sequence[float], spec: str) -> str:
    """One value, or the smallest–largest: "16–24", "0.12–0.25"."""
    low, high = format(min(values), spec), format(max(values), spec)
    return low if low == high else f"{low}–{high}"
