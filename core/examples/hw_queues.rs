//! Probe: does a stream's copy wait behind another stream's wait on the
//! GPU? Issue 17's copy thread (`OXCCL_SHARED_P2P=server`) hangs when one
//! of the leader's waiting streams shares the thread's hardware queue
//! (always under `CUDA_DEVICE_MAX_CONNECTIONS=1`). This asks the driver,
//! case by case, whether stream priorities or a second context of the same
//! process give the copy a queue of its own, and whether that second
//! context can reach the first one's memory at all.
//!
//! Each case: streams "A" wait on a host-mapped word that only the host
//! sets; stream "B", enqueued after them, copies 4 KiB and then stores 1
//! into a second word. The host watches that word for 300 ms: seen means
//! B ran past A's waits (its own queue), not seen means it sat behind one.
//! The host then releases A and drains everything before the next case.
//!
//! Run on a GPU machine, once per queue count:
//! `CUDA_DEVICE_MAX_CONNECTIONS=1 cargo run --release -p oxccl --example hw_queues`.
//! Prints one line per case; exits 0 unless the driver refuses a call the
//! probe needs.

use std::ffi::c_void;
use std::time::{Duration, Instant};

use cudarc::driver::sys;

fn ok(r: sys::CUresult, what: &str) {
    if r != sys::CUresult::CUDA_SUCCESS {
        eprintln!("hw_queues: {what} failed: {r:?}");
        std::process::exit(2);
    }
}

struct Words {
    host: *mut u32,
    dev: u64,
}

impl Words {
    fn get(&self, i: usize) -> u32 {
        // SAFETY: `host` points at 64 mapped, pinned words for the life of
        // the probe; the GPU writes them, so the read is volatile.
        unsafe { std::ptr::read_volatile(self.host.add(i)) }
    }
    fn set(&self, i: usize, v: u32) {
        // SAFETY: as in `get`.
        unsafe { std::ptr::write_volatile(self.host.add(i), v) }
    }
    fn addr(&self, i: usize) -> u64 {
        self.dev + 4 * i as u64
    }
}

fn stream(priority: i32) -> sys::CUstream {
    let mut s: sys::CUstream = std::ptr::null_mut();
    // SAFETY: valid out-pointer; a context is current.
    ok(
        unsafe { sys::cuStreamCreateWithPriority(&mut s, 1, priority) },
        "cuStreamCreateWithPriority",
    );
    s
}

fn alloc(bytes: usize) -> u64 {
    let mut p: sys::CUdeviceptr = 0;
    // SAFETY: valid out-pointer; a context is current.
    ok(unsafe { sys::cuMemAlloc_v2(&mut p, bytes) }, "cuMemAlloc");
    p
}

fn set_current(ctx: sys::CUcontext) {
    // SAFETY: ctx is a live context of this process.
    ok(unsafe { sys::cuCtxSetCurrent(ctx) }, "cuCtxSetCurrent");
}

/// Enqueues a wait on word 0 in each of `waiters`, then on `b` a copy
/// (`copy`) and a store of 1 into word 1; says whether the store landed
/// within 300 ms, then releases and drains.
fn case(
    name: &str,
    w: &Words,
    waiters: &[(sys::CUcontext, sys::CUstream)],
    b: (sys::CUcontext, sys::CUstream),
    copy: &dyn Fn(sys::CUstream) -> sys::CUresult,
) {
    w.set(0, 0);
    w.set(1, 0);
    let geq = sys::CUstreamWaitValue_flags::CU_STREAM_WAIT_VALUE_GEQ as u32;
    for &(ctx, s) in waiters {
        set_current(ctx);
        // SAFETY: word 0 is mapped pinned memory (portable, so in every
        // context) alive until the stream drains below.
        ok(
            unsafe { sys::cuStreamWaitValue32_v2(s, w.addr(0), 1, geq) },
            "cuStreamWaitValue32",
        );
    }
    set_current(b.0);
    let copied = copy(b.1);
    // SAFETY: as above, word 1.
    ok(
        unsafe { sys::cuStreamWriteValue32_v2(b.1, w.addr(1), 1, 0) },
        "cuStreamWriteValue32",
    );
    let start = Instant::now();
    let mut seen = None;
    while start.elapsed() < Duration::from_millis(300) {
        if w.get(1) == 1 {
            seen = Some(start.elapsed());
            break;
        }
        std::hint::spin_loop();
    }
    w.set(0, 1);
    for &(ctx, s) in waiters.iter().chain(std::iter::once(&b)) {
        set_current(ctx);
        // SAFETY: a live stream of the current context.
        ok(
            unsafe { sys::cuStreamSynchronize(s) },
            "cuStreamSynchronize",
        );
    }
    match seen {
        Some(t) => println!(
            "{name}: B RAN PAST the waits ({:.1} us; copy {copied:?})",
            t.as_secs_f64() * 1e6
        ),
        None => println!("{name}: B WAITED behind a wait (copy {copied:?})"),
    }
}

