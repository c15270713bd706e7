// Shared test helpers: a random host problem with buffers for every tensor (strided, with guard
// elements around every output), realistic or hard input values, the fp64 oracle over every
// (sequence, head), and a comparison that checks every output element was written, nothing else
// was, and reports relative L2 errors. Header-only, no GoogleTest dependency, so CPU and GPU
// suites (and tools) can share it.
#pragma once

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "common/half.h"
#include "common/shape.h"
#include "gdnkit/gdnkit.h"
#include "gdnkit/reference.h"

namespace gdnkit::test {

// What the input values look like.
enum class Inputs {
  realistic,  // q, k L2-normalised per head; v ~ randn; g = logsigmoid(randn); beta = sigmoid(randn)
  hard,       // as realistic, but g in (-1e-3, 0] (almost no decay) and beta in [0.99, 1]
  resets,     // as hard, but about one gate in 40 a reset-style value: -1e4, -1e30, -FLT_MAX, -inf,
              // -200 or -80 in log space; 0, 1e-45 (subnormal) or 1e-30 in linear space
};

// Everything that describes one test case. Defaults: MHA, 2 heads, 64/64, bf16, packed.
struct Spec {
  std::vector<std::int64_t> lens{100};  // sequence lengths (all equal when !cu_seqlens)
  bool cu_seqlens = true;                // false: the uniform [B, L] mode
  int Hq = 2, Hk = 2, Hv = 2;
  int dk = 64, dv = 64;
  DType qkv = DType::bf16;
  DType beta_dtype = DType::f32;
  DType cu_dtype = DType::i32;
  bool has_gate = true, has_beta = true, initial_state = false, final_state = true;
  GateSpace gate_space = GateSpace::log;
  StateLayout layout = StateLayout::kv;
  bool in_place = false;  // final_state is the initial_state buffer
  std::optional<float> scale;
  // Input layout: q/k/v as slices of one fused [T, Hq*dk + Hk*dk + Hv*dv] buffer, and padding
  // (filled with NaN, so a misplaced read shows) between heads and at the end of each token row.
  bool fused_qkv = false;
  int in_head_pad = 0, in_token_pad = 0;  // q, k, v, g, beta
  int o_head_pad = 0, o_token_pad = 0;
  Inputs inputs = Inputs::realistic;
  std::uint64_t seed = 1;

  int H() const { return std::max(Hq, Hv); }
  std::int64_t T() const {
    std::int64_t t = 0;
    for (auto l : lens) t += l;
    return t;
  }
  std::string describe() const {
    std::ostringstream s;
    s << "seed=" << seed << " N=" << lens.size() << " T=" << T() << " lens=[";
    for (std::size_t i = 0; i < lens.size() && i < 12; ++i) s << (i ? "," : "") << lens[i];
    if (lens.size() > 12) s << ",...";
    s << "] cu_seqlens=" << (cu_seqlens ? to_string(cu_dtype) : "none") << " heads=" << Hq << "/" << Hk << "/"
      << Hv << " dk=" << dk << " dv=" << dv << " qkv=" << to_string(qkv) << " beta=" << to_string(beta_dtype)
      << " gate=" << has_gate << "(" << to_string(gate_space) << ") has_beta=" << has_beta
      << " init=" << initial_state << " final=" << final_state << " layout=" << to_string(layout)
      << " in_place=" << in_place << " fused=" << fused_qkv << " in_pad=" << in_head_pad << "/" << in_token_pad
      << " o_pad=" << o_head_pad << "/" << o_token_pad << " inputs="
      << (inputs == Inputs::hard ? "hard" : inputs == Inputs::resets ? "resets" : "realistic");
    if (scale) s << " scale=" << *scale;
    return s.str();
  }
};

// A split (context-parallel) test's case: the lengths (packed with cu_seqlens, else equal),
// Hq = Hk = hqk query/key heads shared by hv value heads, head dims dk and dv.
inline Spec split_case(std::vector<std::int64_t> lens, bool cu, int hqk, int hv, int dk, int dv, std::uint64_t seed) {
  Spec s;
  s.lens = std::move(lens);
  s.cu_seqlens = cu;
  s.Hq = s.Hk = hqk;
  s.Hv = hv;
  s.dk = dk;
  s.dv = dv;
  s.seed = seed;
  return s;
}

// A buffer with `kGuard` sentinel elements before and after the payload.
template <typename T>
struct Guarded {
  static constexpr std::size_t kGuard = 64;
  std::vector<T> buf;
  std::size_t n = 0;
  T sentinel{};

