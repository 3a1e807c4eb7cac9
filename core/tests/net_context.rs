//! Contexts of the v11+ net ABI: a built-in network named "Recording"
//! exports a v12 vtable that wraps the socket network's and records `init`,
//! `devices`, `listen`, `connect` and `finalize`, with a context of its own
//! per `init` (as a real plugin would allocate one). As in NCCL 2.30: each
//! communicator gets its own context, made with its commHash, used by its
//! connections and finalized when it goes; `devices()` is asked once, after
//! the first `init`; there is no context for the process; a split of a
//! communicator made with split_share takes its parent's context, finalized
//! once both are gone.
//!
//! One test in this binary: the process's network is chosen once, and the
//! counts are per process.

use std::os::raw::{c_int, c_void};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
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
    Devices,
    Listen {
        ctx: u64,
    },
    Connect {
        ctx: u64,
    },
    Finalize {
        ctx: u64,
    },
    /// listen or connect with a context already finalized, or a second
    /// finalize: never allowed.
    Misuse {
        ctx: u64,
        call: &'static str,
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
/// Never freed, so that a call with a finalized context is recorded
/// rather than reading freed memory.
struct Ctx {
    serial: u64,
    inner: *mut c_void,
    finalized: AtomicBool,
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
                devices: Some(devices),
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
        finalized: AtomicBool::new(false),
    });
    // SAFETY: NCCL passes a valid out-pointer.
    unsafe { *ctx = Box::into_raw(mine) as *mut c_void };
    0
}

/// # Safety
/// `ctx` is a context `init` returned (they are never freed).
unsafe fn ctx<'a>(ctx: *mut c_void) -> &'a Ctx {
    assert!(!ctx.is_null(), "a NULL context");
    // SAFETY: the caller's contract.
    unsafe { &*(ctx as *const Ctx) }
}

/// Records `call` on `c` as misuse when `c` was finalized; true if so.
fn finalized(c: &Ctx, call: &'static str) -> bool {
    let gone = c.finalized.load(Ordering::SeqCst);
    if gone {
        record(Event::Misuse {
            ctx: c.serial,
            call,
        });
    }
    gone
}

unsafe extern "C" fn devices(n: *mut c_int) -> i32 {
    record(Event::Devices);
    // SAFETY: forwarded unchanged.
    unsafe { (inner().devices.unwrap())(n) }
}

