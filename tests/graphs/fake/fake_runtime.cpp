// The stand-in runtime's calls (cuda_runtime.h, fake_runtime.h). One lock over all its state: the
// code under test may call it from several threads at once.
#include "fake_runtime.h"

#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>

struct CUstream_st {
  bool capturing = false;
  std::vector<CUgraphNode_st*> captured;  // the capture's nodes so far
};

struct CUgraphNode_st {
  const void* func = nullptr;
  dim3 grid, block;
  std::size_t smem = 0;
  std::vector<unsigned char> args;
  std::vector<std::size_t> sizes;
  bool programmatic = false;  // its edge from the node before it (the launch had the PDL attribute)
};

struct CUgraph_st {
  std::vector<std::unique_ptr<CUgraphNode_st>> nodes;  // a chain, in launch order
};

struct CUgraphExec_st {
  const CUgraph_st* graph = nullptr;
  std::vector<fake::Ran> params;  // per node, as set last
};

namespace {

std::mutex mu;
std::map<const void*, std::vector<std::size_t>> sizes_of;
std::map<std::pair<cudaStream_t, std::thread::id>, std::vector<fake::Ran>> logs;
struct Refusal {
  int after = 0, count = 0;
  cudaError_t err = cudaSuccess;
};
std::map<std::string, Refusal> refusals;
std::map<std::string, int> call_counts;
int graphs_alive = 0, execs_alive = 0;
std::vector<const CUgraph_st*> all_graphs;  // to find a node's graph (the real runtime knows it from the handle)
CUstream_st legacy_state, per_thread_state;  // (capture on them is not modelled)
thread_local cudaError_t last_error = cudaSuccess;
thread_local cudaStreamCaptureMode capture_mode = cudaStreamCaptureModeGlobal;

std::pair<cudaStream_t, std::thread::id> log_key(cudaStream_t s) {
  return {s, s == cudaStreamPerThread ? std::this_thread::get_id() : std::thread::id()};
}

CUstream_st* state(cudaStream_t s) {
  if (s == nullptr) return &legacy_state;
  if (s == cudaStreamPerThread) return &per_thread_state;
  return s;
}

// Counts the call; an injected refusal is returned (and left as the last error). mu held.
cudaError_t enter(const char* call) {
  ++call_counts[call];
  auto it = refusals.find(call);
  if (it == refusals.end() || it->second.count == 0) return cudaSuccess;
  if (it->second.after > 0) {
    --it->second.after;
    return cudaSuccess;
  }
  --it->second.count;
  return last_error = it->second.err;
}

cudaError_t error(cudaError_t err) { return last_error = err; }

std::vector<unsigned char> gather(const std::vector<std::size_t>& sizes, void* const* args) {
  std::vector<unsigned char> bytes;
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    const auto* p = static_cast<const unsigned char*>(args[i]);
    bytes.insert(bytes.end(), p, p + sizes[i]);
  }
  return bytes;
}

}  // namespace

namespace fake {

void register_sizes(const void* func, std::vector<std::size_t> sizes) {
  std::lock_guard<std::mutex> lock(mu);
  sizes_of[func] = std::move(sizes);
}

std::vector<Ran> take_log(cudaStream_t stream) {
  std::lock_guard<std::mutex> lock(mu);
  return std::exchange(logs[log_key(stream)], {});
}

void refuse(const std::string& call, int count, int after, cudaError_t err) {
  std::lock_guard<std::mutex> lock(mu);
  refusals[call] = {after, count, err};
}

int calls(const std::string& call) {
  std::lock_guard<std::mutex> lock(mu);
  return call_counts[call];
}

int live_graphs() {
  std::lock_guard<std::mutex> lock(mu);
  return graphs_alive;
}

int live_execs() {
  std::lock_guard<std::mutex> lock(mu);
  return execs_alive;
}

}  // namespace fake

cudaError_t cudaGetLastError() { return std::exchange(last_error, cudaSuccess); }

cudaError_t cudaThreadExchangeStreamCaptureMode(cudaStreamCaptureMode* mode) {
  std::swap(*mode, capture_mode);
  return cudaSuccess;
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned int) {
  std::lock_guard<std::mutex> lock(mu);
  if (const cudaError_t err = enter("cudaStreamCreateWithFlags")) return err;
  *stream = new CUstream_st;
  return cudaSuccess;
}

cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  std::lock_guard<std::mutex> lock(mu);
  enter("cudaStreamDestroy");
  delete stream;
  return cudaSuccess;
}

cudaError_t cudaStreamIsCapturing(cudaStream_t stream, cudaStreamCaptureStatus* status) {
  std::lock_guard<std::mutex> lock(mu);
  if (const cudaError_t err = enter("cudaStreamIsCapturing")) return err;
  *status = state(stream)->capturing ? cudaStreamCaptureStatusActive : cudaStreamCaptureStatusNone;
  return cudaSuccess;
}

cudaError_t cudaStreamBeginCapture(cudaStream_t stream, cudaStreamCaptureMode) {
  std::lock_guard<std::mutex> lock(mu);
  if (const cudaError_t err = enter("cudaStreamBeginCapture")) return err;
  CUstream_st* s = state(stream);
  if (s->capturing) return error(cudaErrorInvalidValue);
  s->capturing = true;
  s->captured.clear();
  return cudaSuccess;
}

cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t* graph) {
  std::lock_guard<std::mutex> lock(mu);
  CUstream_st* s = state(stream);
  if (!s->capturing) return error(cudaErrorInvalidValue);
  s->capturing = false;
  auto* g = new CUgraph_st;
  for (CUgraphNode_st* n : s->captured) g->nodes.emplace_back(n);
  s->captured.clear();
  ++graphs_alive;
  all_graphs.push_back(g);
  *graph = g;
  if (const cudaError_t err = enter("cudaStreamEndCapture")) {  // (the real one leaves no graph then)
    std::erase(all_graphs, g);
    delete g;
    --graphs_alive;
    *graph = nullptr;
    return err;
  }
  return cudaSuccess;
}

cudaError_t cudaLaunchKernelExC(const cudaLaunchConfig_t* config, const void* func, void** args) {
  std::lock_guard<std::mutex> lock(mu);
  if (const cudaError_t err = enter("cudaLaunchKernelExC")) return err;
  auto it = sizes_of.find(func);
  if (it == sizes_of.end()) return error(cudaErrorInvalidValue);  // a kernel the test did not register
  bool programmatic = false;
  for (unsigned a = 0; a < config->numAttrs; ++a)
    programmatic |= config->attrs[a].id == cudaLaunchAttributeProgrammaticStreamSerialization &&
                    config->attrs[a].val.programmaticStreamSerializationAllowed != 0;
  CUstream_st* s = state(config->stream);
  if (s->capturing) {
    auto* n = new CUgraphNode_st;
    n->func = func;
    n->grid = config->gridDim;
    n->block = config->blockDim;
    n->smem = config->dynamicSmemBytes;
    n->sizes = it->second;
    n->args = gather(it->second, args);
    n->programmatic = programmatic && !s->captured.empty();
    s->captured.push_back(n);
    return cudaSuccess;
  }
  logs[log_key(config->stream)].push_back({func, config->gridDim, config->dynamicSmemBytes, gather(it->second, args)});
  return cudaSuccess;
}

cudaError_t cudaGraphGetNodes(cudaGraph_t graph, cudaGraphNode_t* nodes, std::size_t* count) {
  std::lock_guard<std::mutex> lock(mu);
  if (const cudaError_t err = enter("cudaGraphGetNodes")) return err;
  if (nodes != nullptr)
    for (std::size_t i = 0; i < *count && i < graph->nodes.size(); ++i) nodes[i] = graph->nodes[i].get();
  *count = graph->nodes.size();
  return cudaSuccess;
}

cudaError_t cudaGraphGetRootNodes(cudaGraph_t graph, cudaGraphNode_t* nodes, std::size_t* count) {
  std::lock_guard<std::mutex> lock(mu);
  if (const cudaError_t err = enter("cudaGraphGetRootNodes")) return err;
  const std::size_t roots = graph->nodes.empty() ? 0 : 1;
  if (nodes != nullptr && *count >= 1 && roots == 1) nodes[0] = graph->nodes[0].get();
  *count = roots;
  return cudaSuccess;
}

