// CUDA backend: planning (device properties read once, kernel chosen, shared memory opted in) and
// launch. The kernels (a per-chunk prep kernel and the state walk) are in prep_kernel.cuh and
// walk_kernel.cuh, their instantiations in split_bf16.cu and split_f16.cu.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <deque>
#include <mutex>
#include <string>

#include "common/host_stamps.h"
#include "cuda/backend.h"
#include "cuda/capture_mode.h"
#include "cuda/chunked.h"
#include "cuda/cp.h"
#include "cuda/launch_list.h"
#include "cuda/cp_model.h"
#include "cuda/walk_grid.h"

namespace gdnkit::cuda {

namespace {

using detail::fail;

// Whether the planner picks the fused kernel where the device runs it and it pays (choose_fused);
// a caller can always require it by name.
constexpr bool kFusedByDefault = true;
using K = Error::Kind;

std::string str(std::int64_t x) { return std::to_string(x); }

void check(cudaError_t err, const char* what) {
  if (err != cudaSuccess)
    throw Error(Error::Kind::cuda, what, std::string(what) + ": CUDA error " + cudaGetErrorName(err) + ": " +
                                             cudaGetErrorString(err));
}

// q/k/v/o rows are moved with 16-byte vectors: 8 elements of bf16/f16. A stride only matters when
// its dimension has more than one entry.
void check_vector_strides(const char* name, const Strides& s, std::int64_t tokens, int heads) {
  const std::string expected = "a multiple of 8 elements (16-byte vector access in the CUDA backend)";
  if (tokens > 1 && s.token % 8 != 0) fail(K::invalid_value, std::string(name) + ".token stride", expected, str(s.token));
  if (heads > 1 && s.head % 8 != 0) fail(K::invalid_value, std::string(name) + ".head stride", expected, str(s.head));
}

void check_aligned(const char* name, const void* ptr, unsigned bytes = 16,
                   const char* why = "16-byte vector access in the CUDA backend") {
  const auto addr = reinterpret_cast<std::uintptr_t>(ptr);
  if (addr % bytes != 0) {
    char got[32];
    std::snprintf(got, sizeof got, "%p", ptr);
    fail(K::invalid_value, name, "a " + str(bytes) + "-byte aligned pointer (" + why + ")", got);
  }
}

}  // namespace

const SplitKernel* find_split_kernel(DType dtype, int dk, int warps, bool sm90a) {
  for (const SplitKernelList list : {split_kernels_bf16(), split_kernels_f16()})
    for (int i = 0; i < list.count; ++i) {
      const SplitKernel& k = list.begin[i];
      if (k.dtype == dtype && k.dk == dk && k.warps == warps && k.sm90a == sm90a && !k.short_chunks) return &k;
    }
  return nullptr;
}

bool device_available() noexcept {
  // Counted once per process: a framework binding plans on every call.
  static const bool available = [] {
    int count = 0;
    const cudaError_t err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess) {
      cudaGetLastError();  // clear the sticky "no driver" error
      return false;
    }
    return count > 0;
  }();
  return available;
}

