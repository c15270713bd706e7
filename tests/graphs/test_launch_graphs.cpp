// A split's launches through LaunchGraphs (src/cuda/launch_list.cpp) against a stand-in runtime
// (fake/): what each stream ran is compared with what each call asked for, launch by launch and
// byte by byte, so a node left with an earlier call's arguments shows. Covers the first call one by
// one, the build at the second, the calls that set no node (the same key, or the same arguments
// without a key), the nodes set where arguments changed, refused builds and refused node updates
// (one by one instead, nothing leaked), a caller's capture, the entries taken over past 64 streams,
// and calls from several threads. No GPU needed.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "cuda/launch_list.h"
#include "fake/fake_runtime.h"

namespace {

using gdnkit::cuda::LaunchGraphs;
using gdnkit::cuda::LaunchGraphStats;
using gdnkit::cuda::LaunchList;
using gdnkit::cuda::launch_graph_stats;

struct alignas(64) Params {  // like a fused kernel's parameter block
  const void* q = nullptr;
  const void* o = nullptr;
  long long tokens = 0;
  unsigned char pad[40] = {};
};

// Kernels by signature only (the stand-in runtime never calls them).
void builder(const int*, int) {}
void stage1(Params) {}
void scan(const float*, float*, int) {}
void correction(const void*, void*, long long) {}

void register_kernels() {
  fake::register_kernel(builder);
  fake::register_kernel(stage1);
  fake::register_kernel(scan);
  fake::register_kernel(correction);
}

// A call's buffers: what a split's launches point at.
struct Call {
  std::uintptr_t q, o, ws;
  long long tokens;
  bool keyed = true;
};

// The call's four launches (the builder, stage 1, the scan, the correction), keyed by its buffers
// as launch_cp keys a split.
void fill(LaunchList& list, const Call& c) {
  auto ptr = [](std::uintptr_t a) { return reinterpret_cast<void*>(a); };
  Params p;
  p.q = ptr(c.q);
  p.o = ptr(c.o);
  p.tokens = c.tokens;
  ASSERT_TRUE(list.add(builder, dim3(1), dim3(32), 0, static_cast<const int*>(ptr(c.ws)), 7));
  ASSERT_TRUE(list.add_block(reinterpret_cast<const void*>(&stage1), dim3(static_cast<unsigned>(c.tokens / 64), 8), dim3(384),
                             200 * 1024, 2, &p, sizeof p, alignof(Params)));
  ASSERT_TRUE(list.add(scan, dim3(8), dim3(128), 0, static_cast<const float*>(ptr(c.ws + 256)),
                       static_cast<float*>(ptr(c.ws + 512)), 8));
  ASSERT_TRUE(list.add(correction, dim3(static_cast<unsigned>(c.tokens / 64)), dim3(256), 1024, ptr(c.ws + 512),
                       ptr(c.o), c.tokens));
  if (c.keyed) {  // (a split's lengths come from its plan; here they are the call's, so in its key)
    const std::uintptr_t key[] = {c.q, c.o, c.ws, static_cast<std::uintptr_t>(c.tokens)};
    ASSERT_TRUE(list.set_key(key, sizeof key));
  }
}

// What the list's launches run, as the stand-in logs them.
std::vector<fake::Ran> expected(const LaunchList& list) {
  std::vector<fake::Ran> runs;
  for (int i = 0; i < list.size(); ++i) {
    const auto& l = list[i];
    fake::Ran r{l.func, l.grid, l.smem, {}};
    for (int a = 0; a < l.num_args; ++a) {
      const auto* p = static_cast<const unsigned char*>(l.args[a]);
      r.args.insert(r.args.end(), p, p + l.arg_bytes[a]);
    }
    runs.push_back(r);
  }
  return runs;
}

bool same_runs(const std::vector<fake::Ran>& a, const std::vector<fake::Ran>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (a[i].func != b[i].func || a[i].grid.x != b[i].grid.x || a[i].grid.y != b[i].grid.y ||
        a[i].grid.z != b[i].grid.z || a[i].smem != b[i].smem || a[i].args != b[i].args)
      return false;
  return true;
}

// One call through graphs on stream; what ran must be what it asked for.
void run_call(LaunchGraphs& graphs, const Call& c, cudaStream_t stream, const char* what) {
  SCOPED_TRACE(what);
  LaunchList list;
  fill(list, c);
  ASSERT_EQ(graphs.launch(list, stream), cudaSuccess);
  EXPECT_TRUE(same_runs(fake::take_log(stream), expected(list))) << "what ran is not what the call asked for";
}

cudaStream_t new_stream() {
  cudaStream_t s = nullptr;
  EXPECT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  return s;
}

TEST(LaunchGraphs, EachCallRunsItsOwnArguments) {
  register_kernels();
  const cudaStream_t s = new_stream();
  {
    LaunchGraphs graphs;
    const Call a{0x10000, 0x20000, 0x30000, 4096}, b{0x11000, 0x21000, 0x31000, 4096};
    const LaunchGraphStats st0 = launch_graph_stats();
    run_call(graphs, a, s, "first call: one by one");
    const LaunchGraphStats st1 = launch_graph_stats();
    EXPECT_EQ(st1.direct_launches - st0.direct_launches, 1);
    EXPECT_EQ(st1.graphs, st0.graphs);

    run_call(graphs, a, s, "second call: the graph built and launched");
    const LaunchGraphStats st2 = launch_graph_stats();
    EXPECT_EQ(st2.graphs - st1.graphs, 1);
    EXPECT_EQ(st2.nodes - st1.nodes, 4);
    EXPECT_EQ(st2.programmatic_edges - st1.programmatic_edges, 3);  // every launch after the first
    EXPECT_EQ(st2.graph_launches - st1.graph_launches, 1);
    EXPECT_EQ(st2.nodes_set, st1.nodes_set) << "the capturing call set its nodes again";

    run_call(graphs, a, s, "the same buffers: no node set");
    const LaunchGraphStats st3 = launch_graph_stats();
    EXPECT_EQ(st3.nodes_set, st2.nodes_set);
    EXPECT_EQ(st3.graph_launches - st2.graph_launches, 1);

    run_call(graphs, b, s, "other buffers: every node set");
    const LaunchGraphStats st4 = launch_graph_stats();
    EXPECT_EQ(st4.nodes_set - st3.nodes_set, 4);

    Call b_new_ws = b;  // the workspace moved: the builder, the scan and the correction
    b_new_ws.ws += 0x1000;
    run_call(graphs, b_new_ws, s, "another workspace: its three nodes set");
    const LaunchGraphStats st5 = launch_graph_stats();
    EXPECT_EQ(st5.nodes_set - st4.nodes_set, 3);

    Call unkeyed = b_new_ws;  // no key: each node compared by its bytes
    unkeyed.keyed = false;
    run_call(graphs, unkeyed, s, "no key, the same arguments: no node set");
    const LaunchGraphStats st6 = launch_graph_stats();
    EXPECT_EQ(st6.nodes_set, st5.nodes_set);
    unkeyed.o += 0x100;  // stage 1 and the correction
    run_call(graphs, unkeyed, s, "no key, o moved: two nodes set");
    const LaunchGraphStats st7 = launch_graph_stats();
    EXPECT_EQ(st7.nodes_set - st6.nodes_set, 2);
    // After a call without a key, a keyed call with b_new_ws's key must not skip: the nodes hold
    // the unkeyed call's o.
    run_call(graphs, b_new_ws, s, "back to a key seen before, after an unkeyed call");
    const LaunchGraphStats st8 = launch_graph_stats();
    EXPECT_EQ(st8.nodes_set - st7.nodes_set, 2);

    Call longer = a;  // another grid for stage 1 and the correction: the same graph, nodes set
    longer.tokens = 8192;
    run_call(graphs, longer, s, "longer sequences: grids set");
    const LaunchGraphStats st9 = launch_graph_stats();
    EXPECT_EQ(st9.graphs, st2.graphs);
    EXPECT_EQ(st9.failures, st0.failures);
    EXPECT_EQ(fake::live_graphs(), 1);
    EXPECT_EQ(fake::live_execs(), 1);
  }
  EXPECT_EQ(fake::live_graphs(), 0) << "a graph outlived its LaunchGraphs";
  EXPECT_EQ(fake::live_execs(), 0);
  cudaStreamDestroy(s);
}

TEST(LaunchGraphs, RefusedBuildsLaunchOneByOne) {
  register_kernels();
  const cudaStream_t s = new_stream();
  {
    LaunchGraphs graphs;
    const Call a{0x40000, 0x50000, 0x60000, 2048};
    const int instantiations = fake::calls("cudaGraphInstantiate");
    fake::refuse("cudaGraphInstantiate", LaunchGraphs::kMaxTries);
    const LaunchGraphStats st0 = launch_graph_stats();
    for (int i = 0; i < LaunchGraphs::kMaxTries + 3; ++i) run_call(graphs, a, s, "builds refused");
    const LaunchGraphStats st1 = launch_graph_stats();
    EXPECT_EQ(st1.graphs, st0.graphs);
    EXPECT_EQ(st1.direct_launches - st0.direct_launches, LaunchGraphs::kMaxTries + 3);
    EXPECT_EQ(st1.failures - st0.failures, LaunchGraphs::kMaxTries);
    EXPECT_EQ(fake::calls("cudaGraphInstantiate") - instantiations, LaunchGraphs::kMaxTries)
        << "a shape whose builds failed kMaxTries times was built again";
    EXPECT_EQ(fake::live_graphs(), 0) << "a refused build left its captured graph";
    EXPECT_EQ(cudaGetLastError(), cudaSuccess) << "a refused build left its error to the caller";

    // A refused upload: the instantiated graph is destroyed too.
    const Call b{0x41000, 0x51000, 0x61000, 2048};
    cudaStream_t s2 = new_stream();
    fake::refuse("cudaGraphUpload", 1);
    for (int i = 0; i < 3; ++i) run_call(graphs, b, s2, "an upload refused, then built");
    EXPECT_EQ(launch_graph_stats().graphs - st1.graphs, 1);
    EXPECT_EQ(fake::live_graphs(), 1);
    EXPECT_EQ(fake::live_execs(), 1);
    cudaStreamDestroy(s2);
  }
  EXPECT_EQ(fake::live_execs(), 0);
  cudaStreamDestroy(s);
}

TEST(LaunchGraphs, RefusedNodeUpdateLaunchesOneByOne) {
  register_kernels();
  const cudaStream_t s = new_stream();
  LaunchGraphs graphs;
  const Call a{0x70000, 0x80000, 0x90000, 4096}, b{0x71000, 0x81000, 0x91000, 4096};
  run_call(graphs, a, s, "first");
  run_call(graphs, a, s, "built");
  // The second node's update refused: the first already holds b's arguments.
  fake::refuse("cudaGraphExecKernelNodeSetParams", 1, /*after=*/1);
  const LaunchGraphStats st0 = launch_graph_stats();
  run_call(graphs, b, s, "a node update refused: one by one");
  const LaunchGraphStats st1 = launch_graph_stats();
  EXPECT_EQ(st1.direct_launches - st0.direct_launches, 1);
  EXPECT_EQ(st1.failures - st0.failures, 1);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  // a's arguments again: the key of the last call that set every node is a's, but the first node
  // now holds b's, so the graph must not launch as it is.
  run_call(graphs, a, s, "the call before the refusal again, through the graph");
  const LaunchGraphStats st2 = launch_graph_stats();
  EXPECT_EQ(st2.graph_launches - st1.graph_launches, 1);
  EXPECT_EQ(st2.nodes_set - st1.nodes_set, 2);  // the first (b's) and the second (unknown)
  // And b's again: the nodes the refusal left unset are set now.
  run_call(graphs, b, s, "the refused call's arguments again, through the graph");
  const LaunchGraphStats st3 = launch_graph_stats();
  EXPECT_EQ(st3.graph_launches - st2.graph_launches, 1);
  EXPECT_EQ(st3.nodes_set - st2.nodes_set, 4);
}

TEST(LaunchGraphs, CallerCaptureGetsTheLaunches) {
  register_kernels();
  const cudaStream_t s = new_stream();
  LaunchGraphs graphs;
  const Call a{0xa0000, 0xb0000, 0xc0000, 1024};
  ASSERT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), cudaSuccess);
  const LaunchGraphStats st0 = launch_graph_stats();
  for (int i = 0; i < 3; ++i) {
    LaunchList list;
    fill(list, a);
    ASSERT_EQ(graphs.launch(list, s), cudaSuccess);
  }
  const LaunchGraphStats st1 = launch_graph_stats();
  EXPECT_EQ(st1.graphs, st0.graphs) << "a graph was built on a capturing stream";
  EXPECT_EQ(st1.direct_launches - st0.direct_launches, 3);
  cudaGraph_t caller = nullptr;
  ASSERT_EQ(cudaStreamEndCapture(s, &caller), cudaSuccess);
  std::size_t n = 0;
  ASSERT_EQ(cudaGraphGetNodes(caller, nullptr, &n), cudaSuccess);
  EXPECT_EQ(n, 12u) << "the launches did not join the caller's capture";
  EXPECT_TRUE(fake::take_log(s).empty()) << "a launch ran outside the caller's capture";
  cudaGraphDestroy(caller);
}

