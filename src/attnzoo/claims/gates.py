"""The validity gates: whether a comparison can show a claim at all, checked before any effect is read.

A language-model claim is judged only at the papers' own protocol (:class:`LanguageModelGate`: a compute-optimal
budget, an end state, a stable gap, models better than a count model); a task's claim only where its baseline
learned the task (:class:`TaskLearned`). Each returns a :class:`Gate`: passed or not, every condition checked
(:class:`GatePart`), the levels reached and, where the claim's default advice is wrong, what would make it pass.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
from scipy import stats

from attnzoo.results import CompareResults
from attnzoo.variants import Variant

if TYPE_CHECKING:
    from attnzoo.claims.claim import Claim

DIVERGED = "a diverged training"  # how a gate's reason ends when a value is NaN or infinite


@dataclass(frozen=True)
class GatePart:
    """One condition of a gate, with the level it was checked at (in words, for the report)."""

    name: str
    passed: bool
    detail: str


@dataclass(frozen=True)
class Gate:
    """Whether a comparison can show the claim at all; ``levels`` are what it reached, for the report."""

    passed: bool
    reason: str
    levels: dict[str, float]
    remedy: str | None = None  # what would make a failed gate pass, where the claim's default advice is wrong
    parts: tuple[GatePart, ...] = ()  # every condition checked, passed or not

    @classmethod
    def of(cls, parts: list[GatePart], levels: dict[str, float], remedies: dict[str, str], summary: str) -> Gate:
        """Passed when every part passed; else the reason is every failed part's detail, the remedy the first's."""
        failed = [part for part in parts if not part.passed]
        if not failed:
            return cls(True, summary, levels, parts=tuple(parts))
        reason = "; ".join(f"{part.name}: {part.detail}" for part in failed)
        return cls(False, reason, levels, remedies.get(failed[0].name), tuple(parts))


@dataclass(frozen=True)
class LanguageModelGate:
    """The papers' own protocol for a language-model comparison: judged only where all of these hold.

    (a) **budget**: every model trained on at least ``min_tokens_per_parameter`` tokens per parameter (an uptrained
        model counts its source's pre-training), read its training split at most ``max_passes`` times, and ended
        at its schedule's floor learning rate, as each run's log recorded the last step's (a file from before runs
        recorded it: every planned step ran);
    (b) **end state**: finite, and no model's validation loss *rose* by ``loss_effect``/2 or more over the last
        quarter (a least-squares line through each seed's curve, the mean over seeds): overfitting stays caught;
    (c) **gap stability**: the mean paired gap ``variant − baseline`` at 75% and at 100% of training differs by
        less than ``loss_effect``/2, with one sign at 50%, 75% and 100% unless all three lie within
        ``loss_effect``/2 of zero, each point scored on at least ``min_windows`` windows or the whole split: a
        model that merely learns faster early is not an end state. Curves that run together change sign by noise,
        not by crossing: without that exception a negligible effect could never pass;
    (d) **competent models**: every seed of every model beats a count-based trigram model (interpolated Kneser–Ney)
        fitted on the same training split and scored on the same validation split (a mean can pass with a seed
        that never learned its context); except the variant of a claim that has it
        at least as good as the baseline on a measure that tracks its loss (:attr:`Claim.favours_variant_on_loss`):
        a variant that did not learn its context where the baseline did is the claim failing, which the verdict
        shows, not a comparison that cannot show it. A model that has not learned its context can lose a
        comparison but never win or tie one.

    A loss still falling is no reason to refuse: no paper trains to a flat loss, and what a falling loss could
    hide (a gap that is still moving) is measured directly by (c). ``loss_effect`` is the smallest validation-loss
    difference of interest in nats (the claim's own for a loss claim).

    ``fixed_budget``: the claim names its own training budget (GQA's uptraining fraction α), so the gap at the end
    of that budget is what is claimed, and one still closing there is the recipe's result, not an unfinished run:
    (c) then asks neither that the gap hold nor that it keep one sign, only that the models not move apart by
    ``loss_effect``/2 or more over the budget's last quarter, as the schedule decays to its floor (an uptraining
    that does not settle, whose gap says where the budget was cut)."""

    loss_effect: float
    fixed_budget: bool = False
    min_tokens_per_parameter: float = 20.0
    max_passes: float = 4.0
    min_windows: int = 1024
    gap_points: tuple[float, ...] = (0.5, 0.75, 1.0)
    window: float = 0.25

    def describe(self) -> str:
        half = f"{self.loss_effect / 2:g}"
        stability = (
            f"(c) the gap read at the end of the budget the claim names, the models not moving apart by {half} nats "
            "over its last quarter"
            if self.fixed_budget
            else f"(c) the gap at 75% and 100% of training within {half} nats, one sign at 50/75/100% unless all "
            "within it of zero"
        )
        return (
            f"(a) ≥ {self.min_tokens_per_parameter:g} tokens per parameter, ≤ {self.max_passes:g} passes, the floor "
            f"learning rate at the last step as logged; (b) no validation loss rose by {half} nats or more over the "
            f"last {self.window:.0%}; {stability}, each on ≥ {self.min_windows:,} windows or the whole split; (d) "
            "every seed of every model below the trigram level"
        )

    def check(self, results: CompareResults, claim: Claim) -> Gate:
        models = list(dict.fromkeys((claim.baseline, claim.variant, *claim.measure.trains)))
        missing = [label for label in models if label not in results.variants]
        if missing:
            return Gate(False, f"{' and '.join(missing)} did not train here", {})
        levels: dict[str, float] = {}
        parts = [
            self._budget(results, models, levels),
            self._end_state(results, models, levels),
            self._gap(results, claim, levels),
            _competent(results, models, levels, claim.variant if claim.favours_variant_on_loss else None),
        ]
        remedies = {
            "(a) budget": "a budget of at least 20 tokens per parameter read at most 4 times (a smaller model, more "
            "tokens, or a larger corpus), trained to the end of its schedule",
            "(b) end state": "a training split larger than a run's tokens, or a schedule under which the validation "
            "loss settles",
            "(c) gap stability": "a longer run at the same size (more tokens per parameter), with evaluations on at "
            "least 1,024 windows at 50, 75 and 100% of training",
            "(d) competent models": "a size and budget at which every model beats the n-gram model (for absolute "
            "positions, a larger model or more tokens)",
        }
        diverged = [p for p in parts if not p.passed and p.detail.endswith(DIVERGED)]
        if diverged:
            return Gate(False, diverged[0].detail, levels, parts=tuple(parts))
        return Gate.of(parts, levels, remedies, self.describe())

    def _budget(self, results: CompareResults, models: list[str], levels: dict[str, float]) -> GatePart:
        problems = []
        for label in models:
            found = results.variants[label]
            run = found.runs[0]
            variant = Variant.parse(label)
            source = results.variants.get(variant.source.label) if variant.uptrain is not None else None
            tokens = run.tokens + (source.runs[0].tokens if source else 0)
            per_parameter, passes = tokens / found.parameters, tokens / results.corpus.train_tokens
            levels[f"{label}: tokens per parameter"] = per_parameter
            levels[f"{label}: passes over the training split"] = passes
            if per_parameter < self.min_tokens_per_parameter:
                problems.append(f"{label} trained on {per_parameter:.1f} tokens per parameter")
            if passes > self.max_passes:
                problems.append(f"{label} read its training split {passes:.1f} times")
            planned = variant.steps(results.budget.steps)
            short = [r.seed for r in found.runs if r.steps < planned]
            if short:
                problems.append(
                    f"{label} stopped before its schedule's floor learning rate (seed(s) {short}: fewer than "
                    f"{planned} steps)"
                )
            floor = results.budget.min_lr * variant.lr  # +lrF scales the whole schedule, its floor too
            above = {r.seed: r.final_lr for r in found.runs if r.final_lr is not None and not _at(r.final_lr, floor)}
            if above:
                problems.append(
                    f"{label} ended at learning rate {max(above.values()):.2g}, not its schedule's floor {floor:.2g} "
                    f"(seed(s) {sorted(above)}, as their logs recorded it)"
                )
        if problems:
            limits = (
                f"the protocol asks ≥ {self.min_tokens_per_parameter:g} tokens per parameter and ≤ "
                f"{self.max_passes:g} passes"
            )
            return GatePart("(a) budget", False, f"{'; '.join(problems)} ({limits})")
        logged = all(run.final_lr is not None for label in models for run in results.variants[label].runs)
        floor = (
            "every run's logged learning rate at its floor"
            if logged
            else "every run to its last planned step (no learning rate logged in these records: the floor is read "
            "off the steps)"
        )
        return GatePart("(a) budget", True, f"{floor}, within the tokens and passes")

    def _end_state(self, results: CompareResults, models: list[str], levels: dict[str, float]) -> GatePart:
        rising = []
        for label in models:
            fall = _last_fall(results.variants[label].runs, self.window)
            if fall is None:
                return GatePart("(b) end state", False, f"{label} logged fewer than two validation points")
            if not math.isfinite(fall) or not all(math.isfinite(r.val.loss) for r in results.variants[label].runs):
                return GatePart("(b) end state", False, f"{label}'s validation loss is non-finite: {DIVERGED}")
            levels[f"{label}: fall over the last {self.window:.0%} (nats)"] = fall
            if -fall >= self.loss_effect / 2:
                rising.append(f"{label} rose {-fall:.3f} nats")
        if rising:
            passes = max(run.tokens for label in models for run in results.variants[label].runs)
            passes /= results.corpus.train_tokens
            why = (
                f"the models overfit a training split they read {passes:.1f} times"
                if passes > 1
                else "within one pass over the training split: the loss passed its minimum before the end"
            )
            return GatePart(
                "(b) end state",
                False,
                f"{' and '.join(rising)} over the last {self.window:.0%} of training (the limit is "
                f"{self.loss_effect / 2:g}): {why}",
            )
        return GatePart("(b) end state", True, f"no validation loss rose by {self.loss_effect / 2:g} nats or more")

    def _gap(self, results: CompareResults, claim: Claim, levels: dict[str, float]) -> GatePart:
        gaps = {}
        for point in self.gap_points:
            gap = _mean_gap(results, claim, point)
            if isinstance(gap, str):
                return GatePart("(c) gap stability", False, gap)
            gaps[point] = gap
            levels[f"gap at {point:.0%} (nats)"] = gap
        shown = ", ".join(f"{gap:+.4f} at {point:.0%}" for point, gap in gaps.items())
        windows = results.spec.get("train", {}).get("eval_windows")
        whole = results.corpus.val_tokens // results.budget.seq_len
        if windows is not None and windows < min(self.min_windows, whole):
            return GatePart(
                "(c) gap stability",
                False,
                f"the gap ({shown}) was scored on {windows:,} windows, fewer than {self.min_windows:,} and than the "
                f"whole split ({whole:,})",
            )
        last, before = gaps[self.gap_points[-1]], gaps[self.gap_points[-2]]
        if self.fixed_budget:
            # A gap closing as the budget ends is the recipe's result, read where the claim reads it; two models
            # moving apart while the schedule decays to its floor are settling on no result, and the gap at the end
            # says where the budget was cut.
            apart = abs(last) - abs(before)
            if apart >= self.loss_effect / 2:
                return GatePart(
                    "(c) gap stability",
                    False,
                    f"the models moved apart by {apart:.4f} nats over the last quarter of the budget the claim names "
                    f"({shown}), against the {self.loss_effect / 2:g} allowed: an uptraining that does not settle",
                )
            return GatePart("(c) gap stability", True, f"read at the end of the budget the claim names ({shown})")
        signs = {math.copysign(1.0, gap) for gap in gaps.values()}
        moved = abs(last - before)
        # Curves that run together (every gap within δ/2 of zero) change sign by noise, not by crossing: that
        # is the stable end state of a negligible effect, which the sign rule would otherwise never let through.
        together = all(abs(gap) < self.loss_effect / 2 for gap in gaps.values())
        if len(signs) > 1 and not together:
            return GatePart("(c) gap stability", False, f"the gap changed sign ({shown}): the curves cross")
        if moved >= self.loss_effect / 2:
            return GatePart(
                "(c) gap stability",
                False,
                f"the gap moved {moved:.4f} nats over the last quarter ({shown}), against the {self.loss_effect / 2:g} "
                "allowed: one model is still catching up",
            )
        if len(signs) > 1:
            return GatePart(
                "(c) gap stability",
                True,
                f"the curves ran together ({shown}: every gap within {self.loss_effect / 2:g} of zero)",
            )
        return GatePart("(c) gap stability", True, f"the gap held ({shown})")


def _mean_gap(results: CompareResults, claim: Claim, fraction: float) -> float | str:
    """The mean over paired seeds of ``variant − baseline`` on the training curves at ``fraction`` of each one's
    planned training. An uptrained variant against a baseline trained from scratch is set against the baseline's
    end, which it continues from; two uptrained models are compared at matched points of their own budgets. A string
    says why it cannot be read."""
    ours, theirs = results.variants[claim.variant], results.variants[claim.baseline]
    variant, baseline = Variant.parse(claim.variant), Variant.parse(claim.baseline)
    planned = variant.steps(results.budget.steps), baseline.steps(results.budget.steps)
    continued = variant.uptrain is not None and baseline.uptrain is None
    gaps = []
    for run in ours.runs:
        base = next((r for r in theirs.runs if r.seed == run.seed), None)
        if base is None:
            continue
        mine = _curve_at(run, fraction, planned[0])
        other = _curve_at(base, 1.0 if continued else fraction, planned[1])
        if mine is None or other is None:
            return f"no evaluation at {fraction:.0%} of training in {claim.variant if mine is None else claim.baseline}"
        gaps.append(mine - other)
    if not gaps:
        return "no seed that both models ran"
    return float(np.mean(gaps))


def _curve_at(run, fraction: float, steps: int) -> float | None:
    step = round(fraction * steps)
    return next((loss for s, loss in run.val_curve if s == step), None)


def _competent(results: CompareResults, models: list[str], levels: dict[str, float], may_fail: str | None) -> GatePart:
    """Every model below the n-gram level, but ``may_fail``, whose failure counts against its claim (the gate's (d))."""
    ngram = results.corpus.ngram
    if ngram is None:
        return GatePart(
            "(d) competent models",
            False,
            "this results file records no n-gram level of its corpus (`attnzoo compare --report-only` adds it)",
        )
    levels[f"{ngram.order}-gram level (nats/token)"] = ngram.val_loss
    count_model = (
        f"a {ngram.order}-gram count model ({ngram.val_loss:.3f}, fitted on {ngram.train_tokens:,} training tokens)"
    )
    worse = {}
    for label in models:
        losses = {run.seed: run.val.loss for run in results.variants[label].runs}
        failed = sorted(seed for seed, loss in losses.items() if not loss < ngram.val_loss)
        mean = float(np.mean(list(losses.values())))
        if len(failed) == len(losses):
            worse[label] = f"{label} {mean:.3f}"
        elif failed:
            worse[label] = f"{label} {mean:.3f} (seed(s) {failed} at up to {max(losses[s] for s in failed):.3f})"
    if worse and list(worse) != [may_fail]:
        return GatePart(
            "(d) competent models",
            False,
            f"{', '.join(worse.values())} nats/token, no better than {count_model}: a model that has not learned to "
            "use its context",
        )
    if worse:
        others = " and ".join(label for label in models if label != may_fail)
        return GatePart(
            "(d) competent models",
            True,
            f"{worse[may_fail]} nats/token, no better than {count_model}, where {others} learned to use the context "
            "in the same budget: a result against the claim, not a comparison that cannot show it",
        )
    return GatePart(
        "(d) competent models",
        True,
        f"every seed of every model below the {ngram.order}-gram level {ngram.val_loss:.3f}",
    )


def _at(lr: float, floor: float) -> bool:
    """A logged learning rate at the schedule's floor, to the float32 the log may have rounded it to."""
    return math.isclose(lr, floor, rel_tol=1e-6)


def _last_fall(runs, window: float) -> float | None:
    """The mean over seeds of each seed's fall, from its own curve (for seeds logged at the same steps, the fall of
    the mean curve); None where a seed logged fewer than two points."""
    falls = [_run_fall(run.val_curve, window) for run in runs]
    return None if not falls or any(f is None for f in falls) else float(np.mean(falls))


def _run_fall(val_curve, window: float) -> float | None:
    steps = [step for step, _ in val_curve]
    if len(steps) < 2:
        return None
    curve = np.asarray([loss for _, loss in val_curve], dtype=np.float64)
    start = steps[-1] - window * steps[-1]
    inside = [i for i, step in enumerate(steps) if step >= start]
    if len(inside) < 2:
        inside = [len(steps) - 2, len(steps) - 1]
    fit = stats.linregress([steps[i] for i in inside], curve[inside])
    return float(-fit.slope * window * steps[-1])


@dataclass(frozen=True)
class TaskLearned:
    """Judged only where the baseline learned the task on at least ``seed_share`` of its seeds (4 of 5, 3 of 3),
    each seed closing at least ``share`` of the gap from chance to the solved level and beating the task's shortcut
    (the score of skipping the step it tests, e.g. answering with a random needle) where the task declares one; and
    no seed of the variant ended at or beyond chance: a model worse than a uniform guess failed to train, and says
    nothing about its mechanism. ``variant_too``, for a claim read off a probe of the mechanism (attention shares)
    rather than the task's metric: the variant must pass the same gate, since a model that did not learn the task
    says nothing about how its mechanism solves it. Per seed, not on the mean: a mean can pass with most seeds below
    the shortcut. The levels also count the seeds that learned it on each side, with Fisher's exact test of the two
    counts (``scipy.stats.fisher_exact``), since a task is often solved or not rather than by degrees."""

    share: float = 0.5
    variant_too: bool = False
    seed_share: float = 0.8

    def describe(self) -> str:
        who = "the baseline and the variant each" if self.variant_too else "the baseline"
        return (
            f"{who} closed ≥ {self.share:.0%} of the gap from chance to solved and beat any shortcut on ≥ "
            f"{self.seed_share:.0%} of its seeds"
        )

    def check(self, results: CompareResults, claim: Claim) -> Gate:
        task = results.tasks[claim.measure.task]  # type: ignore[index]
        if task.chance is None or task.solved is None:
            return Gate(False, f"task {task.name!r} declares no chance and solved levels to gate on", {})
        sign = 1 if task.higher_is_better else -1
        threshold = task.chance + self.share * (task.solved - task.chance)
        if task.shortcut is not None:  # a model on the shortcut has not learned the step the task tests
            threshold = max(threshold, task.shortcut) if sign > 0 else min(threshold, task.shortcut)
        finals = {label: [run.final[task.metric] for run in task.runs[label]] for label in task.runs}
        diverged = [label for label in (claim.baseline, claim.variant) if not np.all(np.isfinite(finals[label]))]
        if diverged:
            return Gate(False, f"{' and '.join(diverged)} ended with a non-finite {task.metric}: {DIVERGED}", {})

        def learned(value: float) -> bool:
            return sign * (value - threshold) >= 0 and value != task.shortcut

        solved = {label: sum(learned(v) for v in finals[label]) for label in (claim.baseline, claim.variant)}
        n = {label: len(finals[label]) for label in solved}
        table = [[solved[label], n[label] - solved[label]] for label in (claim.variant, claim.baseline)]
        levels = {
            f"{claim.baseline} (baseline)": float(np.mean(finals[claim.baseline])),
            f"{claim.variant}": float(np.mean(finals[claim.variant])),
            "chance": task.chance,
            "gate": threshold,
            "solved": task.solved,
            f"{claim.baseline}: seeds past the gate": solved[claim.baseline],
            f"{claim.variant}: seeds past the gate": solved[claim.variant],
            "Fisher's exact p of the counts": float(stats.fisher_exact(table).pvalue),
        }
        if task.shortcut is not None:
            levels["shortcut"] = task.shortcut
        needed = {label: math.ceil(self.seed_share * n[label] - 1e-9) for label in n}
        who = [claim.baseline] + ([claim.variant] if self.variant_too else [])
        for label in who:
            if solved[label] < needed[label]:
                role = "the baseline" if label == claim.baseline else claim.variant
                why = "it did not learn the task" if label == claim.baseline else "a probe of a model that did not"
                return Gate(
                    False,
                    f"{role} reached the gate ({task.metric} {threshold:.3g}; chance {task.chance:.3g}, solved "
                    f"{task.solved:g}) on {solved[label]} of {n[label]} seeds, fewer than {needed[label]}: {why}"
                    + (" learn the task" if label != claim.baseline else ""),
                    levels,
                )
        failed = [run.seed for run in task.runs[claim.variant] if sign * (run.final[task.metric] - task.chance) <= 0]
        if failed:
            return Gate(
                False,
                f"{claim.variant} ended at or beyond chance ({task.chance:.3g}) on seed(s) {failed}: a failed training",
                levels,
            )
        return Gate(True, self.describe(), levels)
