//! The CollNet plugin: an `ncclCollNetPlugin_vN` (v12 down to v6) exported
//! by the net plugin's library, as NCCL looks for it (src/plugin/net.cc:
//! the same library as `NCCL_NET_PLUGIN`, the newest version first). It is
//! noted when the net plugin's library is opened and negotiated the first
//! time a communicator asks for it (`NCCL_COLLNET_ENABLE=1`): `init` (once
//! per process before v11; a probe context from v11 on), `devices`, and
//! device 0's properties. A plugin with no device, a NULL entry oxccl calls,
//! or a failing `init` is not used, with one INFO line saying why.
//!
//! A [`CollComm`] is one rank's membership in a CollNet group: a context
//! (v11+), a listening comm whose handle the caller gathers from every
//! member, and the comm `connect` returns from all the handles. Its
//! [`CollComm::all_reduce`] drives `iallreduce` and `test` to completion on
//! host memory registered with `regMr`.
#![allow(unsafe_code)]

use std::ffi::CStr;
use std::os::raw::{c_int, c_void};
use std::ptr::null_mut;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use oxccl_plugin::ffi::net::collnet::{CollAbi, COLL_LOADABLE};
use oxccl_plugin::ffi::net::v12::{PropertiesV12, SgeV12};
use oxccl_plugin::ffi::net::{NCCL_NET_HANDLE_MAXSIZE, NCCL_PTR_HOST};
use oxccl_plugin::ffi::NCCL_SUCCESS;
use tracing::info;

use crate::error::{Error, Result};
use oxccl_plugin::loader::Lib;

/// Collnet symbols NCCL looks up, newest first.
pub fn symbols() -> Vec<&'static str> {
    COLL_LOADABLE.iter().map(|l| l.symbol).collect()
}

/// A handle as `listen` writes it.
pub type Handle = [u8; NCCL_NET_HANDLE_MAXSIZE];

/// A negotiated CollNet vtable and its library.
pub struct CollNet {
    abi: &'static dyn CollAbi,
    _lib: Lib,
    name: String,
    library: String,
    symbol: &'static str,
    ndev: usize,
    /// Device 0's port speed (Mbit/s) and latency (us), for the cost model.
    pub speed_mbps: i32,
    pub latency_us: f32,
    /// Device 0's largest single collective (`maxCollBytes`).
    pub max_coll_bytes: usize,
    /// Whether `iallgather` and `ireducescatter` are there (v8 on, left
    /// non-NULL by the plugin).
    pub gathers: (bool, bool),
}

// SAFETY: the vtable is immutable data of a library kept loaded by the
// `Lib` held next to it; NCCL calls it from several threads too.
unsafe impl Send for CollNet {}
// SAFETY: as above.
unsafe impl Sync for CollNet {}

/// The library whose collnet symbols were seen, and the negotiation's
/// outcome once asked for.
static FOUND: Mutex<Option<Lib>> = Mutex::new(None);
static NEGOTIATED: Mutex<Option<std::result::Result<Arc<CollNet>, String>>> = Mutex::new(None);

/// Called when the net plugin's library is opened: notes the collnet
/// symbols it exports (if any) for [`plugin`], with an INFO line.
pub fn note(lib: &Lib) {
    let found = lib.present(&symbols());
    if found.is_empty() {
        return;
    }
    info!(target: "oxccl::init|net",
        "collnet plugin in {} ({}): used for all_reduce on host memory where NCCL_COLLNET_ENABLE=1",
        lib.name(), found.join(", "));
    if let Ok(mut f) = FOUND.lock() {
        *f = Some(lib.clone());
    }
    if let Ok(mut n) = NEGOTIATED.lock() {
        *n = None;
    }
}

fn check(what: &str, r: i32) -> Result<()> {
    if r == NCCL_SUCCESS {
        return Ok(());
    }
    let m = format!("collnet plugin {what} returned ncclResult_t {r}");
    Err(match r {
        2 => Error::System(m),
        4 => Error::InvalidArgument(m),
        5 => Error::InvalidUsage(m),
        6 => Error::Remote(m),
        _ => Error::Internal(m),
    })
}

