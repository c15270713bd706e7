// Context parallelism on one GPU, host side (the stages are described in cp.cuh).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "cuda/chunked.h"
#include "cuda/cp.cuh"

namespace gdnkit::cuda {

// The workspace of one split call: the two lists, the per-sequence slot table, the segments' end
// states E and maps M, and the map CTAs' output rows ([T, H, dk], 16-bit).
struct CpWorkspace {
  std::size_t list1 = 0, list3 = 0, seq_slots = 0, states = 0, maps = 0, map_o = 0, map_end = 0,
              bytes = 0;  // offsets, total
};
CpWorkspace cp_workspace(const CpLayout& c, std::int64_t seqs, std::int64_t tokens, int heads, int dk, int dv);

// Enqueues the launches on stream (no host synchronisation): the list builder, with cutoff > 0 the
// decay shortcut's stop points (cp_stop_cta), stage 1 on k1 (a walk-list fused kernel, opted into
// its shared memory, whose value-column blocks divide dk: its map CTAs cover M), the scan and the
// correction; every launch after the first is a programmatic dependent launch (pdl.cuh). p is the
// call's parameters as for the unsplit kernel; cutoff 0 is exact; ws holds
// cp_workspace(...).bytes, 16-byte aligned (its parts start at multiples of 256 bytes from ws).
cudaError_t launch_cp(const ChunkedParams& p, const CpLayout& c, const SplitKernel& k1, float cutoff,
                      unsigned char* ws, cudaStream_t stream);

}  // namespace gdnkit::cuda
