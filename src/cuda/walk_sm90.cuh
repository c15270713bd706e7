// The walk's products on wgmma (sm_90a): the staging policy WgmmaWalk for gdn_walk_kernel
// (walk_kernel.cuh). A warpgroup (4 warps, 64 value columns) issues each product once, its A
// operand from registers as in the mma.sync walk (St, Xt, Vnt, Vd rounded in pairs), its B operand
// read once from shared memory through a descriptor, instead of once per warp through ldmatrix.
//
// Per stage, in 128-byte-swizzled tiles (wgmma_sm90.cuh): K and Q [64 x dk] (dk / 64 column
// blocks of 8 KB), Mt hi, Mt lo and P as full [64 x 64] (8 KB each, copied chunk by chunk from the
// record's lower-block layout; their upper-triangle chunks are zeroed once per CTA and never
// written again), V padded [64][DVB + 8] for ldmatrix.trans, gam and dec.
//
//   KSt += St K^T      m64 n(16 NB) k16 x dk/16, B = K   K-major
//   QSt += St Q^T      same with Q
//   Vnt += Xt Mt^T     m64 n(16 NB) k16 x NB x 2 (lo, then hi), B = Mt K-major; in a full chunk
//                      m64n32k16 x 6 x 2 (lower_products: Mt's upper triangle skipped); with
//                      kBlockSolve (the fused kernel) by block substitution instead, m64n16k16 and
//                      m64n32k16 in three waits (block_solve)
//   Ot  += Vnt P^T     m64 n(16 NB) k16 x NB, B = P K-major; in a full chunk m64n32k16 x 6
//   St  += Vdt K       m64 n(dk) k16 x NB, B = K MN-major (the same bytes as for K S)
//
// Three waits per step: K S with Q S, then Vn, then P Vn and Vd K as two commit groups, with O
// stored once P Vn retires while Vd K still runs. The block solve (kBlockSolve) waits three times
// for Vn; with one state warpgroup it keeps Q S in flight while Xt is formed, retired with Vn's
// first products (kQsLate). The zero-state path then takes the products too (zeros): else ptxas
// serialises every wgmma (C7515). With the whole Mt the same measured within the noise, while the
// aux set the step (docs/perf-notes.md, "The walk's copies").
//
// wgmma reads shared memory through the async proxy. The zero fills (the upper triangles in
// prepare, the rows past a tail chunk's end in load) are ordinary stores, so the threads that
// write them fence them to the async proxy (gmma_smem_fence) before the CTA barrier that publishes
// the stage. cp.async copies need no such fence (CUTLASS's cp.async + GMMA mainloops have none
// either); fencing every stage cost 1.8% on fixed-b2-t4096 (docs/perf-notes.md, 61c1023).
#pragma once

// A measurement aid (results are wrong with it): GDNKIT_WALK_PROBE_OUT skips the step's output side,
// bit 0 Q S, bit 1 P Vn, bit 2 the O stores (walk_kernel.cuh), to bound what it costs the step. With
// bit 2 ptxas also drops Q S and P Vn, whose results then feed nothing (docs/perf-notes.md). Bit 3
// skips K S, to bound what a K S formed a step ahead could take off the step ("K S a step ahead").
#ifndef GDNKIT_WALK_PROBE_OUT
#define GDNKIT_WALK_PROBE_OUT 0
#endif
// GDNKIT_WALK_QS_LATE 1 (default): in the block-solve walk of one state warpgroup (the fused
// 64-column kernels), Q S in a commit group of its own after K S, retired by the block solve's
// first wait, so that Xt is formed while Q S runs; 0: one group and one wait for both; 2: also
// with two state warpgroups (there, at dk = 128, ptxas serialises every wgmma for want of
// registers, C7512). Against the block solve alone on an H100: the fixed-b1 pairs 1-3% faster
// from 4,096 tokens on, level at 1,024 (docs/perf-notes.md, "Every 64-column kernel by block
// substitution").
#ifndef GDNKIT_WALK_QS_LATE
#define GDNKIT_WALK_QS_LATE 1
#endif