/// The CollNet plugin of the net plugin's library, negotiated once; the
/// reason it is not used otherwise (no library exports one, no device, a
/// NULL entry, `init` failed).
pub fn plugin() -> std::result::Result<Arc<CollNet>, String> {
    let mut slot = NEGOTIATED
        .lock()
        .map_err(|_| "collnet table poisoned by an earlier panic".to_string())?;
    if let Some(r) = slot.as_ref() {
        return r.clone();
    }
    let lib = FOUND.lock().ok().and_then(|f| f.clone());
    let r = match lib {
        None => Err("the net plugin's library (NCCL_NET_PLUGIN) exports no ncclCollNetPlugin_v6..v12; the built-in networks have none".to_string()),
        Some(lib) => negotiate(&lib),
    };
    match &r {
        Ok(c) => info!(target: "oxccl::init|net",
            "collnet plugin {} from {} ({}): {} device(s), {} Mb/s, {} us",
            c.name, c.library, c.symbol, c.ndev, c.speed_mbps, c.latency_us),
        Err(why) => info!(target: "oxccl::init|net", "no collnet: {why}"),
    }
    *slot = Some(r.clone());
    r
}

fn negotiate(lib: &Lib) -> std::result::Result<Arc<CollNet>, String> {
    let Some(l) = COLL_LOADABLE
        .iter()
        .find(|l| lib.symbol(l.symbol).is_some())
    else {
        return Err(format!(
            "{} exports no collnet version this oxccl loads (v6 to v12)",
            lib.name()
        ));
    };
    let p = lib.symbol(l.symbol).expect("found above");
    // SAFETY: by the ABI, the symbol `ncclCollNetPlugin_vN` is an
    // `ncclCollNet_vN_t`; the library stays loaded as long as `lib`, which
    // the returned value holds.
    let abi = unsafe { (l.cast)(p as *const c_void) };
    let refuse = |why: String| format!("{} in {}: {why}; not used", l.symbol, lib.name());
    // What is called before `devices` says whether the rest is needed.
    let first: Vec<&str> = abi
        .null_entries()
        .into_iter()
        .filter(|e| matches!(*e, "name" | "init" | "devices"))
        .collect();
    if !first.is_empty() {
        return Err(refuse(format!("NULL {}", first.join(", "))));
    }
    // SAFETY: checked non-null; the plugin's name is a C string it keeps.
    let name = unsafe { CStr::from_ptr(abi.name()) }
        .to_string_lossy()
        .into_owned();
    let log = crate::plugin::ffi_log::logger();
    // Before v11 `init` is the process's; from v11 a context is made for
    // this look and finalized right after, as each communicator makes its own.
    let mut ctx = null_mut();
    // SAFETY: a logger from our shim and an out-pointer for the context.
    check("init", unsafe { abi.init(&mut ctx, 0, log) }).map_err(|e| refuse(e.to_string()))?;
    let mut n: c_int = 0;
    // SAFETY: an out-pointer for the count.
    let r = check("devices", unsafe { abi.devices(&mut n) });
    let mut props: Option<PropertiesV12> = None;
    if r.is_ok() && n > 0 {
        let null = abi.null_entries();
        if !null.is_empty() {
            if abi.has_context() {
                // SAFETY: the context `init` made above.
                unsafe { abi.finalize(ctx) };
            }
            return Err(refuse(format!("NULL {}", null.join(", "))));
        }
        // SAFETY: properties are plain C data (all-zero valid), filled by
        // the plugin for device 0, which exists.
        let mut pr: PropertiesV12 = unsafe { std::mem::zeroed() };
        // SAFETY: device 0 exists; `pr` is the v12 properties struct.
        if check("getProperties", unsafe { abi.get_properties(0, &mut pr) }).is_ok() {
            props = Some(pr);
        }
    }
    if abi.has_context() {
        // SAFETY: the context `init` made above, used no more.
        let _ = check("finalize", unsafe { abi.finalize(ctx) });
    }
    r.map_err(|e| refuse(e.to_string()))?;
    if n <= 0 {
        return Err(refuse("0 devices".into()));
    }
    let props = props.ok_or_else(|| refuse("getProperties of device 0 failed".into()))?;
    Ok(Arc::new(CollNet {
        abi,
        _lib: lib.clone(),
        name,
        library: lib.name().to_string(),
        symbol: l.symbol,
        ndev: n as usize,
        speed_mbps: props.speed,
        latency_us: props.latency,
        max_coll_bytes: if props.max_coll_bytes == 0 {
            oxccl_plugin::ffi::net::MAX_COLLNET_SIZE
        } else {
            props.max_coll_bytes
        },
        gathers: abi.gathers(),
    }))
}

impl CollNet {
    pub fn name(&self) -> &str {
        &self.name
    }

