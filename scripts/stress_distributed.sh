#!/usr/bin/env bash
# Runs the distributed tests (tests/test_distributed.py: DDP and FSDP2 over two gloo ranks, launched by torchrun)
# N times in a row and reports how many runs passed. A rank that aborts at exit (SIGABRT, "terminate called ...")
# fails its torchrun and so its run.
#
#   bash scripts/stress_distributed.sh [N=30] [extra pytest arguments, e.g. -k fsdp]
set -uo pipefail
cd "$(dirname "$0")/.."
N=${1:-30}
shift || true
PYTHON=${PYTHON:-python3}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"  # this checkout, whatever is installed
logs=$(mktemp -d)
passed=0
for i in $(seq 1 "$N"); do
    started=$(date +%s)
    if "$PYTHON" -m pytest -q -p no:cacheprovider tests/test_distributed.py "$@" >"$logs/run-$i.log" 2>&1; then
        passed=$((passed + 1))
        verdict=passed
    else
        verdict="FAILED (log: $logs/run-$i.log)"
    fi
    if grep -q "terminate called" "$logs/run-$i.log"; then
        verdict="$verdict; 'terminate called' in its output"
    fi
    echo "run $i/$N: $verdict in $(($(date +%s) - started)) s ($(tail -n 1 "$logs/run-$i.log"))"
done
echo "stress_distributed: $passed/$N runs passed"
[ "$passed" -eq "$N" ]
