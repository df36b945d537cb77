#!/usr/bin/env bash
# Issue 40's measurements on a CUDA GPU, in one call of under 7 minutes: the device step's CUDA
# checks (tests/cuda_checks.py: graph replay against eager, device sampling against the host's),
# then bench/gpu_decode.py (ceilings, end to end with graphs on and off beside transformers, the
# server's batch, the kernel against SDPA). Everything lands in $OUT; the report is printed last.
#
#     bash bench/gpu_check.sh              # on the GPU machine (the device tool's $OUT)
#     bash bench/gpu_check.sh --dry-run    # here: the same plumbing on the CPU, tiny shapes
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu_check}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
if [ "${1:-}" = "--dry-run" ]; then
    TRITON_INTERPRET=1 $PY bench/gpu_decode.py --dry-run --json "$OUT/gpu_decode.json" 2>"$OUT/gpu_decode.log"
    exit $?
fi
nvidia-smi --query-gpu=name,memory.used,memory.total,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu.txt"
timeout 150 $PY tests/cuda_checks.py 2>&1 | tee "$OUT/cuda_checks.txt"
checks=${PIPESTATUS[0]}
$PY bench/gpu_decode.py --budget-s 300 --json "$OUT/gpu_decode.json" 2>"$OUT/gpu_decode.log" | tee "$OUT/gpu_decode.md"
bench=${PIPESTATUS[0]}
echo "cuda checks: exit $checks; bench: exit $bench"
exit $(( checks || bench ))
