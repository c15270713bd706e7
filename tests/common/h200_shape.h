// Problem shapes for the host-only planner tests (cost model, walk grid): an H200's SM count and
// a multi-head problem of equal head counts at dk = dv = 128.
#pragma once

#include <cstdint>

#include "common/shape.h"

namespace gdnkit::test {

constexpr int kH200Sms = 132;

// `seqs` sequences holding `tokens` tokens in all, `heads` q, k and v heads.
inline detail::Shape mha_shape(int heads, std::int64_t seqs, std::int64_t tokens) {
  detail::Shape s;
  s.N = seqs;
  s.T = tokens;
  s.Hq = s.Hk = s.Hv = s.H = heads;
  s.dk = s.dv = 128;
  return s;
}

}  // namespace gdnkit::test
