//! A library's `ncclNet_vN_t` as the core's one `Net` trait.
//!
//! Written once against the newest version: the SDK's
//! [`oxccl_plugin::ffi::net::Abi`] presents any version's vtable in v12's
//! shape (each version file converts its own arguments and fills what it
//! lacks, as NCCL's `net_vN.cc` do), so nothing here matches on a version.
#![allow(unsafe_code)]

use std::ffi::CStr;
use std::os::raw::{c_int, c_void};
use std::ptr::null_mut;

use oxccl_plugin::ffi::net::{
    v12, Abi, Same, LOADABLE, MAX_NET_SIZE, NCCL_NET_TRAFFIC_CLASS_UNDEF,
};
use oxccl_plugin::ffi::*;
use oxccl_plugin::{
    DmaBuf, ListenComm, MrHandle, Net, NetError, NetHandle, NetProf, NetProperties, NetResult,
    PtrType, RecvComm, Request, SendComm, NET_HANDLE_MAXSIZE,
};

use oxccl_plugin::loader::Lib;

/// Net symbols NCCL has defined, newest first, with the version this
/// adapter loads them as (`None`: known, not loadable here).
pub const SYMBOLS: &[(&str, Option<u32>)] = &[
    ("ncclNetPlugin_v12", Some(12)),
    ("ncclNetPlugin_v11", Some(11)),
    ("ncclNetPlugin_v10", Some(10)),
    ("ncclNetPlugin_v9", Some(9)),
    ("ncclNetPlugin_v8", Some(8)),
    ("ncclNetPlugin_v7", Some(7)),
    ("ncclNetPlugin_v6", Some(6)),
];

/// A v11+ context: one per communicator ([`CPlugin::open`]), as NCCL's
/// `ncclNetInit` makes, or one shared by a communicator and the splits that
/// share its resources. There is none for the process: the vtable kept by
/// [`CPlugin`] holds NULL and is never called with it.
#[derive(Clone, Copy)]
struct Ctx(*mut c_void);

/// A vtable in the newest shape, the entries typed as the newest's copied
/// out once, and the context (NULL before v11 and in [`CPlugin`]).
#[derive(Clone, Copy)]
struct Vt {
    abi: &'static dyn Abi,
    same: Same,
    ctx: Ctx,
}

// SAFETY: the vtable is immutable data of a library kept loaded by the
// `Lib` held next to it; the context is the plugin's, which NCCL also shares
// between threads.
unsafe impl Send for Vt {}
// SAFETY: as above.
unsafe impl Sync for Vt {}

fn check(what: &str, r: i32) -> NetResult<()> {
    // Every poll of a request comes through here: success costs nothing.
    if r == NCCL_SUCCESS {
        return Ok(());
    }
    let name = match r {
        1 => "ncclUnhandledCudaError",
        2 => "ncclSystemError",
        3 => "ncclInternalError",
        4 => "ncclInvalidArgument",
        5 => "ncclInvalidUsage",
        6 => "ncclRemoteError",
        7 => "ncclInProgress",
        _ => "an unknown result",
    };
    let m = format!("plugin {what} returned {name} ({r})");
    match r {
        NCCL_SUCCESS => Ok(()),
        NCCL_SYSTEM_ERROR => Err(NetError::System(m)),
        NCCL_INVALID_ARGUMENT => Err(NetError::InvalidArgument(m)),
        NCCL_REMOTE_ERROR => Err(NetError::Remote(m)),
        NCCL_INVALID_USAGE => Err(NetError::InvalidUsage(m)),
        _ => Err(NetError::Internal(m)),
    }
}

fn missing(f: &str) -> NetError {
    NetError::Internal(format!("the plugin's vtable has a NULL {f}"))
}

/// Why a library's net vtable was not used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub looked: Vec<&'static str>,
    pub found: Vec<&'static str>,
    pub reason: String,
}

/// A negotiated vtable and its library, shared by every context made from
/// it. Before v11 the plugin's one `init` has run; from v11 on nothing has:
/// each [`CPlugin::open`] makes a context.
pub struct CPlugin {
    /// v11+: with a NULL context, only copied into [`Hold`]s with a real one.
    vt: Vt,
    /// Keeps the library loaded while any context or comm made from it lives.
    _lib: Lib,
    name: String,
    /// The symbol the vtable was read from, and what the refusal line names.
    sym: &'static str,
    looked: Vec<&'static str>,
    found: Vec<&'static str>,
    /// What `devices()` answered: NCCL asks once, right after the first
    /// `init` (`ncclNetPluginInit`), and keeps the count for every later
    /// communicator.
    devices: std::sync::Mutex<Option<usize>>,
}

/// What keeps a vtable usable: its library loaded and, for v11+, its
/// context alive. Every comm and request made through a context holds it, so
/// that `finalize` runs after the last of them is closed (NCCL finalizes a
/// communicator's context after closing its connections), whatever order
/// their owners drop in. Communicators that share a context (a split with
/// NCCL's splitShare) share one `Hold`: it is finalized once, when the last
/// of them is gone.
struct Hold {
    vt: Vt,
    plugin: std::sync::Arc<CPlugin>,
}

