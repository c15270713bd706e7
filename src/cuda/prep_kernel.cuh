// The prep kernel of the CUDA path (docs/math.md, the chunked form, fused): everything about a chunk
// that depends only on K, Q, g and beta, computed once per (chunk, head) and fully in parallel.
//
// For chunk j of sequence n and output head h it writes one workspace record (layout in chunked.h):
//   gam = exp(G), dec = exp(G_last - G) with G = cumsum(g) within the chunk (fp32; computed once
//        here rather than by every warp of every walk),
//   P  = scale * lower_incl(Q K^T) .* exp(G_i - G_j)              (qkv dtype),
//   Mt = exp(G_i - G_j) Tu_ij beta_j, Tu = (I + strict_lower(diag(beta) K K^T))^-1,
//        stored as hi + lo: hi = round(Mt), lo = round(Mt - hi)  (two qkv-dtype matrices).
// Carrying Mt as hi + lo makes it effectively exact (relative error ~2^-17 instead of 2^-9 in bf16):
// measured in emulation, its rounding was one of the two dominant errors of the final state
// (docs/perf-notes.md). Only the 16-row blocks that hold valid rows are computed and written
// (nb = ceil(nrows / 16)).
//
// The work, per CTA of four warps (warp w):
//   1. Gram products on mma.sync (16-bit operands, fp32 accumulators): warp w forms block row 3 - w
//      of Q K^T and block row w of K K^T, five 16 x 16 tiles each way. P leaves straight from the
//      accumulators (no shared-memory round trip); A = diag(beta) K K^T goes to shared memory (fp32).
//   2. The inverse Tu in fp32 arithmetic (invert_unit_lower, shared with the fused kernel): warp b
//      inverts diagonal block b by forward substitution; then block row I (I = 1..3) is
//      Tu_IJ = -Tu_II sum_{J <= M < I} A_IM Tu_MJ, on mma.sync with tf32 operands split as hi + lo
//      (three products: hi hi + hi lo + lo hi, error ~2^-21 per product; as accurate as fp32
//      forward substitution, tests/cpu/test_inverse.cpp).
//   3. Mt as hi + lo from Tu, G and beta.
#pragma once

#include <cfloat>

#include "common/gate.h"
#include "cuda/chunk_io.cuh"
#include "cuda/mma_sm80.cuh"
#include "cuda/wmma_common.cuh"