    /// `ncclCollNetPlugin_vN` it was read from.
    pub fn symbol(&self) -> &'static str {
        self.symbol
    }

    pub fn devices(&self) -> usize {
        self.ndev
    }

    /// Whether the plugin reduces `dtype` (ncclDataType_t) with `op`
    /// (ncclRedOp_t).
    pub fn reduce_support(&self, dtype: i32, op: i32) -> bool {
        let mut s: c_int = 0;
        // SAFETY: an out-pointer; NCCL's numbering of types and ops.
        let r = unsafe { self.abi.reduce_support(dtype, op, &mut s) };
        r == NCCL_SUCCESS && s == 1
    }

    /// This rank's side of a group for the communicator `comm_hash`: a
    /// context (v11+) and a listening comm on device 0, with its handle.
    pub fn listen(self: &Arc<Self>, comm_hash: u64) -> Result<(Listening, Handle)> {
        let mut ctx = null_mut();
        if self.abi.has_context() {
            let log = crate::plugin::ffi_log::logger();
            // SAFETY: a logger from our shim and an out-pointer.
            check("init", unsafe { self.abi.init(&mut ctx, comm_hash, log) })?;
        }
        let mut l = Listening {
            net: self.clone(),
            ctx,
            listen: null_mut(),
        };
        let mut handle = [0u8; NCCL_NET_HANDLE_MAXSIZE];
        // SAFETY: the context made above (or NULL before v11), a handle
        // buffer of NCCL_NET_HANDLE_MAXSIZE bytes and an out-pointer.
        check("listen", unsafe {
            self.abi
                .listen(ctx, 0, handle.as_mut_ptr().cast(), &mut l.listen)
        })?;
        if l.listen.is_null() {
            return Err(Error::Internal(
                "collnet plugin listen succeeded with a NULL comm".into(),
            ));
        }
        Ok((l, handle))
    }
}

/// A listening comm (and its context), before `connect`.
pub struct Listening {
    net: Arc<CollNet>,
    ctx: *mut c_void,
    listen: *mut c_void,
}

// SAFETY: the plugin's comms are used by one thread at a time (a `Mutex`
// in the caller), as NCCL's proxy does.
unsafe impl Send for Listening {}

impl Listening {
    /// `connect` with every member's handle, this rank being `rank` of
    /// them: collective, it returns once the plugin has the group.
    pub fn connect(mut self, handles: &[Handle], rank: usize) -> Result<CollComm> {
        let mut ptrs: Vec<*mut c_void> =
            handles.iter().map(|h| h.as_ptr() as *mut c_void).collect();
        let mut coll = null_mut();
        // SAFETY: one pointer per member to its handle (alive for the
        // call), this rank's place, the listening comm and an out-pointer.
        check("connect", unsafe {
            self.net.abi.connect(
                ptrs.as_mut_ptr(),
                handles.len() as c_int,
                rank as c_int,
                self.listen,
                &mut coll,
            )
        })?;
        if coll.is_null() {
            return Err(Error::Internal(
                "collnet plugin connect succeeded with a NULL comm".into(),
            ));
        }
        let c = CollComm {
            net: self.net.clone(),
            ctx: self.ctx,
            listen: self.listen,
            coll,
            nranks: handles.len(),
            rank,
        };
        self.listen = null_mut();
        self.ctx = null_mut();
        Ok(c)
    }
}

impl Drop for Listening {
    fn drop(&mut self) {
        // SAFETY: the comm and context this value made, used no more.
        unsafe {
            if !self.listen.is_null() {
                self.net.abi.close_listen(self.listen);
            }
            if !self.ctx.is_null() {
                self.net.abi.finalize(self.ctx);
            }
        }
    }
}

/// One rank's comm in a CollNet group.
pub struct CollComm {
    net: Arc<CollNet>,
    ctx: *mut c_void,
    listen: *mut c_void,
    coll: *mut c_void,
    /// Members of the group, and this one's place.
    nranks: usize,
    rank: usize,
}

// SAFETY: as `Listening`.
unsafe impl Send for CollComm {}

impl CollComm {
    pub fn net(&self) -> &Arc<CollNet> {
        &self.net
    }

