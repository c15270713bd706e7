// Launchers and table entries of the CUDA path's kernels, one per (qkv dtype, dk, walk policy).
// Included by split_bf16.cu and split_f16.cu, one translation unit per dtype (they compile in
// parallel).
#pragma once

#include <cuda_runtime.h>

#include "cuda/chunked.h"
#include "cuda/prep_kernel.cuh"
#include "cuda/short_walk.cuh"
#include "cuda/walk_kernel.cuh"
#if GDNKIT_HAS_CUTLASS
#include "cuda/walk_sm90.cuh"
#endif

namespace gdnkit::cuda {

template <class W>
cudaError_t launch_split(const ChunkedParams& params, dim3 prep_grid, dim3 walk_grid, cudaStream_t stream) {
  using T = typename W::T;
  void* args[] = {const_cast<ChunkedParams*>(&params)};
  if (prep_grid.x > 0) {
    const cudaError_t err = cudaLaunchKernel(reinterpret_cast<const void*>(&gdn_prep_kernel<T, W::DK>), prep_grid,
                                             dim3(kPrepThreads), args, PrepLayout<W::DK>::total, stream);
    if (err != cudaSuccess) return err;
  }
  return cudaLaunchKernel(reinterpret_cast<const void*>(&gdn_walk_kernel<W>), walk_grid, dim3(W::kThreads), args,
                          walk_smem_bytes<W>(), stream);
}

template <class W>
constexpr SplitKernel split_entry(const char* name, DType dtype) {
  return SplitKernel{name,
                     dtype,
                     W::DK,
                     W::kThreads / 32,
                     W::kSm90a,
                     PrepLayout<W::DK>::total,
                     walk_smem_bytes<W>(),
                     reinterpret_cast<const void*>(&gdn_prep_kernel<typename W::T, W::DK>),
                     reinterpret_cast<const void*>(&gdn_walk_kernel<W>),
                     &launch_split<W>,
                     W::kThreads,
                     false};
}

// The short walk (short_walk.cuh): one kernel, no prep, no workspace; prep_grid is ignored.
template <class SW>
cudaError_t launch_short(const ChunkedParams& params, dim3, dim3 walk_grid, cudaStream_t stream) {
  void* args[] = {const_cast<ChunkedParams*>(&params)};
  return cudaLaunchKernel(reinterpret_cast<const void*>(&gdn_short_kernel<SW>), walk_grid, dim3(SW::kThreads), args,
                          0, stream);
}

template <class SW>
constexpr SplitKernel short_entry(const char* name, DType dtype) {
  return SplitKernel{name,    dtype,     SW::DK,  SW::W, false, 0, 0, nullptr,
                     reinterpret_cast<const void*>(&gdn_short_kernel<SW>), &launch_short<SW>, SW::kThreads,
                     false,   nullptr,   true};
}

// Table entries of one dtype (T, its name in kernel names, its DType): the mma.sync walks for
// sm_80+, the short walks (sm_80+) and, with the CUTLASS headers, the wgmma walks for sm_90a.
#define GDNKIT_MMA_SYNC_KERNELS(T, NAME, DTYPE)                                           \
  split_entry<MmaSyncWalk<T, 128, 1>>("cuda-split-mma-" NAME "-k128-w1", DTYPE),          \
      split_entry<MmaSyncWalk<T, 128, 2>>("cuda-split-mma-" NAME "-k128-w2", DTYPE),      \
      split_entry<MmaSyncWalk<T, 128, 4>>("cuda-split-mma-" NAME "-k128-w4", DTYPE),      \
      split_entry<MmaSyncWalk<T, 128, 8>>("cuda-split-mma-" NAME "-k128-w8", DTYPE),      \
      split_entry<MmaSyncWalk<T, 64, 1>>("cuda-split-mma-" NAME "-k64-w1", DTYPE),        \
      split_entry<MmaSyncWalk<T, 64, 2>>("cuda-split-mma-" NAME "-k64-w2", DTYPE),        \
      split_entry<MmaSyncWalk<T, 64, 4>>("cuda-split-mma-" NAME "-k64-w4", DTYPE),        \
      split_entry<MmaSyncWalk<T, 64, 8>>("cuda-split-mma-" NAME "-k64-w8", DTYPE)
#define GDNKIT_SHORT_KERNELS(T, NAME, DTYPE)                                       \
  short_entry<ShortWalk<T, 128, 8>>("cuda-short-" NAME "-k128-w8", DTYPE),           \
      short_entry<ShortWalk<T, 128, 4>>("cuda-short-" NAME "-k128-w4", DTYPE),       \
      short_entry<ShortWalk<T, 128, 2>>("cuda-short-" NAME "-k128-w2", DTYPE),       \
      short_entry<ShortWalk<T, 128, 1>>("cuda-short-" NAME "-k128-w1", DTYPE),       \
      short_entry<ShortWalk<T, 64, 8>>("cuda-short-" NAME "-k64-w8", DTYPE),         \
      short_entry<ShortWalk<T, 64, 4>>("cuda-short-" NAME "-k64-w4", DTYPE),         \
      short_entry<ShortWalk<T, 64, 2>>("cuda-short-" NAME "-k64-w2", DTYPE),         \
      short_entry<ShortWalk<T, 64, 1>>("cuda-short-" NAME "-k64-w1", DTYPE)
#define GDNKIT_WGMMA_KERNELS(T, NAME, DTYPE)                                              \
  split_entry<WgmmaWalk<T, 128, 1>>("cuda-split-wgmma-" NAME "-k128-w4", DTYPE),          \
      split_entry<WgmmaWalk<T, 128, 2>>("cuda-split-wgmma-" NAME "-k128-w8", DTYPE),      \
      split_entry<WgmmaWalk<T, 64, 1>>("cuda-split-wgmma-" NAME "-k64-w4", DTYPE),        \
      split_entry<WgmmaWalk<T, 64, 2>>("cuda-split-wgmma-" NAME "-k64-w8", DTYPE)

}  // namespace gdnkit::cuda
