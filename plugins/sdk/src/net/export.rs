//! Exports a Rust [`Net`] through NCCL's C ABI. The glue is written once
//! here, against the newest version (`ncclNet_v12_t`), generic over a
//! [`Provider`]: null checks, panics caught at the boundary, errors turned
//! into `ncclResult_t` and a WARN line through NCCL's logger. The older
//! versions are that vtable converted by their own files
//! (`abi::vN::exported`). A plugin writes one line:
//! [`crate::export_net_plugin!`].
#![allow(unsafe_code)]

use std::ffi::CString;
use std::os::raw::{c_char, c_int, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};

use super::abi::v12::{self, PropertiesV12, VDevicePropsV12};
use super::abi::{DeviceHandle, Newest, INIT_AS, MAX_COLLNET_SIZE, NCCL_NET_ID_UNDEF};
use crate::ffi::*;
use crate::{
    DmaBuf, ListenComm, MrHandle, Net, NetError, NetProperties, NetResult, PtrType, RecvComm,
    Request, SendComm, NET_HANDLE_MAXSIZE,
};

/// Where an exported plugin gets its one network instance.
pub trait Provider: 'static {
    fn cell() -> &'static OnceLock<Result<Box<dyn Net>, NetError>>;
    fn make() -> NetResult<Box<dyn Net>>;
    /// The C name NCCL prints ("Socket" …), NUL-terminated.
    const NAME: &'static [u8];
    /// Whether the vtables carry `irecvConsumed`. NCCL calls it after every
    /// completed receive whenever it is non-NULL, so a network that has
    /// nothing to do there leaves it NULL and saves NCCL that call per step
    /// (`export_net_plugin!(name, make, irecv_consumed)` sets it).
    const IRECV_CONSUMED: bool = false;
}

fn net<P: Provider>() -> Result<&'static dyn Net, NetError> {
    match P::cell().get_or_init(P::make) {
        Ok(n) => Ok(n.as_ref()),
        Err(e) => Err(e.clone()),
    }
}

static LOGGER: AtomicUsize = AtomicUsize::new(0);

/// The profiler callback the last `init` was given (net v10 and later), or
/// 0: each `isend`/`irecv` hands it with its profiler handle to the
/// network. One for the process: NCCL (and oxccl) pass the same function
/// to every communicator's `init`.
static PROF_CB: AtomicUsize = AtomicUsize::new(0);

/// The profiler of one operation, when a callback was given at `init` and
/// the caller passed a handle with the operation.
fn net_prof(phandle: *mut c_void) -> Option<crate::NetProf> {
    if phandle.is_null() {
        return None;
    }
    let f = PROF_CB.load(Ordering::Acquire);
    if f == 0 {
        return None;
    }
    // SAFETY: PROF_CB only ever holds a non-null `ncclProfilerCallback_t`
    // given to init, stored as an integer.
    let cb: crate::ffi::types::ProfilerCallback = unsafe { std::mem::transmute(f) };
    // SAFETY: the callback as given; the handle the caller passed with this
    // operation, valid while its request is (the ABI's contract).
    unsafe { crate::NetProf::new(cb, phandle) }
}

/// Logs through NCCL's logger when one was given at `init`, else to stderr
/// in NCCL's line form ([`crate::logger::nccl_line`]).
pub fn log(level: c_int, msg: &str) {
    let f = LOGGER.load(Ordering::Acquire);
    if f == 0 {
        crate::logger::to_stderr(level, msg);
        return;
    }
    let Ok(text) = CString::new(msg.replace('\0', " ")) else {
        return;
    };
    // SAFETY: LOGGER only ever holds a non-null `ncclDebugLogger_t` given
    // to init; "%s" consumes exactly the one string argument passed.
    unsafe {
        let f: unsafe extern "C" fn(
            c_int,
            std::os::raw::c_ulong,
            *const c_char,
            c_int,
            *const c_char,
            ...
        ) = std::mem::transmute(f);
        f(
            level,
            NCCL_NET,
            c"oxccl-plugin".as_ptr(),
            0,
            c"%s".as_ptr(),
            text.as_ptr(),
        );
    }
}

