// The chunked CPU path (through the public Plan API, host memory) against the fp64 token
// recurrence, on many random shapes and every option. Each case gets fresh random inputs from
// its own seed; a failure prints the case (seed included) so it can be replayed.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#if defined(__linux__)
#include <sched.h>
#endif

#include "common/test_util.h"
#include "cpu/backend.h"

namespace {

using namespace gdnkit;
using test::Case;
using test::Errors;
using test::Inputs;
using test::Spec;
using test::SweepChoices;
using test::random_spec;

// ---- Tolerances -------------------------------------------------------------------------------
//
// Relative L2 of the chunked fp32 result against the fp64 oracle run on the same (already rounded)
// bf16/f16 inputs, so input rounding cancels and two sources remain:
//
// 1. fp32 arithmetic. Unit roundoff u32 = 2^-24 = 6e-8. Within a chunk every quantity is a sum of
//    at most max(dk, C) <= 256 products (a chain of three products: K S, M X, K^T Vn), so its
//    relative error is ~ sqrt(256) u32 = 1e-6 for random-sign terms, times the norm of the
//    forward-substitution inverse Tu (a few for L2-normalised keys and beta <= 1). The state carries
//    its error across chunks: with realistic decay it is forgotten within a few tokens, with almost
//    no decay (hard inputs) it random-walks, growing like sqrt(L / C) (about 5 at L = 1500).
//    Together ~1e-5 at worst; kFp32 = 2e-5. Measured (all cases here): realistic ~7e-8, hard
//    (L = 1500, g ~ 0, beta ~ 1) 3e-7, worst (seq, head) of the random sweep 5e-7. (Summing the
//    cumulative gate in float instead of double measured 1e-6 on realistic inputs.)
//    A bug in the algebra (a dropped gate or beta, an off-by-one row) gives 1e-2 .. 1.
constexpr double kFp32 = 2e-5;
// 2. Rounding o to the output dtype (the kernel's own final rounding). Round to nearest moves
//    every element by at most u (bf16: 8 significant bits, u = 2^-8 = 3.9e-3; f16: 11 bits,
//    u = 2^-11 = 4.9e-4) relative, so for any set of elements ||round(x) - x|| <= u ||x||: a hard
//    bound, and by the triangle inequality ||round(x) - r|| <= (u (1 + e) + e) ||r|| with e the fp32
//    error. Used for the worst (sequence, head) and for small o.
//    Over many elements the rounding error is uniform within half an ulp (<= u|x|), so its mean
//    square relative size is at most u^2 / 3: rms u / sqrt(3) (bf16 2.3e-3, f16 2.8e-4; measured
//    1.7e-3 and 2.1e-4). Used for o as a whole when it holds >= 10^4 elements (then the sample
//    rms is within a few percent of its expectation; with 16 elements it can reach u).
//    Sharper still: against the oracle rounded to o's dtype, an element differs only where the fp32
//    error moves x across a rounding boundary, with probability |x - r| / ulp, and then by one ulp
//    (<= 2u|r|). So E ||round(x) - round(r)||^2 <= sum |x_i - r_i| 2u |r_i| <= 2u e ||r||^2:
//    rel L2 <= sqrt(2 u e) (bf16 4e-4, f16 1.4e-4; measured at most 9e-5 and 2.3e-5), for o with
//    >= 10^4 elements, where one flip of a large element stays far below it.
constexpr std::int64_t kMinStatCount = 10000;
double out_u(DType dt) { return dt == DType::bf16 ? 1.0 / 256.0 : 1.0 / 2048.0; }
double tol_o_worst(DType dt) { return out_u(dt) * (1 + kFp32) + kFp32; }
double tol_o_all(DType dt, std::int64_t count) {
  return count >= kMinStatCount ? out_u(dt) / std::sqrt(3.0) * (1 + kFp32) + kFp32 : tol_o_worst(dt);
}
double tol_o_rounded(DType dt) { return std::sqrt(2 * out_u(dt) * kFp32); }
// 3. The final state is fp32 and never rounded: only the fp32 error, for the rel L2 and for the
//    largest element error relative to the largest element (per (seq, head); the largest errors
//    and the largest elements both sit a few standard deviations out, so the ratio tracks the
//    rel L2).
constexpr double kTolState = kFp32;

// Builds the case, runs oracle and kernel, checks everything; returns the errors.
Errors check_case(const Spec& spec, const Options& options = {}) {
  SCOPED_TRACE(spec.describe());
  Case c = test::random_case(spec);
  const test::Reference ref = test::run_reference(c);  // before the run: in-place overwrites the initial state
  test::run_host(c, options);
  const Errors e = test::compare(c, ref);
  EXPECT_TRUE(e.issues.empty()) << e.issues;
  EXPECT_LT(e.o, tol_o_all(spec.qkv, e.o_count)) << e.str();
  EXPECT_LT(e.o_worst, tol_o_worst(spec.qkv)) << e.str();
  if (e.o_count >= kMinStatCount) EXPECT_LT(e.o_rounded, tol_o_rounded(spec.qkv)) << e.str();
  if (spec.final_state) {
    EXPECT_LT(e.state, kTolState) << e.str();
    EXPECT_LT(e.state_worst, kTolState) << e.str();
    EXPECT_LT(e.state_max, kTolState) << e.str();
  }
  return e;
}

void report(const char* what, const Spec& spec, const Errors& e) {
  std::printf("  %-32s %-4s  o %.2e (worst %.2e, vs rounded %.2e)  state %.2e (worst %.2e, max %.2e)\n", what,
              to_string(spec.qkv), e.o, e.o_worst, e.o_rounded, e.state, e.state_worst, e.state_max);
}

// ---- Random sweep ------------------------------------------------------------------------------

// The CPU backend takes any head dims and strides.
const SweepChoices kCpuSweep{{16, 32, 48, 64, 100, 128, 256}, {16, 24, 64, 100, 128, 256}, 200, 1000, 0.15,
                             {1, 7, 63, 64, 65, 130}, {0, 1, 8}, {0, 3, 16}, {0, 2, 16}, {0, 5, 64}};

TEST(ChunkedCpu, RandomSweep) {
  constexpr int kCases = 300;
  Errors worst[2];  // per qkv dtype: the largest of each error over the sweep
  for (int i = 0; i < kCases; ++i) {
    const Spec s = random_spec(1000 + i, 1.5e7, kCpuSweep);
    const Errors e = check_case(s);
    if (HasFailure()) break;  // one failing case (with its seed) is enough to read
    Errors& w = worst[s.qkv == DType::bf16 ? 0 : 1];
    w.o = std::max(w.o, e.o);
    w.o_worst = std::max(w.o_worst, e.o_worst);
    if (e.o_count >= kMinStatCount) w.o_rounded = std::max(w.o_rounded, e.o_rounded);
    w.state = std::max(w.state, e.state);
    w.state_worst = std::max(w.state_worst, e.state_worst);
    w.state_max = std::max(w.state_max, e.state_max);
  }
  Spec s;
  s.qkv = DType::bf16;
  report("sweep maxima", s, worst[0]);
  s.qkv = DType::f16;
  report("sweep maxima", s, worst[1]);
}

// ---- Named cases ---------------------------------------------------------------------------------

// Chunk boundaries: shorter than, exactly, just over one chunk, and many chunks.
TEST(ChunkedCpu, SequenceLengths) {
  for (DType dt : {DType::bf16, DType::f16})
    for (std::int64_t L : {1, 63, 64, 65, 1000}) {
      const Spec s = test::chunk_border_spec(dt, L);
      const Errors e = check_case(s);
      report(("L=" + std::to_string(L) + " realistic 1/1/2 128").c_str(), s, e);
    }
}

TEST(ChunkedCpu, HeadDims) {
  const int dims[][2] = {{16, 16}, {16, 256}, {256, 16}, {100, 100}, {64, 256}, {256, 64}, {256, 256}, {24, 40}};
  int i = 0;
  for (auto [dk, dv] : dims) {
    Spec s;
    s.lens = {65, 130, 3};
    s.Hq = s.Hk = s.Hv = 1;
    s.dk = dk;
    s.dv = dv;
    s.initial_state = true;
    s.layout = i % 2 ? StateLayout::vk : StateLayout::kv;
    s.seed = 100 + i++;
    check_case(s);
  }
}

TEST(ChunkedCpu, HeadRatios) {
  int i = 0;
  for (int r : {1, 2, 4})
    for (bool gqa : {false, true}) {
      Spec s;
      s.lens = {70, 0, 129};
      s.Hq = s.Hk = s.Hv = 2;
      (gqa ? s.Hq : s.Hv) = 2 * r;
      s.dk = s.dv = 32;
      s.initial_state = true;
      s.seed = 200 + i++;
      check_case(s);
    }
}

// Every combination of the flags, both gate spaces and both state layouts.
TEST(ChunkedCpu, AllOptions) {
  int i = 0;
  for (int bits = 0; bits < 64; ++bits) {
    Spec s;
    s.lens = {70, 0, 5, 64};
    s.Hq = s.Hk = 1;
    s.Hv = 2;
    s.dk = s.dv = 32;
    test::set_option_bits(s, bits);
    s.seed = 300 + i++;
    check_case(s);
  }
}

TEST(ChunkedCpu, Dtypes) {
  int i = 0;
  for (DType q : {DType::bf16, DType::f16})
    for (DType b : {DType::f32, DType::bf16, DType::f16})
      for (DType cu : {DType::i32, DType::i64}) {
        Spec s;
        s.lens = {100, 1, 64};
        s.qkv = q;
        s.beta_dtype = b;
        s.cu_dtype = cu;
        s.seed = 400 + i++;
        check_case(s);
      }
}

// The batched [B, L] mode without cu_seqlens, and many sequences, some empty.
TEST(ChunkedCpu, SequenceLayouts) {
  Spec s;
  s.cu_seqlens = false;
  s.lens = {65, 65, 65, 65};
  s.initial_state = true;
  s.seed = 500;
  check_case(s);
  s.lens = {1, 1, 1};
  s.seed = 501;
  check_case(s);
  // N = 50 with zero-length sequences everywhere (first and last included).
  s.cu_seqlens = true;
  s.lens.clear();
  for (int n = 0; n < 50; ++n) s.lens.push_back(n % 3 == 0 ? 0 : (n * 37) % 90 + 1);
  s.lens.back() = 0;
  s.cu_dtype = DType::i64;
  s.seed = 502;
  check_case(s);
}

// Nothing to compute: final state = initial state (or zeros), no o rows.
TEST(ChunkedCpu, EmptyProblems) {
  for (bool init : {false, true})
    for (bool uniform : {false, true}) {
      Spec s;
      s.lens = {0, 0, 0};
      s.cu_seqlens = !uniform;
      s.initial_state = init;
      s.layout = init ? StateLayout::vk : StateLayout::kv;
      s.seed = 600;
      const Errors e = check_case(s);
      EXPECT_EQ(e.state, 0.0);
    }
}

// q, k, v as slices of one fused projection buffer; padded head and token strides everywhere
// (the padding holds NaN, so a misplaced read fails); o with padded head and token strides.
TEST(ChunkedCpu, Strides) {
  int i = 0;
  for (bool fused : {true, false})
    for (int pad : {0, 1, 8}) {
      Spec s;
      s.lens = {130, 0, 17};
      s.Hq = s.Hk = 2;
      s.Hv = 4;
      s.dk = 64;
      s.dv = 48;
      s.fused_qkv = fused;
      s.in_head_pad = pad;
      s.in_token_pad = 2 * pad + 1;
      s.o_head_pad = pad;
      s.o_token_pad = 64 - pad;
      s.beta_dtype = pad == 1 ? DType::bf16 : DType::f32;
      s.initial_state = true;
      s.seed = 700 + i++;
      check_case(s);
    }
}

// final_state == initial_state: each item must read its whole initial state before writing.
TEST(ChunkedCpu, InPlaceState) {
  int i = 0;
  for (StateLayout layout : {StateLayout::kv, StateLayout::vk}) {
    Spec s;
    s.lens = {100, 0, 64, 1};
    s.Hq = s.Hk = 1;
    s.Hv = 4;
    s.dk = 48;
    s.dv = 80;
    s.initial_state = s.final_state = s.in_place = true;
    s.layout = layout;
    s.seed = 800 + i++;
    check_case(s);
  }
}

// Almost no decay and beta ~ 1 over long sequences: the state remembers everything, so fp32
// errors accumulate across chunks instead of being forgotten.
TEST(ChunkedCpu, HardInputs) {
  int i = 0;
  for (DType dt : {DType::bf16, DType::f16})
    for (GateSpace gs : {GateSpace::log, GateSpace::linear}) {
      Spec s;
      s.lens = {1500};
      s.Hq = s.Hk = s.Hv = 1;
      s.dk = s.dv = 128;
      s.qkv = dt;
      s.gate_space = gs;
      s.inputs = Inputs::hard;
      s.initial_state = gs == GateSpace::linear;
      s.seed = 900 + i++;
      const Errors e = check_case(s);
      report(("L=1500 hard " + std::string(to_string(gs)) + " 128").c_str(), s, e);
    }
  {  // 64 chunks without forgetting.
    Spec s;
    s.lens = {4096};
    s.Hq = s.Hk = s.Hv = 1;
    s.dk = s.dv = 128;
    s.inputs = Inputs::hard;
    s.seed = 940;
    const Errors e = check_case(s);
    report("L=4096 hard log 128", s, e);
  }
  // No gate at all (decay exactly 1) and beta exactly 1.
  Spec s;
  s.lens = {1100, 300};
  s.dk = s.dv = 64;
  s.has_gate = s.has_beta = false;
  s.seed = 950;
  const Errors e = check_case(s);
  report("L=1100+300 no gate, no beta 64", s, e);
}

// Reset-style gates (-1e4, -1e30, -FLT_MAX, -inf in log space; 0 or a subnormal alpha in linear
// space) among almost-no-decay ones: without the floor of common/gate.h the chunk's sums G lose the
// gates after a reset in their rounding (or turn into -inf - -inf = NaN).
TEST(ChunkedCpu, ResetGates) {
  int i = 0;
  for (GateSpace gs : {GateSpace::log, GateSpace::linear})
    for (StateLayout layout : {StateLayout::kv, StateLayout::vk}) {
      Spec s;
      s.lens = {700, 130, 0, 64};
      s.Hq = s.Hk = 1;
      s.Hv = 2;
      s.dk = s.dv = 128;
      s.gate_space = gs;
      s.layout = layout;
      s.inputs = Inputs::resets;
      s.initial_state = true;
      s.seed = 960 + i++;
      const Errors e = check_case(s);
      report(("resets " + std::string(to_string(gs)) + " " + to_string(layout)).c_str(), s, e);
    }
}

// Linear-space gates of exactly 0 (full reset; the kernel uses log(FLT_MIN)) and exactly 1.
TEST(ChunkedCpu, LinearGateExtremes) {
  Spec s;
  s.lens = {200, 70};
  s.gate_space = GateSpace::linear;
  s.initial_state = true;
  s.seed = 1000;
  Case c = test::random_case(s);
  for (std::int64_t t = 0; t < c.shape.T; ++t)
    for (int h = 0; h < c.shape.H; ++h) {
      float& a = c.g[static_cast<std::size_t>(t * c.shape.g.token + h * c.shape.g.head)];
      if (t % 7 == 3) a = 0.0f;
      if (t % 5 == 1) a = 1.0f;
    }
  const test::Reference ref = test::run_reference(c);
  test::run_host(c);
  const Errors e = test::compare(c, ref);
  EXPECT_TRUE(e.issues.empty()) << e.issues;
  EXPECT_LT(e.o_worst, tol_o_worst(s.qkv)) << e.str();
  EXPECT_LT(e.state_worst, kTolState) << e.str();
}

// Running the first part of each sequence, then the rest from its final state, equals one run:
// within tolerance of the oracle always, and bit for bit when the split is on a chunk boundary.
TEST(ChunkedCpu, Continuation) {
  struct Split { std::vector<std::int64_t> lens, cut; };
  const Split splits[] = {{{300, 200}, {128, 64}}, {{300, 200, 90}, {100, 1, 89}}, {{65}, {0}}, {{65}, {65}}};
  int i = 0;
  for (const Split& sp : splits)
    for (StateLayout layout : {StateLayout::kv, StateLayout::vk}) {
      Spec s;
      s.lens = sp.lens;
      s.Hq = s.Hk = 1;
      s.Hv = 2;
      s.dk = s.dv = 64;
      s.initial_state = true;
      s.layout = layout;
      s.seed = 1100 + i++;
      SCOPED_TRACE(s.describe());
      Case full = test::random_case(s);
      const test::Reference ref = test::run_reference(full);
      test::run_host(full);

      std::vector<std::int64_t> zero(sp.lens.size(), 0);
      Case a = test::sub_case(full, zero, sp.cut);
      Case b = test::sub_case(full, sp.cut, sp.lens);
      test::run_host(a);
      std::copy_n(a.fin.data(), a.state_elems(), b.init.data());
      test::run_host(b);

      // Stitch the two parts' o back into full order.
      const detail::Shape& fs = full.shape;
      std::vector<double> o(ref.o.size()), o_full = test::gather_o(full);
      const std::vector<double> oa = test::gather_o(a), ob = test::gather_o(b);
      for (std::size_t n = 0; n < sp.lens.size(); ++n)
        for (std::int64_t t = 0; t < sp.lens[n]; ++t) {
          const bool first = t < sp.cut[n];
          const std::int64_t src = first ? a.starts[n] + t : b.starts[n] + t - sp.cut[n];
          std::copy_n((first ? oa : ob).data() + src * fs.H * fs.dv, fs.H * fs.dv,
                      o.data() + (full.starts[n] + t) * fs.H * fs.dv);
        }
      const std::vector<double> st = test::gather_state(b), st_full = test::gather_state(full);
      EXPECT_LT(test::rel_l2(o, ref.o), tol_o_all(s.qkv, static_cast<std::int64_t>(o.size())));
      EXPECT_LT(test::rel_l2(st, ref.state), kTolState);
      bool aligned = true;
      for (auto c : sp.cut) aligned = aligned && c % 64 == 0;
      if (aligned) {
        EXPECT_EQ(o, o_full) << "split on chunk boundaries must be bit-identical";
        EXPECT_EQ(st, st_full) << "split on chunk boundaries must be bit-identical";
      }
    }
}

// Results do not depend on the thread count (each item is computed by one thread, start to end),
// and a workspace of exactly workspace_bytes() at an odd address is enough.
TEST(ChunkedCpu, ThreadsAndWorkspace) {
  Spec s;
  s.lens = {300, 0, 17, 64, 129, 1};
  s.Hq = s.Hk = 2;
  s.Hv = 4;
  s.dk = s.dv = 32;
  s.initial_state = true;
  s.seed = 1200;
  Case base = test::random_case(s);
  test::run_host(base);
  const std::vector<double> o0 = test::gather_o(base), s0 = test::gather_state(base);
  for (int threads : {1, 2, 3, 7, 64}) {
    for (bool misalign : {false, true}) {
      Case c = test::random_case(s);
      Options opt;
      opt.cpu_threads = threads;
      const Plan plan = Plan::create(c.problem, opt);
      EXPECT_EQ(plan.backend(), Backend::cpu);
      EXPECT_STREQ(plan.kernel_name(), "cpu-chunked-fp32");
      test::run_host(c, opt, misalign);
      EXPECT_EQ(test::gather_o(c), o0) << "threads=" << threads;
      EXPECT_EQ(test::gather_state(c), s0) << "threads=" << threads;
    }
  }
}

// GDNKIT_CPU_SIMD set while in scope (Plan::create reads it).
struct SimdEnv {
  explicit SimdEnv(const char* value) { setenv("GDNKIT_CPU_SIMD", value, 1); }
  ~SimdEnv() { unsetenv("GDNKIT_CPU_SIMD"); }
};

// The products on the best instruction set the CPU has (AVX-512, AVX2 + FMA, else SSE), capped by
// GDNKIT_CPU_SIMD=avx2 or =baseline (read by Plan::create; other values refused): every path within the tolerances on
// shapes whose rows and columns leave remainders (chunk tails, dv not a multiple of 8 or 16, dk
// 32), the plan picks the path the CPU allows, AVX-512 gives AVX2's bits (the same fused
// multiply-adds per element), and AVX2 differs from SSE (fused rounding), so each ran.
TEST(ChunkedCpu, SimdPaths) {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  const bool has_avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  const bool has_avx512 = has_avx2 && __builtin_cpu_supports("avx512f");
#else
  const bool has_avx2 = false, has_avx512 = false;
#endif
  int i = 0;
  for (auto [dk, dv] : {std::pair{128, 128}, {64, 20}, {32, 44}, {48, 24}}) {
    Spec s;
    s.lens = {150, 37, 1, 64};
    s.Hq = s.Hk = 1;
    s.Hv = 2;
    s.dk = dk;
    s.dv = dv;
    s.initial_state = true;
    s.final_state = true;
    s.inputs = i == 2 ? Inputs::hard : Inputs::realistic;
    s.seed = 1500 + i++;
    struct Run {
      Errors errors;
      std::string simd;
      std::vector<std::uint16_t> o;
      std::vector<double> state;
    };
    auto run = [&](const char* cap) {
      const SimdEnv env(cap);
      Run r;
      r.errors = check_case(s);
      Case c = test::random_case(s);
      r.simd = cpu::simd_name(cpu::plan(c.problem, c.shape, Options{}));
      test::run_host(c);
      r.o = c.o.buf;
      r.state = test::gather_state(c);
      return r;
    };
    const Run best = run(""), avx2 = run("avx2"), sse = run("baseline");
    SCOPED_TRACE("dk=" + std::to_string(dk) + " dv=" + std::to_string(dv));
    EXPECT_EQ(best.simd, has_avx512 ? "avx512" : has_avx2 ? "avx2" : "baseline");
    EXPECT_EQ(avx2.simd, has_avx2 ? "avx2" : "baseline");
    EXPECT_EQ(sse.simd, "baseline");
    EXPECT_TRUE(best.o == avx2.o && best.state == avx2.state) << "AVX-512 and AVX2 gave different bits";
    if (has_avx2) EXPECT_NE(avx2.state, sse.state) << "the baseline and AVX2 paths gave the same bits: one of them did not run";
    std::printf("SIMD dk=%d dv=%d (%s): o %.3g (avx2 %.3g, baseline %.3g), state %.3g (avx2 %.3g, baseline %.3g)\n", dk,
                dv, best.simd.c_str(), best.errors.o, avx2.errors.o, sse.errors.o, best.errors.state,
                avx2.errors.state, sse.errors.state);
  }
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  // "avx512" is no cap, like empty; a value the backend does not know is refused by name rather
  // than read as no cap (a typo would otherwise time the wrong path).
  {
    Case c = test::random_case(Spec{});
    const SimdEnv env("avx512");
    EXPECT_EQ(cpu::simd_name(cpu::plan(c.problem, c.shape, Options{})),
              std::string(has_avx512 ? "avx512" : has_avx2 ? "avx2" : "baseline"));
  }
  for (const char* bad : {"AVX2", "sse", "avx2 "}) {
    const SimdEnv env(bad);
    try {
      Plan::create(test::random_case(Spec{}).problem);
      ADD_FAILURE() << "GDNKIT_CPU_SIMD=\"" << bad << "\" was accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), Error::Kind::invalid_value);
      EXPECT_EQ(e.argument(), "GDNKIT_CPU_SIMD");
      EXPECT_NE(std::string(e.what()).find(std::string("got \"") + bad + "\""), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("avx512, avx2, baseline or unset"), std::string::npos) << e.what();
    }
  }
#endif
}

// A non-finite input at token t (v NaN, k inf, a NaN gate, beta NaN) poisons the outputs of t and
// later tokens of its sequence only: the rows of its chunk before t stay as they were with finite
// inputs, bit for bit (the products' register blocks stop at the diagonal), on every SIMD path.
TEST(ChunkedCpu, NonFiniteInputStaysCausal) {
  for (const char* simd : {"", "avx2", "baseline"}) {
    const SimdEnv env(simd);
    for (int what = 0; what < 4; ++what) {
      Spec s;
      s.lens = {130};
      s.Hq = s.Hk = s.Hv = 1;
      s.dk = 32;
      s.dv = 24;
      s.initial_state = true;
      s.seed = 1600 + what;
      Case c = test::random_case(s);
      test::run_host(c);
      const std::vector<std::uint16_t> clean = c.o.buf;
      const std::int64_t t = 64 + 13 + what;  // inside the second chunk, not at a block's first row
      switch (what) {
        case 0:
          for (int d = 0; d < s.dv; ++d) c.qkv[c.v_off + t * c.shape.v.token + d] = test::kNaN16;
          break;
        case 1:
          c.qkv[c.k_off + t * c.shape.k.token + 3] = 0x7f80;  // +inf
          break;
        case 2:
          c.g[t * c.shape.g.token] = std::nanf("");
          break;
        default:
          c.beta32[t * c.shape.beta.token] = std::nanf("");
      }
      c.poison_outputs();
      test::run_host(c);
      SCOPED_TRACE(std::string(simd) + ", input " + std::to_string(what));
      const std::int64_t row = c.shape.o.token;
      const std::uint16_t* o = c.o.data();
      const std::uint16_t* o_clean = clean.data() + (o - c.o.buf.data());
      EXPECT_EQ(std::memcmp(o, o_clean, sizeof(std::uint16_t) * static_cast<std::size_t>(t * row)), 0)
          << "a row before token " << t << " changed";
      bool poisoned = false;
      for (int d = 0; d < s.dv; ++d) poisoned |= (o[t * row + d] & 0x7f80) == 0x7f80;
      EXPECT_TRUE(poisoned) << "token " << t << "'s own output stayed finite";
    }
  }
}

#if defined(__linux__)
// cpu_threads = 0 takes the hardware threads the process may run on: pinned to one CPU, a plan asks
// for one thread's workspace.
TEST(ChunkedCpu, ThreadsFollowAffinity) {
  cpu_set_t all, one;
  ASSERT_EQ(sched_getaffinity(0, sizeof all, &all), 0);
  CPU_ZERO(&one);
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu)
    if (CPU_ISSET(cpu, &all)) {
      CPU_SET(cpu, &one);
      break;
    }
  Spec s;
  s.lens = {64, 64, 64, 64};
  s.Hq = s.Hk = s.Hv = 4;  // 16 items
  const Problem p = test::random_case(s).problem;
  gdnkit::Options single;
  single.cpu_threads = 1;
  const std::size_t one_thread = Plan::create(p, single).workspace_bytes();
  ASSERT_EQ(sched_setaffinity(0, sizeof one, &one), 0);
  const std::size_t pinned = Plan::create(p).workspace_bytes();
  ASSERT_EQ(sched_setaffinity(0, sizeof all, &all), 0);
  EXPECT_EQ(pinned, one_thread);
  if (CPU_COUNT(&all) > 1) EXPECT_GT(Plan::create(p).workspace_bytes(), one_thread);
}
#endif

// Reusing one plan (and workspace) for several runs: no state leaks between runs or items.
TEST(ChunkedCpu, PlanReuse) {
  Spec s;
  s.lens = {130, 7};
  s.initial_state = true;
  s.seed = 1300;
  Case c1 = test::random_case(s);
  s.seed = 1301;
  Case c2 = test::random_case(s);
  const test::Reference r1 = test::run_reference(c1), r2 = test::run_reference(c2);
  const Plan plan = Plan::create(c1.problem);
  std::vector<unsigned char> ws(plan.workspace_bytes());
  plan.run(c1.tensors(), ws.data(), ws.size());
  plan.run(c2.tensors(), ws.data(), ws.size());
  c1.poison_outputs();
  plan.run(c1.tensors(), ws.data(), ws.size());
  for (auto [c, r] : {std::pair<Case*, const test::Reference*>{&c1, &r1}, {&c2, &r2}}) {
    const Errors e = test::compare(*c, *r);
    EXPECT_TRUE(e.issues.empty()) << e.issues;
    EXPECT_LT(e.o_worst, tol_o_worst(s.qkv)) << e.str();
    EXPECT_LT(e.state_worst, kTolState) << e.str();
  }
}

}  // namespace
