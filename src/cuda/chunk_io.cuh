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

// First workspace slot of sequence n (its chunk j uses slot + j).
__device__ __forceinline__ std::int64_t first_slot(std::int64_t bos, std::int64_t n) { return bos / kChunk + n; }

}  // namespace gdnkit::cuda
