// The test side of the stand-in runtime (cuda_runtime.h beside it): kernels' parameter sizes (the
// real runtime knows them from the kernel), what ran on each stream, injected refusals, and the
// graph objects still alive.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <string>
#include <vector>

namespace fake {

// One kernel run: what the stream executed (a launch made one by one or a graph node launched).
struct Ran {
  const void* func = nullptr;
  dim3 grid;
  std::size_t smem = 0;
  std::vector<unsigned char> args;  // the arguments' bytes, one after another
};

void register_sizes(const void* func, std::vector<std::size_t> sizes);
// A kernel's parameter sizes, from its type (what cudaLaunchKernelExC reads through args).
template <typename... P>
void register_kernel(void (*kernel)(P...)) {
  register_sizes(reinterpret_cast<const void*>(kernel), {sizeof(P)...});
}

// What ran on stream since the last call (cudaStreamPerThread: this thread's), and clears it.
std::vector<Ran> take_log(cudaStream_t stream);

// `count` calls of the runtime function named `call` (e.g. "cudaGraphInstantiate",
// "cudaGraphExecKernelNodeSetParams"), after the next `after` ones, return err instead of doing anything.
void refuse(const std::string& call, int count, int after = 0, cudaError_t err = cudaErrorUnknown);
// How often each function was called (refused calls included).
int calls(const std::string& call);

// Graphs and executable graphs not destroyed yet.
int live_graphs();
int live_execs();

}  // namespace fake