TEST(LaunchGraphs, EntriesTakenOverPastTheLimit) {
  register_kernels();
  LaunchGraphs graphs;
  std::vector<cudaStream_t> streams;
  const LaunchGraphStats st0 = launch_graph_stats();
  for (int i = 0; i <= LaunchGraphs::kMaxGraphs; ++i) {
    streams.push_back(new_stream());
    const Call c{0x100000u + 0x1000u * i, 0x200000u + 0x1000u * i, 0x300000u + 0x1000u * i, 1024};
    run_call(graphs, c, streams.back(), "a stream's first call");
    run_call(graphs, c, streams.back(), "its second: a graph");
  }
  const LaunchGraphStats st1 = launch_graph_stats();
  EXPECT_EQ(st1.graphs - st0.graphs, LaunchGraphs::kMaxGraphs + 1);
  EXPECT_EQ(st1.evictions - st0.evictions, 1);
  EXPECT_EQ(fake::live_execs(), LaunchGraphs::kMaxGraphs) << "the entry taken over kept its graph";
  // The first stream's entry was taken over: its next call starts one by one again, with its own
  // arguments.
  const Call c0{0x100000, 0x200000, 0x300000, 1024};
  run_call(graphs, c0, streams.front(), "the first stream again");
  EXPECT_EQ(launch_graph_stats().direct_launches - st1.direct_launches, 1);
  for (cudaStream_t s : streams) cudaStreamDestroy(s);
}

