"""The report's verdicts section: one row per registered claim, the implementation checks apart, and the rules.

Every row puts this test's own conditions beside the paper's scale, the levels reached (baseline, variant,
chance), each seed's difference, the effect with its interval, the raw and Holm-adjusted p, the verdict with
its reason, and what was checked, for every verdict alike.
"""

from __future__ import annotations

from attnzoo.claims.checks import run_checks
from attnzoo.claims.claim import NONINFERIOR, Claim
from attnzoo.claims.regime import Regime
from attnzoo.claims.rules import MIN_SEEDS, MIN_SIZE_RATIO, MIN_SIZES, OUTCOMES
from attnzoo.claims.verdict import Verdict
from attnzoo.claims.verdicts import counts, format_p
from attnzoo.document import Bullets, Heading, Paragraph
from attnzoo.results.comparison import CompareResults
from attnzoo.stats import SEEDS_AND_BLOCKS, SEEDS_ONLY
from attnzoo.tables import Table

HOW_A_VERDICT_IS_REACHED = (
    "**How a verdict is reached.** Each claim fixes, before any run, its experiment (a variant against a baseline "
    "under the same seeds and data order), its smallest effect of interest δ with where that number comes from, and "
    "a validity gate; it is measured at every model size the comparison ran, and the largest decides. A claim is "
    "**not run** when no size has its experiment, and **not measurable** when its gate fails at the largest size. "
    "On a task, the gate asks the baseline to close half the gap from chance to solved and beat any shortcut on at "
    "least 4 of 5 seeds (for a probe of the mechanism, the variant too), and no variant seed to end at chance; the "
    "counts of seeds that learned it are compared by Fisher's exact test. On a language model it is the papers' "
    "protocol: (a) at least 20 training tokens per parameter, at most 4 passes over the training split and the "
    "learning rate at its floor at the last step, as each run's log recorded it; (b) no validation loss rising by "
    "δ/2 or more over the last quarter; (c) the paired gap at 75% and 100% of training within δ/2 of each other, "
    "with one sign at 50, 75 and 100% unless all three lie within δ/2 of zero (curves that run together change sign "
    "by noise, not by crossing, and a negligible effect could otherwise never pass), each scored on at least 1,024 "
    "windows or the whole split; a claim that names its own budget (GQA's uptraining fraction α) is exempt from the "
    "gap's holding and its sign, since the gap where that budget ends is what the paper claims and one still closing "
    "there is the recipe's result, but fails (c) when its models move apart by δ/2 or more over the budget's last "
    "quarter (an uptraining that does not settle); (d) every seed of every model below a trigram count model "
    "(interpolated Kneser–Ney) fitted on the same training split, except the variant of a claim that has it at "
    "least as good as the baseline on its loss (a model that has not learned its context can lose a comparison but "
    "never win or tie one); and for a paper's primary claim, (e) at least "
    "two sizes, the largest at least 2× the smallest. A claim stated as a compute multiple (DCFormer's 1.7–2×, "
    "Diff's 65% of size or tokens) is judged in that unit, in log-compute, read off MHA's loss against training "
    "compute fitted across the sizes. The paired difference (variant − baseline) gets an interval that counts "
    "the seeds and, for the validation loss and the extrapolation rise, the sampling of the text (blocks crossed "
    "with seeds, never more degrees of freedom than seeds − 1). It is **supported** or **contradicted** when its "
    "90% interval lies beyond ±δ on the claimed or the opposite side (the one-sided minimum-effect test at 5%), "
    "with the five primaries, one per paper, always Holm-corrected together (a primary not judged enters with "
    "p = 1) and every other claim labelled exploratory; **negligible** when the 90% interval lies inside ±δ; "
    "**scale-dependent** when two sizes each decide it, in opposite directions; **LR-sensitive**, where a "
    "learning-rate sweep ran (the claims-lr preset), when a verdict at the largest size differs between the shared "
    "learning rate and each model at its own best one; on one rung of a ladder, a "
    "primary language-model claim is **decided in the ladder**, the rung's report pointing to the ladder's; "
    "**inconclusive** otherwise (a "
    f"difference shown nonzero but not beyond δ included), or with fewer than {MIN_SEEDS} seeds. A non-inferiority "
    "claim is supported when the 90% interval's upper end lies below its margin and contradicted when its lower end "
    "lies above it (Holm-adjusted alike for a primary). A claim whose statement has several "
    "parts (a spikier map with a smaller norm; the same perplexity, 11% faster and with 11% less memory) measures "
    "each, every part decided on its own at the raw 5% level, and holds only as a whole: contradicted when any part "
    "is, else negligible when any part is, supported when every part is, else its first undecided part's verdict; a "
    "bench part (speed, memory) has no seeds and is decided in ln of the ratio, on the range of its timed repeats "
    "(speed) or one peak each (memory), beyond ±δ; a primary of several parts enters Holm's family with the largest "
    "of its parts' p. Implementation checks (the KV cache's size) are arithmetic and never count as a paper's "
    "support."
)


