// Launch lists and their graphs (launch_list.h).
#include "cuda/launch_list.h"

#include "cuda/capture_mode.h"
#include "cuda/pdl_launch.h"

#include <atomic>

namespace gdnkit::cuda {

namespace {
std::atomic<long long> graphs_built{0}, graph_calls{0}, direct_calls{0}, graph_nodes{0}, programmatic_edges{0};
std::atomic<const char*> first_failed_call{nullptr};
std::atomic<int> first_failed_error{cudaSuccess};

void note_failure(const char* call, cudaError_t err) {
  const char* none = nullptr;
  if (first_failed_call.compare_exchange_strong(none, call)) first_failed_error.store(err);
}
}  // namespace

KernelLaunch* LaunchList::begin_launch(const void* func, dim3 grid, dim3 block, std::size_t smem,
                                       unsigned cluster_x) {
  if (open_ || count_ == kMaxLaunches) return nullptr;
  KernelLaunch& l = launches_[count_];
  l = KernelLaunch{};
  l.func = func;
  l.grid = grid;
  l.block = block;
  l.smem = smem;
  l.cluster_x = cluster_x;
  open_ = true;
  return &l;
}

bool LaunchList::end_launch() {
  if (!open_) return false;
  open_ = false;
  ++count_;
  return true;
}

bool LaunchList::push_bytes(KernelLaunch& l, const void* src, std::size_t bytes, std::size_t align) {
  const std::size_t at = (used_ + align - 1) / align * align;
  if (l.num_args == KernelLaunch::kMaxArgs || align > alignof(std::max_align_t) * 8 || at + bytes > kArgBytes) {
    open_ = false;  // the launch is dropped
    return false;
  }
  std::memcpy(storage_ + at, src, bytes);
  l.args[l.num_args++] = storage_ + at;
  used_ = at + bytes;
  return true;
}

bool LaunchList::add_block(const void* func, dim3 grid, dim3 block, std::size_t smem, unsigned cluster_x,
                           const void* arg, std::size_t bytes, std::size_t align) {
  KernelLaunch* const l = begin_launch(func, grid, block, smem, cluster_x);
  return l != nullptr && push_bytes(*l, arg, bytes, align) && end_launch();
}

cudaError_t LaunchList::launch(cudaStream_t stream) const {
  for (int i = 0; i < count_; ++i) {
    const KernelLaunch& l = launches_[i];
    const PdlLaunch config(l.grid, l.block, l.smem, stream, /*after=*/true, l.cluster_x);
    const cudaError_t err = cudaLaunchKernelExC(&config.config, l.func, const_cast<void**>(l.args));
    if (err != cudaSuccess) return err;
  }
  return cudaSuccess;
}

LaunchGraphs::~LaunchGraphs() {
  // Errors are ignored: at exit the runtime may already be unloading.
  for (Graph& g : graphs_)
    if (g.exec != nullptr) {
      cudaGraphExecDestroy(g.exec);
      cudaGraphDestroy(g.graph);
    }
  if (capture_ != nullptr) cudaStreamDestroy(capture_);
  cudaGetLastError();
}

bool LaunchGraphs::matches(const Graph& g, const LaunchList& list, cudaStream_t stream) const {
  if (g.stream != stream || g.count != list.size()) return false;
  if (stream == cudaStreamPerThread && g.thread != std::this_thread::get_id()) return false;
  for (int i = 0; i < g.count; ++i) {
    const KernelLaunch& l = list[i];
    if (g.funcs[i] != l.func || g.clusters[i] != l.cluster_x || g.blocks[i].x != l.block.x ||
        g.blocks[i].y != l.block.y || g.blocks[i].z != l.block.z)
      return false;
  }
  return true;
}

// Captures list's launches on a private stream (the caller's may be the legacy stream, which
// cannot be captured) and instantiates them; the nodes form a chain in launch order. mutex_ held.
bool LaunchGraphs::build(Graph& g, const LaunchList& list) {
  // A capture in global mode on any thread (this one's own on another stream included) must
  // neither refuse these calls nor be broken by them.
  const RelaxedCaptureMode relaxed;
  cudaGraph_t graph = nullptr;
  auto fail = [&](const char* call, cudaError_t err) {
    note_failure(call, err);
    if (graph != nullptr) cudaGraphDestroy(graph);
    cudaGetLastError();  // a refusal here is not the caller's error: the call launches one by one
    return false;
  };
  cudaError_t err = cudaSuccess;
  if (capture_ == nullptr && (err = cudaStreamCreateWithFlags(&capture_, cudaStreamNonBlocking)) != cudaSuccess) {
    capture_ = nullptr;
    return fail("cudaStreamCreateWithFlags", err);
  }
  // Thread-local: other threads' calls (an allocation, say) do not break this capture, nor does it
  // break theirs.
  if ((err = cudaStreamBeginCapture(capture_, cudaStreamCaptureModeThreadLocal)) != cudaSuccess)
    return fail("cudaStreamBeginCapture", err);
  const cudaError_t launch_err = list.launch(capture_);
  err = cudaStreamEndCapture(capture_, &graph);
  if (launch_err != cudaSuccess) return fail("cudaLaunchKernelExC (under capture)", launch_err);
  if (err != cudaSuccess) return fail("cudaStreamEndCapture", err);

  std::size_t n = 0;
  if ((err = cudaGraphGetNodes(graph, nullptr, &n)) != cudaSuccess) return fail("cudaGraphGetNodes", err);
  if (n != static_cast<std::size_t>(list.size())) return fail("cudaGraphGetNodes (a node per launch)", cudaErrorUnknown);
  cudaGraphNode_t node = nullptr;
  std::size_t roots = 1;
  long long edges = 0;  // programmatic ones (the launches' attribute, kept by the capture)
  if ((err = cudaGraphGetRootNodes(graph, &node, &roots)) != cudaSuccess || roots != 1)
    return fail("cudaGraphGetRootNodes (one root)", err != cudaSuccess ? err : cudaErrorUnknown);
  for (int i = 0; i < list.size(); ++i) {
    cudaKernelNodeParams kp{};
    if ((err = cudaGraphKernelNodeGetParams(node, &kp)) != cudaSuccess) return fail("cudaGraphKernelNodeGetParams", err);
    g.nodes[i] = node;
    g.node_funcs[i] = kp.func;
    std::size_t next_n = 1;
    cudaGraphNode_t next = nullptr;
    cudaGraphEdgeData edge{};
#if CUDART_VERSION >= 13000
    err = cudaGraphNodeGetDependentNodes(node, &next, &edge, &next_n);
#else
    err = cudaGraphNodeGetDependentNodes_v2(node, &next, &edge, &next_n);
#endif
    if (err != cudaSuccess) return fail("cudaGraphNodeGetDependentNodes", err);
    if (next_n != (i + 1 < list.size() ? 1u : 0u)) return fail("cudaGraphNodeGetDependentNodes (a chain)", cudaErrorUnknown);
    edges += next_n == 1 && edge.type == cudaGraphDependencyTypeProgrammatic;
    node = next;
  }
  cudaGraphExec_t exec = nullptr;
  if ((err = cudaGraphInstantiate(&exec, graph, 0)) != cudaSuccess) return fail("cudaGraphInstantiate", err);
  g.graph = graph;  // kept: the exec's nodes are named by the graph's (cudaGraphExecKernelNodeSetParams)
  g.exec = exec;
  graphs_built.fetch_add(1, std::memory_order_relaxed);
  graph_nodes.fetch_add(list.size(), std::memory_order_relaxed);
  programmatic_edges.fetch_add(edges, std::memory_order_relaxed);
  return true;
}

LaunchGraphs::Graph* LaunchGraphs::find_or_build(const LaunchList& list, cudaStream_t stream) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (Graph& g : graphs_)
    if (matches(g, list, stream)) {
      // Built at the second call (a refusal may pass: a few more tries).
      if (g.exec == nullptr && g.tries < kMaxTries) {
        ++g.tries;
        build(g, list);
      }
      return g.exec != nullptr ? &g : nullptr;  // built under mutex_, never changed after
    }
  if (graphs_.size() >= kMaxGraphs) return nullptr;
  // The first call of a shape on a stream launches one by one: a plan that runs once (a new
  // problem size each call, say) never pays the capture (~15-20 us of host time).
  Graph& g = graphs_.emplace_back();
  g.stream = stream;
  g.thread = std::this_thread::get_id();
  g.count = list.size();
  for (int i = 0; i < g.count; ++i) {
    g.funcs[i] = list[i].func;
    g.blocks[i] = list[i].block;
    g.clusters[i] = list[i].cluster_x;
  }
  return nullptr;
}

