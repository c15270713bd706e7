// Host emulation of wgmma_sm90.cuh: the warpgroup exchanges A fragments and accumulators, and B is
// read through the descriptor with the canonical 128-byte-swizzled layouts.
//
// Asynchrony as the hardware allows it: a product's result lands in its accumulator only when a
// gmma_wait retires its commit group; until then the accumulator reads as NaN, and the
// accumulator and the A registers must keep their values (checked when the group retires). So a
// kernel that reads an accumulator early, writes it, or reuses an A fragment of a product in
// flight, fails its test. Not modelled: B is read from shared memory at issue, and the fences
// (gmma_arrive, gmma_fence, gmma_smem_fence) do nothing here; the GPU suite covers those.
#pragma once
#include <cmath>
#include <cstdint>
#include <deque>
#include <vector>
#include "cuda/mma_sm80.cuh"
namespace gdnkit::cuda {
constexpr std::uint32_t kSwizzleAtomBytes = 1024;
constexpr std::uint32_t swizzle128(int row, int chunk) {
  return static_cast<std::uint32_t>(row) * 128u + (static_cast<std::uint32_t>(chunk ^ (row & 7)) << 4);
}
inline std::uint64_t gmma_desc(const void* smem, std::uint32_t lbo, std::uint32_t sbo) {
  const std::uint32_t addr = smem_addr(smem);
  if (addr % 16) { std::fprintf(stderr, "gmma desc start not 16-byte aligned\n"); std::abort(); }
  return (std::uint64_t((addr >> 4) & 0x3fffu)) | (std::uint64_t((lbo >> 4) & 0x3fffu) << 16) |
         (std::uint64_t((sbo >> 4) & 0x3fffu) << 32) | (std::uint64_t(1) << 62);
}
struct WgX { std::uint32_t a[128][4]; float d[128][64]; };
inline WgX g_wgx[2];
inline std::barrier<>* g_wg_barrier[2] = {};
inline void wgbar() { g_wg_barrier[threadIdx.x / 128]->arrive_and_wait(); }
struct GmmaPending {
  float* d;
  std::vector<float> value;       // the result, written to d when the group retires
  const std::uint32_t* a;         // the A registers, which must not change until then
  std::uint32_t a_at_issue[4];
};
struct GmmaGroups {
  std::vector<GmmaPending> open;                 // issued since the last commit
  std::deque<std::vector<GmmaPending>> groups;   // committed, oldest first
};
inline thread_local GmmaGroups g_gmma;
// The in-flight value of accumulator d (the newest product into it), or nullptr.
inline const std::vector<float>* gmma_in_flight(const float* d) {
  for (auto it = g_gmma.open.rbegin(); it != g_gmma.open.rend(); ++it)
    if (it->d == d) return &it->value;
  for (auto g = g_gmma.groups.rbegin(); g != g_gmma.groups.rend(); ++g)
    for (auto it = g->rbegin(); it != g->rend(); ++it)
      if (it->d == d) return &it->value;
  return nullptr;
}
template <typename T, int N, bool B_MN_MAJOR>
inline void gmma_rs(float (&d)[N / 2], const std::uint32_t (&a)[4], std::uint64_t desc, bool accumulate) {
  const int wg = threadIdx.x / 128, me = threadIdx.x % 128;
  WgX& x = g_wgx[wg];
  wgbar();
  for (int i = 0; i < 4; ++i) x.a[me][i] = a[i];
  wgbar();
  const std::uint32_t start = (desc & 0x3fff) << 4, lbo = ((desc >> 16) & 0x3fff) << 4, sbo = ((desc >> 32) & 0x3fff) << 4;
  if ((desc >> 62) != 1) { std::fprintf(stderr, "unexpected swizzle mode\n"); std::abort(); }
  auto half = [](std::uint32_t w, int hi) { return static_cast<std::uint16_t>(hi ? w >> 16 : w & 0xffff); };
  auto A = [&](int m, int k) {
    const int warp = m / 16, r = m % 16;
    const int lane = 4 * (r % 8) + (k % 8) / 2;
    return h2f<T>(half(x.a[32 * warp + lane][(r >= 8) + 2 * (k >= 8)], k % 2));
  };
  extern unsigned char smem_raw[];
  auto B = [&](int k, int n) {
    std::uint32_t addr;
    if (B_MN_MAJOR) addr = start + (n / 64) * lbo + (k / 8) * sbo + (k % 8) * 128 + (n % 64) * 2;
    else addr = start + (n % 8) * 128 + (n / 8) * sbo + (k / 8) * 16 + (k % 8) * 2;
    addr ^= ((addr >> 7) & 7) << 4;
    if (addr + 2 > 200 * 1024) { std::fprintf(stderr, "wgmma B outside shared memory\n"); std::abort(); }
    std::uint16_t v; std::memcpy(&v, smem_raw + addr, 2);
    return h2f<T>(v);
  };
  const int warp = me / 32, lane = me % 32, g = lane / 4, t = lane % 4;
  const std::vector<float>* prior = gmma_in_flight(d);  // chained products accumulate in flight
  GmmaPending pend{d, std::vector<float>(N / 2), a, {a[0], a[1], a[2], a[3]}};
  for (int j = 0; j < N / 8; ++j)
    for (int e = 0; e < 4; ++e) {
      const int m = 16 * warp + g + 8 * (e / 2), n = 8 * j + 2 * t + e % 2;
      float s = accumulate ? (prior ? (*prior)[4 * j + e] : d[4 * j + e]) : 0.0f;
      for (int k = 0; k < 16; ++k) s += A(m, k) * B(k, n);
      pend.value[4 * j + e] = s;
    }
  wgbar();
  for (int i = 0; i < N / 2; ++i) d[i] = std::nanf("");
  g_gmma.open.push_back(std::move(pend));
}
inline void gmma_arrive() {}
inline void gmma_smem_fence() {}
inline void gmma_commit() {
  g_gmma.groups.push_back(std::move(g_gmma.open));
  g_gmma.open.clear();
}
// Retires all but the newest N commit groups.
template <int N>
inline void gmma_wait() {
  while (static_cast<int>(g_gmma.groups.size()) > N) {
    const std::vector<GmmaPending> done = std::move(g_gmma.groups.front());
    g_gmma.groups.pop_front();
    for (const GmmaPending& p : done) {  // checks first: products of one group may chain on d
      if (std::memcmp(p.a, p.a_at_issue, sizeof p.a_at_issue) != 0) {
        std::fprintf(stderr, "wgmma A registers changed while the product was in flight\n");
        std::abort();
      }
      for (std::size_t i = 0; i < p.value.size(); ++i)
        if (!std::isnan(p.d[i])) {
          std::fprintf(stderr, "wgmma accumulator written while the product was in flight\n");
          std::abort();
        }
    }
    for (const GmmaPending& p : done)
      if (gmma_in_flight(p.d) == nullptr)  // a newer product into d still in flight: d stays NaN
        for (std::size_t i = 0; i < p.value.size(); ++i) p.d[i] = p.value[i];
  }
}
inline void gmma_wait_all() { gmma_wait<0>(); }
template <int N> inline void gmma_fence(float (&)[N]) {}
template <int N> inline void gmma_fence(std::uint32_t (&)[N]) {}
}  // namespace gdnkit::cuda
