"""Send/recv latency after a pause, for ranks sharing one GPU (issue 17).

Rank 0 sends 8 bytes to rank 1 every `gap` seconds; each rank times its
own call plus a stream synchronize, and rank 1 prints the median and the
largest. A copy thread that sleeps between messages shows here, not in a
back-to-back benchmark. Run under torchrun with oxccl's libnccl.so.2 in
LD_PRELOAD:

    LD_PRELOAD=.../libnccl.so.2 torchrun --nproc-per-node 2 tools/p2p_after_idle.py 0.02 30
"""
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist


def main():
    gap = float(sys.argv[1]) if len(sys.argv) > 1 else 0.02
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 30
    rank = int(os.environ["RANK"])
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", device_id=torch.device("cuda", 0))
    buf = torch.full((2,), float(rank), device="cuda")
    times = []
    for i in range(rounds + 2):
        time.sleep(gap)
        t0 = time.perf_counter()
        if rank == 0:
            buf.fill_(float(i))
            dist.send(buf, 1)
        else:
            dist.recv(buf, 0)
        torch.cuda.synchronize()
        dt = (time.perf_counter() - t0) * 1e6
        if rank == 1 and buf[0].item() != float(i):
            print(f"round {i}: got {buf[0].item()}, wanted {i}: WRONG", flush=True)
            sys.exit(1)
        if i >= 2:
            times.append(dt)
    if rank == 1:
        print(
            f"after {gap * 1e3:.0f} ms pauses, {rounds} messages of 8 B: "
            f"median {statistics.median(times):.1f} us, largest {max(times):.1f} us, 0 wrong",
            flush=True,
        )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
