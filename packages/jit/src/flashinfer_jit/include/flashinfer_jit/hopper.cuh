// Small SM90 helpers shared by flashinfer_jit kernels: shared-memory addresses, mbarriers,
// TMA tile loads and thread-block-cluster primitives, as thin inline-PTX wrappers.
// Include as `#include "flashinfer_jit/hopper.cuh"` (the package include folder is always on
// the NVRTC include path). Everything here needs sm_90a (or sm_90 for the non-TMA parts).
#pragma once

#include <cuda/std/cstdint>

namespace flashinfer_jit {

// The 128-byte TMA descriptor as a kernel parameter. Declare the parameter as
// `const __grid_constant__ flashinfer_jit::TensorMap map` and pass `&map` to the loads; the
// host passes flashinfer_jit.TensorMap (cuTensorMapEncodeTiled output) by value.
struct alignas(64) TensorMap {
  unsigned long long opaque[16];
};

__device__ __forceinline__ uint32_t shared_address(const void* pointer) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(pointer));
}

// ---- mbarrier (transaction-count barriers that TMA completes) ------------------------------

__device__ __forceinline__ void mbarrier_init(uint64_t* barrier, uint32_t arrive_count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;"
               :: "r"(shared_address(barrier)), "r"(arrive_count) : "memory");
}

// Makes initialised barriers visible to the async proxy (TMA) and to the cluster.
__device__ __forceinline__ void fence_barrier_init() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}

// One arrival that also announces `bytes` of incoming TMA traffic for the current phase.
__device__ __forceinline__ void mbarrier_arrive_expect_tx(uint64_t* barrier, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;"
               :: "r"(shared_address(barrier)), "r"(bytes) : "memory");
}

__device__ __forceinline__ bool mbarrier_try_wait_parity(uint64_t* barrier, uint32_t parity) {
  uint32_t done;
  asm volatile(
      "{\n"
      "  .reg .pred ready;\n"
      "  mbarrier.try_wait.parity.shared::cta.b64 ready, [%1], %2;\n"
      "  selp.u32 %0, 1, 0, ready;\n"
      "}\n"
      : "=r"(done) : "r"(shared_address(barrier)), "r"(parity) : "memory");
  return done != 0;
}

// Blocks until the phase with the given parity (0 for the first phase) has completed.
__device__ __forceinline__ void mbarrier_wait_parity(uint64_t* barrier, uint32_t parity) {
  while (!mbarrier_try_wait_parity(barrier, parity)) {
  }
}

// ---- TMA ------------------------------------------------------------------------------

__device__ __forceinline__ void prefetch_tensor_map(const TensorMap* map) {
  asm volatile("prefetch.tensormap [%0];" :: "l"(map) : "memory");
}

// Loads the box whose first element is at (x = innermost, y) into `destination` (shared
// memory, 128-byte aligned) and reports the bytes on `barrier`.
__device__ __forceinline__ void tma_load_2d(void* destination, const TensorMap* map,
                                            uint64_t* barrier, int32_t x, int32_t y) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%3, %4}], [%2];"
      :: "r"(shared_address(destination)), "l"(map), "r"(shared_address(barrier)),
         "r"(x), "r"(y)
      : "memory");
}

// ---- thread-block clusters --------------------------------------------------------------

__device__ __forceinline__ uint32_t cluster_block_rank() {
  uint32_t rank;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
  return rank;
}

__device__ __forceinline__ uint32_t cluster_block_count() {
  uint32_t count;
  asm volatile("mov.u32 %0, %%cluster_nctarank;" : "=r"(count));
  return count;
}

// Full cluster barrier with release/acquire semantics on shared memory of all blocks.
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\n"
               "barrier.cluster.wait.acquire.aligned;" ::: "memory");
}

// Reads a 32-bit word from the shared memory of block `rank` of this cluster, at the offset
// `local` has in this block's shared memory.
__device__ __forceinline__ uint32_t load_shared_of_block(const void* local, uint32_t rank) {
  uint32_t remote, value;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;"
               : "=r"(remote) : "r"(shared_address(local)), "r"(rank));
  asm volatile("ld.shared::cluster.u32 %0, [%1];" : "=r"(value) : "r"(remote) : "memory");
  return value;
}

}  // namespace flashinfer_jit
