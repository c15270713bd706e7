// The host cost of one kernel launch, by the way it is made: the runtime's <<<>>> and
// cudaLaunchKernelEx (with and without the programmatic-dependent and cluster attributes, with
// small and with fused-kernel-sized parameters) against the driver's cuLaunchKernelEx on the
// function handle the runtime gives, and the descriptor rebase a fused call makes
// (cuTensorMapReplaceAddress x 4); and a split's three launches one by one against one CUDA graph
// captured from them (launched as is, or with its nodes' parameters set first). Empty kernels; each
// call timed alone on the host (median of rounds of 200 calls, a stream sync between rounds so the
// queue never fills; and with a sync after every call), on a created stream or the legacy one.
//
//   launch_probe [--rounds N] [--stream nonblocking|blocking|legacy]
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace {

struct Small {
  const void* a;
  int n;
};
struct Large {  // about the fused kernel's: its ChunkedParams and four 128-byte TMA descriptors
  unsigned char bytes[832];
};

__global__ void empty_small(Small) {}
__global__ void empty_large(Large) {}
__global__ void spin(long long cycles) {
  const long long t0 = clock64();
  while (clock64() - t0 < cycles) {
  }
}

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}
void check(CUresult e, const char* what) {
  if (e != CUDA_SUCCESS) {
    std::fprintf(stderr, "%s: CUresult %d\n", what, static_cast<int>(e));
    std::exit(1);
  }
}

template <typename F>
F entry(const char* name) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult q{};
  check(cudaGetDriverEntryPointByVersion(name, &fn, 12000, cudaEnableDefault, &q), name);
  if (fn == nullptr) {
    std::fprintf(stderr, "no driver entry %s\n", name);
    std::exit(1);
  }
  return reinterpret_cast<F>(fn);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

// Median microseconds of one call of f, over rounds of 200 calls; busy: each round queued behind
// a kernel that spins ~2 ms (as a serving engine's launches queue behind its running kernels).
// busy: a 2 ms kernel ahead of each round of 200 calls; synced: the stream waited for after every
// call (each call finds the GPU idle, as in a probe that synchronises per call).
double time_calls(cudaStream_t s, int rounds, bool busy, const std::function<void()>& f, bool synced = false) {
  std::vector<double> t;
  for (int w = 0; w < 50; ++w) f();
  check(cudaStreamSynchronize(s), "sync");
  for (int r = 0; r < rounds; ++r) {
    if (busy) spin<<<1, 32, 0, s>>>(4000000);
    for (int i = 0; i < 200; ++i) {
      const auto a = std::chrono::steady_clock::now();
      f();
      t.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - a).count());
      if (synced) check(cudaStreamSynchronize(s), "sync");
    }
    check(cudaStreamSynchronize(s), "sync");
  }
  return median(t);
}

}  // namespace

