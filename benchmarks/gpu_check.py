"""Verify attnzoo on a CUDA GPU with one command (issue 14).

    python benchmarks/gpu_check.py             # the full check, sized for < 10 minutes on an H100
    python benchmarks/gpu_check.py --quick     # fewer combinations and sizes, about 3 minutes
    python benchmarks/gpu_check.py --dry-run   # the CPU part at tiny sizes (what CI runs); forced without CUDA

The command is ``benchmarks/gpu/check/command.py`` (``--help`` says what it checks), its parts beside it.
"""

import sys

from gpu.check.command import main

if __name__ == "__main__":
    sys.exit(main())
