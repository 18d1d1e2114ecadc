// Read bandwidth of a paged gather on one SM90 GPU, by load path. A measurement kernel for
// tools/read_rate.py, not part of any package.
//
// Every mode reads the pages listed in `pages` (indices into a pool of `page_stride`-byte
// pages), PAGE_BYTES from the start of each, and nothing else. Who reads which page:
//   static (counter == nullptr): CTA c takes the contiguous range [c * n / grid, (c + 1) * n /
//     grid) of the list, as the logits schedule gives each CTA a contiguous run of units, and
//     splits it among its readers (warps, or producer warps) round-robin;
//   dynamic: every reader claims the next CHUNK pages of the list with an atomicAdd on
//     `*counter` (zero before the launch), so fast SMs take more pages than slow ones.
//
//   MODE 0, LDG: every warp reads its pages with 16-byte non-coherent loads, STEP pages at a
//     time, every load of a step issued before the first use.
//   MODE 1, BULK: PRODUCERS warps, in each one lane, copy whole pages with cp.async.bulk into
//     shared-memory slots, `stages / PRODUCERS` of them per warp, used in turn; `first_bytes`
//     > 0 splits each page into two copies at that offset (the logits kernels copy values and
//     scales separately). A slot is reused as soon as its previous copy has landed: no
//     consumer, so this is the copy engine's own rate.
//   MODE 2, TMA: as BULK, but the first BOX_ROWS * 128 bytes of each page arrive as tiled
//     3-D boxes (128 bytes x BOX_ROWS rows x 1 page, 128-byte swizzle), PAGE_BYTES / (132 *
//     BOX_ROWS) of them, and the rest (the scales) as one bulk copy: the FP8 producers' copies.
//
// Checks that the reads happened: LDG XORs every word it reads into sink[thread]; BULK and TMA
// XOR the first word of every page (read from its slot once the copy has landed; by the
// consumers when there are any).
//
// CONSUMERS > 0 adds the consumer hop of the logits kernels (see consume_pages), and WRITES
// their output stores in one of several forms (see store_outputs and write_chunks).
//
// Defines: MODE, PAGE_BYTES, STEP (LDG: pages per warp in flight), MIN_CTAS (LDG launch
// bounds), PRODUCERS, BOX_ROWS, CHUNK (pages per claim, dynamic only), CONSUMERS, WRITES,
// WRITE_EVERY, OUT_ORDER, OUT_CHUNK, OUT_RING, EPOCH_NS.
#include <cuda_fp16.h>

#include "sm90_primitives.cuh"

using namespace fi_sm90;

struct alignas(64) TensorMap {
  uint64_t opaque[16];
};

#ifndef MIN_CTAS
#define MIN_CTAS 2
#endif
#ifndef PRODUCERS
#define PRODUCERS 1
#endif
#ifndef BOX_ROWS
#define BOX_ROWS 64
#endif
#ifndef CHUNK
#define CHUNK 8
#endif
#ifndef STEP
#define STEP 1
#endif

#ifndef CONSUMERS
#define CONSUMERS 0
#endif
#ifndef WRITES
#define WRITES 0
#endif
// WRITE_EVERY = n (WRITES 1-7): only every n-th page of the list stores its floats.
#ifndef WRITE_EVERY
#define WRITE_EVERY 1
#endif
#ifndef OUT_RING
#define OUT_RING 2
#endif
#ifndef EPOCH_NS
#define EPOCH_NS 10000
#endif
#ifndef OUT_CHUNK
#define OUT_CHUNK 16
#endif
constexpr int kThreads = MODE == 0 ? 256 : 32 * PRODUCERS + 128 * CONSUMERS + (WRITES >= 8 ? 32 : 0);
constexpr int kWriterWarp = PRODUCERS + 4 * CONSUMERS;
static_assert(PAGE_BYTES % 16 == 0, "pages are whole 16-byte vectors");
static_assert(CONSUMERS == 0 || PRODUCERS == 4, "the consumer warpgroups follow one warpgroup of 4 producer warps");
// A slot holds one page; TMA slots start on 1024 bytes (the 128-byte swizzle's period).
constexpr int kSlotBytes = MODE == 2 ? (PAGE_BYTES + 1023) / 1024 * 1024 : PAGE_BYTES;