  void init(std::size_t count, T fill) {
    n = count;
    sentinel = fill;
    buf.assign(count + 2 * kGuard, fill);
  }
  T* data() { return buf.data() + kGuard; }
  const T* data() const { return buf.data() + kGuard; }
  bool guards_intact() const {
    for (std::size_t i = 0; i < kGuard; ++i)
      if (!same_bits(buf[i], sentinel) || !same_bits(buf[kGuard + n + i], sentinel)) return false;
    return true;
  }
  static bool same_bits(const T& a, const T& b) { return std::memcmp(&a, &b, sizeof(T)) == 0; }
};

inline float bits_to_float(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline std::uint32_t float_bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// Bit patterns: poison marks elements that must be written (a quiet NaN with a payload no
// arithmetic produces); sentinel marks elements that must not be.
constexpr std::uint16_t kPoison16 = 0x7fa5;  // NaN as bf16 and as f16
constexpr std::uint32_t kPoison32 = 0x7fc0a5a5u;
constexpr std::uint16_t kSentinel16 = 0x5a3c;
constexpr std::uint32_t kSentinel32 = 0x4b5a3c1eu;
constexpr std::uint16_t kNaN16 = 0x7fc0;  // bf16 NaN, also NaN as f16

// A host problem and all its buffers.
struct Case {
  Spec spec;
  Problem problem;
  detail::Shape shape;
  std::vector<std::int64_t> starts;  // N + 1 prefix sums of spec.lens

  std::vector<std::uint16_t> qkv;  // q, k and v (one region each, or interleaved when fused)
  std::int64_t q_off = 0, k_off = 0, v_off = 0;
  std::vector<float> g;
  std::vector<float> beta32;
  std::vector<std::uint16_t> beta16;
  std::vector<std::int32_t> cu32;
  std::vector<std::int64_t> cu64;
  Guarded<float> init;  // initial state (also the final state when in_place)
  Guarded<std::uint16_t> o;
  Guarded<float> fin;

  std::int64_t N() const { return static_cast<std::int64_t>(spec.lens.size()); }
  std::int64_t state_elems() const { return N() * shape.H * shape.state_elems(); }

  Tensors tensors() {
    Tensors t;
    t.q = qkv.data() + q_off;
    t.k = qkv.data() + k_off;
    t.v = qkv.data() + v_off;
    t.g = spec.has_gate ? g.data() : nullptr;
    t.beta = !spec.has_beta ? nullptr
             : spec.beta_dtype == DType::f32 ? static_cast<const void*>(beta32.data())
                                             : static_cast<const void*>(beta16.data());
    t.cu_seqlens = !spec.cu_seqlens ? nullptr
                   : spec.cu_dtype == DType::i64 ? static_cast<const void*>(cu64.data())
                                                 : static_cast<const void*>(cu32.data());
    t.initial_state = spec.initial_state ? init.data() : nullptr;
    t.o = o.data();
    t.final_state = !spec.final_state ? nullptr : spec.in_place ? init.data() : fin.data();
    return t;
  }

  // Offsets of the elements every output must have written.
  template <typename F>
  void for_each_o(F&& f) const {
    for (std::int64_t t = 0; t < shape.T; ++t)
      for (int h = 0; h < shape.H; ++h)
        for (int d = 0; d < shape.dv; ++d) f(t, h, d, t * shape.o.token + h * shape.o.head + d);
  }

  // Marks every element the run must write with poison (everything else holds the sentinel).
  void poison_outputs() {
    std::fill(o.buf.begin(), o.buf.end(), kSentinel16);
    for_each_o([&](std::int64_t, int, int, std::int64_t i) { o.data()[i] = kPoison16; });
    if (spec.final_state && !spec.in_place) {
      std::fill(fin.buf.begin(), fin.buf.end(), bits_to_float(kSentinel32));
      for (std::int64_t i = 0; i < state_elems(); ++i) fin.data()[i] = bits_to_float(kPoison32);
    }
  }
};

// Allocates the buffers of a spec (values: inputs zero, input padding NaN, outputs poisoned).
inline Case make_case(const Spec& spec) {
  Case c;
  c.spec = spec;
  Problem& p = c.problem;
  const std::int64_t T = spec.T();
  const std::int64_t N = static_cast<std::int64_t>(spec.lens.size());
  p.total_tokens = T;
  p.num_seqs = N;
  p.num_q_heads = spec.Hq;
  p.num_k_heads = spec.Hk;
  p.num_v_heads = spec.Hv;
  p.head_dim_k = spec.dk;
  p.head_dim_v = spec.dv;
  p.qkv_dtype = spec.qkv;
  p.beta_dtype = spec.beta_dtype;
  p.cu_seqlens_dtype = spec.cu_dtype;
  p.has_cu_seqlens = spec.cu_seqlens;
  p.scale = spec.scale;
  p.has_gate = spec.has_gate;
  p.has_beta = spec.has_beta;
  p.has_initial_state = spec.initial_state;
  p.want_final_state = spec.final_state;
  p.gate_space = spec.gate_space;
  p.state_layout = spec.layout;
  p.memory = Memory::host;
  const int H = spec.H(), hp = spec.in_head_pad, tp = spec.in_token_pad;

  // q, k, v: head stride dim + pad; fused: one row holds all three.
  const std::int64_t qw = static_cast<std::int64_t>(spec.Hq) * (spec.dk + hp);
  const std::int64_t kw = static_cast<std::int64_t>(spec.Hk) * (spec.dk + hp);
  const std::int64_t vw = static_cast<std::int64_t>(spec.Hv) * (spec.dv + hp);
  p.q.head = p.k.head = spec.dk + hp;
  p.v.head = spec.dv + hp;
  if (spec.fused_qkv) {
    p.q.token = p.k.token = p.v.token = qw + kw + vw + tp;
    c.q_off = 0;
    c.k_off = qw;
    c.v_off = qw + kw;
    c.qkv.assign(static_cast<std::size_t>(T * p.q.token), kNaN16);
  } else {
    p.q.token = qw + tp;
    p.k.token = kw + tp;
    p.v.token = vw + tp;
    c.q_off = 0;
    c.k_off = T * p.q.token;
    c.v_off = c.k_off + T * p.k.token;
    c.qkv.assign(static_cast<std::size_t>(c.v_off + T * p.v.token), kNaN16);
  }
  p.g.head = p.beta.head = 1 + hp;
  p.g.token = p.beta.token = static_cast<std::int64_t>(H) * (1 + hp) + tp;
  p.o.head = spec.dv + spec.o_head_pad;
  p.o.token = static_cast<std::int64_t>(H) * p.o.head + spec.o_token_pad;
  // Leave strides 0 (packed) where they equal the packed default, so both paths get exercised.
  auto pack = [](Strides& s, std::int64_t head, std::int64_t token) {
    if (s.head == head && s.token == token) s = Strides{};
  };
  pack(p.q, spec.dk, qw);
  pack(p.k, spec.dk, kw);
  pack(p.v, spec.dv, vw);
  pack(p.g, 1, H);
  pack(p.beta, 1, H);
  pack(p.o, spec.dv, static_cast<std::int64_t>(H) * spec.dv);

  c.shape = detail::resolve_shape(p);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  c.g.assign(static_cast<std::size_t>(T * c.shape.g.token), nan);
  if (spec.beta_dtype == DType::f32)
    c.beta32.assign(static_cast<std::size_t>(T * c.shape.beta.token), nan);
  else
    c.beta16.assign(static_cast<std::size_t>(T * c.shape.beta.token), kNaN16);
  c.starts.assign(1, 0);
  for (auto l : spec.lens) c.starts.push_back(c.starts.back() + l);
  for (auto x : c.starts) {
    c.cu32.push_back(static_cast<std::int32_t>(x));
    c.cu64.push_back(x);
  }
  c.init.init(static_cast<std::size_t>(c.state_elems()), bits_to_float(kSentinel32));
  c.o.init(static_cast<std::size_t>(T > 0 ? T * c.shape.o.token : 0), kSentinel16);
  c.fin.init(static_cast<std::size_t>(c.state_elems()), bits_to_float(kSentinel32));
  c.poison_outputs();
  return c;
}

inline std::uint16_t to_qkv(float x, DType dt) {
  return dt == DType::bf16 ? detail::float_to_bf16(x) : detail::float_to_fp16(x);
}

// Fills the inputs with values of the spec's kind (fresh random numbers from spec.seed).
inline void fill_inputs(Case& c) {
  const Spec& sp = c.spec;
  const detail::Shape& s = c.shape;
  std::mt19937_64 rng(sp.seed * 0x9e3779b97f4a7c15ull + 12345);
  std::normal_distribution<double> randn(0.0, 1.0);
  std::uniform_real_distribution<double> unif(0.0, 1.0);
  const bool hard = sp.inputs == Inputs::hard || sp.inputs == Inputs::resets;
  const float log_resets[] = {-1e4f, -1e30f, -FLT_MAX, -INFINITY, -200.0f, -80.0f};
  const float linear_resets[] = {0.0f, 1e-45f, 1e-30f};
  int next_reset = 0;
  std::vector<double> row(static_cast<std::size_t>(std::max(s.dk, s.dv)));
  auto write_heads = [&](std::int64_t off, Strides st, int heads, int dim, bool normalise) {
    for (std::int64_t t = 0; t < s.T; ++t)
      for (int h = 0; h < heads; ++h) {
        double norm = 0.0;
        for (int d = 0; d < dim; ++d) {
          row[d] = randn(rng);
          norm += row[d] * row[d];
        }
        const double f = normalise ? 1.0 / std::sqrt(norm) : 1.0;
        for (int d = 0; d < dim; ++d)
          c.qkv[static_cast<std::size_t>(off + t * st.token + h * st.head + d)] =
              to_qkv(static_cast<float>(row[d] * f), sp.qkv);
      }
  };
  write_heads(c.q_off, s.q, s.Hq, s.dk, true);
  write_heads(c.k_off, s.k, s.Hk, s.dk, true);
  write_heads(c.v_off, s.v, s.Hv, s.dv, false);
  for (std::int64_t t = 0; t < s.T; ++t)
    for (int h = 0; h < s.H; ++h) {
      const double x = randn(rng);
      double g = hard ? -1e-3 * unif(rng) : -std::log1p(std::exp(-x));  // logsigmoid
      if (sp.gate_space == GateSpace::linear) g = std::exp(g);
      float gf = static_cast<float>(g);
      if (sp.inputs == Inputs::resets && unif(rng) < 1.0 / 40) {
        gf = sp.gate_space == GateSpace::linear ? linear_resets[next_reset % 3] : log_resets[next_reset % 6];
        ++next_reset;
      }
      c.g[static_cast<std::size_t>(t * s.g.token + h * s.g.head)] = gf;
      const double y = randn(rng);
      const float b = static_cast<float>(hard ? 1.0 - 0.01 * unif(rng) : 1.0 / (1.0 + std::exp(-y)));
      const std::size_t bi = static_cast<std::size_t>(t * s.beta.token + h * s.beta.head);
      if (sp.beta_dtype == DType::f32)
        c.beta32[bi] = b;
      else
        c.beta16[bi] = to_qkv(b, sp.beta_dtype);
    }
  for (std::int64_t i = 0; i < c.state_elems(); ++i) c.init.data()[i] = static_cast<float>(randn(rng));
}

inline Case random_case(const Spec& spec) {
  Case c = make_case(spec);
  fill_inputs(c);
  return c;
}

// cu_seqlens for three sequences of T tokens in all that Plan::run does not check (Plan::validate
// does): decreasing, negative, past T, i64 values beyond 32 bits, every sequence past T.
inline std::vector<std::vector<std::int64_t>> invalid_cu_seqlens(std::int64_t T) {
  return {{0, T + 670, 10, T}, {-50, 100, 90, T + 4000}, {0, T, T, -7}, {0, 1LL << 40, -(1LL << 40), T},
          {T + 70, T + 80, T + 90, T + 100}};
}
// A random case of spec (three sequences) whose cu_seqlens holds cu instead: i64 where a value needs
// it or i64 is asked for, else i32.
inline Case case_with_cu_seqlens(Spec spec, const std::vector<std::int64_t>& cu, bool i64) {
  for (std::int64_t x : cu) i64 = i64 || x != static_cast<std::int32_t>(x);
  spec.cu_dtype = i64 ? DType::i64 : DType::i32;
  Case c = random_case(spec);
  for (std::size_t n = 0; n < cu.size() && n < c.cu64.size(); ++n) {
    c.cu64[n] = cu[n];
    c.cu32[n] = static_cast<std::int32_t>(cu[n]);
  }
  return c;
}

// The fp64 oracle over every (sequence, head), packed: o [T, H, dv], state [N, H, dk, dv] (kv).
struct Reference {
  std::vector<double> o;
  std::vector<double> state;
};

inline Reference run_reference(Case& c) {
  const detail::Shape& s = c.shape;
  Reference r;
  r.o.assign(static_cast<std::size_t>(s.T * s.H * s.dv), 0.0);
  r.state.assign(static_cast<std::size_t>(c.state_elems()), 0.0);
  const Tensors t = c.tensors();
  std::vector<double> o, st;
  for (std::int64_t n = 0; n < c.N(); ++n)
    for (int h = 0; h < s.H; ++h) {
      reference::recurrence(c.problem, t, n, h, o, st);
      for (std::int64_t i = 0; i < c.starts[n + 1] - c.starts[n]; ++i)
        std::copy_n(o.data() + i * s.dv, s.dv, r.o.data() + ((c.starts[n] + i) * s.H + h) * s.dv);
      std::copy(st.begin(), st.end(), r.state.begin() + (n * s.H + h) * s.state_elems());
    }
  return r;
}

// ||x - ref|| / ||ref|| accumulated over pairs; infinite when x holds NaN or inf (so NaN never
// passes a "<" test); when ref is all zero, the absolute ||x||.
struct RelL2 {
  double err2 = 0.0, ref2 = 0.0;
  bool finite = true;
  void add(double x, double ref) {
    if (!std::isfinite(x)) finite = false;
    err2 += (x - ref) * (x - ref);
    ref2 += ref * ref;
  }
  double value() const {
    if (!finite || !std::isfinite(err2)) return std::numeric_limits<double>::infinity();
    return ref2 > 0.0 ? std::sqrt(err2 / ref2) : std::sqrt(err2);
  }
};

inline double rel_l2(const std::vector<double>& x, const std::vector<double>& ref) {
  RelL2 r;
  for (std::size_t i = 0; i < x.size(); ++i) r.add(x[i], ref[i]);
  return r.value();
}

struct Errors {
  double o = 0, o_worst = 0;          // rel L2 over all of o; worst over (sequence, head)
  double state = 0, state_worst = 0;  // the same for the final state
  double state_max = 0;               // worst (seq, head) of max |x - ref| / max |ref| of the state
  double o_rounded = 0;               // rel L2 of o against the oracle rounded to o's dtype
  std::int64_t o_count = 0;           // elements of o
  std::string issues;                 // empty, or what was not written / written where it must not be
  std::string str() const {
    std::ostringstream s;
    s << "o rel L2 " << o << " (worst seq/head " << o_worst << ", vs rounded oracle " << o_rounded
      << "), state rel L2 " << state << " (worst " << state_worst << ", max abs / max " << state_max << ")";
    if (!issues.empty()) s << "; " << issues;
    return s.str();
  }
};

// The run's outputs as packed doubles: o [T, H, dv] and final state [N, H, dk, dv] (kv layout).
inline std::vector<double> gather_o(const Case& c) {
  const detail::Shape& s = c.shape;
  std::vector<double> out(static_cast<std::size_t>(s.T * s.H * s.dv));
  c.for_each_o([&](std::int64_t t, int h, int d, std::int64_t i) {
    out[static_cast<std::size_t>((t * s.H + h) * s.dv + d)] = detail::load_as_float(c.o.data(), c.spec.qkv, i);
  });
  return out;
}

inline std::vector<double> gather_state(const Case& c) {
  const detail::Shape& s = c.shape;
  const float* f = c.spec.in_place ? c.init.data() : c.fin.data();
  std::vector<double> out(static_cast<std::size_t>(c.state_elems()));
  for (std::int64_t nh = 0; nh < c.N() * s.H; ++nh)
    for (int i = 0; i < s.dk; ++i)
      for (int j = 0; j < s.dv; ++j)
        out[static_cast<std::size_t>(nh * s.state_elems() + i * s.dv + j)] =
            f[nh * s.state_elems() + (c.spec.layout == StateLayout::kv ? i * s.dv + j : j * s.dk + i)];
  return out;
}

// Compares a finished run with the oracle; also checks poison, sentinels and guards.
inline Errors compare(const Case& c, const Reference& ref) {
  const detail::Shape& s = c.shape;
  Errors e;
  std::ostringstream issues;
  // Every o element written (no poison left, finite), nothing else touched.
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
  if (!c.spec.final_state || c.spec.in_place) {
    for (std::size_t i = 0; i < c.fin.buf.size(); ++i)
      if (float_bits(c.fin.buf[i]) != kSentinel32 && float_bits(c.fin.buf[i]) != kPoison32) {
        issues << "final_state written although not wanted; ";
        break;
      }
  }

  const std::vector<double> o = gather_o(c);
  RelL2 all, rounded;
  for (std::int64_t n = 0; n < c.N(); ++n)
    for (int h = 0; h < s.H; ++h) {
      RelL2 one;
      for (std::int64_t t = c.starts[n]; t < c.starts[n + 1]; ++t)
        for (int d = 0; d < s.dv; ++d) {
          const std::size_t i = static_cast<std::size_t>((t * s.H + h) * s.dv + d);
          one.add(o[i], ref.o[i]);
          all.add(o[i], ref.o[i]);
          const std::uint16_t r16 = to_qkv(static_cast<float>(ref.o[i]), c.spec.qkv);
          rounded.add(o[i], detail::load_as_float(&r16, c.spec.qkv, 0));
        }
      e.o_worst = std::max(e.o_worst, one.value());
    }
  e.o = all.value();
  e.o_rounded = rounded.value();
  e.o_count = static_cast<std::int64_t>(o.size());
  if (c.spec.final_state) {
    const std::vector<double> st = gather_state(c);
    RelL2 sall;
    for (std::int64_t nh = 0; nh < c.N() * s.H; ++nh) {
      RelL2 one;
      double max_err = 0.0, max_ref = 0.0;
      for (std::int64_t i = nh * s.state_elems(); i < (nh + 1) * s.state_elems(); ++i) {
        const double x = st[static_cast<std::size_t>(i)], r = ref.state[static_cast<std::size_t>(i)];
        one.add(x, r);
        sall.add(x, r);
        max_err = std::isfinite(x) ? std::max(max_err, std::abs(x - r)) : std::numeric_limits<double>::infinity();
        max_ref = std::max(max_ref, std::abs(r));
      }
      e.state_worst = std::max(e.state_worst, one.value());
      e.state_max = std::max(e.state_max, max_ref > 0.0 ? max_err / max_ref : max_err);
    }
    e.state = sall.value();
  }
  e.issues = issues.str();
  return e;
}

// A case holding tokens [from[n], to[n]) of every sequence n of `full` (same heads, options and
// values; packed afresh with full's layout options). Used to split sequences for continuation.
inline Case sub_case(const Case& full, const std::vector<std::int64_t>& from, const std::vector<std::int64_t>& to) {
  Spec spec = full.spec;
  for (std::size_t n = 0; n < spec.lens.size(); ++n) spec.lens[n] = to[n] - from[n];
  Case c = make_case(spec);
  const detail::Shape& fs = full.shape;
  const detail::Shape& s = c.shape;
  for (std::int64_t n = 0; n < c.N(); ++n)
    for (std::int64_t i = 0; i < spec.lens[static_cast<std::size_t>(n)]; ++i) {
      const std::int64_t src = full.starts[n] + from[static_cast<std::size_t>(n)] + i, dst = c.starts[n] + i;
      auto copy = [&](std::int64_t soff, Strides ss, std::int64_t doff, Strides ds, int heads, int dim) {
        for (int h = 0; h < heads; ++h)
          for (int d = 0; d < dim; ++d)
            c.qkv[static_cast<std::size_t>(doff + dst * ds.token + h * ds.head + d)] =
                full.qkv[static_cast<std::size_t>(soff + src * ss.token + h * ss.head + d)];
      };
      copy(full.q_off, fs.q, c.q_off, s.q, s.Hq, s.dk);
      copy(full.k_off, fs.k, c.k_off, s.k, s.Hk, s.dk);
      copy(full.v_off, fs.v, c.v_off, s.v, s.Hv, s.dv);
      for (int h = 0; h < s.H; ++h) {
        c.g[static_cast<std::size_t>(dst * s.g.token + h * s.g.head)] =
            full.g[static_cast<std::size_t>(src * fs.g.token + h * fs.g.head)];
        const std::size_t bd = static_cast<std::size_t>(dst * s.beta.token + h * s.beta.head);
        const std::size_t bs = static_cast<std::size_t>(src * fs.beta.token + h * fs.beta.head);
        if (spec.beta_dtype == DType::f32)
          c.beta32[bd] = full.beta32[bs];
        else
          c.beta16[bd] = full.beta16[bs];
      }
    }
  std::copy_n(full.init.data(), full.state_elems(), c.init.data());
  return c;
}

// Runs a host plan with a workspace of exactly workspace_bytes() (deliberately misaligned by one
// byte when `misalign`, to prove the backend aligns for itself). The workspace starts as all-ones
// bytes, a NaN in every float, so scratch read before it is written poisons the result.
inline void run_host(Case& c, const Options& options = {}, bool misalign = false) {
  const Plan plan = Plan::create(c.problem, options);
  const std::size_t bytes = plan.workspace_bytes();
  std::vector<unsigned char> ws(bytes + 64, 0xff);
  unsigned char* p = ws.data() + (misalign ? 1 : 0);
  plan.run(c.tensors(), bytes ? p : nullptr, bytes);
}

// ---- random sweeps -----------------------------------------------------------------------------

template <typename T>
T pick(std::mt19937_64& rng, std::initializer_list<T> xs) {
  return *(xs.begin() + std::uniform_int_distribution<std::size_t>(0, xs.size() - 1)(rng));
}
template <typename T>
T pick(std::mt19937_64& rng, const std::vector<T>& xs) {  // the same draw as the list form
  return xs[std::uniform_int_distribution<std::size_t>(0, xs.size() - 1)(rng)];
}
inline bool coin(std::mt19937_64& rng, double p = 0.5) { return std::uniform_real_distribution<double>(0, 1)(rng) < p; }

// What a random sweep draws from (the CUDA backend takes fewer head dims and aligned strides).
struct SweepChoices {
  std::vector<int> dk, dv;
  std::int64_t short_max;                   // random lengths are 1..short_max (1..40 for N > 10)
  std::int64_t long_len;                    // with N <= 2, a sequence is this long with long_p
  double long_p;
  std::vector<std::int64_t> uniform_lens;   // lengths without cu_seqlens
  std::vector<int> in_head_pad, in_token_pad, o_head_pad, o_token_pad;
};

// The option flags of an "all options" case from six bits: gate, beta, initial state, final state,
// linear gate space, [dv, dk] state layout (every suite runs all 64 combinations).
inline void set_option_bits(Spec& s, int bits) {
  s.has_gate = bits & 1;
  s.has_beta = bits & 2;
  s.initial_state = bits & 4;
  s.final_state = bits & 8;
  s.gate_space = bits & 16 ? GateSpace::linear : GateSpace::log;
  s.layout = bits & 32 ? StateLayout::vk : StateLayout::kv;
}

// A varlen case (an empty sequence among them) whose q, k, v are slices of one fused projection
// buffer or separate, with head and token strides padded by `pad` elements, and o padded too.
inline Spec strides_spec(bool fused, int pad, std::uint64_t seed) {
  Spec s;
  s.lens = {130, 0, 17};
  s.Hq = s.Hk = 2;
  s.Hv = 4;
  s.dk = 128;
  s.dv = 64;
  s.fused_qkv = fused;
  s.in_head_pad = pad;
  s.in_token_pad = 2 * pad + 8;
  s.o_head_pad = pad;
  s.o_token_pad = 64 - pad;
  s.beta_dtype = pad == 8 ? DType::bf16 : DType::f32;
  s.initial_state = true;
  s.seed = seed;
  return s;
}

// The chunk-border case every suite runs for a few lengths L (shorter than, exactly, just over
// one chunk, several chunks): one sequence, heads 1/1/2, dk = dv = 128, an initial state.
inline Spec chunk_border_spec(DType qkv, std::int64_t L) {
  Spec s;
  s.lens = {L};
  s.Hq = s.Hk = 1;
  s.Hv = 2;
  s.dk = s.dv = 128;
  s.qkv = qkv;
  s.initial_state = true;
  s.seed = 10 + static_cast<std::uint64_t>(L);
  return s;
}

// A random case whose oracle costs at most ~budget multiply-adds of T * H * dk * dv.
inline Spec random_spec(std::uint64_t seed, double budget, const SweepChoices& c) {
  std::mt19937_64 rng(seed);
  Spec s;
  s.seed = seed;
  for (;;) {
    // Heads: MHA, GVA or GQA with ratio 2 or 4.
    const int mode = pick(rng, {0, 1, 2});
    const int base = pick(rng, {1, 2});
    const int r = mode == 0 ? 1 : pick(rng, {2, 4});
    s.Hq = s.Hk = s.Hv = base;
    if (mode == 1) s.Hv = r * base;                  // GVA
    if (mode == 2) s.Hq = r * base;                  // GQA
    if (mode == 0) s.Hq = s.Hk = s.Hv = pick(rng, {1, 2, 3});
    s.dk = pick(rng, c.dk);
    s.dv = pick(rng, c.dv);
    s.cu_seqlens = !coin(rng, 0.2);
    s.lens.clear();
    if (s.cu_seqlens) {
      const int N = pick(rng, {1, 2, 3, 5, 8, 17, 50});
      for (int i = 0; i < N; ++i) {
        const int kind = std::uniform_int_distribution<int>(0, 9)(rng);
        std::int64_t L = kind == 0 ? 0 : kind == 1 ? 1 : kind == 2 ? pick(rng, {63, 64, 65, 128})
                                       : std::uniform_int_distribution<std::int64_t>(1, N > 10 ? 40 : c.short_max)(rng);
        if (N <= 2 && coin(rng, c.long_p)) L = c.long_len;
        s.lens.push_back(L);
      }
      s.cu_dtype = pick(rng, {DType::i32, DType::i64});
    } else {
      const int N = pick(rng, {1, 2, 3, 4});
      s.lens.assign(N, pick(rng, c.uniform_lens));
    }
    const double cost = static_cast<double>(s.T()) * s.H() * s.dk * s.dv;
    if (cost <= budget) break;
  }
  s.qkv = pick(rng, {DType::bf16, DType::f16});
  s.beta_dtype = pick(rng, {DType::f32, DType::bf16, DType::f16});
  s.has_gate = coin(rng, 0.85);
  s.has_beta = coin(rng, 0.85);
  s.initial_state = coin(rng);
  s.final_state = coin(rng, 0.7);
  s.gate_space = pick(rng, {GateSpace::log, GateSpace::linear});
  s.layout = pick(rng, {StateLayout::kv, StateLayout::vk});
  s.in_place = s.initial_state && s.final_state && coin(rng, 0.3);
  s.fused_qkv = coin(rng, 0.3);
  if (coin(rng, 0.3)) {
    s.in_head_pad = pick(rng, c.in_head_pad);
    s.in_token_pad = pick(rng, c.in_token_pad);
  }
  if (coin(rng, 0.3)) {
    s.o_head_pad = pick(rng, c.o_head_pad);
    s.o_token_pad = pick(rng, c.o_token_pad);
  }
  s.inputs = coin(rng, 0.2) ? Inputs::hard : Inputs::realistic;
  if (coin(rng, 0.1)) s.scale = 0.37f;
  return s;
}

}  // namespace gdnkit::test
