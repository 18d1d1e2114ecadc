#!/usr/bin/env bash
# DRAM and L2 traffic of single logits launches, from ncu's counters: what the memory system
# moved for production and for measurement variants (EXP_STORES=1: no logit stores; =2: every
# logit stored into the first 512 columns of its row, which stay in L2). One launch each,
# B 128, L 64k, block 64 unless VARIANTS says otherwise; clock control off.
#
#   OUT=/tmp/dram bash tools/dram_counters.sh
#   VARIANTS="fp8 1,64,128,65536 -;fp8 1,64,128,65536 EXP_STORES=1" bash tools/dram_counters.sh
#
# Writes $OUT/metrics-available.txt (the DRAM metric names this GPU offers) and $OUT/counters.csv
# (every variant's ncu CSV, one after another); prints each variant's metrics. Metrics in EXTRA_METRICS are collected
# in a second pass per variant, so a name this ncu lacks cannot cost the base table.
set -u
OUT=${OUT:-/tmp/dram-counters}
mkdir -p "$OUT"
cd "$(dirname "$0")/.."
export PYTHONPATH=packages/layouts/src:packages/jit/src:packages/schedule/src:packages/attn-scores/src${PYTHONPATH:+:$PYTHONPATH}
export FLASHINFER_JIT_CACHE_DIR=${FLASHINFER_JIT_CACHE_DIR:-/tmp/flashinfer-jit-cache}
ncu --query-metrics 2>&1 | grep -E "^dram" > "$OUT/metrics-available.txt"
echo "DRAM metric names offered: $(wc -l < "$OUT/metrics-available.txt")"
# Bytes each way, and the DRAM cycles busy with reads, with writes and at all, against the
# elapsed DRAM cycles (every counter summed over the memory channels).
BASE=gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,dram__cycles_active.sum,dram__cycles_active_read.sum,dram__cycles_active_write.sum,dram__cycles_elapsed.sum,lts__t_sectors_op_write.sum
IFS=';' read -ra variants <<< "${VARIANTS:-fp8 1,64,128,65536 -;fp8 1,64,128,65536 EXP_STORES=1;fp8 1,64,128,65536 EXP_STORES=2;fp8 2,64,128,65536 -;fp4 1,64,128,65536 -}"
for variant in "${variants[@]}"; do
  read -r kernel shape knobs <<< "$variant"
  [ "$knobs" = - ] && knobs=""
  for pass in base extra; do
    metrics=$BASE
    if [ "$pass" = extra ]; then
      [ -n "${EXTRA_METRICS:-}" ] || continue
      metrics=$EXTRA_METRICS
    fi
    timeout 240 ncu --clock-control none -k "regex:${kernel}_paged_mqa_logits_sm90" -s 2 -c 1 \
      --metrics "$metrics" --csv \
      python tools/fp8_kernel_check.py --profile --profile-kernel "$kernel" --profile-shape "$shape" \
      ${knobs:+--profile-experiment "$knobs"} > "$OUT/one.csv" 2>&1
    echo "== $kernel $shape ${knobs:-production} ($pass, exit $?)" | tee -a "$OUT/counters.csv"
    cat "$OUT/one.csv" >> "$OUT/counters.csv"
    grep -E '"(gpu__|dram__|lts__|fbpa)' "$OUT/one.csv" \
      | awk -F'","' '{gsub(/"/, "", $NF); printf "  %-60s %s %s\n", $(NF-2), $(NF-1), $NF}'
  done
done
rm -f "$OUT/one.csv"
if [ "${COPY:-1}" = 1 ]; then
  # The copy ceiling's own traffic: the benchmark's 1 GiB device-to-device copy (every kernel
  # launched, if the copy is a kernel at all), then the same bytes through an elementwise kernel.
  timeout 240 ncu --clock-control none -c 8 --metrics "$BASE" --csv python -c "
import torch
src = torch.empty(1 << 30, dtype=torch.uint8, device='cuda').random_(0, 256)
dst = torch.empty_like(src)
for _ in range(2):
    dst.copy_(src)
torch.neg(src.view(torch.int8), out=dst.view(torch.int8))
torch.cuda.synchronize()
" > "$OUT/one.csv" 2>&1
  echo "== copy (exit $?)" | tee -a "$OUT/counters.csv"
  cat "$OUT/one.csv" >> "$OUT/counters.csv"
  grep -E '"(gpu__|dram__|lts__)' "$OUT/one.csv" \
    | awk -F'","' '{gsub(/"/, "", $NF); printf "  %-40s %-60s %s %s\n", substr($5, 1, 40), $(NF-2), $(NF-1), $NF}'
  rm -f "$OUT/one.csv"
fi