__device__ __forceinline__ void cta_range(int n, int& begin, int& end) {
  begin = static_cast<int>(static_cast<long long>(n) * blockIdx.x / gridDim.x);
  end = static_cast<int>(static_cast<long long>(n) * (blockIdx.x + 1) / gridDim.x);
}

// The pages of one reader (a warp), in order: `next()` gives each lane the reader's next page
// (all lanes the same one), or -1 when the list is exhausted. Page ids are fetched a window
// at a time (32 static, CHUNK dynamic), one per lane.
struct PageSource {
  const int* pages;
  int* counter;
  int begin, end, reader, readers;  // static: pages begin + reader + readers * j
  int ordinal = 0, window_first = -1, window_count = 0, page_of_lane = 0;
  int claimed = -1, claimed_page = 0;  // dynamic: the claim ahead, and this lane's page id of it

  __device__ void claim() {
    const int lane = threadIdx.x % 32;
    int first = 0;
    if (lane == 0) first = atomicAdd(counter, CHUNK);
    claimed = __shfl_sync(0xffffffffu, first, 0);
    claimed_page = lane < CHUNK && claimed + lane < end ? pages[claimed + lane] : 0;
  }

  __device__ int next() {
    const int lane = threadIdx.x % 32;
    if (ordinal == window_count) {  // refill: 32 more page ids
      ordinal = 0;
      if (counter == nullptr) {
        window_first = window_first < 0 ? begin + reader : window_first + 32 * readers;
        const int index = window_first + lane * readers;
        window_count = min(32, max(0, (end - window_first + readers - 1) / readers));
        page_of_lane = index < end ? pages[index] : 0;
      } else {
        // CHUNK consecutive pages of the list per claim (lane 0's atomicAdd), one claim ahead:
        // the ids of the window used now were loaded at the previous refill.
        static_assert(CHUNK >= 1 && CHUNK <= 32, "CHUNK: 1 to 32 pages per claim");
        if (claimed < 0) claim();
        window_count = min(CHUNK, max(0, end - claimed));
        page_of_lane = claimed_page;
        claim();
      }
      if (window_count == 0) return -1;
    }
    return __shfl_sync(0xffffffffu, page_of_lane, ordinal++);
  }
};

__device__ __forceinline__ uint4 load_nc(const uint8_t* address) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(address));
  return v;
}

__device__ __forceinline__ uint64_t l2_policy_evict_last() {
  uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(policy));
  return policy;
}

__device__ __forceinline__ uint64_t l2_policy_evict_first() {
  uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
  return policy;
}

// LDG: a warp reads its pages STEP at a time, each page in PARTS parts of at most 17 loads per
// lane, every load of a step issued before the first use.
__device__ void ldg_pages(const uint8_t* pool, long long page_stride, PageSource& source, uint32_t* sink) {
  constexpr int kVectors = PAGE_BYTES / 16;
  constexpr int kParts = (kVectors + 32 * 17 - 1) / (32 * 17);
  constexpr int kPartVectors = kVectors / kParts;
  constexpr int kLoads = (kPartVectors + 31) / 32;
  static_assert(kVectors % kParts == 0, "pages split into equal parts");
  const int lane = threadIdx.x % 32;
  uint32_t acc = 0;
  for (bool more = true; more;) {
    const uint8_t* part_base[STEP];
#pragma unroll
    for (int p = 0; p < STEP; ++p) {
      const int page = more ? source.next() : -1;
      more = page >= 0;
      part_base[p] = more ? pool + page * page_stride : nullptr;
    }
#pragma unroll 1
    for (int part = 0; part < kParts; ++part) {
      uint4 v[STEP][kLoads];
#pragma unroll
      for (int p = 0; p < STEP; ++p) {
#pragma unroll
        for (int i = 0; i < kLoads; ++i) {
          const int vector = i * 32 + lane;
          v[p][i] = make_uint4(0, 0, 0, 0);
          if (part_base[p] != nullptr && vector < kPartVectors) {
            v[p][i] = load_nc(part_base[p] + (part * kPartVectors + vector) * 16);
          }
        }
      }
#pragma unroll
      for (int p = 0; p < STEP; ++p) {
#pragma unroll
        for (int i = 0; i < kLoads; ++i) acc ^= v[p][i].x ^ v[p][i].y ^ v[p][i].z ^ v[p][i].w;
      }
    }
  }
  sink[blockIdx.x * kThreads + threadIdx.x] = acc;
}

