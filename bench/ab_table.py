"""The table of an A/B or variants run of scripts/gpu_check.sh (its ab.txt or variants.txt).

Those files hold blocks "== PATH/bench_gdnkit (round N)" of bench_gdnkit's rows (name, tokens,
device_ms, host_us, kernel and, in newer drivers, plan_us), each side timed once per round,
alternately. This prints, per (row, kernel), every side's device ms in each round and its change
against the reference side (the median of its rounds against the reference's median; --mean for
means), so that a run reads as one table:

    python3 bench/ab_table.py gpu-out/variants.txt [--ref NAME] [--mean]

A side is named by the folder of its driver (variant-NAME -> NAME, build-gpu-ab-TREE -> TREE); the
reference is `--ref`, else the tree built in place (gpu_check.sh's $BUILD: the default build).
"""
import argparse
import collections
import os
import re
import statistics
import sys


def side_name(path, build):
    d = os.path.basename(os.path.dirname(path))
    if d.startswith("variant-"):
        return d[len("variant-"):]
    if d == build:
        return "this"
    if d.startswith(build + "-ab-"):
        return d[len(build + "-ab-"):]
    return d


def parse(lines, build):
    times = collections.OrderedDict()  # (row, kernel) -> side -> [ms per round]
    sides = []
    side = None
    for line in lines:
        m = re.match(r"== (\S+) \(round (\d+)\)", line)
        if m:
            side = side_name(m.group(1), build)
            if side not in sides:
                sides.append(side)
            continue
        f = line.split()
        if side is None or len(f) not in (5, 6) or f[0] == "row":
            continue
        try:
            ms = float(f[2])
        except ValueError:
            continue
        times.setdefault((f[0], f[4]), collections.OrderedDict()).setdefault(side, []).append(ms)
    return sides, times


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("file")
    ap.add_argument("--ref", default="this", help="the side the others are compared with")
    ap.add_argument("--build", default="build-gpu", help="the in-place build folder's name")
    ap.add_argument("--mean", action="store_true", help="compare means of rounds instead of medians")
    a = ap.parse_args()
    stat = statistics.fmean if a.mean else statistics.median
    sides, times = parse(open(a.file), a.build)
    if not times:
        sys.exit(f"{a.file}: no rows")
    if a.ref not in sides:
        sys.exit(f"--ref {a.ref}: not a side of {a.file} ({', '.join(sides)})")
    sides = [a.ref] + [s for s in sides if s != a.ref]
    lines = []
    for (row, kernel), by in times.items():
        ref = by.get(a.ref)
        cells = []
        for s in sides:
            t = by.get(s)
            if not t:
                cells.append("-")
                continue
            text = "/".join("%.4f" % x for x in t)
            if s != a.ref and ref:
                text += " %+.1f%%" % (100.0 * (stat(t) / stat(ref) - 1.0))
            cells.append(text)
        lines.append((row, kernel, cells))
    # Columns as wide as their widest cell (three or more rounds make long ones).
    w = [max([len(s)] + [len(c[2][i]) for c in lines]) + 2 for i, s in enumerate(sides)]
    print("%-30s %-36s" % ("row", "kernel") + "".join(s.rjust(w[i]) for i, s in enumerate(sides)))
    for row, kernel, cells in lines:
        print("%-30s %-36s" % (row, kernel) + "".join(c.rjust(w[i]) for i, c in enumerate(cells)))

if __name__ == "__main__":
    main()
