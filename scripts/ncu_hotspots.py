#!/usr/bin/env python3
"""Summarises the SASS-level counters of an Nsight Compute report.

    ncu --import walk.ncu-rep --page source --csv --print-source sass > walk.csv
    python3 scripts/ncu_hotspots.py walk.csv [--top 25]

Prints the executed-instruction mix by opcode (warp-level instructions, with the share of the
total) and the SASS lines with the most warp-stall samples. The report must have been captured
with the SourceCounters section (scripts/gpu_check.sh, stage "profile")."""
import argparse
import csv
import re
import sys
from collections import defaultdict


def number(text):
    text = (text or "").replace(",", "").strip()
    try:
        return float(text)
    except ValueError:
        return 0.0


def find_column(header, *needles):
    for i, name in enumerate(header):
        low = name.lower()
        if all(n in low for n in needles):
            return i
    return None


def opcode(sass):
    # "@!P0 HMMA.16816.F32.BF16 R4, ..." -> "HMMA"
    words = sass.strip().split()
    if words and words[0].startswith("@"):
        words = words[1:]
    return re.split(r"[.\s]", words[0])[0] if words else "?"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("csv")
    ap.add_argument("--top", type=int, default=25)
    args = ap.parse_args()

    rows = list(csv.reader(open(args.csv, newline="", errors="replace")))
    start = next((i for i, r in enumerate(rows) if find_column(r, "source") is not None and len(r) > 3), None)
    if start is None:
        sys.exit(f"{args.csv}: no source table found (first line: {rows[0] if rows else 'empty'})")
    header = rows[start]
    src = find_column(header, "source")
    addr = find_column(header, "address")
    executed = find_column(header, "instructions executed")
    if executed is None:
        executed = find_column(header, "warp", "executed")
    stalls = find_column(header, "stall sampling", "all")
    if stalls is None:
        stalls = find_column(header, "stall")
    print(f"columns: source={header[src]!r} executed={header[executed] if executed is not None else None!r} "
          f"stalls={header[stalls] if stalls is not None else None!r}")

    mix = defaultdict(float)
    lines = []
    for r in rows[start + 1:]:
        if len(r) <= src or not r[src].strip():
            continue
        ex = number(r[executed]) if executed is not None and executed < len(r) else 0.0
        st = number(r[stalls]) if stalls is not None and stalls < len(r) else 0.0
        mix[opcode(r[src])] += ex
        lines.append((st, ex, r[addr] if addr is not None else "", r[src].strip()))

    total = sum(mix.values())
    print(f"\nexecuted warp instructions: {total:,.0f}")
    for op, n in sorted(mix.items(), key=lambda kv: -kv[1])[:30]:
        print(f"  {op:<10} {n:>14,.0f}  {100 * n / max(total, 1):5.1f}%")
    stall_total = sum(l[0] for l in lines)
    print(f"\nSASS lines with the most stall samples (of {stall_total:,.0f}):")
    for st, ex, a, s in sorted(lines, key=lambda l: -l[0])[: args.top]:
        print(f"  {100 * st / max(stall_total, 1):5.1f}%  {a:>6}  {s[:90]}")


if __name__ == "__main__":
    main()
