// Context parallelism on one GPU (docs/math.md "Splitting a sequence"): the device side of the three
// stages that cp.cu launches back to back on one stream.
//
// Sequence n (len_n tokens, from cu_seqlens or the uniform length) is cut at chunk borders into
// nseg_n = max(1, ceil(len_n / seg)) segments of `seg` tokens (the last one shorter). A sequence
// of nseg_n >= 2 owns the slots slot_n .. slot_n + nseg_n - 2 of E and M (slot_n: the sum of
// nseg_m - 1 over the sequences before it; at most T / seg slots in all).
//   Build (cp_build_lists, one CTA): both walk lists from the lengths, on the device (the host
//     need not know them: the lists are sized by upper bounds and padded with empty walks).
//   Stage 1, the fused kernel over list 1: segment 0 of each sequence from its initial state,
//     writing its rows of o and its end state to E[slot_n]; segments 1 .. nseg_n - 2 from zero
//     without o, writing N_s to E[slot_n + s], while the map CTAs walk the identity through the
//     same tokens with V = 0 and write M_s to M[slot_n + s]. An unsplit sequence (nseg_n = 1) is
//     walked whole here. Then S_end(s) = M_s S_end(s - 1) + N_s.
//   Stage 2, cp_scan_cta: per (sequence, head, 8 value columns), E[slot_n + s] <- M_s E[slot_n + s - 1]
//     + E[slot_n + s] for s = 1 .. nseg_n - 2, in fp32, in order: E then holds the end states.
//   Stage 3, the fused kernel over list 3: segments 1 .. nseg_n - 1 from E[slot_n + s - 1],
//     writing o, the last one the sequence's final state.
// The segment-0 walks in stage 1 and all of stage 3 compute the same chunks, in the same order and
// from the same states (up to the scan's rounding), as the unsplit kernel.
#pragma once

#include <cstdint>

#include "cuda/chunk_io.cuh"
#include "cuda/chunked.h"

namespace gdnkit::cuda {

struct CpLayout {
  int seg = 0;                   // tokens per segment, a multiple of 64
  std::int64_t cap1 = 0, cap3 = 0;  // list lengths: N + slots, slots
  std::int64_t slots = 0;        // E and M slots: floor(T / seg) bounds the sum of nseg_n - 1
  static CpLayout of(std::int64_t tokens, std::int64_t seqs, int seg) {
    CpLayout c;
    c.seg = seg;
    c.slots = tokens / seg;
    c.cap1 = seqs + c.slots;
    c.cap3 = c.slots;
    return c;
  }
};

constexpr int kCpBuildThreads = 256;

// Both walk lists and the per-sequence table seq_slots[2 n] = slot_n, [2 n + 1] = nseg_n, by one
// CTA of NT threads (sm: 2 NT ints of shared memory). Sequences are taken NT at a time: an
// exclusive scan of their list-1 and list-3 entry counts places them; the tails are padded with
// empty walks.
template <int NT>
__device__ __forceinline__ void cp_build_lists(const ChunkedParams& p, const CpLayout& c, WalkSpan* list1,
                                               WalkSpan* list3, int* seq_slots, int* sm, int tid) {
  std::int64_t o1 = 0, o3 = 0;  // entries placed so far (list 3's are also the slots)
  for (std::int64_t base = 0; base < p.num_seqs; base += NT) {
    const std::int64_t n = base + tid;
    const bool here = n < p.num_seqs;
    // Clamped into [0, T] (the run does not check cu_seqlens: a decreasing or out-of-range one
    // gives wrong numbers, as the unsplit kernel would, but no access outside the buffers).
    std::int64_t bos = here ? seq_begin(p, n) : 0, eos = here ? seq_begin(p, n + 1) : 0;
    bos = bos < 0 ? 0 : bos > p.tokens ? p.tokens : bos;
    eos = eos < bos ? bos : eos > p.tokens ? p.tokens : eos;
    const int nseg = here ? static_cast<int>(eos - bos > c.seg ? (eos - bos + c.seg - 1) / c.seg : 1) : 0;
    const int e1 = here ? (nseg > 1 ? nseg - 1 : 1) : 0, e3 = here ? nseg - 1 : 0;
    // Inclusive scans of e1 and e3 over the NT threads (Hillis-Steele in shared memory).
    int* const s1 = sm;
    int* const s3 = sm + NT;
    s1[tid] = e1;
    s3[tid] = e3;
    __syncthreads();
    for (int d = 1; d < NT; d *= 2) {
      const int a = tid >= d ? s1[tid - d] : 0, b = tid >= d ? s3[tid - d] : 0;
      __syncthreads();
      s1[tid] += a;
      s3[tid] += b;
      __syncthreads();
    }
    const std::int64_t at1 = o1 + s1[tid] - e1, at3 = o3 + s3[tid] - e3;
    const std::int64_t total1 = s1[NT - 1], total3 = s3[NT - 1];
    __syncthreads();  // the totals are read before the next round overwrites them
    if (here) {
      const auto slot = static_cast<std::int32_t>(at3);
      seq_slots[2 * n] = slot;
      seq_slots[2 * n + 1] = at1 + e1 <= c.cap1 && at3 + e3 <= c.cap3 ? nseg : 1;  // 1: no scan (see below)
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
      // The bounds hold for valid cu_seqlens (sum of nseg_n - 1 <= T / seg); the checks keep an
      // invalid one (sequences overlapping) inside the lists and slots.
      for (int s = 0; s + 1 < nseg && at1 + s < c.cap1 && at3 + s < c.cap3; ++s) {
        WalkSpan a = span(s);
        a.last = 0;
        a.state_out = slot + s;
        if (s > 0) {
          a.state_in = kStateZero;
          a.map = slot + s;
          a.out = 0;
        }
        list1[at1 + s] = a;
        WalkSpan b = span(s + 1);
        b.state_in = slot + s;
        b.last = s + 2 == nseg;
        list3[at3 + s] = b;
      }
    }
    o1 += total1;
    o3 += total3;
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
  const int h = blockIdx.y, c0 = NC * blockIdx.x, i = tid;
  const std::int64_t n = blockIdx.z;
  const int nseg = seq_slots[2 * n + 1];
  if (nseg < 3) return;  // no middle segment: E[slot_n] is already the start of segment 1
  const std::int64_t cs = p.state_vk ? DK : 1, ds = p.state_vk ? 1 : p.dv;  // column, key strides
  auto at = [&](std::int64_t gs, int col) {
    return (gs * p.num_heads + h) * static_cast<std::int64_t>(DK) * p.dv + i * ds + (c0 + col) * cs;
  };
  const std::int64_t base = seq_slots[2 * n];
#pragma unroll
  for (int j = 0; j < NC; ++j) xs[i * NC + j] = E[at(base, j)];
  for (int s = 1; s + 1 < nseg; ++s) {
    const std::int64_t gs = base + s;
    const float* const m = M + (gs * p.num_heads + h) * static_cast<std::int64_t>(DK) * DK + i;
    float mi[DK], acc[NC];
#pragma unroll
    for (int k = 0; k < DK; ++k) mi[k] = m[k * DK];  // M[i][k]
#pragma unroll
    for (int j = 0; j < NC; ++j) acc[j] = E[at(gs, j)];
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
    __syncthreads();  // every thread is done reading X
#pragma unroll
    for (int j = 0; j < NC; ++j) {
      xs[i * NC + j] = acc[j];
      E[at(gs, j)] = acc[j];
    }
  }
}

}  // namespace gdnkit::cuda
