import dataclasses
import json

import pytest

from attnzoo import ModelConfig

BASE = dict(vocab_size=64, dim=32, n_layers=2, n_heads=4, max_seq_len=16)


def make(**overrides):
    return ModelConfig(**{**BASE, **overrides})


def test_derived_fields_are_resolved():
    cfg = make()
    assert cfg.n_kv_heads == 4
    assert cfg.head_dim == 32 // 4
    assert cfg.mlp_hidden_dim % 32 == 0 and cfg.mlp_hidden_dim >= 8 * 32 / 3
    assert make(mlp="gelu").mlp_hidden_dim == 4 * 32
    # Options dicts are completed with defaults so the saved config is the full architecture.
    assert cfg.position_options["rope_theta"] == 10000.0


def test_json_round_trip(tmp_path):
    cfg = make(n_kv_heads=2, position="rope", position_options={"partial_rotary_factor": 0.5, "rope_type": "linear"})
    path = tmp_path / "config.json"
    cfg.to_json(path)
    assert ModelConfig.from_json(path) == cfg
    assert ModelConfig.from_json(cfg.to_json()) == cfg
    assert json.loads(path.read_text())["n_kv_heads"] == 2


def test_replace_revalidates():
    with pytest.raises(ValueError, match="n_kv_heads"):
        dataclasses.replace(make(), n_kv_heads=3)


@pytest.mark.parametrize(
    ("overrides", "names"),
    [
        (dict(vocab_size=0), ["vocab_size=0", ">= 1"]),
        (dict(dim=1.5), ["dim=1.5", "integer"]),
        (dict(n_layers=True), ["n_layers=True"]),
        (dict(n_heads=0), ["n_heads=0"]),
        (dict(n_heads=5), ["n_heads=5", "must divide dim=32"]),
        (dict(n_kv_heads=3), ["n_kv_heads=3", "must divide n_heads=4"]),
        (dict(n_kv_heads=8), ["n_kv_heads=8", "[1, n_heads=4]"]),
        (dict(head_dim=0), ["head_dim=0"]),
        (dict(mlp="relu"), ["mlp='relu'", "swiglu", "gelu"]),
        (dict(mlp_hidden_dim=-1), ["mlp_hidden_dim=-1"]),
        (dict(norm="batchnorm"), ["norm='batchnorm'", "rmsnorm", "layernorm"]),
        (dict(norm_eps=0), ["norm_eps=0"]),
        (dict(dropout=1.0), ["dropout=1.0", "[0, 1)"]),
        (dict(bias="yes"), ["bias='yes'", "true or false"]),
        (dict(tie_embeddings=1), ["tie_embeddings=1"]),
        (dict(max_seq_len=0), ["max_seq_len=0"]),
        (dict(attn_backend="flash"), ["attn_backend='flash'", "auto", "eager", "sdpa"]),
        (dict(init_std=-0.1), ["init_std=-0.1"]),
        (dict(attention="nope"), ["attention='nope'", "mha"]),
        (dict(position="xpos"), ["position='xpos'", "alibi", "rope"]),
        (dict(attention_options={"window": 3}), ["attention_options", "window", "mha"]),
        (dict(position_options={"theta": 3}), ["position_options", "theta", "rope_theta"]),
        (dict(position="alibi", position_options={"slopes": 1}), ["position_options", "slopes"]),
        (dict(position_options={"rope_type": "ntk"}), ["rope_type='ntk'", "yarn", "llama3"]),
        (dict(position_options={"rope_theta": 1}), ["rope_theta=1"]),
        (dict(position_options={"partial_rotary_factor": 0}), ["partial_rotary_factor=0"]),
        (dict(position_options={"factor": 0.5}), ["factor=0.5"]),
        (dict(position_options={"low_freq_factor": 4}), ["high_freq_factor=4.0", "low_freq_factor=4"]),
        # head_dim 8 × 0.1 → 0 rotated dims; × 0.75 → 6 is fine; head_dim 6 × 0.5 → 3 is odd.
        (dict(position_options={"partial_rotary_factor": 0.1}), ["partial_rotary_factor=0.1", "even"]),
        (dict(head_dim=6, position_options={"partial_rotary_factor": 0.5}), ["partial_rotary_factor=0.5", "got 3"]),
        (dict(dim=33, n_heads=3, position="sinusoidal"), ["dim=33", "even"]),
        (dict(attention_options=[1]), ["attention_options=[1]", "dict"]),
        # A string is not a switch: "no" would otherwise count as true and turn interleaving on.
        (dict(position_options={"interleaved": "no"}), ["interleaved='no'", "true or false"]),
        (dict(position_options={"rope_theta": "abc"}), ["rope_theta='abc'", "number"]),
        (dict(position_options={"original_max_position_embeddings": 0}), ["original_max_position_embeddings=0"]),
        (dict(position_options={"attention_factor": "2"}), ["attention_factor='2'"]),
        (
            dict(position_options={"rope_type": "dynamic", "partial_rotary_factor": 0.25}),
            ["rope_type='dynamic'", "more than 2 rotated dims"],
        ),
    ],
)
def test_every_bad_field_names_field_value_and_allowed(overrides, names):
    with pytest.raises(ValueError) as err:
        make(**overrides)
    for fragment in names:
        assert fragment in str(err.value), f"{fragment!r} missing from: {err.value}"


def test_unknown_json_field_is_refused():
    with pytest.raises(ValueError, match=r"unknown ModelConfig field\(s\) \['n_embd'\]"):
        ModelConfig.from_dict({**BASE, "n_embd": 32})


def test_malformed_json_is_a_clear_error(tmp_path):
    path = tmp_path / "config.json"
    path.write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        ModelConfig.from_json(path)
