// FP8 paged MQA logits for Hopper (SM90a).
//
//   out[b*NEXT_N + t, p] = scale[p] * sum_h w[b*NEXT_N + t, h] * relu(q[b, t, h, :] . k[p, :])
//
// One persistent CTA per SM walks a contiguous run of 64-token work units (request, unit)
// given by the schedule rows [blockIdx.x, blockIdx.x + 1], precomputed or (schedule == null)
// derived by the CTA from seq_lens. Roles (warp specialisation):
//
//   warpgroup 0          NUM_PRODUCERS producer warps: warps 1.. (warp 0 when it is the only
//                        one) together copy each request's q and weights into a q slot
//                        (cp.async, into the 128B/64B/32B swizzle WGMMA expects); unit k's warp
//                        TMA-loads its 64 KV rows (1 or 2 boxes of min(64, BLOCK_SIZE) rows) and
//                        their fp32 scales into a stage.
//   warpgroups 1..NC     consumers: unit k goes to consumer k % NC. WGMMA m64nNk32 with the
//                        64 KV tokens as M and the NEXT_N*NUM_HEADS query heads as N, then the
//                        epilogue in registers: ReLU, weight, sum over heads, times the token
//                        scale, store.
//
// The WGMMA puts tokens in M so one pass over the KV serves every draft slot (N = NEXT_N * H).
// The pipeline loops and barriers are shared with the MXFP4 kernel (paged_mqa_common.cuh).
//
// Shared memory (the base 1024-byte aligned; every tile and chunk base a multiple of its
// swizzle atom, 8 rows of CW bytes, which is 1024 bytes for the 128-byte swizzle):
//   kv tiles   [STAGES][HEAD_DIM / CW][64 rows][CW bytes]        CW = swizzle row width
//   q slots    [2][HEAD_DIM / CW][N rows][CW bytes]
//   weights    [2][N] fp32 (fp16 in the first half of each slot with a float16 epilogue)
//   scales     [STAGES][64] fp32
//   barriers   full[STAGES], empty[STAGES], q_full[2], q_empty[2], then the in-kernel
//              schedule rows (Barriers in paged_mqa_common.cuh)
//
// Specialisation constants (defines): BLOCK_SIZE, HEAD_DIM, NUM_HEADS, NEXT_N, NUM_STAGES,
// NUM_CONSUMERS, NUM_PRODUCERS, MMA_HALVES, WEIGHT_REGS, OUT_DTYPE, EPI_DTYPE (0 = fp32,
// 1 = fp16), ACC_FP16, SCHEDULE_ENTRY_UNITS, SHARED_BYTES (the launch's dynamic shared memory).

// The float32 epilogue's weights are copied as they are, so the whole q slot can be filled by
// cp.async and completed on its barrier asynchronously; the float16 epilogue rounds them first.
#ifndef ASYNC_Q_ARRIVE
#define ASYNC_Q_ARRIVE (EPI_DTYPE == 0)
#endif
#include "paged_mqa_common.cuh"
#include "wgmma_fp8.cuh"

