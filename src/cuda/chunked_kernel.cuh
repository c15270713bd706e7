// The portable fused chunked GDN prefill (GDN_MATH.md section 2, fused form), sm_80 and newer.
//
// One CTA (4 warps) walks one (sequence n, output head h, block of DVB value columns) through the
// sequence's chunks of C = 64 tokens, in order. Column c of the state depends only on column c of
// the state and of V, so the value columns split into independent CTAs; each CTA recomputes the
// chunk quantities that depend on K, Q, g and beta only (A, Tu, P), which is cheap next to the
// state products when DVB is a good fraction of dv.
//
// Per chunk with n <= 64 valid rows (rows n..63 are zero-filled: K, Q, V rows 0, g 0, beta 0):
//   G   = cumsum(g),  gam_i = exp(G_i)
//   KS  = K S,  QS = Q S                                  (S: fp32 state, bf16/f16 copy for the MMAs)
//   P   = scale * lower_incl(Q K^T) .* exp(G_i - G_j)
//   X   = V - diag(gam) KS
//   A   = strict_lower(diag(beta) K K^T),  Tu = (I + A)^-1          (fp32)
//   Mt  = exp(G_i - G_j) * Tu_ij * beta_j   (i >= j)
//   Vn  = Mt X
//   O   = scale * diag(gam) QS + P Vn                                (rows < n stored)
//   S'  = gam_last S + K^T diag(exp(G_last - G_i)) Vn
// Padded rows stay exactly zero through every product: their K/Q/V rows are 0 and beta 0, so their
// rows and columns of A, Mt and P are 0 (Tu is the identity there), so their Vn rows are 0.
//
// Products run on tensor cores through nvcuda::wmma (16x16x16, bf16/f16 operands, fp32
// accumulate). Everything that is not an MMA operand (state, gates, the inverse, O before the
// store) stays fp32. Shared memory regions are reused across the phases of a chunk; the layout
// struct below says which phase owns what, and every change of owner is behind a __syncthreads.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_pipeline_primitives.h>
#include <mma.h>

#include <cfloat>
#include <cstddef>
#include <cstdint>

#include "cuda/chunked.h"

namespace gdnkit::cuda {

namespace wm = nvcuda::wmma;

// ---- small helpers ------------------------------------------------------------------------------

template <typename T>
__device__ __forceinline__ float to_f32(T x);
template <>
__device__ __forceinline__ float to_f32<__nv_bfloat16>(__nv_bfloat16 x) {
  return __bfloat162float(x);
}
template <>
__device__ __forceinline__ float to_f32<__half>(__half x) {
  return __half2float(x);
}

template <typename T>
__device__ __forceinline__ T from_f32(float x);
template <>
__device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}
template <>
__device__ __forceinline__ __half from_f32<__half>(float x) {
  return __float2half_rn(x);
}

// Two floats as two 16-bit values packed in one 32-bit word (the first at the lower address).
template <typename T>
__device__ __forceinline__ unsigned pack2(float a, float b);
template <>
__device__ __forceinline__ unsigned pack2<__nv_bfloat16>(float a, float b) {
  return static_cast<unsigned>(__bfloat16_as_ushort(__float2bfloat16_rn(a))) |
         static_cast<unsigned>(__bfloat16_as_ushort(__float2bfloat16_rn(b))) << 16;
}
template <>
__device__ __forceinline__ unsigned pack2<__half>(float a, float b) {
  return static_cast<unsigned>(__half_as_ushort(__float2half_rn(a))) |
         static_cast<unsigned>(__half_as_ushort(__float2half_rn(b))) << 16;
}

template <typename T>
using FragA = wm::fragment<wm::matrix_a, 16, 16, 16, T, wm::row_major>;
template <typename T>
using FragAT = wm::fragment<wm::matrix_a, 16, 16, 16, T, wm::col_major>;  // transposed view
template <typename T>
using FragB = wm::fragment<wm::matrix_b, 16, 16, 16, T, wm::row_major>;
template <typename T>
using FragBT = wm::fragment<wm::matrix_b, 16, 16, 16, T, wm::col_major>;  // transposed view
using FragC = wm::fragment<wm::accumulator, 16, 16, 16, float>;

