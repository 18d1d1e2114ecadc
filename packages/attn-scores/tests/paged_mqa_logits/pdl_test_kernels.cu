// Test kernels for programmatic dependent launch (test_gpu_pdl.py); not part of the package.

// A stand-in for the kernel a serving loop runs just before the logits call (the KV cache
// append, the lengths update, the schedule helper). It lets the next kernel in the stream
// launch at once, idles for `delay_ns` of the global timer, then copies `bytes` bytes of `src`
// into `dst`. A next kernel launched with programmatic stream serialization that read `dst`
// before its `griddepcontrol.wait` would see the old bytes.
extern "C" __global__ void late_copy(unsigned char* dst, const unsigned char* src, long long bytes,
                                     long long delay_ns) {
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  unsigned long long start, now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  } while (now - start < static_cast<unsigned long long>(delay_ns));
  const long long step = static_cast<long long>(gridDim.x) * blockDim.x;
  for (long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x; i < bytes; i += step) {
    dst[i] = src[i];
  }
}

// Copies `bytes` bytes of `src` into `seen` as they are when it runs, with no
// `griddepcontrol.wait`: launched programmatically after late_copy, it shows whether a
// dependent kernel really starts before late_copy has written.
extern "C" __global__ void early_read(unsigned char* seen, const unsigned char* src, long long bytes) {
  const long long step = static_cast<long long>(gridDim.x) * blockDim.x;
  for (long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x; i < bytes; i += step) {
    seen[i] = src[i];
  }
}
