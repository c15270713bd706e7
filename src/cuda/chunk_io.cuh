// Device helpers shared by the prep and walk kernels: sequence bounds, workspace slots and the
// cp.async copies of chunk rows and lower-block-layout records into shared memory.
#pragma once

#include <cuda_pipeline_primitives.h>

#include <cstdint>

#include "cuda/chunked.h"

namespace gdnkit::cuda {

// 128-byte-swizzled tiles (wgmma operands, TMA boxes; wgmma_sm90.cuh): atoms of 8 rows x 128
// bytes, 1024-byte aligned, the 16-byte chunk c of row r at chunk c ^ (r % 8).
constexpr std::uint32_t kSwizzleAtomBytes = 1024;

// Byte offset of the 16-byte chunk `chunk` of row `row` in a 128-byte-swizzled column block.
__host__ __device__ constexpr std::uint32_t swizzle128(int row, int chunk) {
  return static_cast<std::uint32_t>(row) * 128u + (static_cast<std::uint32_t>(chunk ^ (row & 7)) << 4);
}

// Copies rows [0, n) of a [rows x COLS] 16-bit global matrix (row stride `stride` elements) into
// shared memory (ld LD) with 16-byte cp.async, NT threads; rows [n, rows) are zero-filled.
template <int NT, typename T, int COLS, int LD>
__device__ __forceinline__ void load_rows_async_n(T* dst, const T* src, std::int64_t stride, int n, int rows,
                                                  int tid) {
  constexpr int VEC = 8;
  constexpr int PER_ROW = COLS / VEC;
  for (int idx = tid; idx < rows * PER_ROW; idx += NT) {
    const int row = idx / PER_ROW;
    const int col = (idx % PER_ROW) * VEC;
    T* d = dst + row * LD + col;
    if (row < n)
      __pipeline_memcpy_async(d, src + row * stride + col, 16);
    else
      *reinterpret_cast<uint4*>(d) = make_uint4(0u, 0u, 0u, 0u);
  }
}

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

// Copies block rows [0, nb) of a lower-block-layout matrix (chunked.h) from its workspace record
// into shared memory (the same layout: one contiguous prefix) with 16-byte cp.async, NT threads.
template <int NT, typename T>
__device__ __forceinline__ void load_lower_async(T* dst, const T* src, int nb, int tid) {
  const int vecs = lower_block_off(nb) / 8;
  for (int idx = tid; idx < vecs; idx += NT) __pipeline_memcpy_async(dst + 8 * idx, src + 8 * idx, 16);
}

__device__ __forceinline__ std::int64_t seq_begin(const ChunkedParams& p, std::int64_t n) {
  if (!p.has_cu_seqlens) return n * p.uniform_len;
  return p.cu_seqlens_i64 ? static_cast<const std::int64_t*>(p.cu_seqlens)[n]
                          : static_cast<std::int64_t>(static_cast<const std::int32_t*>(p.cu_seqlens)[n]);
}

// Sequence n's tokens [bos, eos), as every kernel reads them: clamped into [0, T], eos >= bos. run()
// does not check cu_seqlens (validate() does): a decreasing or out-of-range one gives wrong numbers
// but no access outside the buffers, the workspace included.
__device__ __forceinline__ std::int64_t seq_bos(const ChunkedParams& p, std::int64_t n) {
  const std::int64_t b = seq_begin(p, n);
  return b < 0 ? 0 : b > p.tokens ? p.tokens : b;
}
__device__ __forceinline__ void seq_range(const ChunkedParams& p, std::int64_t n, std::int64_t& bos,
                                          std::int64_t& eos) {
  bos = seq_bos(p, n), eos = seq_begin(p, n + 1);
  eos = eos < bos ? bos : eos > p.tokens ? p.tokens : eos;
}
// Segments of a sequence of len tokens cut every seg tokens (one where len <= seg: not split).
__device__ __forceinline__ int cp_segments(std::int64_t len, int seg) {
  return static_cast<int>(len > seg ? (len + seg - 1) / seg : 1);
}

// An entry of a split's lists (cp.cuh) for segment s of sequence n (tokens [bos, eos), nseg
// segments of seg tokens, slots from `slot`): in list 1 (fix false) the stage-1 walk, in list 3
// (fix true, s >= 1) the correction's segment.
__device__ __forceinline__ WalkSpan cp_entry(std::int64_t n, std::int64_t bos, std::int64_t eos, int seg, int nseg,
                                             int slot, int s, bool fix) {
  WalkSpan w;
  w.seq = static_cast<std::int32_t>(n);
  w.begin = static_cast<std::int32_t>(bos + static_cast<std::int64_t>(s) * seg);
  const std::int64_t end = bos + static_cast<std::int64_t>(s + 1) * seg;
  w.end = static_cast<std::int32_t>(nseg == 1 || end > eos ? eos : end);
  if (nseg == 1) return w;  // the whole sequence, as the unsplit kernel walks it
  w.last = 0;               // the scan writes the final state
  if (fix) {
    w.state_in = slot + s - 1;
    w.map = slot + s;
    return w;
  }
  w.state_out = slot + s;
  if (s > 0) {
    w.state_in = kStateZero;
    w.map = slot + s;
  }
  return w;
}

// A list's padding: no tokens, no state read, nothing written.
__device__ __forceinline__ WalkSpan cp_empty_entry() {
  WalkSpan w;
  w.state_in = kStateZero;
  w.last = 0;
  w.out = 0;
  return w;
}

// Entry i of list 1 (fix false) or list 3 (fix true): list[i], or where the lists are not built
// (list == nullptr; ChunkedParams::cp_seg), computed. Sequence n then owns list-1 entries
// [n e, n e + e) and list-3 entries [n (e - 1), (n + 1) (e - 1)), e = cp_per_seq, and the slots
// from n e; entries past its segments are empty.
__device__ __forceinline__ WalkSpan cp_walk_entry(const ChunkedParams& p, const WalkSpan* list, std::int64_t i,
                                                  bool fix) {
  if (list != nullptr) return list[i];
  const int e = p.cp_per_seq - (fix ? 1 : 0);
  if (e <= 0) return cp_empty_entry();
  const std::int64_t n = i / e;
  const int s = static_cast<int>(i - n * e) + (fix ? 1 : 0);
  if (n >= p.num_seqs) return cp_empty_entry();
  std::int64_t bos, eos;
  seq_range(p, n, bos, eos);
  const int nseg = cp_segments(eos - bos, p.cp_seg);
  if (s >= nseg) return cp_empty_entry();
  return cp_entry(n, bos, eos, p.cp_seg, nseg, static_cast<int>(n * p.cp_per_seq), s, fix);
}

// Where a split's lists place sequence n (cp.cuh): its list-1 entries from at1 (nseg of them), its
// list-3 entries from at3 = at1 - n (nseg - 1), its E and M slots from ats (nseg where it is split,
// else none), each an exclusive prefix sum over the sequences before it.
struct CpPlace {
  std::int64_t n, bos, eos, at1, at3, ats;
  int nseg;
};
// Segment s's entry in list 1 (fix false) or list 3 (fix true, s >= 1) of a split of seg-token
// segments whose list 1 has cap1 entries and whose E and M have `slots` slots. The bounds hold for
// valid cu_seqlens; on an invalid one (sequences overlapping) a segment whose list-1 place or slot
// falls outside gets an empty entry, so that every entry inside the lists is written and names
// slots inside E and M (list 3's places are inside whenever list 1's are: at3 + s - 1 < cap3
// implies at1 + s < cap1 and, with at most min(N, cap3) split sequences, ats + s < slots).
__device__ __forceinline__ WalkSpan cp_placed_entry(const CpPlace& q, int seg, std::int64_t cap1, std::int64_t slots,
                                                    int s, bool fix) {
  if (q.at1 + s >= cap1 || (q.nseg > 1 && q.ats + s >= slots)) return cp_empty_entry();
  return cp_entry(q.n, q.bos, q.eos, seg, q.nseg, static_cast<int>(q.ats), s, fix);
}
// Sequence n's segment count in the table the scan reads (seq_slots[2 n + 1]): nseg where all its
// entries and slots fit, else 1 (the scan skips it).
__device__ __forceinline__ int cp_table_segments(const CpPlace& q, std::int64_t cap1, std::int64_t cap3,
                                                 std::int64_t slots) {
  const bool fits =
      q.at1 + q.nseg <= cap1 && q.at3 + q.nseg - 1 <= cap3 && q.ats + (q.nseg > 1 ? q.nseg : 0) <= slots;
  return fits ? q.nseg : 1;
}

// Stage 1 of a packed split without the list builder (ChunkedParams::cp_seq_slots; the walk-list
// kernels' packed instantiation), by one warp of each CTA: the CTA's list-1 entries blockIdx.z +
// k gridDim.z (k < kCtaWalks, below num_walks) into mine[k], placed exactly as cp_build_lists
// places them: the sequences 32 per round, their counts summed by warp scans. The CTAs of head 0's
// first column block also write the list-3 entry that belongs beside each of theirs (list-1 entry
// i of sequence n beside list-3 entry i - n - 1; list-1 padding i beside list-3 padding i - N, as
// cap1 = N + cap3), and CTA (0, 0, 0) the table seq_slots. Every CTA reads all of cu_seqlens: for
// few sequences (cp.cu, kCpPackedMaxSeqs).
__device__ __forceinline__ void cp_warp_packed_stage1(const ChunkedParams& p, WalkSpan* mine, int lane) {
  const std::int64_t z = blockIdx.z, gz = gridDim.z, cap1 = p.num_walks, cap3 = p.cp_cap3, slots = p.cp_slots;
  const int seg = p.cp_packed_seg;
  const bool side = blockIdx.x == 0 && blockIdx.y == 0;  // writes list 3
  const std::int64_t ks = z < cap1 ? (cap1 - z + gz - 1) / gz : 0;
  const int count = ks < kCtaWalks ? static_cast<int>(ks) : kCtaWalks;  // the CTA's entries
  for (int k = lane; k < count; k += 32) mine[k] = cp_empty_entry();
  __syncwarp();
  std::int64_t o1 = 0, os = 0;  // list-1 entries and slots placed so far
  for (std::int64_t base = 0; base < p.num_seqs; base += 32) {
    CpPlace q;
    q.n = base + lane;
    q.bos = q.eos = 0;
    const bool here = q.n < p.num_seqs;
    if (here) seq_range(p, q.n, q.bos, q.eos);
    q.nseg = here ? cp_segments(q.eos - q.bos, seg) : 0;
    const int es = q.nseg > 1 ? q.nseg : 0;
    int s1 = q.nseg, ss = es;  // inclusive scans over the lanes
#pragma unroll
    for (int d = 1; d < 32; d *= 2) {
      const int a = __shfl_up_sync(0xffffffffu, s1, d), b = __shfl_up_sync(0xffffffffu, ss, d);
      if (lane >= d) s1 += a, ss += b;
    }
    q.at1 = o1 + s1 - q.nseg;
    q.ats = os + ss - es;
    q.at3 = q.at1 - q.n;
    if (here) {
      if (side && z == 0) {
        p.cp_seq_slots[2 * q.n] = static_cast<int>(q.ats);
        p.cp_seq_slots[2 * q.n + 1] = cp_table_segments(q, cap1, cap3, slots);
      }
      // The CTA's entries among the sequence's [at1, at1 + nseg).
      const std::int64_t from = q.at1 > z ? q.at1 : z;
      for (std::int64_t k = (from - z + gz - 1) / gz; k < count; ++k) {
        const std::int64_t i = z + k * gz;
        if (i >= q.at1 + q.nseg) break;
        const int s = static_cast<int>(i - q.at1);
        mine[k] = cp_placed_entry(q, seg, cap1, slots, s, false);
        if (side && s > 0 && q.at3 + s - 1 < cap3) p.cp_list3[q.at3 + s - 1] = cp_placed_entry(q, seg, cap1, slots, s, true);
      }
    }
    o1 += __shfl_sync(0xffffffffu, s1, 31);
    os += __shfl_sync(0xffffffffu, ss, 31);
  }
  for (int k = lane; side && k < count; k += 32) {
    const std::int64_t i = z + k * gz;
    if (i >= o1) p.cp_list3[i - p.num_seqs] = cp_empty_entry();  // i - N < cap1 - N = cap3
  }
}

// First workspace slot of sequence n (its chunk j uses slot + j).
__device__ __forceinline__ std::int64_t first_slot(std::int64_t bos, std::int64_t n) { return bos / kChunk + n; }

}  // namespace gdnkit::cuda
