// The fused SM90 kernel (docs/fused-kernel-design.md): the prep and the state walk of the CUDA
// path in one warp-specialised CTA per (value block of DVB = 128 or 64 columns, head, sequence
// list), so that no record goes through global memory and K and Q are read once.
//
// One aux warpgroup and DVB / 64 state warpgroups (384 or 256 threads):
//   aux (warps 0-3)    thread 0 issues TMA copies of every chunk's K and Q (one chunk ahead of
//                      the aux itself) and V; all four warps compute the chunk's record into shared
//                      memory one chunk ahead of the walk: Q K^T and K K^T on wgmma (both operands
//                      from the swizzled K, Q tiles, in flight while the gates' cumsum G is formed),
//                      P and gam/dec, A = diag(beta) K K^T .* D (D_ij = exp(G_i - G_j), shared with
//                      P), its fp32 inverse D .* Tu (invert_unit_lower, the prep kernel's), and
//                      Mt = (D .* Tu) diag(beta) as hi + lo from the inverse's registers, straight
//                      into the 128-byte-swizzled tiles the walk's wgmma reads;
//   state (warps 4-)   warpgroups of 64 value columns each run the wgmma walk's chunk step
//                      (walk_chunk with WgmmaWalk's products), the state in registers throughout.
// With two state warpgroups, registers move from the aux to them (setmaxnreg: 136 + 2 x 184 =
// 3 x 168; ptxas then serializes the kernel's wgmma (C7512), which needs 192 for the state, but
// 120 + 2 x 192 makes the aux spill and runs 1.3x slower). With one, every warpgroup keeps 255.
//
// Shared memory rings: K+Q in three stages (chunk c is read by the aux for its record while the
// walk runs chunk c - 1, then by the walk; chunk c + 1's copies are in flight meanwhile), V and the
// record in two; mbarriers track the copies. Named barriers: FULL[c % 2] (aux arrives when chunk
// c's K, Q, V and record are in place; the state warps wait), EMPTY[c % 2] (the state warps arrive
// when done with chunk c; the aux waits before it reuses chunk c's stages for chunk c + 2 and
// c + 3). The aux's own barrier orders its phases.
//
// Tail chunks: a TMA box always holds 64 rows, so past a sequence's end it copies the next
// sequence's rows (or zeros past the tensor). With finite values they would cancel exactly (zero
// gates, beta and Mt columns), but a non-finite neighbour would turn 0 x inf into NaN: the aux
// zeroes those rows of K and Q before its own products read them, and each state warpgroup zeroes
// the rows of its V columns that the walk reads (racecheck flags the aux doing it across the FULL
// barrier; masking X in the walk costs the walk spills). Gates and beta of padding rows
// are 0; the walk runs only the valid row blocks and writes only valid rows, so nothing past a
// sequence's end is written. The descriptors are kernel parameters (__grid_constant__), never
// modified.
#pragma once

#include "cuda/prep_kernel.cuh"
#include "cuda/walk_sm90.cuh"

namespace gdnkit::cuda {

template <typename T_, int DK_, int DVB_ = 128>
struct FusedSm90 {
  using T = T_;
  static constexpr int DK = DK_;
  static constexpr int DVB = DVB_;             // value columns per CTA: 64 per state warpgroup
  static_assert(DVB == 64 || DVB == 128, "one or two state warpgroups");
  static constexpr int kStateWarpgroups = DVB / 64;
  static constexpr int kThreads = 128 * (1 + kStateWarpgroups);
  // The state warpgroups' products (WgmmaWalk's), with V staged as TMA lands it: 128-byte-swizzled
  // column blocks of 64 value columns.
  struct Walk : WgmmaWalk<T, DK, kStateWarpgroups> {
    static constexpr bool kVSwizzled = true;
  };
  static constexpr int LDA = kChunk + 4;       // fp32 A / Tu rows (as in the prep kernel)
  static constexpr int LDR = 8;
  // Registers per thread: aux + 2 x state = 3 x 168 (a 384-thread launch). Overridable to measure.
#ifndef GDNKIT_FUSED_AUX_REGS
#define GDNKIT_FUSED_AUX_REGS 136
#define GDNKIT_FUSED_STATE_REGS 184
#endif
  // (Two warpgroups, DVB = 64, keep the launch's 255 per thread: no register moves.)
  static constexpr int kAuxRegs = GDNKIT_FUSED_AUX_REGS, kStateRegs = GDNKIT_FUSED_STATE_REGS;
  static_assert(kAuxRegs + 2 * kStateRegs <= 3 * 168 && kAuxRegs % 8 == 0 && kStateRegs % 8 == 0,
                "setmaxnreg budget of a 384-thread CTA");
  // Named barrier ids (+ stage, or + state warpgroup for kBarVTail).
  static constexpr int kBarAux = 1, kBarFull = 2, kBarEmpty = 4, kBarVTail = 6;

