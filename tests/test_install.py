"""``scripts/install.sh --dry-run``: which torch a machine without torch gets, resolved by pip for real.

No network: the indexes are local ``file://`` directories built here, standing in for the two real ones. The
default index offers what PyPI offers, ``torch 2.13.0`` depending on ``nvidia-*`` wheels (the CUDA build);
the CPU index offers ``torch 2.13.0+cpu`` alone, as https://download.pytorch.org/whl/cpu does. pip reads no
configuration of this machine (``PIP_CONFIG_FILE=/dev/null``), so its local CPU wheel cannot hide the choice.
"""

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
INSTALL = REPO / "scripts" / "install.sh"
VERSION = "2.13.0"

pytestmark = [
    pytest.mark.skipif(shutil.which("bash") is None, reason="install.sh is a bash script"),
    pytest.mark.skipif(os.path.exists("/proc/driver/nvidia/version"), reason="this machine has an NVIDIA driver"),
]


def _wheel(directory: Path, name: str, version: str, requires: list[str]) -> None:
    """A minimal pure-Python wheel with its metadata, in ``directory/name/`` with a PEP 503 index.html."""
    project = directory / name
    project.mkdir(parents=True, exist_ok=True)
    filename = f"{name.replace('-', '_')}-{version}-py3-none-any.whl"
    dist_info = f"{name.replace('-', '_')}-{version}.dist-info"
    metadata = "\n".join(
        ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}", *(f"Requires-Dist: {r}" for r in requires)]
    )
    files = {
        f"{dist_info}/METADATA": metadata + "\n",
        f"{dist_info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    files[f"{dist_info}/RECORD"] = "".join(f"{path},,\n" for path in files) + f"{dist_info}/RECORD,,\n"
    with zipfile.ZipFile(project / filename, "w") as wheel:
        for path, text in files.items():
            wheel.writestr(path, text)
    links = "".join(f'<a href="{p.name}">{p.name}</a>\n' for p in sorted(project.glob("*.whl")))
    (project / "index.html").write_text(f"<html><body>\n{links}</body></html>\n")


@pytest.fixture(scope="module")
def indexes(tmp_path_factory):
    root = tmp_path_factory.mktemp("indexes")
    _wheel(root / "pypi", "torch", VERSION, ["nvidia-cublas-cu12==12.8.4.1"])  # the CUDA build, as on PyPI
    _wheel(root / "pypi", "nvidia-cublas-cu12", "12.8.4.1", [])
    _wheel(root / "cpu", "torch", f"{VERSION}+cpu", [])
    return root


def _dry_run(tmp_path, indexes, cpu_index: str, path_prefix: str = "") -> tuple[str, list[tuple[str, str]]]:
    env = {key: value for key, value in os.environ.items() if not key.startswith("PIP_")}
    env.update(
        PIP_CONFIG_FILE=os.devnull,
        PIP_INDEX_URL=(indexes / "pypi").as_uri(),
        PIP_NO_CACHE_DIR="1",
        PIP_DISABLE_PIP_VERSION_CHECK="1",
        ATTNZOO_TORCH_CPU_INDEX=cpu_index,
        PYTHON=sys.executable,
        PATH=path_prefix + env.get("PATH", ""),
    )
    report = tmp_path / "report.json"
    done = subprocess.run(
        ["bash", str(INSTALL), "--dry-run", str(report)], capture_output=True, text=True, env=env, timeout=300
    )
    assert done.returncode == 0, done.stdout + done.stderr
    resolved = [(m["metadata"]["name"], m["metadata"]["version"]) for m in json.loads(report.read_text())["install"]]
    return done.stdout, resolved


def test_without_an_nvidia_driver_the_cpu_build_is_resolved_and_no_nvidia_package(tmp_path, indexes):
    out, resolved = _dry_run(tmp_path, indexes, (indexes / "cpu").as_uri())
    assert resolved == [("torch", f"{VERSION}+cpu")]
    assert "no NVIDIA driver: the CPU build" in out and "0 nvidia-* package(s)" in out


def test_an_unreachable_cpu_index_falls_back_to_the_default_index(tmp_path, indexes):
    out, resolved = _dry_run(tmp_path, indexes, (tmp_path / "nowhere").as_uri())
    assert "cannot be reached" in out and "from pip's default index as configured" in out
    assert ("torch", VERSION) in resolved  # what the default index offers: here, as on PyPI, the CUDA build


def test_with_an_nvidia_driver_the_default_index_gives_the_cuda_build(tmp_path, indexes):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").write_text("#!/bin/sh\nexit 0\n")
    (bin_dir / "nvidia-smi").chmod(0o755)
    out, resolved = _dry_run(tmp_path, indexes, (indexes / "cpu").as_uri(), path_prefix=f"{bin_dir}{os.pathsep}")
    assert "an NVIDIA driver is present" in out
    assert sorted(resolved) == [("nvidia-cublas-cu12", "12.8.4.1"), ("torch", VERSION)]
    assert "1 nvidia-* package(s): nvidia-cublas-cu12" in out


def test_an_unknown_option_is_refused_before_anything_is_installed():
    done = subprocess.run(["bash", str(INSTALL), "--devv"], capture_output=True, text=True, cwd=REPO)
    assert done.returncode == 2
    assert "unknown option '--devv': expected nothing, --dev or --dry-run [REPORT]" in done.stdout
    assert "installing" not in done.stdout
