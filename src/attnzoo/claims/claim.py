"""The papers' claims as records: what each paper says, the experiment here that tests it, and how it is judged.

A :class:`Claim` names its paper, says what the paper found in one sentence with the paper's own figure and
where that figure is printed (``source``), and fixes, before any run, everything its verdict depends on:

* the experiment: a variant against a baseline, and the :class:`Measure` read off each seed's run;
* the claimed direction (:data:`LOWER`, :data:`HIGHER`) or a non-inferiority margin (:data:`NONINFERIOR`);
* the **smallest effect of interest** and where that number comes from: an effect whose interval lies inside
  it is *negligible*, whatever its sign;
* the **validity gate** (:mod:`attnzoo.claims.gates`): a claim on a task is judged only where the baseline learned
  the task, a language-model claim only at the papers' own protocol;
* whether it is its paper's **primary** claim: the primaries are corrected together for multiplicity (Holm),
  every other claim is exploratory;
* the preset that runs it: a claim whose experiment needs a GPU, or that no preset runs yet, is registered all
  the same and reported as *not run*, never left out.

:mod:`attnzoo.claims.measures` builds the measures, :mod:`attnzoo.claims.verdicts` turns a comparison's results into
one verdict per claim, and one module per paper (:mod:`attnzoo.claims.diff`, ...) registers its claims.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import numpy as np

from attnzoo.claims.gates import LanguageModelGate, TaskLearned
from attnzoo.results import CompareResults, Ladder

LOWER, HIGHER, NONINFERIOR = "lower", "higher", "noninferior"
# lower/higher: the claimed sign of variant − baseline. noninferior: variant − baseline stays below the margin,
# for a measure where lower is better (a loss): the variant is no worse than the baseline by more than it.
Rule = Literal["lower", "higher", "noninferior"]

Values = dict[int, float]  # seed → the measure
Blocks = dict[int, np.ndarray]  # seed → the measure on each evaluation block (the same blocks for every variant)


@dataclass(frozen=True)
class Measure:
    """A quantity read off a comparison for one variant: one value per seed, or None where it was not run.

    ``blocks``, where the measure is an average over evaluation blocks, reads each block's value, so the
    interval can include the sampling of the evaluation text as well as the seeds.
    """

    label: str  # with its unit
    needs: str  # what the comparison must run to measure it, for the "not run" reason
    read: Callable[[CompareResults, str], Values | None]
    task: str | None = None  # the synthetic task it is read from; None: the language model
    blocks: Callable[[CompareResults, str], Blocks | None] | None = None
    trains: tuple[str, ...] = ()  # language-model variants it reads besides the claim's variant and baseline
    # A measure read across model sizes (a compute multiple off the baseline's scaling curve): given every size and
    # the one to read; ``read`` then answers None for a size on its own.
    across: Callable[[Ladder, CompareResults, str], Values | None] | None = None
    # What else to show beside the measure's mean, for one variant (e.g. the factors of a product): name → mean.
    levels: Callable[[CompareResults, str], dict[str, float]] | None = None
    # How the measure moves as the variant's validation loss rises: +1 (a loss), −1 (a compute multiple), 0 where a
    # model's loss says nothing of it (a probe; the rise past the training length, least for a model that ignores
    # its context). Decides what a variant that never learned its context means for a claim (the gate's (d)).
    loss_sign: Literal[-1, 0, 1] = 0


# ------------------------------------------------------------------------------------------------ the parts


@dataclass(frozen=True)
class Part:
    """A further part of a claim's statement ("spikier *and* with a smaller norm"), measured like the claim's own
    measure: the same variant, baseline and gate, its own measure, rule and smallest effect of interest.

    ``fixed_by_task``: why the part's task fixes its measure for every model that learns the task (a target map
    both models fit), so the two cannot differ there by their mechanism: the part is then not measurable on that
    task, for this reason, its measured difference reported beside it and not judged."""

    measure: Measure
    rule: Rule
    smallest_effect: float
    smallest_effect_source: str
    fixed_by_task: str = ""

    @property
    def name(self) -> str:
        return self.measure.label

    def describe(self, variant: str, baseline: str) -> str:
        return f"`{variant}` − `{baseline}`: {self.measure.label}, {_RULE_WORDS[self.rule]}"


@dataclass(frozen=True)
class BenchPart:
    """A part of a claim read off the comparison's bench (ALiBi's "11% faster, 11% less memory"): ``quantity`` of
    ``variant`` benched at ``variant_multiple`` times the training length against ``baseline``'s at
    ``baseline_multiple`` times, in the ``mode`` case (a bench case holds the tokens per step, so a longer case is
    fewer, longer sequences). Judged in ln of the ratio: the speed on the range of every timed repeat, the memory
    on each side's peak (one value, no interval)."""

    quantity: Literal["speed", "memory"]
    variant: str
    baseline: str
    baseline_multiple: int
    rule: Rule
    smallest_effect: float
    smallest_effect_source: str
    variant_multiple: int = 1
    mode: str = "train"

    def __post_init__(self) -> None:
        if self.rule == NONINFERIOR:
            raise ValueError("a bench part is directional: lower or higher")

    @property
    def name(self) -> str:
        what = "training throughput (tokens/s)" if self.quantity == "speed" else "peak training memory"
        return (
            f"{what} of {self.variant} at {self.variant_multiple}L ÷ {self.baseline}'s at {self.baseline_multiple}L, "
            "from the bench (ln of the ratio)"
        )

    def describe(self, variant: str, baseline: str) -> str:
        return f"{self.name}, {_RULE_WORDS[self.rule]}"


