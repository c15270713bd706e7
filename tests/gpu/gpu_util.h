// GPU-only test helpers on top of tests/common/test_util.h: a device mirror of a test::Case (every
// host buffer copied whole, guard elements, poison and sentinels included, so test::compare can
// check the downloaded outputs exactly as it checks a host run), and a few CUDA conveniences.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/test_util.h"

namespace gdnkit::test {

inline void cuda_check(cudaError_t err, const char* what) {
  if (err != cudaSuccess)
    throw std::runtime_error(std::string(what) + ": " + cudaGetErrorName(err) + ": " + cudaGetErrorString(err));
}
#define GDN_CUDA(call) ::gdnkit::test::cuda_check((call), #call)

// Device copies of every host buffer of a Case. Pointers into a host buffer map to the same offset
// in its device copy. The Case must not be moved or resized while a mirror of it exists.
class DeviceCase {
 public:
  explicit DeviceCase(Case& c) : c_(c) {
    add(c.qkv.data(), c.qkv.size() * sizeof(std::uint16_t));
    add(c.g.data(), c.g.size() * sizeof(float));
    add(c.beta32.data(), c.beta32.size() * sizeof(float));
    add(c.beta16.data(), c.beta16.size() * sizeof(std::uint16_t));
    add(c.cu32.data(), c.cu32.size() * sizeof(std::int32_t));
    add(c.cu64.data(), c.cu64.size() * sizeof(std::int64_t));
    add(c.init.buf.data(), c.init.buf.size() * sizeof(float));
    add(c.o.buf.data(), c.o.buf.size() * sizeof(std::uint16_t));
    add(c.fin.buf.data(), c.fin.buf.size() * sizeof(float));
    upload();
  }
  DeviceCase(const DeviceCase&) = delete;
  DeviceCase& operator=(const DeviceCase&) = delete;
  ~DeviceCase() {
    for (auto& b : bufs_) cudaFree(b.dev);
  }

  // The problem with Memory::cuda.
  Problem problem() const {
    Problem p = c_.problem;
    p.memory = Memory::cuda;
    return p;
  }

  // The Case's tensors, pointing into the device copies.
  Tensors tensors() const {
    Tensors h = c_.tensors();
    Tensors d;
    d.q = map(h.q);
    d.k = map(h.k);
    d.v = map(h.v);
    d.g = static_cast<const float*>(map(h.g));
    d.beta = map(h.beta);
    d.cu_seqlens = map(h.cu_seqlens);
    d.initial_state = static_cast<const float*>(map(h.initial_state));
    d.o = map(h.o);
    d.final_state = static_cast<float*>(map(h.final_state));
    return d;
  }

  // Host -> device, every buffer (inputs, poisoned outputs, guards).
  void upload(cudaStream_t stream = nullptr) {
    for (auto& b : bufs_)
      if (b.bytes) GDN_CUDA(cudaMemcpyAsync(b.dev, b.host, b.bytes, cudaMemcpyHostToDevice, stream));
    GDN_CUDA(cudaStreamSynchronize(stream));
  }

  // Device -> host for the buffers a run may write (o, final state, and the initial state, which
  // is the final state when in place), guards included.
  void download(cudaStream_t stream = nullptr) {
    for (const void* host : {static_cast<const void*>(c_.o.buf.data()), static_cast<const void*>(c_.fin.buf.data()),
                             static_cast<const void*>(c_.init.buf.data())}) {
      const Buf* b = find(host);
      if (b && b->bytes)
        GDN_CUDA(cudaMemcpyAsync(const_cast<void*>(b->host), b->dev, b->bytes, cudaMemcpyDeviceToHost, stream));
    }
    GDN_CUDA(cudaStreamSynchronize(stream));
  }

 private:
  struct Buf {
    const void* host = nullptr;
    std::size_t bytes = 0;
    void* dev = nullptr;
  };

