// The CUDA backend (through the public Plan API, device memory) against the fp64 token recurrence.
// Every test skips when no CUDA device is present, so the binary runs (and reports skips) in CI.
// Each case prints one "ERR cuda ..." line with its rel-L2 errors for collection.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <future>
#include <random>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "common/test_util.h"
#include "common/walk_split.h"
#include "cuda/chunked.h"
#include "cuda/cp_model.h"
#include "cuda/launch_list.h"
#include "gpu/gpu_util.h"

namespace {

using namespace gdnkit;
using test::Case;
using test::DeviceCase;
using test::Errors;
using test::Inputs;
using test::Spec;
using test::SweepChoices;
using test::random_spec;

// ---- Tolerances -------------------------------------------------------------------------------
//
// The oracle runs in fp64 on the same (already rounded) bf16/f16 inputs, so the error is the
// kernel's own: its MMA operands are rounded to the input dtype (the 16-bit copy of the state in
// K S and Q S, X = V - gam K S, Mt, P, Vn and the decayed Vn in the state update), products
// accumulate in fp32, and o is rounded once more on the store. Each rounding moves an element by
// at most u relative (bf16 u = 2^-8 = 3.9e-3, f16 u = 2^-11 = 4.9e-4), by about u / sqrt(3) rms.
// About three such roundings sit in series on every path (state copy -> X -> Vn -> o or state),
// partly averaged away by the 64..128-term sums, so the expected rel-L2 of o and of the final
// state is a few u / sqrt(3): bf16 ~5e-3 .. 1e-2, f16 ~6e-4 .. 1.3e-3. Across chunks the state
// carries its error forward, but (I - beta k k^T) with |k| = 1, beta <= 1 is a contraction and the
// gate decays it, so it does not grow without bound even with no decay (hard inputs).
// Limits: bf16 2e-2, f16 5e-3 over a whole case (about 4x the expected value), twice that for the
// worst single (sequence, head), which holds few elements when a sequence is short. A bug in the
// algebra (a dropped gate or beta, a row off by one, a stale padded row) gives 1e-1 .. 1; NaN or
// inf gives an infinite error and fails.
double tol_all(DType dt) { return dt == DType::bf16 ? 2e-2 : 5e-3; }
double tol_worst(DType dt) { return 2 * tol_all(dt); }

class Cuda : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  }
};

void report(const std::string& what, const Spec& spec, const Errors& e, const std::string& kernel = "") {
  std::printf("ERR cuda %-40s %-4s o %.3e (worst %.3e, vs rounded oracle %.3e)  state %.3e (worst %.3e, max %.3e)  %s\n",
              what.c_str(), to_string(spec.qkv), e.o, e.o_worst, e.o_rounded, e.state, e.state_worst, e.state_max,
              kernel.c_str());
  std::fflush(stdout);
}

void expect_within(const Spec& spec, const Errors& e) {
  EXPECT_TRUE(e.issues.empty()) << e.issues;
  EXPECT_LT(e.o, tol_all(spec.qkv)) << e.str();
  EXPECT_LT(e.o_worst, tol_worst(spec.qkv)) << e.str();
  if (spec.final_state) {
    EXPECT_LT(e.state, tol_all(spec.qkv)) << e.str();
    EXPECT_LT(e.state_worst, tol_worst(spec.qkv)) << e.str();
  }
}

// Builds the case, runs the oracle and the CUDA plan, checks everything; returns the errors.
Errors check_case(const Spec& spec, const std::string& what, std::string* kernel_out = nullptr,
                  const gdnkit::Options& options = {}) {
  SCOPED_TRACE(spec.describe());
  Case c = test::random_case(spec);
  const test::Reference ref = test::run_reference(c);  // before the run: in place overwrites the initial state
  DeviceCase d(c);
  const std::string kernel = test::run_device(c, d, nullptr, options);
  const Errors e = test::compare(c, ref);
  expect_within(spec, e);
  report(what, spec, e, kernel);
  if (kernel_out) *kernel_out = kernel;
  return e;
}

// A case whose outputs were downloaded after running `plan`: within tolerance of the oracle, and
// reported.
void check_downloaded(const std::string& what, const Case& c, const test::Reference& ref, const Plan& plan) {
  const Errors e = test::compare(c, ref);
  expect_within(c.spec, e);
  report(what, c.spec, e, plan.kernel_name());
}

// Runs f; expects an Error of `kind` naming `argument` whose message contains `part`.
void expect_error(const std::function<void()>& f, Error::Kind kind, const std::string& argument,
                  const std::string& part) {
  try {
    f();
  } catch (const Error& e) {
    EXPECT_EQ(static_cast<int>(e.kind()), static_cast<int>(kind)) << e.what();
    EXPECT_EQ(e.argument(), argument) << e.what();
    EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << "'" << part << "' not in: " << e.what();
    return;
  }
  ADD_FAILURE() << "no gdnkit::Error thrown (expected one about " << argument << ")";
}

// ---- Random sweep ------------------------------------------------------------------------------

// Within what the CUDA backend supports: dk, dv in {64, 128}; q/k/v/o strides multiples of 8.
const SweepChoices kCudaSweep{{64, 128}, {64, 128}, 300, 1500, 0.2, {1, 7, 63, 64, 65, 130, 500},
                              {0, 8, 16}, {0, 8, 24}, {0, 8, 16}, {0, 8, 64}};

TEST_F(Cuda, RandomSweep) {
  constexpr int kCases = 80;
  for (int i = 0; i < kCases; ++i) {
    const Spec s = random_spec(5000 + i, 4e7, kCudaSweep);
    check_case(s, "sweep seed=" + std::to_string(s.seed));
    if (HasFailure()) break;  // one failing case (with its seed) is enough to read
  }
}

// ---- Named cases ---------------------------------------------------------------------------------

// Chunk boundaries: shorter than, exactly, just over one chunk, and many chunks.
TEST_F(Cuda, SequenceLengths) {
  for (DType dt : {DType::bf16, DType::f16})
    for (std::int64_t L : {1, 2, 63, 64, 65, 127, 128, 129, 1000}) {
      const Spec s = test::chunk_border_spec(dt, L);
      check_case(s, "L=" + std::to_string(L) + " 1/1/2 128");
    }
}

TEST_F(Cuda, HeadDims) {
  const int dims[][2] = {{64, 64}, {64, 128}, {128, 64}, {128, 128}};
  int i = 0;
  for (DType dt : {DType::bf16, DType::f16})
    for (auto [dk, dv] : dims) {
      Spec s;
      s.lens = {65, 130, 3};
      s.Hq = s.Hk = s.Hv = 1;
      s.dk = dk;
      s.dv = dv;
      s.qkv = dt;
      s.initial_state = true;
      s.layout = i % 2 ? StateLayout::vk : StateLayout::kv;
      s.seed = 100 + i++;
      check_case(s, "dk=" + std::to_string(dk) + " dv=" + std::to_string(dv));
    }
}

// MHA, GVA and GQA with ratios 2 and 4 (Qwen-like 16/32 heads scaled down).
TEST_F(Cuda, HeadRatios) {
  int i = 0;
  for (int r : {1, 2, 4})
    for (bool gqa : {false, true}) {
      Spec s;
      s.lens = {70, 0, 129};
      s.Hq = s.Hk = s.Hv = 2;
      (gqa ? s.Hq : s.Hv) = 2 * r;
      s.dk = s.dv = 128;
      s.initial_state = true;
      s.seed = 200 + i++;
      check_case(s, std::string(gqa ? "GQA" : "GVA") + " r=" + std::to_string(r));
    }
}

// Every combination of the flags, both gate spaces and both state layouts.
TEST_F(Cuda, AllOptions) {
  int i = 0;
  for (int bits = 0; bits < 64; ++bits) {
    Spec s;
    s.lens = {70, 0, 5, 64};
    s.Hq = s.Hk = 1;
    s.Hv = 2;
    s.dk = s.dv = 64;
    test::set_option_bits(s, bits);
    s.seed = 300 + i++;
    check_case(s, "options bits=" + std::to_string(bits));
  }
}

TEST_F(Cuda, Dtypes) {
  int i = 0;
  for (DType q : {DType::bf16, DType::f16})
    for (DType b : {DType::f32, DType::bf16, DType::f16})
      for (DType cu : {DType::i32, DType::i64}) {
        Spec s;
        s.lens = {100, 1, 64};
        s.dk = s.dv = 128;
        s.qkv = q;
        s.beta_dtype = b;
        s.cu_dtype = cu;
        s.seed = 400 + i++;
        check_case(s, std::string("beta=") + to_string(b) + " cu=" + to_string(cu));
      }
}

// The batched [B, L] mode without cu_seqlens, and many sequences, some empty.
TEST_F(Cuda, SequenceLayouts) {
  Spec s;
  s.cu_seqlens = false;
  s.lens = {65, 65, 65, 65};
  s.dk = s.dv = 128;
  s.initial_state = true;
  s.seed = 500;
  check_case(s, "uniform 4 x 65");
  s.lens = {1, 1, 1};
  s.seed = 501;
  check_case(s, "uniform 3 x 1");
  s.cu_seqlens = true;
  s.lens.clear();
  for (int n = 0; n < 50; ++n) s.lens.push_back(n % 3 == 0 ? 0 : (n * 37) % 90 + 1);
  s.lens.back() = 0;
  s.cu_dtype = DType::i64;
  s.seed = 502;
  check_case(s, "packed 50 seqs, zero-length ones");
}

// More sequences than gridDim.z allows (65535): CTAs stride over sequences.
TEST_F(Cuda, ManySequences) {
  Spec s;
  s.lens.assign(70000, 1);
  for (std::size_t n = 0; n < s.lens.size(); n += 7) s.lens[n] = 0;
  for (std::size_t n = 3; n < s.lens.size(); n += 1000) s.lens[n] = 70;
  s.Hq = s.Hk = s.Hv = 1;
  s.dk = s.dv = 64;
  s.initial_state = true;
  s.seed = 550;
  check_case(s, "N=70000 short seqs");
}

// A packed batch of uneven lengths with a walk CTA per sequence, which the planner walks longest
// first (3 to 64 sequences with cu_seqlens; it gives each sequence its own CTA when they average
// four chunks or more, as both batches here do), each CTA ranking the lengths itself. The plan does
// not report the order; tests/emu checks the ranking itself.
TEST_F(Cuda, LongestFirstBatch) {
  Spec s;
  s.lens = {300, 2000, 0, 700, 65, 1500, 1, 900, 2000, 64};
  s.Hq = s.Hk = 2;
  s.Hv = 4;
  s.dk = s.dv = 128;
  s.initial_state = true;
  s.final_state = true;
  s.seed = 560;
  check_case(s, "N=10 uneven, longest first");
  s.lens.assign(64, 0);
  for (std::size_t n = 0; n < s.lens.size(); ++n) s.lens[n] = static_cast<std::int64_t>((n * 37) % 11) * 61;
  s.dk = s.dv = 64;
  s.seed = 561;
  check_case(s, "N=64 uneven, longest first");
}

// More uneven sequences than one wave of fused CTAs holds per head (64 heads: two CTAs per head on
// 132 SMs): the planner deals the ranked sequences to one wave (ChunkedParams::lpt) and each CTA
// walks its share back to back. On sm_90 the default plan is the fused kernel; tests/emu checks
// the shares themselves (a partition, the greedy assignment).
TEST_F(Cuda, LptShareBatch) {
  Spec s;
  s.lens = {600, 1, 0, 130, 257, 64, 400, 65, 200, 70, 129, 300};
  s.Hq = s.Hk = 16;
  s.Hv = 64;
  s.dk = s.dv = 128;
  s.initial_state = true;
  s.final_state = true;
  s.seed = 565;
  std::string kernel;
  check_case(s, "N=12 uneven, 64 heads, lpt shares", &kernel);
  const bool sm90 = test::device_is_sm90();
  if (sm90 && cuda::find_fused_kernel(DType::bf16, 128, 128) != nullptr &&
      test::suite_kernel_mode().empty())
    EXPECT_EQ(kernel, "cuda-fused-sm90-bf16-k128");
}

// Nothing to compute: final state = initial state (or zeros), no o rows.
TEST_F(Cuda, EmptyProblems) {
  for (bool init : {false, true})
    for (bool uniform : {false, true}) {
      Spec s;
      s.lens = {0, 0, 0};
      s.cu_seqlens = !uniform;
      s.dk = s.dv = 128;
      s.initial_state = init;
      s.layout = init ? StateLayout::vk : StateLayout::kv;
      s.seed = 600;
      const Errors e = check_case(s, std::string("empty init=") + (init ? "1" : "0") + " uniform=" + (uniform ? "1" : "0"));
      EXPECT_EQ(e.state, 0.0);
    }
  // Zero-length sequences between real ones, in place.
  Spec s;
  s.lens = {0, 100, 0, 0, 64, 0};
  s.dk = s.dv = 128;
  s.initial_state = s.final_state = s.in_place = true;
  s.seed = 601;
  check_case(s, "zero-length between, in place");
}

