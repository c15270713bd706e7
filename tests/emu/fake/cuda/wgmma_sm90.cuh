// Host emulation of wgmma_sm90.cuh: the warpgroup exchanges A fragments and accumulators, and B is
// read through the descriptor with the canonical 128-byte-swizzled layouts.
//
// Asynchrony as the hardware allows it. A product is computed only when a gmma_wait retires its
// commit group, reading its B operand from shared memory then (the warpgroup waits together, as
// wgmma.wait_group does); until then its accumulator reads as NaN, and the accumulator and the A
// registers must keep their values (checked at retirement). So a kernel that reads an accumulator
// early, writes it, reuses an A fragment, or overwrites a B tile while a product that reads it is in
// flight, fails its test. Not modelled: the fences (gmma_arrive, gmma_fence, gmma_smem_fence) do
// nothing here; the GPU suite covers those.
#pragma once
#include <cmath>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <thread>
#include <vector>
#include <cuda.h>
#include "cuda/chunk_io.cuh"
#include "cuda/mma_sm80.cuh"
namespace gdnkit::cuda {
inline std::uint64_t gmma_desc(const void* smem, std::uint32_t lbo, std::uint32_t sbo) {
  const std::uint32_t addr = smem_addr(smem);
  if (addr % 16) { std::fprintf(stderr, "gmma desc start not 16-byte aligned\n"); std::abort(); }
  return (std::uint64_t((addr >> 4) & 0x3fffu)) | (std::uint64_t((lbo >> 4) & 0x3fffu) << 16) |
         (std::uint64_t((sbo >> 4) & 0x3fffu) << 32) | (std::uint64_t(1) << 62);
}
inline std::uint64_t gmma_desc_add(std::uint64_t desc, std::uint32_t bytes) {
  if (bytes % 16) { std::fprintf(stderr, "gmma desc offset not 16-byte aligned\n"); std::abort(); }
  if ((desc & 0x3fffu) + (bytes >> 4) > 0x3fffu) { std::fprintf(stderr, "gmma desc offset carries out of the address\n"); std::abort(); }
  return desc + (bytes >> 4);
}
constexpr std::uint32_t gmma_kstep(int kk, int rows) {
  return static_cast<std::uint32_t>((kk / 4) * (rows * 128) + (kk % 4) * 32);
}
constexpr std::size_t kSmemBytes = 232448;  // the emulated dynamic shared memory (an H100/H200's opt-in limit)
// Element (k, n) of a 128-byte-swizzled operand tile: K-major (element (k, n) at row n, column k)
// or MN-major (row k, column n).
inline std::uint16_t smem_operand(std::uint32_t start, std::uint32_t lbo, std::uint32_t sbo, int k, int n, bool mn_major) {
  std::uint32_t addr;
  if (mn_major) addr = start + (n / 64) * lbo + (k / 8) * sbo + (k % 8) * 128 + (n % 64) * 2;
  else addr = start + (n % 8) * 128 + (n / 8) * sbo + (k / 8) * 16 + (k % 8) * 2;
  addr ^= ((addr >> 7) & 7) << 4;
  if (addr + 2 > kSmemBytes) { std::fprintf(stderr, "wgmma operand outside shared memory\n"); std::abort(); }
  std::uint16_t v; std::memcpy(&v, g_cta->smem + addr, 2);
  return v;
}
using WgX = EmuWgX;
inline void wgbar() { g_cta->wg[threadIdx.x / 128]->arrive_and_wait(); }
struct GmmaPending {
  float* d;
  std::vector<float> init;                    // the accumulator input, unless chained
  std::shared_ptr<GmmaPending> chain;         // the in-flight product into d this one adds to
  std::vector<float> value;                   // computed at retirement, written to d
  const std::uint32_t* a;                     // the A registers, which must not change until then
  std::uint32_t a_at_issue[4];
  std::vector<std::uint32_t> wg_a;            // the warpgroup's A fragments at issue, 128 x 4
  std::function<void(GmmaPending&, const std::vector<float>&)> compute;  // B read when called
};
using GmmaPtr = std::shared_ptr<GmmaPending>;
struct GmmaGroups {
  std::vector<GmmaPtr> open;                 // issued since the last commit
  std::deque<std::vector<GmmaPtr>> groups;   // committed, oldest first
};
inline thread_local GmmaGroups g_gmma;
// The newest product in flight into accumulator d, or null.
inline GmmaPtr gmma_in_flight(const float* d) {
  for (auto it = g_gmma.open.rbegin(); it != g_gmma.open.rend(); ++it)
    if ((*it)->d == d) return *it;
  for (auto g = g_gmma.groups.rbegin(); g != g_gmma.groups.rend(); ++g)
    for (auto it = g->rbegin(); it != g->rend(); ++it)
      if ((*it)->d == d) return *it;
  return nullptr;
}
// This thread's accumulator entries of an m64nNk16 product: rows 16 warp + g (+ 8), columns
// 8 j + 2t (+ 1), the mma.sync C layout; A(m, k) and B(k, n) give the operands' elements.
template <int N, class FA, class FB>
inline void gmma_accumulate(GmmaPending& p, const std::vector<float>& in, int me, FA&& A, FB&& B) {
  const int warp = me / 32, lane = me % 32, g = lane / 4, t = lane % 4;
  p.value.assign(N / 2, 0.0f);
  for (int j = 0; j < N / 8; ++j)
    for (int e = 0; e < 4; ++e) {
      const int m = 16 * warp + g + 8 * (e / 2), n = 8 * j + 2 * t + e % 2;
      float s = in[4 * j + e];
      for (int k = 0; k < 16; ++k) s += A(m, k) * B(k, n);
      p.value[4 * j + e] = s;
    }
}
template <typename T, int N, bool B_MN_MAJOR>
inline void gmma_rs(float (&d)[N / 2], const std::uint32_t (&a)[4], std::uint64_t desc, bool accumulate) {
  const int wg = threadIdx.x / 128, me = threadIdx.x % 128;
  WgX& x = g_cta->wgx[wg];
  wgbar();
  for (int i = 0; i < 4; ++i) x.a[me][i] = a[i];
  wgbar();
  if ((desc >> 62) != 1) { std::fprintf(stderr, "unexpected swizzle mode\n"); std::abort(); }
  auto pend = std::make_shared<GmmaPending>();
  pend->d = d;
  pend->a = a;
  for (int i = 0; i < 4; ++i) pend->a_at_issue[i] = a[i];
  pend->wg_a.assign(&x.a[0][0], &x.a[0][0] + 128 * 4);
  pend->chain = accumulate ? gmma_in_flight(d) : nullptr;  // chained products accumulate in flight
  if (!pend->chain) pend->init = accumulate ? std::vector<float>(d, d + N / 2) : std::vector<float>(N / 2, 0.0f);
  pend->compute = [desc, me](GmmaPending& p, const std::vector<float>& in) {
    const std::uint32_t start = (desc & 0x3fff) << 4, lbo = ((desc >> 16) & 0x3fff) << 4,
                        sbo = ((desc >> 32) & 0x3fff) << 4;
    auto half = [](std::uint32_t w, int hi) { return static_cast<std::uint16_t>(hi ? w >> 16 : w & 0xffff); };
    auto A = [&](int m, int k) {
      const int warp = m / 16, r = m % 16;
      const int lane = 4 * (r % 8) + (k % 8) / 2;
      return h2f<T>(half(p.wg_a[4 * (32 * warp + lane) + (r >= 8) + 2 * (k >= 8)], k % 2));
    };
    auto B = [&](int k, int n) { return h2f<T>(smem_operand(start, lbo, sbo, k, n, B_MN_MAJOR)); };
    gmma_accumulate<N>(p, in, me, A, B);
  };
  wgbar();  // every thread has copied x.a before the next product overwrites it
  for (int i = 0; i < N / 2; ++i) d[i] = std::nanf("");
  g_gmma.open.push_back(std::move(pend));
}
// Both operands from shared memory (K-major): the same retirement rules, no A registers.
template <typename T, int N>
inline void gmma_ss(float (&d)[N / 2], std::uint64_t desc_a, std::uint64_t desc_b, bool accumulate) {
  const int me = threadIdx.x % 128;
  if ((desc_a >> 62) != 1 || (desc_b >> 62) != 1) { std::fprintf(stderr, "unexpected swizzle mode\n"); std::abort(); }
  auto pend = std::make_shared<GmmaPending>();
  static const std::uint32_t no_a[4] = {};
  pend->d = d;
  pend->a = no_a;
  pend->chain = accumulate ? gmma_in_flight(d) : nullptr;
  if (!pend->chain) pend->init = accumulate ? std::vector<float>(d, d + N / 2) : std::vector<float>(N / 2, 0.0f);
  pend->compute = [desc_a, desc_b, me](GmmaPending& p, const std::vector<float>& in) {
    auto field = [](std::uint64_t desc, int sh) { return static_cast<std::uint32_t>(((desc >> sh) & 0x3fff) << 4); };
    auto A = [&](int m, int k) {
      return h2f<T>(smem_operand(field(desc_a, 0), field(desc_a, 16), field(desc_a, 32), k, m, false));
    };
    auto B = [&](int k, int n) {
      return h2f<T>(smem_operand(field(desc_b, 0), field(desc_b, 16), field(desc_b, 32), k, n, false));
    };
    gmma_accumulate<N>(p, in, me, A, B);
  };
  wgbar();
  for (int i = 0; i < N / 2; ++i) d[i] = std::nanf("");
  g_gmma.open.push_back(std::move(pend));
}

// Named barriers: one std::barrier per id and CTA, made on first use with its thread count (every
// use of an id must give the same count).
inline std::barrier<>& named_barrier(int id, int count) {
  EmuCta& cta = *g_cta;
  std::lock_guard<std::mutex> lock(cta.named_mutex);
  if (id <= 0 || id >= 16 || count % 32 != 0) { std::fprintf(stderr, "bad named barrier %d/%d\n", id, count); std::abort(); }
  if (!cta.named[id]) {
    cta.named[id] = std::make_unique<std::barrier<>>(count);
    cta.named_count[id] = count;
  } else if (cta.named_count[id] != count) {
    std::fprintf(stderr, "named barrier %d used with counts %d and %d\n", id, cta.named_count[id], count);
    std::abort();
  }
  return *cta.named[id];
}
// A lagging walk for the pairs' tests: with g_emu_lag_rank r >= 0, threads 128-255 of the CTA of
// rank r (its first state warpgroup) sleep before each named barrier and mbarrier wait, so that
// the other CTA runs as far ahead as the hand-over's barriers let it.
// With g_emu_lag_wg w >= 0, state warpgroup w of every CTA (threads 128 (w + 1) .. + 127) lags the
// same way: the other state warpgroup runs ahead as far as its barriers let it.
inline std::atomic<int> g_emu_lag_rank{-1}, g_emu_lag_wg{-1};
inline void emu_lag() {
  const int w = g_emu_lag_wg.load();
  if ((g_emu_lag_rank.load() == static_cast<int>(g_cta->rank) && threadIdx.x >= 128 && threadIdx.x < 256) ||
      (w >= 0 && static_cast<int>(threadIdx.x) >= 128 * (w + 1) && static_cast<int>(threadIdx.x) < 128 * (w + 2)))
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
}
inline void named_sync(int id, int count) {
  emu_lag();
  named_barrier(id, count).arrive_and_wait();
}
inline void named_arrive(int id, int count) {
  auto token = named_barrier(id, count).arrive();
  (void)token;
}
// TMA and mbarriers. A copy is recorded at issue and lands when a thread's wait on its barrier
// returns (so a read before the wait sees stale bytes). Phases as the hardware has them: a phase
// completes once it has had the barrier's count of arrivals (mbar_init) and its transaction bytes
// are balanced. mbar_expect_tx is an arrival that adds bytes to expect; each copy completes its
// bytes at issue, and may do so before the phase is armed (the count then goes below zero, as
// the hardware's tx-count may). mbar_wait(bar, parity) blocks, as try_wait.parity spins, while the
// phase in progress (phase c after c completed ones) has that parity, then lands the completed
// phases' copies. A wait that nothing satisfies within seconds aborts (a wrong parity ends there
// or reads stale bytes), and so does an arrival beyond the count of the phase in progress (one
// more expect_tx than the phase has arrivals for: armed again before it completed).
struct TmaCopy {
  unsigned char* dst;
  std::vector<unsigned char> bytes;
  unsigned phase = 0;    // the phase it completes bytes of (1-based: completed phases at issue + 1)
  bool landed = false;   // written at issue already (g_peer_copies_land_at_issue)
};
struct MbarPhase {
  int count = 1;            // arrivals per phase
  unsigned completed = 0;   // phases completed since the initialisation
  int pending = 1;          // arrivals the phase in progress still needs
  std::int64_t tx = 0;      // its bytes expected and not yet completed (below zero: completed first)
};
inline std::mutex g_tma_mutex;
inline std::vector<std::pair<std::uint64_t*, TmaCopy>> g_tma_pending;
inline std::map<const std::uint64_t*, MbarPhase> g_mbar;  // guarded by g_tma_mutex
inline std::condition_variable g_mbar_changed;            // an arrival or a copy issued
// A barrier is usable once initialised: mbar_init writes a marker into it (late, so that a thread
// that waits on or arms a barrier without a CTA barrier after its initialisation reads the
// 0xff bytes run_grid fills shared memory with, and aborts).
constexpr std::uint64_t kMbarInitialised = 0x6d626172696e6974ull;
inline void mbar_check(const std::uint64_t* bar, const char* what) {
  std::uint64_t v;
  std::memcpy(&v, bar, 8);
  if (v != kMbarInitialised) {
    std::fprintf(stderr, "mbarrier %s before its initialisation\n", what);
    std::abort();
  }
}
inline void mbar_init(std::uint64_t* bar, int count) {
  std::this_thread::sleep_for(std::chrono::microseconds(200));
  {
    std::lock_guard<std::mutex> lock(g_tma_mutex);
    g_mbar[bar] = MbarPhase{count, 0, count, 0};
  }
  std::memcpy(bar, &kMbarInitialised, 8);
}
// The phase in progress completes where it has its arrivals and its bytes (caller holds g_tma_mutex).
inline void mbar_settle(MbarPhase& ph) {
  if (ph.pending == 0 && ph.tx == 0) {
    ++ph.completed;
    ph.pending = ph.count;
  }
  g_mbar_changed.notify_all();
}
inline void mbar_arrive_locked(const std::uint64_t* bar, std::int64_t tx_bytes) {
  MbarPhase& ph = g_mbar[bar];
  if (ph.pending <= 0) {
    std::fprintf(stderr, "mbarrier arrival beyond its count (armed again before its phase completed)\n");
    std::abort();
  }
  --ph.pending;
  ph.tx += tx_bytes;
  mbar_settle(ph);
}
inline void mbar_init_fence() {}
inline void tma_prefetch(const void*) {}
inline void mbar_expect_tx(std::uint64_t* bar, std::uint32_t bytes) {
  mbar_check(bar, "armed");
  std::lock_guard<std::mutex> lock(g_tma_mutex);
  mbar_arrive_locked(bar, bytes);
}
// Records a copy on bar's phase in progress, completing its bytes (caller holds g_tma_mutex).
inline void mbar_record(std::uint64_t* bar, TmaCopy&& c) {
  MbarPhase& ph = g_mbar[bar];
  c.phase = ph.completed + 1;
  ph.tx -= static_cast<std::int64_t>(c.bytes.size());
  g_tma_pending.emplace_back(bar, std::move(c));
  mbar_settle(ph);
}
// With g_tma_loads_land_at_issue a tile copy writes shared memory at its issue instead (as
// bulk_copy_to_peer's option below), so that a copy issued into a stage that a lagging warp still
// reads changes what it reads. Built with -DGDNKIT_EMU_TMA_LAND_AT_ISSUE=1 every test runs so.
#ifndef GDNKIT_EMU_TMA_LAND_AT_ISSUE
#define GDNKIT_EMU_TMA_LAND_AT_ISSUE 0
#endif
inline std::atomic<bool> g_tma_loads_land_at_issue{GDNKIT_EMU_TMA_LAND_AT_ISSUE != 0};
inline void tma_load_3d(void* dst, const void* map_ptr, std::uint64_t* bar, int c0, int c1, int c2) {
  const CUtensorMap& m = *static_cast<const CUtensorMap*>(map_ptr);
  if (reinterpret_cast<std::uintptr_t>(dst) % 1024) { std::fprintf(stderr, "TMA box not 1024-byte aligned\n"); std::abort(); }
  TmaCopy c{static_cast<unsigned char*>(dst), std::vector<unsigned char>(64 * 128, 0)};
  for (int r = 0; r < 64; ++r)
    for (int col = 0; col < 64; ++col) {
      const std::uint64_t x = std::uint64_t(c0) + col, y = std::uint64_t(c1) + r, z = std::uint64_t(c2);
      if (x >= m.dims[0] || y >= m.dims[1] || z >= m.dims[2]) continue;  // outside: zeros
      const unsigned char* src = static_cast<const unsigned char*>(m.base) + z * m.strides[1] + y * m.strides[0] + 2 * x;
      std::memcpy(c.bytes.data() + swizzle128(r, col / 8) + 2 * (col % 8), src, 2);
    }
  std::lock_guard<std::mutex> lock(g_tma_mutex);
  if (g_tma_loads_land_at_issue) {
    std::memcpy(c.dst, c.bytes.data(), c.bytes.size());
    c.landed = true;
  }
  mbar_record(bar, std::move(c));
}
// TMA stores: each is recorded at its issue and performed (shared memory read, global memory
// written) only when a wait of the issuing thread retires its bulk group, so that a box rewritten
// between the issue and the wait, or a store never waited for, shows in the results.
struct TmaStore {
  const CUtensorMap* map;
  const unsigned char* src;
  int c0, c1, c2;
};
struct BulkGroups {
  std::vector<TmaStore> open;                    // issued since the last commit
  std::deque<std::vector<TmaStore>> groups;      // committed, oldest first
};
inline thread_local BulkGroups g_bulk;
inline std::atomic<long> g_bulk_unperformed{0};  // stores issued and not yet waited for, all threads
inline void tma_store_3d(const void* map_ptr, const void* src, int c0, int c1, int c2) {
  if (reinterpret_cast<std::uintptr_t>(src) % 1024) { std::fprintf(stderr, "TMA store box not 1024-byte aligned\n"); std::abort(); }
  ++g_bulk_unperformed;
  g_bulk.open.push_back({static_cast<const CUtensorMap*>(map_ptr), static_cast<const unsigned char*>(src), c0, c1, c2});
}
inline void bulk_commit() {
  g_bulk.groups.push_back(std::move(g_bulk.open));
  g_bulk.open.clear();
}
inline void bulk_perform(const TmaStore& st) {
  const CUtensorMap& m = *st.map;
  for (int r = 0; r < 64; ++r)
    for (int col = 0; col < 64; ++col) {
      const std::uint64_t x = std::uint64_t(st.c0) + col, y = std::uint64_t(st.c1) + r, z = std::uint64_t(st.c2);
      if (x >= m.dims[0] || y >= m.dims[1] || z >= m.dims[2]) continue;  // outside: not written
      unsigned char* dst = static_cast<unsigned char*>(const_cast<void*>(m.base)) + z * m.strides[1] + y * m.strides[0] + 2 * x;
      std::memcpy(dst, st.src + swizzle128(r, col / 8) + 2 * (col % 8), 2);
    }
}
template <int N>
inline void bulk_wait_read() {
  while (g_bulk.groups.size() > std::size_t(N)) {
    for (const TmaStore& st : g_bulk.groups.front()) {
      bulk_perform(st);
      --g_bulk_unperformed;
    }
    g_bulk.groups.pop_front();
  }
}
template <int N>
inline void bulk_wait() {
  bulk_wait_read<N>();
}
inline void bulk_load(void* dst, const void* src, std::uint32_t bytes, std::uint64_t* bar) {
  if (reinterpret_cast<std::uintptr_t>(dst) % 16 || reinterpret_cast<std::uintptr_t>(src) % 16 || bytes % 16) {
    std::fprintf(stderr, "bulk copy not 16-byte aligned\n");
    std::abort();
  }
  TmaCopy c{static_cast<unsigned char*>(dst), std::vector<unsigned char>(bytes)};
  std::memcpy(c.bytes.data(), src, bytes);
  std::lock_guard<std::mutex> lock(g_tma_mutex);
  mbar_record(bar, std::move(c));
}
inline void mbar_wait(std::uint64_t* bar, int parity) {
  emu_lag();
  mbar_check(bar, "waited on");
  std::unique_lock<std::mutex> lock(g_tma_mutex);
  unsigned completed = 0;
  auto done = [&] {
    completed = g_mbar[bar].completed;
    return static_cast<int>(completed & 1) != parity;
  };
  if (!g_mbar_changed.wait_for(lock, std::chrono::seconds(20), done)) {
    std::fprintf(stderr, "mbarrier wait (parity %d) never satisfied\n", parity);
    std::abort();
  }
  for (auto it = g_tma_pending.begin(); it != g_tma_pending.end();) {
    if (it->first == bar && it->second.phase <= completed) {
      if (!it->second.landed) std::memcpy(it->second.dst, it->second.bytes.data(), it->second.bytes.size());
      it = g_tma_pending.erase(it);
    } else {
      ++it;
    }
  }
}
inline bool encode_tile_map(CUtensorMap* map, const void* base, bool bf16, std::int64_t cols, std::int64_t tokens,
                            int heads, std::int64_t token_stride, std::int64_t head_stride) {
  const std::uint64_t rows = tokens > 1 ? std::uint64_t(tokens) : 1;
  map->base = base;
  map->bf16 = bf16;
  map->dims[0] = std::uint64_t(cols);
  map->dims[1] = rows;
  map->dims[2] = std::uint64_t(heads);
  map->strides[0] = tokens > 1 ? std::uint64_t(token_stride) * 2 : (std::uint64_t(cols) * 2 + 15) / 16 * 16;
  map->strides[1] = heads > 1 ? std::uint64_t(head_stride) * 2 : map->strides[0] * rows;
  return map->strides[0] % 16 == 0 && map->strides[1] % 16 == 0;
}

template <int R> inline void regs_down() {}
template <int R> inline void regs_up() {}

inline void gmma_arrive() {}
inline void gmma_smem_fence() {}
inline void gmma_commit() {
  g_gmma.groups.push_back(std::move(g_gmma.open));
  g_gmma.open.clear();
}
// Retires all but the newest N commit groups, computing their products now. The warpgroup waits
// together: no thread leaves (and writes shared memory) while another still reads B for them.
template <int N>
inline void gmma_wait() {
  wgbar();
  while (static_cast<int>(g_gmma.groups.size()) > N) {
    const std::vector<GmmaPtr> done = std::move(g_gmma.groups.front());
    g_gmma.groups.pop_front();
    for (const GmmaPtr& p : done) {  // checks first: products of one group may chain on d
      if (std::memcmp(p->a, p->a_at_issue, sizeof p->a_at_issue) != 0) {
        std::fprintf(stderr, "wgmma A registers changed while the product was in flight\n");
        std::abort();
      }
    }
    for (const GmmaPtr& p : done) p->compute(*p, p->chain ? p->chain->value : p->init);
    for (const GmmaPtr& p : done) {
      for (std::size_t i = 0; i < p->value.size(); ++i)
        if (!std::isnan(p->d[i])) {
          std::fprintf(stderr, "wgmma accumulator written while the product was in flight\n");
          std::abort();
        }
    }
    for (const GmmaPtr& p : done)
      if (gmma_in_flight(p->d) == nullptr)  // a newer product into d still in flight: d stays NaN
        for (std::size_t i = 0; i < p->value.size(); ++i) p->d[i] = p->value[i];
    for (const GmmaPtr& p : done) p->chain.reset();  // its value has been used
  }
  wgbar();
}
inline void gmma_wait_all() { gmma_wait<0>(); }
template <int N> inline void gmma_fence(float (&)[N]) {}
template <int N> inline void gmma_fence(std::uint32_t (&)[N]) {}
// Clusters: the harness runs the CTAs of a cluster at once (run_grid), each with its own EmuCta;
// a CTA launched without a cluster is a cluster of one. A shared::cluster address (peer_smem) is
// the CTA's rank and the offset in its shared memory, with the top bit set so that it is never
// taken for a CTA-local one.
inline unsigned cluster_rank() { return g_cta->rank; }
inline unsigned cluster_size() { return g_cta->size; }
inline void cluster_sync() {
  if (g_cta->size == 1) __syncthreads();
  else g_cta->cluster_barrier->arrive_and_wait();
}
constexpr std::uint32_t kClusterAddress = 0x80000000u;
inline std::atomic<bool> g_peer_copies_land_at_issue{false};    // bulk_copy_to_peer below
inline std::atomic<long> g_peer_copies{0}, g_peer_arrivals{0};  // counts, for the tests
inline std::uint32_t peer_smem(const void* p, unsigned rank) {
  if (rank >= g_cta->size) {
    std::fprintf(stderr, "peer_smem of rank %u in a cluster of %u\n", rank, g_cta->size);
    std::abort();
  }
  const std::uint32_t off = smem_addr(p);
  if (off >= kSmemBytes) { std::fprintf(stderr, "peer_smem of an address outside shared memory\n"); std::abort(); }
  return kClusterAddress | (rank << 24) | off;
}
inline unsigned char* cluster_ptr(std::uint32_t addr, const char* what) {
  const unsigned rank = (addr >> 24) & 0x7f;
  if (!(addr & kClusterAddress) || rank >= g_cta->size) {
    std::fprintf(stderr, "%s: not a shared::cluster address of this cluster\n", what);
    std::abort();
  }
  return g_cta->cluster[rank]->smem + (addr & 0xffffffu);
}
inline void mbar_arrive_cluster(std::uint32_t bar) {
  auto* b = reinterpret_cast<std::uint64_t*>(cluster_ptr(bar, "mbar_arrive_cluster"));
  mbar_check(b, "arrived on");
  ++g_peer_arrivals;
  std::lock_guard<std::mutex> lock(g_tma_mutex);
  mbar_arrive_locked(b, 0);
}
// The source is read at issue. The bytes land in the peer when a thread there waits on its barrier,
// so that a walk that reads its record before the wait reads stale bytes; or, with
// g_peer_copies_land_at_issue, at once, so that a copy issued into a stage the peer still reads
// (before its release) changes what the peer reads.
inline void bulk_copy_to_peer(std::uint32_t dst, const void* src, std::uint32_t bytes, std::uint32_t bar) {
  unsigned char* d = cluster_ptr(dst, "bulk_copy_to_peer");
  auto* b = reinterpret_cast<std::uint64_t*>(cluster_ptr(bar, "bulk_copy_to_peer"));
  if (reinterpret_cast<std::uintptr_t>(d) % 16 || reinterpret_cast<std::uintptr_t>(src) % 16 || bytes % 16) {
    std::fprintf(stderr, "bulk copy not 16-byte aligned\n");
    std::abort();
  }
  mbar_check(b, "completed by a peer's copy");
  TmaCopy c{d, std::vector<unsigned char>(bytes)};
  std::memcpy(c.bytes.data(), src, bytes);
  ++g_peer_copies;
  std::lock_guard<std::mutex> lock(g_tma_mutex);
  if (g_peer_copies_land_at_issue) {
    std::memcpy(d, c.bytes.data(), bytes);
    c.landed = true;
  }
  mbar_record(b, std::move(c));
}
}  // namespace gdnkit::cuda
