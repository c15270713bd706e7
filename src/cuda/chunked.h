// The CUDA path's kernel parameters, workspace record layout and the table of compiled
// instantiations. Shared by the kernels (prep_kernel.cuh, walk_kernel.cuh, instantiated in
// split_*.cu) and backend.cu (planning and dispatch).
#pragma once

#include <cuda_runtime.h>

#include <climits>
#include <cstddef>
#include <cstdint>

#include "common/shape.h"
#include "gdnkit/gdnkit.h"

namespace gdnkit::cuda {

constexpr int kChunk = 64;     // tokens per chunk (C)
constexpr int kPrepThreads = 128;  // threads per prep CTA (4 warps); a walk CTA has 32 x warps
// Batches of up to this many sequences are walked longest first (ChunkedParams::longest_first);
// the walk ranks them in shared memory (kWalkOrderBytes after the policy's stages).
constexpr int kLongestFirstMaxSeqs = 64;
// The fused kernel keeps token positions and list indices in 32 bits (TMA coordinates are): a
// chunk's end (position + kChunk) and the next list index (index + gridDim.z <= 65535) must not
// wrap. Larger problems run on the split path.
constexpr std::int64_t kFusedMaxTokens = std::int64_t{INT32_MAX} - kChunk;
constexpr std::int64_t kFusedMaxSeqs = std::int64_t{INT32_MAX} - 65535;
inline bool fused_sizes_ok(std::int64_t tokens, std::int64_t seqs_or_walks) {
  return tokens <= kFusedMaxTokens && seqs_or_walks <= kFusedMaxSeqs;
}
constexpr std::size_t kWalkOrderBytes = 2 * 4 * kLongestFirstMaxSeqs;

// One walk of the fused kernel's optional walk list (ChunkedParams::walks): tokens [begin, end) of
// sequence seq, begin at a chunk border of the sequence (its start + a multiple of 64). Splitting a
// sequence into walks at chunk borders gives the same output as walking it whole, given the state
// at each border.
//   state_in   >= 0: start from walk_states[state_in]; -1: the sequence's initial state (zero
//              without one); -2: zero.
//   last       the walk writes the sequence's final state (want_final_state).
//   state_out  >= 0: the walk also writes its end state to walk_out[state_out].
//   map        context parallelism (cp.cuh): >= 0: the map CTAs (blockIdx.x >= value_blocks) walk
//              the identity through these tokens with V = 0 and write the transfer map M to
//              map_out[map] (and, with out, their "o" rows to map_o); -1: they skip the walk.
//   out        the walk writes its rows of o.
struct WalkSpan {
  std::int32_t seq = 0, begin = 0, end = 0, state_in = -1, last = 1, state_out = -1, map = -1, out = 1;
};
constexpr std::int32_t kStateZero = -2;  // WalkSpan::state_in: start from zero
// The fused kernel's walk-list entries per CTA: at most this many, copied or computed
// (ChunkedParams::cp_seg) into shared memory where the walk order would be (kWalkOrderBytes). A
// launch of a walk-list variant needs num_walks <= kCtaWalks x grid.z.
constexpr int kCtaWalks = static_cast<int>(kWalkOrderBytes / sizeof(WalkSpan));

// map_o's layout (ChunkedParams::map_o): the 16 rows of a chunk's 16-row block b (tokens t0 ..
// t0 + 15, t0 = chunk start + 16 b) of head h form one piece of 16 x dk elements at row t0, in
// which k-step kk (keys 16 kk .. + 15) of lane L is the 16-byte A fragment of an m64nNk16 wgmma
// (tokens t0 + L / 4 and + 8, keys 16 kk + 2 (L % 4), + 1 and + 8, + 9): one 16-byte store per
// lane in stage 1, one 16-byte load straight into the fragment in the correction. A sequence's
// last block reaches up to 15 rows past its end (stored as zeros there): into the next sequence's
// first segment, which has no map walk and so no map_o rows, or past T (map_o has T + 16 rows).
__host__ __device__ constexpr std::int64_t map_o_piece(std::int64_t row0, int h, int kk, int lane, int heads, int dk) {
  return (row0 * heads + 16 * h) * dk + 256 * kk + 8 * lane;
}

// A transfer map's layout (ChunkedParams::map_out, dk x dk fp32 per map and head), in the order
// the scan reads it as the A operand of m16n8k8 (tf32): for warp w (rows 16 w .. + 15) and k-step
// ks (columns 8 ks .. + 7), lane L's four words a0 .. a3 = M[16 w + L / 4 (+ 8)][8 ks + L % 4 (+ 4)]
// are 16 contiguous bytes, and a warp's k-step 512.
template <int DK>
__host__ __device__ constexpr int map_m_index(int i, int c) {
  const int w = i / 16, g = i % 8, hh = (i / 8) % 2, ks = c / 8, t = c % 4, half = (c / 4) % 2;
  return ((w * (DK / 8) + ks) * 32 + 4 * g + t) * 4 + hh + 2 * half;
}
template <int DK>
constexpr bool map_m_index_permutes() {  // every element of M at its own place in [0, DK^2)
  bool seen[DK * DK] = {};
  for (int i = 0; i < DK; ++i)
    for (int c = 0; c < DK; ++c) {
      const int x = map_m_index<DK>(i, c);
      if (x < 0 || x >= DK * DK || seen[x]) return false;
      seen[x] = true;
    }
  return true;
}
static_assert(map_m_index_permutes<64>() && map_m_index_permutes<128>());
// A state tile lane's element (j, e) (M[8 j + 2t + e % 2][col + 8 (e / 2)], col = the lane's column,
// a multiple of 16 plus g) relative to its element (0, 0): the same for every lane.
template <int DK>
__host__ __device__ constexpr int map_m_tile_offset(int j, int e) {
  return (j / 2 * (DK / 8) + e / 2) * 128 + 16 * (e % 2) + j % 2;
}
template <int DK>
constexpr bool map_m_tile_offsets_hold() {
  for (int col = 0; col < DK; ++col)
    for (int t = 0; t < 4; ++t)
      for (int j = 0; j < DK / 8; ++j)
        for (int e = 0; e < 4; ++e)
          if ((col + 8 * (e / 2)) < DK &&
              map_m_index<DK>(8 * j + 2 * t + e % 2, col + 8 * (e / 2)) - map_m_index<DK>(2 * t, col) !=
                  map_m_tile_offset<DK>(j, e))
            return false;
  return true;
}
static_assert(map_m_tile_offsets_hold<64>() && map_m_tile_offsets_hold<128>());

// Everything the kernel reads, resolved on the host. Strides are in elements. Pointers are the
// caller's; the kernel never writes through an input pointer.
struct ChunkedParams {
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  const float* g = nullptr;
  const void* beta = nullptr;
  const void* cu_seqlens = nullptr;
  const float* initial_state = nullptr;  // may equal final_state
  void* o = nullptr;
  float* final_state = nullptr;

