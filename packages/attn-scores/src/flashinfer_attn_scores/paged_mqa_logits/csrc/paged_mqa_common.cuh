// Pieces shared by the FP8 and MXFP4 paged MQA logits kernels (SM90a): the work-unit walk
// over the schedule, the block-table window, the producer / consumer pipeline loops with their
// mbarriers, the epilogue number types and the per-draft-slot head sums of the accumulator.
// The kernels supply what differs: how q is staged, which copies fill a stage, and what a
// consumer does with a full stage.
//
// Specialisation constants used here: BLOCK_SIZE, NUM_HEADS, NEXT_N, NUM_STAGES,
// NUM_CONSUMERS, NUM_PRODUCERS (default 1), MMA_HALVES (default 1), OUT_DTYPE, EPI_DTYPE
// (dtype codes: 0 = float32, 1 = float16, 2 = bfloat16), ACC_FP16 (FP8 kernel only; unset
// reads as 0), SCHEDULE_ENTRY_UNITS (flashinfer_schedule's SCHEDULE_REQUEST_ENTRY_UNITS).
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "sm90_primitives.cuh"

namespace fi_paged_mqa {

using namespace fi_sm90;

#ifndef NUM_PRODUCERS
#define NUM_PRODUCERS 1
#endif
static_assert(NUM_PRODUCERS >= 1 && NUM_PRODUCERS <= 4, "1 to 4 producer warps");
static_assert(NUM_CONSUMERS >= 1 && NUM_CONSUMERS <= 6, "1 to 6 consumer warpgroups");
// Unit k lives in stage k % NUM_STAGES; consumer k % NUM_CONSUMERS waits on its full barrier
// and producer warp k % NUM_PRODUCERS on its empty barrier, each for the parity of round
// k / NUM_STAGES. A parity test cannot tell "round r done" from "round r - 2 done, r - 1 not";
// it is safe only because the waiting warp already waited for round r - 1 of that stage
// itself, which holds when its role count divides the stage count.
static_assert(NUM_STAGES % NUM_CONSUMERS == 0 && NUM_STAGES % NUM_PRODUCERS == 0,
              "NUM_STAGES must be a multiple of NUM_CONSUMERS and of NUM_PRODUCERS");

// The register split between the producer warpgroup and the consumers. setmaxnreg only moves
// registers inside a CTA: a consumer's .inc takes what the producer warpgroup's .dec gave back
// from the launch allocation (ptxas gives each thread 65536 / threads, in steps of 8, under
// __launch_bounds__(threads, 1)), never the rest of the register file; asking for more makes
// .inc wait (PTX ISA, setmaxnreg). For 2 and 4 consumer warpgroups this gives the 216-224 and
// 104 registers the kernels were tuned with; 3 gives 144 (fp4) / 152 (fp8), 5 and 6 no .inc.
constexpr int kThreads = 128 * (NUM_CONSUMERS + 1);
constexpr int kLaunchRegsUncapped = 65536 / kThreads / 8 * 8;
constexpr int kLaunchRegs = kLaunchRegsUncapped < 248 ? kLaunchRegsUncapped : 248;  // 255 at most per thread
// The role switch of each kernel: producers `dec` to kProducerRegs, consumers `inc` to their
// share when it exceeds the launch allocation.
template <int kProducerRegs>
struct RegisterSplit {
  static constexpr int kWidest = kLaunchRegs + (kLaunchRegs - kProducerRegs) / NUM_CONSUMERS / 8 * 8;
  static constexpr int kConsumerRegs = kWidest < 240 ? kWidest : 240;
  static_assert(kConsumerRegs <= kLaunchRegs ||
                    NUM_CONSUMERS * (kConsumerRegs - kLaunchRegs) <= kLaunchRegs - kProducerRegs,
                "the consumers' setmaxnreg.inc must fit in what the producers' dec gives back");
  __device__ static __forceinline__ void enter_producer() { regs_decrease<kProducerRegs>(); }
  __device__ static __forceinline__ void enter_consumer() {
    if constexpr (kConsumerRegs > kLaunchRegs) regs_increase<kConsumerRegs>();
  }
};

constexpr int kTile = 64;  // KV tokens per work unit = WGMMA M (flashinfer_schedule's unit)
constexpr int kN = NEXT_N * NUM_HEADS;
// Measurement knobs shared by both kernels (never set in production; each kernel's header
// says what it drops).
#ifndef EXP_SKIP_MATH
#define EXP_SKIP_MATH 0
#endif
#ifndef EXP_SKIP_MMA
#define EXP_SKIP_MMA 0
#endif
#ifndef EXP_SKIP_EPILOGUE
#define EXP_SKIP_EPILOGUE 0
#endif
// EXP_STORES (FP8 kernel, measurement): 1 computes everything but stores no logit (the store
// sits behind a run-time condition that never holds); 2 stores every logit into the first 512
// columns of its row, so the stores stay in L2 and never reach DRAM during the call.
#ifndef EXP_STORES
#define EXP_STORES 0
#endif
// MMA_HALVES = 2: a unit's N columns are two MMA commit groups of N / 2, so the epilogue of
// the first half runs while the tensor cores compute the second (no more accumulator
// registers than one group of N). 1: one group.
#ifndef MMA_HALVES
#define MMA_HALVES 1
#endif
// RELU_FMA = 1 (the default; float32 epilogue over a float32 accumulator): each head term
// w * relu(x) is formed as w * (x + |x|), i.e. twice the term, and the row sum is halved
// before it leaves the thread (exact: scaling by 2 commutes with the float32 roundings, away
// from overflow and subnormals), so the output is bitwise the FMNMX form's. FADD with an |x|
// operand issues on the FMA pipe; FMNMX issues on the ALU pipe, which has half the FMA pipe's
// rate on Hopper and also carries the fp4 decode. H200, B 128, L 64k, block 64, 2026-11-29:
// fp4 next_n 1 290 -> 280 us (block 128: 294 -> 274), fp8 next_n 1 275 -> 271 us, next_n 2-4
// within 1 %. Unlike fmaxf, x + |x| keeps a NaN (as the reference's relu does) but turns -inf
// into NaN, hence not over a float16 accumulator, which can overflow. RELU_FMA = 0: FMNMX.
// RELU_FMA = 2 (measured no better): the first column of each pair takes the FADD form into a
// second per-row sum, the second keeps FMNMX; the halved second sum joins the first before the
// quad reduction (not bitwise equal to the others: another summation order).
#ifndef RELU_FMA
#define RELU_FMA 1
#endif
// RELU_FORM 3 (fp8, float32 epilogue over a float16 accumulator): the ReLU is one HMNMX2 on
// the packed half2 register, before the two halves are widened to float32 (acc_pair); the
// widening is exact, so this is bitwise the ReLU of the widened values, at half the
// instructions (one per pair instead of an FMNMX per value).
#if EPI_DTYPE == 0 && !(defined(ACC_FP16) && ACC_FP16)
#define RELU_FORM RELU_FMA
#elif EPI_DTYPE == 0
#define RELU_FORM 3
#else
#define RELU_FORM 0
#endif
constexpr int kHalves = MMA_HALVES;
constexpr int kNHalf = kN / kHalves;
static_assert(kHalves == 1 || (kHalves == 2 && kNHalf % 8 == 0), "MMA_HALVES: 1, or 2 with N / 2 a multiple of 8");
// A unit's tokens come in boxes of min(64, BLOCK_SIZE) rows, one per KV block it touches.
constexpr int kBoxRows = BLOCK_SIZE < kTile ? BLOCK_SIZE : kTile;
constexpr int kBoxesPerTile = kTile / kBoxRows;
static_assert(kTile % kBoxRows == 0 && BLOCK_SIZE % kBoxRows == 0, "block size must be 32, 64 or 128");

// Opaque 128-byte CUtensorMap, passed by value as a __grid_constant__ parameter.
struct alignas(64) TensorMap {
  uint64_t opaque[16];
};

// Work units of a request of `len` tokens; none for len <= 0. (len - 1) / kTile + 1 rather
// than (len + kTile - 1) / kTile, which overflows for lengths within kTile of 2^31.
__device__ __forceinline__ int units_of(int len) { return len > 0 ? (len - 1) / kTile + 1 : 0; }

// The schedule's virtual units of a request: its units plus the entry charge, 0 when empty.
constexpr int kEntryUnits = SCHEDULE_ENTRY_UNITS;
static_assert(kEntryUnits >= 0 && kEntryUnits < 1024, "SCHEDULE_ENTRY_UNITS: a small charge");
__device__ __forceinline__ int schedule_cost(int len) { return len > 0 ? units_of(len) + kEntryUnits : 0; }
// The unit holding virtual position `offset` of its request (the entry positions: unit 0).
__device__ __forceinline__ int unit_at(long long offset) {
  return offset > kEntryUnits ? static_cast<int>(offset - kEntryUnits) : 0;
}

// The dynamic shared memory base rounded up to 1024 bytes (the 128-byte swizzle atom).
// Offsetting the __shared__ array itself, rather than a uintptr_t, keeps the address space
// visible to the compiler: shared accesses become LDS/STS instead of generic loads.
__device__ __forceinline__ uint8_t* aligned_smem(uint8_t* raw) {
  return raw + ((1024 - (smem_addr(raw) & 1023)) & 1023);
}

// ---------------------------------------------------------------- the schedule in the kernel
// Without a precomputed schedule every CTA derives its own two rows (blockIdx.x and
// blockIdx.x + 1 of the [gridDim.x + 1, 2] schedule) from seq_lens, with exactly the policy
// of flashinfer_schedule at one pass per token (its module docstring has the picture):
//   cost[b] = ceil(len_b / kTile) + kEntryUnits (0 for len_b <= 0), total = sum_b cost[b],
//   S = gridDim.x, g(i) = (total / S) * i + min(i, total % S),
//   row i = (b, max(0, g(i) - prefix[b] - kEntryUnits)) for the b with
//           prefix[b] <= g(i) < prefix[b] + cost[b], (batch_size, 0) when g(i) == total.
// This replaces a separate schedule launch (and its round trip through global memory) on the
// critical path of small batches. Thread t scans the contiguous requests
// [t * P, (t + 1) * P), P = ceil(batch_size / blockDim.x): one batch of loads, one block-wide
// scan of the per-thread sums, then a re-walk of its own requests (L1 hits).
__device__ __forceinline__ long long request_cost(const int* seq_lens, long long stride, int b) {
  return schedule_cost(seq_lens[b * stride]);
}
// rows[4]: the length of request rows[0] (0 for the sentinel), so that the walkers start without
// reading it again (an L1 or L2 round trip before the first block-table read of every call).
constexpr int kScheduleRowInts = 5;

// Exclusive block-wide scan (blockDim.x a multiple of 32, at most 1024); also returns the total.
// `warp_sums`: 32 entries of shared scratch.
__device__ __forceinline__ long long block_exclusive_scan(long long value, long long& total, long long* warp_sums) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  long long inclusive = value;
#pragma unroll
  for (int offset = 1; offset < 32; offset *= 2) {
    const long long other = __shfl_up_sync(0xffffffffu, inclusive, offset);
    if (lane >= offset) inclusive += other;
  }
  if (lane == 31) warp_sums[warp] = inclusive;
  __syncthreads();
  if (warp == 0) {
    long long w = lane < warps ? warp_sums[lane] : 0;
#pragma unroll
    for (int offset = 1; offset < 32; offset *= 2) {
      const long long other = __shfl_up_sync(0xffffffffu, w, offset);
      if (lane >= offset) w += other;
    }
    warp_sums[lane] = w;  // inclusive over warps
  }
  __syncthreads();
  total = warp_sums[warps - 1];
  const long long result = inclusive - value + (warp > 0 ? warp_sums[warp - 1] : 0);
  __syncthreads();  // warp_sums may be reused by the caller's next scan
  return result;
}