  static constexpr std::size_t kq_bytes = 2 * Walk::k_bytes;  // K, then Q
  static constexpr std::size_t m_bytes = Walk::m_bytes;       // one swizzled 64 x 64 tile
  static constexpr std::size_t rec_gam = 3 * m_bytes;         // Mt hi, Mt lo, P, then gam, dec
  static constexpr std::size_t rec_bytes =
      (rec_gam + 2 * kChunk * 4 + kSwizzleAtomBytes - 1) / kSwizzleAtomBytes * kSwizzleAtomBytes;
  static constexpr std::size_t v_bytes = std::size_t(DVB / 64) * kChunk * 128;
  static constexpr std::size_t off_kq = 0;                               // 3 stages
  static constexpr std::size_t off_rec = off_kq + 3 * kq_bytes;          // 2 stages
  static constexpr std::size_t off_v = off_rec + 2 * rec_bytes;          // 2 stages
  static constexpr std::size_t off_at = off_v + 2 * v_bytes;             // A, then Tu's diagonal blocks
  static constexpr std::size_t off_tl = off_at + align128(std::size_t(kChunk) * LDA * 4);  // Tu rows 16..63
  static constexpr std::size_t off_r = off_tl + align128(std::size_t(kChunk - 16) * LDA * 4);
  // Per record stage: the gates as loaded, their cumsum G, beta (64 fp32 each). Two stages, so the
  // next chunk's gates are stored while a slow warp still reads this chunk's.
  static constexpr std::size_t off_gates = off_r + align128(std::size_t(4) * 16 * LDR * 4);
  static constexpr std::size_t gates_bytes = 3 * kChunk * 4;
  static constexpr std::size_t off_order = off_gates + 2 * gates_bytes;  // longest-first ranks
  static constexpr std::size_t off_bar = off_order + kWalkOrderBytes;     // mbarriers: K+Q x 3, V x 2
  static constexpr std::size_t smem_bytes = off_bar + 5 * 8 + kSwizzleAtomBytes;  // + base alignment
  static_assert(kq_bytes % kSwizzleAtomBytes == 0 && v_bytes % kSwizzleAtomBytes == 0 &&
                    rec_bytes % kSwizzleAtomBytes == 0 && off_bar % 8 == 0,
                "stages keep their alignment");

