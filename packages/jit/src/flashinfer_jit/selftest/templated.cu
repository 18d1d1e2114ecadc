// Self-test for name expressions: a templated kernel instantiated from Python.
#include <cuda/std/cstdint>

template <int kValue, typename T>
__global__ void fill_value(T* __restrict__ out, int32_t n) {
  const int32_t i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = static_cast<T>(kValue);
}
