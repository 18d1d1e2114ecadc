#!/usr/bin/env bash
# Device call: the fp4-n3-producer-regs branch's changed configs (tests from the branch tree),
# then the A/B against main's tree, then (time left) the whole suite from the checkout (branch).
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
root=$PWD
nvidia-smi --query-gpu=name,uuid,driver_version,clocks.sm,power.draw --format=csv | tee "$OUT/gpu.txt"
date -u | tee -a "$OUT/gpu.txt"
new=$root/scratch/ab/new
export PYTHONPATH=$new/packages/layouts/src:$new/packages/jit/src:$new/packages/schedule/src:$new/packages/attn-scores/src
( timeout 100 python - <<'PY'
import torch, time
from flashinfer_attn_scores import precompile_paged_mqa_logits
t = time.time()
cfgs = precompile_paged_mqa_logits("cuda", variants=("fp4",), output_dtypes=(torch.bfloat16, torch.float32, torch.float16),
                                   block_sizes=(64, 128), next_ns=(3,), epi_dtypes=(torch.float32,))
print("precompiled", len(cfgs), "in", round(time.time() - t, 1), "s")
PY
) 2>&1 | tail -3 | tee "$OUT/precompile.log"
T=$new/packages/attn-scores/tests/paged_mqa_logits
timeout 150 python -m pytest -q -p no:cacheprovider --import-mode=importlib -rfE "$T/test_gpu.py" \
  -k "(fp4_matches_reference and (64-False-3 or 128-False-3 or 128-True-3) and epi_dtype0) or (fp4 and many_short and -3-)" \
  > "$OUT/branch_tests.log" 2>&1; echo "branch tests rc=$?" | tee -a "$OUT/branch_tests.log"
tail -5 "$OUT/branch_tests.log"
unset PYTHONPATH
timeout "${AB_TIMEOUT:-200}" python tools/tree_ab.py scratch/ab/old scratch/ab/new --single --rounds 2 \
  --shapes "${AB_SHAPES:-fp4:3:64:64:32768,fp4:3:128:128:65536,fp4:3:64:128:16384}" > "$OUT/ab.log" 2>&1
echo "ab rc=$?" | tee -a "$OUT/ab.log"; tail -14 "$OUT/ab.log"
if [ "${SUITE:-1}" = 1 ]; then
  export PYTHONPATH=packages/layouts/src:packages/jit/src:packages/schedule/src:packages/attn-scores/src
  left=$((580 - SECONDS)); echo "suite: ${left} s left"
  SKIP_TESTS=shards SKIP_CHECK=1 JIT_BENCH=0 BENCH=0 SHARD_TIMEOUT=${SHARD_TIMEOUT:-$((left - 70))} SHARD4_TIMEOUT=60 \
    timeout "$left" bash tools/gpu_session.sh -rfE > "$OUT/session.log" 2>&1
  echo "suite rc=$?"; tail -25 "$OUT/session.log"
fi
