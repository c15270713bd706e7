// The state walk of the CUDA path: chunk after chunk, only the products that need the state S
// (dk x dv, fp32), from the prep kernel's records (Mt, P, G; prep_kernel.cuh):
//
//   X  = V - diag(gam) K S                        gam_i = exp(G_i)
//   Vn = Mt X                                     (Mt as hi + lo: two products, one accumulator)
//   O  = scale diag(gam) Q S + P Vn
//   S' = gam_last S + K^T diag(exp(G_last - G)) Vn
//
// Value columns never mix: column c of O and of S' needs only column c of V and of S. So each warp
// owns 16 value columns and runs the whole chunk step for them alone, in registers, with no
// exchange between warps. It keeps the transposed state St = S^T (16 x dk, fp32) as mma.sync
// accumulators and works transposed throughout:
//
//   KSt = St K^T, QSt = St Q^T        A = St (16 x dk), B = K^T, Q^T      (ldmatrix of K, Q rows)
//   Xt  = Vt - KSt diag(gam)                                              (ldmatrix.trans of V)
//   Vnt = Xt Mt^T                      A = Xt,  B = Mt^T                   (ldmatrix of Mt rows)
//   Ot  = QSt diag(scale gam) + Vnt P^T                                   (ldmatrix of P rows)
//   St' = gam_last St + Vnt diag(exp(G_last - G)) K                       (ldmatrix.trans of K)
//
// Each product's fp32 accumulators, rounded in pairs to the qkv dtype, are the next product's A
// fragments (mma_sm80.cuh), so nothing but the staged inputs and the output goes through shared
// memory. The roundings are those of the earlier WMMA walk (docs/perf-notes.md): S, X, Vn and Vd
// to 16 bits as operands, everything else fp32. Ot is transposed back in registers (movmatrix).
//
// A CTA of WARPS warps covers DVB = 16 WARPS value columns of one head and shares the staging of
// K, Q, V, the record and G: two stages, the next chunk's copies (cp.async) in flight while the
// current one is computed, one CTA barrier per chunk. blockIdx.z strides over sequences, and the
// pipeline runs across sequence boundaries too (short sequences overlap their loads).
// Only the 16-row blocks that hold valid rows are touched (nb = ceil(nrows / 16)); rows in
// [nrows, 16 nb) are zero in K, Q, V, Mt and P, so they stay zero through every product.
#pragma once

#include <cstdint>
#include <type_traits>

#include "cuda/chunk_io.cuh"
#include "cuda/mma_sm80.cuh"
#include "cuda/wmma_common.cuh"

