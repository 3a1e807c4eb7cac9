"""NCCL's C API from Python with ctypes, on host memory: ncclGetVersion,
then a 2-rank all_reduce of float32 between two processes, checked.

    oxccl-run -- python3 host_allreduce.py [COUNT]

Under oxccl-run, libnccl.so.2 is already mapped (LD_PRELOAD) and
ctypes.CDLL("libnccl.so.2") returns it; without oxccl-run the script
opens oxccl.library() where the oxccl package is installed. Rank 0 makes
the unique id and hands it to rank 1 through a pipe. OXCCL_HOST_MEMORY=1
keeps the communicators on host memory where a GPU exists: there, NCCL's
calls take host pointers and have finished with the buffers when they
return (the stream argument is ignored, NULL here).
"""

import ctypes
import multiprocessing as mp
import os
import queue
import sys
import time

NCCL_FLOAT32, NCCL_SUM = 7, 0
NRANKS = 2


class UniqueId(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_char * 128)]


def open_nccl():
    """The preloaded libnccl.so.2 (oxccl-run), else the oxccl wheel's,
    else whichever the loader finds."""
    path = "libnccl.so.2"
    if "libnccl.so.2" not in os.environ.get("LD_PRELOAD", ""):
        try:
            import oxccl

            path = oxccl.library()
        except ImportError:
            pass
    lib = ctypes.CDLL(path)
    lib.ncclGetErrorString.restype = ctypes.c_char_p
    lib.ncclGetLastError.restype = ctypes.c_char_p
    lib.ncclCommInitRank.argtypes = [
        ctypes.POINTER(ctypes.c_void_p), ctypes.c_int, UniqueId, ctypes.c_int,
    ]
    lib.ncclAllReduce.argtypes = [
        ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,
        ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p,
    ]
    lib.ncclCommDestroy.argtypes = [ctypes.c_void_p]
    lib.ncclCommFinalize.argtypes = [ctypes.c_void_p]
    lib.ncclGetLastError.argtypes = [ctypes.c_void_p]
    return lib


def check(lib, rc, what):
    if rc != 0:
        err = lib.ncclGetErrorString(rc).decode()
        last = (lib.ncclGetLastError(None) or b"").decode()
        raise SystemExit(f"{what} failed: {err} ({rc}): {last}")


def mapped_nccl():
    """The libnccl files this process has mapped."""
    with open("/proc/self/maps") as f:
        return sorted({l.split()[-1] for l in f if "libnccl" in l})


def rank_main(rank, count, conn, results):
    lib = open_nccl()
    uid = UniqueId()
    if rank == 0:
        check(lib, lib.ncclGetUniqueId(ctypes.byref(uid)), "ncclGetUniqueId")
        conn.send_bytes(ctypes.string_at(ctypes.addressof(uid), 128))
    else:
        ctypes.memmove(ctypes.addressof(uid), conn.recv_bytes(), 128)
    comm = ctypes.c_void_p()
    check(lib, lib.ncclCommInitRank(ctypes.byref(comm), NRANKS, uid, rank),
          "ncclCommInitRank")
    # Rank r holds (r + 1) * (i % 1000); the sum over 2 ranks is 3 * (i % 1000).
    send = (ctypes.c_float * count)(*[(rank + 1) * (i % 1000) for i in range(count)])
    recv = (ctypes.c_float * count)()
    check(lib, lib.ncclAllReduce(send, recv, count, NCCL_FLOAT32, NCCL_SUM, comm, None),
          "ncclAllReduce")
    wrong = sum(1 for i in range(count) if recv[i] != 3 * (i % 1000))
    check(lib, lib.ncclCommFinalize(comm), "ncclCommFinalize")
    check(lib, lib.ncclCommDestroy(comm), "ncclCommDestroy")
    results.put((rank, wrong, recv[count - 1]))


def main():
    count = int(sys.argv[1]) if len(sys.argv) > 1 else 1 << 18
    os.environ.setdefault("OXCCL_HOST_MEMORY", "1")
    # Both ranks are on this machine: bootstrap over loopback.
    os.environ.setdefault("NCCL_SOCKET_IFNAME", "lo")
    lib = open_nccl()
    v = ctypes.c_int()
    check(lib, lib.ncclGetVersion(ctypes.byref(v)), "ncclGetVersion")
    print(f"ncclGetVersion: {v.value} ({v.value // 10000}.{v.value // 100 % 100}.{v.value % 100})")
    print(f"mapped: {', '.join(mapped_nccl())}")
    ctx = mp.get_context("spawn")
    # The id goes from rank 0 to rank 1 over a pipe; results come back on a queue.
    id_pipe = ctx.Pipe()
    done = ctx.Queue()
    procs = [ctx.Process(target=rank_main, args=(r, count, id_pipe[r], done))
             for r in range(NRANKS)]
    for p in procs:
        p.start()
    results, deadline = [], time.monotonic() + 120
    while len(results) < NRANKS and time.monotonic() < deadline:
        try:
            results.append(done.get(timeout=1))
        except queue.Empty:
            if any(p.exitcode not in (None, 0) for p in procs):
                break  # a rank failed; it said why on stderr
    for p in procs:
        p.join(60)
    wrong = sum(w for _, w, _ in results) if len(results) == NRANKS else -1
    last = results[0][2] if results else float("nan")
    ok = wrong == 0 and all(p.exitcode == 0 for p in procs)
    print(f"all_reduce sum, {NRANKS} ranks, {count} float32 on host memory: "
          f"last element {last:g} (want {3 * ((count - 1) % 1000)}), #wrong {wrong}: "
          f"{'OK' if ok else 'FAILED'}")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
