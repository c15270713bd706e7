// Splits a case's sequences into walks of the fused kernel's walk-list variant (cuda::WalkSpan) at
// chunk borders, with the fp64 oracle's state at each border as the walk's start state: what the
// next stage of context parallelism hands the kernel. Used by the emulated and the GPU tests.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "common/test_util.h"
#include "cuda/chunked.h"

namespace gdnkit::test {

struct WalkSplit {
  std::vector<cuda::WalkSpan> walks;  // in a scrambled order (the kernel must not assume any)
  std::vector<float> states;          // [2 N, H, dk, dv] start states, in the case's state layout
};

// Walks [0, c1[n]), [c1[n], c2[n]), [c2[n], len[n]) of every sequence n (cuts at multiples of 64,
// c1 <= c2 <= len; equal cuts give empty walks), the first from the sequence's initial state, the
// others from the oracle's state at their start (states n and N + n), only the last writing the
// final state.
inline WalkSplit split_walks(Case& full, const std::vector<std::int64_t>& c1, const std::vector<std::int64_t>& c2) {
  const detail::Shape& s = full.shape;
  const std::int64_t N = full.N();
  WalkSplit w;
  w.states.assign(static_cast<std::size_t>(2 * N * s.H * s.state_elems()), 0.0f);
  const std::vector<std::int64_t> zero(static_cast<std::size_t>(N), 0);
  for (int level = 0; level < 2; ++level) {
    Case part = sub_case(full, zero, level == 0 ? c1 : c2);
    const Reference r = run_reference(part);
    for (std::int64_t nh = 0; nh < N * s.H; ++nh)
      for (int i = 0; i < s.dk; ++i)
        for (int j = 0; j < s.dv; ++j)
          w.states[static_cast<std::size_t>((level * N * s.H + nh) * s.state_elems() +
                                            (full.spec.layout == StateLayout::kv ? i * s.dv + j : j * s.dk + i))] =
              static_cast<float>(r.state[static_cast<std::size_t>(nh * s.state_elems() + i * s.dv + j)]);
  }
  for (std::int64_t n = 0; n < N; ++n) {
    const std::size_t u = static_cast<std::size_t>(n);
    const auto b = static_cast<std::int32_t>(full.starts[n]);
    const auto len = static_cast<std::int32_t>(full.spec.lens[u]);
    const auto a1 = static_cast<std::int32_t>(c1[u]), a2 = static_cast<std::int32_t>(c2[u]);
    const auto seq = static_cast<std::int32_t>(n);
    w.walks.push_back({seq, b + a2, b + len, static_cast<std::int32_t>(N + n), 1});
    w.walks.push_back({seq, b, b + a1, -1, 0});
    w.walks.push_back({seq, b + a1, b + a2, seq, 0});
  }
  std::reverse(w.walks.begin(), w.walks.end());
  return w;
}

}  // namespace gdnkit::test
