// Context parallelism on one GPU, host side (the stages are described in cp.cuh).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "cuda/chunked.h"

namespace gdnkit::cuda {

// How a split cuts the sequences (cp.cuh describes the stages).
struct CpLayout {
  int seg = 0;                   // tokens per segment, a multiple of 64
  std::int64_t cap1 = 0, cap3 = 0;  // list lengths: N + T / seg (sum of max(nseg_n, 1)), T / seg (of nseg_n - 1)
  std::int64_t slots = 0;        // E and M slots: the sum of nseg_n over split sequences
  bool pairs = false;            // stage 1 at 128 columns in value and map pairs (ChunkedParams::cp_pairs)
  // Lead mode (pairs, exact, one sequence in two segments, dk = dv = 128): the first segment by the
  // unsplit 64-column pairs in the same launch (fused_sm90.cuh, gdn_fused_lead_kernel); the planner
  // then makes it the longer one (cp_model.h, cp_best_lead).
  bool lead = false;
  static CpLayout of(std::int64_t tokens, std::int64_t seqs, int seg) {
    // nseg_n <= floor(len_n / seg) + 1, and a split sequence has floor(len_n / seg) >= 1.
    CpLayout c;
    c.seg = seg;
    c.cap3 = tokens / seg;
    c.cap1 = seqs + c.cap3;
    c.slots = c.cap3 + (seqs < c.cap3 ? seqs : c.cap3);
    return c;
  }
};

// Sequences up to which an exact packed split's stage 1 places its own list entries instead of
// the list builder (launch_cp; each of its CTAs reads the whole of cu_seqlens, 32 sequences per
// round of warp shuffles).
constexpr std::int64_t kCpPackedMaxSeqs = 64;

// One sequence, or sequences of one length (no cu_seqlens): every entry of the split's lists is then
// a function of its index, and this sets p.cp_seg and p.cp_per_seq so that the kernels compute
// the entries they read (cp.cuh, cp_walk_entry) and returns true; the lists are not built (a launch
// less). Otherwise it returns false and leaves p alone.
inline bool cp_compute_lists(ChunkedParams& p, const CpLayout& c) {
  // (The fused kernel keeps at most kCtaWalks computed entries per CTA, with 65535 CTAs in z.)
  if ((p.has_cu_seqlens && p.num_seqs != 1) || c.cap1 > std::int64_t(kCtaWalks) * 65535) return false;
  p.cp_seg = c.seg;
  // Entries per sequence: the one sequence's list (its segments, then padding), else the segments
  // of the common length.
  const std::int64_t e = p.num_seqs == 1 ? c.cap1 : p.uniform_len > c.seg ? (p.uniform_len + c.seg - 1) / c.seg : 1;
  p.cp_per_seq = static_cast<int>(e);
  return true;
}

// Lead mode's first segment (CpLayout::lead): the call's parameters p (one sequence, cu_seqlens[0]
// = 0) for the unsplit 64-column pairs, cut at the segment's end (`tokens`: seq_range clamps the
// sequence there) and with the end state, as the final state, into E's slot 0 (the sequence's first
// slot; E is [slot, H] states in the problem's layout, as the final state). A list computed for p
// (cp_compute_lists) is not theirs: they walk the sequence.
inline ChunkedParams cp_lead_params(const ChunkedParams& p, const CpLayout& c, float* E) {
  ChunkedParams a = p;
  a.tokens = p.tokens < c.seg ? p.tokens : c.seg;
  a.final_state = E;
  a.want_final_state = true;
  a.walks = nullptr;
  a.num_walks = 0;
  a.cp_seg = a.cp_per_seq = 0;
  a.longest_first = a.lpt = false;
  return a;
}

// How many of a list's first entries get CTAs: with computed lists only those that hold a walk
// or a segment, the rest being padding whose CTAs would only start and exit (a list's length only
// bounds them); otherwise the whole list. List 1 (stage 1): nseg for one sequence, cp_per_seq per
// sequence of equal lengths. List 3 (the correction): one fewer each (a sequence's first segment
// needs no correction), so one sequence in two segments has one where cap3 = T / seg is 2. At
// least 1: a grid is never empty.
inline std::int64_t cp_list_entries(const ChunkedParams& p, const CpLayout& c, bool computed, bool fix) {
  const std::int64_t cap = fix ? c.cap3 : c.cap1;
  if (!computed) return cap;
  const std::int64_t segs = p.num_seqs == 1 ? (p.tokens > c.seg ? (p.tokens + c.seg - 1) / c.seg : 1)
                                            : static_cast<std::int64_t>(p.num_seqs) * p.cp_per_seq;
  const std::int64_t n = segs - (fix ? (p.num_seqs == 1 ? 1 : p.num_seqs) : 0);
  return n < 1 ? 1 : n < cap ? n : cap;
}

// Whether the scan has a step to take (cp.cuh, stage 2): a sequence of three segments or more, or a
// final state wanted (the last step's only product). With computed lists the host knows the
// longest sequence (at most T tokens where there is one, else the common length); otherwise the
// scan is launched and its CTAs find out.
inline bool cp_needs_scan(const ChunkedParams& p, const CpLayout& c, bool computed) {
  const std::int64_t longest = p.num_seqs == 1 ? p.tokens : p.uniform_len;
  return !computed || p.want_final_state || (longest + c.seg - 1) / c.seg > 2;
}

// The workspace of one split call: the two lists, the per-sequence slot table, the segments' end
// states E and maps M, and the map CTAs' output rows ((T + 16) x H x dk, 16-bit, map_o_piece).
struct CpWorkspace {
  std::size_t list1 = 0, list3 = 0, seq_slots = 0, states = 0, maps = 0, map_o = 0, map_end = 0,
              bytes = 0;  // offsets, total
};
CpWorkspace cp_workspace(const CpLayout& c, std::int64_t seqs, std::int64_t tokens, int heads, int dk, int dv);

// Opts the split's kernels into their shared memory on `device` (the current device), once per
// process and device; the planner calls it before it picks a split.
cudaError_t cp_prepare(int device);

// Enqueues the launches on stream (no host synchronisation): the list builder (not where
// cp_compute_lists holds, nor for an exact split of at most kCpPackedMaxSeqs sequences, whose
// stage 1 places the entries), with cutoff > 0 the decay shortcut's stop points (cp_stop_cta), stage 1
// on k1 (a walk-list fused kernel, opted into its shared memory, whose value-column blocks divide
// dk: its map CTAs cover M; maps: the call's K, Q and V descriptors for it, chunked.h), the scan
// (where cp_needs_scan) and the correction; every launch, the builder's too, is a programmatic dependent launch (pdl.cuh).
// p is the call's parameters as for the unsplit kernel; cutoff 0 is exact; ws holds
// cp_workspace(...).bytes, 16-byte aligned (its parts start at multiples of 256 bytes from ws).
// With graphs (the plan's), the launches go through its graph for the stream (launch_list.h);
// without, one by one. Nothing is launched when the parameters are refused.
class LaunchGraphs;
cudaError_t launch_cp(const ChunkedParams& p, const CpLayout& c, const SplitKernel& k1, const FusedMaps& maps,
                      float cutoff, unsigned char* ws, LaunchGraphs* graphs, cudaStream_t stream);

}  // namespace gdnkit::cuda
