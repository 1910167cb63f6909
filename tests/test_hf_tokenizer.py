"""The ``hf`` tokenizer: a Hugging Face ``tokenizer.json`` read from local files, for models converted from HF.

Tokenizers are trained here on a few sentences (``hf_tokenizer_helpers``); nothing is downloaded.
"""

import json
import sys

import numpy as np
import pytest
from hf_tokenizer_helpers import save_byte_level_tokenizer, save_sentencepiece_tokenizer
from training_helpers import write_text_corpus

from attnzoo.cli import main
from attnzoo.data import HFTokenizer, MissingDependencyError, corpora, prepare_corpus, tokenizer_from_dict
from attnzoo.training import DataConfig

transformers = pytest.importorskip("transformers")

TEXTS = [
    "the king and queen of rome",
    "naïve café — 東京 🚀 words unseen in training\n\ttabs,  doubled   spaces\n\n",
    "a literal <|endoftext|> in the text, and <s> too",
]
STYLES = {"byte-level": save_byte_level_tokenizer, "sentencepiece": save_sentencepiece_tokenizer}


@pytest.fixture(scope="module", params=list(STYLES))
def saved(request, tmp_path_factory):
    """(style, a directory written by the tokenizer's save_pretrained)."""
    return request.param, STYLES[request.param](tmp_path_factory.mktemp(request.param))


@pytest.fixture(scope="module")
def byte_level(tmp_path_factory):
    return save_byte_level_tokenizer(tmp_path_factory.mktemp("byte-level"))


def test_ids_are_those_of_transformers_and_text_round_trips(saved):
    _, directory = saved
    reference = transformers.AutoTokenizer.from_pretrained(directory)
    tokenizer = HFTokenizer.from_file(directory)
    assert tokenizer.vocab_size == tokenizer.num_ids == len(reference)
    for text in TEXTS:
        ids = tokenizer.encode(text)
        assert ids.dtype == np.uint16  # 300+ ids
        # No BOS or EOS is added: a corpus is one plain token stream.
        assert ids.tolist() == reference(text, add_special_tokens=False)["input_ids"]
        assert tokenizer.decode(ids) == text
    assert tokenizer.decode([tokenizer.num_ids + 5]) == ""  # a padding id has no token


def test_token_bytes_count_the_text_exactly_for_byte_level_and_one_prefix_space_for_sentencepiece(saved):
    style, directory = saved
    tokenizer = HFTokenizer.from_file(directory)
    lengths = tokenizer.token_bytes()
    assert lengths.shape == (tokenizer.vocab_size,) and lengths.dtype == np.int64
    # SentencePiece prefixes each text with "▁" and its decoder strips the space again; it is counted once.
    extra = {"byte-level": 0, "sentencepiece": 1}[style]
    for text in TEXTS:
        assert lengths[tokenizer.encode(text)].sum() == len(text.encode("utf-8")) + extra
    if style == "byte-level":  # every token decoded alone: its bytes, where they form whole characters
        whole = [i for i in range(tokenizer.num_ids) if "\ufffd" not in tokenizer.decode([i])]
        assert len(whole) == tokenizer.num_ids - 128  # all but the lone bytes 0x80-0xFF
        assert all(lengths[i] == len(tokenizer.decode([i]).encode("utf-8")) for i in whole)


def test_it_is_stored_whole_and_read_back_from_either_form(saved, tmp_path):
    _, directory = saved
    tokenizer = HFTokenizer.from_file(directory)
    stored = json.loads(json.dumps(tokenizer.to_dict()))
    assert stored["kind"] == "hf" and stored["tokenizer"] == json.loads((directory / "tokenizer.json").read_text())
    assert tokenizer_from_dict(stored) == tokenizer
    # attnzoo's form, as a run stores it, also reads as a file; HF's form reads as a dict.
    (tmp_path / "tokenizer.json").write_text(json.dumps(stored))
    assert HFTokenizer.from_file(tmp_path / "tokenizer.json") == tokenizer_from_dict(stored["tokenizer"]) == tokenizer
    padded = tokenizer.padded_to(tokenizer.num_ids + 20)
    assert padded != tokenizer and tokenizer_from_dict(json.loads(json.dumps(padded.to_dict()))) == padded
    assert tokenizer.padded_to(tokenizer.num_ids - 1) is tokenizer  # too small: left for the caller to refuse


