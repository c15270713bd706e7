// C++ benchmark driver: times gdnkit's CUDA path on the rows of bench/rows.json.
//
// For each row: cuLA's input recipe (q = 0.03 randn, k = 0.01 randn, v = 0.1 randn in bf16,
// g = log(alpha) with alpha in [0.85, 0.95), beta in [0, 0.5) in f32, packed varlen, no states),
// drawn on the device; --gate-linear passes alpha itself (GateSpace::linear), --beta-bf16 stores
// beta as bf16 (what a model's sigmoid in bf16 hands over). Device time: CUDA events around
// back-to-back launches after warm-up, rotating over enough input copies to exceed the L2 cache,
// median of repeats. Host time: wall time of one Plan::run call (enqueue only), median; plan
// time: wall time of one Plan::create of the row's first plan (what a caller that plans every
// call, as the Python binding does, pays besides run), median.
//
//   bench_gdnkit --rows bench/rows.json [--only NAME,...] [--sets N] [--json]
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "gdnkit/gdnkit.h"

namespace {

struct Row {
  std::string name, suite;
  int hq = 0, hk = 0, hv = 0, dk = 0, dv = 0;
  std::vector<long long> lens;
};

// Reads the fields this driver needs from rows.json (one row object per line, as the file is kept).
std::vector<Row> read_rows(const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    std::fprintf(stderr, "bench_gdnkit: cannot open %s\n", path.c_str());
    std::exit(2);
  }
  auto field = [](const std::string& line, const std::string& key) -> std::string {
    const auto at = line.find("\"" + key + "\"");
    if (at == std::string::npos) return "";
    auto p = line.find(':', at) + 1;
    while (line[p] == ' ') ++p;
    if (line[p] == '"') return line.substr(p + 1, line.find('"', p + 1) - p - 1);
    if (line[p] == '[') return line.substr(p + 1, line.find(']', p) - p - 1);
    return line.substr(p, line.find_first_of(",}", p) - p);
  };
  std::vector<Row> rows;
  for (std::string line; std::getline(in, line);) {
    if (line.find("\"lens\"") == std::string::npos) continue;
    Row r;
    r.name = field(line, "name"), r.suite = field(line, "suite");
    r.hq = std::stoi(field(line, "Hq")), r.hk = std::stoi(field(line, "Hk")), r.hv = std::stoi(field(line, "Hv"));
    r.dk = std::stoi(field(line, "dk")), r.dv = std::stoi(field(line, "dv"));
    std::stringstream ls(field(line, "lens"));
    for (std::string x; std::getline(ls, x, ',');) r.lens.push_back(std::stoll(x));
    rows.push_back(r);
  }
  return rows;
}

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "bench_gdnkit: %s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

__device__ float hash_uniform(unsigned long long seed, unsigned long long i) {
  unsigned long long x = seed * 0x9E3779B97F4A7C15ull + i * 0xBF58476D1CE4E5B9ull;
  x ^= x >> 31, x *= 0x94D049BB133111EBull, x ^= x >> 29, x *= 0xBF58476D1CE4E5B9ull, x ^= x >> 32;
  return (static_cast<float>(x >> 40) + 0.5f) * (1.0f / 16777216.0f);  // (0, 1)
}

__global__ void fill_normal_bf16(__nv_bfloat16* out, long long n, float stddev, unsigned long long seed) {
  for (long long i = blockIdx.x * 256ll + threadIdx.x; i < n; i += 256ll * gridDim.x) {
    const float u1 = hash_uniform(seed, 2 * i), u2 = hash_uniform(seed, 2 * i + 1);
    out[i] = __float2bfloat16(stddev * sqrtf(-2.0f * logf(u1)) * cospif(2.0f * u2));
  }
}

// g = log(alpha), or alpha itself with linear gates; beta as f32 or (beta_bf16) bf16.
__global__ void fill_gates(float* g, void* beta, bool linear, bool beta_bf16, long long n, unsigned long long seed) {
  for (long long i = blockIdx.x * 256ll + threadIdx.x; i < n; i += 256ll * gridDim.x) {
    const float alpha = 0.85f + 0.1f * hash_uniform(seed, 2 * i), b = 0.5f * hash_uniform(seed, 2 * i + 1);
    g[i] = linear ? alpha : logf(alpha);
    if (beta_bf16)
      static_cast<__nv_bfloat16*>(beta)[i] = __float2bfloat16(b);
    else
      static_cast<float*>(beta)[i] = b;
  }
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct InputSet {
  void *q = nullptr, *k = nullptr, *v = nullptr, *o = nullptr;
  float* g = nullptr;
  void* beta = nullptr;
};

}  // namespace