fn code(e: &NetError) -> i32 {
    match e {
        NetError::InvalidArgument(_) => NCCL_INVALID_ARGUMENT,
        NetError::System(_) => NCCL_SYSTEM_ERROR,
        NetError::Remote(_) => NCCL_REMOTE_ERROR,
        NetError::InvalidUsage(_) => NCCL_INVALID_USAGE,
        _ => NCCL_INTERNAL_ERROR,
    }
}

/// Runs a glue body: a panic or an error becomes a result code and a WARN line.
fn guard(what: &str, f: impl FnOnce() -> NetResult<()>) -> i32 {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => NCCL_SUCCESS,
        Ok(Err(e)) => {
            log(NCCL_LOG_WARN, &format!("{what}: {e}"));
            code(&e)
        }
        Err(_) => {
            log(
                NCCL_LOG_WARN,
                &format!("{what}: panic inside the plugin (caught at the C boundary)"),
            );
            NCCL_INTERNAL_ERROR
        }
    }
}

fn nonnull<T>(p: *mut T, what: &str) -> NetResult<*mut T> {
    if p.is_null() {
        Err(NetError::InvalidArgument(format!("{what} is NULL")))
    } else {
        Ok(p)
    }
}

/// What a `void*` comm handed to NCCL points at.
enum Comm {
    Send(Box<dyn SendComm>),
    Recv(Box<dyn RecvComm>),
    Listen(Box<dyn ListenComm>),
}

fn out_comm(c: Comm) -> *mut c_void {
    Box::into_raw(Box::new(c)) as *mut c_void
}

/// # Safety
/// `p` was returned by `out_comm` and not closed.
unsafe fn comm<'a>(p: *mut c_void) -> NetResult<&'a mut Comm> {
    let p = nonnull(p as *mut Comm, "comm")?;
    // SAFETY: per the function contract.
    Ok(unsafe { &mut *p })
}

fn ptr_type(t: c_int) -> NetResult<PtrType> {
    match t {
        1 => Ok(PtrType::Host),
        2 => Ok(PtrType::Cuda),
        4 => Ok(PtrType::Dmabuf),
        _ => Err(NetError::InvalidArgument(format!(
            "memory type {t} is not a NCCL_PTR_* value"
        ))),
    }
}

/// Names of devices, kept alive for NCCL (it keeps the pointers).
static NAMES: Mutex<Vec<(usize, CString, CString)>> = Mutex::new(Vec::new());

/// The per-communicator context. One network instance (the provider's
/// cell, made on first use and kept for the process) serves every
/// communicator, so the context only has to be non-NULL: every `init`
/// returns this one and `finalize` releases nothing. Any number of
/// contexts can therefore be alive at once, and finalizing one leaves the
/// network usable through the others.
static CONTEXT: u8 = 0;

/// `init`: called once per communicator (v11 and later), or once for the
/// process through an older version's conversion, which sets [`INIT_AS`]
/// for the log line.
unsafe extern "C" fn init<P: Provider>(
    ctx: *mut *mut c_void,
    _comm_id: u64,
    _config: *mut v12::CommConfigV12,
    logger: Logger,
    prof: ProfilerCallback,
) -> i32 {
    if !ctx.is_null() {
        // SAFETY: non-null out-pointer from NCCL.
        unsafe { *ctx = &CONTEXT as *const u8 as *mut c_void };
    }
    let abi = match INIT_AS.swap(0, Ordering::Relaxed) {
        0 => 12,
        v => v,
    };
    if let Some(f) = logger {
        LOGGER.store(f as usize, Ordering::Release);
    }
    // Versions before v10 pass none: a callback an earlier init gave stays.
    if let Some(f) = prof {
        PROF_CB.store(f as usize, Ordering::Release);
    }
    guard("init", || {
        let n = net::<P>()?;
        log(
            NCCL_LOG_INFO,
            &format!(
                "oxccl net plugin {} (ncclNet_v{abi}) with {} device(s)",
                n.name(),
                n.devices()?
            ),
        );
        Ok(())
    })
}

unsafe extern "C" fn devices<P: Provider>(ndev: *mut c_int) -> i32 {
    guard("devices", || {
        let p = nonnull(ndev, "ndev")?;
        let n = net::<P>()?.devices()?;
        // SAFETY: checked non-null; NCCL passes a valid int.
        unsafe { *p = n as c_int };
        Ok(())
    })
}

