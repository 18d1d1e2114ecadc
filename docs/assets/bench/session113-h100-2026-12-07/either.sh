#!/usr/bin/env bash
# H200: the fp4 grid on main and random calls; otherwise main's whole GPU suite.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
name=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "GPU: $name"
if [[ "$name" == *H200* ]]; then
  bash scratch/grid.sh fp4 6430000 > "$OUT/grid.log" 2>&1
  tail -30 "$OUT/grid.log"
  tar czf /tmp/logs.tar.gz -C "$OUT" --exclude=results.json . && (cd "$OUT" && find . -type f ! -name results.json ! -name grid.log -delete) && mv /tmp/logs.tar.gz "$OUT"/
  find "$OUT" -type f
else
  nvidia-smi --query-gpu=name,uuid,driver_version --format=csv > "$OUT/gpu.txt"; date -u >> "$OUT/gpu.txt"
  SKIP_TESTS=shards SKIP_CHECK=1 JIT_BENCH=0 BENCH=0 SHARD_TIMEOUT=400 SHARD4_TIMEOUT=60 bash tools/gpu_session.sh -rfE > "$OUT/session.log" 2>&1
  date -u >> "$OUT/gpu.txt"
  tail -40 "$OUT/session.log"
fi
