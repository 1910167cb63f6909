"""Calibrate a synthetic task's budget: train variants × seeds under one budget and log every run (issue 23).

    PYTHONPATH=src OMP_NUM_THREADS=1 python benchmarks/calibrate_tasks.py needles \
        --variants mha+rope diff+rope --seeds 0 1 2 --budget steps=1500 --option n_needles=4 --model dim=64

The budget starts from the task's ``--scale`` budget (default: claims); ``--budget``, ``--option`` (the task's
config) and ``--model`` (ModelConfig fields) change it, each ``KEY=VALUE`` with a JSON value. Every run
appends one JSON line to ``--log`` (the budget, the learning curve, the final evaluation, seconds, the load
average) and prints a line; the final table gives per-seed levels beside the task's chance and solved levels.
Runs are sequential, so wall-clock figures mean something only at 1 thread on a quiet machine.

    python benchmarks/calibrate_tasks.py --table     # the log as benchmarks/results/task_calibration.md
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from pathlib import Path
from typing import Any

import torch

from attnzoo.compare.tasks import task_configs, train_task
from attnzoo.config import parse_key_value
from attnzoo.evals.task import TaskSpec, get_task
from attnzoo.io import atomic_write_text
from attnzoo.tables import Table
from attnzoo.variants import Variant

DEFAULT_LOG = Path(__file__).parent / "results" / "task_calibration.jsonl"


def parse_settings(pairs: list[str]) -> dict[str, Any]:
    return dict(parse_key_value(pair) for pair in pairs)


def calibrated_spec(task: str, scale: str, budget: list[str], options: list[str], model: list[str]) -> TaskSpec:
    spec = TaskSpec.at_scale(task, scale)
    changes = parse_settings(budget)
    for name in ("sweep_lengths", "sweep_depths"):
        if name in changes:
            changes[name] = tuple(changes[name])
    changes["options"] = {**spec.budget.options, **parse_settings(options)}
    changes["model"] = {**spec.budget.model, **parse_settings(model)}
    if changes["options"].get("degrees") is not None:
        changes["options"]["degrees"] = tuple(changes["options"]["degrees"])
    return spec.replace(**changes)


def calibration_table(records: list[dict[str, Any]]) -> Table:
    """One row per (task, setting, variant): the final metric of each seed, in the order run."""
    groups: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for record in records:
        groups.setdefault((record["task"], record["tag"], record["variant"]), []).append(record)
    rows = []
    for (task, tag, variant), runs in groups.items():
        metric = get_task(task).metric
        levels = ", ".join(f"{run['final'][metric]:.3f}" for run in runs)
        seconds = ", ".join(f"{run['seconds']:.0f}" for run in runs)
        loads = f"{min(r['load_average'] for r in runs):.1f}–{max(r['load_average'] for r in runs):.1f}"
        task_record = get_task(task)
        config = task_record.config(**runs[0]["budget"]["options"])
        chance = "—" if runs[0]["chance"] is None else f"{runs[0]['chance']:.3f}"
        shortcut = "—" if task_record.shortcut is None else f"{task_record.shortcut(config):.3f}"
        seeds = ", ".join(str(run["seed"]) for run in runs)
        steps = ", ".join(str(run["steps"]) for run in runs)
        rows.append([task, tag, variant, steps, metric, chance, shortcut, seeds, levels, seconds, loads])
    header = ["task", "setting", "variant", "steps", "metric", "chance", "shortcut", "seeds", "final"]
    header += ["seconds", "load"]
    return Table(header, rows)


def write_table(log: Path) -> Path:
    records = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    out = log.with_suffix(".md")
    intro = (
        f"Task calibration runs from `{log.name}` (benchmarks/calibrate_tasks.py), one thread each on the shared "
        "2-core machine: seconds are wall clock under the load average shown, not a quiet machine's. Each "
        "setting's budget is in the log.\n\n"
    )
    atomic_write_text(out, intro + calibration_table(records).to_markdown() + "\n")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("task", nargs="?")
    parser.add_argument("--table", action="store_true", help="write the log as a markdown table and stop")
    parser.add_argument("--variants", nargs="+", default=["mha+rope"])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--scale", default="claims")
    parser.add_argument("--budget", nargs="*", default=[], metavar="KEY=VALUE", help="TaskBudget fields")
    parser.add_argument("--option", nargs="*", default=[], metavar="KEY=VALUE", help="the task's config fields")
    parser.add_argument("--model", nargs="*", default=[], metavar="KEY=VALUE", help="ModelConfig fields")
    parser.add_argument("--tag", default="", help="a label for this setting in the log")
    parser.add_argument("--log", type=Path, default=DEFAULT_LOG)
    args = parser.parse_args(argv)
    if args.table:
        print(write_table(args.log))
        return 0
    if args.task is None:
        parser.error("name a task, or pass --table")

    spec = calibrated_spec(args.task, args.scale, args.budget, args.option, args.model)
    configs = task_configs(spec, Variant.parse_all(args.variants))
    labels = list(configs)
    task = spec.task
    chance = task.chance(spec.config()) if task.chance is not None else None
    shortcut = task.shortcut(spec.config()) if task.shortcut is not None else None
    device = torch.device("cpu")
    print(
        f"{args.task} [{args.tag}] budget {dataclasses.asdict(spec.budget)}; chance {chance}, shortcut {shortcut}, "
        f"solved {task.solved}"
    )
    args.log.parent.mkdir(parents=True, exist_ok=True)
    for label in labels:
        for seed in args.seeds:
            run = train_task(spec, configs[label], seed, device, progress=False, label=label)
            record = {
                "task": args.task,
                "tag": args.tag,
                "variant": label,
                "seed": seed,
                "budget": dataclasses.asdict(spec.budget),
                "parameters": run.parameters,
                "steps": run.steps,
                "seconds": round(run.seconds, 2),
                "load_average": os.getloadavg()[0],
                "threads": torch.get_num_threads(),
                "history": run.history,
                "final": run.final,
                "steps_to_threshold": run.steps_to_threshold,
                "probe": run.probe,
                "chance": chance,
                "shortcut": shortcut,
                "solved": task.solved,
            }
            with args.log.open("a") as log:
                log.write(json.dumps(record) + "\n")
            curve = " ".join(f"{step}:{value:.3f}" for step, value in run.history)
            print(
                f"{label:>32} seed {seed}: {task.metric} {run.final[task.metric]:.4f} "
                f"({run.steps} steps, {run.seconds:.1f} s, load {record['load_average']:.2f}) | {curve}",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
