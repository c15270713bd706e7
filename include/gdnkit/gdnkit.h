// gdnkit: the Gated DeltaNet prefill (chunked forward of the GDN recurrence).
//
// Usage:
//   gdnkit::Problem p;             // shapes, dtypes, strides, options (metadata only)
//   p.total_tokens = T; p.num_seqs = N; ...
//   gdnkit::Plan plan = gdnkit::Plan::create(p);            // checks metadata, picks a backend
//   void* ws = alloc(plan.workspace_bytes());               // caller-owned scratch
//   plan.run(tensors, ws, plan.workspace_bytes(), stream);  // CUDA: no allocation, no host sync
//                                   // (the CPU backend starts its worker threads in run())
//
// The math is in docs/math.md. Summary, per sequence and output head, state S (dk x dv, fp32):
//   S_t = exp(g_t) (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T,   o_t = scale * S_t^T q_t.
//
// Thread safety: a Plan's configuration is fixed at create(); run() and validate() are const and
// change nothing shared but, thread-safely, process-wide diagnostic counters and a split plan's
// cache of CUDA graphs, so one plan may run on many threads and streams at once. (A plan that
// splits sequences keeps the CUDA graphs of its launches, Options::split_graph: run() fills that
// cache under its own locks, and copies of the plan share it.) All scratch memory
// is the workspace the caller passes: two runs in flight at the same time must be given two
// workspaces (two plans running on two streams share nothing unless the caller makes them).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>

struct CUstream_st;  // the CUDA runtime's stream type; gdnkit::Stream is cudaStream_t

namespace gdnkit {

using Stream = CUstream_st*;

// Element types. q, k, v and o share one of f16/bf16; g is f32; beta is f32, f16 or bf16;
// states are f32; cu_seqlens is i32 or i64.
enum class DType : std::uint8_t { f16, bf16, f32, i32, i64 };

// Log space: g_t = log(alpha_t), decay exp(g_t) (FLA, vLLM model code).
// Linear space: the caller passes alpha_t itself (flashinfer, cuLA); gdnkit uses log(max(alpha, FLT_MIN)).
// Either way a log gate below log(FLT_MIN) = -87.34 (-inf included) acts as -87.34: a full decay at
// fp32 resolution, and the rows after such a reset keep the precision of their own gates.
enum class GateSpace : std::uint8_t { log, linear };

// kv: state[n][h][i_k][i_v] ([N, H, dk, dv], FLA).  vk: state[n][h][i_v][i_k] ([N, H, dv, dk], flashinfer).
enum class StateLayout : std::uint8_t { kv, vk };

// Where the tensors live.
enum class Memory : std::uint8_t { host, cuda };

// Which implementation runs. automatic: the fastest one that supports the problem on the memory given.
enum class Backend : std::uint8_t { automatic, cpu, cuda };

// Strides in elements. The innermost (feature) dimension is always contiguous. 0 means packed:
// head stride = head dim (1 for g/beta), token stride = heads * head stride.
struct Strides {
  std::int64_t token = 0;
  std::int64_t head = 0;
};

// Everything about a call except the data pointers. Plain metadata: cheap to copy and compare.
//
// Heads: let H = max(Hq, Hv) be the number of output heads (gates, beta, states and o have H heads).
//   MHA: Hq = Hk = Hv.
//   GVA: Hq = Hk, Hv = r*Hq (r >= 2); output head h reads q/k head h / r and v head h.
//   GQA: Hk = Hv, Hq = r*Hv (r >= 2); output head h reads q head h and k/v head h / r.
// Sequences: with has_cu_seqlens, sequence n is tokens [cu_seqlens[n], cu_seqlens[n+1]) (N+1 entries,
// starting at 0, non-decreasing, ending at T; empty sequences are allowed). Without, the T tokens are
// N equal sequences of T/N tokens (the batched [B, L, H, D] layout).
struct Problem {
  std::int64_t total_tokens = 0;  // T
  std::int64_t num_seqs = 1;      // N
  int num_q_heads = 0;            // Hq
  int num_k_heads = 0;            // Hk
  int num_v_heads = 0;            // Hv
  int head_dim_k = 128;           // dk, 16..256
  int head_dim_v = 128;           // dv, 16..256

  DType qkv_dtype = DType::bf16;         // q, k, v and o
  DType beta_dtype = DType::f32;         // f32, f16 or bf16
  DType cu_seqlens_dtype = DType::i32;   // i32 or i64
  bool has_cu_seqlens = true;

  Strides q, k, v, o, g, beta;  // per tensor, in its elements (Strides above; 0 = packed)

  std::optional<float> scale;  // default head_dim_k^-0.5

  bool has_gate = true;            // false: decay 1
  bool has_beta = true;            // false: beta 1
  bool has_initial_state = false;  // false: zeros
  bool want_final_state = false;
  GateSpace gate_space = GateSpace::log;
  StateLayout state_layout = StateLayout::kv;
  Memory memory = Memory::host;