fn main() {
    // SAFETY: the whole probe is plain driver calls on this process's
    // contexts, streams and allocations, each live where used, with valid
    // out-pointers.
    unsafe {
        if !sys::is_culib_present() {
            println!("hw_queues: no CUDA driver here; nothing probed");
            return;
        }
        ok(sys::cuInit(0), "cuInit");
        let mut dev: sys::CUdevice = 0;
        ok(sys::cuDeviceGet(&mut dev, 0), "cuDeviceGet");
        let mut primary: sys::CUcontext = std::ptr::null_mut();
        ok(sys::cuDevicePrimaryCtxRetain(&mut primary, dev), "retain");
        set_current(primary);
        let (mut least, mut greatest) = (0, 0);
        ok(
            sys::cuCtxGetStreamPriorityRange(&mut least, &mut greatest),
            "cuCtxGetStreamPriorityRange",
        );
        println!(
            "CUDA_DEVICE_MAX_CONNECTIONS={:?}, stream priorities {least} (least) to {greatest} (greatest)",
            std::env::var("CUDA_DEVICE_MAX_CONNECTIONS").ok()
        );
        let mut host: *mut c_void = std::ptr::null_mut();
        let flags = sys::CU_MEMHOSTALLOC_PORTABLE | sys::CU_MEMHOSTALLOC_DEVICEMAP;
        ok(sys::cuMemHostAlloc(&mut host, 256, flags), "cuMemHostAlloc");
        let mut dptr: sys::CUdeviceptr = 0;
        ok(
            sys::cuMemHostGetDevicePointer_v2(&mut dptr, host, 0),
            "cuMemHostGetDevicePointer",
        );
        let w = Words {
            host: host.cast(),
            dev: dptr,
        };
        const N: usize = 4096;
        let (src, dst) = (alloc(N), alloc(N));
        let copy_in = |s: sys::CUstream| sys::cuMemcpyDtoDAsync_v2(dst, src, N, s);

        let a = stream(0);
        let b = stream(0);
        case(
            "1 same priority, A then B",
            &w,
            &[(primary, a)],
            (primary, b),
            &copy_in,
        );
        let a_low = stream(least);
        let b_high = stream(greatest);
        case(
            "2 A least, B greatest priority",
            &w,
            &[(primary, a_low)],
            (primary, b_high),
            &copy_in,
        );
        let a_high = stream(greatest);
        let b_low = stream(least);
        case(
            "3 A greatest, B least priority",
            &w,
            &[(primary, a_high)],
            (primary, b_low),
            &copy_in,
        );
        let many: Vec<_> = (0..16).map(|_| (primary, stream(0))).collect();
        let b2 = stream(0);
        case(
            "4 16 A, B after, all default priority",
            &w,
            &many,
            (primary, b2),
            &copy_in,
        );
        let b3 = stream(greatest);
        case(
            "5 16 A default, B greatest priority",
            &w,
            &many,
            (primary, b3),
            &copy_in,
        );
        let many_high: Vec<_> = (0..16).map(|_| (primary, stream(greatest))).collect();
        case(
            "6 16 A greatest, B greatest (made before them)",
            &w,
            &many_high,
            (primary, b3),
            &copy_in,
        );

        // A second context of this process.
        let mut second: sys::CUcontext = std::ptr::null_mut();
        ok(
            sys::cuCtxCreate_v4(&mut second, std::ptr::null_mut(), 0, dev),
            "cuCtxCreate",
        );
        set_current(second);
        let s2 = stream(0);
        let (src2, dst2) = (alloc(N), alloc(N));
        let copy_own = |s: sys::CUstream| sys::cuMemcpyDtoDAsync_v2(dst2, src2, N, s);
        case(
            "7 A in the primary context, B in a second context",
            &w,
            &many,
            (second, s2),
            &copy_own,
        );
        let copy_primary = |s: sys::CUstream| sys::cuMemcpyDtoDAsync_v2(dst2, src, N, s);
        case(
            "8 as 7, B copies from the primary context's buffer by address",
            &w,
            &many,
            (second, s2),
            &copy_primary,
        );
        let copy_peer = |s: sys::CUstream| sys::cuMemcpyPeerAsync(dst2, second, src, primary, N, s);
        case(
            "9 as 7, B copies from the primary context's buffer with cuMemcpyPeerAsync",
            &w,
            &many,
            (second, s2),
            &copy_peer,
        );
        set_current(primary);
        let mut handle: sys::CUipcMemHandle = std::mem::zeroed();
        ok(
            sys::cuIpcGetMemHandle(&mut handle, src),
            "cuIpcGetMemHandle",
        );
        set_current(second);
        let mut opened: sys::CUdeviceptr = 0;
        let r = sys::cuIpcOpenMemHandle_v2(&mut opened, handle, 1);
        println!(
            "10 cuIpcOpenMemHandle in the second context of the primary context's buffer: {r:?}"
        );
        if r == sys::CUresult::CUDA_SUCCESS {
            let copy_ipc = |s: sys::CUstream| sys::cuMemcpyDtoDAsync_v2(dst2, opened, N, s);
            case(
                "11 as 7, B copies from that IPC mapping",
                &w,
                &many,
                (second, s2),
                &copy_ipc,
            );
        }
    }
}