/// The device's properties and C strings for its name and PCI path that
/// stay alive as long as the process (NCCL keeps the pointers).
fn properties<P: Provider>(dev: c_int) -> NetResult<(NetProperties, *mut c_char, *mut c_char)> {
    let p = net::<P>()?.properties(dev as usize)?;
    let mut names = NAMES
        .lock()
        .map_err(|_| NetError::Internal("names poisoned".into()))?;
    if !names.iter().any(|(d, _, _)| *d == dev as usize) {
        let c = |s: &str| CString::new(s.replace('\0', "")).unwrap_or_default();
        names.push((dev as usize, c(&p.name), c(&p.pci_path)));
    }
    let (_, name, pci) = names
        .iter()
        .find(|(d, _, _)| *d == dev as usize)
        .expect("inserted above");
    let pci = if p.pci_path.is_empty() {
        std::ptr::null_mut()
    } else {
        pci.as_ptr() as *mut c_char
    };
    Ok((p, name.as_ptr() as *mut c_char, pci))
}

unsafe extern "C" fn get_properties<P: Provider>(dev: c_int, props: *mut PropertiesV12) -> i32 {
    guard("getProperties", || {
        let out = nonnull(props, "props")?;
        let (p, name, pci_path) = properties::<P>(dev)?;
        let mut devs = [0; v12::MAX_DEVS_PER_NIC_V12];
        devs[0] = dev;
        let v = PropertiesV12 {
            name,
            pci_path,
            guid: p.guid,
            ptr_support: p.ptr_support,
            reg_is_global: p.reg_is_global as c_int,
            force_flush: 0,
            speed: p.speed_mbps,
            port: p.port,
            latency: p.latency_us,
            max_comms: p.max_comms,
            max_recvs: p.max_recvs,
            net_device_type: 0,
            net_device_version: 0,
            // Not a virtual device: the one physical device it is.
            vprops: VDevicePropsV12 { ndevs: 1, devs },
            max_p2p_bytes: p
                .max_p2p_bytes
                .clamp(1, super::abi::NCCL_MAX_NET_SIZE_BYTES),
            max_coll_bytes: MAX_COLLNET_SIZE,
            max_multi_request_size: 1,
            rail_id: NCCL_NET_ID_UNDEF,
            plane_id: NCCL_NET_ID_UNDEF,
        };
        // SAFETY: checked non-null; NCCL passes its properties struct.
        unsafe { out.write(v) };
        Ok(())
    })
}

unsafe extern "C" fn listen<P: Provider>(
    _ctx: *mut c_void,
    dev: c_int,
    handle: *mut c_void,
    listen_comm: *mut *mut c_void,
) -> i32 {
    guard("listen", || {
        let (h, lc) = (
            nonnull(handle, "handle")?,
            nonnull(listen_comm, "listenComm")?,
        );
        let (bytes, l) = net::<P>()?.listen(dev as usize)?;
        // SAFETY: NCCL gives NCCL_NET_HANDLE_MAXSIZE writable bytes and a valid out-pointer.
        unsafe {
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), h as *mut u8, NET_HANDLE_MAXSIZE);
            *lc = out_comm(Comm::Listen(l));
        }
        Ok(())
    })
}

unsafe extern "C" fn connect<P: Provider>(
    _ctx: *mut c_void,
    dev: c_int,
    handle: *mut c_void,
    send_comm: *mut *mut c_void,
    _dev_comm: *mut *mut DeviceHandle,
) -> i32 {
    guard("connect", || {
        let (h, sc) = (
            nonnull(handle as *mut [u8; NET_HANDLE_MAXSIZE], "handle")?,
            nonnull(send_comm, "sendComm")?,
        );
        // SAFETY: the handle is NCCL's 128-byte buffer, which the plugin may use for its state.
        let r = net::<P>()?.connect(dev as usize, unsafe { &mut *h })?;
        // SAFETY: valid out-pointer from NCCL.
        unsafe { *sc = r.map_or(std::ptr::null_mut(), |c| out_comm(Comm::Send(c))) };
        Ok(())
    })
}

