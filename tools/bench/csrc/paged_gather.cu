// Read-only paged gather: the memory ceiling of a paged MQA logits call.
//
// For the same (kv_fused, block_tables, seq_lens) as an op call, it reads the KV cache bytes
// that call must read and nothing else of the pool: for request b and each of its
// ceil(seq_lens[b] / BLOCK_SIZE) block-table entries, the values of the block's valid tokens
// (tokens * VALUE_BYTES contiguous bytes at the start of the block) and their scales (the
// first tokens * SCALE_BYTES bytes of the block's scale region, rounded up to a whole 16-byte
// vector: at most 12 bytes more, in the last block of a request only). Block-table entries
// past a request's blocks are never read. Per block of BLOCK_SIZE tokens:
//
//   [ values: BLOCK_SIZE * VALUE_BYTES, token-major ][ scales: BLOCK_SIZE * SCALE_BYTES ]
//
// Everything is read with 16-byte non-coherent loads (the pool is not written while the
// kernel runs); a warp takes one block at a time and keeps up to LOADS_PER_LANE vectors per
// lane in flight. Blocks are dealt round-robin to every warp of the grid in (request, block)
// order, so the load is balanced whatever the lengths. The XOR of every 32-bit word read is
// reduced per CTA into out[blockIdx.x]: the loads cannot be dropped, and the XOR of all of
// out[] equals the XOR of exactly the bytes above (a word read twice would cancel out).
//
// Defines: BLOCK_SIZE (tokens per block), VALUE_BYTES and SCALE_BYTES (per token: fp8
// head_dim and 4, MXFP4 head_dim/2 and head_dim/32), THREADS, LOADS_PER_LANE,
// MIN_CTAS_PER_SM. The interleaved MXFP4 scale order is not modelled: the token-major order's
// scale bytes are read (the same count except in a request's last, partial block).

#include <cuda/std/cstdint>

#ifndef THREADS
#define THREADS 256
#endif
#ifndef LOADS_PER_LANE
#define LOADS_PER_LANE 16
#endif
// Without a minimum, ptxas aims at full occupancy (32 registers at 256 threads) and issues
// the loads two at a time; with 2 CTAs per SM it has up to 128 registers and issues all
// LOADS_PER_LANE loads before the first XOR (checked in the SASS, 94 registers).
#ifndef MIN_CTAS_PER_SM
#define MIN_CTAS_PER_SM 2
#endif

static_assert(VALUE_BYTES % 16 == 0, "a token's values must be whole 16-byte vectors");
static_assert(BLOCK_SIZE * VALUE_BYTES % 16 == 0 && BLOCK_SIZE * SCALE_BYTES % 16 == 0,
              "both regions of a block must be whole 16-byte vectors");
static_assert(THREADS % 32 == 0 && THREADS <= 1024, "THREADS must be whole warps");

namespace {

constexpr unsigned FULL_MASK = 0xffffffffu;
constexpr int WARPS = THREADS / 32;
constexpr int VALUE_VECTORS_PER_TOKEN = VALUE_BYTES / 16;
constexpr int SCALE_VECTORS_PER_BLOCK = BLOCK_SIZE * SCALE_BYTES / 16;
constexpr int SCALE_LOADS = (SCALE_VECTORS_PER_BLOCK + 31) / 32;

struct Words4 {
  uint32_t x, y, z, w;
};

// 16 bytes through the non-coherent (read-only) path, without allocating in L1: every byte is
// read exactly once, so caching it in L1 would only evict the block table.
__device__ __forceinline__ Words4 load_vector(const uint8_t* address) {
  Words4 v;
  asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(address));
  return v;
}

__device__ __forceinline__ uint32_t fold(const Words4& v) { return v.x ^ v.y ^ v.z ^ v.w; }

// XOR of the valid bytes of one block (see the file comment), split across the warp's lanes.
__device__ __forceinline__ uint32_t xor_block(const uint8_t* block, int tokens, int lane) {
  const uint8_t* scales = block + BLOCK_SIZE * VALUE_BYTES;
  const int scale_vectors = (tokens * SCALE_BYTES + 15) / 16;
  const int value_vectors = tokens * VALUE_VECTORS_PER_TOKEN;

  uint32_t acc = 0;
#pragma unroll 1
  for (int base = 0; base < value_vectors; base += 32 * LOADS_PER_LANE) {
    // The scales are loaded with the first batch of values, in the same basic block, so
    // their latency overlaps (folding them outside the loop lets the compiler hoist the fold
    // above the value loads, which then wait for the scale load to return).
    Words4 s[SCALE_LOADS];
#pragma unroll
    for (int k = 0; k < SCALE_LOADS; ++k) {
      const int index = k * 32 + lane;
      s[k] = base == 0 && index < scale_vectors ? load_vector(scales + 16 * index)
                                                : Words4{0, 0, 0, 0};
    }
    Words4 v[LOADS_PER_LANE];
#pragma unroll
    for (int k = 0; k < LOADS_PER_LANE; ++k) {
      const int index = base + k * 32 + lane;
      v[k] = index < value_vectors ? load_vector(block + 16 * index) : Words4{0, 0, 0, 0};
    }
#pragma unroll
    for (int k = 0; k < LOADS_PER_LANE; ++k) acc ^= fold(v[k]);
#pragma unroll
    for (int k = 0; k < SCALE_LOADS; ++k) acc ^= fold(s[k]);
  }
  return acc;
}

}  // namespace

