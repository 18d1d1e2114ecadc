#!/usr/bin/env bash
# Device call: the whole GPU suite on the fp4-n3-producer-regs tree (the checkout), then fresh fp4 random cases.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,uuid,driver_version --format=csv | tee "$OUT/gpu.txt"; date -u | tee -a "$OUT/gpu.txt"
grep -n "define PRODUCER_REGS" packages/attn-scores/src/flashinfer_attn_scores/paged_mqa_logits/csrc/fp4_paged_mqa_logits.cu | tee -a "$OUT/gpu.txt"
export PYTHONPATH=packages/layouts/src:packages/jit/src:packages/schedule/src:packages/attn-scores/src
SKIP_TESTS=shards SKIP_CHECK=1 JIT_BENCH=0 BENCH=0 SHARD_TIMEOUT=340 SHARD4_TIMEOUT=60 \
  timeout 380 bash tools/gpu_session.sh -rfE > "$OUT/session.log" 2>&1
echo "suite rc=$?"
left=$((540 - SECONDS)); echo "random cases: $left s"
timeout "$left" python tools/random_cases.py --fp4 600 --first-seed 6350000 --scales wide > "$OUT/random.log" 2>&1
echo "random rc=$?"; tail -6 "$OUT/random.log"
