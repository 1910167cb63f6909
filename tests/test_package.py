"""The package as a user installs it: an sdist and a wheel built from the source, the wheel installed into a fresh
virtual environment, and the command run from there, so a module or file missing from the package fails here.

No network: the build runs without isolation (setuptools as installed), and the environment sees this test's own
packages (a ``.pth`` file naming the running interpreter's site-packages) for torch and the rest, so pip installs
the wheel alone from the file. It does not see its base interpreter's: that interpreter has no torch where attnzoo
was installed into a virtual environment, as the README's commands do.
"""

import json
import os
import shutil
import site
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import pytest
from training_helpers import write_text_corpus

import attnzoo
from attnzoo.attention.kernels import build

REPO = Path(__file__).resolve().parents[1]


def _run(*argv, cwd: Path, env: dict[str, str] | None = None) -> str:
    result = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, f"{argv}\n{result.stdout}\n{result.stderr}"
    return result.stdout


def _our_site_packages() -> list[str]:
    """Where this interpreter finds torch and attnzoo's other dependencies: its own site-packages, be it a virtual
    environment's or the system's. A .pth line adds a folder without running the .pth files in it, so an editable
    install of attnzoo there never shadows the wheel, which the environment's own site-packages hold first."""
    folders = [*site.getsitepackages(), sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]]
    return list(dict.fromkeys(folder for folder in folders if Path(folder).is_dir()))


def test_the_version_is_written_once():
    # pyproject.toml reads it from attnzoo.__version__ (setuptools' dynamic version).
    pyproject = (REPO / "pyproject.toml").read_text()
    assert 'dynamic = ["version"]' in pyproject and 'version = { attr = "attnzoo.__version__" }' in pyproject
    assert "\nversion =" not in pyproject.split("[tool.setuptools.dynamic]")[0]


@pytest.mark.slow
def test_the_wheel_installs_into_a_fresh_environment_and_runs(tmp_path):
    source = tmp_path / "source"  # a copy, so that the build leaves nothing in the checkout
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    shutil.copytree(REPO / "src", source / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    dist = tmp_path / "dist"
    _run(sys.executable, "-m", "build", "--no-isolation", "--outdir", str(dist), str(source), cwd=tmp_path)
    wheel = dist / f"attnzoo-{attnzoo.__version__}-py3-none-any.whl"
    assert wheel.is_file() and (dist / f"attnzoo-{attnzoo.__version__}.tar.gz").is_file()

    env_dir = tmp_path / "venv"
    # As if its base interpreter had no torch; and no pip of its own (ensurepip took seconds): this interpreter's
    # pip, seen through the .pth file, installs into the environment that runs it.
    venv.create(env_dir, system_site_packages=False, with_pip=False)
    python = env_dir / "bin" / "python"
    no_torch = subprocess.run([str(python), "-c", "import torch"], cwd=tmp_path, capture_output=True, text=True)
    assert "No module named 'torch'" in no_torch.stderr, no_torch.stderr  # the base's packages are out of sight
    purelib = _run(str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])", cwd=tmp_path)
    (Path(purelib.strip()) / "running-interpreter.pth").write_text("\n".join(_our_site_packages()) + "\n")
    _run(str(python), "-m", "pip", "install", "--quiet", "--no-deps", "--no-index", str(wheel), cwd=tmp_path)
    # Outside the checkout and with no PYTHONPATH: the installed copy is the one imported.
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    env |= {"ATTNZOO_CACHE_DIR": str(tmp_path / "cache"), "OMP_NUM_THREADS": "1"}
    where = _run(str(python), "-c", "import attnzoo; print(attnzoo.__file__)", cwd=tmp_path, env=env)
    assert where.startswith(str(env_dir)), where
    # The fused CPU kernels' C++ sources ship in the wheel: they are compiled on the user's machine.
    source_check = (
        "from attnzoo.attention.kernels import build; "
        "print(*sorted(path.name for path in build.CSRC.iterdir() if path.is_file()))"
    )
    checkout = sorted(path.name for path in build.CSRC.iterdir() if path.suffix in (".cpp", ".h"))
    assert _run(str(python), "-c", source_check, cwd=tmp_path, env=env).split() == checkout

    command = env_dir / "bin" / "attnzoo"
    assert _run(str(command), "--version", cwd=tmp_path, env=env).strip() == f"attnzoo {attnzoo.__version__}"
    assert "parameters" in _run(str(command), "info", cwd=tmp_path, env=env)
    text = write_text_corpus(tmp_path / "text.txt")
    out = tmp_path / "compare"
    flags = ["--preset", "micro", "--variants", "mha+rope", "--tasks", "--data", str(text), "--out", str(out)]
    flags.append("--no-progress")  # and no synthetic task: the language model's runs, report and verdicts are enough
    _run(str(command), "compare", *flags, cwd=tmp_path, env=env)
    assert json.loads((out / "results.json").read_text())["attnzoo_version"] == attnzoo.__version__
    assert (out / "report.html").is_file()