// q, k, v as slices of one fused projection buffer; padded head and token strides (multiples of
// 8; the padding holds NaN, so a misplaced read fails); o with padded head and token strides.
TEST_F(Cuda, Strides) {
  int i = 0;
  for (bool fused : {true, false})
    for (int pad : {0, 8, 16}) {
      const Spec s = test::strides_spec(fused, pad, 700 + i++);
      check_case(s, std::string("strides fused=") + (fused ? "1" : "0") + " pad=" + std::to_string(pad));
    }
}

// final_state == initial_state: each CTA reads its whole state block before writing it.
TEST_F(Cuda, InPlaceState) {
  int i = 0;
  for (StateLayout layout : {StateLayout::kv, StateLayout::vk}) {
    Spec s;
    s.lens = {100, 0, 64, 1};
    s.Hq = s.Hk = 1;
    s.Hv = 4;
    s.dk = 128;
    s.dv = 128;
    s.initial_state = s.final_state = s.in_place = true;
    s.layout = layout;
    s.seed = 800 + i++;
    check_case(s, std::string("in place ") + to_string(layout));
  }
}

// Reset-style gates (test::Inputs::resets: -1e4, -1e30, -FLT_MAX, -inf in log space, 0 or a
// subnormal alpha in linear space) among almost-no-decay ones, on the planner's kernel and on a split.
TEST_F(Cuda, ResetGates) {
  int i = 0;
  for (DType dt : {DType::bf16, DType::f16})
    for (GateSpace gs : {GateSpace::log, GateSpace::linear}) {
      Spec s;
      s.lens = {3000, 700, 0, 65};
      s.Hq = s.Hk = 1;
      s.Hv = 2;
      s.dk = s.dv = 128;
      s.qkv = dt;
      s.gate_space = gs;
      s.inputs = Inputs::resets;
      s.initial_state = true;
      s.seed = 1720 + i++;
      check_case(s, std::string("resets ") + to_string(gs));
    }
}

// Almost no decay (g in (-1e-3, 0]) and beta ~ 1 over 16K tokens: the state remembers everything,
// so rounding errors are carried across 256 chunks instead of being forgotten.
TEST_F(Cuda, HardInputs16K) {
  int i = 0;
  for (DType dt : {DType::bf16, DType::f16})
    for (GateSpace gs : {GateSpace::log, GateSpace::linear}) {
      Spec s;
      s.lens = {16384};
      s.Hq = s.Hk = s.Hv = 1;
      s.dk = s.dv = 128;
      s.qkv = dt;
      s.gate_space = gs;
      s.inputs = Inputs::hard;
      s.initial_state = gs == GateSpace::linear;
      s.seed = 900 + i++;
      check_case(s, std::string("L=16384 hard ") + to_string(gs));
    }
  // No gate at all (decay exactly 1) and beta exactly 1.
  Spec s;
  s.lens = {3000, 700};
  s.dk = s.dv = 128;
  s.has_gate = s.has_beta = false;
  s.seed = 950;
  check_case(s, "L=3000+700 no gate, no beta");
}

// One 64K-token sequence with GVA 1/1/4: everything checked for being written, two heads checked
// against the oracle (the oracle over all heads would take minutes).
TEST_F(Cuda, LongSequence64K) {
  Spec s;
  s.lens = {65536};
  s.Hq = s.Hk = 1;
  s.Hv = 4;
  s.dk = s.dv = 128;
  s.initial_state = true;
  s.seed = 960;
  SCOPED_TRACE(s.describe());
  Case c = test::random_case(s);
  std::vector<std::vector<double>> ro(2), rs(2);
  const int heads[2] = {0, 3};
  for (int i = 0; i < 2; ++i) reference::recurrence(c.problem, c.tensors(), 0, heads[i], ro[i], rs[i]);
  DeviceCase d(c);
  const std::string kernel = test::run_device(c, d);
  EXPECT_EQ(test::written_issues(c), "");
  for (int i = 0; i < 2; ++i) {
    const test::PairErrors pe = test::pair_errors(c, 0, heads[i], ro[i], rs[i]);
    Errors e;
    e.o = e.o_worst = pe.o;
    e.state = e.state_worst = pe.state;
    expect_within(s, e);
    report("L=65536 head " + std::to_string(heads[i]), s, e, kernel);
  }
}

// Linear-space gates of exactly 0 (full reset; log(FLT_MIN) in the kernel) and exactly 1.
TEST_F(Cuda, LinearGateExtremes) {
  Spec s;
  s.lens = {200, 70};
  s.dk = s.dv = 128;
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
  DeviceCase d(c);
  const std::string kernel = test::run_device(c, d);
  const Errors e = test::compare(c, ref);
  expect_within(s, e);
  report("linear gates 0 and 1", s, e, kernel);
}

// Walk CTAs of 1, 2, 4 and 8 warps (16 value columns each): the planner picks by how many
// (sequence, head, column block) walks there are per SM, so a growing number of sequences walks
// every size on a 132-SM H200 (fewer on other devices). Each must be exact against the oracle.
TEST_F(Cuda, WalkCtaSizes) {
  if (!test::suite_kernel_mode().empty()) GTEST_SKIP() << "tests the planner's choice; GDNKIT_TEST_KERNEL is set";
  const int sms = test::sm_count();
  std::set<std::string> kernels;
  int i = 0;
  for (DType dt : {DType::bf16, DType::f16})
    for (int dk : {64, 128})
      for (int seqs : {2, (sms + 3) / 4, (sms + 1) / 2, sms}) {
        Spec s;
        s.Hq = s.Hk = s.Hv = 1;
        s.lens.clear();
        // Lengths of 0 to 62 tokens, the longest over 32 (not the short walk's) and the mean at
        // most 32 (not the fused kernel's): the smallest batch is two sequences, 33 and 6 tokens.
        for (int n = 0; n < seqs; ++n)
          s.lens.push_back(n % 7 == 3 ? 0 : n % 2 == 0 ? 33 + (n * 53) % 30 : 1 + (n * 13) % 8);
        s.dk = dk;
        s.dv = 128;
        s.qkv = dt;
        s.initial_state = i % 2;
        s.layout = i % 3 ? StateLayout::kv : StateLayout::vk;
        s.seed = 1050 + i++;
        std::string kernel;
        check_case(s, "walk CTA sizes N=" + std::to_string(seqs) + " dk=" + std::to_string(dk), &kernel);
        // The split path's CTA sizes by their suffix (-w1 .. -w8); the fused kernel and the short walk as such.
        kernels.insert(kernel.rfind("cuda-fused-", 0) == 0   ? "fused"
                       : kernel.rfind("cuda-short-", 0) == 0 ? "short"
                                                             : kernel.substr(kernel.rfind('-') + 1));
      }
  std::string seen;
  for (const std::string& k : kernels) seen += k + " ";
  std::printf("INFO walk CTA sizes used: %s\n", seen.c_str());
  if (sms == 132) EXPECT_EQ(kernels.size(), 4u) << seen;
  else EXPECT_GE(kernels.size(), 2u) << seen;
}

// Every compiled walk, required by name (Options::kernel): exact against the oracle on a mixed
// batch (tail chunks of 1..3 row blocks, an empty sequence, initial state, both layouts). A kernel
// the device cannot run (wgmma off sm_90) must be refused as unsupported, naming options.kernel.
TEST_F(Cuda, EveryKernel) {
  const bool sm90 = test::device_is_sm90();
  int ran = 0, i = 0;
  for (const cuda::SplitKernelList list :
       {cuda::split_kernels_bf16(), cuda::split_kernels_f16(), cuda::fused_kernels()})
    for (int j = 0; j < list.count; ++j) {
      const cuda::SplitKernel& k = list.begin[j];
      Spec s;
      s.lens = {200, 0, 17, 64, 130, 35};
      s.Hq = s.Hk = 1;
      s.Hv = 2;
      s.dk = k.dk;
      s.dv = 128;
      s.qkv = k.dtype;
      s.initial_state = true;
      s.layout = i % 2 ? StateLayout::vk : StateLayout::kv;
      s.gate_space = i % 3 == 0 ? GateSpace::linear : GateSpace::log;
      s.seed = 1200 + i++;
      gdnkit::Options o;
      o.kernel = k.name;
      if (k.sm90a && !sm90) {
        Case c = test::random_case(s);
        DeviceCase d(c);
        expect_error([&] { Plan::create(d.problem(), o); }, Error::Kind::unsupported, "options.kernel",
                     "compute capability 9.0");
        continue;
      }
      std::string kernel;
      check_case(s, std::string("required ") + k.name, &kernel, o);
      EXPECT_EQ(kernel, k.name);
      ++ran;
    }
  std::printf("INFO required-kernel runs: %d\n", ran);
  EXPECT_GE(ran, 16);
  // An unknown name is invalid, and the message lists what exists for the dtype and dk.
  Spec s;
  s.lens = {10};
  s.dk = s.dv = 128;
  Case c = test::random_case(s);
  DeviceCase d(c);
  gdnkit::Options o;
  o.kernel = "cuda-split-mma-bf16-k128-w3";
  expect_error([&] { Plan::create(d.problem(), o); }, Error::Kind::invalid_value, "options.kernel",
               "cuda-split-mma-bf16-k128-w4");
  expect_error([&] { Plan::create(d.problem(), o); }, Error::Kind::invalid_value, "options.kernel",
               "built for dtype bf16 and dk 128: ");
  // The fused kernel walks 128 value columns per CTA: required at dv = 64, it is refused by name
  // (its -v64 variant runs there).
  if (sm90 && cuda::find_fused_kernel(DType::bf16, 128, 128) != nullptr) {
    Spec s64 = s;
    s64.dv = 64;
    Case c64 = test::random_case(s64);
    DeviceCase d64(c64);
    o.kernel = "cuda-fused-sm90-bf16-k128";
    expect_error([&] { Plan::create(d64.problem(), o); }, Error::Kind::unsupported, "options.kernel",
                 "head_dim_v 128");
  }
}

// Running the first part of each sequence, then the rest from its final state, equals one run:
// within tolerance of the oracle always, and bit for bit when the split is on a chunk boundary
// (both parts on the full run's kernel: the planner may pick another for a part, e.g. the fused
// kernel for long sequences and the split path for short ones, whose roundings differ).
TEST_F(Cuda, Continuation) {
  struct Split { std::vector<std::int64_t> lens, cut; };
  const Split splits[] = {{{300, 200}, {128, 64}}, {{300, 200, 90}, {100, 1, 89}}, {{65}, {0}}, {{65}, {65}}};
  int i = 0;
  for (const Split& sp : splits)
    for (StateLayout layout : {StateLayout::kv, StateLayout::vk}) {
      Spec s;
      s.lens = sp.lens;
      s.Hq = s.Hk = 1;
      s.Hv = 2;
      s.dk = s.dv = 128;
      s.initial_state = true;
      s.layout = layout;
      s.seed = 1100 + i++;
      SCOPED_TRACE(s.describe());
      Case full = test::random_case(s);
      const test::Reference ref = test::run_reference(full);
      std::string kernel;
      {
        DeviceCase d(full);
        kernel = test::run_device(full, d);
      }
      gdnkit::Options same;
      same.kernel = kernel.c_str();
      std::vector<std::int64_t> zero(sp.lens.size(), 0);
      Case a = test::sub_case(full, zero, sp.cut);
      Case b = test::sub_case(full, sp.cut, sp.lens);
      {
        DeviceCase d(a);
        EXPECT_EQ(test::run_device(a, d, nullptr, same), kernel);
      }
      std::copy_n(a.fin.data(), a.state_elems(), b.init.data());
      {
        DeviceCase d(b);
        EXPECT_EQ(test::run_device(b, d, nullptr, same), kernel);
      }
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
      Errors e;
      e.o = e.o_worst = test::rel_l2(o, ref.o);
      e.state = e.state_worst = test::rel_l2(st, ref.state);
      EXPECT_LT(e.o, tol_all(s.qkv));
      EXPECT_LT(e.state, tol_all(s.qkv));
      report("continuation split " + std::to_string(i), s, e);
      bool aligned = true;
      for (auto c : sp.cut) aligned = aligned && c % 64 == 0;
      if (aligned) {
        EXPECT_EQ(o, o_full) << "split on chunk boundaries must be bit-identical";
        EXPECT_EQ(st, st_full) << "split on chunk boundaries must be bit-identical";
      }
    }
}

