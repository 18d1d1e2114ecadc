#!/usr/bin/env bash
# One device call on the H200: the GPU test suite, the kernel bring-up check, the JIT launch
# benchmark, the op benchmark, (PROFILE=1) an ncu profile and (SANITIZE=1) compute-sanitizer
# runs; short tables last.
# Runs the packages from their src/ folders (the device image has no package registry).
#   bash tools/gpu_session.sh [extra pytest args...]   # with SKIP_TESTS=shards: added to every
#     shard; a -k there replaces shards 0 and 1's own -k (pytest keeps the last), and a shard it
#     leaves with no test (pytest's exit 5) counts as passed
#   SKIP_TESTS=shards SKIP_CHECK=1 JIT_BENCH=0 BENCH=0 bash tools/gpu_session.sh   # whole suite, 4 shards + the timing shard
#   SANITIZE=1 SKIP_TESTS=1 SKIP_CHECK=1 JIT_BENCH=0 BENCH=0 bash tools/gpu_session.sh
#   SANITIZE=1 SANITIZE_RANDOM="20 12 4861000" RANDOM_BATCHES=large SANITIZE_CONTROLS=1 SKIP_TESTS=1 SKIP_CHECK=1 JIT_BENCH=0 BENCH=0 bash tools/gpu_session.sh
#   PDL_AB=1 SKIP_TESTS=1 SKIP_CHECK=1 JIT_BENCH=0 BENCH=0 bash tools/gpu_session.sh
#   HOST_AB=ab_old SKIP_TESTS=1 SKIP_CHECK=1 JIT_BENCH=0 BENCH=0 bash tools/gpu_session.sh
#   EXPERIMENTS="large fp4" SKIP_TESTS=1 SKIP_CHECK=1 JIT_BENCH=0 BENCH=0 bash tools/gpu_session.sh
#   WGMMA_RATE=1 SKIP_TESTS=1 SKIP_CHECK=1 JIT_BENCH=0 BENCH=0 bash tools/gpu_session.sh
#   FLOOR=1 SKIP_TESTS=1 SKIP_CHECK=1 JIT_BENCH=0 BENCH=0 bash tools/gpu_session.sh
#   RANDOM_CASES="3000 2000 3000" SKIP_TESTS=1 SKIP_CHECK=1 JIT_BENCH=0 BENCH=0 bash tools/gpu_session.sh
#   READ_RATE="paths hop writes write-volume epochs" EXPERIMENTS=load-path SKIP_TESTS=1 SKIP_CHECK=1 JIT_BENCH=0 BENCH=0 bash tools/gpu_session.sh
# Knobs: KNOB_DEFAULTS ("RELU_FMA=1": kernel #define defaults for this session), EXPERIMENTS
# ("large fp4 consumers data": variant tables of tools/fp8_kernel_check.py), PDL_AB (0; 1: host time of one eager call and the small-batch variants, FLASHINFER_PDL=0
# against 1, interleaved twice), PROFILE_SPECS ("fp4 1,64,128,32768;fp8 2,64,128,32768": ncu launches, each with an optional epilogue dtype last, e.g. "fp8 2,64,128,32768 float16"), BENCH_OPS (fp8), BENCH_ARGS (extra tools/bench arguments, e.g. --no-gather or
# --host-time-only), BENCH_TIMEOUT (300 s), SANITIZE_TOOLS ("memcheck racecheck synccheck"),
# SANITIZE_NOCACHE (1, the default: a second memcheck without PyTorch's caching allocator), SANITIZE_TIMEOUT
# (110 s per tool run; five runs then fit one 600 s device call even if each one times out),
# SANITIZE_CASE_ARGS (tools/sanitize_cases.py arguments for every run, e.g. "--only structures"),
# SANITIZE_RANDOM ("fp8 fp4 first-seed": random_cases.py calls instead, drawn with the RANDOM_*
# knobs), SANITIZE_KERNELS (paged_mqa_logits: the --kernel-name kns= filter; empty for none),
# SANITIZE_CONTROLS (0; 1: also tools/sanitizer_controls.py, planted bugs each tool must report;
# SANITIZE_CONTROLS_TIMEOUT 400 s),
# SANITIZE_PLAIN_TIMEOUT (100 s: the run without a sanitizer). Step timeouts: SHARD_TIMEOUT (420 s
# per shard), SHARD4_TIMEOUT (120 s, the timing shard), PYTEST_TIMEOUT (540 s, the suite in one
# process), CHECK_TIMEOUT (300 s), EXPERIMENTS_TIMEOUT (240 s).
# Logs go to $OUT (the device tool's output folder) or /tmp/gpu-session; where that would be
# more than the 8 files the device tool returns, they are packed into $OUT/logs.tar.gz at the
# end. The GPU's clocks, power and throttle reasons go to $OUT/gpu-state.csv at the start and
# the end. Exit status: 1 if any step failed or timed out (each says so), else 0.
set -uo pipefail
source "$(dirname "$0")/source_env.sh"
OUT=${OUT:-/tmp/gpu-session}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
status=0
# step_done NAME RC: remember a failed step (the script's exit status) and say which one.
step_done() {
  case $2 in
    0) ;;
    124 | 137) echo "$1: TIMED OUT (exit $2)"; status=1 ;;
    *) echo "$1: FAILED (exit $2)"; status=1 ;;
  esac
}
gpu_state() {
  nvidia-smi --query-gpu=timestamp,name,uuid,driver_version,clocks.sm,clocks.mem,clocks.max.sm,power.draw,power.limit,temperature.gpu,clocks_throttle_reasons.active --format=csv"$1" \
    >> "$OUT/gpu-state.csv" 2>&1
}
if [ -n "${KNOB_DEFAULTS:-}" ]; then
  # KNOB_DEFAULTS ("RELU_FMA=1 ..."): run everything below with these #define defaults in the
  # kernel sources (a measurement knob tested as the default); the sources are restored on exit.
  # Only for knobs that leave the shared-memory layout and the role counts alone: those are
  # sized in Python (fp8_sm90.py / fp4_sm90.py), which never sees these edits.
  csrc=packages/attn-scores/src/flashinfer_attn_scores/paged_mqa_logits/csrc
  saved=$(mktemp -d)
  cp "$csrc"/*.cu "$csrc"/*.cuh "$saved"/
  trap 'cp "$saved"/* "$csrc"/; rm -rf "$saved"' EXIT
  for knob in $KNOB_DEFAULTS; do
    sed -i "s/^#define ${knob%%=*} .*/#define ${knob%%=*} ${knob#*=}/" "$csrc"/*.cu "$csrc"/*.cuh
    echo "KNOB_DEFAULTS: $(grep -h "^#define ${knob%%=*} " "$csrc"/*.cu "$csrc"/*.cuh | sort -u | tr '\n' ' ')"
  done
