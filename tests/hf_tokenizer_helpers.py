"""Tiny Hugging Face tokenizers, trained on a few sentences and saved as ``save_pretrained`` saves them.

Two styles, as pretrained decoder-only models ship them: byte-level BPE (GPT-2, GPT-NeoX/Pythia, Llama 3)
and SentencePiece-style BPE with byte fallback (Llama 2, Mistral). transformers and tokenizers are imported
inside the builders, so that test modules can skip when they are missing.
"""

from __future__ import annotations

import json
from pathlib import Path

from training_helpers import WORDS

SENTENCES = [
    " ".join(WORDS),
    " ".join(reversed(WORDS)),
    "the king and the queen sat while the fool sang\n",
    "his songs were of rome and of a stone throne\n",
]


def _trained_bpe(pre_tokenizer, vocab_size: int, **trainer_options) -> tuple[dict[str, int], list[tuple[str, str]]]:
    from tokenizers import Tokenizer, models, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizer
    tokenizer.train_from_iterator(SENTENCES, trainers.BpeTrainer(vocab_size=vocab_size, **trainer_options))
    model = json.loads(tokenizer.to_str())["model"]
    return model["vocab"], [tuple(merge) for merge in model["merges"]]


def save_byte_level_tokenizer(directory: Path, vocab_size: int = 300) -> Path:
    """A GPT-2 tokenizer of ``vocab_size`` ids (256 bytes, learned merges, ``<|endoftext|>``)."""
    import transformers
    from tokenizers import pre_tokenizers

    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False)
    vocab, merges = _trained_bpe(
        byte_level, vocab_size, special_tokens=["<|endoftext|>"], initial_alphabet=byte_level.alphabet()
    )
    transformers.GPT2Tokenizer(vocab=vocab, merges=merges).save_pretrained(directory)
    return directory


def save_sentencepiece_tokenizer(directory: Path) -> Path:
    """A Llama tokenizer: ``<unk> <s> </s>``, the 256 byte-fallback tokens ``<0x00>``…, then learned pieces."""
    import transformers
    from tokenizers import pre_tokenizers

    pieces, merges = _trained_bpe(pre_tokenizers.Metaspace(), 120)
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"<0x{byte:02X}>": 3 + byte for byte in range(256)}}
    for piece in pieces:
        vocab.setdefault(piece, len(vocab))
    transformers.LlamaTokenizer(vocab=vocab, merges=merges).save_pretrained(directory)
    return directory
