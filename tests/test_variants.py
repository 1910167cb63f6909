import dataclasses

import pytest

from attnzoo import ModelConfig, Transformer
from attnzoo.variants import Variant, count_parameters, matched_configs, variant_config

BASE = ModelConfig(vocab_size=256, dim=128, n_layers=2, n_heads=8, max_seq_len=64)


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("mha", Variant("mha", "rope")),
        ("diff+alibi", Variant("diff", "alibi")),
        ("mha+rope+kv2", Variant("mha", "rope", 2)),
        (" selective + none ", Variant("selective", "none")),
        (
            "selective[value_temperature=false]+none",
            Variant("selective", "none", options=(("value_temperature", False),)),
        ),
        (
            "dcmha[rank=1, query_wise=true]+alibi+kv2",
            Variant("dcmha", "alibi", 2, (("query_wise", True), ("rank", 1))),
        ),
        ("selective[temperature_fn=mlp]", Variant("selective", "rope", options=(("temperature_fn", "mlp"),))),
        ("mha+rope+x1.5", Variant("mha", "rope", compute=1.5)),
        ("mha+rope+kv2+x2", Variant("mha", "rope", 2, compute=2.0)),
        ("mha+sinusoidal+len2", Variant("mha", "sinusoidal", length=2)),
        ("diff+alibi+kv2+len4+x1.5", Variant("diff", "alibi", 2, compute=1.5, length=4)),
    ],
)
def test_parse(spec, expected):
    assert Variant.parse(spec) == expected
    assert Variant.parse(expected.label) == expected


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("", "expected ATTENTION"),
        ("flash+rope", "'flash' is not a known attention mechanism"),
        ("mha+xpos", "'xpos' is not a known positional scheme"),
        ("mha+rope+kv0", "bad kv-head count '0'"),
        ("mha+rope+x0", r"bad compute multiple '0': expected xC with 0 < C <= 100"),
        ("mha+rope+x1.2.3", "bad compute multiple '1.2.3'"),
        ("mha+rope+x2+kv2", "expected ATTENTION"),
        ("mha+rope+alibi", "expected ATTENTION"),
        ("mha+rope+len1", r"bad length multiple '1': expected lenN with 2 <= N <= 64"),
        ("mha+rope+len", r"bad length multiple '': expected lenN"),
        ("mha+rope+len2+kv2", "expected ATTENTION"),
        ("mha+rope+kv2+up0.1+len2", r"an uptrained variant \(\+upF\) trains at its source's length; drop \+lenN"),
        ("mha[+rope", "expected ATTENTION"),
        ("selective[bogus=1]+rope", r"'selective\[bogus=1\]\+rope'.*unknown option\(s\) \['bogus'\]"),
        ("selective[value_temperature=2]", "value_temperature=2 is invalid: must be true or false"),
        ("selective[value_temperature]", "must be KEY=VALUE"),
        # The last value won silently: which one was meant is not for the parser to guess.
        (
            "selective[value_temperature=false,value_temperature=true]",
            r"option value_temperature is given more than once \(false, true\)",
        ),
    ],
)
def test_parse_errors_name_the_spec(spec, message):
    with pytest.raises(ValueError, match=message):
        Variant.parse(spec)


def test_options_reach_the_variants_config():
    options_label = "selective[value_temperature=false]+rope"
    configs = matched_configs([Variant.parse("selective+rope"), Variant.parse(options_label)], BASE)
    assert configs["selective+rope"].attention_options["value_temperature"] is True
    assert configs[options_label].attention_options["value_temperature"] is False


def test_count_parameters_equals_a_built_model():
    assert count_parameters(BASE) == Transformer(BASE).num_parameters()


def test_diff_pairs_with_half_the_heads_of_twice_the_size():
    cfg = variant_config(Variant("diff", "rope", 4), BASE)
    assert (cfg.n_heads, cfg.n_kv_heads, cfg.head_dim) == (4, 2, 32)
    assert variant_config(Variant("mha", "alibi"), BASE).n_heads == 8