fi
gpu_state ""
cat "$OUT/gpu-state.csv"
date -u

if [ "${SKIP_TESTS:-0}" = shards ]; then
  # The whole GPU suite as four pytest processes at once on the one GPU (the suite is bound by
  # NVRTC compiles and the float64 references on the host's cores): about 240 s instead of
  # about 430 s on the H200 machine (2026-11-30). Each shard's log is $OUT/pytest-<i>.log.
  gpu_tests=packages/attn-scores/tests/paged_mqa_logits/test_gpu.py
  # run_shard I LIMIT ARGS...: the script's own pytest arguments ("$extra") come last.
  extra=("$@")
  run_shard() {
    local i=$1 limit=$2
    shift 2
    timeout -k 10 "$limit" python -m pytest -m gpu -q -p no:cacheprovider -rfE "$@" "${extra[@]}" \
      > "$OUT/pytest-$i.log" 2>&1
  }
  # Shards 0-3 took 270-320 s beside random_cases.py on an H100 (2026-12-05), shard 4 about 10 s:
  # the defaults (420 + 120 s) leave the rest of a 600 s device call for what follows.
  limit=${SHARD_TIMEOUT:-420}
  run_shard 0 "$limit" "$gpu_tests" -k fp4 &
  pids=($!)
  run_shard 1 "$limit" "$gpu_tests" -k "not fp4" &
  pids+=($!)
  # Two files time the host or the GPU and run alone after the others, as shard 4: the
  # benchmark's timing test measures a spin kernel's length, which the other shards' kernels
  # stretch (it failed once that way, 2026-11-30), and the PDL tests need the host back from
  # a call within a test kernel's idle (one case failed that way under four shards in two
  # sessions, 2026-12-02, and once alone at a 1 ms idle, 2026-12-05: the idle is 20 ms now).
  timing_test=tests-integration/test_bench_timing.py
  pdl_test=packages/attn-scores/tests/paged_mqa_logits/test_gpu_pdl.py
  run_shard 2 "$limit" packages/attn-scores --ignore="$gpu_tests" --ignore="$pdl_test" &
  pids+=($!)
  run_shard 3 "$limit" packages/schedule packages/jit packages/layouts tests-integration \
    --ignore="$timing_test" &
  pids+=($!)
  rcs=()
  for pid in "${pids[@]}"; do
    wait "$pid"
    rcs+=($?)
  done
  run_shard 4 "${SHARD4_TIMEOUT:-120}" "$timing_test" "$pdl_test"
  rcs+=($?)
  for i in 0 1 2 3 4; do
    echo "pytest shard $i (exit ${rcs[$i]}): $(tail -n 1 "$OUT/pytest-$i.log")"
    [ "${rcs[$i]}" = 5 ] && rcs[i]=0 # no test selected (an extra -k): not a failure
    step_done "pytest shard $i" "${rcs[$i]}"
    grep -E "^(FAILED|ERROR)" "$OUT/pytest-$i.log" | cut -c1-220 | head -30
  done