namespace {

// What the planner reads of a device and of a kernel image on it, once per process and device:
// attribute and occupancy queries cost about a microsecond each, and a framework binding plans on
// every call. Entries are only appended, under the lock, to deques (references stay valid). A
// cudaDeviceReset drops the shared-memory opt-in recorded here: plan in a new process after one.
struct DeviceInfo {
  int device = -1;
  int cc_major = 0, cc_minor = 0, sm_count = 0, smem_optin = 0;
};
struct KernelInfo {
  int device = -1;
  const SplitKernel* kernel = nullptr;
  int binary_version = 0, ptx_version = 0;  // of the walk's image on this device; 0: none loads
  bool prepared = false;                     // shared memory opted in, occupancy read
  int ctas_per_sm = 0;
};
std::mutex cache_mutex;
std::deque<DeviceInfo>& device_cache() {
  static std::deque<DeviceInfo> v;
  return v;
}
std::deque<KernelInfo>& kernel_cache() {
  static std::deque<KernelInfo> v;
  return v;
}

int attribute(cudaDeviceAttr attr, int device) {
  int value = 0;
  check(cudaDeviceGetAttribute(&value, attr, device), "cudaDeviceGetAttribute");
  return value;
}

DeviceInfo device_info(int device) {
  std::lock_guard<std::mutex> lock(cache_mutex);
  for (const DeviceInfo& d : device_cache())
    if (d.device == device) return d;
  DeviceInfo d;
  d.device = device;
  d.cc_major = attribute(cudaDevAttrComputeCapabilityMajor, device);
  d.cc_minor = attribute(cudaDevAttrComputeCapabilityMinor, device);
  d.sm_count = attribute(cudaDevAttrMultiProcessorCount, device);
  d.smem_optin = attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
  device_cache().push_back(d);
  return d;
}

// The cache entry of k on the current device `device` (image versions read on first use).
KernelInfo& kernel_info_locked(int device, const SplitKernel& k) {
  for (KernelInfo& e : kernel_cache())
    if (e.device == device && e.kernel == &k) return e;
  KernelInfo e;
  e.device = device;
  e.kernel = &k;
  cudaFuncAttributes attrs{};
  const cudaError_t err = cudaFuncGetAttributes(&attrs, k.walk_func);
  if (err == cudaSuccess) {
    e.binary_version = attrs.binaryVersion;
    e.ptx_version = attrs.ptxVersion;
  } else if (err == cudaErrorInvalidDeviceFunction || err == cudaErrorNoKernelImageForDevice) {
    cudaGetLastError();  // no image of it loads on this device: recorded as version 0
  } else {
    check(err, "cudaFuncGetAttributes");  // anything else is reported, and nothing is cached
  }
  kernel_cache().push_back(e);
  return kernel_cache().back();
}

KernelInfo kernel_info(int device, const SplitKernel& k) {
  std::lock_guard<std::mutex> lock(cache_mutex);
  return kernel_info_locked(device, k);
}

// Opts k's kernels into their shared memory and reads the walk's occupancy, once per device.
KernelInfo prepare_kernel(int device, const SplitKernel& k) {
  std::lock_guard<std::mutex> lock(cache_mutex);
  KernelInfo& e = kernel_info_locked(device, k);
  if (!e.prepared) {
    check(cudaFuncSetAttribute(k.walk_func, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(k.walk_smem)),
          "cudaFuncSetAttribute");
    for (const void* f : {k.paired_func, k.packed_func})
      if (f != nullptr)
        check(cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(k.walk_smem)),
              "cudaFuncSetAttribute");
    if (k.lead_func != nullptr)
      check(cudaFuncSetAttribute(k.lead_func, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(k.lead_smem)),
            "cudaFuncSetAttribute");
    if (k.prep_func != nullptr)
      check(cudaFuncSetAttribute(k.prep_func, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 static_cast<int>(k.prep_smem)),
            "cudaFuncSetAttribute");
    check(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&e.ctas_per_sm, k.walk_func, k.threads, k.walk_smem),
          "cudaOccupancyMaxActiveBlocksPerMultiprocessor");
    e.prepared = true;
  }
  return e;
}

// True when the device runs k's walk: the wgmma walks need compute capability 9.0 and an sm_90a
// image of the kernel (other images of it are a trap).
bool walk_runs_on(const SplitKernel& k, const Config& c) {
  if (!k.sm90a) return true;
  if (c.cc_major != 9 || c.cc_minor != 0) return false;
  return kernel_info(c.device, k).binary_version == 90;
}

bool fits(const SplitKernel& k, int smem_optin) {
  return k.walk_smem <= static_cast<std::size_t>(smem_optin) && k.prep_smem <= static_cast<std::size_t>(smem_optin);
}