unsafe extern "C" fn accept(
    listen_comm: *mut c_void,
    recv_comm: *mut *mut c_void,
    _dev: *mut *mut DeviceHandle,
) -> i32 {
    guard("accept", || {
        let rc = nonnull(recv_comm, "recvComm")?;
        // SAFETY: NCCL passes back the listen comm we returned.
        let Comm::Listen(l) = (unsafe { comm(listen_comm) })? else {
            return Err(NetError::InvalidArgument(
                "accept on a comm that is not a listening one".into(),
            ));
        };
        let r = l.accept()?;
        // SAFETY: valid out-pointer from NCCL.
        unsafe { *rc = r.map_or(std::ptr::null_mut(), |c| out_comm(Comm::Recv(c))) };
        Ok(())
    })
}

unsafe extern "C" fn reg_mr(
    c: *mut c_void,
    data: *mut c_void,
    size: usize,
    ty: c_int,
    mh: *mut *mut c_void,
) -> i32 {
    guard("regMr", || {
        let out = nonnull(mh, "mhandle")?;
        let t = ptr_type(ty)?;
        // SAFETY: NCCL passes a comm we returned.
        let m = match unsafe { comm(c) }? {
            Comm::Send(s) => s.reg_mr(data as *mut u8, size, t)?,
            Comm::Recv(r) => r.reg_mr(data as *mut u8, size, t)?,
            Comm::Listen(_) => {
                return Err(NetError::InvalidArgument(
                    "regMr on a listening comm".into(),
                ))
            }
        };
        // SAFETY: valid out-pointer from NCCL.
        unsafe { *out = m.0 as *mut c_void };
        Ok(())
    })
}

/// `regMrDmaBuf`, the same in every version: the buffer, its memory type
/// and the dma-buf (`fd`, `offset`) the GPU driver exported it as.
unsafe extern "C" fn reg_mr_dma_buf(
    c: *mut c_void,
    data: *mut c_void,
    size: usize,
    ty: c_int,
    offset: u64,
    fd: c_int,
    mh: *mut *mut c_void,
) -> i32 {
    guard("regMrDmaBuf", || {
        let out = nonnull(mh, "mhandle")?;
        let t = ptr_type(ty)?;
        let d = DmaBuf { fd, offset };
        // SAFETY: NCCL passes a comm we returned.
        let m = match unsafe { comm(c) }? {
            Comm::Send(s) => s.reg_mr_dma_buf(data as *mut u8, size, t, d)?,
            Comm::Recv(r) => r.reg_mr_dma_buf(data as *mut u8, size, t, d)?,
            Comm::Listen(_) => {
                return Err(NetError::InvalidArgument(
                    "regMrDmaBuf on a listening comm".into(),
                ))
            }
        };
        // SAFETY: valid out-pointer from NCCL.
        unsafe { *out = m.0 as *mut c_void };
        Ok(())
    })
}

unsafe extern "C" fn dereg_mr(c: *mut c_void, mh: *mut c_void) -> i32 {
    guard("deregMr", || {
        let m = MrHandle(mh as usize);
        // SAFETY: NCCL passes a comm we returned.
        match unsafe { comm(c) }? {
            Comm::Send(s) => s.dereg_mr(m),
            Comm::Recv(r) => r.dereg_mr(m),
            Comm::Listen(_) => Err(NetError::InvalidArgument(
                "deregMr on a listening comm".into(),
            )),
        }
    })
}

/// What a request pointer handed to NCCL points at: a thin box around the
/// network's request (a `dyn` pointer is two words), emptied when `test`
/// reports it finished.
type RequestSlot = Option<Box<dyn Request>>;

/// Emptied slots kept for the next requests of this thread (NCCL posts and
/// tests on its proxy thread), so that a request costs one allocation, the
/// network's, instead of two. Bounded: a burst beyond it is freed.
const SPARE_SLOTS: usize = 64;

thread_local! {
    // The boxes are the point: each is a slot's allocation, kept to be
    // handed out again, not a way to hold the value.
    #[allow(clippy::vec_box)]
    static SPARE: std::cell::RefCell<Vec<Box<RequestSlot>>> =
        const { std::cell::RefCell::new(Vec::new()) };
}

