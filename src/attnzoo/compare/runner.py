"""``run_compare``: benchmark, train and evaluate every variant × seed, run the tasks, and write the report.

The output directory is the state of the comparison, so a compare resumes by running it again::

    OUT/runs/<variant>/seed<k>/           a training run (see attnzoo.training.trainer), plus
        compare_run.json                  its evaluations, written last: the run is complete
        attention_maps.npy                the first seed's maps on the validation prompt
    OUT/bench.json                        throughput and memory, every variant measured in one sitting
    OUT/tasks/<task>/<variant>/seed<k>/result.json
    OUT/results.json, report.md, report.html, plots/

A run with ``compare_run.json`` is reused; one with a checkpoint short of the last step resumes from it (the
trainer makes exactly the updates of an uninterrupted run); one without a checkpoint starts over. A run
directory that holds a different model or training configuration is refused rather than overwritten.
Runs go seed by seed, every variant within a seed, so a compare stopped early has whole seeds to show.
"""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import shutil
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from itertools import product
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

from attnzoo import __version__
from attnzoo.bench import BenchCase, machine_description, measure
from attnzoo.compare.report import ATTENTION_MAPS, summary_table, write_report
from attnzoo.compare.spec import CompareSpec, TaskSpec, resolve_spec, task_metric
from attnzoo.compare.stats import Difference, Summary, difference
from attnzoo.compare.tasks import context_len, task_configs, train_task
from attnzoo.config import ModelConfig
from attnzoo.data.corpora import Corpus
from attnzoo.evals import LMEvalConfig, length_extrapolation
from attnzoo.io import atomic_write_text
from attnzoo.model import Transformer
from attnzoo.tables import Table
from attnzoo.training.checkpoint import CheckpointError, latest_checkpoint, load_pretrained, read_checkpoint
from attnzoo.training.config import TrainConfig
from attnzoo.training.distributed import Distributed, resolve_device
from attnzoo.training.evaluation import evaluate
from attnzoo.training.metrics import MetricsLog
from attnzoo.training.trainer import METRICS, Trainer, check_resumable, load_corpus
from attnzoo.variants import Variant, count_parameters, matched_configs

RUN_RECORD = "compare_run.json"
BENCH = "bench.json"
RESULTS = "results.json"


@dataclass(frozen=True)
class CompareResult:
    out_dir: Path
    results: dict[str, Any] | None  # None when interrupted before the report
    interrupted_by: int | None  # the signal that stopped a training run, if any


def run_compare(
    preset_or_spec: str | CompareSpec,
    out_dir: str | os.PathLike,
    variants: Sequence[str] | None = None,
    *,
    seeds: Sequence[int] | None = None,
    steps: int | None = None,
    corpus: str | None = None,
    tasks: Sequence[str] | None = None,
    device: str | None = None,
    progress: bool = True,
) -> CompareResult:
    """Compare ``variants`` (default: the preset's) under one budget and write the report into ``out_dir``.

    Running it again with the same arguments reuses every finished run and resumes an interrupted one.
    SIGINT/SIGTERM during training stop after the current step with a checkpoint, and the call returns
    with ``interrupted_by`` set and no report.
    """
    spec = resolve_spec(
        preset_or_spec, variants=variants, seeds=seeds, steps=steps, corpus=corpus, tasks=tasks, device=device
    )
    return Comparison(spec, Path(out_dir), progress).run()


