// Context parallelism on one GPU: the list builder, the scan and correction kernels and the launch
// sequence (cp.cuh describes the stages).
#include "cuda/cp.h"
#include "common/host_stamps.h"
#include "cuda/launch_list.h"

#include <algorithm>
#include <cmath>
#include <mutex>

#if GDNKIT_HAS_CUTLASS
#include "cuda/cp.cuh"
#endif

namespace gdnkit::cuda {

namespace {

std::size_t align256(std::size_t x) { return (x + 255) / 256 * 256; }

}  // namespace

CpWorkspace cp_workspace(const CpLayout& c, std::int64_t seqs, std::int64_t tokens, int heads, int dk, int dv) {
  CpWorkspace w;
  const auto slots = static_cast<std::size_t>(c.slots) * static_cast<std::size_t>(heads);
  w.list1 = 0;
  w.list3 = align256(static_cast<std::size_t>(c.cap1) * sizeof(WalkSpan));
  w.seq_slots = w.list3 + align256(static_cast<std::size_t>(c.cap3) * sizeof(WalkSpan));
  w.states = w.seq_slots + align256(static_cast<std::size_t>(seqs) * 2 * sizeof(int));
  w.maps = w.states + align256(slots * dk * dv * sizeof(float));
  w.map_o = w.maps + align256(slots * dk * dk * sizeof(float));
  w.map_end = w.map_o + align256(static_cast<std::size_t>(tokens + 16) * heads * dk * 2);  // map_o_piece
  w.bytes = w.map_end + align256(slots * 2 * sizeof(int));
  return w;
}

#if GDNKIT_HAS_CUTLASS

namespace {

__global__ void __launch_bounds__(kCpBuildThreads) gdn_cp_build_kernel(const ChunkedParams p, const CpLayout c,
                                                                        WalkSpan* list1, WalkSpan* list3,
                                                                        int* seq_slots) {
  __shared__ int sm[3 * kCpBuildThreads];
  grid_dependency_wait();  // cu_seqlens may come from the kernel ahead (a programmatic launch)
  cp_build_lists<kCpBuildThreads>(p, c, list1, list3, seq_slots, sm, threadIdx.x);
}

template <int DK>
__global__ void __launch_bounds__(cp_scan_threads<DK>()) gdn_cp_scan_kernel(const ChunkedParams p, const int* seq_slots, float* E,
                                                         const float* M) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
  __trap();  // bulk copies (the split runs on sm_90a only)
#else
  extern __shared__ __align__(16) unsigned char scan_sm[];  // cp_scan_smem_bytes<DK>()
  cp_scan_cta<DK>(p, seq_slots, E, M, scan_sm, threadIdx.x);
#endif
}

constexpr int kCpStopThreads = 256;
__global__ void __launch_bounds__(kCpStopThreads) gdn_cp_stop_kernel(const ChunkedParams p, const WalkSpan* list3,
                                                                      float log_cutoff, int* map_end) {
  __shared__ float sm[kCpStopThreads + 1];
  cp_stop_cta<kCpStopThreads>(p, list3, log_cutoff, map_end, sm, threadIdx.x);
}

template <typename T, int DK>
__global__ void __launch_bounds__(kCpFixThreads) gdn_cp_fix_kernel(const ChunkedParams p, const WalkSpan* list3,
                                                                    std::int64_t count, const float* E,
                                                                    const T* map_o) {
#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
  __trap();  // wgmma (the split runs on sm_90a only)
#else
  extern __shared__ __align__(16) unsigned char fix_sm[];  // cp_fix_smem_bytes<DK>()
  cp_fix_cta<T, DK>(p, list3, count, E, map_o, fix_sm, threadIdx.x);
#endif
}

// Appends a launch (each of a split's launches is a programmatic dependent launch, pdl.cuh: the
// kernel may be scheduled before the one ahead of it on the stream has finished, and waits for it
// in grid_dependency_wait).
template <typename... Params, typename... Args>
cudaError_t add(LaunchList& list, void (*kernel)(Params...), dim3 grid, unsigned threads, std::size_t smem,
                Args... args) {
  return list.add(kernel, grid, dim3(threads), smem, args...) ? cudaSuccess : cudaErrorInvalidValue;
}

}  // namespace

