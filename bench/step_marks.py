#!/usr/bin/env python3
"""Prints the fused kernel's step marks (builds with -DGDNKIT_FUSED_TIMELINE -DGDNKIT_STEP_MARKS;
walk_kernel.cuh, fused_sm90.cuh).

Reads the "TL launch cta ..." lines of one process (stdin) and prints, for launch 6 and each of the
four chunks marked (from GDNKIT_TIMELINE_J0), every mark of state thread 0 of each state warpgroup
and of lane 0 of each aux warp, in SM cycles from state warpgroup 0's first mark of the first
chunk: medians over CTAs. The state's marks: the step's top, past FULL (and the peer's copy and V),
past the P barrier, K S and Q S issued, the aside done, their wait, Xt formed, Vn issued, its wait,
walk_chunk's products begun, Vn and Vd converted, P Vn issued, the state product issued, the wait
for P Vn, O stored or staged, the wait for the state product. The aux's (the unpaired kernel's
order): the record's top, past EMPTY, the next gates' loads issued, K and Q landed, the tail's
rows, the gate converted, stored, past the aux barrier, K K^T issued, the cumsum, A formed, the
diagonal blocks, the block rows, the tail's Mt rows, FULL arrived. A 64-column pair's aux skips
the peer's chunks, so its marks of those chunks stop early. Clock reads are scheduled by ptxas:
read the marks as indicative. A mark right after a barrier is nearer the warp's arrival there than
the barrier's release (the warps' marks after one barrier differ by up to ~700 cycles): a wait at
a barrier shows up in the warp's next interval (docs/perf-notes.md, "Reading the marks across warps").

    GDNKIT_TIMELINE_J0=64 bench_gdnkit --only fixed-b2-t16384 --reps 3 | python3 bench/step_marks.py

A mark's median is over the CTAs that recorded it. In a pair only the chunk's owner records its
record's phases, so a chunk's row mixes both ranks' early marks with the owner's later ones;
`--rank R` keeps the CTAs of rank R only (CTA index % 2 == R: clusters of two along x), whose rows
then alternate between its own chunks and its peer's.
"""
import statistics
import sys

OWN, CHUNKS = 48, 4
STATE = ["top", "FULL", "Pbar", "KSQS issued", "aside", "KSQS wait", "make_x", "Vn issued", "Vn wait",
         "products", "converted", "PVn issued", "State issued", "wait1", "store_o", "wait0"]
AUX = ["top", "EMPTY", "gate ld", "K landed", "tail", "gate", "stored", "auxbar", "KKT issued", "cumsum", "A",
       "diagonal", "rows", "Mt tail", "FULL", "-"]


def signed(x):
    x &= 0xffffffff
    return x - (1 << 32) if x >= 1 << 31 else x


def main():
    rank = None
    if len(sys.argv) == 3 and sys.argv[1] == "--rank":
        rank = int(sys.argv[2])
    elif len(sys.argv) != 1:
        sys.exit("usage: step_marks.py [--rank 0|1] < the driver's output")
    lines = [line.split() for line in sys.stdin if line.startswith("TL 6 ")]
    ctas = [[int(x) for x in f[3:]] for f in lines if rank is None or int(f[2]) % 2 == rank]
    ctas = [c for c in ctas if len(c) >= OWN + 6 * CHUNKS * 16]
    if not ctas:
        sys.exit("no marks: a build with GDNKIT_FUSED_TIMELINE and GDNKIT_STEP_MARKS, run for at least 10 launches")
    which = f" of rank {rank}" if rank is not None else ""
    print(f"launch 6: {len(ctas)} CTAs{which}; cycles from state warpgroup 0's top of the first chunk marked")
    mark = lambda c, r, ch, k: c[OWN + (r * CHUNKS + ch) * 16 + k]
    for ch in range(CHUNKS):
        print(f"chunk j0 + {ch}")
        for r in range(6):
            names = STATE if r < 2 else AUX
            cells = []
            for k in range(16):
                v = [signed(mark(c, r, ch, k) - mark(c, 0, 0, 0)) for c in ctas if mark(c, r, ch, k) and mark(c, 0, 0, 0)]
                if v:
                    cells.append(f"{names[k]}={statistics.median(v):.0f}")
            label = f"state {r}" if r < 2 else f"aux w{r - 2}"
            print(f"  {label:8s} " + " ".join(cells))


if __name__ == "__main__":
    main()
