#!/usr/bin/env python3
"""Warp-stall samples per SASS instruction and per stall reason, from an Nsight Compute report.

    ncu --section SourceCounters -o rep <app>             # on the GPU machine
    python3 scripts/ncu_stalls.py rep.ncu-rep [--from 0x19000] [--to 0x20000] [--top 30] [--csv all.csv]

ncu's CSV source page gives only the total of a line's samples; the per-reason split (barrier, wait,
short_scoreboard, mio_throttle, ...) is in the report's smsp__pcsamp_warps_issue_stalled_* metrics,
one instance per PC, read here through ncu's Python module (extras/python of the ncu install).
Prints, for the instructions at kernel offsets [from, to) (a warp role's code, e.g. the aux's), the
share of each stall reason and the instructions with the most samples, with their execution counts
(warp instructions: which warps ran a line tells the roles apart)."""
import argparse
import glob
import sys

for d in glob.glob('/opt/nvidia/nsight-compute/*/extras/python') + glob.glob('/usr/local/cuda*/nsight-compute*/extras/python'):
    sys.path.append(d)
import ncu_report  # noqa: E402

PREFIX = 'smsp__pcsamp_warps_issue_stalled_'


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument('report')
    ap.add_argument('--from', dest='lo', type=lambda x: int(x, 0), default=0)
    ap.add_argument('--to', dest='hi', type=lambda x: int(x, 0), default=1 << 40)
    ap.add_argument('--top', type=int, default=30)
    ap.add_argument('--csv', help='also write every instruction with samples (offset, samples, executed, each reason) to this file')
    args = ap.parse_args()
    action = ncu_report.load_report(args.report).range_by_idx(0).action_by_idx(0)
    cols = {}
    for name in action.metric_names():
        if not (name.startswith(PREFIX) or name in ('inst_executed', 'smsp__pcsamp_sample_count')):
            continue
        if name.endswith('_not_issued'):
            continue
        m = action[name]
        if not m.has_correlation_ids():
            continue
        ids = m.correlation_ids()
        cols[name.replace(PREFIX, '')] = {ids.as_uint64(i): m.as_double(i) for i in range(m.num_instances())}
    pcs = sorted(pc for pc in cols.get('smsp__pcsamp_sample_count', {}) if pc >= 1 << 32)
    if not pcs:
        sys.exit(f'{args.report}: no per-PC samples (was SourceCounters collected?)')
    base = pcs[0]
    sel = [pc for pc in pcs if args.lo <= pc - base < args.hi]
    total = cols['smsp__pcsamp_sample_count']
    reasons = [r for r in cols if r not in ('inst_executed', 'smsp__pcsamp_sample_count')]
    n = sum(total.get(pc, 0) for pc in sel) or 1
    print(f"{action.name()}: {len(sel)} instructions with samples at offsets [{args.lo:#x}, {min(args.hi, pcs[-1] - base + 16):#x}), "
          f"{n:.0f} samples ({100 * n / sum(total.values()):.1f}% of the kernel's)")
    share = sorted(((sum(cols[r].get(pc, 0) for pc in sel), r) for r in reasons), reverse=True)
    print('  ' + ', '.join(f'{r} {100 * c / n:.1f}%' for c, r in share if c))
    if args.csv:
        with open(args.csv, 'w') as f:
            f.write('offset,samples,executed,' + ','.join(reasons) + '\n')
            for pc in pcs:
                f.write(f"{pc - base:#x},{total.get(pc, 0):.0f},{cols['inst_executed'].get(pc, 0):.0f},"
                        + ','.join(f'{cols[r].get(pc, 0):.0f}' for r in reasons) + '\n')
    print(f"{'offset':>8} {'samples':>8} {'executed':>10}  top reasons")
    for pc in sorted(sel, key=lambda pc: -total.get(pc, 0))[:args.top]:
        top = sorted(((cols[r].get(pc, 0), r) for r in reasons), reverse=True)[:3]
        print(f"{pc - base:8x} {total.get(pc, 0):8.0f} {cols['inst_executed'].get(pc, 0):10.0f}  "
              + ' '.join(f'{r}:{c:.0f}' for c, r in top if c))


if __name__ == '__main__':
    main()