constexpr std::size_t align128(std::size_t x) { return (x + 127) / 128 * 128; }
constexpr std::size_t max_size(std::size_t a, std::size_t b) { return a > b ? a : b; }

// ---- shared memory layout -----------------------------------------------------------------------
//
// Leading dimensions are padded (+8 16-bit elements, +4 floats) so that the rows of a 16x16 tile
// fall into different banks; every tile start stays 32-byte aligned as wmma requires.
// Regions (owner by phase, see the kernel):
//   k   K [C][LDK]                                   whole chunk
//   qp  Q [C][LDK]  -> P [C][LDC]                   Q until QK^T/QS are done, then P
//   at  fp32 [C][LDA]: Q K^T -> A -> Tu,  then Vn16 [C][LDV] (16-bit)
//   mt  Mt [C][LDC] (16-bit)
//   sf  S fp32 [DK][LDF]                             whole walk
//   sb  S 16-bit copy [DK][LDV]                      refreshed at the end of each chunk
//   xf  fp32 [C][LDF]: K S -> inverse scratch R [16][48] -> Vn
//   of  fp32 [C][LDF]: O accumulator
//   vs  16-bit [C][LDV]: V -> X -> Vd = diag(exp(G_last - G)) Vn
//   G, gam, beta: fp32 [C] each
template <int DK, int DVB>
struct ChunkedLayout {
  static constexpr int C = kChunk;
  static constexpr int LDK = DK + 8;   // 16-bit rows of K and Q
  static constexpr int LDC = C + 8;    // 16-bit rows of P and Mt (64 wide)
  static constexpr int LDA = C + 4;    // fp32 rows of the 64x64 A / Tu
  static constexpr int LDV = DVB + 8;  // 16-bit rows DVB wide (V, X, Vn, Vd, S copy)
  static constexpr int LDF = DVB + 4;  // fp32 rows DVB wide (S, K S, Vn, O)
  static constexpr int LDR = 48;       // inverse scratch row (up to three 16-wide blocks)

  static constexpr std::size_t k_bytes = std::size_t(C) * LDK * 2;
  static constexpr std::size_t qp_bytes = max_size(std::size_t(C) * LDK * 2, std::size_t(C) * LDC * 2);
  static constexpr std::size_t at_bytes = max_size(std::size_t(C) * LDA * 4, std::size_t(C) * LDV * 2);
  static constexpr std::size_t mt_bytes = std::size_t(C) * LDC * 2;
  static constexpr std::size_t sf_bytes = std::size_t(DK) * LDF * 4;
  static constexpr std::size_t sb_bytes = std::size_t(DK) * LDV * 2;
  static constexpr std::size_t xf_bytes = max_size(std::size_t(C) * LDF * 4, std::size_t(16) * LDR * 4);
  static constexpr std::size_t of_bytes = std::size_t(C) * LDF * 4;
  static constexpr std::size_t vs_bytes = std::size_t(C) * LDV * 2;
  static constexpr std::size_t vec_bytes = std::size_t(C) * 4;

  static constexpr std::size_t off_k = 0;
  static constexpr std::size_t off_qp = off_k + align128(k_bytes);
  static constexpr std::size_t off_at = off_qp + align128(qp_bytes);
  static constexpr std::size_t off_mt = off_at + align128(at_bytes);
  static constexpr std::size_t off_sf = off_mt + align128(mt_bytes);
  static constexpr std::size_t off_sb = off_sf + align128(sf_bytes);
  static constexpr std::size_t off_xf = off_sb + align128(sb_bytes);
  static constexpr std::size_t off_of = off_xf + align128(xf_bytes);
  static constexpr std::size_t off_vs = off_of + align128(of_bytes);
  static constexpr std::size_t off_G = off_vs + align128(vs_bytes);
  static constexpr std::size_t off_gam = off_G + align128(vec_bytes);
  static constexpr std::size_t off_beta = off_gam + align128(vec_bytes);
  static constexpr std::size_t total = off_beta + align128(vec_bytes);

  static_assert(DK % 16 == 0 && DVB % 16 == 0, "tiles are 16x16");
  static_assert(LDK % 8 == 0 && LDC % 8 == 0 && LDV % 8 == 0, "wmma: 16-bit ld must be a multiple of 8");
  static_assert(LDA % 4 == 0 && LDF % 4 == 0, "wmma: fp32 ld must be a multiple of 4");
};

