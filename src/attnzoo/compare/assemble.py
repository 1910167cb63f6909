"""A comparison's results assembled from its parts: the runs, the bench, the tasks, the corpus with its n-gram
level, the machine and the sitting, into the record ``OUT/results.json`` holds
(:class:`attnzoo.results.comparison.CompareResults`)."""

from __future__ import annotations

import dataclasses
import os
import platform
import sys
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import torch

from attnzoo import __version__
from attnzoo.attention import ATTENTION
from attnzoo.bench import machine_description
from attnzoo.compare.spec import CompareSpec
from attnzoo.compare.stored import jsonable, read_record, write_record
from attnzoo.config import ModelConfig
from attnzoo.data.corpora import Corpus, prepare_corpus
from attnzoo.evals.ngram import NGramLevel, kneser_ney_level
from attnzoo.model import Transformer
from attnzoo.results.comparison import (
    SCHEMA_VERSION,
    BenchRecord,
    Budget,
    CompareResults,
    CorpusInfo,
    LMRun,
    MachineInfo,
    TaskResult,
    VariantResult,
)
from attnzoo.training.config import DataConfig

RESULTS = "results.json"
NGRAM = "ngram.json"  # the corpus's trigram level, counted once

# The trigram is fitted on at most this many tokens from the start of the training split: all of Shakespeare, and a
# bounded cost on pysource (hundreds of millions of tokens, minutes of sorting on a GPU lease's host). A trigram
# fitted on 8M tokens is weaker than one on all of them, so the competent-model gate is, if anything, lenient there.
NGRAM_TRAIN_TOKENS = 8_000_000


@dataclass(frozen=True)
class Sitting:
    """When this invocation of a compare started, and the machine then (its load average included): what the
    results say of the sitting that wrote them."""

    started: float  # time.perf_counter()
    machine: str
    load_average: list[float] | None

    @classmethod
    def now(cls) -> Sitting:
        return cls(time.perf_counter(), machine_description(torch.get_num_threads()), load_average())


def assemble(
    spec: CompareSpec,
    configs: dict[str, ModelConfig],
    corpus: Corpus,
    runs: dict[str, list[LMRun]],
    bench: BenchRecord,
    task_results: dict[str, TaskResult],
    out_dir: Path,
    device: torch.device,
    sitting: Sitting,
) -> CompareResults:
    """The comparison's results: ``runs`` holds each variant's runs in the order of its seeds."""
    train, labels = spec.train, spec.variant_labels
    return CompareResults(
        schema_version=SCHEMA_VERSION,
        attnzoo_version=__version__,
        created=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        command=sys.argv,
        preset=spec.name,
        spec=jsonable(spec.to_dict()),
        baseline=labels[0],
        seeds=list(spec.seeds),
        budget=Budget(
            steps=train.steps,
            batch_size=train.batch_size,
            seq_len=train.seq_len,
            lr=train.lr,
            warmup_steps=train.warmup_steps,
            min_lr=train.lr * train.min_lr_ratio,
            tokens_per_run=train.steps * train.tokens_per_step,
            runs=len(spec.seeds) * len(labels),
            train_seconds_total=sum(r.train_seconds for by_seed in runs.values() for r in by_seed),
            wall_seconds_this_invocation=time.perf_counter() - sitting.started,
        ),
        evals=spec.evals,
        corpus=CorpusInfo(
            corpus.name, corpus.tokenizer.kind, len(corpus.train), len(corpus.val), ngram_level(corpus, out_dir)
        ),
        machine=MachineInfo(
            description=sitting.machine,
            platform=platform.platform(),
            python=platform.python_version(),
            torch=torch.__version__,
            device=str(device),
            cpu_count=os.cpu_count(),
            torch_threads=torch.get_num_threads(),
            load_average_start=sitting.load_average,
            load_average_end=load_average(),
        ),
        variants={
            label: VariantResult(
                config=configs[label].to_dict(),
                parameters=runs[label][0].parameters,
                kv_cache_bytes_per_token=kv_cache_bytes_per_token(configs[label]),
                map_note=ATTENTION.get(configs[label].attention).map_note,
                runs=runs[label],
            )
            for label in labels
        },
        bench=bench,
        tasks=task_results,
    )


def ngram_level(corpus: Corpus, out_dir: Path) -> NGramLevel:
    """The corpus's trigram level, kept beside the runs: counting a large corpus takes a while, once."""
    path = out_dir / NGRAM
    stored = read_record(NGramLevel, path)
    counted = (min(len(corpus.train), NGRAM_TRAIN_TOKENS), len(corpus.val))
    if stored is not None and (stored.train_tokens, stored.val_tokens) == counted:
        return stored
    level = corpus_ngram_level(corpus)
    write_record(level, path)
    return level


def corpus_ngram_level(corpus: Corpus) -> NGramLevel:
    """The level every judged language model must beat: a trigram count model (attnzoo.evals.ngram)."""
    train = corpus.train[:NGRAM_TRAIN_TOKENS]
    return kneser_ney_level(train, corpus.val, corpus.tokenizer.vocab_size, order=3)


def with_ngram_level(results: CompareResults) -> CompareResults:
    """``results`` with its corpus's trigram level, counted from the corpus its spec names where the file (written
    before the level was kept) lacks it; refused where that corpus no longer tokenizes to the same splits."""
    if results.corpus.ngram is not None:
        return results
    data = DataConfig(**results.spec["train"]["data"])
    corpus = prepare_corpus(data.corpus, data.tokenizer, data.val_fraction)
    found, stored = (len(corpus.train), len(corpus.val)), (results.corpus.train_tokens, results.corpus.val_tokens)
    if found != stored:
        raise ValueError(
            f"the corpus {data.corpus!r} now gives {found[0]:,} training and {found[1]:,} validation tokens, where "
            f"the results were trained on {stored[0]:,} and {stored[1]:,}: its n-gram level cannot be counted here"
        )
    return dataclasses.replace(results, corpus=dataclasses.replace(results.corpus, ngram=corpus_ngram_level(corpus)))


def kv_cache_bytes_per_token(config: ModelConfig) -> int:
    """What the model's static cache allocates per position, over all layers, at its parameters' dtype."""
    with torch.device("meta"):
        cache = Transformer(config).new_cache(1, config.max_seq_len)
    total = sum(b.numel() * b.element_size() for layer in cache.layers for b in layer.buffers.values())
    return total // config.max_seq_len


def load_average() -> list[float] | None:
    return list(os.getloadavg()) if hasattr(os, "getloadavg") else None