def _number(value: float) -> str:
    return f"{value:.4g}"


def _effect(verdict: Verdict) -> str:
    d = verdict.difference
    if d is None:
        return "—"
    return effect_words(d.mean, verdict.interval) + (" (seeds × blocks)" if d.blocks > 1 else "")


def _levels(verdict: Verdict) -> str:
    shown = [f"{name} {_number(value)}" for name, value in verdict.levels.items()]
    for i, part in enumerate(verdict.parts, 2):  # part 1 is the claim's own measure
        own = {name: value for name, value in part.levels.items() if name not in verdict.levels}
        shown += [f"({i}) {name} {_number(value)}" for name, value in own.items()]
    return "; ".join(shown) or "—"


def _gate(verdict: Verdict) -> str:
    gate = verdict.gate
    if gate is None:
        return "—"
    if not gate.parts:
        return ("passed: " if gate.passed else "failed: ") + gate.reason
    return "; ".join(f"{part.name} {'passed' if part.passed else 'FAILED'}: {part.detail}" for part in gate.parts)


def _sizes(verdict: Verdict) -> str:
    return "; ".join(size.describe() for size in verdict.sizes) or "—"


def _test_cell(verdict: Verdict) -> str:
    claim = verdict.claim
    rule = {
        "lower": "claimed lower",
        "higher": "claimed higher",
        NONINFERIOR: f"claimed no worse by more than {claim.smallest_effect:g}",
    }[claim.rule]
    own = f"`{claim.variant}` − `{claim.baseline}`: {claim.measure.label}, {rule}"
    if not claim.parts:
        return own
    parts = [own, *(part.describe(claim.variant, claim.baseline) for part in claim.parts)]
    return "every part: " + " ".join(f"({i}) {part}." for i, part in enumerate(parts, 1))


def _effect_cell(claim: Claim) -> str:
    own = f"{claim.smallest_effect:g}: {claim.smallest_effect_source}"
    if not claim.parts:
        return own
    parts = [own, *(f"{part.smallest_effect:.3g}: {part.smallest_effect_source}" for part in claim.parts)]
    return " ".join(f"({i}) {part}." for i, part in enumerate(parts, 1))


def measured_at(verdict: Verdict, brief: bool = False) -> str:
    """Where the verdict was measured: a language-model claim's regime read off its runs, a task's own scale."""
    if verdict.regime is not None:
        return verdict.regime.brief() if brief else verdict.regime.describe()
    return verdict.conditions or "—"


# A primary's answer in words that carry their scope: what was and was not reproduced, and where.
_SCOPED = {
    "supported": "reproduced at {scope}",
    "contradicted": "not reproduced at {scope}: the effect goes the other way",
    "negligible": "no effect beyond the smallest of interest at {scope}",
    "scale-dependent": "goes opposite ways at different sizes within {scope}",
    "LR-sensitive": "undecided at {scope}: the answer changes with each model's own best learning rate",
    "inconclusive": "undecided at {scope}",
}


def scoped_answer(verdict: Verdict) -> str:
    """A verdict in scoped words for a README or a summary ("not reproduced at 0.12–0.25M parameters, heads ≤ 24"
    rather than "contradicted"), naming a confound of head size with model size where the sizes carry one."""
    return scoped_words(verdict.outcome, verdict.regime)


