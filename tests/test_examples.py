"""The example config files in examples/ load, run, and are the ones the README points to."""

from pathlib import Path

import pytest
from training_helpers import TINY_FLAGS, write_text_corpus

from attnzoo import ModelConfig
from attnzoo.cli import build_parser, main
from attnzoo.cli.compare import _with_config
from attnzoo.cli.flags import model_settings_from_args, train_config_from_args
from attnzoo.compare import resolve_spec
from attnzoo.training import read_checkpoint

REPO = Path(__file__).resolve().parents[1]
TRAIN_TOML = REPO / "examples" / "train.toml"
COMPARE_TOML = REPO / "examples" / "compare.toml"


def test_the_readme_points_to_the_examples():
    readme = (REPO / "README.md").read_text()
    assert "attnzoo train --config examples/train.toml" in readme
    assert "attnzoo compare --config examples/compare.toml" in readme


def test_the_train_example_builds_its_model_and_training():
    args = build_parser().parse_args(["train", "--config", str(TRAIN_TOML)])
    train = train_config_from_args(args)
    model = ModelConfig.from_dict({**model_settings_from_args(args, train), "vocab_size": 256})
    assert (model.attention, model.position, model.n_kv_heads, model.dim) == ("diff", "alibi", 2, 128)
    assert (train.steps, train.warmup_steps, train.data.corpus) == (3000, 100, "shakespeare")
    assert train.warnings() == []


def test_the_train_example_trains_with_flags_winning(tmp_path, capsys):
    text = write_text_corpus(tmp_path / "text.txt")
    run = tmp_path / "run"
    flags = ["--config", str(TRAIN_TOML), "--data", str(text), "--out", str(run), "--steps", "3"]
    small = [*TINY_FLAGS, "--n-heads", "4", "--eval-interval", "3", "--checkpoint-interval", "3"]
    assert main(["train", *flags, *small]) == 0
    config = read_checkpoint(run).model_config
    assert (config.attention, config.position, config.n_kv_heads, config.dim) == ("diff", "alibi", 2, 32)
    assert "warning" not in capsys.readouterr().err


def test_the_compare_example_resolves_to_a_spec_and_flags_win():
    args = _with_config(build_parser().parse_args(["compare", "--config", str(COMPARE_TOML), "--seeds", "2"]))
    assert args.out == Path("runs/compare-gqa") and args.seeds == 2 and args.tasks == ["mqar"]
    spec = resolve_spec(args.preset, variants=args.variants, seeds=range(args.seeds), tasks=args.tasks)
    assert spec.variant_labels[0] == "mha+rope" and len(spec.variants) == 4
    assert [t.name for t in spec.tasks] == ["mqar"] and list(spec.seeds) == [0, 1]


def test_a_compare_config_with_an_unknown_key_is_refused(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text('[compare]\npreset = "micro"\nvariant = ["mha+rope"]\n')
    with pytest.raises(ValueError, match=r"unknown key\(s\) \['variant'\] in \[compare\]"):
        _with_config(build_parser().parse_args(["compare", "--config", str(bad)]))


def test_a_run_whose_warmup_is_at_least_its_steps_warns(tmp_path, capsys):
    text = write_text_corpus(tmp_path / "text.txt")
    flags = ["--data", str(text), *TINY_FLAGS, "--steps", "2", "--eval-interval", "2", "--checkpoint-interval", "2"]
    assert main(["train", *flags, "--out", str(tmp_path / "a"), "--warmup-steps", "2"]) == 0
    assert "warning: warmup_steps=2 >= steps=2: the learning rate is still warming up" in capsys.readouterr().err
    assert main(["train", *flags, "--out", str(tmp_path / "b"), "--warmup-steps", "1"]) == 0
    assert "warning" not in capsys.readouterr().err
