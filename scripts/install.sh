#!/usr/bin/env bash
# Installs attnzoo into the active Python environment.
#
# A bare `torch` requirement on a machine with no torch pulls several GB of CUDA wheels, so torch is
# installed first: an existing build (CPU or CUDA, any version >= 2.4) is kept, otherwise the CPU build
# torch==2.13.0 is installed. Only then is the package installed, which finds torch already satisfied.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}

if "$PYTHON" -c "import torch" 2>/dev/null; then
    echo "install.sh: keeping torch $("$PYTHON" -c 'import torch; print(torch.__version__)')"
else
    echo "install.sh: no torch found; installing the CPU build torch==2.13.0"
    "$PYTHON" -m pip install -q "torch==2.13.0"
fi
"$PYTHON" -m pip install -q -e ".[dev]"
