//! Memory registration as the ncclNet ABI requires it of its caller, held
//! to by a network that enforces it: a built-in named "Strict", the socket
//! network behind the export glue's v12 vtable (so the core reaches it
//! through its C adapter, as it reaches aws-ofi-nccl or IB). Its isend and
//! irecv refuse, and record as a violation, a NULL mhandle, a handle that
//! is not a live registration of that same connection, and a registration
//! that does not cover the bytes moved; deregMr refuses a handle the
//! connection does not hold or one a request still uses; closing a
//! connection with registrations left is a violation too.
//!
//! Host collectives of every kind run through it with 2 to 4 ranks on
//! random data, checked against a reference; then no violation, and every
//! registration released by the time the communicators are gone.
//!
//! The process's network is chosen once and the counts are per process:
//! the tests here take turns.

use std::collections::HashMap;
use std::os::raw::c_void;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use oxccl::{Comm, CommConfig, DataType, Group, RedOp};
use oxccl_net_socket::SocketNet;
use oxccl_plugin::ffi::net::v12::NetV12;
use oxccl_plugin::net::export::{vtable, Exported, Provider};
use oxccl_plugin::{
    BuiltinNet, ListenComm, MrHandle, Net, NetError, NetHandle, NetProperties, NetResult, PtrType,
    RecvComm, Request, SendComm,
};
use rand::Rng;

static REGS: AtomicUsize = AtomicUsize::new(0);
static DEREGS: AtomicUsize = AtomicUsize::new(0);
/// Registrations overlapping one the same connection holds: legal, but a
/// sign of memory registered twice with one connection, where the core
/// means to register each buffer once per connection.
static REDUNDANT: AtomicUsize = AtomicUsize::new(0);
static VIOLATIONS: Mutex<Vec<String>> = Mutex::new(Vec::new());
/// The size of every registration live now, by handle.
static LIVE: Mutex<Vec<(usize, usize)>> = Mutex::new(Vec::new());
/// Handles are unique in the process, so one connection's is never
/// mistaken for another's.
static NEXT_HANDLE: AtomicUsize = AtomicUsize::new(1);
/// Makes every regMr fail (a test of the error).
static FAIL_REG: AtomicBool = AtomicBool::new(false);

fn violation(msg: String) -> NetError {
    VIOLATIONS.lock().unwrap().push(msg.clone());
    NetError::InvalidArgument(msg)
}

fn violations() -> Vec<String> {
    VIOLATIONS.lock().unwrap().clone()
}

fn live() -> usize {
    REGS.load(Ordering::SeqCst) - DEREGS.load(Ordering::SeqCst)
}

/// The sizes of the registrations live now.
fn live_sizes() -> Vec<usize> {
    LIVE.lock().unwrap().iter().map(|l| l.1).collect()
}

struct Reg {
    base: usize,
    len: usize,
    inner: MrHandle,
    /// Requests posted with this registration and not completed.
    in_flight: Arc<AtomicUsize>,
}

/// The registrations of one end of a connection.
#[derive(Default)]
struct Regs {
    map: HashMap<usize, Reg>,
}

impl Regs {
    fn register(&mut self, inner: MrHandle, ptr: *mut u8, len: usize) -> MrHandle {
        let base = ptr as usize;
        if self
            .map
            .values()
            .any(|r| base < r.base + r.len && r.base < base + len)
        {
            REDUNDANT.fetch_add(1, Ordering::SeqCst);
        }
        let h = NEXT_HANDLE.fetch_add(1, Ordering::SeqCst);
        self.map.insert(
            h,
            Reg {
                base,
                len,
                inner,
                in_flight: Arc::default(),
            },
        );
        LIVE.lock().unwrap().push((h, len));
        REGS.fetch_add(1, Ordering::SeqCst);
        MrHandle(h)
    }

