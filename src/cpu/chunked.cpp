// CPU backend: the chunked GDN prefill in fp32, fused form (docs/math.md), C = 64.
//
// Per (sequence, output head) item and per chunk of n <= 64 tokens entering with state S (dk x dv):
//   G = cumsum(g), gam = exp(G), E_ij = exp(G_i - G_j) (i >= j)
//   Tu = (I + strict_lower(diag(beta) K K^T))^-1          (forward substitution)
//   M  = lower_incl(E .* Tu) diag(beta)
//   X  = V - diag(gam) K S,   Vn = M X
//   O  = diag(scale gam) Q S + (scale lower_incl(Q K^T) .* E) Vn
//   S' = gam_n S + (K^T diag(exp(G_n - G))) Vn
// Every product is one routine, gemm(): a 4 x 8 register block of float accumulators whose
// innermost operations run over contiguous output columns in 4-wide SIMD values (SSE, the x86-64
// baseline, so no -march is needed): ~11 GMAC/s per core here, close to the SSE peak. On x86-64
// CPUs with AVX2 and FMA (checked once per plan) an 8 x 8 block of 8-wide fused multiply-adds
// does the same products instead (gemm_avx2), and with AVX-512 an 8 x 16 block of 16-wide ones
// (gemm_avx512, AVX2's results bit for bit); GDNKIT_CPU_SIMD=avx2 or =baseline at Plan::create
// caps the choice.
// Work items are spread over threads through an atomic counter; all scratch is the caller's
// workspace (one 64-byte aligned slice per thread); nothing is allocated per item.
#include <algorithm>
#include <atomic>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <thread>
#include <type_traits>
#include <vector>

#if defined(__linux__)
#include <sched.h>
#endif

#if defined(__SSE2__) || defined(_M_X64)
#include <xmmintrin.h>
#define GDNKIT_HAS_MXCSR 1
#endif
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define GDNKIT_CPU_AVX2 1  // gemm_avx2 compiled (target attribute), used where the CPU has it
#endif

#include "common/gate.h"
#include "common/half.h"
#include "common/shape.h"
#include "cpu/backend.h"

