#!/usr/bin/env python3
"""Host time of one Python call of gdnkit, several variants alternated in one process.

    PYTHONPATH=build-gpu/python python3 bench/python_host_probe.py [--reps 600] [--side-stream]

Times the call itself (the GPU work is queued, then waited for outside the timed span) for the
split row qwen35tp8-2x8-b1-t8192 as the planner runs it, a packed batch's split (qwen35tp8-2x8-
varlen-n3-t16384) (also with the binding's plan cache
emptied before each call, as for a problem it has not seen), unsplit (segments=1) and with the
max_seq_len hint, for fixed-b1-t512, the binding's _forward alone, the torch pieces of a call as
torch's Python API gives them (allocations, the stream query, reading five tensors' attributes:
what the binding pays where torch has no DLPack C exchange table), and one torch launch
(x.add_(1)) as the machine's yardstick; prints the medians."""
import argparse
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench  # noqa: E402

bench.torch = torch
import gdnkit  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=600)
    ap.add_argument("--side-stream", action="store_true",
                    help="make a created stream torch's current one first (default: torch's default stream, "
                         "the legacy one)")
    args = ap.parse_args()
    if args.side_stream:
        torch.cuda.set_stream(torch.cuda.Stream())
    split = bench.make_inputs(dict(lens=[8192], Hq=2, Hk=2, Hv=8, dk=128, dv=128), seed=7)
    small = bench.make_inputs(dict(lens=[512], Hq=64, Hk=64, Hv=64, dk=128, dv=128), seed=7)
    packed = bench.make_inputs(dict(lens=[9000, 5000, 2384], Hq=2, Hk=2, Hv=8, dk=128, dv=128), seed=7)
    y = torch.zeros(1024, device="cuda")

    def call(x, **kw):
        return lambda: gdnkit.chunk_gated_delta_rule(x["q"], x["k"], x["v"], g=x["g"], beta=x["beta"],
                                                     cu_seqlens=x["cu_seqlens"], **kw)
    from gdnkit import _gdnkit
    q = split["q"]
    raw_stream = torch._C._cuda_getCurrentRawStream

    # The binding asks torch for the current stream itself (stream None); builds before it had the
    # caller pass it.
    asks_torch = hasattr(_gdnkit, "_torch_exchange_table")

    def forward(x, segments=None):  # the binding alone, without the Python wrapper
        return lambda: _gdnkit._forward(x["q"], x["k"], x["v"], x["g"], x["beta"], None, None, False,
                                        x["cu_seqlens"], "log", "kv", False, None if asks_torch else raw_stream(0),
                                        None, segments, None, None)
    print(f"torch {torch.__version__}; {gdnkit.__file__}; the binding reads torch tensors through DLPack's C "
          f"exchange table: {asks_torch and _gdnkit._torch_exchange_table()}")
    clear = getattr(_gdnkit, "_plan_cache_clear", lambda: None)

    def new_plan(fn):  # the binding's plan cache emptied first (a problem it has not seen; ~0.1 us)
        return lambda: (clear(), fn())
    variants = {"tp8-t8192, planner (split)": call(split),
                "tp8-t8192, split, new plan": new_plan(call(split)),
                "tp8-t8192, segments=1": call(split, segments=1),
                "tp8-t8192, max_seq_len": call(split, max_seq_len=8192),
                "tp8 n3-t16384 (packed split)": call(packed),
                "fixed-b1-t512": call(small),
                "fixed-b1-t512, new plan": new_plan(call(small)),
                "tp8-t8192 _forward (split)": forward(split),
                "tp8-t8192 _forward unsplit": forward(split, 1),
                "fixed-b1-t512 _forward": forward(small),
                # the pieces of a call that are torch's
                "o: q.new_empty (16 MB)": lambda: q.new_empty((8192, 8, 128)),
                "workspace: new_empty (26 MB)": lambda: q.new_empty((26 << 20,), dtype=torch.uint8),
                "current stream query": lambda: raw_stream(0),
                "5 tensors' attributes": lambda: [(t.dtype, t.shape, t.stride(), t.is_cuda, t.data_ptr(), t.get_device())
                                                  for t in (split["q"], split["k"], split["v"], split["g"], split["beta"])],
                "torch x.add_(1)": lambda: y.add_(1)}
    times = {k: [] for k in variants}
    # The rows that empty the plan cache in a loop of their own, after the others: in one loop they
    # would make every other row plan anew (and, for a split, capture its graph at the next call).
    steady = [k for k in variants if "new plan" not in k]
    for group in (steady, [k for k in variants if k not in steady]):
        for k in group:
            for _ in range(3):  # a split plan's graph is captured at its second call
                variants[k]()
        torch.cuda.synchronize()
        for _ in range(args.reps):
            for k in group:
                t0 = time.perf_counter()
                variants[k]()
                times[k].append(time.perf_counter() - t0)
                torch.cuda.synchronize()
    for k, v in times.items():
        print(f"{k:28s} {1e6 * statistics.median(v):7.1f} us")


if __name__ == "__main__":
    main()
