"""Hostile values for every option of every ``attnzoo`` command, each run through ``attnzoo.cli.main`` and judged.

    python scripts/audit_inputs.py                 # the whole audit: exit 1 if any case is not as it should be
    python scripts/audit_inputs.py --only train    # one command's cases (repeatable)
    python scripts/audit_inputs.py --subset        # the fixed subset tests/test_input_audit.py runs every time

The options come from the CLI's own argparse parsers, so a new flag is tried as soon as it exists: by its type
(an integer, a number, a path) or its choices; a free-text flag by the kind :data:`FREE_TEXT` gives its
destination (a new one without an entry fails the audit until it has one). The config files are tried field by
field from their dataclasses (``[model]``, ``[data]`` and ``[train]`` of a run's TOML, every mechanism's and
positional scheme's options, compare's ``[compare]`` keys and its ``[executor]`` table), and a stored compare's
``results.json`` number by number. Each case runs in this process (a command's imports are paid once) with a tiny
corpus, run and comparison made in a temporary directory, which is also the working directory: nothing is
downloaded and nothing is written into the checkout, which the audit checks with ``git status``.

Each case is one of

* CLEAR: refused (exit status not 0) with one ``attnzoo ...`` line on stderr that names the option or the value;
* ALLOWED: accepted, and listed in :data:`ALLOWED` with why the value is a valid one;
* ACCEPTED: accepted and not listed: a bad value the command ran with;
* REFUSED: listed in :data:`ALLOWED`, yet refused: a valid value no longer taken (or a stale entry);
* VAGUE: refused, but not in one line naming the option or the value;
* TRACEBACK: an exception escaped ``main``, or stderr holds a traceback;
* HANG: still running after the timeout;
* KNOWN: one of the above, listed in :data:`KNOWN` as a fault reported and not yet fixed.

The audit fails on any ACCEPTED, REFUSED, VAGUE, TRACEBACK or HANG.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import types
import typing
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
TIMEOUT_S = 60  # a refusal takes well under a second, an accepted case's tiny run a few
FAILING = ("ACCEPTED", "REFUSED", "VAGUE", "TRACEBACK", "HANG")
CLASSES = ("CLEAR", "ALLOWED", "KNOWN", *FAILING)

INTEGERS = ("0", "-1", str(10**30), "1.5", "nan", "", "x")
NUMBERS = ("nan", "inf", "-inf", "-1", "1e308", "")
UNKNOWN_NAME = "nope"
# A path by its kind: what each is made as lies in World.paths.
PATH_KINDS = (
    "<empty>", "<dir>", "<file>", "<fifo>", "<missing>", "</proc missing>", "</proc file>", "<binary>",
    "<empty file>", "<truncated json>", "<truncated toml>",
)  # fmt: skip
# A damaged copy of the trained run, for the options that read a run or checkpoint directory.
RUN_KINDS = ("<run: truncated config.json>", "<run: empty weights>", "<run: truncated checkpoint.json>")
RUN_OPTIONS = frozenset({"path", "resume", "init_from", "from_attnzoo"})
# Free-text options by destination: the kind of text each takes, which says what to try.
FREE_TEXT = {
    "config": "toml",
    "variants": "variant",
    "variant": "variant",
    "data": "corpus",
    "data.corpus": "corpus",
    "tasks": "task",
    "device": "device",
    "train.device": "device",
    "data.tokenizer": "tokenizer",
    "attention_options": "key=value",
    "position_options": "key=value",
    "train.train_only": "fragment",
    "prompt": "text",
}
FREE_VALUES = {
    "variant": (UNKNOWN_NAME, "", "mha+nope", "mha+rope+kv0", f"mha+rope+kv{10**30}", "+"),
    "task": (UNKNOWN_NAME, ""),
    "device": (UNKNOWN_NAME, "", "cuda:-1", "cuda:x", f"cuda:{10**30}", "cpu:99"),
    "tokenizer": (UNKNOWN_NAME, "", "hf:"),
    "key=value": ("nonsense=1", "=1", "novalue", ""),
    "fragment": ("", "no-such-parameter"),
    "text": ("", "a\ud800b", "x" * 5_000),
}


@dataclass(frozen=True)
class Case:
    """One hostile value for one option."""

    command: str
    option: str  # as the audit lists it: "--lr", "path", "[train] lr", "--attention-option dcmha.rank", ...
    value: str  # as tried, or the kind of path ("<fifo>")
    argv: tuple[str, ...]
    names: tuple[str, ...]  # words that, in the error line, name the option or the value

    def __str__(self) -> str:
        shown = self.value if len(self.value) <= 40 else self.value[:37] + "..."
        return f"{self.command} {self.option} {shown!r}"


@dataclass(frozen=True)
class Outcome:
    case: Case
    verdict: str
    detail: str  # the error line, the escaped exception, or what ran
    seconds: float


# --------------------------------------------------------------------------------------------------- the allow-list

# (command or "*", option, value): why the value is valid. Reviewed one by one: each is a value a user may mean.
ALLOWED: dict[tuple[str, str, str], str] = {
    ("*", "--out", "<dir>"): "an existing empty directory is written into",
    ("*", "--out", "<missing>"): "a directory not there yet is created",
    ("*", "--config", "<empty file>"): "an empty TOML file is a valid config that sets nothing",
    ("train", "--corpus", "</proc file>"): "any readable text file is a corpus, wherever it lies",
    ("train", "--corpus", "<binary>"): "any file is a corpus; its undecodable bytes are read as U+FFFD, with a warning",
    ("eval", "--data", "</proc file>"): "any readable text file is a corpus, wherever it lies",
    ("eval", "--data", "<binary>"): "any file is a corpus; its undecodable bytes are read as U+FFFD, with a warning",
    ("*", "--warmup-steps", "0"): "no warmup: the learning rate starts at its peak",
    ("*", "--seed", "0"): "the default seed",
    ("info", "[train] warmup_steps", "0"): "no warmup: the learning rate starts at its peak",
    ("info", "[train] seed", "0"): "the default seed",
    ("info", "[train] seed", str(2**63 - 1)): "the largest seed torch and numpy take",
    ("generate", "--max-new-tokens", "0"): "the prompt back, continued by nothing",
    ("generate", "--prompt", "x" * 5_000): "a prompt longer than max_seq_len is read in windows, as generation runs",
    ("viz", "--prompt", "x" * 5_000): "a long prompt whose maps fit in memory is drawn",
    ("info", "--train-only", "no-such-parameter"): "info trains nothing: which parameters train is train's to check",
    ("info", "[data] corpus", '"nope"'): "info reads no corpus with the byte tokenizer: train's to check",
    **{("info", "--corpus", kind): "info reads no corpus with the byte tokenizer: train's to check"
       for kind in (*PATH_KINDS, UNKNOWN_NAME) if kind != "<empty>"},
}  # fmt: skip


# Faults found and not yet fixed, each with where its fix belongs: shown as KNOWN, not failing the audit, until the
# fix lands and the entry goes. Keep this short.
KNOWN: dict[tuple[str, str, str], str] = {}


def known(case: Case) -> bool:
    return (case.command, case.option, case.value) in KNOWN


def allowed_why(case: Case) -> str | None:
    return ALLOWED.get((case.command, case.option, case.value)) or ALLOWED.get(("*", case.option, case.value))


# --------------------------------------------------------------------------------------------------- the world


@dataclass
class World:
    """The files the cases name, made once in ``root``: a corpus, a trained run, a finished comparison, and a path
    of each hostile kind."""

    root: Path
    text: Path
    run: Path
    compare: Path
    paths: dict[str, str]
    counter: int = 0

    def fresh(self, name: str = "out") -> str:
        """A path not yet there, for an output a case may write."""
        self.counter += 1
        return str(self.root / "outs" / f"{name}-{self.counter}")


def make_world(root: Path) -> World:
    from attnzoo.cli import main

    text = root / "text.txt"
    words = ["the", "king", "and", "queen", "of", "rome", "sat", "on", "a", "stone", "throne", "while", "his",
             "fool", "sang", "songs", "to", "them"]  # fmt: skip
    lines = [" ".join(words[(i * 7 + j * 3) % len(words)] for j in range(12)) for i in range(500)]
    text.write_text("\n".join(lines) + "\n", encoding="utf-8")
    quiet = io.StringIO()
    with contextlib.redirect_stdout(quiet), contextlib.redirect_stderr(quiet):
        trained = main(["train", "--data", str(text), "--out", str(root / "run"), *TRAIN_FLAGS])
        compared = main(["compare", *COMPARE_FLAGS, "--data", str(text), "--out", str(root / "compare")])
    if trained != 0 or compared != 0:
        raise RuntimeError(f"the audit's own run or comparison failed:\n{quiet.getvalue()}")
    (root / "dir").mkdir()
    (root / "file.txt").write_text("not what was asked for\n")
    os.mkfifo(root / "fifo")
    (root / "binary.bin").write_bytes(bytes(range(256)) * 4)
    (root / "empty").write_bytes(b"")
    (root / "truncated.json").write_text('{"dim": 3')
    (root / "truncated.toml").write_text("[train]\nlr = ")
    paths = {
        "<empty>": "",
        "<dir>": str(root / "dir"),
        "<file>": str(root / "file.txt"),
        "<fifo>": str(root / "fifo"),
        "<missing>": str(root / "missing"),
        "</proc missing>": "/proc/self/attnzoo-audit",
        "</proc file>": "/proc/self/status",
        "<binary>": str(root / "binary.bin"),
        "<empty file>": str(root / "empty"),
        "<truncated json>": str(root / "truncated.json"),
        "<truncated toml>": str(root / "truncated.toml"),
    }
    damage = {
        "<run: truncated config.json>": ("config.json", lambda data: data[: len(data) // 2]),
        "<run: empty weights>": ("model.safetensors", lambda data: b""),
        "<run: truncated checkpoint.json>": ("checkpoint.json", lambda data: data[: len(data) // 2]),
    }
    for index, (kind, (name, cut)) in enumerate(damage.items()):
        copy = root / f"damaged-run-{index}"
        shutil.copytree(root / "run", copy)
        (copy / ".attnzoo.lock").unlink(missing_ok=True)
        for target in copy.glob(f"checkpoints/*/{name}"):
            target.write_bytes(cut(target.read_bytes()))
        paths[kind] = str(copy)
    return World(root=root, text=text, run=root / "run", compare=root / "compare", paths=paths)


# A run of two steps on the tiny corpus: what every train case starts from.
TRAIN_FLAGS = [
    "--dim", "32", "--n-layers", "2", "--n-heads", "2", "--seq-len", "32", "--batch-size", "8", "--steps", "2",
    "--warmup-steps", "1", "--eval-interval", "2", "--checkpoint-interval", "2", "--eval-windows", "8",
    "--log-interval", "1", "--device", "cpu", "--no-progress",
]  # fmt: skip
# A comparison of one variant, one seed, one step and no task: what every compare case starts from.
COMPARE_FLAGS = [
    "--preset", "micro", "--variants", "mha+rope", "--seeds", "1", "--steps", "1", "--tasks", "--device", "cpu",
    "--no-progress",
]  # fmt: skip


def base_argv(world: World, command: str, dest: str) -> list[str]:
    """The command's valid arguments the hostile value is added to (after them, so that it wins); ``{path}`` is
    where a positional path goes."""
    text = str(world.text)
    if command == "train" and dest == "resume":
        return ["train", "--no-progress"]
    if command == "train":
        return ["train", "--data", text, "--out", world.fresh("train"), *TRAIN_FLAGS]
    if command == "compare":
        return ["compare", *COMPARE_FLAGS, "--data", text, "--out", world.fresh("compare")]
    if command == "generate":
        return ["generate", "{path}", "--max-new-tokens", "4", "--device", "cpu"]
    if command == "eval" and dest in ("variant", "steps", "seed"):  # what only a synthetic task reads
        return ["eval", "--task", "mqar", "--steps", "1", "--device", "cpu"]
    if command == "eval":
        task = ["--task", "extrapolation"] if dest == "blocks" else []
        return ["eval", "{path}", *task, "--device", "cpu", "--max-windows", "2", "--no-progress"]
    if command == "info":
        return ["info", "{path}"] if dest == "path" else ["info"]
    if command == "viz":
        return ["viz", "{path}", "--device", "cpu", "--out", world.fresh("viz")]
    if command == "bench":
        return ["bench", "--variants", "mha+rope", "--seq-lens", "16", "--modes", "train", "--repeats", "1",
                "--rounds", "1", "--dim", "32", "--n-layers", "1", "--n-heads", "2", "--tokens-per-step", "32",
                "--decode-tokens", "2", "--device", "cpu", "--no-progress", "--out", world.fresh("bench")]  # fmt: skip
    if command == "convert":
        source = [] if dest == "from_hf" else ["--from", str(world.run)]
        return ["convert", *source, "--kv-heads", "1", "--out", world.fresh("convert")]
    raise ValueError(f"the audit has no base arguments for command {command!r}: add them to base_argv")


def with_value(world: World, command: str, action: argparse.Action, values: list[str]) -> list[str]:
    """The base arguments with ``values`` given to ``action``: a positional in its place, a flag at the end."""
    argv = base_argv(world, command, action.dest)
    if not action.option_strings:
        return [given for arg in argv for given in (values if arg == "{path}" else [arg])]
    argv = [str(world.run) if arg == "{path}" else arg for arg in argv]
    return [*argv, action.option_strings[-1], *values]


# --------------------------------------------------------------------------------------------------- the cases


def _parsers() -> dict[str, argparse.ArgumentParser]:
    from attnzoo.cli import build_parser

    (sub,) = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(sub.choices)


def _field_name(dest: str) -> str:
    return dest.split(".")[-1]


# What an error may call the value of a free-text kind: "corpus 'x'" for --data, "variant 'x'" for --variants.
KIND_NAMES = {"corpus": "corpus", "variant": "variant", "task": "task", "device": "device"}


def _names(action: argparse.Action, value: str) -> tuple[str, ...]:
    """What may name the option in its error: its flags, its field (``seq_len``), ``argument path``, what its kind
    of text is called; and the value (or a path's file name), where it is long enough to tell apart from any other
    number in the line."""
    names = [*action.option_strings, f"argument {action.dest}"]
    if action.option_strings:
        names.append(_field_name(action.dest))
    kind = _option_kind(action)
    if kind in KIND_NAMES:
        names.append(KIND_NAMES[kind])
    names += [text for text in (value, Path(value).name) if len(text) >= 3]
    if kind == "variant":  # a part of it: "n_kv_heads=10**30" for mha+rope+kv10**30
        names += re.findall(r"[0-9]{3,}", value)
    return tuple(names)


def option_cases(world: World, command: str, action: argparse.Action) -> list[Case]:
    """The hostile values of one option, by what kind of value it takes."""
    option = action.option_strings[-1] if action.option_strings else action.dest
    kind = _option_kind(action)
    cases = []

    def add(value: str, given: str | None = None, extra_names: tuple[str, ...] = ()) -> None:
        if value == "<dir>":  # each case its own: an accepted case may write into it
            given = world.fresh("dir")
            Path(given).mkdir(parents=True)
        elif value == "<missing>":
            given = world.fresh("missing")
        given = value if given is None else given
        argv = with_value(world, command, action, [given])
        names = _names(action, given) + extra_names
        cases.append(Case(command, option, value, tuple(argv), names))

    if action.choices is not None:
        add(UNKNOWN_NAME)
    elif kind == "int":
        for value in INTEGERS:
            add(value)
    elif kind == "float":
        for value in NUMBERS:
            add(value)
    elif kind in ("path", "corpus", "toml"):
        for path_kind in PATH_KINDS + (RUN_KINDS if action.dest in RUN_OPTIONS else ()):
            add(path_kind, world.paths[path_kind])
        if kind == "corpus":
            add(UNKNOWN_NAME)
    elif kind == "tokenizer":
        for value in FREE_VALUES["tokenizer"]:
            add(value)
        for path_kind in ("<dir>", "<fifo>", "<missing>", "<binary>", "<empty file>", "<truncated json>"):
            add(f"hf:{path_kind}", f"hf:{world.paths[path_kind]}", (world.paths[path_kind],))
    elif kind in FREE_VALUES:
        for value in FREE_VALUES[kind]:
            add(value)
    return cases


def _option_kind(action: argparse.Action) -> str | None:
    """int, float, path, or the kind :data:`FREE_TEXT` names; ``None`` for a flag the audit cannot try."""
    from attnzoo.cli.command import path_argument

    if action.type is int:
        return "int"
    if action.type is float:
        return "float"
    if action.type is path_argument:
        return "path"
    return FREE_TEXT.get(action.dest)


def uncovered_options(parsers: dict[str, argparse.ArgumentParser]) -> list[str]:
    """Flags that take a value the audit does not know how to try: a new free-text flag, until FREE_TEXT has it."""
    return [
        f"{command} {action.option_strings[-1] if action.option_strings else action.dest}"
        for command, parser in parsers.items()
        for action in parser._actions
        if action.nargs != 0 and action.dest != "help" and action.choices is None and _option_kind(action) is None
    ]


# Values of a config field, a mechanism's option or a [compare] key, by the field's type: the wrong type, then
# what is out of range. TOML cannot hold an integer beyond 64 bits, so its largest stands in for 10**30.
def values_for_type(annotation: Any, *, toml: bool) -> list[Any]:
    largest = 2**63 - 1 if toml else 10**30
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        annotation = next(a for a in typing.get_args(annotation) if a is not type(None))
    origin = typing.get_origin(annotation) or annotation
    if annotation is bool:
        return ["x", 2]
    if annotation is int:
        return ["x", 1.5, True, 0, -1, largest]
    if annotation is float:
        return ["x", True, math.nan, math.inf, -math.inf, -1.0, 1e308]
    if annotation is str:
        return [1, "", UNKNOWN_NAME]
    if origin in (tuple, list):
        return ["x", [1], [""]]
    if origin is dict:
        return ["x", [1]]
    return ["x", 1]


def toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(item) for item in value) + "]"
    raise TypeError(f"no TOML form for {value!r}")


def shown(value: Any) -> str:
    return json.dumps(value) if not (isinstance(value, float) and not math.isfinite(value)) else repr(value)


def run_toml_cases(world: World) -> list[Case]:
    """Each field of [model], [data] and [train], wrong in type and in range, in a file given to ``info --config``
    (which validates the same dataclasses as train, without training)."""
    from attnzoo.cli.flags import MODEL_FIELDS_WITHOUT_FLAGS
    from attnzoo.config import ModelConfig
    from attnzoo.training.config import DataConfig, TrainConfig

    cases = []
    for table, cls in (("model", ModelConfig), ("data", DataConfig), ("train", TrainConfig)):
        hints = typing.get_type_hints(cls)
        for field in dataclasses.fields(cls):
            if dataclasses.is_dataclass(hints[field.name]) or field.name in MODEL_FIELDS_WITHOUT_FLAGS[1:]:
                continue
            for value in values_for_type(hints[field.name], toml=True):
                path = world.root / "tomls" / f"{table}-{field.name}-{len(cases)}.toml"
                path.parent.mkdir(exist_ok=True)
                path.write_text(f"[{table}]\n{field.name} = {toml_value(value)}\n")
                argv = ("info", "--config", str(path))
                cases.append(Case("info", f"[{table}] {field.name}", shown(value), argv, (field.name, str(path))))
    return cases


def scheme_option_cases(world: World) -> list[Case]:
    """Each option of every attention mechanism and positional scheme, wrong in type and in range, through
    ``info`` (which builds the model's config, and the model on the meta device)."""
    from attnzoo.attention import ATTENTION
    from attnzoo.positions import POSITIONS

    cases = []
    for kind, registry in (("attention", ATTENTION), ("position", POSITIONS)):
        for name in registry.names():
            options = registry.get(name).Options
            hints = typing.get_type_hints(options)
            for field in dataclasses.fields(options):
                for value in values_for_type(hints[field.name], toml=False):
                    given = f"{field.name}={json.dumps(value)}"
                    argv = ("info", f"--{kind}", name, f"--{kind}-option", given, "--dim", "32", "--n-heads", "2")
                    option = f"--{kind}-option {name}.{field.name}"
                    cases.append(Case("info", option, shown(value), argv, (field.name,)))
    return cases


# What an error may call a [compare] key's value: "corpus ''" for data.
COMPARE_KEY_NAMES = {"data": ("corpus",), "tasks": ("task",), "variants": ("variant",)}
COMPARE_TABLE_BASE = {"preset": "micro", "variants": ["mha+rope"], "seeds": 1, "steps": 1, "tasks": [],
                      "device": "cpu", "no_progress": True}  # fmt: skip


def compare_toml_cases(world: World) -> list[Case]:
    """Each key of compare's [compare] table, wrong in type and in range, and its [executor] table."""
    from attnzoo.cli.compare import CONFIG_KEYS

    cases = []

    def add(option: str, value: str, body: str, names: tuple[str, ...]) -> None:
        path = world.root / "compare-tomls" / f"{len(cases)}.toml"
        path.parent.mkdir(exist_ok=True)
        path.write_text(body)
        argv = ("compare", "--config", str(path), "--out", world.fresh("compare-toml"))
        cases.append(Case("compare", option, value, argv, (*names, str(path))))

    def table(**changes: Any) -> str:
        settings = {**COMPARE_TABLE_BASE, "data": str(world.text), **changes}
        return "[compare]\n" + "".join(f"{key} = {toml_value(value)}\n" for key, value in settings.items())

    for key, expected in CONFIG_KEYS.items():
        if key == "out":  # the flag's own cases try its paths; here the file's own spelling of it
            values: list[Any] = [1, ""]
        else:
            values = values_for_type(expected, toml=True)
        if expected is list:
            values = [*values, [UNKNOWN_NAME]]
        for value in values:
            items = value if isinstance(value, list) else [value]
            said = tuple(item for item in items if isinstance(item, str) and len(item) >= 3)
            add(f"[compare] {key}", shown(value), table(**{key: value}), (key, *COMPARE_KEY_NAMES.get(key, ()), *said))
    add("[executor]", '"x"', table() + 'executor = "x"\n', ("executor",))
    add("[executor] (inline)", "threads = 2", table() + "[executor]\nthreads = 2\n", ("executor",))
    for value in values_for_type(int, toml=True):
        body = table(executor="local") + f"[executor]\nthreads = {toml_value(value)}\n"
        add("[executor] threads", shown(value), body, ("threads",))
    add("[executor] nonsense", "1", table(executor="local") + "[executor]\nnonsense = 1\n", ("nonsense",))
    return cases


# What results.json keeps for the record only: no report, verdict or reuse reads it.
UNREAD_RESULTS = ("spec", "command", "created")


def stored_results_cases(world: World) -> list[Case]:
    """Each kind of number the finished comparison's results.json stores (the first field of each name), made
    negative, NaN and a string, then read back by ``compare --report-only``."""
    stored = json.loads((world.compare / "results.json").read_text())
    seen: set[str] = set()
    cases = []
    for path in _numeric_leaves(stored):
        name = next(part for part in reversed(path) if isinstance(part, str))
        if name in seen or path[0] in UNREAD_RESULTS:
            continue
        seen.add(name)
        for bad in (-1, math.nan, "x"):
            changed = json.loads(json.dumps(stored))
            _set(changed, path, bad)
            out = world.root / "stored" / f"{len(cases)}"
            out.mkdir(parents=True)
            (out / "results.json").write_text(json.dumps(changed))
            where = "/".join(map(str, path))
            argv = ("compare", "--report-only", "--out", str(out))
            cases.append(Case("compare", f"results.json {where}", shown(bad), argv, (name, "results.json")))
    return cases


def _numeric_leaves(node: Any, path: tuple = ()) -> Iterator[tuple]:
    """The path of each number in a JSON document."""
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _numeric_leaves(value, (*path, key))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from _numeric_leaves(value, (*path, index))
    elif isinstance(node, (int, float)) and not isinstance(node, bool):
        yield path


def _set(node: Any, path: tuple, value: Any) -> None:
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value


def all_cases(world: World, only: set[str] | None = None) -> list[Case]:
    cases = []
    for command, parser in _parsers().items():
        if only and command not in only:
            continue
        for action in parser._actions:
            if action.nargs != 0 and action.dest != "help":
                cases += option_cases(world, command, action)
    if not only or "info" in only:
        cases += run_toml_cases(world) + scheme_option_cases(world)
    if not only or "compare" in only:
        cases += compare_toml_cases(world) + stored_results_cases(world)
    return cases


# A fixed subset that the normal test suite runs: every kind of value, every command, the config files.
SUBSET = (
    ("train", "--lr"), ("train", "--seq-len"), ("train", "--out"), ("train", "--resume"), ("train", "--config"),
    ("train", "--tokenizer"), ("train", "--attention-option"), ("train", "--attention"), ("train", "--corpus"),
    ("generate", "path"), ("generate", "--top-p"), ("generate", "--prompt"), ("eval", "--seq-len"),
    ("eval", "--device"), ("info", "--context"), ("bench", "--seq-lens"), ("bench", "--variants"),
    ("viz", "--out"), ("convert", "--kv-heads"), ("convert", "--from-hf"), ("compare", "--seeds"),
    ("compare", "--variants"), ("compare", "[compare] jobs"), ("compare", "[compare] seeds"),
    ("info", "[train] eval_interval"), ("info", "[model] norm_eps"), ("info", "--attention-option dcmha.rank"),
    ("compare", "results.json budget/steps"), ("compare", "results.json variants/mha+rope/runs/0/final_train_loss"),
)  # fmt: skip


# --------------------------------------------------------------------------------------------------- running


class Hang(BaseException):
    """Raised by the alarm in the case's own thread: a BaseException, so no ``except Exception`` keeps it."""


@contextlib.contextmanager
def _deadline(seconds: int) -> Iterator[None]:
    def expire(signum: int, frame: Any) -> None:
        raise Hang

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def run_case(case: Case, timeout_s: int = TIMEOUT_S) -> Outcome:
    from attnzoo.cli import main

    err, out = io.StringIO(), io.StringIO()
    start = time.perf_counter()
    escaped = None
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out), _deadline(timeout_s):
            code = main(list(case.argv))
    except SystemExit as stop:  # argparse's refusals
        code = stop.code if isinstance(stop.code, int) else 1
    except Hang:
        return Outcome(case, "HANG", f"still running after {timeout_s} s", time.perf_counter() - start)
    except BaseException as error:  # whatever escaped is the finding
        escaped = error
    seconds = time.perf_counter() - start
    if escaped is not None:
        verdict = "KNOWN" if known(case) else "TRACEBACK"
        return Outcome(case, verdict, f"{type(escaped).__name__}: {escaped}"[:300], seconds)
    verdict = judge(case, code, err.getvalue())
    if verdict in FAILING and known(case):
        verdict = "KNOWN"
    return Outcome(case, verdict, _detail(code, err.getvalue()), seconds)


def judge(case: Case, code: int, stderr: str) -> str:
    if "Traceback (most recent call last)" in stderr:
        return "TRACEBACK"
    valid = allowed_why(case) is not None
    if code == 0:
        return "ALLOWED" if valid else "ACCEPTED"
    if valid:
        return "REFUSED"
    lines = [line for line in stderr.splitlines() if line.startswith("attnzoo")]
    if len(lines) != 1:
        return "VAGUE"
    return "CLEAR" if any(_names_it(name, lines[0]) for name in case.names) else "VAGUE"


def _names_it(name: str, line: str) -> bool:
    """A field's name as a word (``lr``, not the ``lr`` in ``lr_ratio``); anything else as it stands."""
    if re.fullmatch(r"[a-z_]+", name):
        return re.search(rf"(?<!\w){name}(?![\w-])", line) is not None
    return name in line


def _detail(code: int, stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.startswith("attnzoo")]
    said = " | ".join(lines) if lines else stderr.strip().replace("\n", " | ")
    return f"exit {code}: {said}"[:300]


def git_status(root: Path) -> set[str] | None:
    """The checkout's untracked files, where anything the audit wrote would show (``None`` outside a git
    checkout). Not the changed ones: whoever else works in the checkout changes them meanwhile."""
    try:
        done = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=all"],
                              capture_output=True, text=True, timeout=60, check=True)  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None
    return {line for line in done.stdout.splitlines() if line.startswith("??")}


