"""Tokenizers, corpora and batching for language-model training."""

from attnzoo.data.batches import BatchSchedule, eval_window_starts, gather_windows, window_starts
from attnzoo.data.corpora import CORPORA, Corpus, CorpusError, cache_dir, prepare_corpus
from attnzoo.data.tokenizers import (
    HF_PREFIX,
    TOKENIZERS,
    ByteTokenizer,
    CharTokenizer,
    HFTokenizer,
    MissingDependencyError,
    Tokenizer,
    tokenizer_from_dict,
    tokenizer_from_name,
)

__all__ = [
    "CORPORA",
    "HF_PREFIX",
    "TOKENIZERS",
    "BatchSchedule",
    "ByteTokenizer",
    "CharTokenizer",
    "Corpus",
    "CorpusError",
    "HFTokenizer",
    "MissingDependencyError",
    "Tokenizer",
    "cache_dir",
    "eval_window_starts",
    "gather_windows",
    "prepare_corpus",
    "tokenizer_from_dict",
    "tokenizer_from_name",
    "window_starts",
]
