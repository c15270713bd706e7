// Launchers and table entries of the CUDA path's kernels, one per (qkv dtype, dk, walk warps).
// Included by split_bf16.cu and split_f16.cu, one translation unit per dtype (they compile in
// parallel).
#pragma once

#include <cuda_runtime.h>

#include "cuda/chunked.h"
#include "cuda/prep_kernel.cuh"
#include "cuda/walk_kernel.cuh"

namespace gdnkit::cuda {

template <typename T, int DK, int WARPS>
cudaError_t launch_split(const ChunkedParams& params, dim3 prep_grid, dim3 walk_grid, cudaStream_t stream) {
  void* args[] = {const_cast<ChunkedParams*>(&params)};
  if (prep_grid.x > 0) {
    const cudaError_t err = cudaLaunchKernel(reinterpret_cast<const void*>(&gdn_prep_kernel<T, DK>), prep_grid,
                                             dim3(kPrepThreads), args, PrepLayout<DK>::total, stream);
    if (err != cudaSuccess) return err;
  }
  return cudaLaunchKernel(reinterpret_cast<const void*>(&gdn_walk_kernel<T, DK, WARPS>), walk_grid,
                          dim3(32 * WARPS), args, WalkLayout<DK, WARPS>::total, stream);
}

template <typename T, int DK, int WARPS>
constexpr SplitKernel split_entry(const char* name, DType dtype) {
  return SplitKernel{name,
                     dtype,
                     DK,
                     WARPS,
                     PrepLayout<DK>::total,
                     WalkLayout<DK, WARPS>::total,
                     reinterpret_cast<const void*>(&gdn_prep_kernel<T, DK>),
                     reinterpret_cast<const void*>(&gdn_walk_kernel<T, DK, WARPS>),
                     &launch_split<T, DK, WARPS>};
}

}  // namespace gdnkit::cuda
