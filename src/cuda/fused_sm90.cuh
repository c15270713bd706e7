// The fused SM90 kernel (docs/fused-kernel-design.md): the prep and the state walk of the CUDA
// path in one warp-specialised CTA per (value block of DVB = 128 or 64 columns, head, sequence
// list), so that no record goes through global memory and K and Q are read once.
//
// One aux warpgroup and DVB / 64 state warpgroups (384 or 256 threads):
//   aux (warps 0-3)    computes each chunk's record into shared memory up to R - 1 chunks ahead of the
//                      walk: K K^T on wgmma (both operands from the swizzled K tile, in flight
//                      while the gates' cumsum G is formed), gam/dec, A = diag(beta) K K^T .* D
//                      (D_ij = exp(G_i - G_j)), its fp32 inverse D .* Tu (invert_unit_lower, the
//                      prep kernel's), and Mt = (D .* Tu) diag(beta) as hi + lo, straight into the
//                      128-byte-swizzled tiles the walk's wgmma reads. In the unsplit 128-column
//                      kernels (kBlockSolve) only the inverses of its two 32 x 32 diagonal blocks,
//                      Mt's two diagonal 32 x 32 blocks and -C = -(K K^T) .* D below them: the walk
//                      finishes Vn by block substitution (docs/math.md). Elsewhere the whole Mt
//                      (the blocks left of the diagonal from the inverse's registers, the diagonal
//                      ones from At before the block rows).
//                      Its thread 0 issues the first chunks' TMA copies;
//   state (warps 4-)   warpgroups of 64 value columns: P = scale (Q K^T) .* D, each warpgroup its
//                      share of the columns (fused_p; in the kAuxP instantiation, for 64-column
//                      pairs, the aux's, with A in fused_record), then the wgmma walk's chunk
//                      step (walk_chunk with WgmmaWalk's products), the state in registers
//                      throughout. State thread 0 issues the later chunks' TMA copies as each
//                      step frees a stage (with two state warpgroups while the step's K S and
//                      Q S are in flight), at the positions the aux publishes (F::ahead): the
//                      aux, the bound, issues none.
// With two state warpgroups, registers move from the aux to them (setmaxnreg: 120 + 2 x 192 =
// 3 x 168; below 192 for the state, ptxas serializes every wgmma of the kernel, C7512; the aux
// fits 120 without spills since Q K^T moved to the state warpgroups and the chunk cursor is
// 32-bit). With one, every warpgroup keeps 255.
//
// Shared memory rings: K+Q in three stages (chunk c is read by the aux for its record while the
// walk runs chunk c - 1, then by the walk; chunk c + 1's copies are in flight meanwhile), V in two
// (a full chunk's V stage then holds its O for a TMA store), the record (and its gates) in
// R = F::kRecStages = 3 (the unsplit 128-column kernel: 2 with GDNKIT_FUSED_REC_STAGES=2), P in
// one buffer (in the record stages with kAuxP); mbarriers track the copies. Named barriers:
// FULL[c % R] (aux arrives when chunk c's K, Q, gates and record are in place; V's mbarrier the
// state warps wait for themselves after FULL, GDNKIT_FUSED_V_WAIT_STATE), EMPTY[c % R] (the state
// warps arrive when done with chunk c; the aux waits before it reuses chunk c's stages for chunk
// c + R), P (the state warpgroups' P and tail V rows are in place, before the walk reads them).
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

#include "cuda/pdl.cuh"
#include "cuda/prep_kernel.cuh"
#include "cuda/walk_sm90.cuh"

// Switches, on by default since the variants run of docs/perf-notes.md ("O staged in every
// kernel; V waited for by the state warps"); 0 builds the earlier form, for A/B runs with
// scripts/gpu_check.sh's variants stage:
// - GDNKIT_FUSED_STAGE_O64: the one-warpgroup kernels (64-column pairs) stage O for a TMA store
//   too (fused_state);
// - GDNKIT_FUSED_STAGE_O_WALKS: so do the walk-list kernels' value CTAs;
// - GDNKIT_FUSED_V_WAIT_STATE: the state warps wait for each chunk's V themselves after FULL, so
//   that the aux's FULL arrival, and with it its next records, no longer waits for V's copy (which
//   state thread 0 issues only once the previous step has begun).
// Together: the pairs 5-8% faster, the splits 1-3%, the unpaired 128-column kernel level.
#ifndef GDNKIT_FUSED_STAGE_O64
#define GDNKIT_FUSED_STAGE_O64 1
#endif
#ifndef GDNKIT_FUSED_STAGE_O_WALKS
#define GDNKIT_FUSED_STAGE_O_WALKS 1
#endif
#ifndef GDNKIT_FUSED_V_WAIT_STATE
#define GDNKIT_FUSED_V_WAIT_STATE 1
#endif
// GDNKIT_FUSED_FIRST_COPIES: the order of the first copies. 0: the aux copies K, Q of chunks 0-2
// and V of chunks 0-1 at once. 2 (default): the aux copies chunk 0's K and Q alone, and state
// thread 0 the rest once they have landed (fused_later_first_copies), so that a CTA's first
// record does not wait for the whole launch's first burst of copies; the walk-list kernels keep 0.
// Against 0 (docs/perf-notes.md, "The first copies by the state"): 3-7% off the 8-chunk rows,
// 2-4% off the 16-chunk ones, the longer rows level within the run's noise.
#ifndef GDNKIT_FUSED_FIRST_COPIES
#define GDNKIT_FUSED_FIRST_COPIES 2
#endif
// GDNKIT_FUSED_KQ_FIRST: where state thread 0 issues chunk j + 2's K and Q copies in step j.
// 0: with two state warpgroups while K S and Q S are in flight (walk_chunk's aside, after the O
// store of chunk j - 1), with one after V's copy (which waits for that store's reads). 1: in every
// kernel right after FULL of chunk j, before the O store and V. 2 (default): 1 in the walk-list
// kernels and the one-warpgroup (64-column) kernels (where GDNKIT_FUSED_KQ_AT_END is off), 0 in the
// unsplit 128-column kernel. Against 0 (docs/perf-notes.md, "Step marks; the K and Q copies ahead
// of the O store"): the splits 2-3.5% faster, the 64-column pairs 0.5-1%; in the unsplit
// 128-column kernel 1 was 4-7% slower.
#ifndef GDNKIT_FUSED_KQ_FIRST
#define GDNKIT_FUSED_KQ_FIRST 2
#endif
// GDNKIT_FUSED_KQ_AT_END (default 1): the one-warpgroup kernels (64 columns) copy chunk j + 3's K
// and Q at the end of step j instead, after the barrier of their warps that precedes the O store
// (chunk j's stage is free there); the aux publishes that chunk's position with the next two
// (F::ahead). Against KQ_FIRST's order: the 64-column pairs 1.9-2.7% faster.
#ifndef GDNKIT_FUSED_KQ_AT_END
#define GDNKIT_FUSED_KQ_AT_END 1
#endif
// GDNKIT_FUSED_P_WITH_A (default 1): where the aux forms P (kAuxP, the 64-column pairs), it does so
// with A, from the same exponentials, Q K^T in flight with K K^T (fused_record), rather than after
// the inverse (fused_p). Against 0 (docs/perf-notes.md, "P formed with A"): the pairs 1.5-2.7% faster.
#ifndef GDNKIT_FUSED_P_WITH_A
#define GDNKIT_FUSED_P_WITH_A 1
#endif
// GDNKIT_FUSED_DIAG_PAIRS (default 1): the record's diagonal blocks are solved by aux warps 0 and 2,
// two blocks each (one per half warp), once warps 1 and 3 have formed their rows of A, instead of
// one block per warp with half its lanes idle (invert_unit_lower's kDiagPairs).
#ifndef GDNKIT_FUSED_DIAG_PAIRS
#define GDNKIT_FUSED_DIAG_PAIRS 1
#endif

