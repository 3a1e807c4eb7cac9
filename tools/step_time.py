"""Training step time on the loaded libnccl.so.2: DDP or FSDP2 on a stack
of bf16 Linear blocks (about 1.07 B parameters by default), time per step,
tokens/s and the losses, so that NCCL and oxccl run it in the same call and
their losses can be compared step by step.

  torchrun --nproc-per-node 2 step_time.py --mode ddp --json out.jsonl      # NCCL
  LD_PRELOAD=/path/oxccl/libnccl.so.2 torchrun --nproc-per-node 2 step_time.py --mode ddp ...
  python step_time.py --mode single --tokens 8192                           # one process, same global batch

--as-hosts gives each rank its own NCCL_HOSTID (two ranks on one GPU as
two hosts, through the network). Every rank draws its batch from the same
seeds whatever the library, so the losses match where the reductions do.
"""

import argparse
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch_rank import append_json, loaded_nccl, place



class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.up = nn.Linear(d, 4 * d, bias=False)
        self.down = nn.Linear(4 * d, d, bias=False)

    def forward(self, x):
        return x + self.down(torch.nn.functional.gelu(self.up(x)))


def model(d, layers, dev):
    torch.manual_seed(0)
    m = nn.Sequential(*[Block(d) for _ in range(layers)])
    return m.to(dev, dtype=torch.bfloat16)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mode", choices=["ddp", "fsdp", "single"], default="ddp")
    ap.add_argument("--dim", type=int, default=4096)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=4096, help="tokens per rank per step")
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--as-hosts", action="store_true")
    ap.add_argument("--json", help="append one JSON line (rank 0)")
    ap.add_argument("--label", default="")
    args = ap.parse_args()
    rank, world, dev = place(args.as_hosts, "step")
    distributed = args.mode != "single"
    if distributed:
        dist.init_process_group("nccl", device_id=dev)
    net = model(args.dim, args.layers, dev)
    nparams = sum(p.numel() for p in net.parameters())
    if args.mode == "ddp":
        net = nn.parallel.DistributedDataParallel(net, device_ids=[dev.index], bucket_cap_mb=100)
    elif args.mode == "fsdp":
        from torch.distributed.fsdp import fully_shard

        for blk in net:
            fully_shard(blk)
        fully_shard(net)
    opt = torch.optim.SGD(net.parameters(), lr=1e-3)
    losses, times = [], []
    for step in range(args.warmup + args.steps):
        g = torch.Generator(device=dev).manual_seed(step * 1000 + (rank if distributed else 0))
        x = torch.randn(args.tokens, args.dim, device=dev, dtype=torch.bfloat16, generator=g)
        torch.cuda.synchronize(dev)
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = net(x).float().pow(2).mean()
        loss.backward()
        opt.step()
        torch.cuda.synchronize(dev)
        if step >= args.warmup:
            times.append(time.perf_counter() - t0)
        lv = loss.detach()
        if distributed:
            dist.all_reduce(lv)
            lv /= world
        losses.append(round(lv.item(), 6))
    step_ms = 1000 * sum(times) / len(times)
    rec = {
        "library": args.label or ",".join(loaded_nccl()) or "none",
        "mode": args.mode, "world": world, "as_hosts": args.as_hosts,
        "params": nparams, "tokens_per_rank": args.tokens,
        "step_ms": round(step_ms, 2), "step_ms_min": round(1000 * min(times), 2),
        "tokens_per_s": round(args.tokens * world / (step_ms / 1000)),
        "losses": losses,
        "gpu_mem_gib": round(torch.cuda.max_memory_allocated(dev) / 2**30, 2),
    }
    if rank == 0:
        print(f"{args.mode} x{world} [{rec['library']}] {nparams / 1e9:.2f} B params: "
              f"{rec['step_ms']} ms/step (min {rec['step_ms_min']}), {rec['tokens_per_s']} tokens/s, "
              f"loss {losses[args.warmup]} -> {losses[-1]}", flush=True)
        append_json(args.json, rec)
    if distributed:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