// A tail chunk's padding rows must never carry the next sequence's values into the products
// (the fused kernel's TMA boxes copy them, then zero them): with NaN and inf in the second
// sequence's q, k and v, the first sequence's o and final state are bit for bit unchanged. Every
// dk = 128 bf16 kernel that takes dv = 128, required by name.
TEST_F(Cuda, NonFiniteNeighbourSequence) {
  std::vector<const char*> names;
  for (const cuda::SplitKernelList list : {cuda::split_kernels_bf16(), cuda::fused_kernels()})
    for (int j = 0; j < list.count; ++j)
      if (list.begin[j].dk == 128 && list.begin[j].dtype == DType::bf16) names.push_back(list.begin[j].name);
  const bool sm90 = test::device_is_sm90();
  int ran = 0;
  for (const char* name : names) {
    if (std::string(name).find("wgmma") != std::string::npos || std::string(name).find("fused") != std::string::npos)
      if (!sm90) continue;
    Spec s;
    s.lens = {70, 100};
    s.Hq = s.Hk = s.Hv = 1;
    s.dk = s.dv = 128;
    s.initial_state = true;
    s.final_state = true;
    s.seed = 1500;
    gdnkit::Options o;
    o.kernel = name;
    Case c = test::random_case(s);
    {
      DeviceCase d(c);
      test::run_device(c, d, nullptr, o);
    }
    const std::vector<std::uint16_t> o_clean = c.o.buf;
    const std::vector<float> state_clean = c.fin.buf;
    for (std::int64_t t = c.starts[1]; t < c.starts[2]; ++t) {
      for (int d = 0; d < s.dk; ++d) {
        c.qkv[c.q_off + t * c.shape.q.token + d] = 0x7f80;  // bf16 +inf
        c.qkv[c.k_off + t * c.shape.k.token + d] = test::kNaN16;
      }
      for (int d = 0; d < s.dv; ++d) c.qkv[c.v_off + t * c.shape.v.token + d] = test::kNaN16;
    }
    c.poison_outputs();
    {
      DeviceCase d(c);
      test::run_device(c, d, nullptr, o);
    }
    std::int64_t differ = 0;
    const std::size_t og = c.o.data() - c.o.buf.data(), sg = c.fin.data() - c.fin.buf.data();
    for (std::int64_t t = 0; t < c.starts[1]; ++t)
      for (int d = 0; d < s.dv; ++d) {
        const std::int64_t i = t * c.shape.o.token + d;
        differ += c.o.data()[i] != o_clean[static_cast<std::size_t>(i) + og];
      }
    for (std::int64_t i = 0; i < c.shape.state_elems(); ++i)
      differ += std::memcmp(&c.fin.data()[i], &state_clean[static_cast<std::size_t>(i) + sg], 4) != 0;
    EXPECT_EQ(differ, 0) << name << ": the first sequence changed with a non-finite second one";
    ++ran;
  }
  EXPECT_GE(ran, 4);
}

bool split_runs_here();

// cu_seqlens that run() does not check (validate() does; Emulated.BadSeqlensStayInBounds has the
// same on every kernel's logic): decreasing, negative, past T, i64 values beyond 32 bits. Every
// kernel, the short walk and a split give wrong numbers but no CUDA error, and write nothing outside
// o and the states (guards intact). scripts/gpu_check.sh's sanitize stage runs this test under
// memcheck, which also sees any read outside the inputs and the workspace.
TEST_F(Cuda, BadSeqlensStayInBounds) {
  const bool sm90a = test::device_is_sm90();
  struct Run {
    const char* kernel;
    int dk;
    DType dtype;
    int segments;
  };
  std::vector<Run> runs;
  for (const cuda::SplitKernelList list : {cuda::split_kernels_bf16(), cuda::split_kernels_f16(), cuda::fused_kernels()})
    for (int j = 0; j < list.count; ++j)
      if (!list.begin[j].sm90a || sm90a) runs.push_back({list.begin[j].name, list.begin[j].dk, list.begin[j].dtype, 0});
  runs.push_back({"cuda-short-bf16-k128-w8", 128, DType::bf16, 0});
  if (sm90a && split_runs_here()) runs.push_back({nullptr, 128, DType::bf16, 4});
  Spec s;
  s.lens = {600, 100, 200};
  s.Hq = s.Hk = 1;
  s.Hv = 2;
  s.dv = 128;
  s.initial_state = true;
  s.final_state = true;
  const auto bad = test::invalid_cu_seqlens(s.T());
  int i = 0;
  for (const Run& r : runs)
    for (std::size_t b = 0; b < bad.size(); ++b, ++i) {
      s.dk = r.dk;
      s.qkv = r.dtype;
      s.seed = 3300 + i;
      Case c = test::case_with_cu_seqlens(s, bad[b], b % 2 == 1);
      DeviceCase d(c);
      Problem problem = d.problem();
      problem.max_seq_len = 600;
      gdnkit::Options o;
      o.kernel = r.kernel;
      o.segments = r.segments;
      const Plan plan = Plan::create(problem, o);
      SCOPED_TRACE(std::string(plan.kernel_name()) + ", cu_seqlens #" + std::to_string(b));
      const test::DeviceWorkspace ws(plan);
      plan.run(d.tensors(), ws.ptr(), ws.bytes());
      EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      EXPECT_EQ(cudaGetLastError(), cudaSuccess);
      d.download();
      EXPECT_TRUE(c.o.guards_intact()) << "o written outside its rows";
      EXPECT_TRUE(c.init.guards_intact());
      EXPECT_TRUE(c.fin.guards_intact()) << "final_state written outside its sequences";
    }
  std::printf("INFO bad cu_seqlens runs: %d\n", i);
  EXPECT_GE(i, 5 * 4);
}

// Runs are deterministic: the same inputs give bit-identical outputs, run after run.
TEST_F(Cuda, BitwiseRepeatable) {
  Spec s;
  s.lens = {1000, 0, 65, 300};
  s.Hq = s.Hk = 2;
  s.Hv = 4;
  s.dk = s.dv = 128;
  s.initial_state = true;
  s.seed = 1200;
  Case c = test::random_case(s);
  DeviceCase d(c);
  const Plan plan = Plan::create(d.problem(), test::suite_options(d.problem()));
  const test::DeviceWorkspace ws(plan);
  std::vector<std::uint16_t> o0;
  std::vector<float> s0;
  for (int rep = 0; rep < 5; ++rep) {
    c.poison_outputs();
    d.upload();
    plan.run(d.tensors(), ws.ptr(), ws.bytes(), nullptr);
    GDN_CUDA(cudaDeviceSynchronize());
    d.download();
    EXPECT_EQ(test::written_issues(c), "");
    if (rep == 0) {
      o0 = c.o.buf;
      s0 = c.fin.buf;
    } else {
      EXPECT_EQ(std::memcmp(o0.data(), c.o.buf.data(), o0.size() * 2), 0) << "o differs in run " << rep;
      EXPECT_EQ(std::memcmp(s0.data(), c.fin.buf.data(), s0.size() * 4), 0) << "state differs in run " << rep;
    }
  }
}