cudaError_t LaunchGraphs::launch(const LaunchList& list, cudaStream_t stream) {
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &capture) != cudaSuccess) {
    cudaGetLastError();
    capture = cudaStreamCaptureStatusInvalidated;  // let the launches report what is wrong
  }
  Graph* const g = capture == cudaStreamCaptureStatusNone && list.size() > 0 ? find_or_build(list, stream) : nullptr;
  if (g == nullptr) {
    direct_calls.fetch_add(1, std::memory_order_relaxed);
    return list.launch(stream);
  }
  std::lock_guard<std::mutex> lock(g->mutex);  // graph objects are not thread-safe
  for (int i = 0; i < g->count; ++i) {
    const KernelLaunch& l = list[i];
    cudaKernelNodeParams kp{};
    kp.func = const_cast<void*>(g->node_funcs[i]);
    kp.gridDim = l.grid;
    kp.blockDim = l.block;
    kp.sharedMemBytes = static_cast<unsigned>(l.smem);
    kp.kernelParams = const_cast<void**>(l.args);
    const cudaError_t err = cudaGraphExecKernelNodeSetParams(g->exec, g->nodes[i], &kp);
    if (err != cudaSuccess) {  // nothing launched yet: one by one, where the error, if real, recurs
      note_failure("cudaGraphExecKernelNodeSetParams", err);
      cudaGetLastError();
      direct_calls.fetch_add(1, std::memory_order_relaxed);
      return list.launch(stream);
    }
  }
  graph_calls.fetch_add(1, std::memory_order_relaxed);
  return cudaGraphLaunch(g->exec, stream);
}

LaunchGraphStats launch_graph_stats() {
  LaunchGraphStats s;
  s.graphs = graphs_built.load(std::memory_order_relaxed);
  s.graph_launches = graph_calls.load(std::memory_order_relaxed);
  s.direct_launches = direct_calls.load(std::memory_order_relaxed);
  s.nodes = graph_nodes.load(std::memory_order_relaxed);
  s.programmatic_edges = programmatic_edges.load(std::memory_order_relaxed);
  s.failed_call = first_failed_call.load();
  s.failed_error = static_cast<cudaError_t>(first_failed_error.load());
  return s;
}

}  // namespace gdnkit::cuda
