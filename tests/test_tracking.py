"""`attnzoo train --tensorboard DIR`: the metrics also as TensorBoard scalars, an optional extra never required."""

import json
import sys

import pytest
from training_helpers import TINY_FLAGS, write_text_corpus

from attnzoo.cli import main

FLAGS = [*TINY_FLAGS, "--steps", "4", "--eval-interval", "2", "--checkpoint-interval", "4"]


def _has_tensorboard() -> bool:
    try:
        import tensorboard  # noqa: F401
    except ImportError:
        return False
    return True


def test_without_the_extra_the_flag_is_a_clear_error_before_any_work(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "tensorboard", None)  # as if it were not installed
    for name in [m for m in sys.modules if m.startswith("torch.utils.tensorboard")]:
        monkeypatch.delitem(sys.modules, name)
    text = write_text_corpus(tmp_path / "text.txt")
    run = tmp_path / "run"
    assert main(["train", "--data", str(text), "--out", str(run), *FLAGS, "--tensorboard", str(tmp_path / "tb")]) == 1
    err = capsys.readouterr().err
    assert "attnzoo train: error: --tensorboard needs the tensorboard package" in err
    assert 'pip install -e ".[tensorboard]"' in err
    assert not run.exists() and not (tmp_path / "tb").exists()


def test_off_by_default_and_nothing_needs_it(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorboard", None)
    text = write_text_corpus(tmp_path / "text.txt")
    assert main(["train", "--data", str(text), "--out", str(tmp_path / "run"), *FLAGS]) == 0


@pytest.mark.skipif(not _has_tensorboard(), reason="the optional tensorboard package is not installed here")
def test_the_metrics_are_written_as_tensorboard_scalars(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    text = write_text_corpus(tmp_path / "text.txt")
    run, board = tmp_path / "run", tmp_path / "tb"
    assert main(["train", "--data", str(text), "--out", str(run), *FLAGS, "--tensorboard", str(board)]) == 0
    events = EventAccumulator(str(board))
    events.Reload()
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    train = {r["step"]: r["train_loss"] for r in records if "train_loss" in r}
    val = {r["step"]: r["val_loss"] for r in records if "val_loss" in r}
    assert {"train/loss", "train/lr", "val/loss", "val/bits_per_byte"} <= set(events.Tags()["scalars"])
    assert {e.step: e.value for e in events.Scalars("train/loss")} == pytest.approx(train)
    assert {e.step: e.value for e in events.Scalars("val/loss")} == pytest.approx(val)