impl Drop for Hold {
    fn drop(&mut self) {
        if self.vt.abi.has_context() {
            // SAFETY: the context `init` returned, finalized once (the
            // last holder is dropping it); the library is still loaded
            // (`plugin` drops after this).
            let _ = unsafe { self.vt.abi.finalize(self.vt.ctx.0) };
        }
    }
}

/// A network reached through one of the C vtables, with its context (v11+).
pub struct CNet {
    hold: std::sync::Arc<Hold>,
}

impl CPlugin {
    /// Picks the newest net version the library exports and checks its
    /// required entries. Before v11 it also runs the plugin's one `init`
    /// (those versions have no context, and NCCL's compat layer inits them
    /// once); from v11 on `init` waits for [`CPlugin::open`].
    pub fn negotiate(lib: &Lib) -> Result<CPlugin, Refusal> {
        let looked: Vec<&'static str> = SYMBOLS.iter().map(|(s, _)| *s).collect();
        let found = lib.present(&looked);
        let refuse = |reason: String| Refusal {
            looked: looked.clone(),
            found: found.clone(),
            reason,
        };
        let Some(l) = LOADABLE.iter().find(|l| found.contains(&l.symbol)) else {
            return Err(refuse(
                "no net ABI version this oxccl loads (v6 to v12)".to_string(),
            ));
        };
        let sym = l.symbol;
        let p = lib.symbol(sym).expect("found above");
        // SAFETY: by the ABI, the symbol `ncclNetPlugin_vN` is an
        // `ncclNet_vN_t`; the library stays loaded as long as `lib` (held by
        // the returned value and every comm made from it).
        let abi = unsafe { (l.cast)(p as *const c_void) };
        let vt = Vt {
            abi,
            same: abi.same(),
            ctx: Ctx(null_mut()),
        };
        let null = abi.null_entries();
        if !null.is_empty() {
            return Err(refuse(format!("{sym} has NULL {}", null.join(", "))));
        }
        // SAFETY: checked non-null; the plugin's name is a C string.
        let name = unsafe { CStr::from_ptr(abi.name()) }
            .to_string_lossy()
            .into_owned();
        let plugin = CPlugin {
            vt,
            _lib: lib.clone(),
            name,
            sym,
            looked: looked.clone(),
            found: found.clone(),
            devices: std::sync::Mutex::new(None),
        };
        if !abi.has_context() {
            init(vt, 0, None).map_err(|e| refuse(plugin.init_failed(&e)))?;
        }
        Ok(plugin)
    }

    /// The network as the communicator `comm_hash` uses it. v11+:
    /// `init(&ctx, comm_hash, …)` here, and that context is finalized once
    /// the returned value and every comm made through it are gone. Before
    /// v11 there is no context: the process's one `init` serves.
    pub fn open(
        self: &std::sync::Arc<Self>,
        comm_hash: u64,
        traffic_class: Option<i32>,
    ) -> NetResult<CNet> {
        let vt = if self.vt.abi.has_context() {
            init(self.vt, comm_hash, traffic_class)?
        } else {
            self.vt
        };
        Ok(CNet {
            hold: std::sync::Arc::new(Hold {
                vt,
                plugin: self.clone(),
            }),
        })
    }

    /// Why `init` failed, as the refusal line gives it.
    pub fn init_failed(&self, e: &NetError) -> String {
        format!("{} init failed: {e}", self.sym)
    }

    /// This library refused for `reason` (after negotiation: a failed
    /// `init`), with what was looked for and found.
    pub fn refusal(&self, reason: String) -> Refusal {
        Refusal {
            looked: self.looked.clone(),
            found: self.found.clone(),
            reason,
        }
    }

    /// A built-in keeps its registered name ("Socket"), which `NCCL_NET`
    /// matches, rather than the name its exported vtable gives libraries.
    pub fn renamed(mut self, name: &str) -> CPlugin {
        self.name = name.to_string();
        self
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The ABI version in use ("v11").
    pub fn version(&self) -> String {
        format!("v{}", self.vt.abi.version())
    }
}

impl CNet {
    fn vt(&self) -> Vt {
        self.hold.vt
    }

