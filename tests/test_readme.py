"""The README and the guides as a new user meets them: a short landing page whose links land, commands that can
run, outputs under runs/ (which git ignores), and a Python example that runs as written."""

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text(encoding="utf-8")
GUIDES = sorted(
    p
    for p in (REPO / "docs").rglob("*.md")
    if not {REPO / "docs" / "claims", REPO / "docs" / "claims-one-size"} & set(p.parents)
)
DOCUMENTS = [REPO / "README.md", *GUIDES]


def _code(text: str, languages: str = "bash|python|toml") -> str:
    return "\n".join(re.findall(rf"```(?:{languages})?\n(.*?)```", text, flags=re.DOTALL))


def test_the_readme_fits_on_two_screens_and_opens_with_the_two_commands():
    assert len(README.splitlines()) <= 120
    commands = re.findall(r"```bash\n(.*?)\n```", README, flags=re.DOTALL)[:2]
    assert commands == [
        "bash scripts/install.sh && python3 -m attnzoo compare",
        "bash scripts/install.sh --dev && python3 -m pytest",
    ]
    assert "bash scripts/install.sh --dev && python3 -m pytest" in (REPO / ".ci" / "run").read_text()


def test_every_relative_link_of_the_readme_lands():
    links = [target for target in re.findall(r"\]\(([^)#\s]+)", README) if "://" not in target]
    assert len(links) >= 10
    assert [target for target in links if not (REPO / target).exists()] == []


def test_the_readme_never_installs_attnzoo_from_a_package_index():
    # attnzoo is not published: an extra comes from the clone.
    for document in DOCUMENTS:
        assert not re.search(r"pip install\s+['\"]?attnzoo\b", document.read_text(encoding="utf-8")), document
    assert 'pip install -e ".[hf]"' in README


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda p: str(p.relative_to(REPO)))
def test_the_examples_write_under_runs_which_git_ignores(document):
    text = document.read_text(encoding="utf-8")
    code = _code(text)
    outputs = re.findall(r"--out\s+(\S+)", code) + re.findall(r"save_pretrained\(\"([^\"]+)\"\)", code)
    outputs += re.findall(r"Path\(\"([^\"]+)\"\)\)", text)
    assert [o for o in outputs if not o.startswith(("runs/", "benchmarks/results/"))] == []
    assert "/runs/" in (REPO / ".gitignore").read_text().splitlines()  # the top-level runs/, not the fixtures


def test_the_readme_prose_keeps_its_lines_short():
    """Prose lines (not tables or code) stay within 120 characters, as the code does."""
    text = re.sub(r"```.*?```", "", README, flags=re.DOTALL)
    prose = [line for line in text.splitlines() if not line.startswith("|")]
    assert [line for line in prose if len(line) > 120] == []


def test_the_readme_python_examples_run(tmp_path, monkeypatch):
    layer_example, model_example = re.findall(r"```python\n(.*?)```", README, flags=re.DOTALL)
    monkeypatch.chdir(tmp_path)  # its runs/my-model lands in the test's directory
    namespace: dict = {}
    exec(compile(layer_example, "README.md", "exec"), namespace)
    assert namespace["y"].shape == (2, 128, 256) and namespace["cache"].max_len == 256
    exec(compile(model_example, "README.md", "exec"), namespace)
    assert namespace["out"].shape == (2, 8 + 32)
    assert (tmp_path / "runs" / "my-model" / "config.json").is_file()
