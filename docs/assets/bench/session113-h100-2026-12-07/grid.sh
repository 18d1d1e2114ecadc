#!/usr/bin/env bash
# One device call: a grid of the given ops on main, then (if time is left) random calls.
# usage: bash scratch/grid.sh OPS [RANDOM_FIRST_SEED]
set -uo pipefail
source tools/source_env.sh
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
{ date -u; nvidia-smi --query-gpu=name,uuid,driver_version,power.limit,clocks.max.sm --format=csv; git log --oneline -1 2>/dev/null; } > "$OUT/gpu.txt" 2>&1
cat "$OUT/gpu.txt"
for op in ${1//,/ }; do
  echo "== precompile $op $(date -u +%T)"
  out_dtype=$([ "$op" = fp4 ] && echo bfloat16 || echo float32)
  timeout 200 python -c "import torch, flashinfer_attn_scores as m; m.precompile_paged_mqa_logits(variants=('$op',), output_dtypes=(torch.$out_dtype,))" > "$OUT/precompile-$op.log" 2>&1
  echo "precompile rc=$? $(date -u +%T)"
  echo "== bench $op $(date -u +%T)"
  timeout ${BENCH_LIMIT:-420} python tools/bench --ops "$op" --out "$OUT/$op" > "$OUT/bench-$op.log" 2>&1
  echo "bench $op rc=$? $(date -u +%T)"; tail -4 "$OUT/bench-$op.log"
done
if [ -n "${2:-}" ]; then
  echo "== random $(date -u +%T)"
  timeout 150 python tools/random_cases.py --fp4 300 --first-seed "$2" --scales wide 2>&1 | tr '\r' '\n' | grep -v '%|' > "$OUT/random-$2.log"
  echo "random rc=$? $(date -u +%T)"; tail -5 "$OUT/random-$2.log"
fi
date -u