// Requests are taken in chunks of CHUNK: the CTA scans the chunk's block counts into shared
// memory once, then every warp finds the request of each of its blocks by a binary search
// there. (The first version walked every request in every warp, about 0.5 us per request on
// the H200, which made the "ceiling" slower than the op for many short requests.)
constexpr int CHUNK = 1024;
constexpr int PER_THREAD = CHUNK / THREADS;
static_assert(CHUNK % THREADS == 0, "CHUNK must be a multiple of THREADS");

struct Located {
  int request, block_in_request, tokens;
};

extern "C" __global__ void __launch_bounds__(THREADS, MIN_CTAS_PER_SM)
    paged_gather_xor(const uint8_t* __restrict__ kv, int64_t block_stride_bytes,
                     const int32_t* __restrict__ block_tables, int64_t table_row_stride,
                     const int32_t* __restrict__ seq_lens, int64_t seq_lens_stride,
                     int32_t batch_size, uint32_t* __restrict__ out) {
  __shared__ int prefix[CHUNK + 1];  // exclusive block-count prefix of the chunk's requests
  __shared__ int lengths[CHUNK];
  __shared__ int warp_totals[WARPS];
  // Launched with programmatic dependent launch where the ops are (a launch without it
  // passes both at once): the next launch may start now, and nothing is read before the
  // previous kernel in the stream has completed, as in the logits kernels.
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  asm volatile("griddepcontrol.wait;" ::: "memory");
  const int lane = threadIdx.x % 32, warp_in_cta = threadIdx.x / 32;
  const int64_t total_warps = int64_t(gridDim.x) * WARPS;
  const int64_t warp = int64_t(blockIdx.x) * WARPS + warp_in_cta;

  uint32_t acc = 0;
  int64_t blocks_before = 0;  // blocks of all requests before the current chunk
  for (int first = 0; first < batch_size; first += CHUNK) {
    const int count = min(CHUNK, batch_size - first);
    // Thread t counts the blocks of the chunk's requests [t * PER_THREAD, (t + 1) * PER_THREAD).
    int mine = 0;
#pragma unroll
    for (int k = 0; k < PER_THREAD; ++k) {
      const int i = threadIdx.x * PER_THREAD + k;
      const int length = i < count ? max(seq_lens[int64_t(first + i) * seq_lens_stride], 0) : 0;
      if (i < count) lengths[i] = length;
      mine += (length + BLOCK_SIZE - 1) / BLOCK_SIZE;
    }
    int inclusive = mine;
#pragma unroll
    for (int delta = 1; delta < 32; delta *= 2) {
      const int below = __shfl_up_sync(FULL_MASK, inclusive, delta);
      if (lane >= delta) inclusive += below;
    }
    if (lane == 31) warp_totals[warp_in_cta] = inclusive;
    __syncthreads();
    int before = inclusive - mine;
    for (int w = 0; w < warp_in_cta; ++w) before += warp_totals[w];
#pragma unroll
    for (int k = 0; k < PER_THREAD; ++k) {
      const int i = threadIdx.x * PER_THREAD + k;
      if (i < count) {
        prefix[i] = before;
        before += (lengths[i] + BLOCK_SIZE - 1) / BLOCK_SIZE;
      }
    }
    int chunk_blocks = 0;
    for (int w = 0; w < WARPS; ++w) chunk_blocks += warp_totals[w];
    if (threadIdx.x == 0) prefix[count] = chunk_blocks;
    __syncthreads();

    // The chunk's block `local` (global index blocks_before + local) belongs to warp
    // (blocks_before + local) % total_warps, as in one round-robin over all blocks.
    auto locate = [&](int local) {
      int low = 0, high = count;  // the request r with prefix[r] <= local < prefix[r + 1]
      while (high - low > 1) {
        const int middle = (low + high) / 2;
        if (prefix[middle] <= local) low = middle; else high = middle;
      }
      const int j = local - prefix[low];
      return Located{low, j, min(BLOCK_SIZE, lengths[low] - j * BLOCK_SIZE)};
    };
    auto block_id_of = [&](const Located& at) {
      return block_tables[int64_t(first + at.request) * table_row_stride + at.block_in_request];
    };
    int64_t start = (warp - blocks_before) % total_warps;
    if (start < 0) start += total_warps;
    if (start < chunk_blocks) {
      Located at = locate(int(start));
      int64_t block_id = block_id_of(at);
      for (int64_t local = start; local < chunk_blocks; local += total_warps) {
        // The next block's id is fetched before this block's loads, off the critical path.
        const int64_t next = local + total_warps;
        Located next_at{};
        int64_t next_id = 0;
        if (next < chunk_blocks) {
          next_at = locate(int(next));
          next_id = block_id_of(next_at);
        }
        acc ^= xor_block(kv + block_id * block_stride_bytes, at.tokens, lane);
        at = next_at;
        block_id = next_id;
      }
    }
    blocks_before += chunk_blocks;
    __syncthreads();  // prefix and lengths are rewritten by the next chunk
  }

#pragma unroll
  for (int delta = 16; delta > 0; delta /= 2) acc ^= __shfl_xor_sync(FULL_MASK, acc, delta);
  if (lane == 0) warp_totals[warp_in_cta] = static_cast<int>(acc);
  __syncthreads();
  if (threadIdx.x == 0) {
    uint32_t total = 0;
#pragma unroll
    for (int w = 0; w < WARPS; ++w) total ^= static_cast<uint32_t>(warp_totals[w]);
    out[blockIdx.x] = total;
  }
}
