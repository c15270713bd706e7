// Context parallelism on one GPU: the walk-list builder, the scan kernel and the launch sequence
// (cp.cuh describes the stages).
#include "cuda/cp.h"

#include <algorithm>

namespace gdnkit::cuda {

namespace {

__global__ void __launch_bounds__(kCpBuildThreads) gdn_cp_build_kernel(const ChunkedParams p, const CpLayout c,
                                                                        WalkSpan* list1, WalkSpan* list3,
                                                                        int* seq_slots) {
  __shared__ int sm[2 * kCpBuildThreads];
  cp_build_lists<kCpBuildThreads>(p, c, list1, list3, seq_slots, sm, threadIdx.x);
}

template <int DK>
__global__ void __launch_bounds__(DK) gdn_cp_scan_kernel(const ChunkedParams p, const int* seq_slots, float* E,
                                                         const float* M) {
  __shared__ __align__(16) float xs[DK * kCpScanCols];
  cp_scan_cta<DK>(p, seq_slots, E, M, xs, threadIdx.x);
}

std::size_t align256(std::size_t x) { return (x + 255) / 256 * 256; }

}  // namespace

CpWorkspace cp_workspace(const CpLayout& c, std::int64_t seqs, int heads, int dk, int dv) {
  CpWorkspace w;
  const auto slots = static_cast<std::size_t>(c.slots) * static_cast<std::size_t>(heads);
  w.list1 = 0;
  w.list3 = align256(static_cast<std::size_t>(c.cap1) * sizeof(WalkSpan));
  w.seq_slots = w.list3 + align256(static_cast<std::size_t>(c.cap3) * sizeof(WalkSpan));
  w.states = w.seq_slots + align256(static_cast<std::size_t>(seqs) * 2 * sizeof(int));
  w.maps = w.states + align256(slots * dk * dv * sizeof(float));
  w.bytes = w.maps + align256(slots * dk * dk * sizeof(float));
  return w;
}

cudaError_t launch_cp(const ChunkedParams& p, const CpLayout& c, const SplitKernel& k1, const SplitKernel& k3,
                      unsigned char* ws, cudaStream_t stream) {
  const int dk = k1.dk, dvb1 = 16 * k1.warps, dvb3 = 16 * k3.warps;
  if (c.seg < kChunk || c.seg % kChunk != 0 || dk % dvb1 != 0 || p.dv % dvb1 != 0 || p.dv % dvb3 != 0 ||
      k3.dk != dk || k3.dtype != k1.dtype || p.num_seqs < 1 || p.num_seqs > 65535 || c.cap1 < p.num_seqs)
    return cudaErrorInvalidValue;
  const CpWorkspace w = cp_workspace(c, p.num_seqs, p.num_heads, dk, p.dv);
  auto* const list1 = reinterpret_cast<WalkSpan*>(ws + w.list1);
  auto* const list3 = reinterpret_cast<WalkSpan*>(ws + w.list3);
  auto* const seq_slots = reinterpret_cast<int*>(ws + w.seq_slots);
  auto* const E = reinterpret_cast<float*>(ws + w.states);
  auto* const M = reinterpret_cast<float*>(ws + w.maps);
  const auto H = static_cast<unsigned>(p.num_heads);

  gdn_cp_build_kernel<<<1, kCpBuildThreads, 0, stream>>>(p, c, list1, list3, seq_slots);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;

  FusedMaps maps;  // stage 1 and stage 3 read the same K, Q, V
  if (!encode_fused_maps(p, k1.dtype, dk, &maps)) return cudaErrorInvalidValue;

  ChunkedParams p1 = p;
  p1.longest_first = false;
  p1.walks = list1;
  p1.num_walks = c.cap1;
  p1.walk_states = nullptr;
  p1.walk_out = E;
  p1.map_out = M;
  p1.value_blocks = p.dv / dvb1;
  const dim3 g1(static_cast<unsigned>(p.dv / dvb1 + dk / dvb1), H, static_cast<unsigned>(std::min<std::int64_t>(c.cap1, 65535)));
  err = launch_fused_encoded(k1, p1, maps, g1, stream);
  if (err != cudaSuccess || c.cap3 == 0) return err;

  const dim3 grid(static_cast<unsigned>(p.dv / kCpScanCols), H, static_cast<unsigned>(p.num_seqs));
  if (dk == 128)
    gdn_cp_scan_kernel<128><<<grid, 128, 0, stream>>>(p, seq_slots, E, M);
  else
    gdn_cp_scan_kernel<64><<<grid, 64, 0, stream>>>(p, seq_slots, E, M);
  err = cudaGetLastError();
  if (err != cudaSuccess) return err;

  ChunkedParams p3 = p;
  p3.longest_first = false;
  p3.walks = list3;
  p3.num_walks = c.cap3;
  p3.walk_states = E;
  const dim3 g3(static_cast<unsigned>(p.dv / dvb3), H, static_cast<unsigned>(std::min<std::int64_t>(c.cap3, 65535)));
  return launch_fused_encoded(k3, p3, maps, g3, stream);
}

}  // namespace gdnkit::cuda
