//! Completed events, kept in per-thread buffers. A thread registers its
//! buffer in the global list once (the only global lock, at first use); after
//! that a stop pushes into the thread's own buffer, whose mutex nobody else
//! touches until a communicator finalizes, so it is never contended on the
//! hot path.

use std::borrow::Cow;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

/// A name NCCL gives (function, type, algorithm, protocol): the common ones
/// are matched to static strings so that recording does not allocate.
pub type Name = Cow<'static, str>;

const KNOWN: &[&str] = &[
    "AllReduce",
    "Broadcast",
    "Reduce",
    "AllGather",
    "ReduceScatter",
    "Send",
    "Recv",
    "SendRecv",
    "AllToAll",
    "Gather",
    "Scatter",
    "AllGatherV",
    "ncclInt8",
    "ncclUint8",
    "ncclInt32",
    "ncclUint32",
    "ncclInt64",
    "ncclUint64",
    "ncclFloat16",
    "ncclFloat32",
    "ncclFloat64",
    "ncclBfloat16",
    "ncclFloat8e4m3",
    "ncclFloat8e5m2",
    "Tree",
    "Ring",
    "CollNetDirect",
    "CollNetChain",
    "NVLS",
    "NVLSTree",
    "PAT",
    "LL",
    "LL128",
    "Simple",
];

/// A static copy of `s` when it is a known name, else an owned one.
pub fn intern(s: &str) -> Name {
    match KNOWN.iter().find(|k| **k == s) {
        Some(k) => Cow::Borrowed(k),
        None => Cow::Owned(s.to_owned()),
    }
}

/// The arguments shown for an event in the trace.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Args {
    pub count: Option<usize>,
    pub dtype: Option<Name>,
    pub root: Option<i32>,
    pub peer: Option<i32>,
    pub seq: Option<u64>,
    pub algo: Option<Name>,
    pub proto: Option<Name>,
    pub channels: Option<u32>,
    pub step: Option<i32>,
    pub bytes: Option<usize>,
    /// A proxy op's bytes per step.
    pub chunk: Option<i32>,
    /// The last `NCCL_PROFILER_*` state recorded.
    pub state: Option<i32>,
    /// A kernel channel's GPU `globaltimer` (ns) at start and at stop, as
    /// NCCL reads them on the device (v4 and later).
    pub gpu_start_ns: Option<u64>,
    pub gpu_stop_ns: Option<u64>,
    /// The caller's tag of the call (profiler v7), shown when not 0.
    pub user_tag: Option<u64>,
}

/// One completed event.
#[derive(Debug, Clone, PartialEq)]
pub struct Record {
    /// The communicator (profiler context) it belongs to.
    pub ctx: u64,
    /// Start order in the process (unique): the event's id in the trace.
    pub seq: u64,
    /// The handle NCCL held for the event, and the one it gave as the
    /// parent's: matched when the trace is written, not on the hot path.
    pub handle: usize,
    pub parent: usize,
    pub rank: i32,
    /// The thread that started it.
    pub tid: u32,
    pub start_ns: u64,
    pub dur_ns: u64,
    /// "coll", "p2p", "group", "proxy", …
    pub cat: &'static str,
    pub name: Name,
    pub args: Args,
}

struct ThreadBuf {
    records: Mutex<Vec<Record>>,
}

static REGISTRY: Mutex<Vec<Arc<ThreadBuf>>> = Mutex::new(Vec::new());
static NEXT_TID: AtomicU32 = AtomicU32::new(1);
static NEXT_SEQ: AtomicU64 = AtomicU64::new(1);

/// The next start-order number (lock-free).
pub fn next_seq() -> u64 {
    NEXT_SEQ.fetch_add(1, Ordering::Relaxed)
}
static DROPPED: AtomicU64 = AtomicU64::new(0);

/// Records kept per thread before new ones are dropped (and counted): a
/// long job must not grow the process without bound. About 150 bytes each.
pub const MAX_PER_THREAD: usize = 1 << 20;

thread_local! {
    static BUF: Arc<ThreadBuf> = {
        let b = Arc::new(ThreadBuf { records: Mutex::new(Vec::with_capacity(1024)) });
        REGISTRY.lock().unwrap_or_else(|e| e.into_inner()).push(b.clone());
        b
    };
    static TID: u32 = NEXT_TID.fetch_add(1, Ordering::Relaxed);
}

/// A small per-thread number for the trace's `tid` (stable for the thread).
pub fn thread_id() -> u32 {
    TID.with(|t| *t)
}

/// Nanoseconds since the process's first event: one epoch for every
/// communicator, so traces of one process line up.
pub fn now_ns() -> u64 {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    EPOCH.get_or_init(Instant::now).elapsed().as_nanos() as u64
}

/// Appends to the calling thread's buffer.
pub fn push(r: Record) {
    BUF.with(|b| {
        let mut v = b.records.lock().unwrap_or_else(|e| e.into_inner());
        if v.len() < MAX_PER_THREAD {
            v.push(r);
        } else {
            DROPPED.fetch_add(1, Ordering::Relaxed);
        }
    });
}

/// Records dropped so far because a thread's buffer was full; the count is
/// reset by the call.
pub fn take_dropped() -> u64 {
    DROPPED.swap(0, Ordering::Relaxed)
}

/// Takes every record of context `ctx` out of all threads' buffers, in
/// start order.
pub fn drain(ctx: u64) -> Vec<Record> {
    let bufs: Vec<Arc<ThreadBuf>> = REGISTRY.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let mut out = Vec::new();
    for b in bufs {
        let mut v = b.records.lock().unwrap_or_else(|e| e.into_inner());
        let (mine, rest): (Vec<Record>, Vec<Record>) = std::mem::take(&mut *v)
            .into_iter()
            .partition(|r| r.ctx == ctx);
        *v = rest;
        out.extend(mine);
    }
    out.sort_by_key(|r| (r.start_ns, r.seq));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(ctx: u64, start_ns: u64) -> Record {
        Record {
            ctx,
            seq: next_seq(),
            handle: 0,
            parent: 0,
            rank: 0,
            tid: thread_id(),
            start_ns,
            dur_ns: 1,
            cat: "coll",
            name: intern("AllReduce"),
            args: Args::default(),
        }
    }

    #[test]
    fn per_thread_buffers_drain_by_context() {
        let (a, b) = (u64::MAX - 1, u64::MAX - 2);
        push(rec(a, 5));
        push(rec(b, 6));
        std::thread::spawn(move || push(rec(a, 3))).join().unwrap();
        let got = drain(a);
        assert_eq!(got.iter().map(|r| r.start_ns).collect::<Vec<_>>(), [3, 5]);
        assert_ne!(got[0].tid, got[1].tid);
        assert!(drain(a).is_empty());
        assert_eq!(drain(b).len(), 1);
    }

    #[test]
    fn known_names_do_not_allocate() {
        assert!(matches!(intern("AllReduce"), Cow::Borrowed(_)));
        assert!(matches!(intern("Fancy"), Cow::Owned(_)));
    }
}