// The instantiation named by Options::kernel, or an error naming options.kernel: invalid_value
// when no such kernel exists for the problem's dtype and dk, unsupported when this device cannot
// run it. Never another kernel.
const SplitKernel* required_kernel(const std::string& want, const Problem& problem, const detail::Shape& s,
                                   const Config& c, int smem_optin) {
  const SplitKernel* split = nullptr;
  std::string names;
  for (const SplitKernelList list : {split_kernels_bf16(), split_kernels_f16(), fused_kernels()})
    for (int i = 0; i < list.count; ++i) {
      const SplitKernel& k = list.begin[i];
      if (k.dtype != problem.qkv_dtype || k.dk != s.dk || (s.dv / 16) % k.warps != 0) continue;
      names += (names.empty() ? "" : ", ") + std::string(k.name);
      if (want == k.name) split = &k;
    }
  if (split == nullptr) {
    // A fused kernel of this dtype and dk exists, but it walks 128 value columns per CTA.
    const SplitKernel* fused = find_fused_kernel(problem.qkv_dtype, s.dk, 128);
    if (fused != nullptr && want == fused->name && s.dv != 128)
      fail(K::unsupported, "options.kernel",
           want + " with head_dim_v 128 (its -v64 variant walks 64 value columns per CTA)",
           "head_dim_v " + str(s.dv));
    fail(K::invalid_value, "options.kernel",
         std::string("one of the kernels built for dtype ") + to_string(problem.qkv_dtype) + " and dk " + str(s.dk) +
             ": " + names,
         want);
  }
  if (split->fused && !fused_sizes_ok(s.T, s.N))
    fail(K::unsupported, "options.kernel",
         want + " for at most " + str(kFusedMaxTokens) + " tokens and " + str(kFusedMaxSeqs) +
             " sequences (32-bit positions; the split path takes larger problems)",
         "T=" + str(s.T) + ", N=" + str(s.N));
  if (!walk_runs_on(*split, c) || !fits(*split, smem_optin))
    fail(K::unsupported, "options.kernel",
         "a kernel this device runs (" + want + " needs " +
             (split->sm90a ? "compute capability 9.0 and an sm_90a image" : "compute capability 8.0+") + " and " +
             str(static_cast<std::int64_t>(split->walk_smem)) + " bytes of shared memory per block)",
         "sm_" + str(c.cc_major) + str(c.cc_minor) + " with " + str(smem_optin) + " bytes");
  return split;
}

// The fused kernel (one CTA per (value block, head, sequence list): the prep's work and the walk
// in one pass, no records in global memory) where the device runs it and fused_columns
// (cp_model.h: the measured rules, host arithmetic) picks a column block for the shape.
// split_warps: the walk warps per CTA of the split path the planner would run instead (0: none).
const SplitKernel* choose_fused(const Problem& problem, const detail::Shape& s, const Config& c, int smem_optin,
                                int split_warps) {
  if (!kFusedByDefault || !fused_sizes_ok(s.T, s.N)) return nullptr;
  const int dvb = fused_columns(s, c.sm_count, split_warps);
  const SplitKernel* k = dvb ? find_fused_kernel(problem.qkv_dtype, s.dk, dvb) : nullptr;
  if (k == nullptr || !walk_runs_on(*k, c) || !fits(*k, smem_optin)) return nullptr;
  return k;
}

// The short walk where the sequences are short (short_walk_takes, walk_grid.cpp): its widest CTA
// that divides dv.
const SplitKernel* choose_short(const Problem& problem, const detail::Shape& s) {
  if (!short_walk_takes(s, problem.has_cu_seqlens, problem.max_seq_len)) return nullptr;
  for (int warps : {8, 4, 2, 1}) {
    if ((s.dv / 16) % warps != 0) continue;
    for (const SplitKernelList list : {split_kernels_bf16(), split_kernels_f16()})
      for (int i = 0; i < list.count; ++i) {
        const SplitKernel& k = list.begin[i];
        if (k.short_chunks && k.dtype == problem.qkv_dtype && k.dk == s.dk && k.warps == warps) return &k;
      }
  }
  return nullptr;
}

