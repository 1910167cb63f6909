"""Training a model from scratch on a synthetic task, and scoring it, for one variant × seed.

The loop is the language-model trainer's optimisation (AdamW with decay on matrices, warmup + cosine, the
same clipping) over fresh batches from ``TASKS[name].make_batch`` each step: a fixed training set is
memorised at these sizes (eval_protocols.md §8, item 3). The batches come from a generator seeded by the
run's seed alone, so every variant trained with seed k sees the same batches. Evaluation uses one fixed
set (:data:`EVAL_SEED`) for every variant and seed, every ``eval_interval`` steps, which gives MQAR's
steps-to-99% and the task's learning curve.
"""

from __future__ import annotations

import math
import time
from dataclasses import replace
from typing import Any

import torch
from tqdm import tqdm

from attnzoo.compare.spec import TaskSpec, task_metric
from attnzoo.config import ModelConfig
from attnzoo.evals import (
    TASKS,
    LengthDepthSweep,
    attention_noise_probe,
    needles_batch,
    needles_sweep,
    passkey_sweep,
    steps_to_threshold,
)
from attnzoo.model import Transformer
from attnzoo.training.config import TrainConfig
from attnzoo.training.optim import build_optimizer, learning_rate
from attnzoo.training.trainer import derive_seed
from attnzoo.variants import Variant, matched_configs

EVAL_SEED = 0  # the fixed evaluation set; training streams come from derive_seed and never coincide with it
TASK_DATA_STREAM = 2  # tags the task-batch stream of a seed, apart from the trainer's streams
SWEEPS = {"passkey": passkey_sweep, "needles": needles_sweep}


def context_len(task: TaskSpec) -> int:
    """Tokens the model reads per sample, whatever the task calls it."""
    return TASKS[task.name].make_batch(task.config(), 1, EVAL_SEED).inputs.shape[1]


def task_configs(task: TaskSpec, variants: list[str]) -> dict[str, ModelConfig]:
    """Parameter-matched models for the task, keyed by variant label; the task's length is the model's."""
    baseline = ModelConfig.from_dict(
        {**task.model, "vocab_size": TASKS[task.name].vocab_size(task.config()), "max_seq_len": context_len(task)}
    )
    return matched_configs([Variant.parse(v) for v in variants], baseline)


def _optimisation(task: TaskSpec, seed: int) -> TrainConfig:
    """The task's budget as a TrainConfig, so the trainer's optimizer and schedule apply unchanged."""
    return TrainConfig(
        steps=task.steps,
        batch_size=task.batch_size,
        seq_len=context_len(task),
        lr=task.lr,
        warmup_steps=task.warmup_steps,
        seed=seed,
    )


