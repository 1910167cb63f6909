"""Passkey retrieval: find a number hidden in filler text, by context length and needle depth.

Protocol: the Landmark-attention prompt (Mohtashami & Jaggi, 2023; epfml/landmark-attention
``llama/run_test.py``) over a closed word-level vocabulary, so a small model can learn it from scratch, with
the 5-digit key of Position Interpolation (Chen et al., 2023); eval_protocols.md §1.3. A sample is::

    <bos> header filler[:n_pre] needle filler[:n_fill - n_pre] question D

where the needle states the key D twice and only D's digits after the question are scored. As in the
Landmark code, both filler pieces start at the beginning of the repeated garbage text, cut at word level.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from attnzoo.evals.base import (
    CLAIMS_LOOP,
    IGNORE_INDEX,
    TINY_LOOP,
    LengthDepthSweep,
    TaskBatch,
    WordVocab,
    as_generator,
    exact_match,
    greedy_predictions,
    length_depth_sweep,
    randint,
    random_number,
    scored_accuracy,
    unique_words,
)
from attnzoo.evals.task import Task, TaskBudget, register_task
from attnzoo.validation import require

HEADER = (
    "There is an important info hidden inside a lot of irrelevant text . Find it and memorize them . "
    "I will quiz you about the important information there ."
)
GARBAGE = "The grass is green . The sky is blue . The sun is yellow . Here we go . There and back again ."
NEEDLE = ("The pass key is", ". Remember it .", "is the pass key .")  # the key goes between the parts
QUESTION = "What is the pass key ? The pass key is"
DIGITS = [str(d) for d in range(10)]
VOCAB = WordVocab(["<bos>", *DIGITS, *unique_words(HEADER, GARBAGE, *NEEDLE, QUESTION)])

_HEADER, _GARBAGE, _QUESTION = VOCAB.encode(HEADER), VOCAB.encode(GARBAGE), VOCAB.encode(QUESTION)
_NEEDLE = [VOCAB.encode(part) for part in NEEDLE]
_PROMPT_LEN = len(_HEADER) + sum(map(len, _NEEDLE)) + len(_QUESTION)  # without keys, filler or <bos>


@dataclass(frozen=True)
class PasskeyConfig:
    context_len: int = 256  # tokens the model reads: the sample without its last digit
    n_digits: int = 5
    depth: float | None = None  # share of the filler before the needle; None: uniform per sample

    def __post_init__(self) -> None:
        require(self.n_digits >= 1, "n_digits", self.n_digits, "must be >= 1")
        require(
            self.n_filler >= 0,
            "context_len",
            self.context_len,
            f"must be >= {self.context_len - self.n_filler} to hold the prompt without filler",
        )
        if self.depth is not None:
            require(0 <= self.depth <= 1, "depth", self.depth, "must be in [0, 1]")

    @property
    def n_filler(self) -> int:
        # The sample is context_len + 1 tokens: <bos>, the prompt, three copies of the key, and the filler.
        return self.context_len - _PROMPT_LEN - 3 * self.n_digits


@dataclass
class PasskeyBatch(TaskBatch):
    depth: Tensor  # (B,) share of the filler placed before the needle


def vocab_size(cfg: PasskeyConfig) -> int:
    return len(VOCAB)


def _filler(n: int) -> list[int]:
    return [_GARBAGE[i % len(_GARBAGE)] for i in range(n)]


def passkey_batch(cfg: PasskeyConfig, batch_size: int, seed: int | torch.Generator) -> PasskeyBatch:
    generator = as_generator(seed)
    n_fill = cfg.n_filler
    samples, depths = [], []
    for _ in range(batch_size):
        digits = [VOCAB.ids[str(d)] for d in random_number(cfg.n_digits, generator)]
        n_pre = randint(0, n_fill + 1, generator) if cfg.depth is None else round(cfg.depth * n_fill)
        needle = _NEEDLE[0] + digits + _NEEDLE[1] + digits + _NEEDLE[2]
        prefix = [VOCAB.ids["<bos>"], *_HEADER, *_filler(n_pre), *needle, *_filler(n_fill - n_pre), *_QUESTION]
        samples.append(prefix + digits)
        depths.append(n_pre / n_fill if n_fill else 0.0)
    tokens = torch.tensor(samples)
    targets = tokens[:, 1:].clone()
    targets[:, : -cfg.n_digits] = IGNORE_INDEX
    return PasskeyBatch(inputs=tokens[:, :-1], targets=targets, depth=torch.tensor(depths))


def score_passkey(predictions: Tensor, batch: TaskBatch) -> tuple[float, float]:
    """(exact-match accuracy over samples, digit accuracy)."""
    exact = exact_match(predictions, batch.targets).float().mean().item()
    return exact, scored_accuracy(predictions, batch.targets)


def evaluate_passkey(
    model: nn.Module, cfg: PasskeyConfig, n_samples: int = 100, seed: int = 0, batch_size: int = 32
) -> dict[str, float]:
    batch = passkey_batch(cfg, n_samples, seed)
    accuracy, digit_accuracy = score_passkey(greedy_predictions(model, batch.inputs, batch_size), batch)
    return {"accuracy": accuracy, "digit_accuracy": digit_accuracy}


def passkey_sweep(
    model: nn.Module,
    cfg: PasskeyConfig,
    lengths: Sequence[int],
    depths: Sequence[float] = (0.0, 0.25, 0.5, 0.75, 1.0),
    samples_per_cell: int = 20,
    seed: int = 0,
    batch_size: int = 32,
) -> LengthDepthSweep:
    """Accuracy by (context length, depth); ``.largest_length(0.9)`` is the longest length retrieved ≥ 90%."""
    return length_depth_sweep(
        model,
        cfg,
        passkey_batch,
        score_passkey,
        lengths=lengths,
        depths=depths,
        samples_per_cell=samples_per_cell,
        seed=seed,
        batch_size=batch_size,
    )


_STANDARD = TaskBudget(
    model={"dim": 128, "n_layers": 2, "n_heads": 4},
    steps=2000,
    batch_size=32,
    lr=1e-3,
    warmup_steps=100,
    eval_interval=250,
    eval_samples=200,
    stop_at=0.99,
    sweep_lengths=(128, 256, 512, 1024),
    sweep_samples=20,
)
register_task(
    Task(
        name="passkey",
        config=PasskeyConfig,
        make_batch=passkey_batch,
        evaluate=evaluate_passkey,
        vocab_size=vocab_size,
        measures="retrieval: a number stated once in filler text, recalled at the end, by context length and depth",
        paper="Landmark attention (Mohtashami & Jaggi, 2023)",
        chance=lambda cfg: 1 / (9 * 10 ** (cfg.n_digits - 1)),  # a uniform number of n_digits digits
        solved=1.0,
        sweep=passkey_sweep,
        budgets={
            "micro": TaskBudget(
                options={"context_len": 64, "n_digits": 2},
                **TINY_LOOP,
                sweep_lengths=(64, 128),
                sweep_depths=(0.0, 1.0),
                sweep_samples=2,
            ),
            # The papers' 5-digit key (calibrated, benchmarks/results/task_calibration.md): MHA climbs steadily,
            # 0.44 at step 1,500, 0.70 at 2,000 and 0.86 at 2,500, with no plateau to leave.
            "claims": TaskBudget(
                options={"context_len": 96, "n_digits": 5},
                **{**CLAIMS_LOOP, "steps": 2000, "eval_interval": 250},
            ),
            "standard": _STANDARD,
            "full": dataclasses.replace(_STANDARD, steps=3000, sweep_lengths=(128, 256, 512, 1024, 2048)),
        },
    )
)
