#!/usr/bin/env bash
# Session 115, last call (about 380 s of device time left). H200: fp4 next_n 3 over the grid on
# main (the one row whose kernel changed since run 36). H100: a few seconds of wide random calls.
set -uo pipefail
source tools/source_env.sh
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
{ date -u; nvidia-smi --query-gpu=name,uuid,driver_version,power.limit,clocks.max.sm --format=csv; git log --oneline -1; } > "$OUT/gpu.txt" 2>&1
cat "$OUT/gpu.txt"
name=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
if [[ "$name" == *H200* ]]; then
  timeout 60 python -c "import torch, flashinfer_attn_scores as m; m.precompile_paged_mqa_logits(variants=('fp4',), output_dtypes=(torch.bfloat16,), next_ns=(3,))" > "$OUT/precompile.log" 2>&1 \
    || timeout 90 python -c "import torch, flashinfer_attn_scores as m; m.precompile_paged_mqa_logits(variants=('fp4',), output_dtypes=(torch.bfloat16,))" >> "$OUT/precompile.log" 2>&1
  echo "precompile rc=$? $(date -u +%T)"
  timeout 170 python tools/bench --ops fp4 --next-n 3 --no-host-time --out "$OUT/n3" > "$OUT/bench-fp4-n3.log" 2>&1
  echo "n3 rc=$? $(date -u +%T)"; tail -4 "$OUT/bench-fp4-n3.log"
else
  python tools/random_cases.py --fp8 100 --fp4 100 --first-seed 6600000 --scales wide --replays 3 --time-limit 10 2>&1 | tr '\r' '\n' | grep -v '%|' > "$OUT/random-6600000.log"
  echo "random rc=$? $(date -u +%T)"; tail -3 "$OUT/random-6600000.log"
fi
date -u
