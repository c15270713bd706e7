#!/usr/bin/env python3
"""Side-by-side benchmark of gdnkit and FLA on the rows of bench/rows.json (one process, one GPU).

For every row, on identical inputs (cuLA's benchmark recipe: q = 0.03 randn, k = 0.01 randn,
v = 0.1 randn in bf16, decay alpha in [0.85, 0.95) passed as log(alpha), beta in [0, 0.5), packed
varlen, no initial state, no final state):
  gdnkit_ms        device time of one gdnkit call: CUDA-graph replays (at least four calls per
                   graph) timed with CUDA events, median of repeats, inputs rotated over enough
                   copies to exceed the L2 cache
  gdnkit_eager_ms  CUDA-event time of one eager Python call, host overhead included (median)
  fla_kernel_ms    sum of FLA's GPU kernel times for one call (torch profiler, median of calls)
  fla_eager_ms     CUDA-event time of one eager FLA call (median)
  floor_ms         max(flops / 785e12, bytes / 4.26e12) as in GDN_MATH.md section 4

Writes bench/results/<gpu>-<date>.json (or --out) and prints a table. --plot draws a PNG.
"""
import argparse
import datetime
import json
import math
import os
import statistics
import subprocess
import sys

torch = None  # imported in main(): --plot-from works without it

HERE = os.path.dirname(os.path.abspath(__file__))
MATMUL_RATE = 785e12   # bf16 dense, measured on an H200 (PEERS.md)
COPY_RATE = 4.26e12    # device copy, bytes read + written
L2_BYTES = 60 << 20


def floor_ms(row):
    t = sum(row["lens"])
    H = max(row["Hq"], row["Hv"])
    dk, dv = row["dk"], row["dv"]
    flops = t * H * (10 * 64 * dk + 6 * dk * dv)
    nbytes = t * (row["Hq"] * dk + row["Hk"] * dk + 2 * H * dv) * 2 + t * H * 6
    return 1e3 * max(flops / MATMUL_RATE, nbytes / COPY_RATE)


def make_inputs(row, seed, device="cuda"):
    g = torch.Generator(device=device).manual_seed(seed)
    T = sum(row["lens"])
    H = max(row["Hq"], row["Hv"])
    bf = torch.bfloat16

    def randn(*shape):
        return torch.randn(*shape, generator=g, device=device, dtype=torch.float32)

    q = (0.03 * randn(1, T, row["Hq"], row["dk"])).to(bf)
    k = (0.01 * randn(1, T, row["Hk"], row["dk"])).to(bf)
    v = (0.1 * randn(1, T, row["Hv"], row["dv"])).to(bf)
    alpha = 0.85 + 0.1 * torch.rand(1, T, H, generator=g, device=device)
    gate = torch.log(alpha).float()
    beta = (0.5 * torch.rand(1, T, H, generator=g, device=device)).float()
    cu = torch.zeros(len(row["lens"]) + 1, dtype=torch.int32, device=device)
    cu[1:] = torch.cumsum(torch.tensor(row["lens"], device=device), 0)
    return dict(q=q, k=k, v=v, g=gate, beta=beta, cu_seqlens=cu)


def input_bytes(x):
    return sum(t.numel() * t.element_size() for t in x.values())


def events_median(fn, reps, warmup=3):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        fn()
        e1.record()
        e1.synchronize()
        times.append(e0.elapsed_time(e1))
    return statistics.median(times)


def graph_device_ms(call, sets, reps, min_calls=4):
    """Captures calls cycling through the input sets (one per set, at least min_calls) into one
    graph, replays it, returns median ms per call. The events around a replay also time the
    replay's launch (several microseconds on a slow host), which at least four calls per graph
    spread, as the C++ driver's four back-to-back launches do: a graph of the one call a row whose
    single input set exceeds the L2 cache gets had added that latency to every call."""
    for x in sets:  # warm up outside capture (first-call work, allocator)
        call(x)
    torch.cuda.synchronize()
    calls = [sets[i % len(sets)] for i in range(max(len(sets), min_calls))]
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        with torch.cuda.graph(graph, stream=stream):
            for x in calls:
                call(x)
    torch.cuda.synchronize()
    ms = events_median(graph.replay, reps)
    return ms / len(calls)


