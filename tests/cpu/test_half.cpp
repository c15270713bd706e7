// The host 16-bit conversions round to nearest even, keep NaN and infinity, and handle subnormals.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>

#include "common/half.h"

namespace {

using namespace gdnkit::detail;

TEST(Half, Bf16RoundTripAndRounding) {
  for (float x : {0.0f, 1.0f, -2.5f, 3.140625f, 0x1p-100f, -0x1.8p70f}) EXPECT_EQ(bf16_to_float(float_to_bf16(x)), x) << x;
  // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties go to the even mantissa (1).
  EXPECT_EQ(bf16_to_float(float_to_bf16(1.0f + 1.0f / 256)), 1.0f);
  EXPECT_EQ(bf16_to_float(float_to_bf16(1.0f + 3.0f / 256)), 1.0f + 4.0f / 256);
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_TRUE(std::isinf(bf16_to_float(float_to_bf16(std::numeric_limits<float>::infinity()))));
}

TEST(Half, Fp16RoundTripAndRounding) {
  for (float x : {0.0f, 1.0f, -2.5f, 65504.0f, 6.103515625e-05f, 5.960464477539063e-08f})
    EXPECT_EQ(fp16_to_float(float_to_fp16(x)), x) << x;
  EXPECT_EQ(fp16_to_float(float_to_fp16(1.0f + 1.0f / 2048)), 1.0f);  // tie to even
  EXPECT_EQ(fp16_to_float(float_to_fp16(1.0f + 3.0f / 2048)), 1.0f + 4.0f / 2048);
  EXPECT_TRUE(std::isinf(fp16_to_float(float_to_fp16(70000.0f))));
  EXPECT_TRUE(std::isnan(fp16_to_float(float_to_fp16(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_EQ(fp16_to_float(float_to_fp16(1e-9f)), 0.0f);
  // Every finite half converts to float and back to itself.
  for (std::uint32_t h = 0; h < 0x10000; ++h) {
    if ((h & 0x7c00u) == 0x7c00u) continue;
    const auto b = static_cast<std::uint16_t>(h);
    ASSERT_EQ(float_to_fp16(fp16_to_float(b)), b) << h;
  }
}

TEST(Half, Fp16SubnormalRounding) {
  const float tiny = 5.960464477539063e-08f;  // 2^-24, the smallest subnormal half
  EXPECT_EQ(fp16_to_float(float_to_fp16(tiny * 2.5f)), tiny * 2.0f);  // tie to even
  EXPECT_EQ(fp16_to_float(float_to_fp16(tiny * 3.5f)), tiny * 4.0f);
  EXPECT_EQ(fp16_to_float(float_to_fp16(tiny * 0.75f)), tiny);
}

}  // namespace
