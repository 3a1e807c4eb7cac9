#!/usr/bin/env python3
"""The performance record's data: benchmark output to CSV, CSV to SVG plots.

Python's standard library only. Two subcommands:

  ingest  parse benchmark output into the record's CSV rows, tagged with
          where and what was measured:
            tools/perf_plot.py ingest --path nvlink --machine 2xH200 \\
                --date 2026-11-27 --commit 46dd0ad --library oxccl \\
                --round 1 -o docs/perf/nvlink.csv run1.txt
          Understood inputs (the format is recognised from the text):
          - nccl-tests stdout (`all_reduce_perf ...`), and `oxccl perf`
            stdout, which prints the same columns (`--op all` names each
            block with a `# <collective>` line);
          - `oxccl perf --json FILE` (its rows: op, bytes, count, dtype,
            redop, root, inplace, time_us, algbw, busbw, wrong);
          - `tools/gloo_bench.py` stdout (size, time, algbw, busbw);
          - `tools/mpi_compare.sh` stdout (oxccl-shm, oxccl-net, mpi-tcp and
            mpi-vader lines: the path and library come from each line).
          Rows are appended to the CSV (its header written when it is new).

  plot    draw SVGs from CSVs: for every path, collective and rank count,
          busbw against size and time against size (log-x, time log-y),
          one line per library and commit, oxccl beside its peer:
            tools/perf_plot.py plot --out docs/perf docs/perf/*.csv
          Out-of-place rows (in-place ones only for a library that has no
          other, as Gloo's all_reduce); a size measured in several rounds
          is drawn at the median of its rounds.

CSV columns: path,machine,date,commit,library,collective,ranks,bytes,
inplace,round,time_us,busbw_gbps,wrong (wrong empty where the benchmark
does not check).
"""

import argparse
import csv
import json
import math
import os
import re
import sys
from collections import OrderedDict, defaultdict

COLUMNS = [
    "path", "machine", "date", "commit", "library", "collective", "ranks",
    "bytes", "inplace", "round", "time_us", "busbw_gbps", "wrong",
]

COLLECTIVES = {
    "all_reduce": "all_reduce", "allreduce": "all_reduce",
    "all_gather": "all_gather", "allgather": "all_gather",
    "reduce_scatter": "reduce_scatter", "reducescatter": "reduce_scatter",
    "broadcast": "broadcast", "reduce": "reduce", "sendrecv": "sendrecv",
    "alltoall": "all_to_all", "all_to_all": "all_to_all",
}

DTYPES = {
    "int8", "uint8", "int32", "uint32", "int64", "uint64", "half", "float",
    "double", "bfloat16", "f8e4m3", "f8e5m2", "fp8_e4m3", "fp8_e5m2",
}


class InputError(Exception):
    """A file that cannot be read as benchmark output: says which and why."""


def collective_name(name):
    key = name.strip().lower()
    if key.endswith("_perf"):
        key = key[: -len("_perf")]
    if key not in COLLECTIVES:
        raise InputError(f"unknown collective {name!r}; known: "
                         + ", ".join(sorted(set(COLLECTIVES.values()))))
    return COLLECTIVES[key]


def number(text):
    """A float from a benchmark column, or None for N/A."""
    if text in ("N/A", "n/a", "-"):
        return None
    return float(text)


def parse_json(text, src):
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        # One object per line is accepted too.
        data = [json.loads(line) for line in text.splitlines() if line.strip()]
    if isinstance(data, dict):
        data = [data]
    rows = []
    for i, obj in enumerate(data):
        try:
            rows.append({
                "collective": collective_name(obj["op"]),
                "bytes": int(obj["bytes"]),
                "inplace": 1 if obj["inplace"] else 0,
                "time_us": float(obj["time_us"]),
                "busbw_gbps": float(obj["busbw"]),
                "wrong": int(obj["wrong"]),
            })
        except (KeyError, TypeError, ValueError) as e:
            raise InputError(f"{src}: row {i} of the JSON is not an `oxccl perf --json` row ({e})")
    return {"rows": rows, "library": "oxccl", "ranks": None}


