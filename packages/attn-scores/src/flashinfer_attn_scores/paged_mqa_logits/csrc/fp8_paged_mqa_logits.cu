// FP8 paged MQA logits for Hopper (SM90a).
//
//   out[b*NEXT_N + t, p] = scale[p] * sum_h w[b*NEXT_N + t, h] * relu(q[b, t, h, :] . k[p, :])
//
// One persistent CTA per SM walks a contiguous run of 64-token work units (request, unit)
// given by the schedule rows [blockIdx.x, blockIdx.x + 1]. Roles (warp specialisation):
//
//   warpgroup 0, warp 0  producer: per request, copies q and the weights into a q slot
//                        (generic stores in the 128B/64B/32B swizzle WGMMA expects); per unit,
//                        TMA-loads the 64 KV rows (1 or 2 boxes of min(64, BLOCK_SIZE) rows)
//                        and their fp32 scales into a pipeline stage.
//   warpgroups 1..NC     consumers: unit k goes to consumer k % NC. WGMMA m64nNk32 with the
//                        64 KV tokens as M and the NEXT_N*NUM_HEADS query heads as N, then the
//                        epilogue in registers: ReLU, weight, sum over heads, times the token
//                        scale, store.
//
// The WGMMA puts tokens in M so one pass over the KV serves every draft slot (N = NEXT_N * H).
//
// Shared memory (all tile bases 1024-byte aligned for the swizzle):
//   kv tiles   [STAGES][HEAD_DIM / CW][64 rows][CW bytes]        CW = swizzle row width
//   q slots    [2][HEAD_DIM / CW][N rows][CW bytes]
//   weights    [2][N] fp32
//   scales     [STAGES][64] fp32
//   barriers   full[STAGES], empty[STAGES], q_full[2], q_empty[2]
//
// Specialisation constants (defines): BLOCK_SIZE, HEAD_DIM, NUM_HEADS, NEXT_N, NUM_STAGES,
// NUM_CONSUMERS, OUT_FP16, EPI_FP16, ACC_FP16.

#include <cuda_fp16.h>
#include <cuda/std/cstdint>

#include "sm90_primitives.cuh"
#include "wgmma_fp8.cuh"

namespace {

using namespace fi_sm90;

constexpr int kTile = 64;  // KV tokens per work unit = WGMMA M
constexpr int kN = NEXT_N * NUM_HEADS;
constexpr int kSwizzle = HEAD_DIM % 128 == 0 ? 128 : HEAD_DIM % 64 == 0 ? 64 : 32;
constexpr int kChunks = HEAD_DIM / kSwizzle;
constexpr int kKStepsPerChunk = kSwizzle / 32;
constexpr int kBoxRows = BLOCK_SIZE < kTile ? BLOCK_SIZE : kTile;
constexpr int kBoxesPerTile = kTile / kBoxRows;
constexpr int kBlockBytes = BLOCK_SIZE * (HEAD_DIM + 4);
constexpr int kKvTileBytes = kTile * HEAD_DIM;
constexpr int kQSlotBytes = kN * HEAD_DIM;
constexpr int kProducerRegs = 56;
// Registers left per consumer thread: 65536 = 128 * (kProducerRegs + NUM_CONSUMERS * kConsumerRegs).
constexpr int kConsumerRegs = NUM_CONSUMERS == 1 ? 240 : NUM_CONSUMERS == 2 ? 224 : NUM_CONSUMERS == 3 ? 144 : 104;
static_assert(NUM_CONSUMERS >= 1 && NUM_CONSUMERS <= 4, "1 to 4 consumer warpgroups");

// Measurement variants (never set in production): EXP_SKIP_MATH=1 drops the MMA and the
// epilogue (consumers only release stages and write the token scale), timing the load pipeline.
#ifndef EXP_SKIP_MATH
#define EXP_SKIP_MATH 0
#endif
// Producer warps in warpgroup 0; unit k is issued by warp k % NUM_PRODUCERS.
#ifndef NUM_PRODUCERS
#define NUM_PRODUCERS 1
#endif
static_assert(NUM_PRODUCERS >= 1 && NUM_PRODUCERS <= 4, "1 to 4 producer warps");
constexpr int kThreads = 128 * (NUM_CONSUMERS + 1);

static_assert(HEAD_DIM % 32 == 0, "head_dim must be a multiple of 32");
static_assert(kN % 8 == 0 && kN >= 8 && kN <= 256, "next_n * num_heads must be a multiple of 8 in [8, 256]");
static_assert(NUM_HEADS % 4 == 0, "num_heads must be a multiple of 4");
static_assert(kTile % kBoxRows == 0 && BLOCK_SIZE % kBoxRows == 0, "block size must be 32, 64 or 128");

#if ACC_FP16
using AccReg = uint32_t;  // packed half2
#else
using AccReg = float;
#endif
#if EPI_FP16
using Epi = __half;
#else
using Epi = float;
#endif
#if OUT_FP16
using Out = __half;
#else
using Out = float;
#endif
using Mma = WgmmaFp8<kN, !ACC_FP16>;

// Opaque 128-byte CUtensorMap, passed by value as a __grid_constant__ parameter.
struct alignas(64) TensorMap {
  uint64_t opaque[16];
};

struct SharedLayout {
  static constexpr int kKv = 0;
  static constexpr int kQ = kKv + NUM_STAGES * kKvTileBytes;
  static constexpr int kWeights = kQ + 2 * kQSlotBytes;
  static constexpr int kScales = kWeights + 2 * kN * 4;
  static constexpr int kBarriers = (kScales + NUM_STAGES * kTile * 4 + 7) / 8 * 8;
  static constexpr int kBytes = kBarriers + (2 * NUM_STAGES + 4) * 8;
};

// Byte offset of (row, 16-byte unit) in a swizzled K-major tile whose rows are kSwizzle bytes:
// the TMA/WGMMA swizzle XORs address bits [4, 4+log2(kSwizzle/16)) with bits [7, ...).
__device__ __forceinline__ uint32_t swizzled_offset(uint32_t row, uint32_t unit) {
  const uint32_t linear = row * kSwizzle + unit * 16;
  return linear ^ (((linear >> 7) & (kSwizzle / 16 - 1)) << 4);
}

__device__ __forceinline__ int units_of(int len) { return (len + kTile - 1) / kTile; }

// Walks this CTA's work units (request, unit) in order, skipping zero-length requests.
// The range is [schedule row blockIdx.x, schedule row blockIdx.x + 1).
struct UnitWalker {
  const int* seq_lens;
  long long seq_lens_stride;
  int batch_size, end_b, end_u;
  int b, u, len, units;