namespace gdnkit::cpu {

namespace {

constexpr int kChunk = 64;
constexpr int kAlignFloats = 16;  // 64 bytes
constexpr std::size_t kAlignBytes = 64;
constexpr int NR = 8;  // output columns per register block (two SSE vectors)
constexpr int MR = 4;  // output rows per register block

constexpr std::int64_t round_up(std::int64_t x, std::int64_t m) { return (x + m - 1) / m * m; }

// Offsets (in floats) of one thread's scratch arrays; every array starts 64-byte aligned.
struct Layout {
  // Row strides (floats) are odd multiples of 16: rows start 64-byte aligned, and a matrix walked
  // down a column spreads over every L1 set (a power-of-two stride such as 128 floats maps 128
  // rows onto 8 of 64 sets). Measured neutral on this machine; insurance for smaller L1s.
  int ldv = 0;  // everything dv wide: S, X, O, Vn
  int ldk = 0;  // K and Q rows
  int ldc = 0;  // everything chunk wide: K^T, K K^T, Q K^T, Tu
  int ncv = 0;  // dv rounded up to NR: columns computed (beyond dv they stay 0)
  std::int64_t S = 0, KQ = 0, Kt = 0, KK = 0, QK = 0, T = 0, XO = 0, Vn = 0, vec = 0, total = 0;
};

constexpr int kNumVec = 8;  // G (doubles: two slots), gam, beta, rsK, rsQ, w, erow: kChunk floats each

int padded_stride(int cols) {
  const int ld = static_cast<int>(round_up(cols, kAlignFloats));
  return (ld / kAlignFloats) % 2 == 0 ? ld + kAlignFloats : ld;
}

Layout make_layout(const detail::Shape& s) {
  Layout L;
  L.ldv = padded_stride(s.dv);
  L.ldk = padded_stride(s.dk);
  L.ldc = padded_stride(kChunk);
  L.ncv = static_cast<int>(round_up(s.dv, NR));
  std::int64_t at = 0;
  auto take = [&](std::int64_t floats) {
    const std::int64_t here = at;
    at += round_up(floats, kAlignFloats);
    return here;
  };
  L.S = take(static_cast<std::int64_t>(s.dk) * L.ldv);         // state, kv layout
  L.KQ = take(2 * kChunk * static_cast<std::int64_t>(L.ldk));  // K rows [0, n), Q rows [n, 2n)
  L.Kt = take(static_cast<std::int64_t>(s.dk) * L.ldc);        // K^T, later K^T diag(w)
  L.KK = take(kChunk * L.ldc);                                 // K K^T (lower)
  L.QK = take(kChunk * L.ldc);                                 // Q K^T (lower), then P
  L.T = take(kChunk * L.ldc);                                  // Tu, then M
  L.XO = take(2 * kChunk * static_cast<std::int64_t>(L.ldv));  // X rows [0, n), O rows [n, 2n)
  L.Vn = take(kChunk * static_cast<std::int64_t>(L.ldv));
  L.vec = take(kNumVec * kChunk);
  L.total = at;
  return L;
}

enum class Tri {
  none,
  k_lower,  // A is lower triangular (incl. diagonal) in (row, k); entries above it are zero
  n_lower,  // only output columns j <= row are needed (others may be skipped or garbage)
};

// A 4-float SIMD value (one SSE register: the x86-64 baseline, no -march needed). GCC and Clang
// compile vector-extension arithmetic straight to SIMD instructions; written as plain loops, GCC
// vectorised the micro-kernel across k instead and ran ~4x slower.
#if defined(__GNUC__) || defined(__clang__)
typedef float Vec __attribute__((vector_size(16)));
inline Vec vbroadcast(float x) { return Vec{x, x, x, x}; }
#else
struct Vec {
  float x[4];
  Vec& operator+=(const Vec& o) {
    for (int i = 0; i < 4; ++i) x[i] += o.x[i];
    return *this;
  }
  friend Vec operator*(const Vec& a, const Vec& b) {
    Vec r;
    for (int i = 0; i < 4; ++i) r.x[i] = a.x[i] * b.x[i];
    return r;
  }
};
inline Vec vbroadcast(float v) { return Vec{{v, v, v, v}}; }
#endif
inline Vec vload(const float* p) {
  Vec v;
  std::memcpy(&v, p, sizeof v);  // unaligned load, no aliasing questions
  return v;
}
inline void vstore(float* p, const Vec& v) { std::memcpy(p, &v, sizeof v); }
constexpr int kVecs = NR / 4;  // Vecs per row of a register block

// C[m x ncols] = cs * C + diag(rs) * (A B)   (accumulate)   or   diag(rs) * (A B)   (overwrite).
// A[i][k] = A[i*ars + k*acs]; B is row-major with ldb; ncols is a multiple of NR and B and C
// have at least that many columns. rs == nullptr means all ones.
// Register block: R rows x NR columns of C in R * kVecs accumulators (8 of 16 SSE registers).
// tri0 >= 0 (Tri::k_lower): row r takes k only up to tri0 + r, so the zeros above A's diagonal never
// meet B's later rows (0 x NaN would carry a later token's NaN or inf into earlier rows).
template <int R>
inline void gemm_block(int kdim, int tri0, const float* A, std::ptrdiff_t ars, std::ptrdiff_t acs,
                       const float* B, std::ptrdiff_t ldb, float* C, std::ptrdiff_t ldc,
                       const float* rs, float cs, bool accumulate) {
  Vec acc[R][kVecs];
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < kVecs; ++v) acc[r][v] = vbroadcast(0.0f);
  const int kfull = tri0 < 0 ? kdim : std::min(kdim, tri0);
  for (int kk = 0; kk < kfull; ++kk) {
    const float* b = B + kk * ldb;
    Vec bv[kVecs];
    for (int v = 0; v < kVecs; ++v) bv[v] = vload(b + 4 * v);
    for (int r = 0; r < R; ++r) {
      const Vec a = vbroadcast(A[r * ars + kk * acs]);
      for (int v = 0; v < kVecs; ++v) acc[r][v] += a * bv[v];
    }
  }
  for (int kk = kfull; kk < kdim; ++kk) {  // the diagonal block's triangle
    const float* b = B + kk * ldb;
    Vec bv[kVecs];
    for (int v = 0; v < kVecs; ++v) bv[v] = vload(b + 4 * v);
    for (int r = kk - tri0; r < R; ++r) {
      const Vec a = vbroadcast(A[r * ars + kk * acs]);
      for (int v = 0; v < kVecs; ++v) acc[r][v] += a * bv[v];
    }
  }
  for (int r = 0; r < R; ++r) {
    const Vec s = vbroadcast(rs ? rs[r] : 1.0f);
    float* crow = C + r * ldc;
    for (int v = 0; v < kVecs; ++v) {
      Vec out = s * acc[r][v];
      if (accumulate) out += vbroadcast(cs) * vload(crow + 4 * v);
      vstore(crow + 4 * v, out);
    }
  }
}

void gemm(int m, int ncols, int kdim, const float* A, std::ptrdiff_t ars, std::ptrdiff_t acs,
          const float* B, std::ptrdiff_t ldb, float* C, std::ptrdiff_t ldc, const float* rs,
          float cs, bool accumulate, Tri tri) {
  // Column panels outermost: a kdim x NR panel of B stays in L1 while every row block uses it.
  const bool kl = tri == Tri::k_lower;
  for (int j0 = 0; j0 < ncols; j0 += NR) {
    int i0 = 0;
    for (; i0 + MR <= m; i0 += MR) {
      if (tri == Tri::n_lower && j0 >= i0 + MR) continue;
      const int kmax = kl ? std::min(kdim, i0 + MR) : kdim;
      gemm_block<MR>(kmax, kl ? i0 : -1, A + i0 * ars, ars, acs, B + j0, ldb, C + i0 * ldc + j0, ldc,
                     rs ? rs + i0 : nullptr, cs, accumulate);
    }
    for (; i0 < m; ++i0) {
      if (tri == Tri::n_lower && j0 > i0) continue;
      const int kmax = kl ? std::min(kdim, i0 + 1) : kdim;
      gemm_block<1>(kmax, kl ? i0 : -1, A + i0 * ars, ars, acs, B + j0, ldb, C + i0 * ldc + j0, ldc,
                    rs ? rs + i0 : nullptr, cs, accumulate);
    }
  }
}

#if GDNKIT_CPU_AVX2
// gemm_block with one 8-wide AVX vector per row and fused multiply-adds: R rows x NR columns,
// R accumulators (8 of 16 AVX registers at R = 8, enough to cover the FMA's latency).
template <int R>
__attribute__((target("avx2,fma"))) inline void gemm_block_avx2(int kdim, int tri0, const float* A,
                                                                 std::ptrdiff_t ars, std::ptrdiff_t acs,
                                                                 const float* B, std::ptrdiff_t ldb, float* C,
                                                                 std::ptrdiff_t ldc, const float* rs, float cs,
                                                                 bool accumulate) {
  static_assert(NR == 8, "one AVX vector per row");
  __m256 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  const int kfull = tri0 < 0 ? kdim : std::min(kdim, tri0);
  for (int kk = 0; kk < kfull; ++kk) {
    const __m256 b = _mm256_loadu_ps(B + kk * ldb);
    for (int r = 0; r < R; ++r) acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(A[r * ars + kk * acs]), b, acc[r]);
  }
  for (int kk = kfull; kk < kdim; ++kk) {  // the diagonal block's triangle (gemm_block)
    const __m256 b = _mm256_loadu_ps(B + kk * ldb);
    for (int r = kk - tri0; r < R; ++r)
      acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(A[r * ars + kk * acs]), b, acc[r]);
  }
  for (int r = 0; r < R; ++r) {
    float* crow = C + r * ldc;
    // One explicit form (cs C + (rs acc) as a fused multiply-add) rather than a multiply and an add,
    // which the compiler may contract either way: gemm_block_avx512 writes the same bits.
    const __m256 prod = _mm256_mul_ps(_mm256_set1_ps(rs ? rs[r] : 1.0f), acc[r]);
    const __m256 out = accumulate ? _mm256_fmadd_ps(_mm256_set1_ps(cs), _mm256_loadu_ps(crow), prod) : prod;
    _mm256_storeu_ps(crow, out);
  }
}

