//! Per-communicator contexts of the v11+ net ABI: a built-in network named
//! "Recording" exports a v12 vtable that wraps the socket network's and
//! records `init`, `listen`, `connect` and `finalize`, with a context of its
//! own per `init` (as a real plugin would allocate one). Two communicators
//! of one process must each get their own context, made with their
//! commHash, used by their connections, and finalized when they go.
//!
//! One test in this binary: the process's network is chosen once.

use std::os::raw::{c_int, c_void};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use oxccl::{Comm, CommConfig, DataType, RedOp};
use oxccl_plugin::ffi::net::v12::{CommConfigV12, DeviceHandleV12, NetV12};
use oxccl_plugin::ffi::{Logger, ProfilerCallback};
use oxccl_plugin::BuiltinNet;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Event {
    /// A context made: its serial number and the commId given.
    Init {
        ctx: u64,
        comm_id: u64,
    },
    Listen {
        ctx: u64,
    },
    Connect {
        ctx: u64,
    },
    Finalize {
        ctx: u64,
    },
}

static EVENTS: Mutex<Vec<Event>> = Mutex::new(Vec::new());
static SERIAL: AtomicU64 = AtomicU64::new(1);

fn record(e: Event) {
    EVENTS.lock().unwrap().push(e);
}

fn events() -> Vec<Event> {
    EVENTS.lock().unwrap().clone()
}

/// This plugin's context: its serial number and the wrapped network's.
struct Ctx {
    serial: u64,
    inner: *mut c_void,
}

/// A vtable of pointers to functions and static strings.
struct Vt(NetV12);
// SAFETY: the vtable holds pointers to 'static functions and strings only.
unsafe impl Send for Vt {}
// SAFETY: as above; it is never written after being built.
unsafe impl Sync for Vt {}

/// The socket network's own v12 vtable.
fn inner() -> &'static NetV12 {
    static INNER: OnceLock<Vt> = OnceLock::new();
    &INNER
        .get_or_init(|| {
            oxccl_net_socket::force_link();
            let b = oxccl_plugin::builtin_nets()
                .into_iter()
                .find(|b| b.name == "Socket")
                .expect("socket net linked in");
            let p = (b.abi.expect("socket exports vtables"))("ncclNetPlugin_v12")
                .expect("socket exports v12");
            // SAFETY: the symbol ncclNetPlugin_v12 is an `ncclNet_v12_t`
            // (behind a transparent wrapper) in a static of this binary.
            Vt(unsafe { *(p as *const NetV12) })
        })
        .0
}

fn wrapped() -> &'static NetV12 {
    static WRAPPED: OnceLock<Vt> = OnceLock::new();
    &WRAPPED
        .get_or_init(|| {
            Vt(NetV12 {
                name: c"recording".as_ptr(),
                init: Some(init),
                listen: Some(listen),
                connect: Some(connect),
                finalize: Some(finalize),
                ..*inner()
            })
        })
        .0
}

unsafe extern "C" fn init(
    ctx: *mut *mut c_void,
    comm_id: u64,
    config: *mut CommConfigV12,
    log: Logger,
    prof: ProfilerCallback,
) -> i32 {
    let mut inner_ctx = std::ptr::null_mut();
    // SAFETY: forwarded as NCCL passed them, with our own out-pointer.
    let r = unsafe { (inner().init.unwrap())(&mut inner_ctx, comm_id, config, log, prof) };
    if r != 0 {
        return r;
    }
    let serial = SERIAL.fetch_add(1, Ordering::SeqCst);
    record(Event::Init {
        ctx: serial,
        comm_id,
    });
    let mine = Box::new(Ctx {
        serial,
        inner: inner_ctx,
    });
    // SAFETY: NCCL passes a valid out-pointer.
    unsafe { *ctx = Box::into_raw(mine) as *mut c_void };
    0
}

