// Context parallelism on one GPU (docs/math.md "Splitting a sequence"): the device side of the
// launches that cp.cu enqueues back to back on one stream (up to four: the builder and the scan
// only where needed).
//
// Sequence n (len_n tokens, from cu_seqlens or the uniform length) is cut at chunk borders into
// nseg_n = max(1, ceil(len_n / seg)) segments of `seg` tokens (the last one shorter). A sequence
// of nseg_n >= 2 owns the slots slot_n .. slot_n + nseg_n - 1 of E and M (slot_n: the sum of
// nseg_m over the split sequences before it; CpLayout::slots bounds the total).
//   Build (cp_build_lists, one CTA): both lists from the lengths, on the device (the host need not
//     know them: the lists are sized by upper bounds and padded with empty walks). Not launched for
//     one sequence or sequences of one length: each kernel then computes the entries it reads from
//     their index (cp_walk_entry, ChunkedParams::cp_seg), the same entries the builder would write.
//     Nor for an exact split of a few sequences (cp.cu, kCpPackedMaxSeqs): stage 1 then places its
//     own entries and writes list 3 and the table for the scan and the correction
//     (cp_warp_packed_stage1, ChunkedParams::cp_seq_slots).
//   Stage 1, the fused kernel over list 1: segment 0 of each split sequence from its initial
//     state, segments 1 .. nseg_n - 1 from zero, every one writing its rows of o and its end state
//     to E[slot_n + s] (N_s for s >= 1); the map CTAs walk the identity through the same tokens of
//     segments s >= 1 with V = 0, writing M_s to M[slot_n + s] and their output rows to map_o: row
//     t is the linear map from the segment's start state to o_t. An unsplit sequence (nseg_n = 1)
//     is walked whole here, exactly as the unsplit kernel walks it.
//     Lead mode (CpLayout::lead: one sequence in two segments, exact, dk = dv = 128): the same
//     launch runs the first segment on the unsplit 64-column pairs, which write its end state to
//     E[0] as their final state, beside the second segment's value and map pair
//     (gdn_fused_lead_kernel); the planner makes the first segment the longer one (cp_model.cpp).
//   Stage 2, cp_scan_cta: per (sequence, head, 8 value columns), E[slot_n + s] <- M_s E[slot_n + s - 1]
//     + E[slot_n + s] for s = 1 .. nseg_n - 1, in fp32, in order: E then holds the true end states,
//     the last one the sequence's final state (also written to final_state). Without a final state
//     the last step is skipped (no correction reads it), and so is the launch where no sequence
//     has three segments or more and the host knows it (computed lists).
//   Stage 3, cp_fix_cta over list 3 (segments s >= 1): o_t += map_o[t] E[slot_n + s - 1], a
//     chunk-parallel product (E split into a 16-bit hi + lo pair, fp32 accumulation).
// Every token's o is thus walked once (the unsplit kernel's work), plus one identity walk of dk
// columns per segment after the first, instead of the two walks of a re-walk of each segment.
// The decay shortcut (cutoff > 0) adds cp_stop_cta before stage 1: the identity walks then stop
// where the segment's gates have decayed its start state below the cutoff (ChunkedParams::map_end).
#pragma once

#include <cfloat>
#include <cstdint>

#include "common/gate.h"
#include "cuda/chunk_io.cuh"
#include "cuda/chunked.h"
#include "cuda/cp.h"
#include "cuda/mma_sm80.cuh"
#include "cuda/pdl.cuh"
#include "cuda/wgmma_sm90.cuh"
#include "cuda/wmma_common.cuh"

