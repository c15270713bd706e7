"""gdnkit: the Gated DeltaNet (GDN) prefill.

    o, final_state = gdnkit.chunk_gated_delta_rule(q, k, v, g, beta, ...)

computes, per sequence and output head, with state S (dk x dv, float32, zeros or initial_state):

    S_t = exp(g_t) (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T,    o_t = scale * S_t^T q_t

q is a NumPy array, a torch tensor, a CuPy array or an array-API array (outputs are allocated with
q's framework, on q's device); the other tensors may be any DLPack-capable arrays on q's device.
Host arrays run on the CPU backend; CUDA tensors on the CUDA backend, on the framework's current
stream.
"""

import sys as _sys

import numpy as _np
from numpy import ndarray as _ndarray

from ._gdnkit import __version__, cuda_available
from ._gdnkit import _forward

__all__ = ["chunk_gated_delta_rule", "cuda_available", "__version__"]


def _current_stream(q):
    """The stream argument of the binding: None for torch tensors (the binding asks torch for its
    current stream on q's device itself, through DLPack's C exchange table where torch has one),
    else the stream (an integer cudaStream_t) that q's framework is using on q's device, 0 for
    host arrays and for frameworks whose current stream is not known here (the legacy default
    stream)."""
    if getattr(q, "is_cuda", None) is not None:  # torch (it is imported: q is one of its tensors)
        return None
    cupy = _sys.modules.get("cupy")
    if cupy is not None and isinstance(q, cupy.ndarray):
        with q.device:
            return cupy.cuda.get_current_stream().ptr
    return 0


def _namespace(x):
    """The array namespace of x: torch, NumPy (any version), or an array-API namespace (CuPy, ...)."""
    if getattr(x, "is_cuda", None) is not None:
        return _sys.modules["torch"]
    if isinstance(x, _ndarray):
        return _np
    if hasattr(x, "__array_namespace__"):
        return x.__array_namespace__()
    raise TypeError(f"expected a torch tensor, a NumPy array or an array-API array, got {type(x).__name__}")


def _l2norm(x, name):
    """FLA's l2norm of the last dim: x / sqrt(sum(x^2) + 1e-6) in float32, back in x's dtype."""
    xp = _namespace(x)
    if xp is _sys.modules.get("torch"):
        xf = x.float()
        return (xf * xf.square().sum(-1, keepdim=True).add_(1e-6).rsqrt_()).to(x.dtype)
    if x.ndim < 1:
        raise ValueError(f"{name}: expected a tensor with a last dim to normalise, got a 0-d array")
    xf = x.astype(xp.float32)
    return (xf / xp.sqrt(xp.sum(xf * xf, axis=-1, keepdims=True) + 1e-6)).astype(x.dtype)


def _sigmoid(x, times):
    """times * sigmoid(x), float32 (FLA's use_beta_sigmoid_in_kernel, allow_neg_eigval)."""
    xp = _namespace(x)
    if xp is _sys.modules.get("torch"):
        return x.float().sigmoid() * times
    xf = x.astype(xp.float32)
    return times / (1 + xp.exp(-xf))


