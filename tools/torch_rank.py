"""What the torchrun-launched comparison scripts share: where this rank
runs, and which libnccl.so.2 the process mapped (NCCL's or oxccl's, by
LD_PRELOAD), so that one script measures either library in the same call."""

import json
import os

import torch


def loaded_nccl():
    """The libnccl files this process mapped."""
    with open("/proc/self/maps") as f:
        return sorted({line.split()[-1] for line in f if "libnccl" in line})


def place(as_hosts, tag):
    """(rank, world, device) from torchrun's environment, with the device
    bound. `as_hosts` gives each rank its own NCCL_HOSTID, so that two ranks
    on one GPU are two hosts to NCCL and to oxccl alike (NCCL refuses two
    ranks of one host on one GPU); set before the process group is made."""
    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if as_hosts:
        os.environ["NCCL_HOSTID"] = f"{tag}-host-{rank}"
    dev = torch.device("cuda", local % torch.cuda.device_count())
    torch.cuda.set_device(dev)
    return rank, world, dev


def append_json(path, rec):
    """One JSON line per record, appended to `path` (None: nothing)."""
    if path:
        with open(path, "a") as f:
            f.write(json.dumps(rec) + "\n")