fn out_request(r: Option<Box<dyn Request>>) -> *mut c_void {
    let Some(r) = r else {
        return std::ptr::null_mut();
    };
    let spare = SPARE
        .try_with(|s| s.try_borrow_mut().ok().and_then(|mut s| s.pop()))
        .ok()
        .flatten();
    let slot = match spare {
        Some(mut b) => {
            *b = Some(r);
            b
        }
        None => Box::new(Some(r)),
    };
    Box::into_raw(slot) as *mut c_void
}

/// Keeps an emptied slot for a later request, or frees it.
fn recycle(slot: Box<RequestSlot>) {
    let mut slot = Some(slot);
    let _ = SPARE.try_with(|s| {
        if let Ok(mut s) = s.try_borrow_mut() {
            if s.len() < SPARE_SLOTS {
                s.extend(slot.take());
            }
        }
    });
}

fn mr(p: *mut c_void) -> Option<MrHandle> {
    (!p.is_null()).then_some(MrHandle(p as usize))
}

/// `isend`; the profiler handle reaches the network with the callback
/// `init` was given ([`SendComm::isend_profiled`]).
unsafe extern "C" fn isend(
    c: *mut c_void,
    data: *mut c_void,
    size: usize,
    tag: c_int,
    mh: *mut c_void,
    phandle: *mut c_void,
    request: *mut *mut c_void,
) -> i32 {
    // SAFETY: forwarded unchanged.
    unsafe { isend_any(c, data, size, tag, mh, net_prof(phandle), request) }
}

/// # Safety
/// The ABI's contract for `isend`: `c` a send comm we returned, `data`
/// valid until the request completes, `request` a valid out-pointer.
unsafe fn isend_any(
    c: *mut c_void,
    data: *mut c_void,
    size: usize,
    tag: c_int,
    mh: *mut c_void,
    prof: Option<crate::NetProf>,
    request: *mut *mut c_void,
) -> i32 {
    guard("isend", || {
        let out = nonnull(request, "request")?;
        // SAFETY: NCCL passes a send comm we returned.
        let Comm::Send(s) = (unsafe { comm(c) })? else {
            return Err(NetError::InvalidArgument(
                "isend on a comm that is not a send comm".into(),
            ));
        };
        // SAFETY: NCCL keeps `data` valid until the request completes (the ABI's contract).
        let r = unsafe { s.isend_profiled(data as *const u8, size, tag, mr(mh), prof) }?;
        // SAFETY: valid out-pointer from NCCL.
        unsafe { *out = out_request(r) };
        Ok(())
    })
}

/// `irecv`; the profiler handle of its one buffer reaches the network as
/// `isend`'s does.
#[allow(
    clippy::too_many_arguments,
    reason = "the C signature of ncclNet_v12_t's irecv"
)]
unsafe extern "C" fn irecv(
    c: *mut c_void,
    n: c_int,
    data: *mut *mut c_void,
    sizes: *mut usize,
    tags: *mut c_int,
    mhs: *mut *mut c_void,
    phandles: *mut *mut c_void,
    request: *mut *mut c_void,
) -> i32 {
    // NCCL passes one handle per buffer (NULL array before v10's callers
    // had them); `irecv_any` refuses anything but one buffer.
    let ph = if phandles.is_null() || n != 1 {
        std::ptr::null_mut()
    } else {
        // SAFETY: an array of n = 1 entries from the caller.
        unsafe { *phandles }
    };
    // SAFETY: forwarded unchanged.
    unsafe { irecv_any(c, n, data, sizes, tags, mhs, net_prof(ph), request) }
}

