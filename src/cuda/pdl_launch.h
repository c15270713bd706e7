// The host side of a programmatic dependent launch (pdl.cuh has the device side): the launch
// configuration that lets a kernel be scheduled before the one ahead of it on the stream has
// finished. Shared by the split's launches (cp.cu) and the fused kernel's (fused_sm90.cu).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

namespace gdnkit::cuda {

// config for cudaLaunchKernelEx / cudaLaunchKernelExC; with after == false a plain launch.
// Not copyable: config points at attr.
struct PdlLaunch {
  cudaLaunchAttribute attr{};
  cudaLaunchConfig_t config{};
  PdlLaunch(dim3 grid, dim3 block, std::size_t smem, cudaStream_t stream, bool after) {
    attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr.val.programmaticStreamSerializationAllowed = 1;
    config.gridDim = grid;
    config.blockDim = block;
    config.dynamicSmemBytes = smem;
    config.stream = stream;
    config.attrs = &attr;
    config.numAttrs = after ? 1 : 0;
  }
  PdlLaunch(const PdlLaunch&) = delete;
  PdlLaunch& operator=(const PdlLaunch&) = delete;
};

}  // namespace gdnkit::cuda
