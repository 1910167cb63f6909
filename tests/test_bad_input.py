"""Every bad input is refused with one line that names the value and what is allowed; none ends in a traceback.

The table grows with the CLI: a new flag gets a row here with a value it must refuse. Each row runs
``attnzoo.cli.main`` in-process and checks the exit code (1 for the library's refusals, 2 for argparse's), the
words the error must contain, and that stderr holds no traceback and only one line.
"""

import errno
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from training_helpers import TINY_FLAGS, write_text_corpus

from attnzoo import ModelConfig, Transformer
from attnzoo.cli import main
from attnzoo.training.config import tomllib

ROOT = Path(__file__).resolve().parents[1]

BIG = str(10**11)
HUGE_SEED = str(10**23)
HUGE = str(10**30)  # beyond a C long: what torch raised OverflowError or TypeError on
POSITIVE_INT_FIELDS = (
    "n_layers", "max_seq_len", "eval_interval", "eval_windows", "log_interval", "checkpoint_interval",
    "keep_checkpoints", "grad_accum", "seq_len", "head_dim", "mlp_hidden_dim",
)  # fmt: skip
SEED_RANGE = r"seed=10{23} is invalid: must be an integer in \[0, 9223372036854775807\]"


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A trained run, a text file, an ordinary file, a FIFO and a TOML with a bad table, shared by the rows."""
    root = tmp_path_factory.mktemp("bad-input")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("ATTNZOO_CACHE_DIR", str(root / "cache"))
        text = write_text_corpus(root / "text.txt")
        assert main(["train", "--data", str(text), "--out", str(root / "run"), *TINY_FLAGS, "--steps", "2"]) == 0
    (root / "file").write_text("not a directory\n")
    os.mkfifo(root / "fifo")
    (root / "options.toml").write_text('[model]\nattention_options = "not a table"\n')
    (root / "vocab.toml").write_text('[model]\nvocab_size = "x"\n')
    (root / "maps" / "tokenizer.json").mkdir(parents=True)
    (root / "binary.toml").write_bytes(bytes(range(128, 256)))
    for name, line in [("huge-seeds", "seeds = 99999999999999999999"), ("many-seeds", "seeds = 1000000000000"),
                       ("no-variants", "variants = []"), ("many-steps", "steps = 100000000000"),
                       ("empty-out", 'out = ""'), ("empty-executor", 'executor = ""'),
                       ("zero-threads", 'executor = "local"\n[executor]\nthreads = 0'),
                       ("text-threads", 'executor = "local"\n[executor]\nthreads = "x"')]:  # fmt: skip
        (root / f"{name}.toml").write_text(f'[compare]\npreset = "micro"\n{line}\n')
    return {"root": root, "run": root / "run", "text": text}


TRAIN = ["train", "--data", "{text}", "--out", "{root}/new", *TINY_FLAGS]
GENERATE = ["generate", "{run}", "--max-new-tokens", "4", "--device", "cpu"]
EVAL = ["eval", "{run}", "--device", "cpu"]
BENCH = [
    "bench",
    "--variants",
    "mha+rope",
    "--seq-lens",
    "16",
    "--repeats",
    "1",
    "--device",
    "cpu",
    "--out",
    "{root}/b",
]
VIZ = ["viz", "{run}", "--device", "cpu", "--out", "{root}/maps"]

# (argv, exit code, words the error must contain: a regex)
CASES = [
    # Numbers: finite means finite, and within float32's range for what a model computes with.
    ([*TRAIN, "--lr", "inf"], 1, r"lr=inf is invalid: must be a finite number > 0"),
    ([*TRAIN, "--lr", "nan"], 1, r"lr=nan is invalid: must be a finite number > 0"),
    ([*TRAIN, "--lr", "1e39"], 1, r"lr=1e\+39 is invalid: .*float32"),
    ([*TRAIN, "--lr", "-1"], 1, r"lr=-1.0 is invalid: must be a finite number > 0"),
    ([*TRAIN, "--norm-eps", "inf"], 1, r"norm_eps=inf is invalid: must be a finite number > 0"),
    ([*TRAIN, "--init-std", "inf"], 1, r"init_std=inf is invalid: must be a finite number > 0"),
    ([*TRAIN, "--init-std", "1e30"], 1, r"initial weights, before any update\. .*--init-std \(it is 1e\+30"),
    ([*TRAIN, "--grad-clip", "inf"], 1, r"grad_clip=inf is invalid: must be a finite number >= 0"),
    ([*TRAIN, "--weight-decay", "nan"], 1, r"weight_decay=nan is invalid"),
    ([*TRAIN, "--min-lr-ratio", "nan"], 1, r"min_lr_ratio=nan is invalid: must be in \[0, 1\]"),
    ([*TRAIN, "--dropout", "1"], 1, r"dropout=1.0 is invalid: must be in \[0, 1\)"),
    ([*TRAIN, "--beta2", "inf"], 1, r"beta2=inf is invalid"),
    ([*TRAIN, "--val-fraction", "1"], 1, r"val_fraction=1.0 is invalid"),
    ([*TRAIN, "--seed", HUGE_SEED], 1, r"seed=10{23} is invalid: must be an integer in \[0, 9223372036854775807\]"),
    ([*TRAIN, "--seed", "-1"], 1, r"seed=-1 is invalid"),
    ([*TRAIN, "--steps", "0"], 1, r"steps=0 is invalid: must be an integer >= 1"),
    *[
        ([*TRAIN, f"--{name.replace('_', '-')}", "0"], 1, rf"{name}=0 is invalid: must be an integer >= 1")
        for name in POSITIVE_INT_FIELDS
    ],
    ([*TRAIN, "--n-kv-heads", "3"], 1, r"n_kv_heads=3 is invalid: must be an integer in \[1, n_heads=2\]"),
    ([*TRAIN, "--beta1", "1"], 1, r"beta1=1.0 is invalid: must be in \[0, 1\)"),
    ([*TRAIN, "--tokenizer", "bpe"], 1, r"tokenizer='bpe' is invalid"),
    ([*TRAIN, "--tokenizer", "hf:/dev/zero"], 1, r"/dev/zero is not a regular file \(it is a character device\)"),
    ([*TRAIN, "--tokenizer", "hf:{root}/maps"], 1, r"maps/tokenizer.json is not a regular file \(it is a directory\)"),
    ([*TRAIN, "--train-only", ""], 1, r"train_only=\(''?,?\) is invalid|train_only=.* is invalid"),
    ([*TRAIN, "--init-from", "{root}/nowhere"], 1, r"nowhere does not exist"),
    ([*TRAIN, "--warmup-steps", "-1"], 1, r"warmup_steps=-1 is invalid: must be an integer >= 0"),
    ([*TRAIN, "--batch-size", "0"], 1, r"batch_size=0 is invalid"),
    ([*TRAIN, "--n-heads", "3"], 1, r"n_heads=3 is invalid"),
    ([*TRAIN, "--lr", "fast"], 2, r"argument --lr: invalid float value: 'fast'"),
    ([*TRAIN, "--attention", "nope"], 2, r"argument --attention: invalid choice: 'nope'"),
    ([*TRAIN, "--attention-option", "nonsense=1"], 1, r"unknown option\(s\) \['nonsense'\]"),
    ([*TRAIN, "--position-option", "rope_theta=Infinity"], 1, r"rope_theta=inf is invalid"),
    ([*TRAIN, "--config", "{root}/options.toml"], 1, r"attention_options='not a table' is invalid: must be a dict"),
    ([*TRAIN, "--config", "{root}/missing.toml"], 1, r"config file .*missing.toml not found"),
    # Sizes that cannot be allocated are refused before allocating, with the size and the memory.
    (
        [*TRAIN, "--position", "learned", "--dim", "1024", "--max-seq-len", str(10**9)],
        1,
        r"the model .* needs [\d,.]+ GiB but cpu has [\d,.]+ GiB available: lower .*--max-seq-len=1000000000",
    ),
    # Paths.
    ([*TRAIN, "--data", "{root}/nowhere.txt"], 1, r"corpus '.*nowhere.txt' is neither a known corpus"),
    ([*TRAIN, "--data", "{root}/fifo"], 1, r"corpus '.*fifo' is not a regular file or a directory \(it is a FIFO\)"),
    ([*TRAIN, "--out", "{root}/file"], 1, r"--out .*file is a file, not a directory"),
    # Refused before anything else: without the extra it is named, with it the directory is a file.
    ([*TRAIN, "--tensorboard", "{root}/file"], 1, r"--tensorboard (needs the tensorboard package|.*file)"),
    (["train", "--resume", "{root}/nowhere"], 1, r"nowhere holds no complete checkpoint"),
    # generate
    ([*GENERATE, "--temperature", "inf"], 1, r"temperature=inf is invalid: must be a finite number >= 0"),
    ([*GENERATE, "--temperature", "nan"], 1, r"temperature=nan is invalid"),
    ([*GENERATE, "--temperature", "-1"], 1, r"temperature=-1.0 is invalid"),
    ([*GENERATE, "--top-k", "0"], 1, r"top_k=0 is invalid: must be None or an integer >= 1"),
    ([*GENERATE, "--top-p", "nan"], 1, r"top_p=nan is invalid: must be None or in \(0, 1\]"),
    ([*GENERATE, "--max-new-tokens", "-1"], 1, r"max_new_tokens=-1 is invalid: must be an int >= 0"),
    ([*GENERATE, "--max-new-tokens", BIG], 1, r"needs [\d,.]+ GiB but cpu has [\d,.]+ GiB .*--max-new-tokens=10{11}"),
    ([*GENERATE, "--num-samples", BIG], 1, r"needs [\d,.]+ GiB but cpu has [\d,.]+ GiB available: lower --num-samples"),
    ([*GENERATE, "--num-samples", "0"], 1, r"--num-samples=0 is invalid: must be >= 1"),
    (
        [*GENERATE, "--seed", HUGE_SEED],
        1,
        r"--seed=10{23} is invalid: must be an integer in \[0, 9223372036854775807\]",
    ),
    ([*GENERATE, "--seed", "-1"], 1, r"--seed=-1 is invalid"),
    ([*GENERATE, "--prompt", ""], 1, r"--prompt is empty"),
    ([*GENERATE, "--prompt", "a\ud800b"], 1, r"--prompt .*U\+D800.* not valid Unicode"),
    ([*GENERATE[:2], "--device", "foo"], 1, r"device='foo' is invalid: use 'auto', 'cpu', 'cuda' or 'cuda:N'"),
    (["generate", "{root}/nowhere"], 1, r"nowhere does not exist"),
    # eval
    ([*EVAL, "--batch-size", "0"], 1, r"--batch-size=0 is invalid: must be an integer >= 1"),
    ([*EVAL, "--batch-size", "-2"], 1, r"--batch-size=-2 is invalid: must be an integer >= 1"),
    ([*EVAL, "--max-windows", "0"], 1, r"--max-windows=0 is invalid: must be an integer >= 1"),
    ([*EVAL, "--seq-len", "-5"], 1, r"--seq-len=-5 is invalid: must be an integer >= 1"),
    ([*EVAL, "--seq-len", "0"], 1, r"--seq-len=0 is invalid: must be an integer >= 1"),
    ([*EVAL, "--seq-len", "10000000"], 1, r"--seq-len=10000000 is too long for the val split of .* at most [\d,]+"),
    ([*EVAL, "--task", "extrapolation", "--blocks", "0"], 1, r"--blocks=0 is invalid: must be an integer >= 1"),
    ([*EVAL[:2], "--device", "foo"], 1, r"device='foo' is invalid"),
    ([*EVAL, "--data", "{root}/fifo"], 1, r"corpus '.*fifo' is not a regular file or a directory"),
    (
        ["eval", "--task", "mqar", "--steps", "0", "--device", "cpu"],
        1,
        r"--steps=0 is invalid: must be an integer >= 1",
    ),
    (["eval", "--task", "mqar", "--seed", HUGE_SEED, "--device", "cpu"], 1, r"--seed=10{23} is invalid"),
    # bench: refused before anything is measured
    ([*BENCH, "--seq-lens", "0"], 1, r"seq_lens=\[0\] is invalid: each must be an integer >= 1"),
    ([*BENCH, "--repeats", "0"], 1, r"repeats=0 is invalid: must be an integer >= 1"),
    ([*BENCH, "--rounds", "0"], 1, r"rounds=0 is invalid: must be an integer >= 1"),
    ([*BENCH, "--threads", "0"], 1, r"threads=0 is invalid: must be an integer >= 1"),
    ([*BENCH, "--tokens-per-step", "0"], 1, r"tokens_per_step=0 is invalid"),
    ([*BENCH, "--decode-tokens", "0"], 1, r"decode_tokens=0 is invalid"),
    ([*BENCH, "--dim", "0"], 1, r"dim=0 is invalid"),
    ([*BENCH, "--n-layers", "0"], 1, r"n_layers=0 is invalid"),
    ([*BENCH, "--n-heads", "3"], 1, r"n_heads=3 is invalid"),
    ([*BENCH, "--variants", "nope"], 1, r"nope"),
    ([*BENCH, "--device", "foo"], 1, r"device='foo' is invalid: use 'auto', 'cpu', 'cuda' or 'cuda:N'"),
    ([*BENCH[:-1], "{root}/file"], 1, r"--out .*file is a file, not a directory"),
    # viz
    ([*VIZ, "--device", "foo"], 1, r"device='foo' is invalid"),
    ([*VIZ[:-1], "{root}/file"], 1, r"--out .*file is a file, not a directory"),
    (["viz", "{run}", "--prompt", ""], 1, r"prompt"),
    # compare: refused before any training
    (["compare", "--preset", "micro", "--out", "{root}/file"], 1, r"--out .*file is a file, not a directory"),
    (["compare", "--preset", "micro", "--seeds", "0", "--out", "{root}/c"], 1, r"--seeds=0 is invalid"),
    (["compare", "--preset", "micro", "--steps", "0", "--out", "{root}/c"], 1, r"steps=0 is invalid"),
    # An OverflowError traceback, an empty "error: " line, the defaults run silently, a decode error naming no file.
    (
        ["compare", "--config", "{root}/huge-seeds.toml", "--out", "{root}/c"],
        1,
        r"\[compare\] seeds = 99999999999999999999 is invalid: must be an integer in \[1, 1000\]",
    ),
    (
        ["compare", "--config", "{root}/many-seeds.toml", "--out", "{root}/c"],
        1,
        r"\[compare\] seeds = 1000000000000 is invalid: must be an integer in \[1, 1000\]",
    ),
    (["compare", "--seeds", "1000000000000", "--out", "{root}/c"], 1, r"--seeds=1000000000000 is invalid"),
    (["compare", "--config", "{root}/no-variants.toml", "--out", "{root}/c"], 1, r"variants = \[\] names no variant"),
    (
        ["compare", "--config", "{root}/binary.toml", "--out", "{root}/c"],
        1,
        r"config file .*binary.toml is not UTF-8 text \(byte 0x80 at offset 0\)",
    ),
    (["compare", "--config", "{root}/empty-out.toml"], 1, r'\[compare\] out = "" is empty: name a directory'),
    # An empty --config and executor = "" were read as not given (inline); [executor] threads went unchecked.
    (["compare", "--config", "", "--out", "{root}/c"], 2, r"argument --config: the path is empty"),
    (["compare", "--config", "{root}/empty-executor.toml", "--out", "{root}/c"], 1, r"executor='' is unknown; choose"),
    (
        ["compare", "--config", "{root}/zero-threads.toml", "--out", "{root}/c"],
        1,
        r"\[executor\] threads=0 is invalid: the torch threads of each process, an integer in \[1, 4096\]",
    ),
    (
        ["compare", "--config", "{root}/text-threads.toml", "--out", "{root}/c"],
        1,
        r"\[executor\] threads='x' is invalid",
    ),
    ([*TRAIN, "--config", "{root}/binary.toml"], 1, r"config file .*binary.toml is not UTF-8 text"),
    # An empty path is the current directory to pathlib: it wrote there.
    ([*TRAIN, "--tensorboard", ""], 2, r"argument --tensorboard: the path is empty"),
    ([*TRAIN[:4], "", *TINY_FLAGS], 2, r"argument --out: the path is empty"),
    ([*BENCH[:-1], ""], 2, r"argument --out: the path is empty"),
    # Counts beyond what any run could finish: refused with the limit, as the seeds are, not started.
    ([*TRAIN, "--steps", BIG], 1, r"steps=100000000000 is invalid: must be an integer in \[1, 1000000000\]"),
    (["eval", "--task", "denoising", "--steps", BIG, "--device", "cpu"], 1, r"steps=100000000000 is invalid: .*\[1, "),
    (["compare", "--steps", BIG, "--out", "{root}/c"], 1, r"--steps=100000000000 is invalid: .*\[1, 1000000000\]"),
    (
        ["compare", "--config", "{root}/many-steps.toml", "--out", "{root}/c"],
        1,
        r"\[compare\] steps = 100000000000 is invalid: must be an integer in \[1, 1000000000\]",
    ),
    ([*BENCH, "--rounds", BIG], 1, r"rounds=100000000000 is invalid: must be an integer in \[1, 1000000000\]"),
    ([*BENCH, "--repeats", BIG], 1, r"repeats=100000000000 is invalid: must be an integer in \[1, 1000000000\]"),
    ([*TRAIN, "--max-seq-len", BIG], 1, r"max_seq_len=100000000000 is invalid: must be <= 16,777,216 .* with rope"),
    # Found by scripts/audit_inputs.py. Sizes and counts past any run: a traceback from torch's C long, a hang while
    # building 10**30 layers, a message naming neither flag nor value, or accepted.
    ([*TRAIN, "--dim", HUGE], 1, rf"dim={HUGE} is invalid: must be an integer in \[1, 1000000000\]"),
    ([*TRAIN, "--n-layers", HUGE], 1, rf"n_layers={HUGE} is invalid: must be an integer in \[1, 1000000000\]"),
    ([*TRAIN, "--batch-size", HUGE], 1, rf"batch_size={HUGE} is invalid: must be an integer in \[1, 1000000000\]"),
    ([*TRAIN, "--eval-interval", HUGE], 1, rf"eval_interval={HUGE} is invalid: must be an integer in \[1, "),
    ([*TRAIN, "--seq-len", BIG], 1, r"seq_len=100000000000 is invalid: must be an integer in \[1, 1000000000\]"),
    ([*TRAIN, "--attention", "dcmha", "--attention-option", f"rank={HUGE}"], 1, rf"rank={HUGE} is invalid"),
    ([*EVAL, "--max-windows", HUGE], 1, rf"--max-windows={HUGE} is invalid: must be an integer in \[1, 1000000000\]"),
    (["info", "--context", HUGE], 1, rf"--context={HUGE} is invalid: must be an integer in \[1, 1000000000\]"),
    ([*GENERATE, "--top-k", HUGE], 1, rf"top_k={HUGE} is invalid: must be None or an integer in \[1, 1000000000\]"),
    ([*BENCH, "--tokens-per-step", HUGE], 1, rf"tokens_per_step={HUGE} is invalid: must be an integer in \[1, "),
    ([*BENCH, "--threads", HUGE], 1, rf"threads={HUGE} is invalid: must be an integer in \[1, 1000000000\]"),
    ([*BENCH, "--n-layers", HUGE], 1, rf"n_layers={HUGE} is invalid: must be an integer in \[1, 1000000000\]"),
    ([*BENCH, "--seq-lens", HUGE], 1, rf"seq_lens={HUGE} is invalid: must be an integer in \[1, 1000000000\]"),
    # A prompt whose maps cannot be held: the allocator's RuntimeError, a traceback.
    ([*VIZ, "--prompt", "x" * 10**6], 1, r"the attention maps of 1,000,000 tokens needs .* GiB .*: lower --prompt"),
    # A config that is a FIFO hung in open(); an empty --config or --data was read as not given.
    ([*TRAIN, "--config", "{root}/fifo"], 1, r"config file .*fifo is a FIFO, not a file"),
    ([*TRAIN, "--config", ""], 2, r"argument --config: the path is empty"),
    ([*EVAL, "--data", ""], 1, r"corpus='' is invalid: must be a name or path"),
    ([*TRAIN, "--config", "{root}/vocab.toml"], 1, r"\[model\] vocab_size = 'x' is set by the tokenizer: leave it out"),
    # Devices torch takes and nothing here runs on, or (info) never checked.
    ([*TRAIN, "--device", "cpu:99"], 1, r"device='cpu:99' is invalid: use 'auto', 'cpu', 'cuda' or 'cuda:N'"),
    (["info", "--device", "nope"], 1, r"device='nope' is invalid: use 'auto', 'cpu', 'cuda' or 'cuda:N'"),
    # Options of a scheme or mechanism: a TypeError's words, or out of range and accepted.
    ([*TRAIN, "--position-option", 'low_freq_factor="x"'], 1, r"low_freq_factor='x' is invalid: must be a finite"),
    ([*TRAIN, "--position-option", "beta_fast=-1"], 1, r"beta_fast=-1 is invalid: must be a finite number > 0"),
    ([*TRAIN, "--attention", "diff", "--attention-option", "subln_eps=Infinity"], 1, r"subln_eps=inf is invalid"),
    # info
    (["info", "--dim", "0"], 1, r"dim=0 is invalid: must be an integer >= 1"),
    (["info", "{root}/nowhere"], 1, r"nowhere does not exist"),
]


def _fill(argv, world):
    return [arg.format(**world) for arg in argv]


@pytest.mark.parametrize(("argv", "code", "words"), CASES, ids=[f"{c[0][0]} {' '.join(c[0][-2:])}" for c in CASES])
def test_a_bad_input_is_refused_with_one_clear_line(world, capsys, argv, code, words):
    argv = _fill(argv, world)
    try:
        got = main(argv)
    except SystemExit as stop:  # argparse
        got = stop.code
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    assert got == code, err
    assert re.search(words, err), err
    lines = [line for line in err.splitlines() if line.startswith("attnzoo")]
    assert len(lines) == 1, err


def test_every_value_flag_of_every_command_has_a_row(world):
    """A new flag that takes a value shows up here until the table tries a bad value of it."""
    from attnzoo.cli import build_parser

    parser = build_parser()
    (sub,) = [a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction"]
    tried = {(c[0][0], arg) for c in CASES for arg in c[0] if arg.startswith("--")}
    exempt = {
        # Free text or paths tried above under another command, choices argparse checks, and switches.
        "--help", "--config", "--prompt", "--variant", "--task", "--split", "--dtype", "--modes", "--parallel",
        "--mlp", "--norm", "--attn-backend", "--position", "--attention",
    }  # fmt: skip
    missing = []
    for name in ("train", "generate", "eval", "bench", "viz"):
        for action in sub.choices[name]._actions:
            flags = [f for f in action.option_strings if f.startswith("--")]
            if action.nargs == 0 or not flags or set(flags) & exempt:
                continue
            if not any((name, flag) in tried for flag in flags):
                missing.append(f"{name} {flags[0]}")
    assert not missing, f"flags without a bad-value row in CASES: {missing}"


def test_install_sh_refuses_an_argument_it_does_not_know_before_installing_anything():
    """`install.sh --dev --bogus` ignored --bogus and installed."""
    done = subprocess.run(["bash", str(ROOT / "scripts" / "install.sh"), "--dev", "--bogus"], capture_output=True,
                          text=True, timeout=60, env={**os.environ, "PYTHON": "false"})  # fmt: skip
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stdout == "install.sh: unexpected argument '--bogus': expected nothing, --dev or --dry-run [REPORT]\n"


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--bogus", "--dev"], "unknown option '--bogus'"),
        (["--dry-run", "r.json", "--bogus"], "unexpected argument '--bogus'"),
    ],
)
def test_install_sh_names_the_unknown_argument_wherever_it_stands(argv, named):
    """`install.sh --bogus --dev` blamed --dev, the allowed flag; `--dry-run REPORT --bogus` ignored --bogus."""
    done = subprocess.run(["bash", str(ROOT / "scripts" / "install.sh"), *argv], capture_output=True, text=True,
                          timeout=60, env={**os.environ, "PYTHON": "false"})  # fmt: skip
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stdout == f"install.sh: {named}: expected nothing, --dev or --dry-run [REPORT]\n"


def test_info_into_a_closed_pipe_ends_quietly(world):
    """`attnzoo info RUN | head -1` raised BrokenPipeError."""
    command = f"{sys.executable} -m attnzoo info {world['run']} | head -1"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run(command, shell=True, capture_output=True, text=True, timeout=120, env=env)
    assert done.stdout.startswith("checkpoint "), done.stdout
    assert "Traceback" not in done.stderr and "BrokenPipe" not in done.stderr, done.stderr


# Raises KeyboardInterrupt where a Ctrl-C during start-up lands: while torch is imported.
CTRL_C_WHILE_TORCH_LOADS = """
import importlib.abc, sys
class CtrlC(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "torch":
            raise KeyboardInterrupt
sys.meta_path.insert(0, CtrlC())
sys.argv = ["attnzoo", "info"]
"""


@pytest.mark.parametrize("start", ["console script", "python -m attnzoo"])
def test_ctrl_c_during_start_up_is_one_line_and_exit_130(start):
    """A Ctrl-C while the command imported torch ended in a traceback, before any of attnzoo's handlers ran."""
    if start == "console script":  # what pip writes for pyproject's [project.scripts] entry
        scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
        module, function = scripts["attnzoo"].split(":")
        launch = f"from {module} import {function}\nsys.exit({function}())"
    else:
        launch = "import runpy\nrunpy.run_module('attnzoo', run_name='__main__', alter_sys=True)"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run(
        [sys.executable, "-c", CTRL_C_WHILE_TORCH_LOADS + launch], capture_output=True, text=True, timeout=120, env=env
    )
    assert (done.returncode, done.stderr) == (130, "attnzoo: interrupted\n"), done.stderr


def test_importing_attnzoo_loads_no_torch_until_a_model_is_asked_for():
    """What lets the command catch that Ctrl-C: the package's names are imported on first use."""
    code = "import sys, attnzoo; assert 'torch' not in sys.modules; attnzoo.Transformer; assert 'torch' in sys.modules"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120, env=env)