MPI_LINE = re.compile(
    r"^(?P<who>mpi-tcp|mpi-vader) MPI_Allreduce (?P<bytes>\d+) bytes, (?P<ranks>\d+) ranks: "
    r"time (?P<time>[0-9.]+) us, algbw [0-9.]+ GB/s, busbw (?P<busbw>[0-9.]+) GB/s, "
    r"#wrong (?P<wrong>\d+)")
MPI_PATHS = {
    "oxccl-shm": ("host-shm", "oxccl"),
    "oxccl-net": ("host-net", "oxccl"),
    "mpi-vader": ("host-shm", "openmpi-vader"),
    "mpi-tcp": ("host-net", "openmpi-tcp"),
}


def nccl_tests_row(fields):
    """size count type redop root time algbw busbw wrong [time algbw busbw wrong]."""
    if len(fields) < 9 or not fields[0].isdigit() or not fields[1].isdigit():
        return None
    if fields[2] not in DTYPES:
        return None
    out = []
    for inplace, base in ((0, 5), (1, 9)):
        if len(fields) < base + 4:
            continue
        t, bus = number(fields[base]), number(fields[base + 2])
        if t is None or bus is None:
            continue
        wrong = number(fields[base + 3])
        out.append({
            "bytes": int(fields[0]),
            "inplace": inplace,
            "time_us": t,
            "busbw_gbps": bus,
            "wrong": "" if wrong is None else int(wrong),
        })
    return out


def parse_text(text, src, default_coll=None):
    """nccl-tests, `oxccl perf`, gloo_bench.py or mpi_compare.sh output."""
    info = {"rows": [], "ranks": None, "library": None}
    coll = collective_name(default_coll) if default_coll else None
    gloo = False
    rank_lines = 0
    seen = defaultdict(int)  # mpi_compare: rounds per (library, path, bytes)
    for raw in text.splitlines():
        line = raw.strip()
        if not line:
            continue
        m = re.match(r"# Collective test starting: (\S+)", line)
        if m:
            coll = collective_name(m.group(1))
            continue
        if re.match(r"#\s+Rank\s+\d+ ", line):
            rank_lines += 1
            continue
        m = re.match(r"# oxccl perf: (\d+) ranks", line)
        if m:
            info["ranks"] = int(m.group(1))
            info["library"] = "oxccl"
            continue
        m = re.match(r"# gloo (\S+), (\d+) ranks", line)
        if m:
            gloo = True
            coll = collective_name(m.group(1))
            info["ranks"] = int(m.group(2))
            info["library"] = "gloo"
            continue
        if line.startswith("NCCL version "):
            info["library"] = "nccl-" + line.split()[2].split("+")[0]
            continue
        if line.startswith("oxccl version "):
            info["library"] = "oxccl"
            continue
        m = re.match(r"#\s*([a-z_]+)\s*$", line)
        if m and m.group(1) in COLLECTIVES:
            coll = collective_name(m.group(1))
            continue
        if line.startswith("#"):
            continue
        fields = line.split()
        m = MPI_LINE.match(line)
        if m:
            path, lib = MPI_PATHS[m.group("who")]
            key = (lib, path, int(m.group("bytes")))
            seen[key] += 1
            info["rows"].append({
                "path": path, "library": lib, "collective": "all_reduce",
                "ranks": int(m.group("ranks")), "bytes": int(m.group("bytes")),
                "inplace": 0, "round": seen[key], "time_us": float(m.group("time")),
                "busbw_gbps": float(m.group("busbw")), "wrong": int(m.group("wrong")),
            })
            continue
        if fields[0] in ("oxccl-shm", "oxccl-net"):
            got = nccl_tests_row(fields[1:])
            if got:
                path, lib = MPI_PATHS[fields[0]]
                key = (lib, path, got[0]["bytes"])
                seen[key] += 1
                for r in got:
                    r.update(path=path, library=lib, collective="all_reduce",
                             ranks=2, round=seen[key])
                info["rows"].extend(got)
            continue
        if gloo and len(fields) == 4 and fields[0].isdigit():
            info["rows"].append({
                "collective": coll, "bytes": int(fields[0]), "inplace": 1,
                "time_us": float(fields[1]), "busbw_gbps": float(fields[3]),
                "wrong": "",
            })
            continue
        got = nccl_tests_row(fields)
        if got:
            if coll is None:
                raise InputError(f"{src}: rows before any collective is named; pass --collective")
            for r in got:
                r["collective"] = coll
            info["rows"].extend(got)
    if info["ranks"] is None and rank_lines:
        info["ranks"] = rank_lines
    return info