/// # Safety
/// The ABI's contract for `irecv`: `c` a receive comm we returned, arrays of
/// `n` entries, buffers valid until the request completes.
#[allow(
    clippy::too_many_arguments,
    reason = "the C signature, and the profiler"
)]
unsafe fn irecv_any(
    c: *mut c_void,
    n: c_int,
    data: *mut *mut c_void,
    sizes: *mut usize,
    tags: *mut c_int,
    mhs: *mut *mut c_void,
    prof: Option<crate::NetProf>,
    request: *mut *mut c_void,
) -> i32 {
    guard("irecv", || {
        let out = nonnull(request, "request")?;
        if n != 1 {
            return Err(NetError::InvalidArgument(format!(
                "irecv of {n} buffers: this network reports maxRecvs 1"
            )));
        }
        let (d, s, t) = (
            nonnull(data, "data")?,
            nonnull(sizes, "sizes")?,
            nonnull(tags, "tags")?,
        );
        // SAFETY: NCCL passes a recv comm we returned and arrays of n = 1 entries.
        let (Comm::Recv(r), buf, size, tag, m) = (
            unsafe { comm(c) }?,
            unsafe { *d },
            unsafe { *s },
            unsafe { *t },
            unsafe {
                if mhs.is_null() {
                    std::ptr::null_mut()
                } else {
                    *mhs
                }
            },
        ) else {
            return Err(NetError::InvalidArgument(
                "irecv on a comm that is not a receive comm".into(),
            ));
        };
        // SAFETY: NCCL keeps the buffer valid until the request completes.
        let req = unsafe { r.irecv_profiled(buf as *mut u8, size, tag, mr(m), prof) }?;
        // SAFETY: valid out-pointer from NCCL.
        unsafe { *out = out_request(req) };
        Ok(())
    })
}

/// `iflush`, the same in every version. NCCL calls it with the buffers of
/// one completed `irecv`; a NULL request back means "nothing to wait for".
unsafe extern "C" fn iflush(
    c: *mut c_void,
    n: c_int,
    data: *mut *mut c_void,
    sizes: *mut c_int,
    mhs: *mut *mut c_void,
    request: *mut *mut c_void,
) -> i32 {
    guard("iflush", || {
        let out = nonnull(request, "request")?;
        // SAFETY: valid out-pointer from NCCL; cleared first so that no
        // failure below leaves NCCL a stale request to test.
        unsafe { *out = std::ptr::null_mut() };
        if n != 1 {
            return Err(NetError::InvalidArgument(format!(
                "iflush of {n} buffers: this network reports maxRecvs 1"
            )));
        }
        let (d, s) = (nonnull(data, "data")?, nonnull(sizes, "sizes")?);
        // SAFETY: NCCL passes arrays of n = 1 entries (`mhandles` may be NULL).
        let (buf, size, m) = unsafe {
            (
                *d,
                *s,
                if mhs.is_null() {
                    std::ptr::null_mut()
                } else {
                    *mhs
                },
            )
        };
        let size = usize::try_from(size).map_err(|_| {
            NetError::InvalidArgument(format!("iflush of a negative size ({size})"))
        })?;
        // SAFETY: NCCL passes a comm we returned.
        let Comm::Recv(r) = (unsafe { comm(c) })? else {
            return Err(NetError::InvalidArgument(
                "iflush on a comm that is not a receive comm".into(),
            ));
        };
        let req = r.iflush(buf as *mut u8, size, mr(m))?;
        // SAFETY: valid out-pointer from NCCL.
        unsafe { *out = out_request(req) };
        Ok(())
    })
}

/// `getDeviceMr`: NCCL calls it only for networks that asked for device
/// offload; the trait's default refuses.
unsafe extern "C" fn get_device_mr(
    c: *mut c_void,
    mh: *mut c_void,
    dptr_mhandle: *mut *mut c_void,
) -> i32 {
    guard("getDeviceMr", || {
        let out = nonnull(dptr_mhandle, "dptr_mhandle")?;
        let m = mr(mh).ok_or_else(|| NetError::InvalidArgument("mhandle is NULL".into()))?;
        // SAFETY: NCCL passes a comm we returned.
        let d = match unsafe { comm(c) }? {
            Comm::Send(s) => s.get_device_mr(m)?,
            Comm::Recv(r) => r.get_device_mr(m)?,
            Comm::Listen(_) => {
                return Err(NetError::InvalidArgument(
                    "getDeviceMr on a listening comm".into(),
                ))
            }
        };
        // SAFETY: valid out-pointer from NCCL.
        unsafe { *out = d.0 as *mut c_void };
        Ok(())
    })
}