# ------------------------------------------------------------------------------------------------------ the API

API_CASES = [
    (lambda m: m.generate(torch.zeros(1, 2, dtype=torch.long), 2, eos_token_id=999), r"eos_token_id=999 .*\[0, 64\)"),
    (lambda m: m.generate(torch.zeros(1, 2, dtype=torch.long), 2.5), r"max_new_tokens=2.5 is invalid: must be an int"),
    (lambda m: m.generate(torch.zeros(0, 2, dtype=torch.long), 2), r"idx holds no sequences \(batch=0\)"),
    (lambda m: m(torch.zeros(0, 2, dtype=torch.long)), r"idx holds no sequences \(batch=0\)"),
    (lambda m: m(torch.zeros(1, 2, dtype=torch.long), torch.tensor([[1, 64]])), r"target 64 is outside .*\[0, 64\)"),
    (lambda m: m(torch.zeros(1, 2, dtype=torch.long), torch.tensor([[-5, 1]])), r"target -5 is outside"),
    (lambda m: m.generate(torch.zeros(1, 2, dtype=torch.long), 2, temperature=math.inf), r"temperature=inf"),
    (lambda m: m.generate(torch.zeros(1, 2, dtype=torch.long), 2, top_p=math.nan), r"top_p=nan"),
    (lambda m: ModelConfig(init_std=math.inf), r"init_std=inf is invalid: must be a finite number > 0"),
    (lambda m: ModelConfig(norm_eps=1e39), r"norm_eps=1e\+39 is invalid: .*float32"),
    (lambda m: ModelConfig(position_options={"rope_theta": math.nan}), r"rope_theta=nan is invalid"),
    (lambda m: ModelConfig.from_dict(None), r"ModelConfig.from_dict\(None\) is invalid: needs a dict"),
    (lambda m: ModelConfig.from_json("[1, 2]"), r"model config JSON must be an object, got list"),
]