namespace gdnkit::cuda {

template <int DK, int WARPS>
struct WalkLayout {
  static constexpr int C = kChunk;
  static constexpr int DVB = 16 * WARPS;
  static constexpr int LDK = DK + 8;   // +16 bytes per row: ldmatrix rows in distinct bank groups
  static constexpr int LDV = DVB + 8;
  static constexpr std::size_t k_bytes = std::size_t(C) * LDK * 2;
  static constexpr std::size_t v_bytes = std::size_t(C) * LDV * 2;
  // Per stage: K, Q, V and a copy of the chunk's workspace record (Mt hi, Mt lo, P, G at the
  // record's own offsets, so that a full chunk's record is one contiguous copy).
  static constexpr std::size_t off_k = 0;
  static constexpr std::size_t off_q = off_k + align128(k_bytes);
  static constexpr std::size_t off_v = off_q + align128(k_bytes);
  static constexpr std::size_t off_rec = off_v + align128(v_bytes);
  static constexpr std::size_t stage = off_rec + kRecBytes;
  static constexpr std::size_t total = 2 * stage;
  static_assert(DK % 16 == 0, "key tiles are 16 wide");
  static_assert(kRecBytes % 128 == 0, "stages stay 128-byte aligned");
};

// Copies a full chunk's [64 x COLS] 16-bit tile (row stride `stride` elements) into shared memory
// (ld LD) with 16-byte cp.async: NT is a multiple of the vectors per row, so each thread keeps one
// column and steps over rows by a constant.
template <int NT, typename T, int COLS, int LD>
__device__ __forceinline__ void load_tile_full(T* dst, const T* src, std::int64_t stride, int tid) {
  constexpr int PER_ROW = COLS / 8;
  constexpr int STEP = NT / PER_ROW;
  static_assert(NT % PER_ROW == 0 && kChunk % STEP == 0, "whole rows per pass");
  const int row = tid / PER_ROW, col = (tid % PER_ROW) * 8;
  const T* s = src + row * stride + col;
  T* d = dst + row * LD + col;
#pragma unroll
  for (int i = 0; i < kChunk / STEP; ++i) {
    __pipeline_memcpy_async(d, s, 16);
    d += STEP * LD;
    s += STEP * stride;
  }
}

// Two floats from the two 16-bit halves of a 32-bit word (the lower half first).
template <typename T>
__device__ __forceinline__ float2 unpack2(std::uint32_t x) {
  const std::uint16_t lo = static_cast<std::uint16_t>(x & 0xffffu), hi = static_cast<std::uint16_t>(x >> 16);
  if constexpr (std::is_same_v<T, __nv_bfloat16>)
    return make_float2(__bfloat162float(__ushort_as_bfloat16(lo)), __bfloat162float(__ushort_as_bfloat16(hi)));
  else
    return make_float2(__half2float(__ushort_as_half(lo)), __half2float(__ushort_as_half(hi)));
}

// A fragment of the 16 x 16 block formed by C tiles lo (columns 0..7) and hi (8..15).
template <typename T>
__device__ __forceinline__ void to_a_frag(std::uint32_t (&a)[4], const float (&lo)[4], const float (&hi)[4]) {
  a[0] = pack2<T>(lo[0], lo[1]);
  a[1] = pack2<T>(lo[2], lo[3]);
  a[2] = pack2<T>(hi[0], hi[1]);
  a[3] = pack2<T>(hi[2], hi[3]);
}

// One warp's view of a stage and its lane constants (see gdn_walk_kernel).
template <typename T>
struct WalkStage {
  const T* K;   // [64][LDK]
  const T* Q;   // [64][LDK]
  const T* V;   // [64][LDV], the CTA's DVB columns
  const T* Mh;  // Mt hi, lower-block layout
  const T* Ml;  // Mt lo
  const T* P;
  const float* G;
};
struct WalkLane {
  int g, t;             // lane = 4 g + t
  int cw;               // the warp's first column within the CTA's block
  int rows_r, rows_c;   // ldmatrix row address offsets, "rows" pattern
  int cols_r, cols_c;   // "cols" pattern
};

// One chunk step for one warp's 16 value columns, the chunk holding NB 16-row blocks (rows past
// nrows are zero). Updates st in place and stores rows [0, nrows) of O at orow0 (row 0 of the
// chunk, this warp's first column).
template <typename T, int DK, int LDK, int LDV, int NB>
__device__ __forceinline__ void walk_chunk(float (&st)[DK / 8][4], const WalkStage<T>& S, const WalkLane& l,
                                           bool zero_state, int nrows, float scale, T* orow0,
                                           std::int64_t o_token) {
  const int t = l.t;
  const float G_last = S.G[nrows - 1];

  // KSt = St K^T and QSt = St Q^T; tile i covers chunk rows [8 i, 8 i + 8).
  float ks[2 * NB][4], qs[2 * NB][4];
#pragma unroll
  for (int i = 0; i < 2 * NB; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) ks[i][e] = qs[i][e] = 0.0f;
  if (!zero_state) {
#pragma unroll
    for (int kk = 0; kk < DK / 16; ++kk) {
      std::uint32_t a[4];
      to_a_frag<T>(a, st[2 * kk], st[2 * kk + 1]);
#pragma unroll
      for (int rb = 0; rb < NB; ++rb) {
        std::uint32_t b[4];
        ldsm_x4(b, S.K + (16 * rb + l.rows_r) * LDK + 16 * kk + l.rows_c);
        mma16816<T>(ks[2 * rb], a, b[0], b[1]);
        mma16816<T>(ks[2 * rb + 1], a, b[2], b[3]);
        ldsm_x4(b, S.Q + (16 * rb + l.rows_r) * LDK + 16 * kk + l.rows_c);
        mma16816<T>(qs[2 * rb], a, b[0], b[1]);
        mma16816<T>(qs[2 * rb + 1], a, b[2], b[3]);
      }
    }
  }

  // Xt = Vt - KSt diag(gam), as A fragments (xa[rb]: chunk rows [16 rb, 16 rb + 16)).
  std::uint32_t xa[NB][4];
#pragma unroll
  for (int rb = 0; rb < NB; ++rb) {
    std::uint32_t vv[4];  // Vt in the C layout of tiles 2 rb (vv[0], vv[1]) and 2 rb + 1 (vv[2], vv[3])
    ldsm_x4_trans(vv, S.V + (16 * rb + l.rows_r) * LDV + l.cw + l.rows_c);
    float x[2][4];
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int i = 2 * rb + half;
      const float2 G2 = *reinterpret_cast<const float2*>(S.G + 8 * i + 2 * t);
      const float gam0 = __expf(G2.x), gam1 = __expf(G2.y);
      const float2 va = unpack2<T>(vv[2 * half]), vb = unpack2<T>(vv[2 * half + 1]);
      x[half][0] = va.x - gam0 * ks[i][0];
      x[half][1] = va.y - gam1 * ks[i][1];
      x[half][2] = vb.x - gam0 * ks[i][2];
      x[half][3] = vb.y - gam1 * ks[i][3];
    }
    to_a_frag<T>(xa[rb], x[0], x[1]);
  }