cudaError_t cp_prepare(int device) {
  static std::mutex mutex;
  static bool done[64] = {};
  std::lock_guard<std::mutex> lock(mutex);
  if (device >= 0 && device < 64 && done[device]) return cudaSuccess;
  cudaError_t err = cudaFuncSetAttribute(gdn_cp_scan_kernel<128>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(cp_scan_smem_bytes<128>()));
  if (err == cudaSuccess)
    err = cudaFuncSetAttribute(gdn_cp_scan_kernel<64>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               static_cast<int>(cp_scan_smem_bytes<64>()));
  if (err == cudaSuccess && device >= 0 && device < 64) done[device] = true;
  return err;
}

namespace {

cudaError_t add_cp_launches(const ChunkedParams& p_in, const CpLayout& c, const SplitKernel& k1, const FusedMaps& maps,
                            float cutoff, unsigned char* ws, LaunchList& list) {
  ChunkedParams p = p_in;
  const int dk = k1.dk, dvb1 = 16 * k1.warps;
  if (c.seg < kChunk || c.seg % kChunk != 0 || dk % dvb1 != 0 || p.dv % dvb1 != 0 || p.dv % kCpFixCols != 0 ||
      p.num_seqs < 1 || p.num_seqs > 65535 || c.cap1 < p.num_seqs)
    return cudaErrorInvalidValue;
  const CpWorkspace w = cp_workspace(c, p.num_seqs, p.tokens, p.num_heads, dk, p.dv);
  WalkSpan* list1 = nullptr;
  WalkSpan* list3 = nullptr;
  int* seq_slots = nullptr;
  const bool computed = cp_compute_lists(p, c);
  // Few sequences, exact: stage 1 places the entries (cp_warp_packed_stage1), a launch less.
  const bool packed = !computed && cutoff <= 0.0f && p.num_seqs <= kCpPackedMaxSeqs && k1.packed_func != nullptr;
  if (!computed) {
    list1 = reinterpret_cast<WalkSpan*>(ws + w.list1);
    list3 = reinterpret_cast<WalkSpan*>(ws + w.list3);
    seq_slots = reinterpret_cast<int*>(ws + w.seq_slots);
    const cudaError_t err =
        packed ? cudaSuccess
               : add(list, gdn_cp_build_kernel, dim3(1), kCpBuildThreads, 0, p, c, list1, list3, seq_slots);
    if (err != cudaSuccess) return err;
  }
  auto* const E = reinterpret_cast<float*>(ws + w.states);
  auto* const M = reinterpret_cast<float*>(ws + w.maps);
  void* const map_o = ws + w.map_o;
  const auto H = static_cast<unsigned>(p.num_heads);

  cudaError_t err = cudaSuccess;
  if (cutoff > 0.0f && c.cap3 > 0) {  // the decay shortcut: where each map walk may stop
    auto* const map_end = reinterpret_cast<int*>(ws + w.map_end);
    err = add(list, gdn_cp_stop_kernel, dim3(static_cast<unsigned>(c.cap3), H), kCpStopThreads, 0, p, list3,
              std::log(cutoff), map_end);
    if (err != cudaSuccess) return err;
    p.map_end = map_end;
  }

  ChunkedParams p1 = p;
  p1.longest_first = false;
  p1.lpt = false;
  p1.walks = list1;
  p1.num_walks = c.cap1;
  p1.walk_states = nullptr;
  p1.walk_out = E;
  p1.map_out = M;
  p1.map_o = map_o;
  p1.map_o_token = static_cast<std::int64_t>(p.num_heads) * dk;
  p1.value_blocks = p.dv / dvb1;
  p1.cp_pairs = c.pairs && dvb1 == 128 && p.dv == 128 && dk == 128 && p.map_end == nullptr;
  if (packed) {
    p1.walks = nullptr;
    p1.cp_list3 = list3;
    p1.cp_seq_slots = seq_slots;
    p1.cp_packed_seg = c.seg;
    p1.cp_cap3 = static_cast<int>(c.cap3);  // below cap1 <= kCtaWalks x 65535 (the planner's bound)
    p1.cp_slots = static_cast<int>(c.slots);
  }
  if (c.lead) {
    // Lead mode: one sequence in two segments of a computed list, exact, in value and map pairs.
    if (!computed || p.num_seqs != 1 || !p1.cp_pairs || p.tokens <= c.seg) return cudaErrorInvalidValue;
    err = add_fused_lead_launch(k1, cp_lead_params(p, c, E), p1, maps, &list);
  } else {
    // Only the list's real entries get CTAs (cp_list_entries).
    const dim3 g1(static_cast<unsigned>(p.dv / dvb1 + dk / dvb1), H,
                  static_cast<unsigned>(std::min<std::int64_t>(cp_list_entries(p, c, computed, false), 65535)));
    err = add_fused_launch(k1, p1, maps, g1, &list);
  }
  if (err != cudaSuccess || c.cap3 == 0) return err;

  if (cp_needs_scan(p, c, computed)) {
    const dim3 grid(static_cast<unsigned>(p.dv / kCpScanCols), H, static_cast<unsigned>(p.num_seqs));
    if (dk == 128)
      err = add(list, gdn_cp_scan_kernel<128>, grid, cp_scan_threads<128>(), cp_scan_smem_bytes<128>(), p, seq_slots,
                E, M);
    else
      err = add(list, gdn_cp_scan_kernel<64>, grid, cp_scan_threads<64>(), cp_scan_smem_bytes<64>(), p, seq_slots, E,
                M);
    if (err != cudaSuccess) return err;
  }

  const int parts = (c.seg + kCpFixChunks * kChunk - 1) / (kCpFixChunks * kChunk);
  const dim3 g3(static_cast<unsigned>(p.dv / kCpFixCols * parts), H,
                static_cast<unsigned>(std::min<std::int64_t>(cp_list_entries(p, c, computed, true), 65535)));
  const bool bf16 = k1.dtype == DType::bf16;
  using BF = __nv_bfloat16;
  if (bf16 && dk == 128)
    return add(list, gdn_cp_fix_kernel<BF, 128>, g3, kCpFixThreads, cp_fix_smem_bytes<128>(), p, list3, c.cap3, E,
               static_cast<const BF*>(map_o));
  if (bf16)
    return add(list, gdn_cp_fix_kernel<BF, 64>, g3, kCpFixThreads, cp_fix_smem_bytes<64>(), p, list3, c.cap3, E,
               static_cast<const BF*>(map_o));
  if (dk == 128)
    return add(list, gdn_cp_fix_kernel<__half, 128>, g3, kCpFixThreads, cp_fix_smem_bytes<128>(), p, list3, c.cap3, E,
               static_cast<const __half*>(map_o));
  return add(list, gdn_cp_fix_kernel<__half, 64>, g3, kCpFixThreads, cp_fix_smem_bytes<64>(), p, list3, c.cap3, E,
             static_cast<const __half*>(map_o));
}

}  // namespace

