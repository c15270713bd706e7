// The planner's cost model for context parallelism (cp_model.h).
//
// Microseconds of device time, fitted to H200 sweeps of options.segments (docs/perf-notes.md,
// "Context parallelism" and "The planner refitted"): a fused walk-list CTA takes about 4.9 us per
// 64-token chunk with 128 value columns and 4.8 us with 64 when every SM runs one, plus about one
// chunk's time to fill its pipeline; CTAs beyond one per SM run in further waves. The unsplit
// 128-column kernel, since the block solve, about 3.52 us per chunk (measured on batches that
// fill one or two waves). Unsplit at
// dv = 128, the 64-column CTAs run in pairs that share their records: 3.63 us per chunk and two
// chunks' time to fill ("CTA pairs sharing records"; the split's stage 1 keeps 4.8 until measured
// with pairs). An exact split's stage 1 at 128 columns with each segment's value and map CTA in a
// pair sharing the records (the first segments' map CTAs walking along): about 4.0 us per chunk
// ("Value and map CTAs in pairs"); without pairs, where those map CTAs would add a wave, 4.9; at
// 64 columns, whose value blocks and map blocks run in pairs where dk and dv are multiples of 128,
// about 3.4 (fitted to 8- and 16-head splits into 2 and 4 segments, within 10%). A scan step (one
// segment) about 4.5 us; the correction moves map_o and o (read and written) of the rows after
// each sequence's first segment at about 2.2 TB/s; the launches and the split's other fixed costs
// about 30 us. The unsplit split path: its walk 2.9 / 2.9 / 3.4 / 4.4 us per chunk with 1 / 2 / 4
// / 8 warps per CTA, its prep 0.0093 us per chunk and walk (the records of every walk, spread over
// the SMs), and 20 us. Fitted on single sequences of 8 to 64 heads, 2K to 128K tokens: the
// unsplit estimates within 5% of the measured times, the splits' within 6% at 24 to 48 heads,
// 8-10% high at 16 heads or 2048 tokens and 8-20% high for the 8-head splits into 8 segments (far
// under their unsplit time either way);
// tests/cpu/test_cp_model.cpp holds the measurements.
#include "cuda/cp_model.h"

#include <algorithm>
#include <limits>

