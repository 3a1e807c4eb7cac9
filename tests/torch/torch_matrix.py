"""PyTorch test matrix for oxccl: every collective, group and training path
that PyTorch's NCCL backend offers, run on NCCL and on oxccl (LD_PRELOADed
as libnccl.so.2) in the same configurations, so the results can be set side
by side. run_matrix.sh next to this file runs all of it and the comparison.

One configuration (started by torchrun, one process per rank):

  python -m torch.distributed.run --nproc-per-node N torch_matrix.py OUT.json

Each rank writes OUT.json.rank{R}: a header (torch, the libnccl that was
mapped, device, ...) and one entry per check:
  {"name", "ok": true|false|null (null: skipped), "detail", "digest", "seconds"}
digest is the sha256 of the result tensors' bytes, so two runs can be
compared bit for bit. Rank 0 of a world_size-1 run also saves the result
tensors to OUT.json.rank0.pt, so that the comparison can say by how much two
runs differ when their digests do not match. A rank exits 0 once its file
is complete, whatever the verdicts: a run's exit status says only whether it
got to the end.

Environment:
  INIT=eager|lazy    eager: init_process_group(device_id=...), the
                     communicator is made at once; lazy: set_device, then
                     init without device_id (made at the first collective)
  BACKEND=nccl|gloo  gloo with DEVICE=cpu checks this script's logic on a
  DEVICE=cuda|cpu    machine without a GPU (ops gloo lacks show as FAIL)
  GROUPS=a,b         only these check groups (function names), to rerun a few
  MODE=matrix|timeout
                     timeout (world_size 2): rank 1 calls all_reduce, rank 0
                     never does; PyTorch's watchdog must end the run after
                     the 10 s process group timeout (run_matrix.sh times it)
  PG_TIMEOUT=120     the matrix's process group timeout, in seconds

Comparison of the runs that run_matrix.sh made in OUTDIR (a markdown table):

  python torch_matrix.py --compare OUTDIR
"""

import ctypes
import datetime
import hashlib
import json
import os
import re
import sys
import time
import traceback

import torch
import torch.distributed as dist

N = 1 << 20  # elements per collective: ~1M, large enough for several chunks/channels
STEPS = 20  # DDP / FSDP2 training steps
GLOBAL_BATCH = 256  # split evenly over the ranks, so losses compare across world sizes


class Skipped(Exception):
    """A check that cannot run in this configuration; the message says why."""


# ---------------------------------------------------------------- helpers


def loaded_nccl():
    """The libnccl files this process actually mapped (shows the preload took)."""
    with open("/proc/self/maps") as f:
        return sorted({line.split()[-1] for line in f if "libnccl" in line})


