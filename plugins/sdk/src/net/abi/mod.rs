//! NCCL's network plugin ABI, `ncclNet_vN_t`, one frozen file per version as
//! NCCL keeps `net_v8.h` … `net_v12.h`, in one shape:
//!
//! - [`v12`], the newest, declares every struct and documents every entry's
//!   contract; nothing but it is the "current" ABI.
//! - Each older `vN` holds only its frozen `#[repr(C)]` types and the
//!   conversion to and from the newest: `impl` [`Abi`] (a library's `vN`
//!   vtable called in v12's shape, filling what the version lacks as NCCL's
//!   `net_vN.cc` do) and `exported::<N>()` (a v12 vtable [`Newest`] offered
//!   as a `vN` one, for NCCLs that load that version).
//! - Loading ([`crate::net::load`]) and exporting ([`crate::net::export`]) are written
//!   once, against v12.
//!
//! A library exports a vtable under [`v10::SYMBOL`] (`ncclNetPlugin_v10`) and
//! so on; a loader looks up the newest symbol it knows and steps down
//! ([`LOADABLE`]). NCCL 2.28 loads v6 to v11, NCCL 2.30 adds v12.
//!
//! The contract common to every version:
//! - every call returns at once: "not yet" is success with a NULL out-pointer
//!   (`connect`, `accept`, `isend`, `irecv`) and NCCL calls again;
//! - connections are one-way: `listen` on the receiver gives a handle of up
//!   to [`NCCL_NET_HANDLE_MAXSIZE`] bytes that NCCL carries to the sender,
//!   which `connect`s with it; the receiver then `accept`s;
//! - sends and receives on one connection match in the order they were
//!   posted; tags only pick a buffer within one multi-receive;
//! - each send or receive comm holds up to [`NCCL_NET_MAX_REQUESTS`] requests
//!   in flight (times `max_recvs` on the send side).

use std::os::raw::{c_char, c_int, c_void};
use std::sync::atomic::{AtomicPtr, AtomicU32, Ordering};

use crate::ffi::types::{Logger, NcclResult, ProfilerCallback, NCCL_INTERNAL_ERROR};

pub mod collnet;
pub mod v10;
pub mod v11;
pub mod v12;
pub mod v6;
pub mod v7;
pub mod v8;
pub mod v9;

/// `NCCL_NET_HANDLE_MAXSIZE`: bytes NCCL reserves for the handle `listen`
/// writes and the peer's `connect` reads.
pub const NCCL_NET_HANDLE_MAXSIZE: usize = 128;

/// `ptrSupport` bit and `type` of `regMr`: host memory.
pub const NCCL_PTR_HOST: c_int = 0x1;
/// `ptrSupport` bit and `type` of `regMr`: GPU memory (GPUDirect RDMA).
pub const NCCL_PTR_CUDA: c_int = 0x2;
/// `ptrSupport` bit: GPU memory registered through a dma-buf fd
/// (`regMrDmaBuf`).
pub const NCCL_PTR_DMABUF: c_int = 0x4;

/// `NCCL_NET_MAX_REQUESTS`: requests one comm must hold in flight.
pub const NCCL_NET_MAX_REQUESTS: usize = 32;

/// Value NCCL may put in `*request` before `irecv` (LL and LL128 protocols):
/// NCCL detects completion from flags in the data itself, so the plugin may
/// complete such a request early. It must still return a real request.
pub const NCCL_NET_OPTIONAL_RECV_COMPLETION: usize = 0x1;
/// `NCCL_NET_MULTI_REQUEST`: a request flag defined next to
/// [`NCCL_NET_OPTIONAL_RECV_COMPLETION`]; NCCL's core (2.28 to 2.30) does
/// not pass it yet. Kept so that the value is never reused.
pub const NCCL_NET_MULTI_REQUEST: usize = 0x2;

/// `NCCL_NET_ID_UNDEF`: `railId`/`planeId` (net v12) when unknown.
pub const NCCL_NET_ID_UNDEF: i16 = -1;
/// `NCCL_NET_TRAFFIC_CLASS_UNDEF`: `trafficClass` left to the plugin.
pub const NCCL_NET_TRAFFIC_CLASS_UNDEF: c_int = -1;
/// `NCCL_NET_ATTR_UNDEF`: a net attribute (v11 and later) NCCL leaves unset.
pub const NCCL_NET_ATTR_UNDEF: i32 = -1;

/// `MAX_NET_SIZE`: the transfer limit NCCL assumes for plugins before v9
/// (which have no `maxP2pBytes`): 1 GiB, a power of two below `INT_MAX`.
pub const MAX_NET_SIZE: usize = 1024 * 1024 * 1024;
/// `MAX_COLLNET_SIZE`: the same for collnet plugins before v9 (512 MiB).
pub const MAX_COLLNET_SIZE: usize = 512 * 1024 * 1024;
/// `NCCL_MAX_NET_SIZE_BYTES`: the largest `maxP2pBytes`/`maxCollBytes` NCCL
/// accepts (1 TiB).
pub const NCCL_MAX_NET_SIZE_BYTES: usize = 1 << 40;

