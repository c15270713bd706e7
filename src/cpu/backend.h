// CPU backend: the chunked (C = 64) fp32 prefill, multithreaded over (sequence, head).
#pragma once

#include <cstddef>

#include "common/shape.h"

namespace gdnkit::cpu {

struct Config {
  int threads = 1;
  bool avx2 = false;  // the products on AVX2 + FMA (x86-64 CPUs that have them), else the SSE baseline
};

Config plan(const Problem& problem, const detail::Shape& shape, const Options& options);
std::size_t workspace_bytes(const Problem& problem, const detail::Shape& shape, const Config& config);
void run(const Problem& problem, const detail::Shape& shape, const Config& config,
         const Tensors& tensors, void* workspace);

}  // namespace gdnkit::cpu