namespace {

using namespace fi_paged_mqa;
constexpr int kSwizzle = HEAD_DIM % 128 == 0 ? 128 : HEAD_DIM % 64 == 0 ? 64 : 32;
constexpr int kChunks = HEAD_DIM / kSwizzle;
constexpr int kKStepsPerChunk = kSwizzle / 32;
constexpr int kKvTileBytes = kTile * HEAD_DIM;
constexpr int kQSlotBytes = kN * HEAD_DIM;
constexpr int kProducerRegs = 56;
// Registers per consumer thread: what the producers give back (RegisterSplit in
// paged_mqa_common.cuh).
using Registers = RegisterSplit<kProducerRegs>;

// Measurement variants (never set in production; defaults in paged_mqa_common.cuh):
// EXP_SKIP_MATH=1 drops the MMA and the epilogue (consumers only release stages and write the
// token scale), timing the load pipeline; EXP_SKIP_MMA=1 keeps the epilogue but issues no MMA
// (accumulators hold whatever they held); EXP_SKIP_EPILOGUE=1 keeps the MMA but replaces the
// epilogue by one store per row.
// EXP_EXIT=1 returns at once, 2 after the schedule rows: the launch and prologue floor.
#ifndef EXP_EXIT
#define EXP_EXIT 0
#endif
// EXP_TIMESTAMPS=1: schedule_rows_out receives, per CTA, 8 globaltimer readings (ns) instead of
// the schedule rows: entry (after the PDL wait) and rows known (both by the last consumer warp), then the exit of the producer warp and of each
// consumer warpgroup; with at most 4 consumer warpgroups the last reading is the SM's id instead
// (EXP_TIMESTAMPS=2, a finer start: only consumer warpgroup 0's exit, in slot 3; slot 4 producer
// warp 0's first copy, slot 5 consumer 0 holding its first q slot, slot 6 staging warp 1 done
// with the first request, slot 7 consumer 0 finding its first stage full; those four are held
// in registers and stored when their role is done).
#ifndef EXP_TIMESTAMPS
#define EXP_TIMESTAMPS 0
#endif
// EXP_STAMP_WALK (with EXP_TIMESTAMPS=2): reading 6 is, instead of staging warp 1 done with the
// first request, producer warp 0 past its walker's start, just before its first block-table
// read (1), or past its setmaxnreg (2); 3 and 4 check the readings themselves: thread 0 reads
// again right after storing the rows reading (3), or reads twice before storing either (4). On
// the H200 (2026-11-30) 4 read 2 cycles apart and 3 about 1400-1900: the store after
// __syncthreads waited that long to read its register, and the next reading, which reuses the
// register, waited for it. So a reading's own store can delay what the same thread does next.
#ifndef EXP_STAMP_WALK
#define EXP_STAMP_WALK 0
#endif
// The readings are kept in shared memory and written out at the kernel's end, so no global
// store sits between a reading and the work it times.
// EXP_STAMP_CLOCK=1: every reading is the SM's cycle counter (%clock64) instead, exact for
// intervals inside one CTA, not comparable between SMs.
#ifndef EXP_STAMP_CLOCK
#define EXP_STAMP_CLOCK 0
#endif
__device__ __forceinline__ unsigned long long reading() { return EXP_STAMP_CLOCK ? clock64() : globaltimer(); }
#if EXP_TIMESTAMPS
static_assert(NUM_CONSUMERS <= 5, "EXP_TIMESTAMPS: 8 readings; consumer warpgroup w (1-based) exits into slot 2 + w");
__shared__ unsigned long long stamp_slots[8];
__device__ __forceinline__ void stamp(int slot, unsigned long long value) { stamp_slots[slot] = value; }
#else
__device__ __forceinline__ void stamp(int, unsigned long long) {}
#endif
// EXP_PHASES=1: schedule_rows_out receives 64 64-bit slots per CTA, the consumer warpgroups'
// cycles per phase (ConsumerPhases) and then the producer warps' (run_producer).

static_assert(HEAD_DIM % 32 == 0, "head_dim must be a multiple of 32");
static_assert(kN % 8 == 0 && kN >= 8 && kN <= 256, "next_n * num_heads must be a multiple of 8 in [8, 256]");
static_assert(NUM_HEADS % 4 == 0, "num_heads must be a multiple of 4");

#if ACC_FP16
using AccReg = uint32_t;  // packed half2
#else
using AccReg = float;
#endif
using Mma = WgmmaFp8<kNHalf, !ACC_FP16>;

// WEIGHT_REGS = G: the weights of the first G 8-column groups of N stay in registers (a
// thread's column pair of each group: two floats, or one half2 with a float16 epilogue) while a
// consumer works on one request, instead of being loaded from the weight slot for every unit;
// G capped at N / 8. The launcher chooses G (fp8_sm90.weight_register_groups).
#ifndef WEIGHT_REGS
#define WEIGHT_REGS 0
#endif
constexpr int kWeightRegGroups = WEIGHT_REGS < kN / 8 ? WEIGHT_REGS : kN / 8;
#if EPI_DTYPE == 1
using WeightPair = __half2;  // the weight slot holds float16 weights with a float16 epilogue
#else
using WeightPair = float2;
#endif

struct SharedLayout {
  static constexpr int kKv = 0;
  static constexpr int kQ = kKv + NUM_STAGES * kKvTileBytes;
  static constexpr int kWeights = kQ + 2 * kQSlotBytes;
  static constexpr int kScales = kWeights + 2 * kN * 4;
  static constexpr int kBarriers = (kScales + NUM_STAGES * kTile * 4 + 7) / 8 * 8;
  static constexpr int kBytes = kBarriers + Barriers::kBytes;
};
// The dynamic shared memory the launcher asks for (the config's `shared_memory_bytes`, which
// mirrors this layout by hand) must hold the layout after the base is rounded up to 1024 bytes.
static_assert(SharedLayout::kBytes + 1024 <= SHARED_BYTES,
              "the config's shared_memory_bytes is smaller than this kernel's SharedLayout");

// Byte offset of (row, 16-byte unit) in a swizzled K-major tile whose rows are kSwizzle bytes:
// the TMA/WGMMA swizzle XORs address bits [4, 4+log2(kSwizzle/16)) with bits [7, ...).
__device__ __forceinline__ uint32_t swizzled_offset(uint32_t row, uint32_t unit) {
  const uint32_t linear = row * kSwizzle + unit * 16;
  return linear ^ (((linear >> 7) & (kSwizzle / 16 - 1)) << 4);
}

// The two accumulator values (row r0 + 8*i, columns c, c+1) of 8-column group j; with
// RELU_FORM 3 (float32 epilogue, float16 accumulator) their ReLUs.
[[maybe_unused]] __device__ __forceinline__ void acc_pair(const AccReg (&acc)[Mma::kRegs], int j, int i, Epi& x0, Epi& x1) {
#if ACC_FP16
  const __half2 h = *reinterpret_cast<const __half2*>(&acc[2 * j + i]);
#if EPI_DTYPE == 1
  x0 = __low2half(h);
  x1 = __high2half(h);
#else
  static_assert(RELU_FORM == 3, "a float32 epilogue over a float16 accumulator takes the ReLU here");
  const __half2 r = __hmax2_nan(h, __float2half2_rn(0.f));
  x0 = __low2float(r);
  x1 = __high2float(r);
#endif
#else
  x0 = to_epi(acc[4 * j + 2 * i]);
  x1 = to_epi(acc[4 * j + 2 * i + 1]);
#endif
}

#if EPI_DTYPE == 1
// relu of the two values as one half2 (low half: column c): over a float16 accumulator its
// register through HMNMX2 (the .NaN form, so a NaN stays NaN), over a float32 one a single
// F2FP with the ReLU folded in.
__device__ __forceinline__ __half2 relu_half2(const AccReg (&acc)[Mma::kRegs], int j, int i) {
#if ACC_FP16
  return __hmax2_nan(epi2_from_bits(acc[2 * j + i]), __float2half2_rn(0.f));
#else
  return relu_pack(acc[4 * j + 2 * i], acc[4 * j + 2 * i + 1]);
#endif
}
#endif

__device__ __forceinline__ void producer(const TensorMap& kv_map, const uint8_t* kv_base, long long kv_block_stride,
                                         const uint8_t* q, const float* weights, const int* block_tables,
                                         long long block_table_stride, int num_blocks, UnitWalker walk,
                                         uint8_t* smem, long long* phases) {
  const int lane = threadIdx.x % 32;
  uint8_t* kv_tiles = smem + SharedLayout::kKv;
  uint8_t* q_slots = smem + SharedLayout::kQ;
  float* weight_slots = reinterpret_cast<float*>(smem + SharedLayout::kWeights);
  float* scales = reinterpret_cast<float*>(smem + SharedLayout::kScales);
  const Barriers bars(smem + SharedLayout::kBarriers);

  // q rows of request b: [b*N, b*N + N), each HEAD_DIM bytes, stored chunk-major and swizzled.
  // Staging warp `part` copies 16-byte units part*32 + lane + i*kStride with cp.async, so every
  // copy of the request is in flight at once and a request costs one global round trip (the
  // weights' loads are issued first and overlap it). The staging warps issue no KV copies
  // while they stage, so each round trip here is a gap in the pipeline at every request switch.
  auto stage_q = [&](int b, int slot, int part) {
    const uint4* q_src = reinterpret_cast<const uint4*>(q + static_cast<long long>(b) * kQSlotBytes);
    uint8_t* q_dst = q_slots + slot * kQSlotBytes;
    constexpr int kUnitsPerRow = HEAD_DIM / 16;
    constexpr int kUnitsPerChunkRow = kSwizzle / 16;
    constexpr int kUnits = kN * kUnitsPerRow;
    constexpr int kStride = 32 * kStagingWarps;
    [[maybe_unused]] constexpr int kWeightsPerLane = (kN + kStride - 1) / kStride;  // unused with ASYNC_Q_ARRIVE
    const float* w_src = weights + static_cast<long long>(b) * kN;
#if ASYNC_Q_ARRIVE
    // float32 weights: 16-byte cp.async copies as well (kN % 8 == 0). Nothing here waits for
    // the copies: run_producer's arrival completes when they land.
    for (int idx = part * 32 + lane; idx < kN / 4; idx += kStride) {
      cp_async_16(weight_slots + slot * kN + 4 * idx, w_src + 4 * idx);
    }
#else
    float w[kWeightsPerLane];
#pragma unroll
    for (int i = 0; i < kWeightsPerLane; ++i) {
      const int idx = part * 32 + lane + i * kStride;
      if (idx < kN) w[i] = w_src[idx];
    }
#endif
    // Unrolled only where the row split is a shift: with head_dim/16 a multiple of 7 (head_dim
    // 224, 448, 896) the unrolled divisions spilled 4-24 bytes at the producers' 56 registers.
#pragma unroll (kUnitsPerRow & (kUnitsPerRow - 1)) == 0 ? 4 : 1
    for (int idx = part * 32 + lane; idx < kUnits; idx += kStride) {
      const int row = idx / kUnitsPerRow, unit = idx % kUnitsPerRow;
      const int chunk = unit / kUnitsPerChunkRow, unit_in_chunk = unit % kUnitsPerChunkRow;
      cp_async_16(q_dst + chunk * kN * kSwizzle + swizzled_offset(row, unit_in_chunk), q_src + idx);
    }
#if !ASYNC_Q_ARRIVE
    cp_async_wait_all();
#pragma unroll
    for (int i = 0; i < kWeightsPerLane; ++i) {
      const int idx = part * 32 + lane + i * kStride;
      if (idx >= kN) break;
#if EPI_DTYPE == 1
      // Rounded once per request here rather than once per unit by every consumer.
      reinterpret_cast<Epi*>(weight_slots + slot * kN)[idx] = to_epi(w[i]);
#else
      weight_slots[slot * kN + idx] = w[i];
#endif
    }
#endif
  };
  // EXP_TIMESTAMPS=2: readings are held in registers and stored once the role is done (a
  // reading's store can hold its thread back; see EXP_STAMP_WALK).
  unsigned long long first_issue_at = 0, first_staged_at = 0;
  auto issue = [&](int stage, const UnitWalker& unit, const int (&block_ids)[kBoxesPerTile], int boxes) {
    if (EXP_TIMESTAMPS == 2 && first_issue_at == 0) first_issue_at = reading();  // warp 0's first copy
    mbar_arrive_expect_tx(&bars.full[stage], boxes * kBoxRows * (HEAD_DIM + 4));
#pragma unroll
    for (int s = 0; s < kBoxesPerTile; ++s) {
      if (block_ids[s] < 0) continue;
      const int row_in_block = (unit.u * kTile + s * kBoxRows) % BLOCK_SIZE;
#pragma unroll
      for (int c = 0; c < kChunks; ++c) {
        uint8_t* dst = kv_tiles + stage * kKvTileBytes + c * kTile * kSwizzle + s * kBoxRows * kSwizzle;
        tma_load_3d(dst, &kv_map, &bars.full[stage], c * kSwizzle, row_in_block, block_ids[s]);
      }
      const uint8_t* scale_src =
          kv_base + block_ids[s] * kv_block_stride + BLOCK_SIZE * HEAD_DIM + row_in_block * 4;
      bulk_load(scales + stage * kTile + s * kBoxRows, scale_src, kBoxRows * 4, &bars.full[stage]);
    }
  };
  auto stage_q_stamped = [&](int b, int slot, int part) {
    stage_q(b, slot, part);
    if (EXP_TIMESTAMPS == 2 && first_staged_at == 0) first_staged_at = reading();  // staging warp 1 done with the first request
  };
  run_producer(walk, block_tables, block_table_stride, num_blocks, bars, stage_q_stamped, issue,
               EXP_PHASES ? phases + kPhaseSlotsPerCta * blockIdx.x + kProducerPhaseSlots : nullptr);
  if (EXP_TIMESTAMPS == 2 && threadIdx.x == 0) stamp(4, first_issue_at);
  if (EXP_TIMESTAMPS == 2 && !EXP_STAMP_WALK && threadIdx.x == 32) stamp(6, first_staged_at);
}

// A consumer warpgroup's math: the MMAs of one unit, and the epilogue.
struct ConsumerMath {
  int lane, quad, row0;
  const uint8_t* kv_tiles;
  const uint8_t* q_slots;
  const float* weight_slots;
  const float* scales;
  Barriers bars;
  Out* out;
  long long out_stride;
  AccReg acc[kHalves][Mma::kRegs];
  WeightPair weight_regs[kWeightRegGroups > 0 ? kWeightRegGroups : 1];
  Out* request_out = nullptr;  // the current request's first row of this lane's slots (quad >> 1)
  unsigned mma_done = 0;  // EXP_PHASES: clock() when the unit's last MMA group completed