namespace gdnkit::cuda {

namespace {

constexpr std::int64_t kChunkTokens = 64;
constexpr double kStepFused128 = 4.9, kStepFused64 = 4.8, kStepFused64Pairs = 3.63, kScanStep = 4.5, kCpFixed = 30.0;
// The unsplit 128-column kernel since the block solve (d7ce496 on an H200: fixed-b2-t16384 0.902 ms,
// qwen35-16x64-b4-t8192 0.901, fixed-b2-t4096 0.232; it had been 4.9 like the walk-list kernel).
constexpr double kStepFusedUnsplit128 = 3.52;
// Stage 1 of an exact split at 128 columns: a segment's value and map CTA share their records.
constexpr double kStepFused128Pairs = 4.0;
// Stage 1 at 64 columns where its CTAs run in pairs (dk and dv multiples of 128: two value blocks
// and two map blocks per segment, fused_cluster_x).
constexpr double kStepFused64SplitPairs = 3.4;
constexpr double kFixBytesPerUs = 2.2e6;
// Lead mode (CpLayout::lead): the unsplit 64-column pairs' step against the 128-column value and map
// pair's, 2.10 against 3.42 us on an H100 at 5cc38e7 (fixed-b1-t16384's pairs; the two-segment
// splits of qwen3next-16x32-b1-t16384 and -t65536), applied to the latter's constant.
constexpr double kStepLeadPairs = kStepFused128Pairs * 2.10 / 3.42;
constexpr double kPrepPerWalkChunk = 0.0093, kSplitPathFixed = 20.0;

double walk_step(int warps) { return warps <= 2 ? 2.9 : warps == 4 ? 3.4 : 4.4; }
double fused_step(int dvb) { return dvb == 128 ? kStepFused128 : kStepFused64; }
std::int64_t waves(std::int64_t ctas, int sms) { return (ctas + sms - 1) / sms; }
std::int64_t chunks_of(std::int64_t tokens) { return (tokens + kChunkTokens - 1) / kChunkTokens; }

}  // namespace

double cp_unsplit_cost(UnsplitKernel k, const detail::Shape& s, int sms) {
  const std::int64_t n = std::max<std::int64_t>(s.N, 1), chunks = chunks_of(s.T / n);
  const int cols = 16 * k.warps;
  const double walk = static_cast<double>(waves((s.dv / cols) * s.H * n, sms));
  if (k.fused) {
    if (cols == 64 && s.dv == 128) return static_cast<double>(chunks + 2) * kStepFused64Pairs * walk;
    return static_cast<double>(chunks) * (cols == 128 ? kStepFusedUnsplit128 : kStepFused64) * walk;
  }
  return static_cast<double>(chunks) * (walk_step(k.warps) * walk + kPrepPerWalkChunk * static_cast<double>(s.H * n)) +
         kSplitPathFixed;
}

bool fused64_pays(const detail::Shape& s, int sms, int split_warps) {
  if (s.dv != 128) return false;
  return cp_unsplit_cost({true, 4}, s, sms) < kFused64Pays * cp_unsplit_cost({false, split_warps}, s, sms);
}

int fused_columns(const detail::Shape& s, int sms, int split_warps) {
  constexpr std::int64_t kMaxShortMean = 32;  // tokens per sequence (mean) left to the short walk and the split path
  if (s.dv != 128) return 0;
  const std::int64_t n = std::max<std::int64_t>(s.N, 1), walks = s.H * n, tokens_per_seq = s.T / n;
  if (s.T <= kMaxShortMean * n) return 0;
  if (2 * walks >= sms || tokens_per_seq <= kChunkTokens) return 128;
  return tokens_per_seq <= 16 * kChunkTokens || split_warps == 0 || fused64_pays(s, sms, split_warps) ? 64 : 0;
}

namespace {

// cp_split_cost's model of one stage-1 kernel (dvb columns, the decay shortcut or not, value and
// map pairs or not) on one shape, with what does not depend on the segment length computed once:
// cp_best_split evaluates up to 63 segment counts with three kernels each, every one of them
// redoing these (integer divisions among them) had cost 2-4 us per Plan::create on an H200's host.
// Equal lengths; a sequence no longer than a segment is walked whole (the device cuts each
// sequence by its own length). With the decay shortcut (cut) the map walks and the corrections
// are taken to stop after kCutChunks chunks (the gates are on the device: this is the model of
// decaying gates the option is meant for).
struct SplitModel {
  static constexpr std::int64_t kCutChunks = 2;
  std::int64_t n = 1, len = 0, chunks = 0, cv_seg = 0, cm_seg = 0;  // CTAs per segment: value, map (H n blocks)
  int sms = 1, dvb = 128;
  bool cut = false, pairs = false;
  double step = 0.0, row_bytes = 0.0;

  SplitModel() = default;
  SplitModel(const detail::Shape& s, int sms_, int dvb_, bool cut_, bool pairs_) : sms(sms_), dvb(dvb_), cut(cut_) {
    n = std::max<std::int64_t>(s.N, 1), len = s.T / n, chunks = chunks_of(len);
    row_bytes = static_cast<double>(s.H) * (2.0 * s.dk + 4.0 * s.dv);  // map_o, o read and written
    // In pairs the map CTA of a sequence's first segment walks too (beside its value CTA, whose
    // records it shares).
    pairs = pairs_ && dvb == 128 && !cut;
    cv_seg = s.H * n * (s.dv / dvb), cm_seg = s.H * n * (s.dk / dvb);
    // With the shortcut the rows are short and the fixed costs (the stop points, the scan over all
    // heads, launch gaps) weigh more: measured on the H200 (perf-notes), about 10% more per chunk
    // and 80 us more per call than the model of the exact split.
    const bool pairs64 = dvb == 64 && s.dk % 128 == 0 && s.dv % 128 == 0;
    step = pairs ? kStepFused128Pairs : (pairs64 ? kStepFused64SplitPairs : fused_step(dvb)) * (cut ? 1.1 : 1.0);
  }

