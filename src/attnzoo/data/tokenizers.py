"""Tokenizers: byte-level (lossless for any text, the default), char-level (vocabulary built from a corpus) and
a Hugging Face model's own (its ``tokenizer.json``, read from local files).

Each maps text to a numpy array of ids and back, and serialises to a JSON-able dict that is stored with
every run and checkpoint, so a model is always decoded with the vocabulary it was trained on.
"""

from __future__ import annotations

import copy
import json
import os
import re
from abc import ABC, abstractmethod
from collections.abc import Iterable
from pathlib import Path
from types import ModuleType
from typing import Any, ClassVar

import numpy as np

from attnzoo.io import file_kind

TOKENIZERS = ("byte", "char")  # the tokenizers named by their kind alone
HF_PREFIX = "hf:"  # "hf:PATH" names a Hugging Face tokenizer.json, or a directory holding one
HF_TOKENIZER_FILE = "tokenizer.json"
TOKENIZER_CHOICES = "'byte', 'char' or 'hf:PATH' (a Hugging Face tokenizer.json, or a directory holding one)"


class MissingDependencyError(ImportError):
    """An optional dependency is not installed; the message says how to install it."""


class Tokenizer(ABC):
    kind: ClassVar[str]

    @property
    @abstractmethod
    def vocab_size(self) -> int: ...

    @abstractmethod
    def encode(self, text: str) -> np.ndarray:
        """Token ids of ``text`` as a 1-D array of :attr:`dtype`."""

    @abstractmethod
    def decode(self, ids: Iterable[int]) -> str: ...

    @abstractmethod
    def token_bytes(self) -> np.ndarray:
        """The UTF-8 length of every token, (vocab_size,): the denominator of bits per byte."""

    @abstractmethod
    def to_dict(self) -> dict[str, Any]: ...

    def padded_to(self, vocab_size: int) -> Tokenizer:
        """This tokenizer as the tokenizer of a model with ``vocab_size`` embedding rows.

        Only a tokenizer whose models may pad their embeddings past its ids (:class:`HFTokenizer`) adapts;
        the others are returned as they are, for the caller's vocabulary check to refuse a mismatch.
        """
        return self

    @property
    def dtype(self) -> np.dtype:
        """The smallest unsigned integer type that holds every id: how token files are stored."""
        for dtype in (np.uint8, np.uint16):
            if self.vocab_size <= np.iinfo(dtype).max + 1:
                return np.dtype(dtype)
        return np.dtype(np.uint32)


class ByteTokenizer(Tokenizer):
    """One token per UTF-8 byte: vocabulary 256, no unknown symbols, exact round trip for any text."""

    kind = "byte"

    @property
    def vocab_size(self) -> int:
        return 256

    def encode(self, text: str) -> np.ndarray:
        return np.frombuffer(text.encode("utf-8"), dtype=np.uint8)

    def decode(self, ids: Iterable[int]) -> str:
        # Sampled bytes need not form valid UTF-8; show the broken sequence rather than fail.
        return bytes(int(i) for i in ids).decode("utf-8", errors="replace")

    def token_bytes(self) -> np.ndarray:
        return np.ones(256, dtype=np.int64)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind}

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ByteTokenizer)

    def __hash__(self) -> int:
        return hash(self.kind)