/// `ncclNetDeviceType`: what device-side (GPU-initiated) networking a NIC
/// offers. A host-only plugin reports [`NCCL_NET_DEVICE_HOST`].
pub type NetDeviceType = c_int;
/// Host-driven networking only (no offload).
pub const NCCL_NET_DEVICE_HOST: NetDeviceType = 0;
/// GPU kernels unpack received data (the TCPX/devmem-style offload).
pub const NCCL_NET_DEVICE_UNPACK: NetDeviceType = 1;
/// GPU-initiated networking through a proxy (NCCL 2.28 and later).
pub const NCCL_NET_DEVICE_GIN_PROXY: NetDeviceType = 2;
/// GPU-initiated networking, GDAKI backend.
pub const NCCL_NET_DEVICE_GIN_GDAKI: NetDeviceType = 3;
/// GPU-initiated networking, GPI backend (NCCL 2.30).
pub const NCCL_NET_DEVICE_GIN_GPI: NetDeviceType = 4;

/// `netDeviceVersion` meaning "no device offload".
pub const NCCL_NET_DEVICE_INVALID_VERSION: c_int = 0x0;
/// The unpack offload version NCCL's device code implements; a plugin
/// reporting [`NCCL_NET_DEVICE_UNPACK`] must report exactly this.
pub const NCCL_NET_DEVICE_UNPACK_VERSION: c_int = 0x7;

/// `ncclNetDeviceHandle_v7_t`, unchanged since v7 (NCCL's `_v8_t` …
/// `_v12_t` are typedefs of it; each version file aliases it under its
/// own name). Describes a connection's device-side half when NCCL asked
/// `connect`/`accept` for offload.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct DeviceHandle {
    /// Kind of offload ([`NCCL_NET_DEVICE_HOST`] …).
    pub net_device_type: NetDeviceType,
    /// Must equal the version NCCL's device code was built with.
    pub net_device_version: c_int,
    /// Device-side state of the connection, `size` bytes, copied to the GPU.
    pub handle: *mut c_void,
    pub size: usize,
    /// Non-zero when the proxy thread must still call `test` to progress
    /// transfers of this connection.
    pub needs_proxy_progress: c_int,
}

/// A result for an entry that is NULL where the caller expected one (the
/// loader refuses such vtables, so this is never reached through it).
pub(crate) const NULL_ENTRY: NcclResult = NCCL_INTERNAL_ERROR;

/// Calls an optional C entry, [`NULL_ENTRY`] when it is NULL.
macro_rules! call {
    ($f:expr, $($arg:expr),* $(,)?) => {
        match $f {
            // SAFETY: the caller's contract is the entry's (see `Abi`).
            Some(f) => unsafe { f($($arg),*) },
            None => $crate::net::abi::NULL_ENTRY,
        }
    };
}
pub(crate) use call;

/// C types of entries that are the same in every version since v8 (v6 and
/// v7 differ in `accept` and `regMr`, which [`Abi`] converts).
pub type DevicesFn = unsafe extern "C" fn(ndev: *mut c_int) -> NcclResult;
pub type AcceptFn = unsafe extern "C" fn(
    listen_comm: *mut c_void,
    recv_comm: *mut *mut c_void,
    recv_dev_comm: *mut *mut DeviceHandle,
) -> NcclResult;
pub type RegMrFn = unsafe extern "C" fn(
    comm: *mut c_void,
    data: *mut c_void,
    size: usize,
    ty: c_int,
    mhandle: *mut *mut c_void,
) -> NcclResult;
pub type RegMrDmaBufFn = unsafe extern "C" fn(
    comm: *mut c_void,
    data: *mut c_void,
    size: usize,
    ty: c_int,
    offset: u64,
    fd: c_int,
    mhandle: *mut *mut c_void,
) -> NcclResult;
pub type DeregMrFn = unsafe extern "C" fn(comm: *mut c_void, mhandle: *mut c_void) -> NcclResult;
pub type IflushFn = unsafe extern "C" fn(
    recv_comm: *mut c_void,
    n: c_int,
    data: *mut *mut c_void,
    sizes: *mut c_int,
    mhandles: *mut *mut c_void,
    request: *mut *mut c_void,
) -> NcclResult;
pub type TestFn =
    unsafe extern "C" fn(request: *mut c_void, done: *mut c_int, sizes: *mut c_int) -> NcclResult;
