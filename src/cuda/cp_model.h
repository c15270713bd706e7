// The planner's cost model for context parallelism (splitting sequences into segments): plain
// host arithmetic, no CUDA, so that the CPU tests check its choices on an H200's SM count.
#pragma once

#include <cstdint>
#include <limits>

#include "common/shape.h"

namespace gdnkit::cuda {

// The unsplit kernel the planner would run instead: the fused SM90 kernel (16 * warps value
// columns per CTA) or the split path (prep + walk, warps per walk CTA).
struct UnsplitKernel {
  bool fused = false;
  int warps = 0;
};

// A split: nseg segments of seg_tokens tokens per sequence of the modelled length, stage 1 on
// dvb-column CTAs, cost the model's device time in microseconds. nseg = 0: none.
// pairs: stage 1 at 128 columns in value and map CTA pairs sharing their records (exact only).
// lead: lead mode (CpLayout::lead; nseg 2, pairs): the first segment, seg_tokens long, on the
// unsplit 64-column pairs beside the second's value and map pair.
struct CpChoice {
  int nseg = 0, seg_tokens = 0, dvb = 0;
  double cost = 0.0;
  bool pairs = false;
  bool lead = false;
};

// The planner splits where the model puts the split under this fraction of the unsplit kernel.
constexpr double kSplitPays = 0.93;

// Estimated device time (us) of the unsplit kernel k on the problem (lengths s.T / s.N).
double cp_unsplit_cost(UnsplitKernel k, const detail::Shape& s, int sms);

// Whether the fused kernel's 64-column variant (CTA pairs sharing records, at dv = 128) is the
// unsplit kernel to run rather than the split path with split_warps walk warps per CTA: by the
// model, under kFused64Pays of the split path's time.
constexpr double kFused64Pays = 0.95;
bool fused64_pays(const detail::Shape& s, int sms, int split_warps);

// The fused kernel's value columns per CTA by default (0: not the fused kernel; the caller checks
// the device, the build and the size limits), on a device of `sms` SMs, split_warps as above (0:
// no split path to compare with). Measured on an H200 (docs/perf-notes.md, "Fused kernel, second
// version" and "The fused kernel on short sequences"):
//   - 0 where sequences average at most 32 tokens (the short walk or the split path), and at
//     dv != 128 (not measured);
//   - 128 where the walks (sequence, head) fill at least half the SMs: against the split path
//     10-15% faster from 410 tokens, 16-23% at 48 and 64 (256 sequences, 64 heads), level at 32,
//     10% slower at 24 (the short walk is faster there); and for fewer walks of one chunk on
//     average: one 64-token sequence 9.2-9.4 us against the split path's 13.8 (1 head) and 15.9
//     (64 heads), and the 64-column CTAs' 9.9 and 10.8;
//   - 64 (CTA pairs sharing their records) for fewer walks of more than one and up to 16 chunks
//     on average (one 128-token sequence 11.8 and 13.3 us, under the split path's time for half
//     of it), or longer ones where fused64_pays: 11-12% faster than the split path on single
//     sequences of 4K-32K tokens at 64 heads; at 32 heads the split path, with twice the CTAs, is
//     faster by the model.
int fused_columns(const detail::Shape& s, int sms, int split_warps);

// Estimated device time (us) of a split into segments of seg_chunks chunks, stage 1 on dvb-column
// CTAs (cut: the decay shortcut; pairs: CpChoice::pairs, dvb 128 and exact).
double cp_split_cost(const detail::Shape& s, int sms, std::int64_t seg_chunks, int dvb, bool cut, bool pairs = false);

// The cheapest split into nseg segments, nseg in [lo, hi]; nseg = 0 when none is possible, or
// when no split can cost less than `beat` (a lower bound of the costs says so without the search).
CpChoice cp_best_split(const detail::Shape& s, int sms, int lo, int hi, bool cut,
                       double beat = std::numeric_limits<double>::infinity());

// Whether the planner takes lead mode where the model puts it cheapest (GDNKIT_CP_LEAD, a build
// switch). 0 by default until it is timed on a GPU (docs/perf-notes.md, "Lead mode": built and
// checked in the emulator, predicted ~23% faster on qwen3next-16x32-b1-*); 1 plans it.
#ifndef GDNKIT_CP_LEAD
#define GDNKIT_CP_LEAD 0
#endif
constexpr bool kCpLeadPlanned = GDNKIT_CP_LEAD != 0;

// Estimated device time (us) of lead mode with a first segment of seg_chunks chunks (one sequence,
// dk = dv = 128), and the cheapest such split (nseg 0 where lead mode cannot run: more than one
// sequence, other head sizes, more than sms / 4 heads, fewer than two chunks).
double cp_lead_cost(const detail::Shape& s, std::int64_t seg_chunks);
CpChoice cp_best_lead(const detail::Shape& s, int sms);

// The planner's split of a problem (s: its shape; dk and dv multiples of 64, and dv 128 unless
// forced, checked by the caller) on a device of `sms` SMs, with `unsplit` the kernel it would run otherwise.
// forced >= 2: segments of about 1/forced of the modelled length (nseg = 0 where the sequences
// are under two chunks; never lead mode); forced == 0: the split only where it pays by the model,
// lead mode (exact only) where it is the cheapest. max_seq_len: the
// caller's hint (0: unknown); packed: the lengths come from cu_seqlens (unknown to the host).
// prune: skip the search where no split can pay (the same choice, faster; false to test that).
CpChoice cp_choose(const detail::Shape& s, int sms, UnsplitKernel unsplit, int forced, std::int64_t max_seq_len,
                   bool packed, bool cut, bool prune = true);

}  // namespace gdnkit::cuda