@pytest.mark.parametrize(
    ("vocab_size", "dtype"), [(None, np.uint16), (1 << 16, np.uint16), ((1 << 16) + 1, np.uint32), (128_256, np.uint32)]
)
def test_padded_vocabularies_past_65536_ids_are_stored_as_uint32(byte_level, tmp_path, vocab_size, dtype):
    tokenizer = HFTokenizer.from_file(byte_level)
    tokenizer = tokenizer if vocab_size is None else tokenizer.padded_to(vocab_size)
    assert tokenizer.dtype == dtype and tokenizer.encode("the king").dtype == dtype
    assert tokenizer.token_bytes().shape == (tokenizer.vocab_size,) and not tokenizer.token_bytes()[300:].any()
    text = write_text_corpus(tmp_path / "text.txt", n_words=300)
    corpus = prepare_corpus(str(text), tokenizer)
    assert corpus.tokens.dtype == dtype and corpus.info["dtype"] == np.dtype(dtype).name
    assert corpus.tokenizer == tokenizer and corpus.tokenizer.decode(corpus.tokens) == text.read_text()


def test_prepared_tokens_are_cached_per_tokenizer(byte_level, tmp_path, monkeypatch):
    text = str(write_text_corpus(tmp_path / "text.txt", n_words=300))
    other = save_sentencepiece_tokenizer(tmp_path / "other")
    first = prepare_corpus(text, f"hf:{byte_level}")
    assert "-hf-" in first.info["cache"] and first.tokenizer == HFTokenizer.from_file(byte_level)
    with monkeypatch.context() as patched:
        patched.setattr(corpora, "_build", lambda *a: pytest.fail("the cached tokens should have been reused"))
        assert prepare_corpus(text, f"hf:{byte_level / 'tokenizer.json'}").info["cache"] == first.info["cache"]
    caches = {
        first.info["cache"],
        prepare_corpus(text, f"hf:{other}").info["cache"],
        prepare_corpus(text).info["cache"],
    }
    assert len(caches) == 3


def test_missing_files_unsupported_decoders_and_bad_names_are_refused(byte_level, tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match=r"empty holds no tokenizer\.json: name a Hugging Face tokenizer"):
        HFTokenizer.from_file(tmp_path / "empty")
    with pytest.raises(FileNotFoundError, match=r"missing\.json does not exist"):
        HFTokenizer.from_file(tmp_path / "missing.json")
    definition = json.loads((byte_level / "tokenizer.json").read_text())
    with pytest.raises(ValueError, match=r"decoder step 'WordPiece' is not supported .* supported: \['ByteLevel'"):
        HFTokenizer({**definition, "decoder": {"type": "WordPiece", "prefix": "##", "cleanup": True}})
    with pytest.raises(ValueError, match="the tokenizer has no decoder"):
        HFTokenizer({**definition, "decoder": None})
    with pytest.raises(ValueError, match="vocab_size=10 is invalid: the tokenizer produces ids up to 299"):
        tokenizer_from_dict({"kind": "hf", "vocab_size": 10, "tokenizer": definition})
    with pytest.raises(ValueError, match="not a tokenizer description"):
        tokenizer_from_dict({"kind": "hf", "tokenizer": definition})
    for bad in ("hf:", "hf", "bpe"):
        with pytest.raises(ValueError, match=rf"tokenizer='{bad}' is invalid: choose 'byte', 'char' or 'hf:PATH'"):
            DataConfig(tokenizer=bad)


def test_without_the_tokenizers_library_the_error_says_what_to_install(byte_level, tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "tokenizers", None)  # `import tokenizers` now raises ImportError
    hint = r'needs the `tokenizers` library: pip install -e "\.\[hf\]" in the attnzoo checkout'
    with pytest.raises(MissingDependencyError, match=hint):
        HFTokenizer.from_file(byte_level)
    text = write_text_corpus(tmp_path / "text.txt", n_words=300)
    assert main(["train", "--data", str(text), "--tokenizer", f"hf:{byte_level}", "--out", str(tmp_path / "run")]) == 1
    missing = 'a Hugging Face tokenizer needs the `tokenizers` library: pip install -e ".[hf]" in the attnzoo checkout'
    assert capsys.readouterr().err == f"attnzoo train: error: {missing}\n"  # one line, no traceback
