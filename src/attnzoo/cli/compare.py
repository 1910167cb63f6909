"""``attnzoo compare``: the flags of :func:`attnzoo.compare.run_compare`."""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
from pathlib import Path
from typing import Any

from attnzoo.cli.command import check_out_dir, path_argument
from attnzoo.compare import DEFAULT_VARIANTS, PRESETS, resolve_spec, run_compare
from attnzoo.compare.executors import EXECUTORS, ExecutorConfig
from attnzoo.compare.presets import LADDERS
from attnzoo.evals import TASKS
from attnzoo.training.config import read_toml
from attnzoo.validation import MAX_COUNT, is_count
from attnzoo.variants import SPEC_FORMAT


def _variant_list(values: list[str]) -> list[str]:
    """``a b`` and ``a,b`` alike."""
    return [spec for value in values for spec in value.split(",") if spec]


# The keys of a --config file's [compare] table: the flags' names, and the types their values must have.
CONFIG_KEYS: dict[str, type] = {
    "preset": str,
    "out": str,
    "variants": list,
    "seeds": int,
    "steps": int,
    "data": str,
    "tasks": list,
    "device": str,
    "no_progress": bool,
    "executor": str,
    "jobs": int,
}


def load_compare_config(path: str | os.PathLike) -> dict[str, Any]:
    """The ``[compare]`` table of a TOML file, its keys the flags' names (``no_progress`` for --no-progress), and
    under ``executor_options`` its ``[executor]`` table: the engine's own options, passed through."""
    document = read_toml(path)
    tables = {"compare", "executor"}
    if set(document) - tables or not all(isinstance(document.get(name, {}), dict) for name in tables):
        raise ValueError(
            f"config file {path} must hold a [compare] table and optionally an [executor] table; it has "
            f"{sorted(document)}"
        )
    table = document.get("compare", {})
    unknown = sorted(set(table) - set(CONFIG_KEYS))
    if unknown:
        raise ValueError(f"config file {path}: unknown key(s) {unknown} in [compare]; allowed: {list(CONFIG_KEYS)}")
    for key, value in table.items():
        expected = CONFIG_KEYS[key]
        if not isinstance(value, expected) or (expected is int and isinstance(value, bool)):
            raise ValueError(f"config file {path}: [compare] {key} = {value!r} must be a {expected.__name__}")
        if expected is list and not all(isinstance(item, str) for item in value):
            raise ValueError(f"config file {path}: [compare] {key} must be a list of strings")
    if table.get("variants") == []:
        raise ValueError(f"config file {path}: [compare] variants = [] names no variant: name at least one")
    if table.get("out") == "":  # pathlib's current directory: the whole compare would land there
        raise ValueError(f'config file {path}: [compare] out = "" is empty: name a directory (".", for this one)')
    for key in ("seeds", "steps"):
        if key in table:
            check_count(f"config file {path}: [compare] {key} = ", table[key], key)
    return dict(table) | ({"executor_options": document["executor"]} if "executor" in document else {})


# Each seed trains every variant once: beyond this a comparison is a typo, not a plan.
MAX_SEEDS = 1000


