// Read-only paged gather through the copy engine: the same bytes as paged_gather.cu (each
// listed block's valid values, and its scale slice rounded up to a 16-byte vector), read by
// cp.async.bulk copies into a ring of shared-memory slots, the way the logits kernels' producers
// read their pages. tools/read_rate.py measured this path (4 producer warps, static contiguous
// ranges) as the fastest read of random pages on the H200 (2026-11-30).
//
// The blocks to read come as a list of (physical block id, valid tokens) pairs, in request
// order, built on the host side from the call's block tables and lengths (so the kernel does
// no table walk of its own: it is a ceiling). CTA c takes the list's contiguous range
// [c * n / grid, (c + 1) * n / grid). Warps 0-3 are producers (local block k by warp k % 4,
// into slot k % STAGES; lane 0 issues), warps 4-7 consumers (block k by warp 4 + k % 4): each
// consumer XORs every 32-bit word of the block's bytes in its slot, then frees the slot. The XOR
// of out[] over all CTAs equals the XOR of exactly the bytes read.
//
// Defines: BLOCK_SIZE, VALUE_BYTES, SCALE_BYTES (per token), STAGES (a multiple of 4).

// mbarriers and bulk copies: the logits kernels' own wrappers (sm90_primitives.cuh).
#include "sm90_primitives.cuh"

using namespace fi_sm90;

static_assert(VALUE_BYTES % 16 == 0, "a token's values must be whole 16-byte vectors");
static_assert(BLOCK_SIZE * VALUE_BYTES % 16 == 0 && BLOCK_SIZE * SCALE_BYTES % 16 == 0,
              "both regions of a block must be whole 16-byte vectors");
static_assert(STAGES % 4 == 0 && STAGES >= 4, "STAGES: a multiple of the 4 producer warps");

namespace {

constexpr int kProducers = 4;
constexpr int kThreads = 32 * 2 * kProducers;
constexpr int kValueRegion = BLOCK_SIZE * VALUE_BYTES;
constexpr int kSlotBytes = kValueRegion + BLOCK_SIZE * SCALE_BYTES;
constexpr unsigned kFullMask = 0xffffffffu;

__device__ __forceinline__ int scale_bytes_read(int tokens) { return (tokens * SCALE_BYTES + 15) / 16 * 16; }

}  // namespace

extern "C" __global__ void __launch_bounds__(kThreads, 1)
    paged_gather_copies_xor(const uint8_t* __restrict__ kv, int64_t block_stride_bytes,
                            const int2* __restrict__ blocks, int32_t num_blocks, uint32_t* __restrict__ out) {
  extern __shared__ __align__(16) uint8_t smem[];
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + STAGES * kSlotBytes);
  uint64_t* empty = full + STAGES;
  int* slot_tokens = reinterpret_cast<int*>(empty + STAGES);
  __shared__ uint32_t warp_xor[2 * kProducers];

  // Programmatic dependent launch as in the logits kernels (see paged_gather.cu): the barrier
  // setup overlaps the previous kernel, the block list is read after it has completed.
  pdl_launch_dependents();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int begin = static_cast<int>(static_cast<int64_t>(num_blocks) * blockIdx.x / gridDim.x);
  const int end = static_cast<int>(static_cast<int64_t>(num_blocks) * (blockIdx.x + 1) / gridDim.x);
  const int count = end - begin;
  if (threadIdx.x == 0) {
    for (int s = 0; s < STAGES; ++s) {
      mbar_init(&full[s], 1);
      mbar_init(&empty[s], 1);
    }
    fence_barrier_init();
  }
  pdl_wait();
  __syncthreads();

  uint32_t acc = 0;
  if (warp < kProducers) {
    // This warp's blocks k = warp + 4 * i, their (id, tokens) fetched 32 at a time, one per lane.
    int2 entry = make_int2(0, 0);
    for (int i = 0; warp + kProducers * i < count; ++i) {
      if (i % 32 == 0) {
        const int k = warp + kProducers * (i + lane);
        entry = k < count ? blocks[begin + k] : make_int2(0, 0);
      }
      const int k = warp + kProducers * i;
      const int id = __shfl_sync(kFullMask, entry.x, i % 32);
      const int tokens = __shfl_sync(kFullMask, entry.y, i % 32);
      if (lane == 0) {
        const int slot = k % STAGES;
        if (k >= STAGES) mbar_wait(&empty[slot], ((k / STAGES) - 1) & 1);
        slot_tokens[slot] = tokens;  // published to the consumer by the arrival (release)
        const uint32_t value_bytes = tokens * VALUE_BYTES, scale_bytes = scale_bytes_read(tokens);
        mbar_arrive_expect_tx(&full[slot], value_bytes + scale_bytes);
        const uint8_t* block = kv + id * block_stride_bytes;
        uint8_t* dst = smem + slot * kSlotBytes;
        bulk_load(dst, block, value_bytes, &full[slot]);
        bulk_load(dst + kValueRegion, block + kValueRegion, scale_bytes, &full[slot]);
      }
      __syncwarp();
    }
  } else {
    for (int k = warp - kProducers; k < count; k += kProducers) {
      const int slot = k % STAGES;
      mbar_wait(&full[slot], (k / STAGES) & 1);
      const int tokens = slot_tokens[slot];
      const uint4* values = reinterpret_cast<const uint4*>(smem + slot * kSlotBytes);
      const uint4* scales = reinterpret_cast<const uint4*>(smem + slot * kSlotBytes + kValueRegion);
      const int value_vectors = tokens * VALUE_BYTES / 16, scale_vectors = scale_bytes_read(tokens) / 16;
      for (int v = lane; v < value_vectors; v += 32) {
        const uint4 w = values[v];
        acc ^= w.x ^ w.y ^ w.z ^ w.w;
      }
      for (int v = lane; v < scale_vectors; v += 32) {
        const uint4 w = scales[v];
        acc ^= w.x ^ w.y ^ w.z ^ w.w;
      }
      __syncwarp();
      if (lane == 0) mbar_arrive(&empty[slot]);
    }
  }
#pragma unroll
  for (int delta = 16; delta > 0; delta /= 2) acc ^= __shfl_xor_sync(kFullMask, acc, delta);
  if (lane == 0) warp_xor[warp] = acc;
  __syncthreads();
  if (threadIdx.x == 0) {
    uint32_t total = 0;
#pragma unroll
    for (int w = 0; w < 2 * kProducers; ++w) total ^= warp_xor[w];
    out[blockIdx.x] = total;
  }
}