int main(int argc, char** argv) {
  std::string rows_path = "bench/rows.json", only, kernels, segments;
  bool json = false, hint = true, gate_linear = false, beta_bf16 = false, split_graph = true,
       legacy_stream = false, idle_host = false;
  int reps = 20, force_sets = 0;
  float cutoff = 0.0f;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--rows" && i + 1 < argc) rows_path = argv[++i];
    else if (a == "--only" && i + 1 < argc) only = std::string(",") + argv[++i] + ",";
    else if (a == "--reps" && i + 1 < argc) reps = std::atoi(argv[++i]);
    else if (a == "--kernels" && i + 1 < argc) kernels = argv[++i];
    else if (a == "--segments" && i + 1 < argc) segments = argv[++i];
    else if (a == "--split-decay-cutoff" && i + 1 < argc) cutoff = std::strtof(argv[++i], nullptr);
    else if (a == "--sets" && i + 1 < argc) {
      force_sets = std::atoi(argv[++i]);
      if (force_sets < 1) {
        std::fprintf(stderr, "bench_gdnkit: --sets expects a count of input copies >= 1, got '%s'\n", argv[i]);
        return 2;
      }
    }
    else if (a == "--json") json = true;
    else if (a == "--no-hint") hint = false;
    else if (a == "--gate-linear") gate_linear = true;
    else if (a == "--beta-bf16") beta_bf16 = true;
    else if (a == "--legacy-stream") legacy_stream = true;
    else if (a == "--idle-host") idle_host = true;
    else if (a == "--split-launches" && i + 1 < argc && (std::string(argv[i + 1]) == "graph" ||
                                                          std::string(argv[i + 1]) == "direct"))
      split_graph = std::string(argv[++i]) == "graph";
    else {
      std::fprintf(stderr, "usage: bench_gdnkit [--rows FILE] [--only A,B] [--reps N] [--kernels K1,K2] [--segments S1,S2] [--split-decay-cutoff C] [--sets N] [--no-hint] [--gate-linear] [--beta-bf16] [--split-launches graph|direct] [--legacy-stream] [--idle-host] [--json]\n"
                           "  --kernels: time each row with each named kernel (Options::kernel) instead of the\n"
                           "             planner's choice, side by side; rows a kernel cannot run are skipped\n"
                           "  --segments: likewise with each Options::segments value (1: unsplit; k >= 2: k segments)\n"
                           "  --split-decay-cutoff: Options::split_decay_cutoff of every plan (0: exact)\n"
                           "  --sets N: rotate over N input copies (1: the same inputs every launch, L2-warm where\n"
                           "            they fit; PEERS.md names no rotation for its flashinfer numbers); default:\n"
                           "            enough copies to exceed three times the L2 cache, at most 8\n"
                           "  --no-hint: plan without Problem::max_seq_len (the packed lengths unknown to the host)\n"
                           "  --gate-linear: gates passed as alpha (GateSpace::linear) instead of log(alpha)\n"
                           "  --beta-bf16: beta stored as bf16 instead of f32\n"
                           "  --split-launches: a split's launches as one CUDA graph (Options::split_graph, the\n"
                           "                    default) or one by one\n"
                           "  --legacy-stream: run on the legacy default stream (torch's default) instead of a\n"
                           "                   created one\n"
                           "  --idle-host: also the host time of calls that each find the stream idle (a sync\n"
                           "               after every call), printed as 'idle-host ROW KERNEL US' lines\n");
      return 2;
    }
  }
  if (!gdnkit::cuda_available()) {
    std::fprintf(stderr, "bench_gdnkit: no CUDA device\n");
    return 1;
  }
  const long long l2_bytes = 60ll << 20;
  cudaStream_t stream = nullptr;  // the legacy default stream with --legacy-stream
  if (!legacy_stream) check(cudaStreamCreate(&stream), "stream");
  if (!json) std::printf("%-38s %8s %10s %10s %s %s\n", "row", "tokens", "device_ms", "host_us", "kernel", "plan_us");
  for (const Row& row : read_rows(rows_path)) {
    if (!only.empty() && only.find("," + row.name + ",") == std::string::npos) continue;
    gdnkit::Problem p;
    p.memory = gdnkit::Memory::cuda;
    p.num_seqs = static_cast<long long>(row.lens.size());
    std::vector<int> cu_host(1, 0);
    for (auto L : row.lens) cu_host.push_back(cu_host.back() + static_cast<int>(L));
    p.total_tokens = cu_host.back();
    if (hint) p.max_seq_len = *std::max_element(row.lens.begin(), row.lens.end());  // the hint a server has
    p.num_q_heads = row.hq, p.num_k_heads = row.hk, p.num_v_heads = row.hv;
    p.head_dim_k = row.dk, p.head_dim_v = row.dv;
    if (gate_linear) p.gate_space = gdnkit::GateSpace::linear;
    if (beta_bf16) p.beta_dtype = gdnkit::DType::bf16;
    const int H = std::max(row.hq, row.hv);
    const long long T = p.total_tokens;
    // The planner's choice, or each kernel of --kernels that accepts the row.
    // Where the planner splits the sequences (context parallelism), the same row unsplit too: the
    // split must never be the slower one.
    std::vector<gdnkit::Plan> plans;
    for (std::size_t b = 0; b < segments.size();) {
      std::size_t e = segments.find(',', b);
      if (e == std::string::npos) e = segments.size();
      gdnkit::Options o;
      o.segments = std::atoi(segments.substr(b, e - b).c_str());
      o.split_decay_cutoff = cutoff;
      o.split_graph = split_graph;
      b = e + 1;
      try {
        plans.push_back(gdnkit::Plan::create(p, o));
      } catch (const gdnkit::Error& err) {
        if (!json) std::printf("%-38s skipped segments=%d: %s\n", row.name.c_str(), o.segments, err.what());
      }
    }
    if (kernels.empty() && segments.empty()) {
      gdnkit::Options planner;
      planner.split_decay_cutoff = cutoff;
      planner.split_graph = split_graph;
      plans.push_back(gdnkit::Plan::create(p, planner));
      if (std::string(plans[0].kernel_name()).find("-cp") != std::string::npos) {
        gdnkit::Options o;
        o.segments = 1;
        plans.push_back(gdnkit::Plan::create(p, o));
      }
    }
    const bool with_unsplit = kernels.empty() && segments.empty() && plans.size() == 2;
    // Plan::create of the row's first plan (its options again), timed alone.
    double plan_us = 0.0;
    if (!plans.empty() || !kernels.empty()) {
      gdnkit::Options o;
      o.split_decay_cutoff = cutoff;
      o.split_graph = split_graph;
      if (!segments.empty()) o.segments = std::atoi(segments.c_str());
      const std::string first_kernel = kernels.substr(0, kernels.find(','));
      if (!kernels.empty()) o.kernel = first_kernel.c_str();
      std::vector<double> t;
      try {
        for (int r = 0; r < 41; ++r) {
          const auto h0 = std::chrono::steady_clock::now();
          const gdnkit::Plan plan = gdnkit::Plan::create(p, o);
          t.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - h0).count());
        }
        plan_us = median(t);
      } catch (const gdnkit::Error&) {
      }
    }
    std::vector<double> row_ms, row_host_us;
    for (std::size_t b = 0; b < kernels.size();) {
      std::size_t e = kernels.find(',', b);
      if (e == std::string::npos) e = kernels.size();
      const std::string name = kernels.substr(b, e - b);
      b = e + 1;
      gdnkit::Options o;
      o.kernel = name.c_str();
      try {
        plans.push_back(gdnkit::Plan::create(p, o));
      } catch (const gdnkit::Error& err) {
        if (!json) std::printf("%-38s skipped %s: %s\n", row.name.c_str(), name.c_str(), err.what());
      }
    }

    const long long nq = T * row.hq * row.dk, nk = T * row.hk * row.dk, nv = T * row.hv * row.dv, no = T * H * row.dv;
    const long long set_bytes = 2 * (nq + nk + nv + no) + 8 * T * H;
    const int nsets = force_sets > 0 ? force_sets
                                     : static_cast<int>(std::clamp<long long>((3 * l2_bytes + set_bytes - 1) / set_bytes, 1, 8));
    std::vector<InputSet> sets(nsets);
    for (int s = 0; s < nsets; ++s) {
      InputSet& x = sets[s];
      check(cudaMalloc(&x.q, 2 * nq), "malloc"), check(cudaMalloc(&x.k, 2 * nk), "malloc");
      check(cudaMalloc(&x.v, 2 * nv), "malloc"), check(cudaMalloc(&x.o, 2 * no), "malloc");
      check(cudaMalloc(&x.g, 4 * T * H), "malloc"), check(cudaMalloc(&x.beta, 4 * T * H), "malloc");
      const unsigned long long seed = 1000ull * s + 17;
      fill_normal_bf16<<<1024, 256, 0, stream>>>(static_cast<__nv_bfloat16*>(x.q), nq, 0.03f, seed);
      fill_normal_bf16<<<1024, 256, 0, stream>>>(static_cast<__nv_bfloat16*>(x.k), nk, 0.01f, seed + 1);
      fill_normal_bf16<<<1024, 256, 0, stream>>>(static_cast<__nv_bfloat16*>(x.v), nv, 0.1f, seed + 2);
      fill_gates<<<1024, 256, 0, stream>>>(x.g, x.beta, gate_linear, beta_bf16, T * H, seed + 3);
    }
    void* cu = nullptr;
    check(cudaMalloc(&cu, cu_host.size() * 4), "malloc");
    check(cudaMemcpy(cu, cu_host.data(), cu_host.size() * 4, cudaMemcpyHostToDevice), "copy");
    for (const gdnkit::Plan& plan : plans) {
      void* ws = nullptr;
      check(cudaMalloc(&ws, std::max<std::size_t>(plan.workspace_bytes(), 256)), "malloc");
      auto tensors = [&](const InputSet& x) {
        gdnkit::Tensors t;
        t.q = x.q, t.k = x.k, t.v = x.v, t.o = x.o, t.g = x.g, t.beta = x.beta, t.cu_seqlens = cu;
        return t;
      };
      for (int w = 0; w < 3; ++w)
        for (const auto& x : sets) plan.run(tensors(x), ws, plan.workspace_bytes(), stream);
      check(cudaStreamSynchronize(stream), "warm-up");

      cudaEvent_t e0, e1;
      check(cudaEventCreate(&e0), "event"), check(cudaEventCreate(&e1), "event");
      std::vector<double> dev, host;
      const int per_rep = std::max(nsets, 4);
      for (int r = 0; r < reps; ++r) {
        check(cudaEventRecord(e0, stream), "event");
        for (int i = 0; i < per_rep; ++i) {
          const auto h0 = std::chrono::steady_clock::now();
          plan.run(tensors(sets[i % nsets]), ws, plan.workspace_bytes(), stream);
          host.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - h0).count());
        }
        check(cudaEventRecord(e1, stream), "event");
        check(cudaEventSynchronize(e1), "run");
        float ms = 0;
        check(cudaEventElapsedTime(&ms, e0, e1), "event");
        dev.push_back(ms / per_rep);
      }
      const double device_ms = median(dev), host_us = median(host);
      if (idle_host) {
        std::vector<double> idle;
        for (int i = 0; i < 4 * per_rep; ++i) {
          check(cudaStreamSynchronize(stream), "sync");
          const auto h0 = std::chrono::steady_clock::now();
          plan.run(tensors(sets[i % nsets]), ws, plan.workspace_bytes(), stream);
          idle.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - h0).count());
        }
        check(cudaStreamSynchronize(stream), "sync");
        std::printf("idle-host %s %s %.2f\n", row.name.c_str(), plan.kernel_name(), median(idle));
      }
      row_ms.push_back(device_ms);
      row_host_us.push_back(host_us);
      if (json && with_unsplit && row_ms.size() == 2)
        std::printf("{\"name\": \"%s\", \"tokens\": %lld, \"device_ms\": %.5f, \"host_us\": %.2f, \"kernel\": \"%s\", "
                    "\"unsplit_ms\": %.5f, \"unsplit_kernel\": \"%s\", \"plan_us\": %.2f, \"sets\": %d}\n",
                    row.name.c_str(), T, row_ms[0], row_host_us[0], plans[0].kernel_name(), device_ms,
                    plan.kernel_name(), plan_us, nsets);
      else if (json && !(with_unsplit && row_ms.size() == 1))
        std::printf("{\"name\": \"%s\", \"tokens\": %lld, \"device_ms\": %.5f, \"host_us\": %.2f, \"kernel\": \"%s\", "
                    "\"plan_us\": %.2f, \"sets\": %d}\n",
                    row.name.c_str(), T, device_ms, host_us, plan.kernel_name(), plan_us, nsets);
      else if (!json)
        std::printf("%-38s %8lld %10.4f %10.2f %s %.2f\n", row.name.c_str(), T, device_ms, host_us, plan.kernel_name(),
                    plan_us);
      std::fflush(stdout);
      cudaFree(ws), cudaEventDestroy(e0), cudaEventDestroy(e1);
    }
    for (auto& x : sets) {
      for (void* ptr : {x.q, x.k, x.v, x.o, static_cast<void*>(x.g), static_cast<void*>(x.beta)}) cudaFree(ptr);
    }
    cudaFree(cu);
  }
  if (stream != nullptr) cudaStreamDestroy(stream);
  return 0;
}
