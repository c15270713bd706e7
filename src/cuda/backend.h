// CUDA backend entry points, called by the planner. Everything here is host code; kernels live
// in the .cu files beside it.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "common/shape.h"

namespace gdnkit::cuda {

struct SplitKernel;   // chunked.h: one compiled instantiation (prep + walk kernels)
class LaunchGraphs;  // launch_list.h: a split's launches as CUDA graphs, per stream

// Launch configuration fixed at plan time (device properties are read here, once).
struct Config {
  int device = 0;
  int sm_count = 0;
  int cc_major = 0, cc_minor = 0;
  const char* kernel = "none";
  std::size_t workspace = 0;
  const SplitKernel* split = nullptr;      // the instantiation run() launches
  std::int64_t slots = 0;                  // chunk slots in the workspace, ceil(T / 64) + N
  int warps = 0;                           // walk warps per CTA (16 value columns each)
  int walk_z = 1;                          // walk grid z (sequences are strided over it)
  bool longest_first = false;              // walk CTAs take sequences longest first (ChunkedParams)
  bool lpt = false;                        // ... dealt to walk_z CTAs per (value block, head) (ChunkedParams)
  std::size_t smem_bytes = 0;              // dynamic shared memory per CTA
  int ctas_per_sm = 0;                     // occupancy of the chosen kernel (informational)
  // Context parallelism (cp.h): segments per sequence (0: no split), tokens per segment, and the
  // walk-list kernel of stage 1 (with the transfer maps). kernel names the split.
  int cp_segments = 0;                     // of a sequence of the mean length
  int cp_seg_tokens = 0;
  const SplitKernel* cp_stage1 = nullptr;
  float cp_cutoff = 0.0f;                  // Options::split_decay_cutoff (0: exact)
  bool cp_pairs = false;                   // stage 1 in value and map pairs (CpLayout::pairs)
  bool cp_lead = false;                    // stage 1 in lead mode (CpLayout::lead)
  // The split's graphs (Options::split_graph; nullptr: launches one by one). Copies of a plan
  // share them: the graphs are thread-safe and the copies' launches are the same.
  std::shared_ptr<LaunchGraphs> cp_graphs;
  std::string name;                        // kernel's storage when it is composed (the split)
  // The fused kernels' TMA descriptors (K, Q, V, O; chunked.h FusedMaps), encoded here for the
  // problem's shapes and strides: run() only replaces their addresses (encoding costs about a
  // microsecond each on the host). Empty when no fused kernel runs or the driver refused them.
  std::array<unsigned char, 4 * 128> fused_maps{};
  bool has_fused_maps = false;
};

// True when a usable CUDA device is present (no exception).
bool device_available() noexcept;

// Throws Error(unsupported) when the current device or the build cannot run the problem.
Config plan(const Problem& problem, const detail::Shape& shape, const Options& options);

void run(const Problem& problem, const detail::Shape& shape, const Config& config,
         const Tensors& tensors, void* workspace, Stream stream);

// Copies device memory to the host on stream and waits (used only by Plan::validate).
void copy_to_host(void* dst, const void* src, std::size_t bytes, Stream stream);

}  // namespace gdnkit::cuda
