"""Compute and communication overlapped, as training runs them: a bf16
GEMM loop on one stream while collectives of one size run on another.

Prints, per collective, GEMM TFLOP/s alone and during the collectives, and
the collective's busbw alone and during the GEMMs, for whichever
libnccl.so.2 is loaded, so that NCCL and oxccl run it in the same call:

  torchrun --nproc-per-node 2 overlap_bench.py                    # NCCL
  LD_PRELOAD=/path/oxccl/libnccl.so.2 torchrun --nproc-per-node 2 overlap_bench.py

On one GPU, --as-hosts gives each rank its own NCCL_HOSTID (both libraries
then go through their network path); without it oxccl's ranks share the
GPU through its shared-GPU path (NCCL refuses that). --json appends one
record per collective for tools/perf_plot.py-style tables. --max-ctas
passes ProcessGroupNCCL.Options().config.max_ctas.
"""

import argparse

import torch
import torch.distributed as dist
from torch_rank import append_json, loaded_nccl, place

BUSBW = {"all_reduce": lambda n: 2 * (n - 1) / n, "all_gather": lambda n: (n - 1) / n,
         "reduce_scatter": lambda n: (n - 1) / n}



def gemm_loop(a, b, c, iters, stream):
    with torch.cuda.stream(stream):
        for _ in range(iters):
            torch.matmul(a, b, out=c)


def coll_loop(kind, bufs, iters, stream):
    inp, out = bufs
    with torch.cuda.stream(stream):
        for _ in range(iters):
            if kind == "all_reduce":
                dist.all_reduce(inp)
            elif kind == "all_gather":
                dist.all_gather_into_tensor(out, inp)
            else:
                dist.reduce_scatter_tensor(out, inp)


def agreed(n, dev):
    """The largest of every rank's `n`: loops must make the same number of
    calls on every rank, whatever each one timed."""
    t = torch.tensor([n], device=dev, dtype=torch.int64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return int(t.item())


def timed(fn, stream):
    """Milliseconds `fn` takes on `stream`, from events around it."""
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record(stream)
    fn()
    e.record(stream)
    return s, e


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bytes", type=int, default=256 << 20, help="bytes of each rank's collective buffer")
    ap.add_argument("--colls", default="all_reduce,all_gather")
    ap.add_argument("--gemm", type=int, default=8192, help="M=N=K of the bf16 GEMM")
    ap.add_argument("--seconds", type=float, default=2.0, help="length of each timed phase")
    ap.add_argument("--as-hosts", action="store_true")
    ap.add_argument("--max-ctas", type=int)
    ap.add_argument("--json", help="append a JSON line per collective (rank 0)")
    ap.add_argument("--label", default="", help="library label for the output (default: the loaded libnccl)")
    args = ap.parse_args()
    rank, world, dev = place(args.as_hosts, "overlap")
    opts = dist.ProcessGroupNCCL.Options()
    if args.max_ctas is not None:
        opts.config.max_ctas = args.max_ctas
    dist.init_process_group("nccl", pg_options=opts, device_id=dev)
    label = args.label or ",".join(loaded_nccl())

    g = args.gemm
    a = torch.randn(g, g, device=dev, dtype=torch.bfloat16)
    b = torch.randn(g, g, device=dev, dtype=torch.bfloat16)
    c = torch.empty(g, g, device=dev, dtype=torch.bfloat16)
    flops = 2.0 * g * g * g
    s_gemm, s_coll = torch.cuda.Stream(dev), torch.cuda.Stream(dev)

    # GEMM alone: how many fill the phase.
    gemm_loop(a, b, c, 5, s_gemm)
    torch.cuda.synchronize(dev)
    s, e = timed(lambda: gemm_loop(a, b, c, 20, s_gemm), s_gemm)
    torch.cuda.synchronize(dev)
    per_gemm = s.elapsed_time(e) / 20
    n_gemm = agreed(max(10, int(args.seconds * 1000 / per_gemm)), dev)
    dist.barrier()
    s, e = timed(lambda: gemm_loop(a, b, c, n_gemm, s_gemm), s_gemm)
    torch.cuda.synchronize(dev)
    gemm_alone = flops * n_gemm / (s.elapsed_time(e) / 1000) / 1e12

    for kind in args.colls.split(","):
        n = args.bytes // 2  # bf16 elements
        if kind == "all_reduce":
            bufs = (torch.ones(n, device=dev, dtype=torch.bfloat16), None)
        elif kind == "all_gather":
            bufs = (torch.ones(n, device=dev, dtype=torch.bfloat16),
                    torch.empty(n * world, device=dev, dtype=torch.bfloat16))
        else:
            bufs = (torch.ones(n * world, device=dev, dtype=torch.bfloat16),
                    torch.empty(n, device=dev, dtype=torch.bfloat16))
        coll_loop(kind, bufs, 3, s_coll)
        torch.cuda.synchronize(dev)
        dist.barrier()
        s, e = timed(lambda: coll_loop(kind, bufs, 5, s_coll), s_coll)
        torch.cuda.synchronize(dev)
        per_coll = s.elapsed_time(e) / 5
        n_coll = agreed(max(3, int(args.seconds * 1000 / per_coll)), dev)
        dist.barrier()
        s, e = timed(lambda: coll_loop(kind, bufs, n_coll, s_coll), s_coll)
        torch.cuda.synchronize(dev)
        t_alone = s.elapsed_time(e) / 1000 / n_coll
        # Together: the GEMMs span the collectives (a few more on each side).
        dist.barrier()
        n_both = agreed(max(n_gemm, int(n_coll * per_coll / per_gemm) + 4), dev)
        sg, eg = timed(lambda: gemm_loop(a, b, c, n_both, s_gemm), s_gemm)
        sc, ec = timed(lambda: coll_loop(kind, bufs, n_coll, s_coll), s_coll)
        torch.cuda.synchronize(dev)
        gemm_during = flops * n_both / (sg.elapsed_time(eg) / 1000) / 1e12
        t_during = sc.elapsed_time(ec) / 1000 / n_coll
        factor = BUSBW[kind](world)
        # nccl-tests' size: the whole output of an all_gather, the whole
        # input of a reduce_scatter.
        size = args.bytes * (1 if kind == "all_reduce" else world)

        def algbw(t):
            return size / t / 1e9

        rec = {
            "library": label, "coll": kind, "bytes": args.bytes, "world": world,
            "as_hosts": args.as_hosts, "max_ctas": args.max_ctas,
            "gemm_tflops_alone": round(gemm_alone, 1), "gemm_tflops_during": round(gemm_during, 1),
            "busbw_alone": round(algbw(t_alone) * factor, 2), "busbw_during": round(algbw(t_during) * factor, 2),
            "coll_ms_alone": round(t_alone * 1000, 3), "coll_ms_during": round(t_during * 1000, 3),
        }
        recs = [None] * world
        dist.all_gather_object(recs, rec)
        if rank == 0:
            lo = min(r["gemm_tflops_during"] for r in recs)
            print(f"{kind} {args.bytes >> 20} MiB x{world} [{label}]: GEMM {rec['gemm_tflops_alone']} TFLOP/s alone, "
                  f"{rec['gemm_tflops_during']} during (lowest rank {lo}); busbw {rec['busbw_alone']} GB/s alone, "
                  f"{rec['busbw_during']} during", flush=True)
            append_json(args.json, rec)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
