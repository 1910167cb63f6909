"""The documentation site builds strictly (a broken link, a missing page or an unresolved API reference fails it),
and its results tables are the stored results files' (scripts/render_tables.py)."""

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))

import render_tables  # noqa: E402  (scripts/ is no package)


def test_the_site_builds_strictly(tmp_path):
    # PYTHONPATH: the API reference documents the source beside this test, whichever attnzoo is installed.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")])}
    env["NO_MKDOCS_2_WARNING"] = "1"
    build = [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")]
    result = subprocess.run(build, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    api = (tmp_path / "site" / "api" / "index.html").read_text(encoding="utf-8")
    assert 'id="attnzoo.config.ModelConfig"' in api and 'id="attnzoo.model.Transformer"' in api
    assert "Keep a Changelog" in (tmp_path / "site" / "changelog" / "index.html").read_text(encoding="utf-8")


def test_every_table_region_agrees_with_its_results_file():
    assert render_tables.stale_regions(render_tables.documents()) == []


def test_a_table_edited_by_hand_is_caught(tmp_path):
    page = REPO / "docs" / "benchmarks.md"
    text = page.read_text(encoding="utf-8")
    edited = tmp_path / "benchmarks.md"
    edited.write_text(
        text.replace("| mha-eager | train | 256 | 16 | 3,866 |", "| mha-eager | train | 256 | 16 | 3,867 |")
    )
    assert edited.read_text() != text
    assert render_tables.stale_regions([edited]) == [f"{edited}: table:backends.md#1"]


def test_every_regioned_table_comes_from_a_stored_file():
    names = {m["name"] for path in render_tables.documents() for m in render_tables.REGION.finditer(path.read_text())}
    generated = {"claims", "claims-one-size", "compare-quick"}
    assert generated <= names
    assert (render_tables.ONE_SIZE / "results.json").is_file() and (render_tables.QUICK / "results.json").is_file()
    assert all((render_tables.CLAIMS / rung / "results.json").is_file() for rung in ("small", "large"))
    for name in names - generated:
        assert (render_tables.RESULTS / name.partition("#")[0]).is_file(), name
