// The state walk of the CUDA path: chunk after chunk, only the products that need the state S
// (dk x dv, fp32), from the prep kernel's records (Mt, P, gam, dec; prep_kernel.cuh):
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
// A CTA covers DVB = 16 x warps value columns of one head and shares the staging of K, Q, V, the
// record: two stages, the next chunk's copies (cp.async) in flight while the current one is
// computed, one CTA barrier per chunk. blockIdx.z strides over sequences, and the pipeline runs
// across sequence boundaries too (short sequences overlap their loads). With
// ChunkedParams::longest_first the CTAs take the sequences longest first.
//
// The five products come from a staging policy: MmaSyncWalk (here; sm_80+: ldmatrix + mma.sync,
// every warp reading its B operands itself) or WgmmaWalk (walk_sm90.cuh; sm_90a: wgmma, one read
// of each B operand per warpgroup through 128-byte-swizzled shared memory), in two calls per step
// (kq_vn, out_state) so that an asynchronous policy can wait only where a result is needed. Both
// keep the same registers (St, KSt, QSt, Vnt: the accumulator layouts coincide), so the
// element-wise steps, the output store and the pipeline below are shared.
// Only the 16-row blocks that hold valid rows are touched (nb = ceil(nrows / 16)); rows in
// [nrows, 16 nb) are zero in K, Q, V, Mt and P, so they stay zero through every product.
#pragma once

#include <cstdint>
#include <type_traits>

#include "cuda/chunk_io.cuh"
#include "cuda/mma_sm80.cuh"
#include "cuda/wmma_common.cuh"

namespace gdnkit::cuda {

// A fragment of the 16 x 16 block formed by C tiles lo (columns 0..7) and hi (8..15).
template <typename T>
__device__ __forceinline__ void to_a_frag(std::uint32_t (&a)[4], const float (&lo)[4], const float (&hi)[4]) {
  a[0] = pack2<T>(lo[0], lo[1]);
  a[1] = pack2<T>(lo[2], lo[3]);
  a[2] = pack2<T>(hi[0], hi[1]);
  a[3] = pack2<T>(hi[2], hi[3]);
}

// A lane's constants: lane = 4 g + t; cw is the warp's first column within the CTA's block.
// ldmatrix row addresses: lane provides row (lane % 8) of matrix m = lane / 8. Pattern "rows":
// matrices (r, c), (r, c + 8), (r + 8, c), (r + 8, c + 8); pattern "cols": (r, c), (r + 8, c),
// (r, c + 8), (r + 8, c + 8).
struct WalkLane {
  int g, t, cw, warp;
  int rows_r, rows_c;
  int cols_r, cols_c;
};

// The constants of lane `lane` of walk warp `warp` (the warp's index among the walking warps).
__device__ __forceinline__ WalkLane walk_lane(int warp, int lane) {
  WalkLane l;
  l.g = lane / 4;
  l.t = lane % 4;
  l.cw = 16 * warp;
  l.warp = warp;
  l.rows_r = (lane & 7) + 8 * (lane >> 4);
  l.rows_c = 8 * ((lane >> 3) & 1);
  l.cols_r = (lane & 7) + 8 * ((lane >> 3) & 1);
  l.cols_c = 8 * (lane >> 4);
  return l;
}

// The staged operands of one chunk, as the shared step sees them.
template <typename T>
struct WalkStage {
  const unsigned char* base;  // the stage (policy-specific layout of K, Q, Mt, P)
  const unsigned char* kq;    // wgmma policy: swizzled K, then Q (dk / 64 blocks of 8 KB each)
  const unsigned char* mt;    // wgmma policy: swizzled 64 x 64 Mt hi, then Mt lo (8 KB each)
  const T* V;                 // [64][LDV], the CTA's DVB columns, padded rows
  const float* gam;           // 64 x exp(G), then 64 x exp(G_last - G) (the record's gam, dec)
  const unsigned char* p;     // wgmma policy: swizzled 64 x 64 P
  static_assert(kRecDecOff == kRecGamOff + 4 * kChunk, "dec follows gam");
};

// mma.sync products: K, Q as padded [64][DK + 8] tiles, Mt hi, Mt lo, P, gam, dec as a verbatim copy of
// the workspace record (lower-block layout), V as [64][DVB + 8].
template <typename T_, int DK_, int WARPS>
struct MmaSyncWalk {
  using T = T_;
  static constexpr int DK = DK_;
  static constexpr int kThreads = 32 * WARPS;
  static constexpr int DVB = 16 * WARPS;
  static constexpr int LDK = DK + 8;   // +16 bytes per row: ldmatrix rows in distinct bank groups
  static constexpr int LDV = DVB + 8;
  static constexpr std::size_t k_bytes = std::size_t(kChunk) * LDK * 2;
  static constexpr std::size_t v_bytes = std::size_t(kChunk) * LDV * 2;
  static constexpr std::size_t off_k = 0;
  static constexpr std::size_t off_q = off_k + align128(k_bytes);
  static constexpr std::size_t off_v = off_q + align128(k_bytes);
  static constexpr std::size_t off_rec = off_v + align128(v_bytes);  // Mt hi, Mt lo, P, gam, dec at the record's offsets
  static constexpr std::size_t stage_bytes = off_rec + kRecBytes;
  static constexpr bool kSm90a = false;
  static constexpr bool kVSwizzled = false;  // V as padded [64][LDV] rows
  static constexpr std::size_t align = 128;  // of the stages' base (dynamic shared memory is at least this)
  static constexpr std::size_t smem_bytes = 2 * stage_bytes;
  static_assert(DK % 16 == 0 && kRecBytes % 128 == 0, "16-wide key tiles, 128-byte aligned stages");

