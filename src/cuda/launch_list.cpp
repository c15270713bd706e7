// Launch lists and their graphs (launch_list.h).
#include "cuda/launch_list.h"

#include "cuda/capture_mode.h"
#include "cuda/pdl_launch.h"

#include <atomic>
#include <new>

namespace gdnkit::cuda {

namespace {
std::atomic<long long> graphs_built{0}, graph_calls{0}, direct_calls{0}, graph_nodes{0}, programmatic_edges{0},
    evictions{0}, failures{0}, nodes_set{0};
std::mutex first_failure_mutex;
const char* first_failed_call = nullptr;
cudaError_t first_failed_error = cudaSuccess;

void note_failure(const char* call, cudaError_t err) {
  failures.fetch_add(1, std::memory_order_relaxed);
  std::lock_guard<std::mutex> lock(first_failure_mutex);
  if (first_failed_call == nullptr) {
    first_failed_call = call;
    first_failed_error = err;
  }
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
  l.arg_bytes[l.num_args] = static_cast<unsigned>(bytes);
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

bool LaunchGraphs::NodeParams::same(const KernelLaunch& l) const {
  if (!known || smem != l.smem || grid.x != l.grid.x || grid.y != l.grid.y || grid.z != l.grid.z) return false;
  std::size_t at = 0;
  for (int a = 0; a < l.num_args; ++a) {
    if (at + l.arg_bytes[a] > args.size() || std::memcmp(args.data() + at, l.args[a], l.arg_bytes[a]) != 0)
      return false;
    at += l.arg_bytes[a];
  }
  return at == args.size();
}

void LaunchGraphs::NodeParams::remember(const KernelLaunch& l) {
  std::size_t bytes = 0;
  for (int a = 0; a < l.num_args; ++a) bytes += l.arg_bytes[a];
  args.resize(bytes);
  std::size_t at = 0;
  for (int a = 0; a < l.num_args; ++a) {
    std::memcpy(args.data() + at, l.args[a], l.arg_bytes[a]);
    at += l.arg_bytes[a];
  }
  grid = l.grid;
  smem = l.smem;
  known = true;
}

void LaunchGraphs::Graph::release() {
  bool failed = false;
  if (exec != nullptr) failed |= cudaGraphExecDestroy(exec) != cudaSuccess;  // in-flight launches finish first
  if (graph != nullptr) failed |= cudaGraphDestroy(graph) != cudaSuccess;
  if (failed) cudaGetLastError();  // only the error these calls left
  exec = nullptr;
  graph = nullptr;
  for (NodeParams& p : last) p.known = false;
  key.clear();
}

LaunchGraphs::~LaunchGraphs() {
  // Errors are ignored: at exit the runtime may already be unloading.
  for (Graph& g : graphs_) g.release();
  if (capture_ != nullptr && cudaStreamDestroy(capture_) != cudaSuccess) cudaGetLastError();
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
// cannot be captured), instantiates them and uploads the result (so that no launch of it
// allocates); the nodes form a chain in launch order. g.mutex held (not mutex_).
bool LaunchGraphs::build(Graph& g, const LaunchList& list) {
  // The host memory a built graph keeps (its nodes' parameters as captured, the call's key), taken
  // first: a build short of it makes nothing and throws nothing (the call launches one by one).
  try {
    for (int i = 0; i < list.size(); ++i) g.last[i].remember(list[i]);
    g.key.assign(list.key(), list.key() + list.key_bytes());
  } catch (const std::bad_alloc&) {
    g.release();
    note_failure("host memory for a graph's node parameters", cudaErrorMemoryAllocation);
    return false;
  }
  std::lock_guard<std::mutex> capture_lock(capture_mutex_);
  // A capture in global mode on any thread (this one's own on another stream included) must
  // neither refuse these calls nor be broken by them.
  const RelaxedCaptureMode relaxed;
  cudaGraph_t graph = nullptr;
  auto fail = [&](const char* call, cudaError_t err) {
    note_failure(call, err);
    if (graph != nullptr) cudaGraphDestroy(graph);
    for (NodeParams& p : g.last) p.known = false;  // no graph holds them
    g.key.clear();
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

  // The nodes, walked from the one root along the one dependent of each (counts asked first: a
  // query with room for one would truncate a larger count to one).
  std::size_t n = 0, roots = 0;
  if ((err = cudaGraphGetNodes(graph, nullptr, &n)) != cudaSuccess) return fail("cudaGraphGetNodes", err);
  if (n != static_cast<std::size_t>(list.size())) return fail("cudaGraphGetNodes (a node per launch)", cudaErrorUnknown);
  if ((err = cudaGraphGetRootNodes(graph, nullptr, &roots)) != cudaSuccess || roots != 1)
    return fail("cudaGraphGetRootNodes (one root)", err != cudaSuccess ? err : cudaErrorUnknown);
  cudaGraphNode_t node = nullptr;
  if ((err = cudaGraphGetRootNodes(graph, &node, &roots)) != cudaSuccess) return fail("cudaGraphGetRootNodes", err);
  long long edges = 0;  // programmatic ones (the launches' attribute, kept by the capture)
  for (int i = 0; i < list.size(); ++i) {
    cudaKernelNodeParams kp{};
    if ((err = cudaGraphKernelNodeGetParams(node, &kp)) != cudaSuccess) return fail("cudaGraphKernelNodeGetParams", err);
    g.nodes[i] = node;
    g.node_funcs[i] = kp.func;
    std::size_t next_n = 0;
#if CUDART_VERSION >= 13000
    err = cudaGraphNodeGetDependentNodes(node, nullptr, nullptr, &next_n);
#else
    err = cudaGraphNodeGetDependentNodes_v2(node, nullptr, nullptr, &next_n);
#endif
    if (err != cudaSuccess) return fail("cudaGraphNodeGetDependentNodes", err);
    if (next_n != (i + 1 < list.size() ? 1u : 0u)) return fail("cudaGraphNodeGetDependentNodes (a chain)", cudaErrorUnknown);
    if (next_n == 0) break;
    cudaGraphNode_t next = nullptr;
    cudaGraphEdgeData edge{};
#if CUDART_VERSION >= 13000
    err = cudaGraphNodeGetDependentNodes(node, &next, &edge, &next_n);
#else
    err = cudaGraphNodeGetDependentNodes_v2(node, &next, &edge, &next_n);
#endif
    if (err != cudaSuccess) return fail("cudaGraphNodeGetDependentNodes", err);
    edges += edge.type == cudaGraphDependencyTypeProgrammatic;
    node = next;
  }
  cudaGraphExec_t exec = nullptr;
  if ((err = cudaGraphInstantiate(&exec, graph, 0)) != cudaSuccess) return fail("cudaGraphInstantiate", err);
  if ((err = cudaGraphUpload(exec, capture_)) != cudaSuccess) {
    cudaGraphExecDestroy(exec);
    return fail("cudaGraphUpload", err);
  }
  g.graph = graph;  // kept: the exec's nodes are named by the graph's (cudaGraphExecKernelNodeSetParams)
  g.exec = exec;    // (its nodes' parameters and key: remembered above, as captured)
  graphs_built.fetch_add(1, std::memory_order_relaxed);
  graph_nodes.fetch_add(list.size(), std::memory_order_relaxed);
  programmatic_edges.fetch_add(edges, std::memory_order_relaxed);
  return true;
}

LaunchGraphs::Graph* LaunchGraphs::find_or_build(const LaunchList& list, cudaStream_t stream) {
  std::unique_lock<std::mutex> lock(mutex_);
  ++clock_;
  for (Graph& g : graphs_)
    if (matches(g, list, stream)) {
      g.last_use = clock_;
      if (g.built) return &g;  // launch() checks again under g.mutex
      // Built at the second call (a refusal may pass: a few more tries), without mutex_: calls on
      // other streams go on meanwhile (~15-20 us a capture), and a call that finds this one being
      // built launches one by one rather than wait.
      if (g.building || g.tries >= kMaxTries) return nullptr;
      ++g.tries;
      g.building = true;  // not taken over meanwhile (below)
      lock.unlock();
      bool ok = false;
      try {
        std::lock_guard<std::mutex> graph_lock(g.mutex);
        ok = build(g, list);  // false where the runtime refuses or host memory is short
      } catch (...) {
        lock.lock();
        g.building = false;  // taken over or built again later
        throw;
      }
      lock.lock();
      g.building = false;
      g.built = ok;
      return ok ? &g : nullptr;
    }
  // A new (stream, shape): a new entry, or, once there are kMaxGraphs, the least recently used
  // one that no call is building taken over (streams destroyed, threads gone, shapes no longer
  // called). Its graph is destroyed under its lock: a launch that found it before waits, then sees
  // it no longer matches.
  Graph* g = nullptr;
  if (graphs_.size() < kMaxGraphs) {
    g = &graphs_.emplace_back();
  } else {
    for (Graph& e : graphs_)
      if (!e.building && (g == nullptr || e.last_use < g->last_use)) g = &e;
    if (g == nullptr) return nullptr;  // every entry being built: this call launches one by one
    evictions.fetch_add(1, std::memory_order_relaxed);
  }
  std::lock_guard<std::mutex> graph_lock(g->mutex);
  g->release();
  g->built = false;
  // The first call of a shape on a stream launches one by one: a plan that runs once (a new
  // problem size each call, say) never pays the capture (~15-20 us of host time).
  g->stream = stream;
  g->thread = std::this_thread::get_id();
  g->count = list.size();
  for (int i = 0; i < g->count; ++i) {
    g->funcs[i] = list[i].func;
    g->blocks[i] = list[i].block;
    g->clusters[i] = list[i].cluster_x;
  }
  g->tries = 0;
  g->last_use = clock_;
  return nullptr;
}

cudaError_t LaunchGraphs::launch(const LaunchList& list, cudaStream_t stream) {
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  const cudaError_t query = cudaStreamIsCapturing(stream, &capture);
  if (query != cudaSuccess) {
    // E.g. the legacy stream while another stream that synchronises with it is captured: any
    // launch there would break that capture. The caller reports the error.
    cudaGetLastError();
    return query;
  }
  Graph* const g = capture == cudaStreamCaptureStatusNone && list.size() > 0 ? find_or_build(list, stream) : nullptr;
  if (g != nullptr) {
    // Setting the nodes and launching in relaxed mode as well: a global-mode capture elsewhere
    // neither refuses nor is broken by them.
    const RelaxedCaptureMode relaxed;
    std::lock_guard<std::mutex> lock(g->mutex);  // graph objects are not thread-safe
    if (g->exec != nullptr && matches(*g, list, stream)) {  // not taken over since find_or_build
      cudaError_t err = cudaSuccess;
      int set = 0;
      // The call that set every node had the same key: its arguments are this call's.
      const bool same_key = list.key_bytes() > 0 && g->key.size() == list.key_bytes() &&
                            std::memcmp(g->key.data(), list.key(), list.key_bytes()) == 0;
      for (int i = 0; i < g->count && err == cudaSuccess && !same_key; ++i) {
        const KernelLaunch& l = list[i];
        if (g->last[i].same(l)) continue;  // the exec keeps what was set last
        cudaKernelNodeParams kp{};
        kp.func = const_cast<void*>(g->node_funcs[i]);
        kp.gridDim = l.grid;
        kp.blockDim = l.block;
        kp.sharedMemBytes = static_cast<unsigned>(l.smem);
        kp.kernelParams = const_cast<void**>(l.args);
        err = cudaGraphExecKernelNodeSetParams(g->exec, g->nodes[i], &kp);
        if (err == cudaSuccess) g->last[i].remember(l);
        else g->last[i].known = false;  // what the node holds now is not known
        ++set;
      }
      nodes_set.fetch_add(set, std::memory_order_relaxed);
      if (err == cudaSuccess) g->key.assign(list.key(), list.key() + list.key_bytes());  // every node as this call's
      else g->key.clear();
      if (err == cudaSuccess) {
        graph_calls.fetch_add(1, std::memory_order_relaxed);
        return cudaGraphLaunch(g->exec, stream);
      }
      // Nothing launched yet: one by one, where the error, if real, recurs.
      note_failure("cudaGraphExecKernelNodeSetParams", err);
      cudaGetLastError();
    }
  }
  direct_calls.fetch_add(1, std::memory_order_relaxed);
  return list.launch(stream);
}

LaunchGraphStats launch_graph_stats() {
  LaunchGraphStats s;
  s.graphs = graphs_built.load(std::memory_order_relaxed);
  s.graph_launches = graph_calls.load(std::memory_order_relaxed);
  s.direct_launches = direct_calls.load(std::memory_order_relaxed);
  s.nodes = graph_nodes.load(std::memory_order_relaxed);
  s.programmatic_edges = programmatic_edges.load(std::memory_order_relaxed);
  s.evictions = evictions.load(std::memory_order_relaxed);
  s.nodes_set = nodes_set.load(std::memory_order_relaxed);
  s.failures = failures.load(std::memory_order_relaxed);
  std::lock_guard<std::mutex> lock(first_failure_mutex);
  s.failed_call = first_failed_call;
  s.failed_error = first_failed_error;
  return s;
}

}  // namespace gdnkit::cuda
