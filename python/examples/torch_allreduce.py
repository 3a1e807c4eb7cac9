"""PyTorch's nccl backend on oxccl: a checked all_reduce over 2 ranks.

    oxccl-run -- torchrun --nproc-per-node 2 torch_allreduce.py

Each rank takes GPU LOCAL_RANK (modulo the GPUs there are: with one GPU
both ranks share it, which oxccl allows). Sizes from 1 to 16M float32
elements; rank r holds (r + 1) * (i % 1000), so the sum is
(1 + ... + world) * (i % 1000), exact in float32. Rank 0 prints one line:
#wrong over all ranks, the libnccl files this process mapped and which one
the process's NCCL symbols bind to. torch maps its own libnccl.so.2 by path
as well (torch/__init__.py preloads its CUDA libraries), and
torch.cuda.nccl.version() is the version torch was built against, so
neither tells which library runs: where LD_PRELOAD names a libnccl.so.2,
ncclGetVersion as the process's global scope resolves it (the lookup
libtorch's calls go through) must be that library's. Exit code 0 when all
is right.
"""

import ctypes
import os
import sys

import torch
import torch.distributed as dist


def mapped_nccl():
    with open("/proc/self/maps") as f:
        return sorted({l.split()[-1] for l in f if "libnccl" in l})


def bound_to(path):
    """Whether the process's global ncclGetVersion is the one in `path`."""
    glob = ctypes.cast(ctypes.CDLL(None).ncclGetVersion, ctypes.c_void_p).value
    mine = ctypes.cast(ctypes.CDLL(path).ncclGetVersion, ctypes.c_void_p).value
    return glob == mine


def global_version():
    v = ctypes.c_int(0)
    ctypes.CDLL(None).ncclGetVersion(ctypes.byref(v))
    return v.value


def main():
    local = int(os.environ.get("LOCAL_RANK", "0"))
    dev = torch.device("cuda", local % torch.cuda.device_count())
    torch.cuda.set_device(dev)
    dist.init_process_group("nccl", device_id=dev)
    rank, world = dist.get_rank(), dist.get_world_size()
    wrong = torch.zeros(1, dtype=torch.int64, device=dev)
    sizes = [1, 1000, 1 << 16, 1 << 20, 1 << 24]
    for n in sizes:
        pattern = (torch.arange(n, device=dev) % 1000).float()
        t = pattern * (rank + 1)
        dist.all_reduce(t)
        wrong += (t != pattern * (world * (world + 1) // 2)).sum()
    dist.all_reduce(wrong)
    torch.cuda.synchronize()
    libs = mapped_nccl()
    preload = [p for p in os.environ.get("LD_PRELOAD", "").replace(" ", ":").split(":")
               if p.endswith("libnccl.so.2")]
    lib_ok = not preload or bound_to(preload[0])
    ok = wrong.item() == 0 and lib_ok
    if rank == 0:
        print(
            f"torch all_reduce (nccl backend): {world} ranks on {torch.cuda.device_count()} GPU(s), "
            f"float32 {sizes[0]}..{sizes[-1]} elements, #wrong {wrong.item()}; "
            f"ncclGetVersion {global_version()}; mapped {', '.join(libs) or 'no libnccl'}; "
            f"NCCL symbols {'bound to the preloaded one' if lib_ok else 'NOT bound to the preloaded one'}: "
            f"{'OK' if ok else 'FAILED'}",
            flush=True,
        )
    dist.destroy_process_group()
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
