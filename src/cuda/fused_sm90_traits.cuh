// The fused SM90 kernel's configuration (fused_sm90.cuh): its compile-time switches, FusedSm90 (an
// instantiation's roles, shared memory layout, barriers and register split) and the kernel's
// parameters, FusedParams.
#pragma once

#include "cuda/pdl.cuh"
#include "cuda/prep_kernel.cuh"
#include "cuda/walk_sm90.cuh"

// Compile-time switches kept for A/B runs (scripts/gpu_check.sh's variants stage; the defaults are
// the measured winners). Forms that lost, or that won and became the only form, are described where
// the code now does one thing, with the measurements in docs/perf-notes.md: O staged for a TMA
// store in every kernel, V waited for by the state warps, the 64-column kernels' K and Q copied at
// the end of a step, P formed with A in the pairs' aux, the record's diagonal blocks two per warp,
// the 128-column kernels' Vn by block substitution.
// GDNKIT_FUSED_FIRST_COPIES: the order of the first copies. 0: the aux copies K, Q of chunks 0-2
// and V of chunks 0-1 at once. 2 (default): the aux copies chunk 0's K and Q alone, and state
// thread 0 the rest once they have landed (fused_later_first_copies), so that a CTA's first
// record does not wait for the whole launch's first burst of copies; the walk-list kernels keep 0.
// Against 0 (docs/perf-notes.md, "The first copies by the state"): 3-7% off the 8-chunk rows,
// 2-4% off the 16-chunk ones, the longer rows level within the run's noise.
#ifndef GDNKIT_FUSED_FIRST_COPIES
#define GDNKIT_FUSED_FIRST_COPIES 2
#endif
// GDNKIT_FUSED_KQ_FIRST: where state thread 0 of the 128-column kernels issues chunk j + 2's K
// and Q copies in step j (the 64-column kernels copy chunk j + 3's at the end of step j).
// 0: while K S and Q S are in flight (walk_chunk's aside, after the O store of chunk j - 1).
// 1: right after FULL of chunk j, before the O store and V. 2 (default): 1 in the walk-list
// kernels, 0 in the unsplit 128-column kernel. Against 0 (docs/perf-notes.md, "Step marks; the K
// and Q copies ahead of the O store"): the splits 2-3.5% faster; in the unsplit 128-column kernel
// 1 was 4-7% slower. (By state thread 128 right after FULL in the unsplit kernel: -2.3% to +1.1%
// in three H100 runs, removed; docs/perf-notes.md, "K and Q copied after FULL by warpgroup 1".)
#ifndef GDNKIT_FUSED_KQ_FIRST
#define GDNKIT_FUSED_KQ_FIRST 2
#endif
// GDNKIT_FUSED_P_BARRIER_LATE: where the 128-column kernels' state warpgroups meet the P barrier
// (their two halves of P in place). 1 (default): just before P Vn, the tile's only reader
// (FusedLateP); a tail chunk also meets it after FULL, once its V rows are zeroed. 0: right after P,
// before the step's first product. Against 0 (docs/perf-notes.md, "P's barrier met before P Vn"):
// the splits 1.7-5.5% faster, the unsplit kernel level to 2.5% faster (H200). Overlapping P's
// epilogue with K S as well was no faster on the splits, spilled, and made the unsplit kernel
// 3-15% slower (measured and removed).
#ifndef GDNKIT_FUSED_P_BARRIER_LATE
#define GDNKIT_FUSED_P_BARRIER_LATE 1
#endif

// GDNKIT_FUSED_PRODUCER: the unsplit 64-column kernels get a third warpgroup, one warp of which
// issues the K, Q and V copies after chunk 0's K and Q and every staged O store (fused_producer; the
// aux keeps chunk 0's copies and a pair's record copies), so that no state thread stalls issuing
// them; the aux and the state warpgroup then keep 232 registers.
// 1 (default). 0: state thread 0 issues them between its steps. Against 0 (docs/perf-notes.md,
// "A producer warp for the 64-column kernels"): the pairs 2.4-3.9% faster; the walk-list kernels,
// which keep state thread 0's copies, unchanged.
#ifndef GDNKIT_FUSED_PRODUCER
#define GDNKIT_FUSED_PRODUCER 1
#endif
// GDNKIT_FUSED_KS_EARLY (kKsEarly below): a full chunk's K S and Q S are issued once its K and Q have
// landed, before the wait for the record (FULL), so that the state's wait for FULL and the products
// overlap. 1 (default): in the unsplit 64-column kernels (kAuxP); 0: after FULL. Tail chunks keep the
// old order: the aux zeroes their K rows past the end before FULL. Against 0 on an H100
// (docs/perf-notes.md, "K S and Q S before FULL"): the pairs 7.7-9.4% faster, on an H200 9.1%. Not in
// the 64-column walk-list kernels (their state forms P: level on an H200, removed) nor in the
// 128-column ones (ptxas spills and serialises their wgmma, even with K S alone before FULL).
#ifndef GDNKIT_FUSED_KS_EARLY
#define GDNKIT_FUSED_KS_EARLY 1
#endif