// gemm's contract, in blocks of 8, then 4, then single rows.
__attribute__((target("avx2,fma"))) void gemm_avx2(int m, int ncols, int kdim, const float* A, std::ptrdiff_t ars,
                                                    std::ptrdiff_t acs, const float* B, std::ptrdiff_t ldb, float* C,
                                                    std::ptrdiff_t ldc, const float* rs, float cs, bool accumulate,
                                                    Tri tri) {
  const bool kl = tri == Tri::k_lower;
  for (int j0 = 0; j0 < ncols; j0 += NR) {
    auto rows = [&](int i0, int r) {  // skip, or the k range, of rows [i0, i0 + r)
      if (tri == Tri::n_lower && j0 >= i0 + r) return -1;
      return kl ? std::min(kdim, i0 + r) : kdim;
    };
    int i0 = 0;
    for (; i0 + 8 <= m; i0 += 8)
      if (const int kmax = rows(i0, 8); kmax >= 0)
        gemm_block_avx2<8>(kmax, kl ? i0 : -1, A + i0 * ars, ars, acs, B + j0, ldb, C + i0 * ldc + j0, ldc,
                           rs ? rs + i0 : nullptr, cs, accumulate);
    for (; i0 + 4 <= m; i0 += 4)
      if (const int kmax = rows(i0, 4); kmax >= 0)
        gemm_block_avx2<4>(kmax, kl ? i0 : -1, A + i0 * ars, ars, acs, B + j0, ldb, C + i0 * ldc + j0, ldc,
                           rs ? rs + i0 : nullptr, cs, accumulate);
    for (; i0 < m; ++i0)
      if (const int kmax = rows(i0, 1); kmax >= 0)
        gemm_block_avx2<1>(kmax, kl ? i0 : -1, A + i0 * ars, ars, acs, B + j0, ldb, C + i0 * ldc + j0, ldc,
                           rs ? rs + i0 : nullptr, cs, accumulate);
  }
}

