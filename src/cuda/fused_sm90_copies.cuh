// The fused SM90 kernel's TMA copies: K, Q and V into their stages, a staged O out; and the zeroing of
// the rows past a tail chunk's end.
#pragma once

#include "cuda/fused_sm90_probe.cuh"
#include "cuda/fused_sm90_scheduler.cuh"
#include "cuda/fused_sm90_traits.cuh"

namespace gdnkit::cuda {

// TMA copies of the chunk at token c0 into a stage, by one thread: it arms the stage's mbarrier and
// issues the boxes (64 columns x 64 tokens each). The aux issues chunks 0-2 (K, Q) and 0-1 (V)
// (chunk 0's K and Q only, with F::kKqFirst); state thread 0 the rest, as each step frees the
// previous chunk's stages, at the tokens the aux leaves in F::ahead (the state warpgroups keep no
// cursor: registers), or with F::kProducer the producer warp (fused_producer, its own cursor).
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
  // The O of the full chunk at token c0, staged in V stage s (fused_state's o_stage), stored: one
  // bulk group. (A value CTA's columns; a map CTA stages nothing.)
  __device__ void o(int c0, int s) const {
    const auto* const src = reinterpret_cast<const unsigned char*>(F::v(smem, s));
    for (int b = 0; b < F::DVB / 64; ++b)
      tma_store_3d(&fp.o, src + b * (kChunk * 128), static_cast<int>(blockIdx.x) * F::DVB + 64 * b, c0, blockIdx.y);
    bulk_commit();
  }
};

// The producer warp (F::kProducer; lane = 0..31): the copies state thread 0 issues otherwise, in the
// same places of the walk: chunks 1-2's K and Q and 0-1's V once chunk 0's K and Q have landed
// (fused_later_first_copies), then as the state warpgroup finishes each step j (kBarProd + j % 2):
// chunk j + 3's K and Q into chunk j's stage, chunk j's staged O (a full chunk), and, once that
// store has read the V stage, chunk j + 2's V there (after FULL of chunk j + 1 otherwise). Its own
// cursor gives the positions (the state warpgroup's come from the aux, F::ahead). Two barrier ids
// in turn: the state reaches step j + 2's end only after its wait for V of chunk j + 2, copied past
// this wait of step j (so the probe builds that drop the state's V wait are refused below).
template <class F>
__device__ __forceinline__ void fused_producer(const FusedParams& fp, unsigned char* smem, const int* order, int lane) {
#if !GDNKIT_PROBE_COPIES || GDNKIT_FUSED_PROBE_NO_VWAIT
  static_assert(!F::kProducer, "the producer's barrier ids rely on the state's wait for V: probe with GDNKIT_FUSED_PRODUCER=0");
#endif
  const ChunkCursor<F::kWalks> chunks{fp.p, order};
  const FusedCopier<F> copy{fp, smem};
  ChunkPos c[4];  // chunks j .. j + 3 (past the end: !valid)
  c[0] = chunks.first();
  if (!chunks.valid(c[0])) return;
  for (int k = 1; k < 4; ++k) c[k] = chunks.valid(c[k - 1]) ? chunks.next(c[k - 1]) : c[k - 1];
#if GDNKIT_PROBE_COPIES
  if (lane == 0) {
    mbar_wait(F::kq_bar(smem, 0), 0);
    copy.v(c[0].c0, 0);
    for (int k = 1; k < 3 && chunks.valid(c[k]); ++k) {
      copy.kq(c[k].c0, k);
      if (k < 2) copy.v(c[k].c0, k);
    }
  }
#endif
  for (int j = 0;; ++j) {
    __syncwarp();  // lane 0's copies above: the warp meets the barrier converged (bar.sync is aligned)
    named_sync(F::kBarProd + j % 2, 128 + 32);
#if GDNKIT_PROBE_COPIES
    if (lane == 0) {
      if (chunks.valid(c[3])) copy.kq(c[3].c0, j % 3);
      if (c[0].nrows() == kChunk) copy.o(c[0].c0, j % 2);  // O staged in chunk j's V stage
      if (chunks.valid(c[2])) {
        bulk_wait_read<0>();
        copy.v(c[2].c0, j % 2);
      }
    }
#endif
    if (!chunks.valid(c[1])) break;
    c[0] = c[1], c[1] = c[2], c[2] = c[3];
    if (chunks.valid(c[3])) c[3] = chunks.next(c[3]);
  }
  if (lane == 0) bulk_wait<0>();  // no store in flight at exit
}

// Zeroes rows [from, to) of a staged 128-byte-swizzled tile of `blocks` column blocks (the rows past
// a tail chunk's end, which TMA filled from the next sequence), by 128 threads (tid < 128).
// Thread tid takes the 16-byte piece tid % 8 of every 16th row from from + tid / 8: no division by
// the row count (whose runtime divisions had cost the 128-column aux spills in the lead-mode kernel).
__device__ __forceinline__ void zero_tile_rows(unsigned char* tile, int blocks, int from, int to, int tid) {
  const int c = tid % 8;
  for (int r = from + tid / 8; r < to; r += 16)
    for (int b = 0; b < blocks; ++b)
      *reinterpret_cast<uint4*>(tile + b * (kChunk * 128) + swizzle128(r, c)) = make_uint4(0u, 0u, 0u, 0u);
}

}  // namespace gdnkit::cuda
