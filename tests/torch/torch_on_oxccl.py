"""PyTorch's NCCL backend on oxccl: collectives checked against a float64
reference, and 20 steps of DDP training whose losses are written out so
that a run on NCCL and a run on oxccl can be compared.

Run on a machine with 2 GPUs (see run_torch_check.sh next to this file):

  torchrun --nproc-per-node 2 torch_on_oxccl.py OUT.json            # NCCL
  LD_PRELOAD=/path/to/oxccl/libnccl.so.2 \\
  torchrun --nproc-per-node 2 torch_on_oxccl.py OUT.json            # oxccl
  python torch_on_oxccl.py --compare NCCL.json OXCCL.json

LD_PRELOAD makes the dynamic loader take oxccl's libnccl.so.2 (same SONAME)
for PyTorch's DT_NEEDED entry, whatever RPATH torch carries.
"""

import json
import os
import sys

import torch
import torch.distributed as dist


def loaded_nccl():
    """The libnccl this process actually mapped."""
    with open("/proc/self/maps") as f:
        libs = {line.split()[-1] for line in f if "libnccl" in line}
    return sorted(libs)


def rank_data(r, n, seed, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed * 1000 + r)
    return torch.randn(n, generator=g, dtype=torch.float64).to(dtype)


def close(got, want, what, rtol=1e-5, atol=1e-5):
    got = got.double().cpu()
    want = want.double().cpu()
    ok = torch.allclose(got, want, rtol=rtol, atol=atol)
    err = (got - want).abs().max().item() if got.numel() else 0.0
    return {"check": what, "ok": bool(ok), "max_abs_err": err}


def collectives(rank, world, dev):
    res = []
    n = 1_000_003
    inputs = [rank_data(r, n, 1) for r in range(world)]
    ref_sum = sum(x.double() for x in inputs)
    for op, want in [
        (dist.ReduceOp.SUM, ref_sum),
        (dist.ReduceOp.AVG, ref_sum / world),
        (dist.ReduceOp.MAX, torch.stack([x.double() for x in inputs]).max(0).values),
    ]:
        t = inputs[rank].clone().to(dev)
        dist.all_reduce(t, op=op)
        res.append(close(t, want, f"all_reduce {op}"))

    t = inputs[rank].clone().to(dev)
    dist.broadcast(t, src=1 % world)
    res.append(close(t, inputs[1 % world], "broadcast src=1"))

    m = 4099
    parts = [rank_data(r, m, 2) for r in range(world)]
    out = torch.empty(world * m, device=dev)
    dist.all_gather_into_tensor(out, parts[rank].to(dev))
    res.append(close(out, torch.cat(parts), "all_gather_into_tensor"))

    full = [rank_data(r, world * m, 3) for r in range(world)]
    out = torch.empty(m, device=dev)
    dist.reduce_scatter_tensor(out, full[rank].to(dev))
    want = sum(x.double() for x in full)[rank * m:(rank + 1) * m]
    res.append(close(out, want, "reduce_scatter_tensor"))

    blocks = [rank_data(r, world * m, 4) for r in range(world)]
    out = torch.empty(world * m, device=dev)
    dist.all_to_all_single(out, blocks[rank].to(dev))
    want = torch.cat([blocks[p][rank * m:(rank + 1) * m] for p in range(world)])
    res.append(close(out, want, "all_to_all_single"))

    if world >= 2:
        if rank == 0:
            dist.send(rank_data(0, m, 5).to(dev), dst=1)
        elif rank == 1:
            t = torch.empty(m, device=dev)
            dist.recv(t, src=0)
            res.append(close(t, rank_data(0, m, 5), "send/recv 0->1"))

    dist.barrier()
    res.append({"check": "barrier", "ok": True, "max_abs_err": 0.0})

    sub = dist.new_group(ranks=list(range(world)))
    t = inputs[rank].clone().to(dev)
    dist.all_reduce(t, group=sub)
    res.append(close(t, ref_sum, "all_reduce on new_group"))
    dist.destroy_process_group(sub)
    return res


def ddp_losses(rank, dev, steps=20):
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(32, 64), torch.nn.Tanh(), torch.nn.Linear(64, 1)
    ).to(dev)
    ddp = DDP(model, device_ids=[dev.index])
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(100 + rank)
    x = torch.randn(256, 32, generator=g).to(dev)
    y = torch.randn(256, 1, generator=g).to(dev)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(ddp(x), y)
        loss.backward()
        opt.step()
        t = loss.detach().clone()
        dist.all_reduce(t, op=dist.ReduceOp.AVG)
        losses.append(t.item())
    return losses


def run(out_path):
    local = int(os.environ["LOCAL_RANK"])
    dev = torch.device("cuda", local)
    torch.cuda.set_device(dev)
    dist.init_process_group("nccl", device_id=dev)
    rank, world = dist.get_rank(), dist.get_world_size()
    report = {
        "rank": rank,
        "world": world,
        "torch": torch.__version__,
        "nccl_version_reported": ".".join(map(str, torch.cuda.nccl.version())),
        "libnccl_mapped": loaded_nccl(),
        "gpu": torch.cuda.get_device_name(dev),
    }
    report["collectives"] = collectives(rank, world, dev)
    report["ddp_losses"] = ddp_losses(rank, dev)
    torch.cuda.synchronize()
    dist.destroy_process_group()
    bad = [c for c in report["collectives"] if not c["ok"]]
    print(f"rank {rank}: {len(report['collectives']) - len(bad)}/{len(report['collectives'])} checks ok; "
          f"libnccl {report['libnccl_mapped']}; final DDP loss {report['ddp_losses'][-1]:.6f}", flush=True)
    for c in bad:
        print(f"rank {rank}: FAILED {c}", flush=True)
    if rank == 0:
        with open(out_path, "w") as f:
            json.dump(report, f, indent=1)
    sys.exit(1 if bad else 0)


def compare(a_path, b_path):
    a, b = json.load(open(a_path)), json.load(open(b_path))
    print(f"{a_path}: {a['libnccl_mapped']}")
    print(f"{b_path}: {b['libnccl_mapped']}")
    worst = 0.0
    print(f"{'step':>4} {'loss (A)':>14} {'loss (B)':>14} {'rel diff':>10}")
    for i, (x, y) in enumerate(zip(a["ddp_losses"], b["ddp_losses"])):
        rel = abs(x - y) / max(abs(x), 1e-30)
        worst = max(worst, rel)
        print(f"{i:>4} {x:>14.8f} {y:>14.8f} {rel:>10.2e}")
    ok = worst <= 1e-5 and len(a["ddp_losses"]) == len(b["ddp_losses"]) == 20
    print(f"largest relative difference {worst:.2e}: {'MATCH' if ok else 'MISMATCH'} (bound 1e-5)")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--compare":
        compare(sys.argv[2], sys.argv[3])
    elif len(sys.argv) == 2:
        run(sys.argv[1])
    else:
        print(__doc__)
        sys.exit(2)