cudaError_t launch_cp(const ChunkedParams& p, const CpLayout& c, const SplitKernel& k1, const FusedMaps& maps,
                      float cutoff, unsigned char* ws, LaunchGraphs* graphs, cudaStream_t stream) {
  LaunchList list;
  // Every launch's arguments follow from the plan and these addresses (the descriptors in maps
  // too): a graph that last launched with the same ones sets no node.
  // (A value a call could change besides these, were one added to the call, must join the key.)
  [[maybe_unused]] const void* const key[] = {p.q, p.k, p.v, p.g, p.beta, p.cu_seqlens, p.initial_state,
                                              p.o, p.final_state, ws};
  static_assert(sizeof key <= LaunchList::kKeyBytes, "the key fits the list");
#ifndef GDNKIT_FUSED_TIMELINE  // (that measurement build hands stage 1 a stamp buffer on some launches only)
  list.set_key(key, sizeof key);
#endif
  const cudaError_t err = add_cp_launches(p, c, k1, maps, cutoff, ws, list);
  GDNKIT_HOST_STAMP(4);
  if (err != cudaSuccess) return err;  // nothing launched
  return graphs != nullptr ? graphs->launch(list, stream) : list.launch(stream);
}

#else  // no CUTLASS: no fused kernel, so no split either

cudaError_t cp_prepare(int) { return cudaErrorNotSupported; }
cudaError_t launch_cp(const ChunkedParams&, const CpLayout&, const SplitKernel&, const FusedMaps&, float, unsigned char*,
                      LaunchGraphs*, cudaStream_t) {
  return cudaErrorNotSupported;
}

#endif

}  // namespace gdnkit::cuda
