#!/usr/bin/env bash
# Session 114. H200: fp4 grid on main, then random calls. H100: random calls on fresh seeds.
set -uo pipefail
source tools/source_env.sh
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
name=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
if [[ "$name" == *H200* ]]; then
  BENCH_LIMIT=400 bash scratch/grid.sh fp4 ${1:-}
else
  { date -u; nvidia-smi --query-gpu=name,uuid,driver_version,power.limit --format=csv; git log --oneline -1; } > "$OUT/gpu.txt" 2>&1
  cat "$OUT/gpu.txt"
  timeout 150 python tools/random_cases.py --fp8 60 --fp4 60 --schedules 40 --first-seed ${2:-6460000} --shapes wide --layouts wide --scales wide --batches large 2>&1 | tr '\r' '\n' | grep -v '%|' > "$OUT/random-${2:-6460000}.log"
  echo "random rc=$? $(date -u +%T)"; tail -3 "$OUT/random-${2:-6460000}.log"
fi
date -u
