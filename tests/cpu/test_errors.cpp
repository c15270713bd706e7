// Every class of bad input is rejected with an Error whose kind, argument and message say what
// was expected and what was found, and nothing is written when a call is rejected.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "gdnkit/gdnkit.h"

namespace {

using gdnkit::Backend;
using gdnkit::DType;
using gdnkit::Error;
using gdnkit::Plan;
using gdnkit::Problem;

Problem small_problem() {
  Problem p;
  p.total_tokens = 10;
  p.num_seqs = 2;
  p.num_q_heads = p.num_k_heads = p.num_v_heads = 2;
  p.head_dim_k = p.head_dim_v = 16;
  return p;
}

// Runs f, expects an Error of the given kind whose argument and message contain the given parts.
void expect_error(const std::function<void()>& f, Error::Kind kind, const std::string& argument,
                  const std::vector<std::string>& parts) {
  try {
    f();
  } catch (const Error& e) {
    EXPECT_EQ(static_cast<int>(e.kind()), static_cast<int>(kind)) << e.what();
    EXPECT_EQ(e.argument(), argument) << e.what();
    const std::string msg = e.what();
    for (const auto& part : parts) EXPECT_NE(msg.find(part), std::string::npos) << "'" << part << "' not in: " << msg;
    return;
  }
  ADD_FAILURE() << "no gdnkit::Error thrown (expected one about " << argument << ")";
}

void expect_plan_error(const Problem& p, Error::Kind kind, const std::string& argument,
                       const std::vector<std::string>& parts) {
  expect_error([&] { Plan::create(p); }, kind, argument, parts);
}

constexpr auto V = Error::Kind::invalid_value;
constexpr auto Ty = Error::Kind::invalid_type;
constexpr auto U = Error::Kind::unsupported;

TEST(Errors, HeadMapping) {
  Problem p = small_problem();
  p.num_q_heads = 16, p.num_k_heads = 32, p.num_v_heads = 32;  // GVA needs Hk == Hq
  expect_plan_error(p, V, "k", {"k: expected 16 heads for GVA with Hq=16, got 32"});
  p.num_k_heads = 16, p.num_v_heads = 24;  // 24 is no multiple of 16
  expect_plan_error(p, V, "v", {"expected a multiple of Hq=16", "got 24"});
  p.num_q_heads = 8, p.num_k_heads = 8, p.num_v_heads = 8;
  p.num_k_heads = 4;
  expect_plan_error(p, V, "k", {"expected 8 heads for MHA with Hq=8, got 4"});
  p.num_q_heads = 8, p.num_k_heads = 2, p.num_v_heads = 4;  // GQA needs Hk == Hv
  expect_plan_error(p, V, "k", {"expected 4 heads for GQA with Hv=4, got 2"});
  p.num_q_heads = 6, p.num_k_heads = 4, p.num_v_heads = 4;
  expect_plan_error(p, V, "q", {"expected a multiple of Hv=4 heads for GQA, got 6"});
  p.num_q_heads = 3, p.num_k_heads = 2, p.num_v_heads = 2;  // q's heads checked before k's
  expect_plan_error(p, V, "q", {"expected a multiple of Hv=2 heads for GQA, got 3"});
  p.num_q_heads = 4, p.num_k_heads = 4, p.num_v_heads = 2;  // GVA with too few value heads
  expect_plan_error(p, V, "v", {"expected a multiple of Hq=4 heads for GVA with Hk=Hq", "got 2"});
  p.num_q_heads = 3, p.num_k_heads = 3, p.num_v_heads = 2;
  expect_plan_error(p, V, "v", {"expected a multiple of Hq=3 heads for GVA", "got 2"});
  p.num_q_heads = 0;
  expect_plan_error(p, V, "q", {"expected at least 1 head, got 0"});
}

TEST(Errors, SizesAndDims) {
  Problem p = small_problem();
  p.total_tokens = -1;
  expect_plan_error(p, V, "total_tokens", {"expected T >= 0, got -1"});
  p = small_problem();
  p.num_seqs = 0;
  expect_plan_error(p, V, "num_seqs", {"expected N >= 1, got 0"});
  p = small_problem();
  p.head_dim_k = 8;
  expect_plan_error(p, V, "head_dim_k", {"expected 16..256, got 8"});
  p = small_problem();
  p.head_dim_v = 512;
  expect_plan_error(p, V, "head_dim_v", {"expected 16..256, got 512"});
  p = small_problem();
  p.has_cu_seqlens = false;
  p.total_tokens = 11;  // not divisible into 2 equal sequences
  expect_plan_error(p, V, "total_tokens", {"multiple of num_seqs=2", "got 11"});
}

TEST(Errors, DTypes) {
  Problem p = small_problem();
  p.qkv_dtype = DType::f32;
  expect_plan_error(p, Ty, "q", {"expected dtype bf16 or f16", "got f32"});
  p = small_problem();
  p.beta_dtype = DType::i32;
  expect_plan_error(p, Ty, "beta", {"expected dtype f32, bf16 or f16, got i32"});
  p.has_beta = false;  // an absent beta's dtype does not matter
  EXPECT_NO_THROW(Plan::create(p));
  p = small_problem();
  p.cu_seqlens_dtype = DType::f32;
  expect_plan_error(p, Ty, "cu_seqlens", {"expected dtype i32 or i64, got f32"});
}

TEST(Errors, StridesAndScale) {
  Problem p = small_problem();
  p.q.head = -16;
  expect_plan_error(p, V, "q.head stride", {"expected 0 (packed) or a positive stride, got -16"});
  // Offsets beyond 2^60 elements (byte offsets past 64 bits): refused, not wrapped.
  p = small_problem();
  p.q.head = std::int64_t{1} << 62;  // the packed token stride, 2 heads of it, overflows
  expect_plan_error(p, V, "q.head stride", {"below 2^60", "got 4611686018427387904"});
  p = small_problem();
  p.total_tokens = std::int64_t{1} << 60;
  p.cu_seqlens_dtype = DType::i64;
  expect_plan_error(p, V, "q strides", {"last element offset below 2^60", "token stride 32, head stride 16"});
  p = small_problem();
  p.k.token = std::int64_t{1} << 58;  // 10 tokens of it reach past 2^60
  expect_plan_error(p, V, "k strides", {"over T=10 tokens and 2 heads"});
  p = small_problem();
  p.o.head = 8;  // rows of 16 would overlap
  expect_plan_error(p, V, "o.head stride", {"at least the head dim 16", "got 8"});
  p = small_problem();
  p.o.token = 20;  // 2 heads x 16 need 32
  expect_plan_error(p, V, "o.token stride", {"at least 32", "got 20"});
  p = small_problem();
  p.o.head = 10 * 16, p.o.token = 16;  // head-major [H, T, dv]: legal
  EXPECT_NO_THROW(Plan::create(p));
  // A dimension of one index takes no step, so its stride is free (a transposed [1, H, dv] view).
  p = small_problem();
  p.total_tokens = 1, p.num_seqs = 1;
  p.o.head = 16, p.o.token = 16;
  EXPECT_NO_THROW(Plan::create(p));
  p.o.token = 8;
  EXPECT_NO_THROW(Plan::create(p));
  p.o.head = 8;  // the heads still must not overlap, and the message gives the caller's stride
  expect_plan_error(p, V, "o.head stride", {"at least the head dim 16", "got 8"});
  p = small_problem();
  p.num_q_heads = p.num_k_heads = p.num_v_heads = 1;
  p.o.head = 3, p.o.token = 40;
  EXPECT_NO_THROW(Plan::create(p));
  p.o.token = 12;
  expect_plan_error(p, V, "o.token stride", {"at least the head dim 16", "got 12"});
  p = small_problem();
  p.scale = std::numeric_limits<float>::quiet_NaN();
  expect_plan_error(p, V, "scale", {"expected a finite number"});
}

// Counts whose products would overflow the 64-bit offsets are refused at planning, not written past.
TEST(Errors, HugeCounts) {
  Problem p = small_problem();
  p.total_tokens = 0;
  p.has_cu_seqlens = false;
  p.num_seqs = (std::int64_t{1} << 62) + 1;
  expect_plan_error(p, V, "num_seqs", {"expected at most 2251799813685248 (N x H x dk x dv state floats under 2^60)",
                                       "got 4611686018427387905"});
  p.num_seqs = std::int64_t{1} << 51;  // 2 heads of 16 x 16: the limit
  EXPECT_NO_THROW(Plan::create(p));
  p = small_problem();
  p.total_tokens = std::int64_t{1} << 31;
  p.num_seqs = 1;
  expect_plan_error(p, Ty, "cu_seqlens", {"expected dtype i64 for T > 2^31-1, got i32"});
}

TEST(Errors, BackendForMemory) {
  Problem p = small_problem();
  gdnkit::Options o;
  o.backend = Backend::cuda;
  expect_error([&] { Plan::create(p, o); }, U, "backend", {"expected cpu or automatic for host memory, got cuda"});
  p.memory = gdnkit::Memory::cuda;
  o.backend = Backend::cpu;
  expect_error([&] { Plan::create(p, o); }, U, "backend", {"expected cuda or automatic for CUDA memory, got cpu"});
}

// A required kernel is honoured or refused, never replaced: the CPU backend has one kernel.
TEST(Errors, RequiredKernel) {
  gdnkit::Options o;
  o.kernel = "cuda-split-wgmma-bf16-k128-w4";
  expect_error([&] { Plan::create(small_problem(), o); }, V, "options.kernel",
               {"expected cpu-chunked-fp32", "got cuda-split-wgmma-bf16-k128-w4"});
  std::string name = "cpu-chunked-fp32";
  o.kernel = name.c_str();
  const Plan plan = Plan::create(small_problem(), o);
  name.assign("overwritten after planning");  // the plan keeps no pointer to the caller's string
  EXPECT_STREQ(plan.kernel_name(), "cpu-chunked-fp32");
}

// The CPU backend does not split sequences (options.segments >= 2 is a CUDA request).
TEST(Errors, SegmentsOnCpu) {
  gdnkit::Options o;
  o.segments = 4;
  expect_error([&] { Plan::create(small_problem(), o); }, U, "options.segments",
               {"expected 0 or 1 for the CPU backend", "got 4"});
  o.segments = -2;
  expect_error([&] { Plan::create(small_problem(), o); }, V, "options.segments", {"got -2"});
  o.segments = 1;
  EXPECT_STREQ(Plan::create(small_problem(), o).kernel_name(), "cpu-chunked-fp32");
}

// The decay shortcut's cutoff is in [0, 1) on every backend (a no-op where nothing is split).
TEST(Errors, SplitDecayCutoff) {
  gdnkit::Options o;
  for (float bad : {-0.5f, 1.0f, 2.0f, std::numeric_limits<float>::quiet_NaN()}) {
    o.split_decay_cutoff = bad;
    expect_error([&] { Plan::create(small_problem(), o); }, V, "options.split_decay_cutoff",
                 {"expected a value in [0, 1)"});
  }
  o.split_decay_cutoff = 1e-6f;
  EXPECT_STREQ(Plan::create(small_problem(), o).kernel_name(), "cpu-chunked-fp32");
}

// Enum values outside their enumerators (a cast, uninitialised memory, another ABI) are refused by
// name, never read as the nearest valid one.
TEST(Errors, EnumValues) {
  Problem p = small_problem();
  p.gate_space = static_cast<gdnkit::GateSpace>(7);
  expect_plan_error(p, V, "gate_space", {"expected log or linear, got 7"});
  p = small_problem();
  p.state_layout = static_cast<gdnkit::StateLayout>(9);
  expect_plan_error(p, V, "state_layout", {"expected kv or vk, got 9"});
  p = small_problem();
  p.memory = static_cast<gdnkit::Memory>(5);
  expect_plan_error(p, V, "memory", {"expected host or cuda, got 5"});
  gdnkit::Options o;
  o.backend = static_cast<gdnkit::Backend>(9);
  expect_error([&] { Plan::create(small_problem(), o); }, V, "backend", {"expected automatic, cpu or cuda, got 9"});
}

// max_seq_len is a hint, but an impossible one is refused.
TEST(Errors, MaxSeqLen) {
  Problem p = small_problem();
  p.max_seq_len = -1;
  expect_error([&] { Plan::create(p); }, V, "max_seq_len", {"got -1"});
  p.max_seq_len = p.total_tokens + 1;
  expect_error([&] { Plan::create(p); }, V, "max_seq_len", {"[1, T=" + std::to_string(p.total_tokens) + "]"});
  p.max_seq_len = p.total_tokens;
  EXPECT_STREQ(Plan::create(p).kernel_name(), "cpu-chunked-fp32");
  p.total_tokens = 0;  // no tokens: only 0
  p.max_seq_len = 5;
  expect_error([&] { Plan::create(p); }, V, "max_seq_len", {"expected 0 (T=0), got 5"});
}

TEST(Errors, CpuThreads) {
  gdnkit::Options o;
  o.cpu_threads = -2;
  expect_error([&] { Plan::create(small_problem(), o); }, V, "cpu_threads", {"got -2"});
}

TEST(Errors, MovedFromPlanCanBeAssigned) {
  Plan a = Plan::create(small_problem());
  Plan b = std::move(a);
  a = b;  // assigning into a moved-from plan makes it whole again
  EXPECT_EQ(a.problem().total_tokens, 10);
}

TEST(Errors, CudaMemoryWithoutDevice) {
  if (gdnkit::cuda_available()) GTEST_SKIP() << "a CUDA device is present";
  Problem p = small_problem();
  p.memory = gdnkit::Memory::cuda;
  try {
    Plan::create(p);
    ADD_FAILURE() << "planning CUDA memory without a device must fail";
  } catch (const Error& e) {
    EXPECT_TRUE(e.kind() == Error::Kind::unsupported) << e.what();
  }
}

// Buffers for small_problem(), filled with harmless values.
struct Buffers {
  std::vector<std::uint16_t> q, k, v, o;
  std::vector<float> g, beta, h0, ht;
  std::vector<std::int32_t> cu{0, 4, 10};
  Buffers() : q(10 * 2 * 16, 0x3c00), k(q), v(q), o(q.size(), 0xffff), g(20, -0.1f), beta(20, 0.5f),
              h0(2 * 2 * 16 * 16, 0.0f), ht(h0.size(), 1.0f) {}
  gdnkit::Tensors tensors() {
    gdnkit::Tensors t;
    t.q = q.data(), t.k = k.data(), t.v = v.data(), t.o = o.data();
    t.g = g.data(), t.beta = beta.data(), t.cu_seqlens = cu.data();
    t.initial_state = h0.data(), t.final_state = ht.data();
    return t;
  }
};

// small_problem() in f16 with both states (Buffers' tensors).
Problem problem_with_states() {
  Problem p = small_problem();
  p.qkv_dtype = DType::f16;
  p.has_initial_state = p.want_final_state = true;
  return p;
}

TEST(Errors, RunPointersAndWorkspace) {
  const Plan plan = Plan::create(problem_with_states());
  std::vector<unsigned char> ws(plan.workspace_bytes() + 1);
  Buffers b;
  const std::vector<std::uint16_t> o_before = b.o;
  struct Case { const char* name; std::function<void(gdnkit::Tensors&)> clear; const char* why; };
  const std::vector<Case> cases = {
      {"q", [](gdnkit::Tensors& t) { t.q = nullptr; }, "T > 0"},
      {"o", [](gdnkit::Tensors& t) { t.o = nullptr; }, "T > 0"},
      {"g", [](gdnkit::Tensors& t) { t.g = nullptr; }, "has_gate"},
      {"beta", [](gdnkit::Tensors& t) { t.beta = nullptr; }, "has_beta"},
      {"cu_seqlens", [](gdnkit::Tensors& t) { t.cu_seqlens = nullptr; }, "has_cu_seqlens"},
      {"initial_state", [](gdnkit::Tensors& t) { t.initial_state = nullptr; }, "has_initial_state"},
      {"final_state", [](gdnkit::Tensors& t) { t.final_state = nullptr; }, "want_final_state"},
  };
  for (const auto& c : cases) {
    gdnkit::Tensors t = b.tensors();
    c.clear(t);
    expect_error([&] { plan.run(t, ws.data(), ws.size()); }, V, c.name,
                 {std::string("expected a pointer (") + c.why + "), got null"});
  }
  if (plan.workspace_bytes() > 0) {
    expect_error([&] { plan.run(b.tensors(), ws.data(), plan.workspace_bytes() - 1); }, V, "workspace_bytes",
                 {"expected at least " + std::to_string(plan.workspace_bytes())});
    expect_error([&] { plan.run(b.tensors(), nullptr, ws.size()); }, V, "workspace", {"got null"});
  }
  EXPECT_EQ(b.o, o_before) << "a rejected run wrote o";
  // Bad cu_seqlens values are caught by run() on the host path too (reading them is free there),
  // before anything is written.
  b.cu = {0, 11, 10};
  expect_error([&] { plan.run(b.tensors(), ws.data(), ws.size()); }, V, "cu_seqlens[2]",
               {"expected a non-decreasing value >= 11, got 10"});
  EXPECT_EQ(b.o, o_before) << "a rejected run wrote o";
}

// Outputs that overlap an input, each other or the workspace are refused before anything is
// written; final_state == initial_state exactly (in place) runs, and so do disjoint views into one
// buffer.
TEST(Errors, RunAliasing) {
  const Problem p = problem_with_states();
  const Plan plan = Plan::create(p);
  std::vector<unsigned char> ws(std::max<std::size_t>(plan.workspace_bytes() + 64, 1024));  // holds o
  Buffers b;
  const std::vector<std::uint16_t> o_before = b.o;
  const std::vector<float> h0_before = b.h0;
  // Each alias stays inside allocations of its own (the overlapping pair in one buffer, or the
  // smaller tensor inside the larger), so that the output overlaps only the named tensor whatever
  // the heap's layout.
  std::vector<float> states(b.h0.size() + 256, 0.0f);  // both states, 256 elements apart
  struct Case { const char* out; const char* other; std::function<void(gdnkit::Tensors&)> alias; };
  const std::vector<Case> cases = {
      {"o", "q", [&](gdnkit::Tensors& t) { t.o = b.q.data() + 16; }},  // one token on
      {"o", "v", [&](gdnkit::Tensors& t) { t.o = b.v.data(); }},       // exactly v: still an overlap
      {"o", "final_state", [&](gdnkit::Tensors& t) { t.o = reinterpret_cast<std::uint16_t*>(b.ht.data()); }},
      {"final_state", "initial_state",
       [&](gdnkit::Tensors& t) { t.initial_state = states.data(), t.final_state = states.data() + 256; }},
      {"final_state", "g", [&](gdnkit::Tensors& t) { t.g = b.ht.data() + 100; }},
      {"o", "workspace", [&](gdnkit::Tensors& t) { t.o = reinterpret_cast<std::uint16_t*>(ws.data()); }},
  };
  for (const auto& c : cases) {
    gdnkit::Tensors t = b.tensors();
    c.alias(t);
    if (std::string(c.other) == "workspace" && plan.workspace_bytes() == 0) continue;
    expect_error([&] { plan.run(t, ws.data(), ws.size()); }, V, c.out, {std::string("no overlap with ") + c.other});
  }
  EXPECT_EQ(b.o, o_before) << "a rejected run wrote o";
  EXPECT_EQ(b.h0, h0_before) << "a rejected run wrote initial_state";
  // In place: the final state over the initial one.
  gdnkit::Tensors t = b.tensors();
  t.final_state = b.h0.data();
  EXPECT_NO_THROW(plan.run(t, ws.data(), ws.size()));
  // v and o as disjoint halves of one buffer's rows ([T, 4 heads, 16], o the last two heads) run;
  // rows that share a head do not.
  Problem pv = p;
  pv.has_initial_state = pv.want_final_state = false;
  pv.v = {64, 16};
  pv.o = {64, 16};
  const Plan plan_v = Plan::create(pv);
  std::vector<std::uint16_t> vo(10 * 64, 0x3c00);
  gdnkit::Tensors tv = b.tensors();
  tv.v = vo.data(), tv.o = vo.data() + 32;
  std::vector<unsigned char> ws_v(plan_v.workspace_bytes() + 64);
  EXPECT_NO_THROW(plan_v.run(tv, ws_v.data(), ws_v.size()));
  EXPECT_EQ(std::vector<std::uint16_t>(vo.begin(), vo.begin() + 32), std::vector<std::uint16_t>(32, 0x3c00));
  tv.o = vo.data() + 16;
  expect_error([&] { plan_v.run(tv, ws_v.data(), ws_v.size()); }, V, "o", {"no overlap with v"});
  // Per head: [T, 2 heads, {v, o}, 16], v and o each head stride 32, o 16 elements on.
  pv.v = {64, 32};
  pv.o = {64, 32};
  const Plan plan_h = Plan::create(pv);
  std::fill(vo.begin(), vo.end(), std::uint16_t{0x3c00});
  tv.v = vo.data(), tv.o = vo.data() + 16;
  EXPECT_NO_THROW(plan_h.run(tv, ws_v.data(), ws_v.size()));
  for (int t = 0; t < 10; ++t)
    for (int h = 0; h < 2; ++h)
      for (int d = 0; d < 16; ++d) ASSERT_EQ(vo[t * 64 + h * 32 + d], 0x3c00) << "v written at " << t << ", " << h;
  tv.o = vo.data() + 8;  // half of each o head over v's
  expect_error([&] { plan_h.run(tv, ws_v.data(), ws_v.size()); }, V, "o", {"no overlap with v"});
}

TEST(Errors, ValidateValues) {
  Problem p = small_problem();
  p.qkv_dtype = DType::f16;
  const Plan plan = Plan::create(p);
  Buffers b;
  EXPECT_NO_THROW(plan.validate(b.tensors()));
  b.cu = {1, 4, 10};
  expect_error([&] { plan.validate(b.tensors()); }, V, "cu_seqlens[0]", {"expected 0, got 1"});
  b.cu = {0, 4, 9};
  expect_error([&] { plan.validate(b.tensors()); }, V, "cu_seqlens[2]", {"expected total_tokens=10, got 9"});
  b.cu = {0, 4, 10};
  b.g[7 * 2 + 1] = std::numeric_limits<float>::infinity();
  expect_error([&] { plan.validate(b.tensors()); }, V, "g[7, 1]", {"expected a log-space gate <= 0 (or -inf)", "got inf"});
  b.g[7 * 2 + 1] = 100.0f;  // a growing gate: exp of the chunk's summed gates would overflow
  expect_error([&] { plan.validate(b.tensors()); }, V, "g[7, 1]", {"expected a log-space gate <= 0", "got 100"});
  b.g[7 * 2 + 1] = 0.0f;  // no decay
  EXPECT_NO_THROW(plan.validate(b.tensors()));
  b.g[7 * 2 + 1] = -std::numeric_limits<float>::infinity();  // a full decay
  EXPECT_NO_THROW(plan.validate(b.tensors()));
  b.g[7 * 2 + 1] = std::numeric_limits<float>::quiet_NaN();
  expect_error([&] { plan.validate(b.tensors()); }, V, "g[7, 1]", {"got nan"});

  Problem lin = p;
  lin.gate_space = gdnkit::GateSpace::linear;
  const Plan plan_lin = Plan::create(lin);
  b.g.assign(20, 0.9f);
  EXPECT_NO_THROW(plan_lin.validate(b.tensors()));
  b.g[3] = -0.5f;  // a linear gate is a decay factor: never negative
  expect_error([&] { plan_lin.validate(b.tensors()); }, V, "g[1, 1]", {"expected a linear gate in [0, 1], got -0.5"});
  b.g[3] = 1.0f;  // no decay
  EXPECT_NO_THROW(plan_lin.validate(b.tensors()));
  b.g[3] = 1e30f;  // a growing gate
  expect_error([&] { plan_lin.validate(b.tensors()); }, V, "g[1, 1]", {"expected a linear gate in [0, 1]"});
}

TEST(Errors, NamesAndSizes) {
  EXPECT_STREQ(gdnkit::to_string(DType::bf16), "bf16");
  EXPECT_STREQ(gdnkit::to_string(Backend::cuda), "cuda");
  EXPECT_EQ(gdnkit::dtype_size(DType::i64), 8u);
  EXPECT_STREQ(gdnkit::to_string(gdnkit::GateSpace::linear), "linear");
  EXPECT_STREQ(gdnkit::to_string(gdnkit::StateLayout::vk), "vk");
  // Values outside the enums (a caller's cast of a bad int) are named "?", never another value.
  EXPECT_STREQ(gdnkit::to_string(static_cast<DType>(9)), "?");
  EXPECT_STREQ(gdnkit::to_string(static_cast<Backend>(9)), "?");
  EXPECT_STREQ(gdnkit::to_string(static_cast<gdnkit::GateSpace>(9)), "?");
  EXPECT_STREQ(gdnkit::to_string(static_cast<gdnkit::StateLayout>(9)), "?");
  EXPECT_EQ(gdnkit::dtype_size(static_cast<DType>(9)), 0u);
  const Plan plan = Plan::create(small_problem());
  EXPECT_EQ(plan.backend(), Backend::cpu);
  EXPECT_FLOAT_EQ(plan.scale(), 0.25f);  // 16^-0.5
  EXPECT_EQ(plan.num_output_heads(), 2);
  Plan copy = plan;  // plans are values
  EXPECT_EQ(copy.problem().total_tokens, 10);
}

}  // namespace
