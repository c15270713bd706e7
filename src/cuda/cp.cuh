// Context parallelism on one GPU (docs/math.md "Splitting a sequence"): the device side of the four
// launches that cp.cu enqueues back to back on one stream.
//
// Sequence n (len_n tokens, from cu_seqlens or the uniform length) is cut at chunk borders into
// nseg_n = max(1, ceil(len_n / seg)) segments of `seg` tokens (the last one shorter). A sequence
// of nseg_n >= 2 owns the slots slot_n .. slot_n + nseg_n - 1 of E and M (slot_n: the sum of
// nseg_m over the split sequences before it; CpLayout::slots bounds the total).
//   Build (cp_build_lists, one CTA): both lists from the lengths, on the device (the host need not
//     know them: the lists are sized by upper bounds and padded with empty walks).
//   Stage 1, the fused kernel over list 1: segment 0 of each split sequence from its initial
//     state, segments 1 .. nseg_n - 1 from zero, every one writing its rows of o and its end state
//     to E[slot_n + s] (N_s for s >= 1); the map CTAs walk the identity through the same tokens of
//     segments s >= 1 with V = 0, writing M_s to M[slot_n + s] and their output rows to map_o: row
//     t is the linear map from the segment's start state to o_t. An unsplit sequence (nseg_n = 1)
//     is walked whole here, exactly as the unsplit kernel walks it.
//   Stage 2, cp_scan_cta: per (sequence, head, 8 value columns), E[slot_n + s] <- M_s E[slot_n + s - 1]
//     + E[slot_n + s] for s = 1 .. nseg_n - 1, in fp32, in order: E then holds the true end states,
//     the last one the sequence's final state (also written to final_state).
//   Stage 3, cp_fix_cta over list 3 (segments s >= 1): o_t += map_o[t] E[slot_n + s - 1], a
//     chunk-parallel product (E split into a 16-bit hi + lo pair, fp32 accumulation).
// Every token's o is thus walked once (the unsplit kernel's work), plus one identity walk of dk
// columns per segment after the first, instead of the two walks of a re-walk of each segment.
// The decay shortcut (cutoff > 0) adds cp_stop_cta before stage 1: the identity walks then stop
// where the segment's gates have decayed its start state below the cutoff (ChunkedParams::map_end).
#pragma once

#include <cfloat>
#include <cstdint>

#include "cuda/chunk_io.cuh"
#include "cuda/chunked.h"
#include "cuda/mma_sm80.cuh"
#include "cuda/pdl.cuh"
#include "cuda/wmma_common.cuh"

