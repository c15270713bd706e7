#!/usr/bin/env python3
"""Summarises the fused kernel's phase stamps (builds with -DGDNKIT_FUSED_TIMELINE; fused_sm90.cuh).

Reads the "TL launch cta t0 .. t47" lines of one process (stdin or files) and prints, per
launch, the kernel's span (first CTA start to last CTA exit) and each phase's time from the first
CTA's start, as the median and maximum over CTAs, in microseconds; then, for the eight chunks
stamped step by step (from GDNKIT_TIMELINE_J0), medians over CTAs of: the step's start after the
previous one's, its length (past FULL to done), the wait at FULL (past FULL minus the previous
step done: the walk waiting for the record) and the record's lead (past FULL minus the aux's
record formed); then the gap between the two launches (launch 6's first start minus launch 5's
last exit; negative where they overlap).

    GDNKIT_TIMELINE_J0=0 bench_gdnkit --only fixed-b2-t512 --reps 3 | python3 bench/timeline.py
"""
import fileinput
import statistics

NAMES = {1: "prologue end", 3: "step 0 begins", 4: "last step done", 5: "aux done", 6: "exit"}


def main():
    launches = {}
    for line in fileinput.input():
        f = line.split()
        if len(f) < 51 or f[0] != "TL":  # (a GDNKIT_STEP_MARKS build appends its marks)
            continue
        launches.setdefault(int(f[1]), []).append([int(x) for x in f[3:51]])
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
        # Step 0's start to the last step's end spans all the CTA's steps (dividing by n - 1 had
        # overstated the short rows' steps).
        steps = [(c[4] - c[3]) / 1e3 / c[7] for c in ctas if c[3] > 0 and c[7] > 0]
        if steps:
            print(f"  per step (step 0 begun to last step done, over the chunks): median {statistics.median(steps):.3f} us")
        med = lambda v: f"{statistics.median(v) / 1e3:6.2f}" if v else "     -"
        rows = []
        for k in range(8):
            ok = [c for c in ctas if c[8 + k] > 0]
            start = [c[8 + k] - c[7 + k] for c in ok if k > 0 and c[7 + k] > 0]
            length = [c[16 + k] - c[8 + k] for c in ok if c[16 + k] > 0]
            wait = [c[8 + k] - c[15 + k] for c in ok if k > 0 and c[15 + k] > 0]
            lead = [c[8 + k] - c[24 + k] for c in ok if c[24 + k] > 0]
            if ok:
                rows.append(f"  chunk +{k}: after previous {med(start)}  length {med(length)}  "
                            f"FULL wait {med(wait)}  record lead {med(lead)} us ({len(ok)} CTAs)")
        if rows:
            print("  step by step (medians over CTAs):")
            print("\n".join(rows))
        # Per CTA: its slowest stamped step (start to start) and where; the time from the last
        # stamped step done to the CTA's last step done where that step is the CTA's last one.
        worst, tails = [], []
        for c in ctas:
            d = [(c[8 + k] - c[7 + k], k) for k in range(1, 8) if c[8 + k] > 0 and c[7 + k] > 0]
            if d:
                worst.append(max(d))
            last = max((k for k in range(8) if c[16 + k] > 0), default=None)
            if last is not None and c[4] > 0:
                tails.append(c[4] - c[16 + last])
        if worst:
            at = sorted(k for _, k in worst)
            print(f"  slowest stamped step per CTA: median {statistics.median(w for w, _ in worst) / 1e3:.2f} "
                  f"max {max(w for w, _ in worst) / 1e3:.2f} us, at chunk +k: "
                  + " ".join(f"{k}:{at.count(k)}" for k in range(1, 8)))
        if tails:
            print(f"  last stamped step done -> last step done: median {statistics.median(tails) / 1e3:.2f} "
                  f"max {max(tails) / 1e3:.2f} us")
        wd = [[(c[32 + w] - c[0]) / 1e3 for c in ctas if c[32 + w] > 0] for w in range(16)]
        if any(wd):
            print("  warp done (from the CTA's start), median per warp: "
                  + " ".join(f"{w}:{statistics.median(v):.1f}" for w, v in enumerate(wd) if v))
    if 5 in span and 6 in span:
        print(f"gap launch 5 -> 6: {(span[6][0] - span[5][1]) / 1e3:.2f} us")


if __name__ == "__main__":
    main()
