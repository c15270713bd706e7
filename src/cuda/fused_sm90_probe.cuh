// Measurement aids of the fused SM90 kernel, compiled out unless a build defines them:
// GDNKIT_FUSED_PROBE (cycle stamps of one chunk's phases), GDNKIT_FUSED_TIMELINE (phase stamps of
// every CTA, bench/timeline.py) and GDNKIT_STEP_MARKS (bench/step_marks.py).
#pragma once

#include "cuda/fused_sm90_traits.cuh"

// GDNKIT_FUSED_PROBE_NO_VWAIT 1: the state warpgroups neither wait for V's copy nor, before issuing
// it, for the previous O store's reads of its stage (results wrong).
// GDNKIT_FUSED_PROBE_AUX_NO_KWAIT 1: the aux forms each record without waiting for its chunk's K and
// Q copy, as if they had landed by EMPTY (results wrong): what copying them earlier could take off.
// What a GDNKIT_FUSED_PROBE_SKIP build keeps (both 1 without it).
#define GDNKIT_PROBE_RECORDS (GDNKIT_FUSED_PROBE_SKIP != 1 && GDNKIT_FUSED_PROBE_SKIP != 4)
#define GDNKIT_PROBE_COPIES (GDNKIT_FUSED_PROBE_SKIP != 3 && GDNKIT_FUSED_PROBE_SKIP != 4)

namespace gdnkit::cuda {

// Cycle stamps of the aux's phases (thread 0 of CTA (0, 0, 0), chunk 8), printed, in builds with
// GDNKIT_FUSED_PROBE defined: a measurement aid, compiled out otherwise. GDNKIT_FUSED_PROBE_SKIP
// (1: no records, 2: no walk steps, 3: no copies, 4: neither records nor copies; results are wrong
// then) times the roles apart.
struct FusedProbe {
#ifdef GDNKIT_FUSED_PROBE
  long long t[16];
  int n = 0;
  bool on = false;
  __device__ void mark() {
    if (on && n < 16) t[n++] = clock64();
  }
  __device__ void print(const char* what) const {
    if (!on) return;
    long long d[15] = {};
    for (int i = 1; i < n; ++i) d[i - 1] = t[i] - t[i - 1];
    printf("probe %s: %lld %lld %lld %lld %lld %lld %lld %lld %lld %lld %lld %lld %lld %lld %lld\n", what, d[0], d[1],
           d[2], d[3], d[4], d[5], d[6], d[7], d[8], d[9], d[10], d[11], d[12], d[13], d[14]);
  }
#elif defined(GDNKIT_STEP_MARKS)
  int c = -1, n = 0;  // the aux's chunk - j0 being marked (step_marks, lane 0 of each warp), or -1
  __device__ void mark() {
    unsigned t;
    asm volatile("mov.u32 %0, %%clock;" : "=r"(t)::"memory");
    if (c >= 0 && n < 16) step_marks[2 + threadIdx.x / 32][c][n++] = t;
  }
  __device__ void print(const char*) const {}
#else
  __device__ void mark() {}
  __device__ void print(const char*) const {}
#endif
};

// Stamps of one launch's phases in every CTA (%globaltimer, ns), in builds with
// GDNKIT_FUSED_TIMELINE defined: a measurement aid, compiled out otherwise. Slots: 0 the CTA's
// start, 1 the end of its prologue (before the roles split), 3 the first step begun (state thread
// 0, past FULL of chunk 0: the first record is out), 4 the last step done, 5 the aux done, 6 the
// exit; 7 the chunks walked (slot 2 unused: a stamp after the aux's own arrival on FULL was seen
// several microseconds after the state warps had passed that barrier, i.e. ptxas may move a
// timer read across an arrival). Then, for the eight chunks j0 + k (FusedParams::timeline_j0, the
// host's GDNKIT_TIMELINE_J0): 8 + k state thread 0 past FULL of the chunk, 16 + k its step done,
// 24 + k the aux's record formed (before its V wait and FULL arrival); 32 + w warp w done with its
// role (lane 0, back from fused_aux or fused_state). Where FusedParams::timeline is set (the
// host's launches 5 and 6 of the process, fused_sm90.cu), thread 0 stores them there at exit,
// kTimelineSlots per CTA; the host prints them at its launch 9 ("TL launch cta t0 .. t47"),
// bench/timeline.py summarises the lines. ptxas schedules the timer reads, and a barrier does not
// pin them: the stamps of one CTA were seen to disagree by several microseconds
// (docs/perf-notes.md, "Step-by-step stamps"), so read them as indicative.
// (No printf in the kernel: a call makes ptxas serialize its wgmma, C7510.)
#ifdef GDNKIT_FUSED_TIMELINE
constexpr unsigned kTimelineCtas = 1024;
constexpr int kTimelineOwnSlots = 48;
#ifdef GDNKIT_STEP_MARKS
constexpr int kTimelineSlots = kTimelineOwnSlots + 6 * kMarkChunks * 16;  // then step_marks
#else
constexpr int kTimelineSlots = kTimelineOwnSlots;
#endif
__shared__ unsigned long long fused_timeline[kTimelineOwnSlots];
__device__ __forceinline__ unsigned long long global_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
#define GDNKIT_FUSED_STAMP(cond, slot)                                            \
  do {                                                                            \
    if (cond) ::gdnkit::cuda::fused_timeline[slot] = ::gdnkit::cuda::global_ns(); \
  } while (0)
// Chunk j's stamp in slot base + (j - j0) where j is among the eight stamped ones.
#define GDNKIT_FUSED_STAMP_STEP(cond, j, j0, base) \
  GDNKIT_FUSED_STAMP((cond) && (j) >= (j0) && (j) < (j0) + 8, (base) + ((j) - (j0)) % 8)
#else
#define GDNKIT_FUSED_STAMP_STEP(cond, j, j0, base) \
  do {                                             \
  } while (0)
#define GDNKIT_FUSED_STAMP(cond, slot) \
  do {                                 \
  } while (0)
#endif

}  // namespace gdnkit::cuda
