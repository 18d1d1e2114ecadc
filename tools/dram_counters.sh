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
# (every variant's ncu CSV, one after another); prints each variant's metrics. COPY=0 skips the
# reference launch at the end (an elementwise kernel, 1 GiB in and out).
set -u
OUT=${OUT:-/tmp/dram-counters}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)  # absolute: source_env.sh changes to the repository root
source "$(dirname "$0")/source_env.sh"
ncu --query-metrics 2>&1 | grep -E "^dram" > "$OUT/metrics-available.txt"
echo "DRAM metric names offered: $(wc -l < "$OUT/metrics-available.txt")"
# Bytes each way, and the DRAM cycles busy with reads, with writes and at all, against the
# elapsed DRAM cycles (every counter summed over the memory channels).
BASE=gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,dram__cycles_active.sum,dram__cycles_active_read.sum,dram__cycles_active_write.sum,dram__cycles_elapsed.sum,lts__t_sectors_op_write.sum
# The last launch's metrics from $OUT/one.csv, appended to counters.csv and printed.
print_metrics() {
  cat "$OUT/one.csv" >> "$OUT/counters.csv"
  grep -E '"(gpu__|dram__|lts__)' "$OUT/one.csv" \
    | awk -F'","' '{gsub(/"/, "", $NF); printf "  %-60s %s %s\n", $(NF-2), $(NF-1), $NF}'
}
IFS=';' read -ra variants <<< "${VARIANTS:-fp8 1,64,128,65536 -;fp8 1,64,128,65536 EXP_STORES=1;fp8 1,64,128,65536 EXP_STORES=2;fp8 2,64,128,65536 -;fp4 1,64,128,65536 -}"
for variant in "${variants[@]}"; do
  read -r kernel shape knobs <<< "$variant"
  [ "$knobs" = - ] && knobs=""
  timeout 240 ncu --clock-control none -k "regex:${kernel}_paged_mqa_logits_sm90" -s 2 -c 1 \
    --metrics "$BASE" --csv \
    python tools/fp8_kernel_check.py --profile --profile-kernel "$kernel" --profile-shape "$shape" \
    ${knobs:+--profile-experiment "$knobs"} > "$OUT/one.csv" 2>&1
  echo "== $kernel $shape ${knobs:-production} (exit $?)" | tee -a "$OUT/counters.csv"
  print_metrics
done
rm -f "$OUT/one.csv"
if [ "${COPY:-1}" = 1 ]; then
  # A reference with as many writes as reads: 1 GiB in, 1 GiB out through an elementwise
  # kernel. (The benchmark's copy ceiling is a copy-engine transfer, which ncu does not profile.)
  timeout 240 ncu --clock-control none -k "regex:vectorized_elementwise" -c 1 --metrics "$BASE" --csv python -c "
import torch
src = torch.empty(1 << 30, dtype=torch.int8, device='cuda')
torch.neg(src, out=torch.empty_like(src))
torch.cuda.synchronize()
" > "$OUT/one.csv" 2>&1
  echo "== elementwise 1 GiB in, 1 GiB out (exit $?)" | tee -a "$OUT/counters.csv"
  print_metrics
  rm -f "$OUT/one.csv"
fi
