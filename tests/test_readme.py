"""The README as a new user meets it: commands that can run, outputs under runs/ (which git ignores)."""

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text(encoding="utf-8")


def _code() -> str:
    return "\n".join(re.findall(r"```(?:bash|python|toml)?\n(.*?)```", README, flags=re.DOTALL))


def test_the_readme_never_installs_attnzoo_from_a_package_index():
    # attnzoo is not published: an extra comes from the clone.
    assert not re.search(r"pip install\s+['\"]?attnzoo\b", README)
    assert 'pip install -e ".[hf]"' in README


def test_the_readme_examples_write_under_runs_which_git_ignores():
    outputs = re.findall(r"--out\s+(\S+)", _code()) + re.findall(r"save_pretrained\(\"([^\"]+)\"\)", _code())
    outputs += re.findall(r"Path\(\"([^\"]+)\"\)\)", README)
    assert outputs
    assert [o for o in outputs if not o.startswith(("runs/", "benchmarks/results/"))] == []
    assert "/runs/" in (REPO / ".gitignore").read_text().splitlines()  # the top-level runs/, not the fixtures