// Two plans for different problems run concurrently on two streams, several times over; both
// results are right.
// Runs plan pa on da and pb on db four times each, on two non-blocking streams at once, each plan
// with its own workspace; waits and downloads both.
void run_on_two_streams(const Plan& pa, DeviceCase& da, const Plan& pb, DeviceCase& db) {
  const test::DeviceWorkspace wa(pa), wb(pb);
  cudaStream_t s1 = nullptr, s2 = nullptr;
  GDN_CUDA(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
  GDN_CUDA(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
  for (int rep = 0; rep < 4; ++rep) {
    pa.run(da.tensors(), wa.ptr(), wa.bytes(), s1);
    pb.run(db.tensors(), wb.ptr(), wb.bytes(), s2);
  }
  GDN_CUDA(cudaStreamSynchronize(s1));
  GDN_CUDA(cudaStreamSynchronize(s2));
  da.download(s1);
  db.download(s2);
  GDN_CUDA(cudaStreamDestroy(s1));
  GDN_CUDA(cudaStreamDestroy(s2));
}

// Two unlike problems (bf16 dk 128 with an initial state; f16 dk 64 GQA, vk state, linear gates,
// bf16 beta, 64-bit cu_seqlens), seeds `seed` and seed + 1.
std::pair<Spec, Spec> two_specs(std::uint64_t seed) {
  Spec sa;
  sa.lens = {2000, 500};
  sa.Hq = sa.Hk = 2;
  sa.Hv = 4;
  sa.dk = sa.dv = 128;
  sa.qkv = DType::bf16;
  sa.initial_state = true;
  sa.seed = seed;
  Spec sb;
  sb.lens = {70, 1, 900, 0, 64};
  sb.Hq = 4;
  sb.Hk = sb.Hv = 2;
  sb.dk = sb.dv = 64;
  sb.qkv = DType::f16;
  sb.layout = StateLayout::vk;
  sb.gate_space = GateSpace::linear;
  sb.beta_dtype = DType::bf16;
  sb.cu_dtype = DType::i64;
  sb.seed = seed + 1;
  return {sa, sb};
}

// Runs plan on d four times on a new stream of its own; meant for a new thread (one that has made
// no CUDA call before: the driver's descriptor calls need the device's context current there, so
// the workspace comes from the caller). Returns the error's text, "" for none.
std::string run_four_calls(const Plan& plan, DeviceCase& d, const test::DeviceWorkspace& w) {
  try {
    cudaStream_t s = nullptr;
    if (cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess) throw std::runtime_error("stream");
    for (int i = 0; i < 4; ++i) plan.run(d.tensors(), w.ptr(), w.bytes(), s);
    if (cudaStreamSynchronize(s) != cudaSuccess || cudaStreamDestroy(s) != cudaSuccess)
      throw std::runtime_error("stream synchronize");
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

// Two unlike plans (two_specs) run at once: on two streams from this thread, or each from a
// thread of its own at the same time.
void check_two_plans(std::uint64_t seed, bool threads) {
  const auto [sa, sb] = two_specs(seed);
  Case a = test::random_case(sa), b = test::random_case(sb);
  const test::Reference ra = test::run_reference(a), rb = test::run_reference(b);
  DeviceCase da(a), db(b);
  const Plan pa = Plan::create(da.problem(), test::suite_options(da.problem())),
             pb = Plan::create(db.problem(), test::suite_options(db.problem()));
  if (threads) {
    const test::DeviceWorkspace wa(pa), wb(pb);
    std::string ea, eb;
    std::thread ta([&] { ea = run_four_calls(pa, da, wa); }), tb([&] { eb = run_four_calls(pb, db, wb); });
    ta.join();
    tb.join();
    EXPECT_EQ(ea, "") << pa.kernel_name();
    EXPECT_EQ(eb, "") << pb.kernel_name();
    da.download();
    db.download();
  } else {
    run_on_two_streams(pa, da, pb, db);
  }
  check_downloaded(threads ? "two threads: A" : "two streams: A", a, ra, pa);
  check_downloaded(threads ? "two threads: B" : "two streams: B", b, rb, pb);
}

TEST_F(Cuda, TwoStreams) { check_two_plans(1300, false); }
TEST_F(Cuda, TwoThreads) { check_two_plans(1310, true); }

// plan.run on d captured once into a CUDA graph, on a stream and with a workspace of its own;
// replay() launches the graph on that stream.
class CapturedRun {
 public:
  CapturedRun(const Plan& plan, DeviceCase& d) : ws_(plan) {
    GDN_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    GDN_CUDA(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeGlobal));
    plan.run(d.tensors(), ws_.ptr(), ws_.bytes(), stream_);
    GDN_CUDA(cudaStreamEndCapture(stream_, &graph_));
    GDN_CUDA(cudaGraphInstantiate(&exec_, graph_, 0));
  }
  CapturedRun(const CapturedRun&) = delete;
  CapturedRun& operator=(const CapturedRun&) = delete;
  ~CapturedRun() {
    cudaGraphExecDestroy(exec_);
    cudaGraphDestroy(graph_);
    cudaStreamDestroy(stream_);
  }
  void replay() { GDN_CUDA(cudaGraphLaunch(exec_, stream_)); }
  cudaStream_t stream() const { return stream_; }

 private:
  test::DeviceWorkspace ws_;
  cudaStream_t stream_ = nullptr;
  cudaGraph_t graph_ = nullptr;
  cudaGraphExec_t exec_ = nullptr;
};

// run() captured into a CUDA graph; the graph replayed after new input values were copied into
// the same buffers gives the new, right answer.
TEST_F(Cuda, GraphCapture) {
  Spec s;
  s.lens = {300, 0, 65, 1};
  s.Hq = s.Hk = 1;
  s.Hv = 4;
  s.dk = s.dv = 128;
  s.initial_state = true;
  s.seed = 1400;
  Case c = test::random_case(s);
  const test::Reference r1 = test::run_reference(c);
  DeviceCase d(c);
  const Plan plan = Plan::create(d.problem(), test::suite_options(d.problem()));
  CapturedRun run(plan, d);
  run.replay();
  d.download(run.stream());
  check_downloaded("graph replay 1", c, r1, plan);

  // New values (a different seed), outputs poisoned again, same device buffers.
  c.spec.seed = 1401;
  test::fill_inputs(c);
  c.poison_outputs();
  const test::Reference r2 = test::run_reference(c);
  d.upload(run.stream());
  run.replay();
  d.download(run.stream());
  check_downloaded("graph replay 2 (new inputs)", c, r2, plan);

  // validate() copies values to the host and waits: refused on a stream being captured, before it
  // breaks the capture (which then ends whole, holding the run captured after the refusal).
  cudaStream_t s2 = nullptr;
  GDN_CUDA(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
  const test::DeviceWorkspace ws(plan);
  GDN_CUDA(cudaStreamBeginCapture(s2, cudaStreamCaptureModeGlobal));
  expect_error([&] { plan.validate(d.tensors(), s2); }, Error::Kind::invalid_value, "stream", "being captured");
  plan.run(d.tensors(), ws.ptr(), ws.bytes(), s2);
  cudaGraph_t graph = nullptr;
  EXPECT_EQ(cudaStreamEndCapture(s2, &graph), cudaSuccess);
  if (graph != nullptr) GDN_CUDA(cudaGraphDestroy(graph));
  GDN_CUDA(cudaStreamDestroy(s2));
}

// ---- Errors the CUDA backend adds ------------------------------------------------------------------


Problem cuda_problem() {
  Problem p;
  p.total_tokens = 100;
  p.num_seqs = 1;
  p.has_cu_seqlens = false;
  p.num_q_heads = p.num_k_heads = p.num_v_heads = 2;
  p.memory = Memory::cuda;
  return p;
}

TEST_F(Cuda, UnsupportedHeadDims) {
  Problem p = cuda_problem();
  p.head_dim_k = 96;
  expect_error([&] { Plan::create(p); }, Error::Kind::unsupported, "head_dim_k",
               "head_dim_k: expected 64 or 128 for the CUDA backend, got 96");
  p.head_dim_k = 128;
  p.head_dim_v = 256;
  expect_error([&] { Plan::create(p); }, Error::Kind::unsupported, "head_dim_v",
               "head_dim_v: expected 64 or 128 for the CUDA backend, got 256");
}

TEST_F(Cuda, VectorStrides) {
  Problem p = cuda_problem();
  p.q.head = 132;  // not a multiple of 8
  expect_error([&] { Plan::create(p); }, Error::Kind::invalid_value, "q.head stride", "a multiple of 8");
  p = cuda_problem();
  p.v.token = 2 * 128 + 4;
  expect_error([&] { Plan::create(p); }, Error::Kind::invalid_value, "v.token stride", "a multiple of 8");
  p = cuda_problem();
  p.o.token = 2 * 128 + 12;
  expect_error([&] { Plan::create(p); }, Error::Kind::invalid_value, "o.token stride", "got 268");
}

TEST_F(Cuda, MisalignedPointer) {
  Spec s;
  s.lens = {10};
  s.dk = s.dv = 128;
  Case c = test::random_case(s);
  DeviceCase d(c);
  const Plan plan = Plan::create(d.problem(), test::suite_options(d.problem()));
  const test::DeviceWorkspace ws(plan);
  Tensors t = d.tensors();
  t.k = static_cast<const unsigned char*>(t.k) + 2;
  expect_error([&] { plan.run(t, ws.ptr(), ws.bytes(), nullptr); }, Error::Kind::invalid_value, "k", "16-byte aligned");
  t = d.tensors();
  t.o = static_cast<unsigned char*>(t.o) + 8;
  expect_error([&] { plan.run(t, ws.ptr(), ws.bytes(), nullptr); }, Error::Kind::invalid_value, "o", "16-byte aligned");
  // The tensors read element by element: their element type's alignment.
  t = d.tensors();
  t.g = reinterpret_cast<const float*>(reinterpret_cast<const unsigned char*>(t.g) + 2);
  expect_error([&] { plan.run(t, ws.ptr(), ws.bytes(), nullptr); }, Error::Kind::invalid_value, "g", "4-byte aligned");
  t = d.tensors();
  t.cu_seqlens = static_cast<const unsigned char*>(t.cu_seqlens) + 1;
  expect_error([&] { plan.run(t, ws.ptr(), ws.bytes(), nullptr); }, Error::Kind::invalid_value, "cu_seqlens",
               "-byte aligned");
  if (plan.workspace_bytes() > 0) {  // the workspace: 256 bytes, as Plan::run documents
    const test::DeviceWorkspace big(plan.workspace_bytes() + 256);
    expect_error([&] { plan.run(d.tensors(), static_cast<unsigned char*>(big.ptr()) + 128, plan.workspace_bytes(), nullptr); },
                 Error::Kind::invalid_value, "workspace", "256-byte aligned");
  }
  GDN_CUDA(cudaDeviceSynchronize());
}

TEST_F(Cuda, WrongDevice) {
  int count = 0;
  GDN_CUDA(cudaGetDeviceCount(&count));
  if (count < 2) GTEST_SKIP() << "needs two devices";
  int dev = 0;
  GDN_CUDA(cudaGetDevice(&dev));
  Spec s;
  s.lens = {10};
  s.dk = s.dv = 128;
  Case c = test::random_case(s);
  DeviceCase d(c);
  const Plan plan = Plan::create(d.problem(), test::suite_options(d.problem()));
  const test::DeviceWorkspace ws(plan);
  GDN_CUDA(cudaSetDevice((dev + 1) % count));
  expect_error([&] { plan.run(d.tensors(), ws.ptr(), ws.bytes(), nullptr); }, Error::Kind::invalid_value, "device",
               "expected the plan's device");
  GDN_CUDA(cudaSetDevice(dev));
}

// The fused kernel's positions and list indices are 32-bit: past kFusedMaxTokens tokens (or
// kFusedMaxSeqs sequences) the planner takes the split path, and a caller requiring the fused kernel
// gets an error at planning, not a wrapped index in the kernel. (Metadata only: nothing is run.)
TEST_F(Cuda, FusedSizeLimits) {
  if (cuda::find_fused_kernel(DType::bf16, 128, 128) == nullptr) GTEST_SKIP() << "a build without the fused kernel";
  Problem p = cuda_problem();
  p.num_q_heads = p.num_k_heads = p.num_v_heads = 64;
  p.head_dim_k = p.head_dim_v = 128;
  p.has_cu_seqlens = true;
  p.cu_seqlens_dtype = DType::i64;
  for (std::int64_t T : {cuda::kFusedMaxTokens + 1, std::int64_t{1} << 31}) {
    p.total_tokens = T;
    p.num_seqs = 2;
    gdnkit::Options whole;
    whole.segments = 1;
    const Plan plan = Plan::create(p, whole);
    EXPECT_EQ(std::string(plan.kernel_name()).rfind("cuda-split-", 0), 0u) << plan.kernel_name() << " at T=" << T;
    gdnkit::Options fused = whole;
    fused.kernel = cuda::find_fused_kernel(DType::bf16, 128, 128)->name;
    expect_error([&] { Plan::create(p, fused); }, Error::Kind::unsupported, "options.kernel", "32-bit positions");
  }
  p.total_tokens = cuda::kFusedMaxTokens;  // the largest the fused kernel takes
  gdnkit::Options fused;
  fused.segments = 1;
  fused.kernel = cuda::find_fused_kernel(DType::bf16, 128, 128)->name;
  const bool sm90 = test::device_is_sm90();
  if (sm90) EXPECT_NO_THROW(Plan::create(p, fused));
}

// The planner's choice, its shared memory and occupancy (printed for the record). Every walk CTA
// size must fit at least one CTA per SM, and the planner's pick must be a listed instantiation.
TEST_F(Cuda, PlanReportsKernel) {
  const bool sm90 = test::device_is_sm90();
  for (DType dt : {DType::bf16, DType::f16})
    for (int d : {64, 128})
      for (std::int64_t seqs : {1, 1000}) {
        Problem p = cuda_problem();
        p.qkv_dtype = dt;
        p.head_dim_k = p.head_dim_v = d;
        p.num_seqs = seqs;
        p.total_tokens = 100 * seqs;
        const Plan plan = Plan::create(p);
        EXPECT_EQ(plan.backend(), Backend::cuda);
        const std::string name = plan.kernel_name();
        const bool wgmma = name.rfind("cuda-split-wgmma-", 0) == 0;
        const bool fused = name.rfind("cuda-fused-sm90-", 0) == 0;
        EXPECT_TRUE(wgmma || fused || name.rfind("cuda-split-mma-", 0) == 0) << name;
        if (wgmma || fused) EXPECT_TRUE(sm90) << name;
        // 100 tokens per sequence (more than 32 on average): the fused kernel at dv 128, in
        // 128-column blocks where its 2,000 walks fill the SMs, in 64-column ones (CTA pairs) for
        // one sequence of two chunks.
        const bool fused_expected =
            d == 128 && sm90 && cuda::find_fused_kernel(dt, 128, 128) != nullptr;
        EXPECT_EQ(fused, fused_expected) << name;
        const bool v64 = name.size() > 4 && name.substr(name.size() - 4) == "-v64";
        if (fused_expected) EXPECT_EQ(v64, seqs == 1) << name;
        const cuda::SplitKernel* k = fused ? cuda::find_fused_kernel(dt, d, v64 ? 64 : 128) : nullptr;
        for (int w : {1, 2, 4, 8})
          if (!fused && name.size() > 3 && name.substr(name.size() - 3) == "-w" + std::to_string(w))
            k = cuda::find_split_kernel(dt, d, w, wgmma);
        ASSERT_NE(k, nullptr) << name;
        EXPECT_STREQ(k->name, plan.kernel_name());
        // One kRecBytes record per (chunk slot, head): slots = ceil(T / 64) + N, H = 2; none fused.
        const std::size_t slots = static_cast<std::size_t>((p.total_tokens + 63) / 64 + seqs);
        EXPECT_EQ(plan.workspace_bytes(), fused ? 0 : slots * 2 * cuda::kRecBytes);
        int ctas = 0;
        GDN_CUDA(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&ctas, k->walk_func, k->threads, k->walk_smem));
        EXPECT_GE(ctas, 1);
        int prep_ctas = 0;
        if (!fused)
          GDN_CUDA(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&prep_ctas, k->prep_func, cuda::kPrepThreads,
                                                                 k->prep_smem));
        EXPECT_GE(prep_ctas, fused ? 0 : 1);
        std::printf("INFO cuda %s %d SMs  N=%-5lld H=2 d=%d  kernel %-30s smem %zu B  CTAs/SM %d\n",
                    sm90 ? "sm_90" : "not sm_90",
                    test::sm_count(), static_cast<long long>(seqs), d, name.c_str(), k->walk_smem, ctas);
        std::printf("INFO   prep smem %zu B  CTAs/SM %d  workspace %zu B\n", k->prep_smem, prep_ctas,
                    plan.workspace_bytes());
      }
  // Where the planner takes the fused kernel (backend.cu, choose_fused), on an H100/H200 built with
  // it: 128-column blocks when the walks fill half the SMs or average one chunk, 64-column ones for
  // a few short sequences and for long ones with heads near half the SMs (pairs of CTAs sharing records), the
  // split path for long ones with few heads and at dv = 64, the short walk for sequences of a few
  // tokens (short_walk_takes).
  if (sm90 && cuda::find_fused_kernel(DType::bf16, 128, 128) != nullptr) {
    struct Expect {
      std::int64_t heads, seqs, tokens;
      int dv;
      const char* kernel;  // nullptr: a split kernel
    };
    const int sms = test::sm_count();
    for (const Expect& e : {Expect{sms, 1, 4096, 128, "cuda-fused-sm90-bf16-k128"},
                            Expect{4, 64, 64 * 300, 128, "cuda-fused-sm90-bf16-k128"},
                            Expect{8, 1, 512, 128, "cuda-fused-sm90-bf16-k128-v64"},
                            Expect{8, 1, 64, 128, "cuda-fused-sm90-bf16-k128"},
                            Expect{8, 1, 100, 128, "cuda-fused-sm90-bf16-k128-v64"},
                            Expect{8, 1, 8192, 128, nullptr}, Expect{4, 64, 64 * 300, 64, nullptr},
                            Expect{(sms - 4) / 2, 1, 16384, 128, "cuda-fused-sm90-bf16-k128-v64"},
                            Expect{sms, 100, 100 * 40, 128, "cuda-fused-sm90-bf16-k128"},
                            Expect{sms, 100, 100 * 32, 128, "cuda-short-bf16-k128-w8"},
                            Expect{sms, 100, 200, 128, "cuda-short-bf16-k128-w8"}}) {
      Problem p = cuda_problem();
      p.num_q_heads = p.num_k_heads = p.num_v_heads = static_cast<int>(e.heads);
      p.head_dim_k = 128;
      p.head_dim_v = e.dv;
      p.num_seqs = e.seqs;
      p.total_tokens = e.tokens;
      gdnkit::Options unsplit;  // the sequence split has its own test (ContextParallelPlanner)
      unsplit.segments = 1;
      const std::string name = Plan::create(p, unsplit).kernel_name();
      if (e.kernel != nullptr) EXPECT_EQ(name, e.kernel) << e.heads << " heads, " << e.seqs << " sequences";
      else EXPECT_EQ(name.rfind("cuda-split-", 0), 0u) << name << ": " << e.heads << " heads, " << e.seqs << " sequences";
    }
    // Packed lengths unknown to the host: the short walk on a mean of at most 16 tokens only up to
    // 1,024 tokens in all (the mean may hide one long sequence); with the hint, by the longest.
    Problem p = cuda_problem();
    p.num_q_heads = p.num_k_heads = p.num_v_heads = sms;
    p.has_cu_seqlens = true;
    p.num_seqs = 100;
    gdnkit::Options unsplit;
    unsplit.segments = 1;
    p.total_tokens = 500;
    EXPECT_EQ(std::string(Plan::create(p, unsplit).kernel_name()), "cuda-short-bf16-k128-w8");
    p.total_tokens = 1500;
    EXPECT_EQ(std::string(Plan::create(p, unsplit).kernel_name()).rfind("cuda-split-", 0), 0u);
    p.max_seq_len = 32;
    EXPECT_EQ(std::string(Plan::create(p, unsplit).kernel_name()), "cuda-short-bf16-k128-w8");
    p.max_seq_len = 33;
    EXPECT_EQ(std::string(Plan::create(p, unsplit).kernel_name()).rfind("cuda-split-", 0), 0u);
  }
  for (DType dt : {DType::bf16, DType::f16})
    for (int d : {64, 128})
      for (int w : {1, 2, 4, 8, -4, -8}) {  // negative: the wgmma walk of -w warps (sm_90a)
        if (w < 0 && !sm90) continue;
        const cuda::SplitKernel* k = cuda::find_split_kernel(dt, d, w < 0 ? -w : w, w < 0);
        if (w < 0 && k == nullptr) continue;  // built without the CUTLASS headers
        ASSERT_NE(k, nullptr);
        int ctas = 0;
        GDN_CUDA(cudaFuncSetAttribute(k->walk_func, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      static_cast<int>(k->walk_smem)));
        GDN_CUDA(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&ctas, k->walk_func, 32 * k->warps, k->walk_smem));
        EXPECT_GE(ctas, 1) << k->name;
      }
}

}  // namespace