def ingest(args):
    out_rows = []
    for src in args.files:
        try:
            with open(src) as f:
                text = f.read()
        except OSError as e:
            raise InputError(f"cannot read {src}: {e}")
        if text.lstrip().startswith(("[", "{")):
            info = parse_json(text, src)
        else:
            info = parse_text(text, src, args.collective)
        if not info["rows"]:
            raise InputError(f"{src}: no benchmark rows found (nccl-tests, oxccl perf, "
                             "gloo_bench.py, mpi_compare.sh or oxccl perf --json)")
        # in-place rows stay where a size has no out-of-place row (Gloo's
        # all_reduce is in place only)
        has_out = {(r["collective"], r["bytes"], r.get("path") or args.path)
                   for r in info["rows"] if not r["inplace"]}
        for r in info["rows"]:
            row = {
                "path": r.get("path") or args.path,
                "machine": args.machine,
                "date": args.date,
                "commit": args.commit,
                "library": args.library or r.get("library") or info.get("library"),
                "collective": collective_name(args.collective) if args.collective else r["collective"],
                "ranks": args.ranks or r.get("ranks") or info.get("ranks"),
                "bytes": r["bytes"],
                "inplace": r["inplace"],
                "round": r.get("round") or args.round,
                "time_us": r["time_us"],
                "busbw_gbps": r["busbw_gbps"],
                "wrong": r["wrong"],
            }
            if args.placement == "out" and row["inplace"] and \
                    (row["collective"], row["bytes"], row["path"]) in has_out:
                continue
            missing = [k for k in ("path", "library", "ranks") if not row[k]]
            if missing:
                raise InputError(f"{src}: cannot tell the {', '.join(missing)} from the "
                                 "output; pass " + ", ".join("--" + m for m in missing))
            out_rows.append(row)
    new = not os.path.exists(args.output) or os.path.getsize(args.output) == 0
    with open(args.output, "a", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS, lineterminator="\n")
        if new:
            w.writeheader()
        for row in out_rows:
            row = dict(row)
            row["time_us"] = f"{row['time_us']:g}"
            row["busbw_gbps"] = f"{row['busbw_gbps']:g}"
            w.writerow(row)
    print(f"{len(out_rows)} rows -> {args.output}", file=sys.stderr)


# ---------------------------------------------------------------- plotting

PATH_TITLES = {
    "nvlink": "NVLink (P2P)",
    "shm": "shared memory between GPUs",
    "net": "socket network",
    "net-graph": "socket network, launched vs replayed from a CUDA graph",
    "host": "host memory",
    "host-shm": "host memory, one host",
    "host-net": "host memory, socket network",
}

OX_COLORS = ["#d62728", "#ff7f0e", "#8c564b", "#e377c2"]
PEER_COLORS = ["#1f77b4", "#2ca02c", "#17becf", "#9467bd"]


def human_bytes(n):
    for unit, div in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= div:
            v = n / div
            return f"{v:g} {unit}" if v == int(v) else f"{v:.1f} {unit}"
    return f"{n} B"


