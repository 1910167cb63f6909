"""Multi-needle retrieval with distractors, and the attention-noise probe of Diff Transformer Table 3.

Protocol: the Diff Transformer multi-needle test (Ye et al., 2024, §3.4, Table 2) with LWM's needle and
question strings, over a closed word-level vocabulary and a haystack of i.i.d. noise words (RULER's
MK-NIAH setting); eval_protocols.md §2.2. N needles "the special magic <city> number is : <digits> ." are
hidden in the haystack and R of them are asked for; the first one asked is the answer needle, placed at the
requested depth, and the other N - 1 are placed uniformly. A sample is::

    <bos> haystack-with-needles question answer : d1 , d2 , …

and each queried needle scores as one exact match of its digits.

The probe (§2.3) reads each layer's effective attention map at the rows that predict the answer needle's
digits and splits their mass between the answer needle, the distractor needles, the <bos> sink, the question
(everything after the haystack), and the noise words; for a softmax map the five shares add to 1.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from attnzoo.evals.base import (
    CLAIMS_LOOP,
    FULL_LOOP,
    IGNORE_INDEX,
    TINY_LOOP,
    LengthDepthSweep,
    TaskBatch,
    WordVocab,
    as_generator,
    evaluating,
    greedy_predictions,
    length_depth_sweep,
    model_device,
    randint,
    random_number,
    unique_words,
)
from attnzoo.evals.task import Task, TaskBudget, register_task
from attnzoo.validation import require

TEMPLATE_WORDS = unique_words(
    "the special magic number is : . what are numbers for , and ? answer", " ".join(str(d) for d in range(10))
)


@dataclass(frozen=True)
class NeedlesConfig:
    context_len: int = 256  # tokens the model reads: the sample without its last digit
    n_needles: int = 6  # N
    n_queries: int = 2  # R: needles asked for, answered in the order asked
    n_digits: int = 5
    n_keys: int = 64  # the city names a needle is keyed by
    n_noise_words: int = 200  # the haystack's vocabulary
    depth: float | None = None  # position of the answer needle as a share of the haystack; None: uniform

    def __post_init__(self) -> None:
        require(self.n_needles >= 1, "n_needles", self.n_needles, "must be >= 1")
        require(1 <= self.n_queries <= self.n_needles, "n_queries", self.n_queries, "must be in [1, n_needles]")
        require(self.n_digits >= 1, "n_digits", self.n_digits, "must be >= 1")
        require(self.n_keys >= self.n_needles, "n_keys", self.n_keys, "must be >= n_needles (keys are distinct)")
        require(self.n_noise_words >= 1, "n_noise_words", self.n_noise_words, "must be >= 1")
        require(self.haystack_len >= 0, "context_len", self.context_len, "is too short to hold the needles")
        if self.depth is not None:
            require(0 <= self.depth <= 1, "depth", self.depth, "must be in [0, 1]")

    @property
    def needle_len(self) -> int:
        return 8 + self.n_digits  # the special magic <city> number is : <digits> .

    @property
    def question_len(self) -> int:
        # "what is/are the special magic number(s) for", R cities with R - 1 separators (", " or "and"), "?"
        return 7 + 2 * self.n_queries

    @property
    def answer_len(self) -> int:
        return self.n_queries * self.n_digits + self.n_queries - 1  # digits separated by commas

    @property
    def haystack_len(self) -> int:
        # the sample is <bos>, haystack, needles, question, "answer :", answer: context_len + 1 tokens
        fixed = 1 + self.n_needles * self.needle_len + self.question_len + 2 + self.answer_len
        return self.context_len + 1 - fixed


def vocabulary(cfg: NeedlesConfig) -> WordVocab:
    cities = [f"city{i}" for i in range(cfg.n_keys)]
    noise = [f"w{i}" for i in range(cfg.n_noise_words)]
    return WordVocab(["<bos>", *TEMPLATE_WORDS, *cities, *noise])


def vocab_size(cfg: NeedlesConfig) -> int:
    return len(vocabulary(cfg))


@dataclass
class NeedlesBatch(TaskBatch):
    depth: Tensor  # (B,) position of the answer needle as a share of the haystack
    needle_spans: Tensor  # (B, N, 2) [start, end) in inputs; row 0 the answer needle, rows < R the queried ones
    answer_positions: Tensor  # (B, R, n_digits) the input positions that predict each queried needle's digits
    question_start: int  # the first position after the haystack and its needles


def needles_batch(cfg: NeedlesConfig, batch_size: int, seed: int | torch.Generator) -> NeedlesBatch:
    generator = as_generator(seed)
    vocab = vocabulary(cfg)
    ids = vocab.ids
    first_noise, hay_len = ids["w0"], cfg.haystack_len
    samples, depths, spans = [], [], []
    for _ in range(batch_size):
        cities = (torch.randperm(cfg.n_keys, generator=generator)[: cfg.n_needles] + ids["city0"]).tolist()
        numbers: list[list[int]] = []
        while len(numbers) < cfg.n_needles:  # distinct, so a distractor's digits are never right
            number = random_number(cfg.n_digits, generator)
            if number not in numbers:
                numbers.append(number)
        digits = [[ids[str(d)] for d in number] for number in numbers]
        needles = [
            [*vocab.encode("the special magic"), city, *vocab.encode("number is :"), *d, ids["."]]
            for city, d in zip(cities, digits, strict=True)
        ]
        answer_at = randint(0, hay_len + 1, generator) if cfg.depth is None else round(cfg.depth * hay_len)
        # Insertion points into the haystack; needles at the same point go in a random order.
        points = [answer_at, *torch.randint(0, hay_len + 1, (cfg.n_needles - 1,), generator=generator).tolist()]
        tiebreak = torch.rand(cfg.n_needles, generator=generator).tolist()
        order = sorted(range(cfg.n_needles), key=lambda i: (points[i], tiebreak[i]))
        hay = (torch.randint(0, cfg.n_noise_words, (hay_len,), generator=generator) + first_noise).tolist()

        tokens, sample_spans, consumed = [ids["<bos>"]], [(0, 0)] * cfg.n_needles, 0
        for i in order:
            tokens += hay[consumed : points[i]]
            consumed = points[i]
            sample_spans[i] = (len(tokens), len(tokens) + len(needles[i]))
            tokens += needles[i]
        tokens += hay[consumed:]

        tokens += _question(vocab, cities[: cfg.n_queries]) + vocab.encode("answer :")
        for r in range(cfg.n_queries):
            tokens += ([ids[","]] if r else []) + digits[r]
        samples.append(tokens)
        depths.append(answer_at / hay_len if hay_len else 0.0)
        spans.append(sample_spans)

    tokens = torch.tensor(samples)
    # The r-th answer's digits are tokens answer_start + r·(n_digits + 1) + j; position p predicts token p + 1.
    answer_start = cfg.context_len + 1 - cfg.answer_len
    offsets = torch.arange(cfg.n_queries)[:, None] * (cfg.n_digits + 1) + torch.arange(cfg.n_digits)[None, :]
    answer_positions = (answer_start - 1 + offsets).expand(batch_size, -1, -1)
    targets = torch.full((batch_size, cfg.context_len), IGNORE_INDEX)
    positions = answer_positions.flatten(1)
    targets.scatter_(1, positions, tokens.gather(1, positions + 1))
    return NeedlesBatch(
        inputs=tokens[:, :-1],
        targets=targets,
        depth=torch.tensor(depths),
        needle_spans=torch.tensor(spans),
        answer_positions=answer_positions.clone(),
        question_start=1 + hay_len + cfg.n_needles * cfg.needle_len,
    )


def _question(vocab: WordVocab, asked: list[int]) -> list[int]:
    """'what is the special magic number for c ?', or '… numbers for c1 , c2 and c3 ?'."""
    ids = vocab.ids
    if len(asked) == 1:
        return [*vocab.encode("what is the special magic number for"), asked[0], ids["?"]]
    listed = [token for city in asked[:-1] for token in (city, ids[","])]
    listed[-1] = ids["and"]
    return [*vocab.encode("what are the special magic numbers for"), *listed, asked[-1], ids["?"]]


def score_needles(predictions: Tensor, batch: NeedlesBatch) -> tuple[float, float]:
    """(accuracy: share of queried needles whose digits are all right, digit accuracy)."""
    positions = batch.answer_positions.flatten(1)
    correct = (predictions.gather(1, positions) == batch.targets.gather(1, positions)).view(
        batch.answer_positions.shape
    )
    return correct.all(dim=-1).float().mean().item(), correct.float().mean().item()


def evaluate_needles(
    model: nn.Module, cfg: NeedlesConfig, n_samples: int = 100, seed: int = 0, batch_size: int = 32
) -> dict[str, float]:
    batch = needles_batch(cfg, n_samples, seed)
    accuracy, digit_accuracy = score_needles(greedy_predictions(model, batch.inputs, batch_size), batch)
    return {"accuracy": accuracy, "digit_accuracy": digit_accuracy}


def needles_sweep(
    model: nn.Module,
    cfg: NeedlesConfig,
    lengths: Sequence[int],
    depths: Sequence[float] = (0.0, 0.25, 0.5, 0.75, 1.0),
    samples_per_cell: int = 50,
    seed: int = 0,
    batch_size: int = 32,
) -> LengthDepthSweep:
    """Accuracy by (context length, answer depth) at this config's N and R."""
    return length_depth_sweep(
        model,
        cfg,
        needles_batch,
        score_needles,
        lengths=lengths,
        depths=depths,
        samples_per_cell=samples_per_cell,
        seed=seed,
        batch_size=batch_size,
    )


