// The fused SM90 kernel's instantiations (fused_sm90.cuh): bf16 and f16, dk 64 and 128, dv 128.
// Built only with the CUTLASS/CuTe headers (wgmma); without them the list is empty.
#include <cuda_runtime.h>

#include "cuda/chunked.h"
#if GDNKIT_HAS_CUTLASS
#include "cuda/fused_sm90.cuh"
#endif

namespace gdnkit::cuda {

#if GDNKIT_HAS_CUTLASS
namespace {

template <typename T, int DK>
cudaError_t launch_fused(const ChunkedParams& params, dim3, dim3 grid, cudaStream_t stream) {
  void* args[] = {const_cast<ChunkedParams*>(&params)};
  return cudaLaunchKernel(reinterpret_cast<const void*>(&gdn_fused_kernel<T, DK>), grid,
                          dim3(FusedSm90<T, DK>::kThreads), args, FusedSm90<T, DK>::smem_bytes, stream);
}

template <typename T, int DK>
constexpr SplitKernel fused_entry(const char* name, DType dtype) {
  using F = FusedSm90<T, DK>;
  return SplitKernel{name,     dtype,   DK, F::DVB / 16, true, 0, F::smem_bytes, nullptr,
                     reinterpret_cast<const void*>(&gdn_fused_kernel<T, DK>),
                     &launch_fused<T, DK>, F::kThreads, true};
}

const SplitKernel kKernels[] = {
    fused_entry<__nv_bfloat16, 128>("cuda-fused-sm90-bf16-k128", DType::bf16),
    fused_entry<__nv_bfloat16, 64>("cuda-fused-sm90-bf16-k64", DType::bf16),
    fused_entry<__half, 128>("cuda-fused-sm90-f16-k128", DType::f16),
    fused_entry<__half, 64>("cuda-fused-sm90-f16-k64", DType::f16),
};

}  // namespace

SplitKernelList fused_kernels() { return {kKernels, static_cast<int>(sizeof kKernels / sizeof kKernels[0])}; }
#else
SplitKernelList fused_kernels() { return {nullptr, 0}; }
#endif

const SplitKernel* find_fused_kernel(DType dtype, int dk) {
  const SplitKernelList list = fused_kernels();
  for (int i = 0; i < list.count; ++i)
    if (list.begin[i].dtype == dtype && list.begin[i].dk == dk) return &list.begin[i];
  return nullptr;
}

}  // namespace gdnkit::cuda