namespace gdnkit::cuda {

// ---- prep ---------------------------------------------------------------------------------------

// Shared memory, 35 KB at dk = 128 (six CTAs per SM on an H100/H200). Q is staged where A and the
// diagonal blocks of Tu later live (Q K^T leaves from registers before A is stored); Tu's blocks
// below the diagonal (block rows 1..3) and a 16 x 8 scratch per warp reuse K's space once K K^T is
// formed.
template <int DK>
struct PrepLayout {
  static constexpr int C = kChunk;
  static constexpr int LDK = DK + 8;   // +16 bytes per row: ldmatrix rows in distinct bank groups
  static constexpr int LDA = C + 4;    // fp32; tf32 A-fragment loads (rows g, columns t) conflict-free
  static constexpr int LDR = 8;        // the per-warp 16 x 8 scratch
  static constexpr std::size_t k_bytes = std::size_t(C) * LDK * 2;
  static constexpr std::size_t at_bytes = std::size_t(C) * LDA * 4;
  static constexpr std::size_t tl_bytes = std::size_t(C - 16) * LDA * 4;
  static constexpr std::size_t r_bytes = std::size_t(kPrepThreads / 32) * 16 * LDR * 4;
  static constexpr std::size_t vec_bytes = std::size_t(C) * 4;
  static constexpr std::size_t max2(std::size_t a, std::size_t b) { return a > b ? a : b; }
  static constexpr std::size_t off_k = 0;  // K, then Tl and the scratch
  static constexpr std::size_t off_r = off_k + tl_bytes;
  static constexpr std::size_t off_at = off_k + align128(max2(k_bytes, tl_bytes + r_bytes));  // Q, then A / Tu
  static constexpr std::size_t off_g = off_at + align128(max2(at_bytes, k_bytes));  // g as loaded
  static constexpr std::size_t off_G = off_g + align128(vec_bytes);                 // its cumsum
  static constexpr std::size_t off_beta = off_G + align128(vec_bytes);
  static constexpr std::size_t total = off_beta + align128(vec_bytes);
};

// acc[bj][nt] += X_BR Y_bj^T over the key dimension: the 16 x 16 tiles (BR, bj), bj <= BR, of
// X Y^T (X, Y: [64][LDK] 16-bit rows; nt selects columns [8 nt, 8 nt + 8) of a tile).
template <typename T, int DK, int LDK, int BR>
__device__ __forceinline__ void gram_row(float (&acc)[BR + 1][2][4], const T* X, const T* Y, int lane) {
  const int ar = (lane & 7) + 8 * ((lane >> 3) & 1), ac = 8 * (lane >> 4);  // A: (r, c), (r+8, c), (r, c+8), (r+8, c+8)
  const int br = (lane & 7) + 8 * (lane >> 4), bc = 8 * ((lane >> 3) & 1);  // B: (r, c), (r, c+8), (r+8, c), (r+8, c+8)
#pragma unroll
  for (int bj = 0; bj <= BR; ++bj)
#pragma unroll
    for (int nt = 0; nt < 2; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[bj][nt][e] = 0.0f;
#pragma unroll
  for (int kk = 0; kk < DK; kk += 16) {
    std::uint32_t a[4];
    ldsm_x4(a, X + (16 * BR + ar) * LDK + kk + ac);
#pragma unroll
    for (int bj = 0; bj <= BR; ++bj) {
      std::uint32_t b[4];
      ldsm_x4(b, Y + (16 * bj + br) * LDK + kk + bc);
      mma16816<T>(acc[bj][0], a, b[0], b[1]);
      mma16816<T>(acc[bj][1], a, b[2], b[3]);
    }
  }
}

// Block row BR of P = scale * lower_incl(Q K^T) .* exp(G_i - G_j), formed and stored by one warp
// (lower-block layout, zeros above the diagonal and in the 8 padding columns). ga, gb: the
// chunk's G[lane], G[lane + 32] (every lane of the warp holds them).
template <typename T, int DK, int LDK, int BR>
__device__ __forceinline__ void p_block_row(T* Pg, const T* Qs, const T* Ks, float ga, float gb, float scale,
                                            int lane) {
  float acc[BR + 1][2][4];
  gram_row<T, DK, LDK, BR>(acc, Qs, Ks, lane);
  const int g = lane / 4, t = lane % 4;
  constexpr int ld = lower_block_ld(BR);
  T* const row0 = Pg + lower_block_off(BR);
  float gi[2];
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) gi[hh] = __shfl_sync(0xffffffffu, BR < 2 ? ga : gb, (16 * BR + g + 8 * hh) & 31);
#pragma unroll
  for (int bj = 0; bj <= BR; ++bj)
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
      const int j = 16 * bj + 8 * nt + 2 * t;
      const float gj0 = __shfl_sync(0xffffffffu, bj < 2 ? ga : gb, j & 31);
      const float gj1 = __shfl_sync(0xffffffffu, bj < 2 ? ga : gb, (j + 1) & 31);
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const int i = 16 * BR + g + 8 * hh;
        float x0 = scale * acc[bj][nt][2 * hh] * fast_exp(gi[hh] - gj0);
        float x1 = scale * acc[bj][nt][2 * hh + 1] * fast_exp(gi[hh] - gj1);
        if (bj == BR) {  // the diagonal tile: zero above the diagonal
          x0 = j <= i ? x0 : 0.0f;
          x1 = j + 1 <= i ? x1 : 0.0f;
        }
        *reinterpret_cast<unsigned*>(row0 + (g + 8 * hh) * ld + j) = pack2<T>(x0, x1);
      }
    }
  if (lane < 16) *reinterpret_cast<uint4*>(row0 + lane * ld + 16 * (BR + 1)) = make_uint4(0u, 0u, 0u, 0u);
}

