// The chunked GDN prefill for sm_80 and newer (GDN_MATH.md section 2, fused form), in two kernels.
//
// Prep, fully parallel over (chunk, head): the chunk-local quantities that depend only on K, Q, g
// and beta (Q K^T, K K^T, the blocked fp32 inverse Tu) are computed once per chunk and written to
// the workspace as Mt = exp(G_i - G_j) Tu_ij beta_j, P and G (record layout in chunked.h).
// Walk, one CTA per (sequence, head, block of DVB value columns), chunk after chunk: only the
// state products,
//
//   KS  = K S,  QS = Q S
//   X   = V - diag(gam) KS
//   Vn  = Mt X
//   O   = scale * diag(gam) QS + P Vn
//   S'  = gam_last S + K^T diag(exp(G_last - G)) Vn
//
// Both kernels touch only the 16-row blocks that hold valid rows (nb = ceil(nrows / 16)), so short
// chunks (short sequences) cost little. Rows in [nrows, 16 nb) are zero in K, Q, V, Mt and P, so
// they stay zero through every product. Products run on WMMA (16-bit operands, fp32 accumulators);
// the state, the gates, the inverse and O before its store stay fp32. One operand is carried in
// two parts: Mt as hi + lo (two 16-bit matrices, hi = round(Mt), lo = round(Mt - hi)) and
// Vn = Mt_hi X + Mt_lo X, two MMAs into one fp32 accumulator, so Mt is effectively exact (relative
// error ~2^-17 instead of 2^-9 in bf16). Measured in emulation, the rounding of Mt was one of the
// two dominant errors of the final state (the other is Vd's); the split costs 10 extra 16x16x16
// MMAs per full chunk and 16-column block (+9% of the walk's MMAs at dk = 128, +15% at dk = 64) and
// lowers the state error by ~30% (bf16 and f16) and the output error by ~12% (docs/perf-notes.md).
// Mt and P are stored (workspace and shared memory) in the lower-block layout of chunked.h.
#pragma once

#include <cuda_pipeline_primitives.h>

#include <cfloat>

#include "cuda/wmma_common.cuh"

namespace gdnkit::cuda {

// Copies rows [0, n) of a [rows x COLS] 16-bit global matrix (row stride `stride` elements) into
// shared memory (ld LD) with 16-byte cp.async; rows [n, rows) are zero-filled.
template <typename T, int COLS, int LD>
__device__ __forceinline__ void load_rows_async_n(T* dst, const T* src, std::int64_t stride, int n, int rows,
                                                  int tid) {
  constexpr int VEC = 8;
  constexpr int PER_ROW = COLS / VEC;
  for (int idx = tid; idx < rows * PER_ROW; idx += kThreads) {
    const int row = idx / PER_ROW;
    const int col = (idx % PER_ROW) * VEC;
    T* d = dst + row * LD + col;
    if (row < n)
      __pipeline_memcpy_async(d, src + row * stride + col, 16);
    else
      *reinterpret_cast<uint4*>(d) = make_uint4(0u, 0u, 0u, 0u);
  }
}

__device__ __forceinline__ std::int64_t seq_begin(const ChunkedParams& p, std::int64_t n) {
  if (!p.has_cu_seqlens) return n * p.uniform_len;
  return p.cu_seqlens_i64 ? static_cast<const std::int64_t*>(p.cu_seqlens)[n]
                          : static_cast<std::int64_t>(static_cast<const std::int32_t*>(p.cu_seqlens)[n]);
}

// Copies block rows [0, nb) of a lower-block-layout matrix (chunked.h) from its workspace record
// into shared memory (the same layout: one contiguous prefix) with 16-byte cp.async.
template <typename T>
__device__ __forceinline__ void load_lower_async(T* dst, const T* src, int nb, int tid) {
  const int vecs = lower_block_off(nb) / 8;
  for (int idx = tid; idx < vecs; idx += kThreads) __pipeline_memcpy_async(dst + 8 * idx, src + 8 * idx, 16);
}

// First workspace slot of sequence n (its chunk j uses slot + j).
__device__ __forceinline__ std::int64_t first_slot(std::int64_t bos, std::int64_t n) { return bos / kChunk + n; }

// ---- prep ---------------------------------------------------------------------------------------

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
  static constexpr std::size_t off_k = 0;
  static constexpr std::size_t off_q = off_k + align128(k_bytes);
  static constexpr std::size_t off_at = off_q + align128(k_bytes);
  static constexpr std::size_t off_r = off_at + align128(at_bytes);
  static constexpr std::size_t off_G = off_r + align128(r_bytes);
  static constexpr std::size_t off_beta = off_G + align128(vec_bytes);
  static constexpr std::size_t total = off_beta + align128(vec_bytes);
};

