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

}  // namespace gdnkit::cuda