class Comparison:
    """One invocation of a compare: the spec, the output directory and the device it runs on."""

    def __init__(self, spec: CompareSpec, out_dir: Path, progress: bool):
        self.spec, self.out_dir, self.progress = spec, out_dir, progress
        self.labels = spec.variant_labels
        self.baseline = self.labels[0]
        self.env = Distributed(device=resolve_device(spec.train.device))
        self.started = time.perf_counter()
        self.machine_at_start = machine_description(torch.get_num_threads())  # with the load average now
        self.load_at_start = _load_average()

    def say(self, message: str) -> None:
        tqdm.write(message)  # above any progress bar
        sys.stdout.flush()

    def run(self) -> CompareResult:
        spec = self.spec
        self.say(
            f"attnzoo compare ({spec.name}: {spec.description}) → {self.out_dir}\n"
            f"variants {', '.join(self.labels)} (baseline {self.baseline}); seeds {list(spec.seeds)}"
        )
        corpus = load_corpus(spec.train.data, self.env)
        self.extrapolation_tokens(corpus)  # refuse a too-short corpus now, not after the training
        configs = matched_configs(
            [Variant.parse(v) for v in spec.variants], spec.baseline_config(corpus.tokenizer.vocab_size)
        )
        # Every variant's speed and memory in one sitting, back to back, so the ratios share machine conditions.
        bench = self.bench(configs)
        lm_runs: dict[str, dict[int, dict[str, Any]]] = {label: {} for label in self.labels}
        jobs = list(product(spec.seeds, self.labels))
        for i, (seed, label) in enumerate(jobs, start=1):
            self.say(f"\n── [{i}/{len(jobs)}] {label} · seed {seed} · {self._elapsed()} elapsed ──")
            record, interrupted_by = self.lm_run(label, configs[label], seed, corpus)
            if interrupted_by is not None:
                self.say(f"compare interrupted; run the same command again to continue from {self.out_dir}")
                return CompareResult(self.out_dir, None, interrupted_by)
            lm_runs[label][seed] = record
            self.say(progress_table(lm_runs, self.baseline))

        task_results = {task.name: self.task(task) for task in spec.tasks}
        results = self.assemble(configs, corpus, lm_runs, bench, task_results)
        atomic_write_text(self.out_dir / RESULTS, json.dumps(results, indent=2) + "\n")
        paths = write_report(results, self.out_dir)
        self.say(final_summary(results, paths))
        return CompareResult(self.out_dir, results, None)

    def _elapsed(self) -> str:
        return _duration(time.perf_counter() - self.started)

    # ------------------------------------------------------------------------------------ language model

    def lm_run(
        self, label: str, config: ModelConfig, seed: int, corpus: Corpus
    ) -> tuple[dict[str, Any] | None, int | None]:
        """Train (or reuse, or resume) one run and evaluate it: (its record, or the stopping signal)."""
        spec = self.spec
        run_dir = self.out_dir / "runs" / label / f"seed{seed}"
        train_config = dataclasses.replace(spec.train, seed=seed)
        evals = _jsonable({**asdict(spec.evals), "maps": seed == spec.seeds[0]})
        found = latest_checkpoint(run_dir)
        checkpoint = read_checkpoint(found) if found is not None else None
        if checkpoint is not None:
            try:
                check_resumable(checkpoint, config, train_config)
            except CheckpointError as err:
                raise CheckpointError(
                    f"{run_dir} holds a run with another configuration than this compare's: {err}. "
                    "Choose another output directory, or delete that run to retrain it."
                ) from None
        finished = checkpoint is not None and checkpoint.step == train_config.steps
        record = _read_json(run_dir / RUN_RECORD)
        if finished and record is not None and record["evals"] == evals:
            self.say(f"reusing {run_dir} (finished earlier)")
            return record, None
        if checkpoint is None and run_dir.exists():
            shutil.rmtree(run_dir)  # stopped before its first checkpoint: nothing in it can be continued

        if not finished:
            trainer = Trainer(
                config, train_config, corpus, run_dir, env=self.env, resume=checkpoint, progress=self.progress
            )
            result = trainer.fit()
            if result.interrupted_by is not None:
                return None, result.interrupted_by
            model = trainer.raw_model
        else:
            self.say(f"{run_dir} finished training earlier; evaluating it")
            model, _ = load_pretrained(run_dir, self.env.device)
        record = self.evaluate_lm_run(model, label, seed, train_config, corpus, run_dir)
        record["evals"] = evals
        atomic_write_text(run_dir / RUN_RECORD, json.dumps(record, indent=2) + "\n")
        return record, None

    def extrapolation_tokens(self, corpus: Corpus) -> np.ndarray:
        """The start of the validation split that every length is scored on: whole blocks of the longest."""
        evals = self.spec.evals
        longest = max(evals.extrapolation_multiples) * self.spec.train.seq_len
        n_tokens = evals.extrapolation_blocks * longest + 1
        if len(corpus.val) < n_tokens:
            raise ValueError(
                f"the validation split of {corpus.name!r} has {len(corpus.val):,} tokens; length extrapolation "
                f"needs {n_tokens:,} ({evals.extrapolation_blocks} blocks of {longest}): use more text"
            )
        return np.asarray(corpus.val[:n_tokens], dtype=np.int64)

    def evaluate_lm_run(
        self, model: Transformer, label: str, seed: int, train_config: TrainConfig, corpus: Corpus, run_dir: Path
    ) -> dict[str, Any]:
        spec, device = self.spec, self.env.device
        started = time.perf_counter()
        token_bytes = corpus.tokenizer.token_bytes()
        val = evaluate(
            model,
            corpus.val,
            token_bytes,
            seq_len=train_config.seq_len,
            batch_size=train_config.batch_size,
            max_windows=train_config.eval_windows,
            env=self.env,
        )
        stream = self.extrapolation_tokens(corpus)
        lm_config = LMEvalConfig(
            block_len=train_config.seq_len,
            bytes_per_token=float(token_bytes[stream].mean()),
            batch_size=spec.evals.extrapolation_batch_size,
        )
        points = length_extrapolation(
            model, torch.from_numpy(stream).to(device), lm_config, spec.evals.extrapolation_multiples
        )
        if seed == spec.seeds[0]:
            prompt = torch.from_numpy(np.asarray(corpus.val[: spec.evals.map_tokens], dtype=np.int64))[None]
            model.eval()
            maps = model.attention_maps(prompt.to(device))  # each (1, heads, T, T): the effective, mixing map
            np.save(run_dir / ATTENTION_MAPS, torch.stack([m[0] for m in maps]).cpu().numpy())
        metrics = MetricsLog(run_dir / METRICS).read()
        train_records = [r for r in metrics if "train_loss" in r]
        train_seconds = _training_seconds(train_records, train_config.tokens_per_step)
        self.say(
            f"evaluated {label} seed {seed} in {time.perf_counter() - started:.1f} s: val loss {val.loss:.4f}, "
            + ", ".join(f"{p.multiple}×: {p.result.loss:.3f}" if p.result else f"{p.multiple}×: N/A" for p in points)
        )
        return {
            "variant": label,
            "seed": seed,
            "run_dir": str(run_dir.relative_to(self.out_dir)),
            "parameters": model.num_parameters(),
            "steps": train_config.steps,
            "tokens": train_config.steps * train_config.tokens_per_step,
            "train_seconds": train_seconds,
            "train_tokens_per_s": train_config.steps * train_config.tokens_per_step / train_seconds,
            "final_train_loss": train_records[-1]["train_loss"],
            "val": val.to_dict(),
            "extrapolation": [
                {"multiple": p.multiple, "block_len": p.block_len, **asdict(p.result)}
                if p.result is not None
                else {"multiple": p.multiple, "block_len": p.block_len, "unavailable": p.reason}
                for p in points
            ],
            "curve": {
                "train": [[r["step"], r["train_loss"]] for r in train_records],
                "val": [[r["step"], r["val_loss"]] for r in metrics if "val_loss" in r],
            },
        }

    # -------------------------------------------------------------------------------------------- bench

    def bench(self, configs: dict[str, ModelConfig]) -> dict[str, Any]:
        """Every variant's throughput and peak memory, measured in one sitting so the ratios compare like
        with like; reused only if nothing about the measurement has changed."""
        spec, train = self.spec.evals, self.spec.train
        threads = torch.get_num_threads()
        key = _jsonable(
            {
                "configs": {label: configs[label].to_dict() for label in self.labels},
                "cases": [list(case) for case in spec.bench_cases],
                "batch_size": train.batch_size,
                "seq_len": train.seq_len,
                "repeats": spec.bench_repeats,
                "warmup": spec.bench_warmup,
                "threads": threads,
                "device": str(self.env.device),
            }
        )
        stored = _read_json(self.out_dir / BENCH)
        if stored is not None and stored["key"] == key:
            self.say(f"reusing {self.out_dir / BENCH}")
            return stored
        self.say("── throughput and memory of the untrained models, each case in a fresh process ──")
        measurements = []
        for (mode, multiple), label in product(spec.bench_cases, self.labels):
            case = BenchCase(
                label, configs[label], max(1, train.batch_size // multiple), train.seq_len * multiple, mode
            )
            entry = {"variant": label, "mode": mode, "seq_len": case.seq_len, "batch_size": case.batch_size}
            try:
                result = measure(
                    case,
                    repeats=spec.bench_repeats,
                    warmup=spec.bench_warmup,
                    threads=threads,
                    device=str(self.env.device),
                )
            except RuntimeError as err:  # e.g. learned positions past max_seq_len: N/A, with the reason
                entry["unavailable"] = str(err)
            else:
                entry.update(
                    tokens_per_s=result.tokens_per_s,
                    tokens_per_s_min=result.tokens_per_s_min,
                    tokens_per_s_max=result.tokens_per_s_max,
                    peak_mem_mb=result.peak_mem_mb,
                )
            measurements.append(entry)
            shown = f"{entry['tokens_per_s']:,.0f} tok/s" if "tokens_per_s" in entry else "N/A"
            self.say(f"{mode} T={case.seq_len} {label}: {shown}")
        bench = {"key": key, "machine": machine_description(threads), "measurements": measurements}
        atomic_write_text(self.out_dir / BENCH, json.dumps(bench, indent=2) + "\n")
        return bench

    # -------------------------------------------------------------------------------------------- tasks

    def task(self, task: TaskSpec) -> dict[str, Any]:
        configs = task_configs(task, list(self.spec.variants))
        runs: dict[str, dict[int, dict[str, Any]]] = {label: {} for label in self.labels}
        self.say(
            f"\n── task {task.name}: {task.steps} steps × {task.batch_size} samples · {self._elapsed()} elapsed ──"
        )
        for seed, label in product(self.spec.seeds, self.labels):
            path = self.out_dir / "tasks" / task.name / label / f"seed{seed}" / "result.json"
            identity = _jsonable({"task": asdict(task), "model": configs[label].to_dict()})
            stored = _read_json(path)
            if stored is not None:
                if stored["identity"] != identity:
                    raise ValueError(
                        f"{path} was trained with another task or model configuration than this compare's; "
                        "choose another output directory, or delete it to retrain"
                    )
                runs[label][seed] = stored
                continue
            result = train_task(task, configs[label], seed, self.env.device, self.progress, label)
            result.update(identity=identity, parameters=count_parameters(configs[label]))
            atomic_write_text(path, json.dumps(result, indent=2) + "\n")
            runs[label][seed] = result
            self.say(f"{task.name} {label} seed {seed}: {result['metric']} {result['final'][result['metric']]:.4f}")
        metric, higher_is_better = task_metric(task.name)
        finals = {label: Summary.of([r["final"][metric] for r in by_seed.values()]) for label, by_seed in runs.items()}
        return {
            "spec": asdict(task),
            "metric": metric,
            "higher_is_better": higher_is_better,
            "context_len": context_len(task),
            "summary": {label: asdict(summary) for label, summary in finals.items()},
            "versus_baseline": {
                label: _difference_dict(difference(summary, finals[self.baseline]))
                for label, summary in finals.items()
                if label != self.baseline
            },
            "runs": {label: list(by_seed.values()) for label, by_seed in runs.items()},
        }

    # ------------------------------------------------------------------------------------------ results

    def assemble(
        self,
        configs: dict[str, ModelConfig],
        corpus: Corpus,
        lm_runs: dict[str, dict[int, dict[str, Any]]],
        bench: dict[str, Any],
        task_results: dict[str, Any],
    ) -> dict[str, Any]:
        spec, train = self.spec, self.spec.train
        runs = {label: [lm_runs[label][seed] for seed in spec.seeds] for label in self.labels}
        return {
            "attnzoo_version": __version__,
            "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "command": sys.argv,
            "preset": spec.name,
            "spec": spec.to_dict(),
            "baseline": self.baseline,
            "seeds": list(spec.seeds),
            "budget": {
                "steps": train.steps,
                "batch_size": train.batch_size,
                "seq_len": train.seq_len,
                "tokens_per_run": train.steps * train.tokens_per_step,
                "runs": len(spec.seeds) * len(self.labels),
                "train_seconds_total": sum(r["train_seconds"] for by_seed in runs.values() for r in by_seed),
                "wall_seconds_this_invocation": time.perf_counter() - self.started,
            },
            "corpus": {
                "name": corpus.name,
                "tokenizer": corpus.tokenizer.kind,
                "train_tokens": len(corpus.train),
                "val_tokens": len(corpus.val),
            },
            "machine": {
                "description": self.machine_at_start,
                "platform": platform.platform(),
                "python": platform.python_version(),
                "torch": torch.__version__,
                "device": str(self.env.device),
                "cpu_count": os.cpu_count(),
                "torch_threads": torch.get_num_threads(),
                "load_average_start": self.load_at_start,
                "load_average_end": _load_average(),
            },
            "variants": {
                label: {
                    "config": configs[label].to_dict(),
                    "parameters": count_parameters(configs[label]),
                    "runs": runs[label],
                    "summary": summarize_lm(runs[label]),
                }
                for label in self.labels
            },
            "versus_baseline": versus_baseline(runs, self.baseline),
            "bench": bench,
            "tasks": task_results,
        }


# --------------------------------------------------------------------------------------------------- summaries

# Metrics summarised over seeds: (name, how to read it from a run record); all lower-is-better.
LM_METRICS: dict[str, Callable[[dict[str, Any]], float | None]] = {
    "val_loss": lambda r: r["val"]["loss"],
    "val_bits_per_byte": lambda r: r["val"]["bits_per_byte"],
    "val_perplexity": lambda r: r["val"]["perplexity"],
    "final_train_loss": lambda r: r["final_train_loss"],
}


def extrapolation_loss(record: dict[str, Any], multiple: int) -> float | None:
    point = next(p for p in record["extrapolation"] if p["multiple"] == multiple)
    return point.get("loss")


def _metric_values(runs: list[dict[str, Any]]) -> dict[str, list[float]]:
    """Every summarised metric's values over the runs; a metric N/A in any run is left out."""
    values = {name: [read(r) for r in runs] for name, read in LM_METRICS.items()}
    for point in runs[0]["extrapolation"]:
        values[f"loss_at_{point['multiple']}x"] = [extrapolation_loss(r, point["multiple"]) for r in runs]
    return {name: vs for name, vs in values.items() if all(v is not None for v in vs)}


def summarize_lm(runs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {name: asdict(Summary.of(values)) for name, values in _metric_values(runs).items()}


def versus_baseline(runs: dict[str, list[dict[str, Any]]], baseline: str) -> dict[str, dict[str, Any]]:
    """Each variant's difference from the baseline in every metric both have, with the noise verdict."""
    base = {name: Summary.of(values) for name, values in _metric_values(runs[baseline]).items()}
    out = {}
    for label, label_runs in runs.items():
        if label == baseline:
            continue
        ours = {name: Summary.of(values) for name, values in _metric_values(label_runs).items()}
        out[label] = {}
        for name in ours.keys() & base.keys():
            out[label][name] = _difference_dict(difference(ours[name], base[name]))
    return out


def _difference_dict(diff: Difference) -> dict[str, Any]:
    return {**asdict(diff), "within_noise": diff.within_noise, "verdict": diff.verdict}


def progress_table(lm_runs: dict[str, dict[int, dict[str, Any]]], baseline: str) -> str:
    """The terminal table after each run: mean ± std over the seeds finished so far."""
    base_runs = list(lm_runs[baseline].values())
    base = Summary.of([r["val"]["loss"] for r in base_runs]) if base_runs else None
    rows = []
    for label, by_seed in lm_runs.items():
        if not by_seed:
            rows.append([label, "0", "…", "…", "…"])
            continue
        loss = Summary.of([r["val"]["loss"] for r in by_seed.values()])
        bpb = Summary.of([r["val"]["bits_per_byte"] for r in by_seed.values()])
        versus = "baseline" if label == baseline else (difference(loss, base).format(4) if base else "…")
        rows.append([label, str(loss.n), loss.format(4), bpb.format(4), versus])
    return Table(["variant", "seeds", "val loss", "val bits/byte", "Δ loss vs baseline"], rows).to_text()


def final_summary(results: dict[str, Any], paths: dict[str, Path]) -> str:
    budget = results["budget"]
    lines = [
        "",
        summary_table(results).to_text(),
        "",
        f"{len(results['seeds'])} seed(s) × {budget['steps']} steps × {budget['tokens_per_run']:,} tokens per run; "
        f"training {_duration(budget['train_seconds_total'])} in all, "
        f"this invocation {_duration(budget['wall_seconds_this_invocation'])}",
        "report: " + ", ".join(str(p) for p in paths.values()),
    ]
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------------ helpers


def _training_seconds(train_records: list[dict[str, Any]], tokens_per_step: int) -> float:
    """Time spent in training steps, from the throughput logged with each record: evaluation, checkpoints
    and the steps of an interrupted session that a resume redid are not counted."""
    seconds, previous = 0.0, 0
    for record in train_records:
        seconds += (record["step"] - previous) * tokens_per_step / record["tokens_per_s"]
        previous = record["step"]
    return seconds


def _read_json(path: Path) -> Any:
    """The file's JSON, or None if it is missing or damaged: then the work it records is redone."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return None


def _jsonable(value: Any) -> Any:
    """``value`` as it reads back from JSON (tuples become lists), so stored and fresh values compare equal."""
    return json.loads(json.dumps(value))


def _load_average() -> list[float] | None:
    return list(os.getloadavg()) if hasattr(os, "getloadavg") else None


def _duration(seconds: float) -> str:
    minutes, seconds = divmod(round(seconds), 60)
    return f"{minutes}m{seconds:02d}s" if minutes else f"{seconds}s"
