"""What the stored claims ladder answered, said by a run that decides no paper's primary claim itself.

One comparison decides none by design: a primary language-model claim is judged across two model sizes 2× apart,
at the papers' budget, with enough seeds, which only the claims ladder trains. The ladder that did is committed in
the repository (``docs/claims``: its report and ``verdicts.json``). A clone has it beside the package, and its
primaries are read from there, in the words the report uses; an installed package carries no ``docs/`` and says
where the report lives and the command that reproduces it.
"""

from __future__ import annotations

import json
from pathlib import Path

from attnzoo.claims.regime import Regime
from attnzoo.claims.report import answer_words, effect_words
from attnzoo.claims.rules import MIN_SIZE_RATIO, MIN_SIZES
from attnzoo.claims.verdicts import ClaimRecord, VerdictsRecord
from attnzoo.records import from_dict

STORED_LADDER = Path("docs") / "claims"  # in the repository
REPRODUCE = "python3 -m attnzoo compare --preset claims --executor local --jobs 2"


def clone_root() -> Path:
    """The repository this package was imported from, where it runs from a clone (``src/attnzoo/...``)."""
    return Path(__file__).resolve().parents[3]


def stored_primaries(root: Path) -> list[ClaimRecord] | None:
    """The primaries of the claims ladder stored under ``root``, or None where it holds none (an installed
    package)."""
    path = root / STORED_LADDER / "verdicts.json"
    if not path.is_file():
        return None
    record = from_dict(VerdictsRecord, json.loads(path.read_text()), str(path))
    return [row for row in record.claims if row.role == "primary"]


def stored_answer(preset: str, root: Path | None = None) -> list[str]:
    """The lines a run that decides no primary ends with: why, what the stored ladder decided (one line a paper),
    and the command that reproduces it."""
    root = clone_root() if root is None else root
    report = STORED_LADDER / "report.md"
    lines = [
        f"This {preset} run decides none of the papers' primary claims, by design: each is judged across at least "
        f"{MIN_SIZES} model sizes {MIN_SIZE_RATIO:g}× apart at the papers' budget, which only the claims ladder trains."
    ]
    primaries = stored_primaries(root)
    if primaries is None:
        lines.append(f"The stored claims ladder's answer is in the attnzoo repository's {report}.")
    else:
        lines.append(f"The claims ladder stored in {root / report} decided them:")
        for row in primaries:
            regime = Regime.from_record(row.regime) if row.regime is not None else None
            words = answer_words(row.outcome, regime, row.would_change)
            if regime is not None:  # decided, in scoped words that do not name the outcome
                effect = effect_words(row.effect, row.interval90)
                words = f"{row.outcome} (effect {effect}, its 90% interval): {words}"
            lines.append(f"  {row.paper}: {words}")
    lines.append(f"Reproduce it: {REPRODUCE}  (two sizes; its time by machine in docs/jobs/compare.md)")
    return lines
