// CTA schedule for the persistent paged MQA logits kernels, computed on the GPU so that a
// captured CUDA graph re-derives it from the current contents of seq_lens on every replay.
//
// Policy (identical to the pure-PyTorch version in schedule.py, whose docstring has a picture):
//   units[b] = ceil(seq_lens[b] / TOKENS_PER_UNIT) * passes
//   cost[b] = units[b] + ENTRY_UNITS if units[b] > 0, else 0;  total = sum(cost)
//   SM i starts at virtual position g(i) = (total / S) * i + min(i, total % S),  i = 0..S
//   row i = (b, max(0, g(i) - prefix[b] - ENTRY_UNITS)) for the request b with
//   prefix[b] <= g(i) < prefix[b] + cost[b], or (batch_size, 0) when g(i) == total (row S is
//   always that sentinel).
//
// One CTA of 1024 threads: a reduction for the total, then a chunked exclusive scan in which
// each non-empty request writes the rows whose g(i) falls inside it.
//
// Overflow: every length, count and index argument may be anywhere in int32 (num_sms and
// batch_size up to 2**31 - 1), so loop indices that step past them, and sums of two of them,
// are 64-bit.

#include <cuda/std/cstdint>

namespace {

constexpr int kThreads = 1024;

// Virtual units of request b: its units plus the entry charge, 0 when it is empty.
__device__ __forceinline__ long long cost_of(const int* seq_lens, long long stride, long long b,
                                             int batch_size, int passes) {
  if (b >= batch_size) return 0;
  const int len = seq_lens[b * stride];
  // ceil(len / TOKENS_PER_UNIT) without forming len + TOKENS_PER_UNIT - 1, which overflows int.
  return len > 0 ? static_cast<long long>((len - 1) / TOKENS_PER_UNIT + 1) * passes + ENTRY_UNITS : 0;
}

__device__ __forceinline__ long long start_unit(long long i, long long per_sm, long long remainder) {
  return per_sm * i + (i < remainder ? i : remainder);
}

// Inclusive scan over the block; returns this thread's inclusive sum and the block total.
__device__ long long block_inclusive_scan(long long value, long long* warp_sums, long long& total) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
#pragma unroll
  for (int offset = 1; offset < 32; offset *= 2) {
    const long long other = __shfl_up_sync(0xffffffffu, value, offset);
    if (lane >= offset) value += other;
  }
  if (lane == 31) warp_sums[warp] = value;
  __syncthreads();
  if (warp == 0) {
    long long w = warp_sums[lane];
#pragma unroll
    for (int offset = 1; offset < 32; offset *= 2) {
      const long long other = __shfl_up_sync(0xffffffffu, w, offset);
      if (lane >= offset) w += other;
    }
    warp_sums[lane] = w;
  }
  __syncthreads();
  if (warp > 0) value += warp_sums[warp - 1];
  total = warp_sums[31];
  __syncthreads();
  return value;
}

}  // namespace

extern "C" __global__ void __launch_bounds__(kThreads, 1)
paged_mqa_logits_schedule(const int* seq_lens, long long seq_lens_stride, int batch_size,
                          int num_sms, int passes, int* schedule) {
  __shared__ long long warp_sums[32];

  long long total = 0;
  for (long long base = 0; base < batch_size; base += kThreads) {
    long long chunk_total;
    block_inclusive_scan(cost_of(seq_lens, seq_lens_stride, base + threadIdx.x, batch_size, passes),
                         warp_sums, chunk_total);
    total += chunk_total;
  }
  const long long per_sm = total / num_sms, remainder = total % num_sms;

  for (long long i = threadIdx.x; i <= num_sms; i += kThreads) {
    if (start_unit(i, per_sm, remainder) >= total) {
      schedule[2 * i] = batch_size;
      schedule[2 * i + 1] = 0;
    }
  }

  long long carry = 0;
  for (long long base = 0; base < batch_size; base += kThreads) {
    const long long b = base + threadIdx.x;
    const long long cost = cost_of(seq_lens, seq_lens_stride, b, batch_size, passes);
    long long chunk_total;
    const long long prefix = carry + block_inclusive_scan(cost, warp_sums, chunk_total) - cost;
    carry += chunk_total;
    if (cost == 0) continue;
    // First SM whose start unit is >= prefix (start_unit is non-decreasing in i).
    long long lo = 0, hi = num_sms;
    while (lo < hi) {
      const long long mid = (lo + hi) / 2;
      if (start_unit(mid, per_sm, remainder) >= prefix) hi = mid; else lo = mid + 1;
    }
    for (long long i = lo; i <= num_sms; ++i) {
      const long long g = start_unit(i, per_sm, remainder);
      if (g >= prefix + cost) break;
      const long long unit = g - prefix - ENTRY_UNITS;  // < 0 on the entry positions: unit 0
      schedule[2 * i] = static_cast<int>(b);
      schedule[2 * i + 1] = static_cast<int>(unit > 0 ? unit : 0);
    }
  }
}