// Writes {b, u} of row blockIdx.x and of row blockIdx.x + 1 to rows[0..3] and the length of
// request rows[0] to rows[4] (shared memory).
// Every thread of the CTA must call it (block-wide barriers inside).
__device__ void compute_schedule_rows(const int* seq_lens, long long stride, int batch_size, int* rows,
                                      long long* scratch) {
  const int per_thread = (batch_size + blockDim.x - 1) / blockDim.x;
  const int first = min(static_cast<int>(threadIdx.x) * per_thread, batch_size);
  const int last = min(first + per_thread, batch_size);
  long long mine = 0;
#pragma unroll 8
  for (int b = first; b < last; ++b) mine += request_cost(seq_lens, stride, b);
  long long total;
  long long prefix = block_exclusive_scan(mine, total, scratch);

  const long long per_cta = total / gridDim.x, extra = total % gridDim.x;
  const long long g0 = per_cta * blockIdx.x + min(static_cast<long long>(blockIdx.x), extra);
  const long long g1 = per_cta * (blockIdx.x + 1) + min(static_cast<long long>(blockIdx.x + 1), extra);
  if (threadIdx.x == 0) {  // g == total: the sentinel (batch_size, 0); overwritten otherwise
    rows[0] = rows[2] = batch_size;
    rows[1] = rows[3] = rows[4] = 0;
  }
  __syncthreads();
  if (mine > 0 && prefix <= g1 && g0 < prefix + mine) {  // a row may fall in these requests
    for (int b = first; b < last; ++b) {
      const int len = seq_lens[b * stride];
      const long long cost = schedule_cost(len);
      if (g0 >= prefix && g0 < prefix + cost) {
        rows[0] = b;
        rows[1] = unit_at(g0 - prefix);
        rows[4] = len;
      }
      if (g1 >= prefix && g1 < prefix + cost) {
        rows[2] = b;
        rows[3] = unit_at(g1 - prefix);
      }
      prefix += cost;
    }
  }
  __syncthreads();
}