@dataclass
class AttentionShares:
    """Attention mass from the query rows onto each key set, averaged over samples and rows."""

    shares: dict[str, Tensor]  # set name → (layers, heads)

    def per_layer(self) -> dict[str, list[float]]:
        return {name: share.mean(dim=1).tolist() for name, share in self.shares.items()}

    def last_layer(self) -> dict[str, float]:
        return {name: share[-1].mean().item() for name, share in self.shares.items()}

    def mean(self) -> dict[str, float]:
        """Over layers and heads: the Diff paper does not say how it aggregates, so report this and the last layer."""
        return {name: share.mean().item() for name, share in self.shares.items()}


def attention_shares(
    maps: Sequence[Tensor],
    query_rows: Tensor,
    key_sets: Mapping[str, Tensor],
    positive_part: bool = False,
) -> AttentionShares:
    """Share of attention from ``query_rows`` onto each of ``key_sets``, per layer and head.

    ``maps`` are (B, heads, T, T) effective maps, one per layer, as ``Transformer.attention_maps`` returns;
    ``query_rows`` and each key set are (B, T) bool. A map may be signed (Diff attention, A1 − λ·A2, whose
    rows sum to 1 − λ): shares are its raw mass by default, and with ``positive_part`` they are shares of
    max(A, 0) renormalised per row, so that they add to 1 over a partition of the keys.
    """
    device = maps[0].device
    query_rows = query_rows.to(device)
    batch_of_row = query_rows.nonzero()[:, 0]
    if batch_of_row.numel() == 0:
        raise ValueError("query_rows selects no row")
    row_keys = {name: keys.to(device)[batch_of_row][:, None, :] for name, keys in key_sets.items()}  # (rows, 1, T)
    per_layer: dict[str, list[Tensor]] = {name: [] for name in key_sets}
    for attention in maps:
        rows = attention.permute(0, 2, 1, 3)[query_rows].float()  # (rows, heads, T)
        if positive_part:
            rows = rows.clamp(min=0)
            rows = rows / rows.sum(dim=-1, keepdim=True).clamp(min=torch.finfo(rows.dtype).tiny)
        for name, keys in row_keys.items():
            per_layer[name].append((rows * keys).sum(dim=-1).mean(dim=0).cpu())  # (heads,)
    return AttentionShares({name: torch.stack(layers) for name, layers in per_layer.items()})


