// The prep kernel's time per chunk record when k CTAs share an SM (k forced by requesting extra
// dynamic shared memory): how fast one 128-thread CTA turns out a record with little else running.
// That is the budget question of a fused kernel, where one warpgroup would prepare chunk j + 1
// while the others walk chunk j (docs/fused-kernel-design.md).
//
//   build-gpu/bench_prep_alone        (one head, 64 x SMs x 12 tokens of cuLA-style inputs)
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "cuda/chunked.h"
#include "cuda/prep_kernel.cuh"

namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "bench_prep_alone: %s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

__device__ unsigned mix(unsigned long long i, unsigned seed) {
  unsigned h = static_cast<unsigned>(i) * 2654435761u ^ seed;
  h ^= h >> 13;
  h *= 0x5bd1e995u;
  return h ^ (h >> 15);
}
// Uniform in [-scale, scale): the scale of cuLA's inputs (k 0.01, q 0.03).
__global__ void fill_bf16(__nv_bfloat16* x, long long n, float scale, unsigned seed) {
  for (long long i = blockIdx.x * 256ll + threadIdx.x; i < n; i += 256ll * gridDim.x)
    x[i] = __float2bfloat16(scale * ((mix(i, seed) & 0xffff) / 32768.0f - 1.0f));
}
// Uniform in [lo, lo + width).
__global__ void fill_f32(float* x, long long n, float lo, float width, unsigned seed) {
  for (long long i = blockIdx.x * 256ll + threadIdx.x; i < n; i += 256ll * gridDim.x)
    x[i] = lo + width * ((mix(i, seed) & 0xffff) / 65536.0f);
}

}  // namespace

int main() {
  using namespace gdnkit;
  constexpr int DK = 128;
  int sms = 0, optin = 0;
  check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), "attribute");
  check(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, 0), "attribute");
  const long long T = 64ll * sms * 12;  // 12 waves of CTAs at one per SM
  Problem pr;
  pr.memory = Memory::cuda;
  pr.total_tokens = T;
  pr.num_q_heads = pr.num_k_heads = pr.num_v_heads = 1;
  pr.head_dim_k = pr.head_dim_v = DK;
  const detail::Shape s = detail::resolve_shape(pr);

  __nv_bfloat16 *q, *k;
  float *g, *beta;
  int* cu;
  unsigned char* ws;
  const long long slots = (T + cuda::kChunk - 1) / cuda::kChunk + 1;
  check(cudaMalloc(&q, T * DK * 2), "malloc");
  check(cudaMalloc(&k, T * DK * 2), "malloc");
  check(cudaMalloc(&g, T * 4), "malloc");
  check(cudaMalloc(&beta, T * 4), "malloc");
  check(cudaMalloc(&cu, 8), "malloc");
  check(cudaMalloc(&ws, slots * cuda::kRecBytes), "malloc");
  const int cu_host[2] = {0, static_cast<int>(T)};
  check(cudaMemcpy(cu, cu_host, 8, cudaMemcpyHostToDevice), "copy");
  fill_bf16<<<1024, 256>>>(q, T * DK, 0.03f, 1);
  fill_bf16<<<1024, 256>>>(k, T * DK, 0.01f, 2);
  fill_f32<<<1024, 256>>>(g, T, -0.163f, 0.112f, 3);  // log(alpha), alpha in [0.85, 0.95)
  fill_f32<<<1024, 256>>>(beta, T, 0.0f, 0.5f, 4);
  check(cudaGetLastError(), "fill");

  Tensors t;
  t.q = q, t.k = k, t.v = q, t.o = nullptr, t.g = g, t.beta = beta, t.cu_seqlens = cu;
  cuda::ChunkedParams p = cuda::chunked_params(pr, s, t);
  p.ws = ws;
  const void* kern = reinterpret_cast<const void*>(&cuda::gdn_prep_kernel<__nv_bfloat16, DK>);
  check(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, optin), "attribute");
  const int base = static_cast<int>(cuda::PrepLayout<DK>::total);
  std::printf("prep CTA (dk %d): %d bytes of shared memory; %d SMs; %lld CTAs\n", DK, base, sms, slots);
  std::printf("%8s %10s %10s %22s %22s\n", "CTAs/SM", "occupancy", "ms", "us per CTA (lifetime)", "us per record per SM");
  for (int per_sm : {1, 2, 3, 4, 6}) {
    int smem = per_sm == 1 ? optin : std::max(base, 228 * 1024 / per_sm - 2048);
    smem = std::min(smem, optin);
    int occ = 0;
    check(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, kern, cuda::kPrepThreads, smem), "occupancy");
    cudaEvent_t e0, e1;
    check(cudaEventCreate(&e0), "event");
    check(cudaEventCreate(&e1), "event");
    void* args[] = {&p};
    std::vector<float> ms;
    for (int r = 0; r < 12; ++r) {
      check(cudaEventRecord(e0), "event");
      check(cudaLaunchKernel(kern, dim3(static_cast<unsigned>(slots)), dim3(cuda::kPrepThreads), args, smem, 0),
            "launch");
      check(cudaEventRecord(e1), "event");
      check(cudaEventSynchronize(e1), "run");
      float x = 0;
      check(cudaEventElapsedTime(&x, e0, e1), "event");
      if (r >= 2) ms.push_back(x);  // two warm-ups
    }
    std::sort(ms.begin(), ms.end());
    const double med = ms[ms.size() / 2];
    const double waves = static_cast<double>(slots) / (static_cast<double>(sms) * occ);
    std::printf("%8d %10d %10.4f %22.2f %22.2f\n", per_sm, occ, med, med * 1e3 / waves,
                med * 1e3 / (static_cast<double>(slots) / sms));
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
  }
  return 0;
}
