"""Tokenizers: byte-level (lossless for any text, the default) and char-level (vocabulary built from a corpus).

Both map text to a numpy array of ids and back, and serialise to a small JSON-able dict that is stored with
every run and checkpoint, so a model is always decoded with the vocabulary it was trained on.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable
from typing import Any, ClassVar

import numpy as np

TOKENIZERS = ("byte", "char")


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

    @property
    def dtype(self) -> np.dtype:
        """The smallest unsigned integer type that holds every id: how token files are stored."""
        return np.dtype(np.uint8 if self.vocab_size <= 256 else np.uint16)


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


def tokenizer_from_dict(data: dict[str, Any]) -> Tokenizer:
    """Rebuild a tokenizer from :meth:`Tokenizer.to_dict`; a malformed dict raises ``ValueError``."""
    kind = data.get("kind") if isinstance(data, dict) else None
    if kind == "byte" and set(data) == {"kind"}:
        return ByteTokenizer()
    if kind == "char" and set(data) == {"kind", "chars"} and isinstance(data["chars"], str):
        return CharTokenizer(data["chars"])
    raise ValueError(
        f"not a tokenizer description: {str(data)[:120]}; expected {{'kind': 'byte'}} or "
        "{'kind': 'char', 'chars': '<sorted characters>'}"
    )
