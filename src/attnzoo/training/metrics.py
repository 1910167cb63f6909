"""The run's metrics log (one JSON object per line), its optional TensorBoard mirror, and its loss-curve plot."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from attnzoo.data.tokenizers import MissingDependencyError
from attnzoo.io import atomic_write, atomic_write_text

TENSORBOARD_HINT = 'pip install -e ".[tensorboard]" in the attnzoo checkout (or pip install tensorboard)'


class MetricsLog:
    """Append-only JSONL of ``{"step": ..., <metric>: ...}`` records, flushed record by record."""

    def __init__(self, path: Path):
        self.path = Path(path)

    def append(self, record: dict[str, Any]) -> None:
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")

    def read(self) -> list[dict[str, Any]]:
        if not self.path.is_file():
            return []
        records = []
        for line in self.path.read_text(encoding="utf-8").splitlines():
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                continue  # a crash mid-append cuts a line short; the complete ones are still good
        return records

    def clear(self) -> None:
        """Forget every record; the file appears again with the first one (which watchers wait for)."""
        self.path.unlink(missing_ok=True)

    def truncate_after(self, step: int) -> None:
        """Forget records past ``step``: a resumed run logs those steps again."""
        kept = [r for r in self.read() if r["step"] <= step]
        atomic_write_text(self.path, "".join(json.dumps(r) + "\n" for r in kept))


def require_tensorboard() -> Any:
    """``torch.utils.tensorboard.SummaryWriter``, or a clear error when the optional ``tensorboard`` package is
    missing (the ``tensorboard`` extra)."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        raise MissingDependencyError(
            f"--tensorboard needs the tensorboard package, which is not installed: {TENSORBOARD_HINT}"
        ) from None
    return SummaryWriter


class TensorBoardLog:
    """Writes each metrics record as TensorBoard scalars beside ``metrics.jsonl``: ``train/loss``, ``train/lr``,
    ``val/loss``, ... at the record's step. ``tensorboard --logdir DIR`` shows them."""

    def __init__(self, log_dir: Path):
        self.writer = require_tensorboard()(log_dir=str(log_dir))

    def append(self, record: dict[str, Any]) -> None:
        step = record["step"]
        for key, value in record.items():
            if key == "step" or isinstance(value, bool) or not isinstance(value, (int, float)):
                continue
            group, _, name = key.partition("_") if key.startswith(("train_", "val_")) else ("train", "", key)
            self.writer.add_scalar(f"{group}/{name}", value, step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


def plot_losses(records: list[dict[str, Any]], path: Path, title: str) -> None:
    """Train and validation loss against step, as a PNG."""
    from matplotlib.figure import Figure  # imported here: the plot is drawn once, at the end of a run

    figure = Figure(figsize=(7, 4.2), dpi=120, layout="constrained")
    axes = figure.add_subplot()
    for key, label, style in (("train_loss", "train", "-"), ("val_loss", "validation", "o-")):
        points = [(r["step"], r[key]) for r in records if key in r and math.isfinite(r[key])]
        if points:
            axes.plot(*zip(*points, strict=True), style, label=label, markersize=4)
    axes.set(xlabel="step", ylabel="loss (nats / token)", title=title)
    axes.grid(alpha=0.3)
    axes.legend()
    atomic_write(path, lambda tmp: figure.savefig(tmp, format="png"))
