"""all_reduce on host memory with torch.distributed's Gloo backend, in the
columns of `oxccl perf` (time per call, algbw, busbw), for comparing the two
on one machine in one run:

  python -m torch.distributed.run --nproc-per-node 4 tools/gloo_bench.py 1M 256M

Sizes are bytes of float32 per rank (K/M/G suffixes), doubling by 4 from the
first to the last. Rank 0 prints one row per size.

`oxccl perf` puts its host buffers on transparent huge pages (see
cli/src/hostmem.rs); PyTorch does the same for CPU tensors of 2 MiB and more
with THP_MEM_ALLOC_ENABLE=1 (C10_THP_MEM_ALLOC_ENABLE=1 in later versions),
so compare with those set too. The header says whether they are.
"""

import os
import sys
import time

import torch
import torch.distributed as dist


def parse(s):
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    s = s.strip().upper()
    return int(s[:-1]) * mult[s[-1]] if s[-1] in mult else int(s)


def main():
    lo, hi = parse(sys.argv[1]), parse(sys.argv[2])
    iters = int(os.environ.get("ITERS", "10"))
    dist.init_process_group("gloo")
    rank, n = dist.get_rank(), dist.get_world_size()
    if rank == 0:
        thp = [k for k in ("THP_MEM_ALLOC_ENABLE", "C10_THP_MEM_ALLOC_ENABLE") if os.environ.get(k, "0") != "0"]
        print(f"# gloo all_reduce, {n} ranks, float32, {iters} iterations, host memory"
              f" ({'huge pages asked: ' + ', '.join(thp) if thp else 'no huge pages asked'})")
        print(f"# {'size(B)':>12} {'time(us)':>12} {'algbw':>8} {'busbw':>8}")
    size = lo
    while size <= hi:
        x = torch.ones(size // 4, dtype=torch.float32)
        for _ in range(2):
            dist.all_reduce(x)
        dist.barrier()
        t = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(x)
        dist.barrier()
        dt = (time.perf_counter() - t) / iters
        algbw = size / dt / 1e9
        if rank == 0:
            print(f"  {size:>12} {dt * 1e6:>12.1f} {algbw:>8.2f} {algbw * 2 * (n - 1) / n:>8.2f}", flush=True)
        size *= 4
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