def profiler_kernel_ms(call, x, reps, by_name=None):
    """Sum of GPU kernel times of one call, median over reps calls (host gaps excluded). With a
    dict `by_name`, also fills it with the median time of each kernel, keyed by the first of
    ("prep", "walk") its name contains, else by its name."""
    from torch.profiler import ProfilerActivity, profile
    call(x)
    torch.cuda.synchronize()
    per_call = []
    per_name = {}
    for _ in range(reps):
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            call(x)
            torch.cuda.synchronize()
        total_us = 0.0
        names = {}
        for evt in prof.events():
            if evt.device_type == torch.autograd.DeviceType.CUDA:
                total_us += evt.device_time
                key = next((k for k in ("prep", "walk") if k in evt.name), evt.name[:40])
                names[key] = names.get(key, 0.0) + evt.device_time / 1e3
        per_call.append(total_us / 1e3)
        for k, v in names.items():
            per_name.setdefault(k, []).append(v)
    if by_name is not None:
        by_name.update({k: statistics.median(v) for k, v in per_name.items()})
    return statistics.median(per_call)


def gdnkit_call(gdnkit):
    def call(x):
        return gdnkit.chunk_gated_delta_rule(
            x["q"], x["k"], x["v"], g=x["g"], beta=x["beta"], cu_seqlens=x["cu_seqlens"],
            output_final_state=False)
    return call


def fla_call():
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule

    def call(x):
        return chunk_gated_delta_rule(
            x["q"], x["k"], x["v"], g=x["g"], beta=x["beta"], cu_seqlens=x["cu_seqlens"].long(),
            output_final_state=False)
    return call


def host_overhead_us(gdnkit, x, reps=200, new_plan=False):
    """Host time of one Python call (the GPU work is queued, not waited for). new_plan: the
    binding's plan cache emptied before each call, as for a problem it has not seen."""
    import time
    call = gdnkit_call(gdnkit)
    clear = getattr(gdnkit._gdnkit, "_plan_cache_clear", None) if new_plan else None
    call(x)
    torch.cuda.synchronize()
    samples = []
    for _ in range(reps):
        if clear is not None:
            clear()
        t0 = time.perf_counter()
        call(x)
        samples.append(time.perf_counter() - t0)
        torch.cuda.synchronize()
    return 1e6 * statistics.median(samples)