#include "cuda/walk_kernel.cuh"
#include "cuda/wgmma_sm90.cuh"

namespace gdnkit::cuda {

// Copies rows [0, nrows) of a chunk's K and Q ([64 x DK] 16-bit, token strides k_token, q_token)
// into 128-byte-swizzled tiles (dk / 64 column blocks of 64 rows x 128 bytes) with 16-byte
// cp.async, NT threads; rows [nrows, zero_to) are zero-filled with ordinary stores (the caller
// fences them to the async proxy before wgmma reads them). Thread tid keeps the 16-byte chunk
// tid % (DK / 8) of every (NT / (DK / 8))-th row.
template <int NT, typename T, int DK>
__device__ __forceinline__ void load_kq_swizzled(unsigned char* kd, unsigned char* qd, const T* k, std::int64_t k_token,
                                                 const T* q, std::int64_t q_token, int nrows, int zero_to, int tid) {
  constexpr int CPR = DK / 8;  // 16-byte chunks per row
  constexpr int STEP = NT / CPR;
  static_assert(NT % CPR == 0 && kChunk % STEP == 0, "whole rows per pass");
  const int c = tid % CPR, r0 = tid / CPR;
  const std::uint32_t col_off = static_cast<std::uint32_t>(c / 8) * (kChunk * 128);
#pragma unroll
  for (int i = 0; i < kChunk / STEP; ++i) {
    const int r = r0 + i * STEP;
    if (r >= zero_to) break;
    const std::uint32_t off = col_off + swizzle128(r, c % 8);
    if (r < nrows) {
      __pipeline_memcpy_async(kd + off, k + r * k_token + 8 * c, 16);
      __pipeline_memcpy_async(qd + off, q + r * q_token + 8 * c, 16);
    } else {
      *reinterpret_cast<uint4*>(kd + off) = make_uint4(0u, 0u, 0u, 0u);
      *reinterpret_cast<uint4*>(qd + off) = make_uint4(0u, 0u, 0u, 0u);
    }
  }
}

// kBlockSolve_ (the fused kernel's): the record's Mt holds only its two 32 x 32 diagonal blocks,
// and below them -C = -(K K^T) .* D (D_ij = exp(G_i - G_j)), so kq_vn solves Vn by block
// substitution instead of one product with the whole Mt (block_solve).
template <typename T_, int DK_, int WG, bool kBlockSolve_ = false>
struct WgmmaWalk {
  using T = T_;
  static constexpr int DK = DK_;
  static constexpr bool kBlockSolve = kBlockSolve_;
  static constexpr bool kQsLate = kBlockSolve_ && (GDNKIT_WALK_QS_LATE == 2 || (GDNKIT_WALK_QS_LATE == 1 && WG == 1));
  static constexpr bool kSm90a = true;
  static constexpr bool kVSwizzled = false;  // V as padded [64][LDV] rows (cp.async)
  static constexpr int kThreads = 128 * WG;
  static constexpr int DVB = 64 * WG;
  static constexpr int LDV = DVB + 8;
  static constexpr std::size_t k_bytes = std::size_t(kChunk) * DK * 2;  // dk / 64 blocks of 64 x 128 bytes
  static constexpr std::size_t m_bytes = std::size_t(kChunk) * 128;     // one block
  static constexpr std::size_t v_bytes = std::size_t(kChunk) * LDV * 2;
  static constexpr std::size_t off_k = 0;
  static constexpr std::size_t off_q = off_k + k_bytes;
  static constexpr std::size_t off_mh = off_q + k_bytes;
  static constexpr std::size_t off_ml = off_mh + m_bytes;
  static constexpr std::size_t off_p = off_ml + m_bytes;
  static constexpr std::size_t off_v = off_p + m_bytes;
  static constexpr std::size_t off_g = off_v + align128(v_bytes);
  static constexpr std::size_t stage_bytes = (off_g + kChunk * 8 + kSwizzleAtomBytes - 1) / kSwizzleAtomBytes * kSwizzleAtomBytes;
  static constexpr std::size_t align = kSwizzleAtomBytes;                // stages start 1024-byte aligned
  static constexpr std::size_t smem_bytes = 2 * stage_bytes + align;     // + slack to align the base
  static_assert(DK % 64 == 0, "dk is whole 64-column swizzle blocks");