// GDNKIT_FUSED_BLOCK_SOLVE (default 1): in the unsplit 128-column kernels the record's inverse
// stops at Mt's two 32 x 32 diagonal blocks and the walk finishes Vn by block substitution
// (FusedSm90::kBlockSolve); 0: the whole Mt everywhere.
#ifndef GDNKIT_FUSED_BLOCK_SOLVE
#define GDNKIT_FUSED_BLOCK_SOLVE 1
#endif

namespace gdnkit::cuda {

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
  static constexpr int kThreads = 128 * (1 + kStateWarpgroups);
  // The state warpgroups' products (WgmmaWalk's), with V staged as TMA lands it: 128-byte-swizzled
  // column blocks of 64 value columns.
  // kBlockSolve: the walk solves each chunk's Vn by block substitution over its two 32-token halves
  // (GDNKIT_FUSED_BLOCK_SOLVE): the record holds Mt's two 32 x 32 diagonal blocks and, below them,
  // -C = -(K K^T) .* D, so that the aux's inverse forms 2 of the 6 blocks left of its diagonal
  // (invert_unit_lower's kHalves).
  // Only in the unsplit 128-column kernels, whose aux sets the step (10-13.5% faster). The
  // 64-column kernels' one state warpgroup carries the longer chain alone: the pairs measured
  // 1-3% faster on two instances and 8-14% slower on a third. The walk-list kernels at 128
  // columns (a split's stage 1) spilled with it (4-72 bytes, per walk, however arranged).
  static constexpr bool kBlockSolve = GDNKIT_FUSED_BLOCK_SOLVE && DVB_ == 128 && !kWalks_;
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
  // (Two warpgroups, DVB = 64, keep the launch's 255 per thread: no register moves.)
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
  static_assert(GDNKIT_FUSED_FIRST_COPIES == 0 || GDNKIT_FUSED_FIRST_COPIES == 2, "first copies: 0 or 2");
  static constexpr int kRecStages = DVB == 64 || (kWalks && DK == 128) ? 3 : GDNKIT_FUSED_REC_STAGES;
  static_assert(kRecStages == 2 || kRecStages == 3, "two or three record stages");
  // Named barrier ids (+ stage for FULL and EMPTY); kBarP: the state warpgroups' P is in place.
  // kBarDiag + w / 2: aux warp w + 1's rows of A are in place for warp w (w = 0, 2; GDNKIT_FUSED_DIAG_PAIRS).
  static constexpr int kBarAux = 1, kBarFull = 2, kBarEmpty = kBarFull + kRecStages, kBarP = kBarEmpty + kRecStages;
  static constexpr int kBarDiag = kBarP + 1;
  static_assert(kBarDiag + 1 < 16, "hardware named barriers");

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

// Cycle stamps of the aux's phases (thread 0 of CTA (0, 0, 0), chunk 8), printed, in builds with
// GDNKIT_FUSED_PROBE defined: a measurement aid, compiled out otherwise. GDNKIT_FUSED_PROBE_SKIP
// (1: no records, 2: no walk steps, 3: no copies; results are wrong then) times the roles apart.
struct FusedProbe {
#ifdef GDNKIT_FUSED_PROBE
  long long t[16];
  int n = 0;
  bool on = false;
  __device__ void mark() {
    if (on && n < 16) t[n++] = clock64();
  }
  __device__ void print(const char* what) const {
    if (!on) return;
    long long d[15] = {};
    for (int i = 1; i < n; ++i) d[i - 1] = t[i] - t[i - 1];
    printf("probe %s: %lld %lld %lld %lld %lld %lld %lld %lld %lld %lld %lld %lld %lld %lld %lld\n", what, d[0], d[1],
           d[2], d[3], d[4], d[5], d[6], d[7], d[8], d[9], d[10], d[11], d[12], d[13], d[14]);
  }
#elif defined(GDNKIT_STEP_MARKS)
  int c = -1, n = 0;  // the aux's chunk - j0 being marked (step_marks, lane 0 of each warp), or -1
  __device__ void mark() {
    unsigned t;
    asm volatile("mov.u32 %0, %%clock;" : "=r"(t)::"memory");
    if (c >= 0 && n < 16) step_marks[2 + threadIdx.x / 32][c][n++] = t;
  }
  __device__ void print(const char*) const {}
#else
  __device__ void mark() {}
  __device__ void print(const char*) const {}
#endif
};

// Stamps of one launch's phases in every CTA (%globaltimer, ns), in builds with
// GDNKIT_FUSED_TIMELINE defined: a measurement aid, compiled out otherwise. Slots: 0 the CTA's
// start, 1 the end of its prologue (before the roles split), 3 the first step begun (state thread
// 0, past FULL of chunk 0: the first record is out), 4 the last step done, 5 the aux done, 6 the
// exit; 7 the chunks walked (slot 2 unused: a stamp after the aux's own arrival on FULL was seen
// several microseconds after the state warps had passed that barrier, i.e. ptxas may move a
// timer read across an arrival). Then, for the eight chunks j0 + k (FusedParams::timeline_j0, the
// host's GDNKIT_TIMELINE_J0): 8 + k state thread 0 past FULL of the chunk, 16 + k its step done,
// 24 + k the aux's record formed (before its V wait and FULL arrival); 32 + w warp w done with its
// role (lane 0, back from fused_aux or fused_state). Where FusedParams::timeline is set (the
// host's launches 5 and 6 of the process, fused_sm90.cu), thread 0 stores them there at exit,
// kTimelineSlots per CTA; the host prints them at its launch 9 ("TL launch cta t0 .. t47"),
// bench/timeline.py summarises the lines. ptxas schedules the timer reads, and a barrier does not
// pin them: the stamps of one CTA were seen to disagree by several microseconds
// (docs/perf-notes.md, "Step-by-step stamps"), so read them as indicative.
// (No printf in the kernel: a call makes ptxas serialize its wgmma, C7510.)
#ifdef GDNKIT_FUSED_TIMELINE
constexpr unsigned kTimelineCtas = 1024;
constexpr int kTimelineOwnSlots = 48;
#ifdef GDNKIT_STEP_MARKS
constexpr int kTimelineSlots = kTimelineOwnSlots + 6 * kMarkChunks * 16;  // then step_marks
#else
constexpr int kTimelineSlots = kTimelineOwnSlots;
#endif
__shared__ unsigned long long fused_timeline[kTimelineOwnSlots];
__device__ __forceinline__ unsigned long long global_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
#define GDNKIT_FUSED_STAMP(cond, slot)                                            \
  do {                                                                            \
    if (cond) ::gdnkit::cuda::fused_timeline[slot] = ::gdnkit::cuda::global_ns(); \
  } while (0)
// Chunk j's stamp in slot base + (j - j0) where j is among the eight stamped ones.
#define GDNKIT_FUSED_STAMP_STEP(cond, j, j0, base) \
  GDNKIT_FUSED_STAMP((cond) && (j) >= (j0) && (j) < (j0) + 8, (base) + ((j) - (j0)) % 8)
#else
#define GDNKIT_FUSED_STAMP_STEP(cond, j, j0, base) \
  do {                                             \
  } while (0)
#define GDNKIT_FUSED_STAMP(cond, slot) \
  do {                                 \
  } while (0)
#endif

// D_ij, D_i,j+1 with D_ij = exp(G_i - G_j) from base-2 G (G log2(e)), zero above the diagonal
// (j > i). Every exponent is <= 0 where it is evaluated: nothing overflows for any gates.
__device__ __forceinline__ float2 decay_pair(float gi, float2 gj, int i, int j) {
  return make_float2(j <= i ? fast_exp2(gi - gj.x) : 0.0f, j + 1 <= i ? fast_exp2(gi - gj.y) : 0.0f);
}

// The wgmma descriptor of a staged K or Q tile: 128-byte-swizzled blocks of 64 columns x 64 rows
// (from `tile`, which may start at a row that is a multiple of 8); its kk-th step of 16 columns is
// gmma_desc_add(fused_kdesc(tile), gmma_kstep(kk, kChunk)).
__device__ __forceinline__ std::uint64_t fused_kdesc(const unsigned char* tile) { return gmma_desc(tile, 16, 1024); }

// G, the inclusive cumsum of the chunk's gates gs, in every warp of the aux; warp 0 publishes
// G log2(e) (gs + kChunk; the exponents of the record and P are base 2) and gam, dec into the
// record stage rec (G_last = G[63]: padded rows repeat it); the aux barrier at the end publishes them.
// (The cumsum by warp 0 alone, the others going straight to the barrier: 0.3-1.9% slower.)
template <class F>
__device__ __forceinline__ void publish_gates(float* gs, unsigned char* rec, int lane, int warp) {
  float ga, gb;
  chunk_cumsum(gs, lane, ga, gb);
  if (warp == 0) {
    constexpr float kLog2e = 1.4426950408889634f;
    gs[kChunk + lane] = ga * kLog2e;
    gs[kChunk + lane + 32] = gb * kLog2e;
    float* const gam = reinterpret_cast<float*>(rec + F::rec_gam);
    const float g_last = __shfl_sync(0xffffffffu, gb, 31);
    gam[lane] = fast_exp(ga);
    gam[lane + 32] = fast_exp(gb);
    gam[kChunk + lane] = fast_exp(g_last - ga);
    gam[kChunk + lane + 32] = fast_exp(g_last - gb);
  }
  named_sync(F::kBarAux, 128);
}

// The record of one chunk (rows [0, nrows) valid) from its staged K (kq) and the thread's gate or
// beta value (load_gate_beta; staged in `gates`), by the aux warpgroup (tid < 128), into rec: Mt hi,
// Mt lo as swizzled 64 x 64 tiles (zeros above the diagonal and in rows past the valid row blocks:
// the blocks right of the diagonal zero since zero_record_tiles), gam and dec; and G log2(e) into
// `gates` for fused_p. With kAuxP (and GDNKIT_FUSED_P_WITH_A) also P, scaled by `scale`, into the
// record stage. The caller's copies of K (and Q) have landed; this starts with an aux barrier.
// With mt false only G, gam and dec: the other CTA of a pair forms Mt (fused_paired).
template <class F>
__device__ __forceinline__ void fused_record(const unsigned char* kq, unsigned char* rec, unsigned char* smem,
                                             float* gates, float gate_beta, int nrows, int tid, FusedProbe& probe,
                                             bool mt, float scale) {
  using T = typename F::T;
  constexpr int DK = F::DK;
  constexpr int LDA = F::LDA;
  const int warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  const int nb = (nrows + 15) / 16;
  float* const gs = gates;
  float* const Gs = gates + kChunk;
  float* const bs = gates + 2 * kChunk;
  float* const At = reinterpret_cast<float*>(smem + F::off_at);
  float* const Tl = reinterpret_cast<float*>(smem + F::off_tl);
  (tid < kChunk ? gs[tid] : bs[tid - kChunk]) = gate_beta;
  probe.mark();
  named_sync(F::kBarAux, 128);
  probe.mark();

  // Without Mt (the peer forms it, fused_paired) only G, gam and dec: no K K^T. That path holds no
  // wgmma at all, which keeps the kernel's wgmma unserialized (a branch between a wgmma's issue and
  // its wait makes ptxas serialize every wgmma of the kernel, C7518).
  if (!mt) {
    publish_gates<F>(gs, rec, lane, warp);
    return;
  }
  // K K^T (rows and columns: K; warp w holds rows 16 w + g and + 8, columns 8 n + 2t, + 1), in
  // flight while G is formed. (Q K^T is the state warpgroups', fused_p, but with kPWithA below.)
  const std::uint64_t dk = fused_kdesc(kq);
  float kkt[32];
  // With kPWithA (the aux's P, kAuxP) also Q K^T, in the same group: P = scale (Q K^T) .* D takes
  // the decay of A's pieces below (the same fragments: rows 16 w + g, + 8, columns 8 n + 2t, + 1),
  // instead of a second pass of exponentials and a second product wait after the inverse.
  constexpr bool kPWithA = F::kAuxP && GDNKIT_FUSED_P_WITH_A;
  float qkt[kPWithA ? 32 : 1];
  gmma_fence(kkt);
  if constexpr (kPWithA) gmma_fence(qkt);
  gmma_arrive();
#pragma unroll
  for (int kk = 0; kk < DK / 16; ++kk) {
    const std::uint64_t d = gmma_desc_add(dk, gmma_kstep(kk, kChunk));
    gmma_ss<T, 64>(kkt, d, d, kk > 0);
  }
  if constexpr (kPWithA) {
    const std::uint64_t dq = fused_kdesc(kq + F::Walk::k_bytes);
#pragma unroll
    for (int kk = 0; kk < DK / 16; ++kk)
      gmma_ss<T, 64>(qkt, gmma_desc_add(dq, gmma_kstep(kk, kChunk)), gmma_desc_add(dk, gmma_kstep(kk, kChunk)),
                     kk > 0);
  }
  gmma_commit();
  probe.mark();

  publish_gates<F>(gs, rec, lane, warp);
  probe.mark();

  // A = diag(beta) (K K^T) .* D with the decay D_ij = exp(G_i - G_j) (j <= i, else 0), so that the
  // inverse of I + strict_lower(A) is D .* Tu (a similarity by diag(exp(G))) and Mt below needs no
  // exponentials. Every exponent is <= 0: nothing overflows for any gates. Block row w (tiles left of
  // and on the diagonal) by warp w. No barrier of all four warps follows: the inverse's first step
  // reads only the diagonal blocks of the warp's own rows, or with kDiagPairs below of its pair's
  // (warp 3 forms four times warp 0's pieces; a barrier here kept the others waiting for it, 0.5-3%
  // of the step).
  const int i0 = 16 * warp + g;
  const float gi[2] = {Gs[i0], Gs[i0 + 8]};
  const float b[2] = {bs[i0], bs[i0 + 8]};
  gmma_wait<0>();
  gmma_fence(kkt);
  if constexpr (kPWithA) gmma_fence(qkt);
  // Pieces (column tiles) 2q and 2q + 1 of the warp's rows: A's left of and on the diagonal
  // (q <= warp); with kPWithA all of P's, stored by stmatrix as fused_p does (zeros right of the
  // diagonal, without exponentials).
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    std::uint32_t r[4] = {0u, 0u, 0u, 0u};
    if (q <= warp) {
#pragma unroll
      for (int nn = 0; nn < 2; ++nn) {
        const int n = 2 * q + nn, j = 8 * n + 2 * t;
        const float2 gj = *reinterpret_cast<const float2*>(Gs + j);
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
          const int i = i0 + 8 * hh;
          const float2 d = decay_pair(gi[hh], gj, i, j);
          // With kBlockSolve the bottom-left quarter holds C = (K K^T) .* D, without beta (emit_c).
          const float bi = F::kBlockSolve && warp >= 2 && q < 2 ? 1.0f : b[hh];
          *reinterpret_cast<float2*>(At + i * LDA + j) =
              make_float2(bi * kkt[4 * n + 2 * hh] * d.x, bi * kkt[4 * n + 2 * hh + 1] * d.y);
          if constexpr (kPWithA)
            r[2 * nn + hh] = pack2<T>(scale * qkt[4 * n + 2 * hh] * d.x, scale * qkt[4 * n + 2 * hh + 1] * d.y);
        }
      }
    }
    if constexpr (kPWithA) {
      unsigned char* const P = rec + 2 * F::m_bytes;  // F::p_tile of this stage
      const int m = lane / 8;
      stsm_x4(P + swizzle128(16 * warp + 8 * (m % 2) + lane % 8, 2 * q + m / 2), r);
    }
  }
  __syncwarp();
  constexpr bool kDiagPairs = GDNKIT_FUSED_DIAG_PAIRS;
  // Warp w + 1's rows of A, for warp w's second diagonal block (w even). Warp w + 1 waits too (a
  // bar.arrive there made racecheck report the gate stores at the record's start against the cumsum's
  // reads): it forms more of A than warp w, so it arrives last and does not wait.
  if constexpr (kDiagPairs) named_sync(F::kBarDiag + warp / 2, 64);
  probe.mark();
  // The inverse D .* Tu, and Mt = (D .* Tu) diag(beta) as hi + lo: the blocks left of the diagonal
  // straight from the inverse's registers (mma fragments) as each is formed; the diagonal blocks
  // from At by warps 2 and 3, whose block rows are the shorter ones (7 block products against 9),
  // with every lane, after the barrier that ends the substitution and before their rows: writing
  // them before that barrier, 16 lanes a column each, had kept the block rows of every warp
  // waiting, and after the rows their latency was on the record's path. The blocks right of the
  // diagonal are zero from the kernel's start (zero_record_tiles) and never written; a tail chunk
  // zeroes the block rows at or past nb, which the inverse leaves alone.
  unsigned char* const Mh = rec;
  unsigned char* const Ml = rec + F::m_bytes;
  auto put_pair = [&](int r, int c, float v0, float v1) {  // Mt[r][c], Mt[r][c + 1] (c even)
    const std::uint32_t hi = pack2<T>(v0, v1);
    const float2 hf = unpack2<T>(hi);
    const std::uint32_t off = swizzle128(r, c / 8) + 2 * (c % 8);
    *reinterpret_cast<std::uint32_t*>(Mh + off) = hi;
    *reinterpret_cast<std::uint32_t*>(Ml + off) = pack2<T>(v0 - hf.x, v1 - hf.y);
  };
  // Mt[r][c .. c + 7] = v as hi + lo, one 16-byte piece per tile (c a multiple of 8).
  auto put_piece = [&](int r, int c, const float (&v)[8]) {
    std::uint32_t wh[4], wl[4];
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      wh[q] = pack2<T>(v[2 * q], v[2 * q + 1]);
      const float2 hf = unpack2<T>(wh[q]);
      wl[q] = pack2<T>(v[2 * q] - hf.x, v[2 * q + 1] - hf.y);
    }
    const std::uint32_t off = swizzle128(r, c / 8);
    *reinterpret_cast<uint4*>(Mh + off) = make_uint4(wh[0], wh[1], wh[2], wh[3]);
    *reinterpret_cast<uint4*>(Ml + off) = make_uint4(wl[0], wl[1], wl[2], wl[3]);
  };
  // 16 bytes of -C (kBlockSolve) into Mt's tiles, hi + lo: row 32 + p / 4, columns 8 (p % 4) .. + 7
  // of At's bottom-left quarter. (Stored from the A loop's registers instead, the kernel spilled.)
  auto emit_c = [&](int p) {
    const int r = 32 + p / 4, c = 8 * (p % 4);
    const float4 x0 = *reinterpret_cast<const float4*>(At + r * LDA + c);
    const float4 x1 = *reinterpret_cast<const float4*>(At + r * LDA + c + 4);
    put_piece(r, c, {-x0.x, -x0.y, -x0.z, -x0.w, -x1.x, -x1.y, -x1.z, -x1.w});
  };
  // Diagonal block bd of Mt: lane l writes row 16 bd + l % 16, columns 16 bd + 8 (l / 16) .. + 7,
  // one 16-byte piece per tile (conflict-free: eight rows of one column piece per quarter warp).
  auto emit_diag = [&](int bd) {
    const int r = 16 * bd + lane % 16, c = 16 * bd + 8 * (lane / 16);
    const float4 x0 = *reinterpret_cast<const float4*>(At + r * LDA + c);
    const float4 x1 = *reinterpret_cast<const float4*>(At + r * LDA + c + 4);
    const float4 b0 = *reinterpret_cast<const float4*>(bs + c);
    const float4 b1 = *reinterpret_cast<const float4*>(bs + c + 4);
    put_piece(r, c, {x0.x * b0.x, x0.y * b0.y, x0.z * b0.z, x0.w * b0.w,
                     x1.x * b1.x, x1.y * b1.y, x1.z * b1.z, x1.w * b1.w});
  };
  // The beta of the lane's two columns of its warp's blocks (J = 0 for warps 0 and 1, J = 1 and 2
  // for warps 2 and 3), loaded before the block rows: loaded at each block, the warp stalls on them
  // there, in its chain of products (1-2% of the step). Not in the walk-list kernels, where the two
  // registers cost spills, nor with kBlockSolve (one strip per warp; with them it spilled too).
  constexpr bool kBetaFirst = !F::kWalks && !F::kBlockSolve;
  float2 bcol[2] = {};
  auto emit_block = [&](int I, int J, int nt, const float (&o)[4]) {
    const int c = 16 * J + 8 * nt + 2 * t;
    const float2 bc = kBetaFirst ? (J == 2 ? bcol[1] : bcol[0]) : *reinterpret_cast<const float2*>(bs + c);
    put_pair(16 * I + g, c, o[0] * bc.x, o[1] * bc.y);
    put_pair(16 * I + g + 8, c, o[2] * bc.x, o[3] * bc.y);
  };
  invert_unit_lower<LDA, F::LDR, kDiagPairs, F::kBlockSolve>(
      At, Tl, reinterpret_cast<float*>(smem + F::off_r), nb, warp, lane,
      [&] {
        named_sync(F::kBarAux, 128);
        probe.mark();
        if (kBetaFirst) {
          bcol[0] = *reinterpret_cast<const float2*>(bs + 16 * (warp >= 2) + 8 * (warp & 1) + 2 * t);
          bcol[1] = *reinterpret_cast<const float2*>(bs + 32 + 8 * (warp & 1) + 2 * t);
        }
        if (warp >= 2) {  // before the block rows, whose loads' latency hides these stores
          const int b0 = 2 * (warp - 2);
          if (b0 < nb) emit_diag(b0);
          if (b0 + 1 < nb) emit_diag(b0 + 1);
        } else if (F::kBlockSolve) {  // -C's quarter by warps 0 and 1, two pieces a lane, valid rows only
          if (32 + (64 * warp + lane) / 4 < 16 * nb) emit_c(64 * warp + lane);
          if (32 + (64 * warp + 32 + lane) / 4 < 16 * nb) emit_c(64 * warp + 32 + lane);
        }
      },
      emit_block,
      [&] {  // no barrier: each thread's FULL arrival follows its own stores (the caller's fence)
        probe.mark();  // the probe's "block rows" (thread 0: warp 0's rows)
      });
  if (nb < 4) {  // a tail chunk: rows [16 nb, 64) of Mt hi and lo are zero
    for (int idx = tid; idx < 2 * (kChunk - 16 * nb) * 8; idx += 128) {
      const int c = idx % 8, r = 16 * nb + (idx / 8) % (kChunk - 16 * nb);
      *reinterpret_cast<uint4*>((idx < (kChunk - 16 * nb) * 8 ? Mh : Ml) + swizzle128(r, c)) =
          make_uint4(0u, 0u, 0u, 0u);
    }
  }
  probe.mark();
}

