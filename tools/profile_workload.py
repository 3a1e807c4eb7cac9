"""One fixed sequence of collectives through torch.distributed's NCCL
backend, for running the same program under NCCL and under oxccl
(LD_PRELOAD of oxccl's libnccl.so.2) with a profiler plugin loaded, so that
what the plugin records can be compared (tools/profiler_side_by_side.sh).

Per size (float32, SIZES bytes, default 4K,1M,16M): 3 all_reduce, one
broadcast, reduce, all_gather, reduce_scatter, all_to_all, and a batch of
one send to the next rank and one receive from the previous. Each result
is checked against the exact value; rank 0 prints one line per size.
Every rank uses GPU LOCAL_RANK modulo the GPUs present.
"""

import os

import torch
import torch.distributed as dist


def parse(s):
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    s = s.strip().upper()
    return int(s[:-1]) * mult[s[-1]] if s[-1] in mult else int(s)


def main():
    sizes = [parse(s) for s in os.environ.get("SIZES", "4K,1M,16M").split(",")]
    local = int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count()
    dev = torch.device("cuda", local)
    torch.cuda.set_device(dev)
    dist.init_process_group("nccl", device_id=dev)
    rank, n = dist.get_rank(), dist.get_world_size()
    bad = 0
    for size in sizes:
        count = max(size // 4, n) // n * n
        x = torch.full((count,), float(rank + 1), device=dev)
        for _ in range(3):
            y = x.clone()
            dist.all_reduce(y)
            bad += int((y != n * (n + 1) / 2).sum())
        y = x.clone()
        dist.broadcast(y, 0)
        bad += int((y != 1.0).sum())
        y = x.clone()
        dist.reduce(y, 0)
        if rank == 0:
            bad += int((y != n * (n + 1) / 2).sum())
        g = torch.empty(count * n, device=dev)
        dist.all_gather_into_tensor(g, x)
        want = torch.arange(1, n + 1, device=dev, dtype=torch.float32).repeat_interleave(count)
        bad += int((g != want).sum())
        s = torch.empty(count // n, device=dev)
        dist.reduce_scatter_tensor(s, x)
        bad += int((s != n * (n + 1) / 2).sum())
        a = torch.empty(count, device=dev)
        dist.all_to_all_single(a, x)
        want = torch.arange(1, n + 1, device=dev, dtype=torch.float32).repeat_interleave(count // n)
        bad += int((a != want).sum())
        r = torch.empty(count, device=dev)
        ops = [
            dist.P2POp(dist.isend, x, (rank + 1) % n),
            dist.P2POp(dist.irecv, r, (rank + n - 1) % n),
        ]
        for w in dist.batch_isend_irecv(ops):
            w.wait()
        bad += int((r != float((rank + n - 1) % n + 1)).sum())
        torch.cuda.synchronize()
        if rank == 0:
            print(f"size {size} B: 9 calls, wrong so far {bad}", flush=True)
    t = torch.tensor([bad], device=dev)
    dist.all_reduce(t)
    if rank == 0:
        print(f"#wrong {int(t.item())}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
