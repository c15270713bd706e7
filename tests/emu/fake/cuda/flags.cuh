// Host emulation of flags.cuh: host atomics. The emulator runs one CTA at a time, so a wait on a
// flag that is not raised yet can never end: it fails the test instead of hanging.
#pragma once
#include <atomic>
#include <cstdio>
#include <cstdlib>

namespace gdnkit::cuda {

inline int take_ticket(int* counter) { return std::atomic_ref<int>(*counter).fetch_add(1); }
inline void raise_flag(int* flag) { std::atomic_ref<int>(*flag).store(1, std::memory_order_release); }
inline void wait_flag(const int* flag) {
  if (std::atomic_ref<int>(*const_cast<int*>(flag)).load(std::memory_order_acquire) == 0) {
    std::fprintf(stderr, "wait_flag: the flag is not raised (a wait on a higher ticket's work)\n");
    std::abort();
  }
}
inline float load_cg(const float* p) { return *p; }

}  // namespace gdnkit::cuda
