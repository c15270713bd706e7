// The fused SM90 kernel's aux warpgroup: the first chunks' copies, then every chunk's record (and
// with kAuxP its P) up to kRecStages - 1 chunks ahead of the state warpgroups.
#pragma once

#include "cuda/fused_sm90_copies.cuh"
#include "cuda/fused_sm90_probe.cuh"
#include "cuda/fused_sm90_record.cuh"
#include "cuda/fused_sm90_scheduler.cuh"

namespace gdnkit::cuda {

// The aux warpgroup: the first chunks' copies (TMA, issued by thread 0) and every record, one
// chunk ahead of the state warpgroups (with F::kAuxP also P).
template <class F>
__device__ __forceinline__ void fused_aux(const FusedParams& fp, unsigned char* smem, const int* order, int tid) {
  constexpr int DK = F::DK;
  const ChunkedParams& p = fp.p;
  constexpr int C = kChunk;
  const int h = blockIdx.y;
  // In the pairs (kAuxP, 232 registers; 255 without the producer warpgroup) the pair's rank (-1:
  // not paired) and the list's bounds are read once, not at every use (3-5% of the pairs' time);
  // the 128-column kernels have no registers to hold them.
  constexpr bool kHoist = F::kAuxP;
  ChunkCursor<F::kWalks, kHoist> chunks{p, order};
  if constexpr (kHoist) chunks.cache();
  const PairTests<F, kHoist> pair;
  const FusedCopier<F> copy{fp, smem};

  constexpr int R = F::kRecStages;
  int j = 0;  // chunks handed to the state warpgroups
  ChunkPos cur = chunks.first();
  if (chunks.valid(cur)) {
#if GDNKIT_PROBE_COPIES
    if (tid == 0) {  // K and Q of chunks 0-2, V of chunks 0-1 (then state thread 0 or the producer)
      ChunkPos c = cur;  // (with F::kKqFirst, chunk 0's K and Q: fused_later_first_copies)
      for (int k = 0; k < (F::kKqFirst ? 1 : 3) && chunks.valid(c); ++k, c = chunks.next(c)) {
        copy.kq(c.c0, k);
        if (k < 2 && !F::kKqFirst) copy.v(c.c0, k);
      }
    }
#endif
    // The next chunk's gate or beta stays a loaded word until its record (load_gate_beta_bits):
    // the load is in flight during this record.
    std::uint32_t gb_cur = load_gate_beta_bits(p, cur.c0, cur.nrows(), h, tid);
    for (;;) {
      FusedProbe probe;
#ifdef GDNKIT_FUSED_PROBE
      probe.on = tid == 0 && blockIdx.x == 0 && blockIdx.y == 0 && blockIdx.z == 0 && j == 8;
#elif defined(GDNKIT_STEP_MARKS)
      probe.c =
          tid % 32 == 0 && j >= fp.timeline_j0 && j < fp.timeline_j0 + kMarkChunks ? j - fp.timeline_j0 : -1;
#endif
      probe.mark();
      const ChunkPos nxt = chunks.next(cur);
      const bool more = chunks.valid(nxt);
      const int nrows = cur.nrows();
      // Chunk j - R is done with, and so is its slot of F::ahead (state thread 0 reads it at step j - R).
      if (j >= R) named_sync(F::kBarEmpty + j % R, F::kThreads);
      if (tid == 0) {  // for state thread 0's copies at step j (published by FULL[j]; a producer has its own)
        if constexpr (!F::kProducer) {
          const ChunkPos nxt2 = more ? chunks.next(nxt) : nxt;
          F::ahead(smem, j % R)[0] = more ? nxt.c0 : -1;
          F::ahead(smem, j % R)[1] = more && chunks.valid(nxt2) ? nxt2.c0 : -1;
          if constexpr (F::kStateWarpgroups == 1) {  // (fused_state's kKqAtEnd)
            const bool more2 = more && chunks.valid(nxt2);
            const ChunkPos nxt3 = more2 ? chunks.next(nxt2) : nxt2;
            F::ahead(smem, j % R)[2] = more2 && chunks.valid(nxt3) ? nxt3.c0 : -1;
          }
        }
        if (pair.from_peer(j)) mbar_expect_tx(F::rec_full_bar(smem, j % R), F::rec_copy_bytes);  // the peer's copy
      }
      probe.mark();
      const std::uint32_t gb_next = more ? load_gate_beta_bits(p, nxt.c0, nxt.nrows(), h, tid) : 0u;
      probe.mark();
#if GDNKIT_PROBE_COPIES && !GDNKIT_FUSED_PROBE_AUX_NO_KWAIT
      mbar_wait(F::kq_bar(smem, j % 3), (j / 3) & 1);  // this chunk's K and Q
#endif
      probe.mark();
      if (nrows < C) {
        zero_tile_rows(F::kq(smem, j % 3), 2 * (DK / 64), nrows, C, tid);
        gmma_smem_fence();  // the zero rows, before wgmma reads them (only here: the fence waits
                            // for this thread's outstanding loads, the next chunk's gates)
      }
#ifdef GDNKIT_STEP_MARKS
      probe.mark();
      {
        const float gbv = gate_beta_value(p, gb_cur, tid);
        asm volatile("" ::"f"(gbv) : "memory");
        probe.mark();
      }
#endif
#if GDNKIT_PROBE_RECORDS
      // With kAuxP the peer's copy brings the whole record (Mt, P, gam, dec) of its chunks: nothing
      // to form here. (Both products' wgmma groups, issue to wait, lie inside this branch: ptxas
      // 13.0 keeps the kernel's wgmma unserialized.) Otherwise it forms Mt where the chunk is its
      // own (always with kAuxP, said as a constant so that the path without Mt is not compiled).
      if (!(F::kAuxP && pair.from_peer(j))) {
        fused_record<F>(F::kq(smem, j % 3), F::rec(smem, j % R), smem,
                        reinterpret_cast<float*>(smem + F::off_gates + (j % R) * F::gates_bytes),
                        gate_beta_value(p, gb_cur, tid), nrows, tid, probe, F::kAuxP || !pair.from_peer(j),
                        p.scale);
        if constexpr (F::kAuxP) probe.mark();
      }
#endif
      GDNKIT_FUSED_STAMP_STEP(tid == 0, j, fp.timeline_j0, 24);
      if (pair.own(j)) {  // the copy into the peer's stage, once its walk is done with chunk j - 3 there
        gmma_smem_fence();  // this thread's Mt stores, before the bulk copy reads them
        named_sync(F::kBarAux, 128);
        if (tid == 0) {
          if (j >= 3) mbar_wait(F::rec_free_bar(smem, j % R), ((j - 3) / 6) & 1);
          const unsigned peer = cluster_rank() ^ 1u;
          bulk_copy_to_peer(peer_smem(F::rec(smem, j % R), peer), F::rec(smem, j % R), F::rec_copy_bytes,
                            peer_smem(F::rec_full_bar(smem, j % R), peer));
        }
      }
      gmma_smem_fence();  // the record's stores, before the state warpgroups' wgmma
      named_arrive(F::kBarFull + j % R, F::kThreads);
      probe.mark();
      probe.print("aux: EMPTY, ahead | gate loads | K wait | tail, gate store | aux barrier | K K^T issue | "
                  "cumsum | K K^T wait, A | diagonal | block rows | tail | (P |) V + FULL");
      ++j;
      if (!more) break;
      cur = nxt;
      gb_cur = gb_next;
    }
  }
  // Every arrival on a barrier is matched before the CTA exits: the last R chunks' EMPTY.
  for (int jj = j >= R ? j - R : 0; jj < j; ++jj) named_sync(F::kBarEmpty + jj % R, F::kThreads);
  GDNKIT_FUSED_STAMP(tid == 0, 5);
}

}  // namespace gdnkit::cuda
