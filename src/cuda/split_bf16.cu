// The CUDA path's bf16 instantiations (split_instances.cuh); one translation unit per dtype.
#include "cuda/split_instances.cuh"

namespace gdnkit::cuda {

namespace {
const SplitKernel kKernels[] = {
    GDNKIT_MMA_SYNC_KERNELS(__nv_bfloat16, "bf16", DType::bf16),
    GDNKIT_SHORT_KERNELS(__nv_bfloat16, "bf16", DType::bf16),
#if GDNKIT_HAS_CUTLASS
    GDNKIT_WGMMA_KERNELS(__nv_bfloat16, "bf16", DType::bf16),
#endif
};
}  // namespace

SplitKernelList split_kernels_bf16() { return {kKernels, static_cast<int>(sizeof kKernels / sizeof kKernels[0])}; }

}  // namespace gdnkit::cuda