    /// Whether this value has a context (v11+), which its listen and
    /// connect pass.
    #[cfg(test)]
    fn has_context(&self) -> bool {
        self.vt().abi.has_context()
    }
}

/// Runs `init` with the core's logger; v11+ also returns a context, made
/// for the communicator `comm_id` (0: a context made only to look at the
/// devices before any communicator exists, finalized right after), with
/// its config's traffic class (None: NCCL's undefined value).
fn init(vt: Vt, comm_id: u64, traffic_class: Option<i32>) -> NetResult<Vt> {
    let log = crate::plugin::ffi_log::logger();
    let mut ctx = null_mut();
    let mut cfg = v12::CommConfigV12 {
        traffic_class: traffic_class.unwrap_or(NCCL_NET_TRAFFIC_CLASS_UNDEF),
    };
    // The profiler callback, as NCCL gives it to every net plugin: events
    // the plugin reports under an operation's handle reach the profiler
    // (v10 and later; older versions' conversions drop it).
    let prof = Some(crate::plugin::profiler::net_callback as _);
    // SAFETY: entries checked non-null at load; the arguments are what the
    // ABI describes (a logger, the profiler callback, a config with the
    // traffic class left to the plugin, a context out-pointer).
    check("init", unsafe {
        vt.abi.init(&mut ctx, comm_id, &mut cfg, log, prof)
    })?;
    Ok(Vt {
        ctx: Ctx(ctx),
        ..vt
    })
}

fn cstr(c: *mut std::os::raw::c_char) -> String {
    if c.is_null() {
        String::new()
    } else {
        // SAFETY: the plugin returns NUL-terminated strings it keeps alive.
        unsafe { CStr::from_ptr(c) }.to_string_lossy().into_owned()
    }
}

impl Net for CNet {
    fn name(&self) -> &str {
        &self.hold.plugin.name
    }

    /// Asked of the plugin once (a context is alive: this value's, or
    /// before v11 the process's `init` ran), then answered from
    /// [`CPlugin::devices`]; a failure is not kept, the next call asks again.
    fn devices(&self) -> NetResult<usize> {
        let mut known = self
            .hold
            .plugin
            .devices
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if let Some(n) = *known {
            return Ok(n);
        }
        let mut n: c_int = 0;
        let f = self.vt().same.devices.ok_or_else(|| missing("devices"))?;
        // SAFETY: a valid out-pointer.
        check("devices", unsafe { f(&mut n) })?;
        let n = n.max(0) as usize;
        *known = Some(n);
        Ok(n)
    }

    fn properties(&self, dev: usize) -> NetResult<NetProperties> {
        // SAFETY: an all-zero properties struct is valid (NULL pointers, zeros).
        let mut p: v12::PropertiesV12 = unsafe { std::mem::zeroed() };
        // SAFETY: entry checked non-null at load; `p` is the newest's struct,
        // which the version's conversion fills.
        check("getProperties", unsafe {
            self.vt().abi.get_properties(dev as c_int, &mut p)
        })?;
        Ok(NetProperties {
            name: cstr(p.name),
            pci_path: cstr(p.pci_path),
            guid: p.guid,
            // NCCL takes dma-buf only from a plugin with regMrDmaBuf.
            ptr_support: match self.vt().same.reg_mr_dma_buf {
                Some(_) => p.ptr_support,
                None => p.ptr_support & !(PtrType::Dmabuf as i32),
            },
            reg_is_global: p.reg_is_global != 0,
            speed_mbps: p.speed,
            port: p.port,
            latency_us: p.latency,
            max_comms: p.max_comms,
            max_recvs: p.max_recvs,
            // 0 (unset): the limit NCCL assumes, as v8 (which lacks it) gets.
            max_p2p_bytes: if p.max_p2p_bytes == 0 {
                MAX_NET_SIZE
            } else {
                p.max_p2p_bytes
            },
        })
    }

    fn listen(&self, dev: usize) -> NetResult<(NetHandle, Box<dyn ListenComm>)> {
        let mut h = [0u8; NET_HANDLE_MAXSIZE];
        let mut c = null_mut();
        let (d, hp) = (dev as c_int, h.as_mut_ptr() as *mut c_void);
        let vt = self.vt();
        // SAFETY: entries checked non-null at load; a 128-byte handle buffer
        // and a valid out-pointer, as the ABI asks.
        let r = unsafe { vt.abi.listen(vt.ctx.0, d, hp, &mut c) };
        check("listen", r)?;
        Ok((h, Box::new(self.comm(c, Kind::Listen))))
    }

    fn connect(&self, dev: usize, handle: &mut NetHandle) -> NetResult<Option<Box<dyn SendComm>>> {
        let mut c = null_mut();
        let mut dc = null_mut();
        let (d, hp) = (dev as c_int, handle.as_mut_ptr() as *mut c_void);
        let vt = self.vt();
        // SAFETY: entries checked non-null at load; the handle buffer the
        // peer's listen wrote, valid out-pointers.
        let r = unsafe { vt.abi.connect(vt.ctx.0, d, hp, &mut c, &mut dc) };
        check("connect", r)?;
        Ok((!c.is_null()).then(|| Box::new(self.comm(c, Kind::Send)) as Box<dyn SendComm>))
    }
}

impl CNet {
    fn comm(&self, c: *mut c_void, kind: Kind) -> CComm {
        CComm {
            vt: self.vt(),
            _hold: self.hold.clone(),
            c,
            kind,
        }
    }
}

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Send,
    Recv,
    Listen,
}

struct CComm {
    vt: Vt,
    _hold: std::sync::Arc<Hold>,
    c: *mut c_void,
    kind: Kind,
}

