// Host conversions between float and the 16-bit formats (round to nearest even), and typed loads.
#pragma once

#include <cstdint>
#include <cstring>

#include "gdnkit/gdnkit.h"

namespace gdnkit::detail {

inline float bf16_to_float(std::uint16_t h) {
  std::uint32_t u = static_cast<std::uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline std::uint16_t float_to_bf16(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((u >> 16) | 0x40);  // NaN stays NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<std::uint16_t>(u >> 16);
}

inline float fp16_to_float(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  std::uint32_t exp = (h >> 10) & 0x1fu;
  std::uint32_t man = h & 0x3ffu;
  std::uint32_t u;
  if (exp == 0x1f) {
    u = sign | 0x7f800000u | (man << 13);
  } else if (exp == 0) {
    if (man == 0) {
      u = sign;
    } else {  // subnormal: normalise
      int e = -1;
      do {
        ++e;
        man <<= 1;
      } while ((man & 0x400u) == 0);
      u = sign | static_cast<std::uint32_t>(127 - 15 - e) << 23 | (man & 0x3ffu) << 13;
    }
  } else {
    u = sign | (exp + 127 - 15) << 23 | man << 13;
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline std::uint16_t float_to_fp16(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  const std::uint16_t sign = static_cast<std::uint16_t>((u >> 16) & 0x8000u);
  const std::uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return sign | 0x7e00u;                 // NaN
  if (a >= 0x477ff000u) return sign | 0x7c00u;                // overflow (>= 65520) -> inf
  if (a < 0x33000001u) return sign;                           // < half the smallest subnormal -> 0
  int exp = static_cast<int>(a >> 23);
  std::uint32_t man = (a & 0x7fffffu) | 0x800000u;
  if (exp < 113) {  // subnormal half: shift mantissa into place with round to nearest even
    const int shift = 113 - exp + 13;
    std::uint32_t r = man >> shift;
    const std::uint32_t rem = man & ((1u << shift) - 1);
    const std::uint32_t halfway = 1u << (shift - 1);
    if (rem > halfway || (rem == halfway && (r & 1u))) ++r;
    return sign | static_cast<std::uint16_t>(r);
  }
  std::uint32_t r = a - (112u << 23);  // rebias exponent
  r += 0xfffu + ((r >> 13) & 1u);
  return sign | static_cast<std::uint16_t>(r >> 13);
}

// Reads element i of a q/k/v/beta-style buffer of the given type as float.
inline float load_as_float(const void* base, DType dtype, std::int64_t i) {
  switch (dtype) {
    case DType::bf16: return bf16_to_float(static_cast<const std::uint16_t*>(base)[i]);
    case DType::f16: return fp16_to_float(static_cast<const std::uint16_t*>(base)[i]);
    case DType::f32: return static_cast<const float*>(base)[i];
    default: return 0.0f;
  }
}

inline void store_from_float(void* base, DType dtype, std::int64_t i, float x) {
  switch (dtype) {
    case DType::bf16: static_cast<std::uint16_t*>(base)[i] = float_to_bf16(x); break;
    case DType::f16: static_cast<std::uint16_t*>(base)[i] = float_to_fp16(x); break;
    case DType::f32: static_cast<float*>(base)[i] = x; break;
    default: break;
  }
}

inline std::int64_t load_index(const void* base, DType dtype, std::int64_t i) {
  return dtype == DType::i64 ? static_cast<const std::int64_t*>(base)[i]
                             : static_cast<const std::int32_t*>(base)[i];
}

}  // namespace gdnkit::detail