  void add(const void* host, std::size_t bytes) {
    if (host == nullptr || bytes == 0) return;
    Buf b;
    b.host = host;
    b.bytes = bytes;
    GDN_CUDA(cudaMalloc(&b.dev, bytes));
    bufs_.push_back(b);
  }
  const Buf* find(const void* host) const {
    const auto* p = static_cast<const unsigned char*>(host);
    for (const auto& b : bufs_) {
      const auto* base = static_cast<const unsigned char*>(b.host);
      if (p >= base && p < base + b.bytes) return &b;
    }
    return nullptr;
  }
  void* map(const void* host) const {
    if (host == nullptr) return nullptr;
    const Buf* b = find(host);
    if (b == nullptr) return nullptr;  // an empty buffer (T == 0): the run must not touch it
    return static_cast<unsigned char*>(b->dev) + (static_cast<const unsigned char*>(host) -
                                                  static_cast<const unsigned char*>(b->host));
  }

  Case& c_;
  std::vector<Buf> bufs_;
};

// The caller-owned scratch a plan asks for (workspace_bytes(); null when it asks for none),
// allocated before any run (and before any graph capture).
class DeviceWorkspace {
 public:
  explicit DeviceWorkspace(const Plan& plan) : DeviceWorkspace(plan.workspace_bytes()) {}
  explicit DeviceWorkspace(std::size_t bytes) : bytes_(bytes) {
    if (bytes_ > 0) GDN_CUDA(cudaMalloc(&ptr_, bytes_));
  }
  ~DeviceWorkspace() {
    if (ptr_ != nullptr) cudaFree(ptr_);
  }
  DeviceWorkspace(const DeviceWorkspace&) = delete;
  DeviceWorkspace& operator=(const DeviceWorkspace&) = delete;
  void* ptr() const { return ptr_; }
  std::size_t bytes() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  std::size_t bytes_ = 0;
};

// The suite's plan options: `o`, unless it names no kernel and GDNKIT_TEST_KERNEL is set, in which
// case every problem the fused kernel takes (bf16 or f16) requires it by name, so that the whole
// suite runs on it (scripts/gpu_check.sh runs the suite three ways): "fused" requires the
// 128-column variant where dv = 128 and the 64-column one where dv = 64, "fused-v64" the
// 64-column one everywhere; "short" requires the short walk (16-token chunks) of the widest CTA
// that divides dv, for every problem of 16-bit q/k/v.
// GDNKIT_TEST_KERNEL's value; unset and empty both mean the planner's choice, and any other value
// than the three modes fails the test that asks (a misspelt mode would otherwise run the default).
inline std::string suite_kernel_mode() {
  const char* env = std::getenv("GDNKIT_TEST_KERNEL");
  const std::string mode = env != nullptr ? env : "";
  if (!mode.empty() && mode != "fused" && mode != "fused-v64" && mode != "short")
    ADD_FAILURE() << "GDNKIT_TEST_KERNEL: expected fused, fused-v64, short or empty, got '" << mode << "'";
  return mode;
}

inline gdnkit::Options suite_options(const gdnkit::Problem& p, gdnkit::Options o = {}) {
  thread_local std::string name;
  if (o.kernel != nullptr || o.segments != 0) return o;
  const std::string mode = suite_kernel_mode();
  if (mode != "fused" && mode != "fused-v64" && mode != "short") return o;
  if (p.qkv_dtype != DType::bf16 && p.qkv_dtype != DType::f16) return o;
  if (mode == "short") {
    if (p.head_dim_v % 16 != 0 || (p.head_dim_k != 64 && p.head_dim_k != 128)) return o;
    int w = 8;
    while ((p.head_dim_v / 16) % w != 0) w /= 2;
    name = std::string("cuda-short-") + (p.qkv_dtype == DType::bf16 ? "bf16" : "f16") + "-k" +
           std::to_string(p.head_dim_k) + "-w" + std::to_string(w);
    o.kernel = name.c_str();
    return o;
  }
  if (p.head_dim_v != 64 && p.head_dim_v != 128) return o;
  const bool v64 = mode == "fused-v64" || p.head_dim_v == 64;
  name = std::string("cuda-fused-sm90-") + (p.qkv_dtype == DType::bf16 ? "bf16" : "f16") + "-k" +
         std::to_string(p.head_dim_k) + (v64 ? "-v64" : "");
  o.kernel = name.c_str();
  return o;
}

// Plans (with suite_options(options)), runs on `stream`, waits, downloads. Returns the plan's
// kernel name.
inline std::string run_device(Case& c, DeviceCase& d, cudaStream_t stream = nullptr,
                              const gdnkit::Options& options = {}) {
  const Plan plan = Plan::create(d.problem(), suite_options(d.problem(), options));
  EXPECT_EQ(plan.backend(), Backend::cuda);
  const DeviceWorkspace ws(plan);
  plan.run(d.tensors(), ws.ptr(), ws.bytes(), stream);
  GDN_CUDA(cudaStreamSynchronize(stream));
  GDN_CUDA(cudaGetLastError());
  d.download(stream);
  (void)c;
  return plan.kernel_name();
}

inline int sm_count() {
  int dev = 0, sms = 0;
  GDN_CUDA(cudaGetDevice(&dev));
  GDN_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  return sms;
}

// Whether the current device is compute capability 9.0 (H100/H200), where the sm_90a kernels run.
inline bool device_is_sm90() {
  int dev = 0, major = 0, minor = 0;
  GDN_CUDA(cudaGetDevice(&dev));
  GDN_CUDA(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  GDN_CUDA(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
  return major == 9 && minor == 0;
}

// Every o element of the case written (no poison), nothing around it touched, guards intact;
// the part of test::compare that needs no oracle. Empty when all is well.
inline std::string written_issues(const Case& c) {
  std::ostringstream issues;
  std::int64_t unwritten = 0, touched = 0;
  std::vector<char> valid(c.o.n, 0);
  c.for_each_o([&](std::int64_t, int, int, std::int64_t i) {
    valid[static_cast<std::size_t>(i)] = 1;
    if (c.o.data()[i] == kPoison16) ++unwritten;
  });
  for (std::size_t i = 0; i < c.o.n; ++i)
    if (!valid[i] && c.o.data()[i] != kSentinel16) ++touched;
  if (unwritten) issues << unwritten << " o elements not written; ";
  if (touched) issues << touched << " o padding elements overwritten; ";
  if (!c.o.guards_intact()) issues << "o guard elements overwritten; ";
  if (!c.init.guards_intact()) issues << "initial_state guard elements overwritten; ";
  if (!c.fin.guards_intact()) issues << "final_state guard elements overwritten; ";
  if (c.spec.final_state && !c.spec.in_place)
    for (std::int64_t i = 0; i < c.state_elems(); ++i)
      if (float_bits(c.fin.data()[i]) == kPoison32) {
        issues << "final_state not fully written; ";
        break;
      }
  return issues.str();
}

// Rel-L2 errors of sequence n, head h only, against the oracle (for cases too big for all pairs).
// The oracle reads the host inputs, so call it before download() when the state is in place.
struct PairErrors {
  double o = 0, state = 0;
};
inline PairErrors pair_errors(const Case& c, std::int64_t n, int h, const std::vector<double>& ref_o,
                              const std::vector<double>& ref_state) {
  const detail::Shape& s = c.shape;
  RelL2 eo, es;
  for (std::int64_t t = c.starts[n]; t < c.starts[n + 1]; ++t)
    for (int d = 0; d < s.dv; ++d)
      eo.add(detail::load_as_float(c.o.data(), c.spec.qkv, t * s.o.token + h * s.o.head + d),
             ref_o[static_cast<std::size_t>((t - c.starts[n]) * s.dv + d)]);
  if (c.spec.final_state) {
    const float* f = c.spec.in_place ? c.init.data() : c.fin.data();
    const std::int64_t base = (n * s.H + h) * s.state_elems();
    for (int i = 0; i < s.dk; ++i)
      for (int j = 0; j < s.dv; ++j)
        es.add(f[base + (c.spec.layout == StateLayout::kv ? i * s.dv + j : j * s.dk + i)],
               ref_state[static_cast<std::size_t>(i * s.dv + j)]);
  }
  return {eo.value(), es.value()};
}

}  // namespace gdnkit::test
