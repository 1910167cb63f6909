"""attnzoo's tokenizers as Hugging Face ``tokenizers`` tokenizers, the ``tokenizer.json`` transformers reads.

Each encodes and decodes as attnzoo's does: bytes through the byte-level alphabet with no merges (invalid UTF-8
decodes to U+FFFD as Python's ``errors="replace"`` does), characters as a vocabulary of single symbols, and a
Hugging Face tokenizer as its own definition. No special token is added to encoded text, as in attnzoo.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from attnzoo.data.tokenizers import ByteTokenizer, CharTokenizer, HFTokenizer, Tokenizer

if TYPE_CHECKING:
    import tokenizers


def byte_symbols() -> dict[int, str]:
    """GPT-2's printable stand-in for each byte (``bytes_to_unicode`` in its encoder.py): the alphabet of the
    ``tokenizers`` library's ByteLevel pre-tokenizer and decoder. Printable Latin-1 bytes stand for themselves,
    the others for 256, 257, ... in byte order."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    others = [byte for byte in range(256) if byte not in printable]
    return {**{byte: chr(byte) for byte in printable}, **{byte: chr(256 + i) for i, byte in enumerate(others)}}


def hf_tokenizer(tokenizer: Tokenizer) -> tokenizers.Tokenizer:
    """The ``tokenizers`` tokenizer that gives ``tokenizer``'s ids for any text it encodes, and its text back.

    A char tokenizer refuses a character outside its vocabulary; the ``tokenizers`` one drops it.
    """
    from tokenizers import Tokenizer as Definition
    from tokenizers import decoders, models, pre_tokenizers

    if isinstance(tokenizer, HFTokenizer):
        return Definition.from_str(json.dumps(tokenizer.definition))
    if isinstance(tokenizer, ByteTokenizer):
        symbols = byte_symbols()
        byte_level = Definition(models.BPE(vocab={symbols[byte]: byte for byte in range(256)}, merges=[]))
        byte_level.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
        byte_level.decoder = decoders.ByteLevel()
        return byte_level
    if isinstance(tokenizer, CharTokenizer):
        # BPE without merges splits text into its characters, each one token; Fuse joins them back.
        chars = Definition(models.BPE(vocab={char: i for i, char in enumerate(tokenizer.chars)}, merges=[]))
        chars.decoder = decoders.Fuse()
        return chars
    raise ValueError(f"a {tokenizer.kind} tokenizer has no Hugging Face counterpart")
