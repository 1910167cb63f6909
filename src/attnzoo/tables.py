"""The one table writer: a header and string cells, rendered as aligned text, markdown or HTML.

Every table attnzoo prints or writes (compare's report and terminal summaries, ``attnzoo bench``, the
benchmark scripts) is a :class:`Table`, so the three renderings never drift apart. Ratios follow one
convention everywhere, named in the column header by :func:`speed_header` and :func:`memory_header`:
speed is tokens/s over the baseline's (above 1 is faster), memory is peak over the baseline's (above 1
is more).
"""

from __future__ import annotations

import html
import re
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass
class Table:
    header: list[str]
    rows: list[list[str]]

    def __post_init__(self) -> None:
        bad = [row for row in self.rows if len(row) != len(self.header)]
        if bad:
            raise ValueError(f"table row {bad[0]} has {len(bad[0])} cells; the header has {len(self.header)}")

    def to_text(self) -> str:
        """Aligned plain-text columns, for the terminal."""
        widths = [max(len(row[i]) for row in [self.header, *self.rows]) for i in range(len(self.header))]

        def line(cells: Sequence[str]) -> str:
            return "  ".join(cell.ljust(w) for cell, w in zip(cells, widths, strict=True)).rstrip()

        return "\n".join([line(self.header), "  ".join("─" * w for w in widths), *map(line, self.rows)])

    def to_markdown(self) -> str:
        def line(cells: Sequence[str]) -> str:
            return "| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |"

        return "\n".join([line(self.header), "|" + "---|" * len(self.header), *map(line, self.rows)])

    def to_html(self) -> str:
        head = "".join(f"<th>{inline_html(cell)}</th>" for cell in self.header)
        body = "".join("<tr>" + "".join(f"<td>{inline_html(cell)}</td>" for cell in row) + "</tr>" for row in self.rows)
        return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def inline_html(text: str) -> str:
    """Escaped text with markdown's inline `code` and **bold** as HTML."""
    escaped = html.escape(text)
    escaped = re.sub(r"`([^`]+)`", r"<code>\1</code>", escaped)
    return re.sub(r"\*\*([^*]+)\*\*", r"<strong>\1</strong>", escaped)


def speed_header(baseline: str) -> str:
    return f"speed vs {baseline} (>1 faster)"


def memory_header(baseline: str) -> str:
    return f"memory vs {baseline} (>1 more)"


def ratio(value: float | None) -> str:
    return f"{value:.2f}×" if value is not None else "N/A"
