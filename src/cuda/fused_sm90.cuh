// The fused SM90 kernel (docs/fused-kernel-design.md): the prep and the state walk of the CUDA
// path in one warp-specialised CTA per (value block of DVB = 128 or 64 columns, head, sequence
// list), so that no record goes through global memory and K and Q are read once.
//
// One aux warpgroup, DVB / 64 state warpgroups and, in the unsplit 64-column kernels, a producer
// warpgroup (384 threads; the walk-list 64-column kernels 256):
//   aux (warps 0-3)    computes each chunk's record into shared memory up to R - 1 chunks ahead of the
//                      walk: K K^T on wgmma (both operands from the swizzled K tile, in flight
//                      while the gates' cumsum G is formed), gam/dec, A = diag(beta) K K^T .* D
//                      (D_ij = exp(G_i - G_j)), its fp32 inverse D .* Tu (invert_unit_lower, the
//                      prep kernel's), and Mt = (D .* Tu) diag(beta) as hi + lo, straight into the
//                      128-byte-swizzled tiles the walk's wgmma reads. With kBlockSolve (every
//                      kernel by default; GDNKIT_FUSED_BLOCK_SOLVE64) only the inverses of its two
//                      32 x 32 diagonal blocks, Mt's two diagonal 32 x 32 blocks and
//                      -C = -(K K^T) .* D below them: the walk finishes Vn by block substitution
//                      (docs/math.md). Without it the whole Mt (the blocks left of the diagonal
//                      from the inverse's registers, the diagonal ones from At before the block rows).
//                      Its thread 0 issues the first chunks' TMA copies;
//   state (warps 4-)   warpgroups of 64 value columns: P = scale (Q K^T) .* D, each warpgroup its
//                      share of the columns (fused_p; in the kAuxP instantiation, for 64-column
//                      pairs, the aux's, with A in fused_record), then the wgmma walk's chunk
//                      step (walk_chunk with WgmmaWalk's products), the state in registers
//                      throughout. State thread 0 issues the later chunks' TMA copies as each
//                      step frees a stage (with two state warpgroups while the step's K S and
//                      Q S are in flight), at the positions the aux publishes (F::ahead): the
//                      aux, the bound, issues none;
//   producer (warp 8)  in the unsplit 64-column kernels (F::kProducer) the copies and O stores
//                      that state thread 0 issues elsewhere, as the state warpgroup finishes each
//                      step (fused_producer), at positions from its own cursor (the aux publishes
//                      none there): a state thread that issued them stalled the whole
//                      warpgroup's next step. Warps 9-11 only give up their registers.
// With two state warpgroups, registers move from the aux to them (setmaxnreg: 120 + 2 x 192 =
// 3 x 168; below 192 for the state, ptxas serializes every wgmma of the kernel, C7512; the aux
// fits 120 without spills since Q K^T moved to the state warpgroups and the chunk cursor is
// 32-bit). With the producer, from it to the others (40 + 2 x 232; they use up to 220). The
// walk-list 64-column kernels keep 255 in both warpgroups.
//
// Shared memory rings: K+Q in three stages (chunk c is read by the aux for its record while the
// walk runs chunk c - 1, then by the walk; chunk c + 1's copies are in flight meanwhile), V in two
// (a full chunk's V stage then holds its O for a TMA store), the record (and its gates) in
// R = F::kRecStages = 3 (the unsplit 128-column kernel: 2 with GDNKIT_FUSED_REC_STAGES=2), P in
// one buffer (in the record stages with kAuxP); mbarriers track the copies. Named barriers:
// FULL[c % R] (aux arrives when chunk c's K, Q, gates and record are in place; V's mbarrier the
// state warps wait for themselves after FULL), EMPTY[c % R] (the state warps arrive when done
// with chunk c; the aux waits before it reuses chunk c's stages for chunk c + R), P (the state
// warpgroups' P and tail V rows are in place, before the walk reads them; in the
// 128-column kernels met just before P Vn, and after FULL only by a tail chunk: FusedLateP).
// The aux's own barrier orders its phases.
// The two 64-column CTAs of a walk, and the value and map CTA of a split's segment at 128 columns,
// run as a cluster and share the records (fused_paired).
//
// Tail chunks: a TMA box always holds 64 rows, so past a sequence's end it copies the next
// sequence's rows (or zeros past the tensor). With finite values they would cancel exactly (zero
// gates, beta and Mt columns), but a non-finite neighbour would turn 0 x inf into NaN: the aux
// zeroes those rows of K and Q before its own products read them, and each state warpgroup zeroes
// the rows of its V columns that the walk reads (racecheck flags the aux doing it across the FULL
// barrier; masking X in the walk costs the walk spills). Gates and beta of padding rows
// are 0; the walk runs only the valid row blocks and writes only valid rows, so nothing past a
// sequence's end is written (a TMA store, whose box is 64 rows, only ever takes a full chunk; a
// tail's O goes out by ordinary stores of its valid rows). The descriptors are kernel parameters
// (__grid_constant__), never modified.
#pragma once

