//! The loader: a library's `ncclNet_vN_t` as the one [`Net`] trait the
//! core drives.
//!
//! Written once against the newest version: [`crate::net::abi::Abi`]
//! presents any version's vtable in v12's shape (each version file converts
//! its own arguments and fills what it lacks, as NCCL's `net_vN.cc` do), so
//! nothing here matches on a version. What the host hands every plugin's
//! `init` (its logger and profiler callback) comes in as [`Host`].
#![allow(unsafe_code)]

use std::ffi::CStr;
use std::os::raw::{c_int, c_void};
use std::ptr::null_mut;

use crate::ffi::*;
use crate::loader::Lib;
use crate::net::abi::{v12, Abi, Same, LOADABLE, MAX_NET_SIZE, NCCL_NET_TRAFFIC_CLASS_UNDEF};
use crate::{
    DmaBuf, ListenComm, MrHandle, Net, NetError, NetHandle, NetProf, NetProperties, NetResult,
    PtrType, RecvComm, Request, SendComm, NET_HANDLE_MAXSIZE,
};

/// What the host passes to every `init` of a net plugin: its logger and
/// the callback through which the plugin reports profiler events (v10 and
/// later; older versions' conversions drop it).
#[derive(Clone, Copy)]
pub struct Host {
    pub log: Logger,
    pub prof: ProfilerCallback,
}

/// [`SYMBOLS`] from the one list of versions ([`crate::net_versions!`]).
macro_rules! symbols {
    ($([$n:literal, $sym:ident, $coll:ident, $m:ident, $ty:ident, $cty:ident,
        $export:ident, $nccl:literal])*) => {
        /// Net symbols NCCL has defined, newest first, with the version this
        /// adapter loads them as (`None`: known, not loadable here).
        pub const SYMBOLS: &[(&str, Option<u32>)] = &[$((stringify!($sym), Some($n)),)*];
    };
}
crate::net_versions!((symbols));

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
    /// Given to each `init`.
    host: Host,
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
    /// once); from v11 on `init` waits for [`CPlugin::open`]. Every `init`
    /// is given `host`'s logger and profiler callback.
    pub fn negotiate(lib: &Lib, host: Host) -> Result<CPlugin, Refusal> {
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
            host,
            devices: std::sync::Mutex::new(None),
        };
        if !abi.has_context() {
            init(vt, host, 0, None).map_err(|e| refuse(plugin.init_failed(&e)))?;
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
            init(self.vt, self.host, comm_hash, traffic_class)?
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
    pub fn has_context(&self) -> bool {
        self.vt().abi.has_context()
    }
}

/// Runs `init` with the host's logger and profiler callback; v11+ also returns a context, made
/// for the communicator `comm_id` (0: a context made only to look at the
/// devices before any communicator exists, finalized right after), with
/// its config's traffic class (None: NCCL's undefined value).
fn init(vt: Vt, host: Host, comm_id: u64, traffic_class: Option<i32>) -> NetResult<Vt> {
    let mut ctx = null_mut();
    let mut cfg = v12::CommConfigV12 {
        traffic_class: traffic_class.unwrap_or(NCCL_NET_TRAFFIC_CLASS_UNDEF),
    };
    // SAFETY: entries checked non-null at load; the arguments are what the
    // ABI describes (a logger, the profiler callback, a config with the
    // traffic class left to the plugin, a context out-pointer).
    check("init", unsafe {
        vt.abi
            .init(&mut ctx, comm_id, &mut cfg, host.log, host.prof)
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
    /// the count its `CPlugin` keeps; a failure is not kept, the next call asks again.
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
