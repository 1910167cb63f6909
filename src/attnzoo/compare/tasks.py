"""Training a model from scratch on a synthetic task, and scoring it, for one variant × seed.

The loop is the language-model trainer's optimisation (AdamW with decay on matrices, warmup + cosine, the
same clipping) over fresh batches from the task's ``make_batch`` each step: a fixed training set is
memorised at these sizes (eval_protocols.md §8, item 3). The batches come from a generator seeded by the
run's seed alone, so every variant trained with seed k sees the same batches. Evaluation uses one fixed
set (:data:`EVAL_SEED`) for every variant and seed, every ``eval_interval`` steps, which gives MQAR's
steps-to-99% and the task's learning curve. Whatever else is measured (a length × depth sweep, a probe) is
declared by the task's record, never looked up by its name here.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable

import torch
from tqdm import tqdm

from attnzoo.config import ModelConfig
from attnzoo.distributed import resolve_device
from attnzoo.evals import steps_to_threshold
from attnzoo.evals.task import TaskSpec
from attnzoo.results.comparison import SweepResult, TaskRun
from attnzoo.training.config import TrainConfig
from attnzoo.training.optim import build_optimizer, learning_rate
from attnzoo.training.trainer import derive_seed
from attnzoo.variants import Variant, count_parameters, matched_configs

EVAL_SEED = 0  # the fixed evaluation set; training streams come from derive_seed and never coincide with it
TASK_DATA_STREAM = 2  # tags the task-batch stream of a seed, apart from the trainer's streams


def context_len(spec: TaskSpec) -> int:
    """Tokens the model reads per sample, whatever the task calls it."""
    return spec.task.make_batch(spec.config(), 1, EVAL_SEED).inputs.shape[1]


def task_configs(spec: TaskSpec, variants: Iterable[Variant]) -> dict[str, ModelConfig]:
    """Parameter-matched models for the task, keyed by variant label; the task's length is the model's."""
    baseline = ModelConfig.from_dict(
        {
            **spec.budget.model,
            "vocab_size": spec.task.vocab_size(spec.config()),
            "max_seq_len": context_len(spec),
        }
    )
    return matched_configs(variants, baseline)


def _optimisation(spec: TaskSpec, seed: int) -> TrainConfig:
    """The task's budget as a TrainConfig, so the trainer's optimizer and schedule apply unchanged."""
    budget = spec.budget
    return TrainConfig(
        steps=budget.steps,
        batch_size=budget.batch_size,
        seq_len=context_len(spec),
        lr=budget.lr,
        warmup_steps=budget.warmup_steps,
        seed=seed,
    )


def step_seconds(spec: TaskSpec, model_config: ModelConfig, device: torch.device, steps: int = 3) -> float:
    """Seconds one training step of this task takes here: the fastest of ``steps`` after a warm-up step."""
    torch.manual_seed(0)
    model = spec.task.new_model(model_config, spec.config()).to(device)
    optimizer = build_optimizer(model, _optimisation(spec, 0))
    generator = torch.Generator().manual_seed(0)
    times = []
    for _ in range(steps + 1):
        batch = spec.task.make_batch(spec.config(), spec.budget.batch_size, generator)
        started = time.perf_counter()
        _, loss = model(batch.inputs.to(device), batch.targets.to(device))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - started)
    return min(times[1:])


def train_task(
    spec: TaskSpec, model_config: ModelConfig, seed: int, device: torch.device, progress: bool, label: str
) -> TaskRun:
    """Train, evaluate along the way, and score the final model with everything its task declares."""
    task, budget, cfg = spec.task, spec.budget, spec.config()
    optimisation = _optimisation(spec, seed)
    torch.manual_seed(seed)
    model = spec.task.new_model(model_config, spec.config()).to(device)
    optimizer = build_optimizer(model, optimisation)
    generator = torch.Generator().manual_seed(derive_seed(seed, TASK_DATA_STREAM))

    started = time.perf_counter()
    history: list[tuple[int, float]] = []
    step, loss_value, last_eval = 0, math.nan, {}
    bar = tqdm(total=budget.steps, desc=f"{task.name} {label} seed {seed}", unit="step", disable=not progress)
    with bar:
        while step < budget.steps:
            for group in optimizer.param_groups:
                group["lr"] = learning_rate(step, optimisation)
            batch = task.make_batch(cfg, budget.batch_size, generator)
            _, loss = model(batch.inputs.to(device), batch.targets.to(device))
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), optimisation.grad_clip)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            step, loss_value = step + 1, loss.item()
            bar.update(1)
            # The last step always evaluates, so last_eval scores the final model.
            if step % budget.eval_interval == 0 or step == budget.steps:
                last_eval = task.evaluate(model, cfg, n_samples=budget.eval_samples, seed=EVAL_SEED)
                history.append((step, last_eval[task.metric]))
                bar.set_postfix(loss=f"{loss_value:.3f}", **{task.metric: f"{history[-1][1]:.3f}"}, refresh=False)
                if budget.stop_at is not None and history[-1][1] >= budget.stop_at:
                    break
    seconds = time.perf_counter() - started  # training and the evaluations along the way

    sweep = None
    if budget.sweep_lengths:
        assert task.sweep is not None  # TaskSpec refuses sweep lengths for a task without a sweep
        grid = task.sweep(
            model,
            cfg,
            lengths=budget.sweep_lengths,
            depths=budget.sweep_depths,
            samples_per_cell=budget.sweep_samples,
            seed=EVAL_SEED,
        )
        sweep = SweepResult.of(grid)
    return TaskRun(
        task=task.name,
        variant=label,
        seed=seed,
        parameters=count_parameters(model_config),
        steps=step,
        tokens=step * budget.batch_size * context_len(spec),
        seconds=seconds,
        final_train_loss=loss_value,
        history=history,
        final=last_eval,
        stop_at=budget.stop_at,
        steps_to_threshold=steps_to_threshold(history, budget.stop_at) if budget.stop_at is not None else None,
        sweep=sweep,
        probe=task.probe(model, cfg, budget.probe_samples) if task.probe is not None else {},
    )


def run_task(
    name: str,
    variant: str,
    *,
    seed: int = 0,
    steps: int | None = None,
    scale: str = "standard",
    device: torch.device | str = "auto",
    progress: bool = True,
) -> TaskRun:
    """Train one variant from scratch on a registered task at a scale of its budget, and score it."""
    spec = TaskSpec.at_scale(name, scale)
    if steps is not None:
        spec = spec.replace(steps=steps, eval_interval=min(spec.budget.eval_interval, steps))
    parsed = Variant.parse(variant)
    device = resolve_device(device) if isinstance(device, str) else device
    return train_task(spec, task_configs(spec, [parsed])[parsed.label], seed, device, progress, parsed.label)
