"""Tests of the gdnkit Python binding against an fp64 NumPy implementation of the token recurrence.

Runs on a machine with no GPU and no torch (NumPy arrays run the CPU backend). The torch and
ml_dtypes tests run only where those packages are importable.

Tolerances. Both sides see the same fp16 (or bf16) inputs, converted exactly to float64 for the
oracle, so the difference is only (a) gdnkit computing in fp32 (the chunked form: ~1e-6 relative
to the output's magnitude at these sizes) and (b) o being rounded to q's dtype: half an ulp,
2^-11 ~ 4.9e-4 relative for fp16 (2^-8 ~ 3.9e-3 for bf16). So o is checked elementwise with
rtol = 2x that rounding plus an atol of 1e-4 (fp16) of the largest |o| for (a) and for elements
near zero; final states are fp32 and are checked to 1e-5 of the largest |S|, which fp32
accumulation over a few hundred tokens stays well below (~1e-6 measured).
"""

import os
import platform
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest

import gdnkit

F16_RTOL = 2 * 2.0**-11
BF16_RTOL = 2 * 2.0**-8


# --------------------------------------------------------------------------------------------
# Oracle and inputs


def reference(q, k, v, g, beta, scale, initial_state, cu_seqlens, gate="log", state_layout="kv"):
    """fp64 token recurrence on packed [T, heads, dim] arrays. Returns o [T, H, dv] and the final
    states [N, H, dk, dv] (always kv layout); initial_state is in state_layout."""
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    T, Hq, dk = q.shape
    Hk, Hv, dv = k.shape[1], v.shape[1], v.shape[2]
    H = max(Hq, Hv)
    qi, ki, vi = (np.arange(H) // (H // n) for n in (Hq, Hk, Hv))
    if g is None:
        a = np.ones((T, H))
    else:
        g = np.asarray(g, dtype=np.float64)
        a = np.exp(g) if gate == "log" else g
    b = np.ones((T, H)) if beta is None else np.asarray(beta, dtype=np.float64)
    scale = dk**-0.5 if scale is None else scale
    cu = np.asarray(cu_seqlens, dtype=np.int64)
    o = np.zeros((T, H, dv))
    states = np.zeros((len(cu) - 1, H, dk, dv))
    for n in range(len(cu) - 1):
        if initial_state is None:
            S = np.zeros((H, dk, dv))
        else:
            S = np.asarray(initial_state[n], dtype=np.float64)
            S = S.copy() if state_layout == "kv" else S.transpose(0, 2, 1).copy()
        for t in range(cu[n], cu[n + 1]):
            S *= a[t][:, None, None]
            kt = k[t, ki]
            u = b[t][:, None] * (v[t, vi] - (kt[:, None, :] @ S)[:, 0, :])
            S += kt[:, :, None] * u[:, None, :]
            o[t] = scale * (q[t, qi][:, None, :] @ S)[:, 0, :]
        states[n] = S
    return o, states


def l2norm(x):
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def logsigmoid(x):
    return -np.logaddexp(0.0, -x)


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def make_inputs(rng, lead, Hq, Hk, Hv, dk, dv, dtype=np.float16, beta_dtype=np.float32):
    """Realistic inputs: q, k L2-normalised, g = logsigmoid(randn), beta = sigmoid(randn)."""
    lead = tuple(lead)
    H = max(Hq, Hv)
    q = l2norm(rng.standard_normal(lead + (Hq, dk))).astype(dtype)
    k = l2norm(rng.standard_normal(lead + (Hk, dk))).astype(dtype)
    v = rng.standard_normal(lead + (Hv, dv)).astype(dtype)
    g = logsigmoid(rng.standard_normal(lead + (H,))).astype(np.float32)
    beta = sigmoid(rng.standard_normal(lead + (H,))).astype(beta_dtype)
    return q, k, v, g, beta


def cu_of(lengths, dtype=np.int32):
    return np.concatenate([[0], np.cumsum(lengths)]).astype(dtype)


def assert_o_close(o, ref, rtol=F16_RTOL, atol_frac=1e-4):
    o = np.asarray(o, dtype=np.float64)
    assert o.shape == ref.shape
    assert np.all(np.isfinite(o))
    atol = atol_frac * max(np.abs(ref).max(), 1e-30)
    np.testing.assert_allclose(o, ref, rtol=rtol, atol=atol)


def assert_state_close(s, ref):
    s = np.asarray(s, dtype=np.float64)
    assert s.shape == ref.shape
    np.testing.assert_allclose(s, ref, rtol=0, atol=1e-5 * max(np.abs(ref).max(), 1e-30))


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


def packed(x):
    """[B, L, ...] -> [B*L, ...]."""
    return None if x is None else x.reshape((-1,) + x.shape[2:])


# --------------------------------------------------------------------------------------------
# Correctness


@pytest.mark.parametrize("cu_dtype", [np.int32, np.int64])
def test_packed_varlen(rng, cu_dtype):
    lengths = [37, 0, 150, 64, 1, 0]  # short, empty, several chunks, exactly one chunk, one token
    T = sum(lengths)
    q, k, v, g, beta = make_inputs(rng, (T,), 2, 2, 2, 32, 32)
    cu = cu_of(lengths, cu_dtype)
    o, st = gdnkit.chunk_gated_delta_rule(q, k, v, g, beta, cu_seqlens=cu, output_final_state=True)
    assert isinstance(o, np.ndarray) and o.dtype == np.float16 and o.shape == (T, 2, 32)
    assert st.dtype == np.float32 and st.shape == (len(lengths), 2, 32, 32)
    ro, rs = reference(q, k, v, g, beta, None, None, cu)
    assert_o_close(o, ro)
    assert_state_close(st, rs)
    assert np.all(st[1] == 0) and np.all(st[5] == 0)  # empty sequences keep the (zero) start state


def test_batched_4d(rng):
    B, L = 3, 70
    q, k, v, g, beta = make_inputs(rng, (B, L), 2, 2, 2, 32, 64)
    o, st = gdnkit.chunk_gated_delta_rule(q, k, v, g, beta, output_final_state=True)
    assert o.shape == (B, L, 2, 64) and o.dtype == np.float16
    assert st.shape == (B, 2, 32, 64)
    ro, rs = reference(packed(q), packed(k), packed(v), packed(g), packed(beta), None, None,
                       cu_of([L] * B))
    assert_o_close(o.reshape(B * L, 2, 64), ro)
    assert_state_close(st, rs)


def test_4d_with_cu_seqlens_batch_1(rng):
    lengths = [20, 90, 3]
    T = sum(lengths)
    q, k, v, g, beta = make_inputs(rng, (1, T), 2, 2, 2, 32, 32)
    cu = cu_of(lengths, np.int64)
    o, st = gdnkit.chunk_gated_delta_rule(q, k, v, g, beta, cu_seqlens=cu, output_final_state=True)
    assert o.shape == (1, T, 2, 32) and st.shape == (3, 2, 32, 32)
    ro, rs = reference(q[0], k[0], v[0], g[0], beta[0], None, None, cu)
    assert_o_close(o[0], ro)
    assert_state_close(st, rs)


@pytest.mark.parametrize("heads", [(2, 2, 2), (1, 1, 4), (2, 2, 6), (4, 2, 2), (6, 1, 1)],
                         ids=["mha", "gva-1-4", "gva-2-6", "gqa-4-2", "gqa-6-1"])
def test_head_sharing(rng, heads):
    Hq, Hk, Hv = heads
    H = max(Hq, Hv)
    lengths = [90, 45]
    q, k, v, g, beta = make_inputs(rng, (sum(lengths),), Hq, Hk, Hv, 32, 32)
    cu = cu_of(lengths)
    o, st = gdnkit.chunk_gated_delta_rule(q, k, v, g, beta, cu_seqlens=cu, output_final_state=True)
    assert o.shape == (sum(lengths), H, 32) and st.shape == (2, H, 32, 32)
    ro, rs = reference(q, k, v, g, beta, None, None, cu)
    assert_o_close(o, ro)
    assert_state_close(st, rs)


def test_gate_linear(rng):
    lengths = [100, 60]
    q, k, v, g, beta = make_inputs(rng, (sum(lengths),), 2, 2, 2, 32, 32)
    alpha = np.exp(g).astype(np.float32)
    cu = cu_of(lengths)
    o, st = gdnkit.chunk_gated_delta_rule(q, k, v, alpha, beta, cu_seqlens=cu,
                                          output_final_state=True, gate="linear")
    ro, rs = reference(q, k, v, alpha, beta, None, None, cu, gate="linear")
    assert_o_close(o, ro)
    assert_state_close(st, rs)
    # The same decays in log space give the same answer.
    o_log, _ = gdnkit.chunk_gated_delta_rule(q, k, v, g, beta, cu_seqlens=cu, gate="log")
    assert_o_close(o_log, ro)


@pytest.mark.parametrize("drop", ["g", "beta", "both"])
def test_gate_or_beta_absent(rng, drop):
    lengths = [80, 33]
    q, k, v, g, beta = make_inputs(rng, (sum(lengths),), 2, 2, 2, 32, 32)
    if drop in ("g", "both"):
        g = None
    if drop in ("beta", "both"):
        beta = None
    cu = cu_of(lengths)
    o, st = gdnkit.chunk_gated_delta_rule(q, k, v, g, beta, cu_seqlens=cu, output_final_state=True)
    ro, rs = reference(q, k, v, g, beta, None, None, cu)
    assert_o_close(o, ro)
    assert_state_close(st, rs)


@pytest.mark.parametrize("layout", ["kv", "vk"])
def test_initial_and_final_state(rng, layout):
    lengths = [70, 0, 20]
    H, dk, dv = 2, 32, 64
    q, k, v, g, beta = make_inputs(rng, (sum(lengths),), H, H, H, dk, dv)
    shape = (3, H, dk, dv) if layout == "kv" else (3, H, dv, dk)
    h0 = (0.1 * rng.standard_normal(shape)).astype(np.float32)
    cu = cu_of(lengths)
    o, st = gdnkit.chunk_gated_delta_rule(q, k, v, g, beta, initial_state=h0, output_final_state=True,
                                          cu_seqlens=cu, state_layout=layout)
    assert st.shape == shape and st.dtype == np.float32
    ro, rs = reference(q, k, v, g, beta, None, h0, cu, state_layout=layout)
    assert_o_close(o, ro)
    st_kv = st if layout == "kv" else st.transpose(0, 1, 3, 2)
    assert_state_close(st_kv, rs)
    np.testing.assert_array_equal(st[1], h0[1])  # an empty sequence passes its state through
    # Without output_final_state: no state, same o.
    o2, none = gdnkit.chunk_gated_delta_rule(q, k, v, g, beta, initial_state=h0, cu_seqlens=cu,
                                             state_layout=layout)
    assert none is None
    np.testing.assert_array_equal(o2, o)


def test_non_contiguous_views(rng):
    """q/k/v as views into one fused projection, g/beta with non-packed strides."""
    T, H, dk, dv = 130, 2, 32, 32
    q, k, v, g, beta = make_inputs(rng, (T,), H, H, H, dk, dv)
    fused = np.zeros((T, 2 * H * dk + H * dv + 8), dtype=np.float16)  # padded rows
    fused[:, : H * dk] = q.reshape(T, -1)
    fused[:, H * dk : 2 * H * dk] = k.reshape(T, -1)
    fused[:, 2 * H * dk : 2 * H * dk + H * dv] = v.reshape(T, -1)
    qv = fused[:, : H * dk].reshape(T, H, dk)
    kv = fused[:, H * dk : 2 * H * dk].reshape(T, H, dk)
    vv = fused[:, 2 * H * dk : 2 * H * dk + H * dv].reshape(T, H, dv)
    assert not qv.flags.c_contiguous and qv.strides[0] == fused.strides[0]
    g_t = np.ascontiguousarray(g.T).T  # token stride 1, head stride T
    beta_w = np.zeros((T, 3 * H), np.float32)
    beta_w[:, ::3] = beta
    beta_s = beta_w[:, ::3]  # head stride 3
    # A padded head stride as well: [T, H, dk + 16][..., :dk].
    qp = np.zeros((T, H, dk + 16), np.float16)
    qp[..., :dk] = q
    cu = cu_of([T // 2, T - T // 2])
    o, st = gdnkit.chunk_gated_delta_rule(qp[..., :dk], kv, vv, g_t, beta_s, cu_seqlens=cu,
                                          output_final_state=True)
    o_ref, st_ref = gdnkit.chunk_gated_delta_rule(q, k, v, g, beta, cu_seqlens=cu,
                                                  output_final_state=True)
    np.testing.assert_array_equal(o, o_ref)
    np.testing.assert_array_equal(st, st_ref)
    o2, _ = gdnkit.chunk_gated_delta_rule(qv, kv, vv, g, beta, cu_seqlens=cu)
    np.testing.assert_array_equal(o2, o_ref)
    ro, _ = reference(q, k, v, g, beta, None, None, cu)
    assert_o_close(o, ro)


def test_batched_views_of_fused_projection(rng):
    B, L, H, d = 2, 40, 2, 32
    fused = rng.standard_normal((B, L, 3 * H * d)).astype(np.float16)
    q = fused[..., : H * d].reshape(B, L, H, d)
    k = fused[..., H * d : 2 * H * d].reshape(B, L, H, d)
    v = fused[..., 2 * H * d :].reshape(B, L, H, d)
    q[...] = l2norm(q.astype(np.float64)).astype(np.float16)
    k[...] = l2norm(k.astype(np.float64)).astype(np.float16)
    g = logsigmoid(rng.standard_normal((B, L, H))).astype(np.float32)
    beta = sigmoid(rng.standard_normal((B, L, H))).astype(np.float32)
    o, st = gdnkit.chunk_gated_delta_rule(q, k, v, g, beta, output_final_state=True)
    ro, rs = reference(packed(q), packed(k), packed(v), packed(g), packed(beta), None, None,
                       cu_of([L] * B))
    assert_o_close(o.reshape(B * L, H, d), ro)
    assert_state_close(st, rs)


@pytest.mark.parametrize("scale", [None, 0.5, 1.0])
def test_scale(rng, scale):
    q, k, v, g, beta = make_inputs(rng, (1, 50), 2, 2, 2, 64, 32)
    o, _ = gdnkit.chunk_gated_delta_rule(q, k, v, g, beta, scale=scale)
    ro, _ = reference(q[0], k[0], v[0], g[0], beta[0], scale, None, [0, 50])
    assert_o_close(o[0], ro)


@pytest.mark.parametrize("beta_dtype", [np.float32, np.float16, np.float64])
def test_beta_dtype(rng, beta_dtype):
    q, k, v, g, beta = make_inputs(rng, (77,), 2, 2, 2, 32, 32, beta_dtype=beta_dtype)
    o, _ = gdnkit.chunk_gated_delta_rule(q, k, v, g, beta)
    ro, _ = reference(q, k, v, g, beta, None, None, [0, 77])
    assert_o_close(o, ro)
    if beta_dtype == np.float64:  # converted to float32 first: the float32 call's bits
        o32, _ = gdnkit.chunk_gated_delta_rule(q, k, v, g, beta.astype(np.float32))
        assert np.array_equal(o, o32)


def test_single_sequence_without_cu_seqlens(rng):
    q, k, v, g, beta = make_inputs(rng, (65,), 1, 1, 1, 64, 64)
    o, st = gdnkit.chunk_gated_delta_rule(q, k, v, g, beta, output_final_state=True)
    assert o.shape == (65, 1, 64) and st.shape == (1, 1, 64, 64)
    ro, rs = reference(q, k, v, g, beta, None, None, [0, 65])
    assert_o_close(o, ro)
    assert_state_close(st, rs)


@pytest.mark.parametrize("what", ["q nan", "k nan", "v inf", "g nan", "beta nan"])
def test_non_finite_input_poisons_only_what_depends_on_it(rng, what):
    """A NaN or inf in one token of one head (docs/math.md, "Non-finite inputs"): that head's
    outputs from the token on (only the token's own row for q) and its final state are all
    non-finite; the rows before the token's chunk, the other head and the other sequence are
    bit for bit the clean run's."""
    lengths, t, chunk0 = [200, 90], 150, 128  # the token and its chunk's first row
    q, k, v, g, beta = make_inputs(rng, (sum(lengths),), 2, 2, 2, 32, 32)
    h0 = rng.standard_normal((2, 2, 32, 32)).astype(np.float32)
    cu = cu_of(lengths)
    args = dict(initial_state=h0, output_final_state=True, cu_seqlens=cu)
    o0, s0 = gdnkit.chunk_gated_delta_rule(q, k, v, g, beta, **args)
    assert np.all(np.isfinite(o0.astype(np.float32))) and np.all(np.isfinite(s0))
    name, kind = what.split()
    x = {"q": q, "k": k, "v": v, "g": g, "beta": beta}[name].copy()
    x[t, 0] = np.nan if kind == "nan" else np.inf
    bad = dict(q=q, k=k, v=v, g=g, beta=beta)
    bad[name] = x
    o, st = gdnkit.chunk_gated_delta_rule(bad["q"], bad["k"], bad["v"], bad["g"], bad["beta"], **args)
    o, o0 = o.astype(np.float32), o0.astype(np.float32)
    last = t + 1 if name == "q" else lengths[0]
    assert not np.any(np.isfinite(o[t:last, 0]))
    if name == "q":
        np.testing.assert_array_equal(o[last:lengths[0], 0], o0[last:lengths[0], 0])
        np.testing.assert_array_equal(st, s0)
    else:
        assert not np.any(np.isfinite(st[0, 0]))
        np.testing.assert_array_equal(st[0, 1], s0[0, 1])
        np.testing.assert_array_equal(st[1], s0[1])
    np.testing.assert_array_equal(o[:chunk0, 0], o0[:chunk0, 0])
    np.testing.assert_array_equal(o[:, 1], o0[:, 1])
    np.testing.assert_array_equal(o[lengths[0]:], o0[lengths[0]:])


def test_zero_tokens(rng):
    q, k, v, g, beta = make_inputs(rng, (0,), 2, 2, 2, 32, 32)
    h0 = rng.standard_normal((2, 2, 32, 32)).astype(np.float32)
    o, st = gdnkit.chunk_gated_delta_rule(q, k, v, g, beta, initial_state=h0, output_final_state=True,
                                          cu_seqlens=np.array([0, 0, 0], np.int32))
    assert o.shape == (0, 2, 32) and o.dtype == np.float16
    np.testing.assert_array_equal(st, h0)


def test_read_only_inputs(rng):
    q, k, v, g, beta = make_inputs(rng, (40,), 2, 2, 2, 32, 32)
    for x in (q, k, v, g, beta):
        x.setflags(write=False)
    o, _ = gdnkit.chunk_gated_delta_rule(q, k, v, g, beta)
    ro, _ = reference(q, k, v, g, beta, None, None, [0, 40])
    assert_o_close(o, ro)


def test_validate_accepts_good_input(rng):
    lengths = [30, 0, 40]
    q, k, v, g, beta = make_inputs(rng, (70,), 2, 2, 2, 32, 32)
    cu = cu_of(lengths)
    o, _ = gdnkit.chunk_gated_delta_rule(q, k, v, g, beta, cu_seqlens=cu, validate=True)
    o2, _ = gdnkit.chunk_gated_delta_rule(q, k, v, g, beta, cu_seqlens=cu)
    np.testing.assert_array_equal(o, o2)


def test_required_kernel(rng):
    """kernel= is honoured or refused, never replaced: host arrays have one kernel."""
    q, k, v, g, beta = make_inputs(rng, (70,), 2, 2, 2, 32, 32)
    o, _ = gdnkit.chunk_gated_delta_rule(q, k, v, g, beta, kernel="cpu-chunked-fp32")
    o2, _ = gdnkit.chunk_gated_delta_rule(q, k, v, g, beta)
    np.testing.assert_array_equal(o, o2)
    with pytest.raises(ValueError) as e:
        gdnkit.chunk_gated_delta_rule(q, k, v, g, beta, kernel="cuda-split-wgmma-bf16-k128-w8")
    assert str(e.value).startswith("kernel: expected") and "cpu-chunked-fp32" in str(e.value)
    with pytest.raises(TypeError):
        gdnkit.chunk_gated_delta_rule(q, k, v, g, beta, kernel=3)


def test_segments_on_host(rng):
    """segments= is a CUDA option: host arrays accept 0/1/None and refuse a split, by name."""
    q, k, v, g, beta = make_inputs(rng, (70,), 2, 2, 2, 32, 32)
    o, _ = gdnkit.chunk_gated_delta_rule(q, k, v, g, beta)
    o1, _ = gdnkit.chunk_gated_delta_rule(q, k, v, g, beta, segments=1)
    np.testing.assert_array_equal(o, o1)
    with pytest.raises(RuntimeError) as e:
        gdnkit.chunk_gated_delta_rule(q, k, v, g, beta, segments=4)
    assert str(e.value).startswith("segments: expected") and "got 4" in str(e.value)
    with pytest.raises(TypeError):
        gdnkit.chunk_gated_delta_rule(q, k, v, g, beta, segments="4")


def test_split_decay_cutoff_on_host(rng):
    """split_decay_cutoff= is checked on every backend ([0, 1)); on the host nothing is split."""
    q, k, v, g, beta = make_inputs(rng, (70,), 2, 2, 2, 32, 32)
    o, _ = gdnkit.chunk_gated_delta_rule(q, k, v, g, beta)
    np.testing.assert_array_equal(gdnkit.chunk_gated_delta_rule(q, k, v, g, beta, split_decay_cutoff=1e-6)[0], o)
    for bad in (-0.1, 1.0, float("nan")):
        with pytest.raises(ValueError) as e:
            gdnkit.chunk_gated_delta_rule(q, k, v, g, beta, split_decay_cutoff=bad)
        assert str(e.value).startswith("split_decay_cutoff: expected")
    with pytest.raises(TypeError):
        gdnkit.chunk_gated_delta_rule(q, k, v, g, beta, split_decay_cutoff="0.1")


def test_max_seq_len_hint(rng):
    """max_seq_len is a planning hint: any value in [0, T] gives the same answer; others are refused."""
    q, k, v, g, beta = make_inputs(rng, (70,), 2, 2, 2, 32, 32)
    o, _ = gdnkit.chunk_gated_delta_rule(q, k, v, g, beta)
    for hint in (0, 1, 70):
        np.testing.assert_array_equal(gdnkit.chunk_gated_delta_rule(q, k, v, g, beta, max_seq_len=hint)[0], o)
    with pytest.raises(ValueError) as e:
        gdnkit.chunk_gated_delta_rule(q, k, v, g, beta, max_seq_len=71)
    assert "max_seq_len" in str(e.value) and "got 71" in str(e.value)
    with pytest.raises(TypeError):
        gdnkit.chunk_gated_delta_rule(q, k, v, g, beta, max_seq_len=7.5)


def test_plan_cache(rng):
    """The binding keeps the plans of recent problems: a repeated problem reuses its plan, a call
    that differs in anything the planner reads gets its own (and the right answer), the cache stays
    bounded, and a refused problem is never kept."""
    from gdnkit import _gdnkit

    _gdnkit._plan_cache_clear()
    q, k, v, g, beta = make_inputs(rng, (130,), 2, 2, 2, 32, 32)
    cu = cu_of([130])
    h0 = rng.standard_normal((1, 2, 32, 32)).astype(np.float32)
    o1, _ = gdnkit.chunk_gated_delta_rule(q, k, v, g, beta)
    assert _gdnkit._plan_cache_info() == (0, 1, 1)
    o2, _ = gdnkit.chunk_gated_delta_rule(q, k, v, g, beta)
    assert _gdnkit._plan_cache_info() == (1, 1, 1)
    np.testing.assert_array_equal(o1, o2)

    # Problems that differ in one planning input each, called in turn twice: every call matches
    # its own oracle, the first round misses and the second hits.
    calls = [
        (dict(), dict()),
        (dict(scale=0.5), dict(scale=0.5)),
        (dict(gate="linear", g=np.exp(g)), dict(gate="linear", g=np.exp(g))),
        (dict(initial_state=h0, state_layout="vk"), dict(initial_state=h0, state_layout="vk")),
        (dict(initial_state=h0), dict(initial_state=h0)),
        (dict(output_final_state=True), dict()),
        (dict(cu_seqlens=cu), dict()),
        (dict(cu_seqlens=cu.astype(np.int64)), dict()),
        (dict(beta=beta.astype(np.float16)), dict(beta=beta.astype(np.float16))),
        (dict(g=None), dict(g=None)),
    ]
    _gdnkit._plan_cache_clear()
    for rnd in range(2):
        for kw, ref_kw in calls:
            args = dict(g=g, beta=beta)
            args.update(kw)
            o, state = gdnkit.chunk_gated_delta_rule(q, k, v, **args)
            r = dict(g=g, beta=beta, scale=None, initial_state=None, gate="log", state_layout="kv")
            r.update(ref_kw)
            ref_o, ref_s = reference(q, k, v, r["g"], r["beta"], r["scale"], r["initial_state"], cu, r["gate"],
                                     r["state_layout"])
            assert_o_close(o, ref_o)
            if kw.get("output_final_state"):
                assert_state_close(state, ref_s)
            else:
                assert state is None
        assert _gdnkit._plan_cache_info() == (rnd * len(calls), len(calls), len(calls))

    # Bounded: twenty lengths leave the sixteen most recent.
    for t in range(40, 60):
        gdnkit.chunk_gated_delta_rule(q[:t], k[:t], v[:t], g[:t], beta[:t])
    hits, misses, entries = _gdnkit._plan_cache_info()
    assert entries == 16 and misses == len(calls) + 20
    gdnkit.chunk_gated_delta_rule(q[:59], k[:59], v[:59], g[:59], beta[:59])
    assert _gdnkit._plan_cache_info()[0] == hits + 1

    # A refused problem raises every time and is not kept.
    for _ in range(2):
        with pytest.raises(ValueError, match="kernel"):
            gdnkit.chunk_gated_delta_rule(q, k, v, g, beta, kernel="no-such-kernel")
    assert _gdnkit._plan_cache_info() == (hits + 1, misses + 2, 16)


def test_threads_share_nothing(rng):
    """Calls release the GIL and keep no shared buffers: concurrent calls give the serial answers."""
    inputs = [make_inputs(rng, (150,), 2, 2, 2, 32, 32) for _ in range(4)]
    serial = [gdnkit.chunk_gated_delta_rule(*x)[0] for x in inputs]
    results = [None] * len(inputs)

    def work(i):
        for _ in range(3):
            results[i] = gdnkit.chunk_gated_delta_rule(*inputs[i])[0]

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(inputs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for a, b in zip(results, serial):
        np.testing.assert_array_equal(a, b)


def test_module_info():
    assert gdnkit.__version__ == "0.1.0"
    assert isinstance(gdnkit.cuda_available(), bool)
    assert callable(gdnkit.chunk_gated_delta_rule)


def test_runs_without_torch_or_cuda():
    """A process in which torch cannot be imported still imports gdnkit and runs NumPy problems;
    gdnkit itself never imports torch."""
    code = textwrap.dedent(
        """
        import sys
        sys.modules["torch"] = None  # any `import torch` now fails
        import numpy as np
        import gdnkit
        assert "torch" not in sys.modules or sys.modules["torch"] is None
        q = np.full((10, 1, 16), 0.25, np.float16)
        o, s = gdnkit.chunk_gated_delta_rule(q, q, q, output_final_state=True)
        assert o.shape == (10, 1, 16) and s.shape == (1, 1, 16, 16)
        assert np.all(np.isfinite(o.astype(np.float64)))
        print("ok", gdnkit.cuda_available())
        """
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env={**__import__("os").environ, "CUDA_VISIBLE_DEVICES": ""})
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "ok False"


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="GDNKIT_CPU_SIMD is read on x86-64 only")
def test_cpu_simd_cap_from_the_environment():
    """GDNKIT_CPU_SIMD caps the CPU backend's instructions when a problem is first planned: avx2 and
    baseline run (the outputs within the CPU path's error of each other), a value the library does
    not know is a ValueError naming the variable, not a silent choice."""
    code = textwrap.dedent(
        """
        import numpy as np
        import gdnkit
        rng = np.random.default_rng(5)
        q = (rng.standard_normal((70, 2, 32)) * 0.2).astype(np.float16)
        try:
            o, _ = gdnkit.chunk_gated_delta_rule(q, q, q)
        except ValueError as e:
            print("ValueError", e)
        else:
            print("ok", float(np.abs(o.astype(np.float64)).sum()))
        """
    )
    out = {}
    for cap in ("avx2", "baseline", "avx3"):
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                           env={**os.environ, "GDNKIT_CPU_SIMD": cap})
        assert r.returncode == 0, r.stderr
        out[cap] = r.stdout.strip()
    assert out["avx3"].startswith("ValueError GDNKIT_CPU_SIMD: expected avx512, avx2, baseline or unset"), out["avx3"]
    assert 'got "avx3"' in out["avx3"], out["avx3"]
    a, b = (float(out[c].split()[1]) for c in ("avx2", "baseline"))
    assert out["avx2"].startswith("ok") and out["baseline"].startswith("ok")
    assert abs(a - b) <= 1e-3 * abs(a), (a, b)


# --------------------------------------------------------------------------------------------
# validate=True


def _small(rng, T=64, H=2):
    return make_inputs(rng, (T,), H, H, H, 32, 32)


@pytest.mark.parametrize("cu, message", [
    ([0, 50, 40, 64], "cu_seqlens[2]: expected a non-decreasing value >= 50, got 40"),
    ([0, 10, 60], "cu_seqlens[2]: expected total_tokens=64, got 60"),
    ([3, 10, 64], "cu_seqlens[0]: expected 0, got 3"),
])
@pytest.mark.parametrize("validate", [True, False])
def test_bad_cu_seqlens(rng, cu, message, validate):
    # Host cu_seqlens are always checked (a bad one would read out of bounds); validate=True goes
    # through Plan::validate, with the same message.
    q, k, v, g, beta = _small(rng)
    with pytest.raises(ValueError) as e:
        gdnkit.chunk_gated_delta_rule(q, k, v, g, beta, cu_seqlens=np.array(cu, np.int64),
                                      validate=validate)
    assert message in str(e.value)


@pytest.mark.parametrize("gate, bad, message", [
    ("log", np.nan, "g[5, 1]: expected a log-space gate <= 0 (or -inf), got nan"),
    ("log", np.inf, "g[5, 1]: expected a log-space gate <= 0 (or -inf), got inf"),
    ("log", 100.0, "g[5, 1]: expected a log-space gate <= 0 (or -inf), got 100"),
    ("linear", -0.5, "g[5, 1]: expected a linear gate in [0, 1], got -0.5"),
    ("linear", 1e30, "g[5, 1]: expected a linear gate in [0, 1], got 1000000015047466219876688855040"),
    ("linear", np.nan, "g[5, 1]: expected a linear gate in [0, 1], got nan"),
])
def test_validate_catches_bad_gates(rng, gate, bad, message):
    q, k, v, g, beta = _small(rng)
    if gate == "linear":
        g = np.exp(g).astype(np.float32)
    g[5, 1] = bad
    with pytest.raises(ValueError) as e:
        gdnkit.chunk_gated_delta_rule(q, k, v, g, beta, gate=gate, validate=True)
    assert message in str(e.value)
    # Without validate the call runs (and the NaN or garbage is the caller's).
    gdnkit.chunk_gated_delta_rule(q, k, v, g, beta, gate=gate)


# --------------------------------------------------------------------------------------------
# Bad input: every class raises TypeError or ValueError naming the argument.


def _base(rng):
    q, k, v, g, beta = make_inputs(rng, (64,), 2, 2, 2, 32, 32)
    return dict(q=q, k=k, v=v, g=g, beta=beta)


def _base4(rng):
    q, k, v, g, beta = make_inputs(rng, (2, 32), 2, 2, 2, 32, 32)
    return dict(q=q, k=k, v=v, g=g, beta=beta)


BAD = {
    # dtypes
    "q float32": (_base, lambda a: a.update(q=a["q"].astype(np.float32)), TypeError,
                  "q: expected dtype float16 or bfloat16, got float32"),
    "k dtype != q": (_base, lambda a: a.update(k=a["k"].astype(np.float32)), TypeError,
                     "k: expected dtype float16 like q, got float32"),
    "v dtype != q": (_base, lambda a: a.update(v=a["v"].astype(np.float64)), TypeError,
                     "v: expected dtype float16 like q, got float64"),
    "g int32": (_base, lambda a: a.update(g=a["g"].astype(np.int32)), TypeError,
                "g: expected dtype float32, got int32"),
    "beta int32": (_base, lambda a: a.update(beta=a["beta"].astype(np.int32)), TypeError,
                   "beta: expected dtype float32, float16 or bfloat16, got int32"),
    "beta int64": (_base, lambda a: a.update(beta=a["beta"].astype(np.int64)), TypeError,
                   "beta: expected dtype float32, float16 or bfloat16, got int64"),
    "cu_seqlens float": (_base, lambda a: a.update(cu_seqlens=np.array([0.0, 64.0])), TypeError,
                         "cu_seqlens: expected dtype int32 or int64, got float64"),
    "cu_seqlens uint32": (_base, lambda a: a.update(cu_seqlens=np.array([0, 64], np.uint32)),
                          TypeError, "cu_seqlens: expected dtype int32 or int64, got uint32"),
    "initial_state int32": (_base, lambda a: a.update(initial_state=np.zeros((1, 2, 32, 32), np.int32)),
                            TypeError, "initial_state: expected dtype float32, got int32"),
    # argument types
    "q list": (_base, lambda a: a.update(q=[[[0.0]]]), TypeError,
               "q: expected a DLPack-capable tensor (NumPy array, torch tensor, ...), got list"),
    "q None": (_base, lambda a: a.update(q=None), TypeError, "q: expected a tensor, got None"),
    "scale str": (_base, lambda a: a.update(scale="x"), TypeError, "scale: expected a float or None, got str"),
    "g float": (_base, lambda a: a.update(g=-0.1), TypeError,
                "g: expected a DLPack-capable tensor (NumPy array, torch tensor, ...), got float"),
    "g list": (_base, lambda a: a.update(g=a["g"].tolist()), TypeError,
               "g: expected a DLPack-capable tensor (NumPy array, torch tensor, ...), got list"),
    "initial_state list": (_base, lambda a: a.update(initial_state=np.zeros((1, 2, 32, 32)).tolist()), TypeError,
                           "initial_state: expected a DLPack-capable tensor (NumPy array, torch tensor, ...), got list"),
    # ranks and shapes
    "q 2-D": (_base, lambda a: a.update(q=a["q"][:, 0]), ValueError,
              "q: expected 3 dims [T, H, K] or 4 dims [B, T, H, K], got 2 dims (64, 32)"),
    "k 4-D for 3-D q": (_base, lambda a: a.update(k=a["k"][None]), ValueError,
                        "k: expected 3 dims [T, H, D] like q, got 4 dims (1, 64, 2, 32)"),
    "g 3-D for 3-D q": (_base, lambda a: a.update(g=a["g"][None]), ValueError,
                        "g: expected 2 dims [T, H] like q, got 3 dims (1, 64, 2)"),
    "k T mismatch": (_base, lambda a: a.update(k=a["k"][:63]), ValueError,
                     "k: expected T=64 like q, got T=63"),
    "beta T mismatch": (_base, lambda a: a.update(beta=a["beta"][:10]), ValueError,
                        "beta: expected T=64 like q, got T=10"),
    "v batch mismatch": (_base4, lambda a: a.update(v=np.concatenate([a["v"], a["v"][:1]])), ValueError,
                         "v: expected [B, T]=[2, 32] like q, got [B, T]=[3, 32]"),
    "g batch-T mismatch": (_base4, lambda a: a.update(g=a["g"][:, :31]), ValueError,
                           "g: expected [B, T]=[2, 32] like q, got [B, T]=[2, 31]"),
    "k head dim": (_base, lambda a: a.update(k=a["k"][..., :16]), ValueError,
                   "k: expected head dim 32 like q, got 16"),
    "head dim too small": (_base, lambda a: a.update(q=a["q"][..., :8], k=a["k"][..., :8]), ValueError,
                           "q, k head dim: expected 16..256, got 8"),
    "k heads": (_base, lambda a: a.update(k=a["k"][:, :1]), ValueError,
                "k: expected 2 heads for MHA with Hq=2, got 1"),
    "v heads not multiple": (_base, lambda a: a.update(v=np.concatenate([a["v"], a["v"][:, :1]], axis=1)),
                             ValueError, "v: expected a multiple of Hq=2 heads for GVA, got 3"),
    "v heads fewer than q and k": (_base, lambda a: a.update(v=a["v"][:, :1]), ValueError,
                                   "v: expected a multiple of Hq=2 heads for GVA with Hk=Hq (GQA needs Hk = Hv "
                                   "instead), got 1"),
    "g heads": (_base, lambda a: a.update(g=np.concatenate([a["g"], a["g"][:, :1]], axis=1)), ValueError,
                "g: expected H=max(Hq, Hv)=2 heads, got 3"),
    "beta heads": (_base, lambda a: a.update(beta=a["beta"][:, :1]), ValueError,
                   "beta: expected H=max(Hq, Hv)=2 heads, got 1"),
    "cu_seqlens 2-D": (_base, lambda a: a.update(cu_seqlens=np.array([[0, 64]], np.int32)), ValueError,
                       "cu_seqlens: expected 1 dim [N+1], got 2 dims (1, 2)"),
    "cu_seqlens short": (_base, lambda a: a.update(cu_seqlens=np.array([0], np.int32)), ValueError,
                         "cu_seqlens: expected at least 2 entries [N+1], got (1,)"),
    "cu_seqlens with B>1": (_base4, lambda a: a.update(cu_seqlens=np.array([0, 64], np.int32)), ValueError,
                            "cu_seqlens: expected batch size B=1 for 4-D q with cu_seqlens"),
    "initial_state shape": (_base, lambda a: a.update(initial_state=np.zeros((1, 2, 32, 16), np.float32)),
                            ValueError, "initial_state: expected shape [N, H, dk, dv] = (1, 2, 32, 32) "
                            "for state_layout='kv', got (1, 2, 32, 16)"),
    "initial_state N": (_base, lambda a: a.update(initial_state=np.zeros((2, 2, 32, 32), np.float32)),
                        ValueError, "initial_state: expected shape [N, H, dk, dv] = (1, 2, 32, 32)"),
    "initial_state vk shape": (_base4, lambda a: a.update(initial_state=np.zeros((2, 2, 32, 16), np.float32),
                                                          state_layout="vk"),
                               ValueError, "initial_state: expected shape [N, H, dv, dk] = (2, 2, 32, 32) "
                               "for state_layout='vk', got (2, 2, 32, 16)"),
    "cu_seqlens_cpu decreasing": (_base, lambda a: a.update(cu_seqlens=np.array([0, 40, 30, 64], np.int32),
                                                            cu_seqlens_cpu=np.array([0, 40, 30, 64])), ValueError,
                                  "cu_seqlens_cpu: expected a host copy of cu_seqlens (4 entries, 0 first, "
                                  "non-decreasing, T=64 last), got [0, 40, 30, 64] (4 entries)"),
    "cu_seqlens_cpu past T": (_base, lambda a: a.update(cu_seqlens=np.array([0, 40, 64], np.int32),
                                                        cu_seqlens_cpu=np.array([0, 40, 70])), ValueError,
                              "cu_seqlens_cpu: expected a host copy of cu_seqlens (3 entries, 0 first, "
                              "non-decreasing, T=64 last), got [0, 40, 70]"),
    "cu_seqlens_cpu without cu_seqlens": (_base, lambda a: a.update(cu_seqlens_cpu=np.array([0, 64])), ValueError,
                                          "cu_seqlens_cpu: expected only with cu_seqlens (a host copy of it), "
                                          "got one without cu_seqlens"),
    "cu_seqlens_cpu entries": (_base, lambda a: a.update(cu_seqlens=np.array([0, 40, 64], np.int32),
                                                         cu_seqlens_cpu=np.array([0, 64])), ValueError,
                               "cu_seqlens_cpu: expected a host copy of cu_seqlens (3 entries"),
    "cu_seqlens_cpu one entry": (_base, lambda a: a.update(cu_seqlens=np.array([0, 64], np.int32),
                                                           cu_seqlens_cpu=np.array([0])), ValueError,
                                 "cu_seqlens_cpu: expected a host copy of cu_seqlens (2 entries"),
    "cu_seqlens_cpu floats": (_base, lambda a: a.update(cu_seqlens=np.array([0, 64], np.int32),
                                                        cu_seqlens_cpu=np.array([0.0, 64.0])), ValueError,
                              "cu_seqlens_cpu: expected a 1-D integer host copy of cu_seqlens (2 entries), "
                              "got shape (2,), dtype float64"),
    # FLA's keywords
    "chunk_size": (_base, lambda a: a.update(chunk_size=128), ValueError, "chunk_size: expected 16, 32 or 64, got 128"),
    "transpose_state_layout and state_v_first": (_base, lambda a: a.update(transpose_state_layout=True,
                                                                           state_v_first=True), ValueError,
                                                 "transpose_state_layout: expected None with state_v_first=True"),
    "gate in kernel without g": (_base, lambda a: a.update(g=None, use_gate_in_kernel=True,
                                                           A_log=np.zeros(2, np.float32)), ValueError,
                                 "g: expected a tensor with use_gate_in_kernel=True, got None"),
    "gate in kernel without A_log": (_base, lambda a: a.update(use_gate_in_kernel=True), ValueError,
                                     "A_log: expected a tensor with use_gate_in_kernel=True, got None"),
    "A_log heads": (_base, lambda a: a.update(use_gate_in_kernel=True, A_log=np.zeros(3, np.float32)), ValueError,
                    "A_log: expected shape (2,) (one value per output head, max(Hq, Hv)) with use_gate_in_kernel=True, "
                    "got (3,)"),
    "A_log a list": (_base, lambda a: a.update(use_gate_in_kernel=True, A_log=[0.0, 0.0]), TypeError,
                     "A_log: expected a tensor with use_gate_in_kernel=True, got list"),
    "q a list with l2norm": (_base, lambda a: a.update(q=[0.0], use_qk_l2norm_in_kernel=True), TypeError,
                             "q: expected a torch tensor, a NumPy array or an array-API array, got list"),
    "dt_bias heads": (_base, lambda a: a.update(use_gate_in_kernel=True, A_log=np.zeros(2, np.float32),
                                                dt_bias=np.zeros(1, np.float32)), ValueError,
                      "dt_bias: expected shape (2,) (one value per output head, max(Hq, Hv)) with "
                      "use_gate_in_kernel=True, got (1,)"),
    # options
    "gate": (_base, lambda a: a.update(gate="exp"), ValueError, "gate: expected 'log' or 'linear', got 'exp'"),
    "state_layout": (_base, lambda a: a.update(state_layout="kk"), ValueError,
                     "state_layout: expected 'kv' ([N, H, dk, dv]) or 'vk' ([N, H, dv, dk]), got 'kk'"),
    "scale nan": (_base, lambda a: a.update(scale=float("nan")), ValueError, "scale: expected a finite number"),
    "scale beyond float32": (_base, lambda a: a.update(scale=1e39), ValueError,
                             "scale: expected a finite number (float32), got 1e+39"),
    "scale below float32": (_base, lambda a: a.update(scale=1e-60), ValueError,
                            "scale: expected 0 or a magnitude float32 keeps (>= 1.4e-45), got 1e-60"),
    "segments float": (_base, lambda a: a.update(segments=2.0), TypeError,
                       "segments: expected an int or None, got float"),
    "segments beyond int64": (_base, lambda a: a.update(segments=2**70), ValueError,
                              "segments: expected an int in the 64-bit range, got 1180591620717411303424"),
    "max_seq_len beyond int64": (_base, lambda a: a.update(max_seq_len=-2**70), ValueError,
                                 "max_seq_len: expected an int in the 64-bit range"),
    "split_decay_cutoff huge int": (_base, lambda a: a.update(split_decay_cutoff=2**2000), ValueError,
                                    "split_decay_cutoff: expected a finite number, got 1148130695274254524"),
    "split_decay_cutoff str": (_base, lambda a: a.update(split_decay_cutoff="0.1"), TypeError,
                               "split_decay_cutoff: expected a float or None, got str"),
    "split_decay_cutoff 1": (_base, lambda a: a.update(split_decay_cutoff=1.0), ValueError,
                             "split_decay_cutoff: expected a value in [0, 1) (0: exact), got 1.0"),
    # NumPy arrays that DLPack cannot carry: the reason, not "expected a NumPy array"
    "q big-endian": (_base, lambda a: a.update(q=a["q"].astype(">f2")), TypeError,
                     "q: expected a NumPy array of native byte order, a supported dtype and strides in whole "
                     "elements, got dtype >f2"),
    "beta big-endian": (_base, lambda a: a.update(beta=a["beta"].astype(">f4")), TypeError,
                        "beta: expected a NumPy array of native byte order"),
    # head counts that do not fit a C int are refused, not truncated
    "q batch of 0": (_base4, lambda a: a.update(q=a["q"][:0], k=a["k"][:0], v=a["v"][:0], g=a["g"][:0],
                                                beta=a["beta"][:0]), ValueError,
                     "q: expected a batch size B >= 1 in [B, T, H, K], got B=0 (shape (0, 32, 2, 32))"),
    "q 2^32+2 heads": (_base, lambda a: a.update(q=np.lib.stride_tricks.as_strided(
        a["q"], (64, 2**32 + 2, 32), (a["q"].strides[0], 2, 2))), ValueError,
        "q: expected at most 2^31-1 heads, got 4294967298"),
}


# Layouts the kernels cannot read in place: copied to dense tensors first (as FLA's input_guard
# does), the result that of the dense call.
COPIED = {
    "initial_state transposed": (_base, lambda a: a.update(
        initial_state=np.ascontiguousarray(np.random.default_rng(3).standard_normal((1, 2, 32, 32)).astype(np.float32)
                                           .transpose(0, 1, 3, 2)).transpose(0, 1, 3, 2))),
    "q last dim strided": (_base, lambda a: a.update(q=np.repeat(a["q"], 2, axis=-1)[..., ::2])),
    "k negative token stride": (_base, lambda a: a.update(k=np.ascontiguousarray(a["k"][::-1])[::-1])),
    "g broadcast": (_base, lambda a: a.update(g=np.broadcast_to(a["g"][:1], (64, 2)))),
    "beta broadcast heads": (_base, lambda a: a.update(beta=np.broadcast_to(a["beta"][:, :1], (64, 2)))),
    "q batch not flattenable": (_base4, lambda a: a.update(q=np.concatenate([a["q"], a["q"]], axis=1)[:, :32])),
    "cu_seqlens strided": (_base, lambda a: a.update(cu_seqlens=np.array([0, 9, 64, 9], np.int32)[::2])),
    "v misaligned": (_base, lambda a: a.update(v=np.frombuffer(
        np.concatenate([np.zeros(1, np.float16), a["v"].ravel()]).tobytes(), np.float16, offset=2).reshape(64, 2, 32))),
}


@pytest.mark.parametrize("case", list(COPIED), ids=list(COPIED))
def test_layout_copied(rng, case):
    make, mutate = COPIED[case]
    args = make(rng)
    mutate(args)
    args["output_final_state"] = True
    dense = {k: np.ascontiguousarray(x) if isinstance(x, np.ndarray) else x for k, x in args.items()}
    assert any(not (isinstance(x, np.ndarray) and x.flags.c_contiguous) for x in args.values()) or case == "v misaligned"
    o, st = gdnkit.chunk_gated_delta_rule(**args)
    o_d, st_d = gdnkit.chunk_gated_delta_rule(**dense)
    assert np.array_equal(o, o_d) and np.array_equal(st, st_d)
    B, T = (1, o.shape[0]) if o.ndim == 3 else o.shape[:2]
    packed = [np.asarray(dense[n], np.float64).reshape((B * T,) + dense[n].shape[o.ndim - 2:])
              for n in ("q", "k", "v", "g", "beta")]
    cu = dense["cu_seqlens"] if "cu_seqlens" in dense else np.arange(B + 1) * T
    ro, rs = reference(*packed, None, dense.get("initial_state"), cu)
    assert_o_close(o.astype(np.float64).reshape(ro.shape), ro)
    assert_state_close(st, rs)


def test_gate_and_state_dtypes_converted(rng):
    # FLA takes gates and initial states of any floating dtype (its kernels read them as float32).
    q, k, v, g, beta = _small(rng)
    h0 = rng.standard_normal((1, 2, q.shape[-1], v.shape[-1])).astype(np.float16)
    o, st = gdnkit.chunk_gated_delta_rule(q, k, v, g.astype(np.float16), beta, initial_state=h0,
                                          output_final_state=True)
    o32, st32 = gdnkit.chunk_gated_delta_rule(q, k, v, g.astype(np.float16).astype(np.float32), beta,
                                              initial_state=h0.astype(np.float32), output_final_state=True)
    assert st.dtype == np.float32 and np.array_equal(o, o32) and np.array_equal(st, st32)


def test_numpy_bfloat16_gates_and_state_converted(rng):
    # ml_dtypes' bfloat16 (dtype kind "V") is a floating dtype too.
    ml_dtypes = pytest.importorskip("ml_dtypes")
    q, k, v, g, beta = _small(rng)
    h0 = rng.standard_normal((1, 2, q.shape[-1], v.shape[-1])).astype(ml_dtypes.bfloat16)
    gb = g.astype(ml_dtypes.bfloat16)
    o, st = gdnkit.chunk_gated_delta_rule(q, k, v, gb, beta, initial_state=h0, output_final_state=True)
    o32, st32 = gdnkit.chunk_gated_delta_rule(q, k, v, gb.astype(np.float32), beta,
                                              initial_state=h0.astype(np.float32), output_final_state=True)
    assert np.array_equal(o, o32) and np.array_equal(st, st32)


def test_gate_in_kernel_gqa(rng):
    # GQA (Hq = 2 Hv): gates, A_log and dt_bias have max(Hq, Hv) = Hq output heads.
    T, dk, dv = 40, 32, 32
    q, k, v, g, beta = make_inputs(rng, (T,), 4, 2, 2, dk, dv)
    a = rng.standard_normal((T, 4)).astype(np.float32)
    A_log = rng.standard_normal(4).astype(np.float32)
    dt_bias = rng.standard_normal(4).astype(np.float32)
    o, _ = gdnkit.chunk_gated_delta_rule(q, k, v, a, beta, use_gate_in_kernel=True, A_log=A_log, dt_bias=dt_bias)
    g_ref = (-np.exp(A_log) * np.logaddexp(a + dt_bias, 0)).astype(np.float32)
    o_ref, _ = gdnkit.chunk_gated_delta_rule(q, k, v, g_ref, beta)
    np.testing.assert_allclose(o.astype(np.float64), o_ref.astype(np.float64), rtol=1e-3, atol=1e-4)


def test_fla_chunk_size_and_old_state_name(rng):
    q, k, v, g, beta = _small(rng)
    o, st = gdnkit.chunk_gated_delta_rule(q, k, v, g, beta, output_final_state=True, state_v_first=True)
    for kw in (dict(chunk_size=16, state_v_first=True), dict(chunk_size=32, transpose_state_layout=True)):
        o2, st2 = gdnkit.chunk_gated_delta_rule(q, k, v, g, beta, output_final_state=True, **kw)
        assert np.array_equal(o, o2) and np.array_equal(st, st2)


@pytest.mark.parametrize("case", list(BAD), ids=list(BAD))
def test_bad_input(rng, case):
    make, mutate, exc, message = BAD[case]
    args = make(rng)
    mutate(args)
    with pytest.raises(exc) as e:
        gdnkit.chunk_gated_delta_rule(**args)
    assert message in str(e.value), str(e.value)


def test_numpy_scalars_as_options(rng):
    # numpy integers and floats work where Python ints and floats do (e.g. max_seq_len=np.diff(cu).max()).
    q, k, v, g, beta = _small(rng)
    cu = np.array([0, 40, 64], np.int64)
    ref, _ = gdnkit.chunk_gated_delta_rule(q, k, v, g, beta, cu_seqlens=cu)
    o, _ = gdnkit.chunk_gated_delta_rule(q, k, v, g, beta, cu_seqlens=cu, max_seq_len=np.diff(cu).max(),
                                         segments=np.int32(1), split_decay_cutoff=np.float32(0.0),
                                         scale=np.float64(32 ** -0.5))
    np.testing.assert_array_equal(o, ref)
    # a cutoff just under 1 is in range, though it rounds to 1 in float64 -> float32
    gdnkit.chunk_gated_delta_rule(q, k, v, g, beta, cu_seqlens=cu, split_decay_cutoff=0.99999999999)


# --------------------------------------------------------------------------------------------
# FLA's keywords (applied with q's framework before the kernel; here NumPy)


def test_fla_keywords_match_their_formulas(rng):
    lengths = [70, 0, 45]
    cu = cu_of(lengths)
    H, dk, dv = 2, 32, 32
    T = sum(lengths)
    q = (3 * rng.standard_normal((T, H, dk))).astype(np.float16)  # not normalised
    k = (0.5 * rng.standard_normal((T, H, dk))).astype(np.float16)
    v = rng.standard_normal((T, H, dv)).astype(np.float16)
    g_raw = rng.standard_normal((T, H)).astype(np.float32)
    beta_raw = rng.standard_normal((T, H)).astype(np.float32)
    A_log = rng.standard_normal(H).astype(np.float32)
    dt_bias = rng.standard_normal(H).astype(np.float32)
    h0 = rng.standard_normal((3, H, dv, dk)).astype(np.float32)
    o, st = gdnkit.chunk_gated_delta_rule(
        q, k, v, g_raw, beta_raw, initial_state=h0, output_final_state=True, cu_seqlens=cu,
        use_qk_l2norm_in_kernel=True, use_beta_sigmoid_in_kernel=True, allow_neg_eigval=True,
        use_gate_in_kernel=True, A_log=A_log, dt_bias=dt_bias, state_v_first=True,
        cu_seqlens_cpu=cu, chunk_indices=np.zeros(3, np.int32))
    assert st.shape == (3, H, dv, dk)  # state_v_first: the vk layout

    def fla_l2norm(x):  # in float32, stored in x's dtype
        xf = x.astype(np.float32)
        return (xf / np.sqrt((xf * xf).sum(-1, keepdims=True) + np.float32(1e-6))).astype(x.dtype)
    qn, kn = fla_l2norm(q), fla_l2norm(k)
    beta = 2 * sigmoid(beta_raw.astype(np.float64))
    g = -np.exp(A_log.astype(np.float64)) * np.logaddexp(0.0, g_raw.astype(np.float64) + dt_bias)
    ro, rs = reference(qn, kn, v, g, beta, None, h0, cu, state_layout="vk")
    assert_o_close(o, ro, atol_frac=1e-3)
    assert_state_close(st.transpose(0, 1, 3, 2), rs)
    # The same inputs given already transformed: the same numbers up to float32 rounding of beta, g.
    o2, _ = gdnkit.chunk_gated_delta_rule(qn, kn, v, g.astype(np.float32), beta.astype(np.float32),
                                          initial_state=h0, cu_seqlens=cu, state_layout="vk")
    np.testing.assert_allclose(o.astype(np.float64), o2.astype(np.float64), rtol=F16_RTOL, atol=1e-3)


@pytest.mark.parametrize("kw, exc, message", [
    (dict(head_first=True), ValueError, "head_first: expected False"),
    (dict(cp_context=object()), ValueError, "cp_context: expected None"),
    (dict(use_gate_in_kernel=True), ValueError, "A_log: expected a tensor with use_gate_in_kernel=True, got None"),
    (dict(use_gate_in_kernel=True, A_log=np.zeros(2, np.float32), gate="linear"), ValueError,
     "gate: expected 'log' with use_gate_in_kernel=True"),
    (dict(allow_neg_eigval=True), ValueError, "allow_neg_eigval: expected use_beta_sigmoid_in_kernel=True"),
    (dict(use_beta_sigmoid_in_kernel=True, beta=None), ValueError,
     "beta: expected a tensor with use_beta_sigmoid_in_kernel=True, got None"),
])
def test_fla_keywords_refused(rng, kw, exc, message):
    q, k, v, g, beta = _small(rng)
    kw = dict(kw)
    beta = kw.pop("beta", beta)
    with pytest.raises(exc) as e:
        gdnkit.chunk_gated_delta_rule(q, k, v, g, beta, **kw)
    assert message in str(e.value)


def test_positional_signature_keeps_cu_seqlens_ninth(rng):
    # (q, k, v, g, beta, scale, initial_state, output_final_state, cu_seqlens), as FLA's older
    # releases and vLLM's copy order them; FLA's newer keywords are keyword-only here.
    q, k, v, g, beta = _small(rng)
    cu = np.array([0, 30, 64], np.int32)
    o1, s1 = gdnkit.chunk_gated_delta_rule(q, k, v, g, beta, None, None, True, cu)
    o2, s2 = gdnkit.chunk_gated_delta_rule(q, k, v, g, beta, output_final_state=True, cu_seqlens=cu)
    np.testing.assert_array_equal(o1, o2)
    assert s1.shape == (2, 2, 32, 32)
    np.testing.assert_array_equal(s1, s2)


def test_reset_gates_forget_exactly(rng):
    # A log gate of -inf (or -1e30) at token t is a full reset: from t on, the output is that of the
    # sequence restarted at t from a zero state, up to rounding (common/gate.h's floor, e^-87).
    q, k, v, g, beta = _small(rng, T=200)
    t = 77
    for reset in (-np.inf, -1e30, -np.finfo(np.float32).max):
        g2 = g.copy()
        g2[t] = reset
        o, _ = gdnkit.chunk_gated_delta_rule(q, k, v, g2, beta, validate=True)
        o_tail, _ = gdnkit.chunk_gated_delta_rule(q[t:], k[t:], v[t:], g2[t:], beta[t:])
        assert np.all(np.isfinite(o.astype(np.float32)))
        np.testing.assert_allclose(o[t:].astype(np.float64), o_tail.astype(np.float64), rtol=F16_RTOL, atol=1e-4)


# --------------------------------------------------------------------------------------------
# Other frameworks and dtypes (skipped where not installed)


def test_numpy_bfloat16(rng):
    ml_dtypes = pytest.importorskip("ml_dtypes")
    bf16 = ml_dtypes.bfloat16
    q, k, v, g, beta = make_inputs(rng, (90,), 2, 2, 2, 32, 32, dtype=bf16, beta_dtype=bf16)
    o, st = gdnkit.chunk_gated_delta_rule(q, k, v, g, beta, output_final_state=True)
    assert o.dtype == bf16 and o.shape == (90, 2, 32)
    ro, rs = reference(q.astype(np.float64), k.astype(np.float64), v.astype(np.float64), g,
                       beta.astype(np.float64), None, None, [0, 90])
    assert_o_close(o.astype(np.float64), ro, rtol=BF16_RTOL, atol_frac=1e-3)
    assert_state_close(st, rs)
    with pytest.raises(TypeError, match="k: expected dtype bfloat16 like q, got float16"):
        gdnkit.chunk_gated_delta_rule(q, k.astype(np.float16), v, g, beta)
    # Byte-swapped bf16 is refused (its uint16 view would be read swapped), like byte-swapped f16.
    swapped = np.dtype(bf16).newbyteorder(">")
    with pytest.raises(TypeError, match="q: expected a NumPy array of native byte order"):
        gdnkit.chunk_gated_delta_rule(q.astype(swapped), k.astype(swapped), v.astype(swapped), g, beta)


@pytest.fixture
def torch():
    return pytest.importorskip("torch")


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_torch_cpu_round_trip(rng, torch, dtype):
    tdt = getattr(torch, dtype)
    lengths = [50, 0, 70]
    q, k, v, g, beta = make_inputs(rng, (120,), 2, 2, 4, 32, 32, dtype=np.float32)
    tq, tk, tv = (torch.from_numpy(x).to(tdt) for x in (q, k, v))
    tg, tb = torch.from_numpy(g), torch.from_numpy(beta).to(tdt)
    cu = torch.tensor(cu_of(lengths, np.int64))
    h0 = torch.from_numpy((0.1 * rng.standard_normal((3, 4, 32, 32))).astype(np.float32))
    o, st = gdnkit.chunk_gated_delta_rule(tq, tk, tv, tg, tb, initial_state=h0, output_final_state=True,
                                          cu_seqlens=cu)
    assert isinstance(o, torch.Tensor) and o.dtype == tdt and o.device.type == "cpu"
    assert tuple(o.shape) == (120, 4, 32)
    assert isinstance(st, torch.Tensor) and st.dtype == torch.float32 and tuple(st.shape) == (3, 4, 32, 32)
    f64 = lambda t: t.to(torch.float64).numpy()  # noqa: E731
    ro, rs = reference(f64(tq), f64(tk), f64(tv), f64(tg), f64(tb), None, h0.numpy(), cu.numpy())
    rtol = F16_RTOL if dtype == "float16" else BF16_RTOL
    assert_o_close(f64(o), ro, rtol=rtol, atol_frac=1e-4 if dtype == "float16" else 1e-3)
    assert_state_close(st.numpy(), rs)
    # Views into a fused projection go through with their strides.
    fused = torch.cat([tq.reshape(120, -1), tk.reshape(120, -1), tv.reshape(120, -1)], dim=1)
    o2, _ = gdnkit.chunk_gated_delta_rule(fused[:, :64].view(120, 2, 32), fused[:, 64:128].view(120, 2, 32),
                                          fused[:, 128:].view(120, 4, 32), tg, tb, initial_state=h0,
                                          cu_seqlens=cu)
    assert torch.equal(o2, o)


def test_torch_exchange_table(rng, torch):
    """Where torch has DLPack's C exchange table the binding uses it (reads, workspace, stream),
    and what it reads agrees with the attribute path (nn.Parameter, which the binding reads
    through its attributes): views with a storage offset and strides. Outputs are torch's own
    allocations (resizable storage, so that record_stream and resize_ work on them), packed, no
    grad."""
    from gdnkit import _gdnkit
    if hasattr(torch.Tensor, "__dlpack_c_exchange_api__"):
        assert _gdnkit._torch_exchange_table()
    T, dk = 70, 32
    q, k, v, g, beta = make_inputs(rng, (T + 5,), 2, 2, 2, dk, dk, dtype=np.float32)
    tq, tk, tv = (torch.from_numpy(x).to(torch.bfloat16)[5:] for x in (q, k, v))  # storage offset 5 tokens
    assert tq.storage_offset() == 5 * 2 * dk
    tg = torch.from_numpy(np.repeat(g, 2, axis=1))[5:, ::2]  # strides (4, 2)
    assert tg.stride() == (4, 2) and torch.equal(tg, torch.from_numpy(g)[5:])
    tb = torch.from_numpy(beta)[5:]
    o, st = gdnkit.chunk_gated_delta_rule(tq, tk, tv, tg, tb, output_final_state=True)
    for x, shape, dtype in ((o, (T, 2, dk), torch.bfloat16), (st, (1, 2, dk, dk), torch.float32)):
        assert type(x) is torch.Tensor and x.dtype == dtype and tuple(x.shape) == shape and x.is_contiguous()
        assert not x.requires_grad and x.storage_offset() == 0
        assert x.untyped_storage().nbytes() == x.numel() * x.element_size()
        assert x.untyped_storage().resizable()  # not wrapped around a foreign buffer (from_blob)
    P = torch.nn.Parameter
    o_attr, st_attr = gdnkit.chunk_gated_delta_rule(P(tq, requires_grad=False), P(tk, requires_grad=False),
                                                    P(tv, requires_grad=False), P(tg, requires_grad=False),
                                                    P(tb, requires_grad=False), output_final_state=True)
    assert torch.equal(o_attr, o) and torch.equal(st_attr, st)
    f64 = lambda t: t.to(torch.float64).numpy()  # noqa: E731
    ro, rs = reference(f64(tq), f64(tk), f64(tv), f64(tg), f64(tb), None, None, [0, T])
    assert_o_close(f64(o), ro, rtol=BF16_RTOL, atol_frac=1e-3)
    assert_state_close(st.numpy(), rs)


def test_torch_negative_view_refused(torch):
    """A tensor with torch's negative bit stores -x as x: it is refused by name, not read as x."""
    c = torch.complex(torch.ones(8, 2), torch.full((8, 2), 0.5))
    g_neg = c.conj().imag  # float32 [8, 2], the negative bit set
    assert g_neg.is_neg()
    q = torch.full((8, 2, 16), 0.25, dtype=torch.float16)
    with pytest.raises(ValueError, match=r"g: expected a tensor without torch's negative bit .*got a negative view"):
        gdnkit.chunk_gated_delta_rule(q, q, q, g_neg)
    o, _ = gdnkit.chunk_gated_delta_rule(q, q, q, g_neg.resolve_neg())
    assert torch.isfinite(o).all()


def test_torch_fla_keywords_match_numpy(rng, torch):
    # The torch branch of FLA's keywords (l2norm, beta sigmoid, gate) against the NumPy branch.
    T, H, dk, dv = 90, 2, 32, 32
    q = (2 * rng.standard_normal((T, H, dk))).astype(np.float16)
    k = rng.standard_normal((T, H, dk)).astype(np.float16)
    v = rng.standard_normal((T, H, dv)).astype(np.float16)
    g = rng.standard_normal((T, H)).astype(np.float32)
    beta = rng.standard_normal((T, H)).astype(np.float32)
    A_log = rng.standard_normal(H).astype(np.float32)
    dt_bias = rng.standard_normal(H).astype(np.float32)
    kw = dict(use_qk_l2norm_in_kernel=True, use_beta_sigmoid_in_kernel=True, allow_neg_eigval=True,
              use_gate_in_kernel=True, output_final_state=True)
    o_np, s_np = gdnkit.chunk_gated_delta_rule(q, k, v, g, beta, A_log=A_log, dt_bias=dt_bias, **kw)
    t = torch.from_numpy
    o_t, s_t = gdnkit.chunk_gated_delta_rule(t(q), t(k), t(v), t(g), t(beta), A_log=t(A_log),
                                             dt_bias=t(dt_bias), **kw)
    np.testing.assert_allclose(o_t.double().numpy(), o_np.astype(np.float64), rtol=F16_RTOL, atol=1e-3)
    np.testing.assert_allclose(s_t.numpy(), s_np, rtol=1e-4, atol=1e-5)


def test_torch_bad_input(rng, torch):
    q = torch.zeros(8, 2, 16, dtype=torch.float16)
    with pytest.raises(TypeError, match="q: expected dtype float16 or bfloat16, got float32"):
        gdnkit.chunk_gated_delta_rule(q.float(), q, q)
    with pytest.raises(TypeError, match="k: expected dtype float16 like q, got bfloat16"):
        gdnkit.chunk_gated_delta_rule(q, q.bfloat16(), q)
    v_strided = torch.randn(8, 2, 32).half()[..., ::2]  # read through a dense copy
    assert torch.equal(gdnkit.chunk_gated_delta_rule(q, q, v_strided)[0],
                       gdnkit.chunk_gated_delta_rule(q, q, v_strided.contiguous())[0])
    with pytest.raises(ValueError, match=r"g: expected H=max\(Hq, Hv\)=2 heads, got 3"):
        gdnkit.chunk_gated_delta_rule(q, q, q, torch.zeros(8, 3))
    with pytest.raises(ValueError, match=r"cu_seqlens\[1\]: expected total_tokens=8, got 7"):
        gdnkit.chunk_gated_delta_rule(q, q, q, cu_seqlens=torch.tensor([0, 7], dtype=torch.int32))
    meta = torch.zeros(8, 2, 16, dtype=torch.float16, device="meta")
    with pytest.raises((RuntimeError, TypeError)):  # no data: not importable, or an unsupported device
        gdnkit.chunk_gated_delta_rule(meta, meta, meta)


def test_torch_requires_grad(rng, torch):
    """gdnkit is forward-only: with inputs that require grad the forward runs and its outputs join
    the graph, but a backward through them raises instead of leaving the inputs without their share
    of the gradient. Under no_grad (and on detached inputs) the outputs are plain tensors."""
    x = torch.randn(8, 1, 16, requires_grad=True)
    q = (0.25 * x).half()  # derived from a leaf that requires grad
    k = torch.full((8, 1, 16), 0.25, dtype=torch.float16)
    g = torch.full((8, 1), -0.1, requires_grad=True)
    o, st = gdnkit.chunk_gated_delta_rule(q, k, k, g, output_final_state=True)
    o2, st2 = gdnkit.chunk_gated_delta_rule(q.detach(), k, k, g.detach(), output_final_state=True)
    assert tuple(o.shape) == (8, 1, 16) and torch.equal(o.detach(), o2) and torch.equal(st.detach(), st2)
    assert o.requires_grad and not o2.requires_grad
    with pytest.raises(RuntimeError, match="gdnkit.chunk_gated_delta_rule: expected no backward pass"):
        (o.float().sum() + x.sum()).backward()
    with torch.no_grad():
        o3, _ = gdnkit.chunk_gated_delta_rule(q, k, k, g)
    assert not o3.requires_grad and torch.equal(o3, o2)
    o4, none = gdnkit.chunk_gated_delta_rule(q, k, k, g)  # no final state: None passes through
    assert none is None and o4.requires_grad
    # Under no_grad, subclasses that require grad (a Tensor subclass, an nn.Parameter subclass) are
    # read like plain tensors: their DLPack export refuses, their detached view does not.
    class Sub(torch.Tensor):
        pass

    class MyParam(torch.nn.Parameter):
        pass

    with torch.no_grad():
        o5, _ = gdnkit.chunk_gated_delta_rule(q.detach().as_subclass(Sub).requires_grad_(), k, k,
                                              MyParam(g.detach().clone()))
    assert torch.equal(o5, o2)


def test_torch_subclass(rng, torch):
    """A subclass of torch.Tensor as q: read through DLPack, outputs allocated like q."""
    class Sub(torch.Tensor):
        pass

    q = torch.randn(20, 2, 16).half()
    o, st = gdnkit.chunk_gated_delta_rule(q.as_subclass(Sub), q, q, output_final_state=True)
    o2, st2 = gdnkit.chunk_gated_delta_rule(q, q, q, output_final_state=True)
    assert isinstance(o, torch.Tensor) and torch.equal(torch.Tensor(o), o2) and torch.equal(torch.Tensor(st), st2)


def test_torch_fla_doc_example_dtypes(rng, torch):
    """FLA's docstring example: bfloat16 gates and a bfloat16 initial state, converted to float32."""
    F = torch.nn.functional
    T, H, K = 40, 2, 32
    q = torch.randn(1, T, H, K, dtype=torch.bfloat16)
    k = F.normalize(torch.randn(1, T, H, K, dtype=torch.bfloat16), p=2, dim=-1)
    v = torch.randn(1, T, H, K, dtype=torch.bfloat16)
    beta = torch.rand(1, T, H, dtype=torch.bfloat16).sigmoid()
    g = F.logsigmoid(torch.rand(1, T, H, dtype=torch.bfloat16))
    h0 = torch.randn(1, H, K, K, dtype=torch.bfloat16)
    o, ht = gdnkit.chunk_gated_delta_rule(q, k, v, g, beta, initial_state=h0, output_final_state=True)
    o32, ht32 = gdnkit.chunk_gated_delta_rule(q, k, v, g.float(), beta, initial_state=h0.float(),
                                              output_final_state=True)
    assert ht.dtype == torch.float32 and torch.equal(o, o32) and torch.equal(ht, ht32)
    # a transposed view of v's heads (FLA makes it contiguous): copied, same result
    vt = v.transpose(1, 2).contiguous().transpose(1, 2)
    assert not vt.is_contiguous()
    o_t, _ = gdnkit.chunk_gated_delta_rule(q, k, vt, g, beta, initial_state=h0)
    assert torch.equal(o_t, o)


# CUDA (torch or CuPy on a machine with a GPU). The CUDA backend computes the chunk products on
# tensor cores with q's dtype as operand type, so intermediate values (not only o) are rounded to
# fp16/bf16: o is held to a few of q's ulps relative to the largest |o|, final states to 1e-3 of
# the largest |S|.
CUDA_TOL = {"float16": dict(rtol=4 * F16_RTOL, atol_frac=2e-3), "bfloat16": dict(rtol=4 * BF16_RTOL, atol_frac=1e-2)}
# Final states: bf16 operands measured ~4.4e-3 of the largest |S| (H200), fp16 below 1e-3.
CUDA_STATE_TOL = {"float16": 2e-3, "bfloat16": 1.5e-2}


@pytest.fixture
def torch_cuda(torch):
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    return torch


CUDA_CASES = {
    "mha-f16-kv-i32": ("float16", (2, 2, 2), 64, 64, "kv", np.int32, False),
    "gva-bf16-vk-i64-h0": ("bfloat16", (1, 1, 4), 128, 128, "vk", np.int64, True),
    "gqa-bf16-kv-h0": ("bfloat16", (4, 2, 2), 128, 64, "kv", np.int32, True),
    "mha-f16-batched": ("float16", (2, 2, 2), 64, 128, "kv", None, False),
}


@pytest.mark.parametrize("case", list(CUDA_CASES), ids=list(CUDA_CASES))
def test_torch_cuda(rng, torch_cuda, case):
    torch = torch_cuda
    dtype, (Hq, Hk, Hv), dk, dv, layout, cu_dtype, with_h0 = CUDA_CASES[case]
    H = max(Hq, Hv)
    tdt = getattr(torch, dtype)
    dev = torch.device("cuda")
    lengths = [100, 0, 64, 130, 1] if cu_dtype is not None else [96] * 3
    T = sum(lengths)
    q, k, v, g, beta = make_inputs(rng, (T,), Hq, Hk, Hv, dk, dv, dtype=np.float32)
    tq, tk, tv = (torch.from_numpy(x).to(dev, tdt) for x in (q, k, v))
    tg, tb = torch.from_numpy(g).to(dev), torch.from_numpy(beta).to(dev)
    shape = (len(lengths), H, dk, dv) if layout == "kv" else (len(lengths), H, dv, dk)
    h0 = torch.from_numpy((0.1 * rng.standard_normal(shape)).astype(np.float32)).to(dev) if with_h0 else None
    kw = dict(initial_state=h0, output_final_state=True, state_layout=layout)
    if cu_dtype is not None:
        cu = torch.from_numpy(cu_of(lengths, cu_dtype)).to(dev)
        o, st = gdnkit.chunk_gated_delta_rule(tq, tk, tv, tg, tb, cu_seqlens=cu, **kw)
    else:
        B, L = len(lengths), lengths[0]
        o, st = gdnkit.chunk_gated_delta_rule(*(x.reshape((B, L) + x.shape[1:]) for x in (tq, tk, tv, tg, tb)), **kw)
        o = o.reshape(T, H, dv)
    assert o.device == tq.device and o.dtype == tdt and tuple(o.shape) == (T, H, dv)
    assert st.device == tq.device and st.dtype == torch.float32 and tuple(st.shape) == shape
    f64 = lambda t: t.to(torch.float64).cpu().numpy()  # noqa: E731
    ro, rs = reference(f64(tq), f64(tk), f64(tv), f64(tg), f64(tb), None,
                       None if h0 is None else h0.cpu().numpy(), cu_of(lengths), state_layout=layout)
    st_kv = f64(st) if layout == "kv" else f64(st).transpose(0, 1, 3, 2)
    err_o = np.abs(f64(o) - ro).max() / np.abs(ro).max()
    err_s = np.abs(st_kv - rs).max() / np.abs(rs).max()
    print(f"{case}: max |o - ref| / max |ref| = {err_o:.2e}, state {err_s:.2e}")
    assert_o_close(f64(o), ro, **CUDA_TOL[dtype])
    np.testing.assert_allclose(st_kv, rs, rtol=0, atol=CUDA_STATE_TOL[dtype] * np.abs(rs).max())


@pytest.mark.parametrize(
    "dtype, dk, suffix", [("bfloat16", 128, ""), ("float16", 64, ""), ("bfloat16", 128, "-v64")]
)
def test_torch_cuda_fused_kernel(rng, torch_cuda, dtype, dk, suffix):
    """The fused SM90 kernel (128 or 64 value columns per CTA) required by name agrees with the
    fp64 oracle within the CUDA tolerances, and with the planner's kernel; off compute capability
    9.0 it is refused."""
    torch = torch_cuda
    dev = torch.device("cuda")
    tdt = getattr(torch, dtype)
    name = f"cuda-fused-sm90-{'bf16' if dtype == 'bfloat16' else 'f16'}-k{dk}{suffix}"
    lengths = [130, 0, 64, 65, 3]
    T = sum(lengths)
    q, k, v, g, beta = make_inputs(rng, (T,), 1, 1, 2, dk, 128, dtype=np.float32)
    tq, tk, tv = (torch.from_numpy(x).to(dev, tdt) for x in (q, k, v))
    tg, tb = torch.from_numpy(g).to(dev), torch.from_numpy(beta).to(dev)
    cu = torch.from_numpy(cu_of(lengths)).to(dev)
    h0 = torch.from_numpy((0.1 * rng.standard_normal((len(lengths), 2, dk, 128))).astype(np.float32)).to(dev)
    kw = dict(initial_state=h0, output_final_state=True, cu_seqlens=cu)
    if torch.cuda.get_device_capability(dev) != (9, 0):
        with pytest.raises(RuntimeError, match="^kernel: expected"):
            gdnkit.chunk_gated_delta_rule(tq, tk, tv, tg, tb, kernel=name, **kw)
        return
    o, st = gdnkit.chunk_gated_delta_rule(tq, tk, tv, tg, tb, kernel=name, **kw)
    o_plan, st_plan = gdnkit.chunk_gated_delta_rule(tq, tk, tv, tg, tb, **kw)
    f64 = lambda t: t.to(torch.float64).cpu().numpy()  # noqa: E731
    ro, rs = reference(f64(tq), f64(tk), f64(tv), f64(tg), f64(tb), None, h0.cpu().numpy(), cu_of(lengths))
    assert_o_close(f64(o), ro, **CUDA_TOL[dtype])
    np.testing.assert_allclose(f64(st), rs, rtol=0, atol=CUDA_STATE_TOL[dtype] * np.abs(rs).max())
    # The planner's kernel here is the split path (sequences under two chunks on average): the
    # two round slightly differently (the fused kernel folds the decay into A before the
    # inverse) and agree far inside the oracle tolerance.
    assert np.abs(f64(o) - f64(o_plan)).max() <= CUDA_TOL[dtype]["rtol"] * np.abs(ro).max()
    assert np.abs(f64(st) - f64(st_plan)).max() <= CUDA_STATE_TOL[dtype] * np.abs(rs).max()


def test_torch_cuda_stream_and_checks(rng, torch_cuda):
    torch = torch_cuda
    dev = torch.device("cuda")
    q, k, v, g, beta = make_inputs(rng, (200,), 2, 2, 2, 64, 64)
    tq, tk, tv, tg, tb = (torch.from_numpy(x).to(dev) for x in (q, k, v, g, beta))
    cu = torch.tensor([0, 80, 200], dtype=torch.int32, device=dev)
    o_default, _ = gdnkit.chunk_gated_delta_rule(tq, tk, tv, tg, tb, cu_seqlens=cu)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):  # runs on s, allocates on s
        o_side, _ = gdnkit.chunk_gated_delta_rule(tq, tk, tv, tg, tb, cu_seqlens=cu)
    s.synchronize()
    assert torch.equal(o_side, o_default)
    # The private entry point with an explicit stream: torch's current one runs, another is refused
    # by name (torch's allocator would hand the scratch back for reuse on its own stream).
    from gdnkit._gdnkit import _forward
    args = (tq, tk, tv, tg, tb, None, None, False, cu, "log", "kv", False)
    o_cur, _ = _forward(*args, torch.cuda.current_stream().cuda_stream, None, None, None, None)
    assert torch.equal(o_cur, o_default)
    with pytest.raises(ValueError, match=rf"stream: expected None or torch's current stream on q's device "
                                         rf"\({torch.cuda.current_stream().cuda_stream}; .*got {s.cuda_stream}"):
        _forward(*args, s.cuda_stream, None, None, None, None)
    with pytest.raises(ValueError, match=r"cu_seqlens: expected a tensor on q's device \(cuda:0\), got cpu"):
        gdnkit.chunk_gated_delta_rule(tq, tk, tv, tg, tb, cu_seqlens=cu.cpu())
    bad = torch.tensor([0, 120, 80, 200], dtype=torch.int64, device=dev)
    with pytest.raises(ValueError, match=r"cu_seqlens\[2\]: expected a non-decreasing value >= 120, got 80"):
        gdnkit.chunk_gated_delta_rule(tq, tk, tv, tg, tb, cu_seqlens=bad, validate=True)
    g_nan = tg.clone()
    g_nan[7, 1] = float("nan")
    with pytest.raises(ValueError, match=r"g\[7, 1\]: expected a log-space gate <= 0 \(or -inf\), got nan"):
        gdnkit.chunk_gated_delta_rule(tq, tk, tv, g_nan, tb, cu_seqlens=cu, validate=True)
    # A head dim the CUDA backend has no kernel for: a RuntimeError from the planner.
    q48 = torch.zeros(16, 1, 48, dtype=torch.float16, device=dev)
    with pytest.raises(RuntimeError, match="^q, k head dim: expected 64 or 128"):
        gdnkit.chunk_gated_delta_rule(q48, q48, torch.zeros(16, 1, 64, dtype=torch.float16, device=dev))


def test_cupy_cuda(rng):
    cupy = pytest.importorskip("cupy")
    try:
        if cupy.cuda.runtime.getDeviceCount() == 0:
            pytest.skip("no CUDA device")
    except cupy.cuda.runtime.CUDARuntimeError:
        pytest.skip("no CUDA device")
    q, k, v, g, beta = make_inputs(rng, (150,), 2, 2, 2, 64, 64)
    cu = cu_of([50, 100])
    o, st = gdnkit.chunk_gated_delta_rule(*(cupy.asarray(x) for x in (q, k, v, g, beta)),
                                          cu_seqlens=cupy.asarray(cu), output_final_state=True)
    assert isinstance(o, cupy.ndarray) and o.dtype == np.float16 and isinstance(st, cupy.ndarray)
    ro, rs = reference(q, k, v, g, beta, None, None, cu)
    assert_o_close(cupy.asnumpy(o), ro, **CUDA_TOL["float16"])
    np.testing.assert_allclose(cupy.asnumpy(st), rs, rtol=0, atol=CUDA_STATE_TOL["float16"] * np.abs(rs).max())