elif [ "${SKIP_TESTS:-0}" != 1 ]; then
  timeout "${PYTEST_TIMEOUT:-540}" python -m pytest -m gpu -q -p no:cacheprovider -rfE "$@" \
    > "$OUT/pytest-gpu.log" 2>&1
  step_done pytest $?
  echo "pytest: $(tail -n 1 "$OUT/pytest-gpu.log")"
  grep -E "^(FAILED|ERROR)" "$OUT/pytest-gpu.log" | cut -c1-220 | head -30
fi
if [ "${SKIP_CHECK:-0}" != 1 ]; then
  timeout "${CHECK_TIMEOUT:-300}" python tools/fp8_kernel_check.py --no-timing > "$OUT/fp8-check.log" 2>&1
  step_done "fp8 check" $?
  echo "fp8 check: $(grep -c '^ok' "$OUT/fp8-check.log") ok, $(grep -c '^FAIL' "$OUT/fp8-check.log") FAIL"
  grep "^FAIL" "$OUT/fp8-check.log" | cut -c1-200 | head
fi
if [ -n "${RANDOM_CASES:-}" ]; then
  # RANDOM_CASES ("3000 2000 3000 [first seed]"): that many fp8 and fp4 seeded random calls
  # and random schedule comparisons (tools/random_cases.py), seeds from 100000 unless given;
  # RANDOM_SHAPES=wide draws fp8's head shapes from everything the contract admits;
  # RANDOM_BATCHES=large draws 48-513 requests per call instead of 1-40; RANDOM_SCALES=wide
  # also draws fp4 scales far from 1 and draft slots apart in scale; RANDOM_LAYOUTS=wide also
  # draws where the tensors sit in memory; RANDOM_REPLAYS=K replays each call K times in a
  # CUDA graph with new lengths (and often new data); RANDOM_TIMEOUT (540 s) ends the tool
  # before the device call's limit, keeping what it printed.
  read -r fp8_seeds fp4_seeds schedule_seeds first_seed <<< "$RANDOM_CASES"
  timeout "${RANDOM_TIMEOUT:-540}" python tools/random_cases.py --fp8 "$fp8_seeds" --fp4 "${fp4_seeds:-0}" \
    --schedules "${schedule_seeds:-0}" --first-seed "${first_seed:-100000}" \
    --shapes "${RANDOM_SHAPES:-suite}" --batches "${RANDOM_BATCHES:-small}" \
    --scales "${RANDOM_SCALES:-suite}" --layouts "${RANDOM_LAYOUTS:-suite}" --replays "${RANDOM_REPLAYS:-0}" 2>&1 | stdbuf -oL tr '\r' '\n' \
    | grep --line-buffered -v "kernel/s\]\|s/kernel\]" > "$OUT/random-cases.log"
  step_done "random cases" "${PIPESTATUS[0]}"
  grep -E "^(FAIL|random cases|schedules|[0-9]+ kernel)" "$OUT/random-cases.log" | head -30
  grep -q "^random cases" "$OUT/random-cases.log" || grep "^checked" "$OUT/random-cases.log" | tail -n 1