// The same rows for batch_size <= 32 * kPerLane, by one warp with no block barrier: lane l
// loads the lengths of requests [l * P, (l + 1) * P), P = ceil(batch_size / 32) <= kPerLane,
// a warp scan of the lanes' costs gives the prefixes, and the lane whose requests hold
// g(i) reports it. 32-bit arithmetic is exact for lengths within max_seq_len: the output-span
// rule (batch_size * next_n * padded_seq_len(max_seq_len) < 2^31, always validated) keeps the
// units below 2^25, and at most 128 entry charges come on top. (Lengths past max_seq_len are
// outside the contract: the walkers clamp them, but this scan sums them as given, and
// lengths near 2^31 in 64 or more requests wrap the sum, leaving some requests unwritten.
// The CTAs never wait on each other and every walk is bounded, so a wrong range cannot hang
// the kernel nor move an access outside the problem.)
// Measured on the H200 (2026-11-29, a stream of calls that exit once their rows are known):
// B = 1 and 8 take 1.3 us with kPerLane = 1 (1.6 us with kPerLane = 4, hence two instances);
// B = 33-128 take 1.6-1.7 us with kPerLane = 4 against 2.0-2.1 us block-wide (its barriers
// and 64-bit division), 0.3-0.4 us less per call.
constexpr int kWarpScheduleMaxBatch = 128;

template <int kPerLane>
__device__ __forceinline__ void compute_schedule_rows_warp(const int* seq_lens, long long stride, int batch_size,
                                                           int* rows, int* rows_out) {
  const int lane = threadIdx.x % 32;
  const int per_lane = kPerLane == 1 ? 1 : (batch_size + 31) / 32;
  const int first = lane * per_lane;
  int lens[kPerLane], costs[kPerLane];
  int mine = 0;
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) {
    const int b = first + j;
    lens[j] = j < per_lane && b < batch_size ? seq_lens[b * stride] : 0;
    costs[j] = schedule_cost(lens[j]);
    mine += costs[j];
  }
  int inclusive = mine;
#pragma unroll
  for (int offset = 1; offset < 32; offset *= 2) {
    const int other = __shfl_up_sync(0xffffffffu, inclusive, offset);
    if (lane >= offset) inclusive += other;
  }
  const int prefix = inclusive - mine;
  const unsigned total = static_cast<unsigned>(__shfl_sync(0xffffffffu, inclusive, 31));
  const unsigned ctas = gridDim.x, per_cta = total / ctas, extra = total % ctas;
  int row[4], first_len = 0;
#pragma unroll
  for (int end = 0; end < 2; ++end) {
    const unsigned i = blockIdx.x + end;
    const int g = static_cast<int>(per_cta * i + min(i, extra));
    // At most one lane holds g (cost > 0 and prefix <= g < inclusive); none when g == total.
    const bool mine_holds = mine > 0 && prefix <= g && g < inclusive;
    int b = 0, u = 0, len = 0;
    if (mine_holds) {
      int before = prefix;
#pragma unroll
      for (int j = 0; j < kPerLane; ++j) {
        if (g >= before && g < before + costs[j]) {
          b = first + j;
          u = unit_at(g - before);
          len = lens[j];
        }
        before += costs[j];
      }
    }
    const unsigned holders = __ballot_sync(0xffffffffu, mine_holds);
    const int holder = holders ? __ffs(holders) - 1 : 0;
    b = __shfl_sync(0xffffffffu, b, holder);
    u = __shfl_sync(0xffffffffu, u, holder);
    row[2 * end] = holders ? b : batch_size;
    row[2 * end + 1] = holders ? u : 0;
    if (end == 0) first_len = holders ? __shfl_sync(0xffffffffu, len, holder) : 0;
  }
  if (lane < 4) rows[lane] = lane == 0 ? row[0] : lane == 1 ? row[1] : lane == 2 ? row[2] : row[3];
  if (lane == 4) rows[4] = first_len;
  if (rows_out != nullptr && lane < 2) {
    rows_out[2 * blockIdx.x + lane] = lane == 0 ? row[0] : row[1];
    if (blockIdx.x == gridDim.x - 1) rows_out[2 * gridDim.x + lane] = lane == 0 ? row[2] : row[3];
  }
}