def check_count(given_as: str, value: int, key: str) -> None:
    """``seeds`` or ``steps``, a flag's (``given_as`` "--seeds=") or the config file's."""
    if key == "seeds" and not 1 <= value <= MAX_SEEDS:
        raise ValueError(
            f"{given_as}{value} is invalid: must be an integer in [1, {MAX_SEEDS}] (each seed trains every variant; "
            ">= 2 for any ranking)"
        )
    if key == "steps" and not is_count(value):
        raise ValueError(f"{given_as}{value} is invalid: must be an integer in [1, {MAX_COUNT}]")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    presets = "; ".join(f"{name}: {spec.description}" for name, spec in (PRESETS | LADDERS).items())
    presets = presets.replace("%", "%%")  # argparse formats help text with %
    parser.add_argument(
        "--config",
        type=path_argument,
        metavar="FILE.toml",
        help="TOML file with a [compare] table whose keys are these flags' names (e.g. examples/compare.toml); "
        "flags given as well win",
    )
    parser.add_argument("--preset", choices=[*PRESETS, *LADDERS], help=f"the budget (default: quick). {presets}")
    parser.add_argument(
        "--out",
        metavar="DIR",
        type=path_argument,
        help="output directory; run again to resume (default: runs/compare-PRESET)",
    )
    parser.add_argument(
        "--variants",
        nargs="+",
        metavar="SPEC",
        help=f"variants to compare, the first the baseline; each {SPEC_FORMAT} (default: {' '.join(DEFAULT_VARIANTS)})",
    )
    parser.add_argument(
        "--seeds", type=int, metavar="N", help="train each variant with seeds 0..N-1 (default: the preset's)"
    )
    parser.add_argument(
        "--steps",
        type=int,
        metavar="N",
        help="training steps per run (default: the preset's); warmup, evaluations and checkpoints keep their share",
    )
    parser.add_argument(
        "--data",
        metavar="CORPUS",
        help="'shakespeare' (default), 'pystdlib', 'pysource', or a path to a text file or directory",
    )
    parser.add_argument(
        "--tasks",
        nargs="*",
        metavar="TASK",
        help=f"synthetic tasks to train from scratch, from {sorted(TASKS)}; none if the flag is given alone "
        "(default: the preset's)",
    )
    parser.add_argument("--device", help="auto, cpu, cuda or cuda:N (default: auto)")
    parser.add_argument(
        "--executor",
        choices=EXECUTORS,
        help="where the runs train: inline in this process, one after another (default, the reference); local "
        "processes (one per GPU, or --jobs); slurm through submitit; or a ray cluster. Engine options (partition, "
        "time limit, GPUs per run, Ray address) go in the --config file's [executor] table",
    )
    parser.add_argument(
        "--merge-from",
        nargs="+",
        metavar="DIR",
        type=path_argument,
        help="first copy the finished runs of these compare directories (the same comparison, run on other "
        "machines, executors or leases) into --out, under its lock and once every run is checked (a run of another "
        "comparison, unfinished, without provenance or holding numbers no run can have is refused by name); the "
        "compare then trains only what is still missing",
    )
    parser.add_argument(
        "--pool-commits",
        action="store_true",
        help="pool runs trained by different commits of attnzoo (merged from other machines or leases); refused "
        "otherwise, and the report lists each run's commit either way",
    )
    parser.add_argument(
        "--jobs", type=int, metavar="N", help="--executor local: runs at once (default: one per GPU, else per core)"
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bars (status lines still print)")
    parser.add_argument(
        "--claims",
        action="store_true",
        help="end with every claim's verdict, effect and reason as well (always in report.md); by default the last "
        "screen counts them in one line",
    )
    parser.add_argument(
        "--report-only",
        action="store_true",
        help="train nothing: redraw the report and verdicts.json of --out from its results.json, by this version's "
        "rules",
    )


def _with_config(args: argparse.Namespace) -> argparse.Namespace:
    """The flags, each not given taken from the --config file's [compare] table, then the defaults."""
    file = load_compare_config(args.config) if args.config is not None else {}
    merged = dict(vars(args))
    for key, value in file.items():
        if key == "no_progress":
            merged[key] = args.no_progress or value
        elif merged.get(key) is None:
            merged[key] = Path(value) if key == "out" else value
    if merged["preset"] is None:
        merged["preset"] = "quick"
    elif merged["preset"] not in PRESETS | LADDERS:
        raise ValueError(f"preset={merged['preset']!r} in {args.config} is not one of {[*PRESETS, *LADDERS]}")
    return argparse.Namespace(**merged)


def default_out(args: argparse.Namespace) -> Path:
    """``runs/compare-PRESET``, with a digest of what else was asked for, so another comparison never lands in
    (and is never refused by) the preset's own directory."""
    changes = {key: getattr(args, key) for key in ("variants", "seeds", "steps", "data", "tasks")}
    asked = {key: value for key, value in changes.items() if value is not None}
    if not asked:
        return Path("runs") / f"compare-{args.preset}"
    digest = hashlib.sha256(json.dumps(asked, sort_keys=True, default=str).encode()).hexdigest()[:8]
    return Path("runs") / f"compare-{args.preset}-{digest}"


# What --report-only leaves as stored: each would change only a run it does not train. Without --out, the first
# six name the folder it redraws (default_out).
TRAINING_FLAGS = (
    *("preset", "variants", "seeds", "steps", "data", "tasks"),
    *("device", "executor", "jobs", "merge_from", "pool_commits"),
)
NAMING_FLAGS = TRAINING_FLAGS[:6]


def run(args: argparse.Namespace) -> int:
    given = [key for key in TRAINING_FLAGS if getattr(args, key) not in (None, False)]
    args = _with_config(args)
    check_out_dir(args.out)
    if args.report_only:
        out = args.out or default_out(args)
        ignored = [f"--{key.replace('_', '-')}" for key in given if args.out is not None or key not in NAMING_FLAGS]
        if ignored:
            raise ValueError(
                f"--report-only redraws the report of {out} from its results.json and trains nothing: "
                f"{', '.join(ignored)} would change nothing there; leave {'it' if len(ignored) == 1 else 'them'} out"
            )
        return _report_only(out, args.claims)
    if args.preset in LADDERS:
        return _ladder(args)
    for key in ("seeds", "steps"):
        if getattr(args, key) is not None:
            check_count(f"--{key}=", getattr(args, key), key)
    spec = resolve_spec(
        args.preset,
        variants=_variant_list(args.variants) if args.variants else None,
        seeds=range(args.seeds) if args.seeds is not None else None,
        steps=args.steps,
        corpus=args.data,
        tasks=args.tasks,
        device=args.device,
    )
    result = run_compare(
        spec,
        args.out or default_out(args),
        executor=_executor(args),
        pool_commits=args.pool_commits,
        merge_from=args.merge_from or (),
        progress=not args.no_progress,
        claims_table=args.claims,
    )
    # As `attnzoo train` does: a stop by signal is 128 + its number, so scripts can tell it from completion.
    return 128 + result.interrupted_by if result.interrupted_by is not None else 0


def _ladder(args: argparse.Namespace) -> int:
    """A ladder's rungs fix their own variants, seeds, steps and data: one protocol across the sizes."""
    from attnzoo.compare.runner import run_ladder

    fixed = [f"--{key}" for key in ("variants", "seeds", "steps", "data", "tasks") if getattr(args, key) is not None]
    if fixed:
        raise ValueError(
            f"--preset {args.preset} is a ladder whose sizes share one protocol: {', '.join(fixed)} would break it; "
            "leave them out"
        )
    result = run_ladder(
        args.preset,
        args.out or default_out(args),
        progress=not args.no_progress,
        executor=_executor(args),
        pool_commits=args.pool_commits,
        merge_from=args.merge_from or (),
    )
    return 128 + result.interrupted_by if result.interrupted_by is not None else 0


def _executor(args: argparse.Namespace) -> ExecutorConfig:
    name = "inline" if args.executor is None else args.executor  # "" from a config file is refused, not inline
    if args.jobs is not None and name != "local":
        raise ValueError(f"--jobs={args.jobs} counts local processes: it needs --executor local, not {name}")
    options = getattr(args, "executor_options", None) or {}
    if options and name == "inline":
        raise ValueError(
            f"the config file's [executor] table {options} configures an engine, and the runs train inline: name "
            "the engine with --executor local, slurm or ray (or executor = ... in [compare])"
        )
    return ExecutorConfig(name, args.jobs, options)


def _report_only(out: Path, claims_table: bool) -> int:
    from attnzoo.compare.progress import final_summary
    from attnzoo.compare.report import write_report

    results_file = out / "results.json"
    if not results_file.exists() and any(out.glob("*/results.json")):
        return _ladder_report_only(out)
    counted = _with_ngram_level(results_file)
    paths = write_report(counted, out)
    print(final_summary(counted, paths, claims_table).lstrip("\n"))
    return 0


def _ladder_report_only(out: Path) -> int:
    """A folder of rungs, each a comparison in its own subfolder: the ladder's report, judged across them."""
    from attnzoo.compare.progress import ladder_summary
    from attnzoo.compare.report_ladder import write_ladder_report
    from attnzoo.results.ladder import load_ladder

    for results_file in sorted(out.glob("*/results.json")):
        _with_ngram_level(results_file)  # each checked as a comparison's own --report-only checks it
    ladder, dirs = load_ladder(out)
    paths = write_ladder_report(ladder, dirs, out)
    print(ladder_summary(ladder, paths).lstrip("\n"))
    return 0


def _with_ngram_level(results_file: Path):
    """The stored results, checked; a file written before the corpus's n-gram level was kept gains it, once, where
    the corpus can still be read (else the competent-model gate says the level is missing, and this says why)."""
    from attnzoo.compare.assemble import with_ngram_level
    from attnzoo.compare.stored import load_results
    from attnzoo.data.corpora import CorpusError

    results = load_results(results_file)
    try:
        counted = with_ngram_level(results)
    except (ValueError, OSError, CorpusError) as err:
        print(f"{results_file}: no n-gram level recorded, and none counted: {err}", file=sys.stderr)
        return results
    if counted is not results:
        counted.save(results_file)
    return counted
