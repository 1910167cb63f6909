"""The report of a ladder: one comparison per model size, judged together.

Each rung keeps its own full report in its directory (the side-by-side tables, the curves, the maps); the ladder's
``report.md``, ``report.html`` and ``verdicts.json`` beside them hold what only the sizes together can say: the answer
first (each paper's primary claim, and its variant against the baseline's loss against compute across the sizes),
then the sizes themselves and every claim's verdict with each size's effect.
"""

from __future__ import annotations

import json
import os
from collections.abc import Collection
from pathlib import Path

from attnzoo.claims.report import answer_section, claims_section, primaries
from attnzoo.claims.verdict import Verdict
from attnzoo.claims.verdicts import judge_all, verdicts_record
from attnzoo.compare.plots import plot_loss_against_compute
from attnzoo.document import Heading, Image, Paragraph, Report
from attnzoo.io import atomic_write_text
from attnzoo.results.comparison import CompareResults
from attnzoo.results.ladder import Ladder, head_dim, parameters
from attnzoo.tables import Table
from attnzoo.variants import Variant

PLOTS = "plots"
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


def _commits(results: CompareResults, leaving_out: Collection[str] = ()) -> str:
    """The commits the runs of ``results`` (but the labels ``leaving_out``) were trained by, each once."""
    found = {
        run.provenance.commit or "no checkout"
        for label, variant in results.variants.items()
        if label not in leaving_out
        for run in variant.runs
    }
    return ", ".join(commit[:12] for commit in sorted(found))


def parts_table(ladder: Ladder, out_dir: Path) -> Table | None:
    """Each comparison merged into a rung (a learning-rate sweep, an ablation): what it added, and from which code
    and machine, beside the rungs' own; None where no rung has parts."""
    if not ladder.parts:
        return None
    rows = [
        [
            f"[{part.results.preset}]({Path(os.path.relpath(part.path, out_dir)) / 'report.md'})",
            part.rung,
            ", ".join(
                label if label in part.added else f"{label} (the rung's runs judged)" for label in part.results.variants
            ),
            _commits(part.results),
            part.results.machine.description,
            part.results.created,
        ]
        for part in ladder.parts
    ]
    for rung in ladder.rungs:
        added = {label for part in ladder.parts if part.rung == rung.preset for label in part.added}
        rows.append(
            [rung.preset, rung.preset, "(its own)", _commits(rung, added), rung.machine.description, rung.created]
        )
    return Table(["comparison", "rung", "variants", "commits", "machine", "made"], rows)


def uptraining_table(ladder: Ladder) -> Table | None:
    """Each uptrained variant's validation loss against the baseline, by size and uptraining fraction α: how much of
    what the conversion lost each fraction of the pre-training steps buys back. None where no rung uptrained."""
    rows = []
    for rung in ladder.rungs:
        uptrained = [label for label in rung.variants if Variant.parse(label).uptrain is not None]
        for label in sorted(uptrained, key=lambda label: Variant.parse(label).uptrain):
            gap = rung.versus_baseline(label, "val_loss")
            if gap is not None:
                low, high = gap.interval(0.90)
                fraction = f"{Variant.parse(label).uptrain:.0%}"
                rows.append(
                    [rung.preset, label, fraction, f"{gap.mean:+.4f}", f"[{low:+.4f}, {high:+.4f}]", str(gap.seeds)]
                )
    header = ["rung", "variant", "α", f"val loss − {ladder.largest.baseline} (nats)", "90% interval", "seeds"]
    return Table(header, rows) if rows else None


def compute_figures(ladder: Ladder, verdicts: list[Verdict], out_dir: Path) -> list:
    """One picture per paper whose primary's models both trained here, drawn into ``out_dir``'s plots: the
    baseline's loss against training compute across the sizes, the paper's variant beside it; a sentence for the
    others."""
    blocks: list = []
    missing = []
    trained = {label for rung in ladder.rungs for label in rung.variants}
    for verdict in primaries(verdicts):
        claim = verdict.claim
        untrained = [label for label in (claim.variant, claim.baseline) if label not in trained]
        if untrained:
            missing.append(f"{claim.paper} ({' and '.join(untrained)})")
            continue
        path = f"{PLOTS}/compute_{claim.id}.png"
        (out_dir / PLOTS).mkdir(parents=True, exist_ok=True)
        plot_loss_against_compute(ladder.rungs, claim.variant, claim.baseline, out_dir / path)
        blocks.append(
            Image(
                path,
                f"{claim.paper}: validation loss against training compute, {claim.variant} beside {claim.baseline} "
                f"at each size (faint: each seed; dashed: {claim.baseline}'s power law through every seed); ×k: the "
                f"compute {claim.baseline} needs for that loss, over the variant's own",
            )
        )
    if missing:
        blocks.append(Paragraph(f"No picture for {', '.join(missing)}: trained at no size here."))
    return blocks


def write_ladder_report(ladder: Ladder, rung_dirs: list[Path], out_dir: Path) -> dict[str, Path]:
    """report.md, report.html and verdicts.json of the ladder, in ``out_dir``; ``rung_dirs`` hold the rungs' own
    reports, in the ladder's order (smallest first)."""
    verdicts = judge_all(ladder)
    largest = ladder.largest
    report = Report(f"attnzoo ladder: {len(ladder.rungs)} sizes on {largest.corpus.name}")
    report.add(*answer_section(verdicts), *compute_figures(ladder, verdicts, out_dir))
    report.add(
        Heading(2, "The sizes"),
        Paragraph(
            "One comparison per model size, trained under one protocol (the same corpus, sequence length, learning "
            "rate and schedule shape, tokens in proportion to parameters); each rung's own report has its side-by-side "
            "tables and curves. A claim is measured at every size; the largest decides, and every size is shown."
        ),
        rungs_table(ladder, rung_dirs, out_dir),
    )
    uptraining = uptraining_table(ladder)
    if uptraining is not None:
        report.add(
            Heading(2, "Uptraining by fraction"),
            Paragraph(
                "Each uptrained model is the same seed's trained baseline with its kv heads mean-pooled, trained again "
                "with the pre-training schedule over a fraction α of its steps (Ainslie et al., arXiv 2305.13245). "
                "Its gap to the baseline at the end of α, at each size; the claims read α = 5% (the paper's) and 10%."
            ),
            uptraining,
        )
    parts = parts_table(ladder, out_dir)
    if parts is not None:
        report.add(
            Heading(2, "The rungs' parts"),
            Paragraph(
                "Comparisons trained at a rung's model and schedule apart from the ladder (a learning-rate sweep, an "
                "ablation), merged into that rung: the rung keeps its own runs of a label both ran, though a "
                "learning-rate sweep is read off its parts alone. Runs from other commits or machines pair with the "
                "rung's by seed, so the table names both."
            ),
            parts,
        )
    report.add(*claims_section(largest, verdicts))
    out_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out_dir / "report.md", report.to_markdown())
    atomic_write_text(out_dir / "report.html", report.to_html(out_dir))
    atomic_write_text(out_dir / VERDICTS, json.dumps(verdicts_record(ladder, verdicts), indent=2) + "\n")
    return {"markdown": out_dir / "report.md", "html": out_dir / "report.html", "verdicts": out_dir / VERDICTS}
