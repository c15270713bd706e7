// A split call's launch list (src/cuda/launch_list.h): the arguments each launch points at, their
// alignment, and the refusals when the list or its storage is full. Host code only: nothing is
// launched, so it runs without a GPU.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>

#include "cuda/launch_list.h"

namespace {

using gdnkit::cuda::KernelLaunch;
using gdnkit::cuda::LaunchList;

struct alignas(64) Wide {  // like a parameter block holding TMA descriptors
  unsigned char bytes[320];
};

// Kernels by signature only: their addresses are never launched.
void three_args(int, double, const float*) {}
void wide_arg(Wide) {}
void many_args(int, int, int, int, int, int, int, int) {}

template <typename T>
T arg(const KernelLaunch& l, int i) {
  T v;
  std::memcpy(&v, l.args[i], sizeof v);
  return v;
}

TEST(LaunchList, ArgumentsConvertedAndKept) {
  LaunchList list;
  const float x = 1.5f;
  // Arguments convert to the parameter types: 7L to int, 2 to double.
  ASSERT_TRUE(list.add(three_args, dim3(3, 2, 1), dim3(128), 4096, 7L, 2, &x));
  Wide w;
  for (int i = 0; i < 320; ++i) w.bytes[i] = static_cast<unsigned char>(i * 7);
  ASSERT_TRUE(list.add(wide_arg, dim3(1), dim3(384), 200 * 1024, w));
  ASSERT_TRUE(list.add_block(reinterpret_cast<const void*>(&wide_arg), dim3(2), dim3(384), 0, 2, &w, sizeof w,
                             alignof(Wide)));
  ASSERT_EQ(list.size(), 3);

  const KernelLaunch& a = list[0];
  EXPECT_EQ(a.func, reinterpret_cast<const void*>(&three_args));
  EXPECT_EQ(a.grid.x, 3u);
  EXPECT_EQ(a.grid.y, 2u);
  EXPECT_EQ(a.block.x, 128u);
  EXPECT_EQ(a.smem, 4096u);
  EXPECT_EQ(a.cluster_x, 1u);
  ASSERT_EQ(a.num_args, 3);
  EXPECT_EQ(arg<int>(a, 0), 7);
  EXPECT_EQ(arg<double>(a, 1), 2.0);
  EXPECT_EQ(arg<const float*>(a, 2), &x);
  EXPECT_EQ(a.arg_bytes[0], sizeof(int));  // the sizes of the parameter types, not of the arguments
  EXPECT_EQ(a.arg_bytes[1], sizeof(double));
  EXPECT_EQ(a.arg_bytes[2], sizeof(const float*));
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(a.args[1]) % alignof(double), 0u);

  for (int k = 1; k < 3; ++k) {
    const KernelLaunch& b = list[k];
    ASSERT_EQ(b.num_args, 1);
    EXPECT_EQ(b.arg_bytes[0], sizeof(Wide));
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(b.args[0]) % 64, 0u) << "launch " << k;
    EXPECT_EQ(std::memcmp(b.args[0], w.bytes, sizeof w), 0) << "launch " << k;
    EXPECT_NE(b.args[0], static_cast<const void*>(&w)) << "a copy, not the caller's object";
  }
  EXPECT_EQ(list[2].cluster_x, 2u);
  EXPECT_EQ(list[1].smem, 200u * 1024u);
  // The arguments do not overlap one another.
  EXPECT_GE(static_cast<const unsigned char*>(list[2].args[0]) - static_cast<const unsigned char*>(list[1].args[0]),
            static_cast<std::ptrdiff_t>(sizeof(Wide)));
}

TEST(LaunchList, RefusesBeyondItsLaunches) {
  LaunchList list;
  for (int i = 0; i < LaunchList::kMaxLaunches; ++i) ASSERT_TRUE(list.add(three_args, dim3(1), dim3(32), 0, i, 0.0, nullptr));
  EXPECT_FALSE(list.add(three_args, dim3(1), dim3(32), 0, 99, 0.0, nullptr));
  EXPECT_EQ(list.size(), LaunchList::kMaxLaunches);
  for (int i = 0; i < LaunchList::kMaxLaunches; ++i) EXPECT_EQ(arg<int>(list[i], 0), i) << "launch " << i;
}

TEST(LaunchList, RefusesBeyondItsStorage) {
  LaunchList list;
  struct Big {
    unsigned char bytes[LaunchList::kArgBytes / 2 + 64];
  } big{};
  big.bytes[0] = 42;
  ASSERT_TRUE(list.add_block(reinterpret_cast<const void*>(&wide_arg), dim3(1), dim3(32), 0, 1, &big, sizeof big, 8));
  // A second block does not fit: refused, and the first stays as it was.
  EXPECT_FALSE(list.add_block(reinterpret_cast<const void*>(&wide_arg), dim3(1), dim3(32), 0, 1, &big, sizeof big, 8));
  EXPECT_EQ(list.size(), 1);
  EXPECT_EQ(static_cast<const unsigned char*>(list[0].args[0])[0], 42);
  // Eight small arguments still fit, and are kept.
  ASSERT_TRUE(list.add(many_args, dim3(1), dim3(32), 0, 1, 2, 3, 4, 5, 6, 7, 8));
  ASSERT_EQ(list.size(), 2);
  for (int i = 0; i < 8; ++i) EXPECT_EQ(arg<int>(list[1], i), i + 1);
}

// Storage is 128-byte aligned: an argument asking for more is refused (its launch dropped), and the
// launches after it are kept as usual.
TEST(LaunchList, RefusesAlignmentBeyondItsStorage) {
  LaunchList list;
  Wide w{};
  w.bytes[0] = 5;
  EXPECT_FALSE(list.add_block(reinterpret_cast<const void*>(&wide_arg), dim3(1), dim3(32), 0, 1, &w, sizeof w, 256));
  EXPECT_EQ(list.size(), 0);
  ASSERT_TRUE(list.add_block(reinterpret_cast<const void*>(&wide_arg), dim3(1), dim3(32), 0, 1, &w, sizeof w, 128));
  ASSERT_EQ(list.size(), 1);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(list[0].args[0]) % 128, 0u);
  EXPECT_EQ(static_cast<const unsigned char*>(list[0].args[0])[0], 5);
}

}  // namespace
