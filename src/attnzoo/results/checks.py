"""Stored numbers checked for what they measure: the one check every way a stored record comes back in passes
through (``compare --report-only``, a comparison resumed, runs merged from elsewhere, a ladder's rung folders).

:func:`attnzoo.records.from_dict` checks each field's type. A field's name says more: a loss is never negative, a
duration or a rate never below zero, an accuracy lies in [0, 1]; a variant's parameters are those its stored model
configuration builds. A file edited by hand, or written by a bug, that breaks one of these is refused naming the
field and the value, rather than rendered into a report whose numbers cannot be (a NaN ended in an AttributeError
from the statistics module; an edited parameter count made a ladder's rung a third size).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from attnzoo.config import ModelConfig
from attnzoo.validation import is_int
from attnzoo.variants import count_parameters

if TYPE_CHECKING:
    from attnzoo.results.comparison import CompareResults


@dataclasses.dataclass(frozen=True)
class Rule:
    """What a field's numbers must satisfy, and the words that say so."""

    holds: Callable[[float], bool]
    allowed: str


AT_LEAST_0 = Rule(lambda v: v >= 0, "must be >= 0")
ABOVE_0 = Rule(lambda v: v > 0, "must be > 0")
AT_LEAST_1 = Rule(lambda v: v >= 1, "must be >= 1")
FRACTION = Rule(lambda v: 0 <= v <= 1, "must be in [0, 1]")
LOSS = Rule(lambda v: v >= 0, "must be >= 0: a cross-entropy or squared error is never negative")

# By field name, wherever it appears in the records (a list's or a dict's items take the rule of the field holding
# them). Names not listed are checked by their type alone.
NAMES_BY_RULE: tuple[tuple[Rule, str], ...] = (
    (LOSS, "loss final_train_loss block_losses val_loss"),
    (FRACTION, "accuracy depths"),
    (ABOVE_0, "train_seconds tokens_per_s tokens_per_s_min tokens_per_s_max rates lr"),
    (AT_LEAST_1, "parameters block_len stride multiple batch_size seq_len runs rounds cores cpu_count torch_threads "
                 "context_len lengths order repeats threads"),
    (AT_LEAST_0, "seed seeds steps tokens bytes kv_cache_bytes_per_token warmup_steps min_lr final_lr tokens_per_run "
                 "train_seconds_total wall_seconds_this_invocation train_tokens val_tokens seconds peak_mem_mb "
                 "load_average round_load_averages load_average_start load_average_end warmup "
                 "probes"),
)  # fmt: skip
RULES: dict[str, Rule] = {name: rule for rule, names in NAMES_BY_RULE for name in names.split()}
# Records that keep what a diverged run measured, NaN or infinite: a synthetic task's runs.
RECORD_DIVERGENCE = frozenset({"TaskRun", "TaskResult", "SweepResult"})
# (step, value) pairs: the step counts from 1, the value is the named loss or a task's metric.
CURVES: dict[str, Rule | None] = {"train_curve": LOSS, "val_curve": LOSS, "history": None}


def check_record(record: Any, source: str) -> None:
    """Raise a ValueError naming the first number of ``record`` (any stored record: a run's, a bench's, a whole
    comparison's) that its field's rule refuses; ``source`` names where it was read."""
    _check(record, source, None, finite=True)


def check_results(results: CompareResults, source: str = "results") -> None:
    """:func:`check_record` on a whole comparison, then its model configurations: each stored one builds (a
    variant's, or one the bench measured), and a variant's parameters, and each of its runs', are the ones its
    configuration builds."""
    check_record(results, source)
    _check_bench_key(results.bench.key, f"{source}.bench.key")
    bench_configs = results.bench.key.get("configs", {})
    if not isinstance(bench_configs, dict):
        raise ValueError(f"{source}.bench.key.configs = {bench_configs!r} is invalid: must map variants to configs")
    configs = {f"variants.{label}.config": variant.config for label, variant in results.variants.items()}
    configs |= {f"bench.key.configs.{label}": config for label, config in bench_configs.items()}
    built = {where: _built(config, f"{source}.{where}") for where, config in configs.items()}
    for label, variant in results.variants.items():
        counted = count_parameters(built[f"variants.{label}.config"])
        stored = {f"variants.{label}.parameters": variant.parameters}
        stored |= {f"variants.{label}.runs[{i}].parameters": run.parameters for i, run in enumerate(variant.runs)}
        for where, parameters in stored.items():
            if parameters != counted:
                raise ValueError(
                    f"{source}.{where} = {parameters!r} is invalid: the stored configuration of {label} builds "
                    f"{counted:,} parameters (a number edited, or another model's)"
                )


def _built(config: dict[str, Any], where: str) -> ModelConfig:
    try:
        return ModelConfig.from_dict(config)
    except (ValueError, TypeError) as err:
        raise ValueError(f"{where} is not a model configuration attnzoo builds: {err}") from None


def _check(value: Any, where: str, rule: Rule | None, finite: bool) -> None:
    """``finite``: a NaN or an infinity is refused too. A task's runs may hold them (a run that diverged is
    recorded, and its claims judged not measurable); a language-model run that diverged stops, and stores none."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        finite = finite and type(value).__name__ not in RECORD_DIVERGENCE
        for f in dataclasses.fields(value):
            inner, name = getattr(value, f.name), f"{where}.{f.name}"
            if f.name in CURVES:
                for i, (step, point) in enumerate(inner):
                    _check(step, f"{name}[{i}] step", AT_LEAST_1, finite)
                    _check(point, f"{name}[{i}] value", CURVES[f.name], finite)
            else:
                _check(inner, name, RULES.get(f.name), finite)
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            _check(item, f"{where}[{i}]", rule, finite)
    elif isinstance(value, dict):
        for key, item in value.items():
            _check(item, f"{where}.{key}", rule, finite)
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        if not math.isfinite(value):
            if finite:
                raise ValueError(f"{where} = {value!r} is invalid: must be a finite number")
        elif rule is not None and not rule.holds(value):
            raise ValueError(f"{where} = {value!r} is invalid: {rule.allowed}")


def _check_bench_key(key: dict[str, Any], where: str) -> None:
    """The bench's key is free-form (what was measured and how), so its counts are checked here by name: a count
    of the wrong type or sign, and cases that are not (mode, multiple ≥ 1) pairs, are refused."""
    for name, value in key.items():
        rule = RULES.get(name)
        if rule is not None and (not is_int(value) or not rule.holds(value)):
            raise ValueError(
                f"{where}.{name} = {value!r} is invalid: must be an integer {rule.allowed.removeprefix('must be ')}"
            )
    for i, case in enumerate(key.get("cases", [])):
        if not (
            isinstance(case, list) and len(case) == 2 and isinstance(case[0], str) and is_int(case[1]) and case[1] >= 1
        ):
            raise ValueError(f"{where}.cases[{i}] = {case!r} is invalid: must be a [mode, multiple >= 1] pair")
