// Signals between the CTAs of one kernel, through words in global memory that a kernel before it
// on the stream set to zero (cp.cuh, the chained correction): a ticket counter that hands out work
// items in the order CTAs ask for them, and flags that one CTA raises once its stores are done and
// others wait on. A CTA waits only on items of lower tickets, which CTAs already running hold, so
// every wait ends whatever order the hardware starts CTAs in.
// The test harness replaces this header with host atomics (tests/emu/fake/cuda/flags.cuh).
#pragma once

namespace gdnkit::cuda {

// The next ticket (one thread of the CTA asks; it shares the answer).
__device__ __forceinline__ int take_ticket(int* counter) { return atomicAdd(counter, 1); }

// Raises a flag after the CTA's stores: the caller has passed a CTA barrier after them, so this
// release at GPU scope orders every thread's stores before the flag (PTX's cumulativity).
__device__ __forceinline__ void raise_flag(int* flag) {
#if defined(__CUDA_ARCH__)
  asm volatile("st.release.gpu.global.b32 [%0], %1;" ::"l"(flag), "r"(1) : "memory");
#endif
}

// Spins until the flag is raised; the caller then passes a CTA barrier before any thread reads
// what the raiser stored (with loads that bypass L1: load_cg). A flag still down after 2^25 polls
// (seconds of running, against microseconds for a chain's step) can only be a bug: the kernel
// traps, and the call's error says so, rather than hang the GPU.
__device__ __forceinline__ void wait_flag(const int* flag) {
#if defined(__CUDA_ARCH__)
  for (int polls = 0;; ++polls) {
    int v;
    asm volatile("ld.acquire.gpu.global.b32 %0, [%1];" : "=r"(v) : "l"(flag) : "memory");
    if (v != 0) return;
    if (polls == (1 << 25)) __trap();
    __nanosleep(100);
  }
#endif
}

// A load from L2 (data another CTA of this kernel stored).
__device__ __forceinline__ float load_cg(const float* p) { return __ldcg(p); }

}  // namespace gdnkit::cuda
