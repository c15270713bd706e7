// This thread's stream-capture interaction mode set to relaxed for a scope, for the library's few
// calls that stream capture counts as unsafe (building a split's graph, binding a thread's
// context). In the default (global) mode such a call, made while any thread captures a stream in
// global mode (PyTorch's default), is refused and breaks that capture, the caller's graph. The
// calls are unsafe only in general (an allocation that a replay would not repeat): these capture
// nothing of the caller's and keep nothing a replay needs.
#pragma once

#include <cuda_runtime.h>

namespace gdnkit::cuda {

class RelaxedCaptureMode {
 public:
  RelaxedCaptureMode() : set_(cudaThreadExchangeStreamCaptureMode(&mode_) == cudaSuccess) {}
  ~RelaxedCaptureMode() {
    if (set_) cudaThreadExchangeStreamCaptureMode(&mode_);  // the thread's mode as it was
  }
  RelaxedCaptureMode(const RelaxedCaptureMode&) = delete;
  RelaxedCaptureMode& operator=(const RelaxedCaptureMode&) = delete;

 private:
  cudaStreamCaptureMode mode_ = cudaStreamCaptureModeRelaxed;
  bool set_;
};

}  // namespace gdnkit::cuda
