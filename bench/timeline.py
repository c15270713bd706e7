#!/usr/bin/env python3
"""Summarises the fused kernel's phase stamps (builds with -DGDNKIT_FUSED_TIMELINE; fused_sm90.cuh).

Reads the "TL launch cta t0 .. t6 chunks" lines of one process (stdin or files) and prints, per
launch, the kernel's span (first CTA start to last CTA exit) and each phase's time from the first
CTA's start, as the median and maximum over CTAs, in microseconds; then the gap between the two
launches (launch 6's first start minus launch 5's last exit; negative where they overlap).

    bench_gdnkit --only fixed-b2-t512 --reps 3 | python3 bench/timeline.py
"""
import fileinput
import statistics

NAMES = {1: "prologue end", 3: "step 0 begins", 4: "last step done", 5: "aux done", 6: "exit"}


def main():
    launches = {}
    for line in fileinput.input():
        f = line.split()
        if len(f) != 11 or f[0] != "TL":
            continue
        launches.setdefault(int(f[1]), []).append([int(x) for x in f[3:11]])
    span = {}
    for k in sorted(launches):
        ctas = launches[k]
        t0 = min(c[0] for c in ctas)
        end = max(c[6] for c in ctas)
        span[k] = (t0, end)
        chunks = [c[7] for c in ctas]
        print(f"launch {k}: {len(ctas)} CTAs, span {(end - t0) / 1e3:.2f} us, chunks per CTA "
              f"median {statistics.median(chunks):.0f} max {max(chunks)}")
        print(f"  CTA start: median {statistics.median(c[0] - t0 for c in ctas) / 1e3:.2f} "
              f"max {max(c[0] - t0 for c in ctas) / 1e3:.2f} us")
        for i, name in NAMES.items():
            d = [(c[i] - t0) / 1e3 for c in ctas if c[i] > 0]
            if d:
                print(f"  {name:15s} median {statistics.median(d):8.2f} max {max(d):8.2f} us")
        steps = [(c[4] - c[3]) / 1e3 / max(c[7] - 1, 1) for c in ctas if c[3] > 0 and c[7] > 1]
        if steps:
            print(f"  per step after step 0: median {statistics.median(steps):.3f} us")
    if 5 in span and 6 in span:
        print(f"gap launch 5 -> 6: {(span[6][0] - span[5][1]) / 1e3:.2f} us")


if __name__ == "__main__":
    main()
