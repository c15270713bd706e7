"""gdnkit: the Gated DeltaNet (GDN) prefill.

    o, final_state = gdnkit.chunk_gated_delta_rule(q, k, v, g, beta, ...)

computes, per sequence and output head, with state S (dk x dv, float32, zeros or initial_state):

    S_t = exp(g_t) (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T,    o_t = scale * S_t^T q_t

Tensors are any DLPack-capable arrays: NumPy arrays run on the CPU backend; CUDA tensors (torch,
CuPy, ...) run on the CUDA backend, on the framework's current stream. Outputs are allocated with
the framework of q, on q's device.
"""

import sys as _sys

from numpy import ndarray as _ndarray

from ._gdnkit import __version__, cuda_available
from ._gdnkit import _forward

__all__ = ["chunk_gated_delta_rule", "cuda_available", "__version__"]


def _current_stream(q):
    """The stream (as an integer cudaStream_t) that q's framework is using on q's device; 0 for
    host tensors and for frameworks whose current stream is not known here (the legacy default
    stream)."""
    is_cuda = getattr(q, "is_cuda", None)
    if is_cuda is not None:  # torch (it is imported: q is one of its tensors)
        if not is_cuda:
            return 0
        torch = _sys.modules["torch"]
        raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)  # what torch's own kernels use
        if raw is not None:
            return raw(q.get_device())
        return torch.cuda.current_stream(q.device).cuda_stream
    cupy = _sys.modules.get("cupy")
    if cupy is not None and isinstance(q, cupy.ndarray):
        with q.device:
            return cupy.cuda.get_current_stream().ptr
    return 0


def chunk_gated_delta_rule(
    q,
    k,
    v,
    g=None,
    beta=None,
    scale=None,
    initial_state=None,
    output_final_state=False,
    cu_seqlens=None,
    *,
    gate="log",
    state_layout="kv",
    validate=False,
    kernel=None,
    segments=None,
    max_seq_len=None,
    split_decay_cutoff=None,
):
    """The GDN prefill (chunked forward of the gated delta rule), like FLA's function of this name.

    Layouts: packed ``[T, H, D]`` tensors with ``cu_seqlens`` ``[N+1]`` (int32 or int64; sequence n
    is tokens ``cu_seqlens[n]:cu_seqlens[n+1]``, empty sequences allowed), or batched
    ``[B, T, H, D]`` tensors without it (B sequences of T tokens). A 4-D layout with ``cu_seqlens``
    needs B == 1 (FLA's varlen convention). A 3-D layout without ``cu_seqlens`` is one sequence.

    Args:
        q: ``[.., Hq, dk]`` float16 or bfloat16.
        k: ``[.., Hk, dk]``, q's dtype.
        v: ``[.., Hv, dv]``, q's dtype. Heads: MHA (Hq = Hk = Hv), GVA (Hq = Hk, Hv = r*Hq) or
            GQA (Hk = Hv, Hq = r*Hv); H = max(Hq, Hv) output heads.
        g: ``[.., H]`` float32 gates (log space, or alpha itself with ``gate="linear"``); None: no decay.
        beta: ``[.., H]`` float32, float16 or bfloat16; None: beta = 1.
        scale: output scale; None: dk ** -0.5.
        initial_state: ``[N, H, dk, dv]`` (``state_layout="kv"``) or ``[N, H, dv, dk]`` ("vk"),
            float32, C-contiguous; None: zeros.
        output_final_state: also return the state after each sequence's last token.
        cu_seqlens: ``[N+1]`` int32 or int64 sequence boundaries, on q's device.
        gate: ``"log"`` (g = log alpha, FLA) or ``"linear"`` (g = alpha, flashinfer).
        state_layout: ``"kv"`` (``[N, H, dk, dv]``, FLA) or ``"vk"`` (``[N, H, dv, dk]``).
        validate: check cu_seqlens and the gate values first (synchronises for CUDA tensors).
            Host cu_seqlens are always checked (cheap, and a bad one would read out of bounds).
        kernel: None lets the planner choose; a kernel name as the C++ ``Plan::kernel_name()``
            and the ``gdnkit`` CLI report it (e.g. ``"cuda-split-wgmma-bf16-k128-w8"``) requires
            that kernel: an unknown name raises ValueError, one the device cannot run
            RuntimeError. Never a silent fallback.
        segments: CUDA, context parallelism (C++ ``Options::segments``): None or 0 lets the planner
            split long sequences where it pays, 1 never splits, k >= 2 requires segments of about
            1/k of the mean length (RuntimeError where the split cannot run: host arrays, a GPU
            other than H100/H200, a mean length under two chunks).
        max_seq_len: optional hint, the longest sequence's length (C++ ``Problem::max_seq_len``):
            lets the CUDA planner split a batch whose longest sequence is far above the mean.
            Any value in [0, T] gives correct results; 0 or None: unknown (the planner then also
            weighs the worst case, one sequence of all T tokens).
        split_decay_cutoff: the decay shortcut of a split (C++ ``Options::split_decay_cutoff``),
            in [0, 1); None or 0: exact. c > 0 lets a segment drop its start state's influence
            once the gates summed from the segment's start fall below log(c): o moves by at most
            ``scale * |q_t| * c * |E[:, v]|`` (E the segment's start state) for gates <= 0 and
            beta |k|^2 <= 2. No effect where no sequence is split.

    CUDA tensors run on the current stream of q's framework (``torch.cuda.current_stream``, CuPy's
    current stream), on q's device; outputs and scratch come from that framework's allocator on
    that stream, so the call is asynchronous like any other kernel launch.

    Every tensor's last dim must be contiguous; token and head strides may be anything positive
    (views into a fused projection are fine).

    Returns:
        ``(o, final_state)``: o ``[.., H, dv]`` in q's dtype; final_state float32 in the state
        layout, or None without ``output_final_state``.

    Raises:
        ValueError: a shape, stride or value is wrong. TypeError: a dtype or argument type is
        wrong. RuntimeError: no backend can run the problem here (e.g. CUDA tensors in a build
        without the CUDA backend).
    """
    stream = 0 if type(q) is _ndarray else _current_stream(q)
    return _forward(q, k, v, g, beta, scale, initial_state, output_final_state, cu_seqlens,
                    gate, state_layout, validate, stream, kernel, segments, max_seq_len, split_decay_cutoff)