// ---- phase helpers ------------------------------------------------------------------------------

// D = X Y^T for the ten 16x16 tiles on or below the block diagonal of a 64x64 result (X, Y: 64 rows
// of DK, ld LDK; D fp32, ld LDA). Tiles above the block diagonal are not written.
template <typename T, int DK, int LDK, int LDA>
__device__ __forceinline__ void gram_lower_tiles(const T* X, const T* Y, float* D, int warp) {
  for (int t = warp; t < 10; t += 4) {
    int bi = 0;
    while ((bi + 1) * (bi + 2) / 2 <= t) ++bi;
    const int bj = t - bi * (bi + 1) / 2;
    FragC acc;
    wm::fill_fragment(acc, 0.0f);
#pragma unroll
    for (int kk = 0; kk < DK; kk += 16) {
      FragA<T> a;
      FragBT<T> b;  // (Y^T)[kk + r][bj*16 + c] = Y[bj*16 + c][kk + r]
      wm::load_matrix_sync(a, X + bi * 16 * LDK + kk, LDK);
      wm::load_matrix_sync(b, Y + bj * 16 * LDK + kk, LDK);
      wm::mma_sync(acc, a, b, acc);
    }
    wm::store_matrix_sync(D + bi * 16 * LDA + bj * 16, acc, LDA, wm::mem_row_major);
  }
}

// Copies rows [0, n) of a [rows x COLS] 16-bit global matrix (row stride `stride` elements) into
// shared memory (ld LD) with 16-byte cp.async; rows [n, 64) are zero-filled.
template <typename T, int COLS, int LD>
__device__ __forceinline__ void load_rows_async(T* dst, const T* src, std::int64_t stride, int n, int tid) {
  constexpr int VEC = 8;  // 16-bit elements per 16 bytes
  constexpr int PER_ROW = COLS / VEC;
  for (int idx = tid; idx < kChunk * PER_ROW; idx += kThreads) {
    const int row = idx / PER_ROW;
    const int col = (idx % PER_ROW) * VEC;
    T* d = dst + row * LD + col;
    if (row < n)
      __pipeline_memcpy_async(d, src + row * stride + col, 16);
    else
      *reinterpret_cast<uint4*>(d) = make_uint4(0u, 0u, 0u, 0u);
  }
}

__device__ __forceinline__ float load_beta(const ChunkedParams& p, std::int64_t idx) {
  switch (p.beta_dtype) {
    case kBetaBF16: return __bfloat162float(static_cast<const __nv_bfloat16*>(p.beta)[idx]);
    case kBetaF16: return __half2float(static_cast<const __half*>(p.beta)[idx]);
    default: return static_cast<const float*>(p.beta)[idx];
  }
}

// ---- the kernel ---------------------------------------------------------------------------------

