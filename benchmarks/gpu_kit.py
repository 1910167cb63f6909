"""What to run the day a CUDA GPU is lent: every GPU check, benchmark and the gpu-lm preset, within a budget.

    bash scripts/gpu_kit.sh                            # about 40 minutes → benchmarks/results/gpu-<date>/
    bash scripts/gpu_kit.sh --dry-run --out runs/gpu-kit   # every stage at toy sizes on a CPU

The command is ``benchmarks/gpu/kit.py`` (``--help`` lists the stages and flags).
"""

import sys

from gpu.kit import main

if __name__ == "__main__":
    sys.exit(main())
