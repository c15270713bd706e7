// Context parallelism on one GPU, host side (the stages are described in cp.cuh).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "cuda/chunked.h"
#include "cuda/cp.cuh"

namespace gdnkit::cuda {

// The workspace of one split call: the two walk lists, the per-sequence slot table, the segments'
// end states E and maps M.
struct CpWorkspace {
  std::size_t list1 = 0, list3 = 0, seq_slots = 0, states = 0, maps = 0, bytes = 0;  // offsets, total
};
CpWorkspace cp_workspace(const CpLayout& c, std::int64_t seqs, int heads, int dk, int dv);

// Enqueues the three stages on stream (no host synchronisation): stage 1 on k1 (a walk-list fused
// kernel whose value-column blocks divide dk: its map CTAs cover M), the scan, stage 3 on k3.
// Both kernels must have been opted into their shared memory. p is the call's parameters as for
// the unsplit kernel; ws holds cp_workspace(...).bytes, 16-byte aligned (its parts start at
// multiples of 256 bytes from ws).
cudaError_t launch_cp(const ChunkedParams& p, const CpLayout& c, const SplitKernel& k1, const SplitKernel& k3,
                      unsigned char* ws, cudaStream_t stream);

}  // namespace gdnkit::cuda