// Zeroes the Mt hi and lo tiles of every record stage, once per CTA before the first record
// (fused_record writes only their blocks on and left of the diagonal; a pair's copies carry the
// zeros of the CTA that formed them), by the aux's 128 threads.
template <class F>
__device__ __forceinline__ void zero_record_tiles(unsigned char* smem, int tid) {
  for (int s = 0; s < F::kRecStages; ++s)
    for (int idx = tid; idx < int(2 * F::m_bytes / 16); idx += 128)
      reinterpret_cast<uint4*>(F::rec(smem, s))[idx] = make_uint4(0u, 0u, 0u, 0u);
}

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
    bos = static_cast<int>(seq_begin(p, n));
    eos = static_cast<int>(seq_begin(p, n + 1));
  }
}

// Whether the CTA shares records with the other CTA of its cluster (ranks 0 and 1, CTAs x and x ^ 1
// of the grid): the launch (fused_cluster_x, fused_sm90.cu) forms clusters of two only where both
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
// warpgroups of the 128-column kernel are at their budgets).
template <class F>
__device__ __forceinline__ bool pair_own(int j) {
  return fused_paired<F>() && (j & 1) == static_cast<int>(cluster_rank());
}
template <class F>
__device__ __forceinline__ bool pair_from_peer(int j) {
  return fused_paired<F>() && (j & 1) != static_cast<int>(cluster_rank());
}

