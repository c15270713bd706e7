// Host time stamps at fixed points of Plan::run, in a build with -DGDNKIT_HOST_STAMPS only: where a
// call's host time goes (perf-notes, "Host overhead"). Single-threaded probes only; the plan prints
// the median time between consecutive points of its calls when it is destroyed. Nothing otherwise.
#pragma once

#ifdef GDNKIT_HOST_STAMPS
namespace gdnkit::detail {
// Points: 0 Plan::run entered, 1 its checks done, 2 the CUDA backend's checks and parameters done,
// 3 the TMA descriptors rebased, 4 the launch parameters ready (a split's launches listed: cp.cu),
// 7 Plan::run returning.
void host_stamp(int point);
void host_stamps_close(const void* plan);                     // run() returning: one call's times
void host_stamps_report(const void* plan, const char* kernel);  // the plan destroyed: its medians
}  // namespace gdnkit::detail
#define GDNKIT_HOST_STAMP(point) ::gdnkit::detail::host_stamp(point)
#else
#define GDNKIT_HOST_STAMP(point) ((void)0)
#endif
