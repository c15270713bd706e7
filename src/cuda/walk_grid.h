// How the walk CTAs of an unsplit kernel cover a batch's sequences (the grid's z and the order
// they take them in): plain host arithmetic, no CUDA calls, so that the CPU tests check the
// planner's choices on an H200's SM count.
#pragma once

#include <cstdint>

#include "common/shape.h"

namespace gdnkit::cuda {

// z CTAs per (value block, head); longest_first: they rank the sequences by length
// (ChunkedParams::longest_first); lpt: each walks its share of them (ChunkedParams::lpt).
struct WalkGrid {
  std::int64_t z = 1;
  bool longest_first = false;
  bool lpt = false;
};

// s: the problem's shape; cols: value columns per CTA; packed: the lengths come from cu_seqlens;
// fused: the fused SM90 kernel (a pipeline per CTA); sms and ctas_per_sm: the device's SM count
// and the kernel's CTAs per SM.
WalkGrid walk_grid(const detail::Shape& s, int cols, bool packed, bool fused, int sms, int ctas_per_sm);

// Whether the sequences are short enough for the short walk (short_walk.cuh: 16-token chunks, a
// CTA per sequence): the longest length (the uniform length where !packed, else max_seq_len, the
// hint, where given) at most 32 tokens, or, with the lengths unknown, a mean of at most 16 tokens in a batch
// of at most 1,024. The mean may hide one long sequence, which the short walk takes 16 tokens per
// serial step: the token bound keeps that worst case (64 steps) near what the split path's
// per-walk costs take on such a batch (a bound from the measurements, the worst case itself not
// measured). Measured on an H200 only, bf16, dk = dv = 128, 64 heads, no states
// (docs/perf-notes.md, "The short walk"): 256 sequences of L tokens 0.236-0.333 ms against the
// split path's 0.496-0.537 for L = 1 to 16, 0.593 against 0.630 at L = 20, level at L = 32 (0.668
// against 0.666), 1.00 against 0.88 at L = 48; 256 sequences of 1 to 32 tokens (random) 0.454
// against 0.581. Other dtypes, head sizes and GPUs take it by the same rule, unmeasured.
bool short_walk_takes(const detail::Shape& s, bool packed, std::int64_t max_seq_len);

}  // namespace gdnkit::cuda
