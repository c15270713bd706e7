// A separate project built against the installed package (find_package(gdnkit)): one call on host
// memory, checked against the oracle that ships with the header.
#include <gdnkit/gdnkit.h>
#include <gdnkit/reference.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

int main() {
  gdnkit::Problem p;
  p.total_tokens = 70;
  p.num_seqs = 1;
  p.num_q_heads = p.num_k_heads = p.num_v_heads = 1;
  p.head_dim_k = p.head_dim_v = 16;
  p.has_cu_seqlens = false;
  p.has_gate = false;
  p.qkv_dtype = gdnkit::DType::f16;
  const gdnkit::Plan plan = gdnkit::Plan::create(p);
  std::mt19937 rng(3);
  std::uniform_int_distribution<int> mant(0, 1023);
  std::vector<unsigned short> q(70 * 16), k(70 * 16), v(70 * 16), o(70 * 16);
  for (auto* x : {&q, &k, &v})
    for (auto& e : *x) e = static_cast<unsigned short>(0x2c00 | mant(rng));  // f16 in [1/16, 1/8)
  std::vector<float> beta(70, 0.05f);
  std::vector<unsigned char> ws(plan.workspace_bytes());
  gdnkit::Tensors t;
  t.q = q.data(), t.k = k.data(), t.v = v.data(), t.o = o.data(), t.beta = beta.data();
  plan.run(t, ws.data(), ws.size());
  std::vector<double> ref, state;
  gdnkit::reference::recurrence(p, t, 0, 0, ref, state);
  double err = 0, norm = 0;
  auto f16 = [](unsigned short h) { return std::ldexp(1.0 + (h & 1023) / 1024.0, ((h >> 10) & 31) - 15); };
  for (std::size_t i = 0; i < o.size(); ++i) {
    err += (f16(o[i]) - ref[i]) * (f16(o[i]) - ref[i]);
    norm += ref[i] * ref[i];
  }
  const double rel = std::sqrt(err / norm);
  const bool ok = rel < 1e-2;
  std::printf("%s: rel-L2 %.2e against the oracle: %s\n", plan.kernel_name(), rel, ok ? "PASS" : "FAIL");
  return ok ? 0 : 1;
}
