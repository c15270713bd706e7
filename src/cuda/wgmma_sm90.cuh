// Warpgroup MMA (wgmma, sm_90a) for the walk and the fused kernel: shared-memory descriptors of
// 128-byte-swizzled tiles, the register-A and shared-A instructions through CUTLASS/CuTe's
// wrappers, the warpgroup fences, named barriers and register reallocation.
//
// Tiles are stored in "atoms" of 8 rows x 128 bytes (64 16-bit elements per row); within an atom
// the 16-byte chunk c of row r sits at chunk c ^ (r % 8), and atoms are 1024-byte aligned. A
// [rows x 64] tile is rows / 8 atoms one after another (1024 bytes apart), a [rows x 128] tile two
// such column blocks, rows x 128 bytes apart. The same bytes serve as
//   K-major B (B[k][n] = tile[n][k], k within a row):   SBO = 1024 (next 8 rows), LBO unused;
//                                                        the k-th 16-wide step starts 32 k bytes
//                                                        into the row (within one column block)
//   MN-major B (B[k][n] = tile[k][n], n within a row):  SBO = 1024 (next 8 rows = next 8 k),
//                                                        LBO = column-block stride (next 64 n);
//                                                        the k-th 16-row step starts 2048 k bytes in.
// A comes from registers in the layout of mma.sync's A fragment (mma_sm80.cuh), warp w of the
// warpgroup holding rows [16 w, 16 w + 16) of the 64; the fp32 accumulator of m64nN holds, per
// warp, rows [16 w, 16 w + 16) as N / 8 C tiles of mma.sync's m16n8 layout.
#pragma once

#include <cuda.h>

#include <cstdint>
#include <utility>

#ifndef CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED
#define CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED  // the n48 shape (three 16-row blocks of a tail chunk)
#endif
#include <cute/arch/mma_sm90_gmma.hpp>

#include "cuda/chunk_io.cuh"
#include "cuda/mma_sm80.cuh"

