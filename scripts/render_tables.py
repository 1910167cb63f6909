"""Render the results tables of the README and the documentation site from the stored results files.

    python scripts/render_tables.py           # rewrite every marked region in place
    python scripts/render_tables.py --check   # rewrite nothing; exit 1 naming each region that disagrees

A document marks a table as ``<!-- table:NAME -->`` ... ``<!-- /table:NAME -->``; this script owns what lies
between. NAME is

* ``claims``: the verdicts of the kept claims ladder in brief, its rungs (``docs/claims/*/results.json``) judged
  together by the registered claims (``attnzoo.claims``: one module per paper) and the rules of
  ``attnzoo.claims.verdicts``;
* ``claims-one-size``: the same for the kept one-size run, ``docs/claims-one-size/results.json``;
* ``compare-quick``: the side-by-side table of the kept quick compare (the README's main job), from
  ``docs/compare-quick/results.json`` by the report's own ``summary_table``;
* ``FILE.md#K``: the K-th table (from 1) of ``benchmarks/results/FILE.md``, as the benchmark wrote it.

tests/test_docs.py runs ``--check``'s comparison (``stale_regions``), so a table edited by hand, or a results file
rewritten without rendering again, fails the tests.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
CLAIMS = REPO / "docs" / "claims"  # the claims ladder: a folder of rungs
ONE_SIZE = REPO / "docs" / "claims-one-size"
QUICK = REPO / "docs" / "compare-quick"
REGION = re.compile(r"(<!-- table:(?P<name>[^>]+?) -->\n)(?P<body>.*?)(<!-- /table:(?P=name) -->)", re.DOTALL)


def documents(root: Path = REPO) -> list[Path]:
    """The README and the site's pages; the claims report is the lead's generated file, rendered by compare."""
    # compare writes these folders' reports
    generated = tuple(root / "docs" / name for name in ("claims", "claims-one-size", "compare-quick"))
    pages = sorted(p for p in (root / "docs").rglob("*.md") if not any(g in p.parents for g in generated))
    return [root / "README.md", *pages]


def markdown_tables(text: str) -> list[str]:
    """The pipe tables of a markdown text, in order, each as its lines."""
    tables, current = [], []
    for line in [*text.splitlines(), ""]:
        if line.startswith("|"):
            current.append(line)
        elif current:
            tables.append("\n".join(current) + "\n")
            current = []
    return tables


def results_table(name: str) -> str:
    file, _, index = name.partition("#")
    path = RESULTS / file
    if not path.is_file() or not index.isdigit():
        raise ValueError(f"table:{name} names no stored table: expected FILE.md#K with FILE.md in {RESULTS}")
    tables = markdown_tables(path.read_text(encoding="utf-8"))
    if not 1 <= int(index) <= len(tables):
        raise ValueError(f"table:{name}: {path.name} has {len(tables)} table(s)")
    return tables[int(index) - 1]


def claims_table() -> str:
    """The kept claims ladder's rungs judged together by the registered claims and this version's rules, one short
    row a claim: the same verdicts as the ``verdicts.json`` its report wrote beside it."""
    from attnzoo.claims.report import brief_table
    from attnzoo.claims.verdicts import judge_all
    from attnzoo.results.ladder import load_ladder

    ladder, _ = load_ladder(CLAIMS)
    return brief_table(judge_all(ladder)).to_markdown() + "\n"


def one_size_table() -> str:
    """The kept one-size claims run judged the same way, as its ``verdicts.json``."""
    from attnzoo.claims.report import brief_table
    from attnzoo.claims.verdicts import judge_all
    from attnzoo.compare import CompareResults

    return brief_table(judge_all(CompareResults.load(ONE_SIZE / "results.json"))).to_markdown() + "\n"


def quick_table() -> str:
    """The kept quick compare's side-by-side table, as its report shows it."""
    from attnzoo.compare import CompareResults
    from attnzoo.compare.report import summary_table

    return summary_table(CompareResults.load(QUICK / "results.json")).to_markdown() + "\n"


def render(name: str) -> str:
    generated = {"claims": claims_table, "claims-one-size": one_size_table, "compare-quick": quick_table}
    return generated[name]() if name in generated else results_table(name)


def render_document(text: str) -> str:
    cache: dict[str, str] = {}

    def body(match: re.Match) -> str:
        name = match["name"]
        if name not in cache:
            cache[name] = render(name)
        return f"{match.group(1)}{cache[name]}{match.group(4)}"

    return REGION.sub(body, text)


def stale_regions(paths: list[Path]) -> list[str]:
    """``PATH: table:NAME`` for every region whose text is not what its file renders."""
    stale = []
    for path in paths:
        text = path.read_text(encoding="utf-8")
        rendered = {m["name"]: m["body"] for m in REGION.finditer(render_document(text))}
        stale += [f"{path}: table:{m['name']}" for m in REGION.finditer(text) if rendered[m["name"]] != m["body"]]
    return stale


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="rewrite nothing; exit 1 if a region disagrees")
    args = parser.parse_args(argv)
    paths = documents()
    if args.check:
        stale = stale_regions(paths)
        for region in stale:
            print(f"stale: {region} (run python scripts/render_tables.py)")
        return 1 if stale else 0
    for path in paths:
        text = path.read_text(encoding="utf-8")
        rendered = render_document(text)
        if rendered != text:
            path.write_text(rendered, encoding="utf-8")
            print(f"rendered {path.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
