// Programmatic dependent launch (sm_90), for the split's chain of launches (cp.cu) and every fused
// kernel's launch (fused_sm90.cu): a kernel launched with
// cudaLaunchAttributeProgrammaticStreamSerialization may be scheduled before the kernel ahead of it
// on the stream has finished, which hides the launch gap between them. It must
// call grid_dependency_wait() before it reads anything that kernel wrote: the wait returns once
// that kernel has completed and its writes are visible. Without the attribute, and below sm_90, it
// returns at once. No kernel triggers its dependents early (griddepcontrol.launch_dependents, at
// its start): measured on an H200 that made splits 2-28% slower (docs/perf-notes.md), so each
// dependent is scheduled when the kernel before it exits.
// The test harness replaces this header with a no-op (tests/emu/fake/cuda/pdl.cuh).
#pragma once

namespace gdnkit::cuda {

__device__ __forceinline__ void grid_dependency_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

}  // namespace gdnkit::cuda
