"""A saved model loads as it was saved, or not at all (#17.9, #17.10).

Every way in (``Transformer.from_pretrained``; ``load_pretrained``, which the commands use; ``--init-from``'s
``init_from_pretrained``) refuses weights that are not floats or not finite and a ``config.json`` that lacks a
field of the architecture, and says so when floats of another dtype are converted.
"""

import dataclasses
import json
import logging

import pytest
import torch
from safetensors.torch import load_file, save_file

from attnzoo import ModelConfig, Transformer
from attnzoo.config import NOT_ARCHITECTURE
from attnzoo.training import CheckpointError, load_pretrained, read_checkpoint
from attnzoo.training.finetune import init_from_pretrained

CONFIG = ModelConfig(vocab_size=64, dim=16, n_layers=1, n_heads=2, max_seq_len=16)

LOADERS = {
    "from_pretrained": Transformer.from_pretrained,
    "load_pretrained": lambda directory: load_pretrained(directory)[0],
    "init_from": lambda directory: init_from_pretrained(Transformer(CONFIG), read_checkpoint(directory)),
}


@pytest.fixture
def saved(tmp_path):
    model = Transformer(CONFIG).eval()
    model.save_pretrained(tmp_path)
    return tmp_path, model


def _rewrite_weights(directory, change):
    path = directory / "model.safetensors"
    save_file({name: change(tensor) for name, tensor in load_file(path).items()}, path)


def _edit_config(directory, change):
    path = directory / "config.json"
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


@pytest.mark.parametrize("load", LOADERS.values(), ids=LOADERS.keys())
@pytest.mark.parametrize(
    ("change", "words"),
    [
        (lambda t: (t * 100).to(torch.int32), r"tensor '.*' is stored as int32 .*must be stored as bfloat16, float16"),
        (lambda t: t.to(torch.bool), r"tensor .* is stored as bool"),
        (lambda t: torch.full_like(t, float("nan")), r"tensor '.*' holds [\d,]+ NaN or infinite value\(s\) of"),
        (lambda t: t.double() * 1e300, r"tensor .* NaN or infinite value\(s\) of [\d,]+ \(after loading as float32\)"),
    ],
    ids=["int32", "bool", "nan", "beyond-float32"],
)
def test_weights_that_are_not_finite_floats_are_refused_naming_the_tensor(saved, load, change, words):
    """from_pretrained cast integer weights to float32 and loaded all-NaN ones."""
    directory, _ = saved
    _rewrite_weights(directory, change)
    with pytest.raises((ValueError, CheckpointError), match=r"model\.safetensors: " + words):
        load(directory)


@pytest.mark.parametrize("load", LOADERS.values(), ids=LOADERS.keys())
@pytest.mark.parametrize(
    ("dtype", "how"),
    [(torch.float16, "widened exactly"), (torch.bfloat16, "widened exactly"), (torch.float64, "rounded")],
)
def test_floats_of_another_dtype_load_with_a_warning_naming_it(saved, load, dtype, how, caplog):
    """from_pretrained cast fp16 weights to fp32 without a word."""
    directory, _ = saved
    _rewrite_weights(directory, lambda t: t.to(dtype))
    with caplog.at_level(logging.WARNING, logger="attnzoo"):
        load(directory)
    name = str(dtype).removeprefix("torch.")
    assert f"stores {name} weights; they are loaded into a float32 model, {how}" in caplog.text


def test_float32_weights_load_without_a_warning(saved, caplog):
    directory, model = saved
    with caplog.at_level(logging.WARNING, logger="attnzoo"):
        loaded = Transformer.from_pretrained(directory).eval()
    assert not caplog.text
    idx = torch.randint(0, 64, (1, 8))
    assert torch.equal(loaded(idx), model(idx))


@pytest.mark.parametrize("load", LOADERS.values(), ids=LOADERS.keys())
@pytest.mark.parametrize(
    ("change", "words"),
    [
        (lambda c: c.pop("norm_eps"), r"does not record norm_eps \(default 1e-05\)"),
        (lambda c: c["position_options"].pop("rope_theta"), r"does not record position_options.rope_theta \(default"),
        (lambda c: c.pop("causal"), r"does not record causal \(default True\)"),
        (lambda c: c.pop("n_kv_heads"), r"does not record n_kv_heads \(default derived\)"),
        (lambda c: [c.pop("norm_eps"), c.pop("mlp")], r"does not record mlp \(default 'swiglu'\), norm_eps"),
    ],
    ids=["norm_eps", "rope_theta", "causal", "n_kv_heads", "two"],
)
def test_a_config_without_an_architectural_key_is_refused_naming_the_key_and_its_default(saved, load, change, words):
    """Missing keys were filled with today's defaults, which changed the logits of a model saved with others."""
    directory, _ = saved
    _edit_config(directory, change)
    with pytest.raises((ValueError, CheckpointError), match=r"config\.json " + words + r".* add the key"):
        load(directory)


def test_a_config_without_the_fields_that_leave_outputs_alone_loads(saved):
    directory, model = saved
    _edit_config(directory, lambda c: [c.pop(name) for name in NOT_ARCHITECTURE])
    loaded = Transformer.from_pretrained(directory).eval()
    idx = torch.randint(0, 64, (1, 8))
    assert torch.equal(loaded(idx), model(idx))


def test_sinusoidal_positions_need_init_std_which_scales_their_table(tmp_path):
    """init_std sets the sinusoidal table's amplitude, so a config without it loaded other logits silently, and
    --init-from with another init_std was reported as computing what the source did."""
    config = ModelConfig(vocab_size=64, dim=16, n_layers=1, n_heads=2, max_seq_len=16, position="sinusoidal")
    source = dataclasses.replace(config, init_std=0.05)
    Transformer(source).save_pretrained(tmp_path)
    _edit_config(tmp_path, lambda c: c.pop("init_std"))
    with pytest.raises(ValueError, match=r"does not record init_std \(default 0\.02\)"):
        Transformer.from_pretrained(tmp_path)

    Transformer(source).save_pretrained(tmp_path)
    started = init_from_pretrained(Transformer(config), read_checkpoint(tmp_path))
    assert "init_std changes (0.05 → 0.02)" in started.not_identity
    same = init_from_pretrained(Transformer(source), read_checkpoint(tmp_path))
    assert same.not_identity == ()


@pytest.mark.parametrize(
    ("content", "words"),
    [
        (b"not json {", r"config\.json is not a JSON model config: Expecting value"),
        (b"\xff\xfe garbage", r"config\.json is not a JSON model config: 'utf-8' codec"),
        (b"[1, 2]", r"config\.json must hold a JSON object of ModelConfig fields, not list"),
    ],
    ids=["not-json", "not-utf8", "a-list"],
)
def test_an_unreadable_config_is_refused_naming_the_file(saved, content, words):
    """A non-JSON config.json gave a message that did not name the file (a raw UnicodeDecodeError for bytes)."""
    directory, _ = saved
    (directory / "config.json").write_bytes(content)
    with pytest.raises(ValueError, match=str(directory).replace(".", r"\.") + "/" + words):
        Transformer.from_pretrained(directory)


def test_convert_names_an_unreadable_hf_config(tmp_path, capsys):
    from attnzoo.cli import main

    (tmp_path / "config.json").write_text("not json")
    assert main(["convert", "--from-hf", str(tmp_path), "--out", str(tmp_path / "out")]) == 1
    assert f"{tmp_path}/config.json is not a JSON model config" in capsys.readouterr().err