@pytest.mark.parametrize(("call", "words"), API_CASES, ids=[str(i) for i in range(len(API_CASES))])
def test_the_api_refuses_bad_values_with_a_value_error(call, words):
    model = Transformer(ModelConfig(vocab_size=64, dim=16, n_layers=1, n_heads=2, max_seq_len=16))
    with pytest.raises(ValueError, match=words):
        call(model)


@pytest.mark.parametrize("position", ["rope", "alibi"])
def test_training_flops_per_token_refuses_a_length_beyond_memory_before_allocating(position):
    """`training_flops_per_token(cfg, 10**12)` went on to allocate terabytes."""
    from attnzoo.io import TooLarge
    from attnzoo.model import training_flops_per_token

    cfg = ModelConfig(vocab_size=64, dim=16, n_layers=1, n_heads=2, max_seq_len=16, position=position)
    with pytest.raises(TooLarge, match=r"the eager attention scores of one layer at seq_len=1,000,000,000,000 needs"):
        training_flops_per_token(cfg, 10**12)


def test_a_model_too_large_for_memory_is_refused_before_the_allocator_is_asked():
    """It died in the allocator (RuntimeError: DefaultCPUAllocator: can't allocate memory) where the CLI checked."""
    with pytest.raises(MemoryError, match=r"the model .* needs [\d,.]+ GiB .*: lower .*vocab_size=1000000000"):
        Transformer(ModelConfig(vocab_size=10**9, dim=1024, n_layers=1, n_heads=2, max_seq_len=16))


