"""What the presets train for the claims: the variants whose language models the claims read, and the tasks."""

from __future__ import annotations

from attnzoo.claims.claim import CLAIMS, Claim
from attnzoo.claims.protocol import BASELINE
from attnzoo.evals.task import TaskSpec


def _runs_in(preset: str) -> list[Claim]:
    return [c for c in CLAIMS.values() if c.is_run and c.preset == preset]


def claim_variants(preset: str = "claims", one_size: bool = False) -> tuple[str, ...]:
    """Every variant whose language model a claim of ``preset`` reads, the baseline first. A claim read off a task
    trains its variants on that task alone (:func:`claim_tasks`). ``one_size``: for a comparison at one model size,
    leaving out the claims read across sizes (a compute multiple), which it cannot measure."""
    names = [BASELINE]
    for claim in _runs_in(preset):
        if claim.measure.task is None and not (one_size and claim.measure.across is not None):
            names += [claim.variant, claim.baseline, *claim.measure.trains]
    return tuple(dict.fromkeys(names))


def claim_tasks(scale: str, preset: str = "claims") -> tuple[TaskSpec, ...]:
    """The tasks a claim of ``preset`` is measured on, each at ``scale`` of its budget (or the nearest larger) and
    trained only for the variants its claims compare, the first claim's baseline first."""
    specs = []
    claims = _runs_in(preset)
    for name in dict.fromkeys(c.measure.task for c in claims if c.measure.task is not None):
        needed = [c for c in claims if c.measure.task == name]
        variants = dict.fromkeys(label for c in needed for label in (c.baseline, c.variant))
        specs.append(TaskSpec(name, TaskSpec.at_scale(name, scale).budget, tuple(variants)))
    return tuple(specs)
