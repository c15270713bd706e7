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


def _namespace(x, name):
    """The array namespace of x (the argument `name`): torch, NumPy (any version), or an array-API
    namespace (CuPy, ...)."""
    if getattr(x, "is_cuda", None) is not None:
        return _sys.modules["torch"]
    if isinstance(x, _ndarray):
        return _np
    if hasattr(x, "__array_namespace__"):
        return x.__array_namespace__()
    raise TypeError(f"{name}: expected a torch tensor, a NumPy array or an array-API array, got {type(x).__name__}")


def _astype(xp, x, dtype):
    """x in dtype: the array API's function (NumPy 1.x has only the method)."""
    return x.astype(dtype) if xp is _np else xp.astype(x, dtype)


def _l2norm(x, name):
    """FLA's l2norm of the last dim: x / sqrt(sum(x^2) + 1e-6) in float32, back in x's dtype."""
    xp = _namespace(x, name)
    if xp is _sys.modules.get("torch"):
        xf = x.float()
        return (xf * xf.square().sum(-1, keepdim=True).add_(1e-6).rsqrt_()).to(x.dtype)
    if x.ndim < 1:
        raise ValueError(f"{name}: expected a tensor with a last dim to normalise, got a 0-d array")
    xf = _astype(xp, x, xp.float32)
    return _astype(xp, xf / xp.sqrt(xp.sum(xf * xf, axis=-1, keepdims=True) + 1e-6), x.dtype)


def _sigmoid(x, times):
    """times * sigmoid(x), float32 (FLA's use_beta_sigmoid_in_kernel, allow_neg_eigval)."""
    xp = _namespace(x, "beta")
    if xp is _sys.modules.get("torch"):
        return x.float().sigmoid() * times
    xf = _astype(xp, x, xp.float32)
    return times / (1 + xp.exp(-xf))


def _gdn_gate(g, A_log, dt_bias):
    """FLA's use_gate_in_kernel: -exp(A_log) * softplus(g + dt_bias), float32."""
    xp = _namespace(g, "g")
    for name, x in (("A_log", A_log), ("dt_bias", dt_bias)):
        if x is not None and _namespace(x, name) is not xp:
            raise TypeError(f"{name}: expected an array of g's kind ({type(g).__name__}), got {type(x).__name__}")
    if xp is _sys.modules.get("torch"):
        x = g.float() if dt_bias is None else g.float() + dt_bias.float()
        return -A_log.float().exp() * _sys.modules["torch"].nn.functional.softplus(x)
    x = _astype(xp, g, xp.float32)
    if dt_bias is not None:
        x = x + _astype(xp, dt_bias, xp.float32)
    return -xp.exp(_astype(xp, A_log, xp.float32)) * xp.logaddexp(x, xp.zeros_like(x))


def _as_float32(x, name):
    """x as float32 where it holds another floating dtype (FLA takes bfloat16 gates and states),
    else x itself (other dtypes reach the binding, which names them)."""
    dt = x.dtype
    for f in _FLOAT32:
        if dt is f:
            return x
    if getattr(x, "is_cuda", None) is not None:  # torch
        f32 = _sys.modules["torch"].float32
        if f32 not in _FLOAT32:
            _FLOAT32.append(f32)
        return x if not x.dtype.is_floating_point or x.dtype == f32 else x.float()
    if isinstance(x, _ndarray):  # float16/64, and ml_dtypes' bfloat16 (a kind "V" dtype)
        floating = x.dtype.kind == "f" or x.dtype.name == "bfloat16"
        return x.astype(_np.float32) if floating and x.dtype != _np.float32 else x
    xp = _namespace(x, name)
    if xp.isdtype(x.dtype, "real floating") and x.dtype != xp.float32:
        return xp.astype(x, xp.float32)
    return x


_LAYOUT_WORDS = ("stride", "contiguous", "aligned")
_FLOAT32 = [_np.dtype(_np.float32)]  # float32 dtype objects, compared by identity (torch's joins on first use)