// D = X Y^T for the lower block tiles (bi >= bj) with bi < nb (X, Y: ld LDK; D fp32, ld LDA).
template <typename T, int DK, int LDK, int LDA>
__device__ __forceinline__ void gram_lower_tiles_nb(const T* X, const T* Y, float* D, int warp, int nb) {
  const int tiles = nb * (nb + 1) / 2;
  for (int t = warp; t < tiles; t += 4) {
    int bi = 0;
    while ((bi + 1) * (bi + 2) / 2 <= t) ++bi;
    const int bj = t - bi * (bi + 1) / 2;
    FragC acc;
    wm::fill_fragment(acc, 0.0f);
#pragma unroll
    for (int kk = 0; kk < DK; kk += 16) {
      FragA<T> a;
      FragBT<T> b;
      wm::load_matrix_sync(a, X + bi * 16 * LDK + kk, LDK);
      wm::load_matrix_sync(b, Y + bj * 16 * LDK + kk, LDK);
      wm::mma_sync(acc, a, b, acc);
    }
    wm::store_matrix_sync(D + bi * 16 * LDA + bj * 16, acc, LDA, wm::mem_row_major);
  }
}

// grid = (ceil(T / 64) + N, H); 128 threads. One (chunk slot, head) per CTA; empty slots exit.
template <typename T, int DK>
__global__ void __launch_bounds__(kThreads) gdn_prep_kernel(const ChunkedParams p) {
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
  T* const Qs = reinterpret_cast<T*>(smem + L::off_q);
  float* const At = reinterpret_cast<float*>(smem + L::off_at);
  float* const Rs = reinterpret_cast<float*>(smem + L::off_r);
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
  load_rows_async_n<T, DK, LDK>(Ks, kh + c0 * p.k_token, p.k_token, nrows, nb * 16, tid);
  load_rows_async_n<T, DK, LDK>(Qs, qh + c0 * p.q_token, p.q_token, nrows, nb * 16, tid);
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

  // P block rows [0, nb) (lower-block layout, row padding written as zeros so that the walk
  // never copies uninitialised memory), two columns per thread and step (32-bit stores).
  constexpr int PAIRS = lower_block_ld(kChunkBlocks - 1) / 2;  // pairs in the widest row
  for (int e = tid; e < nb * 16 * PAIRS; e += kThreads) {
    const int i = e / PAIRS, j = 2 * (e % PAIRS);
    const int b = i / 16;
    if (j >= lower_block_ld(b)) continue;
    float x0 = 0.0f, x1 = 0.0f;
    if (j <= i) {
      const float gi = Gs[i];
      x0 = p.scale * At[i * LDA + j] * __expf(gi - Gs[j]);
      if (j + 1 <= i) x1 = p.scale * At[i * LDA + j + 1] * __expf(gi - Gs[j + 1]);
    }
    *reinterpret_cast<unsigned*>(Pg + lower_block_off(b) + (i % 16) * lower_block_ld(b) + j) = pack2<T>(x0, x1);
  }
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
    for (int e = tid; e < I * 64; e += kThreads) {
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
    for (int e = tid; e < I * 64; e += kThreads) {
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

  // Mt block rows [0, nb) as hi + lo (lower-block layout, padding zero): hi = round(Mt),
  // lo = round(Mt - hi).
  for (int e = tid; e < nb * 16 * PAIRS; e += kThreads) {
    const int i = e / PAIRS, j = 2 * (e % PAIRS);
    const int b = i / 16;
    if (j >= lower_block_ld(b)) continue;
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
  }
#endif
}

// ---- walk ---------------------------------------------------------------------------------------

template <int DK, int DVB>
struct WalkLayout {
  static constexpr int C = kChunk;
  static constexpr int LDK = DK + 8;
  static constexpr int LDV = DVB + 8;
  static constexpr int LDF = DVB + 4;
  static constexpr std::size_t k_bytes = std::size_t(C) * LDK * 2;
  static constexpr std::size_t c_bytes = kLowerBytes;  // P, Mt hi, Mt lo: lower-block layout
  static constexpr std::size_t v_bytes = std::size_t(C) * LDV * 2;
  static constexpr std::size_t sb_bytes = std::size_t(DK) * LDV * 2;
  static constexpr std::size_t sf_bytes = std::size_t(DK) * LDF * 4;
  static constexpr std::size_t xf_bytes = std::size_t(C) * LDF * 4;
  static constexpr std::size_t vec_bytes = std::size_t(C) * 4;
  static constexpr std::size_t off_k = 0;
  static constexpr std::size_t off_q = off_k + align128(k_bytes);
  static constexpr std::size_t off_p = off_q + align128(k_bytes);
  static constexpr std::size_t off_mt = off_p + align128(c_bytes);
  static constexpr std::size_t off_mtlo = off_mt + align128(c_bytes);
  static constexpr std::size_t off_v = off_mtlo + align128(c_bytes);
  static constexpr std::size_t off_x = off_v + align128(v_bytes);   // X
  static constexpr std::size_t off_vn = off_x + align128(v_bytes);  // Vn 16-bit
  static constexpr std::size_t off_vd = off_vn + align128(v_bytes); // Vd 16-bit
  static constexpr std::size_t off_sb = off_vd + align128(v_bytes);
  static constexpr std::size_t off_sf = off_sb + align128(sb_bytes);
  static constexpr std::size_t off_xf = off_sf + align128(sf_bytes);  // per warp: K S, Q S, Vn, O
  static constexpr std::size_t off_G = off_xf + align128(xf_bytes);   // two buffers (this chunk, next)
  static constexpr std::size_t total = off_G + 2 * align128(vec_bytes);
  static_assert(DK % 16 == 0 && DVB % 16 == 0, "tiles are 16x16");
  static_assert(kThreads / 32 == kChunkBlocks, "warp w owns the chunk's row block w");
};

struct WalkChunk {
  std::int64_t c0;
  const unsigned char* rec;
  int nrows, nb;
};

// grid = (dv / DVB, H, min(N, 65535)); 128 threads. blockIdx.z strides over sequences.
//
// Warp w owns rows [16 w, 16 w + 16) of the chunk (K S, Q S, X, Vn, O) and state row blocks
// w, w + 4, ...; most steps touch only the warp's own rows (__syncwarp), and a chunk has four
// CTA barriers: loads landed | X complete | Vn complete | state and O done. The next chunk's
// loads are issued as soon as their buffers are free: Q, G (double-buffered) and V after X, Mt
// after Vn, K and P at the end. (Measured on an H200: computing K S and Q S together in one phase,
// two independent MMA chains, beats moving Q S one phase later to hide the K and Q loads.)
template <typename T, int DK, int DVB>
__global__ void __launch_bounds__(kThreads, 2) gdn_walk_kernel(const ChunkedParams p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  __trap();
#else
  using L = WalkLayout<DK, DVB>;
  constexpr int C = kChunk;
  constexpr int LDK = L::LDK, LDV = L::LDV, LDF = L::LDF;
  constexpr int NCT = DVB / 16;

  extern __shared__ __align__(128) unsigned char smem[];
  T* const Ks = reinterpret_cast<T*>(smem + L::off_k);
  T* const Qs = reinterpret_cast<T*>(smem + L::off_q);
  T* const Ps = reinterpret_cast<T*>(smem + L::off_p);
  T* const Mt = reinterpret_cast<T*>(smem + L::off_mt);
  T* const MtLo = reinterpret_cast<T*>(smem + L::off_mtlo);
  T* const Vs = reinterpret_cast<T*>(smem + L::off_v);
  T* const Xs = reinterpret_cast<T*>(smem + L::off_x);
  T* const Vn16 = reinterpret_cast<T*>(smem + L::off_vn);
  T* const Vd = reinterpret_cast<T*>(smem + L::off_vd);
  T* const Sb = reinterpret_cast<T*>(smem + L::off_sb);
  float* const Sf = reinterpret_cast<float*>(smem + L::off_sf);
  float* const Xf = reinterpret_cast<float*>(smem + L::off_xf);
  float* const Gbuf = reinterpret_cast<float*>(smem + L::off_G);

  const int tid = threadIdx.x;
  const int warp = tid / 32;
  const int lane = tid % 32;
  const int h = blockIdx.y;
  const int v0 = blockIdx.x * DVB;

  const T* const qh = static_cast<const T*>(p.q) + static_cast<std::int64_t>(h / p.q_group) * p.q_head;
  const T* const kh = static_cast<const T*>(p.k) + static_cast<std::int64_t>(h / p.k_group) * p.k_head;
  const T* const vh = static_cast<const T*>(p.v) + static_cast<std::int64_t>(h / p.v_group) * p.v_head + v0;
  T* const oh = static_cast<T*>(p.o) + static_cast<std::int64_t>(h) * p.o_head + v0;
  float* const Xw = Xf + warp * 16 * LDF;  // this warp's 16 fp32 rows

  auto load_qgv = [&](const WalkChunk& w, float* G) {
    load_rows_async_n<T, DK, LDK>(Qs, qh + w.c0 * p.q_token, p.q_token, w.nrows, w.nb * 16, tid);
    load_rows_async_n<T, DVB, LDV>(Vs, vh + w.c0 * p.v_token, p.v_token, w.nrows, w.nb * 16, tid);
    if (tid < C / 4) __pipeline_memcpy_async(G + 4 * tid, w.rec + kRecGOff + 16 * tid, 16);
  };
  auto load_mt = [&](const WalkChunk& w) {
    load_lower_async<T>(Mt, reinterpret_cast<const T*>(w.rec + kRecMtOff), w.nb, tid);
    load_lower_async<T>(MtLo, reinterpret_cast<const T*>(w.rec + kRecMtLoOff), w.nb, tid);
  };
  auto load_kp = [&](const WalkChunk& w) {
    load_rows_async_n<T, DK, LDK>(Ks, kh + w.c0 * p.k_token, p.k_token, w.nrows, w.nb * 16, tid);
    load_lower_async<T>(Ps, reinterpret_cast<const T*>(w.rec + kRecPOff), w.nb, tid);
  };

  for (std::int64_t n = blockIdx.z; n < p.num_seqs; n += gridDim.z) {
    const std::int64_t bos = seq_begin(p, n), eos = seq_begin(p, n + 1);
    const unsigned char* const rec0 = p.ws + (first_slot(bos, n) * p.num_heads + h) * kRecBytes;
    auto chunk_at = [&](std::int64_t c0) {
      WalkChunk w;
      w.c0 = c0;
      w.rec = rec0 + ((c0 - bos) / C) * p.num_heads * kRecBytes;
      w.nrows = static_cast<int>(eos - c0 < C ? eos - c0 : C);
      w.nb = (w.nrows + 15) / 16;
      return w;
    };

    const std::int64_t state_base = (n * p.num_heads + h) * static_cast<std::int64_t>(DK) * p.dv;
    // Without an initial state the state is exactly zero until the first chunk's update: that
    // chunk skips K S and Q S (X = V, O = P Vn) and starts the update from 0, bit for bit the
    // same result.
    bool zero_state = !p.has_initial_state;
    if (!zero_state || bos >= eos) {
      for (int e = tid; e < DK * DVB; e += kThreads) {
        int kr, c;
        if (p.state_vk) {
          c = e / DK;
          kr = e % DK;
        } else {
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
    }
    if (bos < eos) {
      const WalkChunk first = chunk_at(bos);
      load_qgv(first, Gbuf);
      load_mt(first);
      load_kp(first);
      __pipeline_commit();
    }

    int gb = 0;  // G buffer of the current chunk
    for (std::int64_t c0 = bos; c0 < eos; c0 += C, gb ^= 1) {
      const WalkChunk cur = chunk_at(c0);
      const bool has_next = c0 + C < eos;
      const WalkChunk next = chunk_at(has_next ? c0 + C : c0);
      const int nrows = cur.nrows, nb = cur.nb;
      const float* const Gs = Gbuf + gb * (align128(L::vec_bytes) / 4);
      float* const Gn = Gbuf + (gb ^ 1) * (align128(L::vec_bytes) / 4);
      const bool active = warp < nb;  // this warp's row block holds valid rows
      __pipeline_wait_prior(0);
      __syncthreads();

      // A: K S and Q S (own rows); X = V - gam (K S); O starts as scale gam (Q S), kept in registers.
      FragC oacc[NCT];
      if (active && zero_state) {
#pragma unroll
        for (int c = 0; c < NCT; ++c) wm::fill_fragment(oacc[c], 0.0f);
        for (int e = lane; e < 16 * DVB; e += 32) {
          const int i = warp * 16 + e / DVB, c = e % DVB;
          Xs[i * LDV + c] = Vs[i * LDV + c];
        }
      } else if (active) {
        FragC ks[NCT];
#pragma unroll
        for (int c = 0; c < NCT; ++c) {
          wm::fill_fragment(ks[c], 0.0f);
          wm::fill_fragment(oacc[c], 0.0f);
        }
#pragma unroll 2
        for (int kk = 0; kk < DK; kk += 16) {
          FragA<T> ak, aq;
          wm::load_matrix_sync(ak, Ks + warp * 16 * LDK + kk, LDK);
          wm::load_matrix_sync(aq, Qs + warp * 16 * LDK + kk, LDK);
#pragma unroll
          for (int c = 0; c < NCT; ++c) {
            FragB<T> b;
            wm::load_matrix_sync(b, Sb + kk * LDV + c * 16, LDV);
            wm::mma_sync(ks[c], ak, b, ks[c]);
            wm::mma_sync(oacc[c], aq, b, oacc[c]);
          }
        }
#pragma unroll
        for (int c = 0; c < NCT; ++c) wm::store_matrix_sync(Xw + c * 16, ks[c], LDF, wm::mem_row_major);
        __syncwarp();
        for (int e = lane; e < 16 * DVB; e += 32) {
          const int r = e / DVB, c = e % DVB, i = warp * 16 + r;
          Xs[i * LDV + c] = from_f32<T>(to_f32(Vs[i * LDV + c]) - __expf(Gs[i]) * Xw[r * LDF + c]);
        }
        __syncwarp();
#pragma unroll
        for (int c = 0; c < NCT; ++c) wm::store_matrix_sync(Xw + c * 16, oacc[c], LDF, wm::mem_row_major);
        __syncwarp();
        for (int e = lane; e < 16 * DVB; e += 32) {
          const int r = e / DVB, c = e % DVB;
          Xw[r * LDF + c] *= p.scale * __expf(Gs[warp * 16 + r]);
        }
        __syncwarp();
#pragma unroll
        for (int c = 0; c < NCT; ++c) wm::load_matrix_sync(oacc[c], Xw + c * 16, LDF, wm::mem_row_major);
      }
      __syncthreads();
      if (has_next) load_qgv(next, Gn);
      __pipeline_commit();

      // B: Vn = (Mt_hi + Mt_lo) X (own rows, k-blocks <= warp); Vn (16-bit, for O) and
      // Vd = exp(G_last - G_i) Vn_i.
      const float G_last = Gs[nrows - 1];
      const int ldw = lower_block_ld(warp);                       // this warp's block row of P and Mt
      const int offw = lower_block_off(warp);
      if (active) {
        FragC acc[NCT];
#pragma unroll
        for (int c = 0; c < NCT; ++c) wm::fill_fragment(acc[c], 0.0f);
        for (int kb = 0; kb <= warp; ++kb) {
          FragA<T> a, alo;
          wm::load_matrix_sync(a, Mt + offw + kb * 16, ldw);
          wm::load_matrix_sync(alo, MtLo + offw + kb * 16, ldw);
#pragma unroll
          for (int c = 0; c < NCT; ++c) {
            FragB<T> b;
            wm::load_matrix_sync(b, Xs + kb * 16 * LDV + c * 16, LDV);
            wm::mma_sync(acc[c], alo, b, acc[c]);
            wm::mma_sync(acc[c], a, b, acc[c]);
          }
        }
#pragma unroll
        for (int c = 0; c < NCT; ++c) wm::store_matrix_sync(Xw + c * 16, acc[c], LDF, wm::mem_row_major);
        __syncwarp();
        for (int e = lane; e < 16 * DVB; e += 32) {
          const int r = e / DVB, c = e % DVB, i = warp * 16 + r;
          const float vn = Xw[r * LDF + c];
          Vn16[i * LDV + c] = from_f32<T>(vn);
          Vd[i * LDV + c] = from_f32<T>(__expf(G_last - Gs[i]) * vn);
        }
      }
      __syncthreads();
      if (has_next) load_mt(next);
      __pipeline_commit();

      // C: O += P Vn (own rows) and store; S = gam_last S + K^T Vd (own state row blocks), with
      // the 16-bit copy refreshed row block by row block.
      if (active) {
        for (int kb = 0; kb <= warp; ++kb) {
          FragA<T> a;
          wm::load_matrix_sync(a, Ps + offw + kb * 16, ldw);
#pragma unroll
          for (int c = 0; c < NCT; ++c) {
            FragB<T> b;
            wm::load_matrix_sync(b, Vn16 + kb * 16 * LDV + c * 16, LDV);
            wm::mma_sync(oacc[c], a, b, oacc[c]);
          }
        }
#pragma unroll
        for (int c = 0; c < NCT; ++c) wm::store_matrix_sync(Xw + c * 16, oacc[c], LDF, wm::mem_row_major);
        __syncwarp();
        constexpr int VEC = 8;
        constexpr int PER_ROW = DVB / VEC;
        const int rows = nrows - warp * 16 < 16 ? nrows - warp * 16 : 16;
        for (int idx = lane; idx < rows * PER_ROW; idx += 32) {
          const int r = idx / PER_ROW;
          const int col = (idx % PER_ROW) * VEC;
          const float* f = Xw + r * LDF + col;
          const uint4 out = make_uint4(pack2<T>(f[0], f[1]), pack2<T>(f[2], f[3]), pack2<T>(f[4], f[5]),
                                       pack2<T>(f[6], f[7]));
          *reinterpret_cast<uint4*>(oh + (c0 + warp * 16 + r) * p.o_token + col) = out;
        }
      }
      {
        const float gam_last = __expf(G_last);
#pragma unroll
        for (int rb = warp; rb < DK / 16; rb += 4) {
          FragC acc[NCT];
#pragma unroll
          for (int c = 0; c < NCT; ++c) {
            if (zero_state) {
              wm::fill_fragment(acc[c], 0.0f);
            } else {
              wm::load_matrix_sync(acc[c], Sf + rb * 16 * LDF + c * 16, LDF, wm::mem_row_major);
#pragma unroll
              for (int t = 0; t < acc[c].num_elements; ++t) acc[c].x[t] *= gam_last;
            }
          }
          for (int kb = 0; kb < nb; ++kb) {
            FragAT<T> a;
            wm::load_matrix_sync(a, Ks + kb * 16 * LDK + rb * 16, LDK);
#pragma unroll
            for (int c = 0; c < NCT; ++c) {
              FragB<T> b;
              wm::load_matrix_sync(b, Vd + kb * 16 * LDV + c * 16, LDV);
              wm::mma_sync(acc[c], a, b, acc[c]);
            }
          }
#pragma unroll
          for (int c = 0; c < NCT; ++c)
            wm::store_matrix_sync(Sf + rb * 16 * LDF + c * 16, acc[c], LDF, wm::mem_row_major);
          if (has_next) {
            __syncwarp();
            for (int e = lane; e < 16 * DVB; e += 32) {
              const int kr = rb * 16 + e / DVB, c = e % DVB;
              Sb[kr * LDV + c] = from_f32<T>(Sf[kr * LDF + c]);
            }
          }
        }
      }
      zero_state = false;
      __syncthreads();
      if (has_next) load_kp(next);
      __pipeline_commit();
    }

    if (p.want_final_state) {
      if (bos >= eos) __syncthreads();  // no chunk ran: order the state initialization
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
