// The short-chunk walk: the whole chunked form (docs/math.md) in one kernel, in chunks of 16 tokens,
// for batches of short sequences (decode-like prefills, a few speculative tokens per request). The
// split path runs a prep CTA and a walk CTA per (sequence, head), each staging 64-token tiles, and
// the fused kernel runs a full record per walk: either costs microseconds per walk whatever its
// length. Here one CTA does a 16-token chunk in a few steps with 13-25 KB of shared memory (two
// 8-warp CTAs per SM, by their 128 registers).
//
// A CTA of W warps covers 16 W value columns of one head: grid (dv / 16 W, H, min(N, 65535)),
// blockIdx.z strides over the sequences. Per chunk of n <= 16 rows (zero rows past the end):
//   1. every thread stages K, Q and V rows; warp 0 loads the gates and beta and forms G = cumsum(g),
//      gam = exp(G), dec = exp(G_last - G) (a CTA barrier publishes them);
//   2. warp 0 forms K K^T (mma.sync), A = strict_lower(diag(beta) K K^T), Tu = (I + A)^-1 in fp32
//      (8 x 8 diagonal blocks by forward substitution, a lane per column, then the block below) and
//      Mt = Gam .* Tu .* beta_j as hi + lo;
//      the last warp forms P = scale lower_incl(Q K^T) .* Gam (a second barrier publishes them);
//   3. every warp runs the state step for its 16 columns as the split walk does (walk_kernel.cuh:
//      transposed, St = S^T in registers, the same roundings):
//        KSt = St K^T, QSt = St Q^T   (skipped while the state is zero: no initial state)
//        Xt  = Vt - KSt diag(gam),  Vnt = Xt Mt^T,  Ot = QSt diag(scale gam) + Vnt P^T
//        St' = gam_last St + Vnt diag(dec) K   (skipped after a sequence's last chunk when no final
//                                               state is wanted)
// Correct for any length: a longer sequence walks more 16-token chunks, one after the other (on an
// H200 level with the split path at 32 tokens and slower beyond, so the planner takes this kernel
// only for short sequences; docs/perf-notes.md, "The short walk").
#pragma once

#include <cstdint>

#include "cuda/chunk_io.cuh"
#include "cuda/mma_sm80.cuh"
#include "cuda/prep_kernel.cuh"
#include "cuda/walk_kernel.cuh"
#include "cuda/wmma_common.cuh"