cudaError_t cudaGraphKernelNodeGetParams(cudaGraphNode_t node, cudaKernelNodeParams* params) {
  std::lock_guard<std::mutex> lock(mu);
  if (const cudaError_t err = enter("cudaGraphKernelNodeGetParams")) return err;
  params->func = const_cast<void*>(node->func);
  params->gridDim = node->grid;
  params->blockDim = node->block;
  params->sharedMemBytes = static_cast<unsigned>(node->smem);
  return cudaSuccess;
}

namespace {
// graph, if it holds node, and node's index there (mu held).
std::pair<const CUgraph_st*, std::size_t> find_node(const CUgraph_st* graph, cudaGraphNode_t node) {
  for (std::size_t i = 0; i < graph->nodes.size(); ++i)
    if (graph->nodes[i].get() == node) return {graph, i};
  return {nullptr, 0};
}
}  // namespace

cudaError_t cudaGraphNodeGetDependentNodes(cudaGraphNode_t node, cudaGraphNode_t* dependents, cudaGraphEdgeData* edges,
                                           std::size_t* count) {
  std::lock_guard<std::mutex> lock(mu);
  if (const cudaError_t err = enter("cudaGraphNodeGetDependentNodes")) return err;
  for (const CUgraph_st* g : all_graphs) {
    const auto [graph, i] = find_node(g, node);
    if (graph == nullptr) continue;
    const bool has_next = i + 1 < graph->nodes.size();
    if (dependents != nullptr && *count >= 1 && has_next) {
      dependents[0] = graph->nodes[i + 1].get();
      if (edges != nullptr) {
        edges[0] = cudaGraphEdgeData{};
        edges[0].type = graph->nodes[i + 1]->programmatic ? cudaGraphDependencyTypeProgrammatic
                                                          : cudaGraphDependencyTypeDefault;
      }
    }
    *count = has_next ? 1 : 0;
    return cudaSuccess;
  }
  return error(cudaErrorInvalidValue);
}

cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t graph, unsigned long long) {
  std::lock_guard<std::mutex> lock(mu);
  if (const cudaError_t err = enter("cudaGraphInstantiate")) return err;
  auto* e = new CUgraphExec_st;
  e->graph = graph;
  for (const auto& n : graph->nodes) e->params.push_back({n->func, n->grid, n->smem, n->args});
  ++execs_alive;
  *exec = e;
  return cudaSuccess;
}

cudaError_t cudaGraphUpload(cudaGraphExec_t, cudaStream_t) {
  std::lock_guard<std::mutex> lock(mu);
  return enter("cudaGraphUpload");
}

cudaError_t cudaGraphExecKernelNodeSetParams(cudaGraphExec_t exec, cudaGraphNode_t node,
                                             const cudaKernelNodeParams* params) {
  std::lock_guard<std::mutex> lock(mu);
  if (const cudaError_t err = enter("cudaGraphExecKernelNodeSetParams")) return err;
  const auto [graph, i] = find_node(exec->graph, node);
  if (graph == nullptr || params->func != node->func || params->blockDim.x != node->block.x ||
      params->blockDim.y != node->block.y || params->blockDim.z != node->block.z)
    return error(cudaErrorInvalidValue);
  exec->params[i] = {node->func, params->gridDim, params->sharedMemBytes, gather(node->sizes, params->kernelParams)};
  return cudaSuccess;
}

cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t stream) {
  std::lock_guard<std::mutex> lock(mu);
  if (const cudaError_t err = enter("cudaGraphLaunch")) return err;
  auto& log = logs[log_key(stream)];
  log.insert(log.end(), exec->params.begin(), exec->params.end());
  return cudaSuccess;
}

cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) {
  std::lock_guard<std::mutex> lock(mu);
  enter("cudaGraphExecDestroy");
  delete exec;
  --execs_alive;
  return cudaSuccess;
}

cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
  std::lock_guard<std::mutex> lock(mu);
  enter("cudaGraphDestroy");
  std::erase(all_graphs, graph);
  delete graph;
  --graphs_alive;
  return cudaSuccess;
}
