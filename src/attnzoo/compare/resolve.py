"""A comparison to run: a preset by name (or a spec) with the parts a caller replaces, each validated."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import torch

from attnzoo.compare.presets import PRESETS
from attnzoo.compare.spec import CompareSpec
from attnzoo.evals.task import SCALES, TaskSpec, tasks_at_scale
from attnzoo.validation import require
from attnzoo.variants import Variant


def resolve_spec(
    preset_or_spec: str | CompareSpec,
    *,
    variants: Sequence[str] | None = None,
    seeds: Sequence[int] | None = None,
    steps: int | None = None,
    corpus: str | None = None,
    tasks: Sequence[str] | None = None,
    device: str | None = None,
) -> CompareSpec:
    """A preset by name (or a spec) with the given parts replaced; every override is validated.

    ``tasks`` names the tasks to run (empty: none), each at the preset's scale of its own budget; a custom spec
    (not named after a scale) picks them from its own ``tasks``.
    """
    if isinstance(preset_or_spec, str):
        if preset_or_spec not in PRESETS:
            raise ValueError(f"preset {preset_or_spec!r} is unknown; choose one of {list(PRESETS)}")
        spec = PRESETS[preset_or_spec]
    elif isinstance(preset_or_spec, CompareSpec):
        spec = preset_or_spec
    else:
        raise TypeError(f"expected a preset name or a CompareSpec, got {type(preset_or_spec).__name__}")
    changes: dict[str, Any] = {}
    if variants is not None:
        chosen = changes["variants"] = Variant.parse_all(variants)
        # A task trained on a subset keeps the part of it that is still compared; one with none left is dropped.
        kept = [(task, tuple(v for v in task.variants if v in chosen)) for task in spec.tasks]
        changes["tasks"] = tuple(
            TaskSpec(task.name, task.budget, compared) for task, compared in kept if compared or not task.variants
        )
    if seeds is not None:
        changes["seeds"] = tuple(seeds)
        changes["task_seeds"] = None  # seeds asked for explicitly apply to the tasks too
    train = spec.train if steps is None else spec.train.with_steps(steps)
    train_changes: dict[str, Any] = {}
    if corpus is not None:
        train_changes["data"] = dataclasses.replace(train.data, corpus=corpus)
    if device is not None:
        train_changes["device"] = device
    if train_changes or train is not spec.train:
        changes["train"] = dataclasses.replace(train, **train_changes)
    if tasks is None and isinstance(preset_or_spec, str) and spec.name in SCALES:
        # A task registered after this module was imported joins the preset of its scale (a spec passed whole
        # keeps the tasks it names: none, if it names none).
        known = {task.name for task in spec.tasks}
        added = tuple(task for task in tasks_at_scale(spec.name) if task.name not in known)
        if added:
            changes["tasks"] = spec.tasks + added
    if tasks is not None:
        if spec.name in SCALES:
            changes["tasks"] = tuple(TaskSpec.at_scale(name, spec.name) for name in tasks)
        else:
            own = {task.name: task for task in spec.tasks}
            unknown = sorted(set(tasks) - set(own))
            require(not unknown, "tasks", unknown, f"spec {spec.name!r} has budgets for {sorted(own)} only")
            changes["tasks"] = tuple(own[name] for name in tasks)
    resolved = dataclasses.replace(spec, **changes) if changes else spec
    if resolved.train.device.startswith("cuda") and not torch.cuda.is_available():
        if device is not None:  # asked for by name, not the preset's
            raise ValueError(
                f"device={device!r} is invalid: torch sees no CUDA device here; use 'cpu' (or 'auto', the GPU where "
                "there is one)"
            )
        raise ValueError(
            f"preset {resolved.name!r} runs on a CUDA GPU (device={resolved.train.device!r}), and torch sees none "
            "here: run it where `python -c 'import torch; print(torch.cuda.is_available())'` prints True, or use "
            "--preset claims on a CPU"
        )
    return resolved
