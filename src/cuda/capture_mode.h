// This thread's stream-capture interaction mode set to relaxed for a scope, around the library's
// few calls that stream capture may count as unsafe: binding a thread's context (cudaFree), and
// building, setting and launching a split's graph (instantiating and uploading may allocate). In the
// default (global) mode such a call, made while any thread captures a stream in global mode
// (PyTorch's default), is refused and breaks that capture, the caller's graph. They are unsafe
// only in general (an allocation that a replay of the caller's graph would not repeat): these
// touch no stream being captured and leave nothing a replay needs.
#pragma once

#include <cuda_runtime.h>

namespace gdnkit::cuda {

class RelaxedCaptureMode {
 public:
  RelaxedCaptureMode() : set_(cudaThreadExchangeStreamCaptureMode(&mode_) == cudaSuccess) {
    if (!set_) cudaGetLastError();  // only the error this call left
  }
  ~RelaxedCaptureMode() {
    if (set_ && cudaThreadExchangeStreamCaptureMode(&mode_) != cudaSuccess)  // the thread's mode as it was
      cudaGetLastError();
  }
  RelaxedCaptureMode(const RelaxedCaptureMode&) = delete;
  RelaxedCaptureMode& operator=(const RelaxedCaptureMode&) = delete;

 private:
  cudaStreamCaptureMode mode_ = cudaStreamCaptureModeRelaxed;
  bool set_;
};

}  // namespace gdnkit::cuda
