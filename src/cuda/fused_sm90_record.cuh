// The fused SM90 kernel's per-chunk products beside the walk: the gates' cumsum, the record (K K^T,
// its inverse, Mt as hi + lo, gam and dec) formed by the aux warpgroup (fused_record), and P
// (fused_p, by the state warpgroups, or by the aux in the kAuxP instantiation).
#pragma once

#include "cuda/fused_sm90_probe.cuh"
#include "cuda/fused_sm90_traits.cuh"

namespace gdnkit::cuda {

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
// `gates` for fused_p. With kAuxP also P, scaled by `scale`, into the
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
  // flight while G is formed. (Q K^T is the state warpgroups', fused_p, but with kAuxP below.)
  const std::uint64_t dk = fused_kdesc(kq);
  float kkt[32];
  // With kPWithA (the aux's P, kAuxP) also Q K^T, in the same group: P = scale (Q K^T) .* D takes
  // the decay of A's pieces below (the same fragments: rows 16 w + g, + 8, columns 8 n + 2t, + 1),
  // instead of a second pass of exponentials and a second product wait after the inverse.
  constexpr bool kPWithA = F::kAuxP;
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
          // (warp >= 2 said by the row index, which is live here: a fresh read of the thread index
          // needed a register the lead-mode kernel's 128-column aux did not have.)
          const float bi = F::kBlockSolve && i0 >= 32 && q < 2 ? 1.0f : b[hh];
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
  constexpr bool kDiagPairs = true;  // (invert_unit_lower's kDiagPairs; the prep kernel's are false)
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
  if (nb < 4) {  // a tail chunk: rows [16 nb, 64) of Mt hi and lo are zero (as zero_tile_rows)
    for (int r = 16 * nb + tid / 8; r < kChunk; r += 16) {
      *reinterpret_cast<uint4*>(Mh + swizzle128(r, tid % 8)) = make_uint4(0u, 0u, 0u, 0u);
      *reinterpret_cast<uint4*>(Ml + swizzle128(r, tid % 8)) = make_uint4(0u, 0u, 0u, 0u);
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

// P = scale * (Q K^T) .* D (D_ij = exp(G_i - G_j), j <= i, else 0) of one chunk, the walk's
// 16-bit tile P (F::p_tile), by the state warpgroups (tid among them; not with kAuxP, whose aux
// forms P with A): warpgroup w forms columns [NP w, NP w + NP), NP = 64 / warpgroups, on wgmma from the
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
  // (The aux's P, kAuxP, is formed with A by fused_record and stored by stmatrix; here, in the state
  // warpgroups, stmatrix was level or slower and made the walk-list variants spill: docs/perf-notes.md,
  // "P stored by stmatrix".)
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

// walk_chunk's aside in the kernels whose state warpgroups meet the P barrier just before P Vn
// (FusedSm90::kPBarrierLate): walk_chunk calls before_out() there, so that no state warp waits for
// the others (or for thread 0's copies right after FULL) before its first product.
template <class F, class Fn>
struct FusedLateP {
  Fn& fn;
  __device__ __forceinline__ void operator()() { fn(); }
  __device__ __forceinline__ void before_out() const {
    gmma_smem_fence();  // this thread's P, for the wgmma reads of P Vn
    named_sync(F::kBarP, 128 * F::kStateWarpgroups);
  }
};

}  // namespace gdnkit::cuda