  __device__ void start(const int* schedule, const int* lens, long long stride, int batch) {
    seq_lens = lens;
    seq_lens_stride = stride;
    batch_size = batch;
    b = schedule[2 * blockIdx.x];
    u = schedule[2 * blockIdx.x + 1];
    end_b = min(schedule[2 * blockIdx.x + 2], batch_size);
    end_u = schedule[2 * blockIdx.x + 3];
    load_request();
    while (units == 0 && b < end_b) {
      ++b;
      u = 0;
      load_request();
    }
  }
  __device__ void load_request() {
    len = b < batch_size && (b < end_b || end_u > 0) ? seq_lens[b * seq_lens_stride] : 0;
    units = units_of(len);
  }
  __device__ bool valid() const { return (b < end_b || (b == end_b && u < end_u)) && u < units; }
  __device__ void next() {
    if (++u < units) return;
    u = 0;
    do {
      ++b;
      load_request();
    } while (units == 0 && b < end_b);
  }
};

__device__ __forceinline__ Epi to_epi(float x) {
#if EPI_FP16
  return __float2half_rn(x);
#else
  return x;
#endif
}

__device__ __forceinline__ Epi relu(Epi x) {
#if EPI_FP16
  return __hmax(x, __float2half_rn(0.f));
#else
  return fmaxf(x, 0.f);
#endif
}

__device__ __forceinline__ Out to_out(float x) {
#if OUT_FP16
  return __float2half_rn(x);
#else
  return x;
#endif
}

// The two accumulator values (row r0 + 8*i, columns c, c+1) of 8-column group j.
__device__ __forceinline__ void acc_pair(const AccReg (&acc)[Mma::kRegs], int j, int i, Epi& x0, Epi& x1) {
#if ACC_FP16
  const __half2 h = *reinterpret_cast<const __half2*>(&acc[2 * j + i]);
#if EPI_FP16
  x0 = __low2half(h);
  x1 = __high2half(h);
#else
  x0 = __low2float(h);
  x1 = __high2float(h);
#endif
#else
  x0 = to_epi(acc[4 * j + 2 * i]);
  x1 = to_epi(acc[4 * j + 2 * i + 1]);
#endif
}

__device__ __forceinline__ Epi shfl_xor(Epi v, int mask) {
  return __shfl_xor_sync(0xffffffffu, v, mask);
}

__device__ __forceinline__ void producer(const TensorMap& kv_map, const uint8_t* kv_base,
                                         const uint8_t* q, const float* weights,
                                         const int* block_tables, long long block_table_stride,
                                         UnitWalker walk, uint8_t* smem) {
  const int lane = threadIdx.x % 32;
  const int producer_index = threadIdx.x / 32;
  uint8_t* kv_tiles = smem + SharedLayout::kKv;
  uint8_t* q_slots = smem + SharedLayout::kQ;
  float* weight_slots = reinterpret_cast<float*>(smem + SharedLayout::kWeights);
  float* scales = reinterpret_cast<float*>(smem + SharedLayout::kScales);
  uint64_t* bars = reinterpret_cast<uint64_t*>(smem + SharedLayout::kBarriers);
  uint64_t* full = bars;
  uint64_t* empty = bars + NUM_STAGES;
  uint64_t* q_full = bars + 2 * NUM_STAGES;
  uint64_t* q_empty = q_full + 2;

  int request_ordinal = -1, current_b = -1;
  // Block-table entries, one per lane: `table_entry` covers blocks [table_base, table_base + 32)
  // of the current request, `table_next` the following 32, loaded one batch ahead so the
  // producer never waits on a table read in steady state.
  int table_base = 0, table_entry = 0, table_next = 0, table_valid = 0;
  const int* table_row = nullptr;
  int blocks_in_request = 0;
  auto table_load = [&](int block) {
    return block < blocks_in_request ? table_row[block] : 0;
  };

  for (int k = 0; walk.valid(); walk.next(), ++k) {
    if (walk.b != current_b) {
      current_b = walk.b;
      ++request_ordinal;
      if (producer_index == 0) {  // one warp stages q and the weights of each request
        const int slot = request_ordinal & 1;
        if (request_ordinal >= 2) mbar_wait(&q_empty[slot], ((request_ordinal >> 1) - 1) & 1);
        // q rows of request b: [b*N, b*N + N), each HEAD_DIM bytes, stored chunk-major and swizzled.
        const uint4* q_src = reinterpret_cast<const uint4*>(q + static_cast<long long>(current_b) * kQSlotBytes);
        uint8_t* q_dst = q_slots + slot * kQSlotBytes;
        constexpr int kUnitsPerRow = HEAD_DIM / 16;
        constexpr int kUnitsPerChunkRow = kSwizzle / 16;
#pragma unroll 4
        for (int idx = lane; idx < kN * kUnitsPerRow; idx += 32) {
          const int row = idx / kUnitsPerRow, unit = idx % kUnitsPerRow;
          const int chunk = unit / kUnitsPerChunkRow, unit_in_chunk = unit % kUnitsPerChunkRow;
          *reinterpret_cast<uint4*>(q_dst + chunk * kN * kSwizzle + swizzled_offset(row, unit_in_chunk)) = q_src[idx];
        }
        const float* w_src = weights + static_cast<long long>(current_b) * kN;
        for (int idx = lane; idx < kN; idx += 32) weight_slots[slot * kN + idx] = w_src[idx];
        fence_proxy_async_smem();
        mbar_arrive(&q_full[slot]);  // all 32 lanes arrive
      }
      table_row = block_tables + static_cast<long long>(current_b) * block_table_stride;
      blocks_in_request = (walk.len + BLOCK_SIZE - 1) / BLOCK_SIZE;
      table_valid = 0;
    }

    if (k % NUM_PRODUCERS != producer_index) continue;
    const int stage = k % NUM_STAGES;
    if (k >= NUM_STAGES) mbar_wait(&empty[stage], ((k / NUM_STAGES) - 1) & 1);

    int block_ids[kBoxesPerTile];
    int boxes = 0;
#pragma unroll
    for (int s = 0; s < kBoxesPerTile; ++s) {
      const int token = walk.u * kTile + s * kBoxRows;
      block_ids[s] = -1;
      if (token < walk.len) {
        const int block = token / BLOCK_SIZE;
        if (!table_valid || block < table_base || block >= table_base + 32) {
          if (table_valid && block == table_base + 32) {
            table_entry = table_next;  // sequential walk: the prefetched batch
          } else {
            table_entry = table_load(block + lane);
          }
          table_base = block;
          table_valid = 1;
          table_next = table_load(table_base + 32 + lane);
        }
        block_ids[s] = __shfl_sync(0xffffffffu, table_entry, block - table_base);
        ++boxes;
      }
    }
    if (lane == 0) {
      mbar_arrive_expect_tx(&full[stage], boxes * kBoxRows * (HEAD_DIM + 4));
#pragma unroll
      for (int s = 0; s < kBoxesPerTile; ++s) {
        if (block_ids[s] < 0) continue;
        const int row_in_block = (walk.u * kTile + s * kBoxRows) % BLOCK_SIZE;
#pragma unroll
        for (int c = 0; c < kChunks; ++c) {
          uint8_t* dst = kv_tiles + stage * kKvTileBytes + c * kTile * kSwizzle + s * kBoxRows * kSwizzle;
          tma_load_3d(dst, &kv_map, &full[stage], c * kSwizzle, row_in_block, block_ids[s]);
        }
        const uint8_t* scale_src = kv_base + static_cast<long long>(block_ids[s]) * kBlockBytes +
                                   BLOCK_SIZE * HEAD_DIM + row_in_block * 4;
        bulk_load(scales + stage * kTile + s * kBoxRows, scale_src, kBoxRows * 4, &full[stage]);
      }
    }
    __syncwarp();
  }
}

__device__ __forceinline__ void consumer(int consumer_index, Out* out, long long out_stride,
                                         UnitWalker walk, uint8_t* smem) {
  const int warp_in_group = (threadIdx.x / 32) % 4;
  const int lane = threadIdx.x % 32;
  const int quad = lane % 4;               // which column pair of each 8-column group
  const int row0 = 16 * warp_in_group + lane / 4;  // this thread's rows: row0 and row0 + 8
  uint8_t* kv_tiles = smem + SharedLayout::kKv;
  uint8_t* q_slots = smem + SharedLayout::kQ;
  const float* weight_slots = reinterpret_cast<const float*>(smem + SharedLayout::kWeights);
  const float* scales = reinterpret_cast<const float*>(smem + SharedLayout::kScales);
  uint64_t* bars = reinterpret_cast<uint64_t*>(smem + SharedLayout::kBarriers);
  uint64_t* full = bars;
  uint64_t* empty = bars + NUM_STAGES;
  uint64_t* q_full = bars + 2 * NUM_STAGES;
  uint64_t* q_empty = q_full + 2;

  AccReg acc[Mma::kRegs];
  int request_ordinal = -1, current_b = -1;

  for (int k = 0; walk.valid(); walk.next(), ++k) {
    if (walk.b != current_b) {
      if (request_ordinal >= 0) {
        __syncwarp();
        if (lane == 0) mbar_arrive(&q_empty[request_ordinal & 1]);
      }
      current_b = walk.b;
      ++request_ordinal;
      // Wait even when this consumer gets no unit of the request: it keeps the q-slot
      // arrivals of the two consumers in the same phase.
      mbar_wait(&q_full[request_ordinal & 1], (request_ordinal >> 1) & 1);
    }
    if (k % NUM_CONSUMERS != consumer_index) continue;

    const int stage = k % NUM_STAGES;
    const int slot = request_ordinal & 1;
    mbar_wait(&full[stage], (k / NUM_STAGES) & 1);

    if (EXP_SKIP_MATH) {
      const float scale = scales[stage * kTile + row0];
      __syncwarp();
      if (lane == 0) mbar_arrive(&empty[stage]);
      if (quad == 0) out[static_cast<long long>(walk.b) * NEXT_N * out_stride + walk.u * kTile + row0] = to_out(scale);
      continue;
    }
    const uint8_t* a_tile = kv_tiles + stage * kKvTileBytes;
    const uint8_t* b_tile = q_slots + slot * kQSlotBytes;
#pragma unroll
    for (int i = 0; i < Mma::kRegs; ++i) reg_fence(acc[i]);
    wgmma_fence();
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
#pragma unroll
      for (int ks = 0; ks < kKStepsPerChunk; ++ks) {
        const uint64_t desc_a = smem_desc<kSwizzle>(a_tile + c * kTile * kSwizzle + ks * 32);
        const uint64_t desc_b = smem_desc<kSwizzle>(b_tile + c * kN * kSwizzle + ks * 32);
        Mma::mma(acc, desc_a, desc_b, (c | ks) != 0);
      }
    }
    wgmma_commit();
    wgmma_wait<0>();
#pragma unroll
    for (int i = 0; i < Mma::kRegs; ++i) reg_fence(acc[i]);

    const float scale0 = scales[stage * kTile + row0];
    const float scale1 = scales[stage * kTile + row0 + 8];
    __syncwarp();
    if (lane == 0) mbar_arrive(&empty[stage]);

    // Epilogue: partial[t][i] = sum over this thread's columns of slot t of w * relu(acc).
    // Columns of slot t are [t*H, (t+1)*H); H % 4 == 0, so each half of an 8-column group
    // (quads 0-1 and 2-3) belongs to one slot, known at compile time after unrolling.
    Epi partial[NEXT_N][2];
#pragma unroll
    for (int t = 0; t < NEXT_N; ++t) partial[t][0] = partial[t][1] = to_epi(0.f);
    const float* w = weight_slots + slot * kN;
#pragma unroll
    for (int j = 0; j < kN / 8; ++j) {
      const float2 wf = *reinterpret_cast<const float2*>(w + 8 * j + 2 * quad);
      const Epi w0 = to_epi(wf.x), w1 = to_epi(wf.y);
      const int t_lo = (8 * j) / NUM_HEADS, t_hi = (8 * j + 4) / NUM_HEADS;
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        Epi x0, x1;
        acc_pair(acc, j, i, x0, x1);
        const Epi v = w0 * relu(x0) + w1 * relu(x1);
        if (t_lo == t_hi) {
          partial[t_lo][i] += v;
        } else {
          const Epi zero = to_epi(0.f);
          partial[t_lo][i] += quad < 2 ? v : zero;
          partial[t_hi][i] += quad < 2 ? zero : v;
        }
      }
    }
    const long long column = static_cast<long long>(walk.u) * kTile + row0;
    Out* out_request = out + static_cast<long long>(walk.b) * NEXT_N * out_stride + column;
#pragma unroll
    for (int t = 0; t < NEXT_N; ++t) {
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        partial[t][i] += shfl_xor(partial[t][i], 1);
        partial[t][i] += shfl_xor(partial[t][i], 2);
      }
      if ((t & 3) == quad) {
        out_request[t * out_stride] = to_out(static_cast<float>(partial[t][0]) * scale0);
        out_request[t * out_stride + 8] = to_out(static_cast<float>(partial[t][1]) * scale1);
      }
    }
  }
  if (request_ordinal >= 0) {
    __syncwarp();
    if (lane == 0) mbar_arrive(&q_empty[request_ordinal & 1]);
  }
}

}  // namespace