  __device__ static void prepare(unsigned char*, int) {}

  // Copies of one chunk (nrows rows from k, q, v; the record rec) into a stage. A tail chunk
  // copies only its nb = ceil(nrows / 16) row blocks and zero-fills K, Q, V rows [nrows, 16 nb).
  __device__ static void load(unsigned char* stage, const T* k, std::int64_t k_token, const T* q,
                              std::int64_t q_token, const T* v, std::int64_t v_token, const unsigned char* rec,
                              int nrows, int tid) {
    T* const Kd = reinterpret_cast<T*>(stage + off_k);
    T* const Qd = reinterpret_cast<T*>(stage + off_q);
    T* const Vd = reinterpret_cast<T*>(stage + off_v);
    unsigned char* const Rd = stage + off_rec;
    if (nrows == kChunk) {
      load_tile_full<kThreads, T, DK, LDK>(Kd, k, k_token, tid);
      load_tile_full<kThreads, T, DK, LDK>(Qd, q, q_token, tid);
      load_tile_full<kThreads, T, DVB, LDV>(Vd, v, v_token, tid);
      for (int i = tid; i < static_cast<int>(kRecBytes / 16); i += kThreads)
        __pipeline_memcpy_async(Rd + 16 * i, rec + 16 * i, 16);
    } else {
      const int nb = (nrows + 15) / 16;
      load_rows_async_n<kThreads, T, DK, LDK>(Kd, k, k_token, nrows, nb * 16, tid);
      load_rows_async_n<kThreads, T, DK, LDK>(Qd, q, q_token, nrows, nb * 16, tid);
      load_rows_async_n<kThreads, T, DVB, LDV>(Vd, v, v_token, nrows, nb * 16, tid);
      for (std::size_t off : {kRecMtOff, kRecMtLoOff, kRecPOff})
        load_lower_async<kThreads>(reinterpret_cast<T*>(Rd + off), reinterpret_cast<const T*>(rec + off), nb, tid);
      for (int i = tid; i < kChunk / 2; i += kThreads)  // gam and dec
        __pipeline_memcpy_async(Rd + kRecGamOff + 16 * i, rec + kRecGamOff + 16 * i, 16);
    }
  }
  __device__ static WalkStage<T> stage(const unsigned char* base) {
    return {base, nullptr, nullptr, reinterpret_cast<const T*>(base + off_v),
            reinterpret_cast<const float*>(base + off_rec + kRecGamOff), nullptr};
  }

  // KSt = St K^T and QSt = St Q^T (added to ks, qs).
  template <int NB>
  __device__ static void kq(float (&ks)[2 * NB][4], float (&qs)[2 * NB][4], const float (&st)[DK / 8][4],
                            const WalkStage<T>& S, const WalkLane& l) {
    const T* const K = reinterpret_cast<const T*>(S.base + off_k);
    const T* const Q = reinterpret_cast<const T*>(S.base + off_q);
#pragma unroll
    for (int kk = 0; kk < DK / 16; ++kk) {
      std::uint32_t a[4];
      to_a_frag<T>(a, st[2 * kk], st[2 * kk + 1]);
#pragma unroll
      for (int rb = 0; rb < NB; ++rb) {
        std::uint32_t b[4];
        ldsm_x4(b, K + (16 * rb + l.rows_r) * LDK + 16 * kk + l.rows_c);
        mma16816<T>(ks[2 * rb], a, b[0], b[1]);
        mma16816<T>(ks[2 * rb + 1], a, b[2], b[3]);
        ldsm_x4(b, Q + (16 * rb + l.rows_r) * LDK + 16 * kk + l.rows_c);
        mma16816<T>(qs[2 * rb], a, b[0], b[1]);
        mma16816<T>(qs[2 * rb + 1], a, b[2], b[3]);
      }
    }
  }

