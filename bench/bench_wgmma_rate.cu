// wgmma issue rate on one SM (the fused kernel design's first open question,
// docs/fused-kernel-design.md section 3): cycles per m64nNk16 instruction, A from registers (RS,
// as the walk issues them) or from shared memory (SS), with one, two or three warpgroups issuing
// at once, in batches (four products, then one wait) or dependent (a wait after each product).
// The last column compares the SM's multiply-adds per cycle with 2,048, the dense bf16 rate of an
// H100/H200 SM (989 TFLOP/s at 1.83 GHz over 132 SMs).
//
//   build-gpu/bench_wgmma_rate
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <utility>
#include <vector>

#include "cuda/wgmma_sm90.cuh"

namespace {

using gdnkit::cuda::gmma_desc;
using T = __nv_bfloat16;
namespace G = cute::SM90::GMMA;

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "bench_wgmma_rate: %s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

template <int N> struct SsOp;
template <> struct SsOp<64> { using type = G::MMA_64x64x16_F32BF16BF16_SS<G::Major::K, G::Major::K>; };
template <> struct SsOp<128> { using type = G::MMA_64x128x16_F32BF16BF16_SS<G::Major::K, G::Major::K>; };

template <int N, std::size_t... I>
__device__ __forceinline__ void gmma_ss(float (&d)[N / 2], std::uint64_t da, std::uint64_t db, std::index_sequence<I...>) {
  SsOp<N>::type::fma(da, db, d[I]..., G::ScaleOut::One);
}

// One product of step kk: B is an N x 64 K-major tile (N rows of 128 bytes), A (SS) a 64 x 64 one.
template <int N, bool SS>
__device__ __forceinline__ void product(float (&acc)[N / 2], const std::uint32_t (&a)[4], const unsigned char* sa,
                                        const unsigned char* sb, int kk) {
  const std::uint64_t db = gmma_desc(sb + 32 * kk, 16, 1024);
  if constexpr (SS)
    gmma_ss<N>(acc, gmma_desc(sa + 32 * kk, 16, 1024), db, std::make_index_sequence<N / 2>{});
  else
    gdnkit::cuda::gmma_rs<T, N, false>(acc, a, db, true);
}

template <int N, bool SS, bool DEP>
__global__ void __launch_bounds__(384, 1) rate_kernel(int wgs, int iters, float* sink, long long* cycles) {
  extern __shared__ __align__(1024) unsigned char smem[];
  unsigned char* const sa = smem;            // 64 x 64 bf16, 8 KB
  unsigned char* const sb = smem + 8192;     // N x 64 bf16
  for (int i = threadIdx.x; i < (8192 + N * 128) / 2; i += blockDim.x)
    reinterpret_cast<T*>(smem)[i] = __float2bfloat16(1e-3f * ((i * 37) % 17 - 8));
  gdnkit::cuda::gmma_smem_fence();
  __syncthreads();
  const int wg = threadIdx.x / 128;
  if (wg >= wgs) return;
  float acc[N / 2];
#pragma unroll
  for (int i = 0; i < N / 2; ++i) acc[i] = 0.0f;
  std::uint32_t a[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) a[i] = 0x3a803a80u + threadIdx.x + i;  // small bf16 pairs
  const long long t0 = clock64();
  for (int it = 0; it < iters; ++it) {
    gdnkit::cuda::gmma_fence(acc);
    gdnkit::cuda::gmma_fence(a);
    gdnkit::cuda::gmma_arrive();
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      product<N, SS>(acc, a, sa, sb, kk);
      if constexpr (DEP) {
        gdnkit::cuda::gmma_commit();
        gdnkit::cuda::gmma_wait<0>();
      }
    }
    if constexpr (!DEP) {
      gdnkit::cuda::gmma_commit();
      gdnkit::cuda::gmma_wait<0>();
    }
    gdnkit::cuda::gmma_fence(acc);
  }
  const long long t1 = clock64();
  float s = 0.0f;
#pragma unroll
  for (int i = 0; i < N / 2; ++i) s += acc[i];
  sink[blockIdx.x * blockDim.x + threadIdx.x] = s;
  if (threadIdx.x % 128 == 0) cycles[blockIdx.x * 3 + wg] = t1 - t0;
}

template <int N, bool SS, bool DEP>
void run(int sms, float* sink, long long* cycles) {
  constexpr int kIters = 4096;
  const int smem = 8192 + N * 128;
  auto kern = &rate_kernel<N, SS, DEP>;
  check(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, smem), "attribute");
  for (int wgs = 1; wgs <= 3; ++wgs) {
    kern<<<sms, 384, smem>>>(wgs, kIters / 8, sink, cycles);  // warm-up
    kern<<<sms, 384, smem>>>(wgs, kIters, sink, cycles);
    check(cudaDeviceSynchronize(), "run");
    std::vector<long long> c(sms * 3);
    check(cudaMemcpy(c.data(), cycles, c.size() * 8, cudaMemcpyDeviceToHost), "copy");
    std::vector<double> per;  // cycles per product per warpgroup
    for (int b = 0; b < sms; ++b)
      for (int w = 0; w < wgs; ++w) per.push_back(static_cast<double>(c[b * 3 + w]) / (4.0 * kIters));
    std::sort(per.begin(), per.end());
    const double cyc = per[per.size() / 2];
    const double fma_per_clk = wgs * 64.0 * N * 16 / cyc;  // the SM's rate while all wgs issue
    std::printf("%4d %3s %10s %4d %14.1f %16.0f %10.0f%%\n", N, SS ? "SS" : "RS", DEP ? "dependent" : "batch of 4",
                wgs, cyc, fma_per_clk, 100.0 * fma_per_clk / 2048.0);
  }
}

}  // namespace

int main() {
  int sms = 0;
  check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), "attribute");
  float* sink;
  long long* cycles;
  check(cudaMalloc(&sink, sms * 384 * 4), "malloc");
  check(cudaMalloc(&cycles, sms * 3 * 8), "malloc");
  std::printf("m64nNk16 bf16 wgmma, one CTA per SM (%d SMs); cycles per product per warpgroup (median)\n", sms);
  std::printf("%4s %3s %10s %4s %14s %16s %11s\n", "N", "A", "issue", "WGs", "cycles/product", "FMA/clk per SM",
              "of 2048");
  run<64, false, false>(sms, sink, cycles);
  run<64, false, true>(sms, sink, cycles);
  run<64, true, false>(sms, sink, cycles);
  run<128, false, false>(sms, sink, cycles);
  run<128, false, true>(sms, sink, cycles);
  run<128, true, false>(sms, sink, cycles);
  return 0;
}