// One producer warp's copies (BULK / TMA): lane 0 issues; the warp's slots are
// [producer * per_warp, (producer + 1) * per_warp), used in turn.
__device__ void copy_pages(const uint8_t* pool, long long page_stride, PageSource& source, int stages,
                           int first_bytes, const TensorMap* map, uint8_t* slots, uint64_t* full, uint64_t* empty,
                           uint32_t* sink) {
  constexpr int kBoxes = MODE == 2 ? PAGE_BYTES / (132 * BOX_ROWS) : 0;
  constexpr int kValueBytes = kBoxes * BOX_ROWS * 128;
  const int producer = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int per_warp = stages / PRODUCERS;
  auto slot_of = [&](int k) { return producer * per_warp + k % per_warp; };
  auto slot_bytes = [&](int slot) { return slots + static_cast<long long>(slot) * kSlotBytes; };
  uint32_t acc = 0;
  int k = 0;
  for (int page = source.next(); page >= 0; page = source.next(), ++k) {
    if (lane == 0) {
      const int slot = slot_of(k);
      uint8_t* dst = slot_bytes(slot);
      if (k >= per_warp) {
        if (CONSUMERS > 0) {
          mbar_wait(&empty[slot], ((k / per_warp) - 1) & 1);
        } else {
          mbar_wait(&full[slot], ((k / per_warp) - 1) & 1);
          acc ^= *reinterpret_cast<const uint32_t*>(dst);
        }
      }
      mbar_arrive_expect_tx(&full[slot], PAGE_BYTES);
      const uint8_t* src = pool + page * page_stride;
      if (MODE == 2 && WRITES == 5) {
        const uint64_t policy = l2_policy_evict_first();
#pragma unroll
        for (int b = 0; b < kBoxes; ++b) {
          asm volatile(
              "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.L2::cache_hint"
              " [%0], [%1, {%3, %4, %5}], [%2], %6;" ::"r"(smem_addr(dst + b * BOX_ROWS * 128)),
              "l"(map), "r"(smem_addr(&full[slot])), "r"(0), "r"(b * BOX_ROWS), "r"(page), "l"(policy)
              : "memory");
        }
        asm volatile(
            "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], %4;"
            ::"r"(smem_addr(dst + kValueBytes)), "l"(src + kValueBytes), "r"(PAGE_BYTES - kValueBytes),
            "r"(smem_addr(&full[slot])), "l"(policy) : "memory");
      } else if (MODE == 2) {
#pragma unroll
        for (int b = 0; b < kBoxes; ++b) {
          tma_load_3d(dst + b * BOX_ROWS * 128, map, &full[slot], 0, b * BOX_ROWS, page);
        }
        bulk_load(dst + kValueBytes, src + kValueBytes, PAGE_BYTES - kValueBytes, &full[slot]);
      } else if (first_bytes > 0) {
        bulk_load(dst, src, first_bytes, &full[slot]);
        bulk_load(dst + first_bytes, src + first_bytes, PAGE_BYTES - first_bytes, &full[slot]);
      } else {
        bulk_load(dst, src, PAGE_BYTES, &full[slot]);
      }
    }
    __syncwarp();
  }
  if (lane == 0 && CONSUMERS == 0) {  // the copies still in flight
    for (int j = k > per_warp ? k - per_warp : 0; j < k; ++j) {
      mbar_wait(&full[slot_of(j)], (j / per_warp) & 1);
      acc ^= *reinterpret_cast<const uint32_t*>(slot_bytes(slot_of(j)));
    }
  }
  sink[blockIdx.x * kThreads + threadIdx.x] = lane == 0 ? acc : 0;
}