fi
for which in ${EXPERIMENTS:-}; do
  # EXPERIMENTS ("large fp4 consumers small timestamps"): the variant tables of tools/fp8_kernel_check.py
  # (whole logs in $OUT; the tables are printed).
  timeout "${EXPERIMENTS_TIMEOUT:-240}" python tools/fp8_kernel_check.py --experiments "$which" \
    > "$OUT/experiments-$which.log" 2>&1
  rc=$?
  step_done "experiments $which" $rc
  echo "experiments $which: exit $rc"
  grep -v -E "^\s*$" "$OUT/experiments-$which.log" | tail -n 80
done
if [ "${WGMMA_RATE:-0}" = 1 ]; then
  # The FP8 WGMMA rate beside CUDA-core work on one SM (tools/wgmma_rate.py); the whole table.
  timeout 200 python tools/wgmma_rate.py > "$OUT/wgmma-rate.log" 2>&1
  rc=$?
  step_done wgmma_rate $rc
  echo "wgmma_rate: exit $rc"
  cat "$OUT/wgmma-rate.log"
fi
if [ "${FLOOR:-0}" = 1 ]; then
  # The floor under the small-batch row: an empty kernel, a one-element add_ and the op at B 1,
  # L 4k, one call per graph replay, the cold reading taken apart (tools/small_batch_floor.py).
  timeout 200 python tools/small_batch_floor.py > "$OUT/small-batch-floor.log" 2>&1
  rc=$?
  step_done small_batch_floor $rc
  echo "small_batch_floor: exit $rc"
  cat "$OUT/small-batch-floor.log"
fi
if [ -n "${READ_RATE:-}" ]; then
  # READ_RATE ("paths hop writes write-volume epochs"): the read rate of a paged gather by load
  # path and with output stores (tools/read_rate.py); one log per variant set.
  for set in $READ_RATE; do
    pages=""
    [ "$set" != paths ] && pages="--page-bytes 8448"
    # shellcheck disable=SC2086  # $pages is empty or two words on purpose
    timeout 200 python tools/read_rate.py --set "$set" $pages > "$OUT/read-rate-$set.log" 2>&1
    rc=$?
    step_done "read_rate $set" $rc
    echo "read_rate --set $set: exit $rc"
    cat "$OUT/read-rate-$set.log"
  done
fi
if [ "${JIT_BENCH:-1}" = 1 ]; then
  timeout 120 python packages/jit/benchmarks/launch_overhead.py --json "$OUT/jit-launch.json" > "$OUT/jit-launch.log" 2>&1
  step_done "jit launch benchmark" $?
  tail -n 15 "$OUT/jit-launch.log"