int main(int argc, char** argv) {
  int rounds = 20;
  const char* kind = "nonblocking";
  for (int i = 1; i < argc; ++i)
    if (!std::strcmp(argv[i], "--rounds") && i + 1 < argc) rounds = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--stream") && i + 1 < argc) kind = argv[++i];
  check(cudaSetDevice(0), "cudaSetDevice");
  // The stream every row launches on: a created one (non-blocking or blocking), or the legacy
  // default stream (torch's default).
  cudaStream_t s = nullptr;
  if (!std::strcmp(kind, "nonblocking")) check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "stream");
  else if (!std::strcmp(kind, "blocking")) check(cudaStreamCreate(&s), "stream");
  else if (std::strcmp(kind, "legacy") != 0) {
    std::fprintf(stderr, "launch_probe: --stream expects nonblocking, blocking or legacy, got '%s'\n", kind);
    return 2;
  }
  std::printf("stream: %s\n", kind);
  void* buf = nullptr;
  check(cudaMalloc(&buf, 1 << 20), "malloc");

  using LaunchEx = CUresult (*)(const CUlaunchConfig*, CUfunction, void**, void**);
  using Replace = CUresult (*)(CUtensorMap*, void*);
  using Encode = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*, const cuuint64_t*,
                              const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave, CUtensorMapSwizzle,
                              CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
  const auto launch_ex = entry<LaunchEx>("cuLaunchKernelEx");
  const auto replace = entry<Replace>("cuTensorMapReplaceAddress");
  const auto encode = entry<Encode>("cuTensorMapEncodeTiled");

  cudaFunction_t fs = nullptr, fl = nullptr;
  check(cudaGetFuncBySymbol(&fs, reinterpret_cast<const void*>(empty_small)), "cudaGetFuncBySymbol");
  check(cudaGetFuncBySymbol(&fl, reinterpret_cast<const void*>(empty_large)), "cudaGetFuncBySymbol");

  Small sm{buf, 1};
  Large lg{};
  std::memset(lg.bytes, 1, sizeof lg.bytes);

  constexpr int kBigSmem = 200 * 1024;  // about the fused kernel's
  check(cudaFuncSetAttribute(empty_large, cudaFuncAttributeMaxDynamicSharedMemorySize, kBigSmem), "smem opt-in");
  auto rt = [&](auto kernel, auto arg, bool pdl, unsigned cluster, int smem = 0) {
    cudaLaunchAttribute at[2]{};
    cudaLaunchConfig_t c{};
    c.gridDim = dim3(2, 8, 1), c.blockDim = dim3(128), c.dynamicSmemBytes = smem, c.stream = s, c.attrs = at;
    if (pdl) at[c.numAttrs].id = cudaLaunchAttributeProgrammaticStreamSerialization,
             at[c.numAttrs++].val.programmaticStreamSerializationAllowed = 1;
    if (cluster > 1) at[c.numAttrs].id = cudaLaunchAttributeClusterDimension,
                     at[c.numAttrs++].val.clusterDim = {cluster, 1, 1};
    check(cudaLaunchKernelEx(&c, kernel, arg), "cudaLaunchKernelEx");
  };
  auto drv = [&](CUfunction f, void* arg, bool pdl, unsigned cluster) {
    CUlaunchAttribute at[2]{};
    CUlaunchConfig c{};
    c.gridDimX = 2, c.gridDimY = 8, c.gridDimZ = 1, c.blockDimX = 128, c.blockDimY = 1, c.blockDimZ = 1;
    c.sharedMemBytes = 0, c.hStream = reinterpret_cast<CUstream>(s), c.attrs = at;
    if (pdl) at[c.numAttrs].id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION,
             at[c.numAttrs++].value.programmaticStreamSerializationAllowed = 1;
    if (cluster > 1) at[c.numAttrs].id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION,
                     at[c.numAttrs].value.clusterDim.x = cluster, at[c.numAttrs].value.clusterDim.y = 1,
                     at[c.numAttrs++].value.clusterDim.z = 1;
    void* args[] = {arg};
    check(launch_ex(&c, f, args, nullptr), "cuLaunchKernelEx");
  };

  struct Row {
    const char* name;
    std::function<void()> f;
  };
  std::vector<Row> rows = {
      {"runtime <<<>>> small", [&] { empty_small<<<dim3(2, 8), 128, 0, s>>>(sm); }},
      {"runtime Ex small", [&] { rt(empty_small, sm, false, 1); }},
      {"runtime Ex small pdl", [&] { rt(empty_small, sm, true, 1); }},
      {"runtime Ex small pdl cluster2", [&] { rt(empty_small, sm, true, 2); }},
      {"runtime Ex large pdl", [&] { rt(empty_large, lg, true, 1); }},
      {"runtime Ex large pdl cluster2", [&] { rt(empty_large, lg, true, 2); }},
      {"runtime Ex large pdl cluster2 200KB", [&] { rt(empty_large, lg, true, 2, kBigSmem); }},
      {"driver Ex small", [&] { drv(reinterpret_cast<CUfunction>(fs), &sm, false, 1); }},
      {"driver Ex small pdl", [&] { drv(reinterpret_cast<CUfunction>(fs), &sm, true, 1); }},
      {"driver Ex small pdl cluster2", [&] { drv(reinterpret_cast<CUfunction>(fs), &sm, true, 2); }},
      {"driver Ex large pdl", [&] { drv(reinterpret_cast<CUfunction>(fl), &lg, true, 1); }},
      {"driver Ex large pdl cluster2", [&] { drv(reinterpret_cast<CUfunction>(fl), &lg, true, 2); }},
      {"cudaGetDevice", [&] { int d; check(cudaGetDevice(&d), "cudaGetDevice"); }},
      {"cudaGetFuncBySymbol", [&] {
         cudaFunction_t f;
         check(cudaGetFuncBySymbol(&f, reinterpret_cast<const void*>(empty_small)), "cudaGetFuncBySymbol");
       }},
  };
  // A split's three launches (stage 1, the scan, the correction) made one by one, and as one CUDA
  // graph captured from them: launched as it is, and with its three nodes' parameters set anew
  // first (what a call with new tensors would have to do).
  auto three = [&] {
    rt(empty_large, lg, true, 2, kBigSmem);
    rt(empty_small, sm, true, 1);
    rt(empty_small, sm, true, 1);
  };
  rows.push_back({"3 launches runtime Ex pdl (a split's)", three});
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  // Captured on a stream of its own (the legacy stream cannot be captured), launched on s.
  cudaStream_t cap = nullptr;
  check(cudaStreamCreateWithFlags(&cap, cudaStreamNonBlocking), "stream");
  std::swap(s, cap);
  check(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
  three();
  check(cudaStreamEndCapture(s, &graph), "cudaStreamEndCapture");
  std::swap(s, cap);
  check(cudaGraphInstantiate(&exec, graph, 0), "cudaGraphInstantiate");
  std::size_t n_nodes = 0;
  check(cudaGraphGetNodes(graph, nullptr, &n_nodes), "cudaGraphGetNodes");
  std::vector<cudaGraphNode_t> nodes(n_nodes);
  check(cudaGraphGetNodes(graph, nodes.data(), &n_nodes), "cudaGraphGetNodes");
  std::vector<cudaKernelNodeParams> node_params(n_nodes);
  void* small_args[] = {&sm};
  void* large_args[] = {&lg};
  for (std::size_t i = 0; i < n_nodes; ++i) {
    check(cudaGraphKernelNodeGetParams(nodes[i], &node_params[i]), "cudaGraphKernelNodeGetParams");
    node_params[i].kernelParams =
        node_params[i].func == reinterpret_cast<void*>(empty_large) ? large_args : small_args;
    node_params[i].extra = nullptr;
  }
  std::printf("graph of %zu nodes\n", n_nodes);
  rows.push_back({"graph of the 3: launch", [&] { check(cudaGraphLaunch(exec, s), "cudaGraphLaunch"); }});
  rows.push_back({"graph of the 3: set params, launch", [&] {
                    for (std::size_t i = 0; i < n_nodes; ++i)
                      check(cudaGraphExecKernelNodeSetParams(exec, nodes[i], &node_params[i]),
                            "cudaGraphExecKernelNodeSetParams");
                    check(cudaGraphLaunch(exec, s), "cudaGraphLaunch");
                  }});
  // Four descriptors rebased, as a fused call does.
  CUtensorMap maps[4];
  {
    const cuuint64_t dims[3] = {128, 8, 4096}, strides[2] = {256, 256 * 8};
    const cuuint32_t box[3] = {64, 1, 64}, es[3] = {1, 1, 1};
    for (auto& m : maps)
      check(encode(&m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, buf, dims, strides, box, es, CU_TENSOR_MAP_INTERLEAVE_NONE,
                   CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE),
            "cuTensorMapEncodeTiled");
  }
  rows.push_back({"cuTensorMapReplaceAddress x4", [&] {
                    for (auto& m : maps) check(replace(&m, buf), "cuTensorMapReplaceAddress");
                  }});

  std::printf("%-38s %10s %10s %10s\n", "call", "idle_us", "busy_us", "synced_us");
  auto print = [&](const Row& r) {
    std::printf("%-38s %10.3f %10.3f %10.3f\n", r.name, time_calls(s, rounds, false, r.f),
                time_calls(s, rounds, true, r.f), time_calls(s, std::max(rounds / 4, 1), false, r.f, true));
  };
  for (const Row& r : rows) print(r);
  // Again in reverse order: the first rows' numbers are not an artefact of their place.
  std::printf("(reverse order)\n");
  for (auto it = rows.rbegin(); it != rows.rend(); ++it) print(*it);
  check(cudaStreamSynchronize(s), "sync");
  return 0;
}