def test_a_tiny_temperature_samples_the_argmax_instead_of_nan():
    """`--temperature 1e-45` gave NaN probabilities."""
    model = Transformer(ModelConfig(vocab_size=64, dim=16, n_layers=1, n_heads=2, max_seq_len=16))
    prompt = torch.tensor([[1, 2, 3]])
    tiny = model.generate(prompt, 5, temperature=1e-45, generator=torch.Generator().manual_seed(0))
    assert torch.equal(tiny, model.generate(prompt, 5, temperature=0))


class _Payload:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


def test_a_pickled_weights_file_is_refused_without_advice_to_turn_safety_off(tmp_path):
    from attnzoo.convert.common import read_state_dict

    marker = tmp_path / "payload-ran"
    torch.save({"w": _Payload(marker)}, tmp_path / "pytorch_model.bin")
    with pytest.raises(ValueError, match=r"pytorch_model\.bin holds more than tensors .* not loaded") as refused:
        read_state_dict(tmp_path)
    assert "weights_only" not in str(refused.value) and not marker.exists()


# ---------------------------------------------------------------------------------------------- faults: a full disk


def _one_error_line(err: str) -> str:
    assert "Traceback" not in err, err
    (line,) = [line for line in err.splitlines() if line.startswith("attnzoo")]
    return line


