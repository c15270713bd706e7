// The prep kernel of the CUDA path (GDN_MATH.md section 2, fused form): everything about a chunk
// that depends only on K, Q, g and beta, computed once per (chunk, head) and fully in parallel.
//
// For chunk j of sequence n and output head h it writes one workspace record (layout in chunked.h):
//   G  = cumsum(g) within the chunk (fp32),
//   P  = scale * lower_incl(Q K^T) .* exp(G_i - G_j)              (qkv dtype),
//   Mt = exp(G_i - G_j) Tu_ij beta_j, Tu = (I + strict_lower(diag(beta) K K^T))^-1,
//        stored as hi + lo: hi = round(Mt), lo = round(Mt - hi)  (two qkv-dtype matrices).
// Gram products run on WMMA (16-bit operands, fp32 accumulators); the inverse is fp32 (forward
// substitution on the diagonal blocks, then block rows). Carrying Mt as hi + lo makes it
// effectively exact (relative error ~2^-17 instead of 2^-9 in bf16): measured in emulation, its
// rounding was one of the two dominant errors of the final state (docs/perf-notes.md).
// Only the 16-row blocks that hold valid rows are computed and written (nb = ceil(nrows / 16)).
#pragma once

#include <cfloat>

#include "cuda/chunk_io.cuh"
#include "cuda/wmma_common.cuh"