  __device__ static unsigned char* kq(unsigned char* smem, int s) { return smem + off_kq + s * kq_bytes; }
  __device__ static unsigned char* rec(unsigned char* smem, int s) { return smem + off_rec + s * rec_bytes; }
  __device__ static T* v(unsigned char* smem, int s) { return reinterpret_cast<T*>(smem + off_v + s * v_bytes); }
  __device__ static std::uint64_t* kq_bar(unsigned char* smem, int s) {
    return reinterpret_cast<std::uint64_t*>(smem + off_bar) + s;
  }
  __device__ static std::uint64_t* v_bar(unsigned char* smem, int s) {
    return reinterpret_cast<std::uint64_t*>(smem + off_bar) + 3 + s;
  }
};

// The kernel's parameters: the split path's, and TMA descriptors of k, q and v as 3-D tensors
// (columns, tokens, heads), boxes of 64 x 64 x 1 with the 128-byte swizzle. Built on the host for
// every call and passed by value (__grid_constant__): nothing is shared between launches.
struct FusedParams {
  ChunkedParams p;
  CUtensorMap k, q, v;
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
         encode_tile_map(&fp->v, p.v, bf16, p.dv, p.tokens, p.v_heads, p.v_token, p.v_head);
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
#else
  __device__ void mark() {}
  __device__ void print(const char*) const {}
#endif
};

// The record of one chunk (rows [0, nrows) valid) from its staged K and Q (kq) and the thread's
// gate or beta value (load_gate_beta; staged in `gates`), by the aux warpgroup (tid < 128), into
// rec: P, Mt hi, Mt lo as swizzled 64 x 64 tiles (zeros above the diagonal and in rows past the
// valid row blocks: P written whole, Mt's blocks right of the diagonal zero since
// zero_record_tiles), gam and dec. The caller's copies of K and Q have landed; this starts with an
// aux barrier.
template <class F>
__device__ __forceinline__ void fused_record(const unsigned char* kq, unsigned char* rec, unsigned char* smem,
                                             float* gates, float gate_beta, int nrows, float scale, int tid,
                                             FusedProbe& probe) {
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
  named_sync(F::kBarAux, 128);
  probe.mark();

  // Q K^T and K K^T (rows: Q or K, columns: K; warp w holds rows 16 w + g and + 8, columns
  // 8 n + 2t, + 1), two commit groups in flight while G is formed.
  const unsigned char* const ks = kq;
  const unsigned char* const qs = kq + F::Walk::k_bytes;
  auto kdesc = [](const unsigned char* tile, int kk) {
    return gmma_desc(tile + (kk / 4) * (kChunk * 128) + (kk % 4) * 32, 16, 1024);
  };
  float qk[32], kkt[32];
  gmma_fence(qk);
  gmma_fence(kkt);
  gmma_arrive();
#pragma unroll
  for (int kk = 0; kk < DK / 16; ++kk) gmma_ss<T, 64>(qk, kdesc(qs, kk), kdesc(ks, kk), kk > 0);
  gmma_commit();
#pragma unroll
  for (int kk = 0; kk < DK / 16; ++kk) gmma_ss<T, 64>(kkt, kdesc(ks, kk), kdesc(ks, kk), kk > 0);
  gmma_commit();
  probe.mark();

  // G in every warp; warp 0 publishes G log2(e) (the exponents below are base 2) and gam, dec
  // (G_last = G[63]: padded rows repeat it).
  {
    float ga, gb;
    chunk_cumsum(gs, lane, ga, gb);
    if (warp == 0) {
      constexpr float kLog2e = 1.4426950408889634f;
      Gs[lane] = ga * kLog2e;
      Gs[lane + 32] = gb * kLog2e;
      float* const gam = reinterpret_cast<float*>(rec + F::rec_gam);
      const float g_last = __shfl_sync(0xffffffffu, gb, 31);
      gam[lane] = fast_exp(ga);
      gam[lane + 32] = fast_exp(gb);
      gam[kChunk + lane] = fast_exp(g_last - ga);
      gam[kChunk + lane + 32] = fast_exp(g_last - gb);
    }
  }
  named_sync(F::kBarAux, 128);  // G published
  probe.mark();

  // The decay D_ij = exp(G_i - G_j) (j <= i, else 0) once per element, for both P and A:
  //   P = scale * (Q K^T) .* D, stored as the walk's 16-bit tile;
  //   A = diag(beta) (K K^T) .* D (block row w, tiles left of and on the diagonal, by warp w),
  // so that the inverse of I + strict_lower(A) is D .* Tu (a similarity by diag(exp(G))) and Mt
  // below needs no exponentials. Every exponent is <= 0: nothing overflows for any gates.
  const int i0 = 16 * warp + g;
  const float gi[2] = {Gs[i0], Gs[i0 + 8]};
  const float b[2] = {bs[i0], bs[i0 + 8]};
  gmma_wait<0>();
  gmma_fence(qk);
  gmma_fence(kkt);
  {
    unsigned char* const P = rec + 2 * F::m_bytes;
#pragma unroll
    for (int n = 0; n < 8; ++n) {
      const int j = 8 * n + 2 * t;
      const float2 gj = *reinterpret_cast<const float2*>(Gs + j);
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const int i = i0 + 8 * hh;
        const float d0 = j <= i ? fast_exp2(gi[hh] - gj.x) : 0.0f;
        const float d1 = j + 1 <= i ? fast_exp2(gi[hh] - gj.y) : 0.0f;
        *reinterpret_cast<std::uint32_t*>(P + swizzle128(i, n) + 4 * t) =
            pack2<T>(scale * qk[4 * n + 2 * hh] * d0, scale * qk[4 * n + 2 * hh + 1] * d1);
        if (n <= 2 * warp + 1)
          *reinterpret_cast<float2*>(At + i * LDA + j) =
              make_float2(b[hh] * kkt[4 * n + 2 * hh] * d0, b[hh] * kkt[4 * n + 2 * hh + 1] * d1);
      }
    }
  }
  named_sync(F::kBarAux, 128);
  probe.mark();
  // The inverse D .* Tu, and Mt = (D .* Tu) diag(beta) as hi + lo straight from its registers as
  // each block is formed: the diagonal blocks by columns (lane j < 16 of warp w holds column
  // 16 w + j), the blocks left of the diagonal as mma fragments. The blocks right of the diagonal
  // are zero from the kernel's start (zero_record_tiles) and never written; a tail chunk zeroes
  // the block rows at or past nb, which the inverse leaves alone.
  unsigned char* const Mh = rec;
  unsigned char* const Ml = rec + F::m_bytes;
  auto put_pair = [&](int r, int c, float v0, float v1) {  // Mt[r][c], Mt[r][c + 1] (c even)
    const std::uint32_t hi = pack2<T>(v0, v1);
    const float2 hf = unpack2<T>(hi);
    const std::uint32_t off = swizzle128(r, c / 8) + 2 * (c % 8);
    *reinterpret_cast<std::uint32_t*>(Mh + off) = hi;
    *reinterpret_cast<std::uint32_t*>(Ml + off) = pack2<T>(v0 - hf.x, v1 - hf.y);
  };
  auto emit_diag = [&](const float (&x)[16]) {
    const int c = 16 * warp + lane;
    const float bc = bs[c];
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      const float v = x[i] * bc;
      const std::uint32_t hi = pack2<T>(v, 0.0f);
      const std::uint32_t off = swizzle128(16 * warp + i, c / 8) + 2 * (c % 8);
      *reinterpret_cast<std::uint16_t*>(Mh + off) = static_cast<std::uint16_t>(hi);
      *reinterpret_cast<std::uint16_t*>(Ml + off) = static_cast<std::uint16_t>(pack2<T>(v - unpack2<T>(hi).x, 0.0f));
    }
  };
  auto emit_block = [&](int I, int J, int nt, const float (&o)[4]) {
    const int c = 16 * J + 8 * nt + 2 * t;
    const float2 bc = *reinterpret_cast<const float2*>(bs + c);
    put_pair(16 * I + g, c, o[0] * bc.x, o[1] * bc.y);
    put_pair(16 * I + g + 8, c, o[2] * bc.x, o[3] * bc.y);
  };
  invert_unit_lower<LDA, F::LDR>(
      At, Tl, reinterpret_cast<float*>(smem + F::off_r), nb, warp, lane,
      [&] {
        named_sync(F::kBarAux, 128);
        probe.mark();
      },
      emit_diag, emit_block);
  if (nb < 4) {  // a tail chunk: rows [16 nb, 64) of Mt hi and lo are zero
    for (int idx = tid; idx < 2 * (kChunk - 16 * nb) * 8; idx += 128) {
      const int c = idx % 8, r = 16 * nb + (idx / 8) % (kChunk - 16 * nb);
      *reinterpret_cast<uint4*>((idx < (kChunk - 16 * nb) * 8 ? Mh : Ml) + swizzle128(r, c)) =
          make_uint4(0u, 0u, 0u, 0u);
    }
  }
  probe.mark();
}

