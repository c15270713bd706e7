// Device helpers shared by the CUDA kernels: 16-bit <-> fp32 conversions, WMMA fragment types
// (16x16x16, bf16/f16 operands, fp32 accumulators), shared-memory alignment, typed beta loads.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <mma.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "cuda/chunked.h"

namespace gdnkit::cuda {

namespace wm = nvcuda::wmma;

template <typename T>
__device__ __forceinline__ float to_f32(T x);
template <>
__device__ __forceinline__ float to_f32<__nv_bfloat16>(__nv_bfloat16 x) {
  return __bfloat162float(x);
}
template <>
__device__ __forceinline__ float to_f32<__half>(__half x) {
  return __half2float(x);
}

template <typename T>
__device__ __forceinline__ T from_f32(float x);
template <>
__device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}
template <>
__device__ __forceinline__ __half from_f32<__half>(float x) {
  return __float2half_rn(x);
}

// Two floats as two 16-bit values packed in one 32-bit word (the first at the lower address).
template <typename T>
__device__ __forceinline__ unsigned pack2(float a, float b);
template <>
__device__ __forceinline__ unsigned pack2<__nv_bfloat16>(float a, float b) {
  return static_cast<unsigned>(__bfloat16_as_ushort(__float2bfloat16_rn(a))) |
         static_cast<unsigned>(__bfloat16_as_ushort(__float2bfloat16_rn(b))) << 16;
}
template <>
__device__ __forceinline__ unsigned pack2<__half>(float a, float b) {
  return static_cast<unsigned>(__half_as_ushort(__float2half_rn(a))) |
         static_cast<unsigned>(__half_as_ushort(__float2half_rn(b))) << 16;
}

// Two floats from the two 16-bit halves of a 32-bit word (the lower half first).
template <typename T>
__device__ __forceinline__ float2 unpack2(std::uint32_t x) {
  const std::uint16_t lo = static_cast<std::uint16_t>(x & 0xffffu), hi = static_cast<std::uint16_t>(x >> 16);
  if constexpr (std::is_same_v<T, __nv_bfloat16>)
    return make_float2(__bfloat162float(__ushort_as_bfloat16(lo)), __bfloat162float(__ushort_as_bfloat16(hi)));
  else
    return make_float2(__half2float(__ushort_as_half(lo)), __half2float(__ushort_as_half(hi)));
}

// e^x as ex2.approx.ftz(x log2(e)): a multiply and one MUFU op, the accuracy of __expf (the same
// two steps; its bound grows with |x| through the rounded product).
// Results below 2^-126 flush to zero, where __expf spends three more instructions (a compare and
// two predicated multiplies) on returning a denormal.
__device__ __forceinline__ float fast_exp(float x) {
#if defined(__CUDA_ARCH__)
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x * 1.4426950408889634f));
  return y;
#else  // host compilation pass (and host emulation of the kernels)
  const float y = std::exp2(x * 1.4426950408889634f);
  return y < 1.17549435e-38f ? 0.0f : y;
#endif
}

// 2^x as one ex2.approx.ftz (fast_exp without its multiply, for exponents already in log2 units).
__device__ __forceinline__ float fast_exp2(float x) {
#if defined(__CUDA_ARCH__)
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
#else
  const float y = std::exp2(x);
  return y < 1.17549435e-38f ? 0.0f : y;
#endif
}

template <typename T>
using FragA = wm::fragment<wm::matrix_a, 16, 16, 16, T, wm::row_major>;
template <typename T>
using FragAT = wm::fragment<wm::matrix_a, 16, 16, 16, T, wm::col_major>;  // transposed view
template <typename T>
using FragB = wm::fragment<wm::matrix_b, 16, 16, 16, T, wm::row_major>;
template <typename T>
using FragBT = wm::fragment<wm::matrix_b, 16, 16, 16, T, wm::col_major>;  // transposed view
using FragC = wm::fragment<wm::accumulator, 16, 16, 16, float>;

constexpr std::size_t align128(std::size_t x) { return (x + 127) / 128 * 128; }

}  // namespace gdnkit::cuda