  __device__ ConsumerMath(uint8_t* smem, Out* out_, long long out_stride_)
      : lane(threadIdx.x % 32),
        quad(lane % 4),                                  // which column pair of each 8-column group
        row0(16 * ((threadIdx.x / 32) % 4) + lane / 4),  // this thread's rows: row0 and row0 + 8
        kv_tiles(smem + SharedLayout::kKv),
        q_slots(smem + SharedLayout::kQ),
        weight_slots(reinterpret_cast<const float*>(smem + SharedLayout::kWeights)),
        scales(reinterpret_cast<const float*>(smem + SharedLayout::kScales)),
        bars(smem + SharedLayout::kBarriers),
        out(out_),
        out_stride(out_stride_) {}

  // What depends only on the request, once it holds its q slot (between q_full and q_empty):
  // its output rows and its register-held weights.
  __device__ __forceinline__ void enter_request(int slot, int b) {
    request_out = out + (static_cast<long long>(b) * NEXT_N + (quad >> 1)) * out_stride;
    const float* w = weight_slots + slot * kN;
#pragma unroll
    for (int j = 0; j < kWeightRegGroups; ++j) weight_regs[j] = slot_weights(w, j);
  }

  // This thread's column pair of group j in a weight slot; (j < kWeightRegGroups) held in
  // registers instead.
  __device__ __forceinline__ WeightPair slot_weights(const float* w, int j) const {
    return *reinterpret_cast<const WeightPair*>(reinterpret_cast<const Epi*>(w) + 8 * j + 2 * quad);
  }
  __device__ __forceinline__ WeightPair weights_of_group(const float* w, int j) const {
    // (The clamped index keeps the untaken side in bounds where the array is a stand-in.)
    return j < kWeightRegGroups ? weight_regs[j < kWeightRegGroups ? j : 0] : slot_weights(w, j);
  }