// Where the walk of this CTA gets its range: the precomputed schedule when there is one, else
// the in-kernel rows `own_rows` (kScheduleRowInts ints of shared memory; `scratch` is 256
// bytes of shared memory free until the pipeline starts). `rows_out`, when not null, receives the in-kernel
// rows (a [gridDim.x + 1, 2] table, for tests against flashinfer_schedule). The caller's
// __syncthreads() publishes `own_rows`. Small batches are scheduled by warp 1 alone, while
// thread 0 (warp 0) initialises the barriers.
__device__ __forceinline__ const int* schedule_rows(const int* schedule, const int* seq_lens, long long stride,
                                                    int batch_size, int* rows_out, int* own_rows,
                                                    uint8_t* scratch) {
  if (schedule != nullptr) return schedule + 2 * blockIdx.x;
  if (batch_size <= kWarpScheduleMaxBatch) {
    if (threadIdx.x / 32 == 1) {
      if (batch_size <= 32) {
        compute_schedule_rows_warp<1>(seq_lens, stride, batch_size, own_rows, rows_out);
      } else {
        compute_schedule_rows_warp<kWarpScheduleMaxBatch / 32>(seq_lens, stride, batch_size, own_rows, rows_out);
      }
    }
    return own_rows;
  }
  compute_schedule_rows(seq_lens, stride, batch_size, own_rows, reinterpret_cast<long long*>(scratch));
  // The scratch is a KV stage, which TMA (the async proxy) writes next: order this thread's
  // generic accesses to it before those writes (the caller's __syncthreads() orders the threads).
  fence_proxy_async_smem();
  if (rows_out != nullptr && threadIdx.x < 2) {
    rows_out[2 * blockIdx.x + threadIdx.x] = own_rows[threadIdx.x];
    if (blockIdx.x == gridDim.x - 1) rows_out[2 * gridDim.x + threadIdx.x] = own_rows[2 + threadIdx.x];
  }
  return own_rows;
}

// Walks this CTA's work units (request, unit) in order, skipping zero-length requests.
// The range is [rows[0..1], rows[2..3]): schedule rows blockIdx.x and blockIdx.x + 1.
// `rows_have_len`: rows[4] holds the length of request rows[0] (the in-kernel rows).
//
// Each length is clamped to `max_seq_len`. A length above it is outside the contract, but its
// units would be stored past the padded columns of its output rows, into the next rows or past
// the buffer; clamped, such a request is scored over its first max_seq_len positions and
// nothing outside out's padded columns is written. The schedule's rows still follow the
// unclamped lengths, so a CTA may find its first unit past its request's clamped end: it then
// moves on to the next request.
struct UnitWalker {
  const int* seq_lens;
  long long seq_lens_stride;
  int batch_size, max_len, end_b, end_u;
  int b, u, len, units;

  __device__ void start(const int* rows, const int* lens, long long stride, int batch, int max_seq_len,
                        bool rows_have_len) {
    seq_lens = lens;
    seq_lens_stride = stride;
    batch_size = batch;
    max_len = max_seq_len;
    // A caller's schedule_meta is not checked outside validate mode (and never inside graph
    // capture, where an uninitialised buffer is the likely mistake): negative starts would
    // index seq_lens, the block table and out before their first element. Clamped, any row
    // values keep every access inside the problem; the walk is bounded by seq_lens.
    b = max(rows[0], 0);
    u = max(rows[1], 0);
    end_b = min(rows[2], batch_size);
    end_u = rows[3];
    if (rows_have_len) {
      len = has_request() ? min(rows[4], max_len) : 0;
      units = units_of(len);
    } else {
      load_request();
    }
    while (u >= units && b < end_b) {
      ++b;
      u = 0;
      load_request();
    }
  }
  // Whether request b is inside the range (else its length is taken as 0 and not read).
  __device__ bool has_request() const { return b < batch_size && (b < end_b || end_u > 0); }
  __device__ void load_request() {
    len = has_request() ? min(seq_lens[b * seq_lens_stride], max_len) : 0;
    units = units_of(len);
  }
  // Bitwise rather than short-circuit operators: predicate logic instead of branches in every
  // role's loop condition.
  __device__ bool valid() const { return ((b < end_b) | ((b == end_b) & (u < end_u))) & (u < units); }
  __device__ void next() {
    if (++u < units) return;
    u = 0;
    do {
      ++b;
      load_request();
    } while (units == 0 && b < end_b);
  }
  // Move `steps` units forward, `k` counting units; `on_request()` runs each time the walk
  // enters a new request, so every role sees every request (the q-slot protocol relies on
  // it) while units inside a request are skipped in one step instead of one by one.
  template <typename OnRequest>
  __device__ void advance(unsigned& k, int steps, OnRequest&& on_request) {
    if (steps < units - u) {  // the common case: the step stays inside the request
      u += steps;
      k += steps;
      return;
    }
    while (steps > 0 && valid()) {
      const int within = min(steps, units - 1 - u);
      if (within > 0) {
        u += within;
        k += within;
        steps -= within;
        continue;
      }
      next();
      ++k;
      --steps;
      if (valid()) on_request();
    }
  }
  // The end (exclusive) of this CTA's units in the current request: while u stays below it,
  // valid() holds.
  __device__ int request_end() const { return b < end_b ? units : min(end_u, units); }
  // Calls body(k) for the current unit and every `steps`-th one after it. Inside a request
  // the step is one compare against request_end() instead of advance() and valid(); with the
  // request fixed for the inner loop, ptxas also keeps what depends only on the q slot (the
  // WGMMA B descriptors) across its units. When it was introduced (twenty-first round,
  // 2026-11-30, docs/fp8-kernel-notes.md) the fp4 consumer's unit path (block 64, next_n 1)
  // went from about 270 to about 250 SASS instructions. Entering a request goes through
  // advance(), so on_request() still runs for every request.
  template <typename OnRequest, typename Body>
  __device__ __forceinline__ void for_each(unsigned& k, int steps, OnRequest&& on_request, Body&& body) {
    while (valid()) {
      const int end = request_end();
      for (;;) {
        body(k);
        if (u + steps >= end) break;
        u += steps;
        k += steps;
      }
      advance(k, steps, on_request);
    }
  }
};