// SAFETY: a comm is used by one thread at a time (it is `&mut` for every
// call), which is all the ABI requires of its caller.
unsafe impl Send for CComm {}

impl Drop for CComm {
    fn drop(&mut self) {
        let f = match self.kind {
            Kind::Send => self.vt.same.close_send,
            Kind::Recv => self.vt.same.close_recv,
            Kind::Listen => self.vt.same.close_listen,
        };
        if let Some(f) = f {
            // SAFETY: the comm the plugin returned, closed once.
            let _ = unsafe { f(self.c) };
        }
    }
}

impl CComm {
    fn reg(&mut self, ptr: *mut u8, size: usize, t: PtrType) -> NetResult<MrHandle> {
        let mut mh = null_mut();
        // SAFETY: our comm, the caller's buffer, a valid out-pointer.
        check("regMr", unsafe {
            self.vt
                .abi
                .reg_mr(self.c, ptr as *mut c_void, size, t as c_int, &mut mh)
        })?;
        Ok(MrHandle(mh as usize))
    }

    fn reg_dmabuf(
        &mut self,
        ptr: *mut u8,
        size: usize,
        t: PtrType,
        d: DmaBuf,
    ) -> NetResult<MrHandle> {
        let f = self
            .vt
            .same
            .reg_mr_dma_buf
            .ok_or_else(|| missing("regMrDmaBuf"))?;
        let mut mh = null_mut();
        // SAFETY: our comm, the caller's device memory and the dma-buf the
        // driver exported of it (open for the call), a valid out-pointer.
        check("regMrDmaBuf", unsafe {
            f(
                self.c,
                ptr as *mut c_void,
                size,
                t as c_int,
                d.offset,
                d.fd,
                &mut mh,
            )
        })?;
        Ok(MrHandle(mh as usize))
    }

    fn dereg(&mut self, m: MrHandle) -> NetResult<()> {
        let f = self.vt.same.dereg_mr.ok_or_else(|| missing("deregMr"))?;
        // SAFETY: our comm and a handle its regMr returned.
        check("deregMr", unsafe { f(self.c, m.0 as *mut c_void) })
    }

    fn request(&self, r: *mut c_void) -> Option<Box<dyn Request>> {
        (!r.is_null()).then(|| {
            Box::new(CRequest {
                vt: self.vt,
                _hold: self._hold.clone(),
                r,
                done: false,
            }) as Box<dyn Request>
        })
    }
}

impl ListenComm for CComm {
    fn accept(&mut self) -> NetResult<Option<Box<dyn RecvComm>>> {
        let mut c = null_mut();
        let mut dc = null_mut();
        // SAFETY: our listen comm and valid out-pointers.
        check("accept", unsafe {
            self.vt.abi.accept(self.c, &mut c, &mut dc)
        })?;
        Ok((!c.is_null()).then(|| {
            Box::new(CComm {
                vt: self.vt,
                _hold: self._hold.clone(),
                c,
                kind: Kind::Recv,
            }) as Box<dyn RecvComm>
        }))
    }
}

fn mr(m: Option<MrHandle>) -> *mut c_void {
    m.map_or(null_mut(), |m| m.0 as *mut c_void)
}

impl SendComm for CComm {
    fn reg_mr(&mut self, ptr: *mut u8, size: usize, t: PtrType) -> NetResult<MrHandle> {
        self.reg(ptr, size, t)
    }
    fn reg_mr_dma_buf(
        &mut self,
        ptr: *mut u8,
        size: usize,
        t: PtrType,
        d: DmaBuf,
    ) -> NetResult<MrHandle> {
        self.reg_dmabuf(ptr, size, t, d)
    }
    fn dereg_mr(&mut self, m: MrHandle) -> NetResult<()> {
        self.dereg(m)
    }
    unsafe fn isend(
        &mut self,
        data: *const u8,
        size: usize,
        tag: i32,
        m: Option<MrHandle>,
    ) -> NetResult<Option<Box<dyn Request>>> {
        // SAFETY: forwarded under the caller's contract.
        unsafe { self.isend_profiled(data, size, tag, m, None) }
    }
    /// The operation's profiler handle goes to the plugin, which reports
    /// through the callback its `init` was given.
    unsafe fn isend_profiled(
        &mut self,
        data: *const u8,
        size: usize,
        tag: i32,
        m: Option<MrHandle>,
        prof: Option<NetProf>,
    ) -> NetResult<Option<Box<dyn Request>>> {
        let mut r = null_mut();
        let (c, d, mh) = (self.c, data as *mut c_void, mr(m));
        let ph = prof.map_or(null_mut(), |p| p.phandle());
        // SAFETY: entries checked non-null at load; the caller keeps `data`
        // valid until the request completes (this function's contract).
        let rc = unsafe { self.vt.abi.isend(c, d, size, tag, mh, ph, &mut r) };
        check("isend", rc)?;
        Ok(self.request(r))
    }
}

