// The host side of a programmatic dependent launch (pdl.cuh has the device side): the launch
// configuration that lets a kernel be scheduled before the one ahead of it on the stream has
// finished. Shared by the split's launches (cp.cu) and the fused kernel's (fused_sm90.cu).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

namespace gdnkit::cuda {

// config for cudaLaunchKernelEx / cudaLaunchKernelExC; with after == false a plain launch.
// Not copyable: config points at attrs.
struct PdlLaunch {
  cudaLaunchAttribute attrs[2]{};
  cudaLaunchConfig_t config{};
  // cluster_x > 1: thread-block clusters of that many CTAs along x (grid.x a multiple of it).
  PdlLaunch(dim3 grid, dim3 block, std::size_t smem, cudaStream_t stream, bool after, unsigned cluster_x = 1) {
    config.gridDim = grid;
    config.blockDim = block;
    config.dynamicSmemBytes = smem;
    config.stream = stream;
    config.attrs = attrs;
    config.numAttrs = 0;
    if (after) {
      attrs[config.numAttrs].id = cudaLaunchAttributeProgrammaticStreamSerialization;
      attrs[config.numAttrs++].val.programmaticStreamSerializationAllowed = 1;
    }
    if (cluster_x > 1) {
      attrs[config.numAttrs].id = cudaLaunchAttributeClusterDimension;
      attrs[config.numAttrs].val.clusterDim.x = cluster_x;
      attrs[config.numAttrs].val.clusterDim.y = 1;
      attrs[config.numAttrs++].val.clusterDim.z = 1;
    }
  }
  PdlLaunch(const PdlLaunch&) = delete;
  PdlLaunch& operator=(const PdlLaunch&) = delete;
};

}  // namespace gdnkit::cuda