// A chunk position in the CTA's list of walks: list entry i, chunk at token c0 of a walk ending at
// eos; i >= walk_count: past the end. 32-bit (TMA coordinates are, and launch_fused refuses
// larger calls): three registers per position.
struct ChunkPos {
  int i, eos, c0;
  __device__ int nrows() const { return eos - c0 < kChunk ? eos - c0 : kChunk; }
};

// The CTA's chunks in walk order: first() is chunk 0, next(c) the one after c (past the end:
// !valid(c)). Empty walks have no chunks.
template <bool kWalks>
struct ChunkCursor {
  const ChunkedParams& p;
  const int* order;
  __device__ bool valid(const ChunkPos& c) const { return c.i < cta_list<kWalks>(p, order).end; }
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
    return seek(c.i + cta_list<kWalks>(p, order).stride);
  }
};

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

template <class F>
__device__ __forceinline__ void fused_p(const unsigned char* kq, unsigned char* P, const float* Gs, float scale,
                                        int tid);

// The aux warpgroup: the first chunks' copies (TMA, issued by thread 0) and every record, one
// chunk ahead of the state warpgroups (with F::kAuxP also P).
template <class F>
__device__ __forceinline__ void fused_aux(const FusedParams& fp, unsigned char* smem, const int* order, int tid) {
  constexpr int DK = F::DK;
  const ChunkedParams& p = fp.p;
  constexpr int C = kChunk;
  const int h = blockIdx.y;
  const ChunkCursor<F::kWalks> chunks{p, order};
  const FusedCopier<F> copy{fp, smem};

  constexpr int R = F::kRecStages;
  int j = 0;  // chunks handed to the state warpgroups
  ChunkPos cur = chunks.first();
  if (chunks.valid(cur)) {
#if GDNKIT_FUSED_PROBE_SKIP != 3
    if (tid == 0) {  // K and Q of chunks 0-2, V of chunks 0-1 (then state thread 0 takes over)
      ChunkPos c = cur;  // (with F::kKqFirst, chunk 0's K and Q: fused_later_first_copies)
      for (int k = 0; k < (F::kKqFirst ? 1 : 3) && chunks.valid(c); ++k, c = chunks.next(c)) {
        copy.kq(c.c0, k);
        if (k < 2 && !F::kKqFirst) copy.v(c.c0, k);
      }
    }
#endif
    // The next chunk's gate or beta stays a loaded word until its record (load_gate_beta_bits):
    // the load is in flight during this record.
    std::uint32_t gb_cur = load_gate_beta_bits(p, cur.c0, cur.nrows(), h, tid);
    for (;;) {
      FusedProbe probe;
#ifdef GDNKIT_FUSED_PROBE
      probe.on = tid == 0 && blockIdx.x == 0 && blockIdx.y == 0 && blockIdx.z == 0 && j == 8;
#elif defined(GDNKIT_STEP_MARKS)
      probe.c =
          tid % 32 == 0 && j >= fp.timeline_j0 && j < fp.timeline_j0 + kMarkChunks ? j - fp.timeline_j0 : -1;
#endif
      probe.mark();
      const ChunkPos nxt = chunks.next(cur);
      const bool more = chunks.valid(nxt);
      const int nrows = cur.nrows();
      // Chunk j - R is done with, and so is its slot of F::ahead (state thread 0 reads it at step j - R).
      if (j >= R) named_sync(F::kBarEmpty + j % R, F::kThreads);
      if (tid == 0) {  // for state thread 0's copies at step j (published by FULL[j])
        const ChunkPos nxt2 = more ? chunks.next(nxt) : nxt;
        F::ahead(smem, j % R)[0] = more ? nxt.c0 : -1;
        F::ahead(smem, j % R)[1] = more && chunks.valid(nxt2) ? nxt2.c0 : -1;
        if constexpr (GDNKIT_FUSED_KQ_AT_END && F::kStateWarpgroups == 1) {  // (fused_state's kKqAtEnd)
          const bool more2 = more && chunks.valid(nxt2);
          const ChunkPos nxt3 = more2 ? chunks.next(nxt2) : nxt2;
          F::ahead(smem, j % R)[2] = more2 && chunks.valid(nxt3) ? nxt3.c0 : -1;
        }
        if (pair_from_peer<F>(j)) mbar_expect_tx(F::rec_full_bar(smem, j % R), F::rec_copy_bytes);  // the peer's copy
      }
      probe.mark();
      const std::uint32_t gb_next = more ? load_gate_beta_bits(p, nxt.c0, nxt.nrows(), h, tid) : 0u;
      probe.mark();
#if GDNKIT_FUSED_PROBE_SKIP != 3
      mbar_wait(F::kq_bar(smem, j % 3), (j / 3) & 1);  // this chunk's K and Q
#endif
      probe.mark();
      if (nrows < C) {
        zero_tile_rows(F::kq(smem, j % 3), 2 * (DK / 64), nrows, C, tid);
        gmma_smem_fence();  // the zero rows, before wgmma reads them (only here: the fence waits
                            // for this thread's outstanding loads, the next chunk's gates)
      }
#ifdef GDNKIT_STEP_MARKS
      probe.mark();
      {
        const float gbv = gate_beta_value(p, gb_cur, tid);
        asm volatile("" ::"f"(gbv) : "memory");
        probe.mark();
      }
#endif
#if GDNKIT_FUSED_PROBE_SKIP != 1
      // With kAuxP the peer's copy brings the whole record (Mt, P, gam, dec) of its chunks: nothing
      // to form here. (Both products' wgmma groups, issue to wait, lie inside this branch: ptxas
      // 13.0 keeps the kernel's wgmma unserialized.) Otherwise it forms Mt where the chunk is its
      // own (always with kAuxP, said as a constant so that the path without Mt is not compiled).
      if (!(F::kAuxP && pair_from_peer<F>(j))) {
        fused_record<F>(F::kq(smem, j % 3), F::rec(smem, j % R), smem,
                        reinterpret_cast<float*>(smem + F::off_gates + (j % R) * F::gates_bytes),
                        gate_beta_value(p, gb_cur, tid), nrows, tid, probe, F::kAuxP || !pair_from_peer<F>(j),
                        p.scale);
        if constexpr (F::kAuxP && !GDNKIT_FUSED_P_WITH_A)  // G is published (fused_record's barriers)
          fused_p<F>(F::kq(smem, j % 3), F::p_tile(smem, j % R),
                     reinterpret_cast<const float*>(smem + F::off_gates + (j % R) * F::gates_bytes) + C, p.scale,
                     tid);
        if constexpr (F::kAuxP) probe.mark();
      }
#endif
      GDNKIT_FUSED_STAMP_STEP(tid == 0, j, fp.timeline_j0, 24);
      if (pair_own<F>(j)) {  // the copy into the peer's stage, once its walk is done with chunk j - 3 there
        gmma_smem_fence();  // this thread's Mt stores, before the bulk copy reads them
        named_sync(F::kBarAux, 128);
        if (tid == 0) {
          if (j >= 3) mbar_wait(F::rec_free_bar(smem, j % R), ((j - 3) / 6) & 1);
          const unsigned peer = cluster_rank() ^ 1u;
          bulk_copy_to_peer(peer_smem(F::rec(smem, j % R), peer), F::rec(smem, j % R), F::rec_copy_bytes,
                            peer_smem(F::rec_full_bar(smem, j % R), peer));
        }
      }
#if GDNKIT_FUSED_PROBE_SKIP != 3 && !GDNKIT_FUSED_V_WAIT_STATE
      mbar_wait(F::v_bar(smem, j % 2), (j / 2) & 1);  // this chunk's V
#endif
      gmma_smem_fence();  // the record's stores, before the state warpgroups' wgmma
      named_arrive(F::kBarFull + j % R, F::kThreads);
      probe.mark();
      probe.print("aux: EMPTY, ahead | gate loads | K wait | tail, gate store | aux barrier | K K^T issue | "
                  "cumsum | K K^T wait, A | diagonal | block rows | tail | (P |) V + FULL");
      ++j;
      if (!more) break;
      cur = nxt;
      gb_cur = gb_next;
    }
  }
  // Every arrival on a barrier is matched before the CTA exits: the last R chunks' EMPTY.
  for (int jj = j >= R ? j - R : 0; jj < j; ++jj) named_sync(F::kBarEmpty + jj % R, F::kThreads);
  GDNKIT_FUSED_STAMP(tid == 0, 5);
}