  // vn += Xt Mt_lo^T + Xt Mt_hi^T (Mt lower block triangular).
  template <int NB>
  __device__ static void vn(float (&vn)[2 * NB][4], const std::uint32_t (&xa)[NB][4], const WalkStage<T>& S,
                            const WalkLane& l) {
    const T* const Mh = reinterpret_cast<const T*>(S.base + off_rec + kRecMtOff);
    const T* const Ml = reinterpret_cast<const T*>(S.base + off_rec + kRecMtLoOff);
#pragma unroll
    for (int bi = 0; bi < NB; ++bi) {
      const int row_off = lower_block_off(bi) + l.rows_r * lower_block_ld(bi) + l.rows_c;
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

  // qs += Vnt P^T.
  template <int NB>
  __device__ static void out(float (&qs)[2 * NB][4], const std::uint32_t (&na)[NB][4], const WalkStage<T>& S,
                             const WalkLane& l) {
    const T* const P = reinterpret_cast<const T*>(S.base + off_rec + kRecPOff);
#pragma unroll
    for (int bi = 0; bi < NB; ++bi) {
      const int row_off = lower_block_off(bi) + l.rows_r * lower_block_ld(bi) + l.rows_c;
#pragma unroll
      for (int bj = 0; bj <= bi; ++bj) {
        std::uint32_t b[4];
        ldsm_x4(b, P + row_off + 16 * bj);
        mma16816<T>(qs[2 * bi], na[bj], b[0], b[1]);
        mma16816<T>(qs[2 * bi + 1], na[bj], b[2], b[3]);
      }
    }
  }

  // st += Vdt K (B = K from ldmatrix.trans of K rows).
  template <int NB>
  __device__ static void state(float (&st)[DK / 8][4], const std::uint32_t (&da)[NB][4], const WalkStage<T>& S,
                               const WalkLane& l) {
    const T* const K = reinterpret_cast<const T*>(S.base + off_k);
#pragma unroll
    for (int rb = 0; rb < NB; ++rb) {
#pragma unroll
      for (int dd = 0; dd < DK / 16; ++dd) {
        std::uint32_t b[4];
        ldsm_x4_trans(b, K + (16 * rb + l.cols_r) * LDK + 16 * dd + l.cols_c);
        mma16816<T>(st[2 * dd], da[rb], b[0], b[1]);
        mma16816<T>(st[2 * dd + 1], da[rb], b[2], b[3]);
      }
    }
  }

  // The step's two calls (walk_chunk): mma.sync is synchronous, so they are the products in order.
  template <int NB, class MakeX, class Aside>
  __device__ static void kq_vn(float (&ks)[2 * NB][4], float (&qs)[2 * NB][4], float (&vn_acc)[2 * NB][4],
                               const float (&st)[DK / 8][4], bool zero_state, MakeX&& make_x, Aside&& aside,
                               const WalkStage<T>& S, const WalkLane& l) {
    aside();
    if (!zero_state) kq<NB>(ks, qs, st, S, l);
    std::uint32_t xa[NB][4];
    make_x(xa);
#pragma unroll
    for (int i = 0; i < 2 * NB; ++i)
#pragma unroll
      for (int e = 0; e < 4; ++e) vn_acc[i][e] = 0.0f;
    vn<NB>(vn_acc, xa, S, l);
  }
  template <int NB, class StoreO, class Decay>
  __device__ static void out_state(float (&qs)[2 * NB][4], std::uint32_t (&na)[NB][4], float (&st)[DK / 8][4],
                                   std::uint32_t (&da)[NB][4], StoreO&& store_o, Decay&& decay_state,
                                   const WalkStage<T>& S, const WalkLane& l) {
    out<NB>(qs, na, S, l);
    store_o();
    decay_state();
    state<NB>(st, da, S, l);
  }
};

// A measurement aid (GDNKIT_STEP_MARKS, with GDNKIT_FUSED_TIMELINE; fused_sm90.cu's kernels only):
// %clock marks of thread 0 of each of the fused kernel's state warpgroups (threadIdx.x 128, 256)
// through the phases of the chunk steps j0 .. j0 + kMarkChunks - 1, and of lane 0 of each aux warp
// (FusedProbe::mark) through its records of the same chunks; fused_cta copies them out after the
// timeline's slots and bench/step_marks.py prints them. Compiled out otherwise.
#ifdef GDNKIT_STEP_MARKS
constexpr int kMarkChunks = 4;
__shared__ unsigned step_marks[6][kMarkChunks][16];  // [state WG 0, 1, aux warps 0-3][chunk - j0][mark]
__shared__ int step_mark_chunk[2];                   // each state warpgroup's chunk - j0 being marked, or -1
__device__ __forceinline__ void step_mark(int k) {
  if (threadIdx.x == 128 || threadIdx.x == 256) {
    const int c = step_mark_chunk[threadIdx.x / 128 - 1];
    unsigned t;
    asm volatile("mov.u32 %0, %%clock;" : "=r"(t)::"memory");
    if (c >= 0 && c < kMarkChunks) step_marks[threadIdx.x / 128 - 1][c][k] = t;
  }
}
#define GDNKIT_STEP_MARK(k) ::gdnkit::cuda::step_mark(k)
#else
#define GDNKIT_STEP_MARK(k) \
  do {                      \
  } while (0)
#endif

// One chunk step for one warp's 16 value columns, the chunk holding NB 16-row blocks (rows past
// nrows are zero). Updates st in place and stores rows [0, nrows) of O at orow0 (row 0 of the
// chunk, this warp's first column; o_token elements from one row to the next). A negative o_token
// (a split's map CTAs) stores, where nrows > 0, every row of the NB blocks in map_o's fragment order
// instead (map_o_piece): orow0 is then this lane's piece of block 0, and a block's piece is
// -16 o_token elements after the one before (the sign, not a flag, so that the walk-list kernels
// keep no extra register live through the step). The products come from the policy W, in two
// calls that let an asynchronous policy wait only where a result is needed: kq_vn (K S and Q S,
// then Xt, then Vn) and out_state (P Vn into O and Vd K into S', the O store and the decay of St
// between them). `aside` is work of the caller's that no product waits for (the fused kernel's
// TMA copies): an asynchronous policy runs it while K S and Q S are in flight.
struct NoAside {
  __device__ void operator()() const {}
};
// kStageO (the fused kernel, sm_90): where o_stage is set (full chunks), instead of storing O the
// warp writes its 16 columns of O into the 128-byte-swizzled [64 tokens][64 columns] tile of its
// 64-column block at o_stage (stmatrix, transposed), for a TMA store that the caller issues after
// fencing them and a barrier.
template <class W, int NB, bool kStageO = false, class Aside = NoAside>
__device__ __forceinline__ void walk_chunk(float (&st)[W::DK / 8][4], const WalkStage<typename W::T>& S,
                                           const WalkLane& l, bool zero_state, int nrows, float scale,
                                           typename W::T* orow0, std::int64_t o_token, Aside&& aside = Aside{},
                                           unsigned char* o_stage = nullptr) {
  using T = typename W::T;
  constexpr int DK = W::DK, LDV = W::LDV;
  const int t = l.t;

  // KSt = St K^T and QSt = St Q^T; tile i covers chunk rows [8 i, 8 i + 8).
  float ks[2 * NB][4], qs[2 * NB][4], vn[2 * NB][4];
#pragma unroll
  for (int i = 0; i < 2 * NB; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) ks[i][e] = qs[i][e] = 0.0f;

  // Xt = Vt - KSt diag(gam), as A fragments (xa[rb]: chunk rows [16 rb, 16 rb + 16)).
  auto make_x = [&](std::uint32_t (&xa)[NB][4]) {
#pragma unroll
    for (int rb = 0; rb < NB; ++rb) {
      std::uint32_t vv[4];  // Vt in the C layout of tiles 2 rb (vv[0], vv[1]) and 2 rb + 1 (vv[2], vv[3])
      if constexpr (W::kVSwizzled) {  // 128-byte-swizzled column blocks of 64 value columns (TMA)
        // Rows 16 rb + r swizzle like row r, so with kVOneOffset one lane offset serves every rb
        // (immediates after it) instead of a register per rb: the walk-list variants spilled one
        // register without it; the default variant measured ~1% faster with the per-rb form.
        const int col = l.cw + l.rows_c;
        const unsigned char* const vb = reinterpret_cast<const unsigned char*>(S.V) + (col / 64) * (kChunk * 128);
        if constexpr (W::kVOneOffset) ldsm_x4_trans(vv, vb + swizzle128(l.rows_r, (col % 64) / 8) + rb * (16 * 128));
        else ldsm_x4_trans(vv, vb + swizzle128(16 * rb + l.rows_r, (col % 64) / 8));
      } else {
        ldsm_x4_trans(vv, S.V + (16 * rb + l.rows_r) * LDV + l.cw + l.rows_c);
      }
      float x[2][4];
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int i = 2 * rb + half;
        const float2 gm = *reinterpret_cast<const float2*>(S.gam + 8 * i + 2 * t);
        const float gam0 = gm.x, gam1 = gm.y;
        const float2 va = unpack2<T>(vv[2 * half]), vb = unpack2<T>(vv[2 * half + 1]);
        x[half][0] = va.x - gam0 * ks[i][0];
        x[half][1] = va.y - gam1 * ks[i][1];
        x[half][2] = vb.x - gam0 * ks[i][2];
        x[half][3] = vb.y - gam1 * ks[i][3];
#pragma unroll
        for (int e = 0; e < 4; ++e) ks[i][e] = x[half][e];  // fp32 Xt, for a block solve (else dead)
        // Rows past a tail chunk's end are exactly zero here: the loads (or, in the fused kernel,
        // the state warpgroups) zero those rows of K and V, so K S is zero there too.
      }
      to_a_frag<T>(xa[rb], x[0], x[1]);
    }
  };
  // K S and Q S, then Xt, then Vnt = Xt Mt^T.
  W::template kq_vn<NB>(ks, qs, vn, st, zero_state, make_x, aside, S, l);
  GDNKIT_STEP_MARK(9);

  // Ot = QSt diag(scale gam) + Vnt P^T; Vnt and Vnt diag(exp(G_last - G)) as A fragments.
  std::uint32_t na[NB][4], da[NB][4];
#pragma unroll
  for (int rb = 0; rb < NB; ++rb) {
    float d[2][4];
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int i = 2 * rb + half;
      const float2 gm = *reinterpret_cast<const float2*>(S.gam + 8 * i + 2 * t);
      const float s0 = scale * gm.x, s1 = scale * gm.y;
      qs[i][0] *= s0;
      qs[i][1] *= s1;
      qs[i][2] *= s0;
      qs[i][3] *= s1;
      const float2 dc = *reinterpret_cast<const float2*>(S.gam + kChunk + 8 * i + 2 * t);
      const float e0 = dc.x, e1 = dc.y;
      d[half][0] = vn[i][0] * e0;
      d[half][1] = vn[i][1] * e1;
      d[half][2] = vn[i][2] * e0;
      d[half][3] = vn[i][3] * e1;
    }
    to_a_frag<T>(na[rb], vn[2 * rb], vn[2 * rb + 1]);
    to_a_frag<T>(da[rb], d[0], d[1]);
  }
  // St' = gam_last St + (Vnt diag(exp(G_last - G))) K.
  auto decay_state = [&] {
    const float gam_last = S.gam[kChunk - 1];
#pragma unroll
    for (int j = 0; j < DK / 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) st[j][e] *= gam_last;
  };
  // Tile i is Ot[c][r] for r in [8 i, 8 i + 8); transposed, the lane holds O[8 i + g][2t, 2t+1]
  // (first word: columns cw + 2t, second: cw + 8 + 2t). Every transpose is issued before the first
  // store, so that their latencies overlap, and a chunk whose row blocks are all valid tests no
  // row: each store had waited for its own transpose, the longest phase of the fused kernel's
  // paired step after its waits (docs/perf-notes.md, "The O stores"). (A row pointer stepped by 8
  // rows instead of each row's address spilled in the walk-list kernels.)
  auto store_o = [&] {
#if defined(GDNKIT_WALK_PROBE_OUT) && (GDNKIT_WALK_PROBE_OUT & 4)
    return;
#endif
    if constexpr (kStageO && NB == 4) {
      if (o_stage != nullptr) {
        // stmatrix k stores tiles 2k, 2k + 1 as four 8 x 8 quarters m (tile 2k + m / 2, columns
        // 8 (m % 2) ..; rows g, tokens 2t): transposed, row rr of quarter m is token
        // 16 k + 8 (m / 2) + rr, eight columns from the warp's first + 8 (m % 2).
        const int lane = 4 * l.g + l.t, m = lane / 8, rr = lane % 8;
        unsigned char* const row = o_stage + (l.cw / 64) * (kChunk * 128) +
                                   swizzle128(8 * (m / 2) + rr, (l.cw % 64) / 8 + m % 2);
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          const std::uint32_t r[4] = {pack2<T>(qs[2 * k][0], qs[2 * k][1]), pack2<T>(qs[2 * k][2], qs[2 * k][3]),
                                      pack2<T>(qs[2 * k + 1][0], qs[2 * k + 1][1]),
                                      pack2<T>(qs[2 * k + 1][2], qs[2 * k + 1][3])};
          stsm_x4_trans(row + k * (16 * 128), r);  // rows 16 apart swizzle alike
        }
        return;
      }
    }
    std::uint32_t ov[2 * NB][2];
#pragma unroll
    for (int i = 0; i < 2 * NB; ++i) {
      ov[i][0] = movmatrix_trans(pack2<T>(qs[i][0], qs[i][1]));
      ov[i][1] = movmatrix_trans(pack2<T>(qs[i][2], qs[i][3]));
    }
    if (o_token < 0) {  // the lane's A fragment of each block: tokens 16 b + g and + 8, keys 2t and 8 + 2t
      if (nrows <= 0) return;  // nothing stored (nrows: the rows to store)
#pragma unroll
      for (int b = 0; b < NB; ++b)
        *reinterpret_cast<uint4*>(orow0 - b * 16 * o_token) =
            make_uint4(ov[2 * b][0], ov[2 * b + 1][0], ov[2 * b][1], ov[2 * b + 1][1]);
      return;
    }
    const bool all = nrows >= 16 * NB;  // every row of the NB row blocks
    T* const orow_g = orow0 + l.g * o_token + 2 * t;
    const std::int64_t step = 8 * o_token;
#pragma unroll
    for (int i = 0; i < 2 * NB; ++i) {
      const int r = 8 * i + l.g;
      if (all || r < nrows) {
        T* const orow = orow_g + i * step;
        *reinterpret_cast<std::uint32_t*>(orow) = ov[i][0];
        *reinterpret_cast<std::uint32_t*>(orow + 8) = ov[i][1];
      }
    }
  };
  GDNKIT_STEP_MARK(10);
  if constexpr (requires { aside.before_out(); }) aside.before_out();  // the fused kernel's FusedLateP
  W::template out_state<NB>(qs, na, st, da, store_o, decay_state, S, l);
}

