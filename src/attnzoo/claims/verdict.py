"""A verdict as a record: the claim's outcome with its reason, at the deciding size, at every size that ran it, and
for each further part of its statement."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING

from attnzoo.claims.rules import EQUIVALENCE_CONFIDENCE, Outcome

if TYPE_CHECKING:
    from attnzoo.claims.claim import BenchPart, Claim, Part
    from attnzoo.claims.gates import Gate
    from attnzoo.claims.regime import Regime
    from attnzoo.stats import PairedDifference


@dataclass(frozen=True)
class SizeVerdict:
    """The claim at one model size, decided by that size alone at the raw 5% level."""

    parameters: int
    head_dim: int
    outcome: Outcome
    reason: str
    gate: Gate | None = None
    difference: PairedDifference | None = None
    p_raw: float | None = None  # of the claim's decisive test at this size
    conditions: str = ""
    levels: dict[str, float] = dataclasses.field(default_factory=dict)
    task: str | None = None  # a task's claim: its models are the task's own, run beside this size's

    @property
    def judged(self) -> bool:
        return self.p_raw is not None

    def describe(self) -> str:
        """The effect with the 90% interval the size was decided on, its verdict beside it."""
        d = self.difference
        if d is None:
            effect = "—"
        elif d.has_spread:
            low, high = d.interval(EQUIVALENCE_CONFIDENCE)
            effect = f"{d.mean:+.4f}, 90% [{low:+.4f}, {high:+.4f}]"
        else:
            effect = f"{d.mean:+.4f} (no interval)"
        size = f"{self.parameters / 1e6:.2f}M"
        where = f"task {self.task}, run with the {size} rung" if self.task else f"{size} (head {self.head_dim})"
        return f"{where}: {effect}, {self.outcome}"


@dataclass(frozen=True)
class PartVerdict:
    """A further part of a claim's statement, decided on its own at the raw 5% level. ``effect`` and ``bounds``: for
    a part measured over seeds, the paired difference's mean and 90% interval; for a bench part, ln of the ratio and
    the range of the timed repeats (one value for the memory)."""

    part: Part | BenchPart
    outcome: Outcome
    reason: str
    difference: PairedDifference | None = None
    p_raw: float | None = None
    levels: dict[str, float] = dataclasses.field(default_factory=dict)
    would_change: str = ""
    effect: float | None = None
    bounds: tuple[float, float] | None = None

    @property
    def name(self) -> str:
        return self.part.name


@dataclass(frozen=True)
class Verdict:
    claim: Claim
    outcome: Outcome
    reason: str
    gate: Gate | None = None  # at the deciding (largest) size
    difference: PairedDifference | None = None  # at the deciding size
    p_raw: float | None = None  # of the claim's test at the deciding size: beyond δ, or within the margin
    p_adjusted: float | None = None  # Holm over the primaries; None for an exploratory claim
    would_change: str = ""
    conditions: str = ""  # the deciding size's scale: seeds, tokens per run, parameters
    levels: dict[str, float] = dataclasses.field(default_factory=dict)  # means reached, and chance where defined
    sizes: tuple[SizeVerdict, ...] = ()  # every size that ran the claim, smallest first
    parts: tuple[PartVerdict, ...] = ()  # the statement's other parts; the outcome is the whole's
    regime: Regime | None = None  # the sizes it was measured at (a task's claim: its task's); None if not run

    @property
    def interval(self) -> tuple[float, float] | None:
        """The 90% interval the verdict was decided on (the one-sided tests at 5%), shown beside it."""
        d = self.difference
        return d.interval(EQUIVALENCE_CONFIDENCE) if d and d.has_spread else None

    @property
    def role(self) -> str:
        return "primary" if self.claim.primary else "exploratory"

    @property
    def pending(self) -> bool:
        """Measured and waiting for the family's adjusted p (:func:`attnzoo.claims.sizes.settle`): every other
        verdict is final."""
        return self.p_raw is not None and self.outcome == "inconclusive" and not self.reason