def test_matched_configs_are_within_two_percent_of_the_baseline():
    variants = [Variant.parse(s) for s in ("mha+rope", "diff+rope", "diff_v2+rope", "selective+rope", "mha+rope+kv1")]
    target = count_parameters(BASE)
    configs = matched_configs(variants, BASE)
    assert list(configs) == [v.label for v in variants]
    for cfg in configs.values():
        assert abs(count_parameters(cfg) - target) / target <= 0.02
    # MQA drops most k/v weights; the matcher widens its MLP to make up for them.
    assert configs["mha+rope+kv1"].mlp_hidden_dim > configs["mha+rope"].mlp_hidden_dim


def test_unmatchable_variant_is_refused():
    tiny = ModelConfig(vocab_size=4096, dim=16, n_layers=1, n_heads=2, mlp_hidden_dim=8)
    with pytest.raises(ValueError, match="cannot match"):
        matched_configs([Variant("mha", "learned")], tiny, tolerance=1e-6)


def test_labels_spell_word_options_bare_and_quote_only_what_would_parse_otherwise():
    assert Variant.parse('selective[temperature_fn="mlp"]').label == "selective[temperature_fn=mlp]+rope"
    assert Variant.parse("dcmha[window_type=LG]").label == "dcmha[window_type=LG]+rope"
    # The string "3" is quoted, or it would read back as the number 3.
    assert Variant("selective", options=(("temperature_fn", "3"),)).label == 'selective[temperature_fn="3"]+rope'


def test_a_compute_multiple_trains_the_same_model_longer():
    longer = Variant.parse("dcmha+rope+x1.5")
    assert longer.label == "dcmha+rope+x1.5" and longer.model_label == "dcmha+rope"
    assert longer.steps(300) == 450 and Variant.parse("mha+rope+x1").label == "mha+rope"
    configs = matched_configs([Variant.parse("mha+rope"), Variant.parse("mha+rope+x2")], BASE)
    assert configs["mha+rope+x2"] == configs["mha+rope"]


def test_a_length_multiple_trains_the_same_model_with_room_for_its_longer_sequences():
    longer = Variant.parse("mha+sinusoidal+len2")
    assert longer.label == "mha+sinusoidal+len2" and longer.model_label == "mha+sinusoidal" and longer.steps(300) == 300
    configs = matched_configs([Variant.parse("mha+sinusoidal"), longer], BASE)
    assert configs["mha+sinusoidal+len2"] == dataclasses.replace(
        configs["mha+sinusoidal"], max_seq_len=2 * BASE.max_seq_len
    )
    learned = matched_configs([Variant.parse("mha+learned+len2")], BASE)["mha+learned+len2"]
    assert learned.max_seq_len == 128 and abs(count_parameters(learned) / count_parameters(BASE) - 1) <= 0.02


BENCH_TINY = [
    "--seq-lens",
    "8",
    "--modes",
    "train",
    "--repeats",
    "1",
    "--rounds",
    "1",
    "--dim",
    "32",
    "--n-layers",
    "1",
]


@pytest.mark.parametrize(
    ("argv", "parts"),
    [
        (["bench", "--variants", "mha+rope", "mha+rope+len4"], "+len4 says"),
        (["bench", "--variants", "mha+rope+kv2+up0.05"], "+up0.05 says"),
        (["bench", "--variants", "mha+rope+len2+x1.5"], "+len2 +x1.5 say"),
        (["eval", "--task", "graph", "--variant", "mha+none+len4"], "+len4 says"),
        (["eval", "--task", "mqar", "--variant", "mha+rope+x2"], "+x2 says"),
    ],
)
def test_the_parts_that_say_how_a_comparison_trains_are_refused_where_nothing_reads_them(tmp_path, capsys, argv, parts):
    """``attnzoo bench`` times each model as it is and a task trains on its own budget and length: both accepted
    +lenN (and +xC, +upF) and ignored it."""
    from attnzoo.cli import main

    # Tiny, so that code which accepts the spec measures or trains for a moment, not minutes.
    tiny = [*BENCH_TINY, "--out", str(tmp_path / "bench")] if argv[0] == "bench" else ["--steps", "1"]
    assert main([*argv, "--device", "cpu", *tiny]) == 1
    said = capsys.readouterr().err
    assert f"{parts} how a comparison trains the model" in said and "drop" in said
    assert not (tmp_path / "bench").exists()