// A producer warp's window of 32 block-table entries (one per lane) of the current request,
// with the next 32 loaded one batch ahead so a sequential walk never waits on a table read.
//
// PRIME_TABLE_WINDOW = 1: the window's loads are issued when a warp enters a request, before
// the staging warps stage its q, so the table read overlaps the staging instead of following
// it; the window then slides 32 entries at a time from the walk's first block. 0: loaded at the
// first lookup. fp8 primes (each request switch inside a CTA's run cost about 1 us less with
// the asynchronous q staging, H200, 2026-11-30); fp4 does not: measured then (H200,
// 2026-11-30), ptxas gave its consumers' unit paths 2-6 more instructions for the same change
// and the kernel ran 1-3 % slower. (With NVRTC 13.5 priming changes fp4's unit path at block 64,
// bfloat16 output, float32 epilogue by +2 instructions at next_n 1, 0 at next_n 2 and 4 and -9
// at next_n 3; not re-timed.)
#ifndef PRIME_TABLE_WINDOW
#define PRIME_TABLE_WINDOW 1
#endif
struct BlockTableWindow {
  const int* row = nullptr;
  int blocks = 0, base = 0, entry = 0, next = 0;

  __device__ int load(int block) const { return block < blocks ? row[block] : 0; }
#if PRIME_TABLE_WINDOW
  // Enter a request and issue the loads of the window that starts at logical block
  // `first_block` (the walk's current unit) without waiting for them: a producer warp's next
  // units lie within 32 blocks of it.
  __device__ void reset(const int* table_row, int blocks_in_request, int first_block) {
    const int lane = threadIdx.x % 32;
    row = table_row;
    blocks = blocks_in_request;
    base = first_block;
    entry = load(base + lane);
    next = load(base + 32 + lane);
  }
  // Physical block id of logical `block` (warp-uniform argument, all lanes call).
  __device__ int lookup(int block) {
    const int lane = threadIdx.x % 32;
    if (block >= base + 32 && block < base + 64) {  // into the window loaded one batch ahead
      base += 32;
      entry = next;
      next = load(base + 32 + lane);
    } else if (block < base || block >= base + 32) {
      base = block;
      entry = load(block + lane);
      next = load(base + 32 + lane);
    }
    return __shfl_sync(0xffffffffu, entry, block - base);
  }
#else
  bool valid = false;

  __device__ void reset(const int* table_row, int blocks_in_request, int /*first_block*/) {
    row = table_row;
    blocks = blocks_in_request;
    valid = false;
  }
  // Physical block id of logical `block` (warp-uniform argument, all lanes call).
  __device__ int lookup(int block) {
    const int lane = threadIdx.x % 32;
    if (!valid || block < base || block >= base + 32) {
      entry = valid && block == base + 32 ? next : load(block + lane);
      base = block;
      valid = true;
      next = load(base + 32 + lane);
    }
    return __shfl_sync(0xffffffffu, entry, block - base);
  }
#endif
};

// ---------------------------------------------------------------- the pipeline
// Producer warps that stage q: every producer warp but warp 0, which issues unit 0, so that
// the first KV copies start while q is being staged (with one unit per CTA, as for small
// batches, the two latencies would otherwise add up on the critical path), and several warps
// share the q loads (one round trip per request instead of one per 512 bytes).
constexpr int kFirstStagingWarp = NUM_PRODUCERS > 1 ? 1 : 0;
constexpr int kStagingWarps = NUM_PRODUCERS - kFirstStagingWarp;

// Barrier among the q-staging warps only (named barrier 1; 0 is __syncthreads).
// Not `bar.sync` (= `barrier.sync.aligned`): .aligned requires every participating thread to
// execute the same barrier instruction, but the staging code is inlined at each place the walk
// enters a request, and the warps enter the same request at different places (one warp's first
// step may cross into it, another's later loop step). The hardware counts arrivals per barrier
// id and completed either way; compute-sanitizer's synccheck reported the mismatch as
// "Divergent thread(s) in block" (fp4, 260 requests, H200, 2026-11-30). The non-aligned form
// is defined for that.
__device__ __forceinline__ void staging_warps_sync() {
  if (kStagingWarps == 1) {
    __syncwarp();
  } else {
    asm volatile("barrier.sync 1, %0;" ::"n"(32 * kStagingWarps) : "memory");
  }
}

// mbarriers: full[s] (the producer's expect_tx arrival, completed by the copies), empty[s]
// (every lane of the consuming warpgroup), q_full[2] (every lane of the staging warps),
// q_empty[2] (every consumer lane). Stage s holds unit k with k % NUM_STAGES == s; q slot r & 1 holds the
// r-th request of the walk. After them, the kScheduleRowInts ints of the in-kernel schedule rows.
struct Barriers {
  static constexpr int kBytes = (2 * NUM_STAGES + 4) * 8 + (kScheduleRowInts * 4 + 15) / 16 * 16;
  uint64_t* full;
  uint64_t* empty;
  uint64_t* q_full;
  uint64_t* q_empty;
  int* schedule_rows;

  __device__ explicit Barriers(uint8_t* base)
      : full(reinterpret_cast<uint64_t*>(base)), empty(full + NUM_STAGES), q_full(full + 2 * NUM_STAGES),
        q_empty(q_full + 2), schedule_rows(reinterpret_cast<int*>(q_empty + 2)) {}

  __device__ void init() const {  // one thread, before the block-wide barrier
    for (int s = 0; s < NUM_STAGES; ++s) {
      mbar_init(&full[s], 1);
      mbar_init(&empty[s], 128);
    }
    for (int s = 0; s < 2; ++s) {
      mbar_init(&q_full[s], 32 * kStagingWarps);
      mbar_init(&q_empty[s], 128 * NUM_CONSUMERS);
    }
    fence_barrier_init();
  }
};