impl RecvComm for CComm {
    fn reg_mr(&mut self, ptr: *mut u8, size: usize, t: PtrType) -> NetResult<MrHandle> {
        self.reg(ptr, size, t)
    }
    fn reg_mr_dma_buf(
        &mut self,
        ptr: *mut u8,
        size: usize,
        t: PtrType,
        d: DmaBuf,
    ) -> NetResult<MrHandle> {
        self.reg_dmabuf(ptr, size, t, d)
    }
    fn dereg_mr(&mut self, m: MrHandle) -> NetResult<()> {
        self.dereg(m)
    }
    unsafe fn irecv(
        &mut self,
        data: *mut u8,
        size: usize,
        tag: i32,
        m: Option<MrHandle>,
    ) -> NetResult<Option<Box<dyn Request>>> {
        // SAFETY: forwarded under the caller's contract.
        unsafe { self.irecv_profiled(data, size, tag, m, None) }
    }
    unsafe fn irecv_profiled(
        &mut self,
        data: *mut u8,
        size: usize,
        tag: i32,
        m: Option<MrHandle>,
        prof: Option<NetProf>,
    ) -> NetResult<Option<Box<dyn Request>>> {
        let (mut d, mut t, mut mh) = (data as *mut c_void, tag, mr(m));
        let mut ph: *mut c_void = prof.map_or(null_mut(), |p| p.phandle());
        let mut s = size;
        let mut r = null_mut();
        let c = self.c;
        // SAFETY: entries checked non-null at load; arrays of one entry; the
        // caller keeps `data` valid until the request completes.
        let rc = unsafe {
            self.vt
                .abi
                .irecv(c, 1, &mut d, &mut s, &mut t, &mut mh, &mut ph, &mut r)
        };
        check("irecv", rc)?;
        Ok(self.request(r))
    }
}

struct CRequest {
    vt: Vt,
    _hold: std::sync::Arc<Hold>,
    r: *mut c_void,
    done: bool,
}

// SAFETY: a request is tested by one thread at a time (`&mut self`).
unsafe impl Send for CRequest {}

impl Request for CRequest {
    fn test(&mut self) -> NetResult<Option<Vec<usize>>> {
        Ok(self.test_first()?.map(|s| s.into_iter().collect()))
    }

