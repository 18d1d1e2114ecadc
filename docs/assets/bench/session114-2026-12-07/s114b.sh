#!/usr/bin/env bash
# Session 114, last call. H200: fp4 next_n 3 over the grid, then fp4's other next_n as time allows.
# H100: random calls with graph replays on fresh seeds.
set -uo pipefail
source tools/source_env.sh
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
{ date -u; nvidia-smi --query-gpu=name,uuid,driver_version,power.limit --format=csv; git log --oneline -1; } > "$OUT/gpu.txt" 2>&1
cat "$OUT/gpu.txt"
name=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
if [[ "$name" == *H200* ]]; then
  timeout 100 python -c "import torch, flashinfer_attn_scores as m; m.precompile_paged_mqa_logits(variants=('fp4',), output_dtypes=(torch.bfloat16,))" > "$OUT/precompile.log" 2>&1
  echo "precompile rc=$? $(date -u +%T)"
  timeout 150 python tools/bench --ops fp4 --next-n 3 --out "$OUT/n3" > "$OUT/bench-fp4-n3.log" 2>&1
  echo "n3 rc=$? $(date -u +%T)"; tail -4 "$OUT/bench-fp4-n3.log"
  timeout 170 python tools/bench --ops fp4 --next-n 1,2,4 --no-host-time --out "$OUT/n124" > "$OUT/bench-fp4-n124.log" 2>&1
  echo "n124 rc=$? $(date -u +%T)"; tail -4 "$OUT/bench-fp4-n124.log"
else
  timeout 100 python tools/random_cases.py --fp8 100 --fp4 100 --first-seed ${1:-6490000} --scales wide --replays 3 2>&1 | tr '\r' '\n' | grep -v '%|' > "$OUT/random-${1:-6490000}.log"
  echo "random rc=$? $(date -u +%T)"; tail -3 "$OUT/random-${1:-6490000}.log"
fi
date -u