namespace gdnkit::cuda {

__device__ __forceinline__ std::uint64_t gmma_desc(const void* smem, std::uint32_t lbo, std::uint32_t sbo) {
  const std::uint32_t addr = smem_addr(smem);
  return (static_cast<std::uint64_t>((addr >> 4) & 0x3fffu)) | (static_cast<std::uint64_t>((lbo >> 4) & 0x3fffu) << 16) |
         (static_cast<std::uint64_t>((sbo >> 4) & 0x3fffu) << 32) | (std::uint64_t(1) << 62);  // 128-byte swizzle
}

// desc moved `bytes` (a multiple of 16) further into shared memory: the start address field is
// the low 14 bits of address / 16, which no address inside a CTA's shared memory (< 228 KB)
// carries out of. One add per product instead of rebuilding the descriptor from the address
// (five to twelve instructions per wgmma, issued by every warp of the warpgroup).
__device__ __forceinline__ std::uint64_t gmma_desc_add(std::uint64_t desc, std::uint32_t bytes) {
  return desc + (bytes >> 4);
}
// The byte offset of the kk-th 16-column step of a K-major tile of 64-column swizzled blocks of
// `rows` rows (the step's block, then 32 bytes per step within it).
__device__ __forceinline__ constexpr std::uint32_t gmma_kstep(int kk, int rows) {
  return static_cast<std::uint32_t>((kk / 4) * (rows * 128) + (kk % 4) * 32);
}

namespace detail_gmma {
namespace G = cute::SM90::GMMA;
template <typename T, int N, G::Major B>
struct Op;
#define GDNKIT_GMMA_OP(N)                                                                 \
  template <G::Major B>                                                                  \
  struct Op<__nv_bfloat16, N, B> {                                                       \
    using type = G::MMA_64x##N##x16_F32BF16BF16_RS<G::Major::K, B>;                     \
  };                                                                                     \
  template <G::Major B>                                                                  \
  struct Op<__half, N, B> {                                                              \
    using type = G::MMA_64x##N##x16_F32F16F16_RS<G::Major::K, B>;                       \
  };
GDNKIT_GMMA_OP(16)
GDNKIT_GMMA_OP(32)
GDNKIT_GMMA_OP(48)
GDNKIT_GMMA_OP(64)
GDNKIT_GMMA_OP(128)
#undef GDNKIT_GMMA_OP

// Both operands from shared memory, both K-major (the fused kernel's K K^T and Q K^T).
template <typename T, int N>
struct OpSS;
#define GDNKIT_GMMA_OP_SS(N)                                                          \
  template <>                                                                        \
  struct OpSS<__nv_bfloat16, N> {                                                    \
    using type = G::MMA_64x##N##x16_F32BF16BF16_SS<G::Major::K, G::Major::K>;       \
  };                                                                                 \
  template <>                                                                        \
  struct OpSS<__half, N> {                                                           \
    using type = G::MMA_64x##N##x16_F32F16F16_SS<G::Major::K, G::Major::K>;         \
  };
GDNKIT_GMMA_OP_SS(32)
GDNKIT_GMMA_OP_SS(64)
#undef GDNKIT_GMMA_OP_SS

template <class O, std::size_t... I>
__device__ __forceinline__ void fma_ss(std::uint64_t desc_a, std::uint64_t desc_b, float (&d)[sizeof...(I)],
                                       bool accumulate, std::index_sequence<I...>) {
  O::fma(desc_a, desc_b, d[I]..., accumulate ? G::ScaleOut::One : G::ScaleOut::Zero);
}

template <class O, std::size_t... I>
__device__ __forceinline__ void fma(const std::uint32_t (&a)[4], std::uint64_t desc, float (&d)[sizeof...(I)],
                                    bool accumulate, std::index_sequence<I...>) {
  O::fma(a[0], a[1], a[2], a[3], desc, d[I]..., accumulate ? G::ScaleOut::One : G::ScaleOut::Zero);
}
}  // namespace detail_gmma

// d (+)= A B, M = 64 (the warpgroup), N = N, K = 16; asynchronous until gmma_wait.
template <typename T, int N, bool B_MN_MAJOR>
__device__ __forceinline__ void gmma_rs(float (&d)[N / 2], const std::uint32_t (&a)[4], std::uint64_t desc_b,
                                        bool accumulate) {
  using namespace detail_gmma;
  using O = typename Op<T, N, B_MN_MAJOR ? G::Major::MN : G::Major::K>::type;
  detail_gmma::fma<O>(a, desc_b, d, accumulate, std::make_index_sequence<N / 2>{});
}

// d (+)= A B with A (64 x 16, K-major) and B (16 x N, K-major) both in shared memory.
template <typename T, int N>
__device__ __forceinline__ void gmma_ss(float (&d)[N / 2], std::uint64_t desc_a, std::uint64_t desc_b, bool accumulate) {
  using namespace detail_gmma;
  detail_gmma::fma_ss<typename OpSS<T, N>::type>(desc_a, desc_b, d, accumulate, std::make_index_sequence<N / 2>{});
}

__device__ __forceinline__ void gmma_arrive() { cute::warpgroup_arrive(); }
__device__ __forceinline__ void gmma_commit() { cute::warpgroup_commit_batch(); }
// Orders this thread's earlier shared-memory writes (stores, cp.async copies that have landed)
// before later reads of that memory by wgmma, which reads through the async proxy.
__device__ __forceinline__ void gmma_smem_fence() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

// Waits until at most N of this warpgroup's commit groups are in flight (they retire in order).
template <int N>
__device__ __forceinline__ void gmma_wait() { cute::warpgroup_wait<N>(); }
__device__ __forceinline__ void gmma_wait_all() { cute::warpgroup_wait<0>(); }

// Registers the compiler must treat as read and written here: keeps accumulators and A fragments
// of in-flight wgmma from being moved across the fences or reused before the wait.
template <int N>
__device__ __forceinline__ void gmma_fence(float (&x)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) cute::warpgroup_fence_operand(x[i]);
}
template <int N>
__device__ __forceinline__ void gmma_fence(std::uint32_t (&x)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) cute::warpgroup_fence_operand(x[i]);
}

// mbarriers (64-bit, in shared memory) and TMA tile loads, for the fused kernel's copies: one
// thread arms the barrier with the bytes it expects and issues the copies; every consumer waits
// on the barrier's phase parity (the k-th use of a barrier completes phase k, parity k & 1).
__device__ __forceinline__ void mbar_init(std::uint64_t* bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(count) : "memory");
}
// Makes barrier initialisation visible to the async proxy (TMA) before the first copy.
__device__ __forceinline__ void mbar_init_fence() { asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"); }
__device__ __forceinline__ void mbar_expect_tx(std::uint64_t* bar, std::uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_wait(std::uint64_t* bar, int parity) {
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "wait_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra wait_%=;\n"
      "}\n" ::"r"(smem_addr(bar)),
      "r"(parity)
      : "memory");
}
// Fetches a TMA descriptor into the descriptor cache ahead of its first use.
__device__ __forceinline__ void tma_prefetch(const void* map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<std::uint64_t>(map)) : "memory");
}
// One box of a 3-D tensor map (box origin c0, c1, c2 in elements) into shared memory at dst,
// completing `bar`'s expected transaction bytes. Rows outside the tensor arrive as zeros.
__device__ __forceinline__ void tma_load_3d(void* dst, const void* map, std::uint64_t* bar, int c0, int c1, int c2) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5}], [%2];\n" ::"r"(
          smem_addr(dst)),
      "l"(reinterpret_cast<std::uint64_t>(map)), "r"(smem_addr(bar)), "r"(c0), "r"(c1), "r"(c2)
      : "memory");
}