  // Issue the MMAs of the unit in `stage` against q slot `slot`: one commit group per half of
  // the N columns (half h: q rows [h * kNHalf, (h + 1) * kNHalf) of each chunk).
  __device__ __forceinline__ void mma(int stage, int slot) {
    // Descriptors in uniform registers (see warp_uniform): at next_n 4, block 64, float32
    // epilogue and accumulator, 2 R2UR per unit instead of 32 and a unit path of 360 SASS
    // instructions instead of 389 (NVRTC 13.5).
    stage = warp_uniform(stage);
    slot = warp_uniform(slot);
    const uint8_t* a_tile = kv_tiles + stage * kKvTileBytes;
    const uint8_t* b_tile = q_slots + slot * kQSlotBytes;
#pragma unroll
    for (int h = 0; h < kHalves; ++h) {
#pragma unroll
      for (int i = 0; i < Mma::kRegs; ++i) reg_fence(acc[h][i]);
    }
    wgmma_fence();
    const uint64_t a_desc = smem_desc<kSwizzle>(a_tile), b_desc = smem_desc<kSwizzle>(b_tile);
#pragma unroll
    for (int h = 0; h < kHalves; ++h) {
#pragma unroll
      for (int c = 0; c < kChunks; ++c) {
#pragma unroll
        for (int ks = 0; ks < kKStepsPerChunk; ++ks) {
          const uint64_t desc_a = smem_desc_advance(a_desc, c * kTile * kSwizzle + ks * 32);
          const uint64_t desc_b = smem_desc_advance(b_desc, (c * kN + h * kNHalf) * kSwizzle + ks * 32);
          if (!EXP_SKIP_MMA) Mma::mma(acc[h], desc_a, desc_b, (c | ks) != 0);
        }
      }
      wgmma_commit();
    }
  }