/// # Safety
/// `ctx` is a context `init` returned, not finalized.
unsafe fn ctx<'a>(ctx: *mut c_void) -> &'a Ctx {
    assert!(!ctx.is_null(), "a NULL context");
    // SAFETY: the caller's contract.
    unsafe { &*(ctx as *const Ctx) }
}

unsafe extern "C" fn listen(
    c: *mut c_void,
    dev: c_int,
    handle: *mut c_void,
    listen_comm: *mut *mut c_void,
) -> i32 {
    // SAFETY: the core passes the context its `init` returned.
    let c = unsafe { ctx(c) };
    record(Event::Listen { ctx: c.serial });
    // SAFETY: forwarded unchanged, with the wrapped network's context.
    unsafe { (inner().listen.unwrap())(c.inner, dev, handle, listen_comm) }
}

unsafe extern "C" fn connect(
    c: *mut c_void,
    dev: c_int,
    handle: *mut c_void,
    send_comm: *mut *mut c_void,
    dev_comm: *mut *mut DeviceHandleV12,
) -> i32 {
    // SAFETY: as in `listen`.
    let c = unsafe { ctx(c) };
    // Only a call that made a comm: connect is polled until it does.
    // SAFETY: forwarded unchanged, with the wrapped network's context.
    let r = unsafe { (inner().connect.unwrap())(c.inner, dev, handle, send_comm, dev_comm) };
    // SAFETY: a valid out-pointer, just written by the wrapped network.
    if r == 0 && !unsafe { *send_comm }.is_null() {
        record(Event::Connect { ctx: c.serial });
    }
    r
}

unsafe extern "C" fn finalize(c: *mut c_void) -> i32 {
    // SAFETY: `c` came from `init` as a boxed `Ctx` and is finalized once.
    let c = unsafe { Box::from_raw(c as *mut Ctx) };
    record(Event::Finalize { ctx: c.serial });
    // SAFETY: the wrapped network's context, finalized once.
    unsafe { (inner().finalize.unwrap())(c.inner) }
}

fn symbols(name: &str) -> Option<*const c_void> {
    (name == "ncclNetPlugin_v12").then(|| wrapped() as *const NetV12 as *const c_void)
}

fn not_native() -> oxccl_plugin::NetResult<Box<dyn oxccl_plugin::Net>> {
    Err(oxccl_plugin::NetError::Internal(
        "reached through its vtable only".into(),
    ))
}

oxccl_plugin::inventory::submit! {
    BuiltinNet { name: "Recording", priority: 0, init: not_native, abi: Some(symbols) }
}

fn cfg() -> CommConfig {
    CommConfig::default()
        .with("SOCKET_IFNAME", "lo")
        .with("TIMEOUT", "20")
        .with("NET", "Recording")
        .with("NET_PLUGIN", "none")
}

/// One all-reduce on every rank (one thread each), which connects them.
fn all_reduce(comms: &[Comm]) {
    std::thread::scope(|s| {
        for c in comms {
            s.spawn(move || {
                let mut b = 1f32.to_ne_bytes().to_vec();
                c.all_reduce(None, &mut b, DataType::Float32, RedOp::Sum)
                    .unwrap();
                assert_eq!(f32::from_ne_bytes(b[..4].try_into().unwrap()), 2.0);
            });
        }
    });
}

/// The contexts made, with the commId each was made for.
fn inits(ev: &[Event]) -> Vec<(u64, u64)> {
    ev.iter()
        .filter_map(|e| match *e {
            Event::Init { ctx, comm_id } => Some((ctx, comm_id)),
            _ => None,
        })
        .collect()
}

/// The contexts seen by listen and connect, sorted and deduplicated.
fn used(ev: &[Event]) -> (Vec<u64>, Vec<u64>) {
    let pick = |listen: bool| {
        let mut v: Vec<u64> = ev
            .iter()
            .filter_map(|e| match (*e, listen) {
                (Event::Listen { ctx }, true) | (Event::Connect { ctx }, false) => Some(ctx),
                _ => None,
            })
            .collect();
        v.sort();
        v.dedup();
        v
    };
    (pick(true), pick(false))
}

