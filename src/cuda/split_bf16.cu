// The CUDA path's bf16 instantiations: dk 64 and 128; mma.sync walks of 1, 2, 4 and 8 warps (sm_80+)
// and, with the CUTLASS headers, wgmma walks of 1 and 2 warpgroups (sm_90a).
#include "cuda/split_instances.cuh"

namespace gdnkit::cuda {

namespace {
const SplitKernel kKernels[] = {
    split_entry<MmaSyncWalk<__nv_bfloat16, 128, 1>>("cuda-split-mma-bf16-k128-w1", DType::bf16),
    split_entry<MmaSyncWalk<__nv_bfloat16, 128, 2>>("cuda-split-mma-bf16-k128-w2", DType::bf16),
    split_entry<MmaSyncWalk<__nv_bfloat16, 128, 4>>("cuda-split-mma-bf16-k128-w4", DType::bf16),
    split_entry<MmaSyncWalk<__nv_bfloat16, 128, 8>>("cuda-split-mma-bf16-k128-w8", DType::bf16),
    split_entry<MmaSyncWalk<__nv_bfloat16, 64, 1>>("cuda-split-mma-bf16-k64-w1", DType::bf16),
    split_entry<MmaSyncWalk<__nv_bfloat16, 64, 2>>("cuda-split-mma-bf16-k64-w2", DType::bf16),
    split_entry<MmaSyncWalk<__nv_bfloat16, 64, 4>>("cuda-split-mma-bf16-k64-w4", DType::bf16),
    split_entry<MmaSyncWalk<__nv_bfloat16, 64, 8>>("cuda-split-mma-bf16-k64-w8", DType::bf16),
#if GDNKIT_HAS_CUTLASS
    split_entry<WgmmaWalk<__nv_bfloat16, 128, 1>>("cuda-split-wgmma-bf16-k128-w4", DType::bf16),
    split_entry<WgmmaWalk<__nv_bfloat16, 128, 2>>("cuda-split-wgmma-bf16-k128-w8", DType::bf16),
    split_entry<WgmmaWalk<__nv_bfloat16, 64, 1>>("cuda-split-wgmma-bf16-k64-w4", DType::bf16),
    split_entry<WgmmaWalk<__nv_bfloat16, 64, 2>>("cuda-split-wgmma-bf16-k64-w8", DType::bf16),
#endif
};
}  // namespace

SplitKernelList split_kernels_bf16() { return {kKernels, static_cast<int>(sizeof kKernels / sizeof kKernels[0])}; }

}  // namespace gdnkit::cuda
