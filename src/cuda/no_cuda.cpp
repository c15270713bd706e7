// The CUDA backend's entry points in a CPU-only build (GDNKIT_WITH_CUDA=OFF): no device is ever
// available, and a plan that asks for CUDA memory or a CUDA kernel is refused by name.
#include "cuda/backend.h"

namespace gdnkit::cuda {

namespace {
[[noreturn]] void absent() {
  detail::fail(Error::Kind::unsupported, "memory", "host memory (this build has no CUDA backend: GDNKIT_WITH_CUDA=OFF)",
               "cuda");
}
}  // namespace

bool device_available() noexcept { return false; }
Config plan(const Problem&, const detail::Shape&, const Options&) { absent(); }
void run(const Problem&, const detail::Shape&, const Config&, const Tensors&, void*, Stream) { absent(); }
void copy_to_host(void*, const void*, std::size_t, Stream) { absent(); }

}  // namespace gdnkit::cuda