// The fused kernel where choose_fused picks it, else the split path's walk CTA size. Each warp
// walks 16 value columns; a CTA of W warps shares the staging of one chunk. Cost model: the busiest SM runs ceil(CTAs / SMs) CTAs, each costing about W + 1 warp
// steps (the +1: the per-CTA copies and barrier). Ties go to the larger CTA (less copying).
// CTAs of 8 warps (two warpgroups) use the wgmma walk where the device runs it (H100/H200):
// measured on an H200 it is 10-20% faster than mma.sync there, but a single warpgroup per SM
// (4 warps) waits out every product and is 20% slower than mma.sync (docs/perf-notes.md).
// nullptr when nothing fits the device's shared memory.
const SplitKernel* choose_kernel(const Problem& problem, const detail::Shape& s, const Config& c, int smem_optin) {
  const std::int64_t cols16 = s.dv / 16;
  const SplitKernel* split = nullptr;
  std::int64_t best_cost = 0;
  for (int warps : {8, 4, 2, 1}) {
    if (cols16 % warps != 0) continue;
    const SplitKernel* k = warps == 8 ? find_split_kernel(problem.qkv_dtype, s.dk, warps, true) : nullptr;
    if (k == nullptr || !walk_runs_on(*k, c)) k = find_split_kernel(problem.qkv_dtype, s.dk, warps);
    if (k == nullptr || !fits(*k, smem_optin)) continue;
    const std::int64_t ctas = (cols16 / warps) * s.H * std::max<std::int64_t>(s.N, 1);
    const std::int64_t cost = (ctas + c.sm_count - 1) / c.sm_count * (warps + 1);
    if (split == nullptr || cost < best_cost) {
      split = k;
      best_cost = cost;
    }
  }
  if (const SplitKernel* fused = choose_fused(problem, s, c, smem_optin, split != nullptr ? split->warps : 0))
    return fused;
  // Where the fused kernel is not picked, sequences of a few tokens take the short walk.
  if (const SplitKernel* short_walk = choose_short(problem, s)) return short_walk;
  return split;
}

// ---- context parallelism (cp.h; the cost model in cp_model.cpp) --------------------------------

// Fills c's split fields (and its kernel name and workspace) when the problem is split: by
// request (options.segments >= 2: segments of about 1/k of the longest sequence, Problem::
// max_seq_len, or else of the mean length; an error where it cannot be) or where the cost model
// puts the split below kSplitPays (93%) of the unsplit kernel's time (options.segments == 0).
void plan_split(const Problem& problem, const detail::Shape& s, const Options& options, Config& c, int smem_optin) {
  const int want = options.segments;
  if (want < 0) fail(K::invalid_value, "options.segments", "0 (the planner decides), 1 (never split) or k >= 2", str(want));
  if (want == 1 || (want == 0 && options.kernel != nullptr)) return;
  const bool forced = want >= 2;
  if (forced && options.kernel != nullptr)
    fail(K::invalid_value, "options.segments", "0 or 1 together with options.kernel (a split runs its own kernels)",
         str(want));
  // The lengths live on the device: the plan takes the longest length (the hint) or else the mean
  // for the cost model and the segment length, and sizes the workspace by bounds that hold for
  // any lengths (cp.cuh).
  const std::int64_t n = std::max<std::int64_t>(s.N, 1);
  auto unsupported = [&](const std::string& why) {
    if (forced) fail(K::unsupported, "options.segments", "a problem the split runs on (" + why + ")", str(want));
  };
  if (s.T == 0 || s.T > INT32_MAX / 2 || n > 65535) return unsupported("1 to 2^30 tokens, at most 65535 sequences");
  if (s.dv % 64 != 0 || s.dk % 64 != 0) return unsupported("dk and dv multiples of 64");
  if (!forced && (s.dv != 128 || c.split == nullptr)) return;
  const UnsplitKernel unsplit{c.split != nullptr && c.split->fused, c.split != nullptr ? c.split->warps : 0};
  const float cutoff = options.split_decay_cutoff;
  const CpChoice best =
      cp_choose(s, c.sm_count, unsplit, forced ? want : 0, problem.max_seq_len, problem.has_cu_seqlens, cutoff > 0.0f);
  if (best.nseg < 2) {
    const std::int64_t lmax =
        std::max<std::int64_t>(1, problem.has_cu_seqlens && problem.max_seq_len > 0 ? problem.max_seq_len : s.T / n);
    return unsupported("sequences of two chunks or more: the longest (Problem::max_seq_len) or else the mean is " +
                       str(lmax) + " tokens");
  }
  const SplitKernel* k1 = find_fused_kernel(problem.qkv_dtype, s.dk, best.dvb, true);
  if (k1 == nullptr || !walk_runs_on(*k1, c) || !fits(*k1, smem_optin) ||
      (best.lead && (k1->lead_func == nullptr || k1->lead_smem > static_cast<std::size_t>(smem_optin))))
    return unsupported("compute capability 9.0, an sm_90a build with CUTLASS");
  const CpLayout layout = CpLayout::of(s.T, n, best.seg_tokens);
  if (layout.cap1 > std::int64_t(kCtaWalks) * 65535)  // stage 1's CTAs keep at most kCtaWalks walks each
    return unsupported("at most " + str(std::int64_t(kCtaWalks) * 65535) + " walks in stage 1; this split has " +
                       str(layout.cap1));
  const std::size_t bytes = cp_workspace(layout, n, s.T, static_cast<int>(s.H), s.dk, s.dv).bytes;
  if (!forced && bytes > (std::size_t(1) << 30)) return;  // not worth a gigabyte of scratch
  if (bytes > (std::size_t(16) << 30))  // e.g. a max_seq_len far below the real lengths: tiny segments
    return unsupported("at most 16 GiB of workspace; this split needs " + str(static_cast<std::int64_t>(bytes >> 20)) +
                       " MiB (segments of " + str(best.seg_tokens) + " tokens)");
  prepare_kernel(c.device, *k1);
  check(cp_prepare(c.device), "cudaFuncSetAttribute");
  c.cp_segments = best.nseg;
  c.cp_seg_tokens = best.seg_tokens;
  c.cp_stage1 = k1;
  c.cp_cutoff = cutoff;
  c.cp_pairs = best.pairs;
  c.cp_lead = best.lead;
  if (options.split_graph) c.cp_graphs = std::make_shared<LaunchGraphs>();
  c.workspace = bytes;
  c.name = std::string(k1->name);
  c.name = c.name.substr(0, c.name.size() - std::string("-walks").size()) + "-cp" + str(best.nseg);
  if (best.lead) c.name += "-lead";
  if (cutoff > 0.0f) c.name += "-decay-cut";
}

}  // namespace

