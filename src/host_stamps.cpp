// The host stamps of a build with -DGDNKIT_HOST_STAMPS (common/host_stamps.h); empty otherwise.
#include "common/host_stamps.h"

#ifdef GDNKIT_HOST_STAMPS
#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <map>
#include <vector>

namespace gdnkit::detail {

namespace {
constexpr int kStampPoints = 8;
using StampClock = std::chrono::steady_clock;
StampClock::time_point stamp_at[kStampPoints];
unsigned stamp_mask = 0;
// Per plan: each call's microseconds from the previous point reached to each point (0: not reached).
std::map<const void*, std::vector<std::array<double, kStampPoints>>> stamp_calls;
}  // namespace
void host_stamp(int point) {
  stamp_at[point] = StampClock::now();
  stamp_mask |= 1u << point;
}
void host_stamps_close(const void* plan) {
  std::array<double, kStampPoints> d{};
  int prev = -1;
  for (int i = 0; i < kStampPoints; ++i) {
    if (!(stamp_mask >> i & 1)) continue;
    if (prev >= 0) d[i] = std::chrono::duration<double, std::micro>(stamp_at[i] - stamp_at[prev]).count();
    prev = i;
  }
  stamp_mask = 0;
  stamp_calls[plan].push_back(d);
}
void host_stamps_report(const void* plan, const char* kernel) {
  const auto it = stamp_calls.find(plan);
  if (it == stamp_calls.end()) return;
  std::fprintf(stderr, "host stamps %s (%zu calls, median us since the previous point):", kernel, it->second.size());
  for (int i = 1; i < kStampPoints; ++i) {
    std::vector<double> v;
    for (const auto& d : it->second) v.push_back(d[i]);
    std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2), v.end());
    std::fprintf(stderr, " %d: %.3f", i, v[v.size() / 2]);
  }
  std::fprintf(stderr, "\n");
  stamp_calls.erase(it);
}

}  // namespace gdnkit::detail
#endif