// ASYNC_Q_ARRIVE = 1: the kernel's stage_q issues only cp.async copies and does not wait for
// them; each staging lane's arrival on q_full is cp.async.mbarrier.arrive.noinc, triggered when
// its copies land, and the consumers put the proxy fence after their q_full wait. 0: stage_q's
// stores are complete when it returns; the staging warps fence and arrive.
#ifndef ASYNC_Q_ARRIVE
#define ASYNC_Q_ARRIVE 0
#endif
// Producer warps (warpgroup 0). The staging warps stage the q of every request the walk
// enters: `stage_q(b, slot, part)` fills its share (`part` of kStagingWarps, all 32 lanes take
// part) of q slot `slot` with generic stores. Unit k is issued by warp k % NUM_PRODUCERS: it
// waits until its stage is free, looks up the physical block of each box (-1 past the
// request's end), and lane 0 calls `issue(stage, walk, block_ids, boxes)`, which must arm
// full[stage] for the bytes it copies.
// EXP_PHASES=1 (measurement): `phases`, when not null, receives per producer warp (8 64-bit slots
// each) its SM cycles waiting for free stages, looking up blocks and issuing, and in new
// requests (q staging), then its unit count (32-bit sums, as in ConsumerPhases).
#ifndef EXP_PHASES
#define EXP_PHASES 0
#endif
// Each CTA owns kPhaseSlotsPerCta 64-bit slots of schedule_rows_out, 8 per role:
// consumer warpgroup c at 8c (c < 8), producer warp p at kProducerPhaseSlots + 8p.
constexpr int kPhaseSlotsPerCta = 128;
constexpr int kProducerPhaseSlots = 64;
static_assert(!EXP_PHASES || (NUM_CONSUMERS <= 8 && NUM_PRODUCERS <= 8), "EXP_PHASES: 8 slots per role");

template <typename StageQ, typename IssueUnit>
__device__ __forceinline__ void run_producer(UnitWalker& walk, const int* block_tables, long long block_table_stride,
                                             int num_blocks, const Barriers& bars, StageQ&& stage_q, IssueUnit&& issue,
                                             long long* phases = nullptr) {
  unsigned empty_wait = 0, issuing = 0, requests = 0, units = 0;
  const int lane = threadIdx.x % 32;
  const int producer_index = threadIdx.x / 32;
  int request_ordinal = -1;
  BlockTableWindow table;
  auto enter_table = [&]() {
    table.reset(block_tables + static_cast<long long>(walk.b) * block_table_stride,
                (walk.len + BLOCK_SIZE - 1) / BLOCK_SIZE, walk.u * kTile / BLOCK_SIZE);
  };
  auto on_request = [&]() {
    const unsigned entered = EXP_PHASES ? clock() : 0;
    ++request_ordinal;
    if (PRIME_TABLE_WINDOW) enter_table();
    if (producer_index >= kFirstStagingWarp) {
      const int slot = request_ordinal & 1;
      if (request_ordinal >= 2) mbar_wait(&bars.q_empty[slot], ((request_ordinal >> 1) - 1) & 1);
      stage_q(walk.b, slot, producer_index - kFirstStagingWarp);
      if (ASYNC_Q_ARRIVE) {
        cp_async_arrive_noinc(&bars.q_full[slot]);  // the consumers fence after their wait
      } else {
        fence_proxy_async_smem();  // generic-proxy stores, read by the tensor cores
        mbar_arrive(&bars.q_full[slot]);
      }
    }
    if (!PRIME_TABLE_WINDOW) enter_table();
    if (EXP_PHASES) requests += clock() - entered;
  };
  if (!walk.valid()) return;
  on_request();
  unsigned k = 0;  // unsigned: k % NUM_STAGES and k / NUM_STAGES without sign fix-ups
  walk.advance(k, producer_index, on_request);
  walk.for_each(k, NUM_PRODUCERS, on_request, [&](unsigned k) {
    const int stage = k % NUM_STAGES;
    const unsigned before_wait = EXP_PHASES ? clock() : 0;
    if (k >= NUM_STAGES) mbar_wait(&bars.empty[stage], ((k / NUM_STAGES) - 1) & 1);
    const unsigned stage_free = EXP_PHASES ? clock() : 0;
    int block_ids[kBoxesPerTile];
    int boxes = 0;
#pragma unroll
    for (int s = 0; s < kBoxesPerTile; ++s) {
      const int token = walk.u * kTile + s * kBoxRows;
      block_ids[s] = -1;
      if (token < walk.len) {  // warp-uniform: every lane takes part in the lookup
        const int id = table.lookup(token / BLOCK_SIZE);
        // An id outside [0, num_blocks) (a caller's "no page" mark inside a length, or a stale
        // table; outside the contract) becomes -1, and issue() copies no box of a negative id:
        // the scales' bulk copy has no bounds of its own, and leaving the box out of the
        // expected bytes keeps the stage able to complete, so those positions get stale values
        // instead of a fault or a hung CTA. One unsigned compare covers both ends.
        block_ids[s] = static_cast<unsigned>(id) < static_cast<unsigned>(num_blocks) ? id : -1;
        boxes += block_ids[s] >= 0;
      }
    }
    if (lane == 0) issue(stage, walk, block_ids, boxes);
    __syncwarp();
    if (EXP_PHASES) {
      empty_wait += stage_free - before_wait;
      issuing += clock() - stage_free;
      ++units;
    }
  });
  if (EXP_PHASES && phases != nullptr && lane == 0) {
    long long* mine = phases + 8 * producer_index;
    mine[0] = empty_wait;
    mine[1] = issuing;
    mine[2] = requests;
    mine[3] = units;
  }
}

// EXP_PHASES: a consumer warpgroup's SM cycles per phase, summed over its units (32-bit clock()
// sums: 64-bit ones made fp8 next_n 4 spill). `unit` takes the clock readings of one unit: its
// start, after its MMAs were issued, after they completed, its end.
struct ConsumerPhases {
  unsigned waiting = 0, issuing = 0, mma_waiting = 0, epilogue = 0, units = 0;
  unsigned last_end = EXP_PHASES ? clock() : 0;

  __device__ __forceinline__ void unit(unsigned start, unsigned issued, unsigned mma_done, unsigned end) {
    waiting += start - last_end;  // between units: the full barrier, the walk, a new request's q
    issuing += issued - start;
    mma_waiting += mma_done - issued;
    epilogue += end - mma_done;
    ++units;
    last_end = end;
  }
  // Slots 8 * consumer_index .. + 4 of this CTA's (written by the warpgroup's first thread).
  __device__ __forceinline__ void store(long long* phases, int consumer_index) const {
    if (threadIdx.x % 128 != 0) return;
    long long* mine = phases + kPhaseSlotsPerCta * blockIdx.x + 8 * consumer_index;
    mine[0] = waiting;
    mine[1] = issuing;
    mine[2] = mma_waiting;
    mine[3] = epilogue;
    mine[4] = units;
  }
};