namespace gdnkit::cuda {

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
    std::int64_t bos = 0, eos = 0;
    if (here) seq_range(p, n, bos, eos);
    const int nseg = here ? cp_segments(eos - bos, c.seg) : 0;
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
      // The bounds hold for valid cu_seqlens; an invalid one (sequences overlapping) is kept inside
      // the lists and slots (cp_placed_entry: every entry inside the lists written), and the scan
      // then skips the sequence (nseg 1).
      const CpPlace q{n, bos, eos, at1, at3, ats, nseg};
      seq_slots[2 * n] = static_cast<std::int32_t>(ats);
      seq_slots[2 * n + 1] = cp_table_segments(q, c.cap1, c.cap3, c.slots);
      for (int s = 0; s < nseg && at1 + s < c.cap1; ++s) {
        list1[at1 + s] = cp_placed_entry(q, c.seg, c.cap1, c.slots, s, false);
        if (s > 0 && at3 + s - 1 < c.cap3) list3[at3 + s - 1] = cp_placed_entry(q, c.seg, c.cap1, c.slots, s, true);
      }
    }
    o1 += total1;
    o3 += total3;
    os += totals;
  }
  const WalkSpan empty = cp_empty_entry();
  for (std::int64_t i = o1 + tid; i < c.cap1; i += NT) list1[i] = empty;
  for (std::int64_t i = o3 + tid; i < c.cap3; i += NT) list3[i] = empty;
}

// Value columns per scan CTA (dv / 8 CTAs per sequence and head): the N of the step's m16n8k8
// products. (16 and 32 columns per CTA, on the FFMA step before 3xTF32, were 9% and 29% slower.)
constexpr int kCpScanCols = 8;
// One warp per 16 rows of X (the M of m16n8k8).
template <int DK>
__host__ __device__ constexpr int cp_scan_threads() {
  return 32 * (DK / 16);
}

// The scan's shared memory: two buffers of M (DK x DK fp32 each), the running state X (DK x 8
// fp32) and the buffers' two mbarriers.
template <int DK>
__host__ __device__ constexpr std::size_t cp_scan_smem_bytes() {
  return (2 * std::size_t(DK) * DK + std::size_t(DK) * kCpScanCols) * 4 + 2 * 8;
}