fi
# host_times RESULTS_JSON DIGITS: the host-time rows of a `tools/bench --host-time-only` run on
# one line, op/schedule=us.
host_times() {
  python -c "
import json, sys
rows = json.load(open(sys.argv[1]))['host_time']['results']
print(' '.join(f\"{r['op']}/{r['schedule'].split()[0]}={r['host_us']:.{sys.argv[2]}f}\" for r in rows))
" "$1" "$2" 2>&1
}
if [ "${PDL_AB:-0}" = 1 ]; then
  # Programmatic dependent launch off and on in one session: the host time of an eager call
  # (cuLaunchKernelEx against cuLaunchKernel) and the per-call time in graphs of small calls.
  for round in 1 2; do
    for pdl in 0 1; do
      FLASHINFER_PDL=$pdl timeout 90 python tools/bench --ops fp8,fp4 --host-time-only \
        --out "$OUT/pdl$pdl-$round" > "$OUT/pdl$pdl-$round.log" 2>&1
      step_done "PDL=$pdl round $round host time" $?
      echo "FLASHINFER_PDL=$pdl round $round: host time (us/call, median) $(host_times "$OUT/pdl$pdl-$round/results.json" 1)"
      FLASHINFER_PDL=$pdl timeout 90 python tools/fp8_kernel_check.py --experiments small \
        > "$OUT/pdl$pdl-$round-small.log" 2>&1
      step_done "PDL=$pdl round $round small" $?
      grep -E "^in the kernel" "$OUT/pdl$pdl-$round-small.log"
    done
  done
fi
if [ -n "${HOST_AB:-}" ]; then
  # HOST_AB (a checkout of this repository, e.g. from `git archive <rev> packages`): the host
  # time of one eager call with that tree's packages and with this one's, alternated three times.
  for round in 1 2 3; do
    for tree in "$HOST_AB" .; do
      name=$(basename "$(realpath "$tree")")-$round
      src=$tree/packages
      PYTHONPATH=$src/layouts/src:$src/jit/src:$src/schedule/src:$src/attn-scores/src \
        timeout 120 python tools/bench --ops fp8,fp4 --host-time-only --out "$OUT/host-$name" \
        > "$OUT/host-$name.log" 2>&1
      step_done "host time $name" $?
      echo "host time, tree $tree, round $round (us/call, median): $(host_times "$OUT/host-$name/results.json" 2)"
    done
  done
fi
if [ "${PROFILE:-0}" = 1 ]; then
  # PROFILE_SPECS: ";"-separated "kernel next_n,block_size,batch,avg_len [epi_dtype]" launches
  # to profile; each gets its section report (<name>.txt) and per-SASS-instruction executions
  # and stall samples (<name>.sass.csv) in $OUT.
  IFS=';' read -ra specs <<< "${PROFILE_SPECS:-fp4 1,64,128,32768;fp8 2,64,128,32768}"
  for spec in "${specs[@]}"; do
    read -r kernel shape epi <<< "$spec"
    epi=${epi:-float32}
    name=ncu_${kernel}_${shape//,/_}_${epi}
    timeout 200 ncu --clock-control none -k "regex:${kernel}_paged_mqa_logits_sm90" -s 2 -c 1 \
      --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section SourceCounters \
      --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis -o "$OUT/$name" -f \
      python tools/fp8_kernel_check.py --profile --profile-kernel "$kernel" --profile-shape "$shape" \
      --profile-epi "$epi" > "$OUT/$name.log" 2>&1
    step_done "ncu $spec" $?
    ncu -i "$OUT/$name.ncu-rep" > "$OUT/$name.txt" 2>&1
    ncu -i "$OUT/$name.ncu-rep" --page source --csv --print-source sass > "$OUT/$name.sass.csv" 2>&1
    rm -f "$OUT/$name.ncu-rep"
    echo "== ncu $spec"
    grep -E "Duration|SM Frequency|DRAM Throughput|Issue Slots Busy|Eligible Warps|No Eligible" "$OUT/$name.txt" | head -12
  done
fi
if [ "${SANITIZE:-0}" = 1 ]; then
  # --report-api-errors no: host API calls that fail by design are not kernel errors
  # (cuda-bindings probes optional driver entry points with cuGetProcAddress, and
  # flashinfer_jit reads kernel parameter info until cuKernelGetParamInfo says "invalid value").
  # --kernel-name kns=$SANITIZE_KERNELS: only our kernels are instrumented (PyTorch's run at
  # full speed; large batches under memcheck went from past 240 s to 21 s for 14 calls);
  # tools/sanitizer_controls.py (SANITIZE_CONTROLS=1) shows the filter still sees planted bugs.
  # The calls: tools/sanitize_cases.py (a handful of small fp8 and fp4 calls), or with
  # SANITIZE_RANDOM ("fp8 fp4 first-seed") that many tools/random_cases.py calls drawn with the
  # RANDOM_* knobs of RANDOM_CASES above (no replays: memcheck runs without the caching
  # allocator). Each call is checked against the float64 reference; exit 1 on a mismatch, 9 on
  # a sanitizer error.
  SANITIZER=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null || true)
  if [ -n "${SANITIZE_RANDOM:-}" ]; then
    read -r san_fp8 san_fp4 san_seed <<< "$SANITIZE_RANDOM"
    calls=(tools/random_cases.py --fp8 "$san_fp8" --fp4 "${san_fp4:-0}" --first-seed "${san_seed:-100000}"
      --shapes "${RANDOM_SHAPES:-suite}" --batches "${RANDOM_BATCHES:-small}"
      --scales "${RANDOM_SCALES:-suite}" --layouts "${RANDOM_LAYOUTS:-suite}" --chunk 1)
  else
    # shellcheck disable=SC2206  # SANITIZE_CASE_ARGS is a word list on purpose (e.g. "--only structures")
    calls=(tools/sanitize_cases.py ${SANITIZE_CASE_ARGS:-})
  fi
  # The plain run also compiles every configuration, so the tools' runs time only the calls.
  timeout "${SANITIZE_PLAIN_TIMEOUT:-100}" python "${calls[@]}" > "$OUT/sanitize-plain.log" 2>&1
  rc=$?
  step_done "sanitize calls without a sanitizer" $rc
  echo "sanitize calls without a sanitizer: exit $rc ($(tail -n 1 "$OUT/sanitize-plain.log"))"
  if [ -z "$SANITIZER" ]; then
    echo "compute-sanitizer not found on PATH or in /usr/local/cuda/bin: sanitizer runs skipped"
  else
    kernels=${SANITIZE_KERNELS-paged_mqa_logits}
    filter=()
    [ -n "$kernels" ] && filter=(--kernel-name "kns=$kernels")
    runs="${SANITIZE_TOOLS:-memcheck racecheck synccheck}"
    [ "${SANITIZE_NOCACHE:-1}" = 1 ] && case " $runs " in *" memcheck "*) runs="$runs memcheck-nocache" ;; esac
    for run in $runs; do
      tool=${run%-nocache}
      nocache=()
      # Every tensor its own cudaMalloc, so memcheck sees exact bounds (sanitize_cases.py skips
      # its graph case then; SANITIZE_RANDOM draws no replays).
      [ "$run" = memcheck-nocache ] && nocache=(env PYTORCH_NO_CUDA_MEMORY_CACHING=1)
      "${nocache[@]}" timeout "${SANITIZE_TIMEOUT:-110}" "$SANITIZER" --tool "$tool" "${filter[@]}" \
        --report-api-errors no --error-exitcode 9 python "${calls[@]}" > "$OUT/sanitize-$run.log" 2>&1
      rc=$?
      step_done "sanitize $run" $rc
      # memcheck/synccheck print "ERROR SUMMARY", racecheck "RACECHECK SUMMARY"
      summary=$(grep -m1 -E "(ERROR|RACECHECK) SUMMARY" "$OUT/sanitize-$run.log" || echo "no summary line (see sanitize-$run.log)")
      echo "$run: exit $rc; ${summary#========= }; $(grep -E "cases match the reference|^random cases" "$OUT/sanitize-$run.log" | tail -n 1)"
    done
    if [ "${SANITIZE_CONTROLS:-0}" = 1 ]; then
      timeout "${SANITIZE_CONTROLS_TIMEOUT:-400}" python tools/sanitizer_controls.py \
        --kernels "$kernels" --logs "$OUT/sanitizer-controls" > "$OUT/sanitizer-controls.log" 2>&1
      rc=$?
      step_done "sanitizer controls" $rc
      echo "sanitizer controls: exit $rc"
      tail -n 8 "$OUT/sanitizer-controls.log"
    fi
  fi
fi
if [ "${BENCH:-1}" = 1 ]; then
  # shellcheck disable=SC2086  # BENCH_ARGS is a word list on purpose
  timeout "${BENCH_TIMEOUT:-300}" python tools/bench --ops "${BENCH_OPS:-fp8}" ${BENCH_ARGS:-} --out "$OUT/bench" > "$OUT/bench.log" 2>&1
  rc=$?
  step_done bench $rc
  echo "bench exit $rc"
  tail -n 60 "$OUT/bench.log"
fi
gpu_state ",noheader"
# The device tool returns at most 8 files: past that, everything goes into one archive, and
# the results.json files stay beside it while they fit.
rm -f "$OUT/logs.tar.gz" # an earlier run's, where OUT is reused
mapfile -t files < <(cd "$OUT" && find . -type f | sort)
if [ "${#files[@]}" -gt 8 ] && (cd "$OUT" && tar czf logs.tar.gz "${files[@]}"); then
  mapfile -t kept < <(printf '%s\n' "${files[@]}" | grep '/results\.json$' || true)
  [ "${#kept[@]}" -gt 7 ] && kept=()
  for f in "${files[@]}"; do
    case " ${kept[*]} " in *" $f "*) ;; *) rm -f "$OUT/$f" ;; esac
  done
  find "$OUT" -mindepth 1 -type d -empty -delete
  echo "$OUT: ${#files[@]} files packed into logs.tar.gz (kept beside it: ${kept[*]:-none})"
fi
echo "gpu_session: exit $status"
exit "$status"