namespace gdnkit::cuda {

// ---- prep ---------------------------------------------------------------------------------------

// Shared memory, 35 KB at dk = 128 (six CTAs per SM on an H100/H200): Q is staged where At later
// lives (both 17,408 bytes; Q K^T is held in registers until every warp is done reading Q), and
// the inverse's scratch R reuses K's space once K K^T is formed.
template <int DK>
struct PrepLayout {
  static constexpr int C = kChunk;
  static constexpr int LDK = DK + 8;
  static constexpr int LDA = C + 4;
  static constexpr int LDR = 48;
  static constexpr std::size_t k_bytes = std::size_t(C) * LDK * 2;
  static constexpr std::size_t at_bytes = std::size_t(C) * LDA * 4;
  static constexpr std::size_t r_bytes = std::size_t(16) * LDR * 4;
  static constexpr std::size_t vec_bytes = std::size_t(C) * 4;
  static constexpr std::size_t off_k = 0;  // K, then R
  static constexpr std::size_t off_at = off_k + align128(k_bytes > r_bytes ? k_bytes : r_bytes);  // Q, then At
  static constexpr std::size_t off_G = off_at + align128(at_bytes > k_bytes ? at_bytes : k_bytes);
  static constexpr std::size_t off_beta = off_G + align128(vec_bytes);
  static constexpr std::size_t total = off_beta + align128(vec_bytes);
};

// D = X Y^T for the lower block tiles (bi >= bj) with bi < nb (X, Y: ld LDK; D fp32, ld LDA). All
// warps' products are formed before any is stored (one CTA barrier between), so D may overlap X
// or Y. At most 10 tiles over 4 warps: up to 3 per warp.
template <typename T, int DK, int LDK, int LDA>
__device__ __forceinline__ void gram_lower_tiles_nb(const T* X, const T* Y, float* D, int warp, int nb) {
  const int tiles = nb * (nb + 1) / 2;
  FragC acc[3];
  int at[3];
#pragma unroll
  for (int k = 0; k < 3; ++k) {
    const int t = warp + 4 * k;
    at[k] = -1;
    if (t < tiles) {
      int bi = 0;
      while ((bi + 1) * (bi + 2) / 2 <= t) ++bi;
      const int bj = t - bi * (bi + 1) / 2;
      at[k] = bi * 16 * LDA + bj * 16;
      wm::fill_fragment(acc[k], 0.0f);
#pragma unroll
      for (int kk = 0; kk < DK; kk += 16) {
        FragA<T> a;
        FragBT<T> b;
        wm::load_matrix_sync(a, X + bi * 16 * LDK + kk, LDK);
        wm::load_matrix_sync(b, Y + bj * 16 * LDK + kk, LDK);
        wm::mma_sync(acc[k], a, b, acc[k]);
      }
    }
  }
  __syncthreads();
#pragma unroll
  for (int k = 0; k < 3; ++k)
    if (at[k] >= 0) wm::store_matrix_sync(D + at[k], acc[k], LDA, wm::mem_row_major);
}

// Calls f(b, i, j) for every column pair (j, j + 1) of block rows [0, nb) of a lower-block-layout
// matrix (chunked.h), row padding included: 16 rows x 8 pairs per pass of the 128 threads.
template <typename F>
__device__ __forceinline__ void for_lower_pairs(int nb, int tid, F&& f) {
  const int r = tid / 8, jp0 = tid % 8;
  for (int b = 0; b < nb; ++b) {
    const int pairs = lower_block_ld(b) / 2;
    for (int jp = jp0; jp < pairs; jp += 8) f(b, 16 * b + r, 2 * jp);
  }
}

// grid = (ceil(T / 64) + N, H); 128 threads. One (chunk slot, head) per CTA; empty slots exit.
template <typename T, int DK>
__global__ void __launch_bounds__(kPrepThreads) gdn_prep_kernel(const ChunkedParams p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  __trap();
#else
  using L = PrepLayout<DK>;
  constexpr int C = kChunk;
  constexpr int LDK = L::LDK, LDA = L::LDA, LDR = L::LDR;

  const std::int64_t slot = blockIdx.x;
  const int h = blockIdx.y;
  // The largest n with first_slot(bos_n, n) <= slot (first_slot is strictly increasing in n).
  std::int64_t lo = 0, hi = p.num_seqs - 1;
  while (lo < hi) {
    const std::int64_t mid = (lo + hi + 1) / 2;
    if (first_slot(seq_begin(p, mid), mid) <= slot)
      lo = mid;
    else
      hi = mid - 1;
  }
  const std::int64_t n = lo;
  const std::int64_t bos = seq_begin(p, n), eos = seq_begin(p, n + 1);
  const std::int64_t c0 = bos + (slot - first_slot(bos, n)) * C;
  if (c0 >= eos) return;  // uniform CTA exit: no barrier has run yet
  const int nrows = static_cast<int>(eos - c0 < C ? eos - c0 : C);
  const int nb = (nrows + 15) / 16;

  extern __shared__ __align__(128) unsigned char smem[];
  T* const Ks = reinterpret_cast<T*>(smem + L::off_k);
  T* const Qs = reinterpret_cast<T*>(smem + L::off_at);      // until Q K^T is formed
  float* const At = reinterpret_cast<float*>(smem + L::off_at);
  float* const Rs = reinterpret_cast<float*>(smem + L::off_k);  // once K K^T is formed
  float* const Gs = reinterpret_cast<float*>(smem + L::off_G);
  float* const bs = reinterpret_cast<float*>(smem + L::off_beta);

  const int tid = threadIdx.x;
  const int warp = tid / 32;
  const int lane = tid % 32;
  unsigned char* const rec = p.ws + (slot * p.num_heads + h) * kRecBytes;
  T* const Mg = reinterpret_cast<T*>(rec + kRecMtOff);
  T* const Mlg = reinterpret_cast<T*>(rec + kRecMtLoOff);
  T* const Pg = reinterpret_cast<T*>(rec + kRecPOff);
  float* const Gg = reinterpret_cast<float*>(rec + kRecGOff);

  const T* const qh = static_cast<const T*>(p.q) + static_cast<std::int64_t>(h / p.q_group) * p.q_head;
  const T* const kh = static_cast<const T*>(p.k) + static_cast<std::int64_t>(h / p.k_group) * p.k_head;
  load_rows_async_n<kPrepThreads, T, DK, LDK>(Ks, kh + c0 * p.k_token, p.k_token, nrows, nb * 16, tid);
  load_rows_async_n<kPrepThreads, T, DK, LDK>(Qs, qh + c0 * p.q_token, p.q_token, nrows, nb * 16, tid);
  __pipeline_commit();
  if (tid < C) {
    float g = 0.0f;
    if (tid < nrows && p.has_gate) {
      g = p.g[(c0 + tid) * p.g_token + static_cast<std::int64_t>(h) * p.g_head];
      if (p.gate_linear) g = logf(fmaxf(g, FLT_MIN));
    }
    Gs[tid] = g;
  } else {
    const int i = tid - C;
    float b = 0.0f;
    if (i < nrows)
      b = p.has_beta ? load_beta(p, (c0 + i) * p.beta_token + static_cast<std::int64_t>(h) * p.beta_head) : 1.0f;
    bs[i] = b;
  }
  __pipeline_wait_prior(0);
  __syncthreads();

  // G = inclusive cumsum (warp 0), written to the record too; Q K^T lower tiles into At.
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
    Gg[lane] = a;
    Gg[lane + 32] = b;
  }
  gram_lower_tiles_nb<T, DK, LDK, LDA>(Qs, Ks, At, warp, nb);
  __syncthreads();

  // P block rows [0, nb) (lower-block layout, zero above the diagonal and in the row padding, so
  // that the walk never copies uninitialised memory).
  for_lower_pairs(nb, tid, [&](int b, int i, int j) {
    float x0 = 0.0f, x1 = 0.0f;
    if (j <= i) {
      const float gi = Gs[i];
      x0 = p.scale * At[i * LDA + j] * __expf(gi - Gs[j]);
      if (j + 1 <= i) x1 = p.scale * At[i * LDA + j + 1] * __expf(gi - Gs[j + 1]);
    }
    *reinterpret_cast<unsigned*>(Pg + lower_block_off(b) + (i % 16) * lower_block_ld(b) + j) = pack2<T>(x0, x1);
  });
  __syncthreads();

