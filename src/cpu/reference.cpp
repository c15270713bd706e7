// The test oracle: the GDN token recurrence, literally, in fp64 (reference.h). Deliberately naive:
// it shares no code with the chunked path except the metadata resolution and the typed loads, so
// a bug in the chunked algebra cannot hide in both.
#include "gdnkit/reference.h"

#include <cmath>
#include <string>

#include "common/gate.h"
#include "common/half.h"
#include "common/shape.h"

namespace gdnkit::reference {

void recurrence(const Problem& problem, const Tensors& t, std::int64_t seq, int head,
                std::vector<double>& o, std::vector<double>& final_state) {
  using detail::fail;
  using detail::load_as_float;
  using detail::kLogGateFloor;
  using K = Error::Kind;
  const detail::Shape s = detail::resolve_shape(problem);
  if (seq < 0 || seq >= s.N)
    fail(K::invalid_value, "seq", "0 <= seq < N=" + std::to_string(s.N), std::to_string(seq));
  if (head < 0 || head >= s.H)
    fail(K::invalid_value, "head", "0 <= head < H=" + std::to_string(s.H), std::to_string(head));
  if (problem.has_cu_seqlens && t.cu_seqlens == nullptr)
    fail(K::invalid_value, "cu_seqlens", "a pointer (has_cu_seqlens)", "null");
  const detail::SeqRange r = detail::host_seq_range(problem, s, t.cu_seqlens, seq);
  // Only this sequence's range is checked (checking all of cu_seqlens per call would make a sweep
  // over every (seq, head) quadratic in N).
  if (r.begin < 0 || r.end < r.begin || r.end > s.T) {
    std::string arg = "cu_seqlens[", got = "[";
    arg += std::to_string(seq) + "]";
    got += std::to_string(r.begin) + ", " + std::to_string(r.end) + ")";
    fail(K::invalid_value, arg, "a range inside [0, T=" + std::to_string(s.T) + "]", got);
  }
  const std::int64_t len = r.end - r.begin;
  if (len > 0) {
    if (t.q == nullptr) fail(K::invalid_value, "q", "a pointer (T > 0)", "null");
    if (t.k == nullptr) fail(K::invalid_value, "k", "a pointer (T > 0)", "null");
    if (t.v == nullptr) fail(K::invalid_value, "v", "a pointer (T > 0)", "null");
    if (problem.has_gate && t.g == nullptr) fail(K::invalid_value, "g", "a pointer (has_gate)", "null");
    if (problem.has_beta && t.beta == nullptr) fail(K::invalid_value, "beta", "a pointer (has_beta)", "null");
  }
  if (problem.has_initial_state && t.initial_state == nullptr)
    fail(K::invalid_value, "initial_state", "a pointer (has_initial_state)", "null");

  const int dk = s.dk, dv = s.dv;
  const DType dt = problem.qkv_dtype;
  std::vector<double>& S = final_state;  // S[i_k * dv + i_v], kv layout
  S.assign(static_cast<std::size_t>(dk) * dv, 0.0);
  if (problem.has_initial_state) {
    const float* init = t.initial_state + (seq * s.H + head) * s.state_elems();
    for (int i = 0; i < dk; ++i)
      for (int j = 0; j < dv; ++j)
        S[i * dv + j] = problem.state_layout == StateLayout::kv ? init[i * dv + j] : init[j * dk + i];
  }
  o.assign(static_cast<std::size_t>(len) * dv, 0.0);

  std::vector<double> q(dk), k(dk), v(dv), u(dv);
  const int hq = s.q_head(head), hk = s.k_head(head), hv = s.v_head(head);
  const double scale = s.scale;
  for (std::int64_t i = 0; i < len; ++i) {
    const std::int64_t tok = r.begin + i;
    for (int d = 0; d < dk; ++d) {
      q[d] = load_as_float(t.q, dt, tok * s.q.token + hq * s.q.head + d);
      k[d] = load_as_float(t.k, dt, tok * s.k.token + hk * s.k.head + d);
    }
    for (int d = 0; d < dv; ++d) v[d] = load_as_float(t.v, dt, tok * s.v.token + hv * s.v.head + d);
    double a = 1.0;
    if (problem.has_gate) {
      // The gate's documented floor (common/gate.h), otherwise exact: linear space holds alpha.
      const float g = t.g[tok * s.g.token + head * s.g.head];
      a = problem.gate_space == GateSpace::log ? std::exp(static_cast<double>(g < kLogGateFloor ? kLogGateFloor : g))
                                               : static_cast<double>(g < FLT_MIN ? FLT_MIN : g);
    }
    const double beta =
        problem.has_beta ? load_as_float(t.beta, problem.beta_dtype, tok * s.beta.token + head * s.beta.head)
                         : 1.0;
    // S = a S;  u = beta (v - S^T k);  S += k u^T;  o = scale S^T q.
    for (double& x : S) x *= a;
    for (int j = 0; j < dv; ++j) u[j] = 0.0;
    for (int d = 0; d < dk; ++d)
      for (int j = 0; j < dv; ++j) u[j] += S[d * dv + j] * k[d];
    for (int j = 0; j < dv; ++j) u[j] = beta * (v[j] - u[j]);
    for (int d = 0; d < dk; ++d)
      for (int j = 0; j < dv; ++j) S[d * dv + j] += k[d] * u[j];
    double* orow = o.data() + i * dv;
    for (int d = 0; d < dk; ++d)
      for (int j = 0; j < dv; ++j) orow[j] += S[d * dv + j] * q[d];
    for (int j = 0; j < dv; ++j) orow[j] *= scale;
  }
}

}  // namespace gdnkit::reference