    /// The registration a transfer of `size` bytes at `data` may use.
    fn check(&self, call: &str, data: usize, size: usize, mr: Option<MrHandle>) -> NetResult<&Reg> {
        let Some(m) = mr else {
            return Err(violation(format!(
                "{call} of {size} bytes at {data:#x} with a NULL mhandle"
            )));
        };
        let Some(r) = self.map.get(&m.0) else {
            return Err(violation(format!(
                "{call} of {size} bytes at {data:#x}: mhandle {:#x} is not a live registration of this connection",
                m.0
            )));
        };
        if data < r.base || data + size > r.base + r.len {
            return Err(violation(format!(
                "{call} of bytes {data:#x}..{:#x} outside its registration {:#x}..{:#x}",
                data + size,
                r.base,
                r.base + r.len
            )));
        }
        Ok(r)
    }

    /// Releases `m`; the handle the wrapped network gave for it.
    fn deregister(&mut self, m: MrHandle) -> NetResult<MrHandle> {
        let Some(r) = self.map.get(&m.0) else {
            return Err(violation(format!(
                "deregMr of {:#x}, which this connection does not hold",
                m.0
            )));
        };
        let n = r.in_flight.load(Ordering::SeqCst);
        if n > 0 {
            return Err(violation(format!(
                "deregMr of {:#x} while {n} request(s) using it are in flight",
                m.0
            )));
        }
        let r = self.map.remove(&m.0).expect("looked up above");
        LIVE.lock().unwrap().retain(|l| l.0 != m.0);
        DEREGS.fetch_add(1, Ordering::SeqCst);
        Ok(r.inner)
    }

    fn closing(&self, what: &str) {
        if !self.map.is_empty() {
            violation(format!(
                "{what} closed with {} registration(s) still live",
                self.map.len()
            ));
        }
    }
}

fn refuse_injected() -> NetResult<()> {
    if FAIL_REG.load(Ordering::SeqCst) {
        return Err(NetError::System("injected regMr failure".into()));
    }
    Ok(())
}

/// Counts a request of a registration in flight until it completes.
struct Tracked {
    inner: Box<dyn Request>,
    in_flight: Arc<AtomicUsize>,
    done: bool,
}

impl Tracked {
    fn start(
        r: NetResult<Option<Box<dyn Request>>>,
        reg: &Reg,
    ) -> NetResult<Option<Box<dyn Request>>> {
        Ok(r?.map(|inner| {
            reg.in_flight.fetch_add(1, Ordering::SeqCst);
            Box::new(Tracked {
                inner,
                in_flight: reg.in_flight.clone(),
                done: false,
            }) as Box<dyn Request>
        }))
    }
}

impl Request for Tracked {
    fn test(&mut self) -> NetResult<Option<Vec<usize>>> {
        let r = self.inner.test();
        if !self.done && !matches!(r, Ok(None)) {
            // Done, or failed: either way no longer in flight.
            self.done = true;
            self.in_flight.fetch_sub(1, Ordering::SeqCst);
        }
        r
    }
}

struct Strict(SocketNet);
struct StrictListen(Box<dyn ListenComm>);
struct StrictSend {
    inner: Box<dyn SendComm>,
    regs: Regs,
}
struct StrictRecv {
    inner: Box<dyn RecvComm>,
    regs: Regs,
}

impl Net for Strict {
    fn name(&self) -> &str {
        "Strict"
    }
    fn devices(&self) -> NetResult<usize> {
        self.0.devices()
    }
    fn properties(&self, dev: usize) -> NetResult<NetProperties> {
        self.0.properties(dev)
    }
    fn listen(&self, dev: usize) -> NetResult<(NetHandle, Box<dyn ListenComm>)> {
        let (h, l) = self.0.listen(dev)?;
        Ok((h, Box::new(StrictListen(l))))
    }
    fn connect(&self, dev: usize, h: &mut NetHandle) -> NetResult<Option<Box<dyn SendComm>>> {
        Ok(self.0.connect(dev, h)?.map(|inner| {
            Box::new(StrictSend {
                inner,
                regs: Regs::default(),
            }) as Box<dyn SendComm>
        }))
    }
}

impl ListenComm for StrictListen {
    fn accept(&mut self) -> NetResult<Option<Box<dyn RecvComm>>> {
        Ok(self.0.accept()?.map(|inner| {
            Box::new(StrictRecv {
                inner,
                regs: Regs::default(),
            }) as Box<dyn RecvComm>
        }))
    }
}