// P = scale * (Q K^T) .* D (D_ij = exp(G_i - G_j), j <= i, else 0) of one chunk, the walk's
// 16-bit tile P (F::p_tile), by the state warpgroups (tid among them; with kAuxP by the aux, as one
// warpgroup): warpgroup w forms columns [NP w, NP w + NP), NP = 64 / warpgroups, on wgmma from the
// staged K and Q; Gs holds G log2(e) (publish_gates). P is written whole (zeros above the
// diagonal; rows past a tail's end are zero, as Q's are). The caller fences and orders the stores
// before the walk's wgmma reads them.
template <class F>
__device__ __forceinline__ void fused_p(const unsigned char* kq, unsigned char* P, const float* Gs, float scale,
                                        int tid) {
  using T = typename F::T;
  constexpr int NP = 64 / F::kStateWarpgroups;
  tid = opaque(tid);  // the lane's indices recomputed here, not kept live across the walk (registers)
  const int wg = tid / 128, warp = (tid / 32) % 4, lane = tid % 32, g = lane / 4, t = lane % 4;
  const std::uint64_t dk = fused_kdesc(kq + wg * NP * 128);  // rows [NP wg, NP wg + NP) of K
  const std::uint64_t dq = fused_kdesc(kq + F::Walk::k_bytes);
  float acc[NP / 2];
  gmma_fence(acc);
  gmma_arrive();
#pragma unroll
  for (int kk = 0; kk < F::DK / 16; ++kk)
    gmma_ss<T, NP>(acc, gmma_desc_add(dq, gmma_kstep(kk, kChunk)), gmma_desc_add(dk, gmma_kstep(kk, kChunk)), kk > 0);
  gmma_commit();
  const int i0 = 16 * warp + g;
  const float gi[2] = {Gs[i0], Gs[i0 + 8]};
  gmma_wait<0>();
  gmma_fence(acc);
  // P formed by the aux (kAuxP with GDNKIT_FUSED_P_WITH_A=0; by default fused_record forms it with A,
  // stored the same way) goes out as stmatrix fragments (the accumulator's C tiles are
  // exactly those): each stsm_x4 stores column tiles n, n + 1 (rows 0-7 and 8-15 of the warp's 16
  // each), one 16-byte row piece per lane, a quarter of the store instructions. Measured 0.9-1.4%
  // faster on the 64-column pairs, whose aux sets the step; in the state warpgroups of the
  // 128-column kernel level or slower, and its walk-list variants then spill (docs/perf-notes.md,
  // "P stored by stmatrix").
  constexpr bool kStsm = F::kAuxP;
  if constexpr (kStsm) {
#pragma unroll
    for (int q = 0; q < NP / 16; ++q) {
      std::uint32_t r[4];
#pragma unroll
      for (int nn = 0; nn < 2; ++nn) {
        const int n = 2 * q + nn, j = NP * wg + 8 * n + 2 * t;
        const float2 gj = *reinterpret_cast<const float2*>(Gs + j);
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
          const float2 d = decay_pair(gi[hh], gj, i0 + 8 * hh, j);
          r[2 * nn + hh] = pack2<T>(scale * acc[4 * n + 2 * hh] * d.x, scale * acc[4 * n + 2 * hh + 1] * d.y);
        }
      }
      const int m = lane / 8;
      stsm_x4(P + swizzle128(16 * warp + 8 * (m % 2) + lane % 8, (NP * wg) / 8 + 2 * q + m / 2), r);
    }
  } else {
#pragma unroll
    for (int n = 0; n < NP / 8; ++n) {
      const int j = NP * wg + 8 * n + 2 * t;
      const float2 gj = *reinterpret_cast<const float2*>(Gs + j);
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const int i = i0 + 8 * hh;
        const float2 d = decay_pair(gi[hh], gj, i, j);
        *reinterpret_cast<std::uint32_t*>(P + swizzle128(i, j / 8) + 4 * t) =
            pack2<T>(scale * acc[4 * n + 2 * hh] * d.x, scale * acc[4 * n + 2 * hh + 1] * d.y);
      }
    }
  }
}

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
  // A map CTA's columns are columns of M (dk x dk), the others value columns.
  const bool is_map = F::kWalks && map_cta(p);
  const int v0 = (is_map ? static_cast<int>(blockIdx.x) - p.value_blocks : static_cast<int>(blockIdx.x)) * F::DVB;
  const WalkLane l = walk_lane(warp, lane);
  if (is_map) {  // V = 0 in both stages, for good (no copies land there); ordered by FULL
    for (int idx = tid; idx < int(2 * F::v_bytes / 16); idx += 128 * F::kStateWarpgroups)
      reinterpret_cast<uint4*>(F::v(smem, idx / int(F::v_bytes / 16)))[idx % int(F::v_bytes / 16)] =
          make_uint4(0u, 0u, 0u, 0u);
  }

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
  // as for tails (GDNKIT_FUSED_STAGE_O64 / _O_WALKS = 0 keep them in those kernels too).
  constexpr bool kStageO =
      (!F::kWalks || GDNKIT_FUSED_STAGE_O_WALKS) && (F::kStateWarpgroups == 2 || GDNKIT_FUSED_STAGE_O64);
  constexpr bool kStoreAtEnd = kStageO && F::kStateWarpgroups == 1;
  // K and Q of chunk j + 2 right after FULL of chunk j (GDNKIT_FUSED_KQ_FIRST).
  // With one state warpgroup (GDNKIT_FUSED_KQ_AT_END): chunk j + 3's at the end of step j instead.
  constexpr bool kKqAtEnd = GDNKIT_FUSED_KQ_AT_END && kStoreAtEnd;
  constexpr bool kKqFirst =
      !kKqAtEnd &&
      (GDNKIT_FUSED_KQ_FIRST == 1 || (GDNKIT_FUSED_KQ_FIRST == 2 && (F::kWalks || F::kStateWarpgroups == 1)));
  int o_pending = -1;  // first token of the staged chunk not yet stored (-1: none)
  const auto store_staged_o = [&](int c) {  // thread 0: the stage of chunk c (its first token o_pending)
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
      bos = seq_begin(p, start_index), eos = seq_begin(p, start_index + 1);
    }
    if (is_map)
      identity_state_tiles<DK>(st, v0 + l.cw + l.g, l.t);
    else
      load_state_tiles<DK>(st, p, start, lane_state_offset<DK>(p, start_index, h, v0 + l.cw + l.g, l.t));
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
      const bool from_peer = pair_from_peer<F>(j);
      if (from_peer && j >= 1) {  // done with this CTA's Mt of chunk j - 1: the peer may copy chunk j + 2 there
        __syncwarp();
        if (lane == 0) mbar_arrive_cluster(peer_smem(F::rec_free_bar(smem, (j - 1) % R), cluster_rank() ^ 1u));
      }
      named_sync(F::kBarFull + s, F::kThreads);
      GDNKIT_FUSED_STAMP(tid == 0 && j == 0, 3);
      GDNKIT_FUSED_STAMP_STEP(tid == 0, j, fp.timeline_j0, 8);
      if (from_peer) mbar_wait(F::rec_full_bar(smem, s), (j / 6) & 1);  // the peer's copy (fused_paired)