// Block row BR of A = diag(beta) K K^T (tiles bj <= BR) into At (fp32, ld LDA), by one warp.
template <typename T, int DK, int LDK, int LDA, int BR>
__device__ __forceinline__ void a_block_row(float* At, const T* Ks, const float* bs, int lane) {
  float acc[BR + 1][2][4];
  gram_row<T, DK, LDK, BR>(acc, Ks, Ks, lane);
  const int g = lane / 4, t = lane % 4;
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    const int i = 16 * BR + g + 8 * hh;
    const float b = bs[i];
#pragma unroll
    for (int bj = 0; bj <= BR; ++bj)
#pragma unroll
      for (int nt = 0; nt < 2; ++nt)
        *reinterpret_cast<float2*>(At + i * LDA + 16 * bj + 8 * nt + 2 * t) =
            make_float2(b * acc[bj][nt][2 * hh], b * acc[bj][nt][2 * hh + 1]);
  }
}

// Accumulators of A B as three tf32 products (lo hi, hi lo, hi hi; hi = tf32(x) rounded, lo = x - hi
// read truncated by the mma (tf32_split), every term but lo lo kept, ~2^-21 relative error per
// product; tests/cpu/test_inverse.cpp models this split: truncating hi instead of rounding it
// measured 1.5x less accurate there, truncating lo as accurate as rounding it). Each term has
// its own accumulator, so a sum over k runs as three short dependency chains of mma.sync rather
// than one long one; sum() adds the small terms first.
struct Tf32x3 {
  float lohi[4], hilo[4], hihi[4];
  __device__ __forceinline__ void zero() {
#pragma unroll
    for (int e = 0; e < 4; ++e) lohi[e] = hilo[e] = hihi[e] = 0.0f;
  }
  __device__ __forceinline__ void sum(float (&d)[4]) const {
#pragma unroll
    for (int e = 0; e < 4; ++e) d[e] = (lohi[e] + hilo[e]) + hihi[e];
  }
};

// A measurement aid (results are wrong with it), for timing the record's inverse apart:
// GDNKIT_PROBE_INVERSE 1 keeps only the hi hi product, 2 skips the block rows left of the diagonal,
// 3 the diagonal blocks' substitution as well, 5 loads no operands for the block rows,
// 6 hands no block to emit_block.
#ifndef GDNKIT_PROBE_INVERSE
#define GDNKIT_PROBE_INVERSE 0
#endif

// The operands of one 16 x 8 x 8 product, as loaded: A (16 x 8 at pa, ld lda; 16-byte aligned
// rows) and B (8 x 8 at pb, ld ldb) in mma.sync's fragment order (rows g, g + 8 and columns t, t + 4
// of A; rows t, t + 4 and column g of B).
struct Tf32Ops {
  float a[4], b[2];
  __device__ __forceinline__ void load(const float* pa, int lda, const float* pb, int ldb, int g, int t) {
#if GDNKIT_PROBE_INVERSE == 5
    (void)pa, (void)lda, (void)pb, (void)ldb;
    a[0] = 1e-3f * g, a[1] = 2e-3f * g, a[2] = 1e-3f * t, a[3] = 2e-3f * t, b[0] = 3e-3f * g, b[1] = 3e-3f * t;
#else
    // A by one ldmatrix: its four 8 x 8 16-bit matrices are the fragment's 8 x 4 fp32 quarters (rows
    // 0-7 and 8-15, columns 0-3 and 4-7), lane (g, t) receiving word t of row g of each.
    const int lane = 4 * g + t, m = lane / 8;
    std::uint32_t r[4];
    ldsm_x4(r, pa + (8 * (m & 1) + lane % 8) * lda + 4 * (m >> 1));
    a[0] = __uint_as_float(r[0]), a[1] = __uint_as_float(r[1]), a[2] = __uint_as_float(r[2]), a[3] = __uint_as_float(r[3]);
    b[0] = pb[t * ldb + g], b[1] = pb[(t + 4) * ldb + g];
#endif
  }
};

// d += A B on operands already loaded.
__device__ __forceinline__ void mma1688_3xtf32(Tf32x3& d, const Tf32Ops& o) {
  std::uint32_t ah[4], al[4], bh[2], bl[2];
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    tf32_split(o.a[e], ah[e], al[e]);
  }