impl SendComm for StrictSend {
    fn reg_mr(&mut self, ptr: *mut u8, size: usize, t: PtrType) -> NetResult<MrHandle> {
        refuse_injected()?;
        let inner = self.inner.reg_mr(ptr, size, t)?;
        Ok(self.regs.register(inner, ptr, size))
    }
    fn dereg_mr(&mut self, m: MrHandle) -> NetResult<()> {
        let inner = self.regs.deregister(m)?;
        self.inner.dereg_mr(inner)
    }
    unsafe fn isend(
        &mut self,
        data: *const u8,
        size: usize,
        tag: i32,
        mr: Option<MrHandle>,
    ) -> NetResult<Option<Box<dyn Request>>> {
        let reg = self.regs.check("isend", data as usize, size, mr)?;
        // SAFETY: forwarded under the caller's contract.
        let r = unsafe { self.inner.isend(data, size, tag, Some(reg.inner)) };
        Tracked::start(r, reg)
    }
}

impl Drop for StrictSend {
    fn drop(&mut self) {
        self.regs.closing("a send connection");
    }
}

impl RecvComm for StrictRecv {
    fn reg_mr(&mut self, ptr: *mut u8, size: usize, t: PtrType) -> NetResult<MrHandle> {
        refuse_injected()?;
        let inner = self.inner.reg_mr(ptr, size, t)?;
        Ok(self.regs.register(inner, ptr, size))
    }
    fn dereg_mr(&mut self, m: MrHandle) -> NetResult<()> {
        let inner = self.regs.deregister(m)?;
        self.inner.dereg_mr(inner)
    }
    unsafe fn irecv(
        &mut self,
        data: *mut u8,
        size: usize,
        tag: i32,
        mr: Option<MrHandle>,
    ) -> NetResult<Option<Box<dyn Request>>> {
        let reg = self.regs.check("irecv", data as usize, size, mr)?;
        // SAFETY: forwarded under the caller's contract.
        let r = unsafe { self.inner.irecv(data, size, tag, Some(reg.inner)) };
        Tracked::start(r, reg)
    }
}

impl Drop for StrictRecv {
    fn drop(&mut self) {
        self.regs.closing("a receive connection");
    }
}

struct StrictProvider;
impl Provider for StrictProvider {
    fn cell() -> &'static OnceLock<Result<Box<dyn Net>, NetError>> {
        static CELL: OnceLock<Result<Box<dyn Net>, NetError>> = OnceLock::new();
        &CELL
    }
    fn make() -> NetResult<Box<dyn Net>> {
        Ok(Box::new(Strict(SocketNet::from_env()?)))
    }
    const NAME: &'static [u8] = b"Strict\0";
}

static V12: Exported<NetV12> = Exported(vtable::<StrictProvider>());

fn symbols(name: &str) -> Option<*const c_void> {
    (name == "ncclNetPlugin_v12").then(|| std::ptr::addr_of!(V12).cast())
}

fn not_native() -> NetResult<Box<dyn Net>> {
    Err(NetError::Internal("reached through its vtable only".into()))
}

oxccl_plugin::inventory::submit! {
    BuiltinNet { name: "Strict", priority: 0, init: not_native, abi: Some(symbols) }
}

/// The tests take turns: the counts above are the process's.
fn turn() -> std::sync::MutexGuard<'static, ()> {
    static TURN: Mutex<()> = Mutex::new(());
    TURN.lock().unwrap_or_else(|p| p.into_inner())
}

const CHUNK: usize = 1024;
/// A staging slot of the core's: its 32-byte operation header and a slice.
const SLOT_BYTES: usize = 32 + CHUNK;

/// Small slices, so that operations run through many staging slots and
/// over two channels. The ranks share a host: SHM_DISABLE keeps them on
/// the network under test once a shared-memory transport exists.
fn cfg(algo: &str) -> CommConfig {
    CommConfig::default()
        .with("SHM_DISABLE", "1")
        .with("SOCKET_IFNAME", "lo")
        .with("TIMEOUT", "30")
        .with("NET", "Strict")
        .with("NET_PLUGIN", "none")
        .with("CHUNK_SIZE", &CHUNK.to_string())
        .with("MAX_NCHANNELS", "2")
        .with("ALGO", algo)
}