// gemm_block_avx2 with one 16-wide AVX-512 vector per row: R rows x 16 columns. Each element gets
// the same fused multiply-adds in the same order, and the same scaling, as in gemm_block_avx2.
// (A copy of its shape rather than one template: the instruction set is a per-function target
// attribute, and AVX2-only CPUs must not meet this function's encodings.)
template <int R>
__attribute__((target("avx512f,avx2,fma"))) inline void gemm_block_avx512(int kdim, int tri0, const float* A,
                                                                          std::ptrdiff_t ars, std::ptrdiff_t acs,
                                                                          const float* B, std::ptrdiff_t ldb, float* C,
                                                                          std::ptrdiff_t ldc, const float* rs, float cs,
                                                                          bool accumulate) {
  __m512 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  const int kfull = tri0 < 0 ? kdim : std::min(kdim, tri0);
  for (int kk = 0; kk < kfull; ++kk) {
    const __m512 b = _mm512_loadu_ps(B + kk * ldb);
    for (int r = 0; r < R; ++r) acc[r] = _mm512_fmadd_ps(_mm512_set1_ps(A[r * ars + kk * acs]), b, acc[r]);
  }
  for (int kk = kfull; kk < kdim; ++kk) {  // the diagonal block's triangle (gemm_block)
    const __m512 b = _mm512_loadu_ps(B + kk * ldb);
    for (int r = kk - tri0; r < R; ++r)
      acc[r] = _mm512_fmadd_ps(_mm512_set1_ps(A[r * ars + kk * acs]), b, acc[r]);
  }
  for (int r = 0; r < R; ++r) {
    float* crow = C + r * ldc;
    const __m512 prod = _mm512_mul_ps(_mm512_set1_ps(rs ? rs[r] : 1.0f), acc[r]);  // (gemm_block_avx2's form)
    const __m512 out = accumulate ? _mm512_fmadd_ps(_mm512_set1_ps(cs), _mm512_loadu_ps(crow), prod) : prod;
    _mm512_storeu_ps(crow, out);
  }
}

// gemm's contract in 16-column panels, the last 8 columns (ncols an odd multiple of 8) by
// gemm_block_avx2; rows in blocks of 8, then 4, then single rows.
__attribute__((target("avx512f,avx2,fma"))) void gemm_avx512(int m, int ncols, int kdim, const float* A,
                                                              std::ptrdiff_t ars, std::ptrdiff_t acs, const float* B,
                                                              std::ptrdiff_t ldb, float* C, std::ptrdiff_t ldc,
                                                              const float* rs, float cs, bool accumulate, Tri tri) {
  const bool kl = tri == Tri::k_lower;
  for (int j0 = 0; j0 < ncols;) {
    const bool wide = j0 + 16 <= ncols;
    auto rows = [&](int i0, int r) {  // skip, or the k range, of rows [i0, i0 + r)
      if (tri == Tri::n_lower && j0 >= i0 + r) return -1;
      return kl ? std::min(kdim, i0 + r) : kdim;
    };
    auto block = [&](auto rows_c, int i0, int kmax) {
      constexpr int R = decltype(rows_c)::value;
      const float* a = A + i0 * ars;
      float* c = C + i0 * ldc + j0;
      const float* s = rs ? rs + i0 : nullptr;
      if (wide) gemm_block_avx512<R>(kmax, kl ? i0 : -1, a, ars, acs, B + j0, ldb, c, ldc, s, cs, accumulate);
      else gemm_block_avx2<R>(kmax, kl ? i0 : -1, a, ars, acs, B + j0, ldb, c, ldc, s, cs, accumulate);
    };
    int i0 = 0;
    for (; i0 + 8 <= m; i0 += 8)
      if (const int kmax = rows(i0, 8); kmax >= 0) block(std::integral_constant<int, 8>{}, i0, kmax);
    for (; i0 + 4 <= m; i0 += 4)
      if (const int kmax = rows(i0, 4); kmax >= 0) block(std::integral_constant<int, 4>{}, i0, kmax);
    for (; i0 < m; ++i0)
      if (const int kmax = rows(i0, 1); kmax >= 0) block(std::integral_constant<int, 1>{}, i0, kmax);
    j0 += wide ? 16 : NR;
  }
}
#endif