#if GDNKIT_FUSED_V_WAIT_STATE && GDNKIT_FUSED_PROBE_SKIP != 3
      mbar_wait(F::v_bar(smem, j % 2), (j / 2) & 1);  // this chunk's V (the aux's FULL does not cover it)
#endif
      GDNKIT_STEP_MARK(1);
      // Past FULL of chunk j every state thread is done with step j - 1, so chunk j - 1's stages
      // are free (below). In the walk-list kernels chunk j + 2's K and Q go there first, ahead of
      // the O store and V's copy (kKqFirst; the 64-column kernels have copied them already, at the
      // end of step j - 1: kKqAtEnd).
#if GDNKIT_FUSED_PROBE_SKIP != 3
      if (kKqFirst && tid == 0 && j >= 1) {
        const int a = F::ahead(smem, s)[1];
        if (a >= 0) copy.kq(a, (j + 2) % 3);
      }
#endif
      if constexpr (kStageO && !kStoreAtEnd)
        if (tid == 0 && o_pending >= 0) store_staged_o(j - 1);
      // Every state thread is past step j - 1, so its stages are free: V of chunk j + 1 and K, Q of
      // chunk j + 2 go there (chunks 0-2 and 0-1 are the aux's; K and Q above where kKqFirst). With
      // two state warpgroups, state thread 0 issues them while the step's K S and Q S are in flight
      // (walk_chunk's aside): issued here, before P, they had kept every other state warp waiting
      // at the P barrier (2-6% slower on the 128-column rows; issuing K and Q alone first is still
      // 4-7% slower in the unsplit kernel). With one (64-column pairs, whose aux sets the step)
      // they are issued here: later, they delayed the aux's next records (1-2% slower;
      // docs/perf-notes.md).
      // V's copy goes there too where O is staged: it waits for the store's reads of the stage.
      constexpr bool kCopiesAside = F::kStateWarpgroups == 2, kVAside = kCopiesAside || (kStageO && !kStoreAtEnd);
      const auto copy_kq = [&] {
#if GDNKIT_FUSED_PROBE_SKIP != 3
        if (!kKqFirst && !kKqAtEnd && tid == 0 && j >= 1) {
          const int a = F::ahead(smem, s)[1];
          if (a >= 0) copy.kq(a, (j + 2) % 3);
        }
#endif
      };
      const auto copy_v = [&] {
#if GDNKIT_FUSED_PROBE_SKIP != 3
        if (tid == 0 && j >= 1) {
          const int a = F::ahead(smem, s)[0];
          if (a >= 0) {
            if constexpr (kStageO) bulk_wait_read<0>();  // chunk j - 1's O, staged where V goes
            copy.v(a, (j + 1) % 2);
          }
        }
#endif
      };
      if constexpr (!kVAside) copy_v();
      if constexpr (!kCopiesAside) copy_kq();
      const auto aside = [&] {
        if constexpr (kVAside && !kStageO) copy_v();
        if constexpr (kCopiesAside) copy_kq();
        if constexpr (kVAside && kStageO) copy_v();  // after K and Q: it waits for the O store's reads
      };
      probe.mark();
      unsigned char* const rec = F::rec(smem, s);
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
      if constexpr (!F::kAuxP)
        fused_p<F>(F::kq(smem, j % 3), F::p_tile(smem, s),
                   reinterpret_cast<const float*>(smem + F::off_gates + s * F::gates_bytes) + C, p.scale, tid);
      // The zero V rows and P, before the walk's wgmma reads them (and a later TMA copy rewrites V).
      gmma_smem_fence();
      named_sync(F::kBarP, 128 * F::kStateWarpgroups);
      GDNKIT_STEP_MARK(2);
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
      T* const orow0 = to_map ? static_cast<T*>(p.map_o) + map_o_piece(c0, h, mkk, mt % 32, p.num_heads, DK)
                              : static_cast<T*>(p.o) + static_cast<std::int64_t>(h) * p.o_head + v0 + l.cw + c0 * o_token;
      unsigned char* const o_stage = kStageO && nrows == C && (!F::kWalks || (orows > 0 && !to_map))
                                         ? reinterpret_cast<unsigned char*>(F::v(smem, j % 2))
                                         : nullptr;
