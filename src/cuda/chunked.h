// The fused chunked GDN kernel: its launch parameters and the table of compiled instantiations.
// Shared by chunked_launch.cu (kernels) and backend.cu (planning and dispatch).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "gdnkit/gdnkit.h"

namespace gdnkit::cuda {

constexpr int kChunk = 64;     // tokens per chunk (C)
constexpr int kThreads = 128;  // threads per CTA (4 warps)

// Everything the kernel reads, resolved on the host. Strides are in elements. Pointers are the
// caller's; the kernel never writes through an input pointer.
struct ChunkedParams {
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  const float* g = nullptr;
  const void* beta = nullptr;
  const void* cu_seqlens = nullptr;
  const float* initial_state = nullptr;  // may equal final_state
  void* o = nullptr;
  float* final_state = nullptr;

  std::int64_t q_token = 0, q_head = 0;
  std::int64_t k_token = 0, k_head = 0;
  std::int64_t v_token = 0, v_head = 0;
  std::int64_t o_token = 0, o_head = 0;
  std::int64_t g_token = 0, g_head = 0;
  std::int64_t beta_token = 0, beta_head = 0;

  std::int64_t num_seqs = 0;     // N
  std::int64_t uniform_len = 0;  // sequence length when !has_cu_seqlens
  int num_heads = 0;             // H (output heads)
  int q_group = 1, k_group = 1, v_group = 1;  // input head = output head / group
  int dv = 0;                    // full value head dim (state row length in kv layout)
  float scale = 0.0f;

  // Runtime options (uniform branches, cheap).
  bool has_cu_seqlens = true;
  bool cu_seqlens_i64 = false;
  bool has_gate = true;
  bool gate_linear = false;  // g holds alpha; use log(max(alpha, FLT_MIN))
  bool has_beta = true;
  int beta_dtype = 0;        // 0 f32, 1 bf16, 2 f16
  bool has_initial_state = false;
  bool want_final_state = false;
  bool state_vk = false;     // state layout [dv, dk] instead of [dk, dv]
};

constexpr int kBetaF32 = 0, kBetaBF16 = 1, kBetaF16 = 2;

// One compiled instantiation (qkv dtype, dk, value-column block).
struct ChunkedKernel {
  const char* name;          // static, e.g. "cuda-chunked-wmma-bf16-k128-dv32"
  DType dtype;               // q, k, v, o
  int dk;
  int dvb;                   // value columns per CTA
  std::size_t smem_bytes;    // dynamic shared memory per CTA
  const void* func;          // the __global__ function (for cudaFuncSetAttribute)
  cudaError_t (*launch)(const ChunkedParams& params, dim3 grid, std::size_t smem_bytes, cudaStream_t stream);
};

// The instantiation for (dtype, dk, dvb), or nullptr when none is compiled.
const ChunkedKernel* find_chunked_kernel(DType dtype, int dk, int dvb);

}  // namespace gdnkit::cuda