namespace gdnkit::cuda {

// GDNKIT_FUSED_BLOCK_SOLVE64: which 64-column kernels solve Vn by block substitution, as the
// 128-column ones do. 0: none (the whole inverse), 1: the unsplit pairs (kAuxP) only, 2 (default):
// every one. With Q S late in their walk (GDNKIT_WALK_QS_LATE, walk_sm90.cuh), against 0 on an H100
// (docs/perf-notes.md, "Every 64-column kernel by block substitution"): the fixed-b1 pairs
// 4.6-6.0% faster, the 64-column splits within the noise.
#ifndef GDNKIT_FUSED_BLOCK_SOLVE64
#define GDNKIT_FUSED_BLOCK_SOLVE64 2
#endif
template <typename T_, int DK_, int DVB_ = 128, bool kWalks_ = false, bool kAuxP_ = false>
struct FusedSm90 {
  using T = T_;
  static constexpr int DK = DK_;
  static constexpr int DVB = DVB_;             // value columns per CTA: 64 per state warpgroup
  static_assert(DVB == 64 || DVB == 128, "one or two state warpgroups");
  static constexpr int kStateWarpgroups = DVB / 64;
  // The walk-list variant: walks p.walks (each its own token range, start state and final-state
  // flag) instead of one walk per sequence; the groundwork for splitting sequences.
  static constexpr bool kWalks = kWalks_;
  // P formed by the aux warpgroup with the record, in the record stage (and so copied to the peer
  // with Mt), instead of by the state warpgroup: for 64-column CTAs launched in pairs
  // (fused_cluster_x), whose aux forms every other record. The peer's copy then brings the whole
  // record (Mt, P, gam, dec), and the aux skips the peer's chunks. Alone (no cluster) such a CTA's
  // aux forms every record and P.
  static constexpr bool kAuxP = kAuxP_;
  static_assert(!kAuxP || (DVB_ == 64 && !kWalks_), "P in the aux: the unsplit 64-column kernel");
  static constexpr int kThreads = 128 * (1 + kStateWarpgroups);  // the aux and state warpgroups
  // The producer warpgroup (GDNKIT_FUSED_PRODUCER): the unsplit 64-column kernels.
  static constexpr bool kProducer = DVB_ == 64 && !kWalks_ && GDNKIT_FUSED_PRODUCER != 0;
  static constexpr int kLaunchThreads = kThreads + (kProducer ? 128 : 0);
  static constexpr int kProducerRegs = 40, kRoleRegs = 232;
  static_assert(kProducerRegs + 2 * kRoleRegs <= 3 * 168 && kProducerRegs % 8 == 0 && kRoleRegs % 8 == 0,
                "setmaxnreg budget of a 384-thread CTA");
  // The state warpgroups' products (WgmmaWalk's), with V staged as TMA lands it: 128-byte-swizzled
  // column blocks of 64 value columns.
  // kBlockSolve: the walk solves each chunk's Vn by block substitution over its two 32-token halves:
  // the record holds Mt's two 32 x 32 diagonal blocks and, below them, -C = -(K K^T) .* D, so that the aux's inverse forms 2 of the 6 blocks left of its diagonal
  // (invert_unit_lower's kHalves).
  // The 128-column kernels, whose aux had set the step: unsplit 10-13.5% faster, a split's stage 1
  // (the walk-list kernels) 0.8-1.7%, its errors 4-8% lower. The 64-column kernels, whose one
  // state warpgroup carries the longer chain alone, lost with it while their two roles were
  // balanced (9899e9f); since their aux set the step they gain (GDNKIT_FUSED_BLOCK_SOLVE64 above).
  static constexpr bool kBlockSolve =
      DVB_ == 128 || (GDNKIT_FUSED_BLOCK_SOLVE64 != 0 && kAuxP_) || (GDNKIT_FUSED_BLOCK_SOLVE64 == 2 && DVB_ == 64);
  static constexpr bool kPBarrierLate = DVB_ == 128 && !kAuxP_ && GDNKIT_FUSED_P_BARRIER_LATE != 0;
  // K S and Q S before FULL (GDNKIT_FUSED_KS_EARLY): where P is the aux's (no wgmma between FULL and
  // the walk's K S wait).
  static constexpr bool kKsEarly = kAuxP_ && GDNKIT_FUSED_KS_EARLY != 0;
  struct Walk : WgmmaWalk<T, DK, kStateWarpgroups, kBlockSolve> {
    static constexpr bool kVSwizzled = true;
    static constexpr bool kVOneOffset = kWalks;  // V's ldmatrix offsets (walk_chunk)
  };
  static constexpr int LDA = kChunk + 4;       // fp32 A / Tu rows (as in the prep kernel)
  static constexpr int LDR = 8;
  // Registers per thread: aux + 2 x state = 3 x 168 (a 384-thread launch). Overridable to measure.
#ifndef GDNKIT_FUSED_AUX_REGS
#define GDNKIT_FUSED_AUX_REGS 120
#define GDNKIT_FUSED_STATE_REGS 192
#endif
  // (DVB = 64: with the producer warpgroup 40 + 2 x 232 (kRoleRegs); without, every warpgroup keeps 255.)
  static constexpr int kAuxRegs = GDNKIT_FUSED_AUX_REGS, kStateRegs = GDNKIT_FUSED_STATE_REGS;
  static_assert(kAuxRegs + 2 * kStateRegs <= 3 * 168 && kAuxRegs % 8 == 0 && kStateRegs % 8 == 0,
                "setmaxnreg budget of a 384-thread CTA");
  // Record stages: the aux runs up to kRecStages - 1 records ahead of the walk. CTA pairs sharing
  // records (fused_paired) need the third.
#ifndef GDNKIT_FUSED_REC_STAGES
#define GDNKIT_FUSED_REC_STAGES 3
#endif
  // The aux copies chunk 0's K and Q alone first (GDNKIT_FUSED_FIRST_COPIES).
  static constexpr bool kKqFirst = GDNKIT_FUSED_FIRST_COPIES == 2 && !kWalks;
  static_assert(kKqFirst || !kProducer,
                "the producer takes over the copies after chunk 0's K and Q: GDNKIT_FUSED_FIRST_COPIES=0 needs "
                "GDNKIT_FUSED_PRODUCER=0");
  static_assert(GDNKIT_FUSED_FIRST_COPIES == 0 || GDNKIT_FUSED_FIRST_COPIES == 2, "first copies: 0 or 2");
  static constexpr int kRecStages = DVB == 64 || (kWalks && DK == 128) ? 3 : GDNKIT_FUSED_REC_STAGES;
  static_assert(kRecStages == 2 || kRecStages == 3, "two or three record stages");
  // Named barrier ids (+ stage for FULL and EMPTY); kBarP: the state warpgroups' P is in place.
  // kBarDiag + w / 2: aux warp w + 1's rows of A are in place for warp w (w = 0, 2; the diagonal pairs).
  static constexpr int kBarAux = 1, kBarFull = 2, kBarEmpty = kBarFull + kRecStages, kBarP = kBarEmpty + kRecStages;
  static constexpr int kBarDiag = kBarP + 1;
  // kBarProd + j % 2: the state warpgroup is done with step j (kProducer; fused_producer).
  static constexpr int kBarProd = kBarDiag + 2;
  static_assert(kBarProd + 1 < 16, "hardware named barriers");

