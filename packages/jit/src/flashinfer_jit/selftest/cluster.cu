// Self-test for cluster launches: every block publishes a value in its shared memory, the
// cluster synchronises, and each block reads its right neighbour's value through distributed
// shared memory. out[4 * block + {0,1,2,3}] = {rank, cluster size, neighbour's value, block}.
#include "flashinfer_jit/hopper.cuh"

extern "C" __global__ void cluster_neighbours(int32_t* __restrict__ out) {
  __shared__ uint32_t published;
  const uint32_t rank = flashinfer_jit::cluster_block_rank();
  const uint32_t size = flashinfer_jit::cluster_block_count();
  if (threadIdx.x == 0) published = 1000u * blockIdx.x + 7u;
  flashinfer_jit::cluster_sync();
  if (threadIdx.x == 0) {
    const uint32_t neighbour = flashinfer_jit::load_shared_of_block(&published, (rank + 1) % size);
    out[4 * blockIdx.x + 0] = static_cast<int32_t>(rank);
    out[4 * blockIdx.x + 1] = static_cast<int32_t>(size);
    out[4 * blockIdx.x + 2] = static_cast<int32_t>(neighbour);
    out[4 * blockIdx.x + 3] = static_cast<int32_t>(blockIdx.x);
  }
  // Keep every block's shared memory alive until all neighbours have read it.
  flashinfer_jit::cluster_sync();
}