// Consumer warpgroups. Unit k goes to consumer k % NUM_CONSUMERS, which waits for full[stage]
// and calls `process(stage, slot, walk)`; `process` must arrive on empty[stage] from every
// lane once it no longer reads the stage: an arrival releases only its own thread's reads, and
// the token scales (and fp4's tiles) are read with generic loads that the producer's next
// bulk copies overwrite. With one arrival per warp after __syncwarp(), which the PTX memory
// model allows, compute-sanitizer's racecheck reported those loads once a CTA reused a stage
// (H200, 2026-11-30, as it had for the q slots). Every consumer waits on q_full for every
// request, even one it gets no unit of, so the q-slot phases stay in step.
// `enter_request(walk, slot)` runs once the consumer holds a request's q slot, before that
// request's first unit: what depends only on the request can be computed there once.
template <typename ProcessUnit, typename EnterRequest>
__device__ __forceinline__ void run_consumer(int consumer_index, UnitWalker& walk, const Barriers& bars,
                                             ProcessUnit&& process, EnterRequest&& enter_request) {
  int request_ordinal = -1;
  // Every lane arrives: an arrival releases only its own thread's reads of the slot (the
  // weights are read with generic loads), and the staging warps overwrite the slot next.
  // With one arrival per warp after __syncwarp(), compute-sanitizer's racecheck reported the
  // weight loads of a reused slot (B = 260 case, H200, 2026-11-29); with this, 0 hazards.
  auto release_q = [&]() { mbar_arrive(&bars.q_empty[request_ordinal & 1]); };
  auto on_request = [&]() {
    if (request_ordinal >= 0) release_q();
    ++request_ordinal;
    mbar_wait(&bars.q_full[request_ordinal & 1], (request_ordinal >> 1) & 1);
    // The slot was written by cp.async (generic proxy) and completed on q_full without a fence
    // by the writers: order it before this thread's WGMMAs (async proxy) read it.
    if (ASYNC_Q_ARRIVE) fence_proxy_async_smem();
    enter_request(static_cast<const UnitWalker&>(walk), request_ordinal & 1);
  };
  if (!walk.valid()) return;
  on_request();
  unsigned k = 0;  // unsigned: k % NUM_STAGES and k / NUM_STAGES without sign fix-ups
  walk.advance(k, consumer_index, on_request);
  walk.for_each(k, NUM_CONSUMERS, on_request, [&](unsigned k) {
    const int stage = k % NUM_STAGES;
    mbar_wait(&bars.full[stage], (k / NUM_STAGES) & 1);
    process(stage, request_ordinal & 1, static_cast<const UnitWalker&>(walk));
  });
  release_q();
}

// ---------------------------------------------------------------- epilogue number types
#if EPI_DTYPE == 2
using Epi = __nv_bfloat16;
#elif EPI_DTYPE == 1
using Epi = __half;
#else
using Epi = float;
#endif
#if EPI_DTYPE != 0
// Two columns of one row in one register (low half: the lower column), for the packed 16-bit
// epilogues: one F2FP and one HFMA2 per pair of heads.
#if EPI_DTYPE == 2
using Epi2 = __nv_bfloat162;
#else
using Epi2 = __half2;
#endif

__device__ __forceinline__ Epi2 epi2_from_bits(const uint32_t& bits) { return *reinterpret_cast<const Epi2*>(&bits); }

// The packing conversion of two floats to Epi2, `modifier` "" or ".relu" (a string literal).
#if EPI_DTYPE == 2
#define EPI2_CVT(modifier) "cvt.rn" modifier ".bf16x2.f32 %0, %1, %2;"
#else
#define EPI2_CVT(modifier) "cvt.rn" modifier ".f16x2.f32 %0, %1, %2;"
#endif

__device__ __forceinline__ Epi2 to_epi2(float lo, float hi) {
  uint32_t bits;
  asm(EPI2_CVT("") : "=r"(bits) : "f"(hi), "f"(lo));
  return epi2_from_bits(bits);
}

// relu(lo), relu(hi) rounded to the epilogue type and packed, the ReLU folded into the
// conversion (cvt.rn.relu: one F2FP instead of an F2FP and an HMNMX2). Rounding to nearest
// keeps the sign, so this is the rounded value's relu; a NaN stays NaN, as in the reference's
// relu and the float32 epilogue (HMNMX2 would have turned it into 0).
__device__ __forceinline__ Epi2 relu_pack(float lo, float hi) {
  uint32_t bits;
  asm(EPI2_CVT(".relu") : "=r"(bits) : "f"(hi), "f"(lo));
  return epi2_from_bits(bits);
}
#undef EPI2_CVT
#endif
#if OUT_DTYPE == 2
using Out = __nv_bfloat16;
#elif OUT_DTYPE == 1
using Out = __half;
#else
using Out = float;
#endif

__device__ __forceinline__ Epi to_epi(float x) {
#if EPI_DTYPE == 2
  return __float2bfloat16_rn(x);
#elif EPI_DTYPE == 1
  return __float2half_rn(x);
#else
  return x;
#endif
}

// max(x, 0) that keeps a NaN (the .NaN form of FMNMX/HMNMX2, same cost), as the reference's
// relu does; plain fmaxf would turn it into 0.
__device__ __forceinline__ Epi relu(Epi x) {
#if EPI_DTYPE == 0
  float y;
  asm("max.NaN.f32 %0, %1, 0f00000000;" : "=f"(y) : "f"(x));
  return y;
#else
  return __hmax_nan(x, to_epi(0.f));
#endif
}

// The head term before its weight: relu(x), or 2 relu(x) where RELU_FORM = 1 (kHeadTermScale
// undoes it).
constexpr bool kTwiceRelu = RELU_FORM == 1;
constexpr float kHeadTermScale = kTwiceRelu ? 0.5f : 1.f;
// EXP_ABS_TERMS=1 (a measurement, wrong logits; RELU_FORM 1 only): each head term is w |x|, one
// FFMA with an |x| operand instead of an FADD and an FFMA. That is the epilogue of the |x|
// design (w relu(x) = w (x + |x|) / 2, with the linear part sum_h w_h x_h from extra MMA
// columns; twenty-sixth round of the kernel notes) without the cost of those columns.
#ifndef EXP_ABS_TERMS
#define EXP_ABS_TERMS 0
#endif
#if RELU_FORM == 1
__device__ __forceinline__ Epi head_term(Epi x) { return EXP_ABS_TERMS ? fabsf(x) : x + fabsf(x); }
#elif RELU_FORM == 3
__device__ __forceinline__ Epi head_term(Epi x) { return x; }  // acc_pair applied the ReLU
#else
__device__ __forceinline__ Epi head_term(Epi x) { return relu(x); }
#endif