def _dense(x):
    """x, or a dense copy where its layout is one the kernels cannot read (strides, alignment)."""
    if getattr(x, "is_cuda", None) is not None:  # torch
        if not x.is_contiguous():
            return x.contiguous()
        return x if x.data_ptr() % 16 == 0 else x.clone()
    if isinstance(x, _ndarray):
        return x if x.flags.c_contiguous and x.ctypes.data % 16 == 0 else _np.array(x, order="C")
    cupy = _sys.modules.get("cupy")
    if cupy is not None and isinstance(x, cupy.ndarray):
        return x if x.flags.c_contiguous and x.data.ptr % 16 == 0 else cupy.array(x, order="C")
    return x  # other array-API arrays: no portable way to ask for a copy in a given layout


_forward_only = None


def _forward_only_fn():
    """A torch autograd function around the call: its outputs join the caller's graph, and a
    backward through them raises (gdnkit computes the forward pass only) rather than leaving the
    inputs without their share of the gradient."""
    global _forward_only
    if _forward_only is None:
        torch = _sys.modules["torch"]

        class ForwardOnly(torch.autograd.Function):
            @staticmethod
            def forward(ctx, run, *inputs):
                return run()

            @staticmethod
            def backward(ctx, *grads):
                raise RuntimeError(
                    "gdnkit.chunk_gated_delta_rule: expected no backward pass (gdnkit computes the forward "
                    "pass only), got a backward through its output; train with FLA's chunk_gated_delta_rule, "
                    "or call gdnkit under torch.no_grad() / on detached inputs")

        _forward_only = ForwardOnly
    return _forward_only


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
    chunk_size=64,
    transpose_state_layout=None,
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
        g: ``[.., H]`` gates (log space, or alpha itself with ``gate="linear"``), float32 (another
            floating dtype is converted first, as FLA does); None: no decay.
        beta: ``[.., H]`` float32, float16 or bfloat16 (float64 is converted to float32 first);
            None: beta = 1.
        scale: output scale; None: dk ** -0.5.
        initial_state: ``[N, H, dk, dv]`` (``state_layout="kv"``) or ``[N, H, dv, dk]`` ("vk"),
            float32 (another floating dtype is converted first); None: zeros.
        output_final_state: also return the state after each sequence's last token.
        cu_seqlens: ``[N+1]`` int32 or int64 sequence boundaries, on q's device.
        gate: ``"log"`` (g = log alpha, FLA) or ``"linear"`` (g = alpha, flashinfer).
        state_layout: ``"kv"`` (``[N, H, dk, dv]``, FLA) or ``"vk"`` (``[N, H, dv, dk]``).
        validate: check cu_seqlens and the gate values first (synchronises for CUDA tensors).
            Host cu_seqlens are always checked (cheap, and a bad one would read out of bounds).
        kernel: None lets the planner choose; a kernel name as the C++ ``Plan::kernel_name()``
            and the ``gdnkit`` CLI report it (e.g. ``"cuda-split-wgmma-bf16-k128-w8"``) requires
            that kernel: a name that is not one of the backend's kernels raises ValueError (host
            arrays: the CPU backend's, CUDA tensors: the CUDA backend's; a split's ``-cpK`` name
            is not one: ask for a split with ``segments``), a CUDA kernel this GPU cannot run
            RuntimeError. Never a silent fallback.
        segments: CUDA, context parallelism (C++ ``Options::segments``): None or 0 lets the planner
            split long sequences where it pays, 1 never splits, k >= 2 requires segments of about
            1/k of the longest length (``max_seq_len`` or the one ``cu_seqlens_cpu`` gives, else
            the mean length; RuntimeError where the split cannot run: host arrays, a GPU other
            than H100/H200, segments under two chunks).
        use_qk_l2norm_in_kernel, use_beta_sigmoid_in_kernel, allow_neg_eigval, state_v_first,
        cu_seqlens_cpu, chunk_indices, use_gate_in_kernel, A_log, dt_bias: FLA's keywords (keyword
            only here), same meaning and the same refusals (allow_neg_eigval without
            use_beta_sigmoid_in_kernel; also the sigmoid without beta, the gate with
            ``gate="linear"``). The first two and the gate are applied with q's framework before
            the kernel (FLA's formulas in float32: q / sqrt(sum(q^2) + 1e-6) in q's dtype;
            beta = sigmoid(beta), times 2 with allow_neg_eigval; g = -exp(A_log) *
            softplus(g + dt_bias)), not fused into it yet: each costs a pass over its tensors. ``state_v_first=True`` is
            ``state_layout="vk"``. ``cu_seqlens_cpu`` (a host copy of cu_seqlens, only with it)
            gives the planner the longest length (``max_seq_len``). ``chunk_indices`` is accepted and not needed.
            ``head_first=True`` and ``cp_context`` are refused (ValueError). ``chunk_size`` (16, 32
            or 64) is checked as FLA does and otherwise ignored: the kernels pick their own chunk
            size (64 tokens; 16 in the short walk for batches of short sequences), and chunk
            sizes differ only by rounding. ``transpose_state_layout`` is
            FLA's old name of ``state_v_first``.
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

    Tensors are read in place where their layout allows: a contiguous last dim, positive token
    and head strides (views into a fused projection are fine), a 4-D ``[B, T, ...]`` tensor whose
    batch stride is T times its token stride, a C-contiguous initial_state; on CUDA also token and
    head strides that are multiples of 8 elements and 16-byte aligned data. (Head dims: dk, dv in
    16..256 on the CPU backend, 64 or 128 on CUDA; others raise ValueError or RuntimeError, copied
    or not.) A torch, NumPy or CuPy tensor with another layout (``x[:, :t]``
    of a longer batch, ``expand``-ed heads, a transposed view) is copied to a dense one first, as
    FLA's functions make every input contiguous: such a call costs the copy (other array-API
    arrays are refused by name instead). A torch input that requires grad
    gives outputs whose backward raises (gdnkit computes the forward pass only).

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
    if chunk_size not in (16, 32, 64):  # as FLA; gdnkit picks its own (64-token chunks, 16 in the short walk)
        raise ValueError(f"chunk_size: expected 16, 32 or 64, got {chunk_size!r}")
    if transpose_state_layout is not None:  # FLA's deprecated name of state_v_first
        if state_v_first:
            raise ValueError("transpose_state_layout: expected None with state_v_first=True (it is the old "
                             f"name of state_v_first), got {transpose_state_layout!r}")
        state_v_first = bool(transpose_state_layout)
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
        for name, x in (("g", g), ("A_log", A_log)):
            if x is None:
                raise ValueError(f"{name}: expected a tensor with use_gate_in_kernel=True, got None")
        H = max(q.shape[-2], v.shape[-2]) if len(q.shape) >= 2 and len(v.shape) >= 2 else None
        for name, x in (("A_log", A_log), ("dt_bias", dt_bias)):
            if x is not None and not hasattr(x, "shape"):
                raise TypeError(f"{name}: expected a tensor with use_gate_in_kernel=True, got {type(x).__name__}")
            if x is not None and tuple(x.shape) != (H,):
                raise ValueError(f"{name}: expected shape ({H},) (one value per output head, max(Hq, Hv)) with "
                                 f"use_gate_in_kernel=True, got {tuple(x.shape)}")
        if gate != "log":
            raise ValueError(f"gate: expected 'log' with use_gate_in_kernel=True (it forms log-space gates), "
                             f"got {gate!r}")
        g = _gdn_gate(g, A_log, dt_bias)
    if state_v_first and state_layout == "kv":
        state_layout = "vk"
    if cu_seqlens_cpu is not None and cu_seqlens is None:
        raise ValueError("cu_seqlens_cpu: expected only with cu_seqlens (a host copy of it), "
                         "got one without cu_seqlens")
    if cu_seqlens_cpu is not None and max_seq_len is None:
        try:
            host = _np.asarray(cu_seqlens_cpu)
        except (TypeError, ValueError, RuntimeError) as e:
            raise TypeError(f"cu_seqlens_cpu: expected a host array (a copy of cu_seqlens in host memory), "
                            f"got {type(cu_seqlens_cpu).__name__} ({e})") from None
        # The planner's hint only, but a copy that disagrees with cu_seqlens is a caller's bug.
        n1 = cu_seqlens.shape[0] if cu_seqlens is not None and len(cu_seqlens.shape) == 1 else None
        t = q.shape[-3] if len(q.shape) >= 3 else None
        if host.ndim != 1 or host.shape[0] < 1 or host.dtype.kind not in "iu":
            raise ValueError(f"cu_seqlens_cpu: expected a 1-D integer host copy of cu_seqlens ({n1} entries), "
                             f"got shape {host.shape}, dtype {host.dtype}")
        lens = _np.diff(host)
        if ((lens < 0).any() or int(host[0]) != 0 or (t is not None and int(host[-1]) != t)
                or (n1 is not None and host.shape[0] != n1)):
            raise ValueError(f"cu_seqlens_cpu: expected a host copy of cu_seqlens ({n1} entries, 0 first, "
                             f"non-decreasing, T={t} last), got {host.tolist()[:8]}"
                             f"{' ...' if host.shape[0] > 8 else ''} ({host.shape[0]} entries)")
        if lens.size:
            max_seq_len = int(lens.max())
    # float32 gates and states pass by identity of their dtype (cheap); others are converted.
    # (Objects without a dtype reach the binding, which refuses them by name.)
    f32 = _FLOAT32
    gd = getattr(g, "dtype", None)
    if gd is not None and gd is not f32[0] and gd is not f32[-1]:
        g = _as_float32(g, "g")
    sd = getattr(initial_state, "dtype", None)
    if sd is not None and sd is not f32[0] and sd is not f32[-1]:
        initial_state = _as_float32(initial_state, "initial_state")
    # beta is read as float32, float16 or bfloat16; a float64 one is converted like g.
    if getattr(getattr(beta, "dtype", None), "itemsize", 0) == 8:
        beta = _as_float32(beta, "beta")
    stream = 0 if type(q) is _ndarray else _current_stream(q)
    torch = _sys.modules.get("torch")
    if torch is not None and torch.is_grad_enabled():
        args = (q, k, v, g, beta, initial_state, cu_seqlens)
        grads = [x for x in args if getattr(x, "requires_grad", False)]
        if grads:
            detached = tuple(x.detach() if getattr(x, "requires_grad", False) else x for x in args)
            options = (gate, state_layout, validate, stream, kernel, segments, max_seq_len, split_decay_cutoff)
            return _forward_only_fn().apply(lambda: _call(detached, scale, output_final_state, options), *grads)
    try:
        return _forward(q, k, v, g, beta, scale, initial_state, output_final_state, cu_seqlens, gate, state_layout,
                        validate, stream, kernel, segments, max_seq_len, split_decay_cutoff)
    except ValueError as e:
        options = (gate, state_layout, validate, stream, kernel, segments, max_seq_len, split_decay_cutoff)
        return _call_dense(e, (q, k, v, g, beta, initial_state, cu_seqlens), scale, output_final_state, options)


def _call(args, scale, output_final_state, options):
    """The binding's call on args = (q, k, v, g, beta, initial_state, cu_seqlens), in place, then
    where it refuses a layout, on dense copies (_call_dense)."""
    q, k, v, g, beta, h0, cu = args
    try:
        return _forward(q, k, v, g, beta, scale, h0, output_final_state, cu, *options)
    except ValueError as e:
        return _call_dense(e, args, scale, output_final_state, options)


def _call_dense(error, args, scale, output_final_state, options):
    """After the binding's ValueError `error` on args: where it refused a layout the kernels cannot
    read (FLA makes every input contiguous first), the call once more on dense copies of the
    tensors that are not dense. Other errors, and a layout error that no copy changes, stand."""
    if not any(w in str(error) for w in _LAYOUT_WORDS):
        raise error
    dense = [None if x is None else _dense(x) for x in args]
    if all(a is b for a, b in zip(dense, args)):
        raise error
    q, k, v, g, beta, h0, cu = dense
    return _forward(q, k, v, g, beta, scale, h0, output_final_state, cu, *options)