pub type CloseFn = unsafe extern "C" fn(comm: *mut c_void) -> NcclResult;
pub type GetDeviceMrFn = unsafe extern "C" fn(
    comm: *mut c_void,
    mhandle: *mut c_void,
    dptr_mhandle: *mut *mut c_void,
) -> NcclResult;
pub type IrecvConsumedFn =
    unsafe extern "C" fn(recv_comm: *mut c_void, n: c_int, request: *mut c_void) -> NcclResult;
/// `init` of v11 and v12 (a context per communicator).
pub type InitFn = unsafe extern "C" fn(
    ctx: *mut *mut c_void,
    comm_id: u64,
    config: *mut v12::CommConfigV12,
    log_function: Logger,
    prof_function: ProfilerCallback,
) -> NcclResult;
/// `listen` of v11 and v12.
pub type ListenFn = unsafe extern "C" fn(
    ctx: *mut c_void,
    dev: c_int,
    handle: *mut c_void,
    listen_comm: *mut *mut c_void,
) -> NcclResult;
/// `connect` of v11 and v12.
pub type ConnectFn = unsafe extern "C" fn(
    ctx: *mut c_void,
    dev: c_int,
    handle: *mut c_void,
    send_comm: *mut *mut c_void,
    send_dev_comm: *mut *mut DeviceHandle,
) -> NcclResult;
/// `isend` of v10 to v12 (`size_t` size, profiler handle).
pub type IsendFn = unsafe extern "C" fn(
    send_comm: *mut c_void,
    data: *mut c_void,
    size: usize,
    tag: c_int,
    mhandle: *mut c_void,
    phandle: *mut c_void,
    request: *mut *mut c_void,
) -> NcclResult;
/// `irecv` of v10 to v12 (`size_t` sizes, profiler handles).
pub type IrecvFn = unsafe extern "C" fn(
    recv_comm: *mut c_void,
    n: c_int,
    data: *mut *mut c_void,
    sizes: *mut usize,
    tags: *mut c_int,
    mhandles: *mut *mut c_void,
    phandles: *mut *mut c_void,
    request: *mut *mut c_void,
) -> NcclResult;
/// `listen` before v11 (no context).
pub type ListenNoCtxFn = unsafe extern "C" fn(
    dev: c_int,
    handle: *mut c_void,
    listen_comm: *mut *mut c_void,
) -> NcclResult;
/// `connect` of v7 to v9 (neither context nor config).
pub type ConnectNoCtxFn = unsafe extern "C" fn(
    dev: c_int,
    handle: *mut c_void,
    send_comm: *mut *mut c_void,
    send_dev_comm: *mut *mut DeviceHandle,
) -> NcclResult;
/// `init` before v10 (the logger only).
pub type InitLogFn = unsafe extern "C" fn(log_function: Logger) -> NcclResult;

/// The entries of a vtable whose C type is the newest's, copied out once by
/// a loader. `None` for one the version lacks.
#[derive(Clone, Copy)]
pub struct Same {
    pub devices: Option<DevicesFn>,
    pub reg_mr_dma_buf: Option<RegMrDmaBufFn>,
    pub dereg_mr: Option<DeregMrFn>,
    pub iflush: Option<IflushFn>,
    pub test: Option<TestFn>,
    pub close_send: Option<CloseFn>,
    pub close_recv: Option<CloseFn>,
    pub close_listen: Option<CloseFn>,
    pub get_device_mr: Option<GetDeviceMrFn>,
    pub irecv_consumed: Option<IrecvConsumedFn>,
}

/// [`Same`] of a vtable that has every one of its fields.
macro_rules! same {
    ($v:expr) => {
        $crate::net::abi::Same {
            devices: $v.devices,
            reg_mr_dma_buf: $v.reg_mr_dma_buf,
            dereg_mr: $v.dereg_mr,
            iflush: $v.iflush,
            test: $v.test,
            close_send: $v.close_send,
            close_recv: $v.close_recv,
            close_listen: $v.close_listen,
            get_device_mr: $v.get_device_mr,
            irecv_consumed: $v.irecv_consumed,
        }
    };
}
pub(crate) use same;

/// The entries NCCL calls without a NULL check, by their C names, that are
/// NULL in `$v` (every version names them alike).
macro_rules! null_entries {
    ($v:expr) => {{
        let v = $v;
        [
            ("name", !v.name.is_null()),
            ("init", v.init.is_some()),
            ("devices", v.devices.is_some()),
            ("getProperties", v.get_properties.is_some()),
            ("listen", v.listen.is_some()),
            ("connect", v.connect.is_some()),
            ("accept", v.accept.is_some()),
            ("regMr", v.reg_mr.is_some()),
            ("deregMr", v.dereg_mr.is_some()),
            ("isend", v.isend.is_some()),
            ("irecv", v.irecv.is_some()),
            ("test", v.test.is_some()),
            ("closeSend", v.close_send.is_some()),
            ("closeRecv", v.close_recv.is_some()),
            ("closeListen", v.close_listen.is_some()),
        ]
        .into_iter()
        .filter(|(_, ok)| !ok)
        .map(|(n, _)| n)
        .collect()
    }};
}
pub(crate) use null_entries;

