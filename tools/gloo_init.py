"""Time to a ready torch.distributed Gloo process group of N local processes
on host memory, in the columns of `oxccl perf --ranks N --init-only`, for
comparing the two at the same counts on one machine:

  /opt/torch/.venv/bin/python tools/gloo_init.py 16 64 256

For each count it starts that many processes (this script, as ranks); each
times init_process_group("gloo") over a TCP store on loopback plus one
barrier (Gloo connects its pairs lazily in some versions: the barrier makes
every rank talk before it counts as ready), and rank 0 prints the slowest
rank's time and the span from the first rank's call to the last rank ready
(by the wall clock, which the processes of one machine share). As `oxccl
perf`, it counts from the init call: Python's and torch's start-up are
outside both.
"""

import os
import socket
import subprocess
import sys
import time


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_main():
    import torch
    import torch.distributed as dist

    rank, n = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    start = time.time()
    t = time.perf_counter()
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{os.environ['MASTER_PORT']}",
        rank=rank,
        world_size=n,
    )
    dist.barrier()
    took = time.perf_counter() - t
    end = time.time()
    v = torch.tensor([took, end, -start], dtype=torch.float64)
    dist.all_reduce(v, op=dist.ReduceOp.MAX)
    if rank == 0:
        print(f"  {n:>6} {v[0].item() * 1e3:>14.1f} {(v[1] + v[2]).item() * 1e3:>14.1f}", flush=True)
    dist.destroy_process_group()


def launch(n):
    env = dict(os.environ, WORLD_SIZE=str(n), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()),
               GLOO_SOCKET_IFNAME=os.environ.get("GLOO_SOCKET_IFNAME", "lo"), OMP_NUM_THREADS="1")
    procs = [subprocess.Popen([sys.executable, __file__, "--rank"], env=dict(env, RANK=str(r)))
             for r in range(n)]
    codes = [p.wait() for p in procs]
    if any(codes):
        print(f"# {n} ranks: exit codes {sorted(set(codes))}", file=sys.stderr)
        return 1
    return 0


def main():
    if sys.argv[1:] == ["--rank"]:
        return rank_main()
    counts = [int(a) for a in sys.argv[1:]] or [16]
    import torch

    print(f"# gloo init + barrier, torch {torch.__version__}, processes on this machine, host memory")
    print(f"# {'ranks':>6} {'max_init(ms)':>14} {'span(ms)':>14}", flush=True)
    return max(launch(n) for n in counts)


if __name__ == "__main__":
    sys.exit(main() or 0)