// How the consumers store their 64 floats per page (WRITES):
//   1 st.global per value (lanes 0, 4, ..., rows row0 and row0 + 8), as the logits kernel;
//   2 the same with st.global.cs (streaming);
//   3 the same with an L2 evict_last policy (outputs stay in L2 while the pages stream by);
//   4 each warp's 16 values staged in shared memory and written by one 64-byte bulk copy;
//   5 as 3, and the page copies carry an L2 evict_first policy;
//   6 as 1, but into a 128 KB ring (page k's floats at k % 512): the stores stay in L2;
//   7 64 halfs instead of floats, 16 lanes per warp storing one each (whole 32-byte sectors);
//   8 every page's floats go to a shared-memory chunk of OUT_CHUNK pages (OUT_RING of them,
//     used in turn), and a writer warp stores each full chunk with one bulk copy;
//   9 as 8, but the writer waits for the next multiple of EPOCH_NS on the global timer and
//     then stores every full chunk: all SMs write in bursts at the same instants.
__device__ __forceinline__ void store_outputs(float* out_page, const float* scales, int row0, int lane,
                                              float* stage_out) {
  const float v0 = scales[row0 % 32], v1 = scales[(row0 + 8) % 32];
  if (WRITES == 4) {
    // Rows row0 and row0 + 8 of this warp's 16 (row0 % 16 = lane / 4): one 64-byte copy.
    asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");  // the previous copy has read
    __syncwarp();
    if (lane % 4 == 0) {
      stage_out[lane / 4] = v0;
      stage_out[lane / 4 + 8] = v1;
    }
    fence_proxy_async_smem();
    __syncwarp();
    if (lane == 0) {
      asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], 64;"
                   ::"l"(out_page + row0 - lane / 4), "r"(smem_addr(stage_out)) : "memory");
      asm volatile("cp.async.bulk.commit_group;" ::: "memory");
    }
    return;
  }
  if (WRITES == 7) {  // lane l < 16 stores row 16 * warp + l (held by lane 4 * (l % 8), as v0 or v1)
    const float a = __shfl_sync(0xffffffffu, v0, 4 * (lane % 8)), b = __shfl_sync(0xffffffffu, v1, 4 * (lane % 8));
    if (lane < 16) reinterpret_cast<__half*>(out_page)[row0 - lane / 4 + lane] = __float2half(lane < 8 ? a : b);
    return;
  }
  if (lane % 4 != 0) return;
  if (WRITES == 2) {
    __stcs(out_page + row0, v0);
    __stcs(out_page + row0 + 8, v1);
  } else if (WRITES == 3 || WRITES == 5) {
    const uint64_t policy = l2_policy_evict_last();
    asm volatile("st.global.L2::cache_hint.f32 [%0], %1, %2;" ::"l"(out_page + row0), "f"(v0), "l"(policy) : "memory");
    asm volatile("st.global.L2::cache_hint.f32 [%0], %1, %2;" ::"l"(out_page + row0 + 8), "f"(v1), "l"(policy)
                 : "memory");
  } else {
    out_page[row0] = v0;
    out_page[row0 + 8] = v1;
  }
}

// CONSUMERS > 0 (static ranges only): consumer warpgroup c takes the CTA's pages k = c, c +
// CONSUMERS, ... in order, as the logits consumers take units: it waits for the page's copy,
// (WRITES) stores 64 floats of it as the logits kernel at next_n 1 stores its 64 outputs per
// unit (lanes 0, 4, ... of each warp, two rows each), and each warp's lane 0 releases the slot.
// Where page k of this CTA's range stores its floats (in pages of 64 floats): OUT_ORDER 0 at
// begin + k (each CTA writes its own contiguous region, as the logits kernel does); 1 at
// k * grid + CTA (the CTAs' current pages are neighbours); 2 the same for groups of 16 pages.
// 1 and 2 assume equal range lengths (n_pages a multiple of the grid; else the last pages of
// the longer ranges go past grid * (n / grid): the out tensor has room for them).
#ifndef OUT_ORDER
#define OUT_ORDER 0
#endif
__device__ __forceinline__ long long output_index(int begin, int k) {
  if (OUT_ORDER == 1) return static_cast<long long>(k) * gridDim.x + blockIdx.x;
  if (OUT_ORDER == 2) return (static_cast<long long>(k / 16) * gridDim.x + blockIdx.x) * 16 + k % 16;
  return begin + k;
}