/// Runs `f(rank, comm)` on every rank at once, one thread each.
fn on_ranks<F: Fn(usize, &Comm) + Sync>(comms: &[Comm], f: F) {
    std::thread::scope(|s| {
        let f = &f;
        let hs: Vec<_> = comms
            .iter()
            .enumerate()
            .map(|(r, c)| s.spawn(move || f(r, c)))
            .collect();
        for h in hs {
            h.join().unwrap();
        }
    });
}

fn bytes(v: &[i32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_ne_bytes()).collect()
}

fn ints(b: &[u8]) -> Vec<i32> {
    b.chunks_exact(4)
        .map(|c| i32::from_ne_bytes(c.try_into().unwrap()))
        .collect()
}

fn random(n: usize) -> Vec<i32> {
    let mut rng = rand::rng();
    (0..n).map(|_| rng.random_range(-1000..1000)).collect()
}

/// Output poisoned beforehand, so that a result never written shows.
fn poisoned(n: usize) -> Vec<u8> {
    bytes(&random(n))
}

/// Element-wise sum or max of the ranks' vectors.
fn fold(inputs: &[Vec<i32>], f: fn(i32, i32) -> i32) -> Vec<i32> {
    let mut acc = inputs[0].clone();
    for v in &inputs[1..] {
        for (a, b) in acc.iter_mut().zip(v) {
            *a = f(*a, *b);
        }
    }
    acc
}

/// Every kind of host collective on `count` elements, checked on every rank.
fn every_kind(comms: &[Comm], count: usize) {
    let n = comms.len();
    let sum = |a: i32, b: i32| a + b;
    let inputs: Vec<Vec<i32>> = (0..n).map(|_| random(count)).collect();
    let total = fold(&inputs, sum);
    let max = fold(&inputs, std::cmp::max);
    // Per rank, n blocks of `count` (reduce-scatter's inputs, all-to-all's).
    let blocks: Vec<Vec<i32>> = (0..n).map(|_| random(n * count)).collect();
    let block_sum = fold(&blocks, sum);
    let gathered: Vec<i32> = inputs.concat();
    let root = count % n;
    on_ranks(comms, |r, c| {
        let what = |k: &str| format!("{k}: rank {r} of {n}, {count} element(s)");
        let mine = bytes(&inputs[r]);

        let mut out = poisoned(count);
        c.all_reduce(Some(&mine), &mut out, DataType::Int32, RedOp::Sum)
            .unwrap();
        assert_eq!(ints(&out), total, "{}", what("all_reduce"));

        let mut inplace = mine.clone();
        c.all_reduce(None, &mut inplace, DataType::Int32, RedOp::Max)
            .unwrap();
        assert_eq!(ints(&inplace), max, "{}", what("in-place all_reduce"));

        let mut out = poisoned(count);
        c.broadcast(Some(&mine), &mut out, DataType::Int32, root)
            .unwrap();
        assert_eq!(ints(&out), inputs[root], "{}", what("broadcast"));

        let mut out = poisoned(count);
        c.reduce(Some(&mine), &mut out, DataType::Int32, RedOp::Sum, root)
            .unwrap();
        if r == root {
            assert_eq!(ints(&out), total, "{}", what("reduce"));
        }

        let mut out = poisoned(n * count);
        c.all_gather(Some(&mine), &mut out, DataType::Int32)
            .unwrap();
        assert_eq!(ints(&out), gathered, "{}", what("all_gather"));

        let mut out = poisoned(n * count);
        out[r * count * 4..(r + 1) * count * 4].copy_from_slice(&mine);
        c.all_gather(None, &mut out, DataType::Int32).unwrap();
        assert_eq!(ints(&out), gathered, "{}", what("in-place all_gather"));

        let mut out = poisoned(count);
        c.reduce_scatter(&bytes(&blocks[r]), &mut out, DataType::Int32, RedOp::Sum)
            .unwrap();
        let want = &block_sum[r * count..(r + 1) * count];
        assert_eq!(ints(&out), want, "{}", what("reduce_scatter"));

        let mut buf = bytes(&blocks[r]);
        c.reduce_scatter_in_place(&mut buf, DataType::Int32, RedOp::Sum)
            .unwrap();
        assert_eq!(
            ints(&buf[r * count * 4..(r + 1) * count * 4]),
            want,
            "{}",
            what("in-place reduce_scatter")
        );

        // A ring of sends and receives in one group.
        let (next, prev) = ((r + 1) % n, (r + n - 1) % n);
        let mut out = poisoned(count);
        let mut g = Group::new();
        g.send(c, &mine, DataType::Int32, next).unwrap();
        g.recv(c, &mut out, DataType::Int32, prev).unwrap();
        g.run().unwrap();
        assert_eq!(ints(&out), inputs[prev], "{}", what("send/recv"));

        // Block j of rank i's input lands in block i of rank j's output.
        let mut out = poisoned(n * count);
        oxccl::all_to_all(c, &bytes(&blocks[r]), &mut out, DataType::Int32).unwrap();
        let want: Vec<i32> = (0..n)
            .flat_map(|i| blocks[i][r * count..(r + 1) * count].to_vec())
            .collect();
        assert_eq!(ints(&out), want, "{}", what("all_to_all"));
    });
}

