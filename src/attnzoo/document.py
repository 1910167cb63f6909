"""The blocks a report is made of, rendered twice: as markdown and as one self-contained HTML file.

A report is built once as a list of blocks (headings, paragraphs, bullets, tables, figures), so the markdown and
the HTML always say the same thing. The HTML embeds every figure as a base64 PNG and needs nothing beside itself;
a verdict in bold (``**supported**``) is coloured by its outcome.
"""

from __future__ import annotations

import base64
import html
import re
from dataclasses import dataclass, field
from pathlib import Path

from attnzoo.tables import Table, inline_html


@dataclass
class Heading:
    level: int
    text: str


@dataclass
class Paragraph:
    text: str  # inline `code` and **bold** are rendered in HTML too


@dataclass
class Bullets:
    items: list[str]


@dataclass
class Image:
    path: str  # relative to the report
    caption: str


@dataclass
class Report:
    title: str
    blocks: list[Heading | Paragraph | Bullets | Table | Image] = field(default_factory=list)

    def add(self, *blocks: Heading | Paragraph | Bullets | Table | Image) -> None:
        self.blocks.extend(blocks)

    def to_markdown(self) -> str:
        parts = [f"# {self.title}"]
        for block in self.blocks:
            if isinstance(block, Heading):
                parts.append(f"{'#' * block.level} {block.text}")
            elif isinstance(block, Paragraph):
                parts.append(block.text)
            elif isinstance(block, Bullets):
                parts.append("\n".join(f"- {item}" for item in block.items))
            elif isinstance(block, Table):
                parts.append(block.to_markdown())
            else:
                parts.append(f"![{block.caption}]({block.path})\n\n*{block.caption}*")
        return "\n\n".join(parts) + "\n"

    def to_html(self, root: Path) -> str:
        """One file: styles inline and every image as a data URI read from ``root / path``."""
        parts = [f"<h1>{html.escape(self.title)}</h1>"]
        for block in self.blocks:
            if isinstance(block, Heading):
                parts.append(f"<h{block.level}>{html.escape(block.text)}</h{block.level}>")
            elif isinstance(block, Paragraph):
                parts.append(f"<p>{inline_html(block.text)}</p>")
            elif isinstance(block, Bullets):
                parts.append("<ul>" + "".join(f"<li>{inline_html(i)}</li>" for i in block.items) + "</ul>")
            elif isinstance(block, Table):
                parts.append(block.to_html())
            else:
                data = base64.b64encode((root / block.path).read_bytes()).decode("ascii")
                parts.append(
                    f'<figure><img src="data:image/png;base64,{data}" alt="{html.escape(block.caption)}">'
                    f"<figcaption>{inline_html(block.caption)}</figcaption></figure>"
                )
        return (
            '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            f"<title>{html.escape(self.title)}</title><style>{_CSS}</style></head>\n<body>\n"
            + _colour_verdicts("\n".join(parts))
            + "\n</body></html>\n"
        )


# The verdicts' colours: settled for or against the claim, settled as too small, and not settled.
VERDICT_COLOURS = {
    "supported": "#1a7f37",
    "contradicted": "#b42318",
    "negligible": "#8250df",
    "scale-dependent": "#0969da",
    "LR-sensitive": "#0969da",
    "inconclusive": "#9a6700",
    "decided in the ladder": "#57606a",
    "not measurable": "#57606a",
    "not run": "#57606a",
}


def _colour_verdicts(body: str) -> str:
    pattern = "|".join(re.escape(outcome) for outcome in VERDICT_COLOURS)
    return re.sub(
        rf"<strong>({pattern})</strong>",
        lambda m: f'<strong style="color:{VERDICT_COLOURS[m[1]]}">{m[1]}</strong>',
        body,
    )


_CSS = (
    "body{font:15px/1.5 system-ui,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222}"
    "table{border-collapse:collapse;margin:1em 0;font-size:13px}th,td{border:1px solid #ccc;padding:3px 8px;"
    "text-align:left}th{background:#f3f3f3}code{background:#f3f3f3;padding:0 3px}img{max-width:100%}"
    "figcaption{font-style:italic;color:#555}"
)