// The state of (sequence n, head h) as this lane's St tiles: columns col, col + 8 (value columns,
// col = the warp's first column + g) and keys 8 j + 2t, 8 j + 2t + 1 of St = S^T, i.e. element
// (c, d) of the state at c * cs + d * ds: (cs, ds) = (1, dv) in the [dk, dv] layout, (dk, 1) in
// [dv, dk]. lane_state_offset gives the element (col, 2t).
template <int DK>
__device__ __forceinline__ std::int64_t lane_state_offset(const ChunkedParams& p, std::int64_t n, int h, int col,
                                                          int t) {
  return (n * p.num_heads + h) * static_cast<std::int64_t>(DK) * p.dv +
         (p.state_vk ? static_cast<std::int64_t>(col) * DK + 2 * t : static_cast<std::int64_t>(2 * t) * p.dv + col);
}
// The state from src (null: zero), and into p.final_state. Opaque copies of the offsets: the
// final-state store recomputes them rather than keeping them live (in registers) across the walk.
template <int DK>
__device__ __forceinline__ void load_state_tiles(float (&st)[DK / 8][4], const ChunkedParams& p, const float* src,
                                                 std::int64_t off) {
  const std::int64_t base = opaque(off);
  const int cs = opaque(p.state_vk ? DK : 1), ds = opaque(p.state_vk ? 1 : p.dv);
#pragma unroll
  for (int j = 0; j < DK / 8; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) st[j][e] = src ? src[base + 8 * (e / 2) * cs + (8 * j + e % 2) * ds] : 0.0f;
}
template <int DK>
__device__ __forceinline__ void load_state_tiles(float (&st)[DK / 8][4], const ChunkedParams& p, std::int64_t off) {
  load_state_tiles<DK>(st, p, p.has_initial_state ? p.initial_state : nullptr, off);
}
// The lane's tiles to dst: element (col, 2t) at off, columns cs apart, keys ds apart.
template <int DK>
__device__ __forceinline__ void store_tiles(const float (&st)[DK / 8][4], float* dst, std::int64_t off, int cs,
                                            int ds) {
  const std::int64_t base = opaque(off);
  cs = opaque(cs), ds = opaque(ds);
#pragma unroll
  for (int j = 0; j < DK / 8; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) dst[base + 8 * (e / 2) * cs + (8 * j + e % 2) * ds] = st[j][e];
}
// The lane's tiles of a map walk's end state (the transfer map M, St = M^T: tile j holds M[8 j + 2t
// (+ 1)][col (+ 8)]) into dst, one map and head of ChunkedParams::map_out (map_m_index).
// Element (j, e) lies map_m_tile_offset(j, e) after the lane's element (0, 0): one base register,
// the rest immediates (chunked.h checks the identity for every lane).
template <int DK>
__device__ __forceinline__ void store_map_tiles(const float (&st)[DK / 8][4], float* dst, int col, int t) {
  float* const base = dst + opaque(map_m_index<DK>(2 * t, col));
#pragma unroll
  for (int j = 0; j < DK / 8; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) base[map_m_tile_offset<DK>(j, e)] = st[j][e];
}
// The lane's tiles into dst, a state tensor of p's layout ([index, H, dk, dv] or [.., dv, dk]).
template <int DK>
__device__ __forceinline__ void store_state_tiles(const float (&st)[DK / 8][4], const ChunkedParams& p, float* dst,
                                                  std::int64_t off) {
  store_tiles<DK>(st, dst, off, p.state_vk ? DK : 1, p.state_vk ? 1 : p.dv);
}
template <int DK>
__device__ __forceinline__ void store_state_tiles(const float (&st)[DK / 8][4], const ChunkedParams& p,
                                                  std::int64_t off) {
  store_state_tiles<DK>(st, p, p.final_state, off);
}
// The lane's tiles of the dk x dk identity, the lane's first column being col (a map walk's start).
template <int DK>
__device__ __forceinline__ void identity_state_tiles(float (&st)[DK / 8][4], int col, int t) {
#pragma unroll
  for (int j = 0; j < DK / 8; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) st[j][e] = 8 * j + 2 * t + e % 2 == col + 8 * (e / 2) ? 1.0f : 0.0f;
}

