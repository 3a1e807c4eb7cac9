"""The CTAs a collective library takes, read from the launch grids that
CUPTI records (torch.profiler), under the SM limits a PyTorch user sets
through ProcessGroupNCCL.Options().config (max_ctas, min_ctas, ...).

Every kernel and copy the loaded libnccl.so.2 launches while the 7
collectives run (8 B to 64 MiB, checked against a float64 reference) is
listed by name with its largest grid; with --max-ctas M the run fails when
any launch of the library has more than M blocks. Run it the same way on
NCCL and on oxccl (LD_PRELOAD=.../libnccl.so.2), in the same call:

  torchrun --nproc-per-node 2 cta_budget.py --max-ctas 8 OUT.json
  torchrun --nproc-per-node 2 cta_budget.py --as-hosts OUT.json  # one GPU

--as-hosts gives each rank its own NCCL_HOSTID, so that two ranks on one
GPU are two hosts to both libraries (NCCL refuses two ranks of one host on
one GPU); they then talk through the network. Without it, ranks on one GPU
take oxccl's shared-GPU path. One rank (--nproc-per-node 1) shows the
one-rank path (NCCL and oxccl copy with the copy engine).
"""

import argparse
import json
import os
import sys
import tempfile

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools"))
from torch_rank import loaded_nccl, place  # noqa: E402

# Kernel names of the collective libraries: NCCL's ncclDevKernel_* and
# ncclKernel_*, oxccl's oxccl_*.
LIB_PREFIXES = ("nccl", "oxccl")



def options(args):
    """ProcessGroupNCCL options with the config fields asked for; the ones
    this PyTorch build does not expose are reported, not guessed."""
    opts = dist.ProcessGroupNCCL.Options()
    cfg = opts.config
    asked = {
        "max_ctas": args.max_ctas,
        "min_ctas": args.min_ctas,
        "cga_cluster_size": args.cga_cluster_size,
    }
    set_, missing = {}, []
    for k, v in asked.items():
        if v is None:
            continue
        if hasattr(cfg, k):
            setattr(cfg, k, v)
            set_[k] = v
        else:
            missing.append(k)
    if args.comm_name and hasattr(cfg, "comm_name"):
        cfg.comm_name = args.comm_name
        set_["comm_name"] = args.comm_name
    return opts, set_, missing


