// A call's kernel launches collected before any is made, so that they can be made one by one
// (LaunchList::launch) or as one CUDA graph whose nodes only take new parameters per call
// (LaunchGraphs): a split's three to five launches cost ~3 us of host time each, the graph ~4 us
// in all (docs/perf-notes.md, "A split launched as one CUDA graph").
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>
#include <type_traits>
#include <vector>

namespace gdnkit::cuda {

// One kernel launch: every launch of a list is a programmatic dependent launch (pdl_launch.h)
// after the work ahead of it on the stream, in clusters of cluster_x CTAs along x when above 1.
struct KernelLaunch {
  static constexpr int kMaxArgs = 8;
  const void* func = nullptr;
  dim3 grid, block;
  std::size_t smem = 0;
  unsigned cluster_x = 1;
  int num_args = 0;
  void* args[kMaxArgs] = {};             // each points at its value in the list's storage
  unsigned arg_bytes[kMaxArgs] = {};     // and its size
};

class LaunchList {
 public:
  static constexpr int kMaxLaunches = 5;  // the builder, the stop points, stage 1, the scan, the correction
  static constexpr std::size_t kArgBytes = 4096;

  LaunchList() = default;
  LaunchList(const LaunchList&) = delete;  // the launches point into storage_
  LaunchList& operator=(const LaunchList&) = delete;

  // Appends a launch of kernel with args converted to its parameter types (copied). False when
  // the list or its storage is full.
  template <typename... Params, typename... Args>
  bool add(void (*kernel)(Params...), dim3 grid, dim3 block, std::size_t smem, Args... args) {
    static_assert(sizeof...(Params) == sizeof...(Args), "one argument per parameter");
    static_assert(sizeof...(Params) <= KernelLaunch::kMaxArgs, "KernelLaunch::kMaxArgs");
    KernelLaunch* const l = begin_launch(reinterpret_cast<const void*>(kernel), grid, block, smem, 1);
    if (l == nullptr) return false;
    bool ok = true;
    ((ok = ok && push<std::decay_t<Params>>(*l, static_cast<std::decay_t<Params>>(args))), ...);
    return ok && end_launch();
  }
  // Appends a launch of func, a kernel of one parameter: `bytes` bytes at arg, copied.
  bool add_block(const void* func, dim3 grid, dim3 block, std::size_t smem, unsigned cluster_x, const void* arg,
                 std::size_t bytes, std::size_t align);

  // What the caller says determines every launch's arguments (for a split: the tensors' and the
  // workspace's addresses; the plan fixes the rest). A graph that last launched with the same key
  // launches again without setting any node (LaunchGraphs). At most kKeyBytes; false if longer.
  static constexpr std::size_t kKeyBytes = 128;
  bool set_key(const void* key, std::size_t bytes) {
    if (bytes > kKeyBytes) return false;
    std::memcpy(key_, key, bytes);
    key_bytes_ = bytes;
    return true;
  }
  const unsigned char* key() const { return key_; }
  std::size_t key_bytes() const { return key_bytes_; }

  int size() const { return count_; }
  const KernelLaunch& operator[](int i) const { return launches_[i]; }

  // Makes the launches on stream one by one; the first error stops it (launches before it stand).
  cudaError_t launch(cudaStream_t stream) const;

 private:
  KernelLaunch* begin_launch(const void* func, dim3 grid, dim3 block, std::size_t smem, unsigned cluster_x);
  bool end_launch();
  template <typename T>
  bool push(KernelLaunch& l, const T& value) {
    static_assert(std::is_trivially_copyable_v<T>, "kernel arguments are copied as bytes");
    return push_bytes(l, &value, sizeof(T), alignof(T));
  }
  bool push_bytes(KernelLaunch& l, const void* src, std::size_t bytes, std::size_t align);

  alignas(128) unsigned char storage_[kArgBytes];
  std::size_t used_ = 0;
  KernelLaunch launches_[kMaxLaunches];
  int count_ = 0;
  bool open_ = false;  // a launch begun and not yet ended
  unsigned char key_[kKeyBytes] = {};
  std::size_t key_bytes_ = 0;  // 0: no key
};

// CUDA graphs of one plan's launch lists: one graph per (stream, list shape), captured at the
// shape's second call on that stream (the first launches one by one); each later call sets the
// nodes' grids, shared memory and arguments (cudaGraphExecKernelNodeSetParams) and launches it.
// A node is not set again where its launch is byte for byte the one it holds, nor is any where the
// list's key (LaunchList::set_key) is the one of the call that set them all: a caller whose
// buffers stay where they are launches the graph as it is.
// One graph per stream, because a graph's launches are ordered behind its earlier ones: concurrent
// streams stay concurrent (so cudaStreamPerThread, one handle for a stream per thread, gets a graph
// per thread). At most kMaxGraphs (stream, shape) pairs are kept; a new one takes over the least
// recently used that no call is building (every one being built: the call launches one by one).
// Thread-safe. A stream that is capturing gets the launches one by one (they join
// the caller's graph), as do every call after a graph of its shape could not be built kMaxTries
// times and a call whose arguments the graph refuses (launch_graph_stats counts the refusals and
// keeps the first). The calls that build, set and launch a graph run in relaxed capture mode
// (capture_mode.h).
class LaunchGraphs {
 public:
  static constexpr int kMaxGraphs = 64;
  static constexpr int kMaxTries = 3;  // builds of one graph before its calls stay one by one

