// A stand-in for the CUDA runtime's stream, capture, graph and launch calls that the split's launch
// lists and graphs use (src/cuda/launch_list.*), for testing their host logic without a GPU: a
// launch "runs" by appending its kernel and argument bytes to its stream's log, a capture records
// launches as a chain of graph nodes, an instantiated graph keeps its nodes' parameters, which
// cudaGraphExecKernelNodeSetParams replaces and cudaGraphLaunch appends to the stream's log. So a
// test compares what ran with what each call asked for. Faults can be injected (fake_runtime.h).
#pragma once

#include <cstddef>

#define CUDART_VERSION 13000

struct dim3 {
  unsigned x = 1, y = 1, z = 1;
  constexpr dim3() = default;
  constexpr dim3(unsigned a, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {}
};

enum cudaError_t {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorMemoryAllocation = 2,
  cudaErrorStreamCaptureImplicit = 906,
  cudaErrorUnknown = 999,
};

struct CUstream_st;
using cudaStream_t = CUstream_st*;
#define cudaStreamPerThread (reinterpret_cast<cudaStream_t>(0x2))
#define cudaStreamNonBlocking 0x01

enum cudaStreamCaptureMode {
  cudaStreamCaptureModeGlobal = 0,
  cudaStreamCaptureModeThreadLocal = 1,
  cudaStreamCaptureModeRelaxed = 2,
};
enum cudaStreamCaptureStatus {
  cudaStreamCaptureStatusNone = 0,
  cudaStreamCaptureStatusActive = 1,
  cudaStreamCaptureStatusInvalidated = 2,
};

struct CUgraph_st;
struct CUgraphExec_st;
struct CUgraphNode_st;
using cudaGraph_t = CUgraph_st*;
using cudaGraphExec_t = CUgraphExec_st*;
using cudaGraphNode_t = CUgraphNode_st*;

enum cudaGraphDependencyType {
  cudaGraphDependencyTypeDefault = 0,
  cudaGraphDependencyTypeProgrammatic = 1,
};
struct cudaGraphEdgeData {
  unsigned char from_port = 0;
  unsigned char to_port = 0;
  unsigned char type = cudaGraphDependencyTypeDefault;
  unsigned char reserved[5] = {};
};

struct cudaKernelNodeParams {
  void* func = nullptr;
  dim3 gridDim;
  dim3 blockDim;
  unsigned int sharedMemBytes = 0;
  void** kernelParams = nullptr;
  void** extra = nullptr;
};

enum cudaLaunchAttributeID {
  cudaLaunchAttributeClusterDimension = 4,
  cudaLaunchAttributeProgrammaticStreamSerialization = 5,
};
union cudaLaunchAttributeValue {
  char pad[64];
  int programmaticStreamSerializationAllowed;
  struct {
    unsigned x, y, z;
  } clusterDim;
};
struct cudaLaunchAttribute {
  cudaLaunchAttributeID id;
  char pad[4];
  cudaLaunchAttributeValue val;
};
struct cudaLaunchConfig_t {
  dim3 gridDim;
  dim3 blockDim;
  std::size_t dynamicSmemBytes = 0;
  cudaStream_t stream = nullptr;
  cudaLaunchAttribute* attrs = nullptr;
  unsigned int numAttrs = 0;
};

cudaError_t cudaGetLastError();
cudaError_t cudaThreadExchangeStreamCaptureMode(cudaStreamCaptureMode* mode);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned int flags);
cudaError_t cudaStreamDestroy(cudaStream_t stream);
cudaError_t cudaStreamIsCapturing(cudaStream_t stream, cudaStreamCaptureStatus* status);
cudaError_t cudaStreamBeginCapture(cudaStream_t stream, cudaStreamCaptureMode mode);
cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t* graph);
cudaError_t cudaLaunchKernelExC(const cudaLaunchConfig_t* config, const void* func, void** args);
cudaError_t cudaGraphGetNodes(cudaGraph_t graph, cudaGraphNode_t* nodes, std::size_t* count);
cudaError_t cudaGraphGetRootNodes(cudaGraph_t graph, cudaGraphNode_t* nodes, std::size_t* count);
cudaError_t cudaGraphKernelNodeGetParams(cudaGraphNode_t node, cudaKernelNodeParams* params);
cudaError_t cudaGraphNodeGetDependentNodes(cudaGraphNode_t node, cudaGraphNode_t* dependents, cudaGraphEdgeData* edges,
                                           std::size_t* count);
cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t graph, unsigned long long flags);
cudaError_t cudaGraphUpload(cudaGraphExec_t exec, cudaStream_t stream);
cudaError_t cudaGraphExecKernelNodeSetParams(cudaGraphExec_t exec, cudaGraphNode_t node,
                                             const cudaKernelNodeParams* params);
cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t stream);
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec);
cudaError_t cudaGraphDestroy(cudaGraph_t graph);
