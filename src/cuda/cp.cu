// Context parallelism on one GPU: the walk-list builder, the scan kernel and the launch sequence
// (cp.cuh describes the stages).
#include "cuda/cp.h"

#include <algorithm>

namespace gdnkit::cuda {

namespace {

constexpr unsigned kBuildThreads = 128;

__global__ void __launch_bounds__(kBuildThreads) gdn_cp_build_kernel(const CpLayout c, WalkSpan* list1,
                                                                      WalkSpan* list3) {
  const std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * kBuildThreads + threadIdx.x;
  if (i < c.walks()) cp_build_walk(c, i, list1, list3);
}

template <int DK>
__global__ void __launch_bounds__(DK) gdn_cp_scan_kernel(const ChunkedParams p, const CpLayout c, float* E,
                                                         const float* M) {
  __shared__ __align__(16) float xs[DK * kCpScanCols];
  cp_scan_cta<DK>(p, c, E, M, xs, threadIdx.x);
}

std::size_t align256(std::size_t x) { return (x + 255) / 256 * 256; }

}  // namespace

CpWorkspace cp_workspace(const CpLayout& c, int heads, int dk, int dv) {
  CpWorkspace w;
  const auto segs = static_cast<std::size_t>(c.num_seqs) * static_cast<std::size_t>(c.nseg) * heads;
  const std::size_t list = align256(static_cast<std::size_t>(c.walks()) * sizeof(WalkSpan));
  w.list1 = 0;
  w.list3 = list;
  w.states = 2 * list;
  w.maps = w.states + align256(segs * dk * dv * sizeof(float));
  w.bytes = w.maps + align256(segs * dk * dk * sizeof(float));
  return w;
}

cudaError_t launch_cp(const ChunkedParams& p, const CpLayout& c, const SplitKernel& k1, const SplitKernel& k3,
                      unsigned char* ws, cudaStream_t stream) {
  const int dk = k1.dk, dvb1 = 16 * k1.warps, dvb3 = 16 * k3.warps;
  if (c.nseg < 2 || c.seg % kChunk != 0 || dk % dvb1 != 0 || p.dv % dvb1 != 0 || p.dv % dvb3 != 0 ||
      k3.dk != dk || k3.dtype != k1.dtype || c.num_seqs * c.len != p.tokens)
    return cudaErrorInvalidValue;
  const CpWorkspace w = cp_workspace(c, p.num_heads, dk, p.dv);
  auto* const list1 = reinterpret_cast<WalkSpan*>(ws + w.list1);
  auto* const list3 = reinterpret_cast<WalkSpan*>(ws + w.list3);
  auto* const E = reinterpret_cast<float*>(ws + w.states);
  auto* const M = reinterpret_cast<float*>(ws + w.maps);
  const std::int64_t walks = c.walks();
  const auto z = static_cast<unsigned>(std::min<std::int64_t>(walks, 65535));
  const auto H = static_cast<unsigned>(p.num_heads);

  gdn_cp_build_kernel<<<static_cast<unsigned>((walks + kBuildThreads - 1) / kBuildThreads), kBuildThreads, 0,
                        stream>>>(c, list1, list3);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;

  FusedMaps maps;  // stage 1 and stage 3 read the same K, Q, V
  if (!encode_fused_maps(p, k1.dtype, dk, &maps)) return cudaErrorInvalidValue;

  ChunkedParams p1 = p;
  p1.longest_first = false;
  p1.walks = list1;
  p1.num_walks = walks;
  p1.walk_states = nullptr;
  p1.walk_out = E;
  p1.map_out = M;
  p1.value_blocks = p.dv / dvb1;
  err = launch_fused_encoded(k1, p1, maps, dim3(static_cast<unsigned>(p.dv / dvb1 + dk / dvb1), H, z), stream);
  if (err != cudaSuccess) return err;

  if (c.nseg > 2) {
    const dim3 grid(static_cast<unsigned>(p.dv / kCpScanCols), H, static_cast<unsigned>(c.num_seqs));
    if (dk == 128)
      gdn_cp_scan_kernel<128><<<grid, 128, 0, stream>>>(p, c, E, M);
    else
      gdn_cp_scan_kernel<64><<<grid, 64, 0, stream>>>(p, c, E, M);
    err = cudaGetLastError();
    if (err != cudaSuccess) return err;
  }

  ChunkedParams p3 = p;
  p3.longest_first = false;
  p3.walks = list3;
  p3.num_walks = walks;
  p3.walk_states = E;
  return launch_fused_encoded(k3, p3, maps, dim3(static_cast<unsigned>(p.dv / dvb3), H, z), stream);
}

}  // namespace gdnkit::cuda