namespace gdnkit::cuda {

constexpr int kShortChunk = 16;  // tokens per chunk of the short walk

template <typename T_, int DK_, int W_>
struct ShortWalk {
  using T = T_;
  static constexpr int DK = DK_, W = W_;
  static constexpr int kThreads = 32 * W;
  static constexpr int R = kShortChunk;
  static constexpr int LDK = DK + 8;  // K, Q rows (16-bit): +16 bytes, ldmatrix rows in distinct bank groups
  static constexpr int LDM = R + 8;   // Mt hi, Mt lo, P rows (16-bit): the B-fragment reads are conflict-free
  static constexpr int LDA = R + 4;   // A (fp32)
  static constexpr int DVB = 16 * W;  // value columns per CTA
  static constexpr int LDV = DVB + 8; // V rows (16-bit)
  static constexpr std::size_t off_k = 0;
  static constexpr std::size_t off_q = off_k + std::size_t(R) * LDK * 2;
  static constexpr std::size_t off_mh = off_q + std::size_t(R) * LDK * 2;
  static constexpr std::size_t off_ml = off_mh + std::size_t(R) * LDM * 2;
  static constexpr std::size_t off_p = off_ml + std::size_t(R) * LDM * 2;
  static constexpr std::size_t off_v = off_p + std::size_t(R) * LDM * 2;
  static constexpr std::size_t off_a = off_v + std::size_t(R) * LDV * 2;
  static constexpr std::size_t off_g = off_a + std::size_t(R) * LDA * 4;  // G, gam, dec, beta: 16 fp32 each
  // Warp 0's St while it forms the record (so that its registers serve the inverse: 64 fewer live).
  static constexpr std::size_t off_st = off_g + 4 * R * 4;
  static constexpr std::size_t smem_bytes = off_st + std::size_t(DK / 8) * 4 * 32 * 4;
  static_assert(DK % 16 == 0 && off_q % 16 == 0 && off_mh % 16 == 0 && off_v % 16 == 0 && off_a % 16 == 0,
                "16-byte rows");
  static_assert(smem_bytes <= 48 * 1024, "static shared memory");
};

// One CTA of the short walk; gdn_short_kernel below is its entry point. smem: SW::smem_bytes,
// 16-byte aligned.
template <class SW>
__device__ __forceinline__ void short_walk_cta(const ChunkedParams& p, unsigned char* smem) {
  using T = typename SW::T;
  constexpr int DK = SW::DK, R = SW::R, LDK = SW::LDK, LDM = SW::LDM, LDA = SW::LDA;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  const int h = blockIdx.y;
  const int col0 = (blockIdx.x * SW::W + warp) * 16;  // the warp's first value column
  // ldmatrix row address of this lane: row (lane % 8) of matrix lane / 8, the matrices ordered
  // (rows 0-7, cols 0-7), (8-15, 0-7), (0-7, 8-15), (8-15, 8-15): an A fragment, or with .trans the
  // B fragments of two 8-column tiles.
  const int ld_r = (lane & 7) + 8 * ((lane >> 3) & 1), ld_c = 8 * (lane >> 4);

  T* const Ks = reinterpret_cast<T*>(smem + SW::off_k);
  T* const Qs = reinterpret_cast<T*>(smem + SW::off_q);
  T* const Mh = reinterpret_cast<T*>(smem + SW::off_mh);
  T* const Ml = reinterpret_cast<T*>(smem + SW::off_ml);
  T* const Ps = reinterpret_cast<T*>(smem + SW::off_p);
  T* const Vs = reinterpret_cast<T*>(smem + SW::off_v);
  float* const As = reinterpret_cast<float*>(smem + SW::off_a);
  float* const Gs = reinterpret_cast<float*>(smem + SW::off_g);
  float* const gam = Gs + R;
  float* const dec = Gs + 2 * R;
  float* const bs = Gs + 3 * R;

  const T* const qh = static_cast<const T*>(p.q) + static_cast<std::int64_t>(h / p.q_group) * p.q_head;
  const T* const kh = static_cast<const T*>(p.k) + static_cast<std::int64_t>(h / p.k_group) * p.k_head;
  const T* const vh =
      static_cast<const T*>(p.v) + static_cast<std::int64_t>(h / p.v_group) * p.v_head + blockIdx.x * SW::DVB;
  T* const oh = static_cast<T*>(p.o) + static_cast<std::int64_t>(h) * p.o_head + col0;
  const int pw = SW::W - 1;  // the warp that forms P

  // The B fragment (tokens 8 nt .. + 7 as columns, keys 16 kk .. + 15) of X^T for X = K or Q rows.
  auto b_rows = [&](const T* X, int nt, int kk, std::uint32_t& b0, std::uint32_t& b1) {
    const T* const r = X + (8 * nt + g) * LDK + 16 * kk + 2 * t;
    b0 = *reinterpret_cast<const std::uint32_t*>(r);
    b1 = *reinterpret_cast<const std::uint32_t*>(r + 8);
  };
  // The B fragment of M^T (M: 16 x 16 rows of LDM, M^T's columns 8 nt .. + 7).
  auto b_mat = [&](const T* M, int nt, std::uint32_t& b0, std::uint32_t& b1) {
    const T* const r = M + (8 * nt + g) * LDM + 2 * t;
    b0 = *reinterpret_cast<const std::uint32_t*>(r);
    b1 = *reinterpret_cast<const std::uint32_t*>(r + 8);
  };
  // acc[nt] = X Y^T over the keys, rows of X and Y staged (K K^T, Q K^T).
  auto gram = [&](float (&acc)[2][4], const T* X, const T* Y) {
#pragma unroll
    for (int nt = 0; nt < 2; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[nt][e] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < DK / 16; ++kk) {
      std::uint32_t a[4];
      ldsm_x4(a, X + ld_r * LDK + 16 * kk + ld_c);
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) {
        std::uint32_t b0, b1;
        b_rows(Y, nt, kk, b0, b1);
        mma16816<T>(acc[nt], a, b0, b1);
      }
    }
  };

  // f(i, j, x) for each element x = X[i][j] of a 16 x 16 product held as two C tiles.
  auto each = [&](const float (&acc)[2][4], auto&& f) {
#pragma unroll
    for (int nt = 0; nt < 2; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) f(g + 8 * (e / 2), 8 * nt + 2 * t + e % 2, acc[nt][e]);
  };

