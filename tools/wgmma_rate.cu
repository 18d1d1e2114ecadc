// How fast one SM runs FP8 WGMMA m64nNk32 with A from registers (RS) or from shared memory
// (SS), with 1-4 warpgroups issuing, and how well CUDA-core work overlaps it. A measurement
// kernel for tools/wgmma_rate.py, not part of any package.
//
// Each warpgroup runs ITERS "units" like the logits consumers do: ALU_OPS CUDA-core
// instructions per thread (16 independent chains; in RS form their results are the A
// fragment, in SS form they are kept alive by one store at the end), then 4 k-steps (K = 128)
// into one accumulator set, commit, wait for completion.
// SPLIT=1 specialises the warpgroups instead: the first half only issue the MMAs, the second
// half only run the CUDA-core work (the "decode warps" arrangement), each for ITERS units.
// Thread 0 of each warpgroup records clock64() before and after its loop. The shared tiles
// hold small E4M3 values; the output is only there so that nothing is optimised away.
//
// EPI=1 adds a logits-style epilogue after each unit's wait in the MMA-issuing warpgroups
// (per accumulator: |x| + x, then a multiply-add into one of two sums). STORE=1 makes the
// CUDA-core-only warpgroups of SPLIT=1 write each unit's 16 result words per thread to a
// ring of four 8 KiB shared tiles (four 16-byte stores, as a decode stage would write E4M3
// tiles for SS-form MMAs; no synchronisation with the readers, timing only).
//
// Defines: TILE_N (64 or 128), RS (0/1), WARPGROUPS (1-4), ITERS, ALU_OPS (a multiple of 16),
// OP (0 LOP3, 1 PRMT, 2 FFMA, 3 IMAD, 4 FADD with an immediate, 5 HFMA2, 6 FMNMX), SPLIT (0
// every warpgroup does both, 1 halves, 2 no MMA at all), EPI (0/1), STORE (0/1), OVERLAP (1:
// with SPLIT=0, the CUDA-core work for the next unit runs between the MMAs' commit and their
// wait instead of before the MMAs, the software-pipelined form).
#include "wgmma_fp8.cuh"

using namespace fi_sm90;
using Mma = WgmmaFp8<TILE_N, true>;
// SPLIT=1: the MMA warpgroups take the registers the others give back (launch: 128 per thread).
constexpr int SPLIT_REGS_LO = 96, SPLIT_REGS_HI = 160;

// One CUDA-core instruction of the chosen kind (x depends on the previous one in its chain).
__device__ __forceinline__ uint32_t op(uint32_t x, uint32_t salt) {
  uint32_t y;
  if (OP == 0) {
    asm volatile("lop3.b32 %0, %1, %2, %3, 0x96;" : "=r"(y) : "r"(x), "r"(0x34343434u), "r"(salt));
  } else if (OP == 1) {
    asm volatile("prmt.b32 %0, %1, %2, %3;" : "=r"(y) : "r"(x), "r"(salt), "r"(0x5140u));
  } else if (OP == 2) {
    float f;
    asm volatile("fma.rn.f32 %0, %1, %2, %3;" : "=f"(f) : "f"(__uint_as_float(x)), "f"(1.0001f), "f"(0.5f));
    y = __float_as_uint(f);
  } else if (OP == 3) {  // x * x + salt: a constant multiplier would let ptxas fold the chain
    asm volatile("mad.lo.u32 %0, %1, %1, %2;" : "=r"(y) : "r"(x), "r"(salt));
  } else if (OP == 4) {
    asm volatile("add.f32 %0, %1, 0f3F800000;" : "=r"(y) : "r"(x));
  } else if (OP == 5) {
    asm volatile("fma.rn.f16x2 %0, %1, %1, %2;" : "=r"(y) : "r"(x), "r"(salt));
  } else {
    asm volatile("max.f32 %0, %1, %2;" : "=r"(y) : "r"(x), "r"(salt));
  }
  return y;
}

// The unit's CUDA-core work: 16 chains of ALU_OPS / 16 instructions, masked to E4M3 bytes.
__device__ __forceinline__ void alu_work(uint32_t (&a)[4][4], uint32_t state, int it) {
#pragma unroll
  for (int s = 0; s < 4; ++s) {
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      uint32_t x = state + 0x9E3779B9u * (4 * s + r + it);
#pragma unroll
      for (int k = 0; k < ALU_OPS / 16; ++k) x = op(x, state);
      a[s][r] = x & 0x34343434u;
    }
  }
}

