"""Recovery from a lost rank with PyTorch's NCCL backend on oxccl (issue 16).

N ranks (4 unless --nproc) run checked all_reduces of CUDA tensors; rank 1
SIGKILLs itself inside the stream. The survivors see the failure (the
work's exception, from ncclCommGetAsyncError), take the exclude list from
oxccl's error text ("[oxccl failure: ranks=1 seq=N op=all_reduce]") or,
where the text has none, from the ranks that still answer on the store,
drop the dead rank with torch.distributed.shrink_group (ncclCommShrink; in
PyTorch since 2.10) and run 100 more all_reduces, each checked against a
float64 reference. One GPU is enough: oxccl lets the ranks share it.

  LD_PRELOAD=$PWD/target/release/libnccl.so NCCL_TIMEOUT=10 \\
    python tests/torch/elastic_shrink.py [--nproc 4] [--mode default|abort]

This script starts the ranks itself rather than under torchrun, whose agent
ends every worker as soon as one dies. Each rank's output goes to
$OUT/elastic_rank<r>.log (OUT defaults to /tmp/oxccl-elastic); the summary
and the exit status (0: every survivor recovered with 0 wrong) come here.
The whole run is bounded (LIMIT, 240 s). --mode abort asks for
NCCL_SHRINK_ABORT: oxccl first ends the parent's operations still on the
GPU (kernels return at their next poll of the communicator's stop word;
the shared-GPU path's stream waits are released), then shrinks.
"""

import argparse
import datetime
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time

VICTIM = 1
COUNT = 1 << 16
RECORD = re.compile(r"\[oxccl failure: ranks=([0-9,]+|none) seq=(\S+) op=([^\]]+)\]")


def say(rank, msg):
    print(f"[{time.strftime('%H:%M:%S')}] rank {rank}: {msg}", flush=True)


def data(global_rank, it):
    import torch

    g = torch.Generator().manual_seed(it * 1000 + global_rank)
    return torch.randn(COUNT, generator=g, dtype=torch.float64)


def checked_all_reduce(members, me, it, group, dev, limit):
    """One all_reduce of iteration it's data (each member's by its global
    rank) on group; the number of wrong elements. Raises the work's
    exception, or TimeoutError when it neither completes nor fails in limit s."""
    import torch
    import torch.distributed as dist

    t = data(me, it).float().to(dev)
    work = dist.all_reduce(t, group=group, async_op=True)
    deadline = time.monotonic() + limit
    while not work.is_completed():
        if time.monotonic() > deadline:
            raise TimeoutError(f"all_reduce #{it} neither completed nor failed in {limit} s")
        time.sleep(0.0005)
    work.wait()
    want = sum(data(r, it) for r in members)
    got = t.double().cpu()
    return int((~torch.isclose(got, want, rtol=1e-4, atol=1e-3)).sum().item())


def exclude_from_store(store, rank, world, wait_s):
    """The ranks that did not say they are alive within wait_s."""
    store.set(f"alive/{rank}", "1")
    time.sleep(wait_s)
    return [r for r in range(world) if not store.check([f"alive/{r}"])]


