// The fused SM90 kernel's TMA copies of K, Q and V into their stages, and the zeroing of the rows
// past a tail chunk's end.
#pragma once

#include "cuda/fused_sm90_scheduler.cuh"
#include "cuda/fused_sm90_traits.cuh"

namespace gdnkit::cuda {

// TMA copies of the chunk at token c0 into a stage, by one thread: it arms the stage's mbarrier and
// issues the boxes (64 columns x 64 tokens each). The aux issues chunks 0-2 (K, Q) and 0-1 (V);
// state thread 0 the rest, as each step frees the previous chunk's stages, at the tokens the aux
// leaves in F::ahead (the state warpgroups keep no cursor: registers).
template <class F>
struct FusedCopier {
  const FusedParams& fp;
  unsigned char* smem;
  __device__ void kq(int c0, int s) const {
    const int h = blockIdx.y;
    unsigned char* const d = F::kq(smem, s);
    std::uint64_t* const bar = F::kq_bar(smem, s);
    mbar_expect_tx(bar, static_cast<std::uint32_t>(F::kq_bytes));
    for (int b = 0; b < F::DK / 64; ++b) {
      tma_load_3d(d + b * (kChunk * 128), &fp.k, bar, 64 * b, c0, h / fp.p.k_group);
      tma_load_3d(d + F::Walk::k_bytes + b * (kChunk * 128), &fp.q, bar, 64 * b, c0, h / fp.p.q_group);
    }
  }
  __device__ void v(int c0, int s) const {
    unsigned char* const d = reinterpret_cast<unsigned char*>(F::v(smem, s));
    std::uint64_t* const bar = F::v_bar(smem, s);
    if constexpr (F::kWalks) {
      if (map_cta(fp.p)) {  // V = 0 (zeroed once by the state warpgroups): only the arrival
        mbar_expect_tx(bar, 0u);
        return;
      }
    }
    mbar_expect_tx(bar, static_cast<std::uint32_t>(F::v_bytes));
    for (int b = 0; b < F::DVB / 64; ++b)
      tma_load_3d(d + b * (kChunk * 128), &fp.v, bar, blockIdx.x * F::DVB + 64 * b, c0, blockIdx.y / fp.p.v_group);
  }
};

// Zeroes rows [from, to) of a staged 128-byte-swizzled tile of `blocks` column blocks (the rows past
// a tail chunk's end, which TMA filled from the next sequence), by 128 threads (tid < 128).
__device__ __forceinline__ void zero_tile_rows(unsigned char* tile, int blocks, int from, int to, int tid) {
  const int rows = to - from;
  for (int idx = tid; idx < blocks * rows * 8; idx += 128) {
    const int c = idx % 8, r = from + (idx / 8) % rows, b = idx / (8 * rows);
    *reinterpret_cast<uint4*>(tile + b * (kChunk * 128) + swizzle128(r, c)) = make_uint4(0u, 0u, 0u, 0u);
  }
}

}  // namespace gdnkit::cuda
