// Host emulation of mma_sm80.cuh: lanes exchange operands through a per-warp buffer.
#pragma once
#include <cstdint>
#include <type_traits>
#include "mock.h"
namespace gdnkit::cuda {
using WarpX = EmuWarpX;
inline void wbar() { g_cta->warp[threadIdx.x / 32]->arrive_and_wait(); }
inline void check16(const void* p) {
  if (reinterpret_cast<std::uintptr_t>(p) % 16) { std::fprintf(stderr, "ldmatrix row not 16-byte aligned\n"); std::abort(); }
  extern unsigned char smem[];
  const unsigned char* c = static_cast<const unsigned char*>(p);
  // The CTA's dynamic shared memory (232448 bytes, kSmemBytes in wgmma_sm90.cuh), or the prep
  // kernel's (200 KB).
  const bool in_walk = c >= g_cta->smem && c + 16 <= g_cta->smem + 232448, in_prep = c >= smem && c + 16 <= smem + 200 * 1024;
  if (!in_walk && !in_prep) { std::fprintf(stderr, "ldmatrix outside shared memory\n"); std::abort(); }
}
// An address in the CTA's dynamic shared memory, as an offset from its start.
inline std::uint32_t smem_addr(const void* p) {
  return static_cast<std::uint32_t>(static_cast<const unsigned char*>(p) - g_cta->smem);
}
// The kernels' dynamic shared memory (an `extern __shared__` array in mma_sm80.cuh): the CTA's.
#define GDNKIT_DYNAMIC_SMEM(name) unsigned char* const name = ::g_cta->smem
inline void ldsm_x4(std::uint32_t (&r)[4], const void* row) {
  check16(row);
  WarpX& x = g_cta->wx[threadIdx.x / 32]; const int L = threadIdx.x % 32, g = L / 4, t = L % 4;
  wbar(); x.ptr[L] = row; wbar();
  for (int m = 0; m < 4; ++m) {
    const std::uint16_t* rp = static_cast<const std::uint16_t*>(x.ptr[8 * m + g]);
    r[m] = rp[2 * t] | (std::uint32_t(rp[2 * t + 1]) << 16);
  }
  wbar();
}
inline void ldsm_x4_trans(std::uint32_t (&r)[4], const void* row) {
  check16(row);
  WarpX& x = g_cta->wx[threadIdx.x / 32]; const int L = threadIdx.x % 32, g = L / 4, t = L % 4;
  wbar(); x.ptr[L] = row; wbar();
  for (int m = 0; m < 4; ++m) {
    const std::uint16_t* r0 = static_cast<const std::uint16_t*>(x.ptr[8 * m + 2 * t]);
    const std::uint16_t* r1 = static_cast<const std::uint16_t*>(x.ptr[8 * m + 2 * t + 1]);
    r[m] = r0[g] | (std::uint32_t(r1[g]) << 16);
  }
  wbar();
}
inline void stsm_x4(void* row, const std::uint32_t (&r)[4]) {
  check16(row);
  WarpX& x = g_cta->wx[threadIdx.x / 32]; const int L = threadIdx.x % 32;
  wbar(); x.ptr[L] = row; for (int m = 0; m < 4; ++m) x.u[L][m] = r[m]; wbar();
  std::uint16_t* rp = static_cast<std::uint16_t*>(const_cast<void*>(x.ptr[L]));
  const int m = L / 8, rr = L % 8;
  for (int t = 0; t < 4; ++t) {
    const std::uint32_t w = x.u[4 * rr + t][m];
    rp[2 * t] = static_cast<std::uint16_t>(w & 0xffff);
    rp[2 * t + 1] = static_cast<std::uint16_t>(w >> 16);
  }
  wbar();
}
inline void stsm_x4_trans(void* row, const std::uint32_t (&r)[4]) {
  check16(row);
  WarpX& x = g_cta->wx[threadIdx.x / 32]; const int L = threadIdx.x % 32;
  wbar(); x.ptr[L] = row; for (int m = 0; m < 4; ++m) x.u[L][m] = r[m]; wbar();
  std::uint16_t* rp = static_cast<std::uint16_t*>(const_cast<void*>(x.ptr[L]));
  const int m = L / 8, rr = L % 8;  // stored row rr = column rr of the quarter (lanes 4 c + rr / 2)
  for (int c = 0; c < 8; ++c) {
    const std::uint32_t w = x.u[4 * c + rr / 2][m];
    rp[c] = static_cast<std::uint16_t>(rr % 2 ? w >> 16 : w & 0xffff);
  }
  wbar();
}
template <typename T> inline float h2f(std::uint16_t b) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) return gdnkit::detail::bf16_to_float(b);
  else return gdnkit::detail::fp16_to_float(b);
}
template <typename T>
inline void mma16816(float (&d)[4], const std::uint32_t (&a)[4], std::uint32_t b0, std::uint32_t b1) {
  WarpX& x = g_cta->wx[threadIdx.x / 32]; const int L = threadIdx.x % 32, g = L / 4, t = L % 4;
  wbar();
  for (int i = 0; i < 4; ++i) { x.u[L][i] = a[i]; x.f[L][i] = d[i]; }
  x.u[L][4] = b0; x.u[L][5] = b1;
  wbar();
  auto half = [](std::uint32_t w, int hi) { return static_cast<std::uint16_t>(hi ? w >> 16 : w & 0xffff); };
  auto A = [&](int r, int k) { return h2f<T>(half(x.u[4 * (r % 8) + (k % 8) / 2][(r >= 8) + 2 * (k >= 8)], k % 2)); };
  auto B = [&](int k, int n) { return h2f<T>(half(x.u[4 * n + (k % 8) / 2][4 + (k >= 8)], k % 2)); };
  auto C = [&](int r, int n) { return x.f[4 * (r % 8) + n / 2][(r >= 8) * 2 + n % 2]; };
  float out[4];
  for (int e = 0; e < 4; ++e) {
    const int r = g + 8 * (e / 2), n = 2 * t + e % 2;
    float s = C(r, n);
    for (int k = 0; k < 16; ++k) s += A(r, k) * B(k, n);
    out[e] = s;
  }
  wbar();
  for (int e = 0; e < 4; ++e) d[e] = out[e];
}
inline std::uint32_t movmatrix_trans(std::uint32_t v) {
  WarpX& x = g_cta->wx[threadIdx.x / 32]; const int L = threadIdx.x % 32, g = L / 4, t = L % 4;
  wbar(); x.u[L][0] = v; wbar();
  auto el = [&](int r, int c) -> std::uint32_t { const std::uint32_t w = x.u[4 * r + c / 2][0]; return c % 2 ? w >> 16 : w & 0xffff; };
  const std::uint32_t out = el(2 * t, g) | (el(2 * t + 1, g) << 16);
  wbar();
  return out;
}
inline std::uint32_t tf32_round(float x) {  // the kernels' formula (src/cuda/mma_sm80.cuh), verbatim
  std::uint32_t u;
  std::memcpy(&u, &x, 4);
  return (u + 0x1000u) & 0xffffe000u;
}
inline float bitsf(std::uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }
inline void tf32_split(float x, std::uint32_t& hi, std::uint32_t& lo) {  // verbatim too
  hi = tf32_round(x);
  const float l = x - bitsf(hi);
  std::memcpy(&lo, &l, 4);
}
inline void mma1688_tf32(float (&d)[4], const std::uint32_t (&a)[4], std::uint32_t b0, std::uint32_t b1) {
  WarpX& x = g_cta->wx[threadIdx.x / 32]; const int L = threadIdx.x % 32, g = L / 4, t = L % 4;
  wbar();
  for (int i = 0; i < 4; ++i) { x.u[L][i] = a[i]; x.f[L][i] = d[i]; }
  x.u[L][4] = b0; x.u[L][5] = b1;
  wbar();
  // The hardware reads an operand's top 19 bits: the rest is dropped (truncation), as here.
  auto chk = [](std::uint32_t u) { return bitsf(u & 0xffffe000u); };
  auto A = [&](int r, int k) { return chk(x.u[4 * (r % 8) + k % 4][(r >= 8) + 2 * (k >= 4)]); };
  auto B = [&](int k, int n) { return chk(x.u[4 * n + k % 4][4 + (k >= 4)]); };
  auto C = [&](int r, int n) { return x.f[4 * (r % 8) + n / 2][(r >= 8) * 2 + n % 2]; };
  float out[4];
  for (int e = 0; e < 4; ++e) {
    const int r = g + 8 * (e / 2), n = 2 * t + e % 2;
    float s = C(r, n);
    for (int k = 0; k < 8; ++k) s += A(r, k) * B(k, n);
    out[e] = s;
  }
  wbar();
  for (int e = 0; e < 4; ++e) d[e] = out[e];
}
inline int opaque(int x) { return x; }
inline std::int64_t opaque(std::int64_t x) { return x; }
}  // namespace gdnkit::cuda