  // Wait for half h's MMA group (the later half may still run).
  template <int h>
  __device__ __forceinline__ void wait_half() {
    wgmma_wait<kHalves - 1 - h>();
#pragma unroll
    for (int i = 0; i < Mma::kRegs; ++i) reg_fence(acc[h][i]);
    if (EXP_PHASES && h == kHalves - 1) mma_done = clock();
  }

  // Half h's share of the epilogue: w * relu(acc) summed per draft slot into `sums`.
  template <int h>
  __device__ __forceinline__ void add_half(const float* w, SlotSums& sums) {
#if EPI_DTYPE == 1
    add_half_packed<h>(w, sums);
#else
#pragma unroll
    for (int jl = 0; jl < kNHalf / 8; ++jl) {
      const int j = h * (kNHalf / 8) + jl;  // 8-column group of the unit's N columns
      const float2 wf = weights_of_group(w, j);
      const Epi w0 = to_epi(wf.x), w1 = to_epi(wf.y);
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        Epi x0, x1;
        acc_pair(acc[h], jl, i, x0, x1);
        sums.add_weighted(j, i, quad, w0, x0, w1, x1);
      }
    }
#endif
  }

#if EPI_DTYPE == 1
  // float16 epilogue: a thread's two columns of a row stay one half2 (relu_half2): one F2FP
  // with the ReLU folded in (or one HMNMX2 over a float16 accumulator) and one HFMA2 per pair,
  // into a half2 sum per draft slot and row whose halves are added at the end. Taking the
  // halves apart (acc_pair) costs PRMTs to merge them again; over a float16 accumulator ptxas
  // also wrote the ReLU back into the accumulator registers and then serialized every wgmma of
  // the kernel (ptxas info C7518).
  template <int h>
  __device__ __forceinline__ void add_half_packed(const float* w, SlotSums& sums) {
    const __half2 zero = __float2half2_rn(0.f);
    __half2 pair_sums[NEXT_N][2];
#pragma unroll
    for (int t = 0; t < NEXT_N; ++t) pair_sums[t][0] = pair_sums[t][1] = zero;
#pragma unroll
    for (int jl = 0; jl < kNHalf / 8; ++jl) {
      const int j = h * (kNHalf / 8) + jl;  // 8-column group of the unit's N columns
      const __half2 w2 = weights_of_group(w, j);
      // The group's columns belong to one draft slot, or (H % 8 == 4) quads 0-1 to t_lo and
      // quads 2-3 to t_hi. There the other slot gets 0 * 0, not w * 0: a lane's weight belongs
      // to its own slot, and an infinite or NaN one (a weight from 65520 up rounds to inf) would
      // make the other slot's sum NaN.
      const int t_lo = (8 * j) / NUM_HEADS, t_hi = (8 * j + 4) / NUM_HEADS;
      const bool in_lo = quad < 2;
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const __half2 term = relu_half2(acc[h], jl, i);
        if (t_lo == t_hi) {
          pair_sums[t_lo][i] = __hfma2(w2, term, pair_sums[t_lo][i]);
        } else {
          pair_sums[t_lo][i] = __hfma2(in_lo ? w2 : zero, in_lo ? term : zero, pair_sums[t_lo][i]);
          pair_sums[t_hi][i] = __hfma2(in_lo ? zero : w2, in_lo ? zero : term, pair_sums[t_hi][i]);
        }
      }
    }
#pragma unroll
    for (int t = 0; t < NEXT_N; ++t) {
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        sums.partial[t][i] += __low2half(pair_sums[t][i]) + __high2half(pair_sums[t][i]);
      }
    }
  }