/// A library's `ncclNet_vN_t` as a loader calls it: in the newest shape
/// (`ncclNet_v12_t`'s signatures and structs). Each version file implements
/// it for its vtable, converting arguments and filling what its version
/// lacks as NCCL's `net_vN.cc` do; the contract of each method is that of
/// the v12 entry of the same name ([`v12::NetV12`]), which the caller keeps.
///
/// # Safety
/// An implementation calls the vtable's entries with arguments converted
/// from those it was given, and nothing else.
pub unsafe trait Abi: 'static {
    /// N of `ncclNet_vN_t`.
    fn version(&self) -> u32;
    /// The vtable's `name` (a C string of the plugin, or NULL).
    fn name(&self) -> *const c_char;
    /// The entries NCCL calls unchecked that are NULL here, by C name.
    fn null_entries(&self) -> Vec<&'static str>;
    /// The entries typed as in the newest version.
    fn same(&self) -> Same;
    /// Whether `init` makes a context per communicator (v11 and later).
    /// Before, `init` initializes the plugin for the process and a loader
    /// calls it once; `*ctx` is then NULL and `config` is not passed on.
    fn has_context(&self) -> bool {
        self.version() >= 11
    }
    /// # Safety
    /// As `ncclNet_v12_t::init`.
    unsafe fn init(
        &self,
        ctx: *mut *mut c_void,
        comm_id: u64,
        config: *mut v12::CommConfigV12,
        log: Logger,
        prof: ProfilerCallback,
    ) -> NcclResult;
    /// # Safety
    /// As `ncclNet_v12_t::getProperties`.
    unsafe fn get_properties(&self, dev: c_int, props: *mut v12::PropertiesV12) -> NcclResult;
    /// # Safety
    /// As `ncclNet_v12_t::listen`.
    unsafe fn listen(
        &self,
        ctx: *mut c_void,
        dev: c_int,
        handle: *mut c_void,
        listen_comm: *mut *mut c_void,
    ) -> NcclResult;
    /// # Safety
    /// As `ncclNet_v12_t::connect`.
    unsafe fn connect(
        &self,
        ctx: *mut c_void,
        dev: c_int,
        handle: *mut c_void,
        send_comm: *mut *mut c_void,
        send_dev_comm: *mut *mut DeviceHandle,
    ) -> NcclResult;
    /// # Safety
    /// As `ncclNet_v12_t::accept`.
    unsafe fn accept(
        &self,
        listen_comm: *mut c_void,
        recv_comm: *mut *mut c_void,
        recv_dev_comm: *mut *mut DeviceHandle,
    ) -> NcclResult;
    /// # Safety
    /// As `ncclNet_v12_t::regMr`.
    unsafe fn reg_mr(
        &self,
        comm: *mut c_void,
        data: *mut c_void,
        size: usize,
        ty: c_int,
        mhandle: *mut *mut c_void,
    ) -> NcclResult;
    /// # Safety
    /// As `ncclNet_v12_t::isend`.
    #[allow(clippy::too_many_arguments, reason = "the C signature")]
    unsafe fn isend(
        &self,
        send_comm: *mut c_void,
        data: *mut c_void,
        size: usize,
        tag: c_int,
        mhandle: *mut c_void,
        phandle: *mut c_void,
        request: *mut *mut c_void,
    ) -> NcclResult;
    /// # Safety
    /// As `ncclNet_v12_t::irecv`.
    #[allow(clippy::too_many_arguments, reason = "the C signature")]
    unsafe fn irecv(
        &self,
        recv_comm: *mut c_void,
        n: c_int,
        data: *mut *mut c_void,
        sizes: *mut usize,
        tags: *mut c_int,
        mhandles: *mut *mut c_void,
        phandles: *mut *mut c_void,
        request: *mut *mut c_void,
    ) -> NcclResult;
    /// `finalize` of a context `init` made (v11+); success before v11.
    ///
    /// # Safety
    /// As `ncclNet_v12_t::finalize`.
    unsafe fn finalize(&self, ctx: *mut c_void) -> NcclResult;
}

/// One loadable version: its symbol, N, and the cast of the symbol's
/// address to its vtable; `A` is the trait every version of the kind is
/// called through (the net's [`Abi`], the collnet's `CollAbi`).
pub struct Loadable<A: ?Sized + 'static = dyn Abi> {
    pub symbol: &'static str,
    pub version: u32,
    /// # Safety
    /// The address must be the symbol's: a static vtable (`ncclNet_vN_t`,
    /// `ncclCollNet_vN_t`) that stays mapped as long as the returned
    /// reference is used.
    pub cast: unsafe fn(*const c_void) -> &'static A,
}

