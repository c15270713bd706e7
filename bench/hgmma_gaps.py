#!/usr/bin/env python3
"""Scores a kernel's SASS by what lies between its wgmma instructions.

Reads `cuobjdump -sass -fun SYMBOL BINARY` output (stdin or the files named) and prints, per input,
the HGMMA count, the instructions in total, and over every pair of consecutive HGMMA at most 12
instructions apart: the instructions between them and how many of those are UIADD3.X, UMOV and
UIADD3.64. A description of the code, not a predictor of its speed: every descriptor add on its
low word raised the pair kernel's score and cost the pairs 5-6%, but a lower score (every add one
UIADD3.64) came out 2% slower (docs/perf-notes.md, "K ahead timed").

    cuobjdump -sass -fun '_ZN6gdnkit4cuda16gdn_fused_kernelI13__nv_bfloat16Li128ELi64ELb0ELb1ELb0EEEvNS0_11FusedParamsE' \\
        build/bench_gdnkit > pairs.sass
    python3 bench/hgmma_gaps.py pairs.sass other.sass
"""
import re
import sys

NEAR = 12


def score(lines):
    ins = []
    for line in lines:
        m = re.search(r"/\*([0-9a-f]{4,})\*/\s*(.*?);", line)
        if m:
            ins.append(m.group(2).strip())
    hg = [i for i, s in enumerate(ins) if "HGMMA" in s]
    pairs = gap = ux = um = u64 = 0
    for a, b in zip(hg, hg[1:]):
        if b - a <= NEAR:
            between = ins[a + 1 : b]
            pairs += 1
            gap += len(between)
            ux += sum("UIADD3.X" in s for s in between)
            um += sum(re.search(r"(^|\s)UMOV\s", s) is not None for s in between)
            u64 += sum("UIADD3.64" in s for s in between)
    return len(ins), len(hg), pairs, gap, ux, um, u64


def main():
    sources = [(name, open(name)) for name in sys.argv[1:]] or [("stdin", sys.stdin)]
    print("input instructions HGMMA near_pairs between UIADD3.X UMOV UIADD3.64")
    for name, f in sources:
        print(name, *score(f))


if __name__ == "__main__":
    main()