  // Zeroes the upper-triangle chunks of Mt hi, Mt lo and P in both stages (the copies never write
  // them): row i of block row b holds chunks [0, 2 b + 2) of 8.
  __device__ static void prepare(unsigned char* smem, int tid) {
    for (int idx = tid; idx < 2 * 3 * kChunk * 8; idx += kThreads) {
      const int c = idx % 8, i = (idx / 8) % kChunk, m = (idx / (8 * kChunk)) % 3, s = idx / (3 * 8 * kChunk);
      if (c >= 2 * (i / 16) + 2)
        *reinterpret_cast<uint4*>(smem + s * stage_bytes + off_mh + m * m_bytes + swizzle128(i, c)) =
            make_uint4(0u, 0u, 0u, 0u);
    }
    gmma_smem_fence();
  }

  __device__ static void load(unsigned char* stage, const T* k, std::int64_t k_token, const T* q,
                              std::int64_t q_token, const T* v, std::int64_t v_token, const unsigned char* rec,
                              int nrows, int tid) {
    const int nb = (nrows + 15) / 16;
    load_kq_swizzled<kThreads, T, DK>(stage + off_k, stage + off_q, k, k_token, q, q_token, nrows, 16 * nb, tid);
    T* const Vd = reinterpret_cast<T*>(stage + off_v);
    if (nrows == kChunk)
      load_tile_full<kThreads, T, DVB, LDV>(Vd, v, v_token, tid);
    else
      load_rows_async_n<kThreads, T, DVB, LDV>(Vd, v, v_token, nrows, nb * 16, tid);
    // Mt hi, Mt lo, P: the lower-block rows of the record, chunk by chunk into the swizzled tiles.
#pragma unroll
    for (int b = 0; b < kChunkBlocks; ++b) {
      if (b < nb) {
        constexpr int kMats = 3;
        const int cpr = 2 * b + 2;  // chunks per row in block row b
        for (int idx = tid; idx < kMats * 16 * cpr; idx += kThreads) {
          const int c = idx % cpr, r = (idx / cpr) % 16, m = idx / (16 * cpr);
          const std::size_t src_off = (m == 0 ? kRecMtOff : m == 1 ? kRecMtLoOff : kRecPOff) +
                                      2 * static_cast<std::size_t>(lower_block_off(b) + r * lower_block_ld(b) + 8 * c);
          __pipeline_memcpy_async(stage + off_mh + m * m_bytes + swizzle128(16 * b + r, c), rec + src_off, 16);
        }
      }
    }
    for (int i = tid; i < kChunk / 2; i += kThreads)  // gam and dec
      __pipeline_memcpy_async(stage + off_g + 16 * i, rec + kRecGamOff + 16 * i, 16);
    if (nrows < kChunk) gmma_smem_fence();  // the zero-filled rows
  }

  __device__ static WalkStage<T> stage(const unsigned char* base) {
    return {base, base + off_k, base + off_mh, reinterpret_cast<const T*>(base + off_v),
            reinterpret_cast<const float*>(base + off_g), base + off_p};
  }

  template <int N>
  __device__ static float (&flat(float (&x)[N / 4][4]))[N] {
    return *reinterpret_cast<float (*)[N]>(&x);
  }

