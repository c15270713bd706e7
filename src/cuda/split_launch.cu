// Instantiations of the split path (prep + walk, split_kernel.cuh) and their launchers. One
// instantiation per (qkv dtype, dk, walk value-column block).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "cuda/chunked.h"
#include "cuda/split_kernel.cuh"

namespace gdnkit::cuda {

namespace {

template <typename T, int DK, int DVB>
cudaError_t launch_split(const ChunkedParams& params, dim3 prep_grid, dim3 walk_grid, cudaStream_t stream) {
  void* args[] = {const_cast<ChunkedParams*>(&params)};
  if (prep_grid.x > 0) {
    const cudaError_t err = cudaLaunchKernel(reinterpret_cast<const void*>(&gdn_prep_kernel<T, DK>), prep_grid,
                                             dim3(kThreads), args, PrepLayout<DK>::total, stream);
    if (err != cudaSuccess) return err;
  }
  return cudaLaunchKernel(reinterpret_cast<const void*>(&gdn_walk_kernel<T, DK, DVB>), walk_grid, dim3(kThreads),
                          args, WalkLayout<DK, DVB>::total, stream);
}

template <typename T, int DK, int DVB>
constexpr SplitKernel entry(const char* name, DType dtype) {
  return SplitKernel{name,
                     dtype,
                     DK,
                     DVB,
                     PrepLayout<DK>::total,
                     WalkLayout<DK, DVB>::total,
                     reinterpret_cast<const void*>(&gdn_prep_kernel<T, DK>),
                     reinterpret_cast<const void*>(&gdn_walk_kernel<T, DK, DVB>),
                     &launch_split<T, DK, DVB>};
}

const SplitKernel kSplitKernels[] = {
    entry<__nv_bfloat16, 128, 32>("cuda-split-wmma-bf16-k128-dv32", DType::bf16),
    entry<__nv_bfloat16, 128, 16>("cuda-split-wmma-bf16-k128-dv16", DType::bf16),
    entry<__nv_bfloat16, 64, 32>("cuda-split-wmma-bf16-k64-dv32", DType::bf16),
    entry<__nv_bfloat16, 64, 16>("cuda-split-wmma-bf16-k64-dv16", DType::bf16),
    entry<__half, 128, 32>("cuda-split-wmma-f16-k128-dv32", DType::f16),
    entry<__half, 128, 16>("cuda-split-wmma-f16-k128-dv16", DType::f16),
    entry<__half, 64, 32>("cuda-split-wmma-f16-k64-dv32", DType::f16),
    entry<__half, 64, 16>("cuda-split-wmma-f16-k64-dv16", DType::f16),
};

}  // namespace

const SplitKernel* find_split_kernel(DType dtype, int dk, int dvb) {
  for (const SplitKernel& k : kSplitKernels)
    if (k.dtype == dtype && k.dk == dk && k.dvb == dvb) return &k;
  return nullptr;
}

}  // namespace gdnkit::cuda
