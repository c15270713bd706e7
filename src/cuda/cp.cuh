// Context parallelism on one GPU (docs/math.md "Splitting a sequence"): the device side of the three
// stages that cp.cu launches back to back on one stream.
//
// Every sequence (N of them, L tokens each) is cut at chunk borders into nseg segments of `seg`
// tokens (the last one shorter). Segment (n, s) has the global index gs = n nseg + s.
//   Stage 1, the fused kernel over list1 (N (nseg - 1) walks): segment 0 of each sequence from its
//     initial state, writing its rows of o and its end state E[gs]; segments 1 .. nseg - 2 from zero
//     without o, writing N_s to E[gs], while the map CTAs walk the identity through the same tokens
//     with V = 0 and write M_s to Mbuf[gs]. Then S_end(s) = M_s S_end(s - 1) + N_s.
//   Stage 2, cp_scan: per (sequence, head, 32 value columns), E[gs] <- M_s E[gs - 1] + E[gs] for
//     s = 1 .. nseg - 2, in fp32, in order: E[gs] is then the end state of segment s.
//   Stage 3, the fused kernel over list3 (N (nseg - 1) walks): segments 1 .. nseg - 1 from
//     E[gs - 1], writing o, the last one the sequence's final state.
// The segment-0 walks in stage 1 and all of stage 3 compute the same chunks, in the same order and
// from the same states (up to the scan's rounding), as the unsplit kernel.
#pragma once

#include <cstdint>

#include "cuda/chunked.h"

namespace gdnkit::cuda {

struct CpLayout {
  std::int64_t num_seqs = 0;  // N, each of len tokens (sequence n starts at n len)
  std::int64_t len = 0;
  int seg = 0;                // tokens per segment, a multiple of 64
  int nseg = 0;               // ceil(len / seg), >= 2
  __host__ __device__ std::int64_t walks() const { return num_seqs * (nseg - 1); }
};

// Walk i of both lists (i < N (nseg - 1)); one thread per walk.
__device__ __forceinline__ void cp_build_walk(const CpLayout& c, std::int64_t i, WalkSpan* list1, WalkSpan* list3) {
  const std::int64_t n = i / (c.nseg - 1);
  const int s1 = static_cast<int>(i % (c.nseg - 1));  // list 1: segment s1; list 3: segment s1 + 1
  const std::int64_t bos = n * c.len, eos = bos + c.len;
  const auto base = static_cast<std::int32_t>(n * c.nseg);
  auto span = [&](int s) {
    WalkSpan w;
    w.seq = static_cast<std::int32_t>(n);
    w.begin = static_cast<std::int32_t>(bos + static_cast<std::int64_t>(s) * c.seg);
    const std::int64_t end = bos + static_cast<std::int64_t>(s + 1) * c.seg;
    w.end = static_cast<std::int32_t>(end < eos ? end : eos);
    return w;
  };
  WalkSpan a = span(s1);
  a.last = 0;
  a.state_out = base + s1;
  if (s1 == 0) {
    a.state_in = -1;  // the sequence's initial state
    a.out = 1;
  } else {
    a.state_in = kStateZero;
    a.map = base + s1;
    a.out = 0;
  }
  list1[i] = a;
  WalkSpan b = span(s1 + 1);
  b.state_in = base + s1;
  b.last = s1 + 1 == c.nseg - 1;
  list3[i] = b;
}

constexpr int kCpScanCols = 8;  // value columns per scan CTA (dv / 8 CTAs per sequence and head)

// Stage 2 for (sequence blockIdx.z, head blockIdx.y, value columns [8 blockIdx.x, + 8)), by DK
// threads: thread i owns row i of the running state X (dk x 8, in shared memory, xs: DK * 8
// floats). M is column-major, so the threads' loads of one column are contiguous; each step loads
// all of M's row and N's before it needs X (they do not depend on it). E is in p's state layout.
template <int DK>
__device__ __forceinline__ void cp_scan_cta(const ChunkedParams& p, const CpLayout& c, float* E, const float* M,
                                            float* xs, int tid) {
  constexpr int NC = kCpScanCols;
  const int h = blockIdx.y, c0 = NC * blockIdx.x, i = tid;
  const std::int64_t n = blockIdx.z;
  const std::int64_t cs = p.state_vk ? DK : 1, ds = p.state_vk ? 1 : p.dv;  // column, key strides
  auto at = [&](std::int64_t gs, int col) {
    return (gs * p.num_heads + h) * static_cast<std::int64_t>(DK) * p.dv + i * ds + (c0 + col) * cs;
  };
  const std::int64_t base = n * c.nseg;
#pragma unroll
  for (int j = 0; j < NC; ++j) xs[i * NC + j] = E[at(base, j)];
  for (int s = 1; s + 1 < c.nseg; ++s) {
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
