"""Event kinds and parent links that NCCL's example profiler recorded under
two libraries for the same program, side by side: totals over all ranks'
trace files (trace_*.json in each directory, the plugin's b/e pairs
nesting children inside parents).

  python3 tools/profiler_compare.py NCCL_DIR OXCCL_DIR
"""

import collections
import glob
import json
import os
import sys


def tally_file(path):
    """Counts per event kind and per (parent, child) kinds of one trace.
    The example ends its array with "{}]"; its printf of a NULL %p is
    "(nil)"."""
    counts, links, stack = collections.Counter(), collections.Counter(), []
    for e in json.loads(open(path).read().rstrip() or "[]"):
        if not e:
            continue
        key = e["cat"] if e["cat"] not in ("PROXY", "NET") else e["name"]
        if e["ph"] == "b":
            counts[key] += 1
            if stack:
                links[(stack[-1], key)] += 1
            stack.append(key)
        elif stack:
            stack.pop()
    return counts, links


def tally(d):
    counts, links = collections.Counter(), collections.Counter()
    files = sorted(glob.glob(os.path.join(d, "trace_*.json")))
    for f in files:
        c, l = tally_file(f)
        counts.update(c)
        links.update({f"{p} > {k}": v for (p, k), v in l.items()})
    return len(files), counts, links


def main():
    a, b = sys.argv[1], sys.argv[2]
    (fa, ca, la), (fb, cb, lb) = tally(a), tally(b)
    print(f"trace files: NCCL {fa}, oxccl {fb}")
    for title, x, y in (("event kind", ca, cb), ("parent > child", la, lb)):
        print(f"{title:<40} {'NCCL':>8} {'oxccl':>8}")
        for k in sorted(set(x) | set(y)):
            mark = "" if (x[k] > 0) == (y[k] > 0) else "   <- only one"
            print(f"{k:<40} {x[k]:>8} {y[k]:>8}{mark}")


if __name__ == "__main__":
    main()