// WRITES == 8: the staged output chunks and their barriers (full: one arrival per consumer
// warp and page, 4 * OUT_CHUNK; empty: the writer's, once the bulk copy has read the chunk).
struct OutChunks {
  float floats[OUT_RING * OUT_CHUNK * 64];
  uint64_t full[OUT_RING], empty[OUT_RING];
};

// Spin until the global nanosecond timer enters the next multiple of EPOCH_NS: every SM's
// writer flushes at the same instants (WRITES == 9).
__device__ __forceinline__ void wait_for_epoch() {
  const uint64_t next = (globaltimer() / EPOCH_NS + 1) * EPOCH_NS;
  while (globaltimer() < next) {
  }
}

__device__ __forceinline__ bool mbar_test(uint64_t* bar, uint32_t parity) {
  uint32_t done;
  asm volatile(
      "{\n.reg .pred p;\nmbarrier.test_wait.parity.acquire.cta.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}"
      : "=r"(done) : "r"(smem_addr(bar)), "r"(parity) : "memory");
  return done != 0;
}

__device__ void write_chunks(int count, int begin, OutChunks* chunks, float* out) {
  const int lane = threadIdx.x % 32;
  const int chunks_total = (count + OUT_CHUNK - 1) / OUT_CHUNK;
  for (int chunk = 0; chunk < chunks_total;) {
    mbar_wait(&chunks->full[chunk % OUT_RING], (chunk / OUT_RING) & 1);
    if (WRITES == 9) wait_for_epoch();
    // This chunk, and (WRITES == 9) every later one already full, one bulk copy each.
    const int first = chunk;
    do {
      const int buffer = chunk % OUT_RING;
      if (lane == 0) {
        const int pages = min(OUT_CHUNK, count - chunk * OUT_CHUNK);
        asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;"
                     ::"l"(out + (begin + chunk * OUT_CHUNK) * 64LL),
                     "r"(smem_addr(chunks->floats + buffer * OUT_CHUNK * 64)), "r"(pages * 256) : "memory");
      }
      ++chunk;
    } while (WRITES == 9 && chunk < chunks_total && chunk - first < OUT_RING &&
             mbar_test(&chunks->full[chunk % OUT_RING], (chunk / OUT_RING) & 1));
    if (lane == 0) {
      asm volatile("cp.async.bulk.commit_group;" ::: "memory");
      asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
      for (int c = first; c < chunk; ++c) mbar_arrive(&chunks->empty[c % OUT_RING]);
    }
    __syncwarp();
  }
  if (lane == 0) asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
}

