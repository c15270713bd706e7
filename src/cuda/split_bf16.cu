// The CUDA path's bf16 instantiations: dk 64 and 128, walk CTAs of 1, 2, 4 and 8 warps.
#include "cuda/split_instances.cuh"

namespace gdnkit::cuda {

namespace {
const SplitKernel kKernels[] = {
    split_entry<__nv_bfloat16, 128, 1>("cuda-split-mma-bf16-k128-w1", DType::bf16),
    split_entry<__nv_bfloat16, 128, 2>("cuda-split-mma-bf16-k128-w2", DType::bf16),
    split_entry<__nv_bfloat16, 128, 4>("cuda-split-mma-bf16-k128-w4", DType::bf16),
    split_entry<__nv_bfloat16, 128, 8>("cuda-split-mma-bf16-k128-w8", DType::bf16),
    split_entry<__nv_bfloat16, 64, 1>("cuda-split-mma-bf16-k64-w1", DType::bf16),
    split_entry<__nv_bfloat16, 64, 2>("cuda-split-mma-bf16-k64-w2", DType::bf16),
    split_entry<__nv_bfloat16, 64, 4>("cuda-split-mma-bf16-k64-w4", DType::bf16),
    split_entry<__nv_bfloat16, 64, 8>("cuda-split-mma-bf16-k64-w8", DType::bf16),
};
}  // namespace

SplitKernelList split_kernels_bf16() { return {kKernels, static_cast<int>(sizeof kKernels / sizeof kKernels[0])}; }

}  // namespace gdnkit::cuda
