#!/usr/bin/env python3
# Probe for issue 17 (docs/performance.md, "Ranks sharing one GPU"): two
# processes on one GPU ping-pong a flag with stream memory operations; which
# work in either process makes each round trip wait for a context switch.
# Run: /opt/torch/.venv/bin/python tools/shared_gpu_probe.py
# Which work in the second process makes a cross-process round trip cost a
# context switch? rank 0 may run a kernel; rank 1 may run a copy-engine copy.
import ctypes, os, sys, time
import torch
import torch.multiprocessing as mp

cuda = ctypes.CDLL("libcuda.so.1")
def write(stream, ptr, v):
    r = cuda.cuStreamWriteValue32_v2(ctypes.c_void_p(stream), ctypes.c_uint64(ptr), ctypes.c_uint32(v), ctypes.c_uint(0))
    assert r == 0, r
def wait(stream, ptr, v):
    r = cuda.cuStreamWaitValue32_v2(ctypes.c_void_p(stream), ctypes.c_uint64(ptr), ctypes.c_uint32(v), ctypes.c_uint(0))
    assert r == 0, r
def cecopy(stream, dst, src, n):
    r = cuda.cuMemcpyDtoDAsync_v2(ctypes.c_uint64(dst), ctypes.c_uint64(src), ctypes.c_size_t(n), ctypes.c_void_p(stream))
    assert r == 0, r

def worker(rank, flags, iters, q, k0, c1, c0):
    torch.cuda.set_device(0)
    s = torch.cuda.Stream()
    me, other = flags[rank].data_ptr(), flags[1 - rank].data_ptr()
    x = torch.zeros(2, device="cuda")
    a = torch.zeros(1024, device="cuda"); b = torch.ones(1024, device="cuda")
    with torch.cuda.stream(s):
        for rnd in range(2):
            torch.cuda.synchronize()
            t = time.perf_counter()
            for i in range(1, iters + 1):
                v = rnd * iters + i
                if rank == 0:
                    wait(s.cuda_stream, other, v)
                    if k0: x.add_(1)
                    if c0: cecopy(s.cuda_stream, a.data_ptr(), b.data_ptr(), 4096)
                    write(s.cuda_stream, me, v)
                else:
                    if c1: cecopy(s.cuda_stream, a.data_ptr(), b.data_ptr(), 4096)
                    write(s.cuda_stream, me, v)
                    wait(s.cuda_stream, other, v)
            s.synchronize()
            dt = (time.perf_counter() - t) / iters
        q.put((rank, dt * 1e6))

if __name__ == "__main__":
    mp.set_start_method("spawn")
    for k0, c1, c0 in ((False, False, False), (True, False, False), (False, True, False), (True, True, False), (False, False, True), (True, False, True), (False, True, True)):
        flags = [torch.zeros(16, dtype=torch.int32, device="cuda") for _ in range(2)]
        q = mp.Queue()
        ps = [mp.Process(target=worker, args=(r, flags, 1000, q, k0, c1, c0)) for r in range(2)]
        for p in ps: p.start()
        for p in ps: p.join()
        res = sorted(q.get() for _ in range(2))
        print(f"rank0 kernel={k0} rank0 copy={c0} rank1 copy={c1}: " + ", ".join(f"rank {r} {us:.1f} us" for r, us in res), flush=True)