// The fused kernel's walk-list variant (ChunkedParams::walks, the groundwork for splitting
// sequences): every sequence split into three walks at chunk borders (one empty), listed in
// reverse. From the fp64 oracle's states at the borders, o and the final states are within
// tolerance of the oracle; from the kernel's own states there (prefix runs on the same kernel), bit
// for bit those of the unsplit run. Each variant refuses a call without a walk list, and the plain
// kernel one with it.
TEST_F(Cuda, FusedWalkList) {
  const bool sm90 = test::device_is_sm90();
  if (!sm90 || cuda::find_fused_kernel(DType::bf16, 128, 128, true) == nullptr)
    GTEST_SKIP() << "the fused kernel runs on compute capability 9.0 only";
  int i = 0;
  for (DType dt : {DType::bf16, DType::f16})
    for (int dk : {128, 64})
      for (int dvb : {128, 64}) {
        if (dvb > dk) continue;  // no such walk-list variant: a split's map CTAs walk dk / dvb blocks
        Spec s;
        s.lens = {300, 130, 64, 5, 0, 700};
        s.Hq = s.Hk = 1;
        s.Hv = 2;
        s.dk = dk;
        s.dv = 128;
        s.qkv = dt;
        s.initial_state = i % 2 == 0;
        s.final_state = true;
        s.layout = i % 3 == 0 ? StateLayout::vk : StateLayout::kv;
        s.seed = 1600 + i++;
        SCOPED_TRACE(s.describe() + " dvb=" + std::to_string(dvb));
        const std::vector<std::int64_t> c1 = {64, 128, 64, 0, 0, 320}, c2 = {192, 128, 64, 0, 0, 640};
        const cuda::SplitKernel* k = cuda::find_fused_kernel(dt, dk, dvb, true);
        const cuda::SplitKernel* plain = cuda::find_fused_kernel(dt, dk, dvb);
        ASSERT_NE(k, nullptr);
        // Called directly, not through a plan: opt the variant into its shared memory as
        // prepare_kernel (backend.cu) does for the planner's kernels.
        GDN_CUDA(cudaFuncSetAttribute(k->walk_func, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      static_cast<int>(k->walk_smem)));
        gdnkit::Options same;
        same.kernel = plain->name;
        // Runs c on the walk list w (uploaded), returns the launch's status.
        auto run_walks = [&](Case& c, const test::WalkSplit& w, const cuda::SplitKernel* kern, unsigned z = 5) {
          DeviceCase d(c);
          cuda::WalkSpan* walks = nullptr;
          float* states = nullptr;
          GDN_CUDA(cudaMalloc(&walks, w.walks.size() * sizeof(cuda::WalkSpan)));
          GDN_CUDA(cudaMalloc(&states, w.states.size() * sizeof(float)));
          GDN_CUDA(cudaMemcpy(walks, w.walks.data(), w.walks.size() * sizeof(cuda::WalkSpan), cudaMemcpyHostToDevice));
          GDN_CUDA(cudaMemcpy(states, w.states.data(), w.states.size() * sizeof(float), cudaMemcpyHostToDevice));
          cuda::ChunkedParams p = cuda::chunked_params(d.problem(), c.shape, d.tensors());
          p.walks = walks;
          p.num_walks = static_cast<std::int64_t>(w.walks.size());
          p.walk_states = states;
          const dim3 grid(static_cast<unsigned>(s.dv / dvb), static_cast<unsigned>(c.shape.H), z);
          const cudaError_t err = kern->launch(p, dim3(), grid, nullptr);
          GDN_CUDA(cudaDeviceSynchronize());
          d.download();
          cudaFree(walks);
          cudaFree(states);
          return err;
        };
        // From the oracle's states.
        Case c = test::random_case(s);
        const test::Reference ref = test::run_reference(c);
        const test::WalkSplit w = test::split_walks(c, c1, c2);
        EXPECT_EQ(run_walks(c, w, k), cudaSuccess);
        const Errors e = test::compare(c, ref);
        EXPECT_TRUE(e.issues.empty()) << e.issues;
        EXPECT_LT(e.o, tol_all(dt));
        EXPECT_LT(e.o_worst, tol_worst(dt));
        EXPECT_LT(e.state, tol_all(dt));
        EXPECT_LT(e.state_worst, tol_worst(dt));
        report("fused walk list", s, e, k->name);
        // From the kernel's own states: the prefix runs' final states replace the oracle's.
        Case full = test::random_case(s);
        {
          DeviceCase d(full);
          EXPECT_EQ(test::run_device(full, d, nullptr, same), plain->name);
        }
        test::WalkSplit own = test::split_walks(full, c1, c2);
        const std::vector<std::int64_t> zero(c1.size(), 0);
        for (int level = 0; level < 2; ++level) {
          Case part = test::sub_case(full, zero, level == 0 ? c1 : c2);
          DeviceCase d(part);
          EXPECT_EQ(test::run_device(part, d, nullptr, same), plain->name);
          std::copy_n(part.fin.data(), part.state_elems(), own.states.data() + level * part.state_elems());
        }
        Case split = test::random_case(s);  // the same inputs (same seed), outputs poisoned afresh
        EXPECT_EQ(run_walks(split, own, k), cudaSuccess);
        EXPECT_TRUE(test::written_issues(split).empty()) << test::written_issues(split);
        // The unsplit run's kernel: the paired instantiation where the launch forms pairs.
        const bool paired = plain->paired_func != nullptr && (s.dv / dvb) % 2 == 0;
        if (k->block_solve == (paired ? plain->paired_block_solve : plain->block_solve)) {
          EXPECT_EQ(test::gather_o(split), test::gather_o(full)) << "walks split on chunk borders must be bit-identical";
          EXPECT_EQ(test::gather_state(split), test::gather_state(full))
              << "walks split on chunk borders must be bit-identical";
        } else {  // the same math, Vn solved another way: equal within rounding
          EXPECT_LT(test::rel_l2(test::gather_o(split), test::gather_o(full)), tol_all(dt) / 4);
          EXPECT_LT(test::rel_l2(test::gather_state(split), test::gather_state(full)), tol_all(dt) / 4);
        }
        // The variants refuse the wrong kind of call, and a CTA of more walks than it keeps.
        EXPECT_EQ(run_walks(split, own, plain), cudaErrorInvalidValue);
        ASSERT_GT(own.walks.size(), static_cast<std::size_t>(cuda::kCtaWalks));
        EXPECT_EQ(run_walks(split, own, k, 1), cudaErrorInvalidValue) << own.walks.size() << " walks in one CTA";
        {
          DeviceCase d(split);
          const cuda::ChunkedParams p = cuda::chunked_params(d.problem(), split.shape, d.tensors());
          EXPECT_EQ(k->launch(p, dim3(), dim3(1, 1, 1), nullptr), cudaErrorInvalidValue);
        }
      }
}

// ---- Context parallelism (options.segments; src/cuda/cp.cuh) ----------------------------------------

namespace {

// The split's kernels run here: compute capability 9.0 and a build with the fused kernels.
bool split_runs_here() {
  return test::device_is_sm90() && gdnkit::cuda::find_fused_kernel(DType::bf16, 128, 128, true) != nullptr;
}

Spec cp_spec(std::vector<std::int64_t> lens, bool cu, int dk, int dv, DType dt, std::uint64_t seed) {
  Spec s = test::split_case(std::move(lens), cu, 2, 4, dk, dv, seed);
  s.qkv = dt;
  return s;
}

}  // namespace