#pragma unroll
  for (int e = 0; e < 2; ++e) {
    tf32_split(o.b[e], bh[e], bl[e]);
  }
#if GDNKIT_PROBE_INVERSE != 1
  mma1688_tf32(d.lohi, al, bh[0], bh[1]);
  mma1688_tf32(d.hilo, ah, bl[0], bl[1]);
#endif
  mma1688_tf32(d.hihi, ah, bh[0], bh[1]);
}

// The gate of row tid (tid < 64) or the beta of row tid - 64 (64 <= tid < 128) of the chunk at
// token c0 (nrows valid rows), output head h, in two halves: load_gate_beta_bits issues the load
// and returns the word as loaded (a 16-bit beta in the low half), gate_beta_value converts it. A
// caller that keeps the word until it needs the value keeps the load in flight: converting at once
// (a 16-bit beta's widening, a linear gate's log) makes the warp wait there for the load. Rows past
// the chunk's end get 0: a neutral gate (exp(0) = 1) and no update. Gates are taken to log space
// and floored (common/gate.h).
__device__ __forceinline__ std::uint32_t load_gate_beta_bits(const ChunkedParams& p, std::int64_t c0, int nrows, int h,
                                                             int tid) {
  if (tid < kChunk) {
    if (tid < nrows && p.has_gate)
      return __float_as_uint(p.g[(c0 + tid) * p.g_token + static_cast<std::int64_t>(h) * p.g_head]);
    return __float_as_uint(p.gate_linear ? 1.0f : 0.0f);  // log 1 = 0
  }
  const int i = tid - kChunk;
  if (i >= nrows) return 0u;  // 0 in every beta type
  if (!p.has_beta) return p.beta_dtype == kBetaBF16 ? 0x3f80u : p.beta_dtype == kBetaF16 ? 0x3c00u : 0x3f800000u;  // 1
  const std::int64_t idx = (c0 + i) * p.beta_token + static_cast<std::int64_t>(h) * p.beta_head;
  return p.beta_dtype == kBetaF32 ? static_cast<const std::uint32_t*>(p.beta)[idx]
                                  : static_cast<const unsigned short*>(p.beta)[idx];
}
__device__ __forceinline__ float gate_beta_value(const ChunkedParams& p, std::uint32_t bits, int tid) {
  if (tid < kChunk) {
    return detail::log_gate(__uint_as_float(bits), p.gate_linear);
  }
  switch (p.beta_dtype) {
    case kBetaBF16: return __uint_as_float(bits << 16);
    case kBetaF16: return __half2float(__ushort_as_half(static_cast<unsigned short>(bits)));
    default: return __uint_as_float(bits);
  }
}
__device__ __forceinline__ float load_gate_beta(const ChunkedParams& p, std::int64_t c0, int nrows, int h, int tid) {
  return gate_beta_value(p, load_gate_beta_bits(p, c0, nrows, h, tid), tid);
}

// G = inclusive cumsum of the chunk's 64 gates gs, in every lane of the calling warp:
// ga = G[lane], gb = G[lane + 32].
__device__ __forceinline__ void chunk_cumsum(const float* gs, int lane, float& ga, float& gb) {
  ga = gs[lane];
  gb = gs[lane + 32];
#pragma unroll
  for (int off = 1; off < 32; off *= 2) {
    const float ta = __shfl_up_sync(0xffffffffu, ga, off);
    const float tb = __shfl_up_sync(0xffffffffu, gb, off);
    if (lane >= off) {
      ga += ta;
      gb += tb;
    }
  }
  gb += __shfl_sync(0xffffffffu, ga, 31);
}