  for (std::int64_t n = blockIdx.z; n < p.num_seqs; n += gridDim.z) {
    std::int64_t bos, eos;
    seq_range(p, n, bos, eos);
    const std::int64_t state_lane = lane_state_offset<DK>(p, n, h, col0 + g, t);
    float st[DK / 8][4];  // St tiles: st[j] holds keys [8 j, 8 j + 8) of the warp's 16 columns
    // (A branch, not load_state_tiles' per-element select: ptxas predicates those loads, and
    // without a state their issue and addresses were about a third of the kernel's instructions.)
    if (p.has_initial_state) {
      load_state_tiles<DK>(st, p, p.initial_state, state_lane);
    } else {
#pragma unroll
      for (int j = 0; j < DK / 8; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) st[j][e] = 0.0f;
    }
    bool zero_state = !p.has_initial_state;

    for (std::int64_t c0 = bos; c0 < eos; c0 += R) {
      const int nrows = static_cast<int>(eos - c0 < R ? eos - c0 : R);
      // Warp 0: the gate (lanes 0-15) or beta (lanes 16-31) of row lane % 16, as loaded: converted
      // after the staging loads are issued, so that the two loads' latencies overlap (converted
      // here, every warp waited at the barrier below for the gates' load first).
      const int gb_idx = lane < R ? lane : kChunk + lane - R;
      std::uint32_t gb_bits = 0u;
      if (warp == 0) gb_bits = load_gate_beta_bits(p, c0, nrows, h, gb_idx);

      __syncthreads();  // every warp is done with the previous chunk's staging
      // (Indices from an opaque tid: hoisted out of the walk, the addresses had spilled.) Rows [0,
      // nrows) of K and Q, and of the CTA's V columns (one 16-byte piece per thread); zeros past
      // the end. The V load and the first K, Q loads are issued before any store: with the stores
      // between them, the V loads had waited for the K and Q loads' data.
      {
        constexpr int kKQ = R * (DK / 8), kKQIt = (kKQ + SW::kThreads - 1) / SW::kThreads;
        static_assert(R * (SW::DVB / 8) == SW::kThreads, "one V piece per thread");
        const int base = opaque(tid);
        const int vc = base % (SW::DVB / 8), vr = base / (SW::DVB / 8);
        uint4 xv = make_uint4(0u, 0u, 0u, 0u);
        if (vr < nrows) xv = *reinterpret_cast<const uint4*>(vh + (c0 + vr) * p.v_token + 8 * vc);
        constexpr int kGroup = kKQIt < 2 ? kKQIt : 2;  // pieces in flight per thread (registers)
#pragma unroll
        for (int it0 = 0; it0 < kKQIt; it0 += kGroup) {
          uint4 xk[kGroup], xq[kGroup];
#pragma unroll
          for (int u = 0; u < kGroup; ++u) {
            const int idx = base + (it0 + u) * SW::kThreads, c = idx % (DK / 8), r = idx / (DK / 8);
            xk[u] = xq[u] = make_uint4(0u, 0u, 0u, 0u);
            if (r < nrows && idx < kKQ) {
              xk[u] = *reinterpret_cast<const uint4*>(kh + (c0 + r) * p.k_token + 8 * c);
              xq[u] = *reinterpret_cast<const uint4*>(qh + (c0 + r) * p.q_token + 8 * c);
            }
          }
#pragma unroll
          for (int u = 0; u < kGroup; ++u) {
            const int idx = base + (it0 + u) * SW::kThreads, c = idx % (DK / 8), r = idx / (DK / 8);
            if (idx < kKQ) {
              *reinterpret_cast<uint4*>(Ks + r * LDK + 8 * c) = xk[u];
              *reinterpret_cast<uint4*>(Qs + r * LDK + 8 * c) = xq[u];
            }
          }
        }
        *reinterpret_cast<uint4*>(Vs + vr * SW::LDV + 8 * vc) = xv;
      }
      if (warp == 0) {
        // G over lanes 0-15 (rows past the end have gate 0, so G repeats G_last there).
        const float gb = gate_beta_value(p, gb_bits, gb_idx);
        float G = gb;
#pragma unroll
        for (int off = 1; off < R; off *= 2) {
          const float up = __shfl_up_sync(0xffffffffu, G, off);
          if (lane < R && lane >= off) G += up;
        }
        const float glast = __shfl_sync(0xffffffffu, G, R - 1);
        if (lane < R) {
          Gs[lane] = G;
          gam[lane] = fast_exp(G);
          dec[lane] = fast_exp(glast - G);
        } else {
          bs[lane - R] = gb;
        }
      }
      __syncthreads();  // K, Q, G, gam, dec, beta

      if (warp == 0) {
        // St to shared memory and back around the record: its registers are free meanwhile
        // (ptxas had kept all of them live through the substitution and spilled).
        float* const sv = reinterpret_cast<float*>(smem + SW::off_st) + lane;
        if (!zero_state)
#pragma unroll
          for (int j = 0; j < DK / 8; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) sv[(4 * j + e) * 32] = st[j][e];
        float kk[2][4];
        gram(kk, Ks, Ks);
        each(kk, [&](int i, int j, float v) { As[i * LDA + j] = j < i ? bs[i] * v : 0.0f; });
        __syncwarp();
        // Tu = [T11 0; T21 T22] in 8 x 8 blocks, fp32: lanes 0-7 solve column `lane` of T11 and
        // lanes 8-15 column lane - 8 of T22 by forward substitution (two chains of 28 FMAs at once,
        // where the whole 16 x 16 one was a chain of 120); T22 goes to A22's place, then lanes 0-7
        // form T21 = -T22 (A21 T11). Rows at or past nrows are zero in A (zero K rows), so their
        // column entries are those of I and are not computed.
        const int jj = lane & 7, r0 = lane & 8;
        float x[8], z[8];
        if (lane < R) {
#pragma unroll
          for (int i = 0; i < 8; ++i) {
            float s = 0.0f;
            if (r0 + i < nrows) {
              const float* const arow = As + (r0 + i) * LDA + r0;
#pragma unroll
              for (int m4 = 0; m4 < i; m4 += 4) {  // the row's first i entries as 16-byte loads
                const float4 a = *reinterpret_cast<const float4*>(arow + m4);
                const float av[4] = {a.x, a.y, a.z, a.w};
#pragma unroll
                for (int m = m4; m < m4 + 4 && m < i; ++m) s += av[m - m4] * x[m];
              }
            }
            x[i] = (i == jj ? 1.0f : 0.0f) - s;
          }
        }
        __syncwarp();  // A22 read
        if (lane >= 8 && lane < R)
#pragma unroll
          for (int i = 0; i < 8; ++i) As[(8 + i) * LDA + lane] = x[i];
        __syncwarp();  // T22 written
#pragma unroll
        for (int r = 0; r < 8; ++r) z[r] = 0.0f;
        if (lane < 8 && nrows > 8) {
          float y[8];  // A21 T11[:, jj]
#pragma unroll
          for (int r = 0; r < 8; ++r) {
            const float4 a0 = *reinterpret_cast<const float4*>(As + (8 + r) * LDA);
            const float4 a1 = *reinterpret_cast<const float4*>(As + (8 + r) * LDA + 4);
            y[r] = a0.x * x[0] + a0.y * x[1] + a0.z * x[2] + a0.w * x[3] + a1.x * x[4] + a1.y * x[5] +
                   a1.z * x[6] + a1.w * x[7];
          }
#pragma unroll
          for (int r = 0; r < 8; ++r) {  // -T22 y (T22 lower triangular: its upper entries are stored zeros)
            const float4 t0 = *reinterpret_cast<const float4*>(As + (8 + r) * LDA + 8);
            const float4 t1 = *reinterpret_cast<const float4*>(As + (8 + r) * LDA + 12);
            z[r] = -(t0.x * y[0] + t0.y * y[1] + t0.z * y[2] + t0.w * y[3] + t1.x * y[4] + t1.y * y[5] +
                     t1.z * y[6] + t1.w * y[7]);
          }
        }
        if (lane < R) {  // column `lane` of Mt = D .* Tu diag(beta) as hi + lo; zero rows past nrows
          const int j = lane;
          const float gj = Gs[j], bj = bs[j];
#pragma unroll
          for (int i = 0; i < R; ++i) {
            const float tu = i < 8 ? (lane < 8 ? x[i] : 0.0f) : (lane < 8 ? z[i - 8] : x[i - 8]);
            const float mt = i >= j && i < nrows ? tu * fast_exp(Gs[i] - gj) * bj : 0.0f;
            const T hi = from_f32<T>(mt);
            Mh[i * LDM + j] = hi;
            Ml[i * LDM + j] = from_f32<T>(mt - to_f32<T>(hi));
          }
        }
        __syncwarp();
#pragma unroll
        for (int j = 0; j < DK / 8; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e) st[j][e] = zero_state ? 0.0f : sv[(4 * j + e) * 32];
      }
      if (warp == pw) {
        float qk[2][4];
        gram(qk, Qs, Ks);
        each(qk, [&](int i, int j, float v) {
          Ps[i * LDM + j] = from_f32<T>(j <= i ? p.scale * v * fast_exp(Gs[i] - Gs[j]) : 0.0f);
        });
      }
      __syncthreads();  // Mt, P

      // The state step of the warp's 16 columns.
      float ks[2][4], qs[2][4];
      if (!zero_state) {
#pragma unroll
        for (int nt = 0; nt < 2; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) ks[nt][e] = qs[nt][e] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < DK / 16; ++kk) {
          std::uint32_t sa[4];
          to_a_frag<T>(sa, st[2 * kk], st[2 * kk + 1]);
#pragma unroll
          for (int nt = 0; nt < 2; ++nt) {
            std::uint32_t b0, b1;
            b_rows(Ks, nt, kk, b0, b1);
            mma16816<T>(ks[nt], sa, b0, b1);
            b_rows(Qs, nt, kk, b0, b1);
            mma16816<T>(qs[nt], sa, b0, b1);
          }
        }
      }
      // Xt = Vt - KSt diag(gam), Vt's C tiles (value columns g, g + 8; tokens 8 nt + 2t, + 1) read
      // here (from an opaque offset: read earlier, they had spilled across K S and Q S).
      const T* const vl = Vs + opaque(2 * t * SW::LDV + 16 * warp + g);
      float xt[2][4];
#pragma unroll
      for (int nt = 0; nt < 2; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const float vt = to_f32<T>(vl[(8 * nt + e % 2) * SW::LDV + 8 * (e / 2)]);
          xt[nt][e] = zero_state ? vt : vt - ks[nt][e] * gam[8 * nt + 2 * t + e % 2];
        }
      std::uint32_t xa[4];
      to_a_frag<T>(xa, xt[0], xt[1]);
      float vn[2][4];
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) vn[nt][e] = 0.0f;
        std::uint32_t b0, b1;
        b_mat(Ml, nt, b0, b1);
        mma16816<T>(vn[nt], xa, b0, b1);
        b_mat(Mh, nt, b0, b1);
        mma16816<T>(vn[nt], xa, b0, b1);
      }
      std::uint32_t na[4];
      to_a_frag<T>(na, vn[0], vn[1]);
      float ot[2][4];
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e)
          ot[nt][e] = zero_state ? 0.0f : p.scale * gam[8 * nt + 2 * t + e % 2] * qs[nt][e];
        std::uint32_t b0, b1;
        b_mat(Ps, nt, b0, b1);
        mma16816<T>(ot[nt], na, b0, b1);
      }
      // Ot's 8 x 8 quarters transposed in registers: lane then holds token 8 nt + g, value columns
      // 8 hh + 2t, + 1 (one 4-byte store).