def nccl_bound():
    """The file whose ncclAllReduce torch's calls reach. torch 2.11 itself
    dlopens the NCCL of the nvidia-nccl wheel by path, so under LD_PRELOAD both
    are mapped; libtorch_cuda binds to the first object named libnccl.so.2,
    the preloaded one (LD_DEBUG=bindings agrees), which is what
    dlopen(RTLD_NOLOAD) returns too."""
    class DlInfo(ctypes.Structure):
        _fields_ = [("dli_fname", ctypes.c_char_p), ("dli_fbase", ctypes.c_void_p),
                    ("dli_sname", ctypes.c_char_p), ("dli_saddr", ctypes.c_void_p)]
    try:
        lib = ctypes.CDLL("libnccl.so.2", mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
        addr = ctypes.cast(lib.ncclAllReduce, ctypes.c_void_p).value
        info = DlInfo()
        if ctypes.CDLL(None).dladdr(ctypes.c_void_p(addr), ctypes.byref(info)):
            return os.path.realpath(info.dli_fname.decode())
        return "unknown (dladdr failed)"
    except Exception as e:
        return f"unknown ({type(e).__name__}: {e})"


def rank_data(r, n, seed, dtype=torch.float32):
    """Rank r's input for one check: the same on every rank that asks, so each
    rank can compute the float64 reference from everybody's inputs locally."""
    g = torch.Generator().manual_seed(seed * 1000 + r)
    if dtype == torch.int32:
        # small values: a sum over the ranks cannot overflow, and is exact
        return torch.randint(-1000, 1000, (n,), generator=g, dtype=torch.int32)
    return torch.randn(n, generator=g, dtype=torch.float64).to(dtype)


def digest(tensors):
    """sha256 of the tensors' raw bytes, in order (bf16 included: read as uint8)."""
    h = hashlib.sha256()
    for t in tensors:
        h.update(t.detach().contiguous().cpu().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def verdict(got, want, rtol=1e-5, atol=1e-6):
    """Compare a result with its float64 reference: (ok, detail, [result])."""
    got_cpu = got.detach().cpu()
    g, w = got_cpu.double(), want.double()
    if g.shape != w.shape:
        return False, f"shape {tuple(g.shape)}, want {tuple(w.shape)}", [got_cpu]
    err = (g - w).abs().max().item() if g.numel() else 0.0
    ok = torch.allclose(g, w, rtol=rtol, atol=atol)
    return bool(ok), f"max abs err {err:.3g}", [got_cpu]


def verdicts(pairs, **tol):
    """verdict() over several (got, want) pairs, as one check."""
    oks, details, results = [], [], []
    for got, want in pairs:
        ok, d, res = verdict(got, want, **tol)
        oks.append(ok)
        details.append(d)
        results += res
    return all(oks), "; ".join(details), results


class Ctx:
    """What every check needs to know about this process."""

    def __init__(self):
        self.backend = os.environ.get("BACKEND", "nccl")
        self.device_type = os.environ.get("DEVICE", "cuda")
        self.init = os.environ.get("INIT", "eager")
        self.mode = os.environ.get("MODE", "matrix")
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        if self.device_type == "cuda":
            # two ranks on one GPU share it: rank r uses cuda:(r % count)
            self.dev = torch.device("cuda", self.local_rank % torch.cuda.device_count())
        else:
            self.dev = torch.device(self.device_type)
        self.rank = self.world = None

    def on(self, x):
        """A copy of x on this rank's device (a copy also on CPU: checks work in place)."""
        return x.to(self.dev, copy=True)

    def sync(self):
        if self.dev.type == "cuda":
            torch.cuda.synchronize(self.dev)

    def init_pg(self, timeout=None, store=None):
        """The configuration under test. eager binds the device, so
        ProcessGroupNCCL makes its communicator inside init_process_group (and
        later groups are made by ncclCommSplit); lazy makes it at the first
        collective. device_id must be an accelerator, so on CPU both are lazy."""
        kw = {}
        if timeout is not None:
            kw["timeout"] = timeout
        if store is not None:
            kw.update(store=store, rank=self.rank, world_size=self.world)
        if self.init == "eager" and self.dev.type != "cpu":
            dist.init_process_group(self.backend, device_id=self.dev, **kw)
            # also the current device, so streams and graphs land on dev on a
            # machine with several GPUs (on one GPU it is cuda:0 either way)
            torch.cuda.set_device(self.dev)
        else:
            if self.dev.type == "cuda":
                torch.cuda.set_device(self.dev)
            dist.init_process_group(self.backend, **kw)
        self.rank, self.world = dist.get_rank(), dist.get_world_size()

    def eager_bound(self):
        return dist.distributed_c10d._get_default_group().bound_device_id is not None


class Report:
    """The entries of one rank, rewritten to disk after every check so that a
    crash of the process leaves what ran before it."""

    def __init__(self, path, ctx, header):
        self.path, self.ctx = path, ctx
        self.doc = dict(header, checks=[])
        self.tensors = {}
        # the world_size-1 results are what the comparison sets side by side
        self.keep_tensors = ctx.world == 1

    def write(self):
        tmp = self.path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(self.doc, f, indent=1)
        os.replace(tmp, self.path)

    def add(self, entry):
        self.doc["checks"].append(entry)
        state = {True: "ok", False: "FAIL", None: "skip"}[entry["ok"]]
        print(f"rank {self.ctx.rank}: {entry['name']}: {state} {entry['detail']}", flush=True)
        self.write()

    def check(self, name, fn):
        """Run fn() -> (ok, detail, result tensors) and record it; an exception
        is a failure with its text, Skipped a skip; the script goes on."""
        t0 = time.perf_counter()
        entry = {"name": name, "ok": None, "detail": "", "digest": None}
        try:
            out = fn()
            ok, detail, results = out[:3]
            entry.update(ok=bool(ok), detail=detail)
            if results:
                entry["digest"] = digest(results)
                if self.keep_tensors:
                    self.tensors[name] = [t.detach().cpu() for t in results]
            if len(out) > 3:
                entry.update(out[3])  # extra fields, e.g. the loss list
        except Skipped as e:
            entry["detail"] = str(e)
        except Exception as e:
            # where: the innermost line of this script, and where it was raised
            frames = traceback.extract_tb(e.__traceback__)
            ours = [f for f in frames if f.filename == __file__]
            entry.update(ok=False, detail=f"{type(e).__name__}: {e}"[:2000],
                         where=[f"{os.path.basename(f.filename)}:{f.lineno} {f.name}"
                                for f in (ours[-1:] + frames[-1:])])
        entry["seconds"] = round(time.perf_counter() - t0, 3)
        self.add(entry)

    def finish(self):
        self.doc["finished"] = True  # absent: the process died before the end
        self.write()
        if self.keep_tensors and self.tensors:
            torch.save(self.tensors, self.path + ".pt")


# ------------------------------------------------------------ the checks


def all_reduce_checks(rep, c):
    """Every reduction op on float32; SUM also on bf16 and int32."""
    ins = [rank_data(r, N, 1) for r in range(c.world)]
    stack = torch.stack([x.double() for x in ins])
    refs = {
        "SUM": stack.sum(0),
        "AVG": stack.mean(0),
        "MAX": stack.max(0).values,
        "MIN": stack.min(0).values,
        "PRODUCT": stack.prod(0),
    }
    for op, ref in refs.items():
        def one(op=op, ref=ref):
            t = c.on(ins[c.rank])
            dist.all_reduce(t, op=getattr(dist.ReduceOp, op))
            return verdict(t, ref)
        rep.check(f"all_reduce {op} float32", one)

    def bf16():
        xs = [rank_data(r, N, 2, torch.bfloat16) for r in range(c.world)]
        t = c.on(xs[c.rank])
        dist.all_reduce(t)
        # bf16 keeps 8 bits of mantissa: one rounding of the sum is ~4e-3 relative
        return verdict(t, sum(x.double() for x in xs), rtol=1e-2, atol=1e-2)
    rep.check("all_reduce SUM bf16", bf16)

    def int32():
        xs = [rank_data(r, N, 3, torch.int32) for r in range(c.world)]
        t = c.on(xs[c.rank])
        dist.all_reduce(t)
        return verdict(t, sum(x.double() for x in xs), rtol=0, atol=0)  # exact
    rep.check("all_reduce SUM int32", int32)


def rooted_checks(rep, c):
    """broadcast, reduce, gather, scatter; the root is the last rank, so that
    at world_size 2 it is not rank 0."""
    root = c.world - 1
    ins = [rank_data(r, N, 10) for r in range(c.world)]

    def broadcast():
        t = c.on(ins[c.rank])  # every rank starts from different data
        dist.broadcast(t, src=root)
        return verdict(t, ins[root])
    rep.check("broadcast", broadcast)

    def reduce():
        t = c.on(ins[c.rank])
        dist.reduce(t, dst=root)
        if c.rank != root:  # what a non-root rank's buffer holds is unspecified
            return True, f"not the root (rank {root})", []
        return verdict(t, sum(x.double() for x in ins))
    rep.check("reduce", reduce)

    m = N // c.world
    parts = [rank_data(r, m, 11) for r in range(c.world)]

    def gather():
        outs = [torch.empty(m, device=c.dev) for _ in range(c.world)] if c.rank == root else None
        dist.gather(c.on(parts[c.rank]), gather_list=outs, dst=root)
        if c.rank != root:
            return True, f"not the root (rank {root})", []
        return verdicts(zip(outs, parts))
    rep.check("gather", gather)

    def scatter():
        chunks = [rank_data(p, m, 12) for p in range(c.world)]
        t = torch.empty(m, device=c.dev)
        dist.scatter(t, scatter_list=[c.on(x) for x in chunks] if c.rank == root else None, src=root)
        return verdict(t, chunks[c.rank])
    rep.check("scatter", scatter)


def gather_scatter_checks(rep, c):
    """all_gather (list and flat) and reduce_scatter (list and flat)."""
    m = N // c.world
    parts = [rank_data(r, m, 20) for r in range(c.world)]

    def all_gather():
        outs = [torch.empty(m, device=c.dev) for _ in range(c.world)]
        dist.all_gather(outs, c.on(parts[c.rank]))
        return verdicts(zip(outs, parts))
    rep.check("all_gather", all_gather)

    def all_gather_into_tensor():
        out = torch.empty(c.world * m, device=c.dev)
        dist.all_gather_into_tensor(out, c.on(parts[c.rank]))
        return verdict(out, torch.cat(parts))
    rep.check("all_gather_into_tensor", all_gather_into_tensor)

    full = [rank_data(r, N, 21) for r in range(c.world)]  # each rank's N, cut in world pieces
    want = sum(x.double() for x in full)[c.rank * m:(c.rank + 1) * m]

    def reduce_scatter_tensor():
        out = torch.empty(m, device=c.dev)
        dist.reduce_scatter_tensor(out, c.on(full[c.rank]))
        return verdict(out, want)
    rep.check("reduce_scatter_tensor", reduce_scatter_tensor)

    def reduce_scatter():
        out = torch.empty(m, device=c.dev)
        dist.reduce_scatter(out, [c.on(x) for x in full[c.rank].chunk(c.world)])
        return verdict(out, want)
    rep.check("reduce_scatter", reduce_scatter)


def uneven_count(src, dst, world):
    """Elements rank src sends to rank dst in the uneven all_to_all: all
    different, none a multiple of anything convenient."""
    return N // (2 * world) + 1009 * src + 17 * dst + 1


def all_to_all_checks(rep, c):
    """all_to_all_single with even and uneven splits, and the list form."""
    r, w = c.rank, c.world
    m = N // w
    blocks = [rank_data(p, N, 30) for p in range(w)]

    def even():
        out = torch.empty(N, device=c.dev)
        dist.all_to_all_single(out, c.on(blocks[r]))
        return verdict(out, torch.cat([blocks[p][r * m:(r + 1) * m] for p in range(w)]))
    rep.check("all_to_all_single even", even)

    # rank p's input: its pieces for ranks 0..w-1, one after the other
    send_counts = [[uneven_count(p, d, w) for d in range(w)] for p in range(w)]
    data = [rank_data(p, sum(send_counts[p]), 31) for p in range(w)]

    def piece(p, d):  # what rank p sends to rank d
        start = sum(send_counts[p][:d])
        return data[p][start:start + send_counts[p][d]]

    def uneven():
        recv_counts = [send_counts[p][r] for p in range(w)]
        out = torch.empty(sum(recv_counts), device=c.dev)
        dist.all_to_all_single(out, c.on(data[r]), output_split_sizes=recv_counts,
                               input_split_sizes=send_counts[r])
        return verdict(out, torch.cat([piece(p, r) for p in range(w)]))
    rep.check("all_to_all_single uneven", uneven)

    def as_list():
        outs = [torch.empty(send_counts[p][r], device=c.dev) for p in range(w)]
        dist.all_to_all(outs, [c.on(piece(r, d)) for d in range(w)])
        return verdicts((outs[p], piece(p, r)) for p in range(w))
    rep.check("all_to_all (lists, uneven)", as_list)


def p2p_checks(rep, c):
    """send/recv between pairs of ranks, and a ring with batch_isend_irecv."""
    r, w = c.rank, c.world
    m = N // 4

    def send_recv():
        if w < 2:
            raise Skipped("needs world_size >= 2 (torch refuses send to self)")
        peer = r ^ 1  # pairs (0,1), (2,3), ...
        if peer >= w:
            return True, "no partner (odd world size)", []
        mine = c.on(rank_data(r, m, 40))
        got = torch.empty(m, device=c.dev)
        if r % 2 == 0:  # opposite orders, or blocking send/recv would deadlock
            dist.send(mine, dst=peer)
            dist.recv(got, src=peer)
        else:
            dist.recv(got, src=peer)
            dist.send(mine, dst=peer)
        return verdict(got, rank_data(peer, m, 40))
    rep.check("send/recv", send_recv)

    def ring():
        # at world_size 1 the ring is rank 0 sending to itself: NCCL allows
        # that inside a group, and so does torch's isend/irecv
        nxt, prv = (r + 1) % w, (r - 1) % w
        got = torch.empty(m, device=c.dev)
        ops = [dist.P2POp(dist.isend, c.on(rank_data(r, m, 41)), nxt),
               dist.P2POp(dist.irecv, got, prv)]
        for req in dist.batch_isend_irecv(ops):
            req.wait()
        return verdict(got, rank_data(prv, m, 41))
    rep.check("batch_isend_irecv ring", ring)


def sync_checks(rep, c):
    """barrier (it must actually wait), monitored_barrier on a gloo group,
    and async_op=True collectives completed with wait()."""
    def barrier():
        # rank 0 comes 1 s late: the others' barrier must not return before
        if c.rank == 0:
            time.sleep(1.0)
        t0 = time.perf_counter()
        dist.barrier()
        waited = time.perf_counter() - t0
        ok = c.rank == 0 or waited > 0.8 or c.world == 1
        return ok, f"waited {waited:.2f} s" + ("" if ok else " (rank 0 was 1 s late: it did not wait)"), []
    rep.check("barrier", barrier)

    def monitored():
        # monitored_barrier is gloo only: a gloo group beside the default one
        g = dist.new_group(backend="gloo")
        dist.monitored_barrier(group=g, timeout=datetime.timedelta(seconds=60), wait_all_ranks=True)
        dist.destroy_process_group(g)
        return True, "returned", []
    rep.check("monitored_barrier (gloo group)", monitored)

    def async_op():
        xs = [rank_data(p, N, 50) for p in range(c.world)]
        ys = [rank_data(p, N, 51) for p in range(c.world)]
        a, b = c.on(xs[c.rank]), c.on(ys[c.rank])
        works = [dist.all_reduce(a, async_op=True),
                 dist.all_reduce(b, op=dist.ReduceOp.MAX, async_op=True)]
        for wk in works:
            wk.wait()
        return verdicts([(a, sum(x.double() for x in xs)),
                         (b, torch.stack([y.double() for y in ys]).max(0).values)])
    rep.check("async_op all_reduce x2 + wait", async_op)


def group_checks(rep, c):
    """new_group over all ranks and over a subset; split_group (eager only)."""
    ins = [rank_data(r, N, 60) for r in range(c.world)]

    def reduce_on(g, members):
        t = c.on(ins[c.rank])
        dist.all_reduce(t, group=g)
        return verdict(t, sum(ins[p].double() for p in members))

    def new_all():
        g = dist.new_group(ranks=list(range(c.world)))
        res = reduce_on(g, range(c.world))
        dist.destroy_process_group(g)
        return res
    rep.check("new_group all ranks", new_all)

    def new_subset():
        if c.world < 2:
            raise Skipped("needs world_size > 1")
        members = list(range(1, c.world))  # without rank 0: group rank != global rank
        g = dist.new_group(ranks=members)  # every rank must call it, members or not
        if c.rank not in members:
            return True, "not a member", []
        res = reduce_on(g, members)
        dist.destroy_process_group(g)
        return res
    rep.check("new_group subset", new_subset)

    def split(name, split_ranks):
        def fn():
            if not c.eager_bound():
                # split_group splits the communicator of a default group bound to a device
                raise Skipped("needs eager init (init_process_group with device_id)" if c.init == "lazy"
                              else "no device bound: device_id must be an accelerator, not the CPU")
            g = dist.split_group(split_ranks=split_ranks)
            if g is None:
                return True, "not in any split", []
            members = next(s for s in split_ranks if c.rank in s)
            res = reduce_on(g, members)
            dist.destroy_process_group(g)
            return res
        rep.check(name, fn)
    split("split_group all ranks", [list(range(c.world))])
    split("split_group one rank each", [[p] for p in range(c.world)])


def graph_check(rep, c):
    """An all_reduce captured in a CUDA graph, replayed 3 times with new input."""
    def fn():
        if c.dev.type != "cuda" or c.backend != "nccl":
            raise Skipped("CUDA graph capture needs a CUDA device and the NCCL backend")
        static = torch.zeros(N, device=c.dev)
        # warm up on a side stream (the documented pattern): the communicator
        # exists before capture, even with lazy init
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            dist.all_reduce(static)
        torch.cuda.current_stream().wait_stream(s)
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            dist.all_reduce(static)
        oks, details, results = [], [], []
        for i in range(3):
            ins = [rank_data(r, N, 70 + i) for r in range(c.world)]
            static.copy_(c.on(ins[c.rank]))
            g.replay()
            torch.cuda.synchronize()
            ok, d, res = verdict(static, sum(x.double() for x in ins))
            oks.append(ok)
            details.append(f"replay {i}: {d}")
            results += res
        return all(oks), "; ".join(details), results
    rep.check("cuda graph all_reduce x3 replays", fn)


def make_model(c):
    torch.manual_seed(0)  # same initial weights on every rank and in every run
    return torch.nn.Sequential(
        torch.nn.Linear(32, 64), torch.nn.Tanh(), torch.nn.Linear(64, 1)
    ).to(c.dev)


def train(c, model, params):
    """STEPS of SGD on this rank's slice of one fixed global batch; returns the
    per-step loss over the global batch (mean of the ranks' equal slices), so
    runs of any world size train the same problem and can be compared."""
    g = torch.Generator().manual_seed(100)
    x = torch.randn(GLOBAL_BATCH, 32, generator=g)
    y = torch.randn(GLOBAL_BATCH, 1, generator=g)
    per = GLOBAL_BATCH // c.world
    x = c.on(x[c.rank * per:(c.rank + 1) * per])
    y = c.on(y[c.rank * per:(c.rank + 1) * per])
    opt = torch.optim.SGD(params, lr=0.05)
    losses = []
    for _ in range(STEPS):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        t = loss.detach().clone()
        dist.all_reduce(t)  # SUM then divide: gloo has no AVG
        losses.append((t / c.world).item())
    ok = all(map(lambda v: v == v and abs(v) < 1e30, losses)) and losses[-1] < losses[0]
    detail = f"loss {losses[0]:.6f} -> {losses[-1]:.6f}" + ("" if ok else " (not finite or not decreasing)")
    return ok, detail, losses


def training_checks(rep, c):
    """DDP and FSDP2 on the same model and data; the loss lists are recorded."""
    def ddp():
        from torch.nn.parallel import DistributedDataParallel as DDP
        model = make_model(c)
        ddp_model = DDP(model, device_ids=[c.dev.index] if c.dev.type == "cuda" else None)
        ok, detail, losses = train(c, ddp_model, ddp_model.parameters())
        final = [p.detach().cpu() for p in model.parameters()]  # replicated: same on every rank
        return ok, detail, [torch.tensor(losses, dtype=torch.float64)] + final, {"losses": losses}
    rep.check("DDP 20 steps", ddp)

    def fsdp2():
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard
        model = make_model(c)
        mesh = init_device_mesh(c.dev.type, (c.world,))
        for layer in (model[0], model[2]):
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        ok, detail, losses = train(c, model, model.parameters())
        return ok, detail, [torch.tensor(losses, dtype=torch.float64)], {"losses": losses}
    rep.check("FSDP2 20 steps", fsdp2)


def reinit_check(rep, c):
    """destroy_process_group, then a second init_process_group in the same
    process on a new TCPStore (another port), and one all_reduce on it."""
    def fn():
        # A new TCPStore, made by hand: under torchrun an init_method
        # "tcp://..." would not start a server (TORCHELASTIC_USE_AGENT_STORE
        # makes every rank a client of the agent's store). Rank 0 serves it on
        # a free port and hands the port over through the old store.
        timeout = datetime.timedelta(seconds=60)
        old = dist.distributed_c10d._get_default_store()
        if c.rank == 0:
            store = dist.TCPStore("127.0.0.1", 0, c.world, is_master=True, timeout=timeout,
                                  wait_for_workers=False)  # they learn the port below
            old.set("reinit_port", str(store.port))
        port = int(old.get("reinit_port"))
        if c.rank != 0:
            store = dist.TCPStore("127.0.0.1", port, c.world, is_master=False, timeout=timeout)
        dist.barrier()  # everyone holds the new store before the old group goes
        c.sync()
        dist.destroy_process_group()
        c.init_pg(store=store)
        ins = [rank_data(r, N, 80) for r in range(c.world)]
        t = c.on(ins[c.rank])
        dist.all_reduce(t)
        ok, d, res = verdict(t, sum(x.double() for x in ins))
        return ok, f"new store on port {port}; {d}", res
    rep.check("destroy + second init_process_group + all_reduce", fn)


# ------------------------------------------------------------------ modes


def header(c):
    h = {"rank": c.rank, "world": c.world, "init": c.init, "backend": c.backend,
         "device": str(c.dev), "mode": c.mode, "torch": torch.__version__,
         "libnccl_mapped": loaded_nccl(), "nccl_bound": nccl_bound(),
         "env": {k: os.environ[k] for k in ("LD_PRELOAD", "NCCL_DEBUG", "NCCL_NVLS_ENABLE",
                                            "TORCH_SYMM_MEM_DISABLE_MULTICAST",
                                            "TORCH_NCCL_ASYNC_ERROR_HANDLING") if k in os.environ}}
    try:
        h["nccl_version_reported"] = ".".join(map(str, torch.cuda.nccl.version()))
    except Exception as e:  # a build without NCCL, or no libnccl to ask
        h["nccl_version_reported"] = f"unknown ({type(e).__name__})"
    if c.dev.type == "cuda":
        h["gpu"] = torch.cuda.get_device_name(c.dev)
    h["eager_bound"] = c.eager_bound()
    return h


def run_matrix(out):
    c = Ctx()
    # 120 s instead of 10 min: a collective that hangs (one rank failed before
    # it, say) is ended by the watchdog, whose log names it, well inside the
    # 300 s that run_matrix.sh gives a run
    c.init_pg(timeout=datetime.timedelta(seconds=int(os.environ.get("PG_TIMEOUT", "120"))))
    rep = Report(f"{out}.rank{c.rank}", c, header(c))
    rep.write()
    # reinit replaces the default group, so it comes late; the graph capture
    # comes last: a capture that fails can leave a stream capturing, and then
    # every later CUDA call fails (even imports that touch CUDA: seen with
    # oxccl on an H100), which would hide the results of the checks after it
    groups = (all_reduce_checks, rooted_checks, gather_scatter_checks, all_to_all_checks,
              p2p_checks, sync_checks, group_checks, training_checks, reinit_check,
              graph_check)
    only = os.environ.get("GROUPS")  # e.g. GROUPS=p2p_checks,graph_check to rerun a few
    for group in groups:
        if only is None or group.__name__ in only.split(","):
            group(rep, c)

    def teardown():
        c.sync()
        dist.destroy_process_group()
        return True, "returned", []
    rep.check("destroy_process_group at the end", teardown)
    rep.finish()
    bad = [e for e in rep.doc["checks"] if e["ok"] is False]
    print(f"rank {c.rank}: {sum(e['ok'] is True for e in rep.doc['checks'])} ok, {len(bad)} failed, "
          f"{sum(e['ok'] is None for e in rep.doc['checks'])} skipped; NCCL calls go to {rep.doc['nccl_bound']}",
          flush=True)
    sys.stderr.flush()
    # Exit 0 whatever the verdicts (they are in the files): a rank exiting
    # non-zero makes torchrun kill the ranks still finishing their last
    # checks. So a run's exit status tells only whether it got to the end.
    # os._exit, not sys.exit: after a failed NCCL call the watchdog would hold
    # the process another 60 s (it waits for a flight recorder dump), then
    # abort it.
    os._exit(0)


def run_timeout(out):
    """Rank 1 enters an all_reduce that rank 0 never joins. With a 10 s
    timeout, PyTorch's watchdog (NCCL) or gloo's own timeout must end the
    run long before rank 0 wakes up after 60 s; run_matrix.sh measures how
    long the whole run took and its exit status."""
    c = Ctx()
    c.init_pg(timeout=datetime.timedelta(seconds=10))
    rep = Report(f"{out}.rank{c.rank}", c, header(c))
    if c.world < 2:
        rep.add({"name": "timeout", "ok": False, "detail": "needs world_size 2", "digest": None})
        sys.exit(2)
    if c.rank == 0:
        rep.add({"name": "rank 0 sleeps", "ok": None, "digest": None,
                 "detail": "never joins the all_reduce; sleeps 60 s"})
        time.sleep(60)
        rep.add({"name": "rank 0 woke up", "ok": False, "digest": None,
                 "detail": "60 s passed and nobody ended this run: the watchdog did not act"})
        os._exit(3)
    t = c.on(torch.ones(N))
    t0 = time.time()
    rep.add({"name": "rank 1 all_reduce issued", "ok": None, "digest": None,
             "detail": f"at {t0:.3f} (epoch s)", "issued_at": t0})
    try:
        dist.all_reduce(t)
        t.cpu()  # waits for the collective: this must never return normally
    except Exception as e:
        rep.add({"name": "rank 1 all_reduce raised", "ok": True, "digest": None,
                 "detail": f"after {time.time() - t0:.1f} s: {type(e).__name__}: {e}"[:2000]})
        sys.stdout.flush()
        os._exit(4)
    rep.add({"name": "rank 1 all_reduce returned", "ok": False, "digest": None,
             "detail": f"after {time.time() - t0:.1f} s, though rank 0 never joined"})
    os._exit(5)


# ------------------------------------------------------------- comparison


def load_run(outdir, name):
    """{rank: doc} of one run, {} if it wrote nothing."""
    docs = {}
    for r in range(8):
        p = os.path.join(outdir, f"{name}.json.rank{r}")
        if os.path.exists(p):
            with open(p) as f:
                docs[r] = json.load(f)
    return docs


def load_runs_tsv(outdir):
    runs = {}
    p = os.path.join(outdir, "runs.tsv")
    if os.path.exists(p):
        for line in open(p):
            f = line.rstrip("\n").split("\t")
            if len(f) >= 6:
                runs[f[0]] = {"nproc": int(f[1]), "rc": int(f[2]), "wall": float(f[3]),
                              "bound": f[4], "end": float(f[5])}
    return runs


def state(e):
    return "missing" if e is None else {True: "ok", False: "FAIL", None: "skip"}[e["ok"]]


def one_line(detail):
    """An error text on one line, without CUDA's and NCCL's boilerplate."""
    boiler = ("Search for", "CUDA kernel errors", "For debugging", "Compile with",
              "Exception raised from", "frame #")
    keep = [ln.strip() for ln in detail.splitlines() if ln.strip() and not ln.strip().startswith(boiler)]
    return " / ".join(keep)


def max_diff(outdir, run_a, run_b, name):
    """Largest |a - b| between two ws1 runs' saved result tensors for a check."""
    try:
        a = torch.load(os.path.join(outdir, f"{run_a}.json.rank0.pt"))[name]
        b = torch.load(os.path.join(outdir, f"{run_b}.json.rank0.pt"))[name]
    except Exception:
        return None
    if len(a) != len(b) or any(x.shape != y.shape for x, y in zip(a, b)):
        return float("inf")
    return max(((x.double() - y.double()).abs().max().item() if x.numel() else 0.0)
               for x, y in zip(a, b))


def compare(outdir):
    runs = load_runs_tsv(outdir)
    lines, failures = [], 0

    def emit(s=""):
        lines.append(s)

    emit("# PyTorch matrix: NCCL vs oxccl")
    emit()
    emit("| run | exit | wall s | ranks finished | NCCL calls go to | NCCL version | torch | device |")
    emit("|---|---|---|---|---|---|---|---|")
    for name, info in runs.items():
        docs = load_run(outdir, name)
        d = docs.get(0, {})
        done = sum(1 for x in docs.values() if x.get("finished"))
        emit(f"| {name} | {info['rc']} | {info['wall']:.1f} | {done}/{info['nproc']} "
             f"| {d.get('nccl_bound', '-')} | {d.get('nccl_version_reported', '-')} "
             f"| {d.get('torch', '-')} | {d.get('gpu', d.get('device', '-'))} |")

    for init in ("eager", "lazy"):
        cols = [f"nccl_ws1_{init}", f"oxccl_ws1_{init}", f"oxccl_ws2_{init}"]
        docs = {col: load_run(outdir, col) for col in cols}
        if not any(docs.values()) and not any(col in runs for col in cols):
            continue
        entries = {col: {r: {e["name"]: e for e in d["checks"]} for r, d in docs[col].items()}
                   for col in cols}
        names = []
        for col in cols:
            for r in sorted(docs[col]):
                for e in docs[col][r]["checks"]:
                    if e["name"] not in names:
                        names.append(e["name"])

        def crashed(col):  # why a check is missing: the run died (see its log)
            rc = runs.get(col, {}).get("rc")
            return f" (run exit {rc})" if rc is not None else " (no run)"

        emit()
        emit(f"## INIT={init}")
        emit()
        emit("| check | NCCL ws1 | oxccl ws1 | oxccl ws2 |")
        emit("|---|---|---|---|")
        notes = {}  # (name, state, detail) -> where it was seen
        for name in names:
            ref = entries[cols[0]].get(0, {}).get(name)
            ox1 = entries[cols[1]].get(0, {}).get(name)
            cell_ref = state(ref) + (crashed(cols[0]) if ref is None else "")
            cell1 = state(ox1) + (crashed(cols[1]) if ox1 is None else "")
            if ref and ox1 and ref["digest"] and ox1["digest"]:
                if ref["digest"] == ox1["digest"]:
                    cell1 += ", bit-identical"
                else:
                    md = max_diff(outdir, cols[0], cols[1], name)
                    cell1 += ", differs" + (f", max err {md:.3g}" if md is not None else "")
            # ws2: FAIL if any rank failed, skip if every rank skipped
            ws2 = [entries[cols[2]].get(r, {}).get(name) for r in range(2)] if entries[cols[2]] else [None]
            if any(e is None for e in ws2):
                cell2 = "missing" + crashed(cols[2])
            elif any(e["ok"] is False for e in ws2):
                cell2 = "FAIL"
            elif all(e["ok"] is None for e in ws2):
                cell2 = "skip"
            else:
                cell2 = "ok"
            emit(f"| {name} | {cell_ref} | {cell1} | {cell2} |")
            failures += (cell1.startswith(("FAIL", "missing"))) + (cell2.startswith(("FAIL", "missing")))
            for col in cols:
                for r in sorted(entries[col]):
                    e = entries[col][r].get(name)
                    if e is not None and e["ok"] is not True:
                        # the same reason seen in several runs is told once
                        key = (name, state(e), re.sub(r"\d{4,}", "#", e["detail"]))
                        seen = notes.setdefault(key, {"detail": e["detail"], "where": e.get("where"), "runs": []})
                        seen["runs"].append(f"{col.split('_' + init)[0]} r{r}")
        if notes:
            emit()
            emit("Failures and skips:")
            emit()
            for (name, st, _), n in notes.items():
                at = f" (at {'; '.join(n['where'])})" if n["where"] else ""
                emit(f"- {name}: {st} in {', '.join(n['runs'])}: {one_line(n['detail'])}{at}")

        for name in ("DDP 20 steps", "FSDP2 20 steps"):
            ls = [entries[col].get(0, {}).get(name, {}).get("losses") for col in cols]
            if not any(ls):
                continue
            emit()
            emit(f"### {name} (INIT={init}): global loss per step")
            emit()
            emit("| step | NCCL ws1 | oxccl ws1 | oxccl ws2 |")
            emit("|---|---|---|---|")
            for i in range(max(len(x or []) for x in ls)):
                emit(f"| {i} | " + " | ".join(f"{x[i]:.8f}" if x and i < len(x) else "-" for x in ls) + " |")
            emit()
            for col, x in zip(cols[1:], ls[1:]):
                if ls[0] and x and len(x) == len(ls[0]):
                    diff = max(abs(a - b) for a, b in zip(ls[0], x))
                    emit(f"- {col} vs {cols[0]}: " + ("identical" if x == ls[0] else f"max abs diff {diff:.3g}"))
                else:
                    emit(f"- {col} vs {cols[0]}: cannot compare (missing)")

    touts = [n for n in runs if "timeout" in n]
    if touts:
        emit()
        emit("## MODE=timeout (world_size 2; rank 1 all_reduce, rank 0 sleeps 60 s; pg timeout 10 s)")
        emit()
        emit("| run | exit | wall s | s from rank 1's all_reduce to the end | verdict "
             "| rank 1's last entry | first timeout/abort line of the log |")
        emit("|---|---|---|---|---|---|---|")
        for n in touts:
            info = runs[n]
            r1 = load_run(outdir, n).get(1, {}).get("checks", [])
            issued = next((e["issued_at"] for e in r1 if "issued_at" in e), None)
            after = info["end"] - issued if issued else None
            # ended by an error (not 0), not by the outer `timeout` (124/137),
            # and well before rank 0 would wake (60 s after its init)
            ok = info["rc"] not in (0, 124, 137) and (after if after is not None else info["wall"]) < 40
            last = r1[-1]["name"] + ": " + r1[-1]["detail"] if r1 else "-"
            said = "-"
            try:
                with open(os.path.join(outdir, n + ".log"), errors="replace") as f:
                    # torch's / NCCL's own words, not this script's "rank N: ..." lines
                    said = next((ln.strip() for ln in f if not ln.startswith("rank ") and re.search(
                        r"[Ww]atchdog|timed out|Timed out|timeout|abort", ln)), "-")
            except OSError:
                pass
            failures += not ok
            emit(f"| {n} | {info['rc']} | {info['wall']:.1f} | {f'{after:.1f}' if after is not None else '-'} "
                 f"| {'ended in time' if ok else 'FAIL'} "
                 f"| {last[:200].replace('|', '/')} | {said[:240].replace('|', '/')} |")

    emit()
    emit(f"oxccl failures (FAIL or missing cells, timeout runs not ended in time): {failures}")
    print("\n".join(lines))
    with open(os.path.join(outdir, "matrix.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    return failures


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--compare":
        sys.exit(1 if compare(sys.argv[2]) else 0)
    elif len(sys.argv) == 2 and not sys.argv[1].startswith("-"):
        (run_timeout if os.environ.get("MODE", "matrix") == "timeout" else run_matrix)(sys.argv[1])
    else:
        print(__doc__)
        sys.exit(2)
