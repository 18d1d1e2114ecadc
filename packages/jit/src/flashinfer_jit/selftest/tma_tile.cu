// Self-test: one block loads a BOX_ROWS x BOX_COLS float tile with TMA (unswizzled) at
// (row, col) and writes it densely to `out`. Out-of-bounds elements arrive as zeros.
#include "flashinfer_jit/hopper.cuh"

#ifndef BOX_ROWS
#define BOX_ROWS 64
#endif
#ifndef BOX_COLS
#define BOX_COLS 32
#endif

extern "C" __global__ void tma_load_tile(const __grid_constant__ flashinfer_jit::TensorMap map,
                                         float* __restrict__ out, int32_t row, int32_t col) {
  __shared__ alignas(128) float tile[BOX_ROWS * BOX_COLS];
  __shared__ alignas(8) uint64_t barrier;
  if (threadIdx.x == 0) {
    flashinfer_jit::prefetch_tensor_map(&map);
    flashinfer_jit::mbarrier_init(&barrier, 1);
    flashinfer_jit::fence_barrier_init();
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    flashinfer_jit::mbarrier_arrive_expect_tx(&barrier, sizeof(tile));
    flashinfer_jit::tma_load_2d(tile, &map, &barrier, col, row);
  }
  flashinfer_jit::mbarrier_wait_parity(&barrier, 0);
  for (int i = threadIdx.x; i < BOX_ROWS * BOX_COLS; i += blockDim.x) out[i] = tile[i];
}