#pragma unroll
      for (int nt = 0; nt < 2; ++nt)
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
          const std::uint32_t y = movmatrix_trans(pack2<T>(ot[nt][2 * hh], ot[nt][2 * hh + 1]));
          if (8 * nt + g < nrows)
            *reinterpret_cast<std::uint32_t*>(oh + (c0 + 8 * nt + g) * p.o_token + 8 * hh + 2 * t) = y;
        }

      if (c0 + R < eos || p.want_final_state) {  // St' = gam_last St + Vnt diag(dec) K
        float vd[2][4];
#pragma unroll
        for (int nt = 0; nt < 2; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) vd[nt][e] = vn[nt][e] * dec[8 * nt + 2 * t + e % 2];
        std::uint32_t da[4];
        to_a_frag<T>(da, vd[0], vd[1]);
        const float gl = gam[R - 1];
#pragma unroll
        for (int kb = 0; kb < DK / 16; ++kb) {
          std::uint32_t b[4];  // K's keys 16 kb .. + 15 as two 8-column B fragments (tokens as k)
          ldsm_x4_trans(b, Ks + ld_r * LDK + 16 * kb + ld_c);
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            st[2 * kb][e] *= gl;
            st[2 * kb + 1][e] *= gl;
          }
          mma16816<T>(st[2 * kb], da, b[0], b[1]);
          mma16816<T>(st[2 * kb + 1], da, b[2], b[3]);
        }
      }
      zero_state = false;
    }

    if (p.want_final_state) store_state_tiles<DK>(st, p, state_lane);
  }
}

// grid = (dv / (16 W), H, min(N, 65535)); 32 W threads. Images below sm_80 hold only a trap.
template <class SW>
__global__ void __launch_bounds__(SW::kThreads, 512 / SW::kThreads) gdn_short_kernel(const ChunkedParams p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  __trap();
#else
  __shared__ __align__(128) unsigned char smem[SW::smem_bytes];
  short_walk_cta<SW>(p, smem);
#endif
}

}  // namespace gdnkit::cuda
