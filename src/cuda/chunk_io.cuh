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

// First workspace slot of sequence n (its chunk j uses slot + j).
__device__ __forceinline__ std::int64_t first_slot(std::int64_t bos, std::int64_t n) { return bos / kChunk + n; }

}  // namespace gdnkit::cuda