  // acc (+)= A_bj B for the k-steps bj < NB of a product whose B (Mt or P, K-major at desc) is lower
  // triangular: B[j][i] = 0 for token j > i. In a full chunk (NB = 4) the output columns (tokens)
  // are two n32 halves: the left half [0, 32) takes k-steps 0 and 1 only, the right half all four,
  // six m64n32k16 products (96 tensor cycles) instead of four m64n64k16 (128). Each half is one
  // register range (16 per 32 columns in wgmma's layout) that only n32 products touch: wgmma
  // orders accumulator accesses by default only between products of one shape. B of the right
  // half starts 32 rows (4 KB, whole swizzle atoms) into the tile. Tail chunks keep full products.
  template <int NB>
  __device__ static void lower_products(float (&acc)[8 * NB], const std::uint32_t (&a)[NB][4], std::uint64_t desc) {
    if constexpr (NB == 4) {
      float (&left)[16] = *reinterpret_cast<float (*)[16]>(&acc[0]);
      float (&right)[16] = *reinterpret_cast<float (*)[16]>(&acc[16]);
#pragma unroll
      for (int bj = 0; bj < 4; ++bj) {
        if (bj < 2) gmma_rs<T, 32, false>(left, a[bj], gmma_desc_add(desc, 32 * bj), true);
        gmma_rs<T, 32, false>(right, a[bj], gmma_desc_add(desc, 32 * 128 + 32 * bj), true);
      }
    } else {
#pragma unroll
      for (int bj = 0; bj < NB; ++bj) gmma_rs<T, 16 * NB, false>(acc, a[bj], gmma_desc_add(desc, 32 * bj), true);
    }
  }