    /// All-reduces `count` elements of `dtype` (ncclDataType_t, `esize`
    /// bytes each) from `send` into `recv` (which may be `send`) across the
    /// group with `op` (ncclRedOp_t), in pieces of at most `maxCollBytes`;
    /// `stopped` is polled while waiting and ends the wait with its error,
    /// as does `limit` without progress.
    ///
    /// # Safety
    /// `send` and `recv` hold `count * esize` bytes of host memory, not
    /// touched by anyone else until this returns.
    #[allow(clippy::too_many_arguments, reason = "the C call's arguments")]
    pub unsafe fn all_reduce(
        &self,
        send: *const u8,
        recv: *mut u8,
        count: usize,
        esize: usize,
        dtype: i32,
        op: i32,
        limit: Duration,
        stopped: &dyn Fn() -> Option<Error>,
    ) -> Result<()> {
        let abi = self.net.abi;
        let bytes = count * esize;
        let mut smh = null_mut();
        let mut rmh = null_mut();
        // SAFETY: the caller's buffers of `bytes` bytes, host memory.
        check("regMr", unsafe {
            abi.reg_mr(
                self.coll,
                send as *mut c_void,
                bytes,
                NCCL_PTR_HOST,
                &mut smh,
            )
        })?;
        let in_place = std::ptr::eq(send, recv);
        if !in_place {
            // SAFETY: as above.
            if let Err(e) = check("regMr", unsafe {
                abi.reg_mr(self.coll, recv.cast(), bytes, NCCL_PTR_HOST, &mut rmh)
            }) {
                // SAFETY: the registration made above.
                unsafe { abi.dereg_mr(self.coll, smh) };
                return Err(e);
            }
        } else {
            rmh = smh;
        }
        let per = (self.net.max_coll_bytes / esize.max(1)).max(1);
        let r = (|| {
            let mut at = 0;
            while at < count {
                let n = per.min(count - at);
                let off = at * esize;
                drive(abi, limit, stopped, "iallreduce", |req| {
                    // SAFETY: pieces of the registered buffers; the
                    // request out-pointer.
                    check("iallreduce", unsafe {
                        abi.iallreduce(
                            self.coll,
                            send.add(off) as *mut c_void,
                            recv.add(off).cast(),
                            n,
                            dtype,
                            op,
                            smh,
                            rmh,
                            req,
                        )
                    })
                })?;
                at += n;
            }
            Ok(())
        })();
        // SAFETY: the registrations made above, no request in flight
        // (each completed, or the plugin failed it).
        unsafe {
            abi.dereg_mr(self.coll, smh);
            if !in_place {
                abi.dereg_mr(self.coll, rmh);
            }
        }
        r
    }
}

impl CollComm {
    /// Registers `len` bytes of host memory at `p` for the group; the
    /// handle goes with [`CollComm::dereg`].
    fn reg(&self, p: *const u8, len: usize) -> Result<*mut c_void> {
        let mut mh = null_mut();
        // SAFETY: the caller's host memory of `len` bytes, registered
        // until `dereg`.
        check("regMr", unsafe {
            self.net
                .abi
                .reg_mr(self.coll, p as *mut c_void, len, NCCL_PTR_HOST, &mut mh)
        })?;
        Ok(mh)
    }

    fn dereg(&self, mh: *mut c_void) {
        // SAFETY: a registration `reg` made, with no request in flight.
        unsafe { self.net.abi.dereg_mr(self.coll, mh) };
    }

    /// The windows of a `bytes`-byte result a call may move (at most
    /// `maxCollBytes`, a whole number of `esize` elements), each with its
    /// overlap with this member's block of `per` bytes: (window offset,
    /// window bytes, offset in the block where the overlap starts, or 0).
    fn windows(&self, per: usize, esize: usize) -> Vec<(usize, usize, usize)> {
        let total = per * self.nranks;
        let step = (self.net.max_coll_bytes / esize.max(1)).max(1) * esize.max(1);
        let (lo, hi) = (self.rank * per, (self.rank + 1) * per);
        (0..total)
            .step_by(step)
            .map(|off| {
                let w = step.min(total - off);
                let inside = off.max(lo) < (off + w).min(hi);
                (off, w, if inside { off.max(lo) - lo } else { 0 })
            })
            .collect()
    }

    /// All-gathers the group's blocks of `per` bytes: this member's from
    /// `send` into `recv` (`nranks * per` bytes, member `r`'s block at
    /// `r * per`; `send` may be this member's block of it), through
    /// `iallgather` in windows of at most `maxCollBytes`; waits as
    /// [`CollComm::all_reduce`].
    ///
    /// # Safety
    /// `send` holds `per` bytes and `recv` `nranks * per` bytes of host
    /// memory, not touched by anyone else until this returns.
    pub unsafe fn all_gather(
        &self,
        send: *const u8,
        recv: *mut u8,
        per: usize,
        limit: Duration,
        stopped: &dyn Fn() -> Option<Error>,
    ) -> Result<()> {
        let abi = self.net.abi;
        let smh = self.reg(send, per)?;
        let rmh = match self.reg(recv, per * self.nranks) {
            Ok(m) => m,
            Err(e) => {
                self.dereg(smh);
                return Err(e);
            }
        };
        let r = self
            .windows(per, 1)
            .into_iter()
            .try_for_each(|(off, w, at)| {
                let mut part = SgeV12 {
                    mhandle: rmh,
                    // SAFETY: the window lies within `recv`.
                    address: unsafe { recv.add(off) }.cast(),
                    size: w,
                };
                drive(abi, limit, stopped, "iallgather", |req| {
                    // SAFETY: this member's part of the window within `send`,
                    // one piece within `recv`, both registered; the request
                    // out-pointer.
                    check("iallgather", unsafe {
                        abi.iallgather(
                            self.coll,
                            send.add(at) as *mut c_void,
                            1,
                            &mut part,
                            per,
                            off,
                            w,
                            smh,
                            req,
                        )
                    })
                })
            });
        self.dereg(smh);
        self.dereg(rmh);
        r
    }