def rank_main(mode):
    import torch
    import torch.distributed as dist

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dev = torch.device("cuda", rank % torch.cuda.device_count())
    torch.cuda.set_device(dev)
    with open("/proc/self/maps") as f:
        libs = sorted({ln.split()[-1] for ln in f if "libnccl" in ln})
    dist.init_process_group(
        "nccl", device_id=dev, timeout=datetime.timedelta(seconds=int(os.environ.get("PG_TIMEOUT", "60")))
    )
    say(rank, f"torch {torch.__version__}, {dev}, NCCL {torch.cuda.nccl.version()}, libnccl {libs}")
    if not hasattr(dist, "shrink_group"):
        say(rank, "SKIP: this PyTorch has no torch.distributed.shrink_group (it came in 2.10)")
        os._exit(0)
    store = dist.distributed_c10d._get_default_store()
    members = list(range(world))
    for it in range(5):
        assert checked_all_reduce(members, rank, it, None, dev, 60) == 0, f"warm-up all_reduce #{it} wrong"
    if rank == VICTIM:
        def die():
            time.sleep(1.0)
            store.set("killed_at", repr(time.time()))
            os.kill(os.getpid(), signal.SIGKILL)

        threading.Thread(target=die, daemon=True).start()
    it, err = 5, None
    fail_limit = float(os.environ.get("FAIL_LIMIT", "60"))
    while err is None:
        try:
            wrong = checked_all_reduce(members, rank, it, None, dev, fail_limit)
        except Exception as e:  # the failure this script is about
            err = e
            break
        assert wrong == 0, f"all_reduce #{it}: {wrong} wrong before the failure"
        it += 1
    failed_at = time.time()
    killed_at = float(store.get("killed_at").decode()) if store.check(["killed_at"]) else None
    detect = f"{(failed_at - killed_at) * 1e3:.0f} ms after the kill" if killed_at else "(kill time unknown)"
    say(rank, f"all_reduce #{it} failed {detect}: {type(err).__name__}: {str(err)[:2000]}")
    m = RECORD.search(str(err))
    from_oxccl = None if not m else ([] if m.group(1) == "none" else [int(x) for x in m.group(1).split(",")])
    from_store = exclude_from_store(store, rank, world, 3.0)
    say(rank, f"exclude list from oxccl's error: {from_oxccl}; from the store: {from_store}")
    exclude = from_oxccl if from_oxccl else from_store
    if exclude != [VICTIM]:
        say(rank, f"FAIL: exclude list {exclude}, expected [{VICTIM}]")
        os._exit(1)
    flags = {"default": 0, "abort": 1}[mode]  # NCCL_SHRINK_DEFAULT, NCCL_SHRINK_ABORT
    t = time.monotonic()
    try:
        group = dist.shrink_group(exclude, shrink_flags=flags)
    except Exception as e:
        say(rank, f"FAIL: shrink_group({exclude}, shrink_flags={flags}): {type(e).__name__}: {e}")
        os._exit(1)
    shrink_ms = (time.monotonic() - t) * 1e3
    survivors = [r for r in members if r not in exclude]
    say(rank, f"shrink_group in {shrink_ms:.1f} ms: rank {dist.get_rank(group)} of {dist.get_world_size(group)}")
    wrong = sum(checked_all_reduce(survivors, rank, 1000 + i, group, dev, 60) for i in range(100))
    say(rank, f"{'PASS' if wrong == 0 else 'FAIL'}: detect {detect}, shrink {shrink_ms:.1f} ms, "
              f"100 all_reduces after it: {wrong} wrong")
    # Tearing the parent down may wait on the dead rank: the result is in.
    os._exit(0 if wrong == 0 else 1)


def launch(nproc, mode, out):
    os.makedirs(out, exist_ok=True)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE=str(nproc))
    # The watchdog must not end the survivors (1 and 3 do) nor the monitor
    # kill a stuck one: recovery is the script's job here.
    env.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "0")
    env.setdefault("TORCH_NCCL_ENABLE_MONITORING", "0")
    env.setdefault("NCCL_TIMEOUT", "10")
    limit = float(os.environ.get("LIMIT", "240"))
    procs = []
    for r in range(nproc):
        log = open(os.path.join(out, f"elastic_rank{r}.log"), "w")
        procs.append((r, log, subprocess.Popen(
            [sys.executable, __file__, "--rank-of-job", "--mode", mode],
            env=dict(env, RANK=str(r), LOCAL_RANK=str(r)), stdout=log, stderr=subprocess.STDOUT)))
    start = time.monotonic()
    for _, _, p in procs:
        try:
            p.wait(timeout=max(1.0, limit - (time.monotonic() - start)))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
    ok = True
    for r, log, p in procs:
        log.close()
        text = open(os.path.join(out, f"elastic_rank{r}.log")).read()
        lines = [ln for ln in text.splitlines() if re.search(r"PASS|FAIL|SKIP|exclude list|failed|shrink_group", ln)]
        print(f"--- rank {r}: exit {p.returncode}")
        print("\n".join(lines[-6:]) if lines else text[-2000:])
        if r == VICTIM:
            ok &= p.returncode == -signal.SIGKILL
        else:
            ok &= p.returncode == 0 and ("PASS" in text or "SKIP" in text)
    print(f"{'PASS' if ok else 'FAIL'}: {nproc} ranks, {mode} shrink, {time.monotonic() - start:.1f} s; logs in {out}")
    return 0 if ok else 1


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nproc", type=int, default=4)
    ap.add_argument("--mode", choices=["default", "abort"], default="default")
    ap.add_argument("--rank-of-job", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.rank_of_job:
        rank_main(a.mode)
    else:
        sys.exit(launch(a.nproc, a.mode, os.environ.get("OUT", "/tmp/oxccl-elastic")))