    fn test_first(&mut self) -> NetResult<Option<Option<usize>>> {
        if self.done {
            return Err(NetError::Internal("request tested after completion".into()));
        }
        // -1 stays where the plugin does not write the size (see
        // `Request::test`): reported as "done, size unknown".
        let (mut done, mut size): (c_int, c_int) = (0, -1);
        let f = self.vt.same.test.ok_or_else(|| missing("test"))?;
        // SAFETY: a request the plugin returned, not yet completed.
        let r = unsafe { f(self.r, &mut done, &mut size) };
        if r != NCCL_SUCCESS {
            self.done = true;
        }
        check("test", r)?;
        if done != 0 {
            self.done = true;
            return Ok(Some(usize::try_from(size).ok()));
        }
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use oxccl_net_socket::testing::pair;

    /// The socket network's exported vtable of one version only, as a
    /// library exporting just that version would be.
    /// The version chosen lives in a static read by `symbols`, so tests
    /// running in parallel negotiate one at a time.
    fn negotiate_only(version: u32) -> std::sync::Arc<CPlugin> {
        static ONE: std::sync::Mutex<()> = std::sync::Mutex::new(());
        let _one = ONE.lock().unwrap_or_else(|p| p.into_inner());
        std::sync::Arc::new(CPlugin::negotiate(&only(version)).unwrap())
    }

    fn only(version: u32) -> Lib {
        oxccl_net_socket::force_link();
        static WANT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        WANT.store(version, std::sync::atomic::Ordering::SeqCst);
        fn symbols(name: &str) -> Option<*const std::os::raw::c_void> {
            let v = WANT.load(std::sync::atomic::Ordering::SeqCst);
            let b = oxccl_plugin::builtin_nets()
                .into_iter()
                .find(|b| b.name == "Socket")?;
            (name == format!("ncclNetPlugin_v{v}"))
                .then(|| (b.abi?)(name))
                .flatten()
        }
        Lib::Builtin {
            name: "socket-one-version",
            symbols,
        }
    }

    /// Connects `net` to itself and sends one message; panics on failure.
    /// Connects `net`'s device 0 to itself, sends `msg` into a receive of
    /// `capacity` bytes; returns the sizes the receive reported and its buffer.
    fn round_trip(net: &CNet, msg: &[u8], capacity: usize) -> (Vec<usize>, Vec<u8>) {
        let (mut s, mut r) = pair(net);
        let mut got = vec![0u8; capacity];
        let mut rq = loop {
            // SAFETY: both buffers outlive their requests (polled to completion below).
            if let Some(q) = unsafe { r.irecv(got.as_mut_ptr(), got.len(), 0, None) }.unwrap() {
                break q;
            }
        };
        let mut sq = loop {
            // SAFETY: as above.
            if let Some(q) = unsafe { s.isend(msg.as_ptr(), msg.len(), 0, None) }.unwrap() {
                break q;
            }
        };
        let (mut sd, mut rd) = (None, None);
        while sd.is_none() || rd.is_none() {
            if sd.is_none() {
                sd = sq.test().unwrap();
            }
            if rd.is_none() {
                rd = rq.test().unwrap();
            }
        }
        (rd.unwrap(), got)
    }

    /// A 100-byte message of `fill` arrives whole.
    fn echo(net: &CNet, fill: u8) {
        let msg = vec![fill; 100];
        assert_eq!(round_trip(net, &msg, 100).1, msg);
    }

    /// A network whose registrations are its own: every regMr answers a
    /// fresh value (not the address registered, which a layer in between
    /// could make up again), and every transfer records the handle it was
    /// given. Data moves through the socket network, which ignores handles.
    mod marked {
        use std::os::raw::c_void;
        use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
        use std::sync::{Mutex, OnceLock};

        use oxccl_net_socket::SocketNet;
        use oxccl_plugin::ffi::export::{self, Exported, Provider};
        use oxccl_plugin::ffi::net::{v10, v11, v12, v8, v9};
        use oxccl_plugin::{
            DmaBuf, ListenComm, MrHandle, Net, NetError, NetHandle, NetProperties, NetResult,
            PtrType, RecvComm, Request, SendComm,
        };

        use oxccl_plugin::loader::Lib;

        /// (call, handle) in call order: the handle regMr made, or the one
        /// deregMr, isend or irecv received (0 for none).
        pub static MARKS: Mutex<Vec<(&'static str, usize)>> = Mutex::new(Vec::new());
        static NEXT: AtomicUsize = AtomicUsize::new(0x6d72_0001);

        fn mark(call: &'static str, h: usize) {
            MARKS.lock().unwrap().push((call, h));
        }

        struct Marked(SocketNet);
        struct Listen(Box<dyn ListenComm>);
        struct Send(Box<dyn SendComm>);
        struct Recv(Box<dyn RecvComm>);

        impl Net for Marked {
            fn name(&self) -> &str {
                "marked"
            }
            fn devices(&self) -> NetResult<usize> {
                self.0.devices()
            }
            fn properties(&self, dev: usize) -> NetResult<NetProperties> {
                let mut p = self.0.properties(dev)?;
                p.ptr_support |= PtrType::Dmabuf as i32;
                Ok(p)
            }
            fn listen(&self, dev: usize) -> NetResult<(NetHandle, Box<dyn ListenComm>)> {
                let (h, l) = self.0.listen(dev)?;
                Ok((h, Box::new(Listen(l))))
            }
            fn connect(
                &self,
                dev: usize,
                h: &mut NetHandle,
            ) -> NetResult<Option<Box<dyn SendComm>>> {
                Ok(self
                    .0
                    .connect(dev, h)?
                    .map(|c| Box::new(Send(c)) as Box<dyn SendComm>))
            }
        }

        impl ListenComm for Listen {
            fn accept(&mut self) -> NetResult<Option<Box<dyn RecvComm>>> {
                Ok(self
                    .0
                    .accept()?
                    .map(|c| Box::new(Recv(c)) as Box<dyn RecvComm>))
            }
        }

        fn reg() -> MrHandle {
            let h = NEXT.fetch_add(0x10, Ordering::SeqCst);
            mark("regMr", h);
            MrHandle(h)
        }

        fn seen(call: &'static str, m: Option<MrHandle>) {
            mark(call, m.map_or(0, |m| m.0));
        }

        /// (fd, offset, bytes, pointer type) of each regMrDmaBuf, in order.
        pub static DMABUFS: Mutex<Vec<(i32, u64, usize, i32)>> = Mutex::new(Vec::new());

        fn reg_dmabuf(n: usize, t: PtrType, d: DmaBuf) -> MrHandle {
            DMABUFS.lock().unwrap().push((d.fd, d.offset, n, t as i32));
            reg()
        }

        impl SendComm for Send {
            fn reg_mr(&mut self, _: *mut u8, _: usize, _: PtrType) -> NetResult<MrHandle> {
                Ok(reg())
            }
            fn reg_mr_dma_buf(
                &mut self,
                _: *mut u8,
                n: usize,
                t: PtrType,
                d: DmaBuf,
            ) -> NetResult<MrHandle> {
                Ok(reg_dmabuf(n, t, d))
            }
            fn dereg_mr(&mut self, m: MrHandle) -> NetResult<()> {
                seen("deregMr", Some(m));
                Ok(())
            }
            unsafe fn isend(
                &mut self,
                d: *const u8,
                n: usize,
                tag: i32,
                m: Option<MrHandle>,
            ) -> NetResult<Option<Box<dyn Request>>> {
                seen("isend", m);
                // SAFETY: forwarded under the caller's contract.
                unsafe { self.0.isend(d, n, tag, None) }
            }
        }

        impl RecvComm for Recv {
            fn reg_mr(&mut self, _: *mut u8, _: usize, _: PtrType) -> NetResult<MrHandle> {
                Ok(reg())
            }
            fn reg_mr_dma_buf(
                &mut self,
                _: *mut u8,
                n: usize,
                t: PtrType,
                d: DmaBuf,
            ) -> NetResult<MrHandle> {
                Ok(reg_dmabuf(n, t, d))
            }
            fn dereg_mr(&mut self, m: MrHandle) -> NetResult<()> {
                seen("deregMr", Some(m));
                Ok(())
            }
            unsafe fn irecv(
                &mut self,
                d: *mut u8,
                n: usize,
                tag: i32,
                m: Option<MrHandle>,
            ) -> NetResult<Option<Box<dyn Request>>> {
                seen("irecv", m);
                // SAFETY: forwarded under the caller's contract.
                unsafe { self.0.irecv(d, n, tag, None) }
            }
        }

        struct P;
        impl Provider for P {
            fn cell() -> &'static OnceLock<Result<Box<dyn Net>, NetError>> {
                static CELL: OnceLock<Result<Box<dyn Net>, NetError>> = OnceLock::new();
                &CELL
            }
            fn make() -> NetResult<Box<dyn Net>> {
                Ok(Box::new(Marked(SocketNet::from_env()?)))
            }
            const NAME: &'static [u8] = b"marked\0";
        }

        // The export glue's vtables of every version; it passes handles
        // through unchanged both ways (`MrHandle(p as usize)`), so a
        // handle the network sees is the one that crossed the C ABI.
        static V8: Exported<v8::NetV8> = Exported(v8::exported::<P>());
        static V9: Exported<v9::NetV9> = Exported(v9::exported::<P>());
        static V10: Exported<v10::NetV10> = Exported(v10::exported::<P>());
        static V11: Exported<v11::NetV11> = Exported(v11::exported::<P>());
        static V12: Exported<v12::NetV12> = Exported(export::vtable::<P>());
        /// v12 as a plugin without regMrDmaBuf exports it.
        static V12_NO_DMABUF: Exported<v12::NetV12> = Exported(v12::NetV12 {
            reg_mr_dma_buf: None,
            ..export::vtable::<P>()
        });
        /// [`only`]'s version for [`V12_NO_DMABUF`].
        pub const NO_DMABUF: u32 = 112;
        static WANT: AtomicU32 = AtomicU32::new(0);

        fn symbols(name: &str) -> Option<*const c_void> {
            let v = WANT.load(Ordering::SeqCst);
            if name != format!("ncclNetPlugin_v{}", if v == NO_DMABUF { 12 } else { v }) {
                return None;
            }
            Some(match v {
                NO_DMABUF => std::ptr::addr_of!(V12_NO_DMABUF).cast(),
                8 => std::ptr::addr_of!(V8).cast(),
                9 => std::ptr::addr_of!(V9).cast(),
                10 => std::ptr::addr_of!(V10).cast(),
                11 => std::ptr::addr_of!(V11).cast(),
                _ => std::ptr::addr_of!(V12).cast(),
            })
        }

        /// This network as a library exporting `version` only.
        pub fn only(version: u32) -> std::sync::Arc<super::CPlugin> {
            static ONE: Mutex<()> = Mutex::new(());
            let _one = ONE.lock().unwrap_or_else(|p| p.into_inner());
            WANT.store(version, Ordering::SeqCst);
            let lib = Lib::Builtin {
                name: "marked",
                symbols,
            };
            std::sync::Arc::new(super::CPlugin::negotiate(&lib).unwrap())
        }
    }

    /// regMrDmaBuf reaches the plugin with the descriptor, offset, size and
    /// pointer type given, from both ends and in every version that has it
    /// (v8 on), and its handle is the plugin's; a plugin whose vtable has
    /// no regMrDmaBuf is not taken to accept dma-buf, whatever it reports
    /// (NCCL's dmaBufSupported needs the entry).
    #[test]
    fn dma_buf_registrations_cross_the_abi() {
        let dmabuf = |net: &CNet| net.properties(0).unwrap().ptr_support & PtrType::Dmabuf as i32;
        for v in [8u32, 9, 10, 11, 12] {
            let net = marked::only(v).open(0, None).unwrap();
            assert_ne!(dmabuf(&net), 0, "v{v}");
            let (mut s, mut r) = pair(&net);
            let mut buf = vec![0u8; 8192];
            let d = DmaBuf {
                fd: 40 + v as i32,
                offset: 4096,
            };
            let start = marked::DMABUFS.lock().unwrap().len();
            let sm = s
                .reg_mr_dma_buf(buf.as_mut_ptr(), 100, PtrType::Cuda, d)
                .unwrap();
            let rm = r
                .reg_mr_dma_buf(buf.as_mut_ptr(), 200, PtrType::Cuda, d)
                .unwrap();
            let seen = marked::DMABUFS.lock().unwrap()[start..].to_vec();
            let cuda = PtrType::Cuda as i32;
            assert_eq!(
                seen,
                vec![(d.fd, 4096, 100, cuda), (d.fd, 4096, 200, cuda)],
                "v{v}"
            );
            assert_ne!((sm.0, rm.0), (0, 0), "v{v}");
            s.dereg_mr(sm).unwrap();
            r.dereg_mr(rm).unwrap();
        }
        let net = marked::only(marked::NO_DMABUF).open(0, None).unwrap();
        assert_eq!(dmabuf(&net), 0);
        let (mut s, _r) = pair(&net);
        let e = s
            .reg_mr_dma_buf(
                std::ptr::null_mut(),
                1,
                PtrType::Cuda,
                DmaBuf { fd: 3, offset: 0 },
            )
            .unwrap_err();
        assert!(e.to_string().contains("regMrDmaBuf"), "{e}");
    }

    /// The `mhandle` the adapter passes to isend, irecv and deregMr is
    /// exactly what the plugin's regMr wrote, and the handle the adapter
    /// returns from regMr is that value too, in every version (no boxing
    /// or copying on the way).
    #[test]
    fn transfers_carry_the_handle_reg_mr_made() {
        for v in [8u32, 9, 10, 11, 12] {
            let net = marked::only(v).open(0, None).unwrap();
            let (mut s, mut r) = pair(&net);
            let msg = vec![v as u8; 64];
            let mut got = vec![0u8; 64];
            let start = marked::MARKS.lock().unwrap().len();
            let rm = r
                .reg_mr(got.as_mut_ptr(), got.len(), PtrType::Host)
                .unwrap();
            let sm = s
                .reg_mr(msg.as_ptr() as *mut u8, msg.len(), PtrType::Host)
                .unwrap();
            let mut rq = loop {
                let (p, n) = (got.as_mut_ptr(), got.len());
                // SAFETY: both buffers outlive their requests (polled to completion below).
                if let Some(q) = unsafe { r.irecv(p, n, 0, Some(rm)) }.unwrap() {
                    break q;
                }
            };
            let mut sq = loop {
                // SAFETY: as above.
                if let Some(q) = unsafe { s.isend(msg.as_ptr(), msg.len(), 0, Some(sm)) }.unwrap() {
                    break q;
                }
            };
            let (mut sd, mut rd) = (None, None);
            while sd.is_none() || rd.is_none() {
                if sd.is_none() {
                    sd = sq.test().unwrap();
                }
                if rd.is_none() {
                    rd = rq.test().unwrap();
                }
            }
            assert_eq!(got, msg, "v{v}");
            s.dereg_mr(sm).unwrap();
            r.dereg_mr(rm).unwrap();
            let mut seen = marked::MARKS.lock().unwrap()[start..].to_vec();
            seen.dedup();
            assert_ne!(
                rm.0,
                got.as_ptr() as usize,
                "v{v}: a handle of the plugin's own"
            );
            assert_eq!(
                seen,
                vec![
                    ("regMr", rm.0),
                    ("regMr", sm.0),
                    ("irecv", rm.0),
                    ("isend", sm.0),
                    ("deregMr", sm.0),
                    ("deregMr", rm.0),
                ],
                "v{v}"
            );
        }
    }

    /// Per-communicator views over the export glue: several v11/v12
    /// contexts alive at once, one finalized while the others keep working;
    /// before v11 every view shares the process's one `init`.
    #[test]
    fn contexts_per_communicator_coexist() {
        for v in [11u32, 12] {
            let plugin = negotiate_only(v);
            let a = plugin.open(1, None).unwrap();
            let b = plugin.open(2, None).unwrap();
            assert!(a.has_context() && b.has_context(), "v{v}");
            echo(&a, 1);
            echo(&b, 2);
            drop(a);
            echo(&b, 3);
            let c = plugin.open(3, None).unwrap();
            echo(&c, 4);
            drop(b);
            echo(&c, 5);
        }
        for v in [8u32, 9, 10] {
            let plugin = negotiate_only(v);
            let a = plugin.open(1, None).unwrap();
            assert!(!a.has_context(), "v{v}");
            echo(&a, 6);
        }
    }

    /// Every version's adapter against the same network's export glue:
    /// connect, accept and one message each way of the one connection.
    #[test]
    fn every_version_round_trips_a_message() {
        for v in [8u32, 9, 10, 11, 12] {
            let plugin = negotiate_only(v);
            assert_eq!(plugin.version(), format!("v{v}"));
            let net = plugin.open(0, None).unwrap();
            assert!(net.properties(0).unwrap().max_p2p_bytes > 0);
            let msg: Vec<u8> = (0..1000u32).map(|i| (i * v) as u8).collect();
            let (rd, got) = round_trip(&net, &msg, 4096);
            assert_eq!(rd, vec![1000], "v{v}");
            assert_eq!(&got[..1000], &msg[..], "v{v}");
        }
    }
}
