// The problem after planning: every default resolved, every check passed. Backends read this,
// never the raw Problem defaults.
#pragma once

#include <cstdint>
#include <string>

#include "gdnkit/gdnkit.h"

namespace gdnkit::detail {

struct Shape {
  std::int64_t T = 0;  // total tokens
  std::int64_t N = 0;  // sequences
  int Hq = 0, Hk = 0, Hv = 0;
  int H = 0;           // output heads = max(Hq, Hv)
  int dk = 0, dv = 0;
  // Output head h reads q head h / q_group, k head h / k_group, v head h / v_group.
  int q_group = 1, k_group = 1, v_group = 1;
  Strides q, k, v, o, g, beta;  // resolved: never 0
  float scale = 0.0f;
  std::int64_t uniform_len = 0;  // sequence length when !has_cu_seqlens

  // Head index of each input for output head h.
  int q_head(int h) const { return h / q_group; }
  int k_head(int h) const { return h / k_group; }
  int v_head(int h) const { return h / v_group; }
  // Elements in one state ([dk, dv] or [dv, dk]).
  std::int64_t state_elems() const { return static_cast<std::int64_t>(dk) * dv; }
};

// Checks the metadata and resolves defaults; throws Error naming the argument.
Shape resolve_shape(const Problem& problem);

// Builds the Error message format used everywhere: "<arg>: expected <expected>, got <got>".
[[noreturn]] void fail(Error::Kind kind, const std::string& argument, const std::string& expected,
                       const std::string& got);

// Token range of sequence n (reads cu_seqlens on the host; for host problems only).
struct SeqRange {
  std::int64_t begin = 0, end = 0;
};
SeqRange host_seq_range(const Problem& problem, const Shape& shape, const void* cu_seqlens,
                        std::int64_t n);

// Checks cu_seqlens values on the host (start 0, non-decreasing, end T). Throws Error.
void check_cu_seqlens_host(const Problem& problem, const Shape& shape, const void* cu_seqlens);

}  // namespace gdnkit::detail