  static constexpr std::size_t kq_bytes = 2 * Walk::k_bytes;  // K, then Q
  static constexpr std::size_t m_bytes = Walk::m_bytes;       // one swizzled 64 x 64 tile
  static constexpr std::size_t rec_gam = (kAuxP ? 3 : 2) * m_bytes;  // Mt hi, Mt lo, (P,) then gam, dec
  static constexpr std::size_t rec_bytes =
      (rec_gam + 2 * kChunk * 4 + kSwizzleAtomBytes - 1) / kSwizzleAtomBytes * kSwizzleAtomBytes;
  static constexpr std::size_t v_bytes = std::size_t(DVB / 64) * kChunk * 128;
  static constexpr std::size_t off_kq = 0;                               // 3 stages
  static constexpr std::size_t off_rec = off_kq + 3 * kq_bytes;          // kRecStages stages
  // P of the chunk being walked: one buffer, formed by the state warpgroups after FULL of its chunk,
  // which every state thread reaches only once its previous step (and that step's reads of P) is done.
  // (With kAuxP, P is in the record stages instead.)
  static constexpr std::size_t off_p = off_rec + kRecStages * rec_bytes;
  static constexpr std::size_t off_v = off_p + (kAuxP ? 0 : m_bytes);   // 2 stages
  static constexpr std::size_t off_at = off_v + 2 * v_bytes;             // A, then Tu's diagonal blocks
  static constexpr std::size_t off_tl = off_at + align128(std::size_t(kChunk) * LDA * 4);  // Tu rows 16..63
  static constexpr std::size_t off_r = off_tl + align128(std::size_t(kChunk - 16) * LDA * 4);
  // Per record stage: the gates as loaded, their cumsum G, beta (64 fp32 each), so that the next
  // records' gates are stored while the walk's fused_p still reads this chunk's G.
  static constexpr std::size_t off_gates = off_r + align128(std::size_t(4) * 16 * LDR * 4);
  static constexpr std::size_t gates_bytes = 3 * kChunk * 4;
  static constexpr std::size_t off_order = off_gates + kRecStages * gates_bytes;  // longest-first ranks
  // Per record stage: the first tokens of the next three chunks (-1: none), for state thread 0's copies.
  static constexpr std::size_t off_ahead = off_order + kWalkOrderBytes;
  // mbarriers: K+Q x 3, V x 2, and per record stage a CTA pair's copy landing and release (fused_paired).
  static constexpr std::size_t off_bar = off_ahead + kRecStages * 4 * 4;
  static constexpr std::size_t smem_bytes = off_bar + (5 + 2 * kRecStages) * 8 + kSwizzleAtomBytes;  // + alignment
  static_assert(smem_bytes <= 227 * 1024, "an H100/H200 CTA's shared memory");
  // What a pair shares: Mt hi and lo; with kAuxP also P, gam and dec (the whole record: the aux then
  // skips the peer's chunks).
  static constexpr std::uint32_t rec_copy_bytes = kAuxP ? rec_gam + 2 * kChunk * 4 : 2 * m_bytes;
  static_assert(rec_copy_bytes % 16 == 0 && rec_copy_bytes <= rec_bytes, "one bulk copy of the record stage");
  static_assert(kq_bytes % kSwizzleAtomBytes == 0 && v_bytes % kSwizzleAtomBytes == 0 &&
                    rec_bytes % kSwizzleAtomBytes == 0 && off_bar % 8 == 0,
                "stages keep their alignment");

