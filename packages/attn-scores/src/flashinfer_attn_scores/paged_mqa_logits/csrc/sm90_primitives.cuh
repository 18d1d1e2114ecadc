// Thin wrappers over the SM90 PTX this package uses: mbarriers, the TMA / bulk-copy engine,
// WGMMA shared-memory descriptors and fences, register reallocation.
#pragma once
#include <cuda/std/cstdint>
using cuda::std::int32_t;
using cuda::std::int64_t;
using cuda::std::uint32_t;
using cuda::std::uint64_t;
using cuda::std::uint8_t;
using cuda::std::uintptr_t;

namespace fi_sm90 {

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// `value`, which every lane of the warp already holds, through a shuffle from lane 0: the
// result is the same number, but ptxas then knows it is warp-uniform. A WGMMA descriptor built
// from it can live in uniform registers; built from a per-lane register, ptxas moves each
// descriptor half into a uniform register (`R2UR`) for every k step of every unit.
__device__ __forceinline__ int warp_uniform(int value) { return __shfl_sync(0xffffffffu, value, 0); }

// The global nanosecond timer (measurement knobs only).
__device__ __forceinline__ uint64_t globaltimer() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__device__ __forceinline__ uint32_t sm_id() {
  uint32_t id;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(id));
  return id;
}

// ---------------------------------------------------------------- programmatic dependent launch
// In a kernel launched with programmatic stream serialization (PDL), launch_dependents lets the
// next such kernel in the stream start its blocks before this grid finishes, and wait blocks
// until the previous grid in the stream has completed with its memory visible. A kernel
// launched without the attribute passes both at once.
__device__ __forceinline__ void pdl_launch_dependents() {
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}

__device__ __forceinline__ void pdl_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }

// ---------------------------------------------------------------- mbarrier
__device__ __forceinline__ void mbar_init(uint64_t* bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(bar)), "r"(count));
}

__device__ __forceinline__ void fence_barrier_init() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}

__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.release.cta.shared::cta.b64 _, [%0];" ::"r"(smem_addr(bar)) : "memory");
}

// Arrive once and announce `bytes` of asynchronous (TMA) traffic that completes the phase.
__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.release.cta.shared::cta.b64 _, [%0], %1;"
               ::"r"(smem_addr(bar)), "r"(bytes) : "memory");
}

__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "WAIT_%=:\n"
      "mbarrier.try_wait.parity.acquire.cta.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT_%=;\n"
      "}\n" ::"r"(smem_addr(bar)), "r"(parity) : "memory");
}

// ---------------------------------------------------------------- TMA / bulk copies
// Tiled 3-D tensor copy global -> shared, completing on `bar`.
__device__ __forceinline__ void tma_load_3d(void* dst, const void* tensor_map, uint64_t* bar,
                                            int c0, int c1, int c2) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%3, %4, %5}], [%2];"
      ::"r"(smem_addr(dst)), "l"(tensor_map), "r"(smem_addr(bar)), "r"(c0), "r"(c1), "r"(c2)
      : "memory");
}

// Contiguous bulk copy global -> shared (16-byte aligned, size a multiple of 16).
__device__ __forceinline__ void bulk_load(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
      ::"r"(smem_addr(dst)), "l"(src), "r"(bytes), "r"(smem_addr(bar)) : "memory");
}

// 16-byte asynchronous copy global -> shared (Ampere's cp.async: per thread, to any 16-byte
// aligned shared address, so it can write a swizzled layout). Complete once the issuing thread
// passes cp_async_wait_all(); like st.shared they are generic-proxy writes.
__device__ __forceinline__ void cp_async_16(void* dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(smem_addr(dst)), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;" ::: "memory"); }
// One arrival on `bar` once every cp.async this thread issued so far has landed (.noinc: it is
// one of the arrivals the barrier was initialised to expect). The thread does not wait.
__device__ __forceinline__ void cp_async_arrive_noinc(uint64_t* bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(smem_addr(bar)) : "memory");
}

__device__ __forceinline__ void prefetch_tensor_map(const void* tensor_map) {
  asm volatile("prefetch.tensormap [%0];" ::"l"(tensor_map) : "memory");
}

// Generic-proxy writes to shared memory (st.shared) must be fenced before the tensor cores
// (async proxy) read them.
__device__ __forceinline__ void fence_proxy_async_smem() {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

// ---------------------------------------------------------------- WGMMA
// Shared-memory matrix descriptor for a K-major operand tile whose rows are `swizzle_bytes`
// wide (32/64/128) and stored with the matching TMA swizzle; 8-row groups are
// 8 * swizzle_bytes apart (the stride byte offset). The leading byte offset is unused for
// swizzled K-major layouts when one instruction's K (32 bytes of FP8) fits in a row.
template <int kSwizzleBytes>
__device__ __forceinline__ uint64_t smem_desc(const void* tile) {
  constexpr uint64_t layout = kSwizzleBytes == 128 ? 1 : kSwizzleBytes == 64 ? 2 : 3;
  constexpr uint64_t stride_bytes = 8 * kSwizzleBytes;
  uint64_t desc = 0;
  desc |= static_cast<uint64_t>((smem_addr(tile) & 0x3FFFF) >> 4);
  desc |= static_cast<uint64_t>(1) << 16;  // leading byte offset (ignored here)
  desc |= (stride_bytes >> 4) << 32;
  desc |= layout << 62;
  return desc;
}

// The descriptor of the same tile `bytes` further on (a multiple of 16). Shared memory
// addresses fit the 14-bit start-address field (>> 4) with room to spare, so the add never
// carries into the next field; one integer add instead of rebuilding the descriptor.
__device__ __forceinline__ uint64_t smem_desc_advance(uint64_t desc, uint32_t bytes) { return desc + (bytes >> 4); }

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int kPending>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(kPending) : "memory");
}

// D (64 x 8, float32) += A (64 x 16, bfloat16, from registers) * B (16 x 8, bfloat16, K-major
// in shared memory). a[0..3] hold, for this thread's rows r = 16*warp + lane/4 and r + 8 and
// columns c = 2*(lane % 4), the pairs A[r][c..c+1], A[r+8][c..c+1], A[r][c+8..c+9],
// A[r+8][c+8..c+9] (low half: the lower column), which is exactly how a float32 accumulator
// fragment of an earlier WGMMA holds columns 16k .. 16k + 15 of its rows (FlashAttention-3's
// P x V uses the same identity). d[0..1]: D[r][c..c+1], d[2..3]: D[r+8][c..c+1].
__device__ __forceinline__ void wgmma_bf16_m64n8k16_rs(float (&d)[4], const uint32_t (&a)[4], uint64_t desc_b,
                                                       int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %9, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16 {%0, %1, %2, %3}, {%4, %5, %6, %7}, %8, p, 1, 1, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate));
}

// Keep the accumulator registers ordered with respect to the asynchronous WGMMA.
template <typename T>
__device__ __forceinline__ void reg_fence(T& r) {
  asm volatile("" : "+r"(*reinterpret_cast<uint32_t*>(&r)) :: "memory");
}

// ---------------------------------------------------------------- register reallocation
template <int kRegs>
__device__ __forceinline__ void regs_decrease() { asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(kRegs)); }
template <int kRegs>
__device__ __forceinline__ void regs_increase() { asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(kRegs)); }

}  // namespace fi_sm90
