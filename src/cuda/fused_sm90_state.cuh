// The fused SM90 kernel's state warpgroups: P, the wgmma walk's chunk steps with the state in
// registers, O stored by TMA, the later chunks' copies, and the start and final states of every
// walk.
#pragma once

#include "cuda/fused_sm90_copies.cuh"
#include "cuda/fused_sm90_probe.cuh"
#include "cuda/fused_sm90_record.cuh"
#include "cuda/fused_sm90_scheduler.cuh"

namespace gdnkit::cuda {

// With F::kKqFirst, the first copies after chunk 0's K and Q (the aux's): V of chunk 0, then K, Q
// of chunks 1-2 and V of chunk 1, once chunk 0's K and Q have landed. By state thread 0 in fused_cta,
// before its setmaxnreg and walk (which waits for the first record anyway): from the aux's loop
// they cost the long rows 1-2% (the loop's code changed); inside fused_state the 128-column
// kernels spilled.
template <class F>
__device__ __forceinline__ void fused_later_first_copies(const FusedParams& fp, unsigned char* smem, const int* order) {
  const ChunkCursor<F::kWalks> chunks{fp.p, order};
  const FusedCopier<F> copy{fp, smem};
  ChunkPos c = chunks.first();
  if (!chunks.valid(c)) return;
  mbar_wait(F::kq_bar(smem, 0), 0);
  copy.v(c.c0, 0);
  c = chunks.next(c);
  for (int k = 1; k < 3 && chunks.valid(c); ++k, c = chunks.next(c)) {
    copy.kq(c.c0, k);
    if (k < 2) copy.v(c.c0, k);
  }
}

// Whether the state warpgroups take opaque copies of the lane's constants per walk: in the
// walk-list kernels with the block solve, whose state warpgroups hold more per-walk values, what
// the optimiser derived from those constants and kept across the walks spilled. The other
// kernels' code stays as it was.
template <class F>
constexpr bool kOpaqueLane = F::kWalks && F::kBlockSolve;
// x, opaque to the optimiser (opaque) where kOpaqueLane.
template <class F>
__device__ __forceinline__ int walk_opaque(int x) {
  if constexpr (kOpaqueLane<F>) return opaque(x);
  return x;
}

// The state warpgroups (tid = thread index among their 256): every walk in the CTA's list (a
// sequence, or in the walk-list variant an entry of p.walks), empty ones included (their final
// state is the start one).
template <class F>
__device__ __forceinline__ void fused_state(const FusedParams& fp, unsigned char* smem, const int* order, int tid) {
  const ChunkedParams& p = fp.p;
  const FusedCopier<F> copy{fp, smem};
  using T = typename F::T;
  constexpr int DK = F::DK;
  using W = typename F::Walk;
  constexpr int C = kChunk;
  const int warp = tid / 32, lane = tid % 32;
  const int h = blockIdx.y;
  // In the pairs (kAuxP) the pair's rank read once, -1 when not paired (fused_aux says why).
  const PairTests<F, F::kAuxP> pair;
  // A map CTA's columns are columns of M (dk x dk), the others value columns.
  const bool is_map = F::kWalks && map_cta(p);
  const int v0 = (is_map ? static_cast<int>(blockIdx.x) - p.value_blocks : static_cast<int>(blockIdx.x)) * F::DVB;
  const WalkLane l = walk_lane(warp, lane);
  if (is_map) {  // V = 0 in both stages, for good (no copies land there); ordered by FULL
    for (int idx = tid; idx < int(2 * F::v_bytes / 16); idx += 128 * F::kStateWarpgroups)
      reinterpret_cast<uint4*>(F::v(smem, idx / int(F::v_bytes / 16)))[idx % int(F::v_bytes / 16)] =
          make_uint4(0u, 0u, 0u, 0u);
  }

  // The lane's state column and key pair; opaque copies at each walk's start and end where
  // kOpaqueLane (what is derived from them, offsets and the map's identity, was otherwise hoisted
  // out of the walks and spilled).
  struct LaneCol {
    int col, t;
  };
  const auto lane_col = [&] { return LaneCol{walk_opaque<F>(v0 + l.cw + l.g), walk_opaque<F>(l.t)}; };

  float st[DK / 8][4];
  constexpr int R = F::kRecStages;
  int j = 0;
  // O of a full chunk goes out by TMA: every warp stages its columns in the chunk's V stage, which
  // only its own make_x read and nothing rewrites before chunk j + 2's V copy (stored directly, O
  // cost ~8% of the step; staged, 1-2%: docs/perf-notes.md, "O stored by TMA"). With two state
  // warpgroups, state thread 0 stores the stage after the next FULL barrier (every warp's stmatrix
  // done) and waits for the store's reads before that copy. With one (64-column pairs, whose aux
  // sets the step), the warps meet at a barrier of their own after staging and thread 0 stores at
  // once, so that V's copy stays right after FULL (moved after the store, it made the pairs 2.5-4.5%
  // slower). A map CTA's map_o is in fragment order, which a TMA box does not write: direct stores,
  // as for tails.
  constexpr bool kStoreAtEnd = F::kStateWarpgroups == 1;
  // With one state warpgroup, chunk j + 3's K and Q are copied at the end of step j (1.9-2.7% off
  // the 64-column pairs against the order below). With two, chunk j + 2's right after FULL of
  // chunk j in the walk-list kernels (GDNKIT_FUSED_KQ_FIRST), in walk_chunk's aside otherwise.
  constexpr bool kKqAtEnd = kStoreAtEnd;
  constexpr bool kKqFirst = !kKqAtEnd && (GDNKIT_FUSED_KQ_FIRST == 1 || (GDNKIT_FUSED_KQ_FIRST == 2 && F::kWalks));
  int o_pending = -1;  // first token of the staged chunk not yet stored (-1: none)
  // Thread 0: the stage of chunk c (its first token o_pending). FusedCopier::o is the same store for
  // the producer warp; calling it here changed this kernel's SASS, which is the one timed.
  const auto store_staged_o = [&](int c) {
#pragma unroll
    for (int b = 0; b < F::DVB / 64; ++b)
      tma_store_3d(&fp.o, reinterpret_cast<const unsigned char*>(F::v(smem, c % 2)) + b * (C * 128), v0 + 64 * b,
                   o_pending, h);
    bulk_commit();
  };
  // Walk i's sequence (for its initial and final state).
  auto walk_seq = [&](std::int64_t i) -> std::int64_t {
    if constexpr (F::kWalks) return walk_entry(order, i).seq;
    return p.longest_first ? order[i] : i;
  };
  const ListSpan list = cta_list<F::kWalks>(p, order);
  for (std::int64_t i = list.first; i < list.end; i += list.stride) {
    // The walk: a sequence, or an entry of the walk list (its own start state, perhaps no final one).
    std::int64_t bos, eos, start_index = walk_seq(i);
    const float* start = p.has_initial_state ? p.initial_state : nullptr;
    bool write_o = true;
    if constexpr (F::kWalks) {
      const WalkSpan w = walk_entry(order, i);
      if (is_map && w.map < 0 && !value_map_pair(p)) continue;  // as the aux (walk_range)
      bos = w.begin, eos = is_map ? map_walk_end(p, w) : w.end;
      if (w.state_in >= 0) start = p.walk_states, start_index = w.state_in;
      else if (w.state_in == kStateZero) start = nullptr;
      write_o = w.out != 0 && (!is_map || (p.map_o != nullptr && w.map >= 0));
    } else {
      seq_range(p, start_index, bos, eos);
    }
    {
      const LaneCol c = lane_col();
      if (is_map)
        identity_state_tiles<DK>(st, c.col, c.t);
      else
        load_state_tiles<DK>(st, p, start, lane_state_offset<DK>(p, start_index, h, c.col, c.t));
    }
    bool zero_state = !is_map && start == nullptr;  // then the first chunk skips K S and Q S
    for (std::int64_t c0 = bos; c0 < eos; c0 += C, ++j) {
      const int nrows = static_cast<int>(eos - c0 < C ? eos - c0 : C);
      const int orows = write_o ? nrows : 0;  // rows of O stored
      FusedProbe probe;
#ifdef GDNKIT_FUSED_PROBE
      probe.on = tid == 0 && blockIdx.x == 0 && blockIdx.y == 0 && blockIdx.z == 0 && j == 8;
#endif
      probe.mark();
#ifdef GDNKIT_STEP_MARKS
      if (tid % 128 == 0)
        step_mark_chunk[tid / 128] = j >= fp.timeline_j0 && j < fp.timeline_j0 + kMarkChunks ? j - fp.timeline_j0 : -1;
#endif
      GDNKIT_STEP_MARK(0);
      const int s = j % R;
      const bool from_peer = pair.from_peer(j);
      if (from_peer && j >= 1) {  // done with this CTA's Mt of chunk j - 1: the peer may copy chunk j + 2 there
        __syncwarp();
        if (lane == 0) mbar_arrive_cluster(peer_smem(F::rec_free_bar(smem, (j - 1) % R), cluster_rank() ^ 1u));
      }
      // Every state thread is past step j - 1, so its stages are free: V of chunk j + 1 and K, Q of
      // chunk j + 2 go there (chunks 0-2 and 0-1 are the aux's; K and Q above where kKqFirst). With
      // two state warpgroups, state thread 0 issues them while the step's K S and Q S are in flight
      // (walk_chunk's aside): issued here, before P, they had kept every other state warp waiting
      // at the P barrier (2-6% slower on the 128-column rows; issuing K and Q alone first is still
      // 4-7% slower in the unsplit kernel). With one (64-column pairs, whose aux sets the step)
      // they are issued here: later, they delayed the aux's next records (1-2% slower;
      // docs/perf-notes.md).
      // V's copy goes there too where O is staged: it waits for the store's reads of the stage.
      constexpr bool kCopiesAside = F::kStateWarpgroups == 2, kVAside = kCopiesAside || !kStoreAtEnd;
      const auto copy_kq = [&] {
#if GDNKIT_PROBE_COPIES
        if (!kKqFirst && !kKqAtEnd && tid == 0 && j >= 1) {
          const int a = F::ahead(smem, s)[1];
          if (a >= 0) copy.kq(a, (j + 2) % 3);
        }
#endif
      };
      const auto copy_v = [&] {
#if GDNKIT_PROBE_COPIES
        if (!F::kProducer && tid == 0 && j >= 1) {
          const int a = F::ahead(smem, s)[0];
          if (a >= 0) {
#if !GDNKIT_FUSED_PROBE_NO_VWAIT
            bulk_wait_read<0>();  // chunk j - 1's O, staged where V goes
#endif
            copy.v(a, (j + 1) % 2);
          }
        }
#endif
      };
      const auto aside = [&] {
        if constexpr (kCopiesAside) copy_kq();
        if constexpr (kVAside) copy_v();  // after K and Q: it waits for the O store's reads
      };
      unsigned char* const rec = F::rec(smem, s);
      const float* const p_gates = reinterpret_cast<const float*>(smem + F::off_gates + s * F::gates_bytes) + C;
      // From FULL (the record in place) to the walk. With kKsEarly a full chunk's K S and Q S go
      // first, once its K and Q have landed, and this runs while they are in flight (walk_aside).
      const bool ks_early = F::kKsEarly && nrows == C;
      const auto after_full = [&] {
        named_sync(F::kBarFull + s, F::kThreads);
        GDNKIT_FUSED_STAMP(tid == 0 && j == 0, 3);
        GDNKIT_FUSED_STAMP_STEP(tid == 0, j, fp.timeline_j0, 8);
        if (from_peer) mbar_wait(F::rec_full_bar(smem, s), (j / 6) & 1);  // the peer's copy (fused_paired)
#if GDNKIT_PROBE_COPIES && !GDNKIT_FUSED_PROBE_NO_VWAIT
        mbar_wait(F::v_bar(smem, j % 2), (j / 2) & 1);  // this chunk's V (the aux's FULL does not cover it)
#endif
        GDNKIT_STEP_MARK(1);
        // Past FULL of chunk j every state thread is done with step j - 1, so chunk j - 1's stages
        // are free (below). In the walk-list kernels chunk j + 2's K and Q go there first, ahead of
        // the O store and V's copy (kKqFirst; the 64-column kernels have copied them already, at the
        // end of step j - 1: kKqAtEnd).
#if GDNKIT_PROBE_COPIES
        if (kKqFirst && tid == 0 && j >= 1) {
          const int a = F::ahead(smem, s)[1];
          if (a >= 0) copy.kq(a, (j + 2) % 3);
        }
#endif
        if constexpr (!kStoreAtEnd)
          if (tid == 0 && o_pending >= 0) store_staged_o(j - 1);
        if constexpr (!kVAside) copy_v();
        if constexpr (!kCopiesAside) copy_kq();
        probe.mark();
        if (nrows < C) {
          // A tail chunk: each warpgroup zeroes the rows of its own 64 V columns that the walk reads
          // past the end, [nrows, 16 nb) (TMA filled them from the next sequence; at most 15 rows of
          // 8 16-byte words: one store per thread).
          // (The thread's indices from an opaque tid: hoisted out of the walk, they had spilled.)
          const int ot = opaque(tid), idx = ot % 128, r = nrows + idx / 8;
          if (r < 16 * ((nrows + 15) / 16))
            *reinterpret_cast<uint4*>(reinterpret_cast<unsigned char*>(F::v(smem, j % 2)) + (ot / 128) * (C * 128) +
                                      swizzle128(r, idx % 8)) = make_uint4(0u, 0u, 0u, 0u);
        }
        if constexpr (!F::kAuxP) fused_p<F>(F::kq(smem, j % 3), F::p_tile(smem, s), p_gates, p.scale, tid);
        // The zero V rows and P, before the walk reads them (and a later TMA copy rewrites V); where
        // kPBarrierLate, only a tail's V rows here and P just before P Vn (FusedLateP).
        if (!F::kPBarrierLate || nrows < C) {
          gmma_smem_fence();
          named_sync(F::kBarP, 128 * F::kStateWarpgroups);
        }
        GDNKIT_STEP_MARK(2);
      };
      if constexpr (F::kKsEarly) {
        if (!ks_early) after_full();
#if GDNKIT_PROBE_COPIES
        else mbar_wait(F::kq_bar(smem, j % 3), (j / 3) & 1);  // this chunk's K and Q (as the aux waits)
#endif
      } else {
        after_full();
      }
      const auto walk_aside = [&] {
        if constexpr (F::kKsEarly)
          if (ks_early) after_full();
        aside();
      };
      const WalkStage<T> S{nullptr, F::kq(smem, j % 3), rec, F::v(smem, j % 2),
                           reinterpret_cast<const float*>(rec + F::rec_gam), F::p_tile(smem, s)};
      // A map CTA's "o" rows (the start state's share of o) go to map_o in the correction's
      // fragment order (map_o_piece; walk_chunk's negative o_token). Recomputed per chunk from the
      // parameters (opaque: not held in registers across the walk).
      const bool to_map = F::kWalks && opaque(static_cast<int>(is_map)) != 0;
      const std::int64_t o_token = to_map ? -p.map_o_token : p.o_token;
      // (The map piece's lane and k-step from an opaque thread index: kept from before the walk,
      // they cost the walk-list kernels a spilled register.)
      const int mt = opaque(tid);
      const int mkk = (to_map ? (static_cast<int>(blockIdx.x) - p.value_blocks) * (F::DVB / 16) : 0) + mt / 32;
      // (Where kOpaqueLane, O's column from an opaque copy: held across the walks, it spilled.)
      T* const ohead = static_cast<T*>(p.o) + static_cast<std::int64_t>(h) * p.o_head;
      T* const orow0 = to_map ? static_cast<T*>(p.map_o) + map_o_piece(c0, h, mkk, mt % 32, p.num_heads, DK)
                       : kOpaqueLane<F> ? ohead + opaque(v0 + l.cw) + c0 * o_token
                                        : ohead + v0 + l.cw + c0 * o_token;
      unsigned char* const o_stage = nrows == C && (!F::kWalks || (orows > 0 && !to_map))
                                         ? reinterpret_cast<unsigned char*>(F::v(smem, j % 2))
                                         : nullptr;
      const auto walk = [&](auto& a) {
#if GDNKIT_FUSED_PROBE_SKIP == 2
        if (nrows > 0) a();
        else
#endif
        switch ((nrows + 15) / 16) {
          case 4: walk_chunk<W, 4, true>(st, S, l, zero_state, orows, p.scale, orow0, o_token, a, o_stage); break;
          case 3: walk_chunk<W, 3>(st, S, l, zero_state, orows, p.scale, orow0, o_token, a); break;
          case 2: walk_chunk<W, 2>(st, S, l, zero_state, orows, p.scale, orow0, o_token, a); break;
          default: walk_chunk<W, 1>(st, S, l, zero_state, orows, p.scale, orow0, o_token, a); break;
        }
      };
      if constexpr (!F::kPBarrierLate) {
        walk(walk_aside);
      } else {
        FusedLateP<F, decltype(walk_aside)> late{walk_aside};
        walk(late);
      }
      if (o_stage != nullptr) gmma_smem_fence();  // the staged O, for the TMA store (async proxy)
      o_pending = o_stage != nullptr ? static_cast<int>(c0) : -1;
      if constexpr (F::kProducer) {
        // The producer stores the staged O and copies chunk j + 3's K and Q and chunk j + 2's V once
        // every state warp is past here (its stmatrix fenced above, its products retired).
        named_arrive(F::kBarProd + j % 2, 128 + 32);
        o_pending = -1;
      } else if constexpr (kStoreAtEnd) {
        if (kKqAtEnd || o_pending >= 0) named_sync(F::kBarP, 128);  // every warp's stmatrix and products
#if GDNKIT_PROBE_COPIES
        if (kKqAtEnd && tid == 0) {  // chunk j's K and Q stage is free: chunk j + 3's go there
          const int a = F::ahead(smem, s)[2];
          if (a >= 0) copy.kq(a, j % 3);
        }
#endif
        if (o_pending >= 0 && tid == 0) store_staged_o(j);
        o_pending = -1;
      }
      GDNKIT_FUSED_STAMP_STEP(tid == 0, j, fp.timeline_j0, 16);
      named_arrive(F::kBarEmpty + s, F::kThreads);
      probe.mark();
      probe.print("state: full-wait walk");
      zero_state = false;
    }
    if constexpr (F::kWalks) {
      const WalkSpan w = walk_entry(order, i);
      const LaneCol c = lane_col();
      if (is_map) {
        if (w.map >= 0)
          store_map_tiles<DK>(st, p.map_out + (static_cast<std::int64_t>(w.map) * p.num_heads + h) * DK * DK, c.col,
                              c.t);
        continue;
      }
      if (w.state_out >= 0)
        store_state_tiles<DK>(st, p, p.walk_out, lane_state_offset<DK>(p, w.state_out, h, c.col, c.t));
      if (p.want_final_state && w.last) store_state_tiles<DK>(st, p, lane_state_offset<DK>(p, w.seq, h, c.col, c.t));
    } else if (p.want_final_state) {
      const LaneCol c = lane_col();
      store_state_tiles<DK>(st, p, lane_state_offset<DK>(p, walk_seq(i), h, c.col, c.t));
    }
  }
  {  // the last chunk's staged O; no store is in flight at exit
    if (o_pending >= 0) {
      named_sync(F::kBarP, 128 * F::kStateWarpgroups);  // every warp's stmatrix
      if (tid == 0) store_staged_o(j - 1);
    }
    if (tid == 0) bulk_wait<0>();
  }
  GDNKIT_FUSED_STAMP(tid == 0, 4);
#ifdef GDNKIT_FUSED_TIMELINE
  if (tid == 0) fused_timeline[7] = j;
#endif
}

}  // namespace gdnkit::cuda
