// Host emulation of the CUDA features the chunked kernel uses (test harness only).
#pragma once
#include <barrier>
#include <cfloat>
#include <memory>
#include <mutex>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <vector>
#include "common/half.h"

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__
#define __grid_constant__
#define __align__(n)

struct dim3 { unsigned x = 1, y = 1, z = 1; dim3() = default; dim3(unsigned a, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {} };
using cudaError_t = int;
using cudaStream_t = void*;
struct uint4 { unsigned x, y, z, w; };
inline uint4 make_uint4(unsigned a, unsigned b, unsigned c, unsigned d) { return {a, b, c, d}; }

inline thread_local dim3 threadIdx, blockIdx;
inline dim3 gridDim, blockDim;

// One CTA as the emulator keeps it: its dynamic shared memory, its barriers (the CTA's, each warp's,
// each warpgroup's, the named ones), the buffers through which its lanes and warpgroups exchange
// operands, and its place in its cluster. Each emulated thread reaches its own CTA's through g_cta
// (set by the harness), so that the CTAs of a cluster run at once, each with its own.
struct EmuWarpX { const void* ptr[32]; std::uint32_t u[32][6]; float f[32][4]; };  // mma_sm80's lanes
struct EmuWgX { std::uint32_t a[128][4]; };                                         // wgmma's A fragments
struct EmuCta {
  unsigned char* smem = nullptr;  // kSmemBytes (wgmma_sm90.cuh), 1024-byte aligned
  std::barrier<>* block = nullptr;
  std::barrier<>* warp[12] = {};
  std::barrier<>* wg[3] = {};
  std::uint32_t shfl_bits[12][32] = {};  // any 32-bit value, bit for bit
  unsigned redux[12][32] = {};
  EmuWarpX wx[12] = {};
  EmuWgX wgx[3] = {};
  std::mutex named_mutex;
  std::unique_ptr<std::barrier<>> named[16];  // made on first use with its thread count
  int named_count[16] = {};
  unsigned rank = 0, size = 1;            // in its cluster
  EmuCta* cluster[2] = {};                // the cluster's CTAs by rank
  std::barrier<>* cluster_barrier = nullptr;
};
inline thread_local EmuCta* g_cta = nullptr;

inline void __syncthreads() { g_cta->block->arrive_and_wait(); }
inline void __trap() { std::abort(); }

// Any 32-bit value, bit for bit (floats and integers alike: nothing is rounded through float).
template <typename V>
inline V __shfl_up_sync(unsigned, V v, int off) {
  static_assert(sizeof(V) == 4, "32-bit shuffles");
  const int w = threadIdx.x / 32, l = threadIdx.x % 32;
  g_cta->warp[w]->arrive_and_wait();
  std::memcpy(&g_cta->shfl_bits[w][l], &v, 4);
  g_cta->warp[w]->arrive_and_wait();
  V r = v;
  if (l >= off) std::memcpy(&r, &g_cta->shfl_bits[w][l - off], 4);
  g_cta->warp[w]->arrive_and_wait();
  return r;
}
template <typename V>
inline V __shfl_sync(unsigned, V v, int src) {
  static_assert(sizeof(V) == 4, "32-bit shuffles");
  const int w = threadIdx.x / 32, l = threadIdx.x % 32;
  g_cta->warp[w]->arrive_and_wait();
  std::memcpy(&g_cta->shfl_bits[w][l], &v, 4);
  g_cta->warp[w]->arrive_and_wait();
  V r;
  std::memcpy(&r, &g_cta->shfl_bits[w][src], 4);
  g_cta->warp[w]->arrive_and_wait();
  return r;
}

inline unsigned __reduce_min_sync(unsigned, unsigned v) {  // the whole warp takes part
  const int w = threadIdx.x / 32, l = threadIdx.x % 32;
  g_cta->warp[w]->arrive_and_wait();
  g_cta->redux[w][l] = v;
  g_cta->warp[w]->arrive_and_wait();
  unsigned r = v;
  for (int i = 0; i < 32; ++i) r = g_cta->redux[w][i] < r ? g_cta->redux[w][i] : r;
  g_cta->warp[w]->arrive_and_wait();
  return r;
}

struct __nv_bfloat16 { std::uint16_t bits; };
struct __half { std::uint16_t bits; };
inline float __bfloat162float(__nv_bfloat16 x) { return gdnkit::detail::bf16_to_float(x.bits); }
inline __nv_bfloat16 __float2bfloat16_rn(float x) { return {gdnkit::detail::float_to_bf16(x)}; }
inline float __half2float(__half x) { return gdnkit::detail::fp16_to_float(x.bits); }
inline __half __float2half_rn(float x) { return {gdnkit::detail::float_to_fp16(x)}; }
inline float tofl(__nv_bfloat16 x) { return __bfloat162float(x); }
inline float tofl(__half x) { return __half2float(x); }
inline float tofl(float x) { return x; }

#include <atomic>
inline std::atomic<long> g_ff_copies{0};  // copies whose source bytes were all 0xff (never written)

// cp.async as the hardware allows it to behave: a copy lands only when a __pipeline_wait_prior
// retires its commit group, so a kernel that reads shared memory before waiting reads stale bytes
// here (shared memory starts as 0xff) and fails its test. Sources are read at issue.
struct AsyncCopy {
  void* dst;
  std::vector<unsigned char> bytes;
};
struct AsyncCopies {
  std::vector<AsyncCopy> open;                  // issued since the last commit
  std::vector<std::vector<AsyncCopy>> groups;   // committed, oldest first
};
inline thread_local AsyncCopies g_async;

inline void __pipeline_memcpy_async(void* dst, const void* src, std::size_t n, std::size_t = 0) {
  if ((reinterpret_cast<std::uintptr_t>(dst) % 16) || (reinterpret_cast<std::uintptr_t>(src) % 16)) {
    std::fprintf(stderr, "misaligned cp.async\n");
    std::abort();
  }
  const unsigned char* s = static_cast<const unsigned char*>(src);
  bool all_ff = true;
  for (std::size_t i = 0; i < n; ++i) all_ff = all_ff && s[i] == 0xff;
  if (all_ff) g_ff_copies.fetch_add(1);
  g_async.open.push_back({dst, std::vector<unsigned char>(s, s + n)});
}
inline void __pipeline_commit() {
  g_async.groups.push_back(std::move(g_async.open));
  g_async.open.clear();
}
inline void __pipeline_wait_prior(std::size_t pending) {
  while (g_async.groups.size() > pending) {
    for (const AsyncCopy& c : g_async.groups.front()) std::memcpy(c.dst, c.bytes.data(), c.bytes.size());
    g_async.groups.erase(g_async.groups.begin());
  }
}

namespace nvcuda::wmma {
struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };
template <typename Use, int M, int N, int K, typename T, typename Layout = void>
struct fragment {
  static constexpr int num_elements = 256;
  float x[256];  // the whole tile, row-major [r][c]; meaningful in lane 0 only
};
inline bool lane0() { return threadIdx.x % 32 == 0; }
inline void check_align(const void* p, unsigned ld, int elem) {
  if (reinterpret_cast<std::uintptr_t>(p) % 32) { std::fprintf(stderr, "wmma pointer not 32-byte aligned\n"); std::abort(); }
  if ((elem == 2 && ld % 8) || (elem == 4 && ld % 4)) { std::fprintf(stderr, "wmma bad ld\n"); std::abort(); }
}
template <typename Use, typename T, typename L>
void load_matrix_sync(fragment<Use, 16, 16, 16, T, L>& f, const T* p, unsigned ld) {
  check_align(p, ld, sizeof(T));
  if (!lane0()) return;
  for (int r = 0; r < 16; ++r)
    for (int c = 0; c < 16; ++c) {
      if constexpr (std::is_same_v<L, row_major>) f.x[r * 16 + c] = tofl(p[r * ld + c]);
      else f.x[r * 16 + c] = tofl(p[c * ld + r]);
    }
}
template <typename T>
void load_matrix_sync(fragment<accumulator, 16, 16, 16, T, void>& f, const T* p, unsigned ld, layout_t lay) {
  check_align(p, ld, sizeof(T));
  if (!lane0()) return;
  for (int r = 0; r < 16; ++r)
    for (int c = 0; c < 16; ++c) f.x[r * 16 + c] = lay == mem_row_major ? p[r * ld + c] : p[c * ld + r];
}
template <typename T>
void store_matrix_sync(T* p, const fragment<accumulator, 16, 16, 16, T, void>& f, unsigned ld, layout_t lay) {
  check_align(p, ld, sizeof(T));
  if (!lane0()) return;
  for (int r = 0; r < 16; ++r)
    for (int c = 0; c < 16; ++c) (lay == mem_row_major ? p[r * ld + c] : p[c * ld + r]) = f.x[r * 16 + c];
}
template <typename F>
void fill_fragment(F& f, float v) { for (auto& e : f.x) e = v; }
template <typename TA, typename LA, typename TB, typename LB>
void mma_sync(fragment<accumulator, 16, 16, 16, float, void>& d, const fragment<matrix_a, 16, 16, 16, TA, LA>& a,
              const fragment<matrix_b, 16, 16, 16, TB, LB>& b, const fragment<accumulator, 16, 16, 16, float, void>& c) {
  if (!lane0()) return;
  float out[256];
  for (int r = 0; r < 16; ++r)
    for (int col = 0; col < 16; ++col) {
      float s = c.x[r * 16 + col];
      for (int k = 0; k < 16; ++k) s += a.x[r * 16 + k] * b.x[k * 16 + col];
      out[r * 16 + col] = s;
    }
  std::memcpy(d.x, out, sizeof out);
}
}  // namespace nvcuda::wmma
inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 x) { return x.bits; }
inline unsigned short __half_as_ushort(__half x) { return x.bits; }
#ifndef GDN_MOCK_FLOAT4
#define GDN_MOCK_FLOAT4
struct alignas(16) float4 { float x, y, z, w; };
inline float4 make_float4(float a, float b, float c, float d) { return {a, b, c, d}; }
inline float __expf(float x) { return std::exp(x); }
#endif
inline void __syncwarp(unsigned = 0xffffffffu) { g_cta->warp[threadIdx.x / 32]->arrive_and_wait(); }

struct alignas(8) float2 { float x, y; };
inline float2 make_float2(float a, float b) { return {a, b}; }
inline __nv_bfloat16 __ushort_as_bfloat16(unsigned short b) { return {b}; }
inline __half __ushort_as_half(unsigned short b) { return {b}; }
inline float __uint_as_float(unsigned u) { float f; std::memcpy(&f, &u, 4); return f; }
inline unsigned __float_as_uint(float f) { unsigned u; std::memcpy(&u, &f, 4); return u; }
