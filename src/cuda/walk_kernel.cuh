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
// memory. The roundings are the ones of the earlier WMMA walk: S, X, Vn and Vd to 16 bits as
// operands, everything else fp32. Ot is transposed back in registers (movmatrix) and stored.
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
  static constexpr std::size_t off_k = 0;
  static constexpr std::size_t off_q = off_k + align128(k_bytes);
  static constexpr std::size_t off_mt = off_q + align128(k_bytes);
  static constexpr std::size_t off_mtlo = off_mt + kLowerBytes;
  static constexpr std::size_t off_p = off_mtlo + kLowerBytes;
  static constexpr std::size_t off_v = off_p + kLowerBytes;
  static constexpr std::size_t off_g = off_v + align128(v_bytes);
  static constexpr std::size_t stage = off_g + align128(std::size_t(C) * 4);
  static constexpr std::size_t total = 2 * stage;
  static_assert(DK % 16 == 0, "key tiles are 16 wide");
};

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
  const int g = lane / 4, t = lane % 4;
  const int h = blockIdx.y;
  const int v0 = blockIdx.x * DVB;  // the CTA's first value column
  const int cw = 16 * warp;         // the warp's first column within the CTA's block
  // ldmatrix row addresses: lane provides row (lane % 8) of matrix m = lane / 8. Pattern "rows":
  // matrices (r, c), (r, c + 8), (r + 8, c), (r + 8, c + 8); pattern "cols": (r, c), (r + 8, c),
  // (r, c + 8), (r + 8, c + 8).
  const int rows_r = (lane & 7) + 8 * (lane >> 4), rows_c = 8 * ((lane >> 3) & 1);
  const int cols_r = (lane & 7) + 8 * ((lane >> 3) & 1), cols_c = 8 * (lane >> 4);

  const T* const qh = static_cast<const T*>(p.q) + static_cast<std::int64_t>(h / p.q_group) * p.q_head;
  const T* const kh = static_cast<const T*>(p.k) + static_cast<std::int64_t>(h / p.k_group) * p.k_head;
  const T* const vh = static_cast<const T*>(p.v) + static_cast<std::int64_t>(h / p.v_group) * p.v_head + v0;
  T* const oh = static_cast<T*>(p.o) + static_cast<std::int64_t>(h) * p.o_head + v0 + cw;

  // Issues the copies of one chunk (rows [c0, c0 + nrows) of sequence n) into stage s.
  auto load_chunk = [&](int s, std::int64_t n, std::int64_t bos, std::int64_t c0, int nrows) {
    unsigned char* const base = smem + s * L::stage;
    const int nb = (nrows + 15) / 16;
    const unsigned char* const rec =
        p.ws + ((first_slot(bos, n) + (c0 - bos) / C) * p.num_heads + h) * kRecBytes;
    load_rows_async_n<NT, T, DK, LDK>(reinterpret_cast<T*>(base + L::off_k), kh + c0 * p.k_token, p.k_token, nrows,
                                      nb * 16, tid);
    load_rows_async_n<NT, T, DK, LDK>(reinterpret_cast<T*>(base + L::off_q), qh + c0 * p.q_token, p.q_token, nrows,
                                      nb * 16, tid);
    load_rows_async_n<NT, T, DVB, LDV>(reinterpret_cast<T*>(base + L::off_v), vh + c0 * p.v_token, p.v_token, nrows,
                                       nb * 16, tid);
    load_lower_async<NT>(reinterpret_cast<T*>(base + L::off_mt), reinterpret_cast<const T*>(rec + kRecMtOff), nb, tid);
    load_lower_async<NT>(reinterpret_cast<T*>(base + L::off_mtlo), reinterpret_cast<const T*>(rec + kRecMtLoOff), nb,
                         tid);
    load_lower_async<NT>(reinterpret_cast<T*>(base + L::off_p), reinterpret_cast<const T*>(rec + kRecPOff), nb, tid);
    for (int i = tid; i < C / 4; i += NT)
      __pipeline_memcpy_async(base + L::off_g + 16 * i, rec + kRecGOff + 16 * i, 16);
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
      // Laundered copies: the final-state store below must recompute its offsets rather than keep
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
      const int nb = (nrows + 15) / 16;
      __pipeline_wait_prior(0);
      __syncthreads();  // this chunk's stage landed; every warp is done with the other stage
      if (c0 + C < eos)
        load_chunk(stage ^ 1, n, bos, c0 + C, static_cast<int>(eos - c0 - C < C ? eos - c0 - C : C));
      else
        prefetch_from(n + gridDim.z, stage ^ 1);
      __pipeline_commit();

      const unsigned char* const base = smem + stage * L::stage;
      const T* const Ks = reinterpret_cast<const T*>(base + L::off_k);
      const T* const Qs = reinterpret_cast<const T*>(base + L::off_q);
      const T* const Mh = reinterpret_cast<const T*>(base + L::off_mt);
      const T* const Ml = reinterpret_cast<const T*>(base + L::off_mtlo);
      const T* const Ps = reinterpret_cast<const T*>(base + L::off_p);
      const T* const Vs = reinterpret_cast<const T*>(base + L::off_v);
      const float* const Gs = reinterpret_cast<const float*>(base + L::off_g);
      const float G_last = Gs[nrows - 1];

      // KSt = St K^T and QSt = St Q^T; tile i covers chunk rows [8 i, 8 i + 8).
      float ks[8][4], qs[8][4];
#pragma unroll
      for (int i = 0; i < 8; ++i)
#pragma unroll
        for (int e = 0; e < 4; ++e) ks[i][e] = qs[i][e] = 0.0f;
      if (!zero_state) {
#pragma unroll
        for (int kk = 0; kk < DK / 16; ++kk) {
          std::uint32_t a[4];
          to_a_frag<T>(a, st[2 * kk], st[2 * kk + 1]);
#pragma unroll
          for (int rb = 0; rb < 4; ++rb) {
            if (rb < nb) {
              std::uint32_t b[4];
              ldsm_x4(b, Ks + (16 * rb + rows_r) * LDK + 16 * kk + rows_c);
              mma16816<T>(ks[2 * rb], a, b[0], b[1]);
              mma16816<T>(ks[2 * rb + 1], a, b[2], b[3]);
              ldsm_x4(b, Qs + (16 * rb + rows_r) * LDK + 16 * kk + rows_c);
              mma16816<T>(qs[2 * rb], a, b[0], b[1]);
              mma16816<T>(qs[2 * rb + 1], a, b[2], b[3]);
            }
          }
        }
      }

      // Xt = Vt - KSt diag(gam), as A fragments (xa[rb]: chunk rows [16 rb, 16 rb + 16)).
      std::uint32_t xa[4][4];
#pragma unroll
      for (int rb = 0; rb < 4; ++rb) {
        if (rb < nb) {
          std::uint32_t vv[4];  // Vt in the C layout of tiles 2 rb (vv[0], vv[1]) and 2 rb + 1 (vv[2], vv[3])
          ldsm_x4_trans(vv, Vs + (16 * rb + rows_r) * LDV + cw + rows_c);
          float x[2][4];
#pragma unroll
          for (int half = 0; half < 2; ++half) {
            const int i = 2 * rb + half;
            const float2 G2 = *reinterpret_cast<const float2*>(Gs + 8 * i + 2 * t);
            const float gam0 = __expf(G2.x), gam1 = __expf(G2.y);
            const float2 va = unpack2<T>(vv[2 * half]), vb = unpack2<T>(vv[2 * half + 1]);
            x[half][0] = va.x - gam0 * ks[i][0];
            x[half][1] = va.y - gam1 * ks[i][1];
            x[half][2] = vb.x - gam0 * ks[i][2];
            x[half][3] = vb.y - gam1 * ks[i][3];
          }
          to_a_frag<T>(xa[rb], x[0], x[1]);
        }
      }

      // Vnt = Xt Mt^T = Xt Mt_lo^T + Xt Mt_hi^T (Mt lower block triangular).
      float vn[8][4];
#pragma unroll
      for (int i = 0; i < 8; ++i)
#pragma unroll
        for (int e = 0; e < 4; ++e) vn[i][e] = 0.0f;
#pragma unroll
      for (int bi = 0; bi < 4; ++bi) {
        if (bi < nb) {
          const int row_off = lower_block_off(bi) + rows_r * lower_block_ld(bi) + rows_c;
#pragma unroll
          for (int bj = 0; bj <= bi; ++bj) {
            std::uint32_t lo[4], hi[4];
            ldsm_x4(lo, Ml + row_off + 16 * bj);
            ldsm_x4(hi, Mh + row_off + 16 * bj);
            mma16816<T>(vn[2 * bi], xa[bj], lo[0], lo[1]);
            mma16816<T>(vn[2 * bi + 1], xa[bj], lo[2], lo[3]);
            mma16816<T>(vn[2 * bi], xa[bj], hi[0], hi[1]);
            mma16816<T>(vn[2 * bi + 1], xa[bj], hi[2], hi[3]);
          }
        }
      }

      // Ot = QSt diag(scale gam) + Vnt P^T, stored row by row (movmatrix back to [token][column]).
      std::uint32_t na[4][4], da[4][4];  // Vnt and Vnt diag(exp(G_last - G)) as A fragments
#pragma unroll
      for (int rb = 0; rb < 4; ++rb) {
        if (rb < nb) {
          float d[2][4];
#pragma unroll
          for (int half = 0; half < 2; ++half) {
            const int i = 2 * rb + half;
            const float2 G2 = *reinterpret_cast<const float2*>(Gs + 8 * i + 2 * t);
            const float s0 = p.scale * __expf(G2.x), s1 = p.scale * __expf(G2.y);
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
      }
#pragma unroll
      for (int bi = 0; bi < 4; ++bi) {
        if (bi < nb) {
          const int row_off = lower_block_off(bi) + rows_r * lower_block_ld(bi) + rows_c;
#pragma unroll
          for (int bj = 0; bj <= bi; ++bj) {
            std::uint32_t b[4];
            ldsm_x4(b, Ps + row_off + 16 * bj);
            mma16816<T>(qs[2 * bi], na[bj], b[0], b[1]);
            mma16816<T>(qs[2 * bi + 1], na[bj], b[2], b[3]);
          }
        }
      }
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        if (i < 2 * nb) {
          // Tile i is Ot[c][r] for r in [8 i, 8 i + 8): transposed, lane holds O[8 i + g][2t, 2t+1]
          // (first word: columns cw + 2t, second: cw + 8 + 2t).
          const std::uint32_t o0 = movmatrix_trans(pack2<T>(qs[i][0], qs[i][1]));
          const std::uint32_t o1 = movmatrix_trans(pack2<T>(qs[i][2], qs[i][3]));
          const int r = 8 * i + g;
          if (r < nrows) {
            T* const orow = oh + (c0 + r) * p.o_token + 2 * t;
            *reinterpret_cast<std::uint32_t*>(orow) = o0;
            *reinterpret_cast<std::uint32_t*>(orow + 8) = o1;
          }
        }
      }

      // St' = gam_last St + (Vnt diag(exp(G_last - G))) K; B = K from ldmatrix.trans of K rows.
      const float gam_last = __expf(G_last);
#pragma unroll
      for (int j = 0; j < NKT; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) st[j][e] *= gam_last;
#pragma unroll
      for (int rb = 0; rb < 4; ++rb) {
        if (rb < nb) {
#pragma unroll
          for (int dd = 0; dd < DK / 16; ++dd) {
            std::uint32_t b[4];
            ldsm_x4_trans(b, Ks + (16 * rb + cols_r) * LDK + 16 * dd + cols_c);
            mma16816<T>(st[2 * dd], da[rb], b[0], b[1]);
            mma16816<T>(st[2 * dd + 1], da[rb], b[2], b[3]);
          }
        }
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