using GemmFn = void (*)(int, int, int, const float*, std::ptrdiff_t, std::ptrdiff_t, const float*, std::ptrdiff_t,
                        float*, std::ptrdiff_t, const float*, float, bool, Tri);

// Converts `count` elements of a bf16/f16 row to float (dtype switch hoisted out of the loop).
void load_row(const void* base, DType dtype, std::int64_t offset, int count, float* dst) {
  const std::uint16_t* p = static_cast<const std::uint16_t*>(base) + offset;
  if (dtype == DType::bf16) {
    for (int i = 0; i < count; ++i) dst[i] = detail::bf16_to_float(p[i]);
  } else {
    for (int i = 0; i < count; ++i) dst[i] = detail::fp16_to_float(p[i]);
  }
}

void store_row(void* base, DType dtype, std::int64_t offset, int count, const float* src) {
  std::uint16_t* p = static_cast<std::uint16_t*>(base) + offset;
  if (dtype == DType::bf16) {
    for (int i = 0; i < count; ++i) p[i] = detail::float_to_bf16(src[i]);
  } else {
    for (int i = 0; i < count; ++i) p[i] = detail::float_to_fp16(src[i]);
  }
}

// Flushes subnormal floats to zero on this thread while in scope (x86: MXCSR FTZ | DAZ). Under
// strong decay exp(G) and its products fall below FLT_MIN, and x86 runs arithmetic on subnormals
// through microcode assists: measured 4x slower overall. Flushing changes results by < 1e-38.
class FlushSubnormals {
 public:
#if GDNKIT_HAS_MXCSR
  FlushSubnormals() : saved_(_mm_getcsr()) { _mm_setcsr(saved_ | 0x8040u); }
  ~FlushSubnormals() { _mm_setcsr(saved_); }

 private:
  unsigned saved_;
#endif
};

struct Context {
  const Problem& p;
  const detail::Shape& s;
  const Tensors& t;
  Layout L;
  GemmFn gemm;
};

