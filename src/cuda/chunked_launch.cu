// Instantiations of the fused chunked kernel and their launchers. One instantiation per
// (qkv dtype, dk, value-column block); dv is a runtime value (it only sets the grid and the
// state's row length), everything else in the problem is a runtime flag in ChunkedParams.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "cuda/chunked.h"
#include "cuda/chunked_kernel.cuh"

namespace gdnkit::cuda {

namespace {

template <typename T, int DK, int DVB>
cudaError_t launch_chunked(const ChunkedParams& params, dim3 grid, std::size_t smem_bytes, cudaStream_t stream) {
  // cudaLaunchKernel reports this launch's own configuration errors (not an earlier, unrelated one).
  void* args[] = {const_cast<ChunkedParams*>(&params)};
  return cudaLaunchKernel(reinterpret_cast<const void*>(&gdn_chunked_kernel<T, DK, DVB>), grid, dim3(kThreads),
                          args, smem_bytes, stream);
}

template <typename T, int DK, int DVB>
constexpr ChunkedKernel entry(const char* name, DType dtype) {
  return ChunkedKernel{name,
                       dtype,
                       DK,
                       DVB,
                       ChunkedLayout<DK, DVB>::total,
                       reinterpret_cast<const void*>(&gdn_chunked_kernel<T, DK, DVB>),
                       &launch_chunked<T, DK, DVB>};
}

const ChunkedKernel kKernels[] = {
    entry<__nv_bfloat16, 128, 32>("cuda-chunked-wmma-bf16-k128-dv32", DType::bf16),
    entry<__nv_bfloat16, 128, 64>("cuda-chunked-wmma-bf16-k128-dv64", DType::bf16),
    entry<__nv_bfloat16, 64, 32>("cuda-chunked-wmma-bf16-k64-dv32", DType::bf16),
    entry<__nv_bfloat16, 64, 64>("cuda-chunked-wmma-bf16-k64-dv64", DType::bf16),
    entry<__half, 128, 32>("cuda-chunked-wmma-f16-k128-dv32", DType::f16),
    entry<__half, 128, 64>("cuda-chunked-wmma-f16-k128-dv64", DType::f16),
    entry<__half, 64, 32>("cuda-chunked-wmma-f16-k64-dv32", DType::f16),
    entry<__half, 64, 64>("cuda-chunked-wmma-f16-k64-dv64", DType::f16),
};

}  // namespace

const ChunkedKernel* find_chunked_kernel(DType dtype, int dk, int dvb) {
  for (const ChunkedKernel& k : kKernels)
    if (k.dtype == dtype && k.dk == dk && k.dvb == dvb) return &k;
  return nullptr;
}

}  // namespace gdnkit::cuda