TEST(LaunchGraphs, ThreadsAndStreams) {
  register_kernels();
  LaunchGraphs graphs;
  constexpr int kThreads = 4, kCalls = 60;
  std::vector<cudaStream_t> streams;
  for (int t = 0; t < kThreads; ++t) streams.push_back(new_stream());
  const LaunchGraphStats st0 = launch_graph_stats();
  std::vector<int> wrong(kThreads + 2, 0);
  auto work = [&](int t, cudaStream_t s) {
    for (int i = 0; i < kCalls; ++i) {
      // Buffers that change every third call, and a workspace per thread.
      const std::uintptr_t base = 0x1000000u * (t + 1) + 0x1000u * (i / 3);
      const Call c{base, base + 0x400, 0x8000000u + 0x10000u * t, 64 * (1 + i % 2)};
      LaunchList list;
      fill(list, c);
      if (graphs.launch(list, s) != cudaSuccess || !same_runs(fake::take_log(s), expected(list))) ++wrong[t];
    }
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) threads.emplace_back(work, t, streams[t]);
  // Two more threads on cudaStreamPerThread: a graph each.
  for (int t = kThreads; t < kThreads + 2; ++t) threads.emplace_back(work, t, cudaStreamPerThread);
  for (auto& th : threads) th.join();
  for (int t = 0; t < kThreads + 2; ++t) EXPECT_EQ(wrong[t], 0) << "thread " << t << ": calls that ran other arguments";
  const LaunchGraphStats st1 = launch_graph_stats();
  EXPECT_EQ(st1.graphs - st0.graphs, kThreads + 2);
  EXPECT_EQ(st1.failures, st0.failures);
  EXPECT_EQ(st1.graph_launches + st1.direct_launches - st0.graph_launches - st0.direct_launches, (kThreads + 2) * kCalls);
  for (cudaStream_t s : streams) cudaStreamDestroy(s);
}

}  // namespace