__device__ __forceinline__ Out to_out(float x) {
#if OUT_DTYPE == 2
  return __float2bfloat16_rn(x);
#elif OUT_DTYPE == 1
  return __float2half_rn(x);
#else
  return x;
#endif
}

// x * 2^e with two exact power-of-two factors, cheaper than ldexpf's general path. Exact only
// for |e| <= 252, where both factors are normal; e is clamped there, which is right for x = 1
// (2^e then underflows to 0 or overflows to inf either way) and wrong for larger |x|, so
// callers with such x keep e inside [-252, 252] or use ldexpf.
__device__ __forceinline__ float scale_by_pow2(float x, int e) {
  e = max(min(e, 252), -252);
  const int half = e / 2;
  return x * __int_as_float((half + 127) << 23) * __int_as_float((e - half + 127) << 23);
}

__device__ __forceinline__ float to_float(Epi x) { return static_cast<float>(x); }

__device__ __forceinline__ Epi shfl_xor(Epi v, int mask) { return __shfl_xor_sync(0xffffffffu, v, mask); }

// ---------------------------------------------------------------- per-slot head sums
// The m64nN accumulator gives a thread rows r0 and r0 + 8 and, in every 8-column group j,
// columns 8j + 2*quad and 8j + 2*quad + 1. Columns of draft slot t are [t*H, (t+1)*H);
// H % 4 == 0, so each half of an 8-column group (quads 0-1 and 2-3) belongs to one slot,
// known at compile time after unrolling.
struct SlotSums {
  Epi partial[NEXT_N][2];
#if RELU_FORM == 2
  float twice[NEXT_N][2];  // sums of w * (x + |x|), see RELU_FMA
#endif

  __device__ __forceinline__ void clear() {
#pragma unroll
    for (int t = 0; t < NEXT_N; ++t) partial[t][0] = partial[t][1] = to_epi(0.f);
#if RELU_FORM == 2
#pragma unroll
    for (int t = 0; t < NEXT_N; ++t) twice[t][0] = twice[t][1] = 0.f;
#endif
  }
  // Add `v` (this thread's two columns of group j, row i) to its slot.
  __device__ __forceinline__ void add(int j, int i, int quad, Epi v) {
    const int t_lo = (8 * j) / NUM_HEADS, t_hi = (8 * j + 4) / NUM_HEADS;
    if (t_lo == t_hi) {
      partial[t_lo][i] += v;
    } else {
      const Epi zero = to_epi(0.f);
      partial[t_lo][i] += quad < 2 ? v : zero;
      partial[t_hi][i] += quad < 2 ? zero : v;
    }
  }
  // Add w0 * head_term(x0) + w1 * head_term(x1); a single-slot group accumulates with two FMAs.
  __device__ __forceinline__ void add_weighted(int j, int i, int quad, Epi w0, Epi x0, Epi w1, Epi x1) {
    const int t_lo = (8 * j) / NUM_HEADS, t_hi = (8 * j + 4) / NUM_HEADS;
    if (t_lo == t_hi) {
#if RELU_FORM == 2
      twice[t_lo][i] = w0 * (x0 + fabsf(x0)) + twice[t_lo][i];
      partial[t_lo][i] = w1 * relu(x1) + partial[t_lo][i];
#else
      partial[t_lo][i] = w1 * head_term(x1) + (w0 * head_term(x0) + partial[t_lo][i]);
#endif
    } else {
      add(j, i, quad, w0 * head_term(x0) + w1 * head_term(x1));
    }
  }
  // Sum over the quad, spreading the 2 * NEXT_N totals over its lanes. Afterwards lane `quad`
  // holds, in lane_sums[k], the total of row quad & 1 for draft slot 2k + (quad >> 1), and
  // stores it where stores(k, quad). (An odd NEXT_N's last slot is held by both lane pairs;
  // lanes 0 and 1 store it.)
  //
  // Each butterfly step sends the half a lane gives away and adds the half it keeps, so a
  // step costs one shuffle per kept value instead of one per value (NEXT_N = 4: 6 shuffles
  // and adds instead of 16). Every total is still ((l0 + l1) + (l2 + l3)) over the quad's
  // lanes, as in a plain butterfly, so the results are bitwise the same.
  static constexpr int kLaneSums = (NEXT_N + 1) / 2;
  Epi lane_sums[kLaneSums];

  __device__ __forceinline__ static bool stores(int k, int quad) { return 2 * k + 1 < NEXT_N || quad < 2; }

  __device__ __forceinline__ void reduce_quad(int quad) {
    const bool odd_lane = quad & 1, high_pair = quad & 2;
    // Slot by slot (not step by step), so that few sums are in flight at large NEXT_N.
    auto keep_row = [&](int t) {
#if RELU_FORM == 2
#pragma unroll
      for (int i = 0; i < 2; ++i) partial[t][i] = fmaf(twice[t][i], 0.5f, partial[t][i]);
#endif
      const Epi keep = odd_lane ? partial[t][1] : partial[t][0];
      const Epi give = odd_lane ? partial[t][0] : partial[t][1];
      return keep + shfl_xor(give, 1);
    };
#pragma unroll
    for (int k = 0; k < kLaneSums; ++k) {
      const Epi even_slot = keep_row(2 * k);
      if (2 * k + 1 < NEXT_N) {
        const Epi odd_slot = keep_row(2 * k + 1);
        const Epi keep = high_pair ? odd_slot : even_slot;
        const Epi give = high_pair ? even_slot : odd_slot;
        lane_sums[k] = keep + shfl_xor(give, 2);
      } else {
        lane_sums[k] = even_slot + shfl_xor(even_slot, 2);
      }
    }
  }
};

}  // namespace fi_paged_mqa
