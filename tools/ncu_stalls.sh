#!/usr/bin/env bash
# Where a logits kernel's warps stall, per SASS instruction: ncu's warp-state sampling
# (WarpStateStats + SourceCounters) of one launch, exported as CSV for
# `python tools/ncu_stalls.py`. Clock control off; cache control none by default, so the
# profiled launch (the third of `fp8_kernel_check.py --profile`) finds the code and the small
# inputs where the two launches before it left them, as in a benchmark's back-to-back replays.
#
#   OUT=/tmp/stalls bash tools/ncu_stalls.sh                       # fp8 next_n 1, block 64, B 64, L 4k
#   CASES="fp8 1,64,64,4096;fp4 1,64,128,16384" CACHE=all OUT=/tmp/stalls bash tools/ncu_stalls.sh
#
# INTERVAL=N samples every 2^(5+N) cycles per SM sub-partition (ncu's --warp-sampling-interval,
# 0-31; by default ncu picks one from the kernel's length, which left 251 samples for a 2 us
# launch on the H200).
#
# Per case: $OUT/<kernel>-<shape>-details.csv (the sections' metrics) and
# $OUT/<kernel>-<shape>-source.csv (the SASS source view with its sampling columns).
set -u
OUT=${OUT:-/tmp/ncu-stalls}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)  # absolute: source_env.sh changes to the repository root
source "$(dirname "$0")/source_env.sh"
IFS=';' read -ra cases <<< "${CASES:-fp8 1,64,64,4096}"
for case in "${cases[@]}"; do
  read -r kernel shape <<< "$case"
  name="$kernel-${shape//,/_}"
  report="/tmp/$name"
  rm -f "$report.ncu-rep"
  timeout 300 ncu --clock-control none --cache-control "${CACHE:-none}" \
    -k "regex:${kernel}_paged_mqa_logits_sm90" -s 2 -c 1 \
    --section WarpStateStats --section SourceCounters --import-source no -o "$report" \
    ${INTERVAL:+--warp-sampling-interval "$INTERVAL"} \
    python tools/fp8_kernel_check.py --profile --profile-kernel "$kernel" --profile-shape "$shape" \
    > "$OUT/$name-ncu.log" 2>&1
  echo "== $kernel $shape: ncu exit $?"
  ncu -i "$report.ncu-rep" --page details --csv > "$OUT/$name-details.csv" 2>&1
  ncu -i "$report.ncu-rep" --page source --print-source sass --csv > "$OUT/$name-source.csv" 2>&1
  echo "   details $(wc -l < "$OUT/$name-details.csv") lines, source $(wc -l < "$OUT/$name-source.csv") lines"
done