class CharTokenizer(Tokenizer):
    """One token per Unicode character of a fixed vocabulary, ids in code-point order."""

    kind = "char"
    MAX_VOCAB = 1 << 16  # ids are stored as uint16

    def __init__(self, chars: str):
        if not chars:
            raise ValueError("a char tokenizer needs at least one character")
        if list(chars) != sorted(set(chars)):
            raise ValueError("chars must be sorted and unique (use CharTokenizer.from_texts)")
        if len(chars) > self.MAX_VOCAB:
            raise ValueError(
                f"the text has {len(chars)} distinct characters, more than a char tokenizer stores "
                f"({self.MAX_VOCAB}); use the byte tokenizer"
            )
        self.chars = chars
        self._code_points = np.array([ord(c) for c in chars], dtype=np.uint32)

    @classmethod
    def from_texts(cls, texts: Iterable[str]) -> CharTokenizer:
        seen: set[str] = set()
        for text in texts:
            seen.update(text)
        return cls("".join(sorted(seen)))

    @property
    def vocab_size(self) -> int:
        return len(self.chars)

    def encode(self, text: str) -> np.ndarray:
        code_points = np.frombuffer(text.encode("utf-32-le"), dtype="<u4")
        ids = np.searchsorted(self._code_points, code_points)
        known = ids < len(self.chars)
        known[known] = self._code_points[ids[known]] == code_points[known]
        if not known.all():
            unknown = sorted({chr(c) for c in code_points[~known]})
            raise ValueError(
                f"text has {len(unknown)} character(s) outside the tokenizer's vocabulary of {self.vocab_size}, "
                f"e.g. {unknown[:5]}; the byte tokenizer accepts any text"
            )
        return ids.astype(self.dtype)

    def decode(self, ids: Iterable[int]) -> str:
        return "".join(self.chars[int(i)] for i in ids)

    def token_bytes(self) -> np.ndarray:
        return np.array([len(c.encode("utf-8")) for c in self.chars], dtype=np.int64)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "chars": self.chars}

    def __eq__(self, other: object) -> bool:
        return isinstance(other, CharTokenizer) and other.chars == self.chars

    def __hash__(self) -> int:
        return hash((self.kind, self.chars))


def _tokenizers_library() -> ModuleType:
    try:
        import tokenizers
    except ImportError:
        raise MissingDependencyError(
            'a Hugging Face tokenizer needs the `tokenizers` library: pip install -e ".[hf]" in the attnzoo checkout'
        ) from None
    return tokenizers


# Decoder steps whose effect on each token's bytes is known, as the `tokenizers` library serialises them.
DECODER_STEPS = ("ByteLevel", "ByteFallback", "Replace", "Metaspace", "Strip", "Fuse")
BYTE_FALLBACK_TOKEN = re.compile(r"<0x[0-9A-Fa-f]{2}>")