def collectives(rank, world, dev, sizes):
    """The 7 collectives at each size, results checked."""
    bad = []
    for nbytes in sizes:
        n = max(1, nbytes // 4)
        g = torch.Generator().manual_seed(1000 * rank + n)
        mine = torch.randn(n, generator=g, dtype=torch.float64)
        all_in = [
            torch.randn(n, generator=torch.Generator().manual_seed(1000 * r + n), dtype=torch.float64)
            for r in range(world)
        ]
        t = mine.float().to(dev)
        dist.all_reduce(t)
        want = sum(x.float().double() for x in all_in)
        if not torch.allclose(t.double().cpu(), want, rtol=1e-4, atol=1e-4):
            bad.append(f"all_reduce {nbytes}")
        out = torch.empty(n * world, device=dev)
        dist.all_gather_into_tensor(out, mine.float().to(dev))
        if not torch.equal(out.cpu(), torch.cat([x.float() for x in all_in])):
            bad.append(f"all_gather {nbytes}")
        if n % world == 0:
            rs = torch.empty(n // world, device=dev)
            dist.reduce_scatter_tensor(rs, mine.float().to(dev))
            part = want.float().double().view(world, -1)[rank]
            if not torch.allclose(rs.double().cpu(), part, rtol=1e-4, atol=1e-4):
                bad.append(f"reduce_scatter {nbytes}")
        b = mine.float().to(dev)
        dist.broadcast(b, src=0)
        if not torch.equal(b.cpu(), all_in[0].float()):
            bad.append(f"broadcast {nbytes}")
        r = mine.float().to(dev)
        dist.reduce(r, dst=0)
        if rank == 0 and not torch.allclose(r.double().cpu(), want, rtol=1e-4, atol=1e-4):
            bad.append(f"reduce {nbytes}")
        if n % world == 0:
            a = torch.empty(n, device=dev)
            dist.all_to_all_single(a, mine.float().to(dev))
            chunk = n // world
            exp = torch.cat([x.float()[rank * chunk:(rank + 1) * chunk] for x in all_in])
            if not torch.equal(a.cpu(), exp):
                bad.append(f"all_to_all {nbytes}")
        if world > 1:
            peer = (rank + 1) % world
            src = (rank - 1) % world
            got = torch.empty(n, device=dev)
            reqs = dist.batch_isend_irecv([
                dist.P2POp(dist.isend, mine.float().to(dev), peer),
                dist.P2POp(dist.irecv, got, src),
            ])
            for q in reqs:
                q.wait()
            if not torch.equal(got.cpu(), all_in[src].float()):
                bad.append(f"sendrecv {nbytes}")
    torch.cuda.synchronize(dev)
    return bad


def launches(trace_path):
    """Kernels and copies of the collective library in a chrome trace:
    name -> [launches, largest grid (blocks), threads per block]."""
    with open(trace_path) as f:
        events = json.load(f).get("traceEvents", [])
    kernels, copies = {}, 0
    for e in events:
        cat = e.get("cat", "")
        name = e.get("name", "")
        # CUPTI names a template kernel with its return type first.
        if name.startswith("void "):
            name = name[5:]
        if cat == "kernel" and name.lower().startswith(LIB_PREFIXES):
            grid = e.get("args", {}).get("grid", [1, 1, 1])
            block = e.get("args", {}).get("block", [1, 1, 1])
            blocks = grid[0] * grid[1] * grid[2]
            k = kernels.setdefault(name.split("(")[0], [0, 0, 0])
            k[0] += 1
            k[1] = max(k[1], blocks)
            k[2] = max(k[2], block[0] * block[1] * block[2])
        elif cat == "gpu_memcpy":
            copies += 1
    return kernels, copies


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out", help="JSON file the ranks' findings are written to (rank 0)")
    ap.add_argument("--max-ctas", type=int)
    ap.add_argument("--min-ctas", type=int)
    ap.add_argument("--cga-cluster-size", type=int)
    ap.add_argument("--comm-name")
    ap.add_argument("--as-hosts", action="store_true",
                    help="each rank its own NCCL_HOSTID (two ranks on one GPU through the network)")
    ap.add_argument("--max-bytes", type=int, default=64 << 20)
    args = ap.parse_args()
    rank, world, dev = place(args.as_hosts, "cta-budget")
    opts, set_, missing = options(args)
    dist.init_process_group("nccl", pg_options=opts, device_id=dev)
    sizes = []
    s = 8
    while s <= args.max_bytes:
        sizes.append(s)
        s *= 8
    # Warm-up outside the trace: creation, compilation, connections.
    collectives(rank, world, dev, [8, 1 << 20])
    trace = os.path.join(tempfile.mkdtemp(prefix="cta_budget_"), f"rank{rank}.json")
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        bad = collectives(rank, world, dev, sizes)
    prof.export_chrome_trace(trace)
    kernels, copies = launches(trace)
    largest = max((k[1] for k in kernels.values()), default=0)
    mine = {
        "rank": rank,
        "world": world,
        "libnccl": loaded_nccl(),
        "nccl_version": ".".join(map(str, torch.cuda.nccl.version())),
        "config_set": set_,
        "config_missing": missing,
        "as_hosts": args.as_hosts,
        "kernels": {k: {"launches": v[0], "max_blocks": v[1], "threads": v[2]} for k, v in kernels.items()},
        "library_memcpys": copies,
        "largest_grid": largest,
        "wrong": bad,
    }
    everyone = [None] * world
    dist.all_gather_object(everyone, mine)
    failed = False
    if rank == 0:
        for m in everyone:
            ks = ", ".join(f"{k} x{v['launches']} <= {v['max_blocks']} blocks of {v['threads']}"
                           for k, v in m["kernels"].items()) or "no kernel"
            print(f"rank {m['rank']}/{m['world']}: {m['libnccl']} config {m['config_set']}: {ks}; "
                  f"{m['library_memcpys']} copies; largest grid {m['largest_grid']}; wrong {m['wrong']}")
            if m["config_missing"]:
                print(f"rank {m['rank']}: this PyTorch has no config field {m['config_missing']}")
            if args.max_ctas is not None and m["largest_grid"] > args.max_ctas:
                print(f"FAIL rank {m['rank']}: a launch of {m['largest_grid']} blocks exceeds max_ctas {args.max_ctas}")
                failed = True
            if m["wrong"]:
                print(f"FAIL rank {m['rank']}: wrong results in {m['wrong']}")
                failed = True
        with open(args.out, "w") as f:
            json.dump(everyone, f, indent=1)
        print("cta_budget:", "FAILED" if failed else "ok")
    dist.destroy_process_group()
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
