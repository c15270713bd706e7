"""gdnkit on PyTorch CUDA tensors: against an fp64 recurrence, and side by side with FLA.

Skipped without torch, without a CUDA device, or (for the FLA comparison) without FLA's fla-core.
Each accuracy case prints a line starting with "ACC " (collected by scripts/gpu_check.sh).
"""
import math
import zlib

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)

import gdnkit  # noqa: E402

DEV = "cuda"


def reference_fp64(q, k, v, g, beta, scale, h0, cu):
    """The token recurrence in fp64 on the GPU, all heads at once. q/k/v: [T, H*, D]; heads are
    expanded to H = max(Hq, Hv) (GVA: q/k head h // r). Returns o [T, H, dv], states [N, H, dk, dv]."""
    T, Hq, dk = q.shape
    Hv, dv = v.shape[1], v.shape[2]
    H = max(Hq, Hv)
    q = q.double().repeat_interleave(H // Hq, dim=1)
    k = k.double().repeat_interleave(H // k.shape[1], dim=1)
    v = v.double().repeat_interleave(H // Hv, dim=1)
    a = g.double().exp()
    b = beta.double()
    o = torch.empty(T, H, dv, dtype=torch.float64, device=q.device)
    N = len(cu) - 1
    states = torch.empty(N, H, dk, dv, dtype=torch.float64, device=q.device)
    for n in range(N):
        S = h0[n].double().clone() if h0 is not None else torch.zeros(H, dk, dv, dtype=torch.float64, device=q.device)
        for t in range(int(cu[n]), int(cu[n + 1])):
            S *= a[t][:, None, None]
            u = b[t][:, None] * (v[t] - torch.einsum("hkv,hk->hv", S, k[t]))
            S += k[t][:, :, None] * u[:, None, :]
            o[t] = scale * torch.einsum("hkv,hk->hv", S, q[t])
        states[n] = S
    return o, states


def rel_l2(x, ref):
    x = x.double()
    err = torch.linalg.vector_norm(x - ref) / torch.linalg.vector_norm(ref)
    return float(err) if torch.isfinite(err) else math.inf


def make_inputs(lens, Hq, Hk, Hv, dk, dv, seed, hard=False, dtype=torch.bfloat16):
    gen = torch.Generator(device=DEV).manual_seed(seed)
    T = sum(lens)
    H = max(Hq, Hv)

    def randn(*s):
        return torch.randn(*s, generator=gen, device=DEV)

    q = torch.nn.functional.normalize(randn(T, Hq, dk), dim=-1).to(dtype)
    k = torch.nn.functional.normalize(randn(T, Hk, dk), dim=-1).to(dtype)
    v = randn(T, Hv, dv).to(dtype)
    if hard:  # almost no decay, strong writes: the state carries everything
        g = -1e-3 * torch.rand(T, H, generator=gen, device=DEV)
        beta = 1.0 - 1e-3 * torch.rand(T, H, generator=gen, device=DEV)
    else:
        g = torch.nn.functional.logsigmoid(randn(T, H))
        beta = torch.sigmoid(randn(T, H))
    h0 = 0.1 * randn(len(lens), H, dk, dv)
    cu = torch.tensor([0] + list(torch.tensor(lens).cumsum(0)), dtype=torch.int32, device=DEV)
    return q, k, v, g.float(), beta.float(), h0, cu


CASES = [
    # name, lens, (Hq, Hk, Hv), hard
    ("mha-varlen", [300, 65, 1, 0, 700], (4, 4, 4), False),
    ("gva-2x", [1000, 64, 63], (2, 2, 4), False),
    ("gqa-2x", [513, 200], (4, 2, 2), False),
    ("mha-long-hard", [4096], (2, 2, 2), True),
]


@pytest.mark.parametrize("name,lens,heads,hard", CASES, ids=[c[0] for c in CASES])
def test_against_fp64(name, lens, heads, hard):
    Hq, Hk, Hv = heads
    q, k, v, g, beta, h0, cu = make_inputs(lens, Hq, Hk, Hv, 128, 128, seed=zlib.crc32(name.encode()) % 1000, hard=hard)
    scale = 128 ** -0.5
    o, ht = gdnkit.chunk_gated_delta_rule(q, k, v, g, beta, scale=scale, initial_state=h0,
                                          output_final_state=True, cu_seqlens=cu)
    ro, rs = reference_fp64(q, k, v, g, beta, scale, h0, cu.tolist())
    eo, es = rel_l2(o, ro), rel_l2(ht, rs)
    print(f"\nACC gdnkit {name:16s} o {eo:.3e} state {es:.3e}")
    # bf16 operands on the tensor cores: ~2^-8 relative per rounding, a few roundings deep.
    assert eo < 2e-2 and es < 2e-2


@pytest.mark.parametrize("segments", [None, 2])
@pytest.mark.parametrize("what", ["q nan", "k nan", "v inf", "g nan", "beta nan"])
def test_non_finite_input_poisons_only_what_depends_on_it(what, segments):
    """As the CPU test of the same name (docs/math.md, "Non-finite inputs"), on the planner's kernel
    and on a split: one head's outputs from the poisoned token on (its own row for q) and its final
    state are all non-finite; rows before the token's chunk, the other head and the other
    sequence are bit for bit the clean run's."""
    lengths, t, chunk0 = [1000, 90], 700, 640
    q, k, v, g, beta, h0, cu = make_inputs(lengths, 2, 2, 2, 128, 128, seed=77)
    args = dict(initial_state=h0, output_final_state=True, cu_seqlens=cu, segments=segments)
    o0, s0 = gdnkit.chunk_gated_delta_rule(q, k, v, g, beta, **args)
    assert torch.isfinite(o0).all() and torch.isfinite(s0).all()
    name, kind = what.split()
    bad = dict(q=q, k=k, v=v, g=g, beta=beta)
    bad[name] = bad[name].clone()
    bad[name][t, 0] = float("nan") if kind == "nan" else float("inf")
    o, st = gdnkit.chunk_gated_delta_rule(bad["q"], bad["k"], bad["v"], bad["g"], bad["beta"], **args)
    torch.cuda.synchronize()
    last = t + 1 if name == "q" else lengths[0]
    assert not torch.isfinite(o[t:last, 0]).any()
    if name == "q":
        assert torch.equal(o[last:lengths[0], 0], o0[last:lengths[0], 0])
        assert torch.equal(st, s0)
    else:
        assert not torch.isfinite(st[0, 0]).any()
        assert torch.equal(st[0, 1], s0[0, 1]) and torch.equal(st[1], s0[1])
    assert torch.equal(o[:chunk0, 0], o0[:chunk0, 0])
    assert torch.equal(o[:, 1], o0[:, 1])
    assert torch.equal(o[lengths[0]:], o0[lengths[0]:])


def test_batched_and_linear_gates_and_vk():
    """[B, T, H, D] input, linear gates, vk state layout: same numbers as the packed log-space call."""
    q, k, v, g, beta, h0, cu = make_inputs([256, 256], 2, 2, 4, 128, 128, seed=3)
    o1, s1 = gdnkit.chunk_gated_delta_rule(q, k, v, g, beta, initial_state=h0, output_final_state=True,
                                           cu_seqlens=cu)
    B = lambda x: x.reshape(2, 256, *x.shape[1:])  # noqa: E731
    o2, s2 = gdnkit.chunk_gated_delta_rule(B(q), B(k), B(v), B(g.exp()), B(beta),
                                           initial_state=h0.transpose(-1, -2).contiguous(),
                                           output_final_state=True, gate="linear", state_layout="vk")
    assert o2.shape == (2, 256, 4, 128)
    assert rel_l2(o2.reshape(o1.shape), o1.double()) < 1e-2
    assert rel_l2(s2.transpose(-1, -2), s1.double()) < 1e-2


def test_fla_keywords_and_reset_gates():
    """FLA's keywords on CUDA tensors (q and k normalised by the call, beta through a sigmoid, the
    gate from A_log and dt_bias) against the fp64 recurrence on the transformed inputs, with a
    -inf log gate (a full reset) in each sequence."""
    q, k, v, g, beta, h0, cu = make_inputs([700, 300], 2, 2, 4, 128, 128, seed=11)
    q, k = 3 * q, 0.5 * k  # not normalised
    A_log = torch.linspace(-2.0, 0.5, 4, device=DEV)
    dt_bias = torch.linspace(-1.0, 1.0, 4, device=DEV)
    o, ht = gdnkit.chunk_gated_delta_rule(q, k, v, g, beta, initial_state=h0, output_final_state=True,
                                          cu_seqlens=cu, use_qk_l2norm_in_kernel=True,
                                          use_beta_sigmoid_in_kernel=True, use_gate_in_kernel=True,
                                          A_log=A_log, dt_bias=dt_bias)
    norm = lambda x: (x.float() * torch.rsqrt(x.float().square().sum(-1, keepdim=True) + 1e-6)).to(x.dtype)  # noqa: E731
    gl = -A_log.exp() * torch.nn.functional.softplus(g + dt_bias)
    ro, rs = reference_fp64(norm(q), norm(k), v, gl, torch.sigmoid(beta), 128 ** -0.5, h0, cu.tolist())
    assert rel_l2(o, ro) < 2e-2 and rel_l2(ht, rs) < 2e-2
    g2 = g.clone()
    g2[200] = -math.inf
    g2[900] = -1e30
    o, ht = gdnkit.chunk_gated_delta_rule(q, k, v, g2, beta, initial_state=h0, output_final_state=True,
                                          cu_seqlens=cu, validate=True)
    ro, rs = reference_fp64(q, k, v, g2, beta, 128 ** -0.5, h0, cu.tolist())
    print(f"\nACC gdnkit {'reset-gates':16s} o {rel_l2(o, ro):.3e} state {rel_l2(ht, rs):.3e}")
    assert rel_l2(o, ro) < 2e-2 and rel_l2(ht, rs) < 2e-2


def test_required_kernel():
    """kernel= runs exactly the named CUDA kernel, or raises; the answer matches the planner's."""
    q, k, v, g, beta, h0, cu = make_inputs([300, 65], 2, 2, 4, 128, 128, seed=5)
    o1, s1 = gdnkit.chunk_gated_delta_rule(q, k, v, g, beta, initial_state=h0, output_final_state=True,
                                           cu_seqlens=cu)
    o2, s2 = gdnkit.chunk_gated_delta_rule(q, k, v, g, beta, initial_state=h0, output_final_state=True,
                                           cu_seqlens=cu, kernel="cuda-split-mma-bf16-k128-w2")
    assert rel_l2(o2, o1.double()) < 1e-2 and rel_l2(s2, s1.double()) < 1e-2
    with pytest.raises(ValueError, match="^kernel: expected"):
        gdnkit.chunk_gated_delta_rule(q, k, v, g, beta, cu_seqlens=cu, kernel="cuda-split-mma-bf16-k128-w3")


def test_segments_split_matches_fp64():
    """segments=k splits long sequences (context parallelism) on H100/H200: same answer as the
    fp64 recurrence and as the unsplit call, with almost no decay (the segments' maps matter)."""
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the split runs on compute capability 9.0")
    q, k, v, g, beta, h0, cu = make_inputs([2000], 2, 2, 4, 128, 128, seed=11, hard=True)
    scale = 128 ** -0.5
    o1, s1 = gdnkit.chunk_gated_delta_rule(q, k, v, g, beta, scale=scale, initial_state=h0,
                                           output_final_state=True, cu_seqlens=cu, segments=1)
    o4, s4 = gdnkit.chunk_gated_delta_rule(q, k, v, g, beta, scale=scale, initial_state=h0,
                                           output_final_state=True, cu_seqlens=cu, segments=6)
    ro, rs = reference_fp64(q, k, v, g, beta, scale, h0, cu.tolist())
    print(f"\nACC gdnkit segments=6 o {rel_l2(o4, ro):.3e} state {rel_l2(s4, rs):.3e}  "
          f"unsplit o {rel_l2(o1, ro):.3e} state {rel_l2(s1, rs):.3e}")
    assert rel_l2(o4, ro) < 2e-2 and rel_l2(s4, rs) < 2e-2
    assert rel_l2(o4, ro) < 1.3 * rel_l2(o1, ro) + 1e-4 and rel_l2(s4, rs) < 1.3 * rel_l2(s1, rs) + 1e-4
    # A packed batch of uneven lengths (read on the device), with an empty sequence.
    q, k, v, g, beta, h0, cu = make_inputs([1800, 0, 300, 900], 2, 2, 4, 128, 128, seed=12, hard=True)
    o3, s3 = gdnkit.chunk_gated_delta_rule(q, k, v, g, beta, scale=scale, initial_state=h0,
                                           output_final_state=True, cu_seqlens=cu, segments=3)
    ro, rs = reference_fp64(q, k, v, g, beta, scale, h0, cu.tolist())
    assert rel_l2(o3, ro) < 2e-2 and rel_l2(s3, rs) < 2e-2


def test_split_decay_cutoff_matches_fp64():
    """split_decay_cutoff= (the decay shortcut) on realistic gates: the exact split's accuracy."""
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the split runs on compute capability 9.0")
    q, k, v, g, beta, h0, cu = make_inputs([3000, 1000], 2, 2, 4, 128, 128, seed=13)
    scale = 128 ** -0.5
    ro, rs = reference_fp64(q, k, v, g, beta, scale, h0, cu.tolist())
    oe, se = gdnkit.chunk_gated_delta_rule(q, k, v, g, beta, scale=scale, initial_state=h0,
                                           output_final_state=True, cu_seqlens=cu, segments=6)
    oc, sc = gdnkit.chunk_gated_delta_rule(q, k, v, g, beta, scale=scale, initial_state=h0,
                                           output_final_state=True, cu_seqlens=cu, segments=6,
                                           split_decay_cutoff=1e-6)
    print(f"\nACC gdnkit segments=6 cutoff 1e-6 o {rel_l2(oc, ro):.3e} state {rel_l2(sc, rs):.3e}  "
          f"exact o {rel_l2(oe, ro):.3e} state {rel_l2(se, rs):.3e}")
    assert rel_l2(oc, ro) < 1.05 * rel_l2(oe, ro) + 1e-5 and rel_l2(sc, rs) < 1.05 * rel_l2(se, rs) + 1e-5


def test_graph_capture_replays_with_new_values():
    q, k, v, g, beta, h0, cu = make_inputs([200, 100], 2, 2, 2, 128, 128, seed=5)
    call = lambda: gdnkit.chunk_gated_delta_rule(q, k, v, g, beta, initial_state=h0,  # noqa: E731
                                                 output_final_state=True, cu_seqlens=cu)
    call()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        o, ht = call()
    q2, k2, v2, g2, beta2, h02, _ = make_inputs([200, 100], 2, 2, 2, 128, 128, seed=6)
    for dst, src in ((q, q2), (k, k2), (v, v2), (g, g2), (beta, beta2), (h0, h02)):
        dst.copy_(src)
    graph.replay()
    torch.cuda.synchronize()
    ro, rs = reference_fp64(q, k, v, g, beta, 128 ** -0.5, h0, cu.tolist())
    assert rel_l2(o, ro) < 2e-2 and rel_l2(ht, rs) < 2e-2


FLA_CASES = [
    ("mha-varlen", [300, 65, 1, 700], (4, 4, 4), False),
    ("gva-2x", [1000, 64, 63], (2, 2, 4), False),
    ("mha-2k", [2048], (4, 4, 4), False),
    ("mha-long-hard", [4096], (2, 2, 2), True),
    ("mha-16k-hard", [16384], (1, 1, 1), True),
]


@pytest.mark.parametrize("name,lens,heads,hard", FLA_CASES, ids=[c[0] for c in FLA_CASES])
def test_accuracy_not_worse_than_fla(name, lens, heads, hard):
    """Relative L2 error against fp64 on identical inputs: gdnkit's may exceed FLA's by 10% at most."""
    fla = pytest.importorskip("fla.ops.gated_delta_rule")
    Hq, Hk, Hv = heads
    q, k, v, g, beta, h0, cu = make_inputs(lens, Hq, Hk, Hv, 128, 128, seed=11 + len(name), hard=hard)
    scale = 128 ** -0.5
    H = max(Hq, Hv)
    o, ht = gdnkit.chunk_gated_delta_rule(q, k, v, g, beta, scale=scale, initial_state=h0,
                                          output_final_state=True, cu_seqlens=cu)
    # FLA gets q/k expanded to H heads (the same math as GVA) in its [1, T, H, D] varlen layout.
    fo, fs = fla.chunk_gated_delta_rule(
        q.repeat_interleave(H // Hq, 1)[None], k.repeat_interleave(H // Hk, 1)[None],
        v.repeat_interleave(H // Hv, 1)[None], g=g[None], beta=beta[None], scale=scale,
        initial_state=h0, output_final_state=True, cu_seqlens=cu.long())
    ro, rs = reference_fp64(q, k, v, g, beta, scale, h0, cu.tolist())
    ours = (rel_l2(o, ro), rel_l2(ht, rs))
    theirs = (rel_l2(fo[0], ro), rel_l2(fs, rs))
    print(f"\nACC vs-fla {name:16s} o gdnkit {ours[0]:.3e} FLA {theirs[0]:.3e}   "
          f"state gdnkit {ours[1]:.3e} FLA {theirs[1]:.3e}")
    assert ours[0] <= 1.1 * theirs[0], f"o: gdnkit {ours[0]:.3e} vs FLA {theirs[0]:.3e}"
    assert ours[1] <= 1.1 * theirs[1], f"state: gdnkit {ours[1]:.3e} vs FLA {theirs[1]:.3e}"