// Split runs against the oracle and against the same problem unsplit: segment counts from 2 (one
// scan step; none without a final state) to many (a segment of one chunk), with and without the
// final state (the scan's last step only makes it), short last segments, both dtypes, dk and dv 64 and 128,
// both state layouts, in-place states, no gate and almost no decay (where the segments' maps carry
// the answer: realistic gates decay a start state to nothing within a segment), uniform batches
// and packed ones of uneven lengths (some sequences not split, one empty).
TEST_F(Cuda, ContextParallel) {
  if (!split_runs_here()) GTEST_SKIP() << "the split runs on compute capability 9.0 with the CUTLASS build only";
  struct Run {
    Spec spec;
    int segments;
  };
  std::vector<Run> runs;
  {
    Spec s = cp_spec({4096}, true, 128, 128, DType::bf16, 1700);
    s.inputs = Inputs::hard;
    s.initial_state = true;
    runs.push_back({s, 8});
    s.seed = 1701;
    runs.push_back({s, 2});
    s.seed = 1702;
    s.has_gate = false;
    s.layout = StateLayout::vk;
    s.in_place = true;
    runs.push_back({s, 5});
  }
  {
    Spec s = cp_spec({1000}, true, 128, 128, DType::f16, 1703);  // segments of 128 + a last one of 104
    s.inputs = Inputs::hard;
    s.initial_state = true;
    s.o_head_pad = 8;  // padded o rows
    s.o_token_pad = 24;
    runs.push_back({s, 8});
    s = cp_spec({700, 700, 700}, false, 64, 128, DType::bf16, 1704);
    s.inputs = Inputs::hard;
    runs.push_back({s, 4});
    s = cp_spec({640}, false, 128, 64, DType::bf16, 1705);  // dv 64: 64-column blocks in both stages
    s.has_gate = false;
    s.initial_state = true;
    s.gate_space = GateSpace::linear;
    runs.push_back({s, 10});  // one chunk per segment
    s = cp_spec({3000}, true, 128, 128, DType::bf16, 1706);
    s.Hq = 8, s.Hk = s.Hv = 4;  // GQA
    s.beta_dtype = DType::bf16;
    runs.push_back({s, 6});
    s = cp_spec({130}, true, 128, 128, DType::bf16, 1707);  // 3 chunks: 3 segments, the last of 2 tokens
    s.inputs = Inputs::hard;
    s.initial_state = true;
    runs.push_back({s, 16});
    // A packed batch of uneven lengths: segments of 320 tokens (a fourth of the mean), so 10, 1,
    // 3, 1, 1 and 8 segments; the lengths are read on the device.
    s = cp_spec({3000, 0, 700, 64, 1, 2500}, true, 128, 128, DType::bf16, 1708);
    s.inputs = Inputs::hard;
    s.initial_state = true;
    s.in_place = true;
    s.cu_dtype = DType::i64;
    runs.push_back({s, 4});
    s = cp_spec({1500, 900, 20}, true, 64, 64, DType::f16, 1709);
    s.has_gate = false;
    s.layout = StateLayout::vk;
    runs.push_back({s, 5});
    // A packed batch of many sequences (70, each in three segments of 128, 128 and 44 tokens, one
    // of a single token and not split): 208 stage-1 walks, several waves of CTAs.
    {
      std::vector<std::int64_t> lens(70, 300);
      lens[5] = 1;
      s = cp_spec(lens, true, 128, 128, DType::bf16, 1713);
      s.inputs = Inputs::hard;
      s.initial_state = true;
      runs.push_back({s, 2});
    }
    // No final state: two segments of one sequence launch no scan; more skip the last step, also
    // in a packed batch whose lengths only the device knows.
    s = cp_spec({2048}, true, 128, 128, DType::bf16, 1710);
    s.inputs = Inputs::hard;
    s.initial_state = true;
    s.final_state = false;
    runs.push_back({s, 2});
    s.seed = 1711;
    runs.push_back({s, 6});
    s = cp_spec({3000, 0, 700, 64, 1, 2500}, true, 128, 128, DType::bf16, 1712);
    s.inputs = Inputs::hard;
    s.final_state = false;
    runs.push_back({s, 4});
    // Reset-style gates (-inf, -1e30, ...; common/gate.h's floor) inside segments, both spaces.
    s = cp_spec({4000}, true, 128, 128, DType::bf16, 1730);
    s.inputs = Inputs::resets;
    s.initial_state = true;
    runs.push_back({s, 5});
    s.gate_space = GateSpace::linear;
    s.seed = 1731;
    runs.push_back({s, 3});
    // 16 value heads (GVA) in four segments: on an H200 stage 1 runs at 128 columns in value and
    // map pairs (128 CTAs; at 64 columns 224, two waves).
    s = cp_spec({2048}, true, 128, 128, DType::bf16, 1733);
    s.Hq = s.Hk = 4, s.Hv = 16;
    s.inputs = Inputs::hard;
    s.initial_state = true;
    runs.push_back({s, 4});
    // 40 heads in two segments: on an H200 stage 1 runs at 128 columns without value and map
    // pairs (paired, the first segment's map CTAs would make 160 CTAs, a second wave).
    s = cp_spec({1024}, true, 128, 128, DType::bf16, 1732);
    s.Hq = s.Hk = s.Hv = 40;
    s.inputs = Inputs::hard;
    s.initial_state = true;
    runs.push_back({s, 2});
    // 32 segments of four chunks, four value heads: a long scan (31 steps per sequence and head).
    s = cp_spec({8192}, true, 128, 128, DType::bf16, 1734);
    s.Hq = s.Hk = 1, s.Hv = 4;
    s.inputs = Inputs::hard;
    s.initial_state = true;
    runs.push_back({s, 32});
  }
  for (const Run& r : runs) {
    gdnkit::Options split, whole;
    split.segments = r.segments;
    whole.segments = 1;
    std::string ks, kw;
    const Errors es = check_case(r.spec, "split into " + std::to_string(r.segments), &ks, split);
    const Errors ew = check_case(r.spec, "the same unsplit", &kw, whole);
    EXPECT_NE(ks.find("-cp"), std::string::npos) << ks;
    EXPECT_EQ(kw.find("-cp"), std::string::npos) << kw;
    // Exact: the split's error is the unsplit kernel's, up to rounding (the scan's fp32 sums, the
    // 16-bit copies of states that now start from other values).
    EXPECT_LT(es.o, 1.3 * ew.o + 1e-4) << ks << " vs " << kw;
    EXPECT_LT(es.state, 1.3 * ew.state + 1e-4) << ks << " vs " << kw;
  }
}

namespace {

// Plans pa and pb on two streams at once (each case its own buffers and workspace), checked; then
// pa captured in a graph and replayed on new inputs (seed) in the same buffers, checked.
void two_streams_then_replay(const std::string& what, const Plan& pa, Case& a, DeviceCase& da,
                             const test::Reference& ra, const Plan& pb, const Case& b, DeviceCase& db,
                             const test::Reference& rb, std::uint64_t seed) {
  run_on_two_streams(pa, da, pb, db);
  check_downloaded(what + ", two streams: A", a, ra, pa);
  check_downloaded(what + ", two streams: B", b, rb, pb);
  a.spec.seed = seed;
  test::fill_inputs(a);
  a.poison_outputs();
  const test::Reference r2 = test::run_reference(a);
  CapturedRun run(pa, da);
  da.upload(run.stream());
  run.replay();
  da.download(run.stream());
  check_downloaded(what + ", graph replay", a, r2, pa);
}

}  // namespace

// Lead mode (CpLayout::lead), which the planner picks for one sequence of up to sms / 4 heads at
// dk = dv = 128: the first, longer segment on the unsplit 64-column pairs, the second on a value
// and map pair, in one launch. Against the oracle and the same problem unsplit, as above: both
// dtypes, with and without cu_seqlens and a final state, in place, GVA heads, a tail chunk; then
// on two streams at once and in a captured graph.
TEST_F(Cuda, ContextParallelLeadMode) {
  if (!split_runs_here()) GTEST_SKIP() << "the split runs on compute capability 9.0 with the CUTLASS build only";
  if (test::sm_count() < 128) GTEST_SKIP() << "lead mode needs 4 CTAs per head: 32 heads on 128 SMs";
  if (!gdnkit::cuda::kCpLeadPlanned) GTEST_SKIP() << "a build without lead mode in the planner (GDNKIT_CP_LEAD=0)";
  std::vector<Spec> specs;
  Spec s = cp_spec({4096}, true, 128, 128, DType::bf16, 1740);
  s.Hq = s.Hk = s.Hv = 32;
  s.inputs = Inputs::hard;
  s.initial_state = true;
  specs.push_back(s);
  s = cp_spec({3000}, false, 128, 128, DType::f16, 1741);  // a tail chunk in the second segment
  s.Hq = s.Hk = 16, s.Hv = 32;  // qwen3next's heads
  s.final_state = false;  // no scan launched
  s.layout = StateLayout::vk;
  specs.push_back(s);
  s = cp_spec({6000}, true, 128, 128, DType::bf16, 1742);
  s.Hq = s.Hk = s.Hv = 24;
  s.inputs = Inputs::hard;
  s.initial_state = true;
  s.in_place = true;
  s.gate_space = GateSpace::linear;
  s.beta_dtype = DType::bf16;
  specs.push_back(s);
  for (const Spec& spec : specs) {
    gdnkit::Options planned, whole;
    whole.segments = 1;
    std::string kl, kw;
    const Errors el = check_case(spec, "lead mode", &kl, planned);
    const Errors ew = check_case(spec, "the same unsplit", &kw, whole);
    EXPECT_NE(kl.find("-cp2-lead"), std::string::npos) << kl;
    EXPECT_EQ(kw.find("-cp"), std::string::npos) << kw;
    EXPECT_LT(el.o, 1.3 * ew.o + 1e-4) << kl << " vs " << kw;
    EXPECT_LT(el.state, 1.3 * ew.state + 1e-4) << kl << " vs " << kw;
  }
  // Two plans on two streams at once (each its own workspace), then a graph replay on new inputs.
  Spec sa = specs[0], sb = specs[0];
  sb.lens = {5000};
  sb.seed = 1743;
  Case a = test::random_case(sa), b = test::random_case(sb);
  const test::Reference ra = test::run_reference(a), rb = test::run_reference(b);
  DeviceCase da(a), db(b);
  const Plan pa = Plan::create(da.problem()), pb = Plan::create(db.problem());
  ASSERT_NE(std::string(pa.kernel_name()).find("-lead"), std::string::npos) << pa.kernel_name();
  ASSERT_NE(std::string(pb.kernel_name()).find("-lead"), std::string::npos) << pb.kernel_name();
  two_streams_then_replay("lead mode", pa, a, da, ra, pb, b, db, rb, 1744);
}

// The decay shortcut (Options::split_decay_cutoff) on realistic gates (every segment's start
// state decays to nothing within its first chunk): the error against fp64 is the exact split's,
// in both dtypes, with GVA heads and a packed batch; the plan names the shortcut. (The bound on
// weak decay is tested in the emulation, Emulated.ContextParallelDecayCut.)
TEST_F(Cuda, ContextParallelDecayCut) {
  if (!split_runs_here()) GTEST_SKIP() << "the split runs on compute capability 9.0 with the CUTLASS build only";
  Spec a = cp_spec({4096}, true, 128, 128, DType::bf16, 1720);
  a.initial_state = true;
  Spec b = cp_spec({3000, 0, 700, 2500}, true, 128, 128, DType::f16, 1721);
  b.layout = StateLayout::vk;
  for (const Spec& s : {a, b}) {
    gdnkit::Options cut, exact;
    cut.segments = exact.segments = 6;
    cut.split_decay_cutoff = 1e-6f;
    std::string kc, ke;
    const Errors ec = check_case(s, "split, decay cutoff 1e-6", &kc, cut);
    const Errors ee = check_case(s, "split, exact", &ke, exact);
    EXPECT_NE(kc.find("-decay-cut"), std::string::npos) << kc;
    EXPECT_EQ(ke.find("-decay-cut"), std::string::npos) << ke;
    EXPECT_LT(ec.o, 1.05 * ee.o + 1e-5) << kc << " vs " << ke;
    EXPECT_LT(ec.state, 1.05 * ee.state + 1e-5) << kc << " vs " << ke;
  }
}

// Two cases of one spec (seeds seed and seed + 1), their fp64 references and device copies.
struct CasePair {
  Case a, b;
  test::Reference ra, rb;
  DeviceCase da, db;
  CasePair(Spec s, std::uint64_t seed)
      : a(with_seed(s, seed)), b(with_seed(s, seed + 1)), ra(test::run_reference(a)), rb(test::run_reference(b)),
        da(a), db(b) {}
  static Case with_seed(Spec s, std::uint64_t seed) {
    s.seed = seed;
    return test::random_case(s);
  }
};

// A split plan on two streams at once (each with its own workspace), and captured in a graph.
TEST_F(Cuda, ContextParallelStreamsAndGraph) {
  if (!split_runs_here()) GTEST_SKIP() << "the split runs on compute capability 9.0 with the CUTLASS build only";
  Spec sa = cp_spec({3000}, true, 128, 128, DType::bf16, 1710), sb = cp_spec({2000}, true, 128, 128, DType::bf16, 1711);
  sa.inputs = sb.inputs = Inputs::hard;
  sa.initial_state = sb.initial_state = true;
  Case a = test::random_case(sa), b = test::random_case(sb);
  const test::Reference ra = test::run_reference(a), rb = test::run_reference(b);
  DeviceCase da(a), db(b);
  gdnkit::Options o;
  o.segments = 6;
  const Plan pa = Plan::create(da.problem(), o), pb = Plan::create(db.problem(), o);
  EXPECT_NE(std::string(pa.kernel_name()).find("-cp"), std::string::npos) << pa.kernel_name();
  two_streams_then_replay("split", pa, a, da, ra, pb, b, db, rb, 1712);
}

