// Host emulation of flags.cuh: host atomics. The emulator runs one CTA at a time, so a wait on a
// flag that is not raised yet would never end on a GPU; here it is recorded in g_unraised_waits
// (empty in a normal run), and g_on_unraised_wait, where a test sets it, runs first: a probe
// stores there the data the flag guards (and raises it), as a producer on a GPU would have.
#pragma once
#include <atomic>
#include <functional>
#include <mutex>
#include <vector>

namespace gdnkit::cuda {

inline std::mutex g_flag_mutex;
inline std::vector<const int*> g_unraised_waits;
inline std::function<void(const int*)> g_on_unraised_wait;

inline int take_ticket(int* counter) { return std::atomic_ref<int>(*counter).fetch_add(1); }
inline void raise_flag(int* flag) { std::atomic_ref<int>(*flag).store(1, std::memory_order_release); }
inline void wait_flag(const int* flag) {
  if (std::atomic_ref<int>(*const_cast<int*>(flag)).load(std::memory_order_acquire) == 0) {
    std::lock_guard<std::mutex> lock(g_flag_mutex);
    g_unraised_waits.push_back(flag);
    if (g_on_unraised_wait) g_on_unraised_wait(flag);
  }
}
inline float load_cg(const float* p) { return *p; }

}  // namespace gdnkit::cuda
