// Gates as every backend reads them: in log space, floored (docs/math.md, "Gate space").
#pragma once

#include <cfloat>
#include <cmath>

#if defined(__CUDACC__)
#define GDNKIT_HOST_DEVICE __host__ __device__
#else
#define GDNKIT_HOST_DEVICE
#endif

namespace gdnkit::detail {

// log(FLT_MIN). A log gate below it, -inf included, acts as it: exp of it (1.2e-38) is a full decay
// at fp32 resolution, and the floor keeps a chunk's cumulative sums G small, so the differences
// G_i - G_j between the rows after a reset-style gate (-1e30, -FLT_MAX) keep their precision.
constexpr float kLogGateFloor = -87.336544f;

// The log gate of a raw gate value x (alpha itself when linear). NaN stays NaN.
GDNKIT_HOST_DEVICE inline float log_gate(float x, bool linear) {
  if (linear) x = logf(x < FLT_MIN ? FLT_MIN : x);
  return x < kLogGateFloor ? kLogGateFloor : x;
}

}  // namespace gdnkit::detail