@contextlib.contextmanager
def audit_workspace() -> Iterator[World]:
    """A temporary directory as the world, the working directory and the data cache; restored after."""
    cwd, cache = Path.cwd(), os.environ.get("ATTNZOO_CACHE_DIR")
    with tempfile.TemporaryDirectory(prefix="attnzoo-audit-") as tmp:
        root = Path(tmp)
        os.environ["ATTNZOO_CACHE_DIR"] = str(root / "cache")
        os.chdir(root)
        try:
            yield make_world(root)
        finally:
            os.chdir(cwd)
            if cache is None:
                os.environ.pop("ATTNZOO_CACHE_DIR", None)
            else:
                os.environ["ATTNZOO_CACHE_DIR"] = cache


def run_audit(
    *, only: set[str] | None = None, subset: bool = False, progress: Callable[[Outcome], None] | None = None
) -> tuple[list[Outcome], list[str]]:
    """Every case's outcome, and the problems outside any case (an option the audit cannot try, a file written
    into the checkout)."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    before = git_status(REPO)
    problems = [f"no hostile values known for {name}: give its destination a kind in FREE_TEXT"
                for name in uncovered_options(_parsers())]  # fmt: skip
    outcomes = []
    with audit_workspace() as world:
        cases = all_cases(world, only)
        if subset:
            cases = [case for case in cases if (case.command, case.option) in SUBSET]
        for case in cases:
            outcome = run_case(case)
            outcomes.append(outcome)
            if progress is not None:
                progress(outcome)
    after = git_status(REPO)
    if before is not None and after is not None and after - before:
        problems.append(f"the audit changed the checkout {REPO}: {sorted(after - before)}")
    return outcomes, problems


def summary(outcomes: list[Outcome], problems: list[str]) -> str:
    counts = Counter(outcome.verdict for outcome in outcomes)
    lines = [f"{len(outcomes)} cases: " + ", ".join(f"{counts[name]} {name}" for name in CLASSES)]
    lines += [f"{o.verdict:<9} {o.case}: {o.detail}" for o in outcomes if o.verdict in (*FAILING, "KNOWN")]
    return "\n".join(lines + [f"PROBLEM   {problem}" for problem in problems])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", action="append", metavar="COMMAND", help="only this command's cases; repeatable")
    parser.add_argument("--subset", action="store_true", help="only the fixed subset the test suite runs")
    parser.add_argument("--verbose", action="store_true", help="a line per case as it ends")
    args = parser.parse_args(argv)

    def report(outcome: Outcome) -> None:
        print(f"{outcome.verdict:<9} {outcome.seconds:6.2f}s {outcome.case}: {outcome.detail}", flush=True)

    outcomes, problems = run_audit(
        only=set(args.only) if args.only else None, subset=args.subset, progress=report if args.verbose else None
    )
    print(summary(outcomes, problems))
    return 1 if problems or any(outcome.verdict in FAILING for outcome in outcomes) else 0


if __name__ == "__main__":
    sys.exit(main())