  __device__ static unsigned char* kq(unsigned char* smem, int s) { return smem + off_kq + s * kq_bytes; }
  __device__ static unsigned char* rec(unsigned char* smem, int s) { return smem + off_rec + s * rec_bytes; }
  // P of the chunk in record stage s.
  __device__ static unsigned char* p_tile(unsigned char* smem, int s) {
    return kAuxP ? rec(smem, s) + 2 * m_bytes : smem + off_p;
  }
  __device__ static T* v(unsigned char* smem, int s) { return reinterpret_cast<T*>(smem + off_v + s * v_bytes); }
  __device__ static int* ahead(unsigned char* smem, int s) { return reinterpret_cast<int*>(smem + off_ahead) + 4 * s; }
  __device__ static std::uint64_t* kq_bar(unsigned char* smem, int s) {
    return reinterpret_cast<std::uint64_t*>(smem + off_bar) + s;
  }
  __device__ static std::uint64_t* v_bar(unsigned char* smem, int s) {
    return reinterpret_cast<std::uint64_t*>(smem + off_bar) + 3 + s;
  }
  __device__ static std::uint64_t* rec_full_bar(unsigned char* smem, int s) {
    return reinterpret_cast<std::uint64_t*>(smem + off_bar) + 5 + s;
  }
  __device__ static std::uint64_t* rec_free_bar(unsigned char* smem, int s) {
    return reinterpret_cast<std::uint64_t*>(smem + off_bar) + 5 + kRecStages + s;
  }
};

// The kernel's parameters: the split path's, and TMA descriptors of k, q, v and o as 3-D tensors
// (columns, tokens, heads), boxes of 64 x 64 x 1 with the 128-byte swizzle. Built on the host for
// every call and passed by value (__grid_constant__): nothing is shared between launches.
struct FusedParams {
  ChunkedParams p;
  CUtensorMap k, q, v, o;
#ifdef GDNKIT_FUSED_TIMELINE
  unsigned long long* timeline = nullptr;  // the phase stamps' destination (fused_cta), or none
  int timeline_j0 = 0;                      // the first of the eight chunks stamped step by step
#endif
};

// The descriptors of one call; false when the driver rejects a tensor's layout (encode_tile_map,
// in fused_sm90.cu; the emulation has its own).
template <typename T, int DK>
inline bool make_fused_params(const ChunkedParams& p, FusedParams* fp) {
  constexpr bool bf16 = std::is_same_v<T, __nv_bfloat16>;
  fp->p = p;
  if (p.tokens == 0) return true;  // no chunks, no copies (q, k, v may be null): only final states
  return encode_tile_map(&fp->k, p.k, bf16, DK, p.tokens, p.k_heads, p.k_token, p.k_head) &&
         encode_tile_map(&fp->q, p.q, bf16, DK, p.tokens, p.q_heads, p.q_token, p.q_head) &&
         encode_tile_map(&fp->v, p.v, bf16, p.dv, p.tokens, p.v_heads, p.v_token, p.v_head) &&
         encode_tile_map(&fp->o, p.o, bf16, p.dv, p.tokens, p.num_heads, p.o_token, p.o_head);
}

}  // namespace gdnkit::cuda