  std::int64_t q_token = 0, q_head = 0;
  std::int64_t k_token = 0, k_head = 0;
  std::int64_t v_token = 0, v_head = 0;
  std::int64_t o_token = 0, o_head = 0;
  std::int64_t g_token = 0, g_head = 0;
  std::int64_t beta_token = 0, beta_head = 0;

  std::int64_t num_seqs = 0;     // N
  std::int64_t uniform_len = 0;  // sequence length when !has_cu_seqlens
  std::int64_t tokens = 0;       // T, all sequences packed
  int q_heads = 0, k_heads = 0, v_heads = 0;  // input heads (the fused kernel's tensor maps)
  int num_heads = 0;             // H (output heads)
  int q_group = 1, k_group = 1, v_group = 1;  // input head = output head / group
  int dv = 0;                    // full value head dim (state row length in kv layout)
  float scale = 0.0f;

  // Runtime options (uniform branches, cheap).
  bool has_cu_seqlens = true;
  bool cu_seqlens_i64 = false;
  bool has_gate = true;
  bool gate_linear = false;  // g holds alpha; use log(max(alpha, FLT_MIN))
  bool has_beta = true;
  int beta_dtype = 0;        // 0 f32, 1 bf16, 2 f16
  bool has_initial_state = false;
  bool want_final_state = false;
  bool state_vk = false;     // state layout [dv, dk] instead of [dk, dv]
  // Walk CTAs take sequences in order of decreasing length (the hardware starts CTAs in blockIdx
  // order, so long walks start first and short ones fill in: the longest-first list schedule).
  // Only with cu_seqlens and num_seqs <= kLongestFirstMaxSeqs.
  bool longest_first = false;
  // With longest_first, in the fused kernel only: the ranked sequences are dealt to the gridDim.z
  // CTAs of each (value block, head) by a greedy longest-processing-time assignment (cost: chunks)
  // and each CTA walks its share, longest first, as one pipeline. Needs gridDim.z <= 64.
  bool lpt = false;