// Stage 2 for (sequence blockIdx.z, head blockIdx.y, value columns [8 blockIdx.x, + 8)), by
// cp_scan_threads<DK>() threads: warp w forms rows [16 w, 16 w + 16) of X <- M X + N (X: dk x 8,
// in shared memory) on mma.sync m16n8k8 with tf32 operands split as hi + lo (three products per
// tile in three accumulators: hi hi + hi lo + lo hi, error ~2^-21 per product, as the inverse's;
// tests/cpu/test_inverse.cpp), the lane holding rows 16 w + g, + 8 and columns 2 t, 2 t + 1. Each
// step's M arrives in shared memory by one bulk copy that thread 0 issues two steps ahead, on the
// step's buffer's mbarrier, in the A-fragment order stage 1 stored it in (map_m_index): each
// k-step's fragment is one 16-byte load, a warp's 512 contiguous bytes (column-major M had cost
// 4-way bank conflicts; copied by columns to a padded pitch, the copies set the step: perf-notes).
// E is in p's state layout. sm: cp_scan_smem_bytes<DK>(), 16-byte aligned.
template <int DK>
__device__ __forceinline__ void cp_scan_cta(const ChunkedParams& p, const int* seq_slots, float* E, const float* M,
                                            unsigned char* sm, int tid) {
  constexpr int NC = kCpScanCols, P = DK;
  float* const mbuf = reinterpret_cast<float*>(sm);  // [2][DK x DK], M[i][k] at map_m_index<DK>(i, k)
  float* const xs = mbuf + 2 * DK * P;               // [DK][NC]
  std::uint64_t* const bar = reinterpret_cast<std::uint64_t*>(xs + DK * NC);
  const int h = blockIdx.y, warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  const int r0 = 16 * warp + g, c0 = NC * blockIdx.x + 2 * t;  // the lane's rows r0, r0 + 8; columns c0, c0 + 1
  const std::int64_t n = blockIdx.z;
  grid_dependency_wait();
  int nseg;
  std::int64_t base;
  if (seq_slots != nullptr) {
    nseg = seq_slots[2 * n + 1], base = seq_slots[2 * n];
  } else {  // lists not built (ChunkedParams::cp_seg)
    std::int64_t bos, eos;
    seq_range(p, n, bos, eos);
    nseg = cp_segments(eos - bos, p.cp_seg), base = n * p.cp_per_seq;
  }
  // Step s makes E[base + s] the true state, which the correction of segment s + 1 reads; the
  // last step's state is only the sequence's final state, not computed where none is wanted.
  const int steps = p.want_final_state ? nseg : nseg - 1;  // steps 1 .. steps - 1
  if (steps < 2) return;  // not split, or two segments and no final state
  if (tid == 0) {
    mbar_init(&bar[0], 1);
    mbar_init(&bar[1], 1);
    mbar_init_fence();
  }
  __syncthreads();  // the barriers initialised before any thread arms or waits on them
  const bool vk = p.state_vk;
  // The lane's four elements of slot gs: (row r0 + 8 hh, column c0 + e) at x[2 hh + e].
  auto at = [&](std::int64_t gs, int hh, int e) {
    const std::int64_t m = (gs * p.num_heads + h) * static_cast<std::int64_t>(DK) * p.dv;
    return vk ? m + static_cast<std::int64_t>(c0 + e) * DK + r0 + 8 * hh : m + static_cast<std::int64_t>(r0 + 8 * hh) * p.dv + c0 + e;
  };
  auto load = [&](const float* e, std::int64_t gs, float (&x)[4]) {
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      if (!vk) {
        const float2 a = *reinterpret_cast<const float2*>(e + at(gs, hh, 0));
        x[2 * hh] = a.x, x[2 * hh + 1] = a.y;
      } else {
        x[2 * hh] = e[at(gs, hh, 0)], x[2 * hh + 1] = e[at(gs, hh, 1)];
      }
    }
  };
  auto store = [&](float* e, std::int64_t gs, const float (&x)[4]) {
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      if (!vk) {
        *reinterpret_cast<float2*>(e + at(gs, hh, 0)) = make_float2(x[2 * hh], x[2 * hh + 1]);
      } else {
        e[at(gs, hh, 0)] = x[2 * hh], e[at(gs, hh, 1)] = x[2 * hh + 1];
      }
    }
  };
  auto put_x = [&](const float (&x)[4]) {
#pragma unroll
    for (int hh = 0; hh < 2; ++hh)
      *reinterpret_cast<float2*>(xs + (r0 + 8 * hh) * NC + 2 * t) = make_float2(x[2 * hh], x[2 * hh + 1]);
  };
  // The decay shortcut: step s's start state decayed away (the same for the whole CTA), M_s unused.
  auto cut = [&](int s) {
    return p.map_end != nullptr && p.map_end[2 * ((base + s) * p.num_heads + h) + 1] != 0;
  };
  auto issue = [&](int s) {  // thread 0: M_s into buffer s % 2
    if (s >= steps || cut(s)) return;
    constexpr std::uint32_t bytes = DK * DK * 4;
    mbar_expect_tx(&bar[s & 1], bytes);
    bulk_load(mbuf + (s & 1) * DK * P, M + ((base + s) * p.num_heads + h) * static_cast<std::int64_t>(DK) * DK, bytes,
              &bar[s & 1]);
  };
  if (tid == 0) {
    issue(1);
    issue(2);
  }
  {
    float x[4];
    load(E, base, x);
    put_x(x);
  }
  unsigned phase = 0;  // bit b: the parity of buffer b's next copy (its barrier's phase)
  float nxt[4];        // N_s, loaded a step ahead
  load(E, base + 1, nxt);
  for (int s = 1; s < steps; ++s) {
    float acc[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) acc[j] = nxt[j];
    if (s + 1 < steps) load(E, base + s + 1, nxt);
    const bool skip = cut(s);
    if (!skip) {  // else E_s = N_s: X is not read
      // This warp's fragments of M (map_m_index): k-step ks at m + 128 ks.
      const float* const m = mbuf + (s & 1) * DK * P + (warp * (DK / 8) * 32 + lane) * 4;
      mbar_wait(&bar[s & 1], (phase >> (s & 1)) & 1);
      phase ^= 1u << (s & 1);
      __syncthreads();  // X of the previous step written
      float d[3][4] = {};  // lo hi, hi lo, hi hi
#pragma unroll 4
      for (int k0 = 0; k0 < DK; k0 += 8) {
        // A = M rows 16 w .., columns k0 ..: a0 (g, t), a1 (g + 8, t), a2 (g, t + 4), a3 (g + 8, t + 4),
        // one 16-byte load (a warp reads 512 contiguous bytes: no bank conflicts).
        const float4 a4 = *reinterpret_cast<const float4*>(m + 16 * k0);
        const float av[4] = {a4.x, a4.y, a4.z, a4.w};
        // B = X rows k0 .., columns 0 .. 7: b0 (t, g), b1 (t + 4, g).
        const float bv[2] = {xs[(k0 + t) * NC + g], xs[(k0 + t + 4) * NC + g]};
        std::uint32_t ah[4], al[4], bh[2], bl[2];
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          tf32_split(av[e], ah[e], al[e]);
        }
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          tf32_split(bv[e], bh[e], bl[e]);
        }
        mma1688_tf32(d[0], al, bh[0], bh[1]);
        mma1688_tf32(d[1], ah, bl[0], bl[1]);
        mma1688_tf32(d[2], ah, bh[0], bh[1]);
      }