  // Optional planning hint: the longest sequence's length (0: unknown; the planner then models
  // equal lengths T / N and, for a packed batch that this leaves unsplit, also the worst case of
  // one sequence of T tokens: it splits where that pays, T / N is longer than that split's
  // segments and equal lengths cost at most ~5% more by its model). Any value in [0, T] gives
  // correct results; it sets whether and how finely the CUDA planner splits sequences
  // (Options::segments), so the speed and the split's workspace depend on it: a hint far below
  // the real longest length makes many short segments. Without cu_seqlens every sequence is T / N
  // long and the hint is not used.
  std::int64_t max_seq_len = 0;
};

struct Options {
  Backend backend = Backend::automatic;  // a named backend that cannot run the problem: unsupported
  int cpu_threads = 0;  // CPU backend worker threads; 0 = the hardware threads this process may run on (its CPU affinity)
  // CUDA backend: run exactly this kernel (spelled as Plan::kernel_name() reports it, e.g.
  // "cuda-split-wgmma-bf16-k128-w4"); nullptr lets the planner choose. A name that does not exist
  // for the problem's dtype, dk and dv is invalid_value (a 128-column fused kernel at dv 64:
  // unsupported, naming its -v64 variant); one the device cannot run is unsupported.
  // Never a silent fallback. A split's name ("...-cpK") is not one: ask for it with `segments`.
  const char* kernel = nullptr;
  // CUDA backend, context parallelism (splitting each sequence into segments walked in parallel,
  // exact: docs/math.md "Splitting a sequence"). 0: the planner splits where its cost model says
  // it pays (sm_90a with the fused kernel, dv 128; with few walks: on an H200 one sequence or a
  // few of up to ~44 heads, 2K to 8K tokens and up depending on the heads). 1: never split. k >= 2: segments of whole chunks, about 1/k of the longest
  // sequence (Problem::max_seq_len, else the mean length T / N; shorter sequences get fewer;
  // lengths are read on the device, no host copy of cu_seqlens is needed); unsupported where the
  // device cannot run it or that length is under two chunks. Not combined with `kernel`.
  // In a build with GDNKIT_CP_LEAD=1 (off by default until timed on a GPU) the planner's own
  // choice (0) may also be lead mode ("...-cp2-lead": one sequence of up to SMs / 4 heads at
  // dk = dv = 128 in two segments, the first and longer one walked by the unsplit 64-column CTA
  // pairs beside the second's split walks, in one launch); k >= 2 never is.
  int segments = 0;
  // The decay shortcut of a split, in [0, 1): 0 (the default) is exact. c > 0 lets a segment skip
  // the rest of its start state's transfer map once the gates summed from the segment's start
  // fall below log(c): o and the final state may then differ from the exact result by up to c
  // times the start state's size (per row and value column: scale |q_t| c |E[:, v]| for o; with
  // gates <= 0 and beta |k|^2 <= 2, e.g. L2-normalised keys and beta in [0, 1]; docs/math.md). On
  // decaying gates this removes most of the split's extra work, and the planner then assumes it
  // does. No effect where no sequence is split (and on the CPU backend).
  float split_decay_cutoff = 0.0f;
  // A split call's three to five launches: true (the default) makes them as one CUDA graph that
  // the plan captures at its second call on a stream (the first call launches one by one; a plan
  // keeps its 64 most recently used graphs, one per stream and launch shape) and then reuses with each call's
  // arguments: about 5-7 us of host time on an H100 host against 9-12 us one by one; a call whose
  // tensors and workspace are those of the graph's last call sets no node (3.7-4.6 us on an H200
  // host against 6.3-7.5 us setting them). The cost:
  // the graph's first kernel cannot start early behind the kernel ahead of it on the stream, as a
  // programmatic launch does, about 1-4 us of device time per call back to back
  // (docs/perf-notes.md, "A split launched as one CUDA graph"). On a stream that is being
  // captured, and with false, the launches are made one by one. Building and launching the graph
  // leaves alone any stream another thread (or this one) is capturing, in any capture mode;
  // cudaStreamPerThread gets a graph per thread. No effect without a split.
  bool split_graph = true;
};

// Data pointers for one run. Shapes follow Problem:
//   q [T, Hq, dk], k [T, Hk, dk], v [T, Hv, dv], o [T, H, dv]   (with the strides of Problem)
//   g [T, H] f32, beta [T, H]                                     (with the strides of Problem)
//   cu_seqlens [N+1]
//   initial_state, final_state [N, H, dk, dv] (kv) or [N, H, dv, dk] (vk), f32, contiguous.
// final_state may be exactly the same pointer as initial_state (in-place update); no other output
// may overlap an input, and a partial overlap of the two states is not allowed either.
struct Tensors {
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  const float* g = nullptr;
  const void* beta = nullptr;
  const void* cu_seqlens = nullptr;
  const float* initial_state = nullptr;
  void* o = nullptr;
  float* final_state = nullptr;
};

// Every error gdnkit reports. what() starts with the argument's name; for invalid_value,
// invalid_type and unsupported it gives what was expected and what was found, e.g. "k: expected 16
// heads for GVA with Hq=16, got 32"; for cuda (where the argument is the failing call, e.g.
// "launch") the CUDA runtime's error name and message, or which driver step refused the call
// (the fused kernels' TMA descriptors).
class Error : public std::runtime_error {
 public:
  enum class Kind {
    invalid_value,  // a size, stride, flag or value is wrong (Python: ValueError)
    invalid_type,   // a dtype is wrong (Python: TypeError)
    unsupported,    // valid, but no backend here can run it (Python: RuntimeError)
    cuda,           // the CUDA runtime reported an error (Python: RuntimeError)
  };
  Error(Kind kind, std::string argument, const std::string& message)
      : std::runtime_error(message), kind_(kind), argument_(std::move(argument)) {}
  Kind kind() const noexcept { return kind_; }
  // The argument or step at fault, as what() begins: "q", "q.token stride", "cu_seqlens[3]",
  // "workspace", "GDNKIT_CPU_SIMD", "launch".
  const std::string& argument() const noexcept { return argument_; }