/// Casts the address of a symbol to its vtable type.
///
/// # Safety
/// As [`Loadable::cast`].
unsafe fn cast<T: Abi>(p: *const c_void) -> &'static dyn Abi {
    // SAFETY: per the contract, `p` is a live `T`.
    unsafe { &*(p as *const T) }
}

/// [`LOADABLE`] from the one list of versions.
macro_rules! loadable {
    ($([$n:literal, $sym:ident, $coll:ident, $m:ident, $ty:ident, $cty:ident,
        $export:ident, $nccl:literal])*) => {
        /// Every version a loader can take, newest first.
        pub const LOADABLE: &[Loadable] = &[$(
            Loadable {
                symbol: stringify!($sym),
                version: $n,
                cast: cast::<$m::$ty>,
            },
        )*];
    };
}
crate::net_versions!((loadable));

/// A v12 vtable offered under older versions too: each `vN::exported::<N>()`
/// builds an `ncclNet_vN_t` whose entries convert their arguments and call
/// [`Newest::VT`]'s.
pub trait Newest: 'static {
    const VT: v12::NetV12;
    /// Where the context of the one `init` of a version before v11 is kept,
    /// for its `listen` and `connect`, which have no context argument.
    fn context() -> &'static AtomicPtr<c_void>;
}

/// The version an exported vtable was last initialized as (0: v12 itself),
/// for the plugin's log line.
pub static INIT_AS: AtomicU32 = AtomicU32::new(0);

/// `init` of a version before v11 through the newest: one context, kept
/// for the process in [`Newest::context`]; the traffic class left unset.
///
/// # Safety
/// As `ncclNet_v12_t::init`'s caller (a valid logger or none).
pub(crate) unsafe fn init_once<N: Newest>(
    version: u32,
    log: Logger,
    prof: ProfilerCallback,
) -> NcclResult {
    INIT_AS.store(version, Ordering::Relaxed);
    let mut ctx = std::ptr::null_mut();
    let mut config = v12::CommConfigV12 {
        traffic_class: NCCL_NET_TRAFFIC_CLASS_UNDEF,
    };
    let r = call!(N::VT.init, &mut ctx, 0, &mut config, log, prof);
    if r == crate::ffi::types::NCCL_SUCCESS {
        N::context().store(ctx, Ordering::Release);
    }
    r
}

/// `init` of v8 and v9 (the logger only) through the newest.
pub(crate) unsafe extern "C" fn init_log<N: Newest, const V: u32>(log: Logger) -> NcclResult {
    // SAFETY: forwarded.
    unsafe { init_once::<N>(V, log, None) }
}

/// `listen` before v11 through the newest, with the context of `init_once`.
pub(crate) unsafe extern "C" fn listen_no_ctx<N: Newest>(
    dev: c_int,
    handle: *mut c_void,
    listen_comm: *mut *mut c_void,
) -> NcclResult {
    let ctx = N::context().load(Ordering::Acquire);
    call!(N::VT.listen, ctx, dev, handle, listen_comm)
}

/// `connect` of v7 to v9 (no context, no config) through the newest.
pub(crate) unsafe extern "C" fn connect_no_ctx<N: Newest>(
    dev: c_int,
    handle: *mut c_void,
    send_comm: *mut *mut c_void,
    send_dev_comm: *mut *mut DeviceHandle,
) -> NcclResult {
    let ctx = N::context().load(Ordering::Acquire);
    call!(N::VT.connect, ctx, dev, handle, send_comm, send_dev_comm)
}

/// `isend` before v10 (no profiler handle) through the newest.
pub(crate) unsafe extern "C" fn isend_no_phandle<N: Newest>(
    send_comm: *mut c_void,
    data: *mut c_void,
    size: usize,
    tag: c_int,
    mhandle: *mut c_void,
    request: *mut *mut c_void,
) -> NcclResult {
    let ph = std::ptr::null_mut();
    call!(
        N::VT.isend,
        send_comm,
        data,
        size,
        tag,
        mhandle,
        ph,
        request
    )
}

/// `irecv` before v10 (no profiler handles) through the newest.
pub(crate) unsafe extern "C" fn irecv_no_phandle<N: Newest>(
    recv_comm: *mut c_void,
    n: c_int,
    data: *mut *mut c_void,
    sizes: *mut usize,
    tags: *mut c_int,
    mhandles: *mut *mut c_void,
    request: *mut *mut c_void,
) -> NcclResult {
    let ph = std::ptr::null_mut();
    call!(
        N::VT.irecv,
        recv_comm,
        n,
        data,
        sizes,
        tags,
        mhandles,
        ph,
        request
    )
}

