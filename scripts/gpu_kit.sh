#!/usr/bin/env bash
# What to run the day a CUDA GPU is lent: every GPU check, benchmark and the gpu-lm preset, within a budget.
#
#   bash scripts/gpu_kit.sh                        about 40 minutes → benchmarks/results/gpu-<date>/summary.md
#   bash scripts/gpu_kit.sh --out DIR              the same into DIR; run it again to resume where it stopped
#   bash scripts/gpu_kit.sh --dry-run --out DIR    every stage at toy sizes on a CPU (1-2 minutes), as CI runs it
#   bash scripts/gpu_kit.sh --preset gpu-ladder --rung small --out DIR   one rung of the GPU ladder (docs/jobs/gpu.md)
#
# All of it is benchmarks/gpu_kit.py (its --help lists the stages and flags); this only runs it from the clone.
set -euo pipefail
cd "$(dirname "$0")/.."
exec "${PYTHON:-python3}" benchmarks/gpu_kit.py "$@"