#pragma unroll
      for (int j = 0; j < 4; ++j) acc[j] += (d[0][j] + d[1][j]) + d[2][j];
    }
    __syncthreads();  // every thread is done reading X and this step's buffer
    if (tid == 0) issue(s + 2);
    put_x(acc);
    if (!skip) store(E, base + s, acc);
    if (s + 1 == nseg && p.want_final_state) {
      float* const f = p.final_state + (n * p.num_heads + h) * static_cast<std::int64_t>(DK) * p.dv;
#pragma unroll
      for (int hh = 0; hh < 2; ++hh)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int r = r0 + 8 * hh, c = c0 + e;
          f[vk ? static_cast<std::int64_t>(c) * DK + r : static_cast<std::int64_t>(r) * p.dv + c] = acc[2 * hh + e];
        }
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
  const WalkSpan w = cp_walk_entry(p, list3, blockIdx.x, true);
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
        x += detail::log_gate(p.g[(t0 + r) * p.g_token + static_cast<std::int64_t>(h) * p.g_head], p.gate_linear);
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
// each warp's staging tile of 16 rows x 32 fp32 products (pitch 36 floats).
constexpr int kCpFixCols = 64, kCpFixChunks = 8, kCpFixThreads = 128, kCpFixStagePitch = 36;
// E's 16-bit hi and lo copies as wgmma B tiles (128-byte swizzled, dk / 64 column blocks of 64
// rows each), then the staging tiles; plus the slack that aligns the tiles to 1024 bytes.
template <int DK>
constexpr std::size_t kCpFixTileBytes = std::size_t(DK) * kCpFixCols * 2;
template <int DK>
__host__ __device__ constexpr std::size_t cp_fix_smem_bytes() {
  return 2 * kCpFixTileBytes<DK> + 4 * 16 * std::size_t(kCpFixStagePitch) * 4 + kSwizzleAtomBytes;
}