  // Vnt = Xt Mt^T by block substitution over the chunk's halves h = 0 (tokens 0-31) and 1 (32-63),
  // with Mt's diagonal blocks Mt_hh and C = (K K^T) .* D, strict lower (docs/math.md, "The
  // chunked form"): since
  // Vn = (I + diag(beta) C)^-1 diag(beta) X,
  //   Vn_0 = Mt_00 X_0,   Z_1 = X_1 - C_10 Vn_0,   Vn_1 = Mt_11 Z_1.
  // The record's tiles hold Mt_00, Mt_11 and, in Mt_10's place, -C_10 (hi + lo each). Xt's first
  // half comes rounded (xa) as for the whole Mt; Z_1 accumulates onto the fp32 Xt of the second
  // half (xz, from make_x) and goes into Mt_11 as hi + lo, so it is no less accurate than the
  // whole Mt applied to the rounded Xt (Vn_0 enters C_10 rounded once, as Vn enters P Vn). Three
  // product waits instead of one; each 16-token block of output its own n16 accumulator (the
  // right 16 of a half take both of its k-steps, the left only the first).
  template <int NB, class AfterFirstWait>
  __device__ static void block_solve(float (&vf)[8 * NB], float (&xz)[8 * NB], std::uint32_t (&xa)[NB][4],
                                     std::uint64_t dm, AfterFirstWait&& after_first_wait) {
    constexpr int N0 = NB < 2 ? NB : 2;  // blocks of the first half
    auto acc16 = [&](int b) -> float (&)[8] { return *reinterpret_cast<float (*)[8]>(&vf[8 * b]); };
    // Each accumulator's first product overwrites it (no zeroed registers held across the rounds).
    float (&v0)[8 * N0] = *reinterpret_cast<float (*)[8 * N0]>(&vf[0]);
    fence_all(xa);
    gmma_fence(v0);
    gmma_arrive();
#pragma unroll
    for (int b = 0; b < N0; ++b)
#pragma unroll
      for (int bj = 0; bj <= b; ++bj) {
        gmma_rs<T, 16, false>(acc16(b), xa[bj], gmma_desc_add(dm, m_bytes + 16 * 128 * b + 32 * bj), bj > 0);
        gmma_rs<T, 16, false>(acc16(b), xa[bj], gmma_desc_add(dm, 16 * 128 * b + 32 * bj), true);
      }
    gmma_commit();
    gmma_wait<0>();
    gmma_fence(v0);
    fence_all(xa);
    after_first_wait();
    if constexpr (NB > 2) {
      constexpr int N1 = NB - 2;  // blocks of the second half
      float (&z)[8 * N1] = *reinterpret_cast<float (*)[8 * N1]>(&xz[16]);
      std::uint32_t va[2][4];
#pragma unroll
      for (int bj = 0; bj < 2; ++bj)
        to_a_frag<T>(va[bj], *reinterpret_cast<const float (*)[4]>(&vf[8 * bj]),
                     *reinterpret_cast<const float (*)[4]>(&vf[8 * bj + 4]));
      fence_all(va);
      gmma_fence(z);
      gmma_arrive();
#pragma unroll
      for (int bj = 0; bj < 2; ++bj) {  // Z_1 += Vn_0 (-C_10)^T, rows 32.. of the tiles
        gmma_rs<T, 16 * N1, false>(z, va[bj], gmma_desc_add(dm, 32 * 128 + 32 * bj), true);
        gmma_rs<T, 16 * N1, false>(z, va[bj], gmma_desc_add(dm, m_bytes + 32 * 128 + 32 * bj), true);
      }
      gmma_commit();
      gmma_wait<0>();
      gmma_fence(z);
      fence_all(va);
      std::uint32_t zh[N1][4], zl[N1][4];
#pragma unroll
      for (int k = 0; k < N1; ++k) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const float x0 = z[8 * k + (e / 2) * 4 + 2 * (e % 2)], x1 = z[8 * k + (e / 2) * 4 + 2 * (e % 2) + 1];
          zh[k][e] = pack2<T>(x0, x1);
          const float2 h = unpack2<T>(zh[k][e]);
          zl[k][e] = pack2<T>(x0 - h.x, x1 - h.y);
        }
      }
      float (&v1)[8 * N1] = *reinterpret_cast<float (*)[8 * N1]>(&vf[16]);
      fence_all(zh);
      fence_all(zl);
      gmma_fence(v1);
      gmma_arrive();
#pragma unroll
      for (int b = 2; b < NB; ++b)
#pragma unroll
        for (int bj = 2; bj <= b; ++bj) {
          const std::uint64_t d = gmma_desc_add(dm, 16 * 128 * b + 32 * bj);
          gmma_rs<T, 16, false>(acc16(b), zl[bj - 2], d, bj > 2);
          gmma_rs<T, 16, false>(acc16(b), zh[bj - 2], gmma_desc_add(d, m_bytes), true);
          gmma_rs<T, 16, false>(acc16(b), zh[bj - 2], d, true);
        }
      gmma_commit();
      gmma_wait<0>();
      gmma_fence(v1);
      fence_all(zh);
      fence_all(zl);
    }
  }

  template <int N>
  __device__ static void fence_all(std::uint32_t (&a)[N][4]) {
#pragma unroll
    for (int i = 0; i < N; ++i) gmma_fence(a[i]);
  }

  // K S and Q S in one commit group, then Xt (make_x) and Xt Mt^T. wgmma reads its A registers
  // (St rounded, then Xt) until its group retires, so they live in this frame until its wait.
  // `aside` runs while K S and Q S are in flight (first, on a zero state).
  template <int NB, class MakeX, class Aside>
  __device__ static void kq_vn(float (&ks)[2 * NB][4], float (&qs)[2 * NB][4], float (&vn)[2 * NB][4],
                               const float (&st)[DK / 8][4], bool zero_state, MakeX&& make_x, Aside&& aside,
                               const WalkStage<T>& S, const WalkLane&) {
    float (&kf)[8 * NB] = flat<8 * NB>(ks);
    float (&qf)[8 * NB] = flat<8 * NB>(qs);
    float (&vf)[8 * NB] = flat<8 * NB>(vn);
    std::uint32_t sa[DK / 16][4];
    // With kQsLate a zero state takes the products too (zeros), so that no path defines Q S's
    // registers outside wgmma while its group may be open (ptxas would serialise every wgmma, C7515).
    if (kQsLate || !zero_state) {
      const std::uint64_t dk = gmma_desc(S.kq, 16, 1024);
#pragma unroll
      for (int kk = 0; kk < DK / 16; ++kk) to_a_frag<T>(sa[kk], st[2 * kk], st[2 * kk + 1]);
      fence_all(sa);
      gmma_fence(kf);
      gmma_fence(qf);
      gmma_arrive();
#if !(GDNKIT_WALK_PROBE_OUT & 8)
#pragma unroll
      for (int kk = 0; kk < DK / 16; ++kk)
        gmma_rs<T, 16 * NB, false>(kf, sa[kk], gmma_desc_add(dk, gmma_kstep(kk, kChunk)), true);
#endif
      if constexpr (kQsLate) gmma_commit();  // K S alone: Xt waits for it only
#if !(GDNKIT_WALK_PROBE_OUT & 1)
#pragma unroll
      for (int kk = 0; kk < DK / 16; ++kk)
        gmma_rs<T, 16 * NB, false>(qf, sa[kk], gmma_desc_add(dk, k_bytes + gmma_kstep(kk, kChunk)), true);
#endif
      gmma_commit();
      GDNKIT_STEP_MARK(3);
      aside();
      GDNKIT_STEP_MARK(4);
      if constexpr (kQsLate) {
        gmma_wait<1>();  // K S; Q S (and the St fragments it reads) stay in flight through Xt
        GDNKIT_STEP_MARK(5);
        gmma_fence(kf);
      } else {
        gmma_wait<0>();
        GDNKIT_STEP_MARK(5);
        gmma_fence(kf);
        gmma_fence(qf);
        fence_all(sa);
      }
    } else {
      aside();
    }
    std::uint32_t xa[NB][4];
    make_x(xa);
    GDNKIT_STEP_MARK(6);
    if constexpr (kBlockSolve) {
      block_solve<NB>(vf, kf, xa, gmma_desc(S.mt, 16, 1024), [&] {
        if constexpr (kQsLate) {  // Q S retired with the first products
          gmma_fence(qf);
          fence_all(sa);
        }
      });
      GDNKIT_STEP_MARK(8);
    } else {
#pragma unroll
      for (int i = 0; i < 8 * NB; ++i) vf[i] = 0.0f;
      const std::uint64_t dm = gmma_desc(S.mt, 16, 1024);
      fence_all(xa);
      gmma_fence(vf);
      gmma_arrive();
      lower_products<NB>(vf, xa, gmma_desc_add(dm, m_bytes));  // Mt lo, then hi
      lower_products<NB>(vf, xa, dm);
      gmma_commit();
      GDNKIT_STEP_MARK(7);
      gmma_wait<0>();
      GDNKIT_STEP_MARK(8);
      gmma_fence(vf);
      fence_all(xa);
    }
  }

  // P Vn into O, then Vd K into S', in two commit groups: the O store runs while the state
  // product is in flight.
  template <int NB, class StoreO, class Decay>
  __device__ static void out_state(float (&qs)[2 * NB][4], std::uint32_t (&na)[NB][4], float (&st)[DK / 8][4],
                                   std::uint32_t (&da)[NB][4], StoreO&& store_o, Decay&& decay_state,
                                   const WalkStage<T>& S, const WalkLane&) {
    float (&qf)[8 * NB] = flat<8 * NB>(qs);
    float (&sf)[4 * (DK / 8)] = flat<4 * (DK / 8)>(st);
    const std::uint64_t dp = gmma_desc(S.p, 16, 1024), ds = gmma_desc(S.kq, kChunk * 128, 1024);
    fence_all(na);
    gmma_fence(qf);
    gmma_arrive();
#if !(GDNKIT_WALK_PROBE_OUT & 2)
    lower_products<NB>(qf, na, dp);
#endif
    gmma_commit();
    GDNKIT_STEP_MARK(11);
    decay_state();
    fence_all(da);
    gmma_fence(sf);
    gmma_arrive();
#pragma unroll
    for (int rb = 0; rb < NB; ++rb)
      gmma_rs<T, DK, true>(sf, da[rb], gmma_desc_add(ds, rb * 16 * 128), true);
    gmma_commit();
    GDNKIT_STEP_MARK(12);
    gmma_wait<1>();
    GDNKIT_STEP_MARK(13);
    gmma_fence(qf);
    fence_all(na);
    store_o();
    GDNKIT_STEP_MARK(14);
    gmma_wait<0>();
    GDNKIT_STEP_MARK(15);
    gmma_fence(sf);
    fence_all(da);
  }
};

}  // namespace gdnkit::cuda
