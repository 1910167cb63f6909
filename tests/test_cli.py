import argparse
import importlib
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from training_helpers import TINY_FLAGS, write_text_corpus

from attnzoo import ModelConfig, Transformer
from attnzoo.attention import ATTENTION
from attnzoo.cli import COMMANDS, build_parser, main
from attnzoo.cli.info import parameters_by_component
from attnzoo.compare import run_task
from attnzoo.training import read_checkpoint

COMMAND_NAMES = ("compare", "train", "generate", "eval", "info", "convert", "bench", "viz")


@pytest.fixture
def text(tmp_path):
    return write_text_corpus(tmp_path / "text.txt")


def _metrics(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _train(text, run_dir, *flags):
    return main(["train", "--data", str(text), "--out", str(run_dir), *TINY_FLAGS, *flags])


def test_help_lists_every_command(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0
    top = capsys.readouterr().out
    for command in COMMANDS:
        assert command.name in top


def test_each_command_is_one_module_of_the_cli_package():
    assert tuple(command.name for command in COMMANDS) == COMMAND_NAMES
    for command in COMMANDS:
        module = importlib.import_module(f"attnzoo.cli.{command.name}")
        assert callable(module.add_arguments) and callable(module.run)


STARTUP_PROBE = """
import json, runpy, sys
sys.argv[0] = "attnzoo"
try:
    runpy.run_module("attnzoo", run_name="__main__", alter_sys=True)  # python -m attnzoo ARGS
except SystemExit:
    pass
print(json.dumps(sorted(sys.modules)))
"""
# What `attnzoo --help` and `info` took 20 s under load to import: every command loaded all of these. (Building a
# model on the meta device, as info does, makes torch itself import torch._dynamo and with it Triton.)
HEAVY = {"torch", "attnzoo.bench", "attnzoo.compare", "attnzoo.training.trainer", "matplotlib", "scipy"}


@pytest.mark.parametrize(
    ("argv", "needs"),
    [
        (["--help"], set()),
        (["--version"], set()),
        (["info", "--help"], {"torch"}),
        (["info", "--dim", "64", "--n-heads", "2"], {"torch"}),
    ],
)
def test_a_command_imports_only_what_it_needs(argv, needs):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run([sys.executable, "-c", STARTUP_PROBE, *argv], capture_output=True, text=True, env=env,
                          timeout=120, check=True)  # fmt: skip
    loaded = set(json.loads(done.stdout.splitlines()[-1]))
    assert loaded & HEAVY == needs


def _subparsers() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    (action,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(action.choices)


@pytest.mark.parametrize("name", COMMAND_NAMES)
def test_every_command_help_exits_0_with_its_usage_and_example(name, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main([name, "--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: attnzoo {name}") and f"example:\n  attnzoo {name}" in out


def test_the_module_entry_point_runs_the_cli_package():
    done = subprocess.run([sys.executable, "-m", "attnzoo", "--help"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert all(f"    {name}" in done.stdout for name in COMMAND_NAMES), done.stdout


@pytest.mark.parametrize("name", COMMAND_NAMES)
def test_every_option_has_help_that_cites_nothing_outside_the_repository(name):
    parser = _subparsers()[name]
    for action in parser._actions:
        assert action.help and action.help != argparse.SUPPRESS and action.help.strip(), action.option_strings
    text = parser.format_help()
    assert "eval_protocols" not in text and "§" not in text and not re.search(r"#\d", text), text


def _command_lines(document: Path) -> list[str]:
    """The ``attnzoo ...`` lines of a document's bash blocks, continuations joined and comments dropped."""
    text = document.read_text(encoding="utf-8")
    blocks = re.findall(r"```bash\n(.*?)```", text, flags=re.DOTALL)
    lines = [line.split("  #")[0].strip() for block in blocks for line in block.replace("\\\n", " ").splitlines()]
    return [line for line in lines if re.search(r"(^|-m )attnzoo ", line) and "..." not in line]


def _argvs(document: Path) -> list[list[str]]:
    return [shlex.split(line.split("attnzoo ", 1)[1]) for line in _command_lines(document)]


REPO = Path(__file__).parents[1]
GUIDES = sorted((REPO / "docs").rglob("*.md"))


def test_the_readme_has_an_example_of_every_command():
    assert {argv[0] for argv in _argvs(REPO / "README.md")} == set(COMMAND_NAMES)


@pytest.mark.parametrize("document", [REPO / "README.md", *GUIDES], ids=lambda p: str(p.relative_to(REPO)))
def test_every_documented_command_line_parses(document):
    parser = build_parser()
    for argv in _argvs(document):
        assert parser.parse_args(argv).command.name == argv[0], argv


def test_the_guides_have_command_lines_to_parse():
    assert sum(len(_argvs(guide)) for guide in GUIDES) >= 20


def test_train_then_info_generate_and_eval(text, tmp_path, capsys):
    run = tmp_path / "run"
    assert _train(text, run, "--steps", "4", "--eval-interval", "4") == 0
    trained_on = _metrics(run)[-1]
    capsys.readouterr()

    assert main(["info", str(run)]) == 0
    out = capsys.readouterr().out
    model = Transformer.from_pretrained(read_checkpoint(run).directory)
    assert f"({model.num_parameters():,} in all)" in out
    assert f"{parameters_by_component(model)['layers.*.mlp']:,}" in out
    assert '"dim": 32' in out and '"steps": 4' in out

    generate = ["generate", str(run), "--prompt", "the king", "--max-new-tokens", "20", "--temperature", "0"]
    assert main(generate) == 0
    first = capsys.readouterr().out
    assert first.startswith("the king") and len(first.rstrip("\n").encode()) >= len("the king")
    assert main(generate) == 0 and capsys.readouterr().out == first  # greedy is deterministic
    assert main([*generate[:-1], "1", "--num-samples", "2", "--seed", "3"]) == 0
    assert capsys.readouterr().out.count("─── sample") == 2

    # The same windows as the run's final evaluation give the same loss.
    assert main(["eval", str(run), "--json", "--max-windows", "8"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["loss"] == pytest.approx(trained_on["val_loss"], rel=1e-5)
    assert result["bits_per_byte"] == pytest.approx(trained_on["val_bits_per_byte"], rel=1e-5)
    assert main(["eval", str(run)]) == 0
    assert "bits/byte" in capsys.readouterr().out


def test_flags_override_the_config_file_and_options_reach_the_mechanism(text, tmp_path):
    config = tmp_path / "run.toml"
    config.write_text(
        f'[model]\ndim = 48\nmlp = "gelu"\nposition = "rope"\n[model.position_options]\nrope_theta = 500.0\n'
        f'[data]\ncorpus = "{text}"\n[train]\nsteps = 2\nlr = 0.01\n'
    )
    run = tmp_path / "run"
    assert _train(text, run, "--config", str(config), "--lr", "0.005", "--position-option", "rope_theta=1000") == 0
    model_config = json.loads((run / "config.json").read_text())
    train_config = json.loads((run / "train_config.json").read_text())
    assert model_config["dim"] == 32 and model_config["mlp"] == "gelu"  # the flag wins; the file fills the rest
    assert model_config["position_options"]["rope_theta"] == 1000
    assert train_config["lr"] == 0.005 and train_config["steps"] == 2


@pytest.mark.parametrize("attention", ATTENTION.names())
def test_every_registered_mechanism_trains_from_the_command_line(text, tmp_path, attention):
    assert _train(text, tmp_path / "run", "--attention", attention, "--steps", "1") == 0
    assert json.loads((tmp_path / "run" / "config.json").read_text())["attention"] == attention


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--lr", "-1"], "lr=-1.0 is invalid: must be a finite number > 0"),
        (["--attention-option", "nonsense=1"], r"unknown option\(s\) \['nonsense'\]"),
        (["--n-heads", "3"], "n_heads=3 is invalid"),
        (["--data", "no/such/file.txt"], "neither a known corpus"),
        (["--config", "missing.toml"], "config file missing.toml not found"),
    ],
)
def test_bad_options_give_one_clear_line_and_exit_code_1(text, tmp_path, capsys, flags, message):
    assert _train(text, tmp_path / "run", *flags) == 1
    err = capsys.readouterr().err
    assert err.startswith("attnzoo train: error: ") and "Traceback" not in err
    assert re.search(message, err), err


def test_a_run_directory_is_never_overwritten_and_resume_keeps_its_model(text, tmp_path, capsys):
    run = tmp_path / "run"
    assert _train(text, run, "--steps", "2") == 0
    assert _train(text, run, "--steps", "2") == 1
    assert f"already holds a run: continue it with --resume {run}" in capsys.readouterr().err
    assert main(["train", "--resume", str(run), "--dim", "64"]) == 1
    assert "--resume continues a run with its saved model; drop --dim" in capsys.readouterr().err
    assert main(["train", "--resume", str(tmp_path / "text.txt")]) == 1
    assert "holds no complete checkpoint" in capsys.readouterr().err
    assert main(["train", "--resume", str(run), "--no-progress"]) == 0
    assert "nothing to do: the run already reached step 2" in capsys.readouterr().out


@pytest.mark.slow  # a training subprocess, interrupted, then two more runs
def test_sigint_saves_a_checkpoint_and_the_resumed_run_matches_an_uninterrupted_one(text, tmp_path):
    steps = "150"
    interrupted = tmp_path / "interrupted"
    command = [sys.executable, "-m", "attnzoo", "train", "--data", str(text), "--out", str(interrupted)]
    process = subprocess.Popen(
        [*command, *TINY_FLAGS, "--steps", steps, "--checkpoint-interval", "1000", "--eval-interval", "1000"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    deadline = time.monotonic() + 60
    while not (interrupted / "metrics.jsonl").exists() and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    process.send_signal(signal.SIGINT)
    output, _ = process.communicate(timeout=60)
    assert process.returncode == 128 + signal.SIGINT, output
    stopped_at = read_checkpoint(interrupted).step
    assert 0 < stopped_at < int(steps), output
    assert f"SIGINT: stopped at step {stopped_at}" in output and "Traceback" not in output
    assert _metrics(interrupted)[-1]["step"] == stopped_at

    assert main(["train", "--resume", str(interrupted), "--no-progress"]) == 0
    reference = tmp_path / "reference"
    assert _train(text, reference, "--steps", steps, "--checkpoint-interval", "1000", "--eval-interval", "1000") == 0
    resumed_losses = [r["train_loss"] for r in _metrics(interrupted) if "train_loss" in r]
    assert [r["step"] for r in _metrics(interrupted) if "train_loss" in r] == list(range(1, int(steps) + 1))
    assert resumed_losses == [r["train_loss"] for r in _metrics(reference) if "train_loss" in r]


def test_info_reads_any_pretrained_directory_and_generate_needs_its_tokenizer(tmp_path, capsys):
    model = Transformer(ModelConfig(vocab_size=100, dim=32, n_layers=1, n_heads=2))
    model.save_pretrained(tmp_path / "plain")
    assert main(["info", str(tmp_path / "plain")]) == 0
    assert f"({model.num_parameters():,} in all)" in capsys.readouterr().out
    assert main(["generate", str(tmp_path / "plain")]) == 1
    assert "has no tokenizer.json, so its text cannot be encoded or decoded" in capsys.readouterr().err


def test_eval_task_extrapolation_reports_na_where_the_scheme_refuses(text, tmp_path, capsys):
    run = tmp_path / "learned"
    assert _train(text, run, "--steps", "2", "--position", "learned", "--max-seq-len", "64") == 0
    capsys.readouterr()
    assert main(["eval", str(run), "--task", "extrapolation", "--blocks", "1", "--json"]) == 0
    points = {p["multiple"]: p for p in json.loads(capsys.readouterr().out)["points"]}
    assert sorted(points) == [1, 2, 4, 8, 16]
    # Trained at 32 with room for 64 learned positions: 1× and 2× run, longer lengths are N/A with the reason.
    assert points[1]["loss"] > 0 and points[2]["loss"] > 0
    for multiple in (4, 8, 16):
        assert "loss" not in points[multiple] and "exceeds max_seq_len=64" in points[multiple]["reason"]
    assert main(["eval", str(run), "--task", "extrapolation", "--blocks", "1"]) == 0
    assert "N/A: sequence length 128 exceeds" in capsys.readouterr().out


def test_eval_task_trains_the_variant_from_scratch_and_scores_it(capsys):
    assert main(["eval", "--task", "mqar", "--variant", "diff+rope", "--steps", "2", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)  # progress goes to stderr; stdout is the JSON alone
    assert (result["task"], result["variant"], result["steps"]) == ("mqar", "diff+rope", 2)
    assert 0 <= result["final"]["accuracy"] <= 1 and result["history"][-1][0] == 2


def test_eval_task_argument_errors(text, tmp_path, capsys):
    assert main(["eval", "--task", "lm"]) == 1
    assert "give its run or checkpoint directory" in capsys.readouterr().err
    assert main(["eval", str(tmp_path), "--task", "mqar"]) == 1
    assert "takes no run directory" in capsys.readouterr().err
    with pytest.raises(ValueError, match=r"task='lm' is invalid: choose one of \[.*'mqar'"):
        run_task("lm", "mha+rope")
    with pytest.raises(ValueError, match="steps=0 is invalid"):
        run_task("mqar", "mha+rope", steps=0)


def test_eval_scores_in_the_trained_dtype_unless_told_otherwise(text, tmp_path, capsys):
    run = tmp_path / "run"
    assert _train(text, run, "--steps", "2", "--eval-interval", "2") == 0
    capsys.readouterr()
    losses = {}
    for dtype in (None, "bfloat16"):
        assert main(["eval", str(run), "--json", "--max-windows", "8", *(["--dtype", dtype] if dtype else [])]) == 0
        losses[dtype] = json.loads(capsys.readouterr().out)["loss"]
    assert losses[None] == pytest.approx(_metrics(run)[-1]["val_loss"], rel=1e-5)  # float32, as trained on CPU
    assert losses["bfloat16"] != losses[None] and losses["bfloat16"] == pytest.approx(losses[None], rel=0.05)