@pytest.mark.parametrize("writer", ["safetensors", "torch.save", "text"])
@pytest.mark.parametrize("raises", ["OSError", "the writer's own error"])
def test_a_full_disk_while_saving_names_the_file_the_disk_and_the_checkpoint_kept(
    world, tmp_path, monkeypatch, capsys, writer, raises
):
    """Safetensors raised SafetensorError and torch.save RuntimeError on a full disk: a traceback."""
    from attnzoo import io
    from attnzoo.training import checkpoint

    run = tmp_path / "run"
    argv = ["train", "--data", str(world["text"]), "--out", str(run), *TINY_FLAGS, "--steps", "4"]
    target = {"safetensors": (checkpoint, "save_file"), "torch.save": (checkpoint.torch, "save"),
              "text": (Path, "write_text")}[writer]  # fmt: skip
    real = getattr(*target)

    def full_from_step_4(*args, **kwargs):
        if not any("step-0000004" in str(arg) for arg in args):
            return real(*args, **kwargs)
        if raises == "OSError":
            raise OSError(errno.ENOSPC, "No space left on device")  # as a failed close does: naming no file
        monkeypatch.setattr(io, "free_bytes", lambda path: 0)
        raise RuntimeError("PytorchStreamWriter failed writing file data/0: file write failed")

    monkeypatch.setattr(*target, full_from_step_4)
    assert main([*argv, "--checkpoint-interval", "2"]) == 1
    line = _one_error_line(capsys.readouterr().err)
    assert re.search(r"stopped at step 4: could not write .*step-0000004/\S+: the disk is full", line), line
    assert re.search(r"\(the disk mounted at /.*\)\. Nothing was lost: the last good checkpoint, .*step-0000002", line)
    assert not (run / "checkpoints" / "step-0000004").exists()