  // Vnt = Xt Mt^T = Xt Mt_lo^T + Xt Mt_hi^T (Mt lower block triangular).
  float vn[2 * NB][4];
#pragma unroll
  for (int i = 0; i < 2 * NB; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) vn[i][e] = 0.0f;
#pragma unroll
  for (int bi = 0; bi < NB; ++bi) {
    const int row_off = lower_block_off(bi) + l.rows_r * lower_block_ld(bi) + l.rows_c;
#pragma unroll
    for (int bj = 0; bj <= bi; ++bj) {
      std::uint32_t lo[4], hi[4];
      ldsm_x4(lo, S.Ml + row_off + 16 * bj);
      ldsm_x4(hi, S.Mh + row_off + 16 * bj);
      mma16816<T>(vn[2 * bi], xa[bj], lo[0], lo[1]);
      mma16816<T>(vn[2 * bi + 1], xa[bj], lo[2], lo[3]);
      mma16816<T>(vn[2 * bi], xa[bj], hi[0], hi[1]);
      mma16816<T>(vn[2 * bi + 1], xa[bj], hi[2], hi[3]);
    }
  }

  // Ot = QSt diag(scale gam) + Vnt P^T; Vnt and Vnt diag(exp(G_last - G)) as A fragments.
  std::uint32_t na[NB][4], da[NB][4];
#pragma unroll
  for (int rb = 0; rb < NB; ++rb) {
    float d[2][4];
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int i = 2 * rb + half;
      const float2 G2 = *reinterpret_cast<const float2*>(S.G + 8 * i + 2 * t);
      const float s0 = scale * __expf(G2.x), s1 = scale * __expf(G2.y);
      qs[i][0] *= s0;
      qs[i][1] *= s1;
      qs[i][2] *= s0;
      qs[i][3] *= s1;
      const float e0 = __expf(G_last - G2.x), e1 = __expf(G_last - G2.y);
      d[half][0] = vn[i][0] * e0;
      d[half][1] = vn[i][1] * e1;
      d[half][2] = vn[i][2] * e0;
      d[half][3] = vn[i][3] * e1;
    }
    to_a_frag<T>(na[rb], vn[2 * rb], vn[2 * rb + 1]);
    to_a_frag<T>(da[rb], d[0], d[1]);
  }