  // The fused kernel's walk list (null: one walk per sequence): num_walks entries in device memory,
  // walked instead of the sequences (longest_first must be false), and the start states they name,
  // [index, H, dk, dv] in the problem's state layout (state_vk).
  const WalkSpan* walks = nullptr;
  std::int64_t num_walks = 0;
  // A split whose lists are computed where they are read (cp.cuh, cp_walk_entry) instead of built
  // in memory: walks == nullptr with cp_seg > 0 (tokens per segment); sequence n owns list-1 entries
  // [n cp_per_seq, (n + 1) cp_per_seq) and the E and M slots from n cp_per_seq.
  int cp_seg = 0, cp_per_seq = 0;
  const float* walk_states = nullptr;
  // With a walk list, end states named by WalkSpan::state_out ([index, H, dk, dv], state layout),
  // and the transfer maps of WalkSpan::map ([index, H] of dk x dk each, in the scan's A-fragment
  // order: M[i][c] at map_m_index).
  // map_out set: CTAs with blockIdx.x >= value_blocks are map CTAs, covering dk / DVB column
  // blocks of M (grid.x = value_blocks + dk / DVB).
  float* walk_out = nullptr;
  float* map_out = nullptr;
  int value_blocks = 0;
  // Stage 1 at 128 columns (value_blocks 1, one map CTA): each segment's value and map CTA run as
  // a cluster of two that share their records, the map CTA of a sequence's first segment walking it
  // along without storing anything (fused_cluster_x, value_map_pair in fused_sm90_scheduler.cuh). Exact
  // splits only (map_end null).
  bool cp_pairs = false;
  // The map CTAs' output rows, of the input type (null: they store none): row t of head h is the
  // linear map from the walk's start state to o_t (o_t += map_o[t, h, :] . E), stored in the
  // correction's A-fragment order (map_o_piece), (T + 16) x H x dk elements.
  void* map_o = nullptr;
  std::int64_t map_o_token = 0;  // H dk
  // The decay shortcut (cp.cuh, cp_stop_cta; null: exact): for map slot m and head h,
  // map_end[2 (m H + h)] is the token where the map walk stops and [.. + 1] is 1 where the
  // segment's start state is taken to have decayed away there (its M is then taken as zero).
  const int* map_end = nullptr;

  // The per-chunk records (kRecBytes each, index slot * num_heads + h).
  unsigned char* ws = nullptr;