extern "C" __global__ void __launch_bounds__(kThreads, 1)
fp8_paged_mqa_logits_sm90(const __grid_constant__ TensorMap kv_map, const uint8_t* kv_base,
                          const uint8_t* q, const float* weights, const int* block_tables,
                          long long block_table_stride, const int* seq_lens, long long seq_lens_stride,
                          const int* schedule, int batch_size, Out* out, long long out_stride) {
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  uint8_t* smem = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  uint64_t* bars = reinterpret_cast<uint64_t*>(smem + SharedLayout::kBarriers);

  if (threadIdx.x == 0) {
    prefetch_tensor_map(&kv_map);
    for (int s = 0; s < NUM_STAGES; ++s) {
      mbar_init(&bars[s], 1);                      // full: producer's expect_tx arrival
      mbar_init(&bars[NUM_STAGES + s], 4);         // empty: one arrival per consumer warp
    }
    for (int s = 0; s < 2; ++s) {
      mbar_init(&bars[2 * NUM_STAGES + s], 32);                     // q_full: producer warp
      mbar_init(&bars[2 * NUM_STAGES + 2 + s], 4 * NUM_CONSUMERS);  // q_empty: consumer warps
    }
    fence_barrier_init();
  }
  __syncthreads();

  // Each role starts its own walker after setmaxnreg, so nothing is live across the
  // register reallocation (ptxas would otherwise spill it).
  UnitWalker walk;
  const int warpgroup = threadIdx.x / 128;
  if (warpgroup == 0) {
    regs_decrease<kProducerRegs>();
    if (threadIdx.x < 32 * NUM_PRODUCERS) {
      walk.start(schedule, seq_lens, seq_lens_stride, batch_size);
      producer(kv_map, kv_base, q, weights, block_tables, block_table_stride, walk, smem);
    }
  } else {
    regs_increase<kConsumerRegs>();
    walk.start(schedule, seq_lens, seq_lens_stride, batch_size);
    consumer(warpgroup - 1, out, out_stride, walk, smem);
  }
}
