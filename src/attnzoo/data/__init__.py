"""Tokenizers, corpora and batching for language-model training."""

from attnzoo.data.batches import BatchSchedule, eval_window_starts, gather_windows, window_starts
from attnzoo.data.corpora import CORPORA, Corpus, CorpusError, cache_dir, prepare_corpus
from attnzoo.data.tokenizers import TOKENIZERS, ByteTokenizer, CharTokenizer, Tokenizer, tokenizer_from_dict

__all__ = [
    "CORPORA",
    "TOKENIZERS",
    "BatchSchedule",
    "ByteTokenizer",
    "CharTokenizer",
    "Corpus",
    "CorpusError",
    "Tokenizer",
    "cache_dir",
    "eval_window_starts",
    "gather_windows",
    "prepare_corpus",
    "tokenizer_from_dict",
    "window_starts",
]