/// `isend` with an `int` size (before v9) in the newest shape.
///
/// # Safety
/// As `isend`'s caller.
pub(crate) unsafe fn isend_int(
    f: Option<v8::IsendIntFn>,
    send_comm: *mut c_void,
    data: *mut c_void,
    size: usize,
    tag: c_int,
    mhandle: *mut c_void,
    request: *mut *mut c_void,
) -> NcclResult {
    // NCCL's adapters refuse what an int cannot carry (MAX_NET_SIZE).
    if size > MAX_NET_SIZE {
        return NCCL_INTERNAL_ERROR;
    }
    call!(f, send_comm, data, size as c_int, tag, mhandle, request)
}

/// `regMr` with an `int` size (before v8) in the newest shape: NCCL's
/// adapters refuse 2 GiB and more.
///
/// # Safety
/// As `regMr`'s caller.
pub(crate) unsafe fn reg_mr_int(
    f: Option<v7::RegMrIntFn>,
    comm: *mut c_void,
    data: *mut c_void,
    size: usize,
    ty: c_int,
    mhandle: *mut *mut c_void,
) -> NcclResult {
    let Ok(size) = c_int::try_from(size) else {
        return NCCL_INTERNAL_ERROR;
    };
    call!(f, comm, data, size, ty, mhandle)
}

/// Most buffers of one `irecv` NCCL passes (`NCCL_PROXY_MAX_SUBS`), the
/// bound of the conversions of its size array.
pub const MAX_RECVS: usize = 8;

/// `irecv` with `int` sizes (before v9) in the newest shape.
///
/// # Safety
/// As `irecv`'s caller: `sizes` holds `n` entries.
#[allow(clippy::too_many_arguments, reason = "the C signature")]
pub(crate) unsafe fn irecv_int(
    f: Option<v8::IrecvIntFn>,
    recv_comm: *mut c_void,
    n: c_int,
    data: *mut *mut c_void,
    sizes: *mut usize,
    tags: *mut c_int,
    mhandles: *mut *mut c_void,
    request: *mut *mut c_void,
) -> NcclResult {
    let mut ints = [0 as c_int; MAX_RECVS];
    let Ok(count) = usize::try_from(n) else {
        return NCCL_INTERNAL_ERROR;
    };
    if count > MAX_RECVS || sizes.is_null() {
        return NCCL_INTERNAL_ERROR;
    }
    for (i, slot) in ints.iter_mut().enumerate().take(count) {
        // SAFETY: `sizes` holds `n` entries (the caller's contract).
        let s = unsafe { *sizes.add(i) };
        if s > MAX_NET_SIZE {
            return NCCL_INTERNAL_ERROR;
        }
        *slot = s as c_int;
    }
    call!(
        f,
        recv_comm,
        n,
        data,
        ints.as_mut_ptr(),
        tags,
        mhandles,
        request
    )
}