// A split call's launches as one CUDA graph per stream (Options::split_graph, the default): the
// plan's first call on a stream launches one by one, the second builds the graph, later ones reuse
// it with their own arguments; bit for bit the results of the launches one by one; one plan on two
// streams from two threads at once.
TEST_F(Cuda, ContextParallelLaunchGraph) {
  if (!split_runs_here()) GTEST_SKIP() << "the split runs on compute capability 9.0 with the CUTLASS build only";
  struct Run {
    Spec spec;
    int segments;
    float cutoff;
  };
  std::vector<Run> runs;
  {
    Spec s = cp_spec({4096}, true, 128, 128, DType::bf16, 1740);  // three launches
    s.inputs = Inputs::hard;
    s.initial_state = true;
    runs.push_back({s, 8, 0.0f});
    s = cp_spec({3000, 0, 700, 2500}, true, 128, 128, DType::f16, 1741);  // packed: stage 1 places the lists
    s.layout = StateLayout::vk;
    s.initial_state = true;
    runs.push_back({s, 4, 0.0f});
    s = cp_spec({3000, 700, 2500}, true, 128, 128, DType::bf16, 1742);  // the builder and the stop points: five
    runs.push_back({s, 6, 1e-6f});
    std::vector<std::int64_t> lens(70, 300);  // more sequences than stage 1 places: the builder
    s = cp_spec(lens, true, 64, 128, DType::bf16, 1743);
    s.final_state = false;
    runs.push_back({s, 2, 0.0f});
  }
  auto failed = [](const cuda::LaunchGraphStats& st) {
    return std::string(st.failed_call != nullptr ? st.failed_call : "none") + ": " + cudaGetErrorName(st.failed_error);
  };
  auto same_bits = [](const auto& x, const auto& y) {  // guards and poison (NaN) included
    return x.size() == y.size() && std::memcmp(x.data(), y.data(), x.size() * sizeof(x[0])) == 0;
  };
  cudaStream_t s1 = nullptr, s2 = nullptr;
  GDN_CUDA(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
  GDN_CUDA(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
  for (Run& r : runs) {
    SCOPED_TRACE(r.spec.describe());
    Case c = test::random_case(r.spec);
    const test::Reference ref = test::run_reference(c);
    DeviceCase d(c);
    gdnkit::Options graph, direct;
    graph.segments = direct.segments = r.segments;
    graph.split_decay_cutoff = direct.split_decay_cutoff = r.cutoff;
    direct.split_graph = false;
    const Plan pg = Plan::create(d.problem(), graph), pd = Plan::create(d.problem(), direct);
    ASSERT_NE(std::string(pg.kernel_name()).find("-cp"), std::string::npos) << pg.kernel_name();
    const test::DeviceWorkspace w(pg);

    // The first call on the legacy stream: one by one.
    const cuda::LaunchGraphStats st0 = cuda::launch_graph_stats();
    pg.run(d.tensors(), w.ptr(), w.bytes(), nullptr);
    d.download();
    check_downloaded("split, first call", c, ref, pg);
    const cuda::LaunchGraphStats st1 = cuda::launch_graph_stats();
    EXPECT_EQ(st1.graphs, st0.graphs);
    EXPECT_EQ(st1.direct_launches - st0.direct_launches, 1);
    const std::vector<std::uint16_t> o_direct = c.o.buf;
    const std::vector<float> fin_direct = c.fin.buf;

    // The second builds the graph and launches it: the same bits.
    c.poison_outputs();
    d.upload();
    pg.run(d.tensors(), w.ptr(), w.bytes(), nullptr);
    d.download();
    const cuda::LaunchGraphStats st2 = cuda::launch_graph_stats();
    EXPECT_EQ(st2.failures, st1.failures) << failed(st2);
    EXPECT_EQ(st2.graphs - st1.graphs, 1);
    EXPECT_EQ(st2.graph_launches - st1.graph_launches, 1);
    // Every launch after the first is programmatic; the graph keeps that on its edges.
    EXPECT_GE(st2.nodes - st1.nodes, 2);
    EXPECT_EQ(st2.programmatic_edges - st1.programmatic_edges, st2.nodes - st1.nodes - 1);
    EXPECT_TRUE(same_bits(c.o.buf, o_direct)) << "o differs between the graph and the launches one by one";
    EXPECT_TRUE(same_bits(c.fin.buf, fin_direct)) << "the final state differs between the graph and the launches one by one";
    EXPECT_EQ(st2.nodes_set, st1.nodes_set) << "the call that captured the graph set its nodes again";
    // The same arguments again: the graph launches as it is, no node set, the same bits.
    c.poison_outputs();
    d.upload();
    pg.run(d.tensors(), w.ptr(), w.bytes(), nullptr);
    d.download();
    const cuda::LaunchGraphStats st2b = cuda::launch_graph_stats();
    EXPECT_EQ(st2b.nodes_set, st2.nodes_set);
    EXPECT_EQ(st2b.graph_launches - st2.graph_launches, 1);
    EXPECT_TRUE(same_bits(c.o.buf, o_direct)) << "o differs on the graph's unchanged launch";
    EXPECT_TRUE(same_bits(c.fin.buf, fin_direct)) << "the final state differs on the graph's unchanged launch";

    // split_graph = false: never a graph.
    for (int i = 0; i < 2; ++i) pd.run(d.tensors(), w.ptr(), w.bytes(), nullptr);
    GDN_CUDA(cudaStreamSynchronize(nullptr));
    const cuda::LaunchGraphStats st3 = cuda::launch_graph_stats();
    EXPECT_EQ(st3.graphs, st2b.graphs);
    EXPECT_EQ(st3.graph_launches, st2b.graph_launches);

    // New inputs and another workspace: the graph takes the call's arguments. Another stream gets
    // a graph of its own at its second call.
    c.spec.seed += 100;
    test::fill_inputs(c);
    c.poison_outputs();
    const test::Reference ref2 = test::run_reference(c);
    d.upload();
    const test::DeviceWorkspace w2(pg);
    const cuda::LaunchGraphStats st3b = cuda::launch_graph_stats();
    pg.run(d.tensors(), w2.ptr(), w2.bytes(), nullptr);
    d.download();
    check_downloaded("split, the graph reused", c, ref2, pg);
    EXPECT_GT(cuda::launch_graph_stats().nodes_set, st3b.nodes_set) << "another workspace set no node";
    // The same workspace with every tensor in other buffers (a second device copy of the case): the
    // call's key differs, so the nodes take the new addresses and the results land there.
    {
      c.poison_outputs();
      DeviceCase d2(c);  // uploads the inputs and the poisoned outputs
      const cuda::LaunchGraphStats before = cuda::launch_graph_stats();
      pg.run(d2.tensors(), w2.ptr(), w2.bytes(), nullptr);
      d2.download();
      check_downloaded("split, the graph on other tensors", c, ref2, pg);
      const cuda::LaunchGraphStats after = cuda::launch_graph_stats();
      EXPECT_GT(after.nodes_set, before.nodes_set) << "other tensors set no node";
      EXPECT_EQ(after.graph_launches - before.graph_launches, 1);
      EXPECT_EQ(after.failures, before.failures) << failed(after);
    }
    for (int i = 0; i < 2; ++i) {
      c.poison_outputs();
      d.upload(s1);
      pg.run(d.tensors(), w.ptr(), w.bytes(), s1);
      d.download(s1);
      check_downloaded(i == 0 ? "split, a second stream, first call" : "split, a second stream's graph", c, ref2, pg);
    }
    // Since st3: the graph on another workspace and on other tensors (two launches), then the
    // second stream's first call one by one and its own graph's first launch.
    const cuda::LaunchGraphStats st4 = cuda::launch_graph_stats();
    EXPECT_EQ(st4.graphs - st3.graphs, 1);
    EXPECT_EQ(st4.graph_launches - st3.graph_launches, 3);
    EXPECT_EQ(st4.direct_launches - st3.direct_launches, 1);
    EXPECT_EQ(st4.failures, st3.failures) << failed(st4);
  }

  // One plan, two threads, two streams, eight calls each: each stream's graph is set and launched
  // under its own lock; both results right.
  Spec sp = cp_spec({3000}, true, 128, 128, DType::bf16, 1744);
  sp.initial_state = true;
  CasePair cases(sp, 1744);
  auto& [a, b, ra, rb, da, db] = cases;
  gdnkit::Options o;
  o.segments = 6;
  const Plan plan = Plan::create(da.problem(), o);
  const test::DeviceWorkspace wa(plan), wb(plan);
  const cuda::LaunchGraphStats before = cuda::launch_graph_stats();
  std::string errors[2];
  auto calls = [&](DeviceCase& d, const test::DeviceWorkspace& w, cudaStream_t s, std::string& error) {
    try {
      for (int i = 0; i < 8; ++i) plan.run(d.tensors(), w.ptr(), w.bytes(), s);
    } catch (const std::exception& e) {
      error = e.what();
    }
  };
  std::thread ta(calls, std::ref(da), std::cref(wa), s1, std::ref(errors[0]));
  std::thread tb(calls, std::ref(db), std::cref(wb), s2, std::ref(errors[1]));
  ta.join();
  tb.join();
  EXPECT_EQ(errors[0], "");
  EXPECT_EQ(errors[1], "");
  da.download(s1);
  db.download(s2);
  check_downloaded("split, thread A's graph", a, ra, plan);
  check_downloaded("split, thread B's graph", b, rb, plan);
  const cuda::LaunchGraphStats after = cuda::launch_graph_stats();
  EXPECT_EQ(after.graphs - before.graphs, 2);  // each stream's first call one by one, then its graph
  EXPECT_EQ(after.graph_launches - before.graph_launches, 14);
  GDN_CUDA(cudaStreamDestroy(s1));
  GDN_CUDA(cudaStreamDestroy(s2));
}

// A stream captured in global mode (PyTorch's default) while split plans build their graphs,
// on this thread and on others: the capture comes through whole, as does each plan's result. The
// library's calls that capture counts as unsafe (the build; the context bound at a new thread's
// first call) run in relaxed mode; in the default mode they are refused and break the capture.
class GlobalCapture {
 public:
  GlobalCapture() {
    GDN_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    GDN_CUDA(cudaMalloc(&marker_, kBytes));
    GDN_CUDA(cudaMemset(marker_, 0, kBytes));
  }
  ~GlobalCapture() {
    cudaFree(marker_);
    cudaStreamDestroy(stream_);
  }
  GlobalCapture(const GlobalCapture&) = delete;
  GlobalCapture& operator=(const GlobalCapture&) = delete;
  void begin() {
    GDN_CUDA(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeGlobal));
    GDN_CUDA(cudaMemsetAsync(marker_, 0x5a, kBytes, stream_));
  }
  // Ends the capture; "" when it came through and its replay set the marker.
  std::string end() {
    cudaGraph_t graph = nullptr;
    const cudaError_t err = cudaStreamEndCapture(stream_, &graph);
    if (err != cudaSuccess) return std::string("cudaStreamEndCapture: ") + cudaGetErrorName(err);
    cudaGraphExec_t exec = nullptr;
    std::string out;
    unsigned char host[kBytes] = {};
    if (cudaGraphInstantiate(&exec, graph, 0) != cudaSuccess || cudaGraphLaunch(exec, stream_) != cudaSuccess ||
        cudaMemcpyAsync(host, marker_, kBytes, cudaMemcpyDeviceToHost, stream_) != cudaSuccess ||
        cudaStreamSynchronize(stream_) != cudaSuccess)
      out = std::string("the captured graph's replay: ") + cudaGetErrorName(cudaGetLastError());
    else if (std::count(host, host + kBytes, 0x5a) != static_cast<std::ptrdiff_t>(kBytes))
      out = "the captured graph did not set the marker";
    if (exec != nullptr) cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    return out;
  }

 private:
  static constexpr std::size_t kBytes = 256;
  cudaStream_t stream_ = nullptr;
  void* marker_ = nullptr;
};

TEST_F(Cuda, ContextParallelGraphBesideCapture) {
  if (!split_runs_here()) GTEST_SKIP() << "the split runs on compute capability 9.0 with the CUTLASS build only";
  Spec s = cp_spec({4096}, true, 128, 128, DType::bf16, 1750);
  s.initial_state = true;
  gdnkit::Options o;
  o.segments = 8;
  auto failed = [](const cuda::LaunchGraphStats& st) {
    return std::string(st.failed_call != nullptr ? st.failed_call : "none") + ": " + cudaGetErrorName(st.failed_error);
  };
  // Two calls of a new plan on stream (one by one, then the graph's build and launch); the error's
  // text, "" for none.
  auto two_calls = [](const Plan& plan, DeviceCase& d, const test::DeviceWorkspace& w, cudaStream_t stream) {
    try {
      for (int i = 0; i < 2; ++i) plan.run(d.tensors(), w.ptr(), w.bytes(), stream);
    } catch (const std::exception& e) {
      return std::string(e.what());
    }
    return std::string();
  };

  // This thread captures a stream of its own while it runs the plan on another.
  {
    Case c = test::random_case(s);
    const test::Reference ref = test::run_reference(c);
    DeviceCase d(c);
    const Plan plan = Plan::create(d.problem(), o);
    ASSERT_NE(std::string(plan.kernel_name()).find("-cp"), std::string::npos) << plan.kernel_name();
    const test::DeviceWorkspace w(plan);
    cudaStream_t stream = nullptr;
    GDN_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    d.upload(stream);
    GlobalCapture capture;
    const cuda::LaunchGraphStats before = cuda::launch_graph_stats();
    capture.begin();
    const std::string error = two_calls(plan, d, w, stream);
    EXPECT_EQ(capture.end(), "") << "the capture on this thread";
    EXPECT_EQ(error, "");
    const cuda::LaunchGraphStats after = cuda::launch_graph_stats();
    EXPECT_EQ(after.graphs - before.graphs, 1) << failed(after);
    EXPECT_EQ(after.graph_launches - before.graph_launches, 1);
    EXPECT_EQ(after.failures, before.failures) << failed(after);
    cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;  // the thread's mode is put back
    GDN_CUDA(cudaThreadExchangeStreamCaptureMode(&mode));
    EXPECT_EQ(mode, cudaStreamCaptureModeGlobal);
    GDN_CUDA(cudaThreadExchangeStreamCaptureMode(&mode));
    d.download(stream);
    check_downloaded("split beside this thread's capture", c, ref, plan);
    GDN_CUDA(cudaStreamDestroy(stream));
  }

  // Another thread captures while this thread, and a new thread (its first CUDA call is the
  // plan's), run plans.
  {
    CasePair cases(s, 1751);
    auto& [a, b, ra, rb, da, db] = cases;
    const Plan pa = Plan::create(da.problem(), o), pb = Plan::create(db.problem(), o);
    const test::DeviceWorkspace wa(pa), wb(pb);
    cudaStream_t sa = nullptr, sb = nullptr;
    GDN_CUDA(cudaStreamCreateWithFlags(&sa, cudaStreamNonBlocking));
    GDN_CUDA(cudaStreamCreateWithFlags(&sb, cudaStreamNonBlocking));
    da.upload(sa);
    db.upload(sb);
    GlobalCapture capture;
    const cuda::LaunchGraphStats before = cuda::launch_graph_stats();
    std::promise<void> begun, done;
    std::string capture_error;
    std::thread capturer([&] {
      try {
        capture.begin();
      } catch (const std::exception& e) {
        capture_error = e.what();
      }
      begun.set_value();
      done.get_future().wait();
      if (capture_error.empty()) capture_error = capture.end();
    });
    begun.get_future().wait();
    std::string error_b;
    std::thread fresh([&] { error_b = two_calls(pb, db, wb, sb); });
    const std::string error_a = two_calls(pa, da, wa, sa);
    fresh.join();
    done.set_value();
    capturer.join();
    EXPECT_EQ(capture_error, "") << "the capture on another thread";
    EXPECT_EQ(error_a, "");
    EXPECT_EQ(error_b, "");
    const cuda::LaunchGraphStats after = cuda::launch_graph_stats();
    EXPECT_EQ(after.graphs - before.graphs, 2) << failed(after);
    EXPECT_EQ(after.failures, before.failures) << failed(after);
    da.download(sa);
    db.download(sb);
    check_downloaded("split beside another thread's capture", a, ra, pa);
    check_downloaded("split on a new thread beside another thread's capture", b, rb, pb);
    GDN_CUDA(cudaStreamDestroy(sa));
    GDN_CUDA(cudaStreamDestroy(sb));
  }

  // cudaStreamPerThread names another stream on each thread: one plan, two threads, a graph each
  // (one graph between them would order each thread's calls behind the other's).
  {
    CasePair cases(s, 1753);
    auto& [a, b, ra, rb, da, db] = cases;
    const Plan plan = Plan::create(da.problem(), o);
    const test::DeviceWorkspace wa(plan), wb(plan);
    da.upload();
    db.upload();
    const cuda::LaunchGraphStats before = cuda::launch_graph_stats();
    auto three_calls = [&](DeviceCase& d, const test::DeviceWorkspace& w, std::string& error) {
      try {
        for (int i = 0; i < 3; ++i) plan.run(d.tensors(), w.ptr(), w.bytes(), cudaStreamPerThread);
        if (cudaStreamSynchronize(cudaStreamPerThread) != cudaSuccess) throw std::runtime_error("synchronize");
      } catch (const std::exception& e) {
        error = e.what();
      }
    };
    std::string ea, eb;
    std::thread ta(three_calls, std::ref(da), std::cref(wa), std::ref(ea));
    std::thread tb(three_calls, std::ref(db), std::cref(wb), std::ref(eb));
    ta.join();
    tb.join();
    EXPECT_EQ(ea, "");
    EXPECT_EQ(eb, "");
    const cuda::LaunchGraphStats after = cuda::launch_graph_stats();
    EXPECT_EQ(after.graphs - before.graphs, 2) << failed(after);
    EXPECT_EQ(after.graph_launches - before.graph_launches, 4);
    da.download();
    db.download();
    check_downloaded("split on thread A's per-thread stream", a, ra, plan);
    check_downloaded("split on thread B's per-thread stream", b, rb, plan);
  }

  // More streams than a plan keeps graphs for: the newest take over the least recently used, and
  // a stream whose graph was taken over starts again (one by one, then a graph of its own).
  {
    Case c = test::random_case(s);
    const test::Reference ref = test::run_reference(c);
    DeviceCase d(c);
    const Plan plan = Plan::create(d.problem(), o);
    const test::DeviceWorkspace w(plan);
    d.upload();
    constexpr int kStreams = cuda::LaunchGraphs::kMaxGraphs + 2;
    std::vector<cudaStream_t> streams(kStreams);
    for (cudaStream_t& st : streams) GDN_CUDA(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    const cuda::LaunchGraphStats before = cuda::launch_graph_stats();
    for (cudaStream_t st : streams) {  // each stream's call after the previous stream's
      for (int i = 0; i < 2; ++i) plan.run(d.tensors(), w.ptr(), w.bytes(), st);
      GDN_CUDA(cudaStreamSynchronize(st));
    }
    const cuda::LaunchGraphStats mid = cuda::launch_graph_stats();
    EXPECT_EQ(mid.graphs - before.graphs, kStreams) << failed(mid);
    EXPECT_EQ(mid.evictions - before.evictions, kStreams - cuda::LaunchGraphs::kMaxGraphs);
    EXPECT_EQ(mid.graph_launches - before.graph_launches, kStreams);
    // The first stream's graph went to the last streams: a call one by one, then a new graph.
    c.poison_outputs();
    d.upload();
    for (int i = 0; i < 2; ++i) plan.run(d.tensors(), w.ptr(), w.bytes(), streams[0]);
    GDN_CUDA(cudaStreamSynchronize(streams[0]));
    const cuda::LaunchGraphStats after = cuda::launch_graph_stats();
    EXPECT_EQ(after.graphs - mid.graphs, 1);
    EXPECT_EQ(after.direct_launches - mid.direct_launches, 1);
    EXPECT_EQ(after.failures, before.failures) << failed(after);
    d.download();
    check_downloaded("split after its stream's graph was taken over", c, ref, plan);
    for (cudaStream_t st : streams) GDN_CUDA(cudaStreamDestroy(st));
  }
}

// What the planner picks on its own (metadata only: nothing runs), and the errors of a request
// it cannot honour.
TEST_F(Cuda, ContextParallelPlanner) {
  auto problem = [](int hqk, int hv, std::int64_t n, std::int64_t len, bool cu) {
    Problem p;
    p.total_tokens = n * len;
    p.num_seqs = n;
    p.num_q_heads = p.num_k_heads = hqk;
    p.num_v_heads = hv;
    p.has_cu_seqlens = cu;
    p.memory = Memory::cuda;
    return p;
  };
  const bool hopper = split_runs_here() && test::sm_count() >= 100;
  const std::string tp8 = Plan::create(problem(2, 8, 1, 32768, true)).kernel_name();
  const std::string many = Plan::create(problem(16, 64, 4, 8192, false)).kernel_name();
  const std::string varlen = Plan::create(problem(2, 8, 2, 32768, true)).kernel_name();
  const std::string wide = Plan::create(problem(16, 32, 8, 4096, true)).kernel_name();
  Problem skewed = problem(2, 8, 4, 8192, true);  // e.g. 20000 + 8000 + 3000 + 1768 tokens
  const std::string skew_mean = Plan::create(skewed).kernel_name();
  skewed.max_seq_len = 20000;  // the hint: the longest sequence sets the unsplit time
  const std::string skew_hint = Plan::create(skewed).kernel_name();
  std::printf("planner: tp8 n4 t32768 -> %s without max_seq_len, %s with 20000\n", skew_mean.c_str(),
              skew_hint.c_str());
  if (hopper) {
    EXPECT_NE(skew_hint.find("-cp"), std::string::npos) << "a 20000-token walk on 8 heads";
    // Without the hint the planner plans for the worst case (one sequence of all 32768 tokens)
    // where that costs no more than the unsplit kernel on equal lengths.
    EXPECT_NE(skew_mean.find("-cp"), std::string::npos) << "packed lengths unknown, 4 sequences on 8 heads";
  }
  // ... but not where equal lengths would all be walked whole (no longer than the worst case's
  // segments), which is slower than the unsplit kernel.
  const std::string short8 = Plan::create(problem(2, 8, 8, 4096, true)).kernel_name();
  std::printf("planner: tp8 n8 t32768 without max_seq_len -> %s\n", short8.c_str());
  EXPECT_EQ(short8.find("-cp"), std::string::npos) << short8;
  std::printf("planner: qwen35tp8 b1 t32768 -> %s; qwen35 b4 t8192 -> %s; tp8 varlen n2 t65536 -> %s; "
              "qwen3next varlen n8 t32768 -> %s\n",
              tp8.c_str(), many.c_str(), varlen.c_str(), wide.c_str());
  if (hopper) {
    EXPECT_NE(tp8.find("-cp"), std::string::npos) << "8 walks of 512 chunks on " << test::sm_count() << " SMs";
    EXPECT_NE(varlen.find("-cp"), std::string::npos) << "16 walks of 512 chunks (packed, cu_seqlens)";
  }
  EXPECT_EQ(many.find("-cp"), std::string::npos) << "256 walks fill the GPU";
  EXPECT_EQ(wide.find("-cp"), std::string::npos) << "256 walks fill the GPU";
  // With the decay shortcut a split costs little more than the walk of its longest segment: the
  // planner splits one long sequence of 32 or 64 heads too, but not a short one.
  gdnkit::Options cut;
  cut.split_decay_cutoff = 1e-6f;
  const std::string next_long = Plan::create(problem(16, 32, 1, 65536, true), cut).kernel_name();
  const std::string next_short = Plan::create(problem(16, 32, 1, 4096, true), cut).kernel_name();
  std::printf("planner, decay cutoff 1e-6: qwen3next b1 t65536 -> %s, t4096 -> %s\n", next_long.c_str(),
              next_short.c_str());
  if (hopper) EXPECT_NE(next_long.find("-decay-cut"), std::string::npos) << next_long;
  EXPECT_EQ(next_short.find("-cp"), std::string::npos) << next_short;
  // Exact: one long sequence of 32 heads splits in two (the split path's 128 walk CTAs take
  // ~3.2 us per chunk, the split's 128 fused CTAs in value and map pairs ~4 us for half the chunks:
  // 25% faster at 65536 tokens on an H200, perf-notes), and so does one of 4096 tokens (by the
  // model 16% faster); one of 1024 tokens (by the model 7% slower split) and one of 64 heads
  // (slower split) do not.
  const std::string exact_long = Plan::create(problem(16, 32, 1, 65536, true)).kernel_name();
  const std::string exact_mid = Plan::create(problem(16, 32, 1, 4096, true)).kernel_name();
  const std::string exact_short = Plan::create(problem(16, 32, 1, 1024, true)).kernel_name();
  const std::string exact_64 = Plan::create(problem(16, 64, 1, 32768, true)).kernel_name();
  std::printf("planner, exact: qwen3next b1 t65536 -> %s, t4096 -> %s, t1024 -> %s; qwen35 b1 t32768 -> %s\n",
              exact_long.c_str(), exact_mid.c_str(), exact_short.c_str(), exact_64.c_str());
  if (hopper) {
    EXPECT_NE(exact_long.find("-cp2"), std::string::npos) << exact_long;
    EXPECT_NE(exact_mid.find("-cp2"), std::string::npos) << exact_mid;
  }
  EXPECT_EQ(exact_short.find("-cp"), std::string::npos) << exact_short;
  EXPECT_EQ(exact_64.find("-cp"), std::string::npos) << exact_64;

  gdnkit::Options o;
  o.segments = -1;
  expect_error([&] { Plan::create(problem(2, 8, 1, 4096, true), o); }, Error::Kind::invalid_value,
               "options.segments", "got -1");
  o.segments = 4;  // 64 sequences of 64 tokens: no sequence of two chunks to cut
  expect_error([&] { Plan::create(problem(2, 8, 64, 64, true), o); }, Error::Kind::unsupported, "options.segments",
               "two chunks or more");
  o.segments = 3;
  o.kernel = "cuda-fused-sm90-bf16-k128";
  expect_error([&] { Plan::create(problem(2, 8, 1, 4096, true), o); }, Error::Kind::invalid_value,
               "options.segments", "options.kernel");
  if (!hopper) {
    o.kernel = nullptr;
    expect_error([&] { Plan::create(problem(2, 8, 1, 4096, true), o); }, Error::Kind::unsupported,
                 "options.segments", "compute capability 9.0");
  }
}
