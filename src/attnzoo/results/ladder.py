"""Comparisons of one protocol at several model sizes: the ladder a language-model claim is judged on.

The papers judge an architecture across model sizes trained the same way, never at one size: DCFormer fits its
compute multiple across 405M–1.4B models, Diff across 830M–13B. A :class:`Ladder` holds one comparison (a rung)
per model size, smallest first, all on the same data, sequence length, schedule and learning-rate rule, so a
claim can be judged at each size and the sizes set against each other (:mod:`attnzoo.claims.verdicts`). One
comparison on its own is a ladder of one rung.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from attnzoo.results.comparison import CompareResults

RESULTS = "results.json"


@dataclass(frozen=True)
class Ladder:
    rungs: tuple[CompareResults, ...]  # one per model size, smallest first

    @classmethod
    def of(cls, rungs: Sequence[CompareResults]) -> Ladder:
        """The rungs sorted by the baseline's parameters; refused where two share a size, or where they differ in
        what the protocol holds fixed (the corpus and its tokenizer, the sequence length, the schedule's shape and
        the learning-rate rule)."""
        if not rungs:
            raise ValueError("a ladder needs at least one comparison")
        ordered = sorted(rungs, key=parameters)
        sizes = [parameters(rung) for rung in ordered]
        if len(set(sizes)) < len(sizes):
            raise ValueError(f"two comparisons share a baseline size ({sizes} parameters): one rung per size")
        first = ordered[0]
        for rung in ordered[1:]:
            differs = [
                name
                for name, ours, theirs in (
                    ("corpus", (first.corpus.name, first.corpus.tokenizer), (rung.corpus.name, rung.corpus.tokenizer)),
                    ("baseline", first.baseline, rung.baseline),
                    ("sequence length", first.budget.seq_len, rung.budget.seq_len),
                    ("learning rate", first.budget.lr, rung.budget.lr),
                    ("floor learning rate", first.budget.min_lr / first.budget.lr, rung.budget.min_lr / rung.budget.lr),
                )
                if ours != theirs and not (isinstance(ours, float) and math.isclose(ours, theirs))
            ]
            if differs:
                raise ValueError(
                    f"the comparisons at {parameters(first):,} and {parameters(rung):,} parameters differ in "
                    f"{', '.join(differs)}: a ladder's sizes are trained under one protocol"
                )
        return cls(tuple(ordered))

    @property
    def largest(self) -> CompareResults:
        return self.rungs[-1]


def parameters(rung: CompareResults) -> int:
    """A rung's size: its baseline's parameter count."""
    return rung.variants[rung.baseline].parameters


def head_dim(rung: CompareResults) -> int:
    config = rung.variants[rung.baseline].config
    return config.get("head_dim") or config["dim"] // config["n_heads"]


# How a ladder describes each of its rungs' specs (attnzoo.compare.presets): "<ladder> rung <rung>".
_RUNG = re.compile(r"(?P<ladder>\S+) rung (?P<rung>\S+)")


def ladder_of(results: CompareResults) -> str | None:
    """The ladder preset a comparison is one rung of, or None for a comparison that stands alone. A rung's folder
    sits in its ladder's, whose report judges the rungs together: a rung alone cannot judge what needs its sizes."""
    found = _RUNG.fullmatch(str(results.spec.get("description", "")))
    return found["ladder"] if found and found["rung"] == results.preset else None


def as_ladder(results: CompareResults | Ladder) -> Ladder:
    return results if isinstance(results, Ladder) else Ladder.of([results])


def load_ladder(directory: Path) -> tuple[Ladder, list[Path]]:
    """The ladder whose rungs are the comparisons in ``directory``'s subdirectories (each with its results.json),
    and those subdirectories in the ladder's order. Rungs run on different days or machines merge by being copied
    side by side into one directory."""
    found = sorted(path.parent for path in Path(directory).glob(f"*/{RESULTS}"))
    if not found:
        raise ValueError(f"{directory} holds no comparison: a ladder's rungs are subdirectories with a {RESULTS}")
    rungs = {path: CompareResults.load(path / RESULTS) for path in found}
    ladder = Ladder.of(list(rungs.values()))
    return ladder, [next(path for path, rung in rungs.items() if rung is r) for r in ladder.rungs]