  // At = K K^T (lower block tiles). A = strict_lower(diag(beta) K K^T) is never formed: the
  // inverse below reads only entries strictly below the diagonal and applies beta_i to row i.
  gram_lower_tiles_nb<T, DK, LDK, LDA>(Ks, Ks, At, warp, nb);
  __syncthreads();

  // Tu = (I + A)^-1: diagonal blocks by forward substitution,
  //   x_i = [i == j] - beta_i sum_{m < i} (K K^T)_im x_m.
  {
    float x[16];
    const int b = tid / 16, j = tid % 16;
    if (b < nb) {
      const float* Ab = At + (b * 16) * LDA + b * 16;
#pragma unroll
      for (int i = 0; i < 16; ++i) {
        float s = 0.0f;
#pragma unroll
        for (int m = 0; m < i; ++m) s += Ab[i * LDA + m] * x[m];
        x[i] = (i == j ? 1.0f : 0.0f) - bs[b * 16 + i] * s;
      }
    }
    __syncthreads();
    if (b < nb) {
      float* Tb = At + (b * 16) * LDA + b * 16;
#pragma unroll
      for (int i = 0; i < 16; ++i) Tb[i * LDA + j] = x[i];
    }
    __syncthreads();
  }
  // Off-diagonal blocks, block row by block row:
  //   R_J = sum_{J <= M < I} A_IM Tu_MJ,   Tu_IJ = -Tu_II R_J   (J < I),
  // with A_IM = diag(beta_I) (K K^T)_IM: beta applied to R's rows.
  // Row I reads only rows < I of Tu and row I of A, so Tu_IJ can overwrite A_IJ in place. Each
  // thread computes four consecutive columns (float4 reads of Tu and R rows).
  for (int I = 1; I < nb; ++I) {
    for (int e = tid; e < I * 64; e += kPrepThreads) {
      const int J = e / 64, r = (e / 4) % 16, c = 4 * (e % 4);
      const float* arow = At + (I * 16 + r) * LDA;
      float4 s = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      for (int M = J; M < I; ++M) {
#pragma unroll
        for (int mm = 0; mm < 16; mm += 4) {
          const float4 a = *reinterpret_cast<const float4*>(arow + M * 16 + mm);
          const float av[4] = {a.x, a.y, a.z, a.w};
#pragma unroll
          for (int u = 0; u < 4; ++u) {
            const float4 t = *reinterpret_cast<const float4*>(At + (M * 16 + mm + u) * LDA + J * 16 + c);
            s.x += av[u] * t.x;
            s.y += av[u] * t.y;
            s.z += av[u] * t.z;
            s.w += av[u] * t.w;
          }
        }
      }
      const float br = bs[I * 16 + r];
      *reinterpret_cast<float4*>(Rs + r * LDR + J * 16 + c) = make_float4(br * s.x, br * s.y, br * s.z, br * s.w);
    }
    __syncthreads();
    for (int e = tid; e < I * 64; e += kPrepThreads) {
      const int J = e / 64, r = (e / 4) % 16, c = 4 * (e % 4);
      const float* tii = At + (I * 16 + r) * LDA + I * 16;  // row r of Tu_II (lower, unit diagonal)
      float4 s = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      for (int m = 0; m <= r; ++m) {
        const float a = tii[m];
        const float4 t = *reinterpret_cast<const float4*>(Rs + m * LDR + J * 16 + c);
        s.x += a * t.x;
        s.y += a * t.y;
        s.z += a * t.z;
        s.w += a * t.w;
      }
      *reinterpret_cast<float4*>(At + (I * 16 + r) * LDA + J * 16 + c) = make_float4(-s.x, -s.y, -s.z, -s.w);
    }
    __syncthreads();
  }

  // Mt block rows [0, nb) as hi + lo (lower-block layout, zero above the diagonal and in the row
  // padding): hi = round(Mt), lo = round(Mt - hi).
  for_lower_pairs(nb, tid, [&](int b, int i, int j) {
    float x0 = 0.0f, x1 = 0.0f;
    if (j <= i) {
      const float gi = Gs[i];
      x0 = __expf(gi - Gs[j]) * At[i * LDA + j] * bs[j];
      if (j + 1 <= i) x1 = __expf(gi - Gs[j + 1]) * At[i * LDA + j + 1] * bs[j + 1];
    }
    const T h0 = from_f32<T>(x0), h1 = from_f32<T>(x1);
    const int at = lower_block_off(b) + (i % 16) * lower_block_ld(b) + j;
    *reinterpret_cast<unsigned*>(Mg + at) = pack2<T>(to_f32(h0), to_f32(h1));
    *reinterpret_cast<unsigned*>(Mlg + at) = pack2<T>(x0 - to_f32(h0), x1 - to_f32(h1));
  });
#endif
}

}  // namespace gdnkit::cuda