// One (sequence, output head): walks the chunks in order, carrying the state in scratch.
void run_item(const Context& ctx, std::int64_t seq, int head, float* ws) {
  const Problem& p = ctx.p;
  const detail::Shape& s = ctx.s;
  const Tensors& t = ctx.t;
  const Layout& L = ctx.L;
  const GemmFn gemm = ctx.gemm;
  const int dk = s.dk, dv = s.dv, ldv = L.ldv, ldk = L.ldk, ldc = L.ldc, ncv = L.ncv;
  const DType dt = p.qkv_dtype;
  float* S = ws + L.S;
  float* KQ = ws + L.KQ;
  float* Kt = ws + L.Kt;
  float* KK = ws + L.KK;
  float* QK = ws + L.QK;
  float* T = ws + L.T;
  float* XO = ws + L.XO;
  float* Vn = ws + L.Vn;
  double* G = reinterpret_cast<double*>(ws + L.vec);  // 64-byte aligned
  float* gam = ws + L.vec + 2 * kChunk;
  float* beta = gam + kChunk;
  float* rsK = beta + kChunk;
  float* rsQ = rsK + kChunk;
  float* w = rsQ + kChunk;
  float* erow = w + kChunk;

  const std::int64_t state_off = (seq * s.H + head) * s.state_elems();
  const bool vk = p.state_layout == StateLayout::vk;

  // Initial state, read completely before anything is written (final_state may alias it).
  std::memset(S, 0, sizeof(float) * static_cast<std::size_t>(dk) * ldv);
  if (p.has_initial_state) {
    const float* init = t.initial_state + state_off;
    for (int i = 0; i < dk; ++i) {
      float* row = S + static_cast<std::ptrdiff_t>(i) * ldv;
      if (vk) {
        for (int j = 0; j < dv; ++j) row[j] = init[static_cast<std::ptrdiff_t>(j) * dk + i];
      } else {
        std::memcpy(row, init + static_cast<std::ptrdiff_t>(i) * dv, sizeof(float) * dv);
      }
    }
  }

  const detail::SeqRange range = detail::host_seq_range(p, s, t.cu_seqlens, seq);
  const int hq = s.q_head(head), hk = s.k_head(head), hv = s.v_head(head);
  const float scale = s.scale;

  for (std::int64_t c0 = range.begin; c0 < range.end; c0 += kChunk) {
    const int n = static_cast<int>(std::min<std::int64_t>(kChunk, range.end - c0));
    const int ncn = static_cast<int>(round_up(n, NR));  // columns computed of the n x n products
    float* Kc = KQ;
    float* Qc = KQ + static_cast<std::ptrdiff_t>(n) * ldk;
    float* X = XO;
    float* O = XO + static_cast<std::ptrdiff_t>(n) * ldv;

    // Load the chunk: K, Q rows; V rows into X (padding columns zero); gates and beta.
    // The cumulative gate is summed in double: the factors exp(G_i - G_j) then carry the error of
    // one float rounding of G_i - G_j instead of that of two float running sums of size |G|
    // (up to ~50 per chunk under realistic decay).
    double Gsum = 0.0;
    for (int i = 0; i < n; ++i) {
      const std::int64_t tok = c0 + i;
      load_row(t.k, dt, tok * s.k.token + hk * s.k.head, dk, Kc + static_cast<std::ptrdiff_t>(i) * ldk);
      load_row(t.q, dt, tok * s.q.token + hq * s.q.head, dk, Qc + static_cast<std::ptrdiff_t>(i) * ldk);
      float* xrow = X + static_cast<std::ptrdiff_t>(i) * ldv;
      load_row(t.v, dt, tok * s.v.token + hv * s.v.head, dv, xrow);
      for (int j = dv; j < ncv; ++j) xrow[j] = 0.0f;
      float gi = 0.0f;
      if (p.has_gate) {
        gi = detail::log_gate(t.g[tok * s.g.token + head * s.g.head], p.gate_space == GateSpace::linear);
      }
      Gsum += gi;
      G[i] = Gsum;
      gam[i] = std::exp(static_cast<float>(Gsum));
      beta[i] = p.has_beta ? detail::load_as_float(t.beta, p.beta_dtype, tok * s.beta.token + head * s.beta.head)
                           : 1.0f;
      rsK[i] = -gam[i];
      rsQ[i] = scale * gam[i];
    }
    // K^T (dk x kChunk); columns n.. are zero so the n x n products see no garbage.
    for (int d = 0; d < dk; ++d) {
      float* row = Kt + static_cast<std::ptrdiff_t>(d) * ldc;
      for (int j = 0; j < n; ++j) row[j] = Kc[static_cast<std::ptrdiff_t>(j) * ldk + d];
      for (int j = n; j < kChunk; ++j) row[j] = 0.0f;
    }

    // K K^T and Q K^T, lower triangles only.
    gemm(n, ncn, dk, Kc, ldk, 1, Kt, ldc, KK, ldc, nullptr, 1.0f, false, Tri::n_lower);
    gemm(n, ncn, dk, Qc, ldk, 1, Kt, ldc, QK, ldc, nullptr, 1.0f, false, Tri::n_lower);

    // Tu by forward substitution, row i = e_i - sum_{m<i} beta_i (k_i . k_m) Tu_m; row m of Tu
    // is zero beyond column m, so each update is a contiguous axpy of length m + 1.
    for (int i = 0; i < n; ++i) {
      float* ti = T + static_cast<std::ptrdiff_t>(i) * ldc;
      for (int j = 0; j < kChunk; ++j) ti[j] = 0.0f;
      ti[i] = 1.0f;
      const float* kki = KK + static_cast<std::ptrdiff_t>(i) * ldc;
      for (int m = 0; m < i; ++m) {
        const float a = beta[i] * kki[m];
        const float* tm = T + static_cast<std::ptrdiff_t>(m) * ldc;
        for (int j = 0; j <= m; ++j) ti[j] -= a * tm[j];
      }
    }
    // Only now (every row of Tu is final) the gated, beta-scaled M in place of Tu, and the output
    // mixing matrix P in place of Q K^T; both zero above the diagonal, which k_lower relies on.
    for (int i = 0; i < n; ++i) {
      // exp(G_i - G_j), not gam_i / gam_j: gam_j underflows under strong decay.
      for (int j = 0; j <= i; ++j) erow[j] = std::exp(static_cast<float>(G[i] - G[j]));
      float* ti = T + static_cast<std::ptrdiff_t>(i) * ldc;
      float* pi = QK + static_cast<std::ptrdiff_t>(i) * ldc;
      for (int j = 0; j <= i; ++j) {
        ti[j] *= erow[j] * beta[j];
        pi[j] *= scale * erow[j];
      }
      for (int j = i + 1; j < kChunk; ++j) pi[j] = 0.0f;
    }

    // X = V - diag(gam) K S and O = diag(scale gam) Q S, both from the entering state.
    gemm(n, ncv, dk, Kc, ldk, 1, S, ldv, X, ldv, rsK, 1.0f, true, Tri::none);
    gemm(n, ncv, dk, Qc, ldk, 1, S, ldv, O, ldv, rsQ, 1.0f, false, Tri::none);
    // Vn = M X;  O += P Vn.
    gemm(n, ncv, n, T, ldc, 1, X, ldv, Vn, ldv, nullptr, 1.0f, false, Tri::k_lower);
    gemm(n, ncv, n, QK, ldc, 1, Vn, ldv, O, ldv, nullptr, 1.0f, true, Tri::k_lower);

    for (int i = 0; i < n; ++i)
      store_row(t.o, dt, (c0 + i) * s.o.token + static_cast<std::int64_t>(head) * s.o.head, dv,
                O + static_cast<std::ptrdiff_t>(i) * ldv);

    // S = gam_n S + K^T diag(exp(G_n - G)) Vn.
    for (int j = 0; j < n; ++j) w[j] = std::exp(static_cast<float>(G[n - 1] - G[j]));
    for (int d = 0; d < dk; ++d) {
      float* row = Kt + static_cast<std::ptrdiff_t>(d) * ldc;
      for (int j = 0; j < n; ++j) row[j] *= w[j];
    }
    gemm(dk, ncv, n, Kt, ldc, 1, Vn, ldv, S, ldv, nullptr, gam[n - 1], true, Tri::none);
  }

  if (p.want_final_state) {
    float* fin = t.final_state + state_off;
    for (int i = 0; i < dk; ++i) {
      const float* row = S + static_cast<std::ptrdiff_t>(i) * ldv;
      if (vk) {
        for (int j = 0; j < dv; ++j) fin[static_cast<std::ptrdiff_t>(j) * dk + i] = row[j];
      } else {
        std::memcpy(fin + static_cast<std::ptrdiff_t>(i) * dv, row, sizeof(float) * dv);
      }
    }
  }
}

