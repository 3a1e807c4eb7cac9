"""A collective through torch.distributed's NCCL backend (NCCL itself, or
oxccl when its libnccl.so.2 is preloaded), in the columns of `oxccl perf`,
for comparing the two in one run on the same machine:

  tools/netns_run.sh python tools/torch_bench.py all_reduce 8 1G

OP is all_reduce, broadcast, reduce (root 0), all_gather, reduce_scatter,
all_to_all or sendrecv (each rank sends to the next, receives from the
previous, in one batch).

Sizes are bytes per rank of float32, multiplied by FACTOR (default 8) from
the first to the last; ITERS (default 20) timed calls after 5 warm-up
calls, timed with CUDA events on the current stream. Every rank uses GPU
LOCAL_RANK modulo the GPUs it sees (so ranks of network namespaces share
GPU 0, and 4 processes on 2 GPUs put two on each, which only oxccl runs). Each size is
checked once: all_reduce of rank-dependent values against the exact sum.
Rank 0 prints one row per size. BENCH_LABEL names the library in the
header (default: oxccl when LD_PRELOAD names it, else NCCL's version).
"""

import os
import sys

import torch
import torch.distributed as dist


def parse(s):
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    s = s.strip().upper()
    return int(s[:-1]) * mult[s[-1]] if s[-1] in mult else int(s)


def main():
    op, lo, hi = sys.argv[1], parse(sys.argv[2]), parse(sys.argv[3])
    iters = int(os.environ.get("ITERS", "20"))
    factor = int(os.environ.get("FACTOR", "8"))
    # More local ranks than GPUs share them (rank i on GPU i % GPUs), which
    # NCCL refuses and oxccl runs.
    dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
    torch.cuda.set_device(dev)
    dist.init_process_group("nccl", device_id=dev)
    rank, n = dist.get_rank(), dist.get_world_size()
    bus = {
        "all_reduce": 2 * (n - 1) / n,
        "broadcast": 1.0,
        "reduce": 1.0,
        "all_gather": (n - 1) / n,
        "reduce_scatter": (n - 1) / n,
        "all_to_all": (n - 1) / n,
        "sendrecv": 1.0,
    }[op]
    if rank == 0:
        lib = os.environ.get("BENCH_LABEL") or (
            "oxccl" if "oxccl" in os.environ.get("LD_PRELOAD", "") else f"NCCL {torch.cuda.nccl.version()}"
        )
        print(f"# torch {torch.__version__} {op} over {lib}, {n} ranks, float32, {iters} iterations")
        print(f"# {'size(B)':>12} {'time(us)':>12} {'algbw':>8} {'busbw':>8} {'#wrong':>7}")
    size = lo
    while size <= hi:
        count = max(size // 4, 1)
        if op == "all_to_all":
            count = max(count // n, 1) * n
        x = torch.full((count * n if op == "reduce_scatter" else count,), float(rank + 1), device=dev)
        out = torch.empty(count * n, device=dev) if op == "all_gather" else None
        if op in ("reduce_scatter", "all_to_all", "sendrecv"):
            out = torch.empty(count, device=dev)
        ranks = torch.arange(1, n + 1, device=dev, dtype=torch.float32)

        def call():
            if op == "all_reduce":
                dist.all_reduce(x)
            elif op == "broadcast":
                dist.broadcast(x, 0)
            elif op == "reduce":
                dist.reduce(x, 0)
            elif op == "all_gather":
                dist.all_gather_into_tensor(out, x)
            elif op == "reduce_scatter":
                dist.reduce_scatter_tensor(out, x)
            elif op == "all_to_all":
                dist.all_to_all_single(out, x)
            else:
                ops = [dist.P2POp(dist.isend, x, (rank + 1) % n), dist.P2POp(dist.irecv, out, (rank - 1) % n)]
                for r in dist.batch_isend_irecv(ops):
                    r.wait()

        call()
        if op == "all_reduce" or (op == "reduce" and rank == 0):
            wrong = int((x != n * (n + 1) / 2).sum())
        elif op == "reduce":
            wrong = 0
        elif op == "broadcast":
            wrong = int((x != 1.0).sum())
        elif op == "all_gather":
            wrong = int((out != ranks.repeat_interleave(count)).sum())
        elif op == "reduce_scatter":
            wrong = int((out != n * (n + 1) / 2).sum())
        elif op == "all_to_all":
            wrong = int((out != ranks.repeat_interleave(count // n)).sum())
        else:
            wrong = int((out != float((rank - 1) % n + 1)).sum())
        for _ in range(5):
            call()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        for _ in range(iters):
            call()
        end.record()
        torch.cuda.synchronize()
        dt = start.elapsed_time(end) / 1e3 / iters
        algbw = count * 4 / dt / 1e9
        if rank == 0:
            print(f"  {count * 4:>12} {dt * 1e6:>12.1f} {algbw:>8.2f} {algbw * bus:>8.2f} {wrong:>7}", flush=True)
        size *= factor
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