    /// Reduce-scatters `send` (`nranks * per` bytes of `dtype`, `esize`
    /// bytes each) across the group with `op`: this member's block of the
    /// result (`per` bytes) into `recv`, through `ireducescatter` in windows
    /// of at most `maxCollBytes`; waits as [`CollComm::all_reduce`].
    ///
    /// # Safety
    /// `send` holds `nranks * per` bytes and `recv` `per` bytes of host
    /// memory, not touched by anyone else until this returns.
    #[allow(clippy::too_many_arguments, reason = "the C call's arguments")]
    pub unsafe fn reduce_scatter(
        &self,
        send: *const u8,
        recv: *mut u8,
        per: usize,
        esize: usize,
        dtype: i32,
        op: i32,
        limit: Duration,
        stopped: &dyn Fn() -> Option<Error>,
    ) -> Result<()> {
        let abi = self.net.abi;
        let smh = self.reg(send, per * self.nranks)?;
        let rmh = match self.reg(recv, per) {
            Ok(m) => m,
            Err(e) => {
                self.dereg(smh);
                return Err(e);
            }
        };
        let r = self
            .windows(per, esize)
            .into_iter()
            .try_for_each(|(off, w, at)| {
                let mut part = SgeV12 {
                    mhandle: smh,
                    // SAFETY: the window lies within `send`.
                    address: unsafe { send.add(off) } as *mut c_void,
                    size: w,
                };
                drive(abi, limit, stopped, "ireducescatter", |req| {
                    // SAFETY: one registered piece within `send`, this
                    // member's part of the window within `recv`; the
                    // request out-pointer.
                    check("ireducescatter", unsafe {
                        abi.ireducescatter(
                            self.coll,
                            1,
                            &mut part,
                            recv.add(at).cast(),
                            per,
                            off,
                            w,
                            dtype,
                            op,
                            rmh,
                            req,
                        )
                    })
                })
            });
        self.dereg(smh);
        self.dereg(rmh);
        r
    }
}

/// Posts one collective (`post` writes the request, NULL for "retry
/// later") until the plugin takes it, then tests it to completion.
fn drive(
    abi: &dyn CollAbi,
    limit: Duration,
    stopped: &dyn Fn() -> Option<Error>,
    what: &str,
    mut post: impl FnMut(*mut *mut c_void) -> Result<()>,
) -> Result<()> {
    let mut req: *mut c_void = null_mut();
    let start = Instant::now();
    while req.is_null() {
        post(&mut req)?;
        if req.is_null() {
            wait(start, limit, stopped, what)?;
        }
    }
    let start = Instant::now();
    loop {
        let mut done: c_int = 0;
        let mut size: c_int = 0;
        // SAFETY: the request the plugin returned, tested until done
        // (then freed by the plugin).
        check("test", unsafe { abi.test(req, &mut done, &mut size) })?;
        if done != 0 {
            return Ok(());
        }
        wait(start, limit, stopped, "test")?;
    }
}

/// Between polls: the stop flag, the time limit, a short yield.
fn wait(
    start: Instant,
    limit: Duration,
    stopped: &dyn Fn() -> Option<Error>,
    what: &str,
) -> Result<()> {
    if let Some(e) = stopped() {
        return Err(e);
    }
    if start.elapsed() > limit {
        return Err(Error::Remote(format!(
            "collnet {what} made no progress in {limit:?} (NCCL_TIMEOUT): a member of the CollNet group is gone or stuck"
        )));
    }
    if start.elapsed() > Duration::from_micros(50) {
        std::thread::sleep(Duration::from_micros(20));
    } else {
        std::hint::spin_loop();
    }
    Ok(())
}

impl Drop for CollComm {
    fn drop(&mut self) {
        // SAFETY: the comms and context this value owns, used no more.
        unsafe {
            self.net.abi.close_coll(self.coll);
            if !self.listen.is_null() {
                self.net.abi.close_listen(self.listen);
            }
            if !self.ctx.is_null() {
                self.net.abi.finalize(self.ctx);
            }
        }
    }
}
