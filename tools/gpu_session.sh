#!/usr/bin/env bash
# One device call on the H200: kernel bring-up check with timings, then the GPU test suite.
# Runs the packages from their src/ folders (the device image has no package registry).
#   bash tools/gpu_session.sh [extra pytest args...]
# Logs go to $OUT (the device tool's output folder) or /tmp/gpu-session.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu-session}
mkdir -p "$OUT"
export PYTHONPATH=packages/layouts/src:packages/jit/src:packages/schedule/src:packages/attn-scores/src${PYTHONPATH:+:$PYTHONPATH}
export FLASHINFER_JIT_CACHE_DIR=${FLASHINFER_JIT_CACHE_DIR:-/tmp/flashinfer-jit-cache}
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,clocks.max.sm,power.draw,power.limit,temperature.gpu,clocks_throttle_reasons.active --format=csv
date -u

python -m pytest -m gpu -q -p no:cacheprovider --maxfail=40 "$@" > "$OUT/pytest-gpu.log" 2>&1
echo "pytest: $(tail -n 1 "$OUT/pytest-gpu.log")"
grep -E "^(FAILED|ERROR)" "$OUT/pytest-gpu.log" | cut -c1-220 | head -40
python tools/fp8_kernel_check.py > "$OUT/fp8-check.log" 2>&1
grep -v "^ok" "$OUT/fp8-check.log" | cut -c1-240 | tail -n 60
