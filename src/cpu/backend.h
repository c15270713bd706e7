// CPU backend: the chunked (C = 64) fp32 prefill, multithreaded over (sequence, head).
#pragma once

#include <cstddef>

#include "common/shape.h"

namespace gdnkit::cpu {

// The instruction set of the products (gemm): SSE, the x86-64 baseline; AVX2 with FMA; AVX-512
// (16-wide blocks, the same fused multiply-adds per element: AVX2's results bit for bit).
enum class Simd { baseline, avx2, avx512 };

struct Config {
  int threads = 1;
  Simd simd = Simd::baseline;  // the best the CPU has, unless GDNKIT_CPU_SIMD says less at plan()
};

// The products' instruction set as run() uses it: "baseline", "avx2" or "avx512".
const char* simd_name(const Config& config);

Config plan(const Problem& problem, const detail::Shape& shape, const Options& options);
std::size_t workspace_bytes(const Problem& problem, const detail::Shape& shape, const Config& config);
void run(const Problem& problem, const detail::Shape& shape, const Config& config,
         const Tensors& tensors, void* workspace);

}  // namespace gdnkit::cpu