Config plan(const Problem& problem, const detail::Shape& s, const Options& options) {
  if (!device_available()) fail(K::unsupported, "memory", "a usable CUDA device for Memory::cuda", "none");
  if (s.dk != 64 && s.dk != 128) fail(K::unsupported, "head_dim_k", "64 or 128 for the CUDA backend", str(s.dk));
  if (s.dv != 64 && s.dv != 128) fail(K::unsupported, "head_dim_v", "64 or 128 for the CUDA backend", str(s.dv));
  if (s.H > 65535) fail(K::unsupported, "heads", "at most 65535 output heads for the CUDA backend", str(s.H));
  check_vector_strides("q", s.q, s.T, s.Hq);
  check_vector_strides("k", s.k, s.T, s.Hk);
  check_vector_strides("v", s.v, s.T, s.Hv);
  check_vector_strides("o", s.o, s.T, s.H);

  Config c;
  const cudaError_t dev_err = cudaGetDevice(&c.device);
  if (dev_err != cudaSuccess) {
    cudaGetLastError();
    fail(K::unsupported, "memory", "a usable CUDA device for Memory::cuda",
         std::string(cudaGetErrorName(dev_err)) + " (" + cudaGetErrorString(dev_err) + ")");
  }
  const DeviceInfo dev = device_info(c.device);
  c.cc_major = dev.cc_major;
  c.cc_minor = dev.cc_minor;
  c.sm_count = dev.sm_count;
  const int smem_optin = dev.smem_optin;
  if (c.cc_major < 8)
    fail(K::unsupported, "device", "compute capability 8.0 or newer for the CUDA backend",
         str(c.cc_major) + "." + str(c.cc_minor));

  if (options.segments < 0)
    fail(K::invalid_value, "options.segments", "0 (the planner decides), 1 (never split) or k >= 2",
         str(options.segments));
  const SplitKernel* split = options.kernel != nullptr
                                 ? required_kernel(options.kernel, problem, s, c, smem_optin)
                                 : choose_kernel(problem, s, c, smem_optin);
  if (split == nullptr) {
    const SplitKernel* smallest = find_split_kernel(problem.qkv_dtype, s.dk, 1);
    fail(K::unsupported, "device",
         "at least " + str(smallest ? static_cast<std::int64_t>(smallest->walk_smem) : 0) +
             " bytes of shared memory per block for the CUDA backend",
         str(smem_optin));
  }

  // The default build has kernel images for sm_80 (runs on 8.x) and sm_90a (runs on 9.0 only). An
  // image compiled for a virtual architecture below 8.0 holds only a trap (bf16 mma.sync needs sm_80).
  const KernelInfo img = kernel_info(c.device, *split);
  if (img.ptx_version < 80)
    fail(K::unsupported, "device", "a GPU this build has sm_80+ kernels for (default build: sm_80 family, sm_90a)",
         "sm_" + str(c.cc_major) + str(c.cc_minor) +
             (img.ptx_version == 0 ? std::string(" (no kernel image loads)")
                                   : " (image for compute_" + str(img.ptx_version) + ")"));
  c.ctas_per_sm = prepare_kernel(c.device, *split).ctas_per_sm;

  c.split = split;
  c.kernel = split->name;
  c.warps = split->warps;
  c.smem_bytes = split->walk_smem;
  WalkGrid grid = walk_grid(s, 16 * c.warps, problem.has_cu_seqlens, split->fused, c.sm_count, c.ctas_per_sm);
  if (split->short_chunks) grid = {std::min<std::int64_t>(std::max<std::int64_t>(s.N, 1), 65535), false, false};  // a CTA per sequence
  c.walk_z = static_cast<int>(grid.z);
  c.longest_first = grid.longest_first;
  c.lpt = grid.lpt;
  // One record per (chunk slot, head); slot floor(bos_n / 64) + n + j is unique per chunk.
  c.slots = (s.T + kChunk - 1) / kChunk + s.N;
  c.workspace = split->fused || split->short_chunks
                    ? 0
                    : static_cast<std::size_t>(c.slots) * static_cast<std::size_t>(s.H) * kRecBytes;
  plan_split(problem, s, options, c, smem_optin);
  if (split->fused || c.cp_stage1 != nullptr) {
    // The descriptors of any call of this problem, at a placeholder address that run() replaces.
    Tensors at;
    at.q = at.k = at.v = reinterpret_cast<const void*>(std::uintptr_t{1} << 20);
    at.o = reinterpret_cast<void*>(std::uintptr_t{1} << 20);
    FusedMaps maps;
    c.has_fused_maps = encode_fused_maps(chunked_params(problem, s, at), problem.qkv_dtype, s.dk, &maps);
    std::memcpy(c.fused_maps.data(), maps.bytes, sizeof maps.bytes);
  }
  return c;
}

