// The fused SM90 kernel's instantiations (fused_sm90.cuh): bf16 and f16, dk 64 and 128, value
// blocks of 128 and 64 columns.
// Built only with the CUTLASS/CuTe headers (wgmma); without them the list is empty.
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "cuda/chunked.h"
#include "cuda/launch_list.h"
#include "cuda/pdl_launch.h"
#if GDNKIT_HAS_CUTLASS
#include "cuda/fused_sm90.cuh"
#endif

namespace gdnkit::cuda {

#if GDNKIT_HAS_CUTLASS
namespace {

// A driver function (of its CUDA 12.0 signature PFN), or nullptr where the driver lacks it.
template <typename PFN>
PFN driver_entry(const char* name) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult found{};
  if (cudaGetDriverEntryPointByVersion(name, &fn, 12000, cudaEnableDefault, &found) != cudaSuccess ||
      found != cudaDriverEntryPointSuccess) {
    cudaGetLastError();
    fn = nullptr;
  }
  return reinterpret_cast<PFN>(fn);
}

}  // namespace

bool encode_tile_map(CUtensorMap* map, const void* base, bool bf16, std::int64_t cols, std::int64_t tokens,
                     int heads, std::int64_t token_stride, std::int64_t head_stride) {
  // The driver's encoder, looked up once per process.
  static const auto encode = driver_entry<PFN_cuTensorMapEncodeTiled_v12000>("cuTensorMapEncodeTiled");
  if (encode == nullptr) return false;
  // A dimension of one entry may have any stride (the shape checks skip it); TMA wants a
  // multiple of 16 bytes, so such a stride is replaced by the next dimension's extent.
  const std::uint64_t rows = static_cast<std::uint64_t>(std::max<std::int64_t>(tokens, 1));
  const std::uint64_t row_bytes = tokens > 1 ? static_cast<std::uint64_t>(token_stride) * 2
                                             : (static_cast<std::uint64_t>(cols) * 2 + 15) / 16 * 16;
  const std::uint64_t head_bytes = heads > 1 ? static_cast<std::uint64_t>(head_stride) * 2 : row_bytes * rows;
  const cuuint64_t dims[3] = {static_cast<cuuint64_t>(cols), rows, static_cast<cuuint64_t>(heads)};
  const cuuint64_t strides[2] = {row_bytes, head_bytes};
  const cuuint32_t box[3] = {64, 64, 1};
  const cuuint32_t elem_strides[3] = {1, 1, 1};
  return encode(map, bf16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 3,
                const_cast<void*>(base), dims, strides, box, elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
                CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

namespace {

// The unsplit 64-column kernel has a second instantiation for CTAs launched in pairs, whose aux
// forms P (FusedSm90::kAuxP); a launch takes it where it forms clusters. Both take the larger of
// their shared memory sizes (one CTA per SM either way).
template <int DVB, bool kWalks>
constexpr bool has_aux_p() {
  return DVB == 64 && !kWalks;
}
template <typename T, int DK, int DVB, bool kWalks>
const void* fused_func(bool paired) {
  if constexpr (has_aux_p<DVB, kWalks>())
    if (paired) return reinterpret_cast<const void*>(&gdn_fused_kernel<T, DK, DVB, kWalks, true>);
  return reinterpret_cast<const void*>(&gdn_fused_kernel<T, DK, DVB, kWalks>);
}
template <typename T, int DK, int DVB, bool kWalks>
constexpr bool paired_block_solve() {
  if constexpr (has_aux_p<DVB, kWalks>()) return FusedSm90<T, DK, DVB, kWalks, true>::kBlockSolve;
  return FusedSm90<T, DK, DVB, kWalks>::kBlockSolve;
}
template <typename T, int DK, int DVB, bool kWalks>
constexpr std::size_t fused_smem_bytes() {
  const std::size_t a = FusedSm90<T, DK, DVB, kWalks>::smem_bytes;
  if constexpr (has_aux_p<DVB, kWalks>()) {
    const std::size_t b = FusedSm90<T, DK, DVB, kWalks, true>::smem_bytes;
    return a > b ? a : b;
  }
  return a;
}

#ifdef GDNKIT_FUSED_TIMELINE
// The timeline build's host side (fused_sm90_probe.cuh, GDNKIT_FUSED_TIMELINE): the stamps' buffer (device
// memory) for the process's launches 5 and 6; at launch 9 it waits for the device, copies them back
// and prints them. The chunks stamped step by step start at GDNKIT_TIMELINE_J0 (default 0).
void set_timeline(FusedParams& fp, dim3 grid) {
  static unsigned long long* buf = nullptr;
  static unsigned ctas[2] = {0, 0};
  static int launches = 0;
  static const int j0 = [] {
    const char* e = std::getenv("GDNKIT_TIMELINE_J0");
    return e ? std::atoi(e) : 0;
  }();
  constexpr std::size_t kWords = 2 * kTimelineCtas * kTimelineSlots;
  if (buf == nullptr && cudaMalloc(&buf, kWords * sizeof(unsigned long long)) != cudaSuccess) return;
  const int k = launches++;
  if (k == 9) {
    static unsigned long long host[kWords];
    if (cudaDeviceSynchronize() == cudaSuccess &&
        cudaMemcpy(host, buf, sizeof host, cudaMemcpyDeviceToHost) == cudaSuccess)
      for (int l = 0; l < 2; ++l)
        for (unsigned c = 0; c < ctas[l]; ++c) {
          const unsigned long long* const t = host + (l * kTimelineCtas + c) * kTimelineSlots;
          std::printf("TL %d %u", l + 5, c);
          for (int i = 0; i < kTimelineSlots; ++i) std::printf(" %llu", t[i]);
          std::printf("\n");
        }
  }
  if (k != 5 && k != 6) return;
  ctas[k - 5] = std::min(grid.x * grid.y * grid.z, kTimelineCtas);
  fp.timeline = buf + (k - 5) * kTimelineCtas * kTimelineSlots;
  fp.timeline_j0 = j0;
}
#endif

// Encodes the call's four TMA descriptors (about a microsecond each on the host), then launches.
template <typename T, int DK, int DVB, bool kWalks = false>
cudaError_t launch_fused(const ChunkedParams& params, dim3, dim3 grid, cudaStream_t stream) {
  using F = FusedSm90<T, DK, DVB, kWalks>;
  // A walk list (in memory or computed) iff the variant walks one.
  if (kWalks != (params.walks != nullptr || params.cp_seg > 0)) return cudaErrorInvalidValue;
  if (kWalks && params.num_walks > std::int64_t(kCtaWalks) * grid.z) return cudaErrorInvalidValue;  // walk_entry
  // Token positions and sequence indices are 32-bit in the kernel (TMA coordinates are).
  if (!fused_sizes_ok(params.tokens, std::max(params.num_seqs, params.num_walks))) return cudaErrorInvalidValue;
  if (params.walks != nullptr && params.longest_first) return cudaErrorInvalidValue;  // the order ranks sequences
  if (params.lpt && (!params.longest_first || grid.z > 64)) return cudaErrorInvalidValue;  // lpt_share (fused_sm90_scheduler.cuh)
  FusedParams fp;
  if (!make_fused_params<T, DK>(params, &fp)) return cudaErrorInvalidValue;
#ifdef GDNKIT_FUSED_TIMELINE
  set_timeline(fp, grid);
#endif
  void* args[] = {&fp};
  const unsigned cluster = fused_cluster_x(F::DVB / 16, params, grid);
  const PdlLaunch launch(grid, dim3(F::kLaunchThreads), fused_smem_bytes<T, DK, DVB, kWalks>(), stream, true, cluster);
  return cudaLaunchKernelExC(&launch.config, fused_func<T, DK, DVB, kWalks>(cluster == 2), args);
}

// Lead mode's stage 1 (gdn_fused_lead_kernel) belongs to the 128-column walk-list kernels at dk 128.
template <typename T, int DK, int DVB, bool kWalks>
constexpr bool has_lead() {
  return kWalks && DVB == 128 && DK == 128;
}
template <typename T, int DK, int DVB, bool kWalks>
const void* lead_func() {
  if constexpr (has_lead<T, DK, DVB, kWalks>()) return reinterpret_cast<const void*>(&gdn_fused_lead_kernel<T>);
  return nullptr;
}
template <typename T, int DK, int DVB, bool kWalks>
constexpr std::size_t lead_smem_bytes() {
  if constexpr (has_lead<T, DK, DVB, kWalks>()) {
    const std::size_t a = fused_smem_bytes<T, 128, 64, false>(), b = fused_smem_bytes<T, 128, 128, true>();
    return a > b ? a : b;
  }
  return 0;
}

template <typename T, int DK, int DVB, bool kWalks = false>
SplitKernel fused_entry(const char* name, DType dtype) {
  using F = FusedSm90<T, DK, DVB, kWalks>;
  return SplitKernel{name,
                     dtype,
                     DK,
                     F::DVB / 16,
                     true,
                     0,
                     fused_smem_bytes<T, DK, DVB, kWalks>(),
                     nullptr,
                     fused_func<T, DK, DVB, kWalks>(false),
                     &launch_fused<T, DK, DVB, kWalks>,
                     F::kLaunchThreads,
                     true,
                     has_aux_p<DVB, kWalks>() ? fused_func<T, DK, DVB, kWalks>(true) : nullptr,
                     false,
                     F::kBlockSolve,
                     kWalks ? reinterpret_cast<const void*>(&gdn_fused_kernel<T, DK, DVB, true, false, true>) : nullptr,
                     paired_block_solve<T, DK, DVB, kWalks>(),
                     lead_func<T, DK, DVB, kWalks>(),
                     lead_smem_bytes<T, DK, DVB, kWalks>()};
}

// Two value-block widths: 128 columns per CTA (two state warpgroups, the record computed once per
// 128 columns) and 64 (one, "-v64": twice the CTAs for problems with fewer walks than SMs).
const SplitKernel kKernels[] = {
    fused_entry<__nv_bfloat16, 128, 128>("cuda-fused-sm90-bf16-k128", DType::bf16),
    fused_entry<__nv_bfloat16, 64, 128>("cuda-fused-sm90-bf16-k64", DType::bf16),
    fused_entry<__half, 128, 128>("cuda-fused-sm90-f16-k128", DType::f16),
    fused_entry<__half, 64, 128>("cuda-fused-sm90-f16-k64", DType::f16),
    fused_entry<__nv_bfloat16, 128, 64>("cuda-fused-sm90-bf16-k128-v64", DType::bf16),
    fused_entry<__nv_bfloat16, 64, 64>("cuda-fused-sm90-bf16-k64-v64", DType::bf16),
    fused_entry<__half, 128, 64>("cuda-fused-sm90-f16-k128-v64", DType::f16),
    fused_entry<__half, 64, 64>("cuda-fused-sm90-f16-k64-v64", DType::f16),
};

// The walk-list variants (ChunkedParams::walks), for splitting sequences: not in the planner's list
// (a call by kernel name never reaches them); find_fused_kernel finds them. A split's map CTAs walk
// dk / DVB blocks of columns, so there is no 128-column variant for dk = 64.
const SplitKernel kWalkKernels[] = {
    fused_entry<__nv_bfloat16, 128, 128, true>("cuda-fused-sm90-bf16-k128-walks", DType::bf16),
    fused_entry<__half, 128, 128, true>("cuda-fused-sm90-f16-k128-walks", DType::f16),
    fused_entry<__nv_bfloat16, 128, 64, true>("cuda-fused-sm90-bf16-k128-v64-walks", DType::bf16),
    fused_entry<__nv_bfloat16, 64, 64, true>("cuda-fused-sm90-bf16-k64-v64-walks", DType::bf16),
    fused_entry<__half, 128, 64, true>("cuda-fused-sm90-f16-k128-v64-walks", DType::f16),
    fused_entry<__half, 64, 64, true>("cuda-fused-sm90-f16-k64-v64-walks", DType::f16),
};

}  // namespace

static_assert(sizeof(FusedMaps) == 4 * sizeof(CUtensorMap) && alignof(FusedMaps) >= alignof(CUtensorMap),
              "FusedMaps holds the four descriptors of FusedParams");

bool encode_fused_maps(const ChunkedParams& p, DType dtype, int dk, FusedMaps* maps) {
  FusedParams fp;
  const bool ok = dtype == DType::bf16 ? (dk == 128 ? make_fused_params<__nv_bfloat16, 128>(p, &fp)
                                                    : make_fused_params<__nv_bfloat16, 64>(p, &fp))
                                       : (dk == 128 ? make_fused_params<__half, 128>(p, &fp)
                                                    : make_fused_params<__half, 64>(p, &fp));
  if (!ok || (dtype != DType::bf16 && dtype != DType::f16) || (dk != 64 && dk != 128)) return false;
  std::memcpy(maps->bytes, &fp.k, sizeof(CUtensorMap));
  std::memcpy(maps->bytes + sizeof(CUtensorMap), &fp.q, sizeof(CUtensorMap));
  std::memcpy(maps->bytes + 2 * sizeof(CUtensorMap), &fp.v, sizeof(CUtensorMap));
  std::memcpy(maps->bytes + 3 * sizeof(CUtensorMap), &fp.o, sizeof(CUtensorMap));
  return true;
}

bool rebase_fused_maps(FusedMaps* maps, const ChunkedParams& p) {
  if (p.tokens == 0) return true;  // no copies: the descriptors are never read
  static const auto replace = driver_entry<PFN_cuTensorMapReplaceAddress_v12000>("cuTensorMapReplaceAddress");
  if (replace == nullptr) return false;
  auto* const m = reinterpret_cast<CUtensorMap*>(maps->bytes);
  return replace(&m[0], const_cast<void*>(p.k)) == CUDA_SUCCESS &&
         replace(&m[1], const_cast<void*>(p.q)) == CUDA_SUCCESS &&
         replace(&m[2], const_cast<void*>(p.v)) == CUDA_SUCCESS && replace(&m[3], p.o) == CUDA_SUCCESS;
}

namespace {

// A launch's parameters: p with the call's encoded descriptors (k, q, v, o).
FusedParams fused_params_with(const ChunkedParams& p, const FusedMaps& maps) {
  FusedParams fp;
  fp.p = p;
  std::memcpy(&fp.k, maps.bytes, sizeof(CUtensorMap));
  std::memcpy(&fp.q, maps.bytes + sizeof(CUtensorMap), sizeof(CUtensorMap));
  std::memcpy(&fp.v, maps.bytes + 2 * sizeof(CUtensorMap), sizeof(CUtensorMap));
  std::memcpy(&fp.o, maps.bytes + 3 * sizeof(CUtensorMap), sizeof(CUtensorMap));
  return fp;
}

}  // namespace

cudaError_t add_fused_launch(const SplitKernel& k, const ChunkedParams& p, const FusedMaps& maps, dim3 grid,
                             LaunchList* list) {
  if (!k.fused || (k.warps != 4 && k.warps != 8)) return cudaErrorInvalidValue;
  if (p.num_walks > std::int64_t(kCtaWalks) * grid.z) return cudaErrorInvalidValue;  // walk_entry (fused_sm90_scheduler.cuh)
  if (!fused_sizes_ok(p.tokens, std::max(p.num_seqs, p.num_walks))) return cudaErrorInvalidValue;
  if (p.walks != nullptr && p.longest_first) return cudaErrorInvalidValue;
  if (p.lpt && (!p.longest_first || grid.z > 64)) return cudaErrorInvalidValue;  // lpt_share (fused_sm90_scheduler.cuh)
  FusedParams fp = fused_params_with(p, maps);
#ifdef GDNKIT_FUSED_TIMELINE
  set_timeline(fp, grid);
#endif
  const unsigned cluster = fused_cluster_x(k.warps, p, grid);
  const void* const func = p.cp_seq_slots != nullptr                   ? k.packed_func
                           : cluster == 2 && k.paired_func != nullptr ? k.paired_func
                                                                       : k.walk_func;
  if (func == nullptr) return cudaErrorInvalidValue;  // placing entries needs a walk-list kernel
  return list->add_block(func, grid, dim3(k.threads), k.walk_smem, cluster, &fp, sizeof fp, alignof(FusedParams))
             ? cudaSuccess
             : cudaErrorInvalidValue;
}

cudaError_t add_fused_lead_launch(const SplitKernel& k, const ChunkedParams& lead, const ChunkedParams& rest,
                                  const FusedMaps& maps, LaunchList* list) {
  // One sequence (the pairs walk sequence 0 as CTA z = 0's list; the rest CTAs take entry 1 of a
  // computed list as z = 1's first), exact, at dk = dv = 128 in value and map pairs.
  if (k.lead_func == nullptr || lead.num_seqs != 1 || rest.num_seqs != 1 || lead.walks != nullptr ||
      lead.cp_seg != 0 || rest.walks != nullptr || rest.cp_seg <= 0 || !rest.cp_pairs || rest.map_end != nullptr ||
      rest.value_blocks != 1 || rest.dv != 128 || !lead.want_final_state || lead.longest_first || rest.longest_first)
    return cudaErrorInvalidValue;
  if (!fused_sizes_ok(rest.tokens, std::max(rest.num_seqs, rest.num_walks))) return cudaErrorInvalidValue;
  const dim3 grid(2, static_cast<unsigned>(rest.num_heads), 2);
  // Both halves cluster along x: the pairs (fused_cluster_x at 64 columns) and the value and map pair.
  if (fused_cluster_x(4, lead, grid) != 2 || fused_cluster_x(8, rest, dim3(2, grid.y, 1)) != 2)
    return cudaErrorInvalidValue;
  const FusedLeadParams fp{fused_params_with(lead, maps), fused_params_with(rest, maps)};
  return list->add_block(k.lead_func, grid, dim3(k.threads), k.lead_smem, 2, &fp, sizeof fp, alignof(FusedLeadParams))
             ? cudaSuccess
             : cudaErrorInvalidValue;
}

cudaError_t launch_fused_encoded(const SplitKernel& k, const ChunkedParams& p, const FusedMaps& maps, dim3 grid,
                                 cudaStream_t stream) {
  LaunchList list;
  const cudaError_t err = add_fused_launch(k, p, maps, grid, &list);
  return err != cudaSuccess ? err : list.launch(stream);
}

SplitKernelList fused_kernels() { return {kKernels, static_cast<int>(sizeof kKernels / sizeof kKernels[0])}; }
SplitKernelList fused_walks_kernels() {
  return {kWalkKernels, static_cast<int>(sizeof kWalkKernels / sizeof kWalkKernels[0])};
}
#else
bool encode_fused_maps(const ChunkedParams&, DType, int, FusedMaps*) { return false; }
bool rebase_fused_maps(FusedMaps*, const ChunkedParams&) { return false; }
cudaError_t add_fused_launch(const SplitKernel&, const ChunkedParams&, const FusedMaps&, dim3, LaunchList*) {
  return cudaErrorInvalidValue;
}
cudaError_t add_fused_lead_launch(const SplitKernel&, const ChunkedParams&, const ChunkedParams&, const FusedMaps&,
                                  LaunchList*) {
  return cudaErrorInvalidValue;
}
cudaError_t launch_fused_encoded(const SplitKernel&, const ChunkedParams&, const FusedMaps&, dim3, cudaStream_t) {
  return cudaErrorInvalidValue;
}
SplitKernelList fused_kernels() { return {nullptr, 0}; }
SplitKernelList fused_walks_kernels() { return {nullptr, 0}; }
#endif

const SplitKernel* find_fused_kernel(DType dtype, int dk, int dvb, bool walks) {
  const SplitKernelList list = walks ? fused_walks_kernels() : fused_kernels();
  for (int i = 0; i < list.count; ++i)
    if (list.begin[i].dtype == dtype && list.begin[i].dk == dk && 16 * list.begin[i].warps == dvb)
      return &list.begin[i];
  return nullptr;
}

}  // namespace gdnkit::cuda