fn finalized(ev: &[Event]) -> Vec<u64> {
    let mut v: Vec<u64> = ev
        .iter()
        .filter_map(|e| match *e {
            Event::Finalize { ctx } => Some(ctx),
            _ => None,
        })
        .collect();
    v.sort();
    v
}

/// Waits for a core's last holder (an operation's thread) to let go.
fn wait_finalized(want: &[u64]) -> Vec<Event> {
    let t = Instant::now();
    loop {
        let ev = events();
        let f = finalized(&ev);
        if want.iter().all(|c| f.contains(c)) || t.elapsed() > Duration::from_secs(20) {
            return ev;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn each_communicator_has_its_own_context() {
    let a = Comm::init_all(2, &cfg()).unwrap();
    assert_eq!(a[0].net_name().unwrap(), "Recording");
    // The process's context, for probing devices before any communicator.
    let process: Vec<(u64, u64)> = inits(&events()).into_iter().filter(|i| i.1 == 0).collect();
    assert_eq!(process.len(), 1, "{:?}", events());
    let process = process[0].0;

    all_reduce(&a);
    // Everything before `mark` is `a`'s (its inits and connections).
    let mark = events().len();
    let b = Comm::init_all(2, &cfg()).unwrap();
    all_reduce(&b);
    let ev = events();

    let comm: Vec<(u64, u64)> = inits(&ev).into_iter().filter(|i| i.0 != process).collect();
    assert_eq!(comm.len(), 4, "one init per rank of each comm: {ev:?}");
    // Every
    // rank of a communicator gives the same commHash, and the two differ.
    let a_inits: Vec<(u64, u64)> = inits(&ev[..mark])
        .into_iter()
        .filter(|i| i.0 != process)
        .collect();
    let b_inits = inits(&ev[mark..]);
    assert_eq!((a_inits.len(), b_inits.len()), (2, 2), "{ev:?}");
    assert_eq!(a_inits[0].1, a_inits[1].1, "{ev:?}");
    assert_eq!(b_inits[0].1, b_inits[1].1, "{ev:?}");
    assert_ne!(a_inits[0].1, b_inits[0].1, "{ev:?}");
    assert!(comm.iter().all(|i| i.1 != 0), "{ev:?}");
    let a_ctx: Vec<u64> = a_inits.iter().map(|i| i.0).collect();
    let b_ctx: Vec<u64> = b_inits.iter().map(|i| i.0).collect();

    // Each communicator's connections went through its own two contexts.
    let mut a_sorted = a_ctx.clone();
    a_sorted.sort();
    let mut b_sorted = b_ctx.clone();
    b_sorted.sort();
    assert_eq!(
        used(&ev[..mark]),
        (a_sorted.clone(), a_sorted.clone()),
        "{ev:?}"
    );
    assert_eq!(
        used(&ev[mark..]),
        (b_sorted.clone(), b_sorted.clone()),
        "{ev:?}"
    );
    assert!(finalized(&ev).is_empty(), "{ev:?}");

    // Destroying a communicator finalizes its contexts only, after its
    // connections are closed.
    for c in &a {
        c.destroy().unwrap();
    }
    drop(a);
    let ev = wait_finalized(&a_ctx);
    assert_eq!(finalized(&ev), a_sorted, "{ev:?}");
    all_reduce(&b);
    for c in &b {
        c.destroy().unwrap();
    }
    drop(b);
    let ev = wait_finalized(&b_ctx);
    let mut both = [a_ctx, b_ctx].concat();
    both.sort();
    assert_eq!(
        finalized(&ev),
        both,
        "the process's own context stays: {ev:?}"
    );
    assert!(!finalized(&ev).contains(&process));
}
