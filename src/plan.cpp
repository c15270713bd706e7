// Host planning: metadata checks, defaults, backend choice. No kernel code here.
#include <algorithm>
#include <climits>
#include <cstdint>
#include <cmath>
#include <cstring>
#include <memory>
#include <sstream>
#include <vector>

#include "common/half.h"
#include "common/host_stamps.h"
#include "common/shape.h"
#include "cpu/backend.h"
#include "cuda/backend.h"
#include "gdnkit/gdnkit.h"

namespace gdnkit {

using detail::fail;
using detail::Shape;

namespace detail {

void fail(Error::Kind kind, const std::string& argument, const std::string& expected,
          const std::string& got) {
  throw Error(kind, argument, argument + ": expected " + expected + ", got " + got);
}

namespace {

std::string str(std::int64_t x) { return std::to_string(x); }

// Resolves the strides of a [T, heads, dim] tensor; checks they are positive and that the offset
// of its last element stays below 2^60 elements (so byte offsets fit 64 bits, as the states' do).
Strides resolve_strides(const char* name, Strides s, std::int64_t T, int heads, int dim) {
  using K = Error::Kind;
  const std::string n(name);
  if (s.head < 0) fail(K::invalid_value, n + ".head stride", "0 (packed) or a positive stride", str(s.head));
  if (s.token < 0) fail(K::invalid_value, n + ".token stride", "0 (packed) or a positive stride", str(s.token));
  if (s.head == 0) s.head = dim;
  const std::int64_t limit = std::int64_t{1} << 60;
  if (s.token == 0 && (__builtin_mul_overflow(static_cast<std::int64_t>(heads), s.head, &s.token) || s.token >= limit))
    fail(K::invalid_value, n + ".head stride", "a stride whose packed token stride (" + str(heads) +
         " heads) stays below 2^60 elements", str(s.head));
  std::int64_t last = 0, heads_span = 0;
  if (T > 0 && (__builtin_mul_overflow(T - 1, s.token, &last) ||
                __builtin_mul_overflow(static_cast<std::int64_t>(heads - 1), s.head, &heads_span) ||
                __builtin_add_overflow(last, heads_span + dim, &last) || last >= limit))
    fail(K::invalid_value, n + " strides",
         "a last element offset below 2^60 elements over T=" + str(T) + " tokens and " + str(heads) + " heads",
         "token stride " + str(s.token) + ", head stride " + str(s.head));
  return s;
}

// An output must not write one element twice: the strided dimensions of more than one index, inner
// one first, must each step past everything the inner one covers. (A dimension of extent 1 takes
// no step: its stride is never used.)
void check_no_overlap(const char* name, Strides s, std::int64_t tokens, int heads, int dim) {
  struct Dim { std::int64_t stride, extent; const char* what; };
  Dim a{s.head, heads, "head"}, b{s.token, tokens, "token"};
  if (a.extent <= 1) std::swap(a, b);  // a: a dimension that steps, if any
  if (a.extent <= 1) return;           // one row at most
  if (b.extent > 1 && a.stride > b.stride) std::swap(a, b);
  if (a.stride < dim)
    fail(Error::Kind::invalid_value, std::string(name) + "." + a.what + " stride",
         "at least the head dim " + str(dim) + " (rows must not overlap)", str(a.stride));
  std::int64_t covered = 0;  // a.stride * a.extent, or more than any stride where that overflows
  if (__builtin_mul_overflow(a.stride, a.extent, &covered)) covered = INT64_MAX;
  if (b.extent > 1 && b.stride < covered)
    fail(Error::Kind::invalid_value, std::string(name) + "." + b.what + " stride",
         "at least " + str(covered) + " (rows must not overlap)", str(b.stride));
}

}  // namespace

Shape resolve_shape(const Problem& p) {
  using K = Error::Kind;
  Shape s;
  if (p.total_tokens < 0) fail(K::invalid_value, "total_tokens", "T >= 0", str(p.total_tokens));
  if (p.num_seqs < 1) fail(K::invalid_value, "num_seqs", "N >= 1", str(p.num_seqs));
  if (p.max_seq_len < 0 || p.max_seq_len > p.total_tokens)
    fail(K::invalid_value, "max_seq_len",
         p.total_tokens == 0 ? std::string("0 (T=0)")
                             : "0 (unknown) or a length in [1, T=" + str(p.total_tokens) + "]",
         str(p.max_seq_len));
  if (p.gate_space != GateSpace::log && p.gate_space != GateSpace::linear)
    fail(K::invalid_value, "gate_space", "log or linear", str(static_cast<int>(p.gate_space)));
  if (p.state_layout != StateLayout::kv && p.state_layout != StateLayout::vk)
    fail(K::invalid_value, "state_layout", "kv or vk", str(static_cast<int>(p.state_layout)));
  if (p.memory != Memory::host && p.memory != Memory::cuda)
    fail(K::invalid_value, "memory", "host or cuda", str(static_cast<int>(p.memory)));
  if (p.num_q_heads < 1) fail(K::invalid_value, "q", "at least 1 head", str(p.num_q_heads));
  if (p.num_k_heads < 1) fail(K::invalid_value, "k", "at least 1 head", str(p.num_k_heads));
  if (p.num_v_heads < 1) fail(K::invalid_value, "v", "at least 1 head", str(p.num_v_heads));
  const int Hq = p.num_q_heads, Hk = p.num_k_heads, Hv = p.num_v_heads;
  if (Hv >= Hq) {  // MHA or GVA: q and k heads are shared by groups of value heads
    const char* mode = Hv == Hq ? "MHA" : "GVA";
    if (Hk != Hq)
      fail(K::invalid_value, "k",
           std::to_string(Hq) + " heads for " + mode + " with Hq=" + std::to_string(Hq), str(Hk));
    if (Hv % Hq != 0)
      fail(K::invalid_value, "v", "a multiple of Hq=" + std::to_string(Hq) + " heads for GVA", str(Hv));
    s.H = Hv;
    s.q_group = s.k_group = Hv / Hq;
    s.v_group = 1;
  } else {  // GQA: k and v heads are shared by groups of q heads
    // Hk == Hq with fewer value heads reads as GVA with too few of them: say what GVA needs.
    if (Hk == Hq)
      fail(K::invalid_value, "v",
           "a multiple of Hq=" + std::to_string(Hq) + " heads for GVA with Hk=Hq (GQA needs Hk = Hv instead)",
           str(Hv));
    if (Hq % Hv != 0)
      fail(K::invalid_value, "q", "a multiple of Hv=" + std::to_string(Hv) + " heads for GQA", str(Hq));
    if (Hk != Hv)
      fail(K::invalid_value, "k",
           std::to_string(Hv) + " heads for GQA with Hv=" + std::to_string(Hv), str(Hk));
    s.H = Hq;
    s.q_group = 1;
    s.k_group = s.v_group = Hq / Hv;
  }
  s.Hq = Hq;
  s.Hk = Hk;
  s.Hv = Hv;
  if (p.head_dim_k < 16 || p.head_dim_k > 256)
    fail(K::invalid_value, "head_dim_k", "16..256", str(p.head_dim_k));
  if (p.head_dim_v < 16 || p.head_dim_v > 256)
    fail(K::invalid_value, "head_dim_v", "16..256", str(p.head_dim_v));
  s.dk = p.head_dim_k;
  s.dv = p.head_dim_v;
  s.T = p.total_tokens;
  s.N = p.num_seqs;
  // Every byte offset into the states (and the per-sequence scratch) must fit 64 bits.
  const std::int64_t max_seqs = (std::int64_t{1} << 60) / (static_cast<std::int64_t>(s.H) * s.dk * s.dv);
  if (p.num_seqs > max_seqs)
    fail(K::invalid_value, "num_seqs",
         "at most " + str(max_seqs) + " (N x H x dk x dv state floats under 2^60)", str(p.num_seqs));

  if (p.qkv_dtype != DType::bf16 && p.qkv_dtype != DType::f16)
    fail(K::invalid_type, "q", "dtype bf16 or f16 (shared by q, k, v, o)", to_string(p.qkv_dtype));
  if (p.has_beta && p.beta_dtype != DType::f32 && p.beta_dtype != DType::bf16 && p.beta_dtype != DType::f16)
    fail(K::invalid_type, "beta", "dtype f32, bf16 or f16", to_string(p.beta_dtype));
  if (p.has_cu_seqlens) {
    if (p.cu_seqlens_dtype != DType::i32 && p.cu_seqlens_dtype != DType::i64)
      fail(K::invalid_type, "cu_seqlens", "dtype i32 or i64", to_string(p.cu_seqlens_dtype));
    if (p.cu_seqlens_dtype == DType::i32 && p.total_tokens > INT32_MAX)
      fail(K::invalid_type, "cu_seqlens", "dtype i64 for T > 2^31-1", "i32");
  } else {
    if (p.total_tokens % p.num_seqs != 0)
      fail(K::invalid_value, "total_tokens",
           "a multiple of num_seqs=" + str(p.num_seqs) + " without cu_seqlens", str(p.total_tokens));
    s.uniform_len = p.total_tokens / p.num_seqs;
  }

  s.q = resolve_strides("q", p.q, s.T, Hq, s.dk);
  s.k = resolve_strides("k", p.k, s.T, Hk, s.dk);
  s.v = resolve_strides("v", p.v, s.T, Hv, s.dv);
  s.o = resolve_strides("o", p.o, s.T, s.H, s.dv);
  s.g = resolve_strides("g", p.g, s.T, s.H, 1);
  s.beta = resolve_strides("beta", p.beta, s.T, s.H, 1);
  check_no_overlap("o", s.o, s.T, s.H, s.dv);

  if (p.scale) {
    if (!std::isfinite(*p.scale)) fail(K::invalid_value, "scale", "a finite number", std::to_string(*p.scale));
    s.scale = *p.scale;
  } else {
    s.scale = 1.0f / std::sqrt(static_cast<float>(s.dk));
  }
  return s;
}

SeqRange host_seq_range(const Problem& p, const Shape& s, const void* cu, std::int64_t n) {
  if (!p.has_cu_seqlens) return {n * s.uniform_len, (n + 1) * s.uniform_len};
  return {load_index(cu, p.cu_seqlens_dtype, n), load_index(cu, p.cu_seqlens_dtype, n + 1)};
}

void check_cu_seqlens_host(const Problem& p, const Shape& s, const void* cu) {
  if (!p.has_cu_seqlens) return;
  const std::int64_t first = load_index(cu, p.cu_seqlens_dtype, 0);
  if (first != 0) fail(Error::Kind::invalid_value, "cu_seqlens[0]", "0", str(first));
  std::int64_t prev = 0;
  for (std::int64_t n = 1; n <= s.N; ++n) {
    const std::int64_t x = load_index(cu, p.cu_seqlens_dtype, n);
    if (x < prev)
      fail(Error::Kind::invalid_value, "cu_seqlens[" + str(n) + "]",
           "a non-decreasing value >= " + str(prev), str(x));
    prev = x;
  }
  if (prev != s.T)
    fail(Error::Kind::invalid_value, "cu_seqlens[" + str(s.N) + "]", "total_tokens=" + str(s.T), str(prev));
}

}  // namespace detail

struct PlanImpl {
  Problem problem;
  Options options;
  Shape shape;
  Backend backend = Backend::cpu;
  cpu::Config cpu;
  cuda::Config cuda;
  std::size_t workspace = 0;
};

Plan Plan::create(const Problem& problem, const Options& options) {
  auto impl = std::make_unique<PlanImpl>();
  impl->problem = problem;
  impl->options = options;
  impl->options.kernel = nullptr;  // the caller's string need not outlive the plan
  impl->shape = detail::resolve_shape(problem);
  if (!(options.split_decay_cutoff >= 0.0f && options.split_decay_cutoff < 1.0f))
    fail(Error::Kind::invalid_value, "options.split_decay_cutoff", "a value in [0, 1) (0: exact)",
         std::to_string(options.split_decay_cutoff));
  if (options.backend != Backend::automatic && options.backend != Backend::cpu && options.backend != Backend::cuda)
    fail(Error::Kind::invalid_value, "backend", "automatic, cpu or cuda", std::to_string(static_cast<int>(options.backend)));
  if (problem.memory == Memory::host) {
    if (options.backend == Backend::cuda)
      fail(Error::Kind::unsupported, "backend", "cpu or automatic for host memory", "cuda");
    if (options.kernel != nullptr && std::string(options.kernel) != "cpu-chunked-fp32")
      fail(Error::Kind::invalid_value, "options.kernel", "cpu-chunked-fp32 (the CPU backend's only kernel) or none",
           options.kernel);
    if (options.segments < 0)
      fail(Error::Kind::invalid_value, "options.segments", "0 (the planner decides), 1 (never split) or k >= 2",
           std::to_string(options.segments));
    if (options.segments >= 2)
      fail(Error::Kind::unsupported, "options.segments", "0 or 1 for the CPU backend (it does not split sequences)",
           std::to_string(options.segments));
    impl->backend = Backend::cpu;
    impl->cpu = cpu::plan(problem, impl->shape, options);
    impl->workspace = cpu::workspace_bytes(problem, impl->shape, impl->cpu);
  } else {
    if (options.backend == Backend::cpu)
      fail(Error::Kind::unsupported, "backend", "cuda or automatic for CUDA memory", "cpu");
    impl->backend = Backend::cuda;
    impl->cuda = cuda::plan(problem, impl->shape, options);
    impl->workspace = impl->cuda.workspace;
  }
  return Plan(impl.release());
}

Plan::Plan(PlanImpl* impl) : impl_(impl) {}
Plan::Plan(const Plan& other) : impl_(new PlanImpl(*other.impl_)) {}
Plan& Plan::operator=(const Plan& other) {
  if (this == &other) return *this;
  if (impl_ == nullptr)
    impl_ = new PlanImpl(*other.impl_);  // this one was moved from
  else
    *impl_ = *other.impl_;
  return *this;
}
Plan::Plan(Plan&& other) noexcept : impl_(other.impl_) { other.impl_ = nullptr; }
Plan& Plan::operator=(Plan&& other) noexcept {
  std::swap(impl_, other.impl_);
  return *this;
}
Plan::~Plan() {
#ifdef GDNKIT_HOST_STAMPS
  if (impl_ != nullptr) detail::host_stamps_report(impl_, kernel_name());
#endif
  delete impl_;
}

const Problem& Plan::problem() const noexcept { return impl_->problem; }
Backend Plan::backend() const noexcept { return impl_->backend; }
const char* Plan::kernel_name() const noexcept {
  return impl_->backend == Backend::cpu ? "cpu-chunked-fp32" : (impl_->cuda.name.empty() ? impl_->cuda.kernel : impl_->cuda.name.c_str());
}
std::size_t Plan::workspace_bytes() const noexcept { return impl_->workspace; }
int Plan::num_output_heads() const noexcept { return impl_->shape.H; }
float Plan::scale() const noexcept { return impl_->shape.scale; }

namespace {

void require(const void* ptr, const char* name, const char* why) {
  if (ptr == nullptr) fail(Error::Kind::invalid_value, name, std::string("a pointer (") + why + ")", "null");
}

void check_pointers(const Problem& p, const Tensors& t) {
  if (p.total_tokens > 0) {
    require(t.q, "q", "T > 0");
    require(t.k, "k", "T > 0");
    require(t.v, "v", "T > 0");
    require(t.o, "o", "T > 0");
    if (p.has_gate) require(t.g, "g", "has_gate");
    if (p.has_beta) require(t.beta, "beta", "has_beta");
  }
  if (p.has_cu_seqlens) require(t.cu_seqlens, "cu_seqlens", "has_cu_seqlens");
  if (p.has_initial_state) require(t.initial_state, "initial_state", "has_initial_state");
  if (p.want_final_state) require(t.final_state, "final_state", "want_final_state");
}

// The bytes a tensor of run() may touch: [begin, end) (empty for a null pointer or no elements);
// for a token-strided one also the pattern that repeats every `period` bytes from begin: `heads`
// runs of `width` bytes, `head` bytes apart.
struct Span {
  const char* name;
  std::uintptr_t begin = 0, end = 0;
  std::uintptr_t period = 0, head = 0, width = 0;  // period 0: every byte of [begin, end)
  int heads = 0;
};
Span span(const char* name, const void* ptr, std::int64_t elems_to_last, std::size_t elem_bytes) {
  if (ptr == nullptr || elems_to_last <= 0) return {name};
  const auto b = reinterpret_cast<std::uintptr_t>(ptr);
  return {name, b, b + static_cast<std::uintptr_t>(elems_to_last) * elem_bytes};
}
// [T, heads, dim] with strides s (elements of elem_bytes).
Span span(const char* name, const void* ptr, const Strides& s, std::int64_t T, int heads, int dim,
          std::size_t elem_bytes) {
  const std::int64_t row = static_cast<std::int64_t>(heads - 1) * s.head + dim;
  Span a = span(name, ptr, T == 0 ? 0 : (T - 1) * s.token + row, elem_bytes);
  if (T > 1 && row <= s.token) {
    a.period = static_cast<std::uintptr_t>(s.token) * elem_bytes;
    a.head = static_cast<std::uintptr_t>(s.head) * elem_bytes, a.width = static_cast<std::uintptr_t>(dim) * elem_bytes;
    a.heads = heads;
  }
  return a;
}
// Whether two spans may share a byte. Tensors of one token stride whose heads interleave without
// touching (views into one fused buffer, per token or per head) do not: every pair of head runs is
// compared modulo the period (a run fits in it). Sound, not exact: a pair may also be refused
// whose shared residues fall outside both token ranges.
bool overlap(const Span& a, const Span& b) {
  if (!(a.begin < b.end && b.begin < a.end)) return false;
  if (a.period == 0 || a.period != b.period) return true;
  if (static_cast<std::int64_t>(a.heads) * b.heads > (1 << 16)) return true;  // bounded host work
  const std::uintptr_t P = a.period;
  for (int i = 0; i < a.heads; ++i)
    for (int j = 0; j < b.heads; ++j) {
      const std::uintptr_t x = (a.begin + i * a.head) % P, y = (b.begin + j * b.head) % P;
      const std::uintptr_t d = (y + P - x) % P;  // b's run starts d into a's period
      if (d < a.width || d + b.width > P) return true;
    }
  return false;
}
std::string range_str(const Span& a) {
  std::ostringstream s;
  s << "[0x" << std::hex << a.begin << ", 0x" << a.end << ")";
  return s.str();
}

// What Tensors promises (gdnkit.h): no output overlaps an input, another output or the workspace,
// except final_state == initial_state exactly (an in-place update). Address arithmetic only.
void check_no_aliasing(const Problem& p, const Shape& s, const Tensors& t, const void* ws, std::size_t ws_bytes) {
  const std::size_t e = dtype_size(p.qkv_dtype);
  const std::int64_t states = s.N * s.H * s.state_elems();
  const Span q = span("q", t.q, s.q, s.T, s.Hq, s.dk, e);
  const Span k = span("k", t.k, s.k, s.T, s.Hk, s.dk, e);
  const Span v = span("v", t.v, s.v, s.T, s.Hv, s.dv, e);
  const Span g = span("g", p.has_gate ? t.g : nullptr, s.g, s.T, s.H, 1, 4);
  const Span beta = span("beta", p.has_beta ? t.beta : nullptr, s.beta, s.T, s.H, 1, dtype_size(p.beta_dtype));
  const Span cu = span("cu_seqlens", p.has_cu_seqlens ? t.cu_seqlens : nullptr, s.N + 1,
                       dtype_size(p.cu_seqlens_dtype));
  const Span h0 = span("initial_state", p.has_initial_state ? t.initial_state : nullptr, states, 4);
  const Span o = span("o", t.o, s.o, s.T, s.H, s.dv, e);
  const Span ht = span("final_state", p.want_final_state ? t.final_state : nullptr, states, 4);
  const Span w = span("workspace", ws, static_cast<std::int64_t>(ws_bytes), 1);
  const auto check = [](const Span& out, const Span& other) {
    if (overlap(out, other))
      fail(Error::Kind::invalid_value, out.name, std::string("no overlap with ") + other.name + " " + range_str(other),
           range_str(out));
  };
  for (const Span* x : {&q, &k, &v, &g, &beta, &cu, &h0, &ht, &w}) check(o, *x);
  for (const Span* x : {&q, &k, &v, &g, &beta, &cu, &w}) check(ht, *x);
  if (!(ht.begin == h0.begin && ht.end == h0.end)) check(ht, h0);
  for (const Span* x : {&q, &k, &v, &g, &beta, &cu, &h0}) check(w, *x);
}

}  // namespace

void Plan::run(const Tensors& t, void* workspace, std::size_t bytes, Stream stream) const {
  GDNKIT_HOST_STAMP(0);
  const PlanImpl& P = *impl_;
  check_pointers(P.problem, t);
  check_no_aliasing(P.problem, P.shape, t, workspace, P.workspace);
  if (bytes < P.workspace)
    fail(Error::Kind::invalid_value, "workspace_bytes", "at least " + std::to_string(P.workspace),
         std::to_string(bytes));
  if (P.workspace > 0 && workspace == nullptr)
    fail(Error::Kind::invalid_value, "workspace", "a pointer (workspace_bytes() > 0)", "null");
  GDNKIT_HOST_STAMP(1);
  if (P.backend == Backend::cpu)
    cpu::run(P.problem, P.shape, P.cpu, t, workspace);
  else
    cuda::run(P.problem, P.shape, P.cuda, t, workspace, stream);
#ifdef GDNKIT_HOST_STAMPS
  detail::host_stamp(7);
  detail::host_stamps_close(impl_);
#endif
}

void Plan::validate(const Tensors& t, Stream stream) const {
  const PlanImpl& P = *impl_;
  const Problem& p = P.problem;
  const Shape& s = P.shape;
  // Only what is read here must be present: validate() may run before the outputs exist.
  if (p.has_cu_seqlens) require(t.cu_seqlens, "cu_seqlens", "has_cu_seqlens");
  if (p.has_gate && s.T > 0) require(t.g, "g", "has_gate");
  // Host copies of what has to be looked at (only for device memory).
  std::vector<unsigned char> cu_copy;
  std::vector<float> g_rows;
  const void* cu = t.cu_seqlens;
  const std::size_t cu_bytes = static_cast<std::size_t>(s.N + 1) * dtype_size(p.cu_seqlens_dtype);
  if (p.memory == Memory::cuda && p.has_cu_seqlens) {
    cu_copy.resize(cu_bytes);
    cuda::copy_to_host(cu_copy.data(), t.cu_seqlens, cu_bytes, stream);
    cu = cu_copy.data();
  }
  detail::check_cu_seqlens_host(p, s, cu);
  if (!p.has_gate || s.T == 0) return;
  // Gates: read the strided [T, H] view; copy the covering span for device memory.
  const std::int64_t span = (s.T - 1) * s.g.token + (s.H - 1) * s.g.head + 1;
  const float* g = t.g;
  if (p.memory == Memory::cuda) {
    g_rows.resize(static_cast<std::size_t>(span));
    cuda::copy_to_host(g_rows.data(), t.g, static_cast<std::size_t>(span) * sizeof(float), stream);
    g = g_rows.data();
  }
  for (std::int64_t i = 0; i < s.T; ++i)
    for (int h = 0; h < s.H; ++h) {
      const float x = g[i * s.g.token + h * s.g.head];
      // A decay: log gates <= 0 (-inf a full decay, common/gate.h), linear gates in [0, 1]. A growing
      // gate overflows the chunk's cumulative decay exp(G) once G passes ~88, although the recurrence
      // itself may stay finite.
      const bool ok = p.gate_space == GateSpace::log ? x <= 0.0f : (x >= 0.0f && x <= 1.0f);
      if (!ok) {
        std::ostringstream where;
        where << "g[" << i << ", " << h << "]";
        fail(Error::Kind::invalid_value, where.str(),
             p.gate_space == GateSpace::log ? "a log-space gate <= 0 (or -inf)" : "a linear gate in [0, 1]",
             std::to_string(x));
      }
    }
}

const char* to_string(DType d) noexcept {
  switch (d) {
    case DType::f16: return "f16";
    case DType::bf16: return "bf16";
    case DType::f32: return "f32";
    case DType::i32: return "i32";
    case DType::i64: return "i64";
  }
  return "?";
}

const char* to_string(Backend b) noexcept {
  switch (b) {
    case Backend::automatic: return "automatic";
    case Backend::cpu: return "cpu";
    case Backend::cuda: return "cuda";
  }
  return "?";
}

const char* to_string(GateSpace g) noexcept {
  switch (g) {
    case GateSpace::log: return "log";
    case GateSpace::linear: return "linear";
  }
  return "?";
}

const char* to_string(StateLayout l) noexcept {
  switch (l) {
    case StateLayout::kv: return "kv";
    case StateLayout::vk: return "vk";
  }
  return "?";
}

std::size_t dtype_size(DType d) noexcept {
  switch (d) {
    case DType::f16:
    case DType::bf16: return 2;
    case DType::f32:
    case DType::i32: return 4;
    case DType::i64: return 8;
  }
  return 0;
}

bool cuda_available() noexcept { return cuda::device_available(); }

}  // namespace gdnkit