// The reverse: one 64 x 64 box from shared memory at src (128-byte swizzled, 1024-byte aligned) to
// the tensor at box origin (c0, c1, c2), in the issuing thread's current bulk group; elements
// outside the tensor are not written. The caller fences the box's shared-memory writes to the async
// proxy (gmma_smem_fence) and orders them before the issue (a barrier).
__device__ __forceinline__ void tma_store_3d(const void* map, const void* src, int c0, int c1, int c2) {
  asm volatile("cp.async.bulk.tensor.3d.global.shared::cta.bulk_group [%0, {%2, %3, %4}], [%1];\n" ::"l"(
                   reinterpret_cast<std::uint64_t>(map)),
               "r"(smem_addr(src)), "r"(c0), "r"(c1), "r"(c2)
               : "memory");
}
// Closes the issuing thread's bulk group of stores.
__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
// Waits until at most N of the thread's bulk groups are still reading their shared memory (then it
// may be rewritten), or, bulk_wait, are still writing global memory.
template <int N>
__device__ __forceinline__ void bulk_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(N) : "memory");
}
template <int N>
__device__ __forceinline__ void bulk_wait() {
  asm volatile("cp.async.bulk.wait_group %0;\n" ::"n"(N) : "memory");
}

// A contiguous block of global memory (bytes: a multiple of 16, both addresses 16-byte aligned)
// into shared memory by the TMA unit, completing `bar`'s expected transaction bytes.
__device__ __forceinline__ void bulk_load(void* dst, const void* src, std::uint32_t bytes, std::uint64_t* bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
                   smem_addr(dst)),
               "l"(reinterpret_cast<std::uint64_t>(src)), "r"(bytes), "r"(smem_addr(bar))
               : "memory");
}

// Thread-block clusters (sm_90): the CTA's rank in its cluster, the cluster's size, and a barrier
// of all threads of the cluster's CTAs (release / acquire: shared-memory writes before it are
// visible to every CTA of the cluster after it; each thread takes part).
__device__ __forceinline__ unsigned cluster_rank() {
  unsigned r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
  return r;
}
__device__ __forceinline__ unsigned cluster_size() {
  unsigned r;
  asm volatile("mov.u32 %0, %%cluster_nctarank;\n" : "=r"(r));
  return r;
}
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}
// The address of this CTA's shared variable `p` in CTA `rank` of the cluster (shared::cluster).
__device__ __forceinline__ std::uint32_t peer_smem(const void* p, unsigned rank) {
  std::uint32_t r;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(r) : "r"(smem_addr(p)), "r"(rank));
  return r;
}
// One arrival on an mbarrier of a CTA of the cluster (a shared::cluster address), awaited there
// by mbar_wait: the forms CUTLASS's cluster pipelines use to release a stage to its remote
// producer (release and acquire at CTA scope). The callers release a stage only after the wgmma
// that read it has retired, so no read can be outstanding. At cluster scope the arrival had cost
// a MEMBAR that waited for the thread's outstanding global stores (the previous step's O), 2.7%
// of the state warps' samples in a paired split (docs/perf-notes.md, "The O stores").
__device__ __forceinline__ void mbar_arrive_cluster(std::uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// `bytes` (a multiple of 16) of this CTA's shared memory at src into another CTA's of the cluster
// at dst by the TMA unit, completing the transaction bytes of that CTA's mbarrier bar (dst and bar:
// shared::cluster addresses, peer_smem). The source's generic writes need
// fence.proxy.async.shared::cta (gmma_smem_fence) before.
__device__ __forceinline__ void bulk_copy_to_peer(std::uint32_t dst, const void* src, std::uint32_t bytes,
                                                  std::uint32_t bar) {
  asm volatile("cp.async.bulk.shared::cluster.shared::cta.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
                   dst),
               "r"(smem_addr(src)), "r"(bytes), "r"(bar)
               : "memory");
}

// Host: the TMA descriptor of a [heads][tokens][cols] 16-bit tensor (strides in elements; any
// stride of a dimension with one entry is ignored), boxes of 64 x 64 x 1, 128-byte swizzle, zeros
// outside. False when the driver rejects it. Defined in fused_sm90.cu.
bool encode_tile_map(CUtensorMap* map, const void* base, bool bf16, std::int64_t cols, std::int64_t tokens,
                     int heads, std::int64_t token_stride, std::int64_t head_stride);

// Named barriers (bar.sync / bar.arrive, ids 1..15; 0 is __syncthreads): `count` threads, whole
// warps, take part; arrive does not wait. A producer's arrive and its consumers' sync on one id
// order the producer's earlier shared-memory writes before the consumers' later reads.
__device__ __forceinline__ void named_sync(int id, int count) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}
__device__ __forceinline__ void named_arrive(int id, int count) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}

// The warpgroup's register budget per thread (setmaxnreg; a multiple of 8 in [24, 256]): a
// warp-specialised CTA moves registers from its load/prep warpgroup to its state warpgroups.
template <int R>
__device__ __forceinline__ void regs_down() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(R));
}
template <int R>
__device__ __forceinline__ void regs_up() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(R));
}

}  // namespace gdnkit::cuda