/// `irecvConsumed`. NCCL calls it after every completed receive when the
/// entry is non-NULL, passing back the request that `test` already freed
/// when it reported the request done: the pointer is never read.
unsafe extern "C" fn irecv_consumed(c: *mut c_void, n: c_int, _request: *mut c_void) -> i32 {
    guard("irecvConsumed", || {
        let n = usize::try_from(n)
            .map_err(|_| NetError::InvalidArgument(format!("irecvConsumed of {n} receives")))?;
        // SAFETY: NCCL passes a comm we returned.
        let Comm::Recv(r) = (unsafe { comm(c) })? else {
            return Err(NetError::InvalidArgument(
                "irecvConsumed on a comm that is not a receive comm".into(),
            ));
        };
        r.irecv_consumed(n)
    })
}

unsafe extern "C" fn test(request: *mut c_void, done: *mut c_int, sizes: *mut c_int) -> i32 {
    guard("test", || {
        let p = nonnull(request as *mut RequestSlot, "request")?;
        let d = nonnull(done, "done")?;
        // SAFETY: NCCL passes a request we returned and have not freed.
        let Some(req) = (unsafe { &mut *p }) else {
            // Only a caller that tests a finished request sees an empty
            // slot (while it is spare): nothing to free.
            return Err(NetError::Internal("request tested after completion".into()));
        };
        let r = req.test_first();
        let finished = !matches!(r, Ok(None));
        if finished {
            // SAFETY: a finished (or failed) request is freed exactly once, here.
            let mut slot = unsafe { Box::from_raw(p) };
            drop(slot.take());
            recycle(slot);
        }
        let got = r?;
        // SAFETY: valid out-pointers from NCCL (`sizes` may be NULL).
        unsafe {
            *d = got.is_some() as c_int;
            if let (Some(v), false) = (got, sizes.is_null()) {
                *sizes = v.unwrap_or(0) as c_int;
            }
        }
        Ok(())
    })
}

/// Frees a comm we returned.
unsafe fn close(c: *mut c_void) -> NetResult<()> {
    let p = nonnull(c as *mut Comm, "comm")?;
    // SAFETY: NCCL closes each comm once.
    drop(unsafe { Box::from_raw(p) });
    Ok(())
}

unsafe extern "C" fn close_comm(c: *mut c_void) -> i32 {
    // SAFETY: NCCL passes a comm we returned, once.
    guard("close", || unsafe { close(c) })
}

/// Nothing to release: see [`CONTEXT`]. The network outlives every context
/// on purpose, since NCCL finalizes one communicator's while others run.
unsafe extern "C" fn finalize(_ctx: *mut c_void) -> i32 {
    NCCL_SUCCESS
}

/// Attributes are hints (NCCL: "the plugin may ignore them").
unsafe extern "C" fn set_net_attr(_ctx: *mut c_void, _a: *mut v12::NetAttrV12) -> i32 {
    NCCL_SUCCESS
}

/// The `ncclNet_v12_t` of a provider. `makeVDevice` is left NULL (NCCL
/// checks it): the glue offers no NIC fusion. `getDeviceMr` and
/// `irecvConsumed` reach the trait, whose defaults suit a host-only network.
pub const fn vtable<P: Provider>() -> v12::NetV12 {
    v12::NetV12 {
        name: P::NAME.as_ptr() as *const c_char,
        init: Some(init::<P>),
        devices: Some(devices::<P>),
        get_properties: Some(get_properties::<P>),
        listen: Some(listen::<P>),
        connect: Some(connect::<P>),
        accept: Some(accept),
        reg_mr: Some(reg_mr),
        reg_mr_dma_buf: Some(reg_mr_dma_buf),
        dereg_mr: Some(dereg_mr),
        isend: Some(isend),
        irecv: Some(irecv),
        iflush: Some(iflush),
        test: Some(test),
        close_send: Some(close_comm),
        close_recv: Some(close_comm),
        close_listen: Some(close_comm),
        get_device_mr: Some(get_device_mr),
        irecv_consumed: if P::IRECV_CONSUMED {
            Some(irecv_consumed)
        } else {
            None
        },
        make_vdevice: None,
        finalize: Some(finalize),
        set_net_attr: Some(set_net_attr),
    }
}

