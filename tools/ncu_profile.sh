#!/usr/bin/env bash
# ncu of one large launch per "kernel next_n,block_size,batch,avg_len" argument (default: fp4
# next_n 1 and fp8 next_n 2 at B 128, L 32k), with per-SASS-instruction stall samples as CSV
# (<name>.sass.csv) and the section report (<name>.txt) in $OUT.
#   bash tools/ncu_profile.sh "fp8 4,64,64,32768" ...
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/ncu-profile}
mkdir -p "$OUT"
export PYTHONPATH=packages/layouts/src:packages/jit/src:packages/schedule/src:packages/attn-scores/src${PYTHONPATH:+:$PYTHONPATH}
export FLASHINFER_JIT_CACHE_DIR=${FLASHINFER_JIT_CACHE_DIR:-/tmp/flashinfer-jit-cache}
[ $# -eq 0 ] && set -- "fp4 1,64,128,32768" "fp8 2,64,128,32768"
for spec in "$@"; do
  read -r kernel shape <<< "$spec"
  name=${kernel}_${shape//,/_}
  timeout 200 ncu --clock-control none -k "regex:${kernel}_paged_mqa_logits_sm90" -s 2 -c 1 \
    --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section SourceCounters \
    --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis -o "$OUT/$name" -f \
    python tools/fp8_kernel_check.py --profile --profile-kernel "$kernel" --profile-shape "$shape" > "$OUT/$name.log" 2>&1
  ncu -i "$OUT/$name.ncu-rep" > "$OUT/$name.txt" 2>&1
  ncu -i "$OUT/$name.ncu-rep" --page source --csv --print-source sass > "$OUT/$name.sass.csv" 2>&1
  rm -f "$OUT/$name.ncu-rep"
  echo "== $spec"
  grep -E "Duration|SM Frequency|Throughput|Issued Warp|Eligible|No Eligible|Shared" "$OUT/$name.txt" | head -20
done