def test_a_full_disk_outside_training_names_the_file_and_the_disk(world, tmp_path, monkeypatch, capsys):
    from attnzoo import bench

    def full(path, text):
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(bench, "atomic_write_text", full)
    # A toy case measured in this process: the default model's five modes, each in a process of its own per round,
    # cost 20 s of what the test is not about (tests/test_bench.py measures in fresh processes).
    monkeypatch.setattr(bench, "measure", lambda case, *, threads, **kwargs: bench.measure_here(case, **kwargs))
    argv = [arg.format(**world) for arg in BENCH] + [
        "--modes",
        "train",
        "--dim",
        "32",
        "--n-layers",
        "1",
        "--n-heads",
        "2",
    ]
    assert main(argv) == 1
    line = _one_error_line(capsys.readouterr().err)
    assert re.search(r"No space left on device: .*/b/\S+ \(the disk mounted at /.*\)\. Nothing was lost", line), line


def test_convert_from_hf_refuses_a_pickled_checkpoint_with_code_in_one_line(tmp_path, capsys):
    """transformers' own refusal is a traceback that advises loading the file with weights_only=False."""
    transformers = pytest.importorskip("transformers")
    source = tmp_path / "llama"
    config = transformers.LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                      num_attention_heads=2, num_key_value_heads=2)  # fmt: skip
    config.architectures = ["LlamaForCausalLM"]
    config.save_pretrained(source)
    marker = tmp_path / "payload-ran"
    weights = transformers.LlamaForCausalLM(config).state_dict()
    torch.save({**weights, "extra": _Payload(marker)}, source / "pytorch_model.bin")
    assert main(["convert", "--from-hf", str(source), "--out", str(tmp_path / "out")]) == 1
    line = _one_error_line(capsys.readouterr().err)
    assert re.search(r"pytorch_model\.bin holds more than tensors .* not loaded: .*safetensors", line), line
    assert "weights_only" not in line and not marker.exists() and not (tmp_path / "out").exists()