// Dynamic shared memory of a walk CTA: the policy's stages, then the longest-first order.
template <class W>
constexpr std::size_t walk_smem_bytes() {
  return W::smem_bytes + kWalkOrderBytes;
}

// order[r] = the sequence of rank r by decreasing length, ties by index (p.longest_first).
// lens is scratch; both hold kLongestFirstMaxSeqs ints. Ends with a CTA barrier.
template <int NT>
__device__ __forceinline__ void rank_longest_first(const ChunkedParams& p, int* order, int* lens, int tid) {
  const int n_seqs = static_cast<int>(p.num_seqs);
  for (int n = tid; n < n_seqs; n += NT) {
    std::int64_t bos, eos;
    seq_range(p, n, bos, eos);
    lens[n] = static_cast<int>(eos - bos);
  }
  __syncthreads();
  for (int n = tid; n < n_seqs; n += NT) {
    const int len = lens[n];
    int rank = 0;
    for (int j = 0; j < n_seqs; ++j) rank += lens[j] > len || (lens[j] == len && j < n);
    order[rank] = n;
  }
  __syncthreads();
}

// The walk of one CTA; gdn_walk_kernel below is its entry point.
template <class W>
__device__ __forceinline__ void walk_cta(const ChunkedParams& p) {
  using T = typename W::T;
  constexpr int C = kChunk;
  constexpr int DK = W::DK, DVB = W::DVB;
  constexpr int NKT = DK / 8;  // 8-column key tiles of St

  GDNKIT_DYNAMIC_SMEM(smem_raw);
  unsigned char* const smem =
      smem_raw + ((W::align - (smem_addr(smem_raw) & (W::align - 1))) & (W::align - 1));  // W::align-aligned

  const int tid = threadIdx.x;
  const int warp = tid / 32, lane = tid % 32;
  const int h = blockIdx.y;
  const int v0 = blockIdx.x * DVB;  // the CTA's first value column
  const WalkLane l = walk_lane(warp, lane);
  const int g = l.g, t = l.t, cw = l.cw;

  const T* const qh = static_cast<const T*>(p.q) + static_cast<std::int64_t>(h / p.q_group) * p.q_head;
  const T* const kh = static_cast<const T*>(p.k) + static_cast<std::int64_t>(h / p.k_group) * p.k_head;
  const T* const vh = static_cast<const T*>(p.v) + static_cast<std::int64_t>(h / p.v_group) * p.v_head + v0;
  T* const oh = static_cast<T*>(p.o) + static_cast<std::int64_t>(h) * p.o_head + v0 + cw;

  // Issues the copies of one chunk (rows [c0, c0 + nrows) of sequence n) into stage s.
  auto load_chunk = [&](int s, std::int64_t n, std::int64_t bos, std::int64_t c0, int nrows) {
    const unsigned char* const rec =
        p.ws + ((first_slot(bos, n) + (c0 - bos) / C) * p.num_heads + h) * kRecBytes;
    W::load(smem + s * W::stage_bytes, kh + c0 * p.k_token, p.k_token, qh + c0 * p.q_token, p.q_token,
            vh + c0 * p.v_token, p.v_token, rec, nrows, tid);
  };
  // Sequence i of the CTA's list blockIdx.z, blockIdx.z + gridDim.z, ...: i itself, or the i-th
  // longest with p.longest_first.
  int* const order = reinterpret_cast<int*>(smem_raw + W::smem_bytes);
  if (p.longest_first) rank_longest_first<W::kThreads>(p, order, order + kLongestFirstMaxSeqs, tid);
  auto seq_at = [&](std::int64_t i) -> std::int64_t { return p.longest_first ? order[i] : i; };
  // First chunk of the first non-empty sequence among list entries i, i + gridDim.z, ...: issues
  // its copies.
  auto prefetch_from = [&](std::int64_t i, int s) {
    for (; i < p.num_seqs; i += gridDim.z) {
      const std::int64_t n = seq_at(i);
      std::int64_t bos, eos;
      seq_range(p, n, bos, eos);
      if (eos > bos) {
        load_chunk(s, n, bos, bos, static_cast<int>(eos - bos < C ? eos - bos : C));
        return;
      }
    }
  };

  W::prepare(smem, tid);
  int stage = 0;
  prefetch_from(blockIdx.z, 0);
  __pipeline_commit();

  float st[NKT][4];  // St tiles: st[j] holds columns [8 j, 8 j + 8) of St = S^T
  for (std::int64_t i = blockIdx.z; i < p.num_seqs; i += gridDim.z) {
    const std::int64_t n = seq_at(i);
    std::int64_t bos, eos;
    seq_range(p, n, bos, eos);
    const std::int64_t state_lane = lane_state_offset<DK>(p, n, h, v0 + cw + g, t);
    load_state_tiles<DK>(st, p, state_lane);
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
        prefetch_from(i + gridDim.z, stage ^ 1);
      __pipeline_commit();

      const WalkStage<T> S = W::stage(smem + stage * W::stage_bytes);
      T* const orow0 = oh + c0 * p.o_token;
      // One instantiation per row-block count: full chunks run branch-free straight-line code.
      switch ((nrows + 15) / 16) {
        case 4: walk_chunk<W, 4>(st, S, l, zero_state, nrows, p.scale, orow0, p.o_token); break;
        case 3: walk_chunk<W, 3>(st, S, l, zero_state, nrows, p.scale, orow0, p.o_token); break;
        case 2: walk_chunk<W, 2>(st, S, l, zero_state, nrows, p.scale, orow0, p.o_token); break;
        default: walk_chunk<W, 1>(st, S, l, zero_state, nrows, p.scale, orow0, p.o_token); break;
      }
      zero_state = false;
      stage ^= 1;
    }

    if (p.want_final_state) store_state_tiles<DK>(st, p, state_lane);
  }
}

// grid = (dv / DVB, H, min(N, 65535) or fewer); W::kThreads threads. Images for an architecture
// the policy cannot run on (below sm_80; wgmma without sm_90a) hold only a trap.
template <class W>
__global__ void __launch_bounds__(W::kThreads, 1) gdn_walk_kernel(const ChunkedParams p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  constexpr bool runs_here = false;
#elif defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr bool runs_here = !W::kSm90a;
#else
  constexpr bool runs_here = true;
#endif
  if constexpr (runs_here)
    walk_cta<W>(p);
  else
    __trap();
}

}  // namespace gdnkit::cuda