  // A packed split's stage 1 that places the lists' entries itself instead of the list builder
  // (cp.cu; the walk-list kernels' packed instantiation, chunk_io.cuh cp_warp_packed_stage1): set
  // (cp_seq_slots non-null) only in its parameters, with walks null and num_walks = list 1's
  // length. Its CTAs of head 0's first column block also write list 3 (cp_cap3 entries) and its
  // first CTA the per-sequence table, which the scan and the correction then read as the
  // builder's. Segments of cp_packed_seg tokens, cp_slots E and M slots. (At the end, where
  // FusedParams has room before its descriptors: the other kernels' code is unchanged.)
  WalkSpan* cp_list3 = nullptr;
  int* cp_seq_slots = nullptr;
  int cp_packed_seg = 0, cp_cap3 = 0, cp_slots = 0;
};

constexpr int kBetaF32 = 0, kBetaBF16 = 1, kBetaF16 = 2;

// The kernels' parameters for one call, from the resolved problem (ws is left for the caller).
inline ChunkedParams chunked_params(const Problem& problem, const detail::Shape& s, const Tensors& t) {
  ChunkedParams p;
  p.q = t.q;
  p.k = t.k;
  p.v = t.v;
  p.g = t.g;
  p.beta = t.beta;
  p.cu_seqlens = t.cu_seqlens;
  p.initial_state = t.initial_state;
  p.o = t.o;
  p.final_state = t.final_state;
  p.q_token = s.q.token;
  p.q_head = s.q.head;
  p.k_token = s.k.token;
  p.k_head = s.k.head;
  p.v_token = s.v.token;
  p.v_head = s.v.head;
  p.o_token = s.o.token;
  p.o_head = s.o.head;
  p.g_token = s.g.token;
  p.g_head = s.g.head;
  p.beta_token = s.beta.token;
  p.beta_head = s.beta.head;
  p.num_seqs = s.N;
  p.uniform_len = s.uniform_len;
  p.tokens = s.T;
  p.q_heads = s.Hq;
  p.k_heads = s.Hk;
  p.v_heads = s.Hv;
  p.num_heads = s.H;
  p.q_group = s.q_group;
  p.k_group = s.k_group;
  p.v_group = s.v_group;
  p.dv = s.dv;
  p.scale = s.scale;
  p.has_cu_seqlens = problem.has_cu_seqlens;
  p.cu_seqlens_i64 = problem.cu_seqlens_dtype == DType::i64;
  p.has_gate = problem.has_gate;
  p.gate_linear = problem.gate_space == GateSpace::linear;
  p.has_beta = problem.has_beta;
  p.beta_dtype = problem.beta_dtype == DType::bf16 ? kBetaBF16 : problem.beta_dtype == DType::f16 ? kBetaF16 : kBetaF32;
  p.has_initial_state = problem.has_initial_state;
  p.want_final_state = problem.want_final_state;
  p.state_vk = problem.state_layout == StateLayout::vk;
  return p;
}


// ---- split path: a parallel per-chunk "prep" kernel, then the state walk ------------------------
//
// Prep, grid (slots, H): for chunk j of sequence n (slot floor(bos_n / 64) + n + j, unique per
// chunk, slots < ceil(T / 64) + N) and output head h, writes one workspace record:
//   Mt = exp(G_i - G_j) Tu_ij beta_j (i >= j)            64 x 64, as hi + lo (two qkv-dtype matrices,
//                                                        hi = round(Mt), lo = round(Mt - hi))
//   P  = scale * lower_incl(Q K^T) .* exp(G_i - G_j)      64 x 64, qkv dtype
//   gam = exp(G), dec = exp(G_last - G)                  64 + 64 fp32, G = cumsum(g) within the
//                                                        chunk (padded rows repeat G_last)
// Mt and P are lower block triangular (16 x 16 blocks); only the blocks on or below the diagonal
// are stored, block row by block row ("lower-block layout"): block row b holds rows [16 b, 16 b + 16)
// and columns [0, 16 b + 16), with a row pitch of 16 b + 24 elements (8 unused padding elements
// per row, so that the rows of a 16 x 16 tile fall into different shared-memory banks), starting
// at element 128 b (b + 2). The walk copies the prefix holding its chunk's block rows verbatim
// into shared memory. Block rows at or past the chunk's last 16-row block are not written (the
// walk never reads them).
// Walk, grid (dv / (16 warps), H, z <= min(N, 65535)): the state-dependent products only, each
// warp owning 16 value columns; blockIdx.z strides over sequences.
constexpr int kChunkBlocks = kChunk / 16;
__host__ __device__ constexpr int lower_block_off(int b) { return 128 * b * (b + 2); }  // elements
__host__ __device__ constexpr int lower_block_ld(int b) { return 16 * b + 24; }         // elements
constexpr std::size_t kLowerBytes = std::size_t(lower_block_off(kChunkBlocks)) * 2;     // 6144
constexpr std::size_t kRecMtOff = 0;
constexpr std::size_t kRecMtLoOff = kRecMtOff + kLowerBytes;
constexpr std::size_t kRecPOff = kRecMtLoOff + kLowerBytes;
constexpr std::size_t kRecGamOff = kRecPOff + kLowerBytes;
constexpr std::size_t kRecDecOff = kRecGamOff + std::size_t(kChunk) * 4;  // dec right after gam (walks rely on it)
constexpr std::size_t kRecBytes = kRecDecOff + std::size_t(kChunk) * 4;  // 18944, a multiple of 128
static_assert(kRecBytes % 128 == 0 && kLowerBytes % 128 == 0, "records and their parts stay 128-byte aligned");

struct SplitKernel {
  const char* name;          // static, e.g. "cuda-split-mma-bf16-k128-w4"
  DType dtype;
  int dk;
  int warps;                 // warps per walk CTA; each owns 16 value columns
  bool sm90a;                // wgmma walk: runs only on compute capability 9.0 with an sm_90a image
  std::size_t prep_smem;     // dynamic shared memory per prep CTA
  std::size_t walk_smem;     // dynamic shared memory per walk CTA
  const void* prep_func;
  const void* walk_func;
  // Launches prep (skipped when prep_grid.x == 0) then walk on `stream`.
  cudaError_t (*launch)(const ChunkedParams& params, dim3 prep_grid, dim3 walk_grid, cudaStream_t stream);
  int threads;               // per walk CTA
  // The fused kernel (fused_sm90.cuh): no prep kernel and no workspace; walk_func is the whole
  // call, `warps` counts its state warps (16 value columns each) and `threads` adds its aux warps.
  bool fused;
  // A fused kernel's instantiation for CTAs launched as clusters of two, where it has one (the
  // 64-column kernel: FusedSm90::kAuxP), with the same threads and walk_smem; else nullptr.
  const void* paired_func = nullptr;
  // The short walk (short_walk.cuh): 16-token chunks in one kernel, no prep kernel, no workspace,
  // static shared memory; `warps` as for the split walk (16 value columns each).
  bool short_chunks = false;
  // A fused kernel that solves each chunk's Vn by block substitution (FusedSm90::kBlockSolve)
  // rather than with the whole inverse: kernels that differ in it agree within rounding, not bit
  // for bit.
  bool block_solve = false;
  // A walk-list kernel's instantiation for a packed split's stage 1 that places its own entries
  // (ChunkedParams::cp_seq_slots set), with the same threads and walk_smem; else nullptr.
  const void* packed_func = nullptr;
  // block_solve of paired_func's instantiation (the kernel a launch in clusters of two runs).
  bool paired_block_solve = false;
  // A 128-column walk-list kernel's lead-mode stage 1 (fused_sm90.cuh, gdn_fused_lead_kernel: the
  // unsplit 64-column pairs beside it in one launch), where dk = 128; else nullptr. lead_smem: its
  // dynamic shared memory, the larger of the two kernels'.
  const void* lead_func = nullptr;
  std::size_t lead_smem = 0;
};

// The split instantiation of (dtype, dk, warps, sm90a); nullptr when none matches.
const SplitKernel* find_split_kernel(DType dtype, int dk, int warps, bool sm90a = false);
// The fused instantiation of (dtype, dk, value columns per CTA: 64 or 128), or its walk-list
// variant (launched with ChunkedParams::walks or cp_seg set, else it returns cudaErrorInvalidValue);
// nullptr when none was built (no CUTLASS headers). Before a launch, the kernel must be opted into
// its dynamic shared memory on the device (walk_smem; backend.cu's prepare_kernel, once per
// device, for the planner's kernels).
const SplitKernel* find_fused_kernel(DType dtype, int dk, int dvb, bool walks = false);

// The fused kernels' four TMA descriptors (K, Q, V and O) of one call, opaque: encoded by
// encode_fused_maps (about a microsecond each) or rebased from the plan's (rebase_fused_maps) for
// launch_fused_encoded.
struct alignas(128) FusedMaps {
  unsigned char bytes[4 * 128];
};
// False when the driver rejects a layout or no fused kernel was built.
bool encode_fused_maps(const ChunkedParams& p, DType dtype, int dk, FusedMaps* maps);
// Points maps, encoded for a problem of p's shapes and strides (any addresses), at p's k, q, v and o
// (cuTensorMapReplaceAddress: a fraction of an encoding's cost). False when the driver refuses.
bool rebase_fused_maps(FusedMaps* maps, const ChunkedParams& p);
// Launches k (a fused kernel of the maps' dtype and dk) over p with the encoded maps, as a
// programmatic dependent launch: the kernel may start while the one before it on the stream
// runs, and waits for it before it reads or writes anything in global memory (fused_cta).
cudaError_t launch_fused_encoded(const SplitKernel& k, const ChunkedParams& p, const FusedMaps& maps, dim3 grid,
                                 cudaStream_t stream);
// The same launch appended to list (launch_list.h) rather than made.
class LaunchList;
cudaError_t add_fused_launch(const SplitKernel& k, const ChunkedParams& p, const FusedMaps& maps, dim3 grid,
                             LaunchList* list);
// A lead-mode stage 1 (k.lead_func, grid (2, H, 2)) appended to list: the first segment's pairs
// over `lead` (cp_lead_params), the second segment's value and map pair over `rest` (stage 1's
// parameters, a computed list of one sequence in two segments).
cudaError_t add_fused_lead_launch(const SplitKernel& k, const ChunkedParams& lead, const ChunkedParams& rest,
                                  const FusedMaps& maps, LaunchList* list);

// The instantiations of one qkv dtype (split_bf16.cu, split_f16.cu).
struct SplitKernelList {
  const SplitKernel* begin;
  int count;
};
SplitKernelList split_kernels_bf16();
SplitKernelList split_kernels_f16();
SplitKernelList fused_kernels();  // fused_sm90.cu: every dtype and dk (empty without CUTLASS)
SplitKernelList fused_walks_kernels();  // their walk-list variants (not the planner's)

}  // namespace gdnkit::cuda