// One strip of the inverse's block rows (invert_unit_lower, step 2): columns [8 nt, 8 nt + 8) of
// Tu_IJ = -Tu_II R_J, R_J = sum_{J <= M < I} A_IM Tu_MJ, into Tl and emit_block (R through the
// warp's scratch Rw into B fragments).
template <int LDA, int LDR, class EmitBlock>
__device__ __forceinline__ void block_strip(const float* At, float* Tl, float* Rw, int I, int J, int nt, int g, int t,
                                            EmitBlock& emit_block) {
  auto tu_block = [&](int M) -> const float* {  // Tu_MJ, ld LDA
    return M == J ? At + (16 * M) * LDA + 16 * J : Tl + (16 * M - 16) * LDA + 16 * J;
  };
  const float* const arow = At + (16 * I) * LDA;
  const float* const tii = arow + 16 * I;
  Tf32x3 acc;
  acc.zero();
  for (int M = J; M < I; ++M) {
    Tf32Ops ops[2];
    ops[0].load(arow + 16 * M, LDA, tu_block(M) + 8 * nt, LDA, g, t);
    ops[1].load(arow + 16 * M + 8, LDA, tu_block(M) + 8 * nt + 8 * LDA, LDA, g, t);
    mma1688_3xtf32(acc, ops[0]);
    mma1688_3xtf32(acc, ops[1]);
  }
  float r[4];
  acc.sum(r);
  *reinterpret_cast<float2*>(Rw + g * LDR + 2 * t) = make_float2(r[0], r[1]);
  *reinterpret_cast<float2*>(Rw + (g + 8) * LDR + 2 * t) = make_float2(r[2], r[3]);
  __syncwarp();
  Tf32Ops tops[2];
  tops[0].load(tii, LDA, Rw, LDR, g, t);
  tops[1].load(tii + 8, LDA, Rw + 8 * LDR, LDR, g, t);
  acc.zero();
  mma1688_3xtf32(acc, tops[0]);
  mma1688_3xtf32(acc, tops[1]);
  float o[4];
  acc.sum(o);
#pragma unroll
  for (int e = 0; e < 4; ++e) o[e] = -o[e];
  __syncwarp();  // the scratch is read before the next strip overwrites it
  float* const out = Tl + (16 * I - 16) * LDA + 16 * J + 8 * nt + 2 * t;
  *reinterpret_cast<float2*>(out + g * LDA) = make_float2(o[0], o[1]);
  *reinterpret_cast<float2*>(out + (g + 8) * LDA) = make_float2(o[2], o[3]);
#if GDNKIT_PROBE_INVERSE != 6
  emit_block(I, J, nt, o);
#endif
}