#endif

  // The epilogue of unit (b, u), half by half as its MMA groups complete: per draft slot, the
  // sum over this thread's columns of w * relu(acc), then the quad's sum, times the token
  // scale. The stage goes back to the producer once the last group has read it. No
  // lane-dependent branch before that: ptxas serializes wgmmas in flight across one.
  __device__ __forceinline__ void epilogue(int stage, int slot, int u) {
    // After the quad's reduction this lane holds row row0 + 8 * (quad & 1): one token scale.
    const int row = row0 + 8 * (quad & 1);
    const float scale = scales[stage * kTile + row];
    const int column = u * kTile + row;
    Out* slot_out = request_out + (EXP_STORES == 2 ? column % 512 : column);  // slot 2k + (quad >> 1), k = 0
    const float* w = weight_slots + slot * kN;
    SlotSums sums;
    sums.clear();
    if (!EXP_SKIP_EPILOGUE && kHalves == 2) {
      wait_half<0>();
      add_half<0>(w, sums);
    }
    wait_half<kHalves - 1>();
    mbar_arrive(&bars.empty[stage]);
    if (EXP_SKIP_EPILOGUE) {
      if (quad == 0) slot_out[0] = to_out(to_float(to_epi(acc[0][0])) * scale);
      return;
    }
    add_half<kHalves - 1>(w, sums);
    sums.reduce_quad(quad);
#pragma unroll
    for (int k = 0; k < SlotSums::kLaneSums; ++k, slot_out += 2 * out_stride) {
      if (EXP_STORES == 1 && out_stride > 0) continue;  // always taken at run time
      if (SlotSums::stores(k, quad)) *slot_out = to_out(to_float(sums.lane_sums[k]) * kHeadTermScale * scale);
    }
  }

  // EXP_SKIP_MATH: release the stage and write the token scale only.
  __device__ __forceinline__ void skip_math(int stage, int b, int u) {
    const float scale = scales[stage * kTile + row0];
    mbar_arrive(&bars.empty[stage]);
    if (quad == 0) out[static_cast<long long>(b) * NEXT_N * out_stride + u * kTile + row0] = to_out(scale);
  }
};