 private:
  Kind kind_;
  std::string argument_;
};

struct PlanImpl;  // backend-specific launch configuration (opaque)

class Plan {
 public:
  // Checks the metadata (throws Error), picks a backend and its launch configuration. For
  // Memory::cuda it reads the current device's properties once, here, never in run().
  static Plan create(const Problem& problem, const Options& options = {});

  const Problem& problem() const noexcept;  // as given to create()
  Backend backend() const noexcept;      // never automatic
  const char* kernel_name() const noexcept;  // e.g. "cpu-chunked-fp32"
  std::size_t workspace_bytes() const noexcept;  // the scratch run() needs (0: pass any pointer)
  int num_output_heads() const noexcept;  // H = max(Hq, Hv)
  float scale() const noexcept;           // the resolved scale

  // Computes o (and final_state when wanted). workspace must hold workspace_bytes() bytes in the
  // problem's memory space (device memory for Memory::cuda, 256-byte aligned there; any alignment
  // on the host). For Memory::cuda the
  // work is enqueued on stream and run() returns without synchronising; for Memory::host it runs on
  // the calling thread plus worker threads and returns when done (stream is ignored; on x86 the
  // calling thread's floating-point mode is set to flush subnormals during the call and restored
  // after).
  // Throws Error for null pointers the problem needs, a workspace that is too small, or outputs
  // that overlap an input, each other or the workspace (from the pointers and strides alone). The CUDA
  // backend also needs dk and dv of 64 or 128 and q, k, v, o strides that are multiples of 8
  // elements (create() checks both), q, k, v, o 16-byte aligned and the workspace 256-byte aligned
  // (run() checks them); states, gates, beta and cu_seqlens need their element type's alignment
  // (the CUDA backend's run() checks it too).
  void run(const Tensors& tensors, void* workspace, std::size_t workspace_bytes,
           Stream stream = nullptr) const;

  // Checks the values run() relies on: cu_seqlens starts at 0, never decreases and ends at T (the
  // CPU backend's run() checks this itself; the CUDA kernels read each sequence clamped into
  // [0, T], so an invalid cu_seqlens gives wrong results but no access outside the buffers);
  // gates are decays: <= 0 or -inf in log space, in [0, 1] in linear space (a growing gate can
  // overflow the chunk's cumulative decay, exp of the gates summed over up to 64 tokens, and give
  // NaN where the recurrence itself stays finite). For Memory::cuda this copies
  // them to the host and synchronises stream: call it when debugging, not on the hot path.
  void validate(const Tensors& tensors, Stream stream = nullptr) const;

  // Plans are values: copying one copies its configuration (and shares its graph cache, above). A moved-from Plan may only be
  // assigned to or destroyed.
  Plan(const Plan&);
  Plan& operator=(const Plan&);
  Plan(Plan&&) noexcept;
  Plan& operator=(Plan&&) noexcept;
  ~Plan();

 private:
  explicit Plan(PlanImpl* impl);
  PlanImpl* impl_;
};

// Names as the CLI and error messages spell them ("bf16", "cuda", "log", "kv"); "?" for a value
// outside the enum. dtype_size: bytes of one element (0 outside the enum).
const char* to_string(DType dtype) noexcept;
const char* to_string(Backend backend) noexcept;
const char* to_string(GateSpace gate_space) noexcept;
const char* to_string(StateLayout layout) noexcept;
std::size_t dtype_size(DType dtype) noexcept;

// True when a CUDA device is present and usable from this process (no exception if not).
bool cuda_available() noexcept;

}  // namespace gdnkit
