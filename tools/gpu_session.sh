#!/usr/bin/env bash
# One device call on the H200: the GPU test suite, the kernel bring-up check, the JIT launch
# benchmark, the op benchmark, and (PROFILE=1) an ncu profile; short tables last.
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

if [ "${SKIP_TESTS:-0}" != 1 ]; then
  python -m pytest -m gpu -q -p no:cacheprovider -rfE "$@" > "$OUT/pytest-gpu.log" 2>&1
  echo "pytest: $(tail -n 1 "$OUT/pytest-gpu.log")"
  grep -E "^(FAILED|ERROR)" "$OUT/pytest-gpu.log" | cut -c1-220 | head -30
fi
if [ "${SKIP_CHECK:-0}" != 1 ]; then
  python tools/fp8_kernel_check.py --no-timing > "$OUT/fp8-check.log" 2>&1
  echo "fp8 check: $(grep -c '^ok' "$OUT/fp8-check.log") ok, $(grep -c '^FAIL' "$OUT/fp8-check.log") FAIL"
  grep "^FAIL" "$OUT/fp8-check.log" | cut -c1-200 | head
fi
if [ "${JIT_BENCH:-1}" = 1 ]; then
  timeout 120 python packages/jit/benchmarks/launch_overhead.py --json "$OUT/jit-launch.json" > "$OUT/jit-launch.log" 2>&1
  tail -n 15 "$OUT/jit-launch.log"
fi
if [ "${PROFILE:-0}" = 1 ]; then
  timeout 240 ncu --clock-control none -k regex:fp8_paged_mqa_logits_sm90 -s 2 -c 1 \
    --section SpeedOfLight --section WarpStateStats --section SchedulerStats \
    --section MemoryWorkloadAnalysis --section Occupancy \
    python tools/fp8_kernel_check.py --profile > "$OUT/ncu.txt" 2>&1
  grep -E "Duration|Throughput|Stall|Warp Cycles|Issued|Eligible|Active Warps|No Eligible|One or More" "$OUT/ncu.txt" | head -40
fi
if [ "${BENCH:-1}" = 1 ]; then
  timeout 300 python tools/bench --ops "${BENCH_OPS:-fp8}" --out "$OUT/bench" > "$OUT/bench.log" 2>&1
  echo "bench exit $?"
  tail -n 60 "$OUT/bench.log"
fi