__device__ __forceinline__ void consumer(int consumer_index, Out* out, long long out_stride, UnitWalker walk,
                                         uint8_t* smem, long long* phases) {
  ConsumerMath math(smem, out, out_stride);
  ConsumerPhases timing;
  unsigned long long first_q_at = 0, first_full_at = 0;  // EXP_TIMESTAMPS=2, stored at the end
  run_consumer(
      consumer_index, walk, math.bars,
      [&](int stage, int slot, const UnitWalker& unit) {
        if (EXP_TIMESTAMPS == 2 && first_full_at == 0) first_full_at = reading();  // the first full stage
        if (EXP_SKIP_MATH) {
          math.skip_math(stage, unit.b, unit.u);
          return;
        }
        const unsigned start = EXP_PHASES ? clock() : 0;
        math.mma(stage, slot);
        const unsigned issued = EXP_PHASES ? clock() : 0;
        math.epilogue(stage, slot, unit.u);
        if (EXP_PHASES) timing.unit(start, issued, math.mma_done, clock());
      },
      [&](const UnitWalker& request, int slot) {
        if (EXP_TIMESTAMPS == 2 && first_q_at == 0) first_q_at = reading();  // the first q slot held
        math.enter_request(slot, request.b);
      });
  if (EXP_PHASES) timing.store(phases, consumer_index);
  if (EXP_TIMESTAMPS == 2 && threadIdx.x == 128) {
    stamp(5, first_q_at);
    stamp(7, first_full_at);
  }
}

}  // namespace