def _gdn_gate(g, A_log, dt_bias):
    """FLA's use_gate_in_kernel: -exp(A_log) * softplus(g + dt_bias), float32."""
    xp = _namespace(g)
    if xp is _sys.modules.get("torch"):
        x = g.float() if dt_bias is None else g.float() + dt_bias.float()
        return -A_log.float().exp() * _sys.modules["torch"].nn.functional.softplus(x)
    x = g.astype(xp.float32)
    if dt_bias is not None:
        x = x + dt_bias.astype(xp.float32)
    return -xp.exp(A_log.astype(xp.float32)) * xp.logaddexp(x, xp.zeros_like(x))


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
    use_qk_l2norm_in_kernel=False,
    use_beta_sigmoid_in_kernel=False,
    allow_neg_eigval=False,
    state_v_first=False,
    cu_seqlens_cpu=None,
    chunk_indices=None,
    use_gate_in_kernel=False,
    A_log=None,
    dt_bias=None,
    head_first=False,
    cp_context=None,
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
            that kernel: a name that is not one of the backend's kernels raises ValueError (host
            arrays: the CPU backend's, CUDA tensors: the CUDA backend's), a CUDA kernel this GPU
            cannot run RuntimeError. Never a silent fallback.
        segments: CUDA, context parallelism (C++ ``Options::segments``): None or 0 lets the planner
            split long sequences where it pays, 1 never splits, k >= 2 requires segments of about
            1/k of the mean length (RuntimeError where the split cannot run: host arrays, a GPU
            other than H100/H200, a mean length under two chunks).
        use_qk_l2norm_in_kernel, use_beta_sigmoid_in_kernel, allow_neg_eigval, state_v_first,
        cu_seqlens_cpu, chunk_indices, use_gate_in_kernel, A_log, dt_bias: FLA's keywords (keyword
            only here), same meaning and the same refusals (allow_neg_eigval without
            use_beta_sigmoid_in_kernel; also the sigmoid without beta, the gate with
            ``gate="linear"``). The first two and the gate are applied with q's framework before
            the kernel (FLA's formulas in float32: q / sqrt(sum(q^2) + 1e-6) in q's dtype;
            beta = sigmoid(beta), times 2 with allow_neg_eigval; g = -exp(A_log) *
            softplus(g + dt_bias)), not fused into it yet: each costs a pass over its tensors. ``state_v_first=True`` is
            ``state_layout="vk"``. ``cu_seqlens_cpu`` (a host copy of cu_seqlens) gives the planner
            the longest length (``max_seq_len``). ``chunk_indices`` is accepted and not needed.
            ``head_first=True`` and ``cp_context`` are refused (ValueError).
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
    (views into a fused projection are fine). A 4-D ``[B, T, ...]`` tensor must also flatten to
    ``B*T`` tokens: its batch stride must be T times its token stride (``x[:, :t]`` of a longer
    batch is not; make such a slice contiguous).

    Returns:
        ``(o, final_state)``: o ``[.., H, dv]`` in q's dtype; final_state float32 in the state
        layout, or None without ``output_final_state``.

    Raises:
        ValueError: a shape, stride or value is wrong. TypeError: a dtype or argument type is
        wrong. RuntimeError: no backend can run the problem here (e.g. CUDA tensors in a build
        without the CUDA backend).
    """
    if head_first:
        raise ValueError("head_first: expected False (tensors [B, T, H, D] or [T, H, D]), got True")
    if cp_context is not None:
        raise ValueError("cp_context: expected None (gdnkit splits sequences within one GPU by itself: "
                         "segments), got a context")
    if allow_neg_eigval and not use_beta_sigmoid_in_kernel:  # as FLA
        raise ValueError("allow_neg_eigval: expected use_beta_sigmoid_in_kernel=True with it (it scales the "
                         "sigmoid to (0, 2)), got use_beta_sigmoid_in_kernel=False")
    if use_qk_l2norm_in_kernel:
        q, k = _l2norm(q, "q"), _l2norm(k, "k")
    if use_beta_sigmoid_in_kernel:
        if beta is None:
            raise ValueError("beta: expected a tensor with use_beta_sigmoid_in_kernel=True, got None")
        beta = _sigmoid(beta, 2.0 if allow_neg_eigval else 1.0)
    if use_gate_in_kernel:
        if g is None or A_log is None:
            raise ValueError("A_log: expected a tensor [H] with use_gate_in_kernel=True (and g), got None")
        if gate != "log":
            raise ValueError(f"gate: expected 'log' with use_gate_in_kernel=True (it forms log-space gates), "
                             f"got {gate!r}")
        g = _gdn_gate(g, A_log, dt_bias)
    if state_v_first and state_layout == "kv":
        state_layout = "vk"
    if cu_seqlens_cpu is not None and max_seq_len is None:
        lens = _np.diff(_np.asarray(cu_seqlens_cpu))
        if lens.size:
            max_seq_len = int(lens.max())
    stream = 0 if type(q) is _ndarray else _current_stream(q)
    return _forward(q, k, v, g, beta, scale, initial_state, output_final_state, cu_seqlens,
                    gate, state_layout, validate, stream, kernel, segments, max_seq_len, split_decay_cutoff)