extern "C" __global__ void __launch_bounds__(128 * WARPGROUPS, 1)
wgmma_rate(long long* cycles, float* sink, uint32_t seed) {
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  // Offset from the shared array itself (not through an integer) so that accesses stay
  // shared-memory instructions (STS/LDS) instead of generic ones.
  uint8_t* smem = smem_raw + ((1024 - (smem_addr(smem_raw) & 1023)) & 1023);
  uint8_t* a_tile = smem;              // 64 x 128 bytes, 128-byte swizzle
  uint8_t* b_tile = smem + 64 * 128;   // TILE_N x 128 bytes
  uint8_t* store_ring = b_tile + TILE_N * 128;  // 4 x 8 KiB (STORE=1)
  for (int i = threadIdx.x; i < (64 + TILE_N) * 128 / 4; i += blockDim.x) {
    reinterpret_cast<uint32_t*>(smem)[i] = (seed * (i + 1)) & 0x34343434u;  // small E4M3 values
  }
  fence_proxy_async_smem();
  __syncthreads();

  const int warpgroup = threadIdx.x / 128;
  const bool issues_mma = SPLIT == 0 || (SPLIT == 1 && warpgroup < WARPGROUPS / 2);
  uint32_t a[4][4];
  const uint32_t state = seed ^ threadIdx.x;
#pragma unroll
  for (int s = 0; s < 4; ++s) {
#pragma unroll
    for (int r = 0; r < 4; ++r) a[s][r] = (state * (4 * s + r + 1)) & 0x34343434u;
  }
  const uint64_t a_desc = smem_desc<128>(a_tile);
  const uint64_t b_desc = smem_desc<128>(b_tile);
  uint32_t alive = 0;
  float total = 0.f;

  const long long start = clock64();
  long long stop;
  if (issues_mma) {
    // The accumulators live in this branch only, nothing inside it branches on the
    // warpgroup, and with SPLIT=1 the aligned setmaxnreg tells ptxas the branch is
    // warpgroup-uniform (without it ptxas serializes every wgmma: C7518).
    if (SPLIT == 1) regs_increase<SPLIT_REGS_HI>();
    float acc[Mma::kRegs];
#pragma unroll
    for (int i = 0; i < Mma::kRegs; ++i) acc[i] = 0.f;
#pragma unroll 1
    for (int it = 0; it < ITERS; ++it) {
      if (SPLIT == 0 && !OVERLAP) alu_work(a, state, it);
#pragma unroll
      for (int i = 0; i < Mma::kRegs; ++i) reg_fence(acc[i]);
      wgmma_fence();
#pragma unroll
      for (int s = 0; s < 4; ++s) {
        if (RS) {
          Mma::mma_rs(acc, a[s], smem_desc_advance(b_desc, s * 32), 1);
        } else {
          Mma::mma(acc, smem_desc_advance(a_desc, s * 32), smem_desc_advance(b_desc, s * 32), 1);
        }
      }
      wgmma_commit();
      uint32_t next[4][4];
      if (SPLIT == 0 && OVERLAP) {
        alu_work(next, state, it + 1);
        // ptxas sinks independent work past the wait unless something before the wait uses
        // it: one shared store of the words' XOR per thread.
        uint32_t folded = 0;
#pragma unroll
        for (int s = 0; s < 4; ++s) folded ^= next[s][0] ^ next[s][1] ^ next[s][2] ^ next[s][3];
        reinterpret_cast<volatile uint32_t*>(store_ring)[threadIdx.x] = folded;
      }
      wgmma_wait<0>();
#pragma unroll
      for (int i = 0; i < Mma::kRegs; ++i) reg_fence(acc[i]);
      if (SPLIT == 0 && OVERLAP) {
#pragma unroll
        for (int s = 0; s < 4; ++s) {
#pragma unroll
          for (int r = 0; r < 4; ++r) a[s][r] = next[s][r];
        }
      }
      if (!RS && SPLIT == 0) {
#pragma unroll
        for (int s = 0; s < 4; ++s) alive ^= a[s][0] ^ a[s][1] ^ a[s][2] ^ a[s][3];
      }
      if (EPI) {
        float sum0 = 0.f, sum1 = 0.f;
        const float w = __uint_as_float(0x3F000000u | (state & 0xFFu));
#pragma unroll
        for (int i = 0; i < Mma::kRegs; i += 2) {
          sum0 = fmaf(w, fabsf(acc[i]) + acc[i], sum0);
          sum1 = fmaf(w, fabsf(acc[i + 1]) + acc[i + 1], sum1);
        }
        alive ^= __float_as_uint(sum0 + sum1);
      }
    }
    stop = clock64();
    // Read the accumulators inside this branch: a use after the branches would make ptxas
    // insert its own wgmma wait on a divergent path and serialize every wgmma (C7518).
#pragma unroll
    for (int i = 0; i < Mma::kRegs; ++i) total += acc[i];
  } else {
    if (SPLIT == 1) regs_decrease<SPLIT_REGS_LO>();
#pragma unroll 1
    for (int it = 0; it < ITERS; ++it) {
      alu_work(a, state, it);
      if (STORE) {
        // Thread t's 64 bytes at t * 64, 16-byte chunks rotated by t % 4: conflict-free.
        const int t = threadIdx.x % 128;
        uint8_t* tile = store_ring + (it % 4) * 8192;
#pragma unroll
        for (int s = 0; s < 4; ++s) {
          const uint4 v = make_uint4(a[s][0], a[s][1], a[s][2], a[s][3]);
          *reinterpret_cast<uint4*>(tile + t * 64 + ((s + t) % 4) * 16) = v;
        }
      } else {
#pragma unroll
        for (int s = 0; s < 4; ++s) alive ^= a[s][0] ^ a[s][1] ^ a[s][2] ^ a[s][3];
      }
    }
    stop = clock64();
  }
  sink[blockIdx.x * blockDim.x + threadIdx.x] = total + __uint_as_float(alive & 0x3F000000u);
  if (threadIdx.x % 128 == 0) cycles[blockIdx.x * WARPGROUPS + warpgroup] = stop - start;
}
