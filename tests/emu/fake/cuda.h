// Host emulation of the driver API types the kernels use: the TMA descriptor, as the fields the
// emulated tma_load_3d (fake/cuda/wgmma_sm90.cuh) reads.
#pragma once
#include <cstdint>

struct CUtensorMap {
  const void* base = nullptr;
  bool bf16 = true;
  std::uint64_t dims[3] = {};        // columns, tokens, heads
  std::uint64_t strides[2] = {};     // bytes, of tokens and heads
};
