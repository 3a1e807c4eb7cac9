"""DDP with every rank on GPU 0 (what NCCL refuses), against one process
training on the whole global batch: the losses must match to within float
rounding, since DDP averages the ranks' gradients and every rank holds an
equal share of the batch.

  python shared_gpu_ddp.py single N OUT.json      # one process, N shares
  torchrun --nproc-per-node N shared_gpu_ddp.py dist OUT.json [--no-device-id]
  python shared_gpu_ddp.py compare A.json B.json

Prints the time per step (after 3 warm-up steps) beside the losses.
"""

import json
import os
import sys
import time

import torch
import torch.distributed as dist

STEPS = 20
PER_RANK = 256


def model_and_data(shares, dev):
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(32, 64), torch.nn.Tanh(), torch.nn.Linear(64, 1)
    ).to(dev)
    xs, ys = [], []
    for r in shares:
        g = torch.Generator().manual_seed(100 + r)
        xs.append(torch.randn(PER_RANK, 32, generator=g))
        ys.append(torch.randn(PER_RANK, 1, generator=g))
    return model, torch.cat(xs).to(dev), torch.cat(ys).to(dev)


def train(model, x, y, step_loss):
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    losses, times = [], []
    for i in range(STEPS):
        torch.cuda.synchronize()
        t = time.perf_counter()
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        losses.append(step_loss(loss.detach()))
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    return losses, sum(times[3:]) / (STEPS - 3)


def single(n, out):
    dev = torch.device("cuda", 0)
    model, x, y = model_and_data(range(n), dev)
    losses, dt = train(model, x, y, lambda l: l.item())
    json.dump({"what": f"1 process, {n} shares", "losses": losses, "step_s": dt}, open(out, "w"))


def distributed(out, device_id):
    from torch.nn.parallel import DistributedDataParallel as DDP

    dev = torch.device("cuda", 0)
    torch.cuda.set_device(dev)
    if device_id:
        dist.init_process_group("nccl", device_id=dev)
    else:
        dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    model, x, y = model_and_data([rank], dev)
    ddp = DDP(model, device_ids=[0])

    def mean(l):
        t = l.clone()
        dist.all_reduce(t, op=dist.ReduceOp.AVG)
        return t.item()

    losses, dt = train(ddp, x, y, mean)
    dist.destroy_process_group()
    if rank == 0:
        what = f"{world} processes on GPU 0, device_id {'set' if device_id else 'unset'}"
        json.dump({"what": what, "losses": losses, "step_s": dt}, open(out, "w"))
    print(f"rank {rank}: final loss {losses[-1]:.8f}, {dt * 1e3:.2f} ms per step", flush=True)


def compare(a, b):
    a, b = json.load(open(a)), json.load(open(b))
    worst = max(abs(x - y) / max(abs(x), 1e-30) for x, y in zip(a["losses"], b["losses"]))
    ok = worst <= 1e-5 and len(a["losses"]) == len(b["losses"]) == STEPS
    print(f"{b['what']}: {b['step_s'] * 1e3:.2f} ms per step; {a['what']}: {a['step_s'] * 1e3:.2f} ms; "
          f"final loss {b['losses'][-1]:.8f} vs {a['losses'][-1]:.8f}; largest relative difference "
          f"{worst:.2e}: {'MATCH' if ok else 'MISMATCH'} (bound 1e-5)")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    mode = sys.argv[1] if len(sys.argv) > 1 else ""
    if mode == "single":
        single(int(sys.argv[2]), sys.argv[3])
    elif mode == "dist":
        distributed(sys.argv[2], "--no-device-id" not in sys.argv)
    elif mode == "compare":
        compare(sys.argv[2], sys.argv[3])
    else:
        print(__doc__)
        sys.exit(2)