namespace gdnkit::cuda {

struct CpLayout {
  int seg = 0;                   // tokens per segment, a multiple of 64
  std::int64_t cap1 = 0, cap3 = 0;  // list lengths: N + T / seg (sum of max(nseg_n, 1)), T / seg (of nseg_n - 1)
  std::int64_t slots = 0;        // E and M slots: the sum of nseg_n over split sequences
  static CpLayout of(std::int64_t tokens, std::int64_t seqs, int seg) {
    // nseg_n <= floor(len_n / seg) + 1, and a split sequence has floor(len_n / seg) >= 1.
    CpLayout c;
    c.seg = seg;
    c.cap3 = tokens / seg;
    c.cap1 = seqs + c.cap3;
    c.slots = c.cap3 + (seqs < c.cap3 ? seqs : c.cap3);
    return c;
  }
};

constexpr int kCpBuildThreads = 256;

// Both lists and the per-sequence table seq_slots[2 n] = slot_n, [2 n + 1] = nseg_n, by one CTA of
// NT threads (sm: 3 NT ints of shared memory). Sequences are taken NT at a time: exclusive scans
// of their list-1, list-3 and slot counts place them; the tails are padded with empty walks.
template <int NT>
__device__ __forceinline__ void cp_build_lists(const ChunkedParams& p, const CpLayout& c, WalkSpan* list1,
                                               WalkSpan* list3, int* seq_slots, int* sm, int tid) {
  std::int64_t o1 = 0, o3 = 0, os = 0;  // entries and slots placed so far
  for (std::int64_t base = 0; base < p.num_seqs; base += NT) {
    const std::int64_t n = base + tid;
    const bool here = n < p.num_seqs;
    // Clamped into [0, T] (the run does not check cu_seqlens: a decreasing or out-of-range one
    // gives wrong numbers, as the unsplit kernel would, but no access outside the buffers).
    std::int64_t bos = here ? seq_begin(p, n) : 0, eos = here ? seq_begin(p, n + 1) : 0;
    bos = bos < 0 ? 0 : bos > p.tokens ? p.tokens : bos;
    eos = eos < bos ? bos : eos > p.tokens ? p.tokens : eos;
    const int nseg = here ? static_cast<int>(eos - bos > c.seg ? (eos - bos + c.seg - 1) / c.seg : 1) : 0;
    const int e1 = here ? nseg : 0, e3 = here ? nseg - 1 : 0, es = nseg > 1 ? nseg : 0;
    // Inclusive scans of e1, e3 and es over the NT threads (Hillis-Steele in shared memory).
    int* const s1 = sm;
    int* const s3 = sm + NT;
    int* const ss = sm + 2 * NT;
    s1[tid] = e1;
    s3[tid] = e3;
    ss[tid] = es;
    __syncthreads();
    for (int d = 1; d < NT; d *= 2) {
      const int a = tid >= d ? s1[tid - d] : 0, b = tid >= d ? s3[tid - d] : 0, e = tid >= d ? ss[tid - d] : 0;
      __syncthreads();
      s1[tid] += a;
      s3[tid] += b;
      ss[tid] += e;
      __syncthreads();
    }
    const std::int64_t at1 = o1 + s1[tid] - e1, at3 = o3 + s3[tid] - e3, ats = os + ss[tid] - es;
    const std::int64_t total1 = s1[NT - 1], total3 = s3[NT - 1], totals = ss[NT - 1];
    __syncthreads();  // the totals are read before the next round overwrites them
    if (here) {
      const auto slot = static_cast<std::int32_t>(ats);
      // The bounds hold for valid cu_seqlens; an invalid one (sequences overlapping) is kept inside
      // the lists and slots, and the scan then skips the sequence (nseg 1).
      const bool fits = at1 + e1 <= c.cap1 && at3 + e3 <= c.cap3 && ats + es <= c.slots;
      seq_slots[2 * n] = slot;
      seq_slots[2 * n + 1] = fits ? nseg : 1;
      auto span = [&](int s) {
        WalkSpan w;
        w.seq = static_cast<std::int32_t>(n);
        w.begin = static_cast<std::int32_t>(bos + static_cast<std::int64_t>(s) * c.seg);
        const std::int64_t end = bos + static_cast<std::int64_t>(s + 1) * c.seg;
        w.end = static_cast<std::int32_t>(end < eos ? end : eos);
        return w;
      };
      if (nseg == 1 && at1 < c.cap1) {
        WalkSpan w = span(0);  // the whole sequence, as the unsplit kernel walks it
        w.end = static_cast<std::int32_t>(eos);
        list1[at1] = w;
      }
      for (int s = 0; nseg > 1 && s < nseg && at1 + s < c.cap1 && ats + s < c.slots; ++s) {
        WalkSpan a = span(s);
        a.last = 0;  // the scan writes the final state
        a.state_out = slot + s;
        if (s > 0) {
          a.state_in = kStateZero;
          a.map = slot + s;
          if (at3 + s - 1 < c.cap3) {
            WalkSpan b = span(s);
            b.state_in = slot + s - 1;
            b.map = slot + s;
            b.last = 0;
            list3[at3 + s - 1] = b;
          }
        }
        list1[at1 + s] = a;
      }
    }
    o1 += total1;
    o3 += total3;
    os += totals;
  }
  WalkSpan empty;  // no tokens, no state read, nothing written
  empty.state_in = kStateZero;
  empty.last = 0;
  empty.out = 0;
  for (std::int64_t i = o1 + tid; i < c.cap1; i += NT) list1[i] = empty;
  for (std::int64_t i = o3 + tid; i < c.cap3; i += NT) list3[i] = empty;
}

constexpr int kCpScanCols = 8;  // value columns per scan CTA (dv / 8 CTAs per sequence and head)

// Stage 2 for (sequence blockIdx.z, head blockIdx.y, value columns [8 blockIdx.x, + 8)), by DK
// threads: thread i owns row i of the running state X (dk x 8, in shared memory, xs: DK * 8
// floats). M is column-major, so the threads' loads of one column are contiguous; each step loads
// all of M's row and N's before it needs X (they do not depend on it). E is in p's state layout.
template <int DK>
__device__ __forceinline__ void cp_scan_cta(const ChunkedParams& p, const int* seq_slots, float* E, const float* M,
                                            float* xs, int tid) {
  constexpr int NC = kCpScanCols;
  grid_dependency_wait();
  const int h = blockIdx.y, c0 = NC * blockIdx.x, i = tid;
  const std::int64_t n = blockIdx.z;
  const int nseg = seq_slots[2 * n + 1];
  if (nseg < 2) return;  // not split
  const std::int64_t cs = p.state_vk ? DK : 1, ds = p.state_vk ? 1 : p.dv;  // column, key strides
  auto at = [&](std::int64_t gs, int col) {
    return (gs * p.num_heads + h) * static_cast<std::int64_t>(DK) * p.dv + i * ds + (c0 + col) * cs;
  };
  const std::int64_t base = seq_slots[2 * n];
#pragma unroll
  for (int j = 0; j < NC; ++j) xs[i * NC + j] = E[at(base, j)];
  for (int s = 1; s < nseg; ++s) {
    const std::int64_t gs = base + s;
    float acc[NC];
#pragma unroll
    for (int j = 0; j < NC; ++j) acc[j] = E[at(gs, j)];
    // The decay shortcut: the segment's start state decayed away (the same for the whole CTA).
    const bool cut = p.map_end != nullptr && p.map_end[2 * (gs * p.num_heads + h) + 1] != 0;
    if (!cut) {  // else E_s = N_s: X is not read (each thread writes only its own row of it)
      const float* const m = M + (gs * p.num_heads + h) * static_cast<std::int64_t>(DK) * DK + i;
      float mi[DK];
#pragma unroll
      for (int k = 0; k < DK; ++k) mi[k] = m[k * DK];  // M[i][k]
      __syncthreads();  // X of the previous step written
#pragma unroll
      for (int k = 0; k < DK; ++k) {
        const float4 x0 = *reinterpret_cast<const float4*>(xs + k * NC);
        const float4 x1 = *reinterpret_cast<const float4*>(xs + k * NC + 4);
        acc[0] = fmaf(mi[k], x0.x, acc[0]);
        acc[1] = fmaf(mi[k], x0.y, acc[1]);
        acc[2] = fmaf(mi[k], x0.z, acc[2]);
        acc[3] = fmaf(mi[k], x0.w, acc[3]);
        acc[4] = fmaf(mi[k], x1.x, acc[4]);
        acc[5] = fmaf(mi[k], x1.y, acc[5]);
        acc[6] = fmaf(mi[k], x1.z, acc[6]);
        acc[7] = fmaf(mi[k], x1.w, acc[7]);
      }
    }
    __syncthreads();  // every thread is done reading X
#pragma unroll
    for (int j = 0; j < NC; ++j) {
      xs[i * NC + j] = acc[j];
      if (!cut) E[at(gs, j)] = acc[j];
    }
    if (s + 1 == nseg && p.want_final_state) {
#pragma unroll
      for (int j = 0; j < NC; ++j)
        p.final_state[(n * p.num_heads + h) * static_cast<std::int64_t>(DK) * p.dv + i * ds + (c0 + j) * cs] = acc[j];
    }
  }
}

// The decay shortcut (Options::split_decay_cutoff > 0), before stage 1: for list-3 entry
// blockIdx.x (a segment s >= 1) and head blockIdx.y, the first chunk after which the gates summed
// from the segment's start fall below log_cutoff, i.e. the start state's weight exp(G) in every
// later row below the cutoff (with gates <= 0 and beta |k|^2 <= 2: docs/math.md). The map walk
// stops after that chunk, the correction covers only the rows before, and the scan takes M_s = 0
// (map_end: ChunkedParams::map_end). NT threads (a power of 2), one chunk each per round (sm: NT floats).
template <int NT>
__device__ __forceinline__ void cp_stop_cta(const ChunkedParams& p, const WalkSpan* list3, float log_cutoff,
                                            int* map_end, float* sm, int tid) {
  grid_dependency_wait();
  const WalkSpan w = list3[blockIdx.x];
  if (w.map < 0 || w.begin >= w.end) return;
  const int h = blockIdx.y;
  const int chunks = (w.end - w.begin + kChunk - 1) / kChunk;
  float carry = 0.0f;  // the gates summed over the rounds before
  int stop = -1;       // the chunk after which the walk stops
  for (int c0 = 0; c0 < chunks && stop < 0; c0 += NT) {
    const int c = c0 + tid;
    float x = 0.0f;
    if (c < chunks && p.has_gate) {
      const std::int64_t t0 = w.begin + static_cast<std::int64_t>(c) * kChunk;
      const int n = w.end - t0 < kChunk ? static_cast<int>(w.end - t0) : kChunk;
      for (int r = 0; r < n; ++r) {
        float gv = p.g[(t0 + r) * p.g_token + static_cast<std::int64_t>(h) * p.g_head];
        if (p.gate_linear) gv = logf(fmaxf(gv, FLT_MIN));
        x += gv;
      }
    }
    // Inclusive scan over the round's chunks (Hillis-Steele in shared memory).
    sm[tid] = x;
    __syncthreads();
    for (int d = 1; d < NT; d *= 2) {
      const float y = tid >= d ? sm[tid - d] : 0.0f;
      __syncthreads();
      sm[tid] += y;
      __syncthreads();
    }
    const bool below = c < chunks && carry + sm[tid] < log_cutoff;
    const float total = sm[NT - 1];
    __syncthreads();
    // The first such chunk: a minimum over the threads (tree reduction; NT where none).
    sm[tid] = below ? static_cast<float>(tid) : static_cast<float>(NT);
    __syncthreads();
    for (int d = NT / 2; d > 0; d /= 2) {
      if (tid < d) sm[tid] = fminf(sm[tid], sm[tid + d]);
      __syncthreads();
    }
    const int first = static_cast<int>(sm[0]);
    if (first < NT) stop = c0 + first;
    carry += total;
    __syncthreads();  // sm is rewritten by the next round
  }
  if (tid == 0) {
    const std::int64_t m = 2 * (static_cast<std::int64_t>(w.map) * p.num_heads + h);
    const std::int64_t e = stop < 0 ? w.end : w.begin + static_cast<std::int64_t>(stop + 1) * kChunk;
    map_end[m] = static_cast<int>(e < w.end ? e : w.end);
    map_end[m + 1] = stop >= 0;
  }
}

// Stage 3: value columns per CTA, the chunks of a segment per CTA (its part of the segment), and
// the shared-memory row pitch of E's 16-bit copies (in elements: 8 more than dk, so that the
// lanes' rows fall into different banks); then each warp's staging tile of 16 rows x 32 fp32
// products (pitch 36 floats).
constexpr int kCpFixCols = 64, kCpFixChunks = 8, kCpFixThreads = 128, kCpFixStagePitch = 36;
template <int DK>
constexpr int kCpFixPitch = DK + 8;
template <int DK>
__host__ __device__ constexpr std::size_t cp_fix_smem_bytes() {
  return 2 * std::size_t(kCpFixCols) * kCpFixPitch<DK> * 2 + 4 * 16 * std::size_t(kCpFixStagePitch) * 4;
}

// Stage 3 for (value columns [64 (blockIdx.x % dv/64), + 64), part blockIdx.x / (dv/64) of each
// segment, head blockIdx.y, list-3 entries blockIdx.z, + gridDim.z, ..), 4 warps: for each chunk,
// warp w adds map_o[t] E (E: dk x 64 of the segment's start state) to rows t = 16 w .. 16 w + 15
// of o, on m16n8k16 products with map_o rows as A (from global memory, the next chunk's loaded
// while this one's run) and E as B, E split into hi + lo = E to about 2^-16 relative. The
// products pass through shared memory so that o is read and written 16 bytes at a time (the CUDA
// backend requires o 16-byte aligned with strides of multiples of 8 elements; es:
// cp_fix_smem_bytes, [hi | lo][column][key], then the staging tiles).
template <typename T, int DK>
__device__ __forceinline__ void cp_fix_cta(const ChunkedParams& p, const WalkSpan* list3, std::int64_t count,
                                           const float* E, const T* map_o, std::uint16_t* es, int tid) {
  constexpr int NC = kCpFixCols, PITCH = kCpFixPitch<DK>, SP = kCpFixStagePitch;
  const int blocks = p.dv / NC, v0 = NC * (static_cast<int>(blockIdx.x) % blocks);
  const int part = static_cast<int>(blockIdx.x) / blocks, h = blockIdx.y;
  const int warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  std::uint16_t* const hi = es;
  std::uint16_t* const lo = es + NC * PITCH;
  float* const stage = reinterpret_cast<float*>(es + 2 * NC * PITCH) + warp * 16 * SP;
  const std::int64_t cs = p.state_vk ? DK : 1, ds = p.state_vk ? 1 : p.dv;  // column, key strides
  const std::int64_t mrow = static_cast<std::int64_t>(p.num_heads) * DK;  // map_o's token stride
  grid_dependency_wait();
  for (std::int64_t i = blockIdx.z; i < count; i += gridDim.z) {
    const WalkSpan w = list3[i];
    // Rows past the map walk's end (the decay shortcut) have no map_o and no correction.
    const int wend = w.map < 0 || p.map_end == nullptr
                         ? w.end
                         : p.map_end[2 * (static_cast<std::int64_t>(w.map) * p.num_heads + h)];
    const int b = w.begin + part * kCpFixChunks * kChunk;
    int e = w.end < b + kCpFixChunks * kChunk ? w.end : b + kCpFixChunks * kChunk;
    e = wend < e ? wend : e;
    if (b >= e) continue;
    __syncthreads();  // the previous entry's E is no longer read
    const float* const src = E + (static_cast<std::int64_t>(w.state_in) * p.num_heads + h) * DK * p.dv + v0 * cs;
    // Consecutive threads read consecutive addresses in either layout; 16 loads in flight per
    // thread before any is used (one round trip per 16, not per element).
    constexpr int kBatch = 16;
    for (int base = 0; base < DK * NC; base += kBatch * kCpFixThreads) {
      float xb[kBatch];
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        const int idx = base + u * kCpFixThreads + tid;
        const int col = p.state_vk ? idx / DK : idx % NC, key = p.state_vk ? idx % DK : idx / NC;
        xb[u] = src[col * cs + key * ds];
      }
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        const int idx = base + u * kCpFixThreads + tid;
        const int col = p.state_vk ? idx / DK : idx % NC, key = p.state_vk ? idx % DK : idx / NC;
        const std::uint32_t xh = pack2<T>(xb[u], 0.0f);
        const float xr = xb[u] - unpack2<T>(xh).x;
        hi[col * PITCH + key] = static_cast<std::uint16_t>(xh & 0xffffu);
        lo[col * PITCH + key] = static_cast<std::uint16_t>(pack2<T>(xr, 0.0f) & 0xffffu);
      }
    }
    __syncthreads();
    // This lane's A fragments of one chunk: rows r, r + 8 (zero past e), keys 16 kk + 2t (+ 8).
    std::uint32_t a[DK / 16][4];
    auto load_a = [&](int c0) {
      const int r0 = c0 + 16 * warp + g, r1 = r0 + 8;
      const T* const m0 = map_o + r0 * mrow + h * DK + 2 * t;
      const T* const m1 = map_o + r1 * mrow + h * DK + 2 * t;
#pragma unroll
      for (int kk = 0; kk < DK / 16; ++kk) {
        a[kk][0] = r0 < e ? *reinterpret_cast<const std::uint32_t*>(m0 + 16 * kk) : 0u;
        a[kk][1] = r1 < e ? *reinterpret_cast<const std::uint32_t*>(m1 + 16 * kk) : 0u;
        a[kk][2] = r0 < e ? *reinterpret_cast<const std::uint32_t*>(m0 + 16 * kk + 8) : 0u;
        a[kk][3] = r1 < e ? *reinterpret_cast<const std::uint32_t*>(m1 + 16 * kk + 8) : 0u;
      }
    };
    load_a(b);
    for (int c0 = b; c0 < e; c0 += kChunk) {
      // This lane's pieces of o: (half, k) is row 16 warp + (lane + 32 k) / 4, columns 32 half +
      // 8 ((lane + 32 k) % 4) .. + 8; loaded before the products so that their latency overlaps.
      const int rbase = c0 + 16 * warp;
      uint4 ov[2][2];
#pragma unroll
      for (int half = 0; half < 2; ++half)
#pragma unroll
        for (int k = 0; k < 2; ++k) {
          const int idx = lane + 32 * k, r = rbase + idx / 4;
          if (r < e)
            ov[half][k] = *reinterpret_cast<const uint4*>(static_cast<const T*>(p.o) + r * p.o_token + h * p.o_head +
                                                          v0 + 32 * half + 8 * (idx % 4));
        }
      float acc[NC / 8][4] = {};
#pragma unroll
      for (int kk = 0; kk < DK / 16; ++kk)
#pragma unroll
        for (int nt = 0; nt < NC / 8; ++nt) {
          const int off = (8 * nt + g) * PITCH + 16 * kk + 2 * t;
          mma16816<T>(acc[nt], a[kk], *reinterpret_cast<const std::uint32_t*>(hi + off),
                      *reinterpret_cast<const std::uint32_t*>(hi + off + 8));
          mma16816<T>(acc[nt], a[kk], *reinterpret_cast<const std::uint32_t*>(lo + off),
                      *reinterpret_cast<const std::uint32_t*>(lo + off + 8));
        }
      if (c0 + kChunk < e) load_a(c0 + kChunk);  // in flight during the o update
      // o (16-bit) += the products, rounded once; 32 columns at a time through the staging tile.
#pragma unroll
      for (int half = 0; half < 2; ++half) {
#pragma unroll
        for (int nt = 0; nt < NC / 16; ++nt)
#pragma unroll
          for (int hh = 0; hh < 2; ++hh)
            *reinterpret_cast<float2*>(stage + (g + 8 * hh) * SP + 8 * nt + 2 * t) =
                make_float2(acc[NC / 16 * half + nt][2 * hh], acc[NC / 16 * half + nt][2 * hh + 1]);
        __syncwarp();
#pragma unroll
        for (int k = 0; k < 2; ++k) {
          const int idx = lane + 32 * k, rr = idx / 4, c8 = 8 * (idx % 4), r = rbase + rr;
          if (r < e) {
            T* const at = static_cast<T*>(p.o) + r * p.o_token + h * p.o_head + v0 + 32 * half + c8;
            const float* const x = stage + rr * SP + c8;
            std::uint32_t* const u = reinterpret_cast<std::uint32_t*>(&ov[half][k]);
#pragma unroll
            for (int q = 0; q < 4; ++q) {
              const float2 f = unpack2<T>(u[q]);
              u[q] = pack2<T>(f.x + x[2 * q], f.y + x[2 * q + 1]);
            }
            *reinterpret_cast<uint4*>(at) = ov[half][k];
          }
        }
        __syncwarp();
      }
    }
  }
}

}  // namespace gdnkit::cuda
