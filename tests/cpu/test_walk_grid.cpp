// The walk CTAs' grid of an unsplit kernel (src/cuda/walk_grid.cpp) on an H200's 132 SMs: which
// batches the fused kernel deals to one wave (LPT shares), which it walks a CTA per sequence
// longest first, and the split path's strides; and which batches take the short walk. Host
// arithmetic only: runs without a GPU.
#include <gtest/gtest.h>

#include <cstdint>

#include "common/h200_shape.h"
#include "cuda/walk_grid.h"

namespace {

using gdnkit::cuda::walk_grid;
using gdnkit::cuda::WalkGrid;

using gdnkit::test::kH200Sms;
constexpr auto shape = gdnkit::test::mha_shape;  // (heads, sequences, tokens in all)

void expect_grid(const WalkGrid& g, std::int64_t z, bool longest_first, bool lpt) {
  EXPECT_EQ(g.z, z);
  EXPECT_EQ(g.longest_first, longest_first);
  EXPECT_EQ(g.lpt, lpt);
}

// The fused kernel (128 value columns, a CTA per SM) on the benchmark's packed batches: one wave
// of 132 / H CTAs per head wherever the batch has more sequences than that.
TEST(WalkGrid, FusedDealsPackedBatchesToOneWave) {
  SCOPED_TRACE("cuLA varlen rows: 64 heads, 10 and 20 sequences");
  for (std::int64_t tokens : {4096, 8192, 16384}) {
    expect_grid(walk_grid(shape(64, 10, tokens), 128, true, true, kH200Sms, 1), 2, true, true);
    expect_grid(walk_grid(shape(64, 20, tokens), 128, true, true, kH200Sms, 1), 2, true, true);
  }
  SCOPED_TRACE("qwen3next-16x32-varlen-n64-t32768 and qwen35-16x64-b4-t8192");
  expect_grid(walk_grid(shape(32, 64, 32768), 128, true, true, kH200Sms, 1), 4, true, true);
  expect_grid(walk_grid(shape(64, 4, 32768), 128, true, true, kH200Sms, 1), 2, true, true);
  SCOPED_TRACE("the 64-column variant: twice the CTAs per head");
  expect_grid(walk_grid(shape(16, 20, 8192), 64, true, true, kH200Sms, 1), 4, true, true);
}

// A CTA per sequence, ranked longest first, where one wave has room for them all; no ranking
// under three sequences, over 64 or without cu_seqlens (equal lengths).
TEST(WalkGrid, FusedKeepsACtaPerSequenceWhereAWaveHoldsThem) {
  expect_grid(walk_grid(shape(8, 10, 40960), 128, true, true, kH200Sms, 1), 10, true, false);  // wave 16
  expect_grid(walk_grid(shape(64, 2, 32768), 128, true, true, kH200Sms, 1), 2, false, false);  // fixed-b2
  expect_grid(walk_grid(shape(64, 4, 32768), 128, false, true, kH200Sms, 1), 4, false, false);  // batched
  expect_grid(walk_grid(shape(64, 65, 65 * 1024), 128, true, true, kH200Sms, 1), 65, false, false);
  // Under four chunks per sequence on average, too many to rank: strided over one wave (132 / 64
  // CTAs per head), not over two CTAs per SM (five per head: 2.4 waves).
  expect_grid(walk_grid(shape(64, 256, 25600), 128, true, true, kH200Sms, 1), 2, false, false);
  expect_grid(walk_grid(shape(64, 600, 24000), 128, true, true, kH200Sms, 1), 2, false, false);
  expect_grid(walk_grid(shape(8, 600, 24000), 128, true, true, kH200Sms, 1), 16, false, false);
  expect_grid(walk_grid(shape(200, 600, 24000), 128, true, true, kH200Sms, 1), 1, false, false);  // xy > SMs
  expect_grid(walk_grid(shape(32, 600, 24000), 64, true, true, kH200Sms, 1), 2, false, false);    // 64 columns
}

// The split path's walk (several CTAs per SM, no pipeline across sequences) is never dealt.
TEST(WalkGrid, SplitPathWalksACtaPerSequence) {
  expect_grid(walk_grid(shape(64, 10, 16384), 64, true, false, kH200Sms, 3), 10, true, false);
  // Short sequences: z = ceil(2 x 132 x 3 / (2 x 64)) = 7 CTAs per (block, head), strided.
  expect_grid(walk_grid(shape(64, 20, 4096), 64, true, false, kH200Sms, 3), 7, false, false);
}

// Where the planner takes the short walk (short_walk_takes): by the longest length where the host
// knows it (the hint, or the uniform length), else by the mean in batches of at most 1,024 tokens.
TEST(WalkGrid, ShortWalkTakesShortSequences) {
  using gdnkit::cuda::short_walk_takes;
  SCOPED_TRACE("qwen35-16x64-decode-like-n256-t512: packed, 256 x 2 tokens");
  EXPECT_TRUE(short_walk_takes(shape(64, 256, 512), true, 0));
  EXPECT_TRUE(short_walk_takes(shape(64, 256, 512), true, 2));
  SCOPED_TRACE("the hint decides where given: 32 tokens yes, 33 no, whatever the mean");
  EXPECT_TRUE(short_walk_takes(shape(64, 100, 1500), true, 32));
  EXPECT_FALSE(short_walk_takes(shape(64, 100, 1500), true, 33));
  EXPECT_FALSE(short_walk_takes(shape(64, 256, 512), true, 33));
  EXPECT_FALSE(short_walk_takes(shape(64, 256, 512), true, 300));
  SCOPED_TRACE("uniform lengths (no cu_seqlens) are known");
  auto uniform = [](std::int64_t seqs, std::int64_t len) {
    auto s = shape(16, seqs, seqs * len);
    s.uniform_len = len;
    return s;
  };
  EXPECT_TRUE(short_walk_takes(uniform(100, 15), false, 0));
  EXPECT_TRUE(short_walk_takes(uniform(100, 32), false, 0));
  EXPECT_FALSE(short_walk_takes(uniform(100, 33), false, 0));
  // A hint that contradicts them is not taken.
  EXPECT_FALSE(short_walk_takes(uniform(100, 33), false, 1));
  EXPECT_TRUE(short_walk_takes(uniform(100, 15), false, 100));
  SCOPED_TRACE("packed lengths unknown: a mean of 16 up to 1,024 tokens in all");
  EXPECT_TRUE(short_walk_takes(shape(64, 64, 1024), true, 0));
  EXPECT_FALSE(short_walk_takes(shape(64, 100, 1500), true, 0));
  EXPECT_FALSE(short_walk_takes(shape(64, 10, 170), true, 0));
  EXPECT_FALSE(short_walk_takes(shape(64, 1, 4096), true, 0));
}

}  // namespace