def needle_key_sets(batch: NeedlesBatch) -> dict[str, Tensor]:
    """The five disjoint (B, T) key sets of the probe: answer needle, distractors, sink, question, noise."""
    batch_size, length = batch.inputs.shape
    position = torch.arange(length)
    in_needle = (position >= batch.needle_spans[..., :1]) & (position < batch.needle_spans[..., 1:])  # (B, N, T)
    answer, distractors = in_needle[:, 0], in_needle[:, 1:].any(dim=1)
    sink = (position == 0).expand(batch_size, -1)
    question = (position >= batch.question_start).expand(batch_size, -1)
    noise = ~(answer | distractors | sink | question)
    return {"answer": answer, "distractors": distractors, "sink": sink, "question": question, "noise": noise}


def attention_noise_probe(model: nn.Module, batch: NeedlesBatch, positive_part: bool = False) -> AttentionShares:
    """Diff Table 3's "attention to answer" (``answer``) and "attention noise" (``noise``), with the rest.

    The query rows are those that predict the answer needle's digits, teacher-forced.
    """
    query_rows = torch.zeros_like(batch.inputs, dtype=torch.bool)
    query_rows.scatter_(1, batch.answer_positions[:, 0], True)
    with evaluating(model):
        maps = model.attention_maps(batch.inputs.to(model_device(model)))
    return attention_shares(maps, query_rows, needle_key_sets(batch), positive_part)