  LaunchGraphs() = default;
  LaunchGraphs(const LaunchGraphs&) = delete;
  LaunchGraphs& operator=(const LaunchGraphs&) = delete;
  ~LaunchGraphs();  // in-flight launches finish (cudaGraphExecDestroy frees an exec once they have)

  // Makes list's launches on stream, through a graph or one by one; the first error. An error of
  // cudaStreamIsCapturing on stream (the legacy stream while a stream that synchronises with it is
  // captured) is returned before any launch.
  cudaError_t launch(const LaunchList& list, cudaStream_t stream);

 private:
  struct NodeParams {
    dim3 grid;
    std::size_t smem = 0;
    std::vector<unsigned char> args;  // the arguments' bytes, one after another
    bool known = false;
    bool same(const KernelLaunch& l) const;  // whether l sets exactly these
    void remember(const KernelLaunch& l);    // l's (allocates only where the size grows)
  };
  struct Graph {
    cudaStream_t stream = nullptr;
    std::thread::id thread;  // the thread that made the first call (told apart on cudaStreamPerThread only)
    int count = 0;
    const void* funcs[LaunchList::kMaxLaunches] = {};
    dim3 blocks[LaunchList::kMaxLaunches];
    unsigned clusters[LaunchList::kMaxLaunches] = {};
    cudaGraph_t graph = nullptr;                           // the captured launches
    cudaGraphExec_t exec = nullptr;                        // nullptr: not built (yet, or it could not be)
    int tries = 0;                                         // (tries, building, built: under mutex_)
    bool building = false;                                 // a call is building it (the build runs without mutex_)
    bool built = false;                                    // the last build succeeded
    unsigned long long last_use = 0;                       // LaunchGraphs::clock_ at its last call
    cudaGraphNode_t nodes[LaunchList::kMaxLaunches] = {};  // in launch order
    const void* node_funcs[LaunchList::kMaxLaunches] = {};  // as the captured nodes name them
    // Each node's parameters as last set (or captured): a call whose launch has the same grid,
    // shared memory and argument bytes (a caller whose buffers stay where they are) sets nothing.
    NodeParams last[LaunchList::kMaxLaunches];
    // The key of the call whose arguments every node holds (LaunchList::set_key); empty: none.
    std::vector<unsigned char> key;
    std::mutex mutex;  // graph, exec and the nodes: building, taking over, setting the nodes and launching
    void release();    // destroys graph and exec
  };
  bool matches(const Graph& g, const LaunchList& list, cudaStream_t stream) const;
  Graph* find_or_build(const LaunchList& list, cudaStream_t stream);
  bool build(Graph& g, const LaunchList& list);

  // Lock order: mutex_, then a Graph's mutex, then capture_mutex_. A build holds only the last two,
  // so that calls on other streams (their graphs found under mutex_) do not wait for a capture.
  std::mutex mutex_;           // graphs_ (which entry is whose), clock_, each entry's tries and build state
  std::deque<Graph> graphs_;   // never shrinks while the object lives: Graph* stay valid
  std::mutex capture_mutex_;   // capture_ and the captures on it (one build at a time)
  cudaStream_t capture_ = nullptr;
  unsigned long long clock_ = 0;  // calls that looked for a graph
};

// Counts over every LaunchGraphs of the process (for tests and probes).
struct LaunchGraphStats {
  long long graphs = 0;               // built
  long long graph_launches = 0;       // calls made through a graph
  long long direct_launches = 0;      // calls made one launch at a time (by a LaunchGraphs)
  long long nodes = 0;                // in the graphs built (a kernel each)
  long long programmatic_edges = 0;   // between them (a chain: nodes - graphs edges in all)
  long long evictions = 0;            // (stream, shape) entries taken over by new ones
  long long nodes_set = 0;            // cudaGraphExecKernelNodeSetParams calls, refused ones too (a node unchanged is not set)
  long long failures = 0;             // CUDA calls that refused to build a graph or set its nodes
  const char* failed_call = nullptr;  // the first of them, if any
  cudaError_t failed_error = cudaSuccess;
};
LaunchGraphStats launch_graph_stats();

}  // namespace gdnkit::cuda