  // nseg = ceil(chunks / seg_chunks) (at least 1).
  double cost(std::int64_t seg_chunks, std::int64_t nseg) const {
    const std::int64_t walk_chunks = std::min(seg_chunks, chunks);
    const std::int64_t cv = cv_seg * nseg, cm = cm_seg * (pairs ? nseg : nseg - 1);
    const double stage1 =
        cut ? step * static_cast<double>((walk_chunks + 1) * waves(cv, sms) + (kCutChunks + 1) * waves(cm, sms))
            : step * static_cast<double>((walk_chunks + 1) * waves(cv + cm, sms));
    // Rows the correction reads and writes: those after each sequence's first segment.
    const double fixed_rows = nseg < 2 ? 0.0
                              : cut    ? static_cast<double>(n * (nseg - 1) * kCutChunks * kChunkTokens)
                                       : static_cast<double>(n * (len - seg_chunks * kChunkTokens));
    return stage1 + (cut ? 0.5 : 1.0) * kScanStep * static_cast<double>(nseg - 1) +
           fixed_rows * row_bytes / kFixBytesPerUs + kCpFixed + (cut ? 80.0 : 0.0);
  }

  // A lower bound of cost() over every split into two or more segments: stage 1 is at least its
  // CTAs' chunk steps spread evenly over the SMs (the value walks cover every chunk, the map walks
  // at least half of them, none with the shortcut), plus one scan step and the fixed costs.
  double floor() const {
    const double map_share = cut ? 0.0 : pairs ? 1.0 : 0.5;
    const double steps = static_cast<double>(chunks) * (static_cast<double>(cv_seg) + map_share * static_cast<double>(cm_seg));
    return step * steps / static_cast<double>(sms) + (cut ? 0.5 : 1.0) * kScanStep + kCpFixed + (cut ? 80.0 : 0.0);
  }
};

// The stage-1 kernels a split can run: (dvb, pairs) (value and map pairs: one value and one map
// CTA per segment, dk = dv = 128; cp.cu).
template <class F>
void for_each_stage1(const detail::Shape& s, bool cut, F&& f) {
  for (int dvb : {128, 64})
    for (bool pairs : {true, false}) {
      if (s.dk % dvb != 0 || s.dv % dvb != 0 || (pairs && (dvb != 128 || cut || s.dk != 128 || s.dv != 128)))
        continue;
      f(dvb, pairs);
    }
}

}  // namespace

double cp_split_cost(const detail::Shape& s, int sms, std::int64_t seg_chunks, int dvb, bool cut, bool pairs) {
  const SplitModel m(s, sms, dvb, cut, pairs);
  return m.cost(seg_chunks, std::max<std::int64_t>(1, (m.chunks + seg_chunks - 1) / seg_chunks));
}

CpChoice cp_best_split(const detail::Shape& s, int sms, int lo, int hi, bool cut, double beat) {
  CpChoice best;
  SplitModel models[4];
  int count = 0;
  bool below = false;  // some kernel's floor under `beat` (with a margin for the floor's own rounding)
  for_each_stage1(s, cut, [&](int dvb, bool pairs) {
    models[count] = SplitModel(s, sms, dvb, cut, pairs);
    below |= models[count].floor() < beat * (1.0 + 1e-9);
    ++count;
  });
  if (!below) return best;
  const std::int64_t chunks = chunks_of(s.T / std::max<std::int64_t>(s.N, 1));
  for (std::int64_t want = lo; want <= std::min<std::int64_t>(hi, chunks); ++want) {
    const std::int64_t seg_chunks = (chunks + want - 1) / want, nseg = (chunks + seg_chunks - 1) / seg_chunks;
    if (nseg < 2 || (want > lo && nseg != want)) continue;  // a count that whole chunks cannot give
    for (int i = 0; i < count; ++i) {
      const double cost = models[i].cost(seg_chunks, nseg);
      if (best.nseg == 0 || cost < best.cost)
        best = {static_cast<int>(nseg), static_cast<int>(seg_chunks * kChunkTokens), models[i].dvb, cost, models[i].pairs};
    }
  }
  return best;
}

// GDNKIT_CP_LEAD_SHARE (a measurement switch): the first segment's share of the chunks in percent
// instead of the model's balance (0: the model's).
#ifndef GDNKIT_CP_LEAD_SHARE
#define GDNKIT_CP_LEAD_SHARE 0
#endif

double cp_lead_cost(const detail::Shape& s, std::int64_t seg_chunks) {
  const std::int64_t rest = chunks_of(s.T) - seg_chunks;
  const double stage1 = std::max(kStepLeadPairs * static_cast<double>(seg_chunks + 2),
                                 kStepFused128Pairs * static_cast<double>(rest + 1));
  const double row_bytes = static_cast<double>(s.H) * (2.0 * s.dk + 4.0 * s.dv);  // map_o, o read and written
  return stage1 + kScanStep + static_cast<double>(rest * kChunkTokens) * row_bytes / kFixBytesPerUs + kCpFixed;
}

CpChoice cp_best_lead(const detail::Shape& s, int sms) {
  CpChoice best;
  const std::int64_t chunks = chunks_of(s.T);
  if (s.N > 1 || s.dk != 128 || s.dv != 128 || 4 * s.H > sms || chunks < 2) return best;
  // The first segment at least as long as the second: its pairs step faster.
  std::int64_t lo = (chunks + 1) / 2, hi = chunks - 1;
  if (GDNKIT_CP_LEAD_SHARE > 0) lo = hi = std::clamp<std::int64_t>(chunks * GDNKIT_CP_LEAD_SHARE / 100, 1, chunks - 1);
  for (std::int64_t seg_chunks = lo; seg_chunks <= hi; ++seg_chunks) {
    const double cost = cp_lead_cost(s, seg_chunks);
    if (best.nseg == 0 || cost < best.cost)
      best = {2, static_cast<int>(seg_chunks * kChunkTokens), 128, cost, true, true};
  }
  return best;
}

CpChoice cp_choose(const detail::Shape& s, int sms, UnsplitKernel unsplit, int forced, std::int64_t max_seq_len,
                   bool packed, bool cut, bool prune) {
  // The model runs on equal lengths: the batch as ceil(T / Lmax) sequences of the longest length
  // Lmax (the hint, else the mean), whose walks set the time split or not.
  const std::int64_t n = std::max<std::int64_t>(s.N, 1);
  detail::Shape eq = s;
  const std::int64_t lmax = std::max<std::int64_t>(1, packed && max_seq_len > 0 ? max_seq_len : s.T / n);
  eq.N = std::max<std::int64_t>(1, (s.T + lmax - 1) / lmax);
  eq.T = eq.N * lmax;
  const std::int64_t chunks = chunks_of(lmax);
  if (forced >= 2) {
    const int kseg = static_cast<int>(std::min<std::int64_t>(forced, chunks));  // fewer where short
    return cp_best_split(eq, sms, kseg, kseg, cut);
  }
  // A split is taken only under kSplitPays of the unsplit kernel: cp_best_split skips the search
  // where no split can be (`prune`; off only to test that it changes nothing).
  const double unsplit_eq = cp_unsplit_cost(unsplit, eq, sms);
  const double inf = std::numeric_limits<double>::infinity();
  CpChoice best = cp_best_split(eq, sms, 2, 64, cut, prune ? kSplitPays * unsplit_eq : inf);
  if (!cut && kCpLeadPlanned) {
    const CpChoice lead = cp_best_lead(s, sms);
    if (lead.nseg == 2 && (best.nseg < 2 || lead.cost < best.cost)) best = lead;
  }
  if (best.nseg >= 2 && best.cost < kSplitPays * unsplit_eq) return best;
  if (packed && max_seq_len <= 0 && n > 1) {
    // Packed lengths unknown to the host: the mean may hide one long sequence, which alone sets
    // the unsplit time. Plan the segment length for the worst case, one sequence of T tokens, and
    // take it where it pays there (under 85%: a plan for lengths the host does not know) and, on
    // equal lengths, costs at most 5% more than the unsplit kernel by the model (its error). The
    // device cuts each sequence by its own length: sequences no longer than a segment are walked
    // whole.
    detail::Shape one = s;
    one.N = 1;
    const double unsplit_one = cp_unsplit_cost(unsplit, one, sms);
    const CpChoice worst = cp_best_split(one, sms, 2, 64, cut, prune ? 0.85 * unsplit_one : inf);
    // Equal lengths must be cut too: where they would all be walked whole, the split would only
    // add its launches to the unsplit walk (e.g. 8 x 4096 tokens on 32 heads).
    if (worst.nseg >= 2 && chunks > worst.seg_tokens / kChunkTokens && worst.cost < 0.85 * unsplit_one &&
        cp_split_cost(eq, sms, worst.seg_tokens / kChunkTokens, worst.dvb, cut, worst.pairs) <= 1.05 * unsplit_eq)
      return worst;
  }
  return {};
}

}  // namespace gdnkit::cuda