/// Waits for the cores of destroyed communicators to be dropped (an
/// operation's thread may hold one a moment longer).
fn wait_released() -> usize {
    let t = Instant::now();
    while live() > 0 && t.elapsed() < Duration::from_secs(20) {
        std::thread::sleep(Duration::from_millis(20));
    }
    live()
}

#[test]
fn every_collective_hands_the_network_registered_memory() {
    let _turn = turn();
    let counts = [1, 5, 1000, 9000];
    for algo in ["Ring", "Tree"] {
        for n in 2..=4 {
            let comms = Comm::init_all(n, &cfg(algo)).unwrap();
            assert_eq!(comms[0].net_name().unwrap(), "Strict");
            for &count in &counts {
                every_kind(&comms, count);
            }
            // Between operations only staging slots stay registered (no
            // buffer of this test has their size): the operations' own
            // registrations are gone. Each slot is registered once per
            // connection (REDUNDANT, below), however often it is used.
            for round in 0..2 {
                if round > 0 {
                    for &count in &counts {
                        every_kind(&comms, count);
                    }
                }
                let sizes = live_sizes();
                assert!(!sizes.is_empty(), "{algo}, {n} ranks");
                assert!(
                    sizes.iter().all(|&b| b == SLOT_BYTES),
                    "{algo}, {n} ranks: {sizes:?}"
                );
            }
            assert!(violations().is_empty(), "{:#?}", violations());
            for c in &comms {
                c.destroy().unwrap();
            }
            assert_eq!(wait_released(), 0, "{algo}, {n} ranks");
        }
    }
    assert!(violations().is_empty(), "{:#?}", violations());
    assert_eq!(REDUNDANT.load(Ordering::SeqCst), 0);
    let (regs, deregs) = (REGS.load(Ordering::SeqCst), DEREGS.load(Ordering::SeqCst));
    assert!(
        regs > 0 && regs == deregs,
        "{regs} registered, {deregs} released"
    );
}

#[test]
fn a_refused_registration_names_the_call_and_the_peer() {
    let _turn = turn();
    let comms = Comm::init_all(2, &cfg("Ring")).unwrap();
    FAIL_REG.store(true, Ordering::SeqCst);
    let errs: Vec<String> = std::thread::scope(|s| {
        let hs: Vec<_> = comms
            .iter()
            .map(|c| {
                s.spawn(move || {
                    let mut b = bytes(&random(100));
                    c.all_reduce(None, &mut b, DataType::Int32, RedOp::Sum)
                        .unwrap_err()
                        .to_string()
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    FAIL_REG.store(false, Ordering::SeqCst);
    for e in &errs {
        assert!(e.contains("regMr"), "{e}");
        assert!(
            e.contains("send to rank") || e.contains("receive from rank"),
            "{e}"
        );
    }
    for c in &comms {
        c.destroy().unwrap();
    }
    assert_eq!(wait_released(), 0);
    assert!(violations().is_empty(), "{:#?}", violations());
}