def median(values):
    v = sorted(values)
    k = len(v)
    return v[k // 2] if k % 2 else (v[k // 2 - 1] + v[k // 2]) / 2


def nice_step(span, target=5):
    raw = span / target
    mag = 10 ** math.floor(math.log10(raw))
    for m in (1, 2, 2.5, 5, 10):
        if raw <= m * mag:
            return m * mag
    return 10 * mag


def fmt_num(v):
    if v == 0:
        return "0"
    if abs(v) >= 100 or v == int(v):
        return f"{v:.0f}"
    if abs(v) >= 1:
        return f"{v:g}"
    return f"{v:.2g}"


def esc(s):
    return (str(s).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
            .replace('"', "&quot;"))


class Panel:
    """One plot area: log2 x (bytes), linear or log10 y."""

    def __init__(self, x0, y0, w, h, xmin, xmax, ymin, ymax, ylog):
        self.x0, self.y0, self.w, self.h = x0, y0, w, h
        self.lx0 = math.log2(max(xmin, 1))
        self.lx1 = math.log2(max(xmax, 2))
        if self.lx1 - self.lx0 < 1:
            self.lx0 -= 0.5
            self.lx1 += 0.5
        self.ylog = ylog
        if ylog:
            lo = math.floor(math.log10(ymin * 0.9))
            hi = math.ceil(math.log10(ymax))
            if hi == lo:
                hi += 1
            self.ya, self.yb = lo, hi
        else:
            step = nice_step(ymax if ymax > 0 else 1)
            self.ystep = step
            self.ya, self.yb = 0.0, step * math.ceil((ymax if ymax > 0 else 1) / step)

    def px(self, b):
        return self.x0 + (math.log2(b) - self.lx0) / (self.lx1 - self.lx0) * self.w

    def py(self, v):
        if self.ylog:
            f = (math.log10(v) - self.ya) / (self.yb - self.ya)
        else:
            f = (v - self.ya) / (self.yb - self.ya)
        return self.y0 + self.h - f * self.h

    def axes(self, out, ylabel):
        x0, y0, w, h = self.x0, self.y0, self.w, self.h
        out.append(f'<rect x="{x0}" y="{y0}" width="{w}" height="{h}" fill="#ffffff" stroke="#444444"/>')
        # x ticks: powers of two, at most about 8 labels
        lo, hi = math.ceil(self.lx0), math.floor(self.lx1)
        step = 1
        while (hi - lo) / step > 8:
            step *= 2
        k = lo
        while k <= hi:
            if (k - lo) % step == 0:
                x = self.px(2 ** k)
                out.append(f'<line x1="{x:.1f}" y1="{y0}" x2="{x:.1f}" y2="{y0 + h}" stroke="#e4e4e4"/>')
                out.append(f'<text x="{x:.1f}" y="{y0 + h + 15}" text-anchor="middle">{esc(human_bytes(2 ** k))}</text>')
            k += 1
        out.append(f'<text x="{x0 + w / 2:.1f}" y="{y0 + h + 32}" text-anchor="middle">size (bytes, as nccl-tests counts them)</text>')
        # y ticks
        ticks = []
        if self.ylog:
            decades = self.yb - self.ya
            mults = (1, 2, 5) if decades <= 3 else (1,)
            for d in range(self.ya, self.yb + 1):
                for m in mults:
                    v = m * 10 ** d
                    if 10 ** self.ya <= v <= 10 ** self.yb:
                        ticks.append(v)
        else:
            v = self.ya
            while v <= self.yb + 1e-9:
                ticks.append(v)
                v += self.ystep
        for v in ticks:
            y = self.py(v)
            out.append(f'<line x1="{x0}" y1="{y:.1f}" x2="{x0 + w}" y2="{y:.1f}" stroke="#e4e4e4"/>')
            out.append(f'<text x="{x0 - 6}" y="{y + 4:.1f}" text-anchor="end">{fmt_num(v)}</text>')
        out.append(f'<text transform="translate({x0 - 54},{y0 + h / 2:.1f}) rotate(-90)" text-anchor="middle">{esc(ylabel)}</text>')


def series_key(row):
    return (row["library"], row["commit"], row["date"])


def draw_group(title, rows, path):
    """One SVG: busbw and time panels for the given rows (one group)."""
    # out-of-place rows; in-place ones only for a series that has no other
    # (Gloo's all_reduce is in place)
    has_out = {series_key(r) for r in rows if r["inplace"] == "0"}
    rows = [r for r in rows if r["inplace"] == "0" or series_key(r) not in has_out]
    inplace_only = {series_key(r) for r in rows} - has_out
    series = OrderedDict()
    for r in rows:
        series.setdefault(series_key(r), defaultdict(list))[int(r["bytes"])].append(r)
    # oxccl's lines first, then the peers', each in its order of appearance
    keys = sorted(series, key=lambda k: (not k[0].startswith("oxccl"),))
    ox_i = peer_i = 0
    styles = {}
    for k in keys:
        if k[0].startswith("oxccl"):
            styles[k] = OX_COLORS[ox_i % len(OX_COLORS)]
            ox_i += 1
        else:
            styles[k] = PEER_COLORS[peer_i % len(PEER_COLORS)]
            peer_i += 1
    points = {}
    for k in keys:
        pts = []
        for b in sorted(series[k]):
            if b <= 0:
                continue  # an empty call has no place on a log axis
            rs = series[k][b]
            pts.append((b, median([float(r["time_us"]) for r in rs]),
                        median([float(r["busbw_gbps"]) for r in rs])))
        if pts:
            points[k] = pts
    allpts = [p for k in points for p in points[k]]
    if not allpts:
        return None
    xmin = min(p[0] for p in allpts)
    xmax = max(p[0] for p in allpts)
    tmin = min(p[1] for p in allpts if p[1] > 0)
    tmax = max(p[1] for p in allpts)
    bmax = max(p[2] for p in allpts)
    # time in ms where the slowest point passes 10 ms
    scale, unit = (1000.0, "ms") if tmax >= 1e4 else (1.0, "us")
    points = {k: [(b, t / scale, bw) for b, t, bw in pts] for k, pts in points.items()}
    tmin, tmax = tmin / scale, tmax / scale
    legend_rows = (len(points) + 1) // 2
    top = 48 + 18 * legend_rows
    W, pw, ph = 1000, 390, 280
    H = top + ph + 60
    busbw = Panel(80, top, pw, ph, xmin, xmax, 0, bmax, False)
    time = Panel(80 + pw + 110, top, pw, ph, xmin, xmax, tmin, tmax, True)
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" '
        f'font-family="DejaVu Sans, Arial, sans-serif" font-size="12">',
        f'<rect width="{W}" height="{H}" fill="#ffffff"/>',
        f'<text x="{W / 2}" y="22" text-anchor="middle" font-size="15" font-weight="bold">{esc(title)}</text>',
    ]
    for i, k in enumerate(k for k in keys if k in points):
        col, row = i % 2, i // 2
        lx, ly = 90 + col * 480, 44 + row * 18
        lib, commit, date = k
        label = f"{lib} at {commit} ({date})" if lib.startswith("oxccl") else f"{lib} (run with {commit}, {date})"
        if k in inplace_only:
            label += ", in place"
        out.append(f'<line x1="{lx}" y1="{ly - 4}" x2="{lx + 24}" y2="{ly - 4}" stroke="{styles[k]}" stroke-width="2.5"/>')
        out.append(f'<circle cx="{lx + 12}" cy="{ly - 4}" r="3" fill="{styles[k]}"/>')
        out.append(f'<text x="{lx + 30}" y="{ly}">{esc(label)}</text>')
    busbw.axes(out, "busbw (GB/s)")
    time.axes(out, f"time ({unit}), log scale")
    for panel, idx in ((busbw, 2), (time, 1)):
        for k in keys:
            if k not in points:
                continue
            pts = [(panel.px(p[0]), panel.py(p[idx])) for p in points[k] if not (panel.ylog and p[idx] <= 0)]
            if len(pts) > 1:
                d = " ".join(f"{x:.1f},{y:.1f}" for x, y in pts)
                out.append(f'<polyline points="{d}" fill="none" stroke="{styles[k]}" stroke-width="2"/>')
            for x, y in pts:
                out.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="2.6" fill="{styles[k]}"/>')
    out.append(f'<text x="{W - 8}" y="{H - 8}" text-anchor="end" fill="#777777" font-size="10">'
               f'{esc(path)}: out-of-place rows, median of rounds; drawn by tools/perf_plot.py</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def slug(s):
    return re.sub(r"[^A-Za-z0-9]+", "-", s).strip("-").lower()


def plot(args):
    rows = []
    for src in args.csv:
        with open(src, newline="") as f:
            got = list(csv.DictReader(f))
        missing = [c for c in COLUMNS if got and c not in got[0]]
        if missing:
            raise InputError(f"{src}: not a record CSV (no {', '.join(missing)} column)")
        for r in got:
            r["_src"] = src
        rows.extend(got)
    groups = OrderedDict()
    for r in rows:
        groups.setdefault((r["path"], r["machine"], r["collective"], r["ranks"]), []).append(r)
    # name each file by path and collective, adding machine and ranks where needed
    by_pc = defaultdict(set)
    for (p, m, c, n) in groups:
        by_pc[(p, c)].add((m, n))
    os.makedirs(args.out, exist_ok=True)
    written = []
    for (p, m, c, n), rs in groups.items():
        sizes = {r["bytes"] for r in rs}
        if len(sizes) < args.min_sizes:
            continue
        name = [p, c]
        variants = by_pc[(p, c)]
        if len({v[0] for v in variants}) > 1:
            name.append(m)
        if len({v[1] for v in variants}) > 1:
            name.append(f"{n}ranks")
        fname = slug("-".join(name)) + ".svg"
        title = f"{c}, {PATH_TITLES.get(p, p)}: {m}, {n} ranks"
        svg = draw_group(title, rs, os.path.basename(rs[0]["_src"]))
        if svg is None:
            continue
        with open(os.path.join(args.out, fname), "w") as f:
            f.write(svg)
        written.append(fname)
    for w in written:
        print(os.path.join(args.out, w))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    ing = sub.add_parser("ingest", help="benchmark output -> record CSV rows")
    ing.add_argument("files", nargs="+", help="nccl-tests / oxccl perf / gloo_bench / mpi_compare output, or oxccl perf --json files")
    ing.add_argument("-o", "--output", required=True, help="CSV to append to")
    ing.add_argument("--path", help="nvlink, shm, net, net-graph, host, ... (mpi_compare lines carry their own)")
    ing.add_argument("--machine", required=True, help="e.g. 2xH200, H200, vm")
    ing.add_argument("--date", required=True, help="YYYY-MM-DD of the run")
    ing.add_argument("--commit", required=True, help="commit of the code measured")
    ing.add_argument("--library", help="oxccl, nccl-2.28.9, gloo, ... (default: from the output)")
    ing.add_argument("--collective", help="override the collective named in the output")
    ing.add_argument("--ranks", type=int, help="override the rank count found in the output")
    ing.add_argument("--round", type=int, default=1, help="round number of this run (default 1)")
    ing.add_argument("--placement", choices=["both", "out"], default="both",
                     help="keep in-place rows too (both) or out-of-place rows only")
    pl = sub.add_parser("plot", help="record CSVs -> SVG plots")
    pl.add_argument("csv", nargs="+")
    pl.add_argument("--out", default="docs/perf", help="folder for the SVGs")
    pl.add_argument("--min-sizes", type=int, default=3,
                    help="skip groups with fewer sizes than this (default 3)")
    args = ap.parse_args(argv)
    try:
        (ingest if args.cmd == "ingest" else plot)(args)
    except InputError as e:
        print(f"perf_plot.py: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
