//! Memory windows, one-sided signals and copy-engine collectives
//! (`oxccl::win`) on two ranks: as two processes (the peer's window mapped
//! through CUDA IPC for cuMemAlloc memory and by file descriptor for
//! ncclMemAlloc memory), and as two threads of one process (addresses as
//! they are). On one GPU both ranks share it. Random data, checked against
//! what each rank sent; outputs poisoned beforehand. Skips without a GPU.

mod gpu_common;

use std::sync::Arc;
use std::time::Duration;

use gpu_common::{inputs, two_ranks};
use oxccl::cuda::{self, vmm, Context, Device, DeviceBuffer, RawStream, Stream};
use oxccl::win::ce::{self, CeColl};
use oxccl::win::signal::{self, WaitDesc};
use oxccl::win::{self as win, WIN_COLL_SYMMETRIC};
use oxccl::{Comm, CommConfig, DataType, UniqueId};

const ID_ENV: &str = "OXCCL_TEST_WIN_ID";
const TEST: &str = "windows_signals_and_copy_engine_collectives_across_processes";
const N: usize = 2;

fn hex(id: &UniqueId) -> String {
    id.0.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> UniqueId {
    let mut id = [0u8; 128];
    for (i, b) in id.iter_mut().enumerate() {
        *b = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).unwrap();
    }
    UniqueId(id)
}

fn config(dev: usize) -> CommConfig {
    // ZERO: the copy-engine collectives' automatic choice (OXCCL_CE_COLL
    // unset is `auto`).
    CommConfig {
        device: Some(dev),
        ..CommConfig::default()
    }
    .with("CTA_POLICY", "ZERO")
}

/// Copies `bytes` from `src` to `dst` (device addresses) and waits.
fn copy(stream: &Stream, dst: u64, src: u64, bytes: usize) {
    // SAFETY: both ranges are live device memory of the test's, not
    // overlapping; the stream is synchronized before either is freed.
    unsafe { stream.handle().copy_device(dst, src, bytes) }.unwrap();
    stream.synchronize().unwrap();
}

fn read(ptr: u64, bytes: usize) -> Vec<u8> {
    let mut out = vec![0u8; bytes];
    // SAFETY: `ptr..ptr + bytes` is live device memory; no work on it is
    // queued (the callers synchronized their stream).
    unsafe { cuda::read_raw(ptr, &mut out) }.unwrap();
    out
}

/// One rank's part; returns its wrong bytes, by check.
fn rank_main(comm: &Comm) -> Vec<(&'static str, usize)> {
    let me = comm.user_rank();
    let peer = 1 - me;
    let dev = comm.device().unwrap().unwrap();
    let ctx: Arc<Context> = Context::primary(Device::get(dev).unwrap()).unwrap();
    let stream = Stream::new(&ctx).unwrap();
    let s: RawStream = stream.handle();
    let dtype = DataType::Float32;
    let count = 1_000_003;
    let bytes = count * 4;
    let mut wrong = Vec::new();

    // Window A: ncclMemAlloc's memory (the virtual memory API); window B:
    // cuMemAlloc's. Room for n blocks each, plus an offset.
    let off = 4096;
    let a_bytes = off + N * bytes;
    let a = vmm::vmm_alloc(dev, a_bytes).unwrap();
    let b = DeviceBuffer::alloc(&ctx, N * bytes).unwrap();
    let poison = DeviceBuffer::alloc(&ctx, a_bytes).unwrap();
    poison.fill_bytes(0xff).unwrap();
    copy(&stream, a, poison.ptr(), a_bytes);
    b.fill_bytes(0xff).unwrap();
    let wa = win::register(comm, a, a_bytes, WIN_COLL_SYMMETRIC).unwrap();
    let wb = win::register(comm, b.ptr(), b.len(), WIN_COLL_SYMMETRIC).unwrap();
    assert_eq!((wa.user_ptr(), wa.size()), (a, a_bytes));
    assert_eq!(wb.peer(peer).unwrap().1, N * bytes);

    // 1. Put with a signal, then a bare signal; the peer waits for both.
    let mine = inputs(dtype, 700 + me as u64, count);
    let theirs = inputs(dtype, 700 + peer as u64, count);
    let src = DeviceBuffer::alloc(&ctx, bytes).unwrap();
    src.write(0, &mine).unwrap();
    signal::put_signal(comm, src.ptr(), bytes, peer, &wa, off, 0, 0, 0, s).unwrap();
    signal::signal(comm, peer, 0, 0, 0, s).unwrap();
    let desc = WaitDesc {
        op_count: 2,
        peer,
        sig_idx: 0,
        ctx: 0,
    };
    signal::wait_signal(comm, &[desc], s).unwrap();
    stream.synchronize().unwrap();
    let got = read(a + off as u64, bytes);
    wrong.push(("put_signal", diff(&got, &theirs)));
    // A put past the peer's part is refused, not written.
    assert!(
        signal::put_signal(comm, src.ptr(), bytes, peer, &wa, a_bytes - 4, 0, 0, 0, s).is_err()
    );

    // 2. Copy-engine all_gather into window B, three times (the signal
    // counts advance), and all_to_all into window A at its offset.
    for round in 0..3u64 {
        let seeds = |r: usize| 800 + 10 * round + r as u64;
        let send = DeviceBuffer::alloc(&ctx, bytes).unwrap();
        send.write(0, &inputs(dtype, seeds(me), count)).unwrap();
        b.fill_bytes(0xff).unwrap();
        // SAFETY: `send` holds `bytes`, window B n * bytes; synchronized
        // before either is touched again.
        let ran =
            unsafe { ce::try_run(comm, CeColl::AllGather, send.ptr(), b.ptr(), bytes, s) }.unwrap();
        assert!(
            ran,
            "all_gather into a symmetric window under CTA policy ZERO took the copy engine"
        );
        stream.synchronize().unwrap();
        let got = read(b.ptr(), N * bytes);
        let want: Vec<u8> = (0..N)
            .flat_map(|r| inputs(dtype, seeds(r), count))
            .collect();
        wrong.push(("ce all_gather", diff(&got, &want)));
    }
    let send = DeviceBuffer::alloc(&ctx, N * bytes).unwrap();
    let block = |from: usize, to: usize| inputs(dtype, 900 + 2 * from as u64 + to as u64, count);
    let all: Vec<u8> = (0..N).flat_map(|to| block(me, to)).collect();
    send.write(0, &all).unwrap();
    copy(&stream, a, poison.ptr(), a_bytes);
    let out = a + off as u64;
    // SAFETY: as above; the output lies in window A.
    let ran = unsafe { ce::try_run(comm, CeColl::AllToAll, send.ptr(), out, bytes, s) }.unwrap();
    assert!(ran, "all_to_all took the copy engine");
    stream.synchronize().unwrap();
    let got = read(out, N * bytes);
    let want: Vec<u8> = (0..N).flat_map(|from| block(from, me)).collect();
    wrong.push(("ce all_to_all", diff(&got, &want)));
    // Output outside any window: not the copy engine's.
    // SAFETY: nothing is enqueued when it answers false.
    let ran = unsafe { ce::try_run(comm, CeColl::AllGather, send.ptr(), poison.ptr(), 4, s) };
    assert!(!ran.unwrap());

    // Both ranks are done with each other's windows before either goes:
    // a signal each way, waited for.
    signal::signal(comm, peer, 0, 0, 0, s).unwrap();
    let one = WaitDesc {
        op_count: 1,
        ..desc
    };
    signal::wait_signal(comm, &[one], s).unwrap();
    stream.synchronize().unwrap();
    win::deregister(comm, &wa).unwrap();
    win::deregister(comm, &wb).unwrap();
    assert!(win::deregister(comm, &wa).is_err());
    // SAFETY: the window is gone and the stream synchronized.
    assert!(unsafe { vmm::vmm_free(a) }.unwrap());
    println!("rank {me} (pid {}): {wrong:?}", std::process::id());
    wrong
}