_RULE_WORDS = {LOWER: "claimed lower", HIGHER: "claimed higher", NONINFERIOR: "claimed no worse by the margin"}


# ------------------------------------------------------------------------------------------------ the record


@dataclass(frozen=True)
class Claim:
    id: str
    paper: str
    statement: str  # one sentence, with the paper's own figure, or "figure not available"
    source: str  # where the figure is printed: a review in shared/seeds/ (file and line) or the paper's address
    variant: str  # the variant label the claim is about
    baseline: str  # what it is compared with
    measure: Measure
    rule: Rule
    smallest_effect: float  # the smallest |variant − baseline| of interest, in the measure's unit (the margin, for
    smallest_effect_source: str  # NONINFERIOR), and where that number comes from
    gate: LanguageModelGate | TaskLearned
    primary: bool = False  # the paper's one primary claim; at most one per paper
    paper_scale: str = ""  # where the paper measured it
    # A primary's: the paper's own regime (sizes, heads, corpus, tokens), quoting only figures printed in the paper's
    # review or notes (shared/seeds, shared/notes), beside the regime each verdict was measured at.
    paper_regime: str = ""
    checks: tuple[str, ...] = ()  # what was checked to rule out a setup error, shown with every verdict
    preset: str = "claims"  # the preset that runs its experiment
    needs_gpu: bool = False
    experiment: str = ""  # for a claim no preset runs yet: what would test it (its own measure; parts still run)
    # Why no CPU comparison can measure it, from a committed calibration: a CPU run that did not train it calls it
    # "not measurable on the CPU" for this reason, where "not run" would suggest that running it could decide it.
    cpu_calibration: str = ""
    # The statement's other parts, each measured on its own: the claim holds only as a whole (parts.py).
    parts: tuple[Part | BenchPart, ...] = ()

    def __post_init__(self) -> None:
        for effect in (self.smallest_effect, *(part.smallest_effect for part in self.parts)):
            if effect <= 0:
                raise ValueError(f"claim {self.id!r}: a smallest effect must be > 0, got {effect}")
        measures = [self.measure, *(part.measure for part in self.parts if isinstance(part, Part))]
        if any(isinstance(self.gate, TaskLearned) != (measure.task is not None) for measure in measures):
            raise ValueError(
                f"claim {self.id!r}: a task's measure takes TaskLearned, a language model's LanguageModelGate"
            )
        if any(measure.task != self.measure.task for measure in measures):
            raise ValueError(f"claim {self.id!r}: every part is read off the same task (or language model)")

    @property
    def favours_variant_on_loss(self) -> bool:
        """Whether the claim has the variant at least as good as the baseline on a measure that tracks the variant's
        loss, so that a variant whose loss stayed high scores as badly as it did."""
        sign = self.measure.loss_sign
        return (sign == 1 and self.rule in (LOWER, NONINFERIOR)) or (sign == -1 and self.rule == HIGHER)

    @property
    def is_run(self) -> bool:
        """Whether some preset's experiment measures it: the CPU claims preset or a GPU preset."""
        return not self.experiment


CLAIMS: dict[str, Claim] = {}


def register_claim(claim: Claim) -> Claim:
    if claim.id in CLAIMS:
        raise ValueError(f"claim {claim.id!r} is already registered")
    if claim.primary and any(c.primary and c.paper == claim.paper for c in CLAIMS.values()):
        raise ValueError(f"claim {claim.id!r}: {claim.paper} already has a primary claim")
    CLAIMS[claim.id] = claim
    return claim