def _decoder_steps(decoder: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The decoder's steps in order, nested sequences flattened. A decoder whose steps are not all in
    :data:`DECODER_STEPS` is refused: its tokens' byte lengths, which bits per byte divides by, are unknown."""
    if decoder is None:
        raise ValueError(
            "the tokenizer has no decoder, so decoding joins its tokens with spaces and their byte lengths are "
            f"not those of the text; supported decoder steps: {list(DECODER_STEPS)}"
        )
    if decoder.get("type") == "Sequence":
        return [step for inner in decoder["decoders"] for step in _decoder_steps(inner)]
    if decoder.get("type") not in DECODER_STEPS:
        raise ValueError(
            f"the tokenizer's decoder step {decoder.get('type')!r} is not supported (bits per byte needs every "
            f"token's byte length); supported: {list(DECODER_STEPS)}"
        )
    if decoder["type"] == "Replace" and "String" not in decoder["pattern"]:
        raise ValueError(
            f"the tokenizer's decoder replaces a regular expression, {decoder['pattern']}; only a "
            "plain string replacement is supported"
        )
    return [decoder]


def _decoded_length(token: str, steps: list[dict[str, Any]], byte_alphabet: frozenset[str]) -> int:
    """UTF-8 bytes that ``token`` contributes to a decoded text, following the library's decoder steps.

    Steps after a fusing one (``Fuse``, ``ByteLevel``) see the whole text, not single tokens: what they do
    (Llama's ``Strip`` of the space its encoder prefixed) happens once per text and is not counted here.
    """
    for step in steps:
        kind = step["type"]
        if kind == "ByteLevel":
            # Each character stands for one byte (GPT-2's byte-to-unicode table); a token with a character
            # outside the table (an added token) is emitted as its own UTF-8, as the library does.
            return len(token) if set(token) <= byte_alphabet else len(token.encode("utf-8"))
        if kind == "ByteFallback" and BYTE_FALLBACK_TOKEN.fullmatch(token):
            return 1
        if kind == "Replace":
            token = token.replace(step["pattern"]["String"], step["content"])
        elif kind == "Metaspace":
            token = token.replace(step["replacement"], " ")
        elif kind == "Strip":  # at most `start` leading and `stop` trailing `content` characters
            leading = len(token) - len(token.lstrip(step["content"]))
            trailing = len(token) - len(token.rstrip(step["content"]))
            begin = min(leading, step["start"])
            token = token[begin : max(len(token) - min(trailing, step["stop"]), begin)]
        elif kind == "Fuse":
            break
    return len(token.encode("utf-8"))


class HFTokenizer(Tokenizer):
    """A Hugging Face ``tokenizers`` tokenizer: a model's ``tokenizer.json``, read from local files only.

    Text is encoded without adding special tokens (no BOS or EOS: a corpus is one plain token stream, as with
    the other tokenizers); special tokens written out in the text are still matched, as the library does.
    The whole definition is stored with runs and checkpoints, so they need no file outside them.

    ``vocab_size`` may exceed the ids the tokenizer produces (:attr:`num_ids`): HF models often pad their
    embedding matrix to a multiple of 64 or 128 (Pythia: 50,304 rows for 50,277 ids). Padding ids are never
    encoded, decode to nothing and count 0 bytes.

    Bits per byte divides by :meth:`token_bytes`, each token's UTF-8 length in the decoded text. For byte-level
    BPE (GPT-2, GPT-NeoX/Pythia, Llama 3) and byte-fallback tokens the lengths of a text's tokens sum to its
    exact UTF-8 length. A SentencePiece-style tokenizer (Llama 2, Mistral) prefixes each text it encodes with a
    space that its decoder strips again; that space is counted, one byte per document more than the text
    holds, so bits per byte reads low by that share (under 0.1% for documents of more than 1 kB).
    """

    kind = "hf"

    def __init__(self, definition: dict[str, Any], vocab_size: int | None = None):
        """``definition``: the parsed ``tokenizer.json``; ``vocab_size``: the model's embedding rows (default:
        the tokenizer's own :attr:`num_ids`)."""
        library = _tokenizers_library()
        try:
            self._tokenizer = library.Tokenizer.from_str(json.dumps(definition))
        except Exception as err:  # the library raises a bare Exception for a definition it cannot read
            raise ValueError(f"not a Hugging Face tokenizer definition: {err}") from None
        self._decoder_steps = _decoder_steps(definition.get("decoder"))
        vocabulary = self._tokenizer.get_vocab(with_added_tokens=True)
        if not vocabulary:
            raise ValueError("the Hugging Face tokenizer has an empty vocabulary")
        self.definition = definition
        self.num_ids = max(vocabulary.values()) + 1  # ids need not be contiguous
        vocab_size = self.num_ids if vocab_size is None else vocab_size
        if not isinstance(vocab_size, int) or isinstance(vocab_size, bool) or vocab_size < self.num_ids:
            raise ValueError(
                f"vocab_size={vocab_size!r} is invalid: the tokenizer produces ids up to {self.num_ids - 1}, so a "
                f"model using it needs at least {self.num_ids} embedding rows"
            )
        self._vocab_size = vocab_size
        self._own_token_bytes: np.ndarray | None = None  # computed when first asked for

    @classmethod
    def from_file(cls, path: str | os.PathLike) -> HFTokenizer:
        """Read ``path``: a ``tokenizer.json`` (as Hugging Face writes it, or as attnzoo stores an hf tokenizer
        with a run), or a directory holding one."""
        path = Path(path).expanduser()
        file = path / HF_TOKENIZER_FILE if path.is_dir() else path
        if not file.is_file():
            if file.exists():  # a device (hf:/dev/zero), FIFO or directory: never read, it may not end
                where = f"{file} is not a regular file (it is a {file_kind(file)})"
            else:
                where = f"{path} holds no {HF_TOKENIZER_FILE}" if path.is_dir() else f"{path} does not exist"
            raise FileNotFoundError(
                f"{where}: name a Hugging Face {HF_TOKENIZER_FILE}, or a directory holding one (save_pretrained "
                "writes it; a SentencePiece tokenizer.model alone is not read)"
            )
        try:
            data = json.loads(file.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
            raise ValueError(f"{file} is not a readable JSON tokenizer: {err}") from None
        tokenizer = tokenizer_from_dict(data)
        if not isinstance(tokenizer, HFTokenizer):
            raise ValueError(f"{file} describes a {tokenizer.kind} tokenizer, not a Hugging Face one")
        return tokenizer

    @property
    def vocab_size(self) -> int:
        return self._vocab_size

    def encode(self, text: str) -> np.ndarray:
        return np.array(self._tokenizer.encode(text, add_special_tokens=False).ids, dtype=self.dtype)

    def decode(self, ids: Iterable[int]) -> str:
        # Padding ids, which have no token, are skipped by the library.
        return self._tokenizer.decode([int(i) for i in ids], skip_special_tokens=False)

    def token_bytes(self) -> np.ndarray:
        if self._own_token_bytes is None:
            byte_alphabet = frozenset(_tokenizers_library().pre_tokenizers.ByteLevel.alphabet())
            lengths = np.zeros(self.num_ids, dtype=np.int64)
            for token, index in self._tokenizer.get_vocab(with_added_tokens=True).items():
                lengths[index] = _decoded_length(token, self._decoder_steps, byte_alphabet)
            self._own_token_bytes = lengths
        return np.pad(self._own_token_bytes, (0, self.vocab_size - self.num_ids))

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "vocab_size": self.vocab_size, "tokenizer": self.definition}

    def padded_to(self, vocab_size: int) -> HFTokenizer:
        if vocab_size < self.num_ids or vocab_size == self.vocab_size:
            return self
        padded = copy.copy(self)  # shares the parsed tokenizer and its byte lengths, which padding leaves alone
        padded._vocab_size = vocab_size
        return padded

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, HFTokenizer)
            and other.vocab_size == self.vocab_size
            and other.definition == self.definition
        )

    def __hash__(self) -> int:
        return hash((self.kind, self.vocab_size, self.num_ids))


