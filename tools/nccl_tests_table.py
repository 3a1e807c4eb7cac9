#!/usr/bin/env python3
"""Markdown table from two nccl-tests logs of the same test (oxccl's run and
NCCL's): size, time and busbw of each (out-of-place), and the ratios.

  tools/nccl_tests_table.py OXCCL.log NCCL.log
"""
import sys


def rows(path):
    out = {}
    for line in open(path):
        f = line.split()
        if len(f) >= 9 and f[0].isdigit() and f[1].isdigit():
            size = int(f[0])
            # size count type redop root time algbw busbw #wrong ...
            out[size] = (float(f[5]), float(f[7]), f[8])
    return out


def human(n):
    for unit, div in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= div and n % div == 0:
            return f"{n // div} {unit}"
    return f"{n} B"


def main(ox_path, nc_path):
    ox, nc = rows(ox_path), rows(nc_path)
    print("| size | oxccl time (us) | NCCL time (us) | oxccl busbw (GB/s) | NCCL busbw (GB/s) | busbw ratio | #wrong |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for size in sorted(ox):
        if size not in nc:
            continue
        (ot, ob, ow), (nt, nb, _) = ox[size], nc[size]
        ratio = f"{ob / nb:.2f}" if nb > 0 else f"{nt / ot:.2f} (time)"
        print(f"| {human(size)} | {ot:.2f} | {nt:.2f} | {ob:.2f} | {nb:.2f} | {ratio} | {ow} |")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        print(__doc__)
        sys.exit(2)
    main(sys.argv[1], sys.argv[2])