// Tu = (I + A)^-1 for the strictly lower A of block rows [0, nb), in fp32 arithmetic, by four
// warps (warp w of the 128 threads). At (ld LDA) holds A; on return its diagonal blocks hold Tu's
// and Tl (ld LDA, row i at Tl + (i - 16) LDA) the blocks left of the diagonal in block rows 1..3.
// Rs: four 16 x LDR fp32 scratch tiles, one per warp. sync() separates the diagonal blocks from
// the block rows: a barrier of the four warps (after it the diagonal blocks of Tu are in At; the
// fused kernel's then writes Mt's). Step 1 reads only the warp's own diagonal block and sync()
// precedes every other read: the caller orders the writes of A before this call by a barrier, or
// by __syncwarp where warp w wrote block row w (the fused kernel). finish() is called by every warp
// once its block rows are done: the prep kernel's is a barrier when nb > 1.
// Each block of Tu left of the diagonal is also handed to the caller as it is formed, in registers:
// emit_block(I, J, nt, o) by every lane of a warp with o = the mma C fragment of columns
// [8 nt, 8 nt + 8) of block (I, J).
//   1. warp b inverts diagonal block b by forward substitution, lane j < 16 solving column j:
//      x_i = [i == j] - sum_{m < i} A_im x_m (zero above the diagonal);
//   2. block rows I = 1 .. nb - 1: Tu_IJ = -Tu_II R_J, R_J = sum_{J <= M < I} A_IM Tu_MJ, on
//      mma.sync with tf32 operands split as hi + lo (block_strip, mma1688_3xtf32; the A operands,
//      rows of At, by ldmatrix, whence At's 16-byte alignment). Warp w computes the 8
//      columns w % 2 of block J = 0 (w < 2) or of blocks J = 1 .. I - 1 (w >= 2), which balances
//      the M sums; R goes through the warp's scratch into B fragments. A block's sum reads only
//      diagonal blocks and blocks of its own columns, i.e. the warp's own earlier results, so the
//      warps run their block rows without waiting for each other (finish() ends the call).
// kDiagPairs: step 1 by warps 0 and 2 alone, two diagonal blocks each (lanes 0-15 block warp,
// lanes 16-31 block warp + 1), so that no lane idles; the caller then orders warp w + 1's writes of
// its block row before warp w's call (the fused kernel: a named barrier per pair of warps).
// kHalves: step 2 forms only Tu_10 (warps 0, 1) and Tu_32 (warps 2, 3), one strip per warp, i.e.
// the inverses of the two 32 x 32 diagonal blocks; the fused kernel's walk solves the rest by
// block substitution (WgmmaWalk's kBlockSolve), and A's bottom-left quarter is then not read.
template <int LDA, int LDR, bool kDiagPairs = false, bool kHalves = false, class Sync, class EmitBlock, class Finish>
__device__ __forceinline__ void invert_unit_lower(float* At, float* Tl, float* Rs, int nb, int warp, int lane,
                                                  Sync&& sync, EmitBlock&& emit_block, Finish&& finish) {
  static_assert(LDA % 4 == 0, "16-byte rows");
  const int g = lane / 4, t = lane % 4;
  if (GDNKIT_PROBE_INVERSE != 3 && (!kDiagPairs || warp % 2 == 0) && warp < nb) {
    const int b = kDiagPairs ? warp + lane / 16 : warp;  // the lane's diagonal block
    const int col = kDiagPairs ? lane % 16 : lane;       // and its column in it
    const bool solves = kDiagPairs ? b < nb : lane < 16;
    float* const Ab = At + (16 * b) * LDA + 16 * b;
    float x[16];
    if (solves) {
#pragma unroll
      for (int i = 0; i < 16; ++i) {
        // Row i's first i entries as 16-byte broadcast loads (the rows are 16-byte aligned).
        float s = 0.0f;
#pragma unroll
        for (int m4 = 0; m4 < i; m4 += 4) {
          const float4 a = *reinterpret_cast<const float4*>(Ab + i * LDA + m4);
          const float av[4] = {a.x, a.y, a.z, a.w};
#pragma unroll
          for (int m = m4; m < m4 + 4 && m < i; ++m) s += av[m - m4] * x[m];
        }
        x[i] = (i == col ? 1.0f : 0.0f) - s;
      }
    }
    __syncwarp();
    if (solves) {
#pragma unroll
      for (int i = 0; i < 16; ++i) Ab[i * LDA + col] = x[i];
    }
  }
  sync();

  float* const Rw = Rs + warp * 16 * LDR;
  const int nt = warp & 1;
  if constexpr (kHalves) {
    const int I = warp < 2 ? 1 : 3;
    if (I < nb) block_strip<LDA, LDR>(At, Tl, Rw, I, I - 1, nt, g, t, emit_block);
  } else {
    for (int I = 1; I < (GDNKIT_PROBE_INVERSE == 2 || GDNKIT_PROBE_INVERSE == 3 ? 1 : nb); ++I) {
      const int j_begin = warp < 2 ? 0 : 1, j_end = warp < 2 ? 1 : I;
      for (int J = j_begin; J < j_end; ++J) block_strip<LDA, LDR>(At, Tl, Rw, I, J, nt, g, t, emit_block);
      __syncwarp();  // the warp's Tl rows, before its next block row reads them
    }
  }
  finish();
}

