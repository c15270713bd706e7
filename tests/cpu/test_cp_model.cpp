// The context-parallelism cost model (src/cuda/cp_model.cpp) on an H200's 132 SMs: its estimates
// against times measured on one (bench/results/nvidia-h200-2026-12-01-planner-refit.txt; the
// splits with stage 1 in value and map pairs: nvidia-h200-2026-12-01-value-map-pairs.txt), and the
// planner's choices on the benchmark's shapes. Host arithmetic only: runs without a GPU.
#include <gtest/gtest.h>

#include <cstdint>

#include "common/h200_shape.h"
#include "cuda/cp_model.h"

namespace {

using gdnkit::cuda::cp_best_split;
using gdnkit::cuda::cp_choose;
using gdnkit::cuda::cp_split_cost;
using gdnkit::cuda::cp_unsplit_cost;
using gdnkit::cuda::CpChoice;
using gdnkit::cuda::fused64_pays;
using gdnkit::cuda::fused_columns;
using gdnkit::cuda::kCpLeadPlanned;
using gdnkit::cuda::UnsplitKernel;

using gdnkit::test::kH200Sms;

// seqs sequences of len tokens each.
gdnkit::detail::Shape shape(int heads, std::int64_t seqs, std::int64_t len) {
  return gdnkit::test::mha_shape(heads, seqs, seqs * len);
}

// The kernel the planner runs unsplit on an H200 for one sequence of these heads (dk = dv = 128):
// the split path with 1, 2 or 4 walk warps per CTA (bench_gdnkit's kernel column).
UnsplitKernel split_path(int heads) { return {false, heads <= 16 ? 1 : heads <= 32 ? 2 : 4}; }

// Unsplit device times (ms) of single sequences, measured on an H200 (7e3e4ea's tree).
struct Unsplit {
  int heads;
  std::int64_t len;
  double ms;
};
constexpr Unsplit kUnsplit[] = {
    {32, 2048, 0.1256},  {32, 4096, 0.2347},  {32, 8192, 0.4405},  {32, 16384, 0.843}, {32, 32768, 1.655},
    {32, 65536, 3.312},  {32, 131072, 6.55},  {16, 2048, 0.117},   {24, 2048, 0.1174}, {24, 4096, 0.2186},
    {40, 2048, 0.1383},  {40, 4096, 0.2595},  {48, 4096, 0.2685},  {48, 16384, 0.998}, {64, 4096, 0.2825},
    {64, 16384, 1.058},  {64, 32768, 2.066},  {8, 8192, 0.394},    {8, 32768, 1.53},
};

// Split device times (ms): one sequence cut into `segments`, stage 1 at 128 columns in value and
// map pairs (pairs) or not, or at 64 columns (dvb 64: its blocks in pairs).
struct Split {
  int heads;
  std::int64_t len;
  int segments;
  bool pairs;
  double ms, tolerance;
  int dvb = 128;
};
constexpr Split kSplit[] = {
    {32, 2048, 2, true, 0.1038, 0.10},  {32, 8192, 2, true, 0.3312, 0.06},  {32, 16384, 2, true, 0.6396, 0.06},
    {32, 65536, 2, true, 2.4905, 0.06}, {32, 65536, 8, true, 2.7704, 0.06}, {16, 2048, 4, true, 0.0811, 0.10},
    {24, 4096, 2, true, 0.1754, 0.06},  {40, 4096, 3, true, 0.2754, 0.06},  {48, 16384, 4, true, 1.0629, 0.06},
    // The 8-head splits into 8 segments: the model runs 8-20% high there (cp_model.cpp).
    {8, 8192, 8, true, 0.1246, 0.22},   {8, 32768, 8, true, 0.3727, 0.10},  {8, 32768, 4, true, 0.6262, 0.06},
    // Without pairs (7e3e4ea's tree): where the first segments' map CTAs would add a wave.
    {32, 16384, 2, false, 0.736, 0.06}, {24, 4096, 3, false, 0.178, 0.06}, {40, 4096, 2, false, 0.2385, 0.06},
    {48, 16384, 3, false, 1.057, 0.06},
    // At 64 columns (18c3bd9's tree, the same sweep).
    {8, 8192, 2, false, 0.2523, 0.10, 64},  {8, 8192, 4, false, 0.1573, 0.12, 64},
    {8, 32768, 2, false, 0.9453, 0.06, 64}, {8, 32768, 4, false, 0.5382, 0.06, 64},
    {16, 2048, 2, false, 0.0846, 0.17, 64},
};

TEST(CpModel, UnsplitEstimatesMatchTheH200) {
  for (const Unsplit& m : kUnsplit) {
    const double us = cp_unsplit_cost(split_path(m.heads), shape(m.heads, 1, m.len), kH200Sms);
    EXPECT_NEAR(us / 1000.0, m.ms, 0.05 * m.ms) << m.heads << " heads, " << m.len << " tokens";
  }
}

TEST(CpModel, SplitEstimatesMatchTheH200) {
  for (const Split& m : kSplit) {
    const std::int64_t chunks = (m.len + 63) / 64, seg_chunks = (chunks + m.segments - 1) / m.segments;
    const double us = cp_split_cost(shape(m.heads, 1, m.len), kH200Sms, seg_chunks, m.dvb, false, m.pairs);
    EXPECT_NEAR(us / 1000.0, m.ms, m.tolerance * m.ms)
        << m.heads << " heads, " << m.len << " tokens, " << m.segments << " segments, pairs " << m.pairs;
  }
  // Pairs or not, as measured faster: pairs where the first segments' map CTAs fit the wave.
  struct Pick {
    int heads;
    std::int64_t len;
    int segments;
    bool pairs;
  };
  for (const Pick& k : {Pick{8, 32768, 8, true}, Pick{32, 65536, 2, true}, Pick{16, 2048, 4, true},
                        Pick{24, 4096, 3, false}, Pick{40, 4096, 2, false}}) {
    const CpChoice c = cp_best_split(shape(k.heads, 1, k.len), kH200Sms, k.segments, k.segments, false);
    ASSERT_EQ(c.nseg, k.segments) << k.heads << " heads, " << k.len << " tokens";
    EXPECT_EQ(c.dvb, 128) << k.heads << " heads, " << k.len << " tokens";
    EXPECT_EQ(c.pairs, k.pairs) << k.heads << " heads, " << k.len << " tokens, " << k.segments << " segments";
  }
  // 64 columns where they measured faster: 8 heads in 2 or 4 segments (0.945 / 0.538 ms against
  // 1.140 / 0.626 in value and map pairs at 32768 tokens).
  for (int segments : {2, 4}) {
    const CpChoice c = cp_best_split(shape(8, 1, 32768), kH200Sms, segments, segments, false);
    EXPECT_EQ(c.dvb, 64) << segments << " segments";
  }
  // Value and map pairs only where the launch forms them: dk = dv = 128.
  gdnkit::detail::Shape wide = shape(8, 1, 32768);
  wide.dv = 256;
  EXPECT_FALSE(cp_best_split(wide, kH200Sms, 8, 8, false).pairs);
}

// The planner's exact choice on the benchmark's single-sequence rows and on the calibration
// shapes: split where that measured faster (by more than the margin), never where it measured
// slower.
TEST(CpModel, ChoicesOnTheH200) {
  struct Case {
    int heads;
    std::int64_t len;
    int nseg;  // 0: not split
  };
  const Case cases[] = {
      {8, 8192, 8},    {8, 32768, 8},                          // qwen35tp8 rows: 0.125 / 0.394, 0.373 / 1.53 ms
      {32, 16384, 2},  {32, 65536, 2},                         // qwen3next rows: 0.640 / 0.843, 2.49 / 3.31
      {32, 8192, 2},   {32, 4096, 2},                          // 0.331 / 0.441; by the model 0.189 / 0.225
      {32, 2048, kCpLeadPlanned ? 2 : 0},                      // 0.104 / 0.126 (lead mode since, below)
      {64, 4096, 0},   {64, 16384, 0},  {64, 32768, 0},        // fixed-b1, qwen35-b1: every split slower
      {16, 2048, 4},   {24, 4096, kCpLeadPlanned ? 2 : 3},     // 0.081 / 0.117; 0.178 / 0.219 in 3 (lead mode since)
      {40, 2048, 0},   {40, 4096, 2},   {48, 4096, 0},  {48, 16384, 0},  // 0.142 / 0.138 split slower; 0.239 / 0.260
  };
  for (const Case& c : cases) {
    const auto s = shape(c.heads, 1, c.len);
    const CpChoice got = cp_choose(s, kH200Sms, split_path(c.heads), 0, c.len, true, false);
    EXPECT_EQ(got.nseg, c.nseg) << c.heads << " heads, " << c.len << " tokens";
    if (got.nseg >= 2) EXPECT_EQ(got.dvb, 128) << c.heads << " heads, " << c.len << " tokens";
  }
  // Many walks run the fused kernel unsplit (128 columns per CTA) and fill the GPU: no split.
  EXPECT_EQ(cp_choose(shape(64, 2, 16384), kH200Sms, {true, 8}, 0, 16384, true, false).nseg, 0);
  EXPECT_EQ(cp_choose(shape(32, 8, 4096), kH200Sms, {true, 8}, 0, 4096, true, false).nseg, 0);
}

// The fused kernel's 64-column CTAs in pairs sharing their records against the split path, single
// sequences at 64 and 32 heads (measured on an H200, bench/results/nvidia-h200-2026-12-01-cta-pairs.txt).
TEST(CpModel, Fused64PairsOnTheH200) {
  struct M {
    std::int64_t len;
    double ms, tolerance;
  };
  for (const M& m : {M{1024, 0.0684, 0.08}, M{4096, 0.2420, 0.05}, M{16384, 0.9376, 0.05}, M{32768, 1.8592, 0.05}}) {
    const double us = cp_unsplit_cost({true, 4}, shape(64, 1, m.len), kH200Sms);
    EXPECT_NEAR(us / 1000.0, m.ms, m.tolerance * m.ms) << m.len << " tokens";
  }
  // 64 heads: the pairs measured 11-12% faster than the split path (4 warps: 0.283, 1.058, 2.05 ms).
  for (std::int64_t len : {4096, 16384, 32768}) EXPECT_TRUE(fused64_pays(shape(64, 1, len), kH200Sms, 4)) << len;
  // 32 heads: 64 fused CTAs against the split path's 128 (2 warps, 0.843 ms at 16K tokens).
  EXPECT_FALSE(fused64_pays(shape(32, 1, 16384), kH200Sms, 2));
  EXPECT_FALSE(fused64_pays(shape(8, 1, 32768), kH200Sms, 1));
  // Unsplit on the pairs, 64 heads still never split.
  for (std::int64_t len : {4096, 16384, 32768})
    EXPECT_EQ(cp_choose(shape(64, 1, len), kH200Sms, {true, 4}, 0, len, true, false).nseg, 0) << len;
}

// The unsplit 128-column fused kernel (block solve) on batches of many walks: one or two waves of
// 132 SMs (d7ce496 on an H200, bench/results/nvidia-h200-2026-12-05-d7ce496-step-experiments.txt
// and the A/Bs beside it; qwen35-16x64-b4-t8192 as 64 value heads). The estimate had used the
// walk-list kernel's 4.9 us per chunk, 39% high.
TEST(CpModel, Fused128UnsplitOnTheH200) {
  struct M {
    int heads;
    std::int64_t seqs, len;
    double ms;
  };
  for (const M& m : {M{64, 2, 16384, 0.9022}, M{64, 4, 8192, 0.9006}, M{64, 2, 4096, 0.2318}}) {
    const double us = cp_unsplit_cost({true, 8}, shape(m.heads, m.seqs, m.len), kH200Sms);
    EXPECT_NEAR(us / 1000.0, m.ms, 0.05 * m.ms) << m.heads << " heads, " << m.seqs << " x " << m.len << " tokens";
  }
}

// Packed lengths unknown to the host (no max_seq_len): the worst case, one sequence of all the
// tokens, is planned where equal lengths would still be cut and cost at most 5% more.
TEST(CpModel, PackedWithoutTheHint) {
  // 8 x 4096 on 8 heads (64 walks: the split path at 4 warps per CTA unsplit): the worst case's
  // segments are no shorter than the sequences, so equal lengths would be walked whole and the
  // split would only add launches.
  const UnsplitKernel w4{false, 4};
  EXPECT_EQ(cp_choose(shape(8, 8, 4096), kH200Sms, w4, 0, 0, true, false).nseg, 0);
  // 4 x 2048 on 8 heads (the split path at 2 warps unsplit): equal lengths alone do not pay by
  // the model, the worst case does and costs equal lengths under 5% more: planned for it
  // (segments of 1024 tokens) only where the lengths are packed and unknown to the host.
  const UnsplitKernel w2{false, 2};
  const CpChoice worst = cp_choose(shape(8, 4, 2048), kH200Sms, w2, 0, 0, true, false);
  EXPECT_EQ(worst.nseg, 8);
  EXPECT_EQ(worst.seg_tokens, 1024);
  EXPECT_EQ(cp_choose(shape(8, 4, 2048), kH200Sms, w2, 0, 2048, true, false).nseg, 0);  // the hint: known
  EXPECT_EQ(cp_choose(shape(8, 4, 2048), kH200Sms, w2, 0, 0, false, false).nseg, 0);    // no cu_seqlens: equal
}

TEST(CpModel, ForcedSegments) {
  const CpChoice four = cp_choose(shape(64, 1, 4096), kH200Sms, split_path(64), 4, 0, false, false);
  EXPECT_EQ(four.nseg, 4);
  EXPECT_EQ(four.seg_tokens, 1024);
  // Fewer segments where the sequence has fewer chunks; none under two chunks.
  EXPECT_EQ(cp_choose(shape(8, 1, 100), kH200Sms, split_path(8), 3, 0, false, false).nseg, 2);
  EXPECT_EQ(cp_choose(shape(8, 1, 64), kH200Sms, split_path(8), 3, 0, false, false).nseg, 0);
  // The hint sets the segment length: a third of the longest sequence, not of the mean.
  const CpChoice hinted = cp_choose(shape(8, 4, 8192), kH200Sms, split_path(8), 3, 20000, true, false);
  EXPECT_EQ(hinted.seg_tokens, 6720);  // ceil(313 chunks / 3) = 105 chunks
}

// Lead mode (CpLayout::lead): one sequence in two segments, the first, longer one on the unsplit
// 64-column pairs beside the second's value and map pair, where 4 CTAs per head fit the SMs.
TEST(CpModel, LeadMode) {
  using gdnkit::cuda::cp_best_lead;
  using gdnkit::cuda::cp_lead_cost;
  for (const std::int64_t len : {4096, 16384, 65536}) {
    const auto s = shape(32, 1, len);
    const CpChoice lead = cp_best_lead(s, kH200Sms);
    ASSERT_EQ(lead.nseg, 2) << len;
    EXPECT_TRUE(lead.lead && lead.pairs) << len;
    EXPECT_EQ(lead.dvb, 128);
    // The pairs step ~60% of the 128-column pair's time: the first segment takes ~62% of the chunks,
    // and the second is never empty.
    const std::int64_t chunks = len / 64, first = lead.seg_tokens / 64;
    EXPECT_GT(first, chunks * 55 / 100) << len;
    EXPECT_LT(first, chunks * 70 / 100) << len;
    // The search's minimum, and under the even split in value and map pairs by the same model.
    for (const std::int64_t other : {first - 1, first + 1, chunks / 2})
      if (other >= 1 && other < chunks) EXPECT_LE(lead.cost, cp_lead_cost(s, other)) << len << " at " << other;
    EXPECT_LT(lead.cost, cp_split_cost(s, kH200Sms, chunks / 2, 128, false, true)) << len;
    // The planner takes it on these rows (qwen3next-16x32-b1-*) unless built without it.
    const CpChoice got = cp_choose(s, kH200Sms, {true, 4}, 0, len, true, false);
    EXPECT_EQ(got.lead, kCpLeadPlanned) << len;
    if (kCpLeadPlanned) EXPECT_EQ(got.seg_tokens, lead.seg_tokens) << len;
  }
  // Not where 4 CTAs per head exceed the SMs, for two sequences, other head sizes, one chunk.
  EXPECT_EQ(cp_best_lead(shape(64, 1, 16384), kH200Sms).nseg, 0);
  EXPECT_EQ(cp_best_lead(shape(33, 1, 16384), kH200Sms).nseg, 2);
  EXPECT_EQ(cp_best_lead(shape(34, 1, 16384), kH200Sms).nseg, 0);
  EXPECT_EQ(cp_best_lead(shape(32, 2, 16384), kH200Sms).nseg, 0);
  EXPECT_EQ(cp_best_lead(shape(32, 1, 64), kH200Sms).nseg, 0);
  auto dk64 = shape(32, 1, 16384);
  dk64.dk = 64;
  EXPECT_EQ(cp_best_lead(dk64, kH200Sms).nseg, 0);
  // Never with the decay shortcut, nor where the caller forces a segment count.
  EXPECT_FALSE(cp_choose(shape(32, 1, 65536), kH200Sms, {true, 4}, 0, 65536, true, true).lead);
  EXPECT_FALSE(cp_choose(shape(32, 1, 65536), kH200Sms, {true, 4}, 2, 65536, true, false).lead);
  // Nor on the 64-head rows, which the unsplit pairs fill.
  EXPECT_FALSE(cp_choose(shape(64, 1, 32768), kH200Sms, {true, 4}, 0, 32768, true, false).lead);
}

// The decay shortcut's model: one long sequence of 32 or 64 heads splits, a short one does not.
TEST(CpModel, DecayShortcut) {
  EXPECT_GE(cp_choose(shape(32, 1, 65536), kH200Sms, split_path(32), 0, 65536, true, true).nseg, 2);
  EXPECT_GE(cp_choose(shape(64, 1, 32768), kH200Sms, split_path(64), 0, 32768, true, true).nseg, 2);
  EXPECT_EQ(cp_choose(shape(32, 1, 4096), kH200Sms, split_path(32), 0, 4096, true, true).nseg, 0);
  // Its map walks stop after two chunks: the split costs less than the exact one.
  const auto s = shape(32, 1, 65536);
  EXPECT_LT(cp_split_cost(s, kH200Sms, 256, 128, true), cp_split_cost(s, kH200Sms, 256, 128, false));
}

// The fused kernel's column block by default (fused_columns), on an H200's 132 SMs: the boundaries
// of its measured rules (docs/perf-notes.md, "The fused kernel on short sequences").
TEST(CpModel, FusedColumns) {
  // Many walks: 128 columns above a mean of 32 tokens (T > 32 N), whatever the split path.
  EXPECT_EQ(fused_columns(shape(64, 256, 64), kH200Sms, 8), 128);
  EXPECT_EQ(fused_columns(shape(64, 256, 33), kH200Sms, 8), 128);
  EXPECT_EQ(fused_columns(shape(64, 256, 32), kH200Sms, 8), 0);
  EXPECT_EQ(fused_columns(gdnkit::test::mha_shape(64, 256, 256 * 32 + 1), kH200Sms, 8), 128);  // mean 32.004
  EXPECT_EQ(fused_columns(shape(64, 2, 16384), kH200Sms, 8), 128);
  EXPECT_EQ(fused_columns(shape(1, 66, 100), kH200Sms, 1), 128);  // 66 walks: half the SMs
  // Few walks: none at a mean of 32 tokens or less; 128 columns up to one chunk on average; 64 from
  // more than one up to 16 chunks, beyond by the model.
  EXPECT_EQ(fused_columns(shape(8, 1, 32), kH200Sms, 1), 0);
  EXPECT_EQ(fused_columns(shape(1, 65, 32), kH200Sms, 1), 0);
  EXPECT_EQ(fused_columns(shape(8, 1, 33), kH200Sms, 1), 128);
  EXPECT_EQ(fused_columns(shape(1, 1, 64), kH200Sms, 1), 128);
  EXPECT_EQ(fused_columns(shape(64, 1, 64), kH200Sms, 4), 128);
  EXPECT_EQ(fused_columns(shape(8, 1, 65), kH200Sms, 1), 64);
  EXPECT_EQ(fused_columns(shape(1, 65, 100), kH200Sms, 1), 64);
  EXPECT_EQ(fused_columns(shape(8, 1, 127), kH200Sms, 1), 64);
  EXPECT_EQ(fused_columns(shape(8, 1, 128), kH200Sms, 1), 64);
  EXPECT_EQ(fused_columns(shape(8, 1, 1024), kH200Sms, 1), 64);
  EXPECT_EQ(fused_columns(shape(8, 1, 32768), kH200Sms, 1), 0);  // fused64_pays: no (above)
  EXPECT_EQ(fused_columns(shape(64, 1, 16384), kH200Sms, 4), 64);  // 64 walks, under half: the pairs pay
  EXPECT_EQ(fused_columns(shape(32, 1, 16384), kH200Sms, 2), 0);
  EXPECT_EQ(fused_columns(shape(32, 1, 16384), kH200Sms, 0), 64);  // no split path to compare with
  // dv = 64: not measured, never.
  auto dv64 = shape(64, 256, 64);
  dv64.dv = 64;
  EXPECT_EQ(fused_columns(dv64, kH200Sms, 8), 0);
}

// The planner skips its search of segment counts where a lower bound of every split's cost says no
// split can pay (cp_best_split's `beat`): that must never change a choice. Every combination of a
// grid of shapes, hints, unsplit kernels, SM counts and both modes, pruned and not.
TEST(CpModel, PruningChangesNoChoice) {
  int split = 0, cases = 0;
  for (int heads : {1, 2, 8, 16, 32, 64, 128})
    for (std::int64_t seqs : {1, 2, 3, 10, 64})
      for (std::int64_t len : {65, 128, 1000, 4096, 16384, 65536, 262144})
        for (int dims : {0, 1, 2})
          for (std::int64_t hint : {std::int64_t{0}, len, 3 * len})
            for (bool packed : {true, false})
              for (bool cut : {false, true})
                for (UnsplitKernel unsplit : {UnsplitKernel{true, 8}, UnsplitKernel{true, 4}, UnsplitKernel{false, 1},
                                              UnsplitKernel{false, 8}})
                  for (int sms : {kH200Sms, 78}) {
                    gdnkit::detail::Shape s = shape(heads, seqs, len);
                    s.dk = dims == 1 ? 64 : 128;
                    s.dv = dims == 2 ? 64 : 128;
                    const CpChoice a = cp_choose(s, sms, unsplit, 0, hint, packed, cut, true);
                    const CpChoice b = cp_choose(s, sms, unsplit, 0, hint, packed, cut, false);
                    ASSERT_EQ(a.nseg, b.nseg) << heads << " heads, " << seqs << " x " << len << ", dims " << dims
                                              << ", hint " << hint << ", packed " << packed << ", cut " << cut;
                    ASSERT_EQ(a.seg_tokens, b.seg_tokens);
                    ASSERT_EQ(a.dvb, b.dvb);
                    ASSERT_EQ(a.pairs, b.pairs);
                    ASSERT_EQ(a.cost, b.cost);
                    ++cases;
                    split += a.nseg >= 2;
                  }
  EXPECT_GT(cases, 10000);
  EXPECT_GT(split, cases / 20);  // both outcomes well represented
  EXPECT_LT(split, cases - cases / 20);
}

// The bound under every split's cost (the property the pruning rests on), checked against the
// search itself: where cp_best_split finds a split, a `beat` just above its cost keeps it, and a
// `beat` at or below the bound's value finds none.
TEST(CpModel, BestSplitWithBeat) {
  for (int heads : {1, 8, 64})
    for (std::int64_t len : {200, 8192, 131072})
      for (bool cut : {false, true}) {
        const auto s = shape(heads, 1, len);
        const CpChoice best = cp_best_split(s, kH200Sms, 2, 64, cut);
        ASSERT_GE(best.nseg, 2);
        const CpChoice kept = cp_best_split(s, kH200Sms, 2, 64, cut, best.cost * 1.001);
        EXPECT_EQ(kept.nseg, best.nseg);
        EXPECT_EQ(kept.cost, best.cost);
        EXPECT_EQ(cp_best_split(s, kH200Sms, 2, 64, cut, 1.0).nseg, 0);  // nothing costs under 1 us
      }
}

}  // namespace