def git_commit():
    # GDNKIT_COMMIT first: a copied tree's .git may be stale (scripts/gpu_check.sh passes it).
    if os.environ.get("GDNKIT_COMMIT"):
        return os.environ["GDNKIT_COMMIT"]
    try:
        return subprocess.check_output(["git", "rev-parse", "--short", "HEAD"], cwd=HERE, text=True).strip()
    except Exception:
        return "unknown"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default=os.path.join(HERE, "rows.json"))
    ap.add_argument("--suite", default="all", help="cula-28, model or all")
    ap.add_argument("--only", default="", help="comma-separated row names")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--no-fla", action="store_true")
    ap.add_argument("--out", default="")
    ap.add_argument("--plot", default="", help="write a PNG bar chart here")
    ap.add_argument("--cpp-driver", default="", help="path of bench_gdnkit (C++ driver) to merge its numbers")
    ap.add_argument("--plot-from", default="", help="only draw --plot from an existing results JSON")
    args = ap.parse_args()
    if args.plot_from:
        doc = json.load(open(args.plot_from))
        plot(doc["rows"], args.plot, all("fla_kernel_ms" in r for r in doc["rows"]), doc.get("gpu", ""))
        return

    global torch
    import torch as torch_module
    torch = torch_module
    import gdnkit
    rows = json.load(open(args.rows))["rows"]
    if args.suite != "all":
        rows = [r for r in rows if r["suite"] == args.suite]
    if args.only:
        names = set(args.only.split(","))
        rows = [r for r in rows if r["name"] in names]
    fla = None if args.no_fla else fla_call()
    ours = gdnkit_call(gdnkit)

    cpp = {}
    if args.cpp_driver:
        cmd = [args.cpp_driver, "--rows", args.rows, "--json"] + (["--only", args.only] if args.only else [])
        out = subprocess.check_output(cmd, text=True)
        for line in out.splitlines():
            if line.startswith("{"):
                rec = json.loads(line)
                cpp[rec["name"]] = rec

    results = []
    for i, row in enumerate(rows):
        x = make_inputs(row, seed=i)
        nsets = max(1, min(8, math.ceil(3 * L2_BYTES / max(1, input_bytes(x)))))
        sets = [x] + [make_inputs(row, seed=1000 * (i + 1) + j) for j in range(1, nsets)]
        rec = dict(name=row["name"], suite=row["suite"], tokens=sum(row["lens"]), seqs=len(row["lens"]),
                   heads=f'{row["Hq"]}/{row["Hk"]}/{row["Hv"]}', floor_ms=floor_ms(row))
        rec["gdnkit_ms"] = graph_device_ms(ours, sets, args.reps)
        parts = {}
        rec["gdnkit_kernel_ms"] = profiler_kernel_ms(ours, x, 5, parts)
        rec["gdnkit_kernels_ms"] = parts
        rec["gdnkit_eager_ms"] = events_median(lambda: ours(x), args.reps)
        if fla is not None:
            rec["fla_kernel_ms"] = profiler_kernel_ms(fla, x, 5)
            rec["fla_eager_ms"] = events_median(lambda: fla(x), args.reps)
        if row["name"] in cpp:
            rec["gdnkit_cpp_ms"] = cpp[row["name"]]["device_ms"]
            rec["gdnkit_cpp_host_us"] = cpp[row["name"]]["host_us"]
            if "plan_us" in cpp[row["name"]]:  # Plan::create, which a caller that plans every call also pays
                rec["gdnkit_cpp_plan_us"] = cpp[row["name"]]["plan_us"]
            rec["gdnkit_cpp_kernel"] = cpp[row["name"]]["kernel"]
            rec["gdnkit_cpp_input_sets"] = cpp[row["name"]].get("sets", 1)  # rotated call to call
            if "unsplit_ms" in cpp[row["name"]]:  # the planner split the sequences: the same unsplit
                rec["gdnkit_cpp_unsplit_ms"] = cpp[row["name"]]["unsplit_ms"]
                rec["gdnkit_cpp_unsplit_kernel"] = cpp[row["name"]]["unsplit_kernel"]
        results.append(rec)
        del sets, x
        torch.cuda.empty_cache()
        print(f'  {rec["name"]}: gdnkit {rec["gdnkit_ms"]:.3f} ms (' +
              ', '.join(f'{k} {v:.3f}' for k, v in parts.items()) + ')' +
              (f', FLA {rec["fla_kernel_ms"]:.3f} ms' if fla else ''), file=sys.stderr, flush=True)

    smallest = min(rows, key=lambda r: sum(r["lens"]) * max(r["Hq"], r["Hv"]))
    py_host_us = host_overhead_us(gdnkit, make_inputs(smallest, seed=7))
    # And of a call the planner splits (several launches), on the smallest such row.
    split_rows = [row for row, r in zip(rows, results) if "gdnkit_cpp_unsplit_ms" in r]
    split_row = min(split_rows, key=lambda r: sum(r["lens"]) * max(r["Hq"], r["Hv"])) if split_rows else None
    py_split_host_us = host_overhead_us(gdnkit, make_inputs(split_row, seed=7)) if split_row else None
    # The same two calls for a problem the binding's plan cache does not hold (a new shape).
    py_host_new_us = host_overhead_us(gdnkit, make_inputs(smallest, seed=7), new_plan=True)
    py_split_host_new_us = (host_overhead_us(gdnkit, make_inputs(split_row, seed=7), new_plan=True)
                            if split_row else None)

    gpu = torch.cuda.get_device_name().replace(" ", "-").lower()
    today = datetime.date.today().isoformat()
    doc = dict(gpu=torch.cuda.get_device_name(), commit=git_commit(), date=today,
               torch=torch.__version__, python_host_us_smallest_row=py_host_us,
               smallest_row=smallest["name"], python_host_us_split_row=py_split_host_us,
               split_row=split_row["name"] if split_row else None,
               python_host_us_smallest_row_new_plan=py_host_new_us,
               python_host_us_split_row_new_plan=py_split_host_new_us, rows=results)
    out = args.out or os.path.join(HERE, "results", f"{gpu}-{today}.json")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w") as f:
        json.dump(doc, f, indent=1)

    hdr = f'{"row":38s} {"tokens":>7s} {"floor":>7s} {"gdnkit":>7s} {"/floor":>6s} {"eager":>7s}'
    if fla:
        hdr += f' {"FLA":>7s} {"FLAeag":>7s} {"FLA/gk":>6s} {"eag/eag":>7s}'
    print(hdr)
    for r in results:
        line = (f'{r["name"]:38s} {r["tokens"]:7d} {r["floor_ms"]:7.3f} {r["gdnkit_ms"]:7.3f} '
                f'{r["gdnkit_ms"] / r["floor_ms"]:6.2f} {r["gdnkit_eager_ms"]:7.3f}')
        if fla:
            line += (f' {r["fla_kernel_ms"]:7.3f} {r["fla_eager_ms"]:7.3f} {r["fla_kernel_ms"] / r["gdnkit_ms"]:6.2f}'
                     f' {r["fla_eager_ms"] / r["gdnkit_eager_ms"]:7.2f}')
        print(line)
    cula = [r for r in results if r["suite"] == "cula-28"]
    if cula:
        gm = math.exp(sum(math.log(r["gdnkit_ms"] / r["floor_ms"]) for r in cula) / len(cula))
        print(f"cula-28 geomean gdnkit/floor: {gm:.2f}", end="")
        if fla:
            gf = math.exp(sum(math.log(r["fla_kernel_ms"] / r["gdnkit_ms"]) for r in cula) / len(cula))
            slower = [r["name"] for r in results if r["gdnkit_ms"] > r["fla_kernel_ms"]]
            eager_slower = [r["name"] for r in results if r["gdnkit_eager_ms"] > r["fla_eager_ms"]]
            print(f"; FLA kernels / gdnkit: {gf:.2f}x (cula-28); rows where gdnkit device > FLA kernels:"
                  f" {slower or 'none'}; rows where gdnkit eager > FLA eager: {eager_slower or 'none'}", end="")
        print()
    split = [r for r in results if "gdnkit_cpp_unsplit_ms" in r]
    if split:
        print("rows the planner splits (C++ driver, device ms: split / unsplit): " +
              "; ".join(f'{r["name"]} {r["gdnkit_cpp_ms"]:.3f} / {r["gdnkit_cpp_unsplit_ms"]:.3f} '
                        f'({r["gdnkit_cpp_kernel"]})' for r in split))
        worse = [r["name"] for r in split if r["gdnkit_cpp_ms"] > r["gdnkit_cpp_unsplit_ms"]]
        print(f"rows where the split is slower than unsplit: {worse or 'none'}")
    # One Plan::run's host time (enqueue only, the C++ driver's median). A split call through its
    # graph sets the nodes whose arguments changed: all of them where the driver rotates input sets
    # (rows under 3 x L2), none where one set serves every call.
    groups = (("unsplit", lambda r: "gdnkit_cpp_unsplit_ms" not in r),
              ("split, new buffers each call", lambda r: "gdnkit_cpp_unsplit_ms" in r and r["gdnkit_cpp_input_sets"] > 1),
              ("split, the same buffers", lambda r: "gdnkit_cpp_unsplit_ms" in r and r["gdnkit_cpp_input_sets"] == 1))
    spans = []
    for what, member in groups:
        us = [r["gdnkit_cpp_host_us"] for r in results if "gdnkit_cpp_host_us" in r and member(r)]
        if us:
            spans.append(f"{what} {min(us):.1f} to {max(us):.1f} us (median {statistics.median(us):.1f}, {len(us)} rows)")
    if spans:
        print("C++ Plan::run host time: " + "; ".join(spans))
    plans = [r["gdnkit_cpp_plan_us"] for r in results if "gdnkit_cpp_plan_us" in r]
    if plans:
        print(f"C++ Plan::create: {min(plans):.1f} to {max(plans):.1f} us over the rows (median {statistics.median(plans):.1f})")
    print(f"python host time of one call on {smallest['name']}: {py_host_us:.1f} us" +
          (f"; of a split call on {split_row['name']}: {py_split_host_us:.1f} us" if split_row else "") +
          f" (a new problem, planned in the call: {py_host_new_us:.1f}" +
          (f" / {py_split_host_new_us:.1f} us)" if split_row else " us)"))
    print(f"wrote {out}")
    if args.plot:
        try:
            plot(results, args.plot, fla is not None, doc["gpu"])
        except ImportError:
            print("matplotlib is not installed: no plot (draw it later with --plot-from)")


def plot(results, path, with_fla, gpu=""):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    names = [r["name"] for r in results]
    n = len(names)
    width = 0.28
    fig, ax = plt.subplots(figsize=(max(10, 0.45 * n), 5))
    xs = range(n)
    ax.bar([x - width for x in xs], [r["gdnkit_ms"] for r in results], width, label="gdnkit (device)")
    if with_fla:
        ax.bar(list(xs), [r["fla_kernel_ms"] for r in results], width, label="FLA (kernels)")
    ax.bar([x + width for x in xs], [r["floor_ms"] for r in results], width, label="floor")
    ax.set_yscale("log")
    ax.set_ylabel("ms (log scale)")
    ax.set_title(f"GDN prefill, device time per call{' on ' + gpu if gpu else ''}")
    ax.set_xticks(list(xs))
    ax.set_xticklabels(names, rotation=75, fontsize=7)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