def scoped_words(outcome: str, regime: Regime | None) -> str:
    """:func:`scoped_answer` of an outcome measured in ``regime`` (a stored verdict's, read back)."""
    template = _SCOPED.get(outcome)
    if template is None or regime is None:
        ladder = "decided across the ladder's sizes, in its report"
        return ladder if outcome == "decided in the ladder" else f"{outcome} here"
    answer = template.format(scope=regime.scope)
    confound = " (head size grows with model size there: the two confounded)"
    return answer + (confound if regime.confounded else "")


def answer_words(outcome: str, regime: Regime | None, would_change: str) -> str:
    """The scoped answer, and for a claim that was not decided for want of its runs or its protocol, what would."""
    words = scoped_words(outcome, regime)
    undecided = outcome in ("not measurable", "not run") and would_change
    return f"{words}: it would take {would_change}" if undecided else words


def effect_words(effect: float | None, interval: tuple[float, float] | None) -> str:
    """The effect with the 90% interval it was decided on: ``-0.5422 [-0.6586, -0.4258]``."""
    if effect is None:
        return "—"
    return f"{effect:+.4g}" + (f" [{interval[0]:+.4g}, {interval[1]:+.4g}]" if interval else " (no interval)")


def primaries(verdicts: list[Verdict]) -> list[Verdict]:
    return [v for v in verdicts if v.claim.primary]


def answer_table(verdicts: list[Verdict]) -> Table:
    """The primaries, one per paper: the verdict, the effect with the 90% interval it was decided on, the answer in
    words that carry their scope, and the regime it was measured in."""
    rows = [
        [
            v.claim.paper,
            f"`{v.claim.id}`: `{v.claim.variant}` − `{v.claim.baseline}`, {v.claim.measure.label}",
            f"**{v.outcome}**",
            _effect(v),
            answer_words(v.outcome, v.regime, v.would_change),
            measured_at(v, brief=True),
        ]
        for v in primaries(verdicts)
    ]
    header = ["paper", "primary claim: what was measured", "verdict", "effect [90% interval]", "in words"]
    return Table([*header, "measured at"], rows)


def answer_section(verdicts: list[Verdict]) -> list:
    """The report's opening: the answer before anything it rests on."""
    undecided = all(v.outcome in ("not measurable", "not run") for v in primaries(verdicts))
    return [
        Heading(2, "The answer"),
        Paragraph(
            f"Each paper's primary claim ({len(primaries(verdicts))}, corrected together for multiplicity by Holm's "
            "procedure): what this run found, and where. A verdict holds at the sizes it was measured at (its last "
            "column), never at the paper's scale; the claims section below gives every claim in full and how a "
            "verdict is reached."
            + (
                f" This run decides none of them: a primary is judged across at least {MIN_SIZES} model sizes "
                f"{MIN_SIZE_RATIO:g}× apart, as the claims ladder (`attnzoo compare --preset claims`) trains them."
                if undecided
                else ""
            )
        ),
        answer_table(verdicts),
    ]


def shared_checks(verdicts: list[Verdict]) -> tuple[str, ...]:
    """The checks every claim that lists any shares: stated once, above the table."""
    lists = [v.claim.checks for v in verdicts if v.claim.checks]
    return tuple(c for c in lists[0] if all(c in other for other in lists[1:])) if lists else ()