namespace {

static_assert(sizeof(Config::fused_maps) == sizeof(FusedMaps), "the plan holds one FusedMaps");

// The call's fused-kernel descriptors: the plan's, pointed at p's tensors (else encoded anew).
bool call_fused_maps(const Config& c, const ChunkedParams& p, DType dtype, int dk, FusedMaps* maps) {
  auto once = [&] {
    if (!c.has_fused_maps) return encode_fused_maps(p, dtype, dk, maps);
    std::memcpy(maps->bytes, c.fused_maps.data(), sizeof maps->bytes);
    return rebase_fused_maps(maps, p);
  };
  // The driver's descriptor calls want the device's context current, and the runtime makes it so
  // only at a call that needs one: cudaFree(nullptr) is such a call and does nothing else (stream
  // capture counts it as unsafe, hence the relaxed mode, capture_mode.h). Once per thread before
  // its first call, so that the driver never refuses one; again should a call still be refused
  // (the context unbound since, by cuCtxSetCurrent say).
  auto bind_context = [] {
    const RelaxedCaptureMode relaxed;
    if (cudaFree(nullptr) != cudaSuccess) cudaGetLastError();  // only the error it left
  };
  thread_local bool bound = false;
  if (!bound) {
    bind_context();
    bound = true;
  }
  if (once()) return true;
  bind_context();
  return once();
}

}  // namespace