/// [`Abi`] methods for entries a version types as the newest does: each
/// calls the entry of its name with its arguments unchanged.
macro_rules! as_newest {
    ($($entry:ident),* $(,)?) => { $($crate::net::abi::as_newest!(@ $entry);)* };
    (@ init) => {
        unsafe fn init(
            &self,
            ctx: *mut *mut c_void,
            comm_id: u64,
            config: *mut $crate::net::abi::v12::CommConfigV12,
            log: $crate::ffi::types::Logger,
            prof: $crate::ffi::types::ProfilerCallback,
        ) -> NcclResult {
            $crate::net::abi::call!(self.init, ctx, comm_id, config, log, prof)
        }
    };
    (@ listen) => {
        unsafe fn listen(
            &self,
            ctx: *mut c_void,
            dev: c_int,
            handle: *mut c_void,
            listen_comm: *mut *mut c_void,
        ) -> NcclResult {
            $crate::net::abi::call!(self.listen, ctx, dev, handle, listen_comm)
        }
    };
    (@ connect) => {
        unsafe fn connect(
            &self,
            ctx: *mut c_void,
            dev: c_int,
            handle: *mut c_void,
            send_comm: *mut *mut c_void,
            send_dev_comm: *mut *mut $crate::net::abi::DeviceHandle,
        ) -> NcclResult {
            $crate::net::abi::call!(self.connect, ctx, dev, handle, send_comm, send_dev_comm)
        }
    };
    (@ accept) => {
        unsafe fn accept(
            &self,
            listen_comm: *mut c_void,
            recv_comm: *mut *mut c_void,
            recv_dev_comm: *mut *mut $crate::net::abi::DeviceHandle,
        ) -> NcclResult {
            $crate::net::abi::call!(self.accept, listen_comm, recv_comm, recv_dev_comm)
        }
    };
    (@ reg_mr) => {
        unsafe fn reg_mr(
            &self,
            comm: *mut c_void,
            data: *mut c_void,
            size: usize,
            ty: c_int,
            mhandle: *mut *mut c_void,
        ) -> NcclResult {
            $crate::net::abi::call!(self.reg_mr, comm, data, size, ty, mhandle)
        }
    };
    (@ isend) => {
        unsafe fn isend(
            &self,
            send_comm: *mut c_void,
            data: *mut c_void,
            size: usize,
            tag: c_int,
            mhandle: *mut c_void,
            phandle: *mut c_void,
            request: *mut *mut c_void,
        ) -> NcclResult {
            $crate::net::abi::call!(self.isend, send_comm, data, size, tag, mhandle, phandle, request)
        }
    };
    (@ irecv) => {
        unsafe fn irecv(
            &self,
            recv_comm: *mut c_void,
            n: c_int,
            data: *mut *mut c_void,
            sizes: *mut usize,
            tags: *mut c_int,
            mhandles: *mut *mut c_void,
            phandles: *mut *mut c_void,
            request: *mut *mut c_void,
        ) -> NcclResult {
            $crate::net::abi::call!(
                self.irecv, recv_comm, n, data, sizes, tags, mhandles, phandles, request
            )
        }
    };
    (@ finalize) => {
        unsafe fn finalize(&self, ctx: *mut c_void) -> NcclResult {
            $crate::net::abi::call!(self.finalize, ctx)
        }
    };
    // Before v11: no context to finalize.
    (@ no_finalize) => {
        unsafe fn finalize(&self, _ctx: *mut c_void) -> NcclResult {
            $crate::ffi::types::NCCL_SUCCESS
        }
    };
    // Before v11: `listen` has no context.
    (@ listen_no_ctx) => {
        unsafe fn listen(
            &self,
            _ctx: *mut c_void,
            dev: c_int,
            handle: *mut c_void,
            listen_comm: *mut *mut c_void,
        ) -> NcclResult {
            $crate::net::abi::call!(self.listen, dev, handle, listen_comm)
        }
    };
    // v7 to v9: `connect` has neither context nor config.
    (@ connect_no_ctx) => {
        unsafe fn connect(
            &self,
            _ctx: *mut c_void,
            dev: c_int,
            handle: *mut c_void,
            send_comm: *mut *mut c_void,
            send_dev_comm: *mut *mut $crate::net::abi::DeviceHandle,
        ) -> NcclResult {
            $crate::net::abi::call!(self.connect, dev, handle, send_comm, send_dev_comm)
        }
    };
    // Before v9: `isend` takes an `int` size and no profiler handle.
    (@ isend_int) => {
        unsafe fn isend(
            &self,
            send_comm: *mut c_void,
            data: *mut c_void,
            size: usize,
            tag: c_int,
            mhandle: *mut c_void,
            _phandle: *mut c_void,
            request: *mut *mut c_void,
        ) -> NcclResult {
            // SAFETY: forwarded.
            unsafe {
                $crate::net::abi::isend_int(self.isend, send_comm, data, size, tag, mhandle, request)
            }
        }
    };
    // Before v9: `irecv` takes `int` sizes and no profiler handles.
    (@ irecv_int) => {
        unsafe fn irecv(
            &self,
            recv_comm: *mut c_void,
            n: c_int,
            data: *mut *mut c_void,
            sizes: *mut usize,
            tags: *mut c_int,
            mhandles: *mut *mut c_void,
            _phandles: *mut *mut c_void,
            request: *mut *mut c_void,
        ) -> NcclResult {
            // SAFETY: forwarded.
            unsafe {
                $crate::net::abi::irecv_int(
                    self.irecv, recv_comm, n, data, sizes, tags, mhandles, request,
                )
            }
        }
    };
    // Before v8: `regMr` takes an `int` size.
    (@ reg_mr_int) => {
        unsafe fn reg_mr(
            &self,
            comm: *mut c_void,
            data: *mut c_void,
            size: usize,
            ty: c_int,
            mhandle: *mut *mut c_void,
        ) -> NcclResult {
            // SAFETY: forwarded.
            unsafe { $crate::net::abi::reg_mr_int(self.reg_mr, comm, data, size, ty, mhandle) }
        }
    };
    // Before v10: `init` takes the logger only, once for the process.
    (@ init_log) => {
        unsafe fn init(
            &self,
            ctx: *mut *mut c_void,
            _comm_id: u64,
            _config: *mut $crate::net::abi::v12::CommConfigV12,
            log: $crate::ffi::types::Logger,
            _prof: $crate::ffi::types::ProfilerCallback,
        ) -> NcclResult {
            if !ctx.is_null() {
                // SAFETY: a non-NULL out-pointer (the caller's contract).
                unsafe { *ctx = std::ptr::null_mut() };
            }
            $crate::net::abi::call!(self.init, log)
        }
    };
}
pub(crate) use as_newest;