unsafe extern "C" fn listen(
    c: *mut c_void,
    dev: c_int,
    handle: *mut c_void,
    listen_comm: *mut *mut c_void,
) -> i32 {
    // SAFETY: the core passes the context its `init` returned.
    let c = unsafe { ctx(c) };
    if finalized(c, "listen") {
        return 5;
    }
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
    if finalized(c, "connect") {
        return 5;
    }
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
    // SAFETY: the core passes the context its `init` returned.
    let c = unsafe { ctx(c) };
    if c.finalized.swap(true, Ordering::SeqCst) {
        record(Event::Misuse {
            ctx: c.serial,
            call: "finalize",
        });
        return 5;
    }
    record(Event::Finalize { ctx: c.serial });
    // SAFETY: the wrapped network's context, finalized once (just checked).
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

/// The ranks of these tests share a host, so they would talk through
/// shared memory: SHM_DISABLE makes them use the network under test.
fn cfg() -> CommConfig {
    CommConfig::default()
        .with("SHM_DISABLE", "1")
        .with("SOCKET_IFNAME", "lo")
        .with("TIMEOUT", "20")
        .with("NET", "Recording")
        .with("NET_PLUGIN", "none")
}

fn sharing() -> CommConfig {
    CommConfig {
        split_share: Some(true),
        ..cfg()
    }
}

/// One all-reduce on every rank (one thread each), which connects them.
fn all_reduce(comms: &[Comm]) {
    let n = comms.len() as f32;
    std::thread::scope(|s| {
        for c in comms {
            s.spawn(move || {
                let mut b = 1f32.to_ne_bytes().to_vec();
                c.all_reduce(None, &mut b, DataType::Float32, RedOp::Sum)
                    .unwrap();
                assert_eq!(f32::from_ne_bytes(b[..4].try_into().unwrap()), n);
            });
        }
    });
}

/// Every rank splits into one communicator of the same ranks, with `config`.
fn split_all(comms: &[Comm], config: &CommConfig) -> Vec<Comm> {
    std::thread::scope(|s| {
        let hs: Vec<_> = comms
            .iter()
            .enumerate()
            .map(|(r, c)| s.spawn(move || c.split(0, r as i32, config).unwrap().unwrap()))
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

fn destroy(comms: Vec<Comm>) {
    for c in &comms {
        c.destroy().unwrap();
    }
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

/// The contexts made, sorted.
fn ctxs(ev: &[Event]) -> Vec<u64> {
    let mut v: Vec<u64> = inits(ev).into_iter().map(|i| i.0).collect();
    v.sort();
    v
}

fn devices_calls(ev: &[Event]) -> usize {
    ev.iter().filter(|e| **e == Event::Devices).count()
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

/// Contexts finalized, sorted, with repeats.
fn finalized_ctxs(ev: &[Event]) -> Vec<u64> {
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

fn misuse(ev: &[Event]) -> Vec<Event> {
    ev.iter()
        .filter(|e| matches!(e, Event::Misuse { .. }))
        .copied()
        .collect()
}

/// Waits for a core's last holder (an operation's thread) to let go.
fn wait_finalized(want: &[u64]) -> Vec<Event> {
    let t = Instant::now();
    loop {
        let ev = events();
        let f = finalized_ctxs(&ev);
        if want.iter().all(|c| f.contains(c)) || t.elapsed() > Duration::from_secs(20) {
            return ev;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// None of `ctx` finalized yet.
fn none_finalized(ctx: &[u64]) {
    // Time for the threads of a communicator just destroyed to let go.
    std::thread::sleep(Duration::from_millis(200));
    let ev = events();
    let f = finalized_ctxs(&ev);
    assert!(
        ctx.iter().all(|c| !f.contains(c)),
        "{ctx:?} still in use: {ev:?}"
    );
}

/// A parent made with split_share and its split: the split makes no
/// context and connects through the parent's; destroying either leaves the
/// other working, and the contexts are finalized once, after both. Returns
/// the contexts made.
fn shared_split(parent_first: bool) -> Vec<u64> {
    let mark = events().len();
    let parent = Comm::init_all(2, &sharing()).unwrap();
    assert!(parent.iter().all(|c| c.split_share().unwrap()));
    let mine = ctxs(&events()[mark..]);
    assert_eq!(mine.len(), 2, "{:?}", events());
    all_reduce(&parent);

    let mark = events().len();
    let child = split_all(&parent, &cfg());
    // The child's own split_share (unset) is for its own splits.
    assert!(child.iter().all(|c| !c.split_share().unwrap()));
    all_reduce(&child);
    let ev = events();
    assert!(
        inits(&ev[mark..]).is_empty(),
        "no init for the split: {ev:?}"
    );
    assert_eq!(
        used(&ev[mark..]),
        (mine.clone(), mine.clone()),
        "the split connects through its parent's contexts: {ev:?}"
    );

    let (first, second) = if parent_first {
        (parent, child)
    } else {
        (child, parent)
    };
    destroy(first);
    none_finalized(&mine);
    all_reduce(&second);
    destroy(second);
    let ev = wait_finalized(&mine);
    let f = finalized_ctxs(&ev);
    for c in &mine {
        assert_eq!(f.iter().filter(|x| *x == c).count(), 1, "{ev:?}");
    }
    mine
}

#[test]
fn contexts_follow_communicators() {
    // Contexts made, and those made for a communicator (the rest: probes).
    let mut owned = 0;

    // The first communicator: its context is the first init, then
    // devices() once; no context for the process.
    let a = Comm::init_all(2, &cfg()).unwrap();
    assert_eq!(a[0].net_name().unwrap(), "Recording");
    let ev = events();
    let a_inits = inits(&ev);
    assert_eq!(a_inits.len(), 2, "one init per rank, no other: {ev:?}");
    assert!(
        a_inits.iter().all(|i| i.1 != 0 && i.1 == a_inits[0].1),
        "{ev:?}"
    );
    assert_eq!(devices_calls(&ev), 1, "{ev:?}");
    let first_init = ev.iter().position(|e| matches!(e, Event::Init { .. }));
    let devices_at = ev.iter().position(|e| *e == Event::Devices);
    assert!(
        first_init < devices_at,
        "devices() after the first init: {ev:?}"
    );
    owned += 2;
    all_reduce(&a);
    let a_ctx = ctxs(&ev);
    assert_eq!(used(&events()), (a_ctx.clone(), a_ctx.clone()));

    // A second communicator: contexts of its own, its own commHash, and
    // the device count kept from the first.
    let mark = events().len();
    let b = Comm::init_all(2, &cfg()).unwrap();
    all_reduce(&b);
    let ev = events();
    let b_inits = inits(&ev[mark..]);
    assert_eq!(b_inits.len(), 2, "{ev:?}");
    assert_eq!(b_inits[0].1, b_inits[1].1, "{ev:?}");
    assert_ne!(b_inits[0].1, a_inits[0].1, "{ev:?}");
    assert_eq!(devices_calls(&ev), 1, "{ev:?}");
    owned += 2;
    let b_ctx = ctxs(&ev[mark..]);
    assert_eq!(used(&ev[mark..]), (b_ctx.clone(), b_ctx.clone()), "{ev:?}");
    assert!(finalized_ctxs(&ev).is_empty(), "{ev:?}");

    // Destroying a communicator finalizes its contexts only, after its
    // connections are closed.
    destroy(a);
    let ev = wait_finalized(&a_ctx);
    assert_eq!(finalized_ctxs(&ev), a_ctx, "{ev:?}");
    all_reduce(&b);

    // A split of a communicator made without split_share inits its own
    // contexts with its own commHash, whatever its own config says (the
    // parent's decides, as in NCCL).
    let mark = events().len();
    let s = split_all(&b, &sharing());
    all_reduce(&s);
    let ev = events();
    let s_inits = inits(&ev[mark..]);
    assert_eq!(s_inits.len(), 2, "{ev:?}");
    assert_eq!(s_inits[0].1, s_inits[1].1, "{ev:?}");
    assert!(s_inits[0].1 != b_inits[0].1 && s_inits[0].1 != 0, "{ev:?}");
    owned += 2;
    let s_ctx = ctxs(&ev[mark..]);
    assert_eq!(used(&ev[mark..]), (s_ctx.clone(), s_ctx.clone()), "{ev:?}");
    destroy(s);
    let ev = wait_finalized(&s_ctx);
    assert!(
        s_ctx.iter().all(|c| finalized_ctxs(&ev).contains(c)),
        "{ev:?}"
    );
    none_finalized(&b_ctx);
    destroy(b);
    wait_finalized(&b_ctx);

    // With split_share, in both orders of destruction.
    shared_split(true);
    shared_split(false);
    owned += 4;

    // NCCL_COMM_SPLIT_SHARE_RESOURCES (here through the same setting from
    // the API) replaces the config's split_share either way, and a split
    // inherits it with the parent's other settings.
    let mark = events().len();
    let p = Comm::init_all(1, &sharing().with("COMM_SPLIT_SHARE_RESOURCES", "0")).unwrap();
    assert!(!p[0].split_share().unwrap());
    let c = p[0].split(0, 0, &cfg()).unwrap().unwrap();
    assert_eq!(inits(&events()[mark..]).len(), 2, "{:?}", events());
    owned += 2;
    destroy(vec![c]);
    destroy(p);
    let mark = events().len();
    let p = Comm::init_all(1, &cfg().with("COMM_SPLIT_SHARE_RESOURCES", "1")).unwrap();
    assert!(p[0].split_share().unwrap());
    let c = p[0].split(0, 0, &cfg()).unwrap().unwrap();
    assert!(c.split_share().unwrap(), "inherited with the settings");
    assert_eq!(inits(&events()[mark..]).len(), 1, "{:?}", events());
    owned += 1;
    destroy(p);
    destroy(vec![c]);

    // A look at the devices without a communicator (`oxccl info`): a
    // context made for it and finalized before the call returns.
    let mark = events().len();
    let lines = oxccl::net_summary();
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("Recording (built in): ")),
        "{lines:?}"
    );
    let ev = events();
    let probe = inits(&ev[mark..]);
    assert_eq!(probe.len(), 1, "{ev:?}");
    assert_eq!(probe[0].1, 0, "{ev:?}");
    assert_eq!(finalized_ctxs(&ev[mark..]), vec![probe[0].0], "{ev:?}");

    // By the end: every context made was for a communicator or the probe,
    // and was finalized exactly once, never used after.
    let all = ctxs(&events());
    let ev = wait_finalized(&all);
    assert_eq!(all.len(), owned + 1, "{ev:?}");
    assert_eq!(finalized_ctxs(&ev), all, "each once: {ev:?}");
    assert!(misuse(&ev).is_empty(), "{ev:?}");
}