#pragma unroll
  for (int bi = 0; bi < NB; ++bi) {
    const int row_off = lower_block_off(bi) + l.rows_r * lower_block_ld(bi) + l.rows_c;
#pragma unroll
    for (int bj = 0; bj <= bi; ++bj) {
      std::uint32_t b[4];
      ldsm_x4(b, S.P + row_off + 16 * bj);
      mma16816<T>(qs[2 * bi], na[bj], b[0], b[1]);
      mma16816<T>(qs[2 * bi + 1], na[bj], b[2], b[3]);
    }
  }
  // Tile i is Ot[c][r] for r in [8 i, 8 i + 8); transposed, the lane holds O[8 i + g][2t, 2t+1]
  // (first word: columns cw + 2t, second: cw + 8 + 2t).
#pragma unroll
  for (int i = 0; i < 2 * NB; ++i) {
    const std::uint32_t o0 = movmatrix_trans(pack2<T>(qs[i][0], qs[i][1]));
    const std::uint32_t o1 = movmatrix_trans(pack2<T>(qs[i][2], qs[i][3]));
    const int r = 8 * i + l.g;
    if (r < nrows) {
      T* const orow = orow0 + r * o_token + 2 * t;
      *reinterpret_cast<std::uint32_t*>(orow) = o0;
      *reinterpret_cast<std::uint32_t*>(orow + 8) = o1;
    }
  }

  // St' = gam_last St + (Vnt diag(exp(G_last - G))) K; B = K from ldmatrix.trans of K rows.
  const float gam_last = __expf(G_last);
#pragma unroll
  for (int j = 0; j < DK / 8; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) st[j][e] *= gam_last;
#pragma unroll
  for (int rb = 0; rb < NB; ++rb) {
#pragma unroll
    for (int dd = 0; dd < DK / 16; ++dd) {
      std::uint32_t b[4];
      ldsm_x4_trans(b, S.K + (16 * rb + l.cols_r) * LDK + 16 * dd + l.cols_c);
      mma16816<T>(st[2 * dd], da[rb], b[0], b[1]);
      mma16816<T>(st[2 * dd + 1], da[rb], b[2], b[3]);
    }
  }
}