def noise_probe(model: nn.Module, cfg: NeedlesConfig, n_samples: int) -> dict[str, float]:
    """Diff Table 3's shares at the training length, answer depth uniform: the raw (possibly signed) mass of
    each layer's effective map and the shares of its positive part, each over all layers and for the last."""
    batch = needles_batch(dataclasses.replace(cfg, depth=None), n_samples, seed=0)
    raw = attention_noise_probe(model, batch)
    positive = attention_noise_probe(model, batch, positive_part=True)
    views = {
        "mean": raw.mean(),
        "last_layer": raw.last_layer(),
        "positive_part_mean": positive.mean(),
        "positive_part_last_layer": positive.last_layer(),
    }
    return {f"{view}/{key_set}": share for view, shares in views.items() for key_set, share in shares.items()}


def elimination_shortcut(cfg: NeedlesConfig) -> float:
    """What answering with a random needle not given yet scores, without reading the question: after the r earlier
    answers (teacher-forced, so the right ones) the r-th copies one of the N − r needles left, right 1 / (N − r) of
    the time (the numbers are distinct). With R = N = 4 that is 0.52, and a 2-layer MHA sat exactly there, solving
    the last query of every sample and none of the others by its key (benchmarks/results/task_calibration_notes.md);
    with R = 1 it is 1 / N."""
    return sum(1 / (cfg.n_needles - r) for r in range(cfg.n_queries)) / cfg.n_queries


register_task(
    Task(
        name="needles",
        config=NeedlesConfig,
        make_batch=needles_batch,
        evaluate=evaluate_needles,
        vocab_size=vocab_size,
        measures="multi-needle retrieval among distractors, by context length and depth, with the attention-noise "
        "probe: the attention share on the answer and on the context",
        paper="Diff Transformer (Ye et al., 2024)",
        chance=lambda cfg: 1 / (9 * 10 ** (cfg.n_digits - 1)),  # a uniform number of n_digits digits
        solved=1.0,
        shortcut=elimination_shortcut,
        sweep=needles_sweep,
        probe=noise_probe,
        probe_columns={"mean/answer": "attention to answer", "mean/noise": "attention noise"},
        budgets={
            "micro": TaskBudget(
                options={
                    "context_len": 48,
                    "n_needles": 2,
                    "n_queries": 1,
                    "n_digits": 2,
                    "n_keys": 8,
                    "n_noise_words": 16,
                },
                **TINY_LOOP,
                sweep_lengths=(48, 96),
                sweep_depths=(0.0, 1.0),
                sweep_samples=2,
                probe_samples=4,
            ),
            # The best of the settings tried (benchmarks/results/task_calibration.md), and still short: MHA sits
            # below the random-needle shortcut (0.11-0.12 against 1/N = 0.25) at 1,500 and 3,000 steps, with 3
            # layers and with batch 64; asking for every needle (R = N, T = 96, up to 2,500 steps, width 96) only
            # reached the elimination shortcut. Retrieval by key needs a larger budget than a CPU minute.
            "claims": TaskBudget(
                options={"context_len": 64, "n_needles": 4, "n_queries": 1, "n_digits": 2, "n_keys": 16},
                **{
                    **CLAIMS_LOOP,
                    "model": {"dim": 64, "n_layers": 2, "n_heads": 4},
                    "steps": 1500,
                    "lr": 1e-3,
                    "eval_interval": 250,
                },
                probe_samples=64,
            ),
            "full": TaskBudget(
                **FULL_LOOP,
                eval_samples=200,
                stop_at=0.99,
                sweep_lengths=(256, 512, 1024),
                sweep_samples=50,
                probe_samples=50,
            ),
        },
    )
)
