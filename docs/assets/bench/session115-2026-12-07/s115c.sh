#!/usr/bin/env bash
# Session 115, after dc2b9ed. H200: the grid of the op given on main. H100: one minute of wide
# random calls, fp8 and fp4 interleaved, on fresh seeds.
# usage: bash scratch/s115c.sh OP FIRST_SEED
set -uo pipefail
source tools/source_env.sh
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
name=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
if [[ "$name" == *H200* ]]; then
  BENCH_LIMIT=480 bash scratch/grid.sh "$1"
else
  { date -u; nvidia-smi --query-gpu=name,uuid,driver_version,power.limit --format=csv; git log --oneline -1; } > "$OUT/gpu.txt" 2>&1
  cat "$OUT/gpu.txt"
  python tools/random_cases.py --fp8 100 --fp4 100 --schedules 20 --first-seed "$2" --shapes wide --layouts wide --scales wide --batches large --chunk 40 --time-limit 60 2>&1 | tr '\r' '\n' | grep -v '%|' > "$OUT/random-wide-$2.log"
  echo "random wide rc=$? $(date -u +%T)"; tail -4 "$OUT/random-wide-$2.log"
fi
date -u