// grid = (dv / DVB, H, min(N, 65535)); 128 threads. blockIdx.z strides over sequences.
template <typename T, int DK, int DVB>
__global__ void __launch_bounds__(kThreads, 2) gdn_chunked_kernel(const ChunkedParams p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  // bf16 wmma needs sm_80. A build that also targets older architectures still compiles; the
  // planner refuses such an image (ptxVersion < 80), and this trap guards against misuse.
  __trap();
#else
  using L = ChunkedLayout<DK, DVB>;
  constexpr int C = kChunk;
  constexpr int LDK = L::LDK, LDC = L::LDC, LDA = L::LDA, LDV = L::LDV, LDF = L::LDF, LDR = L::LDR;
  constexpr int NCT = DVB / 16;  // 16-wide column tiles of the value block

  extern __shared__ __align__(128) unsigned char smem[];
  T* const Ks = reinterpret_cast<T*>(smem + L::off_k);
  T* const Qs = reinterpret_cast<T*>(smem + L::off_qp);
  T* const Ps = reinterpret_cast<T*>(smem + L::off_qp);  // after Q is consumed
  float* const At = reinterpret_cast<float*>(smem + L::off_at);
  T* const Vn16 = reinterpret_cast<T*>(smem + L::off_at);  // after Tu is consumed
  T* const Mt = reinterpret_cast<T*>(smem + L::off_mt);
  float* const Sf = reinterpret_cast<float*>(smem + L::off_sf);
  T* const Sb = reinterpret_cast<T*>(smem + L::off_sb);
  float* const Xf = reinterpret_cast<float*>(smem + L::off_xf);
  float* const Rs = reinterpret_cast<float*>(smem + L::off_xf);  // inverse scratch
  float* const Of = reinterpret_cast<float*>(smem + L::off_of);
  T* const Vs = reinterpret_cast<T*>(smem + L::off_vs);
  float* const Gs = reinterpret_cast<float*>(smem + L::off_G);
  float* const gam = reinterpret_cast<float*>(smem + L::off_gam);
  float* const bs = reinterpret_cast<float*>(smem + L::off_beta);

  const int tid = threadIdx.x;
  const int warp = tid / 32;
  const int lane = tid % 32;
  const int h = blockIdx.y;
  const int v0 = blockIdx.x * DVB;  // first value column of this CTA

  const T* const qh = static_cast<const T*>(p.q) + static_cast<std::int64_t>(h / p.q_group) * p.q_head;
  const T* const kh = static_cast<const T*>(p.k) + static_cast<std::int64_t>(h / p.k_group) * p.k_head;
  const T* const vh = static_cast<const T*>(p.v) + static_cast<std::int64_t>(h / p.v_group) * p.v_head + v0;
  T* const oh = static_cast<T*>(p.o) + static_cast<std::int64_t>(h) * p.o_head + v0;

  for (std::int64_t n = blockIdx.z; n < p.num_seqs; n += gridDim.z) {
    std::int64_t bos, eos;
    if (p.has_cu_seqlens) {
      if (p.cu_seqlens_i64) {
        bos = static_cast<const std::int64_t*>(p.cu_seqlens)[n];
        eos = static_cast<const std::int64_t*>(p.cu_seqlens)[n + 1];
      } else {
        bos = static_cast<const std::int32_t*>(p.cu_seqlens)[n];
        eos = static_cast<const std::int32_t*>(p.cu_seqlens)[n + 1];
      }
    } else {
      bos = n * p.uniform_len;
      eos = bos + p.uniform_len;
    }

    // State block (this CTA's DVB columns) in fp32 plus its 16-bit copy. The whole block is read
    // here, before anything is written, so final_state may alias initial_state.
    const std::int64_t state_base = (n * p.num_heads + h) * static_cast<std::int64_t>(DK) * p.dv;
    for (int e = tid; e < DK * DVB; e += kThreads) {
      int kr, c;
      if (p.state_vk) {  // [dv][dk]: consecutive threads read consecutive k
        c = e / DK;
        kr = e % DK;
      } else {  // [dk][dv]: consecutive threads read consecutive v
        kr = e / DVB;
        c = e % DVB;
      }
      float s = 0.0f;
      if (p.has_initial_state)
        s = p.state_vk ? p.initial_state[state_base + static_cast<std::int64_t>(v0 + c) * DK + kr]
                       : p.initial_state[state_base + static_cast<std::int64_t>(kr) * p.dv + v0 + c];
      Sf[kr * LDF + c] = s;
      Sb[kr * LDV + c] = from_f32<T>(s);
    }
    __syncthreads();

    for (std::int64_t c0 = bos; c0 < eos; c0 += C) {
      const int nrows = static_cast<int>(eos - c0 < C ? eos - c0 : C);

      // Phase 0: load K, Q, V (block columns) with cp.async; g and beta with scalar loads.
      load_rows_async<T, DK, LDK>(Ks, kh + c0 * p.k_token, p.k_token, nrows, tid);
      load_rows_async<T, DK, LDK>(Qs, qh + c0 * p.q_token, p.q_token, nrows, tid);
      load_rows_async<T, DVB, LDV>(Vs, vh + c0 * p.v_token, p.v_token, nrows, tid);
      __pipeline_commit();
      if (tid < C) {
        float g = 0.0f;  // padded rows: no decay contribution
        if (tid < nrows && p.has_gate) {
          g = p.g[(c0 + tid) * p.g_token + static_cast<std::int64_t>(h) * p.g_head];
          if (p.gate_linear) g = logf(fmaxf(g, FLT_MIN));
        }
        Gs[tid] = g;
      } else {
        const int i = tid - C;
        float b = 0.0f;  // padded rows: beta 0 keeps their Vn rows at exactly 0
        if (i < nrows)
          b = p.has_beta ? load_beta(p, (c0 + i) * p.beta_token + static_cast<std::int64_t>(h) * p.beta_head)
                         : 1.0f;
        bs[i] = b;
      }
      __pipeline_wait_prior(0);
      __syncthreads();

      // Phase 1: warp 0 turns g into G = inclusive cumsum (in place) and gam = exp(G); meanwhile
      // all warps compute Q K^T (lower tiles, into At) and K S, Q S (row block `warp`).
      if (warp == 0) {
        float a = Gs[lane], b = Gs[lane + 32];
#pragma unroll
        for (int off = 1; off < 32; off *= 2) {
          const float ta = __shfl_up_sync(0xffffffffu, a, off);
          const float tb = __shfl_up_sync(0xffffffffu, b, off);
          if (lane >= off) {
            a += ta;
            b += tb;
          }
        }
        b += __shfl_sync(0xffffffffu, a, 31);
        Gs[lane] = a;
        Gs[lane + 32] = b;
        gam[lane] = expf(a);
        gam[lane + 32] = expf(b);
      }
      gram_lower_tiles<T, DK, LDK, LDA>(Qs, Ks, At, warp);
      {
        FragC ks[NCT], qs[NCT];
#pragma unroll
        for (int c = 0; c < NCT; ++c) {
          wm::fill_fragment(ks[c], 0.0f);
          wm::fill_fragment(qs[c], 0.0f);
        }
#pragma unroll 2  // full unrolling hoists every fragment load: ~255 registers instead of ~190
        for (int kk = 0; kk < DK; kk += 16) {
          FragA<T> ak, aq;
          wm::load_matrix_sync(ak, Ks + warp * 16 * LDK + kk, LDK);
          wm::load_matrix_sync(aq, Qs + warp * 16 * LDK + kk, LDK);
#pragma unroll
          for (int c = 0; c < NCT; ++c) {
            FragB<T> b;
            wm::load_matrix_sync(b, Sb + kk * LDV + c * 16, LDV);
            wm::mma_sync(ks[c], ak, b, ks[c]);
            wm::mma_sync(qs[c], aq, b, qs[c]);
          }
        }
#pragma unroll
        for (int c = 0; c < NCT; ++c) {
          wm::store_matrix_sync(Xf + warp * 16 * LDF + c * 16, ks[c], LDF, wm::mem_row_major);
          wm::store_matrix_sync(Of + warp * 16 * LDF + c * 16, qs[c], LDF, wm::mem_row_major);
        }
      }
      __syncthreads();

      // Phase 2 (elementwise, fp32): P into the Q region (Q is no longer needed),
      // X = V - gam_i (K S)_i in place of V, O = scale * gam_i (Q S)_i.
      for (int e = tid; e < C * C; e += kThreads) {
        const int i = e / C, j = e % C;
        // Select, never multiply by a mask: the upper tiles of At hold stale bytes.
        const float x = j <= i ? p.scale * At[i * LDA + j] * expf(Gs[i] - Gs[j]) : 0.0f;
        Ps[i * LDC + j] = from_f32<T>(x);
      }
      for (int e = tid; e < C * DVB; e += kThreads) {
        const int i = e / DVB, c = e % DVB;
        const float x = to_f32(Vs[i * LDV + c]) - gam[i] * Xf[i * LDF + c];
        Vs[i * LDV + c] = from_f32<T>(x);
        Of[i * LDF + c] *= p.scale * gam[i];
      }
      __syncthreads();

      // Phase 3: K K^T (lower tiles) into At (its Q K^T was consumed in phase 2).
      gram_lower_tiles<T, DK, LDK, LDA>(Ks, Ks, At, warp);
      __syncthreads();

      // Phase 4: A = strict_lower(diag(beta) K K^T); everything on or above the diagonal is 0.
      for (int e = tid; e < C * C; e += kThreads) {
        const int i = e / C, j = e % C;
        At[i * LDA + j] = i > j ? bs[i] * At[i * LDA + j] : 0.0f;
      }
      __syncthreads();

      // Phase 5: Tu = (I + A)^-1, diagonal 16x16 blocks. Thread (b, j) solves column j of block b
      // by forward substitution: x_i = [i == j] - sum_{m < i} A_im x_m (x_i = 0 for i < j follows).
      // All reads finish before the in-place writes.
      {
        float x[16];
        const int b = tid / 16, j = tid % 16;
        if (tid < C) {
          const float* Ab = At + (b * 16) * LDA + b * 16;
#pragma unroll
          for (int i = 0; i < 16; ++i) {
            float s = i == j ? 1.0f : 0.0f;
#pragma unroll
            for (int m = 0; m < i; ++m) s -= Ab[i * LDA + m] * x[m];
            x[i] = s;
          }
        }
        __syncthreads();
        if (tid < C) {
          float* Tb = At + (b * 16) * LDA + b * 16;
#pragma unroll
          for (int i = 0; i < 16; ++i) Tb[i * LDA + j] = x[i];
        }
        __syncthreads();
      }

      // Phase 6: off-diagonal blocks, block row by block row:
      //   R_J = sum_{J <= M < I} A_IM Tu_MJ,   Tu_IJ = -Tu_II R_J   (J < I).
      // Row I reads only rows < I of Tu and row I of A, so Tu_IJ can overwrite A_IJ in place.
      for (int I = 1; I < 4; ++I) {
        for (int e = tid; e < I * 256; e += kThreads) {
          const int J = e / 256, r = (e / 16) % 16, c = e % 16;
          const float* arow = At + (I * 16 + r) * LDA;
          const float* tcol = At + J * 16 + c;
          float s = 0.0f;
          for (int m = J * 16; m < I * 16; ++m) s += arow[m] * tcol[m * LDA];
          Rs[r * LDR + J * 16 + c] = s;
        }
        __syncthreads();
        for (int e = tid; e < I * 256; e += kThreads) {
          const int J = e / 256, r = (e / 16) % 16, c = e % 16;
          const float* tii = At + (I * 16 + r) * LDA + I * 16;  // row r of Tu_II (lower, unit diagonal)
          float s = 0.0f;
          for (int m = 0; m <= r; ++m) s += tii[m] * Rs[m * LDR + J * 16 + c];
          At[(I * 16 + r) * LDA + J * 16 + c] = -s;
        }
        __syncthreads();
      }

      // Phase 7: Mt_ij = exp(G_i - G_j) Tu_ij beta_j for i >= j, else 0 (16-bit operand).
      for (int e = tid; e < C * C; e += kThreads) {
        const int i = e / C, j = e % C;
        const float x = i >= j ? expf(Gs[i] - Gs[j]) * At[i * LDA + j] * bs[j] : 0.0f;
        Mt[i * LDC + j] = from_f32<T>(x);
      }
      __syncthreads();

      // Phase 8: Vn = Mt X (row block `warp`; Mt is lower triangular, so only k-blocks <= warp).
      {
        FragC acc[NCT];
#pragma unroll
        for (int c = 0; c < NCT; ++c) wm::fill_fragment(acc[c], 0.0f);
        for (int kb = 0; kb <= warp; ++kb) {
          FragA<T> a;
          wm::load_matrix_sync(a, Mt + warp * 16 * LDC + kb * 16, LDC);
#pragma unroll
          for (int c = 0; c < NCT; ++c) {
            FragB<T> b;
            wm::load_matrix_sync(b, Vs + kb * 16 * LDV + c * 16, LDV);
            wm::mma_sync(acc[c], a, b, acc[c]);
          }
        }
#pragma unroll
        for (int c = 0; c < NCT; ++c)
          wm::store_matrix_sync(Xf + warp * 16 * LDF + c * 16, acc[c], LDF, wm::mem_row_major);
      }
      __syncthreads();

      // Phase 9: 16-bit operands Vn (for O) and Vd = exp(G_last - G_i) Vn_i (for the state, over X).
      const float G_last = Gs[nrows - 1];
      for (int e = tid; e < C * DVB; e += kThreads) {
        const int i = e / DVB, c = e % DVB;
        const float vn = Xf[i * LDF + c];
        Vn16[i * LDV + c] = from_f32<T>(vn);
        Vs[i * LDV + c] = from_f32<T>(expf(G_last - Gs[i]) * vn);
      }
      __syncthreads();

      // Phase 10: O += P Vn (row block `warp`, k-blocks <= warp);
      //           S = gam_last S + K^T Vd (warp owns state row blocks warp, warp + 4, ...).
      {
        FragC acc[NCT];
#pragma unroll
        for (int c = 0; c < NCT; ++c)
          wm::load_matrix_sync(acc[c], Of + warp * 16 * LDF + c * 16, LDF, wm::mem_row_major);
        for (int kb = 0; kb <= warp; ++kb) {
          FragA<T> a;
          wm::load_matrix_sync(a, Ps + warp * 16 * LDC + kb * 16, LDC);
#pragma unroll
          for (int c = 0; c < NCT; ++c) {
            FragB<T> b;
            wm::load_matrix_sync(b, Vn16 + kb * 16 * LDV + c * 16, LDV);
            wm::mma_sync(acc[c], a, b, acc[c]);
          }
        }
#pragma unroll
        for (int c = 0; c < NCT; ++c)
          wm::store_matrix_sync(Of + warp * 16 * LDF + c * 16, acc[c], LDF, wm::mem_row_major);
      }
      {
        const float gam_last = expf(G_last);
#pragma unroll
        for (int rb = warp; rb < DK / 16; rb += 4) {
          FragC acc[NCT];
#pragma unroll
          for (int c = 0; c < NCT; ++c) {
            wm::load_matrix_sync(acc[c], Sf + rb * 16 * LDF + c * 16, LDF, wm::mem_row_major);
#pragma unroll
            for (int t = 0; t < acc[c].num_elements; ++t) acc[c].x[t] *= gam_last;
          }
#pragma unroll
          for (int kb = 0; kb < C / 16; ++kb) {
            FragAT<T> a;  // (K^T)[rb*16 + r][kb*16 + t] = K[kb*16 + t][rb*16 + r]
            wm::load_matrix_sync(a, Ks + kb * 16 * LDK + rb * 16, LDK);
#pragma unroll
            for (int c = 0; c < NCT; ++c) {
              FragB<T> b;
              wm::load_matrix_sync(b, Vs + kb * 16 * LDV + c * 16, LDV);
              wm::mma_sync(acc[c], a, b, acc[c]);
            }
          }
#pragma unroll
          for (int c = 0; c < NCT; ++c)
            wm::store_matrix_sync(Sf + rb * 16 * LDF + c * 16, acc[c], LDF, wm::mem_row_major);
        }
      }
      __syncthreads();

      // Phase 11: store the valid O rows (16-byte stores) and refresh the 16-bit state copy.
      {
        constexpr int VEC = 8;
        constexpr int PER_ROW = DVB / VEC;
        for (int idx = tid; idx < nrows * PER_ROW; idx += kThreads) {
          const int row = idx / PER_ROW;
          const int col = (idx % PER_ROW) * VEC;
          const float* f = Of + row * LDF + col;
          const uint4 out = make_uint4(pack2<T>(f[0], f[1]), pack2<T>(f[2], f[3]), pack2<T>(f[4], f[5]),
                                       pack2<T>(f[6], f[7]));
          *reinterpret_cast<uint4*>(oh + (c0 + row) * p.o_token + col) = out;
        }
        for (int e = tid; e < DK * DVB; e += kThreads) {
          const int kr = e / DVB, c = e % DVB;
          Sb[kr * LDV + c] = from_f32<T>(Sf[kr * LDF + c]);
        }
      }
      __syncthreads();
    }

    // Final state: this CTA's columns only, in the problem's layout.
    if (p.want_final_state) {
      for (int e = tid; e < DK * DVB; e += kThreads) {
        if (p.state_vk) {
          const int c = e / DK, kr = e % DK;
          p.final_state[state_base + static_cast<std::int64_t>(v0 + c) * DK + kr] = Sf[kr * LDF + c];
        } else {
          const int kr = e / DVB, c = e % DVB;
          p.final_state[state_base + static_cast<std::int64_t>(kr) * p.dv + v0 + c] = Sf[kr * LDF + c];
        }
      }
    }
    __syncthreads();  // the next sequence overwrites Sf
  }
#endif
}

}  // namespace gdnkit::cuda