def is_tokenizer_name(name: object) -> bool:
    """Whether ``name`` is a tokenizer setting: 'byte', 'char' or 'hf:PATH'."""
    return isinstance(name, str) and (name in TOKENIZERS or (name.startswith(HF_PREFIX) and name != HF_PREFIX))


def tokenizer_from_name(name: str) -> Tokenizer:
    """The tokenizer that ``name`` gives without a corpus: 'byte', or 'hf:PATH' read from that file or directory.
    (A 'char' vocabulary is built from a corpus's text by :func:`~attnzoo.data.prepare_corpus`.)"""
    if name == "byte":
        return ByteTokenizer()
    if name == "char":
        raise ValueError("a char tokenizer is built from a corpus's text: prepare_corpus(corpus, 'char') builds it")
    if not is_tokenizer_name(name):
        raise ValueError(f"tokenizer={name!r} is invalid: choose {TOKENIZER_CHOICES}")
    return HFTokenizer.from_file(name.removeprefix(HF_PREFIX))


def tokenizer_from_dict(data: dict[str, Any]) -> Tokenizer:
    """Rebuild a tokenizer from :meth:`Tokenizer.to_dict`, or read a Hugging Face ``tokenizer.json`` as it is
    (what ``attnzoo convert`` copies beside a model); a malformed dict raises ``ValueError``."""
    kind = data.get("kind") if isinstance(data, dict) else None
    if kind == "byte" and set(data) == {"kind"}:
        return ByteTokenizer()
    if kind == "char" and set(data) == {"kind", "chars"} and isinstance(data["chars"], str):
        return CharTokenizer(data["chars"])
    if kind == "hf" and set(data) == {"kind", "vocab_size", "tokenizer"} and isinstance(data["tokenizer"], dict):
        return HFTokenizer(data["tokenizer"], data["vocab_size"])
    if isinstance(data, dict) and kind is None and {"version", "model"} <= set(data):
        return HFTokenizer(data)
    raise ValueError(
        f"not a tokenizer description: {str(data)[:120]}; expected {{'kind': 'byte'}}, "
        "{'kind': 'char', 'chars': '<sorted characters>'}, {'kind': 'hf', 'vocab_size': N, 'tokenizer': {...}} "
        "or a Hugging Face tokenizer.json"
    )