// Zeroes the Mt hi and lo tiles of both record stages, once per CTA before the first record
// (fused_record writes only their blocks on and left of the diagonal), by the aux's 128 threads.
template <class F>
__device__ __forceinline__ void zero_record_tiles(unsigned char* smem, int tid) {
  for (int s = 0; s < 2; ++s)
    for (int idx = tid; idx < int(2 * F::m_bytes / 16); idx += 128)
      reinterpret_cast<uint4*>(F::rec(smem, s))[idx] = make_uint4(0u, 0u, 0u, 0u);
}

// A chunk position in the CTA's list of sequences (blockIdx.z, blockIdx.z + gridDim.z, ...):
// list entry i, sequence n = [bos, eos), chunk at token c0. i >= num_seqs: past the end.
struct ChunkPos {
  std::int64_t i, n, bos, eos, c0;
  __device__ int nrows() const { return static_cast<int>(eos - c0 < kChunk ? eos - c0 : kChunk); }
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

// The aux warpgroup: copies (TMA, issued by thread 0) and records, one chunk ahead of the state
// warpgroups.
template <class F>
__device__ __forceinline__ void fused_aux(const FusedParams& fp, unsigned char* smem, const int* order, int tid) {
  constexpr int DK = F::DK;
  const ChunkedParams& p = fp.p;
  constexpr int C = kChunk;
  const int h = blockIdx.y;
  const int hq = h / p.q_group, hk = h / p.k_group, hv = h / p.v_group;
  const int v0 = blockIdx.x * F::DVB;
  // The first chunk of the first non-empty sequence among list entries i, i + gridDim.z, ...
  auto seek = [&](std::int64_t i) -> ChunkPos {
    for (; i < p.num_seqs; i += gridDim.z) {
      const std::int64_t n = p.longest_first ? order[i] : i;
      const std::int64_t bos = seq_begin(p, n), eos = seq_begin(p, n + 1);
      if (eos > bos) return {i, n, bos, eos, bos};
    }
    return {i, 0, 0, 0, 0};
  };
  auto next = [&](const ChunkPos& c) -> ChunkPos {
    if (c.c0 + C < c.eos) return {c.i, c.n, c.bos, c.eos, c.c0 + C};
    return seek(c.i + gridDim.z);
  };
  // Thread 0 arms a stage's barrier and issues its boxes (64 columns x 64 tokens each).
  auto load_kq = [&](const ChunkPos& c, int s) {
    if (tid != 0) return;
    unsigned char* const d = F::kq(smem, s);
    std::uint64_t* const bar = F::kq_bar(smem, s);
    mbar_expect_tx(bar, static_cast<std::uint32_t>(F::kq_bytes));
    for (int b = 0; b < DK / 64; ++b) {
      tma_load_3d(d + b * (C * 128), &fp.k, bar, 64 * b, static_cast<int>(c.c0), hk);
      tma_load_3d(d + F::Walk::k_bytes + b * (C * 128), &fp.q, bar, 64 * b, static_cast<int>(c.c0), hq);
    }
  };
  auto load_v = [&](const ChunkPos& c, int s) {
    if (tid != 0) return;
    unsigned char* const d = reinterpret_cast<unsigned char*>(F::v(smem, s));
    std::uint64_t* const bar = F::v_bar(smem, s);
    mbar_expect_tx(bar, static_cast<std::uint32_t>(F::v_bytes));
    for (int b = 0; b < F::DVB / 64; ++b) tma_load_3d(d + b * (C * 128), &fp.v, bar, v0 + 64 * b, static_cast<int>(c.c0), hv);
  };

  int j = 0;  // chunks handed to the state warpgroups
  ChunkPos cur = seek(blockIdx.z);
  if (cur.i < p.num_seqs) {
    load_kq(cur, 0);
    zero_record_tiles<F>(smem, tid);  // ordered before the records' writes by fused_record's first barrier
    float gb_cur = load_gate_beta(p, cur.c0, cur.nrows(), h, tid);
    for (;;) {
      FusedProbe probe;
#ifdef GDNKIT_FUSED_PROBE
      probe.on = tid == 0 && blockIdx.x == 0 && blockIdx.y == 0 && blockIdx.z == 0 && j == 8;
#endif
      probe.mark();
      const ChunkPos nxt = next(cur);
      const bool more = nxt.i < p.num_seqs;
      const int nrows = cur.nrows();
      if (j >= 2) named_sync(F::kBarEmpty + j % 2, F::kThreads);  // chunk j - 2 is done with
      probe.mark();
#if GDNKIT_FUSED_PROBE_SKIP != 3
      load_v(cur, j % 2);
      if (more) load_kq(nxt, (j + 1) % 3);
#endif
      probe.mark();
      const float gb_next = more ? load_gate_beta(p, nxt.c0, nxt.nrows(), h, tid) : 0.0f;
      probe.mark();
#if GDNKIT_FUSED_PROBE_SKIP != 3
      mbar_wait(F::kq_bar(smem, j % 3), (j / 3) & 1);  // this chunk's K and Q
#endif
      if (nrows < C) {
        zero_tile_rows(F::kq(smem, j % 3), 2 * (DK / 64), nrows, C, tid);
        gmma_smem_fence();  // the zero rows, before wgmma reads them (only here: the fence waits
                            // for this thread's outstanding loads, the next chunk's gates)
      }
#if GDNKIT_FUSED_PROBE_SKIP != 1
      fused_record<F>(F::kq(smem, j % 3), F::rec(smem, j % 2), smem,
                          reinterpret_cast<float*>(smem + F::off_gates + (j % 2) * F::gates_bytes), gb_cur, nrows,
                          p.scale, tid, probe);
#endif
#if GDNKIT_FUSED_PROBE_SKIP != 3
      mbar_wait(F::v_bar(smem, j % 2), (j / 2) & 1);  // this chunk's V
#endif
      gmma_smem_fence();  // the record's stores, before the state warpgroups' wgmma
      named_arrive(F::kBarFull + j % 2, F::kThreads);
      probe.mark();
      probe.print("aux: EMPTY | TMA issue | gate loads | K,Q wait, gates | wgmma issue | cumsum | products' wait, P, A | "
                  "diagonal | rows 1 2 3 | Mt | V + FULL");
      ++j;
      if (!more) break;
      cur = nxt;
      gb_cur = gb_next;
    }
  }
  // Every arrival on a barrier is matched before the CTA exits: the last two chunks' EMPTY.
  for (int jj = j >= 2 ? j - 2 : 0; jj < j; ++jj) named_sync(F::kBarEmpty + jj % 2, F::kThreads);
}

// The state warpgroups (tid = thread index among their 256): the walk of every sequence in the
// CTA's list, empty ones included (their final state is the initial one).
template <class F>
__device__ __forceinline__ void fused_state(const ChunkedParams& p, unsigned char* smem, const int* order, int tid) {
  using T = typename F::T;
  constexpr int DK = F::DK;
  using W = typename F::Walk;
  constexpr int C = kChunk;
  const int warp = tid / 32, lane = tid % 32;
  const int h = blockIdx.y;
  const int v0 = blockIdx.x * F::DVB;
  const WalkLane l = walk_lane(warp, lane);
  T* const oh = static_cast<T*>(p.o) + static_cast<std::int64_t>(h) * p.o_head + v0 + l.cw;

  float st[DK / 8][4];
  int j = 0;
  for (std::int64_t i = blockIdx.z; i < p.num_seqs; i += gridDim.z) {
    const std::int64_t n = p.longest_first ? order[i] : i;
    const std::int64_t bos = seq_begin(p, n), eos = seq_begin(p, n + 1);
    const std::int64_t state_lane = lane_state_offset<DK>(p, n, h, v0 + l.cw + l.g, l.t);
    load_state_tiles<DK>(st, p, state_lane);
    bool zero_state = !p.has_initial_state;  // then the first chunk skips K S and Q S
    for (std::int64_t c0 = bos; c0 < eos; c0 += C, ++j) {
      const int nrows = static_cast<int>(eos - c0 < C ? eos - c0 : C);
      FusedProbe probe;
#ifdef GDNKIT_FUSED_PROBE
      probe.on = tid == 0 && blockIdx.x == 0 && blockIdx.y == 0 && blockIdx.z == 0 && j == 8;
#endif
      probe.mark();
      named_sync(F::kBarFull + j % 2, F::kThreads);
      probe.mark();
      if (nrows < C) {
        // A tail chunk: each warpgroup zeroes the rows of its own 64 V columns that the walk reads
        // past the end, [nrows, 16 nb) (TMA filled them from the next sequence), and fences them
        // before a later TMA copy rewrites the stage.
        // At most 15 rows of 8 16-byte words: one store per thread.
        const int idx = tid % 128, r = nrows + idx / 8;
        if (r < 16 * ((nrows + 15) / 16))
          *reinterpret_cast<uint4*>(reinterpret_cast<unsigned char*>(F::v(smem, j % 2)) + (tid / 128) * (C * 128) +
                                    swizzle128(r, idx % 8)) = make_uint4(0u, 0u, 0u, 0u);
        gmma_smem_fence();
        named_sync(F::kBarVTail + tid / 128, 128);
      }
      unsigned char* const rec = F::rec(smem, j % 2);
      const WalkStage<T> S{nullptr, F::kq(smem, j % 3), rec, F::v(smem, j % 2),
                           reinterpret_cast<const float*>(rec + F::rec_gam)};
      T* const orow0 = oh + c0 * p.o_token;
#if GDNKIT_FUSED_PROBE_SKIP == 2
      if (nrows > 0) {}
      else
#endif
      switch ((nrows + 15) / 16) {
        case 4: walk_chunk<W, 4>(st, S, l, zero_state, nrows, p.scale, orow0, p.o_token); break;
        case 3: walk_chunk<W, 3>(st, S, l, zero_state, nrows, p.scale, orow0, p.o_token); break;
        case 2: walk_chunk<W, 2>(st, S, l, zero_state, nrows, p.scale, orow0, p.o_token); break;
        default: walk_chunk<W, 1>(st, S, l, zero_state, nrows, p.scale, orow0, p.o_token); break;
      }
      named_arrive(F::kBarEmpty + j % 2, F::kThreads);
      probe.mark();
      probe.print("state: full-wait walk");
      zero_state = false;
    }
    if (p.want_final_state) store_state_tiles<DK>(st, p, state_lane);
  }
}

template <class F>
__device__ __forceinline__ void fused_cta(const FusedParams& fp) {
  extern __shared__ __align__(128) unsigned char smem_raw[];
  unsigned char* const smem =
      smem_raw + ((kSwizzleAtomBytes - (smem_addr(smem_raw) & (kSwizzleAtomBytes - 1))) & (kSwizzleAtomBytes - 1));
  const int tid = threadIdx.x;
  int* const order = reinterpret_cast<int*>(smem + F::off_order);
  if (tid == 0) {
    tma_prefetch(&fp.k);
    tma_prefetch(&fp.q);
    tma_prefetch(&fp.v);
    for (int s = 0; s < 3; ++s) mbar_init(F::kq_bar(smem, s), 1);
    for (int s = 0; s < 2; ++s) mbar_init(F::v_bar(smem, s), 1);
    mbar_init_fence();
  }
  if (fp.p.longest_first)
    rank_longest_first<F::kThreads>(fp.p, order, order + kLongestFirstMaxSeqs, tid);  // ends with a CTA barrier
  else
    __syncthreads();  // the barriers are initialised
  if (tid < 128) {
    if constexpr (F::kStateWarpgroups == 2) regs_down<F::kAuxRegs>();
    fused_aux<F>(fp, smem, order, tid);
  } else {
    if constexpr (F::kStateWarpgroups == 2) regs_up<F::kStateRegs>();
    fused_state<F>(fp.p, smem, order, tid - 128);
  }
}

// grid = (dv / DVB, H, min(N, 65535) or fewer); 128 + 2 DVB threads. Images other than sm_90a
// hold only a trap (the planner never picks the kernel there).
template <typename T, int DK, int DVB>
__global__ void __launch_bounds__(FusedSm90<T, DK, DVB>::kThreads, 1)
    gdn_fused_kernel(const __grid_constant__ FusedParams fp) {
#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
  __trap();
#else
  fused_cta<FusedSm90<T, DK, DVB>>(fp);
#endif
}

}  // namespace gdnkit::cuda
