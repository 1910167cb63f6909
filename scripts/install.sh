#!/usr/bin/env bash
# Installs attnzoo (editable) into the active Python environment.
#
#   bash scripts/install.sh                       install what running attnzoo needs
#   bash scripts/install.sh --dev                 also the dev extra: pytest, ruff, transformers, MkDocs, import-linter,
#                                                 build (the docs, layers and wheel tests), and Triton
#                                                 (~1 GB installed, whose interpreter runs the kernel tests on a CPU)
#   bash scripts/install.sh --dry-run [REPORT]    resolve the torch a machine without torch would get
#                                                 (pip install --dry-run --report), install nothing
#
# A bare `torch` requirement resolves to the CUDA build on Linux: 3-5 GB of torch and nvidia-* wheels, even on
# a machine without a GPU. So torch comes first: an existing build (CPU or CUDA, any version >= 2.4) is kept;
# otherwise torch==2.13.0 is installed, the CUDA build where an NVIDIA driver is present, and elsewhere the CPU
# build from PyTorch's CPU wheel index (ATTNZOO_TORCH_CPU_INDEX, default https://download.pytorch.org/whl/cpu).
# Where that index cannot be reached, pip's default index is used as configured (a CPU wheel it offers, e.g.
# through --find-links, wins: 2.13.0+cpu sorts above 2.13.0). Only then is the package installed, which finds
# torch already satisfied.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
TORCH_VERSION=2.13.0
CPU_INDEX=${ATTNZOO_TORCH_CPU_INDEX:-https://download.pytorch.org/whl/cpu}

say() { echo "install.sh: $*"; }

has_nvidia_driver() {
    [ -e /proc/driver/nvidia/version ] || command -v nvidia-smi >/dev/null 2>&1
}

# Whether a PEP 503 index answers for torch (https:// or file://), within 10 seconds.
index_reachable() {
    "$PYTHON" - "$1" <<'PY'
import os
import sys
import urllib.parse
import urllib.request

url = sys.argv[1].rstrip("/") + "/torch/"
try:
    if url.startswith("file:"):  # a local index: a directory per project
        path = urllib.request.url2pathname(urllib.parse.urlparse(url).path)
        if not os.path.isdir(path):
            raise FileNotFoundError(path)
    else:
        urllib.request.urlopen(url, timeout=10).close()
except Exception as err:  # DNS, refused, timeout, missing directory: all mean "not here"
    print(f"install.sh: {url} cannot be reached ({err})")
    sys.exit(1)
PY
}

# Sets TORCH_SOURCE: the pip arguments that pick where torch comes from.
choose_torch_source() {
    TORCH_SOURCE=()
    if has_nvidia_driver; then
        say "an NVIDIA driver is present: torch==$TORCH_VERSION from the default index (the CUDA build)"
    elif index_reachable "$CPU_INDEX"; then
        say "no NVIDIA driver: the CPU build of torch==$TORCH_VERSION from $CPU_INDEX"
        TORCH_SOURCE=(--index-url "$CPU_INDEX")
    else
        say "no NVIDIA driver and no CPU wheel index: torch==$TORCH_VERSION from pip's default index as configured"
    fi
}

if [ "${1:-}" = "--dry-run" ]; then
    if [ $# -gt 2 ]; then
        say "unexpected argument '$3': expected nothing, --dev or --dry-run [REPORT]"; exit 2
    fi
    report=${2:-$(mktemp --suffix=.json)}
    choose_torch_source
    say "resolving (pip install --dry-run --ignore-installed --report $report) ..."
    "$PYTHON" -m pip install --dry-run --ignore-installed --quiet --report "$report" \
        ${TORCH_SOURCE[@]+"${TORCH_SOURCE[@]}"} "torch==$TORCH_VERSION"
    "$PYTHON" - "$report" <<'PY'
import json
import sys

resolved = [item["metadata"] for item in json.load(open(sys.argv[1]))["install"]]
print("install.sh: would install " + ", ".join(f"{m['name']} {m['version']}" for m in resolved))
nvidia = [m["name"] for m in resolved if m["name"].lower().startswith("nvidia-")]
print(f"install.sh: {len(nvidia)} nvidia-* package(s)" + (f": {', '.join(nvidia)}" if nvidia else ""))
PY
    exit 0
fi

# The first argument before the count: of `--bogus --dev`, the unknown one is --bogus, not the --dev after it.
case "${1:-}" in
    "") PACKAGE=. ;;
    --dev) PACKAGE=".[dev]" ;;
    *) say "unknown option '$1': expected nothing, --dev or --dry-run [REPORT]"; exit 2 ;;
esac
if [ $# -gt 1 ]; then
    say "unexpected argument '$2': expected nothing, --dev or --dry-run [REPORT]"; exit 2
fi

if "$PYTHON" -c "import torch" 2>/dev/null; then
    say "keeping torch $("$PYTHON" -c 'import torch; print(torch.__version__)')"
else
    choose_torch_source
    say "installing torch==$TORCH_VERSION ..."
    "$PYTHON" -m pip install ${TORCH_SOURCE[@]+"${TORCH_SOURCE[@]}"} "torch==$TORCH_VERSION"
fi
say "installing attnzoo (editable${1:+, with the dev extra}) and its other dependencies ..."
"$PYTHON" -m pip install -e "$PACKAGE"
# Built here rather than in the first run that needs them: one build per machine and torch, cached by PyTorch.
say "building the fused CPU kernels (once per machine; about 2 minutes on 2 cores) ..."
if "$PYTHON" -c 'import sys; from attnzoo.attention.kernels import build; sys.exit(0 if build.available() else 1)'; then
    say "fused CPU kernels built"
else
    say "the fused CPU kernels could not be built (the warning above says why): attention runs on PyTorch's own paths"
fi
say "done: $("$PYTHON" -c 'import attnzoo, torch; print(f"attnzoo {attnzoo.__version__}, torch {torch.__version__}")')"
