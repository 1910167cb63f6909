"""The report of a ladder: one comparison per model size, judged together.

Each rung keeps its own full report in its directory (the side-by-side tables, the curves, the maps); the ladder's
``report.md``, ``report.html`` and ``verdicts.json`` beside them hold what only the sizes together can say: every
claim's verdict with each size's effect, and the sizes themselves.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from attnzoo.compare.document import Heading, Paragraph, Report
from attnzoo.compare.ladder import Ladder, head_dim, parameters
from attnzoo.compare.report_claims import claims_section
from attnzoo.compare.verdicts import judge_all, verdicts_record
from attnzoo.io import atomic_write_text
from attnzoo.tables import Table

VERDICTS = "verdicts.json"


def rungs_table(ladder: Ladder, rung_dirs: list[Path], out_dir: Path) -> Table:
    rows = []
    for rung, directory in zip(ladder.rungs, rung_dirs, strict=True):
        baseline = rung.variants[rung.baseline]
        tokens = baseline.runs[0].tokens
        rows.append(
            [
                f"[{rung.preset}]({Path(os.path.relpath(directory, out_dir)) / 'report.md'})",
                f"{parameters(rung):,}",
                str(head_dim(rung)),
                f"{tokens:,}",
                f"{tokens / parameters(rung):.1f}",
                f"{tokens / rung.corpus.train_tokens:.2f}",
                f"{len(rung.seeds)}",
                ", ".join(rung.variants),
                rung.created,
            ]
        )
    header = ["rung", "parameters", "head size", "tokens a run", "tokens / parameter", "passes", "seeds"]
    return Table([*header, "variants", "made"], rows)


def write_ladder_report(ladder: Ladder, rung_dirs: list[Path], out_dir: Path) -> dict[str, Path]:
    """report.md, report.html and verdicts.json of the ladder, in ``out_dir``; ``rung_dirs`` hold the rungs' own
    reports, in the ladder's order (smallest first)."""
    verdicts = judge_all(ladder)
    largest = ladder.largest
    report = Report(f"attnzoo ladder: {len(ladder.rungs)} sizes on {largest.corpus.name}")
    report.add(
        Heading(2, "The sizes"),
        Paragraph(
            "One comparison per model size, trained under one protocol (the same corpus, sequence length, learning "
            "rate and schedule shape, tokens in proportion to parameters); each rung's own report has its side-by-side "
            "tables and curves. A claim is measured at every size; the largest decides, and every size is shown."
        ),
        rungs_table(ladder, rung_dirs, out_dir),
        *claims_section(largest, verdicts),
    )
    out_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out_dir / "report.md", report.to_markdown())
    atomic_write_text(out_dir / "report.html", report.to_html(out_dir))
    atomic_write_text(out_dir / VERDICTS, json.dumps(verdicts_record(ladder, verdicts), indent=2) + "\n")
    return {"markdown": out_dir / "report.md", "html": out_dir / "report.html", "verdicts": out_dir / VERDICTS}
