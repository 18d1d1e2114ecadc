#!/usr/bin/env bash
# Session 119. H200: the fp4 grid on main when BUDGET (device seconds left) allows it, else fp4
# next_n 3 only (the row whose kernel changed since run 36). H100: a few seconds of wide random calls.
set -uo pipefail
source tools/source_env.sh
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
name=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
if [[ "$name" == *H200* ]]; then
  if (( ${BUDGET:-0} >= 620 )); then
    BENCH_LIMIT=480 bash scratch/grid.sh "${OPS:-fp4}"
  else
    bash scratch/s115d.sh
  fi
else
  LIMIT=${LIMIT:-5} bash scratch/s115c.sh fp4 "${SEED:-6439200}"
fi