#if GDNKIT_FUSED_PROBE_SKIP == 2
      if (nrows > 0) aside();
      else
#endif
      switch ((nrows + 15) / 16) {
        case 4: walk_chunk<W, 4, kStageO>(st, S, l, zero_state, orows, p.scale, orow0, o_token, aside, o_stage); break;
        case 3: walk_chunk<W, 3>(st, S, l, zero_state, orows, p.scale, orow0, o_token, aside); break;
        case 2: walk_chunk<W, 2>(st, S, l, zero_state, orows, p.scale, orow0, o_token, aside); break;
        default: walk_chunk<W, 1>(st, S, l, zero_state, orows, p.scale, orow0, o_token, aside); break;
      }
      if constexpr (kStageO) {
        if (o_stage != nullptr) gmma_smem_fence();  // the staged O, for the TMA store (async proxy)
        o_pending = o_stage != nullptr ? static_cast<int>(c0) : -1;
        if constexpr (kStoreAtEnd) {
          if (kKqAtEnd || o_pending >= 0) named_sync(F::kBarP, 128);  // every warp's stmatrix and products
#if GDNKIT_FUSED_PROBE_SKIP != 3
          if (kKqAtEnd && tid == 0) {  // chunk j's K and Q stage is free: chunk j + 3's go there
            const int a = F::ahead(smem, s)[2];
            if (a >= 0) copy.kq(a, j % 3);
          }
#endif
          if (o_pending >= 0 && tid == 0) store_staged_o(j);
          o_pending = -1;
        }
      }
      GDNKIT_FUSED_STAMP_STEP(tid == 0, j, fp.timeline_j0, 16);
      named_arrive(F::kBarEmpty + s, F::kThreads);
      probe.mark();
      probe.print("state: full-wait walk");
      zero_state = false;
    }
    if constexpr (F::kWalks) {
      const WalkSpan w = walk_entry(order, i);
      const int col = v0 + l.cw + l.g;
      if (is_map) {
        if (w.map >= 0)
          store_map_tiles<DK>(st, p.map_out + (static_cast<std::int64_t>(w.map) * p.num_heads + h) * DK * DK, col, l.t);
        continue;
      }
      if (w.state_out >= 0) store_state_tiles<DK>(st, p, p.walk_out, lane_state_offset<DK>(p, w.state_out, h, col, l.t));
      if (p.want_final_state && w.last) store_state_tiles<DK>(st, p, lane_state_offset<DK>(p, w.seq, h, col, l.t));
    } else if (p.want_final_state) {
      store_state_tiles<DK>(st, p, lane_state_offset<DK>(p, walk_seq(i), h, v0 + l.cw + l.g, l.t));
    }
  }
  if constexpr (kStageO) {  // the last chunk's staged O; no store is in flight at exit
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

template <class F>
__device__ __forceinline__ void fused_cta(const FusedParams& fp) {
  extern __shared__ __align__(128) unsigned char smem_raw[];
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
  if constexpr (F::kWalks) {
    // The CTA's entries, into shared memory (walk_entry) before the barrier below.
    if (tid < kCtaWalks) {
      const std::int64_t i = blockIdx.z + static_cast<std::int64_t>(tid) * gridDim.z;
      if (i < fp.p.num_walks) reinterpret_cast<WalkSpan*>(order)[tid] = cp_walk_entry(fp.p, fp.p.walks, i, false);
    }
  }
  if (fp.p.longest_first) {
    rank_longest_first<F::kThreads>(fp.p, order, order + kLongestFirstMaxSeqs, tid);  // ends with a CTA barrier
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
    fused_aux<F>(fp, smem, order, tid);
  } else {
#if GDNKIT_FUSED_PROBE_SKIP != 3
    if constexpr (F::kKqFirst)
      if (tid == 128) fused_later_first_copies<F>(fp, smem, order);
#endif
    if constexpr (F::kStateWarpgroups == 2) regs_up<F::kStateRegs>();
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

// grid = (dv / DVB, H, min(N, 65535) or fewer); 128 + 2 DVB threads. Images other than sm_90a
// hold only a trap (the planner never picks the kernel there).
template <typename T, int DK, int DVB, bool kWalks = false, bool kAuxP = false>
__global__ void __launch_bounds__(FusedSm90<T, DK, DVB, kWalks, kAuxP>::kThreads, 1)
    gdn_fused_kernel(const __grid_constant__ FusedParams fp) {
#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
  __trap();
#else
  fused_cta<FusedSm90<T, DK, DVB, kWalks, kAuxP>>(fp);
#endif
}

}  // namespace gdnkit::cuda