/// `version`, `name`, `null_entries` and `same` of a vtable with every
/// field [`Same`] copies.
macro_rules! abi_common {
    ($version:expr) => {
        fn version(&self) -> u32 {
            $version
        }
        fn name(&self) -> *const c_char {
            self.name
        }
        fn null_entries(&self) -> Vec<&'static str> {
            $crate::net::abi::null_entries!(self)
        }
        fn same(&self) -> $crate::net::abi::Same {
            $crate::net::abi::same!(self)
        }
    };
}
pub(crate) use abi_common;

/// Calls a `getProperties` into a zeroed struct of its version and writes
/// the conversion of what it filled into `out`: the one body of every
/// properties conversion, to the newest (loading) and from it (exporting).
///
/// # Safety
/// As `getProperties`'s caller; `T` is a plain C struct (all-zero valid).
pub(crate) unsafe fn props_via<T, U>(
    f: Option<unsafe extern "C" fn(c_int, *mut T) -> NcclResult>,
    dev: c_int,
    out: *mut U,
    convert: impl FnOnce(&T) -> U,
) -> NcclResult {
    if out.is_null() {
        return crate::ffi::types::NCCL_INVALID_ARGUMENT;
    }
    // SAFETY: properties structs are pointers, integers and floats, for
    // which all-zero is a valid value.
    let mut p: T = unsafe { std::mem::zeroed() };
    let r = call!(f, dev, &mut p);
    if r == crate::ffi::types::NCCL_SUCCESS {
        // SAFETY: checked non-null; the caller's properties struct.
        unsafe { out.write(convert(&p)) };
    }
    r
}

/// A properties struct of another version with the fields every version
/// since v6 has copied from `$p`, and the rest given.
macro_rules! props {
    ($p:expr => $t:path { $($f:ident: $e:expr),* $(,)? }) => {{
        let p = $p;
        $t {
            name: p.name,
            pci_path: p.pci_path,
            guid: p.guid,
            ptr_support: p.ptr_support,
            speed: p.speed,
            port: p.port,
            latency: p.latency,
            max_comms: p.max_comms,
            max_recvs: p.max_recvs,
            $($f: $e),*
        }
    }};
}
pub(crate) use props;

#[cfg(test)]
pub(crate) use crate::ffi::assert_layout;

#[cfg(test)]
mod tests {
    // Every size, alignment and offset in this module's tests and in the
    // version files' was measured from NCCL's headers (2.30.7; 2.28.9 gives
    // the same for the versions it has) by a C++ program printing
    // sizeof/alignof/offsetof, built with g++ 12 on x86_64 Linux.

    use std::ffi::CStr;

    use super::*;

    /// The names NCCL's loader looks up with dlsym (src/plugin/net/net_vN.cc).
    #[test]
    fn symbols_are_the_names_nccl_looks_up() {
        let all: [(&[u8], &str); 8] = [
            (v6::SYMBOL, "ncclNetPlugin_v6"),
            (v7::SYMBOL, "ncclNetPlugin_v7"),
            (v8::SYMBOL, "ncclNetPlugin_v8"),
            (v9::SYMBOL, "ncclNetPlugin_v9"),
            (v10::SYMBOL, "ncclNetPlugin_v10"),
            (v11::SYMBOL, "ncclNetPlugin_v11"),
            (v12::SYMBOL, "ncclNetPlugin_v12"),
            (v12::COLLNET_SYMBOL, "ncclCollNetPlugin_v12"),
        ];
        for (sym, name) in all {
            assert_eq!(CStr::from_bytes_with_nul(sym).unwrap().to_str(), Ok(name));
        }
        for l in LOADABLE {
            assert_eq!(l.symbol, format!("ncclNetPlugin_v{}", l.version));
        }
    }

    /// `NCCL_NET_ATTR_INIT`: every field -1 (the unsigned ones as `(uint32_t)-1`).
    #[test]
    fn net_attr_undef_is_nccl_net_attr_init() {
        let a = v12::NetAttrV12::UNDEF;
        assert_eq!(a.send_comm_attr.max_concurrent_peers, NCCL_NET_ATTR_UNDEF);
        assert_eq!(a.recv_comm_attr.min_flows_per_peer, NCCL_NET_ATTR_UNDEF);
        assert_eq!(a.op, NCCL_NET_ATTR_UNDEF as u32);
    }

    /// `ncclNetDeviceHandle_v7_t`.
    #[test]
    fn device_handle_layout() {
        assert_layout!(DeviceHandle, 32, 8, net_device_type @ 0, net_device_version @ 4,
            handle @ 8, size @ 16, needs_proxy_progress @ 24);
    }
}
