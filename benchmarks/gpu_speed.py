"""The first call of a GPU lease (issue 36): training and decoding speed on CUDA in bf16, within one command; then
the CUDA route of each mechanism its summary decides.

    timeout -s TERM 560 python3 benchmarks/gpu_speed.py --out runs/gpu-speed; cp runs/gpu-speed/* "$OUT"/  # CUDA
    python benchmarks/gpu_speed.py --dry-run --out runs/gpu-speed   # every case at toy sizes on the CPU (CI)
    python benchmarks/gpu_speed.py --routes-from runs/gpu-speed/summary.json   # → kernels/cuda_routes.json

The command is ``benchmarks/gpu/speed.py`` (``--help`` says what it runs), its parts beside it in ``benchmarks/gpu/``.
"""

import sys

from gpu.plan import GPU_SIZES
from gpu.speed import directory_problem, main

__all__ = ["GPU_SIZES", "directory_problem", "main"]  # benchmarks/dcmha_triton_sm90.py reads the first two here

if __name__ == "__main__":
    sys.exit(main())