// grid = (ceil(T / 64) + N, H); 128 threads. One (chunk slot, head) per CTA; empty slots exit.
template <typename T, int DK>
__global__ void __launch_bounds__(kPrepThreads, 6) gdn_prep_kernel(const ChunkedParams p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  __trap();
#else
  using L = PrepLayout<DK>;
  constexpr int C = kChunk;
  constexpr int LDK = L::LDK, LDA = L::LDA, LDR = L::LDR;

  const std::int64_t slot = blockIdx.x;
  const int h = blockIdx.y;
  // The largest n with first_slot(bos_n, n) <= slot (first_slot is strictly increasing in n for a
  // valid cu_seqlens; for an invalid one a slot may find no chunk, and a walk may then read a record
  // nobody wrote: wrong numbers, but inside the workspace).
  std::int64_t lo = 0, hi = p.num_seqs - 1;
  while (lo < hi) {
    const std::int64_t mid = (lo + hi + 1) / 2;
    if (first_slot(seq_bos(p, mid), mid) <= slot)
      lo = mid;
    else
      hi = mid - 1;
  }
  const std::int64_t n = lo;
  std::int64_t bos, eos;
  seq_range(p, n, bos, eos);
  const std::int64_t c0 = bos + (slot - first_slot(bos, n)) * C;
  if (c0 < bos || c0 >= eos) return;  // uniform CTA exit: no barrier has run yet
  const int nrows = static_cast<int>(eos - c0 < C ? eos - c0 : C);
  const int nb = (nrows + 15) / 16;

  extern __shared__ __align__(128) unsigned char smem[];
  T* const Ks = reinterpret_cast<T*>(smem + L::off_k);
  T* const Qs = reinterpret_cast<T*>(smem + L::off_at);      // until Q K^T is formed
  float* const At = reinterpret_cast<float*>(smem + L::off_at);  // A, then Tu's diagonal blocks
  float* const Tl = reinterpret_cast<float*>(smem + L::off_k);   // Tu rows [16, 64), left of the diagonal block
  float* const gs = reinterpret_cast<float*>(smem + L::off_g);
  float* const Gs = reinterpret_cast<float*>(smem + L::off_G);
  float* const bs = reinterpret_cast<float*>(smem + L::off_beta);

  const int tid = threadIdx.x;
  const int warp = tid / 32;
  const int lane = tid % 32;
  unsigned char* const rec = p.ws + (slot * p.num_heads + h) * kRecBytes;
  T* const Mg = reinterpret_cast<T*>(rec + kRecMtOff);
  T* const Mlg = reinterpret_cast<T*>(rec + kRecMtLoOff);
  T* const Pg = reinterpret_cast<T*>(rec + kRecPOff);
  float* const gam_g = reinterpret_cast<float*>(rec + kRecGamOff);
  float* const dec_g = reinterpret_cast<float*>(rec + kRecDecOff);

  const T* const qh = static_cast<const T*>(p.q) + static_cast<std::int64_t>(h / p.q_group) * p.q_head;
  const T* const kh = static_cast<const T*>(p.k) + static_cast<std::int64_t>(h / p.k_group) * p.k_head;
  if (nrows == C) {  // full chunk: straight-line copies with constant strides
    load_tile_full<kPrepThreads, T, DK, LDK>(Ks, kh + c0 * p.k_token, p.k_token, tid);
    load_tile_full<kPrepThreads, T, DK, LDK>(Qs, qh + c0 * p.q_token, p.q_token, tid);
  } else {
    load_rows_async_n<kPrepThreads, T, DK, LDK>(Ks, kh + c0 * p.k_token, p.k_token, nrows, nb * 16, tid);
    load_rows_async_n<kPrepThreads, T, DK, LDK>(Qs, qh + c0 * p.q_token, p.q_token, nrows, nb * 16, tid);
  }
  __pipeline_commit();
  (tid < C ? gs[tid] : bs[tid - C]) = load_gate_beta(p, c0, nrows, h, tid);
  __pipeline_wait_prior(0);
  __syncthreads();

  // G = inclusive cumsum of g, in every warp's registers (ga = G[lane], gb = G[lane + 32]); warp 0
  // also writes it to shared memory, and gam and dec to the record (G_last = G[63]: padded rows
  // repeat it).
  float ga, gb;
  chunk_cumsum(gs, lane, ga, gb);
  if (warp == 0) {
    Gs[lane] = ga;
    Gs[lane + 32] = gb;
    const float g_last = __shfl_sync(0xffffffffu, gb, 31);
    gam_g[lane] = fast_exp(ga);
    gam_g[lane + 32] = fast_exp(gb);
    dec_g[lane] = fast_exp(g_last - ga);
    dec_g[lane + 32] = fast_exp(g_last - gb);
  }

  // P: block row 3 - w by warp w (rows at or past nb are not written).
  switch (3 - warp) {
    case 0: p_block_row<T, DK, LDK, 0>(Pg, Qs, Ks, ga, gb, p.scale, lane); break;
    case 1: if (nb > 1) p_block_row<T, DK, LDK, 1>(Pg, Qs, Ks, ga, gb, p.scale, lane); break;
    case 2: if (nb > 2) p_block_row<T, DK, LDK, 2>(Pg, Qs, Ks, ga, gb, p.scale, lane); break;
    default: if (nb > 3) p_block_row<T, DK, LDK, 3>(Pg, Qs, Ks, ga, gb, p.scale, lane); break;
  }
  __syncthreads();  // Q is dead: A may overwrite it

  // A = diag(beta) K K^T: block row w by warp w.
  switch (warp) {
    case 0: a_block_row<T, DK, LDK, LDA, 0>(At, Ks, bs, lane); break;
    case 1: if (nb > 1) a_block_row<T, DK, LDK, LDA, 1>(At, Ks, bs, lane); break;
    case 2: if (nb > 2) a_block_row<T, DK, LDK, LDA, 2>(At, Ks, bs, lane); break;
    default: if (nb > 3) a_block_row<T, DK, LDK, LDA, 3>(At, Ks, bs, lane); break;
  }
  __syncthreads();  // A complete; K is dead: Tl and the scratch may overwrite it

  // Tu (fp32), in place of A's diagonal blocks and in Tl.
  invert_unit_lower<LDA, LDR>(
      At, Tl, reinterpret_cast<float*>(smem + L::off_r), nb, warp, lane, [] { __syncthreads(); },
      [](int, int, int, const float (&)[4]) {}, [&] {
        if (nb > 1) __syncthreads();
      });

  // Mt block rows [0, nb) as hi + lo (lower-block layout, zero above the diagonal and in the row
  // padding): hi = round(Mt), lo = round(Mt - hi). Thread (r, q) = (tid / 8, tid % 8) writes row
  // 16 b + r of block row b, column pairs (16 k + 2 q, +1): k < b left of the diagonal block (Tl),
  // k = b the diagonal block, k = b + 1 the 8 padding columns (q < 4).
  {
    const int r = tid / 8, q = tid % 8;
    for (int b = 0; b < nb; ++b) {  // rolled loops, uniform branches: unrolled, they spill
      const int i = 16 * b + r;
      const float gi = Gs[i];
      T* const hrow = Mg + lower_block_off(b) + r * lower_block_ld(b);
      T* const lrow = Mlg + lower_block_off(b) + r * lower_block_ld(b);
      for (int k = 0; k <= b + 1; ++k) {
        const int j = 16 * k + 2 * q;
        if (k == b + 1) {
          if (q < 4) {
            *reinterpret_cast<unsigned*>(hrow + j) = 0u;
            *reinterpret_cast<unsigned*>(lrow + j) = 0u;
          }
          continue;
        }
        const float2 tu = *reinterpret_cast<const float2*>(k == b ? At + i * LDA + j : Tl + (i - 16) * LDA + j);
        const float2 gj = *reinterpret_cast<const float2*>(Gs + j);
        const float2 bj = *reinterpret_cast<const float2*>(bs + j);
        float x0 = fast_exp(gi - gj.x) * tu.x * bj.x;
        float x1 = fast_exp(gi - gj.y) * tu.y * bj.y;
        if (k == b) {  // the diagonal block: zero above the diagonal (exp may overflow there)
          x0 = 2 * q <= r ? x0 : 0.0f;
          x1 = 2 * q + 1 <= r ? x1 : 0.0f;
        }
        const unsigned h = pack2<T>(x0, x1);
        const float2 hf = unpack2<T>(h);
        *reinterpret_cast<unsigned*>(hrow + j) = h;
        *reinterpret_cast<unsigned*>(lrow + j) = pack2<T>(x0 - hf.x, x1 - hf.y);
      }
    }
  }
#endif
}

}  // namespace gdnkit::cuda
