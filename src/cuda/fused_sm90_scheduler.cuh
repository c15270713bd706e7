// Which chunks a fused SM90 CTA walks: its list of sequences or walk-list entries, the longest-
// first order and its shares, the walk list's map CTAs, the CTA pairs sharing records, and the
// chunk cursor over them.
#pragma once

#include "cuda/fused_sm90_traits.cuh"

namespace gdnkit::cuda {

// The CTA's list: walks (blockIdx.z, blockIdx.z + gridDim.z, ...) of walk_count entries, each a
// sequence or, in the walk-list variant (kWalks), an entry of p.walks; walk_range gives entry i's
// tokens [bos, eos).
template <bool kWalks>
__device__ __forceinline__ std::int64_t walk_count(const ChunkedParams& p) {
  return kWalks ? p.num_walks : p.num_seqs;
}
// The CTA's entries of that list: first, first + stride, ... below the end. With ChunkedParams::lpt
// the CTA's share instead: order[0, n) with n in order[kLongestFirstMaxSeqs] (lpt_share).
struct ListSpan {
  int first, stride;
  std::int64_t end;
};
template <bool kWalks>
__device__ __forceinline__ ListSpan cta_list(const ChunkedParams& p, const int* order) {
  if (!kWalks && p.lpt) return {0, 1, order[kLongestFirstMaxSeqs]};
  return {static_cast<int>(blockIdx.z), static_cast<int>(gridDim.z), walk_count<kWalks>(p)};
}
// The CTA's share of the ranked sequences (order[r] = the sequence of rank r, lens[n] its length;
// rank_longest_first) in a greedy longest-processing-time assignment to the gridDim.z (<= 64)
// bins: in rank order, each sequence goes to the bin with the least work so far (chunks; ties to
// the lowest bin), the same in every CTA. Rewrites order[0, n) with the CTA's sequences, longest
// first, and stores n in order[kLongestFirstMaxSeqs]. By warp 0 (a 32-bit min reduction per
// sequence); the caller's barrier publishes the result.
__device__ __forceinline__ void lpt_share(const ChunkedParams& p, int* order, const int* lens, int lane) {
  const int bins = static_cast<int>(gridDim.z), me = static_cast<int>(blockIdx.z);
  std::uint32_t work[2] = {0u, 0u};  // bins lane and lane + 32
  int n_mine = 0;
  for (int r = 0; r < static_cast<int>(p.num_seqs); ++r) {
    const int n = order[r];
    const auto chunks = static_cast<std::uint32_t>((lens[n] + kChunk - 1) / kChunk);
    // Work below 2^26 chunks (launch checks: tokens < 2^31), the bin in the low 6 bits.
    std::uint32_t key = ~0u;
    if (lane < bins) key = work[0] << 6 | static_cast<std::uint32_t>(lane);
    if (lane + 32 < bins) {
      const std::uint32_t k1 = work[1] << 6 | static_cast<std::uint32_t>(lane + 32);
      key = k1 < key ? k1 : key;
    }
    const int bin = static_cast<int>(__reduce_min_sync(0xffffffffu, key) & 63u);
    if (bin == lane) work[0] += chunks;
    if (bin == lane + 32) work[1] += chunks;
    __syncwarp();  // every lane has read order[r] before it is overwritten
    if (bin == me) {
      if (lane == 0) order[n_mine] = n;  // n_mine <= r: an entry already read
      ++n_mine;
    }
  }
  if (lane == 0) order[kLongestFirstMaxSeqs] = n_mine;
}

// A map CTA (walk list with transfer maps): it walks columns of the identity with V = 0.
__device__ __forceinline__ bool map_cta(const ChunkedParams& p) {
  return p.map_out != nullptr && static_cast<int>(blockIdx.x) >= p.value_blocks;
}
// A split's stage 1 at 128 columns may run a value CTA and a map CTA of each segment as a cluster
// of two (ChunkedParams::cp_pairs, fused_cluster_x) that share their records (fused_paired): both
// must then walk the same chunks, so the map CTA also walks the entries without a map (a
// sequence's first segment) and stores nothing for them.
__device__ __forceinline__ bool value_map_pair(const ChunkedParams& p) {
  return p.cp_pairs && cluster_size() == 2;
}
// The end of a map CTA's walk over list entry w: none without a map (but w.end for a value and map
// pair, value_map_pair), else w.end or, with the decay shortcut, where cp_stop_cta found the
// segment's start state decayed away.
__device__ __forceinline__ int map_walk_end(const ChunkedParams& p, const WalkSpan& w) {
  if (w.map < 0) return value_map_pair(p) ? w.end : w.begin;
  if (p.map_end == nullptr) return w.end;
  const int e = p.map_end[2 * (static_cast<std::int64_t>(w.map) * p.num_heads + blockIdx.y)];
  return e < w.begin ? w.begin : e > w.end ? w.end : e;
}
// Walk-list entry i of the CTA's (kWalks): its copy in shared memory (`order`, unused otherwise: the
// walk-list variant never ranks), which fused_cta took from p.walks or computed (ChunkedParams::
// cp_seg) once, for the CTA's entries blockIdx.z + k gridDim.z, k < kCtaWalks.
__device__ __forceinline__ WalkSpan walk_entry(const int* order, std::int64_t i) {
  return reinterpret_cast<const WalkSpan*>(order)[static_cast<unsigned>(i) / gridDim.z];  // 32-bit: launch checks
}
template <bool kWalks>
__device__ __forceinline__ void walk_range(const ChunkedParams& p, const int* order, int i, int& bos, int& eos) {
  if constexpr (kWalks) {
    const WalkSpan w = walk_entry(order, i);
    bos = w.begin;
    eos = map_cta(p) ? map_walk_end(p, w) : w.end;
  } else {
    const std::int64_t n = p.longest_first ? order[i] : i;
    std::int64_t b, e;
    seq_range(p, n, b, e);
    bos = static_cast<int>(b), eos = static_cast<int>(e);
  }
}

// The launch's clusters along x (fused_sm90.cu; the emulator's harness takes the same): pairs of
// CTAs x, x ^ 1 that walk the same chunks of one head share their records (fused_paired below).
// At 64 columns (warps == 4) that holds for the value blocks of a call and, in a split's stage 1
// (map_out set), for pairs that do not straddle the value and map blocks. At 128 (warps == 8) only
// in a split's stage 1 of one value and one map CTA per segment where the planner asks for it
// (ChunkedParams::cp_pairs; exact splits: the decay shortcut stops the map walks early).
// 1: no clusters.
inline unsigned fused_cluster_x(int warps, const ChunkedParams& p, dim3 grid) {
  if (grid.x % 2 != 0) return 1u;
  if (warps == 8)
    return p.cp_pairs && p.map_out != nullptr && p.map_end == nullptr && p.value_blocks == 1 && grid.x == 2 ? 2u : 1u;
  if (warps != 4) return 1u;
  if (p.map_out != nullptr && p.value_blocks % 2 != 0) return 1u;
  return 2u;
}

// Whether the CTA shares records with the other CTA of its cluster (ranks 0 and 1, CTAs x and x ^ 1
// of the grid): the launch (fused_cluster_x above) forms clusters of two only where both
// CTAs of every pair walk the same chunks of the same head (two value-column blocks of 64, two
// map-column blocks of 64 of a split's stage 1, or its value and map CTA of 128, value_map_pair),
// so their records are equal. Rank r then forms Mt of the chunks j with j % 2 == r and copies it into the peer's stage;
// for the others it forms only G, gam and dec (with kAuxP nothing: the copy has them) and its walk
// waits for the peer's copy:
//   F::rec_full_bar(s)  the peer's copy of a chunk of stage s has landed (the aux arms it with the
//                       bytes; the copy completes them), k-th use for the chunk 6k + c;
//   F::rec_free_bar(s)  the peer's walk is done with the chunk in its stage s that it formed
//                       itself (one remote arrival per state warp), before chunk j + 3, this CTA's,
//                       is copied there.
// Three record stages let the copy run while the walk is still one or two chunks behind.
template <class F>
__device__ __forceinline__ bool fused_paired() {
  // 128-column CTAs pair only as a split's value and map CTA (dk = 128, a walk list).
  if constexpr (F::kRecStages != 3 || (F::DVB == 128 && (!F::kWalks || F::DK != 128))) return false;
  return cluster_size() == 2;
}
// For chunk j (the j-th of the CTA's walks) of a pair: whether this CTA forms its Mt and copies it
// to the peer (own), or the peer does (from the peer). Both read the cluster's special registers
// at each use rather than hold the pair and rank in registers across the walk (the state and aux
// warpgroups of the 128-column kernel are at their budgets); the 64-column pairs (kAuxP), which
// keep 232 registers (255 without the producer warpgroup), hold the rank instead (PairTests).
template <class F>
__device__ __forceinline__ bool pair_own(int j) {
  return fused_paired<F>() && (j & 1) == static_cast<int>(cluster_rank());
}
template <class F>
__device__ __forceinline__ bool pair_from_peer(int j) {
  return fused_paired<F>() && (j & 1) != static_cast<int>(cluster_rank());
}
// The same tests with the rank read once and held (kHeld: the 64-column pairs, kAuxP; rank -1 when
// not paired), or read at each use as above.
template <class F, bool kHeld>
struct PairTests {
  int rank = -1;
  __device__ PairTests() {
    if constexpr (kHeld) rank = fused_paired<F>() ? static_cast<int>(cluster_rank()) : -1;
  }
  __device__ bool own(int j) const {
    if constexpr (kHeld) return rank >= 0 && (j & 1) == rank;
    return pair_own<F>(j);
  }
  __device__ bool from_peer(int j) const {
    if constexpr (kHeld) return rank >= 0 && (j & 1) != rank;
    return pair_from_peer<F>(j);
  }
};

// A chunk position in the CTA's list of walks: list entry i, chunk at token c0 of a walk ending at
// eos; i >= walk_count: past the end. 32-bit (TMA coordinates are, and launch_fused refuses
// larger calls): three registers per position.
struct ChunkPos {
  int i, eos, c0;
  __device__ int nrows() const { return eos - c0 < kChunk ? eos - c0 : kChunk; }
};

// The CTA's chunks in walk order: first() is chunk 0, next(c) the one after c (past the end:
// !valid(c)). Empty walks have no chunks. kCached: the list's end and stride read once (cache(),
// before first use) and held in registers, instead of from the parameters (and, with
// longest-first shares, shared memory) at every call.
template <bool kWalks, bool kCached = false>
struct ChunkCursor {
  const ChunkedParams& p;
  const int* order;
  std::int64_t end_ = 0;
  int stride_ = 0;
  __device__ void cache() {
    const ListSpan l = cta_list<kWalks>(p, order);
    end_ = l.end, stride_ = l.stride;
  }
  __device__ bool valid(const ChunkPos& c) const {
    if constexpr (kCached) return c.i < end_;
    return c.i < cta_list<kWalks>(p, order).end;
  }
  // The first chunk of the first non-empty walk among the CTA's list entries from i on (cta_list).
  __device__ ChunkPos seek(int i) const {
    const ListSpan l = cta_list<kWalks>(p, order);
    for (; i < l.end; i += l.stride) {
      int bos, eos;
      walk_range<kWalks>(p, order, i, bos, eos);
      if (eos > bos) return {i, eos, bos};
    }
    return {i, 0, 0};
  }
  __device__ ChunkPos first() const { return seek(cta_list<kWalks>(p, order).first); }
  __device__ ChunkPos next(const ChunkPos& c) const {
    if (c.c0 + kChunk < c.eos) return {c.i, c.eos, c.c0 + kChunk};
    return seek(c.i + (kCached ? stride_ : cta_list<kWalks>(p, order).stride));
  }
};

}  // namespace gdnkit::cuda
