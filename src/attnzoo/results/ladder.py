"""Comparisons of one protocol at several model sizes: the ladder a language-model claim is judged on.

The papers judge an architecture across model sizes trained the same way, never at one size: DCFormer fits its
compute multiple across 405M–1.4B models, Diff across 830M–13B. A :class:`Ladder` holds one comparison (a rung)
per model size, smallest first, all on the same data, sequence length, schedule and learning-rate rule, so a
claim can be judged at each size and the sizes set against each other (:mod:`attnzoo.claims.verdicts`). One
comparison on its own is a ladder of one rung.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from attnzoo.results.comparison import CompareResults

RESULTS = "results.json"


@dataclass(frozen=True)
class RungPart:
    """A comparison merged into a rung (:func:`merge_parts`): where it was stored, the rung's preset, and the labels
    it added (the rung keeps its own runs of the others)."""

    path: Path
    results: CompareResults
    rung: str
    added: tuple[str, ...]


@dataclass(frozen=True)
class Ladder:
    rungs: tuple[CompareResults, ...]  # one per model size, smallest first, each holding its parts' variants
    parts: tuple[RungPart, ...] = ()  # what each rung merged, for the record

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
    side by side into one directory; so do a rung's parts (:func:`merge_parts`): a comparison trained at a rung's
    model and schedule later (a learning-rate sweep, an ablation) adds its variants to that rung."""
    found = sorted(path.parent for path in Path(directory).glob(f"*/{RESULTS}"))
    if not found:
        raise ValueError(f"{directory} holds no comparison: a ladder's rungs are subdirectories with a {RESULTS}")
    by_setup: dict[str, list[tuple[Path, CompareResults]]] = {}
    for path in found:
        results = CompareResults.load(path / RESULTS)
        by_setup.setdefault(setup_key(results), []).append((path, results))
    rungs, parts = {}, []
    for comparisons in by_setup.values():
        # The ladder's own rung carries the rest; among comparisons none of which is one, the first by folder.
        (path, rung), *its_parts = sorted(comparisons, key=lambda found: (ladder_of(found[1]) is None, found[0]))
        merged = rung
        for part_path, part in its_parts:
            added = tuple(label for label in part.variants if label not in merged.variants)
            merged = merge_parts(merged, [part])
            parts.append(RungPart(part_path, part, rung.preset, added))
        rungs[path] = merged
    ladder = dataclasses.replace(Ladder.of(list(rungs.values())), parts=tuple(sorted(parts, key=lambda p: p.path)))
    return ladder, [next(path for path, rung in rungs.items() if rung is r) for r in ladder.rungs]


# What a comparison's record names for itself alone; the rest of its spec (the model, the training, the evaluations)
# is the setup every run of one rung shares.
_OWN_FIELDS = ("name", "description", "variants", "seeds", "tasks", "task_seeds")


def setup_key(results: CompareResults) -> str:
    """The model and training a comparison's runs share: equal for comparisons that are one rung's parts."""
    return json.dumps({k: v for k, v in results.spec.items() if k not in _OWN_FIELDS}, sort_keys=True)


def merge_parts(rung: CompareResults, parts: Sequence[CompareResults]) -> CompareResults:
    """``rung`` with the variants of ``parts``, comparisons trained at its model and schedule (:func:`setup_key`)
    on other days, machines or commits: its record, baseline and seeds kept, each run keeping its own provenance
    (the ladder's report lists each part's commits and machine). A label both ran keeps the rung's runs."""
    variants = dict(rung.variants)
    for part in parts:
        if setup_key(part) != setup_key(rung):
            raise ValueError(f"{part.preset} is not a part of {rung.preset}: their models or training differ")
        variants |= {label: found for label, found in part.variants.items() if label not in variants}
    return dataclasses.replace(rung, variants=variants)