#include "cuda/fused_sm90_aux.cuh"
#include "cuda/fused_sm90_state.cuh"

namespace gdnkit::cuda {

// One CTA: its barriers and the record tiles' zeros (overlapping the previous kernel, PDL), its
// walk-list entries or longest-first order into shared memory, then the roles (aux: threads
// 0-127, fused_aux; state: the next 128 or 256, fused_state; producer: the last 128 where
// F::kProducer, fused_producer), registers moved between them by setmaxnreg.
// kPacked (walk-list kernels only): a packed split's stage 1 that places its own entries
// (cp_warp_packed_stage1) instead of reading the builder's list.
template <class F, bool kPacked = false>
__device__ __forceinline__ void fused_cta(const FusedParams& fp) {
  GDNKIT_DYNAMIC_SMEM(smem_raw);
  unsigned char* const smem =
      smem_raw + ((kSwizzleAtomBytes - (smem_addr(smem_raw) & (kSwizzleAtomBytes - 1))) & (kSwizzleAtomBytes - 1));
  const int tid = threadIdx.x;
  int* const order = reinterpret_cast<int*>(smem + F::off_order);
#ifdef GDNKIT_FUSED_TIMELINE
  if (tid == 0)
    for (int i = 0; i < kTimelineOwnSlots; ++i) fused_timeline[i] = 0;
#ifdef GDNKIT_STEP_MARKS
  if (tid < 2) step_mark_chunk[tid] = -1;
  for (int i = tid; i < 6 * kMarkChunks * 16; i += blockDim.x) (&step_marks[0][0][0])[i] = 0;
#endif
#endif
  GDNKIT_FUSED_STAMP(tid == 0, 0);
  if (tid == 0) {
    tma_prefetch(&fp.k);
    tma_prefetch(&fp.q);
    tma_prefetch(&fp.v);
    for (int s = 0; s < 3; ++s) mbar_init(F::kq_bar(smem, s), 1);
    for (int s = 0; s < 2; ++s) mbar_init(F::v_bar(smem, s), 1);
    for (int s = 0; s < F::kRecStages; ++s) {
      mbar_init(F::rec_full_bar(smem, s), 1);
      mbar_init(F::rec_free_bar(smem, s), 4 * F::kStateWarpgroups);
    }
    mbar_init_fence();
  }
  // The record tiles' zeros (the aux's threads), before this CTA's records (fused_record's first
  // barrier orders them) and, in a pair, before the peer's first copy into them (the cluster
  // barrier below, which also has the peer's barriers initialised before any copy or arrival
  // reaches them).
  if (tid < 128) zero_record_tiles<F>(smem, tid);
  // Every launch is a programmatic dependent one (pdl_launch.h): the CTA may start while the kernel
  // ahead of it on the stream still runs. The barriers, the descriptor prefetches and the zeros
  // above overlap it; nothing in global memory is read or written before this wait.
  grid_dependency_wait();
  static_assert(F::kWalks || !kPacked, "only a walk list is placed");
  if constexpr (kPacked) {
    if (tid < 32) cp_warp_packed_stage1(fp.p, reinterpret_cast<WalkSpan*>(order), tid);
  } else if constexpr (F::kWalks) {
    // The CTA's entries, into shared memory (walk_entry) before the barrier below.
    if (tid < kCtaWalks) {
      const std::int64_t i = blockIdx.z + static_cast<std::int64_t>(tid) * gridDim.z;
      if (i < fp.p.num_walks) reinterpret_cast<WalkSpan*>(order)[tid] = cp_walk_entry(fp.p, fp.p.walks, i, false);
    }
  }
  if (fp.p.longest_first) {
    rank_longest_first<F::kLaunchThreads>(fp.p, order, order + kLongestFirstMaxSeqs, tid);  // ends with a CTA barrier
    if (!F::kWalks && fp.p.lpt) {
      if (tid < 32) lpt_share(fp.p, order, order + kLongestFirstMaxSeqs, tid);
      __syncthreads();
    }
  } else {
    __syncthreads();  // the barriers are initialised
  }
  if (fused_paired<F>()) cluster_sync();
  GDNKIT_FUSED_STAMP(tid == 0, 1);
  if (tid < 128) {
    if constexpr (F::kStateWarpgroups == 2) regs_down<F::kAuxRegs>();
    if constexpr (F::kProducer) regs_up<F::kRoleRegs>();
    fused_aux<F>(fp, smem, order, tid);
  } else if (F::kProducer && tid >= F::kThreads) {
    if constexpr (F::kProducer) {
      regs_down<F::kProducerRegs>();
      if (tid < F::kThreads + 32) fused_producer<F>(fp, smem, order, tid - F::kThreads);
    }
  } else {
#if GDNKIT_PROBE_COPIES
    if constexpr (F::kKqFirst && !F::kProducer)
      if (tid == 128) fused_later_first_copies<F>(fp, smem, order);
#endif
    if constexpr (F::kStateWarpgroups == 2) regs_up<F::kStateRegs>();
    if constexpr (F::kProducer) regs_up<F::kRoleRegs>();
    fused_state<F>(fp, smem, order, tid - 128);
  }
  GDNKIT_FUSED_STAMP(tid % 32 == 0, 32 + tid / 32);
  // Neither CTA of a pair exits while the other may still copy into it or arrive on its barriers.
  if (fused_paired<F>()) cluster_sync();
#ifdef GDNKIT_FUSED_TIMELINE
  __syncthreads();
  if (tid == 0) {
    fused_timeline[6] = global_ns();
    const unsigned cta = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
    if (fp.timeline != nullptr && cta < kTimelineCtas)
      for (int i = 0; i < kTimelineSlots; ++i)
#ifdef GDNKIT_STEP_MARKS
        fp.timeline[kTimelineSlots * cta + i] =
            i < kTimelineOwnSlots ? fused_timeline[i]
                                  : static_cast<unsigned long long>((&step_marks[0][0][0])[i - kTimelineOwnSlots]);
#else
        fp.timeline[kTimelineSlots * cta + i] = fused_timeline[i];
#endif
  }
#endif
}

// grid = (dv / DVB, H, min(N, 65535) or fewer); F::kLaunchThreads threads. Images other than sm_90a
// hold only a trap (the planner never picks the kernel there).
template <typename T, int DK, int DVB, bool kWalks = false, bool kAuxP = false, bool kPacked = false>
__global__ void __launch_bounds__(FusedSm90<T, DK, DVB, kWalks, kAuxP>::kLaunchThreads, 1)
    gdn_fused_kernel(const __grid_constant__ FusedParams fp) {
#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
  __trap();
#else
  fused_cta<FusedSm90<T, DK, DVB, kWalks, kAuxP>, kPacked>(fp);
#endif
}

// A split's stage 1 in lead mode (cp.h, CpLayout::lead): one sequence in two segments, each walked
// by the kernel whose step suits it, in one launch of grid (2, H, 2) in clusters of two along x.
//   blockIdx.z == 0: the first segment, from the initial state, by the unsplit 64-column pairs
//                    (`lead`: cp_lead_params cuts the sequence at the segment's end and sends its end
//                    state to E's slot 0 as the final state);
//   blockIdx.z == 1: the second segment, by its value and map pair at 128 columns (`rest`: stage 1's
//                    parameters with the computed list, whose entry 1 is that segment: the CTA's
//                    first entry is blockIdx.z of a list strided by gridDim.z = 2).
// The pairs' step is ~60% of the 128-column pair's, so the first segment is the longer one and the
// two finish together on 4 H SMs (docs/perf-notes.md, "Lead mode").
struct FusedLeadParams {
  FusedParams lead, rest;
};
template <typename T>
using FusedLeadPairs = FusedSm90<T, 128, 64, false, true>;
template <typename T>
using FusedLeadRest = FusedSm90<T, 128, 128, true, false>;
template <typename T>
__device__ __forceinline__ void fused_lead_cta(const FusedLeadParams& fp) {
  static_assert(FusedLeadPairs<T>::kLaunchThreads == FusedLeadRest<T>::kLaunchThreads, "one block size");
  if (blockIdx.z == 0)
    fused_cta<FusedLeadPairs<T>>(fp.lead);
  else
    fused_cta<FusedLeadRest<T>>(fp.rest);
}
template <typename T>
__global__ void __launch_bounds__(FusedLeadRest<T>::kLaunchThreads, 1)
    gdn_fused_lead_kernel(const __grid_constant__ FusedLeadParams fp) {
#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
  __trap();
#else
  fused_lead_cta<T>(fp);
#endif
}

}  // namespace gdnkit::cuda
