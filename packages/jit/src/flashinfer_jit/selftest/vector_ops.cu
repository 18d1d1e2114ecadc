// Self-test kernels of flashinfer_jit: element-wise ops and a large dynamic-shared-memory
// kernel. Used by the GPU tests, the launch benchmark and `compile-check`.
#include <cuda/std/cstdint>

#ifndef OFFSET
#define OFFSET 0
#endif

// out[i] = a[i] * alpha + b[i] + OFFSET
extern "C" __global__ void scale_add(float* __restrict__ out, const float* __restrict__ a,
                                     const float* __restrict__ b, float alpha, int32_t n) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) out[i] = a[i] * alpha + b[i] + static_cast<float>(OFFSET);
}

// Does nothing with all its arguments; for measuring launch overhead.
extern "C" __global__ void empty_kernel(float* out, const float* a, const float* b, int32_t n,
                                        int64_t m, float alpha) {}

// Each block stages `elements` floats of its chunk in dynamic shared memory and writes them
// back reversed within the chunk, so the result depends on every staged element.
extern "C" __global__ void reverse_chunks(float* __restrict__ out, const float* __restrict__ in,
                                          int32_t elements) {
  extern __shared__ float stage[];
  const float* chunk_in = in + static_cast<int64_t>(blockIdx.x) * elements;
  float* chunk_out = out + static_cast<int64_t>(blockIdx.x) * elements;
  for (int32_t i = threadIdx.x; i < elements; i += blockDim.x) stage[i] = chunk_in[i];
  __syncthreads();
  for (int32_t i = threadIdx.x; i < elements; i += blockDim.x)
    chunk_out[i] = stage[elements - 1 - i];
}