fn diff(got: &[u8], want: &[u8]) -> usize {
    assert_eq!(got.len(), want.len());
    got.iter().zip(want).filter(|(g, w)| g != w).count()
}

fn all_right(wrong: &[(&str, usize)]) {
    for (what, n) in wrong {
        assert_eq!(*n, 0, "{what}: {n} wrong bytes");
    }
}

#[test]
fn windows_signals_and_copy_engine_collectives_across_processes() {
    let gpus = || cuda::device_count().unwrap_or(1).max(1);
    if let Ok(id) = std::env::var(ID_ENV) {
        let comm = Comm::init_rank(N, unhex(&id), 1, &config(1 % gpus())).unwrap();
        all_right(&rank_main(&comm));
        comm.destroy().unwrap();
        return;
    }
    let Some((_gpus, _)) = two_ranks() else {
        return;
    };
    if !vmm::vmm_supported(&Device::get(0).unwrap()).unwrap() {
        println!("skipped: GPU 0 has no virtual memory management");
        return;
    }
    let id = Comm::unique_id().unwrap();
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", TEST, "--nocapture", "--test-threads=1"])
        .env(ID_ENV, hex(&id))
        .spawn()
        .unwrap();
    let comm = Comm::init_rank(N, id, 0, &config(0)).unwrap();
    let wrong = rank_main(&comm);
    comm.destroy().unwrap();
    let start = std::time::Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if start.elapsed() > Duration::from_secs(300) {
            let _ = child.kill();
            panic!("rank 1's process did not finish within 300 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success(), "rank 1's process failed: {status}");
    all_right(&wrong);
}

#[test]
fn windows_signals_and_copy_engine_collectives_between_threads() {
    let Some((_gpus, devices)) = two_ranks() else {
        return;
    };
    // Two ranks of one process on one GPU waited out the test's limit on
    // an H200 (2026-11-29; cause not found), while two processes on that
    // GPU passed: this case needs a GPU per rank until it is understood.
    if devices[0] == devices[1] {
        println!("skipped: two threads' windows on one GPU hung on the H200 (two GPUs needed)");
        return;
    }
    if !vmm::vmm_supported(&Device::get(0).unwrap()).unwrap() {
        println!("skipped: GPU 0 has no virtual memory management");
        return;
    }
    let comms = Comm::init_all_devices(&devices, &config(devices[0])).unwrap();
    let results: Vec<_> = std::thread::scope(|sc| {
        let hs: Vec<_> = comms.iter().map(|c| sc.spawn(|| rank_main(c))).collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (c, w) in comms.iter().zip(&results) {
        c.destroy().unwrap();
        all_right(w);
    }
}

#[test]
fn windows_are_refused_on_host_memory_communicators() {
    let comms = Comm::init_all(N, &CommConfig::default()).unwrap();
    let mut x = [0u8; 64];
    let errs: Vec<String> = std::thread::scope(|sc| {
        let hs: Vec<_> = comms
            .iter()
            .map(|c| {
                let p = x.as_mut_ptr() as u64;
                sc.spawn(move || win::register(c, p, 64, 0).unwrap_err().to_string())
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for e in errs {
        assert!(e.contains("on a GPU"), "{e}");
    }
    for c in &comms {
        let e = signal::signal(c, 0, 0, 0, 0, RawStream::DEFAULT).unwrap_err();
        assert!(e.to_string().contains("ncclCommWindowRegister"), "{e}");
    }
}