__device__ void consume_pages(int count, int begin, int stages, const uint8_t* slots, uint64_t* full,
                              uint64_t* empty, float* out, float* out_stage, OutChunks* chunks, uint32_t* sink) {
  constexpr int kValueBytes = MODE == 2 ? PAGE_BYTES / (132 * BOX_ROWS) * BOX_ROWS * 128 : 0;
  const int consumer = threadIdx.x / 128 - PRODUCERS / 4, lane = threadIdx.x % 32;
  const int row0 = 16 * ((threadIdx.x / 32) % 4) + lane / 4;
  const int per_warp = stages / PRODUCERS;
  float* stage_out = out_stage + 16 * (threadIdx.x / 32 - PRODUCERS);  // WRITES == 4
  uint32_t acc = 0;
  for (int k = consumer; k < count; k += CONSUMERS) {
    const int producer = k % PRODUCERS, j = k / PRODUCERS;
    const int slot = producer * per_warp + j % per_warp;
    const uint8_t* page = slots + static_cast<long long>(slot) * kSlotBytes;
    mbar_wait(&full[slot], (j / per_warp) & 1);
    if (threadIdx.x % 128 == 0) acc ^= *reinterpret_cast<const uint32_t*>(page);
    const float* scales = reinterpret_cast<const float*>(page + kValueBytes);
    if (WRITES >= 8) {
      const int chunk = k / OUT_CHUNK, buffer = chunk % OUT_RING;
      if (chunk >= OUT_RING) mbar_wait(&chunks->empty[buffer], ((chunk / OUT_RING) - 1) & 1);
      float* staged = chunks->floats + (buffer * OUT_CHUNK + k % OUT_CHUNK) * 64;
      if (lane % 4 == 0) {
        staged[row0] = scales[row0 % 32];
        staged[row0 + 8] = scales[(row0 + 8) % 32];
      }
      fence_proxy_async_smem();
      __syncwarp();
      if (lane == 0) mbar_arrive(&chunks->full[buffer]);
    } else if (WRITES && (begin + k) % WRITE_EVERY == 0) {
      store_outputs(out + (WRITES == 6 ? (begin + k) % 512 : output_index(begin, k)) * 64LL, scales, row0, lane,
                    stage_out);
    }
    __syncwarp();
    if (lane == 0) mbar_arrive(&empty[slot]);
  }
  if (WRITES >= 8) {  // the last chunk's missing pages: arrivals without data
    const int chunks_total = (count + OUT_CHUNK - 1) / OUT_CHUNK;
    for (int k = count + (consumer - count % CONSUMERS + CONSUMERS) % CONSUMERS; k < chunks_total * OUT_CHUNK;
         k += CONSUMERS) {
      const int chunk = k / OUT_CHUNK, buffer = chunk % OUT_RING;
      if (chunk >= OUT_RING) mbar_wait(&chunks->empty[buffer], ((chunk / OUT_RING) - 1) & 1);
      if (lane == 0) mbar_arrive(&chunks->full[buffer]);
    }
  }
  sink[blockIdx.x * kThreads + threadIdx.x] = acc;
}

extern "C" __global__ void __launch_bounds__(kThreads, MODE == 0 ? MIN_CTAS : 1)
    read_rate(const __grid_constant__ TensorMap map, const uint8_t* pool, long long page_stride, const int* pages,
              int n_pages, int* counter, int stages, int first_bytes, float* out, uint32_t* sink) {
  int begin, end;
  cta_range(n_pages, begin, end);
  const int readers = MODE == 0 ? kThreads / 32 : PRODUCERS;
  PageSource source{pages, counter, counter ? 0 : begin, counter ? n_pages : end, static_cast<int>(threadIdx.x / 32),
                    readers};
  if (MODE == 0) {
    ldg_pages(pool, page_stride, source, sink);
    return;
  }
  // Slots first (1024-byte aligned for the 128-byte swizzle), then one mbarrier per slot.
  extern __shared__ uint8_t smem_raw[];
  uint8_t* slots = smem_raw + ((1024 - (smem_addr(smem_raw) & 1023)) & 1023);
  uint64_t* full = reinterpret_cast<uint64_t*>(slots + static_cast<long long>(stages) * kSlotBytes);
  uint64_t* empty = full + stages;
  float* out_stage = reinterpret_cast<float*>((reinterpret_cast<uintptr_t>(empty + stages) + 15) / 16 * 16);
  OutChunks* chunks = reinterpret_cast<OutChunks*>(out_stage);  // WRITES 4 and 8 use one or the other
  if (threadIdx.x == 0) {
    for (int s = 0; s < stages; ++s) {
      mbar_init(&full[s], 1);
      mbar_init(&empty[s], 4);
    }
    for (int b = 0; b < OUT_RING && WRITES >= 8; ++b) {
      mbar_init(&chunks->full[b], 4 * OUT_CHUNK);
      mbar_init(&chunks->empty[b], 1);
    }
    fence_barrier_init();
  }
  __syncthreads();
  if (MODE == 2 && threadIdx.x == 0) prefetch_tensor_map(&map);
  if (WRITES >= 8 && threadIdx.x / 32 == kWriterWarp) {
    write_chunks(end - begin, begin, chunks, out);
  } else if (threadIdx.x < 32 * PRODUCERS) {
    copy_pages(pool, page_stride, source, stages, first_bytes, &map, slots, full, empty, sink);
  } else {
    consume_pages(end - begin, begin, stages, slots, full, empty, out, out_stage, chunks, sink);
    if (WRITES == 4) asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
  }
}
