// The walk CTAs' grid (walk_grid.h).
#include "cuda/walk_grid.h"

#include <algorithm>

#include "cuda/chunked.h"

namespace gdnkit::cuda {

WalkGrid walk_grid(const detail::Shape& s, int cols, bool packed, bool fused, int sms, int ctas_per_sm) {
  WalkGrid g;
  // blockIdx.z strides over sequences. Short sequences (under four chunks on average) are walked
  // several per CTA; longer ones get a CTA each and the hardware balances them. The split path's
  // walk takes about two CTAs per SM slot in all, so that one sequence's copies overlap the
  // previous one's products. The fused kernel pipelines across its sequences itself and holds an
  // SM per CTA: one wave (more CTAs leave a last partial wave of CTAs as long as the others: 2.4
  // waves at 64 heads, 13-29% slower on an H200; docs/perf-notes.md).
  const std::int64_t xy = (s.dv / cols) * s.H, slots = static_cast<std::int64_t>(sms) * std::max(ctas_per_sm, 1);
  g.z = std::min<std::int64_t>(std::max<std::int64_t>(s.N, 1), 65535);
  if (s.T < 4 * kChunk * s.N)
    g.z = std::min<std::int64_t>(g.z, std::max<std::int64_t>(1, fused ? slots / xy : (2 * slots + xy - 1) / xy));
  // A CTA per sequence: start the longest walks first, so that the short ones fill in at the end
  // (packed batches of uneven lengths; the ranking costs each CTA a pass over N lengths).
  const bool ranked = packed && s.N >= 3 && s.N <= kLongestFirstMaxSeqs;
  g.longest_first = ranked && g.z == s.N;
  // The fused kernel fills its pipeline once per CTA (about a record, ~5 us on an H200), so a
  // packed batch with more sequences than one wave of CTAs has room for is walked by one wave: each
  // CTA takes its share of the ranked sequences (ChunkedParams::lpt) and runs them back to back.
  if (ranked && fused) {
    const std::int64_t wave = std::max<std::int64_t>(1, slots / xy);
    if (wave < s.N) {
      g.z = wave;
      g.longest_first = g.lpt = true;
    }
  }
  return g;
}

bool short_walk_takes(const detail::Shape& s, bool packed, std::int64_t max_seq_len) {
  constexpr std::int64_t kMaxLen = 32, kMaxMean = 16, kMaxUnknownTokens = 1024;
  const std::int64_t n = std::max<std::int64_t>(s.N, 1);
  // Without cu_seqlens every sequence is T/N long, whatever the hint says.
  const std::int64_t longest = packed ? max_seq_len : s.uniform_len;
  if (longest > 0) return longest <= kMaxLen;
  return s.T / n <= kMaxMean && s.T <= kMaxUnknownTokens;
}

}  // namespace gdnkit::cuda