// grid = (dv / DVB, H, min(N, 65535) or fewer); 32 WARPS threads.
template <typename T, int DK, int WARPS>
__global__ void __launch_bounds__(32 * WARPS, 1) gdn_walk_kernel(const ChunkedParams p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  __trap();
#else
  using L = WalkLayout<DK, WARPS>;
  constexpr int C = kChunk;
  constexpr int NT = 32 * WARPS;
  constexpr int LDK = L::LDK, LDV = L::LDV, DVB = L::DVB;
  constexpr int NKT = DK / 8;  // 8-column key tiles of St

  extern __shared__ __align__(128) unsigned char smem[];

  const int tid = threadIdx.x;
  const int warp = tid / 32, lane = tid % 32;
  const int h = blockIdx.y;
  const int v0 = blockIdx.x * DVB;  // the CTA's first value column
  // ldmatrix row addresses: lane provides row (lane % 8) of matrix m = lane / 8. Pattern "rows":
  // matrices (r, c), (r, c + 8), (r + 8, c), (r + 8, c + 8); pattern "cols": (r, c), (r + 8, c),
  // (r, c + 8), (r + 8, c + 8).
  WalkLane l;
  l.g = lane / 4;
  l.t = lane % 4;
  l.cw = 16 * warp;
  l.rows_r = (lane & 7) + 8 * (lane >> 4);
  l.rows_c = 8 * ((lane >> 3) & 1);
  l.cols_r = (lane & 7) + 8 * ((lane >> 3) & 1);
  l.cols_c = 8 * (lane >> 4);
  const int g = l.g, t = l.t, cw = l.cw;

  const T* const qh = static_cast<const T*>(p.q) + static_cast<std::int64_t>(h / p.q_group) * p.q_head;
  const T* const kh = static_cast<const T*>(p.k) + static_cast<std::int64_t>(h / p.k_group) * p.k_head;
  const T* const vh = static_cast<const T*>(p.v) + static_cast<std::int64_t>(h / p.v_group) * p.v_head + v0;
  T* const oh = static_cast<T*>(p.o) + static_cast<std::int64_t>(h) * p.o_head + v0 + cw;

  // Issues the copies of one chunk (rows [c0, c0 + nrows) of sequence n) into stage s. A tail
  // chunk copies only its nb = ceil(nrows / 16) row blocks and zero-fills K, Q, V rows [nrows, 16 nb).
  auto load_chunk = [&](int s, std::int64_t n, std::int64_t bos, std::int64_t c0, int nrows) {
    unsigned char* const base = smem + s * L::stage;
    T* const Kd = reinterpret_cast<T*>(base + L::off_k);
    T* const Qd = reinterpret_cast<T*>(base + L::off_q);
    T* const Vd = reinterpret_cast<T*>(base + L::off_v);
    unsigned char* const Rd = base + L::off_rec;
    const unsigned char* const rec =
        p.ws + ((first_slot(bos, n) + (c0 - bos) / C) * p.num_heads + h) * kRecBytes;
    if (nrows == C) {
      load_tile_full<NT, T, DK, LDK>(Kd, kh + c0 * p.k_token, p.k_token, tid);
      load_tile_full<NT, T, DK, LDK>(Qd, qh + c0 * p.q_token, p.q_token, tid);
      load_tile_full<NT, T, DVB, LDV>(Vd, vh + c0 * p.v_token, p.v_token, tid);
      for (int i = tid; i < static_cast<int>(kRecBytes / 16); i += NT)
        __pipeline_memcpy_async(Rd + 16 * i, rec + 16 * i, 16);
    } else {
      const int nb = (nrows + 15) / 16;
      load_rows_async_n<NT, T, DK, LDK>(Kd, kh + c0 * p.k_token, p.k_token, nrows, nb * 16, tid);
      load_rows_async_n<NT, T, DK, LDK>(Qd, qh + c0 * p.q_token, p.q_token, nrows, nb * 16, tid);
      load_rows_async_n<NT, T, DVB, LDV>(Vd, vh + c0 * p.v_token, p.v_token, nrows, nb * 16, tid);
      load_lower_async<NT>(reinterpret_cast<T*>(Rd + kRecMtOff), reinterpret_cast<const T*>(rec + kRecMtOff), nb, tid);
      load_lower_async<NT>(reinterpret_cast<T*>(Rd + kRecMtLoOff), reinterpret_cast<const T*>(rec + kRecMtLoOff), nb,
                           tid);
      load_lower_async<NT>(reinterpret_cast<T*>(Rd + kRecPOff), reinterpret_cast<const T*>(rec + kRecPOff), nb, tid);
      for (int i = tid; i < C / 4; i += NT) __pipeline_memcpy_async(Rd + kRecGOff + 16 * i, rec + kRecGOff + 16 * i, 16);
    }
  };
  // First chunk of the first non-empty sequence among n, n + gridDim.z, ...: issues its copies.
  auto prefetch_from = [&](std::int64_t n, int s) {
    for (; n < p.num_seqs; n += gridDim.z) {
      const std::int64_t bos = seq_begin(p, n), eos = seq_begin(p, n + 1);
      if (eos > bos) {
        load_chunk(s, n, bos, bos, static_cast<int>(eos - bos < C ? eos - bos : C));
        return;
      }
    }
  };

  int stage = 0;
  prefetch_from(blockIdx.z, 0);
  __pipeline_commit();

  float st[NKT][4];  // St tiles: st[j] holds columns [8 j, 8 j + 8) of St = S^T
  for (std::int64_t n = blockIdx.z; n < p.num_seqs; n += gridDim.z) {
    const std::int64_t bos = seq_begin(p, n), eos = seq_begin(p, n + 1);
    // St[c][d] = S[d][c]. Element (c, d) of the state sits at c * cs + d * ds: (cs, ds) = (1, dv) in
    // the [dk, dv] layout, (dk, 1) in [dv, dk]. This lane's St elements are columns col, col + 8
    // (col = v0 + cw + g) and keys 8 j + 2t, 8 j + 2t + 1.
    const std::int64_t state_lane = (n * p.num_heads + h) * static_cast<std::int64_t>(DK) * p.dv +
                                    (p.state_vk ? static_cast<std::int64_t>(v0 + cw + g) * DK + 2 * t
                                                : static_cast<std::int64_t>(2 * t) * p.dv + v0 + cw + g);
    {
      // Opaque copies: the final-state store below recomputes its offsets rather than keeping
      // these live (in registers) across the whole walk.
      const std::int64_t base = opaque(state_lane);
      const int cs = opaque(p.state_vk ? DK : 1), ds = opaque(p.state_vk ? 1 : p.dv);
#pragma unroll
      for (int j = 0; j < NKT; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e)
          st[j][e] = p.has_initial_state ? p.initial_state[base + 8 * (e / 2) * cs + (8 * j + e % 2) * ds] : 0.0f;
    }
    // Without an initial state the state is exactly zero until the first update: that chunk skips
    // K S and Q S (same result bit for bit).
    bool zero_state = !p.has_initial_state;

    for (std::int64_t c0 = bos; c0 < eos; c0 += C) {
      const int nrows = static_cast<int>(eos - c0 < C ? eos - c0 : C);
      __pipeline_wait_prior(0);
      __syncthreads();  // this chunk's stage landed; every warp is done with the other stage
      if (c0 + C < eos)
        load_chunk(stage ^ 1, n, bos, c0 + C, static_cast<int>(eos - c0 - C < C ? eos - c0 - C : C));
      else
        prefetch_from(n + gridDim.z, stage ^ 1);
      __pipeline_commit();

      const unsigned char* const base = smem + stage * L::stage;
      WalkStage<T> S;
      S.K = reinterpret_cast<const T*>(base + L::off_k);
      S.Q = reinterpret_cast<const T*>(base + L::off_q);
      S.V = reinterpret_cast<const T*>(base + L::off_v);
      S.Mh = reinterpret_cast<const T*>(base + L::off_rec + kRecMtOff);
      S.Ml = reinterpret_cast<const T*>(base + L::off_rec + kRecMtLoOff);
      S.P = reinterpret_cast<const T*>(base + L::off_rec + kRecPOff);
      S.G = reinterpret_cast<const float*>(base + L::off_rec + kRecGOff);
      T* const orow0 = oh + c0 * p.o_token;
      // One instantiation per row-block count: full chunks run branch-free straight-line code.
      switch ((nrows + 15) / 16) {
        case 4: walk_chunk<T, DK, LDK, LDV, 4>(st, S, l, zero_state, nrows, p.scale, orow0, p.o_token); break;
        case 3: walk_chunk<T, DK, LDK, LDV, 3>(st, S, l, zero_state, nrows, p.scale, orow0, p.o_token); break;
        case 2: walk_chunk<T, DK, LDK, LDV, 2>(st, S, l, zero_state, nrows, p.scale, orow0, p.o_token); break;
        default: walk_chunk<T, DK, LDK, LDV, 1>(st, S, l, zero_state, nrows, p.scale, orow0, p.o_token); break;
      }
      zero_state = false;
      stage ^= 1;
    }

    if (p.want_final_state) {
      const std::int64_t base = opaque(state_lane);
      const int cs = opaque(p.state_vk ? DK : 1), ds = opaque(p.state_vk ? 1 : p.dv);
#pragma unroll
      for (int j = 0; j < NKT; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) p.final_state[base + 8 * (e / 2) * cs + (8 * j + e % 2) * ds] = st[j][e];
    }
  }
#endif
}

}  // namespace gdnkit::cuda