std::size_t slice_bytes(const detail::Shape& s) {
  return static_cast<std::size_t>(make_layout(s).total) * sizeof(float);
}

// The sequences' order, longest first: only packed batches have lengths to sort.
std::size_t order_bytes(const Problem& p, const detail::Shape& s) {
  if (!p.has_cu_seqlens) return 0;
  return static_cast<std::size_t>(round_up(s.N * static_cast<std::int64_t>(sizeof(std::int64_t)),
                                           static_cast<std::int64_t>(kAlignBytes)));
}

// The hardware threads this process may run on: its CPU affinity where the system says (taskset,
// cgroup cpusets, a framework that pinned the process), else every hardware thread.
int usable_hardware_threads() {
#if defined(__linux__)
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0) return CPU_COUNT(&set);
#endif
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

}  // namespace

Config plan(const Problem&, const detail::Shape& shape, const Options& options) {
  if (options.cpu_threads < 0)
    detail::fail(Error::Kind::invalid_value, "cpu_threads", "0 (all hardware threads) or a positive count",
                 std::to_string(options.cpu_threads));
  Config c;
  c.threads = options.cpu_threads > 0 ? options.cpu_threads : usable_hardware_threads();
  // More threads than (sequence, head) items would only cost workspace.
  const std::int64_t items = shape.N * shape.H;
  c.threads = static_cast<int>(std::max<std::int64_t>(1, std::min<std::int64_t>(c.threads, items)));
#if GDNKIT_CPU_AVX2
  // GDNKIT_CPU_SIMD=baseline or =avx2 caps the instruction set (A/B runs, tests); unset, empty or
  // avx512: the best the CPU has. Any other value is refused rather than read as no cap.
  const char* cap = std::getenv("GDNKIT_CPU_SIMD");
  if (cap != nullptr && cap[0] != '\0' && std::strcmp(cap, "baseline") != 0 && std::strcmp(cap, "avx2") != 0 &&
      std::strcmp(cap, "avx512") != 0)
    detail::fail(Error::Kind::invalid_value, "GDNKIT_CPU_SIMD",
                 "avx512, avx2, baseline or unset (the environment's cap on the CPU backend's instructions)",
                 std::string("\"") + cap + "\"");
  const bool baseline = cap != nullptr && std::strcmp(cap, "baseline") == 0;
  const bool avx2_cap = cap != nullptr && std::strcmp(cap, "avx2") == 0;
  if (!baseline && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
    c.simd = !avx2_cap && __builtin_cpu_supports("avx512f") ? Simd::avx512 : Simd::avx2;
#endif
  return c;
}

const char* simd_name(const Config& config) {
  switch (config.simd) {
    case Simd::avx512: return "avx512";
    case Simd::avx2: return "avx2";
    default: return "baseline";
  }
}

std::size_t workspace_bytes(const Problem& problem, const detail::Shape& shape, const Config& config) {
  // Slack for aligning the caller's pointer, the sequence order, one slice per thread.
  return kAlignBytes + order_bytes(problem, shape) + static_cast<std::size_t>(config.threads) * slice_bytes(shape);
}

void run(const Problem& problem, const detail::Shape& shape, const Config& config,
         const Tensors& tensors, void* workspace) {
  detail::check_cu_seqlens_host(problem, shape, tensors.cu_seqlens);
  const std::int64_t items = shape.N * shape.H;
  // Nothing to compute or write (the threads alone would cost ~100 us).
  if (items == 0 || (shape.T == 0 && !problem.want_final_state)) return;

  auto base = reinterpret_cast<std::uintptr_t>(workspace);
  base = (base + kAlignBytes - 1) / kAlignBytes * kAlignBytes;
  auto* order = problem.has_cu_seqlens ? reinterpret_cast<std::int64_t*>(base) : nullptr;
  auto* slices = reinterpret_cast<unsigned char*>(base + order_bytes(problem, shape));
  const std::size_t slice = slice_bytes(shape);

  // Longest sequences first, so a long one does not start last and leave the other threads idle
  // (equal lengths without cu_seqlens: in index order).
  if (order != nullptr) {
    for (std::int64_t n = 0; n < shape.N; ++n) order[n] = n;
    auto len = [&](std::int64_t n) {
      const detail::SeqRange r = detail::host_seq_range(problem, shape, tensors.cu_seqlens, n);
      return r.end - r.begin;
    };
    // std::sort (unlike stable_sort) never allocates; ties keep index order for determinism.
    std::sort(order, order + shape.N, [&](std::int64_t a, std::int64_t b) {
      const std::int64_t la = len(a), lb = len(b);
      return la != lb ? la > lb : a < b;
    });
  }

#if GDNKIT_CPU_AVX2
  const GemmFn product = config.simd == Simd::avx512 ? gemm_avx512 : config.simd == Simd::avx2 ? gemm_avx2 : gemm;
#else
  const GemmFn product = gemm;
#endif
  const Context ctx{problem, shape, tensors, make_layout(shape), product};
  std::atomic<std::int64_t> next{0};
  auto worker = [&](int tid) {
    const FlushSubnormals flush;  // restores the caller's mode when worker(0) returns
    float* ws = reinterpret_cast<float*>(slices + static_cast<std::size_t>(tid) * slice);
    for (;;) {
      const std::int64_t i = next.fetch_add(1, std::memory_order_relaxed);
      if (i >= items) break;
      const std::int64_t n = i / shape.H;
      run_item(ctx, order != nullptr ? order[n] : n, static_cast<int>(i % shape.H), ws);
    }
  };

  const int threads = static_cast<int>(std::min<std::int64_t>(config.threads, items));
  std::vector<std::thread> pool;
  if (threads > 1) {
    try {
      pool.reserve(static_cast<std::size_t>(threads - 1));
      for (int tid = 1; tid < threads; ++tid) pool.emplace_back(worker, tid);
    } catch (const std::exception&) {
      // Could not start every thread: the ones running (and this one) take all the items.
    }
  }
  worker(0);
  for (std::thread& th : pool) th.join();
}

}  // namespace gdnkit::cpu