def train_task(
    task: TaskSpec, model_config: ModelConfig, seed: int, device: torch.device, progress: bool, label: str
) -> dict[str, Any]:
    """Train, evaluate along the way, and score the final model; the result is a JSON-ready dict."""
    cfg, spec = task.config(), TASKS[task.name]
    metric, higher_is_better = task_metric(task.name)
    optimisation = _optimisation(task, seed)
    torch.manual_seed(seed)
    model = Transformer(model_config).to(device)
    optimizer = build_optimizer(model, optimisation)
    generator = torch.Generator().manual_seed(derive_seed(seed, TASK_DATA_STREAM))

    def evaluate() -> dict[str, float]:
        return spec.evaluate(model, cfg, n_samples=task.eval_samples, seed=EVAL_SEED)

    started = time.perf_counter()
    history: list[tuple[int, float]] = []
    step, loss_value, last_eval = 0, math.nan, {}
    bar = tqdm(total=task.steps, desc=f"{task.name} {label} seed {seed}", unit="step", disable=not progress)
    with bar:
        while step < task.steps:
            for group in optimizer.param_groups:
                group["lr"] = learning_rate(step, optimisation)
            batch = spec.make_batch(cfg, task.batch_size, generator)
            _, loss = model(batch.inputs.to(device), batch.targets.to(device))
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), optimisation.grad_clip)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            step, loss_value = step + 1, loss.item()
            bar.update(1)
            # The last step always evaluates, so last_eval scores the final model.
            if step % task.eval_interval == 0 or step == task.steps:
                last_eval = evaluate()
                history.append((step, last_eval[metric]))
                bar.set_postfix(loss=f"{loss_value:.3f}", **{metric: f"{history[-1][1]:.3f}"}, refresh=False)
                if task.stop_at is not None and history[-1][1] >= task.stop_at:
                    break
    seconds = time.perf_counter() - started  # training and the evaluations along the way

    result: dict[str, Any] = {
        "task": task.name,
        "variant": label,
        "seed": seed,
        "metric": metric,
        "higher_is_better": higher_is_better,
        "steps": step,
        "tokens": step * task.batch_size * context_len(task),
        "seconds": seconds,
        "final_train_loss": loss_value,
        "history": history,
        "final": last_eval,
    }
    if task.stop_at is not None:
        result["stop_at"] = task.stop_at
        result["steps_to_threshold"] = steps_to_threshold(history, task.stop_at)
    if task.sweep_lengths:
        sweep = SWEEPS[task.name](
            model,
            cfg,
            lengths=task.sweep_lengths,
            depths=task.sweep_depths,
            samples_per_cell=task.sweep_samples,
            seed=EVAL_SEED,
        )
        result["sweep"] = sweep_to_dict(sweep)
    if task.name == "needles":
        result["probe"] = noise_probe(model, cfg, task.probe_samples)
    return result


def sweep_to_dict(sweep: LengthDepthSweep) -> dict[str, Any]:
    """Accuracy as a (length × depth) grid, None where the model cannot run the length (with the reason)."""
    lengths = sorted({cell.context_len for cell in sweep.cells})
    depths = sorted({cell.depth for cell in sweep.cells})
    grid = {(cell.context_len, cell.depth): cell.accuracy for cell in sweep.cells}
    return {
        "lengths": lengths,
        "depths": depths,
        "accuracy": [[grid[length, depth] for depth in depths] for length in lengths],
        "accuracy_by_length": {str(k): v for k, v in sweep.accuracy_by_length().items()},
        "largest_length_90": sweep.largest_length(0.9),
        "unavailable": {str(k): v for k, v in sweep.unavailable.items()},
    }


def noise_probe(model: torch.nn.Module, cfg: Any, n_samples: int) -> dict[str, Any]:
    """Diff Table 3's shares at the training length, answer depth uniform, as the raw (possibly signed) mass
    of each layer's effective map and as shares of its positive part (eval_protocols.md §2.3)."""
    batch = needles_batch(replace(cfg, depth=None), n_samples, EVAL_SEED)
    raw = attention_noise_probe(model, batch)
    positive = attention_noise_probe(model, batch, positive_part=True)
    return {
        "mean": raw.mean(),
        "last_layer": raw.last_layer(),
        "positive_part_mean": positive.mean(),
        "positive_part_last_layer": positive.last_layer(),
    }


def run_task(
    name: str,
    variant: str,
    *,
    seed: int = 0,
    steps: int | None = None,
    device: torch.device | str = "auto",
    progress: bool = True,
) -> dict[str, Any]:
    """Train ``variant`` (a spec such as ``diff+rope``) from scratch on the synthetic task ``name`` with the
    standard preset's budget (``steps`` overrides its length) and score it; the result is :func:`train_task`'s."""
    # Local only so that adding this function left the module's imports untouched; they may move to the top.
    from attnzoo.compare.spec import PRESET_TASKS
    from attnzoo.training.distributed import resolve_device

    budgets = PRESET_TASKS["standard"]
    if name not in budgets:
        raise ValueError(f"task={name!r} is invalid: choose one of {sorted(budgets)}")
    task = budgets[name]
    if steps is not None:
        task = replace(task, steps=steps, eval_interval=min(task.eval_interval, steps))
    label = Variant.parse(variant).label
    device = resolve_device(device) if isinstance(device, str) else device
    return train_task(task, task_configs(task, [label])[label], seed, device, progress=progress, label=label)