void run(const Problem& problem, const detail::Shape& s, const Config& c, const Tensors& t, void* workspace,
         Stream stream) {
  int device = -1;
  check(cudaGetDevice(&device), "cudaGetDevice");
  if (device != c.device)
    throw Error(K::invalid_value, "device",
                "device: expected the plan's device " + str(c.device) + " to be current (cudaSetDevice(" +
                    str(c.device) + ") before run), got device " + str(device));
  if (s.T > 0) {
    check_aligned("q", t.q);
    check_aligned("k", t.k);
    check_aligned("v", t.v);
    check_aligned("o", t.o);
    // The kernels read the rest element by element: a misaligned one would fault the context.
    const char* elem = "its element type's alignment";
    if (problem.has_gate) check_aligned("g", t.g, 4, elem);
    if (problem.has_beta) check_aligned("beta", t.beta, problem.beta_dtype == DType::f32 ? 4 : 2, elem);
  }
  if (problem.has_cu_seqlens)
    check_aligned("cu_seqlens", t.cu_seqlens, problem.cu_seqlens_dtype == DType::i64 ? 8 : 4, "its element type's alignment");
  if (problem.has_initial_state) check_aligned("initial_state", t.initial_state, 4, "its element type's alignment");
  if (problem.want_final_state) check_aligned("final_state", t.final_state, 4, "its element type's alignment");
  // Nothing to compute and nothing to write.
  if (s.T == 0 && !problem.want_final_state) return;

  ChunkedParams p = chunked_params(problem, s, t);
  p.ws = static_cast<unsigned char*>(workspace);
  p.longest_first = c.longest_first;
  p.lpt = c.lpt;

  if (c.workspace > 0) check_aligned("workspace", workspace, 256, "Plan::run's contract; cudaMalloc's alignment");
  GDNKIT_HOST_STAMP(2);
  FusedMaps maps;
  const bool fused = c.cp_segments >= 2 || c.split->fused;
  if (fused && !call_fused_maps(c, p, problem.qkv_dtype, s.dk, &maps))
    throw Error(K::cuda, "launch",
                std::string("launch: ") + (c.cp_segments >= 2 ? c.name.c_str() : c.kernel) +
                    " failed: the driver refused the TMA descriptors of q, k, v or o");
  GDNKIT_HOST_STAMP(3);
  if (c.cp_segments >= 2) {
    CpLayout layout = CpLayout::of(s.T, std::max<std::int64_t>(s.N, 1), c.cp_seg_tokens);
    layout.pairs = c.cp_pairs;
    layout.lead = c.cp_lead;
    const cudaError_t err =
        launch_cp(p, layout, *c.cp_stage1, maps, c.cp_cutoff, static_cast<unsigned char*>(workspace),
                  c.cp_graphs.get(), reinterpret_cast<cudaStream_t>(stream));
    if (err != cudaSuccess) {
      cudaGetLastError();
      throw Error(K::cuda, "launch",
                  "launch: " + c.name + " failed: CUDA error " + cudaGetErrorName(err) + ": " + cudaGetErrorString(err));
    }
    return;
  }
  const dim3 grid(static_cast<unsigned>(s.dv / (16 * c.warps)), static_cast<unsigned>(s.H),
                  static_cast<unsigned>(c.walk_z));
  // No chunks, no prep (the walk still writes the final state).
  const dim3 prep_grid(s.T > 0 ? static_cast<unsigned>(c.slots) : 0u, static_cast<unsigned>(s.H));
  GDNKIT_HOST_STAMP(4);
  const cudaError_t err = fused ? launch_fused_encoded(*c.split, p, maps, grid, reinterpret_cast<cudaStream_t>(stream))
                                : c.split->launch(p, prep_grid, grid, reinterpret_cast<cudaStream_t>(stream));
  if (err != cudaSuccess) {
    cudaGetLastError();  // clear it: the error is reported by the exception
    throw Error(K::cuda, "launch",
                std::string("launch: ") + c.kernel + " failed: CUDA error " + cudaGetErrorName(err) + ": " +
                    cudaGetErrorString(err));
  }
}

void copy_to_host(void* dst, const void* src, std::size_t bytes, Stream stream) {
  // A copy to pageable memory and a wait cannot be captured: refused before they break the capture.
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  const cudaError_t query = cudaStreamIsCapturing(stream, &capture);
  if (query != cudaSuccess) cudaGetLastError();
  if (query != cudaSuccess || capture != cudaStreamCaptureStatusNone)
    throw Error(K::invalid_value, "stream",
                std::string("stream: expected one that is not being captured (Plan::validate copies values to the "
                            "host and waits for them), got ") +
                    (query != cudaSuccess ? std::string("a stream cudaStreamIsCapturing refuses: ") + cudaGetErrorName(query)
                                          : std::string("a stream being captured")));
  check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream), "cudaMemcpyAsync");
  check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
}

}  // namespace gdnkit::cuda