extern "C" __global__ void __launch_bounds__(kThreads, 1)
fp8_paged_mqa_logits_sm90(const __grid_constant__ TensorMap kv_map, const uint8_t* kv_base,
                          long long kv_block_stride, const uint8_t* q, const float* weights,
                          const int* block_tables, long long block_table_stride, const int* seq_lens,
                          long long seq_lens_stride, const int* schedule, int* schedule_rows_out, int batch_size,
                          int max_seq_len, int num_blocks, Out* out, long long out_stride) {
  if (EXP_EXIT == 1) return;
  // The next kernel may be launched now: it waits for this grid before it reads anything.
  pdl_launch_dependents();
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  uint8_t* smem = aligned_smem(smem_raw);
  const Barriers bars(smem + SharedLayout::kBarriers);
  if (threadIdx.x == 0) {
    prefetch_tensor_map(&kv_map);
    bars.init();
  }
  if (EXP_TIMESTAMPS && threadIdx.x < 8) stamp(threadIdx.x, 0);
  // No global memory is read or written before this point: with PDL this kernel may start
  // while the previous one is still writing q, seq_lens, the block table or the output.
  pdl_wait();
  // The call-level readings come from the last consumer warp, which only waits at this point:
  // thread 0 issues the first KV copy, and a reading's store can hold it back (EXP_STAMP_WALK).
  constexpr unsigned kStampThread = kThreads - 32;
  if (EXP_TIMESTAMPS && threadIdx.x == kStampThread) {
    stamp(0, reading());
    if (NUM_CONSUMERS <= 4 && EXP_TIMESTAMPS != 2) stamp(7, sm_id());
  }
  // `schedule` null: derive this CTA's range from seq_lens here (see schedule_rows); the scan's
  // scratch is stage 0's KV tile, which no copy has touched yet.
  const int* rows = schedule_rows(schedule, seq_lens, seq_lens_stride, batch_size,
                                  EXP_TIMESTAMPS || EXP_PHASES ? nullptr : schedule_rows_out, bars.schedule_rows,
                                  smem + SharedLayout::kKv);
  __syncthreads();
  if (EXP_TIMESTAMPS && EXP_STAMP_WALK < 3 && threadIdx.x == kStampThread) stamp(1, reading());
  if (EXP_TIMESTAMPS == 2 && EXP_STAMP_WALK == 3 && threadIdx.x == 0) {
    stamp(1, reading());
    stamp(6, reading());
  }
  if (EXP_TIMESTAMPS == 2 && EXP_STAMP_WALK == 4 && threadIdx.x == 0) {
    const unsigned long long first = reading(), second = reading();
    stamp(1, first);
    stamp(6, second);
  }
  if (EXP_EXIT == 2) return;

  // Each role starts its own walker after setmaxnreg, so nothing is live across the
  // register reallocation (ptxas would otherwise spill it).
  UnitWalker walk;
  const int warpgroup = threadIdx.x / 128;
  if (warpgroup == 0) {
    Registers::enter_producer();
    unsigned long long walk_at = EXP_TIMESTAMPS == 2 && EXP_STAMP_WALK == 2 ? reading() : 0;
    if (threadIdx.x < 32 * NUM_PRODUCERS) {
      walk.start(rows, seq_lens, seq_lens_stride, batch_size, max_seq_len, schedule == nullptr);
      if (EXP_TIMESTAMPS == 2 && EXP_STAMP_WALK == 1) walk_at = reading();
      producer(kv_map, kv_base, kv_block_stride, q, weights, block_tables, block_table_stride, num_blocks, walk, smem,
               reinterpret_cast<long long*>(schedule_rows_out));
      if (EXP_TIMESTAMPS && threadIdx.x == 0) stamp(2, reading());
    }
    if (EXP_TIMESTAMPS == 2 && (EXP_STAMP_WALK == 1 || EXP_STAMP_WALK == 2) && threadIdx.x == 0) stamp(6, walk_at);
  } else {
    Registers::enter_consumer();
    walk.start(rows, seq_lens, seq_lens_stride, batch_size, max_seq_len, schedule == nullptr);
    consumer(warpgroup - 1, out, out_stride, walk, smem, reinterpret_cast<long long*>(schedule_rows_out));
    if (EXP_TIMESTAMPS && threadIdx.x % 128 == 0 && (EXP_TIMESTAMPS == 1 || warpgroup == 1)) {
      stamp(2 + warpgroup, reading());
    }
  }
#if EXP_TIMESTAMPS
  __syncthreads();
  if (threadIdx.x < 8) {
    reinterpret_cast<unsigned long long*>(schedule_rows_out)[8 * blockIdx.x + threadIdx.x] = stamp_slots[threadIdx.x];
  }
#endif
}