def verdict_table(verdicts: list[Verdict]) -> Table:
    """The papers' claims and this run's verdict on each: one row a claim."""
    shared = shared_checks(verdicts)
    rows = []
    for v in verdicts:
        d = v.difference
        own = [c for c in v.claim.checks if c not in shared]
        checks = [f"gate: {v.claim.gate.describe()}", *(["the shared setup checks"] if v.claim.checks else []), *own]
        rows.append(
            [
                f"{v.claim.paper}: `{v.claim.id}` ({v.role})",
                f"{v.claim.statement} Source: {v.claim.source}.",
                _test_cell(v),
                _effect_cell(v.claim),
                f"**{v.outcome}**: {v.reason}",
                _gate(v),
                _sizes(v),
                v.conditions or "—",
                measured_at(v),
                v.claim.paper_regime or v.claim.paper_scale or "—",
                _levels(v),
                ", ".join(f"{x:+.4g}" for x in d.per_seed) if d else "—",
                _effect(v),
                f"{format_p(v.p_raw)} / {format_p(v.p_adjusted) if v.claim.primary else 'exploratory'}",
                "; ".join(checks),
                v.would_change or "—",
            ]
        )
    header = [
        "paper: claim",
        "what the paper says",
        "the test",
        "smallest effect of interest",
        "verdict",
        "gate at the deciding size",
        "each size",
        "this test",
        "measured at",
        "the paper's regime",
        "levels reached (mean over seeds)",
        "per-seed differences",
        "effect [90% interval, as decided]",
        "p raw / Holm",
        "checks",
        "what would change it",
    ]
    return Table(header, rows)


def summary_lines(results: CompareResults, verdicts: list[Verdict]) -> list[str]:
    primaries = [v for v in verdicts if v.claim.primary]

    def tally(vs: list[Verdict]) -> str:
        found = counts(vs)
        return ", ".join(f"{found[o]} {o}" for o in OUTCOMES if found[o])

    blocks = all(run.val.block_losses is not None for variant in results.variants.values() for run in variant.runs)
    lines = [
        f"Primary claims ({len(primaries)}, one per paper, Holm-corrected together): {tally(primaries) or 'none'}.",
        f"All {len(verdicts)} claims: {tally(verdicts)}.",
        f"Intervals: {SEEDS_ONLY}; for the validation loss, "
        + (SEEDS_AND_BLOCKS if blocks else "seeds only, since this run stored no per-block validation losses")
        + f". This run has {len(results.seeds)} seed(s).",
        f"Scale: {results.budget.tokens_per_run:,} tokens per language-model run, models of about "
        f"{results.variants[results.baseline].parameters / 1e6:.2f}M parameters; a verdict says what holds at this "
        "test's conditions (its column), never at the paper's.",
    ]
    return lines


def checks_table(results: CompareResults) -> Table | None:
    rows = [[c.name, c.expected, c.measured, f"**{c.status}**"] for c in run_checks(results)]
    return Table(["implementation check", "expected", "measured", "result"], rows) if rows else None


def claims_section(results: CompareResults, verdicts: list[Verdict]) -> list:
    blocks: list = [
        Heading(2, "The papers' claims"),
        Bullets(summary_lines(results, verdicts)),
        brief_table(verdicts),
        Paragraph(HOW_A_VERDICT_IS_REACHED),
    ]
    shared = shared_checks(verdicts)
    if shared:
        listed = "; ".join(shared)
        blocks.append(Paragraph(f"**The shared setup checks**, made for every claim that lists them: {listed}."))
    blocks += [
        Heading(3, "Every claim in full"),
        Paragraph(
            "What the paper says and where, the test and its smallest effect of interest, this test's conditions "
            "beside the paper's scale, the levels reached, each seed's difference, and the checks made."
        ),
        verdict_table(verdicts),
    ]
    checks = checks_table(results)
    if checks is not None:
        blocks += [
            Heading(3, "Implementation checks"),
            Paragraph("Exact properties of the code: arithmetic on the configuration, never evidence for a paper."),
            checks,
        ]
    return blocks


def brief_table(verdicts: list[Verdict]) -> Table:
    """One short row a claim, for the README: the verdict, the effect with its interval, and the p-values."""
    rows = [
        [
            f"`{v.claim.id}` ({v.role})",
            f"**{v.outcome}**",
            measured_at(v, brief=True),
            _effect(v),
            f"{format_p(v.p_raw)} / {format_p(v.p_adjusted) if v.claim.primary else '—'}",
            v.reason,
        ]
        for v in verdicts
    ]
    header = ["claim", "verdict", "measured at", "effect [90% interval, as decided]", "p raw / Holm", "why"]
    return Table(header, rows)
