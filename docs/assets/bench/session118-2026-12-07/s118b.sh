#!/usr/bin/env bash
# Session 118. H200: the fp4 grid (or fp4 next_n 3 alone when BUDGET is short). H100: compute-sanitizer
# (racecheck, memcheck, synccheck) at the 37 structure cases on main, whose fp4 next_n 3 producers
# run at 56 registers since the hundred-and-twelfth round (no sanitizer run since).
set -uo pipefail
source tools/source_env.sh
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
name=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
if [[ "$name" == *H200* ]]; then
  if (( ${BUDGET:-0} >= 620 )); then BENCH_LIMIT=480 bash scratch/grid.sh "${OPS:-fp4}"; else bash scratch/s115d.sh; fi
else
  { date -u; nvidia-smi --query-gpu=name,uuid,driver_version,power.limit --format=csv; git log --oneline -1; } > "$OUT/gpu.txt" 2>&1
  cat "$OUT/gpu.txt"
  SANITIZE=1 SANITIZE_CASE_ARGS="--only structures" SANITIZE_NOCACHE=0 SANITIZE_TIMEOUT=${STO:-110} SANITIZE_PLAIN_TIMEOUT=${PTO:-200} SANITIZE_TOOLS="racecheck memcheck synccheck" \
    SKIP_TESTS=1 SKIP_CHECK=1 JIT_BENCH=0 BENCH=0 bash tools/gpu_session.sh 2>&1 | tail -40
fi
date -u
