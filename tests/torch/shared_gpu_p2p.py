"""Point-to-point between processes on GPU 0 (torchrun, any world size):
ungrouped dist.send/recv in a ping-pong along the ring (even ranks send
first, odd ranks receive first), batch_isend_irecv to both neighbours, and
all_to_all_single, each on random data checked against what the sender
holds, with the time per round. Exits 1 on any wrong element.

  LD_PRELOAD=libnccl.so.2 torchrun --nproc-per-node N shared_gpu_p2p.py
"""

import os
import sys
import time

import torch
import torch.distributed as dist


def data(rank, size, salt):
    g = torch.Generator().manual_seed(salt * 1000 + rank)
    return torch.randn(size, generator=g).cuda()


def main():
    dist.init_process_group("nccl", device_id=torch.device("cuda", 0))
    rank, n = dist.get_rank(), dist.get_world_size()
    nxt, prv = (rank + 1) % n, (rank - 1) % n
    wrong, rows = 0, []
    for size in (2, 1024, 1 << 20, 16 << 20):
        # Ungrouped, ordered so that no rank waits for itself.
        t = time.perf_counter()
        for it in range(5):
            mine, got = data(rank, size, it), torch.empty(size, device="cuda")
            if rank % 2 == 0:
                dist.send(mine, nxt)
                dist.recv(got, prv)
            else:
                dist.recv(got, prv)
                dist.send(mine, nxt)
            wrong += int((got != data(prv, size, it)).sum())
        torch.cuda.synchronize()
        ping = (time.perf_counter() - t) / 5
        # Grouped, to both neighbours at once.
        t = time.perf_counter()
        for it in range(5):
            mine = data(rank, size, 10 + it)
            a, b = torch.empty(size, device="cuda"), torch.empty(size, device="cuda")
            ops = [
                dist.P2POp(dist.isend, mine, nxt),
                dist.P2POp(dist.isend, mine, prv),
                dist.P2POp(dist.irecv, a, prv),
                dist.P2POp(dist.irecv, b, nxt),
            ]
            for w in dist.batch_isend_irecv(ops):
                w.wait()
            wrong += int((a != data(prv, size, 10 + it)).sum())
            wrong += int((b != data(nxt, size, 10 + it)).sum())
        torch.cuda.synchronize()
        batch = (time.perf_counter() - t) / 5
        # All-to-all: block j of rank r's input goes to rank j.
        per = max(size // n, 1)
        mine = data(rank, per * n, 20)
        got = torch.empty(per * n, device="cuda")
        dist.all_to_all_single(got, mine)
        want = torch.cat([data(r, per * n, 20)[rank * per:(rank + 1) * per] for r in range(n)])
        wrong += int((got != want).sum())
        rows.append(f"{size * 4:>10} B: send/recv ring {ping * 1e6:9.1f} us, batch to both {batch * 1e6:9.1f} us")
    total = torch.tensor([wrong], device="cuda")
    dist.all_reduce(total)
    if rank == 0:
        print("\n".join(rows))
        print(f"{n} processes on GPU 0, point-to-point: {int(total)} wrong")
    dist.destroy_process_group()
    sys.exit(1 if int(total) else 0)


if __name__ == "__main__":
    main()