// Stage 3 for (value columns [64 (blockIdx.x % dv/64), + 64), part blockIdx.x / (dv/64) of each
// segment, head blockIdx.y, list-3 entries blockIdx.z, + gridDim.z, ..), one warpgroup: for each
// chunk of 64 rows t, o_t += map_o[t] E (E: dk x 64 of the segment's start state) on wgmma
// (m64n64k16), map_o's rows as A from registers (warp w: rows 16 w .. 16 w + 15, each k-step's
// fragment one 16-byte load: map_o_piece) and E as B from shared memory, split into hi + lo = E to about
// 2^-16 relative. The products pass through shared memory so that o is read and written 16 bytes
// at a time (the CUDA backend requires o 16-byte aligned with strides of multiples of 8 elements).
// es: cp_fix_smem_bytes<DK>().
template <typename T, int DK>
__device__ __forceinline__ void cp_fix_cta(const ChunkedParams& p, const WalkSpan* list3, std::int64_t count,
                                           const float* E, const T* map_o, unsigned char* es, int tid) {
  constexpr int NC = kCpFixCols, SP = kCpFixStagePitch, TB = static_cast<int>(kCpFixTileBytes<DK>);
  const int blocks = p.dv / NC, v0 = NC * (static_cast<int>(blockIdx.x) % blocks);
  const int part = static_cast<int>(blockIdx.x) / blocks, h = blockIdx.y;
  const int warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  unsigned char* const hi = es + ((kSwizzleAtomBytes - (smem_addr(es) & (kSwizzleAtomBytes - 1))) & (kSwizzleAtomBytes - 1));
  unsigned char* const lo = hi + TB;
  float* const stage = reinterpret_cast<float*>(lo + TB) + warp * 16 * SP;
  const std::int64_t cs = p.state_vk ? DK : 1, ds = p.state_vk ? 1 : p.dv;  // column, key strides
  // B's k-step kk (16 product keys) of the hi or lo tile: column block kk / 4, 32 bytes per step.
  const std::uint64_t dhi = gmma_desc(hi, 16, 1024), dlo = gmma_desc(lo, 16, 1024);
  grid_dependency_wait();
  for (std::int64_t i = blockIdx.z; i < count; i += gridDim.z) {
    const WalkSpan w = cp_walk_entry(p, list3, i, true);
    // Rows past the map walk's end (the decay shortcut) have no map_o and no correction.
    const int wend = w.map < 0 || p.map_end == nullptr
                         ? w.end
                         : p.map_end[2 * (static_cast<std::int64_t>(w.map) * p.num_heads + h)];
    const int b = w.begin + part * kCpFixChunks * kChunk;
    int e = w.end < b + kCpFixChunks * kChunk ? w.end : b + kCpFixChunks * kChunk;
    e = wend < e ? wend : e;
    if (b >= e) continue;
    __syncthreads();  // the previous entry's products (retired) no longer read the tiles
    const float* const src = E + (static_cast<std::int64_t>(w.state_in) * p.num_heads + h) * DK * p.dv + v0 * cs;
    // E's dk x 64 block into the hi and lo tiles, a unit (column n, product keys 8 q8 .. + 7) at a
    // time: one 16-byte store per tile, eight rows of a tile apart in consecutive threads (no bank
    // conflicts); consecutive threads read consecutive columns. Two units' loads are issued before
    // their stores (more in flight raised the kernel's registers from 118 to 255 and spilled).
    constexpr int kUnits = DK * NC / 8 / kCpFixThreads, kBatch = 2;
#pragma unroll 1
    for (int u0 = 0; u0 < kUnits; u0 += kBatch) {
      float xb[kBatch][8];
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        const int idx = (u0 + u) * kCpFixThreads + tid, n = idx % NC, q8 = idx / NC;
#pragma unroll
        for (int q = 0; q < 8; ++q) xb[u][q] = src[n * cs + (8 * q8 + q) * ds];
      }
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        const int idx = (u0 + u) * kCpFixThreads + tid, n = idx % NC, q8 = idx / NC;
        std::uint32_t wh[4], wl[4];
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          wh[q] = pack2<T>(xb[u][2 * q], xb[u][2 * q + 1]);
          const float2 r = unpack2<T>(wh[q]);
          wl[q] = pack2<T>(xb[u][2 * q] - r.x, xb[u][2 * q + 1] - r.y);
        }
        const std::uint32_t off = (q8 / 8) * (NC * 128) + swizzle128(n, q8 % 8);
        *reinterpret_cast<uint4*>(hi + off) = make_uint4(wh[0], wh[1], wh[2], wh[3]);
        *reinterpret_cast<uint4*>(lo + off) = make_uint4(wl[0], wl[1], wl[2], wl[3]);
      }
    }
    gmma_smem_fence();  // the tiles' stores, before wgmma reads them
    __syncthreads();
    // This lane's A fragments of one chunk (warp w: rows 16 w .. + 15), one 16-byte piece per
    // k-step (map_o_piece). A block at or past e reads the block holding row e - 1 instead, which
    // stage 1 wrote: a row of the product depends on its own row of A alone, and those rows'
    // results are not stored. Rows past e in that block hold zeros or finite values.
    std::uint32_t a[DK / 16][4];
    auto load_a = [&](int c0) {
      const int r = c0 + 16 * warp < e ? c0 + 16 * warp : c0 + 16 * ((e - 1 - c0) / 16);
      const T* const m = map_o + map_o_piece(r, h, 0, lane, p.num_heads, DK);
#pragma unroll
      for (int kk = 0; kk < DK / 16; ++kk) {
        const uint4 x = *reinterpret_cast<const uint4*>(m + 256 * kk);
        a[kk][0] = x.x, a[kk][1] = x.y, a[kk][2] = x.z, a[kk][3] = x.w;
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
      float acc[NC / 2];  // m64n64's accumulator: C tile j (columns 8 j ..) at acc[4 j ..]
#pragma unroll
      for (int kk = 0; kk < DK / 16; ++kk) gmma_fence(a[kk]);
      gmma_fence(acc);
      gmma_arrive();
#pragma unroll
      for (int kk = 0; kk < DK / 16; ++kk) {
        gmma_rs<T, NC, false>(acc, a[kk], gmma_desc_add(dhi, gmma_kstep(kk, NC)), kk > 0);
        gmma_rs<T, NC, false>(acc, a[kk], gmma_desc_add(dlo, gmma_kstep(kk, NC)), true);
      }
      gmma_commit();
      gmma_wait<0>();
      gmma_fence(acc);
#pragma unroll
      for (int kk = 0; kk < DK / 16; ++kk) gmma_fence(a[kk]);
      if (c0 + kChunk < e) load_a(c0 + kChunk);  // in flight during the o update
      // o (16-bit) += the products, rounded once; 32 columns at a time through the staging tile.
#pragma unroll
      for (int half = 0; half < 2; ++half) {
#pragma unroll
        for (int nt = 0; nt < NC / 16; ++nt)
#pragma unroll
          for (int hh = 0; hh < 2; ++hh)
            *reinterpret_cast<float2*>(stage + (g + 8 * hh) * SP + 8 * nt + 2 * t) =
                make_float2(acc[4 * (NC / 16 * half + nt) + 2 * hh], acc[4 * (NC / 16 * half + nt) + 2 * hh + 1]);
        __syncwarp();
#pragma unroll
        for (int k = 0; k < 2; ++k) {
          const int idx = lane + 32 * k, rr = idx / 4, c8 = 8 * (idx % 4), r = rbase + rr;
          if (r < e) {
            T* const at = static_cast<T*>(p.o) + r * p.o_token + h * p.o_head + v0 + 32 * half + c8;
            // Two 16-byte loads (the compiler split a plain read into eight 32-bit loads, 4-way
            // bank conflicts); at pitch 36 the two rows of a quarter warp fall in distinct banks.
            const float4 x0 = *reinterpret_cast<const float4*>(stage + rr * SP + c8);
            const float4 x1 = *reinterpret_cast<const float4*>(stage + rr * SP + c8 + 4);
            const float x[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
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
