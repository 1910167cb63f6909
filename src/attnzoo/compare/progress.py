"""What a compare says while it runs: the time left, the table after each run, and the closing summary.

:class:`Schedule` turns the bench's per-job estimates into the time left, following how the recent jobs' real
times compared with them; :func:`progress_table` is the terminal table after each run and :func:`final_summary`
the lines a compare ends with (the side-by-side table, the claims' verdicts counted in one line, and where the
report is); :func:`ladder_summary` those a ladder ends with.
"""

from __future__ import annotations

from pathlib import Path

from attnzoo.claims.verdicts import Verdict, counts, judge_all
from attnzoo.compare.report import summary_table
from attnzoo.compare.stored_answer import stored_answer
from attnzoo.results.comparison import CompareResults, LMRun
from attnzoo.results.ladder import Ladder
from attnzoo.stats import Summary, paired_over_seeds
from attnzoo.tables import Table


class Schedule:
    """The training left, estimated per job from the bench and scaled by how the recent jobs' real times (which
    include their evaluations) compared with their estimates: an exponential mean of each finished job's
    real ÷ estimated time, in which the latest job weighs ``RECENT_WEIGHT``. On a machine whose load comes and
    goes, the estimate follows the speed of now, not the average since the start or the bench's moment."""

    RECENT_WEIGHT = 0.5

    def __init__(self, estimates: dict[tuple, float]):
        self.left = dict(estimates)
        self.factor: float | None = None  # None until a job has run

    def finish(self, job: tuple, seconds: float | None) -> None:
        """``job`` is done, in ``seconds``; None when it was reused and took no work."""
        estimate = self.left.pop(job, 0.0)
        if seconds is not None and estimate > 0:
            ratio = seconds / estimate
            recent = self.RECENT_WEIGHT
            self.factor = ratio if self.factor is None else (1 - recent) * self.factor + recent * ratio

    def remaining(self) -> float:
        return (self.factor or 1.0) * sum(self.left.values())


def progress_table(lm_runs: dict[str, dict[int, LMRun]], baseline: str) -> str:
    """The terminal table after each run: mean ± std over the seeds finished so far."""
    base_runs = lm_runs[baseline]
    rows = []
    for label, by_seed in lm_runs.items():
        if not by_seed:
            rows.append([label, "0", "…", "…", "…"])
            continue
        loss = Summary.of([r.val.loss for r in by_seed.values()])
        bpb = Summary.of([r.val.bits_per_byte for r in by_seed.values()])
        seeds = sorted(by_seed.keys() & base_runs.keys())
        if label == baseline:
            versus = "baseline"
        elif seeds:  # paired by seed, as the verdicts are
            versus = paired_over_seeds([by_seed[s].val.loss for s in seeds], [base_runs[s].val.loss for s in seeds])
            versus = versus.format(4)
        else:
            versus = "…"
        rows.append([label, str(loss.n), loss.format(4), bpb.format(4), versus])
    header = ["variant", "seeds", "val loss (nats/token)", "val bits/byte", "Δ loss vs baseline"]
    return Table(header, rows).to_text()


def final_summary(results: CompareResults, paths: dict[str, Path], claims_table: bool = False) -> str:
    """The side-by-side table, the claims in one line of counts, what the stored claims ladder answered where this run
    decides no primary claim (:mod:`attnzoo.compare.stored_answer`), and where the report is: the answer a run
    gives, last on the screen. Each claim's verdict and reason (most of them "not run" in a quick compare) is the
    report's, and on the screen only with ``claims_table`` (``compare --claims``)."""
    budget = results.budget
    verdicts = judge_all(results)
    lines = ["", summary_table(results).to_text(), ""]
    if claims_table:
        rows = [[v.claim.id, v.outcome, v.difference.format(4) if v.difference else "—", v.reason] for v in verdicts]
        lines += [Table(["claim", "verdict", "effect", "why"], rows).to_text(), ""]
    lines += [
        f"{len(results.seeds)} seed(s) × {budget.steps} steps × {budget.tokens_per_run:,} tokens per run; "
        f"training {duration(budget.train_seconds_total)} in all, "
        f"this invocation {duration(budget.wall_seconds_this_invocation)}",
        claims_line(verdicts, paths["markdown"]),
    ]
    if all(v.outcome in ("not measurable", "not run") for v in verdicts if v.claim.primary):
        lines += ["", *stored_answer(results.preset), ""]
    lines.append("report: " + ", ".join(str(p) for p in paths.values()))
    return "\n".join(lines)


def ladder_summary(ladder: Ladder, paths: dict[str, Path]) -> str:
    """A ladder's last lines: each paper's primary claim judged across the sizes (the answer it was run for), every
    claim counted in one line, and where the report is. The largest rung's own "claims:" line above them judges
    one size, where no primary language-model claim can be decided."""
    verdicts = judge_all(ladder)
    primaries = "; ".join(f"{v.claim.id} {v.outcome}" for v in verdicts if v.claim.primary)
    return "\n".join(
        [
            "",
            f"primaries over {len(ladder.rungs)} sizes (Holm-corrected together): {primaries}",
            claims_line(verdicts, paths["markdown"], f"claims over {len(ladder.rungs)} sizes"),
            "ladder report: " + ", ".join(str(p) for p in paths.values()),
        ]
    )


def claims_line(verdicts: list[Verdict], report: Path, title: str = "claims") -> str:
    """``claims: 2 supported, 1 inconclusive, 7 not measurable, 20 not run — every claim with its reason in ...``"""
    found = counts(verdicts)
    tally = ", ".join(f"{n} {outcome}" for outcome, n in found.items() if n)
    return f"{title}: {tally or 'none'} — every claim with its reason in {report}"


def duration(seconds: float) -> str:
    minutes, seconds = divmod(round(seconds), 60)
    return f"{minutes}m{seconds:02d}s" if minutes else f"{seconds}s"