/// Every provider's vtable is offered under the older versions too.
impl<P: Provider> Newest for P {
    const VT: v12::NetV12 = vtable::<P>();
    /// One cell for every provider: they all keep the same context,
    /// `CONTEXT`, so sharing it changes nothing.
    fn context() -> &'static std::sync::atomic::AtomicPtr<c_void> {
        static CTX: std::sync::atomic::AtomicPtr<c_void> =
            std::sync::atomic::AtomicPtr::new(std::ptr::null_mut());
        &CTX
    }
}

/// A vtable in a `static`: it holds pointers only to static data and functions.
#[repr(transparent)]
pub struct Exported<T>(pub T);

// SAFETY: the wrapped vtables point at 'static strings and functions only.
unsafe impl<T> Sync for Exported<T> {}

/// Exports the versions [`crate::net_versions!`] marks for export
/// (`ncclNetPlugin_v8` to `ncclNetPlugin_v12`; no collnet symbol:
/// loaders then run without collnet) for a network made by `$make` (a
/// `fn() -> NetResult<Box<dyn Net>>`), named `$name` in NCCL's logs. A
/// third argument `irecv_consumed` exports that entry (see
/// [`Provider::IRECV_CONSUMED`]).
#[macro_export]
macro_rules! export_net_plugin {
    ($name:literal, $make:path $(, $consumed:ident)?) => {
        #[doc(hidden)]
        pub struct __OxcclNetProvider;
        impl $crate::net::export::Provider for __OxcclNetProvider {
            fn cell(
            ) -> &'static ::std::sync::OnceLock<Result<Box<dyn $crate::Net>, $crate::NetError>>
            {
                static CELL: ::std::sync::OnceLock<Result<Box<dyn $crate::Net>, $crate::NetError>> =
                    ::std::sync::OnceLock::new();
                &CELL
            }
            fn make() -> $crate::NetResult<Box<dyn $crate::Net>> {
                $make()
            }
            const NAME: &'static [u8] = concat!($name, "\0").as_bytes();
            $(const IRECV_CONSUMED: bool = {
                let _ = stringify!($consumed);
                true
            };)?
        }
        $crate::net_versions!(($crate::export_net_plugin) @statics);
    };
    (@statics $([$n:literal, $sym:ident, $coll:ident, $m:ident, $ty:ident, $cty:ident,
        $export:ident, $nccl:literal])*) => {
        $($crate::export_net_plugin!(@one $n, $sym, $m, $ty, $export, $nccl);)*
        /// The exported vtables by symbol name, as `dlsym` would find them:
        /// lets a loader take a built-in network through the same C ABI as
        /// a library (see [`BuiltinNet::abi`]).
        #[doc(hidden)]
        pub fn __oxccl_net_symbol(name: &str) -> Option<*const ::std::ffi::c_void> {
            $($crate::export_net_plugin!(@lookup name, $sym, $export);)*
            None
        }
    };
    (@one $n:literal, $sym:ident, $m:ident, $ty:ident, newest, $nccl:literal) => {
        $crate::export_net_plugin!(@static $n, $sym, $m, $ty, $nccl,
            $crate::net::export::vtable::<__OxcclNetProvider>());
    };
    (@one $n:literal, $sym:ident, $m:ident, $ty:ident, older, $nccl:literal) => {
        $crate::export_net_plugin!(@static $n, $sym, $m, $ty, $nccl,
            $crate::net::abi::$m::exported::<__OxcclNetProvider>());
    };
    (@one $n:literal, $sym:ident, $m:ident, $ty:ident, load, $nccl:literal) => {};
    (@static $n:literal, $sym:ident, $m:ident, $ty:ident, $nccl:literal, $vt:expr) => {
        #[doc = concat!("NCCL's net plugin symbol, version ", $n, " (loaded by ", $nccl, ").")]
        #[no_mangle]
        #[allow(non_upper_case_globals)]
        pub static $sym: $crate::net::export::Exported<$crate::net::abi::$m::$ty> =
            $crate::net::export::Exported($vt);
    };
    (@lookup $name:ident, $sym:ident, load) => {};
    (@lookup $name:ident, $sym:ident, $export:ident) => {
        if $name == stringify!($sym) {
            return Some(::std::ptr::addr_of!($sym).cast());
        }
    };
}

#[cfg(test)]
#[path = "export_tests.rs"]
mod tests;
